"""``nmt bench``: training and decoding speed on a real config, next to the matrix-multiply
peak of the same device and precision measured in the same run."""

from __future__ import annotations

import json
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from nmt.config import Config, DecodeConfig
from nmt.config_sources import set_giving
from nmt.corpus import clean_pairs, read_parallel
from nmt.device import Precision, bf16_available
from nmt.errors import NMTError
from nmt.files import atomic_write_bytes, check_output, check_stdout, write_stdout
from nmt.machine import machine, machine_name
from nmt.models.linear import onednn_available, onednn_mm

if TYPE_CHECKING:
    from nmt.translate import Translator


@dataclass(frozen=True)
class ModelDecoding:
    """The trained run ``--model`` names, and where and in which precision it is decoded: as
    ``nmt translate --model RUN_DIR`` decodes it (device auto, the run's own train.precision),
    unless a --set gave train.device or train.precision, which stand for translate's --device and
    --precision. The config file's own values are the training benchmark's: a bf16 run was decoded
    in the fp32 of the config it was benchmarked with. Its decoding settings are the run's own decode
    section (as 'nmt tune-decode' may have left it), each key a --set gave replaced by the --set's
    (decode.batch_tokens, where a batch runs out of memory), as translate's decoding options do."""

    run: Path
    device: str = "auto"  # "auto", or the --set's (decoded on the trainer's device: the CPU where it fell back)
    precision: str | None = None  # None: the run's train.precision (load_translator's rule)
    decode_set: tuple[tuple[str, object], ...] = ()  # (decode key, value) a --set gave


def model_decoding(run: Path, cfg: Config, overrides: list[str]) -> ModelDecoding:
    """How ``run`` is decoded by a bench of ``cfg``, read with these --set ``overrides``."""

    def by_set(key: str) -> bool:  # the key itself, or its whole section
        return set_giving(key, overrides) is not None

    return ModelDecoding(
        run,
        cfg.train.device if by_set("train.device") else "auto",
        cfg.train.precision if by_set("train.precision") else None,
        tuple((f.name, getattr(cfg.decode, f.name)) for f in fields(cfg.decode) if by_set(f"decode.{f.name}")),
    )


def model_decode(model: ModelDecoding, run_cfg: Config) -> DecodeConfig:
    """The decoding settings ``model``'s run is benchmarked with: its own, with the --set's keys."""
    return replace(run_cfg.decode, **dict(model.decode_set))


def decode_line(decode: DecodeConfig, whose: str) -> str:
    """The decoding settings the figures were taken with, for the log (the beams are the benchmark's)."""
    return (
        f"decoding settings ({whose}): beams 1 and 5 (the benchmark's), length penalty {decode.length_penalty}, "
        f"max length {decode.max_len_a:g} x source + {decode.max_len_b}, batch_tokens {decode.batch_tokens}"
    )


def matmul_peak_gflops(device: torch.device, precision: Precision, sizes=None, seconds: float = 1.0) -> float:
    """Best GFLOP/s of square matmuls (2 n^3 FLOPs each, random data) in the given precision, by the
    best library at hand: fp32 on a CPU also through oneDNN, which beat torch's BLAS 2x on an AMD
    EPYC (nmt/models/linear.py). ``seconds`` per library. Default sizes: 1024 and 2048 on a CPU,
    4096 and 8192 on a GPU (smaller ones leave it idle)."""
    sizes = sizes or ((4096, 8192) if device.type == "cuda" else (1024, 2048))
    products = [torch.mm]
    if device.type == "cpu" and precision.name == "fp32" and onednn_available():
        products.append(onednn_mm)
    best = 0.0
    for product in products:
        for n in sizes:
            a = torch.randn(n, n, device=device, dtype=precision.dtype)
            b = torch.randn(n, n, device=device, dtype=precision.dtype)
            product(a, b)
            if device.type == "cuda":  # the operands' making and the warm-up product, still queued, are not timed
                torch.cuda.synchronize()
            calls, start = 0, time.perf_counter()
            while True:
                product(a, b)
                calls += 1
                if device.type == "cuda":
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - start
                if elapsed >= seconds / len(sizes):
                    break
            best = max(best, 2 * n**3 * calls / elapsed / 1e9)
    return best


