"""Device and precision rules, including the CUDA branches, decided on any machine."""

import os
import subprocess
import sys
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


@pytest.mark.parametrize("bf16,advice", [(True, "use bf16, fp32 or auto on a CPU"), (False, "use fp32 or auto$")])
def test_fp16_on_a_cpu_advises_bf16_only_where_it_can_run(bf16, advice):
    with pytest.raises(NMTError, match=f"fp16 is for GPUs; {advice}"):
        check_precision("fp16", "cpu", bf16)


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


GIB = 2**30


def test_onednn_cache_holds_an_epoch_that_fits_and_stays_bounded_for_one_that_does_not():
    from nmt.device import onednn_cache_capacity

    # 50 kernels per batch shape, and a quarter more for validation, in multiples of 1,024.
    assert onednn_cache_capacity(46, 64 * GIB) == 3072  # the demo: 46 batch shapes
    assert onednn_cache_capacity(191, 64 * GIB) == 12288  # Multi30k at 2,048 tokens
    # 200,000 pairs (789 shapes) or 2M (2,450) need more than 16,384: a cache of 2,048 (0.6 GiB)
    # instead of one that grew to 4.6 GiB and more.
    assert onednn_cache_capacity(789, 64 * GIB) == onednn_cache_capacity(2450, 64 * GIB) == 2048
    assert onednn_cache_capacity(None, 64 * GIB) == 2048  # decoding
    assert onednn_cache_capacity(191, None) == 12288  # memory unknown


def test_onednn_cache_takes_at_most_a_quarter_of_the_memory_and_never_less_than_onednns_default():
    from nmt.device import onednn_cache_capacity

    assert onednn_cache_capacity(191, 8 * GIB) == 6144  # 2 GiB of 0.3 MB kernels: 6,990
    assert onednn_cache_capacity(191, 8 * GIB, processes=2) == 3072  # two ranks on the machine
    assert onednn_cache_capacity(191, GIB) == onednn_cache_capacity(1, 64 * GIB) == 1024


def test_onednn_cache_size_is_the_users_where_set(monkeypatch):
    from nmt import device

    monkeypatch.setattr(device, "memory_bytes", lambda: 64 * GIB)
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert device.size_onednn_cache(789) == "2048" == os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "100")
    assert device.size_onednn_cache(46) == "100"


PROBE = """
import sys

import torch

import nmt.device
from nmt.config import load_config
from nmt.models.linear import onednn_affine
from nmt.rundir import RunDir
from nmt.trainer import Trainer

nmt.device.onednn_cache_capacity = lambda *args, **kwargs: 2
cfg = load_config(sys.argv[1])
trainer = Trainer(cfg, RunDir(cfg.run_dir), print)
trainer.setup()  # auto measures: oneDNN compiles its first kernels there
weight = torch.randn(8, 8)
for rows in (1, 2, 3, 1):  # with room for 2 kernels, the third evicts the first
    onednn_affine(torch.randn(rows, 8), weight)
trainer.close()
"""


