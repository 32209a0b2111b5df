"""Measured ``auto`` choices: precision, attention kernel, the fp32 product library and CPU threads.

Which settings are fastest depends on the machine, so ``auto`` is a measurement, not a rule. bf16
autocast runs several times faster than fp32 on a CPU with AMX, and several times slower where
oneDNN only emulates bf16 (AVX-512 without AVX512-BF16), though torch calls bf16 "supported" on
both. The fused SDPA attention kernel beats two plain matmuls in fp32 on a CPU and loses badly in
bf16. torch's BLAS (MKL) runs AVX2 kernels on AMD CPUs, where oneDNN's fp32 products ran twice as
fast (nmt/models/linear.py). So at start-up a copy of the model with one encoder and one decoder
layer (the run's width, heads, feed-forward size and vocabulary) takes a few training steps on a
batch of the run's kind, for each candidate in turn: the fp32 product library, then precision and
attention kernel, then threads. The fastest wins, under one rule: a candidate replaces the default
(BLAS; fp32; SDPA; all cores; bf16 over fp16) only if it is at least ``MARGIN`` faster, so
``auto`` is never slower than fp32 and noise never flips a choice for nothing.

Decoding is another workload: one query per step, against caches, over a few hundred beam rows.
There the library and the kernel that training chose need not be the faster ones (on a 2-core AMD
EPYC limited to AVX2, where the two libraries tie in training, oneDNN and the explicit attention
formula decoded test_2016_flickr 13% faster than the BLAS and SDPA). So the same model, in the
chosen precision and threads, then takes a few beam-search decoding steps with each pair of the
library and kernel left to ``auto``; training's pair is the default there.

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
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch

from nmt.config import ModelConfig, TrainConfig
from nmt.device import Precision, adamw, bf16_available, check_precision, precision_candidates, precision_problem
from nmt.errors import NMTError
from nmt.files import atomic_write_bytes
from nmt.models.linear import FP32_MATMULS, onednn_available

VERSION = 7  # bump when the measurement changes, so old cache entries are not reused
MARGIN = 0.05  # a candidate must be this much faster than the default to replace it
DECODE_BEAM = 4  # beams per sentence in the decoding measurement
BUSY_CPU_USE = 0.7  # below this share of threads x wall time in CPU time, the cores were shared
CACHE_FILE = "autotune.json"
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "DNNL_MAX_CPU_ISA")
# The attention "kernel" of a model that has none to choose (the RNN: its attention is a few small
# products of its own), so that neither the log nor a cached choice names one it does not use.
NO_KERNEL = "none"
# How ``choose`` uses a training run's record of its choice (``run_record``): see there.
RecordUse = Literal["resume", "start", "read"]


@dataclass(frozen=True)
class Request:
    """What the config asks for; 'auto' is measured."""

    precision: str = "auto"
    attention: str = "auto"
    threads: int | str = "auto"
    fp32_matmul: str = "auto"

    @property
    def named_fp32_matmul(self) -> str:
        """The product library asked for, the BLAS where the choice is left to ``auto``."""
        return "blas" if self.fp32_matmul == "auto" else self.fp32_matmul

    @classmethod
    def from_train(cls, t: TrainConfig, precision: str | None = None) -> Request:
        threads = "auto" if t.threads is None else t.threads
        return cls(precision or t.precision, t.attention, threads, t.fp32_matmul)


@dataclass(frozen=True)
class Choice:
    """The settings a run uses, with the step times (ms) they were chosen on."""

    precision: str
    attention: str
    threads: int | None  # CPU intra-op threads; None on a GPU
    timings: dict[str, dict[str, float]] = field(default_factory=dict)  # dimension -> candidate -> ms
    source: str = "config"  # config | measured | cached | kept (by a resumed run: run_record)
    measured_on: str = ""
    cpu_use: float | None = None  # CPU time / (wall time x threads) while measuring, on a CPU
    fp32_matmul: str = "blas"  # library of fp32 CPU products: blas or onednn
    decode_attention: str | None = None  # the kernel for decoding, where measured apart; None: ``attention``
    decode_fp32_matmul: str | None = None  # the library for decoding, where measured apart; None: ``fp32_matmul``

    def decoding(self) -> tuple[str, str]:
        """(attention kernel, fp32 product library) for decoding."""
        return self.decode_attention or self.attention, self.decode_fp32_matmul or self.fp32_matmul

    def describe(self) -> str:
        """One line for the log: the choice, and the figures it was made on."""
        threads = "" if self.threads is None else f", {self.threads} thread{'' if self.threads == 1 else 's'}"
        cpu_fp32 = self.precision == "fp32" and self.threads is not None
        library = f", fp32 matmul {self.fp32_matmul}" if cpu_fp32 else ""
        kernel = "" if self.attention == NO_KERNEL else f", attention {self.attention}"
        head = f"precision {self.precision}{library}{kernel}{threads}"
        attention, fp32_matmul = self.decoding()
        if (attention, fp32_matmul) != (self.attention, self.fp32_matmul):
            parts = [] if attention == NO_KERNEL else [f"attention {attention}"]
            parts += [f"fp32 matmul {fp32_matmul}"] if cpu_fp32 else []
            if parts:
                head += "; decoding with " + ", ".join(parts)
        if not self.timings:
            return f"{head} (from the config)"
        figures = "; ".join(
            f"{dim}: " + ", ".join(f"{name} {ms:.1f}" for name, ms in options.items())
            for dim, options in self.timings.items()
        )
        where = {"cached": "cached from an earlier measurement", "kept": "kept from the run's start"}.get(
            self.source, "measured now"
        )
        return f"{head} ({where} on {self.measured_on}; ms per tuning step: {figures})"

    def to_dict(self) -> dict:
        return asdict(self)


def has_attention_kernel(model: ModelConfig) -> bool:
    """Whether ``model`` computes attention with a kernel to choose (``train.attention``): the Transformer."""
    return model.type == "transformer"


def for_model(request: Request, model: ModelConfig) -> Request:
    """``request`` with no attention kernel to measure or name for a model that has none."""
    return request if has_attention_kernel(model) else replace(request, attention=NO_KERNEL)


def candidate(first: str, kernel: str) -> str:
    """A timed candidate's name: "precision/kernel" or "library/kernel", the first part alone
    where the model has no kernel."""
    return first if kernel == NO_KERNEL else f"{first}/{kernel}"


# ---------------------------------------------------------------------------- the machine


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


# ---------------------------------------------------------------------------- the cache


def cache_dir() -> Path:
    if os.environ.get("NMT_CACHE_DIR"):
        return Path(os.environ["NMT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nmt"


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


# ---------------------------------------------------------------------------- what is measured


@dataclass(frozen=True)
class Shape:
    """The tuning model and batch: the run's layer shapes and vocabulary, one layer each side."""

    model: ModelConfig
    vocab: int
    sentences: int
    length: int
    decode_sentences: int  # sentences of the decoding measurement, DECODE_BEAM beams each


