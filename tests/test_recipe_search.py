"""scripts/recipe_search.py run as a subprocess on the tiny config: where its runs go, a variant that fails."""

from __future__ import annotations

import subprocess
import sys
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
