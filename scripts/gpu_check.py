"""``make gpu-check``: everything that needs CUDA, in one command, ending in one screen of results.

1. the CUDA-marked tests (tests/test_cuda.py);
2. bf16 against fp32: the first updates of the same run (same seed, batches, weights, no dropout)
   agree within a stated tolerance;
3. 300 updates in bf16 with SDPA attention and fused AdamW: the loss falls;
4. fp16 with a GradScaler: the loss falls, the scale stays finite, overflows are few (calibration);
5. batched beam search on the GPU: equal to one sentence at a time, equal to the CPU, and its speed;
6. ``nmt bench`` on Transformer-base (configs/multi30k_transformer_base.yaml), eager and compiled
   (``train.compile``): training tokens/s and utilisation against the bf16 matmul peak measured in
   the same run (target: at least 35%).

Exit status 1 if a check fails, the utilisation target included (in ``--quick`` it is only reported).
A check that raises is a FAIL row (its traceback printed as it happens) and the others still run, so
one scarce GPU session always ends in the summary screen; so does one without Multi30k, where only the
bench is not run, and one that runs past ``--max-minutes`` (default 9), where the check then running is
a FAIL row and the ones after it are not run.
``--quick`` runs the same logic on a CPU with small sizes (fp16 too, through the tests' hook that lets
it run there; the CUDA-marked tests collected, each then skipped), so CI keeps the script working.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The modules a check imports (its pip package where the name differs). On a GPU machine without
# network, the Python is the machine's own: one without them gets one line, not an ImportError's
# traceback before any result.
NEEDED = {"torch": "torch", "sentencepiece": "sentencepiece", "sacrebleu": "sacrebleu", "yaml": "pyyaml"}
NEEDED |= {"numpy": "numpy", "tqdm": "tqdm", "pytest": "pytest"}


def missing_packages(needed: dict[str, str]) -> list[str]:
    """The pip packages of ``needed`` (module -> package) that this Python cannot import."""
    import importlib.util

    return [package for module, package in needed.items() if importlib.util.find_spec(module) is None]


if __name__ == "__main__" and (lacking := missing_packages(NEEDED)):
    sys.exit(
        f"gpu-check: error: {sys.executable} lacks {', '.join(lacking)}: pip install {' '.join(lacking)} "
        "there, or name a Python that has them with GPU_PY=..."
    )

import torch  # noqa: E402

from nmt import bench, testhooks  # noqa: E402
from nmt.arg_types import positive_float, user_path  # noqa: E402
from nmt.config import config_from_dict  # noqa: E402
from nmt.config_sources import apply_overrides, read_yaml  # noqa: E402
from nmt.device import cpu_has_bf16  # noqa: E402
from nmt.errors import NMTError, error_line  # noqa: E402
from nmt.rundir import RunDir  # noqa: E402
from nmt.scoring import bleu_only  # noqa: E402
from nmt.trainer import Trainer  # noqa: E402
from nmt.training import run  # noqa: E402
from nmt.translate import load_translator  # noqa: E402

AGREE_UPDATES = 10
AGREE_TOLERANCE = 0.02  # |loss_bf16 - loss_fp32| / loss_fp32 over the first updates
MFU_TARGET = 0.35
TESTS_TIMEOUT_S = 300  # the CUDA-marked tests took under a minute on an H100; a hang must not eat the session
# The whole check's time limit: a slow compile or a hang elsewhere must not eat the session either. It
# fits one 10-minute command on a lent GPU machine, summary screen included.
MAX_MINUTES = 9.0


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (check, verdict, figures)
    figures: dict = field(default_factory=dict)
    running: str | None = None  # the check under way (``guarded``)
    # Held by a row being added and by the deadline's summary, which ends the process: no row after it.
    lock: threading.Lock = field(default_factory=threading.Lock)
    children: list[subprocess.Popen] = field(default_factory=list)  # running now (``run_child``)

    def add(self, check: str, ok: bool | None, text: str) -> None:
        verdict = "PASS" if ok else ("FAIL" if ok is not None else "info")
        with self.lock:
            self.rows.append((check, verdict, text))
            print(f"[{verdict}] {check}: {text}", flush=True)

    @property
    def failed(self) -> bool:
        return any(v == "FAIL" for _, v, _ in self.rows)

    def finish(self, out: Path, title: str) -> int:
        """Write gpu_check.json and print the summary screen; the exit status (1 where a row failed)."""
        (out / "gpu_check.json").write_text(json.dumps({"rows": self.rows, **self.figures}, indent=1) + "\n")
        print(f"\n== {title} ==")
        width = max((len(c) for c, _, _ in self.rows), default=0)
        for check, verdict, text in self.rows:
            print(f"{verdict:5} {check:{width}}  {text}", flush=True)
        print(f"gpu-check: results in {out / 'gpu_check.json'}", flush=True)
        return 1 if self.failed else 0


def start_deadline(report: Report, minutes: float, out: Path, title: Callable[[], str]) -> threading.Timer:
    """End the whole check after ``minutes``, whatever runs then (a compile, a hung kernel, a training
    slower than expected): the check under way is a FAIL row, the summary screen and gpu_check.json
    are written, and the process exits with status 1 without running the checks after it. A thread
    of its own does it, since the main thread may be inside a call that never returns to Python."""

    def expire() -> None:
        report.add(report.running or "gpu-check", False, f"not finished within --max-minutes {minutes:g}: stopped")
        with report.lock:  # held from here: the main thread, its child killed, adds no row and ends nothing
            for child in list(report.children):  # os._exit leaves them running, on the GPU, maybe hung
                kill_group(child)
            report.finish(out, title())
            os._exit(1)

    timer = threading.Timer(minutes * 60, expire)
    timer.daemon = True
    timer.start()
    return timer


def quiet(message: str) -> None:
    pass


def guarded(report: Report, check: str, run_check: Callable[[], object]) -> object | None:
    """``run_check()``'s result; where it raises, None and a FAIL row for ``check`` (the traceback
    printed now), so that the checks after it still run and the summary is still printed."""
    report.running = check
    try:
        return run_check()
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        report.add(check, False, error_line(e))
        return None
    finally:
        report.running = None


def demo_config(out: Path, name: str, sets: list[str]):
    """configs/demo.yaml with its data and run under ``out`` (relative: to the working directory)."""
    values = read_yaml(ROOT / "configs" / "demo.yaml")
    out = out.absolute()  # the config resolves relative paths against configs/, not the working directory
    data = out / "demo-data"
    base = [
        f"run_dir={out / name}",
        f"data.train={data / 'train'}",
        f"data.dev={data / 'dev'}",
        f"data.test={data / 'test'}",
        "train.max_minutes=null",
    ]
    apply_overrides(values, base + sets)
    return config_from_dict(values, ROOT / "configs")


def train_run(cfg) -> tuple[Trainer, list[dict], float]:
    """Train ``cfg`` from scratch; the trainer (closed), its per-update metrics, and seconds."""
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    trainer = Trainer(cfg, RunDir(cfg.run_dir), quiet)
    start = time.perf_counter()
    try:
        run(trainer)
    finally:
        trainer.close()
    seconds = time.perf_counter() - start
    lines = (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()
    return trainer, [r for r in map(json.loads, lines) if r["type"] == "train"], seconds


def kill_group(child: subprocess.Popen) -> None:
    """Kill ``child`` and every process it started (it leads a session of its own: ``run_child``)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_child(report: Report, command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run`` capturing text output, with the child in a session of its own and listed in
    ``report.children`` while it runs: the deadline kills it, and at ``timeout`` it is killed with
    what it started (pytest's workers), its output so far kept in the TimeoutExpired."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
    ) as child:
        report.children.append(child)
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(child)
            out, err = child.communicate()
            raise subprocess.TimeoutExpired(command, timeout, out, err) from None
        finally:
            report.children.remove(child)
    return subprocess.CompletedProcess(command, child.returncode, out, err)


def cuda_test_command() -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", str(ROOT / "tests")]


def captured_text(output: str | bytes | None) -> str:
    """A timed-out process's captured output as text: subprocess gives it as bytes even with
    ``text=True`` (decoding happens only once the process has ended), or None where there is none."""
    if isinstance(output, bytes):
        return output.decode("utf-8", errors="replace")
    return output or ""


def tests_passed(returncode: int, summary: str, quick: bool) -> bool:
    """Whether the CUDA-marked tests' run, ending in pytest's quiet ``summary`` line, is a pass: on a
    GPU every one ran and passed, none skipped; in ``--quick`` every one was collected (no test file
    failed to import) and none failed: a CPU skips them all."""
    if returncode != 0:
        return False
    if quick:
        return re.search(r"\d+ (passed|skipped)", summary) is not None
    return re.search(r"\d+ passed", summary) is not None and "skipped" not in summary


def check_tests(report: Report, quick: bool) -> None:
    """pytest -m cuda in a process of its own; in ``--quick`` too, where a CPU skips every test, so that
    the command and the reading of its summary are not first run in a GPU session."""
    try:
        done = run_child(report, cuda_test_command(), TESTS_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        print(captured_text(e.stdout)[-4000:], captured_text(e.stderr)[-2000:], sep="\n", flush=True)
        report.add("CUDA-marked tests", False, f"not finished in {TESTS_TIMEOUT_S} s: stopped (their output is above)")
        return
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    ok = tests_passed(done.returncode, summary, quick)
    report.add("CUDA-marked tests", ok, summary)
    if not ok:
        print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")


def check_agreement(report: Report, out: Path, device: str) -> None:
    if device == "cpu" and not cpu_has_bf16():
        report.add("bf16 vs fp32", None, "skipped: this CPU has no bf16 kernels")
        return
    runs = {}
    for precision in ("fp32", "bf16"):
        sets = [
            f"train.precision={precision}",
            f"train.device={device}",
            "model.dropout=0.0",
            f"train.max_updates={AGREE_UPDATES}",
            "train.warmup_updates=5",
            "train.validate_every=1000",
        ]
        _, records, _ = train_run(demo_config(out, f"agree-{precision}", sets))
        runs[precision] = [r["loss"] for r in records]
    diffs = [abs(b - a) / a for a, b in zip(runs["fp32"], runs["bf16"])]
    worst = max(diffs)
    report.figures["agreement"] = {"fp32": runs["fp32"], "bf16": runs["bf16"], "relative_diff": diffs}
    report.add(
        f"bf16 vs fp32, first {AGREE_UPDATES} updates",
        len(diffs) == AGREE_UPDATES and worst <= AGREE_TOLERANCE,
        f"loss {runs['fp32'][0]:.3f}->{runs['fp32'][-1]:.3f} (fp32) vs {runs['bf16'][0]:.3f}->{runs['bf16'][-1]:.3f}"
        f" (bf16); largest relative difference {worst:.2e} (tolerance {AGREE_TOLERANCE})",
    )


def falls(losses: list[float]) -> tuple[bool, float, float]:
    k = max(1, len(losses) // 10)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    return last < 0.5 * first, first, last


def check_bf16_training(report: Report, out: Path, device: str, updates: int) -> Path:
    precision = "bf16" if device == "cuda" or cpu_has_bf16() else "fp32"
    sets = [
        f"train.precision={precision}",
        "train.attention=sdpa",
        f"train.device={device}",
        f"train.max_updates={updates}",
        f"train.warmup_updates={min(200, updates // 3)}",
        f"train.validate_every={updates}",
    ]
    cfg = demo_config(out, "bf16-sdpa", sets)
    trainer, records, seconds = train_run(cfg)
    ok, first, last = falls([r["loss"] for r in records])
    fused = bool(trainer.optimizer.defaults.get("fused"))
    tokens = sum(r["trg_tokens"] for r in records)
    report.add(
        f"{precision} + SDPA + fused AdamW, {updates} updates",
        ok and len(records) == updates and (fused or device == "cpu"),
        f"loss {first:.2f} -> {last:.2f}; fused AdamW {fused}; {tokens / seconds:,.0f} target tokens/s "
        f"({seconds:.1f} s, validation included)",
    )
    return Path(cfg.run_dir)


# A healthy fp16 run overflows only while the GradScaler halves its scale from 65536 to what the
# gradients fit (and again every 2000 updates, when it tries a larger one): 16 halvings reach a scale of 1,
# below which gradients overflow fp16 even unscaled. Overflows are skipped, not counted as updates.
FP16_MAX_OVERFLOWS = 16


def fp16_verdict(losses: list[float], updates: int, scale: float, skipped: int) -> tuple[bool, str]:
    """(passed, figures) of the fp16 check: every one of ``updates`` recorded, the loss falls, the scale
    stays finite and positive, and no more updates were skipped than calibrating the scale takes."""
    falling, first, last = falls(losses)
    ok = falling and len(losses) == updates and 0 < scale < float("inf") and skipped <= FP16_MAX_OVERFLOWS
    text = (
        f"loss {first:.2f} -> {last:.2f}; loss scale {scale:g}; {skipped} overflowing updates skipped "
        f"(at most {FP16_MAX_OVERFLOWS})"
    )
    return ok, text


@contextmanager
def fp16_runnable(device: str) -> Iterator[None]:
    """On a CPU (``--quick``), fp16 counts as runnable while the fp16 check trains (the tests' hook
    ``nmt.testhooks.FP16_ON_CPU``: torch has fp16 autocast and a GradScaler there too), so that the
    check runs end to end before a GPU session depends on it; the setting is put back after."""
    before = os.environ.get(testhooks.FP16_ON_CPU)
    if device == "cpu":
        os.environ[testhooks.FP16_ON_CPU] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(testhooks.FP16_ON_CPU, None)
        else:
            os.environ[testhooks.FP16_ON_CPU] = before


def check_fp16(report: Report, out: Path, device: str, updates: int) -> None:
    check = f"fp16 + GradScaler, {updates} updates"
    sets = [
        "train.precision=fp16",
        f"train.device={device}",
        f"train.max_updates={updates}",
        f"train.warmup_updates={updates // 3}",
        f"train.validate_every={updates}",
    ]
    try:
        with fp16_runnable(device):
            trainer, records, _ = train_run(demo_config(out, "fp16", sets))
    except NMTError as e:  # "training diverged": the loss scale fell below its minimum
        report.add(check, False, str(e))
        return
    ok, text = fp16_verdict(
        [r["loss"] for r in records], updates, trainer.scaler.get_scale(), trainer.progress.skipped_updates
    )
    report.add(check, ok and trainer.scaler.is_enabled(), text)


def check_beam(report: Report, run_dir: Path, device: str) -> None:
    cfg = demo_config(run_dir.parent, run_dir.name, [])
    src = (run_dir.parent / "demo-data" / "test.src").read_text(encoding="utf-8").splitlines()
    ref = (run_dir.parent / "demo-data" / "test.trg").read_text(encoding="utf-8").splitlines()
    decode = cfg.decode
    gpu = load_translator(RunDir.existing(run_dir), device, "fp32")
    gpu.translate(src[:16], decode)  # warm-up
    start = time.perf_counter()
    batched = [h[0] for h in gpu.translate(src, decode)]
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    one_by_one = [h[0] for h in gpu.translate(src, decode.__class__(**{**vars(decode), "batch_tokens": 1}))]
    cpu = [h[0] for h in load_translator(RunDir.existing(run_dir), "cpu", "fp32").translate(src, decode)]
    same_batched = sum(a == b for a, b in zip(batched, one_by_one)) / len(src)
    same_cpu = sum(a == b for a, b in zip(batched, cpu)) / len(src)
    bleu = bleu_only(batched, ref)
    report.figures["beam"] = {"sentences": len(src), "seconds": seconds, "bleu": bleu}
    report.add(
        f"batched beam search (beam {decode.beam_size}, fp32)",
        same_batched >= 0.99 and same_cpu >= 0.97,
        f"{len(src)} sentences in {seconds:.2f} s = {len(src) / seconds:,.0f} sentences/s, BLEU {bleu:.2f}; "
        f"equal to one at a time: {100 * same_batched:.1f}%, to the CPU: {100 * same_cpu:.1f}%",
    )


def flops(gflops: float) -> str:
    return f"{gflops / 1e3:,.1f} TFLOP/s" if gflops >= 1e3 else f"{gflops:,.1f} GFLOP/s"


def has_cpp_compiler() -> bool:
    """Whether torch.compile's CPU backend finds a C++ compiler on PATH."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def check_bench(report: Report, out: Path, data: Path, quick: bool) -> None:
    """Eager, then compiled (``train.compile``): the last GPU ran eager at 5-10% of the peak, bound by
    the host's operator launches, which compiling fuses; one scarce GPU session measures both.
    ``out`` and ``data`` relative are to the working directory (make passes --data data/multi30k)."""
    out, data = out.absolute(), data.absolute()  # the config would resolve them against configs/
    for label, extra in (("eager", []), ("compiled", ["train.compile=true"])):
        if label == "compiled" and quick and not has_cpp_compiler():
            skipped = "skipped: torch.compile on a CPU needs a C++ compiler (g++, c++ or clang++ on PATH)"
            report.add("nmt bench, Transformer-base, compiled", None, skipped)
            continue
        values = read_yaml(ROOT / "configs" / "multi30k_transformer_base.yaml")
        sets = [
            f"run_dir={out / ('bench-' + label)}",
            f"data.train={data / 'train'}",
            f"data.dev={data / 'val'}",
            f"data.test={data / 'test_2016_flickr'}",
            *extra,
        ]
        if quick:
            sets += ["model.d_model=64", "model.ff_size=128", "model.encoder_layers=1", "model.decoder_layers=1"]
            sets += ["train.max_tokens=2048", "tokenizer.vocab_size=160"]
        apply_overrides(values, sets)
        cfg = config_from_dict(values, ROOT / "configs")
        updates, warmup = (3, 1) if quick else (40, 10)
        try:
            result = bench.run_bench(cfg, None, updates, warmup, 64 if quick else None, print)
        except Exception as e:  # e.g. no Triton for torch.compile: report it and keep the summary screen
            report.add(f"nmt bench, Transformer-base, {label}", False, error_line(e))
            continue
        report.figures[f"bench_{label}"] = result
        train = result["training"]
        mfu = train.get("utilization_vs_peak", 0.0)
        peak = result["matmul_peak_gflops"][result["precision"]]
        report.add(
            f"nmt bench, Transformer-base, {label}",
            None if quick else mfu >= MFU_TARGET,
            f"{train['trg_tokens_per_s']:,.0f} target tokens/s ({train['trg_tokens_per_update']:,.0f} per update), "
            f"{flops(train['model_gflops'])} = {100 * mfu:.1f}% of the measured {result['precision']} "
            f"peak {flops(peak)} (target {100 * MFU_TARGET:.0f}%); auto chose {result['auto']['precision']}"
            f"/{result['auto']['attention']}; beam 5 on test: {result['decoding']['beam5']['sentences_per_s']:,.0f} "
            "sentences/s (untrained model)",
        )


def run_checks(report: Report, args: argparse.Namespace, device: str) -> None:
    """Every check in turn, each guarded: one that raises is a FAIL row and the next one runs."""
    guarded(report, "CUDA-marked tests", lambda: check_tests(report, args.quick))
    guarded(report, f"bf16 vs fp32, first {AGREE_UPDATES} updates", lambda: check_agreement(report, args.out, device))
    updates = 60 if args.quick else 300
    run_dir = guarded(
        report, "bf16 + SDPA + fused AdamW", lambda: check_bf16_training(report, args.out, device, updates)
    )
    guarded(report, "fp16 + GradScaler", lambda: check_fp16(report, args.out, device, updates if args.quick else 100))
    if run_dir is None:
        report.add("batched beam search", None, "not run: it decodes with the bf16 run's model, which failed")
    else:
        guarded(report, "batched beam search", lambda: check_beam(report, run_dir, device))
    if not (args.data / "train.de").exists():
        missing = f"not run: no Multi30k in {args.data} (run 'make multi30k-data', or copy data/multi30k here)"
        report.add("nmt bench, Transformer-base", False, missing)
    else:
        guarded(report, "nmt bench, Transformer-base", lambda: check_bench(report, args.out, args.data, args.quick))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=user_path, default=ROOT / "data" / "multi30k", help="Multi30k directory")
    # Relative to the working directory, as every nmt run_dir is: the checkout's runs/ was a surprise
    # from elsewhere, and no place to write in an installed copy.
    parser.add_argument(
        "--out",
        type=user_path,
        default=Path("runs") / "gpu-check",
        help="the runs' scratch directory and gpu_check.json (default: runs/gpu-check in the working directory)",
    )
    parser.add_argument("--quick", action="store_true", help="the same logic on a CPU with small sizes")
    parser.add_argument(
        "--max-minutes",
        type=positive_float,
        default=MAX_MINUTES,
        help=f"stop after this long, the summary printed (default {MAX_MINUTES:g})",
    )
    args = parser.parse_args()
    args.data, args.out = Path(args.data).absolute(), Path(args.out).absolute()
    if not args.quick and not torch.cuda.is_available():
        message = "no CUDA GPU is visible (use --quick to check the script's logic on a CPU)"
        print(f"gpu-check: error: {message}", file=sys.stderr)
        return 2
    device = "cpu" if args.quick else "cuda"
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"gpu-check: error: --out {args.out}: cannot be made a directory ({e.strerror})", file=sys.stderr)
        return 2
    os.environ.setdefault("NMT_CACHE_DIR", str(args.out / "cache"))
    report = Report()
    start = time.perf_counter()
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (--quick)"
    print(f"gpu-check on {name}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)

    def title() -> str:
        return f"gpu-check on {name} ({time.perf_counter() - start:.0f} s)"

    deadline = start_deadline(report, args.max_minutes, args.out, title)
    run_checks(report, args, device)
    deadline.cancel()
    with report.lock:  # not while the deadline writes its summary
        return report.finish(args.out, title())


if __name__ == "__main__":
    sys.exit(main())
