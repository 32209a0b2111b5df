"""scripts/gpu_check.py (make gpu-check) runs its whole logic on a CPU with --quick, so it cannot rot
between the rare sessions that have a GPU."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import write_corpus

from nmt.synthetic import generate_pairs

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_logic_runs_on_cpu(tmp_path):
    data = tmp_path / "multi30k"
    pairs = generate_pairs(1000, seed=5)
    for split in ("train", "val", "test_2016_flickr"):
        write_corpus(data, split, pairs if split == "train" else pairs[:40])
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_check.py"),
            "--quick",
            "--data",
            str(data),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.split("== gpu-check on")[1]
    assert "FAIL" not in summary
    assert "PASS  batched beam search" in summary
    assert "nmt bench, Transformer-base, eager" in summary and "nmt bench, Transformer-base, compiled" in summary
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    compiler = any(shutil.which(c) for c in ("g++", "c++", "clang++"))  # torch.compile's on a CPU
    for label in ("eager", "compiled") if compiler else ("eager",):
        assert figures[f"bench_{label}"]["training"]["trg_tokens_per_s"] > 0
