"""``nmt plot``: one PNG per scalar of ``metrics.jsonl`` (training loss, dev loss, perplexity and BLEU,
learning rate, gradient norm, target tokens/s), each against updates and against wall time, with
several runs overlaid. Reads nothing but ``metrics.jsonl``, so it also draws a run still training."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nmt.errors import NMTError
from nmt.files import atomic_write, atomic_write_bytes, check_distinct_runs, check_output_dir
from nmt.metrics import (
    METRICS_FILE,
    SCALARS,
    LeftOut,
    Scalar,
    Series,
    elapsed_at,
    moving_average,
    read_metrics,
    scalar_series,
)
from nmt.saved_numbers import is_number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
FIGURE_SIZE = (11.0, 4.2)
TIME_LABEL = "training wall time (minutes, validation included)"
UPDATES_LABEL = "updates"


@dataclass
class RunCurves:
    label: str  # legend entry: the run directory's name
    path: Path
    series: dict[str, Series]  # by scalar name
    updates: int
    seconds: float
    validations: int
    best_bleu: float | None
    averages: list[dict] = field(default_factory=list)  # training's averaged models, with the elapsed seconds


def figure_file(scalar: Scalar) -> str:
    return scalar.name.replace("/", "_") + ".png"


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Each run's directory name; the path as given where two runs share a name."""
    names = [d.resolve().name if d.name in ("", ".", "..") else d.name for d in run_dirs]
    return [str(d) if names.count(n) > 1 else n for d, n in zip(run_dirs, names)]


LINES_NAMED = 5  # of the lines left out of one file, the most a warning lists


def left_out_notes(path: Path, left_out: list[LeftOut]) -> list[str]:
    """What to say of the lines left out of ``path``: one warning for those that are not whole
    records, naming the first and why; a line of its own for a last line cut short, which a run
    stopped mid-write (or one still writing) leaves and is nothing to worry about."""
    notes = []
    bad = [line for line in left_out if not line.cut_short]
    if bad:
        more = ""
        if len(bad) > 1:
            numbers = ", ".join(str(line.number) for line in bad[1:LINES_NAMED])
            numbers += ", ..." if len(bad) > LINES_NAMED else ""
            more = f", and {len(bad) - 1} more line{'s' if len(bad) > 2 else ''} not a whole record ({numbers})"
        notes.append(f"warning: {path}:{bad[0].number}: {bad[0].reason}: left out{more}; the rest is plotted")
    for line in left_out:
        if line.cut_short:
            notes.append(
                f"{path}:{line.number}: the last line is cut short, as a run stopped mid-write (or one still "
                "writing) leaves it: left out"
            )
    return notes


def load_run(run_dir: Path, label: str, log: Callable[[str], None] | None = None) -> RunCurves:
    """A run's curves from its metrics.jsonl; lines that are not whole records are left out, and
    ``log`` told so."""
    left_out: list[LeftOut] = []
    averages: list[dict] = []
    train, valid = read_metrics(run_dir, left_out, averages)
    for note in left_out_notes(Path(run_dir) / METRICS_FILE, left_out) if log is not None else ():
        log(note)
    bleus = [v["dev_bleu"] for v in valid if isinstance(v.get("dev_bleu"), (int, float))]
    return RunCurves(
        label=label,
        path=run_dir,
        series=scalar_series(train, valid),
        updates=int(train[-1]["update"]) if train else 0,
        seconds=max((float(r["elapsed"]) for r in train + valid), default=0.0),
        validations=len(valid),
        best_bleu=max(bleus) if bleus else None,
        averages=[{**a, "elapsed": elapsed_at(a["update"], train + valid)} for a in averages],
    )


