"""The machine a measurement holds for: the CPU's model, identity and flags (or the GPU), the CPUs
this process may use, the torch version and the ISA limits set in the environment."""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import torch

ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "DNNL_MAX_CPU_ISA")


def parse_cpuinfo(text: str) -> tuple[str, str, list[str]]:
    """The first processor's model name, its identity ("GenuineIntel family 6 model 167 stepping 1"
    on x86, "" where the fields are absent) and its sorted feature flags, from /proc/cpuinfo's text.

    Cloud VMs often report a generic model name ("Intel(R) Xeon(R) Processor"); the family and
    model numbers still tell the CPU generation apart.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        name = name.strip()
        if sep and name not in fields:
            fields[name] = value.strip()
    model = next((fields[k] for k in ("model name", "Model", "cpu model") if fields.get(k)), "")
    identity = ""
    if all(fields.get(k) for k in ("cpu family", "model", "stepping")):
        identity = f"family {fields['cpu family']} model {fields['model']} stepping {fields['stepping']}"
        identity = f"{fields['vendor_id']} {identity}" if fields.get("vendor_id") else identity
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    return model, identity, sorted(flags)


def cpu_model_and_flags() -> tuple[str, str, list[str]]:
    """The CPU's model name, identity and feature flags (Linux /proc/cpuinfo; elsewhere the
    platform's name)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine(), "", []
    model, identity, flags = parse_cpuinfo(text)
    return model or platform.machine(), identity, flags


# Flags that decide matmul speed, named in logs and reports.
NOTABLE_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "asimd")


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine(device: torch.device) -> dict:
    """What identifies the hardware and software a measurement holds for."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "torch": torch.__version__,
        }
    model, identity, flags = cpu_model_and_flags()
    return {
        "cpu": model,
        "cpu_id": identity,
        "flags_sha1": hashlib.sha1(" ".join(flags).encode()).hexdigest()[:16],
        "notable_flags": [f for f in NOTABLE_FLAGS if f in flags],
        "cpus": usable_cpus(),
        "torch": torch.__version__,
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_env": {k: os.environ[k] for k in ISA_ENV if os.environ.get(k)},
    }


def machine_name(info: dict) -> str:
    if "gpu" in info:
        return f"{info['gpu']} (compute {info['capability']}, CUDA {info['cuda']})"
    flags = " ".join(info["notable_flags"]) or "no AVX2"
    limits = "".join(f", {k}={v}" for k, v in info["isa_env"].items())
    identity = f" ({info['cpu_id']})" if info.get("cpu_id") else ""
    return f"{info['cpu']}{identity} [{flags}], {info['cpus']} CPUs{limits}"
