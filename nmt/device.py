"""Where and in which precision the model runs: device choice, autocast, gradient scaling.

Every branch here is a plain function of its inputs (device type, capability flags),
so the CUDA-only choices are exercised by tests on a CPU machine.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch

from nmt.errors import NMTError

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_has_bf16() -> bool:
    """True when oneDNN has native bf16 kernels here (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def select_device(name: str, cuda_available: bool | None = None, fallback_to_cpu: bool = False) -> torch.device:
    """``auto`` -> CUDA when present, else CPU. ``cuda`` without a GPU is an error (or CPU with a warning)."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda" if cuda_available else "cpu")
    if name == "cuda" and not cuda_available:
        if fallback_to_cpu:
            warnings.warn("train.device is 'cuda' but no GPU is available: running on CPU", stacklevel=3)
            return torch.device("cpu")
        raise NMTError(
            "config key 'train.device': 'cuda' was asked for but no CUDA GPU is available "
            "(set train.cpu_fallback: true to run on CPU instead)"
        )
    return torch.device(name)


def select_precision(name: str, device_type: str, bf16_supported: bool) -> str:
    """``auto``: bf16 where the hardware has bf16 matrix units, fp16 on older GPUs, else fp32.

    ``bf16_supported`` is ``torch.cuda.is_bf16_supported()`` on CUDA and ``cpu_has_bf16()`` on CPU.
    """
    if name == "auto":
        if bf16_supported:
            return "bf16"
        return "fp16" if device_type == "cuda" else "fp32"
    if name == "fp16" and device_type == "cpu":
        raise NMTError("config key 'train.precision': fp16 is for GPUs; use bf16 or fp32 on CPU")
    return name


def bf16_supported_on(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return cpu_has_bf16()


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


def resolve(device_name: str, precision_name: str, cpu_fallback: bool = False) -> tuple[torch.device, Precision]:
    device = select_device(device_name, fallback_to_cpu=cpu_fallback)
    name = select_precision(precision_name, device.type, bf16_supported_on(device))
    return device, Precision(device.type, name)
