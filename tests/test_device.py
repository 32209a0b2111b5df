"""Device and precision choices, including the CUDA branches, decided on any machine."""

import pytest
import torch

from nmt.device import Precision, select_device, select_precision
from nmt.errors import NMTError


def test_auto_device():
    assert select_device("auto", cuda_available=False).type == "cpu"
    assert select_device("auto", cuda_available=True).type == "cuda"


def test_cuda_without_gpu_is_an_error_or_a_fallback():
    with pytest.raises(NMTError, match="train.device"):
        select_device("cuda", cuda_available=False)
    with pytest.warns(UserWarning, match="running on CPU"):
        assert select_device("cuda", cuda_available=False, fallback_to_cpu=True).type == "cpu"


@pytest.mark.parametrize(
    "name,device,bf16,expected",
    [
        ("auto", "cpu", True, "bf16"),
        ("auto", "cpu", False, "fp32"),
        ("auto", "cuda", True, "bf16"),
        ("auto", "cuda", False, "fp16"),
        ("fp32", "cuda", True, "fp32"),
        ("bf16", "cpu", False, "bf16"),
    ],
)
def test_precision_choice(name, device, bf16, expected):
    assert select_precision(name, device, bf16) == expected


def test_fp16_on_cpu_refused():
    with pytest.raises(NMTError, match="train.precision"):
        select_precision("fp16", "cpu", True)


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