def reset_peak_memory(device: torch.device) -> None:
    """Have ``_peak_memory_mb`` report the peak from here on. On a GPU the allocator's peak is else the
    process's: the matmul peak's operands, and in ``make gpu-check`` the runs before (an eager bench's
    in the compiled one's). A CPU's peak resident size cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def scratch_trainer(cfg: Config, suffix: str, log: Callable[[str], None]):
    """A set-up trainer on ``cfg`` in its own run directory RUN_DIR-``suffix``, starting from fresh
    weights (prepared data and tokenizers there are reused); it never writes a checkpoint."""
    from nmt.rundir import RunDir
    from nmt.trainer import Trainer

    scratch = replace(cfg, run_dir=f"{cfg.run_dir}-{suffix}")
    run = RunDir(scratch.run_dir)
    if run.has_checkpoints():  # a trained run there is not ours to rewrite
        raise NMTError(
            f"{run.path}: holds a trained run's checkpoints, but is where this command keeps its scratch run "
            f"(run_dir + '-{suffix}'): move that run, or give another run_dir"
        )
    trainer = Trainer(scratch, run, log)
    trainer.setup(resume=False)
    return trainer


def update_groups(trainer, count: int) -> list:
    """The first ``count`` updates' batch groups of epoch 1 (repeated if the epoch is shorter)."""
    batches = trainer.epoch_plan()
    acc = trainer.cfg.train.accumulate
    groups = [batches[i : i + acc] for i in range(0, len(batches), acc)]
    if len(groups) < count:
        groups = groups * (count // max(len(groups), 1) + 1)
    return groups[:count]


def _timed_updates(trainer, groups: list) -> tuple[list[float], int, int]:
    """Seconds of each update over ``groups``, and the target and source tokens trained on."""
    times, trg_tokens, src_tokens = [], 0, 0
    for g in groups:
        start = time.perf_counter()
        stats = trainer.train_step(g)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if stats is not None:
            trg_tokens += stats["trg_tokens"]
            src_tokens += stats["src_tokens"]
    return times, trg_tokens, src_tokens


def bench_training(trainer, updates: int, warmup: int, log: Callable[[str], None]) -> dict:
    """Time ``updates`` real optimizer updates after ``warmup`` untimed ones, twice over the same batches.

    The first pass meets every batch shape for the first time, as the first epoch does; kernels
    compiled per shape (oneDNN's, for bf16 on CPUs) are built there. The second pass, over the same
    shapes, is what every later epoch costs: the headline figure.
    """
    groups = update_groups(trainer, warmup + updates)
    for g in groups[:warmup]:
        trainer.train_step(g)
    if trainer.device.type == "cuda":  # the last warm-up optimizer step, still queued, is not the first update timed
        torch.cuda.synchronize()
    timed = groups[warmup:]
    first, _, _ = _timed_updates(trainer, timed)
    step_times, trg_tokens, src_tokens = _timed_updates(trainer, timed)
    seconds = sum(step_times)
    n_sent = sum(len(b) for g in timed for b in g)
    flops = trainer.model.flops_per_token(src_tokens / n_sent, trg_tokens / n_sent)
    result = {
        "updates": len(step_times),
        "seconds": seconds,
        "median_update_seconds": statistics.median(step_times),
        # A stalled update (waiting, or compiling for a new shape) shows here, not in the mean.
        "max_over_median_update": max(step_times) / statistics.median(step_times),
        "first_pass_max_over_median_update": max(first) / statistics.median(first),
        "trg_tokens_per_s": trg_tokens / seconds,
        "src_trg_tokens_per_s": (src_tokens + trg_tokens) / seconds,
        "trg_tokens_per_update": trg_tokens / len(step_times),
        "first_pass_trg_tokens_per_s": trg_tokens / sum(first),
        "flops_per_trg_token": flops,
        "model_gflops": flops * trg_tokens / seconds / 1e9,
    }
    log(
        f"training: {result['trg_tokens_per_s']:.0f} target tokens/s, "
        f"{result['src_trg_tokens_per_s']:.0f} source+target tokens/s "
        f"({result['trg_tokens_per_update']:.0f} target tokens/update, {len(step_times)} updates; "
        f"{result['first_pass_trg_tokens_per_s']:.0f} target tokens/s the first time each batch shape is seen)"
    )
    log(
        f"update time: median {1e3 * result['median_update_seconds']:.0f} ms, slowest/median "
        f"{result['max_over_median_update']:.2f} ({result['first_pass_max_over_median_update']:.2f} the first time)"
    )
    return result


def bench_decoding(translator, lines: list[str], refs: list[str] | None, decode, log) -> dict:
    from nmt.scoring import bleu_only

    out = {}
    for name, beam in (("greedy", 1), ("beam5", 5)):
        cfg = replace(decode, beam_size=beam, nbest=1)
        translator.translate(lines[:8], cfg)  # warm-up: allocator, kernels
        start = time.perf_counter()
        hyps = [h[0] for h in translator.translate(lines, cfg)]
        if translator.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        n_tokens = sum(len(ids) + 1 for ids in translator.trg_tok.encode(hyps))
        out[name] = {
            "sentences": len(lines),
            "seconds": seconds,
            "sentences_per_s": len(lines) / seconds,
            "tokens_per_s": n_tokens / seconds,
        }
        if refs is not None:
            out[name]["bleu"] = bleu_only(hyps, refs, decode.bleu_tokenize, decode.bleu_lowercase)
        bleu = f", BLEU {out[name]['bleu']:.2f}" if refs is not None else ""
        log(
            f"decoding {name}: {len(lines)} sentences in {seconds:.1f} s = "
            f"{out[name]['sentences_per_s']:.1f} sentences/s, {out[name]['tokens_per_s']:.0f} tokens/s{bleu}"
        )
    return out


def run_bench(
    cfg: Config,
    model: ModelDecoding | None,
    updates: int,
    warmup: int,
    decode_sentences: int | None,
    log: Callable[[str], None],
) -> dict:
    trainer = scratch_trainer(cfg, "bench", log)
    try:
        return _bench(trainer, cfg, model, updates, warmup, decode_sentences, log)
    finally:
        trainer.close()


def _bench(trainer, cfg: Config, model: ModelDecoding | None, updates: int, warmup: int, decode_sentences, log) -> dict:
    from nmt.translate import Translator

    device, precision = trainer.device, trainer.precision
    info = machine(device)
    report: dict = {
        "config": cfg.name,
        "device": str(device),
        "machine": info,
        "machine_name": machine_name(info),
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "precision": precision.name,
        "auto": trainer.choice.to_dict(),
        "parameters": trainer.model.num_parameters(),
        "max_tokens": cfg.train.max_tokens,
    }
    threads = torch.get_num_threads()
    log(f"benchmark: {cfg.name} on {report['machine_name']} ({threads} thread{'' if threads == 1 else 's'})")
    names = ["fp32"] + (["bf16"] if bf16_available(device) else []) + (["fp16"] if device.type == "cuda" else [])
    peaks = {name: matmul_peak_gflops(device, Precision(device.type, name)) for name in names}
    report["matmul_peak_gflops"] = peaks
    log("matmul peak: " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()))
    reset_peak_memory(device)  # the peak memory reported is training's and decoding's

    train = bench_training(trainer, updates, warmup, log)
    train["utilization_vs_peak"] = train["model_gflops"] / peaks[precision.name]
    train["utilization_vs_fp32_peak"] = train["model_gflops"] / peaks["fp32"]
    log(
        f"model FLOPs: {train['flops_per_trg_token'] / 1e6:.1f} MFLOP per target token -> "
        f"{train['model_gflops']:.1f} GFLOP/s = {100 * train['utilization_vs_peak']:.0f}% of the "
        f"{precision.name} matmul peak ({100 * train['utilization_vs_fp32_peak']:.0f}% of fp32's)"
    )
    report["training"] = train

    src, trg = decoded_pairs(cfg)
    if decode_sentences:
        src, trg = src[:decode_sentences], trg[:decode_sentences]
    if model is not None:
        translator, decode = model_translator(model, trainer.device, log)
        report["decode_model"] = str(model.run)
    else:
        log("decoding with the untrained benchmark model: pass --model RUN_DIR for realistic output lengths")
        data, kernels = trainer.data, trainer.choice.decoding()
        translator = Translator(trainer.model, data.src_tok, data.trg_tok, device, precision, kernels=kernels)
        report["decode_model"], decode = None, cfg.decode
        log(decode_line(decode, "the config's decode section"))
    report["decoding_kernels"] = decoding_kernels(translator)
    report["decoding"] = bench_decoding(translator, src, trg, decode, log)
    report["peak_memory_mb"] = _peak_memory_mb(device)
    log(f"peak memory: {report['peak_memory_mb']:.0f} MiB")
    return report