def smoothing_window(points: int) -> int:
    """Light smoothing: a fiftieth of the run (none under 100 points), at most 200 updates."""
    return max(1, min(200, points // 50))


def _finite(values: list[float]) -> list[float]:
    return [v if math.isfinite(v) else math.nan for v in values]


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise NMTError("plotting needs matplotlib: pip install 'nmt[report]'") from None
    return Figure


def scalar_figure(scalar: Scalar, runs: list[RunCurves]) -> Figure | None:
    """A matplotlib Figure with the scalar against updates (left) and wall time (right), or None
    when no run has a value for it yet (e.g. no validation so far)."""
    present = [(i, run, run.series[scalar.name]) for i, run in enumerate(runs) if scalar.name in run.series]
    if not present:
        return None
    fig = _figure_class()(figsize=FIGURE_SIZE)
    by_update, by_time = fig.subplots(1, 2)
    window = smoothing_window(max(len(s.values) for _, _, s in present)) if scalar.smooth else 1
    for i, run, s in present:
        color = f"C{i % 10}"  # a run keeps its colour in every figure
        y = _finite(s.values)
        for ax, x in ((by_update, s.updates), (by_time, [t / 60 for t in s.seconds])):
            if scalar.kind == "valid":
                ax.plot(x, y, color=color, marker="o", markersize=3, linewidth=1.2, label=run.label)
            elif window > 1:
                ax.plot(x, y, color=color, alpha=0.25, linewidth=0.6)  # unlabelled: not in the legend
                ax.plot(x, moving_average(y, window), color=color, linewidth=1.5, label=run.label)
            else:
                ax.plot(x, y, color=color, linewidth=1.2, label=run.label)
        _mark_averages(scalar, run, color, by_update, by_time)
    by_update.set_xlabel(UPDATES_LABEL)
    by_time.set_xlabel(TIME_LABEL)
    for ax in (by_update, by_time):
        ax.set_ylabel(scalar.label)
        ax.grid(alpha=0.3)
        if scalar.from_zero:
            ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    note = f" (faint: each update; solid: mean of the last {window})" if window > 1 else ""
    fig.suptitle(scalar.title + note)
    fig.tight_layout()
    return fig


def _mark_averages(scalar: Scalar, run: RunCurves, color: str, by_update, by_time) -> None:
    """A star at each average training made of its last checkpoints (``train.average_last``) that
    holds ``scalar`` (its dev BLEU), beside the validations' curve: auto translates with it where it
    is above their best."""
    marked = [a for a in run.averages if scalar.kind == "valid" and is_number(a.get(scalar.key))]
    if not marked:
        return
    y = [float(a[scalar.key]) for a in marked]
    label = f"{run.label}: average of its last checkpoints"
    for ax, x in ((by_update, [a["update"] for a in marked]), (by_time, [a["elapsed"] / 60 for a in marked])):
        ax.plot(x, y, color=color, marker="*", markersize=11, linestyle="none", label=label)


def save_png(fig: Figure, path: Path) -> None:
    """Rendered to a temporary file beside ``path``, then renamed: never a half-written PNG."""
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=DPI))
    except OSError as e:
        raise NMTError(f"{path}: cannot write ({e.strerror})") from None


def index_markdown(runs: list[RunCurves], figures: list[tuple[Scalar, str]], skipped: list[Scalar]) -> str:
    averaged = any(r.averages for r in runs)  # the column only where a run has one: others' index is as before
    lines = [
        "# Training curves",
        "",
        "| run | directory | updates | wall time | validations | best dev BLEU |" + (" average dev BLEU |" * averaged),
        "| --- | --- | ---: | ---: | ---: | ---: |" + (" ---: |" * averaged),
    ]
    for r in runs:
        best = "-" if r.best_bleu is None else f"{r.best_bleu:.2f}"
        row = f"| {r.label} | {r.path} | {r.updates} | {r.seconds / 60:.1f} min | {r.validations} | {best} |"
        average = f" {r.averages[-1]['dev_bleu']:.2f} |" if r.averages else " - |"
        lines.append(row + average * averaged)
    lines.append("")
    for scalar, name in figures:
        lines += [f"## {scalar.title}", "", f"![{scalar.label}]({name})", ""]
    if skipped:
        lines.append("Not drawn, no values yet: " + ", ".join(s.title.lower() for s in skipped) + ".")
        lines.append("")
    return "\n".join(lines)


def plot_runs(run_dirs: list[Path], out_dir: Path, log: Callable[[str], None]) -> list[Path]:
    """Write one PNG per scalar and ``index.md`` into ``out_dir``; returns the PNGs written."""
    run_dirs = [Path(d) for d in run_dirs]
    out_dir = Path(out_dir)
    for d in run_dirs:
        if not (d / METRICS_FILE).is_file():
            raise NMTError(f"{d}: no {METRICS_FILE}: not a run directory made by 'nmt train'")
    check_distinct_runs(run_dirs)
    _figure_class()
    check_output_dir(out_dir, run_dirs)
    runs = [load_run(d, label, log) for d, label in zip(run_dirs, run_labels(run_dirs))]
    for r in runs:
        log(f"{r.path}: {r.updates} updates, {r.seconds / 60:.1f} min, {r.validations} validations")
    written, figures, skipped = [], [], []
    for scalar in SCALARS:
        fig = scalar_figure(scalar, runs)
        if fig is None:
            skipped.append(scalar)
            continue
        path = out_dir / figure_file(scalar)
        save_png(fig, path)
        written.append(path)
        figures.append((scalar, path.name))
    index = out_dir / "index.md"
    try:
        atomic_write_bytes(index, index_markdown(runs, figures, skipped).encode("utf-8"))
    except OSError as e:
        raise NMTError(f"{index}: cannot write ({e.strerror})") from None
    log(f"wrote {len(written)} figures and {index}")
    return written
