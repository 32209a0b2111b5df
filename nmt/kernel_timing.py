"""The measurement behind ``auto``: a small copy of the model takes training and decoding steps
with each candidate, and the fastest wins by a margin.

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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from nmt.config import ModelConfig
from nmt.device import Precision, adamw, bf16_available, precision_candidates
from nmt.kernel_choice import NO_KERNEL, Choice, Request, candidate, for_model
from nmt.machine import machine, machine_name, usable_cpus
from nmt.models.linear import FP32_MATMULS, onednn_available

MARGIN = 0.05  # a candidate must be this much faster than the default to replace it
DECODE_BEAM = 4  # beams per sentence in the decoding measurement


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
