"""Recipe search at a fixed wall-clock budget, chosen on dev only.

Each variant is the base config with some ``--set`` overrides, trained for the same number of
minutes (``train.max_minutes``: training and validation together), on the same machine, and ranked
by its best dev BLEU (dev loss as the tie-breaker). A test set is never translated here.

    python scripts/recipe_search.py --base configs/multi30k_transformer.yaml --minutes 15 \\
        --out runs/search/lr --variant "lr7e-4: train.lr_peak=7e-4" --variant "lr2e-3: train.lr_peak=2e-3"

``--parallel 2 --threads 1`` trains two variants at once, one thread each (the budget then buys
about half the updates of a two-thread run: compare variants within one search, not across
searches with other settings). Writes OUT/results.md (a table), OUT/results.json and each variant's
OUT/NAME.log; draw the dev curves of the run directories alone with ``nmt plot OUT/*/ --out figures``.
A variant whose run finished (its train.log ends on the run's closing line) is not trained again;
one interrupted is resumed to its budget. A variant that fails is named with its log's last line and
left out of the table; the others are ranked, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nmt.arg_types import positive_float, positive_int, user_path  # noqa: E402
from nmt.metrics import read_metrics  # noqa: E402

POLL_S = 1.0  # how often the running variants are looked at


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'name: key=value key=value' -> (name, [key=value, ...]); 'name:' alone is the base."""
    name, _, sets = text.partition(":")
    if not name.strip() or "/" in name:
        raise SystemExit(f"--variant {text!r}: expected 'NAME: section.key=value ...'")
    return name.strip(), sets.split()


def command(base: Path, run_dir: Path, sets: list[str], minutes: float, threads: int | None) -> list[str]:
    args = [sys.executable, "-m", "nmt", "train", "--config", str(base), "--set", f"run_dir={run_dir}"]
    args += ["--set", f"train.max_minutes={minutes}", "--set", "train.max_updates=null"]
    if threads is not None:
        args += ["--set", f"train.threads={threads}"]
    for s in sets:
        args += ["--set", s]
    return args


# The line ``nmt train`` ends a finished run with (nmt/training.py:run), after its timestamp.
CLOSING_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d best dev BLEU .*; run directory ")


def finished(run_dir: Path) -> bool:
    """Whether the run's last session ended by a stopping rule: an interrupted or crashed one has
    checkpoints too, but its train.log ends on an error or mid-run, and a resume trains it on."""
    try:
        lines = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False
    return bool(lines) and CLOSING_LINE.match(lines[-1]) is not None


def last_line(log: Path) -> str:
    """What a failed variant's log said last."""
    try:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


def summary(name: str, sets: list[str], run_dir: Path) -> dict:
    train, valid = read_metrics(run_dir)
    best = max(valid, key=lambda r: (r["dev_bleu"], -r["dev_loss"]))
    return {
        "name": name,
        "settings": " ".join(sets) or "(base)",
        "updates": train[-1]["update"] if train else 0,
        "minutes": round((train[-1]["elapsed"] if train else 0) / 60, 1),
        "best_dev_bleu": best["dev_bleu"],
        "best_at_update": best["update"],
        "dev_loss_at_best": best["dev_loss"],
        "last_dev_loss": valid[-1]["dev_loss"],
        "curve": [(r["update"], round(r["elapsed"] / 60, 2), r["dev_bleu"]) for r in valid],
    }


def markdown(rows: list[dict], minutes: float) -> str:
    lines = [
        f"Budget: {minutes} minutes of training and validation per variant; ranked by best dev BLEU.",
        "",
        "| rank | variant | settings | updates | best dev BLEU (update) | dev loss there | last dev loss |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for i, r in enumerate(rows, 1):
        lines.append(
            f"| {i} | {r['name']} | `{r['settings']}` | {r['updates']} | {r['best_dev_bleu']:.2f} "
            f"({r['best_at_update']}) | {r['dev_loss_at_best']:.3f} | {r['last_dev_loss']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def train_pending(args: argparse.Namespace, variants: list[tuple[str, list[str]]]) -> dict[str, int]:
    """Train the variants not finished yet, ``--parallel`` at a time; their exit statuses by name."""
    pending = [(n, s) for n, s in variants if not finished(args.out / n)]
    running: list[tuple[str, subprocess.Popen]] = []
    statuses: dict[str, int] = {}
    while pending or running:
        while pending and len(running) < args.parallel:
            name, sets = pending.pop(0)
            # appended: a resumed variant keeps its earlier sessions' output
            with open(args.out / f"{name}.log", "a") as log:
                cmd = command(args.base, args.out / name, sets, args.minutes, args.threads)
                running.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)))
            print(f"started {name}: {' '.join(sets) or '(base)'}", flush=True)
        time.sleep(POLL_S)
        for name, proc in list(running):
            if proc.poll() is not None:
                running.remove((name, proc))
                statuses[name] = proc.returncode
                print(f"finished {name} (exit {proc.returncode})", flush=True)
    return statuses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=user_path, required=True, help="config the variants change")
    p.add_argument("--out", type=user_path, required=True, help="directory of the variants' runs")
    p.add_argument("--minutes", type=positive_float, required=True, help="wall-clock budget per variant")
    p.add_argument("--variant", action="append", required=True, help="'NAME: section.key=value ...'")
    p.add_argument("--parallel", type=positive_int, default=1, help="variants trained at once")
    p.add_argument("--threads", type=positive_int, help="train.threads of each (default: the config's)")
    args = p.parse_args()
    # The trainings run in ROOT: a relative path means the caller's directory, as for any command.
    args.base, args.out = Path(args.base).absolute(), Path(args.out).absolute()
    variants = [parse_variant(v) for v in args.variant]
    args.out.mkdir(parents=True, exist_ok=True)
    statuses = train_pending(args, variants)
    failed = [name for name, status in statuses.items() if status != 0]
    for name in failed:
        print(f"failed {name} (exit {statuses[name]}): {last_line(args.out / f'{name}.log')}", file=sys.stderr)
    ranked = [(n, s) for n, s in variants if n not in failed]
    rows = sorted(
        (summary(n, s, args.out / n) for n, s in ranked), key=lambda r: (-r["best_dev_bleu"], r["dev_loss_at_best"])
    )
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows, args.minutes)
    (args.out / "results.md").write_text(table)
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
