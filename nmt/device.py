"""Where and in which precision the model runs: device choice, what can run there, autocast,
gradient scaling. Which of the runnable precisions is *fastest* is measured, in ``nmt.kernel_timing``.

Every rule here is a plain function of its inputs (device type, capability flags), so the
CUDA-only branches are exercised by tests on a CPU machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nmt import testhooks
from nmt.console import say
from nmt.errors import NMTError

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def keep_freed_memory() -> bool:
    """Have glibc keep freed large blocks for reuse instead of unmapping them (Linux; elsewhere a no-op).

    glibc serves allocations over 32 MB with fresh mmaps and returns them on free, so every update's
    logits, their gradient and the large activations fault their pages in again: 70,000 minor page
    faults per update on the Multi30k config, measured 6-11% of an fp32 update and 5-24% of a bf16
    one on a 2-core Xeon. With an mmap threshold of 1 GB and no trimming, freed memory is reused
    (under 700 faults per update). Freed memory then stays resident until ``release_freed_memory``
    gives it back (the training loop does, every 100 updates). Returns whether the setting took.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
        return libc.mallopt(m_mmap_threshold, 1 << 30) == 1 and libc.mallopt(m_trim_threshold, 2**31 - 1) == 1
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False


def release_freed_memory() -> bool:
    """Give the free pages inside glibc's heap back to the system (``malloc_trim``; Linux with
    glibc, elsewhere a no-op). Returns whether any were.

    Batches of other shapes free blocks of other sizes, and the heap keeps holes the next ones do not
    fit; with ``keep_freed_memory`` glibc never returns them. On the 2-core AMD EPYC a 0.47M-parameter
    model's heap held 670 MiB free beside 400 MiB in use after 1,500 updates of varied batch shapes
    (oneDNN caching no kernels), and preparing 200,000 pairs in the training process left 950 MiB.
    A release takes about 8 ms, and the next update faults its pages in once.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim(0) == 1
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False


# oneDNN's kernel cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, in kernels). Measured on a 2-core AMD
# EPYC (family 26 model 2, AVX512-BF16, no AMX), torch 2.13: every cached kernel holds 280-340 KiB
# of heap, whatever its size (fp32 inner products and bf16 matmuls, 64 to 2,048 wide), and each
# padded batch shape (sentences x source x target length) needs up to 48 of them (a Transformer,
# bf16 with explicit attention; 28 in fp32 through oneDNN): 15 for the encoder's linear layers,
# 15 for the decoder's and the output layer, 18 for attention's batched products.
ONEDNN_KERNEL_BYTES = 300 * 2**10
ONEDNN_KERNELS_PER_BATCH_SHAPE = 50
ONEDNN_CACHE_MIN = 1024  # oneDNN's own default
ONEDNN_CACHE_MAX = 16384  # 4.7 GiB of kernels
ONEDNN_CACHE_UNFITTED = 2048  # 0.6 GiB: where an epoch's kernels do not fit, and for decoding
ONEDNN_CACHE_MEMORY_SHARE = 4  # cached kernels never take more than a quarter of the memory


def memory_bytes() -> int | None:
    """The memory this process can have: the machine's, or its cgroup's limit where lower (a
    container); None where it cannot be read."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():  # cgroup v2 says "max" where unlimited; v1 a number near 2^63
            total = min(total, int(limit))
    return total


