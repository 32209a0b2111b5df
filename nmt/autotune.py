"""Measured ``auto`` choices: precision, attention kernel, the fp32 product library and CPU threads.

Which settings are fastest depends on the machine, so ``auto`` is a measurement, not a rule
(nmt/kernel_timing.py: what is timed, and the margin a candidate must win by). ``choose`` returns
the settings a run uses: the config's where it names them, else the run's record of its choice
(``run_record``), the machine's cache or a new measurement.

The result is cached per machine in ``$NMT_CACHE_DIR`` (default ``~/.cache/nmt``), keyed by the
CPU's model and flags or the GPU, the torch version, the ISA limits set in the environment and the
shapes; ``nmt train``, ``nmt translate`` and ``nmt bench`` of one model then share one choice and
the second run pays nothing. A damaged or foreign cache file, or an entry this device cannot run
(a precision it lacks, more threads than CPUs), is ignored and rewritten. A measurement taken
while other jobs held the cores is used for that run only, never cached: on a 2-core Xeon one
taken beside another job chose 1 thread over 2 (66.8 vs 172.9 ms per step) and, cached, cost
every later run on the idle machine 40% of its speed. Busy means the threads got less than
``BUSY_CPU_USE`` of the CPU time they would have had alone (process CPU time over wall time x
threads, during the multi-threaded steps).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Literal

import torch

from nmt.config import ModelConfig
from nmt.device import bf16_available, check_precision, precision_problem
from nmt.errors import NMTError
from nmt.files import atomic_write_bytes
from nmt.kernel_choice import NO_KERNEL, Choice, Request, for_model
from nmt.kernel_timing import Shape, measure, measures_fp32_matmul, tuning_shape
from nmt.machine import machine, machine_name, usable_cpus
from nmt.models.linear import FP32_MATMULS, onednn_available
from nmt.saved_numbers import is_number

VERSION = 7  # bump when the measurement changes, so old cache entries are not reused
BUSY_CPU_USE = 0.7  # below this share of threads x wall time in CPU time, the cores were shared
CACHE_FILE = "autotune.json"
# How ``choose`` uses a training run's record of its choice (``run_record``): see there.
RecordUse = Literal["resume", "start", "read"]


# ---------------------------------------------------------------------------- the cache


def cache_dir() -> Path:
    if os.environ.get("NMT_CACHE_DIR"):
        return Path(os.environ["NMT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nmt"


def cache_key(info: dict, shape: Shape, request: Request) -> str:
    parts = {"version": VERSION, "machine": info, "shape": asdict(shape), "request": asdict(request)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def read_cache(path: Path) -> dict:
    """The cache's entries; anything unreadable, damaged or foreign counts as empty."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("format") != f"nmt-autotune-{VERSION}":
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def write_cache(path: Path, entries: dict) -> bool:
    """Write the whole cache atomically; False (and no exception) where it cannot be written."""
    payload = {"format": f"nmt-autotune-{VERSION}", "entries": entries}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (json.dumps(payload, indent=1) + "\n").encode())
    except OSError:
        return False
    return True