def tuning_shape(model: ModelConfig, vocab: int, max_tokens: int, max_len: int, device_type: str) -> Shape:
    """A batch of the run's kind but small enough to time in well under a second per step on a
    CPU: ``sentences`` x ``length`` tokens each side, length 24 (a typical sentence in subwords).
    Decoding is measured on more sentences, 256 beam rows on a CPU: with a few dozen, products too
    small to be like a translation's (a thousand rows and more) hid most of what the library changes."""
    tokens = min(max_tokens, 512 if device_type == "cpu" else 16384)
    length = max(2, min(max_len, 24))
    small = replace(model, encoder_layers=1, decoder_layers=1, dropout=0.1 if model.dropout else 0.0)
    decode_rows = 256 if device_type == "cpu" else 2048
    return Shape(small, vocab, max(1, tokens // length), length, decode_rows // DECODE_BEAM)


def cache_key(info: dict, shape: Shape, request: Request) -> str:
    parts = {"version": VERSION, "machine": info, "shape": asdict(shape), "request": asdict(request)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _batch(shape: Shape, device: torch.device, sentences: int | None = None) -> tuple[torch.Tensor, ...]:
    """Random token ids (never 0, the pad id here) for ``shape.sentences`` pairs, or ``sentences``;
    the last quarter of every other source is padding."""
    g = torch.Generator().manual_seed(0)
    B, T, V = sentences or shape.sentences, shape.length, shape.vocab
    src = torch.randint(1, V, (B, T), generator=g)
    src_mask = torch.ones(B, T, dtype=torch.bool)
    src_mask[::2, T - T // 4 :] = False
    src = src.masked_fill(~src_mask, 0)
    trg = torch.randint(1, V, (B, T + 1), generator=g)
    return tuple(t.to(device) for t in (src, src_mask, trg[:, :-1], trg[:, 1:]))


def race(
    steps: dict[str, Callable[[], None]], device: torch.device, rounds: int = 3, usage: list | None = None
) -> dict[str, float]:
    """Milliseconds per call of each candidate: the fastest of ``rounds`` calls, taken in turn
    (A B C A B C ...) so that a busy machine slows every candidate alike, not whichever ran during
    the busy moment. Each first warms up (a GPU twice: its first calls pay one-time set-up). On a
    CPU a candidate whose warm-up took 4x the fastest warm-up is out (emulated bf16 need not be
    timed three times to lose): its warm-up time stands as its figure. ``usage`` collects each
    call's (wall, process CPU) seconds."""

    def timed(step: Callable[[], None]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, cpu = time.perf_counter(), time.process_time()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
        if usage is not None:
            usage.append((wall, time.process_time() - cpu))
        return wall * 1e3

    best: dict[str, float] = {}
    for name, step in steps.items():
        for _ in range(2 if device.type == "cuda" else 1):
            best[name] = timed(step)
    fastest_warmup = min(best.values())
    running = [n for n in steps if device.type == "cuda" or best[n] <= 4 * fastest_warmup]
    for n in running:
        best[n] = float("inf")
    for _ in range(rounds):
        for name in running:
            best[name] = min(best[name], timed(steps[name]))
    return best


def pick(times: dict[str, float], default: str) -> str:
    """The fastest candidate if it beats ``default`` by MARGIN, else ``default``."""
    best = min(times, key=times.get)
    return best if times[best] < (1.0 - MARGIN) * times[default] else default


def decide(grid: dict[str, float], precisions: list[str], kernels: list[str]) -> tuple[str, str]:
    """(precision, attention) from step times keyed "precision/kernel" (``candidate``); the first of each
    list is its default.

    A precision is judged by its faster kernel: fp32 stays unless a lower precision, with its best
    kernel, beats fp32 with *its* best kernel by MARGIN; fp16 must also beat bf16 by MARGIN, since
    bf16 needs no loss scaling. The kernel is then the faster one in that precision.
    """
    fastest = {p: min(grid[candidate(p, a)] for a in kernels) for p in precisions}
    precision = pick(fastest, precisions[0])
    if precision == "fp16" and "bf16" in fastest:
        precision = pick({k: fastest[k] for k in ("bf16", "fp16")}, "bf16")
    return precision, pick({a: grid[candidate(precision, a)] for a in kernels}, kernels[0])


def cpu_use(usage: list[tuple[float, float]], threads: int) -> float:
    """Process CPU time over wall time x threads for (wall, cpu) seconds: near 1 when the threads
    had their cores, well below when other jobs took turns on them."""
    wall = sum(w for w, _ in usage)
    return sum(c for _, c in usage) / (wall * threads) if wall > 0 else 1.0


def decoding_steps(model, shape: Shape, device: torch.device, precision: str) -> Callable[..., Callable[[], None]]:
    """For (library, kernel), a call that takes a few beam-search decoding steps with ``model``:
    ``shape.decode_sentences`` sentences of DECODE_BEAM beams, from a state 10 steps in (or less for
    short sentences), every step reordering the beams as a search does (each beam continues its
    neighbour). Only the model's work is timed, not the search's top-k, which neither choice changes."""
    n, K = shape.decode_sentences, DECODE_BEAM
    src, src_mask, trg_in, _ = _batch(shape, device, n)
    steps = min(4, shape.length)
    start = min(10, shape.length - steps)
    tokens = trg_in.repeat_interleave(K, dim=0)  # (n*K, T)
    rows = torch.arange(n * K, device=device)
    neighbour = rows - rows % K + (rows + 1) % K
    autocast = Precision(device.type, precision).autocast
    model.eval()
    with torch.no_grad(), autocast():
        state = model.init_state(model.encode(src, src_mask))
        state = model.reorder_state(state, rows // K)  # each sentence's K beams
        for t in range(start):
            _, state = model.decode_step(tokens[:, t], state)
            state = model.reorder_state(state, neighbour)

    def steps_with(library: str, attention: str) -> Callable[[], None]:
        def call() -> None:
            model.set_attention_kernel(attention)
            model.set_fp32_matmul(library)
            s = state
            with torch.no_grad(), autocast():
                for t in range(start, start + steps):
                    _, s = model.decode_step(tokens[:, t], s)
                    s = model.reorder_state(s, neighbour)

        return call

    return steps_with


def measure(request: Request, shape: Shape, device: torch.device, world_threads: int | None = None) -> Choice:
    """Time the candidates of every dimension the request leaves to ``auto``; return the choice."""
    from nmt.batching import Batch
    from nmt.loss import teacher_forced_loss
    from nmt.models import build_model

    torch.manual_seed(0)
    model = build_model(shape.model, shape.vocab, shape.vocab, 0).to(device).train()
    optimizer = adamw(model.parameters(), lr=1e-4)
    batch = Batch(*_batch(shape, device), n_trg_tokens=0, n_src_tokens=0, indices=[])

    def step_with(precision: str, attention: str, library: str) -> Callable[[], None]:
        def step() -> None:
            model.set_attention_kernel(attention)
            model.set_fp32_matmul(library)
            optimizer.zero_grad(set_to_none=True)
            loss, _ = teacher_forced_loss(model, model, batch, 0.1, 0, Precision(device.type, precision))
            loss.backward()
            optimizer.step()

        return step

    timings: dict[str, dict[str, float]] = {}
    threads_before = torch.get_num_threads()
    try:
        if world_threads is not None:
            torch.set_num_threads(world_threads)
        # Precision and attention kernel together: which kernel is faster depends on the precision.
        precisions = [request.precision]
        if request.precision == "auto":
            precisions = precision_candidates(device.type, bf16_available(device))
        kernels = [for_model(request, shape.model).attention]
        if kernels == ["auto"]:
            kernels = ["sdpa", "explicit"]
        usage: list[tuple[float, float]] = []
        library = request.named_fp32_matmul
        libraries_left_to_auto = measures_fp32_matmul(request, device.type)
        if libraries_left_to_auto:
            options = race({name: step_with("fp32", kernels[0], name) for name in FP32_MATMULS}, device, usage=usage)
            timings["fp32 matmul"] = options
            library = pick(options, "blas")
        steps = {candidate(p, a): step_with(p, a, library) for p in precisions for a in kernels}
        grid = race(steps, device, usage=usage)
        use = cpu_use(usage, torch.get_num_threads()) if device.type == "cpu" else None
        timings["precision" if kernels == [NO_KERNEL] else "precision/attention"] = grid
        precision, attention = decide(grid, precisions, kernels)
        threads: int | None = None
        if device.type == "cpu":
            if world_threads is not None:
                threads = world_threads
            elif request.threads == "auto":
                cpus = usable_cpus()
                run = step_with(precision, attention, library)

                def on(n: int) -> Callable[[], None]:
                    return lambda: (torch.set_num_threads(n), run())

                options = race({str(n): on(n) for n in dict.fromkeys([cpus, max(1, cpus // 2)])}, device)
                timings["threads"] = options
                threads = int(pick(options, str(cpus)))
            else:
                threads = int(request.threads)
        decode_library, decode_attention = library, attention
        race_libraries = precision == "fp32" and libraries_left_to_auto
        if len(kernels) > 1 or race_libraries:
            if threads is not None:
                torch.set_num_threads(threads)
            steps_with = decoding_steps(model, shape, device, precision)
            if race_libraries:
                pairs = {candidate(lib, a): (lib, a) for lib in FP32_MATMULS for a in kernels}
                default = candidate(library, attention)
            else:  # the library serves nothing here (bf16, fp16) or is the config's
                pairs = {a: (library, a) for a in kernels}
                default = attention
            options = race({name: steps_with(*pair) for name, pair in pairs.items()}, device)
            timings["decoding"] = options
            decode_library, decode_attention = pairs[pick(options, default)]
    finally:
        torch.set_num_threads(threads_before)
    where = machine_name(machine(device))
    return Choice(
        precision, attention, threads, timings, "measured", where, use, library, decode_attention, decode_library
    )


def measures_fp32_matmul(request: Request, device_type: str) -> bool:
    """Whether ``auto`` times the fp32 product libraries: on a CPU, where fp32 may be chosen and this
    torch build has oneDNN."""
    return (
        request.fp32_matmul == "auto"
        and request.precision in ("auto", "fp32")
        and device_type == "cpu"
        and onednn_available()
    )


def check_fp32_matmul(name: str, device_type: str) -> None:
    """Refuse, naming the key, the oneDNN library asked for by name where it cannot run."""
    key = "config key 'train.fp32_matmul'"
    if name == "onednn" and device_type != "cpu":
        raise NMTError(f"{key}: onednn is a CPU library; use auto or blas on a GPU")
    if name == "onednn" and not onednn_available():
        raise NMTError(f"{key}: this torch build cannot send products to oneDNN; use auto or blas")


# ---------------------------------------------------------------------------- the entry point


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
    record holds one for this machine, torch and settings, else as the cache says; it never writes.
    """
    check_precision(request.precision, device.type, bf16_available(device))
    request = for_model(request, model)  # nothing to measure, cache or log for a model without a kernel
    if device.type == "cpu":  # elsewhere the library serves nothing (translating a CPU run on a GPU)
        check_fp32_matmul(request.fp32_matmul, device.type)
    needs = [request.precision == "auto", request.attention == "auto"]
    needs.append(measures_fp32_matmul(request, device.type))
    if device.type == "cpu" and world_threads is None:
        needs.append(request.threads == "auto")
    if not any(needs):
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
        if kept is not None:
            return kept
    choice = _cached_or_measured(request, shape, device, world_threads, key, info, cache or cache_dir(), log)
    if run_record is not None and record_use != "read" and not write_cache(run_record, {key: choice.to_dict()}):
        log(f"auto: could not write {run_record}; a resumed run chooses again")
    return choice


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


def _cached_or_measured(
    request: Request, shape: Shape, device: torch.device, world_threads, key: str, info: dict, cache: Path, log
) -> Choice:
    """The machine's cached choice for ``key``, or a new measurement (cached unless other jobs
    shared the cores while it ran)."""
    path = cache / CACHE_FILE
    cached = _choice_from_entry(read_cache(path).get(key), device, request)
    if cached is not None:
        return cached
    start = time.perf_counter()
    log(f"auto: measuring products/precision/attention/threads on {machine_name(info)} ...")
    choice = measure(request, shape, device, world_threads)
    if choice.cpu_use is not None and choice.cpu_use < BUSY_CPU_USE:
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