def decoded_pairs(cfg: Config) -> tuple[list[str], list[str]]:
    """The pairs the decoding benchmark translates: data.test's (data.dev's where there is none), cleaned
    as translation reads them. None left is an error naming the key: there would be nothing to time."""
    split = "test" if cfg.data.test is not None else "dev"
    spec = getattr(cfg.data, split)
    src, trg = read_parallel(spec, cfg.data.src_lang, cfg.data.trg_lang)
    src, trg, _ = clean_pairs(src, trg)
    if not src:
        raise NMTError(f"config key 'data.{split}': {spec.path}: no sentence pair to decode")
    return src, trg


def model_translator(
    model: ModelDecoding, trained_on: torch.device, log: Callable[[str], None]
) -> tuple[Translator, DecodeConfig]:
    """The ``--model`` run loaded as 'nmt translate' loads it (``ModelDecoding``) with the decoding
    settings translate would use, and log lines saying what it decodes in and why: the scratch run's
    training choice and the --config's decode section do not say it."""
    from nmt.rundir import RunDir
    from nmt.translate import load_translator

    run = RunDir.existing(model.run)
    device = "auto" if model.device == "auto" else trained_on.type
    translator = load_translator(run, device, model.precision, log)
    k = decoding_kernels(translator)
    device_from = "auto" if model.device == "auto" else "--set train.device"
    run_cfg = run.config()
    run_precision = run_cfg.train.precision
    if model.precision is not None:
        precision_from = "--set train.precision"
    elif run_precision == "auto":
        precision_from = "auto's choice, the run's train.precision"
    elif run_precision == k["precision"]:
        precision_from = "the run's train.precision"
    else:  # load_translator warned why
        precision_from = f"auto's choice: the run's train.precision {run_precision} cannot run here"
    log(
        f"decoding {model.run} as 'nmt translate' does: device {k['device']} ({device_from}), precision "
        f"{k['precision']} ({precision_from}), attention {k['attention']}, fp32 matmul {k['fp32_matmul']}"
    )
    decode = model_decode(model, run_cfg)
    set_keys = ", ".join(f"--set decode.{key}" for key, _ in model.decode_set)
    log(decode_line(decode, "the run's decode section" + (f", {set_keys}" if set_keys else "")))
    return translator, decode


