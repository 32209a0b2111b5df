"""scripts/recipe_search.py run as a subprocess on the tiny config: where its runs go, a variant that
fails, and a variant interrupted before its budget."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import tiny_config

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "recipe_search.py"
# Short variants: the script's budget is minutes, so each variant stops itself at a few updates.
SHORT = "train.max_updates=4 train.validate_every=2 train.threads=1"


def run_search(cwd: Path, base: str, out: str, *variants: str) -> subprocess.CompletedProcess:
    args = [sys.executable, str(SCRIPT), "--base", base, "--out", out, "--minutes", "5"]
    for v in variants:
        args += ["--variant", v]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


def closing_line(run_dir: Path) -> str:
    return (run_dir / "train.log").read_text().splitlines()[-1]


def test_relative_base_and_out_are_to_the_callers_directory(tmp_path: Path) -> None:
    tiny_config(tmp_path, warmup_updates=1)
    done = run_search(tmp_path, "tiny.yaml", "search", f"short: {SHORT}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "best dev BLEU" in closing_line(tmp_path / "search" / "short")
    assert "| 1 | short |" in (tmp_path / "search" / "results.md").read_text()


def test_a_failed_variant_is_named_and_the_others_still_ranked(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, warmup_updates=1)
    out = tmp_path / "search"
    done = run_search(tmp_path, str(config), str(out), f"good: {SHORT}", f"bad: {SHORT} train.no_such_key=1")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "failed bad (exit 2): nmt train: error: --set train.no_such_key=1: unknown config key 'train.no_such_key'"
    )
    table = (out / "results.md").read_text()
    assert "| 1 | good |" in table and "bad" not in table


def test_an_interrupted_variant_is_resumed_and_a_finished_one_is_not_trained_again(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, warmup_updates=1)
    out = tmp_path / "search"
    run = out / "long"
    # The variant's own training, stopped by SIGTERM after its first checkpoint (as a killed search leaves it).
    sets = ["train.max_minutes=5", "train.max_updates=40", "train.validate_every=2", "train.threads=1"]
    cmd = [sys.executable, "-m", "nmt", "train", "--config", str(config), "--set", f"run_dir={run}"]
    proc = subprocess.Popen([*cmd, *(a for s in sets for a in ("--set", s))], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run / "checkpoints" / "index.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "SIGTERM received" in closing_line(run)

    variant = "long: train.max_updates=40 train.validate_every=2 train.threads=1"
    done = run_search(tmp_path, str(config), str(out), variant)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "started long" in done.stdout
    assert "best dev BLEU" in closing_line(run)
    assert "| 1 | long | `train.max_updates=40 train.validate_every=2 train.threads=1` | 40 |" in done.stdout

    again = run_search(tmp_path, str(config), str(out), variant)
    assert again.returncode == 0 and "started" not in again.stdout
