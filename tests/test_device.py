"""Device and precision rules, including the CUDA branches, decided on any machine."""

import os
import warnings

import pytest
import torch

from nmt.device import Precision, check_precision, precision_candidates, select_device
from nmt.errors import NMTError


def test_auto_device():
    assert select_device("auto", cuda_available=False).type == "cpu"
    assert select_device("auto", cuda_available=True).type == "cuda"


def test_cuda_without_gpu_is_an_error_or_a_fallback():
    with pytest.raises(NMTError, match="train.device"):
        select_device("cuda", cuda_available=False)
    with pytest.raises(NMTError, match="--device"):
        select_device("cuda", cuda_available=False, key="--device")
    seen: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a line for the run's log, not a Python warning with a source line
        assert select_device("cuda", cuda_available=False, fallback_to_cpu=True, warn=seen.append).type == "cpu"
    assert seen == ["warning: train.device is 'cuda' but no GPU is available: running on CPU (train.cpu_fallback)"]


@pytest.mark.parametrize(
    "device,bf16,expected",
    [
        ("cpu", True, ["fp32", "bf16"]),
        ("cpu", False, ["fp32"]),  # AVX2 only: no bf16 kernels at all
        ("cuda", True, ["fp32", "bf16", "fp16"]),
        ("cuda", False, ["fp32", "fp16"]),  # pre-Ampere
    ],
)
def test_candidates_start_with_fp32_and_hold_only_what_can_run(device, bf16, expected):
    assert precision_candidates(device, bf16) == expected


@pytest.mark.parametrize(
    "name,device,bf16,message",
    [
        ("fp16", "cpu", True, "fp16 is for GPUs"),
        ("bf16", "cpu", False, "bf16 is not available on this CPU"),
        ("bf16", "cuda", False, "bf16 is not available on this GPU"),
    ],
)
def test_a_precision_that_cannot_run_is_refused_naming_the_key(name, device, bf16, message):
    with pytest.raises(NMTError, match=f"train.precision': {message}"):
        check_precision(name, device, bf16)


@pytest.mark.parametrize(
    "name,device,bf16", [("auto", "cpu", False), ("fp32", "cpu", False), ("bf16", "cpu", True), ("fp16", "cuda", False)]
)
def test_a_precision_that_can_run_is_accepted(name, device, bf16):
    check_precision(name, device, bf16)


def test_autocast_and_scaler():
    x = torch.randn(4, 4)
    with Precision("cpu", "bf16").autocast():
        assert (x @ x).dtype == torch.bfloat16
    with Precision("cpu", "fp32").autocast():
        assert (x @ x).dtype == torch.float32
    assert not Precision("cpu", "bf16").grad_scaler().is_enabled()
    scaler = Precision("cpu", "fp16").grad_scaler()
    assert scaler.is_enabled()
    # The fp16 path's scaler logic runs on CPU too: an inf gradient skips the step.
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=1.0)
    scaler.scale((w * torch.tensor([float("inf"), 1.0])).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(w.detach(), torch.ones(2))
    assert scaler.get_scale() < 65536.0


def test_onednn_cache_enlarged_unless_the_user_chose(monkeypatch):
    from nmt.device import ONEDNN_CACHE_CAPACITY, enlarge_onednn_cache

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert enlarge_onednn_cache() == str(ONEDNN_CACHE_CAPACITY)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_CACHE_CAPACITY)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "100")
    assert enlarge_onednn_cache() == "100"


def test_adamw_is_fused_here_and_steps_like_the_default():
    from nmt.device import adamw

    torch.manual_seed(0)
    weights = [torch.randn(64, 32), torch.randn(32)]
    grads = [torch.randn_like(w) for w in weights]
    params = {}
    for name, make in (("fused", adamw), ("default", torch.optim.AdamW)):
        ps = [torch.nn.Parameter(w.clone()) for w in weights]
        opt = make(ps, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01)
        for _ in range(3):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
        params[name] = ps
        if name == "fused":
            assert opt.defaults["fused"]  # torch >= 2.4 has a fused CPU kernel
    for a, b in zip(params["fused"], params["default"]):
        assert torch.allclose(a, b, atol=1e-6)
        assert not torch.equal(a.detach(), weights[0] if a.shape == weights[0].shape else weights[1])