def decoding_kernels(translator) -> dict:
    """The device, precision, attention kernel and fp32 product library the decoding figures were taken in."""
    attention, fp32_matmul = translator.kernels or (translator.model.attention_kernel, translator.model.fp32_matmul)
    return {
        "device": translator.device.type,
        "precision": translator.precision.name,
        "attention": attention,
        "fp32_matmul": fp32_matmul,
    }


def check_json_output(json_path: Path, cfg: Config, config_file: Path, model_dir: str | None) -> None:
    """``--json`` may be none of what bench reads (its config, the corpora) nor a file of a run it
    uses: the config's run, its scratch run RUN_DIR-bench, the ``--model`` run."""
    from nmt.provenance import corpus_files
    from nmt.rundir import RunDir

    d = cfg.data
    specs = [spec for spec in (d.train, d.dev, d.test) if spec is not None]
    corpora = [f for spec in specs for f in corpus_files(spec, d.src_lang, d.trg_lang)]
    check_output(json_path, [config_file, *corpora], "--json")
    runs = [(RunDir(cfg.run_dir), cfg), (RunDir(f"{cfg.run_dir}-bench"), cfg)]
    if model_dir is not None:
        model_run = RunDir(model_dir)
        runs.append((model_run, model_run.config()))
    for run, run_cfg in runs:
        run.check_output(json_path, "--json", run_cfg)


def main(
    cfg: Config,
    config_file: Path,
    model: ModelDecoding | None,
    updates: int,
    warmup: int,
    decode_sentences,
    json_path,
    log,
) -> None:
    from nmt import checkpoint_choice
    from nmt.rundir import RunDir

    if model is not None:  # a wrong run directory, or one with no model yet, is reported before any work
        model_run = RunDir.existing(model.run)
        checkpoint_choice.model_checkpoint(model_run, model_run.config())
    if json_path:
        check_json_output(Path(json_path), cfg, config_file, None if model is None else str(model.run))
    else:
        check_stdout("give --json FILE for the report")
    report = run_bench(cfg, model, updates, warmup, decode_sentences, log)
    text = json.dumps(report, indent=1) + "\n"
    if json_path:
        atomic_write_bytes(Path(json_path), text.encode("utf-8"))
        log(f"wrote {json_path}")
    else:
        write_stdout(text)