def test_the_trainer_sizes_the_kernel_cache_before_oneDNN_reads_it(tmp_path):
    """oneDNN reads its capacity once, when it compiles its first kernel: in the trainer, that is
    while auto measures, so the size must be set before (a size set later is silently ignored)."""
    from conftest import tiny_config

    from nmt.models.linear import onednn_available

    if not onednn_available():
        pytest.skip("this torch build has no oneDNN products")
    config = tiny_config(tmp_path, precision="auto")
    (tmp_path / "probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    env.update(ONEDNN_VERBOSE="profile_create", NMT_CACHE_DIR=str(tmp_path / "cache"))  # a fresh cache: auto measures
    result = subprocess.run(
        [sys.executable, str(tmp_path / "probe.py"), str(config)], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "oneDNN kernel cache: 2 kernels (batch shapes in an epoch: 1)" in result.stdout
    if "onednn_verbose" not in result.stdout:
        pytest.skip("this oneDNN build does not report its kernels (ONEDNN_VERBOSE)")
    probes = [line for line in result.stdout.splitlines() if ",create:cache_" in line and ",mb1ic8oc8," in line]
    assert [line.split(",create:cache_")[1].split(",")[0] for line in probes] == ["miss", "miss"]


HEAP_HOLES = """
import torch

from nmt.device import keep_freed_memory, release_freed_memory


def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))


keep_freed_memory()
blocks, pins = [], []
for _ in range(200):  # 1 MiB blocks, each followed by a small one that stays: the heap cannot shrink
    blocks.append(torch.ones(2**18))
    pins.append(torch.ones(16))
del blocks
freed = rss_mib()
release_freed_memory()
print(freed, rss_mib())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_memory_kept_for_reuse_is_given_back_on_release(tmp_path):
    (tmp_path / "holes.py").write_text(HEAP_HOLES)
    done = subprocess.run([sys.executable, str(tmp_path / "holes.py")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    freed, released = map(int, done.stdout.split())
    assert released < freed - 150  # of the 200 MiB freed and kept, most is the system's again


def test_memory_bytes_is_at_most_the_machines():
    from nmt.device import memory_bytes

    memory = memory_bytes()
    if memory is None:
        pytest.skip("no sysconf here")
    assert 0 < memory <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_adamw_is_fused_here_and_steps_like_the_default():
    from nmt.device import adamw

    torch.manual_seed(0)
    weights = [torch.randn(64, 32), torch.randn(32)]
    grads = [torch.randn_like(w) for w in weights]
    params = {}
    fused_on_cpu = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 4)
    for name, make in (("fused", adamw), ("default", torch.optim.AdamW)):
        ps = [torch.nn.Parameter(w.clone()) for w in weights]
        opt = make(ps, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01)
        for _ in range(3):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
        params[name] = ps
        if name == "fused":
            # torch >= 2.4 has a fused CPU kernel; before it adamw() takes the default loop
            assert bool(opt.defaults["fused"]) == fused_on_cpu
    for a, b in zip(params["fused"], params["default"]):
        assert torch.allclose(a, b, atol=1e-6)
        assert not torch.equal(a.detach(), weights[0] if a.shape == weights[0].shape else weights[1])


@pytest.fixture
def cpu_only(monkeypatch):
    """A machine with no GPU and no bf16 kernels, whatever this one has."""
    import nmt.device

    monkeypatch.delenv("NMT_TEST_FP16_ON_CPU", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(nmt.device, "cpu_has_bf16", lambda: False)


FP16 = "config key 'train.precision': fp16 is for GPUs; use fp32 or auto"
BF16 = "config key 'train.precision': bf16 is not available on this CPU (no AVX-512, so no bf16 kernels); use fp32"
CUDA = "config key 'train.device': 'cuda' was asked for but no CUDA GPU is available"


@pytest.mark.parametrize("command", ["train", "bench"])
def test_a_device_refusal_names_the_file_or_the_set_that_gave_the_value(command, cpu_only, tmp_path, capsys):
    """As every other config error does: the file, the --set, or the file with the --set that caused it."""
    from conftest import tiny_config

    from nmt.cli import main

    config = tiny_config(tmp_path, precision="fp16")
    gpu_config = tiny_config(tmp_path / "gpu", precision="fp16", device="cuda")
    line = config.read_text().splitlines().index("  precision: fp16") + 1  # the file's value: its line too
    gpu_line = gpu_config.read_text().splitlines().index("  precision: fp16") + 1
    gpu_place = f"{gpu_config}: line {gpu_line}, column 3"  # the file's key, which the --set made invalid
    for file, sets, source, error in (
        (config, [], f"{config}: line {line}, column 3", FP16),
        (config, ["train.precision=fp32", "train.precision=bf16"], "--set train.precision=bf16", BF16),
        (config, ["train.precision=fp32", "train.device=cuda"], "--set train.device=cuda", CUDA),
        (gpu_config, ["train.device=cpu"], f"{gpu_place} with --set train.device=cpu", FP16),
        (gpu_config, ["train.device=auto", "seed=4"], f"{gpu_place} with --set train.device=auto", FP16),
    ):
        argv = [command, "--config", str(file), *(a for kv in sets for a in ("--set", kv))]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"nmt {command}: error: {source}: {error}") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "run-bench").exists()  # refused before any work