def _choice_from_entry(entry: object, device: torch.device, request: Request) -> Choice | None:
    """A cached entry back as a Choice, or None if it does not have the right shape or names what
    cannot run on ``device`` (the file can be edited, or copied from another machine)."""
    if not isinstance(entry, dict):
        return None
    try:
        choice = Choice(
            precision=str(entry["precision"]),
            attention=str(entry["attention"]),
            threads=None if entry["threads"] is None else int(entry["threads"]),
            timings={str(d): {str(k): float(v) for k, v in o.items()} for d, o in entry["timings"].items()},
            source="cached",
            measured_on=str(entry["measured_on"]),
            fp32_matmul=str(entry["fp32_matmul"]),
            decode_attention=None if entry["decode_attention"] is None else str(entry["decode_attention"]),
            decode_fp32_matmul=None if entry["decode_fp32_matmul"] is None else str(entry["decode_fp32_matmul"]),
            cpu_use=float(entry["cpu_use"]) if is_number(entry.get("cpu_use")) else None,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    kernels = (NO_KERNEL,) if request.attention == NO_KERNEL else ("sdpa", "explicit")
    valid = (
        choice.precision in ("fp32", "bf16", "fp16")
        and choice.attention in kernels
        and (choice.threads is None or choice.threads > 0)
        and choice.fp32_matmul in FP32_MATMULS
        and choice.decode_attention in (None, *kernels)
        and choice.decode_fp32_matmul in (None, *FP32_MATMULS)
    )
    return choice if valid and _runs_here(choice, device, request) else None


def _runs_here(choice: Choice, device: torch.device, request: Request) -> bool:
    """Whether ``device`` can run ``choice``: its precision, its threads (at most the usable CPUs, or
    the number the request names; a thousand million threads kill the process in the OpenMP runtime),
    and oneDNN products on a CPU only where this torch has them."""
    if precision_problem(choice.precision, device.type, bf16_available(device)) is not None:
        return False
    named = request.threads if isinstance(request.threads, int) else 0
    if choice.threads is not None and choice.threads > max(usable_cpus(), named):
        return False
    uses_onednn = "onednn" in (choice.fp32_matmul, choice.decode_fp32_matmul)
    return device.type != "cpu" or not uses_onednn or onednn_available()


# ---------------------------------------------------------------------------- the entry point


def check_fp32_matmul(name: str, device_type: str) -> None:
    """Refuse, naming the key, the oneDNN library asked for by name where it cannot run."""
    key = "config key 'train.fp32_matmul'"
    if name == "onednn" and device_type != "cpu":
        raise NMTError(f"{key}: onednn is a CPU library; use auto or blas on a GPU")
    if name == "onednn" and not onednn_available():
        raise NMTError(f"{key}: this torch build cannot send products to oneDNN; use auto or blas")


def choose(
    request: Request,
    model: ModelConfig,
    vocab: int,
    max_tokens: int,
    max_len: int,
    device: torch.device,
    log: Callable[[str], None],
    world_threads: int | None = None,
    cache: Path | None = None,
    run_record: Path | None = None,
    record_use: RecordUse = "resume",
) -> Choice:
    """The settings to run with: the config's where it names them, measured (or cached) where 'auto'.

    ``world_threads`` fixes the thread count (ranks of a torchrun job share a machine's cores).
    ``run_record`` is a training run's record of its choice (``RunDir.kernels_path``), used as
    ``record_use`` says. "resume": a run resumed from a training state on the same machine, torch
    and settings keeps the kernels it started with, whatever the cache now says or a new measurement
    would find, so that it computes what the run left alone would have; elsewhere it is chosen
    again, said in the log, and recorded. "start": a run with no training state yet (a new run, or
    a first start that failed before its first state) has nothing to agree with: it chooses, and
    records. "read": a reader of the run (``nmt translate``) decodes in the run's choice where the
    record holds one for this machine, torch and settings and measured on cores no other job shared
    (one measured on busy cores chose what they favoured, often one thread), else as the cache says;
    it never writes.
    """
    check_precision(request.precision, device.type, bf16_available(device))
    request = for_model(request, model)  # nothing to measure, cache or log for a model without a kernel
    if device.type == "cpu":  # elsewhere the library serves nothing (translating a CPU run on a GPU)
        check_fp32_matmul(request.fp32_matmul, device.type)
    left = left_to_auto(request, device.type, world_threads)
    if not left:
        threads = None if device.type != "cpu" else world_threads or int(request.threads)
        attention = "sdpa" if request.attention == "auto" else request.attention
        return Choice(request.precision, attention, threads, fp32_matmul=request.named_fp32_matmul)
    info = machine(device)
    shape = tuning_shape(model, vocab, max_tokens, max_len, device.type)
    if world_threads is not None:
        request = replace(request, threads=world_threads)
    key = cache_key(info, shape, request)
    if run_record is not None and record_use != "start":
        kept = _kept_by_run(run_record, key, device, request, log if record_use == "resume" else None)
        if kept is not None and record_use == "read" and measured_busy(kept):
            # Only what is still auto here is said, and measured again: what the config names is no choice.
            log(
                f"auto: the run's {_listed(left)} {'was' if len(left) == 1 else 'were'} measured while other "
                f"jobs shared the cores ({kept.cpu_use:.0%} of the CPU time its threads would have had alone): "
                "decoding in this machine's own"
            )
        elif kept is not None:
            if measured_busy(kept):
                log(f"auto: {busy_run_choice(kept.cpu_use, left)}")
            return kept
    choice = _cached_or_measured(request, shape, device, world_threads, key, info, cache or cache_dir(), log, left)
    if run_record is not None and record_use == "start" and measured_busy(choice):
        log(f"auto: {busy_run_choice(choice.cpu_use, left)}")
    if run_record is not None and record_use != "read" and not write_cache(run_record, {key: choice.to_dict()}):
        log(f"auto: could not write {run_record}; a resumed run chooses again")
    return choice


# The config key of each dimension ``left_to_auto`` names.
_AUTO_KEYS = {
    "fp32 product library": "train.fp32_matmul",
    "precision": "train.precision",
    "attention kernel": "train.attention",
    "threads": "train.threads",
}


def busy_run_choice(use: float, left: list[str]) -> str:
    """Said where a training run starts or resumes in a choice measured on busy cores: it stays the
    run's. The advice names the keys still left to auto (``left``), not ones the config already gives."""
    keys = _listed([_AUTO_KEYS[name] for name in left])
    return (
        f"this run's choice was measured while other jobs shared the cores ({use:.0%} of the CPU time its "
        "threads would have had alone), and the run keeps it for its life, resumes included, so that it "
        "computes as it would have uninterrupted; to train in the machine's own choice, start the run anew "
        f"on quiet cores, or name {keys} in the config"
    )


def _kept_by_run(
    record: Path, key: str, device: torch.device, request: Request, log: Callable[[str], None] | None
) -> Choice | None:
    """The choice ``record`` holds for ``key``; None where there is no record (said nothing), or it
    holds none this machine can run for ``key`` (said to ``log`` where given, a resume's: the run
    then follows another path)."""
    if not record.exists():
        return None
    entries = read_cache(record)
    kept = _choice_from_entry(entries.get(key), device, request)
    if kept is not None:
        return replace(kept, source="kept")
    if log is None:
        return None
    if key in entries:
        why = "holds a choice for these settings that is damaged or cannot run here"
    elif entries:
        why = "holds the choice for other settings, another machine or another torch"
    else:
        why = "cannot be read, or was written by another version of nmt"
    log(f"auto: {record} {why}; choosing again (the resumed run computes in other kernels from here on)")
    return None


def left_to_auto(request: Request, device_type: str, world_threads: int | None = None) -> list[str]:
    """What ``request`` leaves to ``auto`` on ``device_type``: the dimensions a measurement times,
    in the log's words (a decoding reader uses the kernels and library as measured for decoding)."""
    left = ["fp32 product library"] if measures_fp32_matmul(request, device_type) else []
    left += ["precision"] if request.precision == "auto" else []
    left += ["attention kernel"] if request.attention == "auto" else []
    if device_type == "cpu" and world_threads is None and request.threads == "auto":
        left.append("threads")
    return left


def _listed(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def measured_busy(choice: Choice) -> bool:
    """Whether ``choice`` was measured while other jobs shared the cores: its threads count and
    kernels are then what a busy machine favoured (one thread where the other core was taken)."""
    return choice.cpu_use is not None and choice.cpu_use < BUSY_CPU_USE


def _cached_or_measured(
    request: Request,
    shape: Shape,
    device: torch.device,
    world_threads,
    key: str,
    info: dict,
    cache: Path,
    log,
    left: list[str],
) -> Choice:
    """The machine's cached choice for ``key``, or a new measurement (cached unless other jobs
    shared the cores while it ran)."""
    path = cache / CACHE_FILE
    cached = _choice_from_entry(read_cache(path).get(key), device, request)
    if cached is not None:
        return cached
    start = time.perf_counter()
    log(f"auto: measuring {_listed(left)} on {machine_name(info)} ...")
    choice = measure(request, shape, device, world_threads)
    if measured_busy(choice):
        log(
            f"auto: other jobs shared the cores while measuring ({choice.cpu_use:.0%} of the CPU time "
            "its threads would have had alone): used for this run only, not cached"
        )
        return choice
    entry = {**choice.to_dict(), "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    entry["seconds"] = round(time.perf_counter() - start, 2)
    # Read again: another process may have cached its own choice while this one measured.
    if not write_cache(path, {**read_cache(path), key: entry}):
        log(f"auto: could not write the cache {path}; the next run measures again")
    return choice


def apply_threads(choice: Choice) -> None:
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