def onednn_cache_capacity(batch_shapes: int | None, memory: int | None, processes: int = 1) -> int:
    """How many kernels oneDNN may cache: all that an epoch of ``batch_shapes`` distinct batch
    shapes needs, and a quarter more for validation's decoding, where that is at most
    ONEDNN_CACHE_MAX; otherwise, or without batch shapes (decoding), ONEDNN_CACHE_UNFITTED. Never
    more than a quarter of ``memory`` (bytes; shared by ``processes`` ranks on the machine), never
    fewer than oneDNN's default 1,024.

    oneDNN compiles a kernel per matrix shape and keeps the most recently used ones. Where an
    epoch's kernels fit, each is compiled once: with oneDNN's 1,024, Multi30k's and the demo's were
    compiled again every epoch, and bf16 trained the demo 1.7x slower on a 2-core AMX Xeon, where a
    kernel takes about 2 ms to compile (0.15-0.3 ms on the AMD EPYC). Where they do not fit (a large
    corpus has hundreds to thousands of batch shapes), a larger cache compiles less often but
    holds 0.3 MB a kernel: with room for 16,384, training a 0.47M-parameter model on 200,000 pairs
    grew from 340 MiB to 4.6 GiB in 1,500 updates and was still growing.
    """
    needed = None if batch_shapes is None else _whole_kibi(batch_shapes * ONEDNN_KERNELS_PER_BATCH_SHAPE * 5 // 4)
    capacity = needed if needed is not None and needed <= ONEDNN_CACHE_MAX else ONEDNN_CACHE_UNFITTED
    if memory is not None:
        affordable = memory // (ONEDNN_CACHE_MEMORY_SHARE * max(processes, 1) * ONEDNN_KERNEL_BYTES)
        capacity = min(capacity, affordable // 1024 * 1024)
    return max(ONEDNN_CACHE_MIN, capacity)


def _whole_kibi(kernels: int) -> int:
    """``kernels`` rounded up to a multiple of 1,024."""
    return -(-kernels // 1024) * 1024


def size_onednn_cache(batch_shapes: int | None = None, processes: int = 1) -> str:
    """Set oneDNN's kernel cache for this process (``onednn_cache_capacity``) unless the user set
    ONEDNN_PRIMITIVE_CACHE_CAPACITY; returns the capacity in force. oneDNN reads the setting when
    it compiles its first kernel: call this before any product runs (the trainer does, once its
    data is prepared and before ``auto`` measures)."""
    capacity = onednn_cache_capacity(batch_shapes, memory_bytes(), processes)
    return os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))


def prepare_cpu_process() -> None:
    """What a decoding process on a CPU sets first: freed memory kept, oneDNN's kernel cache sized
    for decoding. (Training sizes the cache for its batch shapes, ``Trainer.setup``.)"""
    keep_freed_memory()
    size_onednn_cache()


def adamw(params, **options) -> torch.optim.AdamW:
    """AdamW with the fused kernel, one pass over all parameters, where this torch has one for the
    parameters' device (CUDA; CPUs from torch 2.4): on a 2-core Xeon 3.5x faster than the default
    loop over tensors. Elsewhere the default implementation, same arithmetic."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **options)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, **options)


def cpu_has_bf16() -> bool:
    """True when oneDNN has bf16 kernels here: native (AVX512-BF16, AMX) or emulated on AVX-512.

    Emulated kernels run several times slower than fp32, so this says what can run, not what is
    fast; ``nmt.kernel_timing`` measures that. Without AVX-512 (AVX2 only) this is False and a bf16
    matmul falls back to a reference loop about 100x slower than fp32.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cuda_has_bf16() -> bool:
    """True on GPUs with bf16 matrix units (Ampere and later), not where bf16 is only emulated."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch < 2.3 has no such argument and reports native support only
        return torch.cuda.is_bf16_supported()


def select_device(
    name: str,
    cuda_available: bool | None = None,
    fallback_to_cpu: bool = False,
    key: str = "config key 'train.device'",
    warn: Callable[[str], None] | None = None,
) -> torch.device:
    """``auto`` -> CUDA when present, else CPU. ``cuda`` without a GPU is an error, or with
    ``fallback_to_cpu`` the CPU and a warning line to ``warn`` (a trainer's log; None: stderr)."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda" if cuda_available else "cpu")
    if name == "cuda" and not cuda_available:
        if fallback_to_cpu:
            message = "warning: train.device is 'cuda' but no GPU is available: running on CPU (train.cpu_fallback)"
            (warn or say)(message)
            return torch.device("cpu")
        raise NMTError(
            f"{key}: 'cuda' was asked for but no CUDA GPU is available"
            + (" (set train.cpu_fallback: true to run on CPU instead)" if key.endswith("'train.device'") else "")
        )
    return torch.device(name)


def precision_candidates(device_type: str, bf16_available: bool) -> list[str]:
    """The precisions ``auto`` times on a device: fp32 first (the default), then the lower ones that can run."""
    lower = ["bf16"] if bf16_available else []
    if device_type == "cuda":
        lower.append("fp16")
    return ["fp32"] + lower


def precision_problem(name: str, device_type: str, bf16_available: bool) -> str | None:
    """Why precision ``name`` cannot run on this device, or None where it can (``auto`` always can)."""
    if name == "fp16" and device_type == "cpu" and not testhooks.fp16_on_cpu():
        return "fp16 is for GPUs"
    if name == "bf16" and not bf16_available:
        where = "this GPU (no bf16 units)" if device_type == "cuda" else "this CPU (no AVX-512, so no bf16 kernels)"
        return f"bf16 is not available on {where}"
    return None


def check_precision(
    name: str, device_type: str, bf16_available: bool, key: str = "config key 'train.precision'"
) -> None:
    """Refuse, naming the key, a precision asked for by name that cannot run on this device."""
    problem = precision_problem(name, device_type, bf16_available)
    if problem is not None:
        # Advise only what runs here: bf16 on a CPU that has its kernels (an AVX2-only one has none).
        advice = "use bf16, fp32 or auto on a CPU" if name == "fp16" and bf16_available else "use fp32 or auto"
        raise NMTError(f"{key}: {problem}; {advice}")


def check_train_device(device: str, precision: str, cpu_fallback: bool) -> None:
    """Refuse, naming the key, a ``train.device`` or ``train.precision`` this machine cannot run:
    the Trainer's own checks, made once the config is read so that they can say where it came from."""
    chosen = select_device(device, fallback_to_cpu=cpu_fallback, warn=lambda message: None)  # the Trainer warns
    check_precision(precision, chosen.type, bf16_available(chosen))


def bf16_available(device: torch.device) -> bool:
    return cuda_has_bf16() if device.type == "cuda" else cpu_has_bf16()


@dataclass(frozen=True)
class Precision:
    """Autocast settings for one device; ``name`` is fp32, bf16 or fp16."""

    device_type: str
    name: str

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.name]

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """Loss scaling only for fp16: bf16 has fp32's exponent range and needs none."""
        return torch.amp.GradScaler(self.device_type, enabled=self.name == "fp16")
