"""scripts/bench_scale.py on a tiny model and a few hundred generated pairs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_scale.py"
sys.path.insert(0, str(ROOT / "scripts"))

import bench_scale  # noqa: E402


def tiny_scale_config(directory: Path) -> Path:
    """configs/scale.yaml with a model that trains in a blink and kernels fixed (nothing measured)."""
    values = yaml.safe_load((ROOT / "configs" / "scale.yaml").read_text())
    values["model"].update(d_model=32, ff_size=64, encoder_layers=1, decoder_layers=1, heads=2)
    values["tokenizer"].update(vocab_size=100, input_sentence_size=1000)
    values["train"].update(precision="fp32", attention="sdpa", fp32_matmul="blas", threads=1, max_tokens=512)
    path = directory / "scale.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_relative_config_workdir_and_json_are_to_the_callers_directory(tmp_path: Path) -> None:
    tiny_scale_config(tmp_path)
    args = ["--pairs", "400", "--updates", "2", "--config", "scale.yaml", "--workdir", "w", "--json", "out/scale.json"]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    # the JSON's directory made, not a traceback once every size is measured
    [result] = json.loads((tmp_path / "out" / "scale.json").read_text())
    assert result["pairs"] == 400 and result["shards"] == 1
    assert (tmp_path / "w" / "scale-400" / "checkpoints").is_dir()


def test_outputs_default_to_runs_in_the_callers_directory_not_the_repositorys(tmp_path: Path) -> None:
    runs = Path("runs").absolute()
    assert bench_scale.output_paths(None, None) == (runs, runs / "bench_scale.json")
    assert bench_scale.output_paths("w", None) == (Path("w").absolute(), Path("w", "bench_scale.json").absolute())
    assert bench_scale.output_paths(None, "x.json")[1] == Path("x.json").absolute()


@pytest.mark.parametrize("option", ["--workdir", "--json"])
def test_an_output_that_cannot_be_written_is_one_line_before_any_work(tmp_path: Path, option: str) -> None:
    (tmp_path / "a_file").write_text("x")
    where = "a_file" if option == "--workdir" else "a_file/scale.json"
    args = ["--pairs", "400", "--config", str(tiny_scale_config(tmp_path)), option, where]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"bench_scale: error: {option} ")
    assert not list(tmp_path.glob("**/scale-data-400"))  # nothing generated


def test_help_names_where_the_outputs_go() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    text = " ".join(done.stdout.split())
    assert "default: runs in the current directory" in text and "default: WORKDIR/bench_scale.json" in text


def test_start_up_figure_leaves_out_the_kernels_measurement(tmp_path: Path) -> None:
    """An uncached ``auto`` measures for seconds before the first batch: not what the data costs."""
    fake_train = tmp_path / "fake_train.py"
    fake_train.write_text(
        "import sys, time\n"
        "say = lambda m: print(m, file=sys.stderr, flush=True)\n"
        "say('auto: measuring products/precision/attention/threads on a CPU ...')\n"
        "time.sleep(2)\n"
        "say('auto: precision fp32, attention sdpa (measured now)')\n"
        "say('epoch 1: 3 batches')\n"
    )
    measured = bench_scale.run_measured([sys.executable, str(fake_train)], marker="epoch 1:")
    assert measured["seconds"] >= 2
    assert measured["marker_seconds"] < 1


def test_help_states_the_whole_description() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    described = " ".join(done.stdout.split("\n\n")[1].split())
    assert described.startswith("Data at scale:") and described.endswith("which should be about the same.")
