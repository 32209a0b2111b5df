"""The benchmark command runs on a tiny config and reports every figure it promises."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import tiny_config

from nmt.cli import main


@pytest.mark.parametrize("model_type", ["transformer", "rnn"])
def test_bench_reports_training_decoding_and_peak(tmp_path, model_type):
    config = tiny_config(tmp_path, model_type)
    out = tmp_path / "bench.json"
    code = main(["bench", "--config", str(config), "--updates", "3", "--warmup", "1", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    train = report["training"]
    assert train["updates"] == 3 and train["trg_tokens_per_s"] > 0 and train["first_pass_trg_tokens_per_s"] > 0
    assert train["src_trg_tokens_per_s"] > train["trg_tokens_per_s"]
    for ratio in ("max_over_median_update", "first_pass_max_over_median_update"):
        assert train[ratio] >= 1.0
    if model_type == "transformer":
        assert train["flops_per_trg_token"] > 0 and 0 < train["utilization_vs_fp32_peak"]
    assert report["matmul_peak_gflops"]["fp32"] > 0
    for mode in ("greedy", "beam5"):
        assert report["decoding"][mode]["sentences"] == 8
        assert report["decoding"][mode]["sentences_per_s"] > 0
    assert report["peak_memory_mb"] > 0
    assert not (tmp_path / "run-bench" / "checkpoints").exists() or not any(
        (tmp_path / "run-bench" / "checkpoints").glob("*.pt")
    )


def test_update_times_script_prints_one_row_per_update(tmp_path):
    """scripts/rnn_update_times.py (issue 15's evidence) goes through the trainer's public API, so it cannot rot."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "rnn_update_times.py"
    config = tiny_config(tmp_path, "rnn")
    result = subprocess.run(
        [sys.executable, str(script), "--config", str(config), "--updates", "4"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line and not line.startswith(("#", "update"))]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4]
    assert all(float(r[3]) > 0 for r in rows)  # wall ms
    assert "max/median" in result.stdout.splitlines()[-1]


def test_bench_json_may_not_overwrite_what_it_reads_or_a_runs_files(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=2, validate_every=2, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    short = ["--updates", "1", "--warmup", "1", "--decode-sentences", "2"]
    assert main(["bench", "--config", str(config), *short, "--json", str(tmp_path / "first.json")]) == 0  # run-bench
    saved = {p: p.read_bytes() for p in (config, run / "config.yaml", tmp_path / "data" / "train.en")}
    for target, said in [
        (config, "is the input"),
        (tmp_path / "data" / "train.en", "is the input"),
        (run / "config.yaml", "is the run's own config.yaml"),
        (run / "metrics.jsonl", "is the run's own metrics.jsonl"),
        (tmp_path / "run-bench" / "config.yaml", "is the run's own config.yaml"),
    ]:
        capsys.readouterr()
        assert main(["bench", "--config", str(config), *short, "--model", str(run), "--json", str(target)]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    assert all(p.read_bytes() == data for p, data in saved.items())


def test_bench_reports_the_kernels_it_decoded_in_the_model_runs_own(tmp_path):
    """--model decodes in that run's kernels, which the scratch run's training choice ("auto") does not say."""
    config = tiny_config(tmp_path, attention="explicit", max_updates=2, validate_every=2, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    out = tmp_path / "bench.json"
    bench = ["bench", "--config", str(config), "--set", "train.attention=sdpa", "--updates", "1", "--warmup", "1"]
    bench += ["--decode-sentences", "2", "--json", str(out)]
    assert main(bench) == 0
    report = json.loads(out.read_text())
    assert report["auto"]["attention"] == "sdpa" and report["decoding_kernels"]["attention"] == "sdpa"
    assert main([*bench, "--model", str(tmp_path / "run")]) == 0
    report = json.loads(out.read_text())
    assert report["auto"]["attention"] == "sdpa"
    decoded = report["decoding_kernels"]
    assert decoded["precision"] == "fp32" and decoded["attention"] == "explicit"


def test_bench_model_decodes_in_the_runs_precision_not_the_configs(tmp_path, monkeypatch, capsys):
    """--model decodes as 'nmt translate --model RUN_DIR' does: in the run's train.precision (fp16
    here), not the --config's fp32, which it was benchmarked in; a --set train.precision still
    overrides, as translate's --precision does. The log line says which, and where it came from."""
    from nmt import testhooks

    monkeypatch.setenv(testhooks.FP16_ON_CPU, "1")
    fixed = {"attention": "sdpa", "threads": 1, "fp32_matmul": "blas"}  # nothing to measure
    config = tiny_config(tmp_path, max_updates=2, validate_every=2, warmup_updates=1, **fixed)
    assert main(["train", "--config", str(config), "--set", "train.precision=fp16"]) == 0
    out = tmp_path / "bench.json"
    bench = ["bench", "--config", str(config), "--updates", "1", "--warmup", "1", "--decode-sentences", "2"]
    bench += ["--model", str(tmp_path / "run"), "--json", str(out)]
    capsys.readouterr()
    assert main(bench) == 0
    report = json.loads(out.read_text())
    assert report["precision"] == "fp32"  # the training benchmark: the --config's
    assert report["decoding_kernels"]["precision"] == "fp16" and report["decoding_kernels"]["device"] == "cpu"
    assert "device cpu (auto), precision fp16 (the run's train.precision)" in capsys.readouterr().err
    assert main([*bench, "--set", "train.precision=fp32"]) == 0
    assert json.loads(out.read_text())["decoding_kernels"]["precision"] == "fp32"
    assert "precision fp32 (--set train.precision)" in capsys.readouterr().err


def test_bench_model_decodes_with_the_runs_decode_settings_a_set_overriding_them(tmp_path, monkeypatch, capsys):
    """--model decodes with what 'nmt translate --model RUN_DIR' would: the run's decode section (here
    a length penalty and max length the --config does not have), not the --config's; a --set
    decode.KEY still overrides (the out-of-memory advice's decode.batch_tokens). The log says which."""
    from nmt import bench

    seen = []
    monkeypatch.setattr(bench, "bench_decoding", lambda translator, src, trg, decode, log: seen.append(decode) or {})
    fixed = {"attention": "sdpa", "threads": 1, "fp32_matmul": "blas"}  # nothing to measure
    config = tiny_config(tmp_path, max_updates=2, validate_every=2, warmup_updates=1, **fixed)
    run_decode = ["--set", "decode.length_penalty=0.6", "--set", "decode.max_len_b=7"]
    assert main(["train", "--config", str(config), *run_decode]) == 0
    bench_cmd = ["bench", "--config", str(config), "--updates", "1", "--warmup", "1", "--decode-sentences", "2"]
    bench_cmd += ["--json", str(tmp_path / "bench.json"), "--model", str(tmp_path / "run")]
    capsys.readouterr()
    assert main([*bench_cmd, "--set", "decode.batch_tokens=300"]) == 0
    decode = seen[-1]
    assert (decode.length_penalty, decode.max_len_b, decode.batch_tokens) == (0.6, 7, 300)
    err = " ".join(capsys.readouterr().err.split())
    assert "decoding settings (the run's decode section, --set decode.batch_tokens)" in err
    assert "length penalty 0.6, max length 1.5 x source + 7, batch_tokens 300" in err
    assert main(bench_cmd[:-2]) == 0  # no --model: the --config's own
    assert (seen[-1].length_penalty, seen[-1].max_len_b) == (1.0, 4)
    assert "decoding settings (the config's decode section)" in capsys.readouterr().err


def test_bench_refuses_a_trained_run_where_its_scratch_run_goes(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=2, validate_every=2, warmup_updates=1)
    assert main(["train", "--config", str(config), "--set", f"run_dir={tmp_path / 'run-bench'}"]) == 0
    kept = (tmp_path / "run-bench" / "config.yaml").read_bytes()
    capsys.readouterr()
    assert main(["bench", "--config", str(config), "--updates", "1", "--warmup", "1"]) == 2
    assert "holds a trained run's checkpoints" in capsys.readouterr().err
    assert (tmp_path / "run-bench" / "config.yaml").read_bytes() == kept


def test_bench_refuses_a_model_run_without_a_checkpoint_before_any_work(tmp_path, capsys, monkeypatch):
    """--model naming a run prepared but not trained yet is refused first: it was said only when the
    decoding began, after the matmul peak and every timed training update."""
    import nmt.bench

    config = tiny_config(tmp_path)
    assert main(["prepare", "--config", str(config)]) == 0
    assert (tmp_path / "run" / "config.yaml").is_file()

    def no_work(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(nmt.bench, "run_bench", no_work)
    capsys.readouterr()
    assert main(["bench", "--config", str(config), "--model", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "the run has no checkpoint yet" in err and err.count("\n") == 1, err


def test_bench_refuses_a_test_set_with_nothing_to_decode_before_any_work(tmp_path, capsys, monkeypatch):
    """A data.test of blank lines (or none at all) left sacreBLEU an empty list: an IndexError's
    traceback after every timed training update. Now one line naming the key, at its line or --set."""
    import nmt.bench

    config = tiny_config(tmp_path)
    for side in ("de", "en"):
        (tmp_path / f"blank.{side}").write_text("\n\n")
        (tmp_path / f"empty.{side}").write_text("")

    def no_work(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(nmt.bench, "run_bench", no_work)
    capsys.readouterr()
    assert main(["bench", "--config", str(config), "--set", f"data.test={tmp_path / 'empty'}"]) == 2
    err = capsys.readouterr().err
    assert f"--set data.test={tmp_path / 'empty'}: config key 'data.test'" in err and err.count("\n") == 1, err
    given = f"test: {tmp_path / 'data' / 'train'}"
    config.write_text(config.read_text().replace(given, f"test: {tmp_path / 'blank'}"))
    assert main(["bench", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "line " in err and "config key 'data.test'" in err and "no sentence pair to decode" in err, err


FAKE_NMT = """#!/bin/sh
# nmt bench's check of --json: its directory must exist
while [ $# -gt 0 ]; do
  if [ "$1" = --json ] && [ ! -d "$(dirname "$2")" ]; then echo "--json $2: no directory" >&2; exit 2; fi
  shift
done
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_bench_on_a_fresh_clone_has_a_directory_for_its_json(tmp_path):
    """A fresh clone has no runs/: `make bench` (--json runs/bench.json) was refused at once there."""
    root = Path(__file__).resolve().parent.parent
    project = tmp_path / "clone"
    project.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(root / name, project / name)
    bin_dir = project / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/bin/sh\n")  # get_multi30k.py: the data is there
    (bin_dir / "nmt").write_text(FAKE_NMT)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (project / ".venv" / ".installed").touch()
    earlier = (project / ".venv" / ".installed").stat().st_mtime - 10
    os.utime(project / "pyproject.toml", (earlier, earlier))  # installed since: make installs nothing
    done = subprocess.run(["make", "--no-print-directory", "bench"], cwd=project, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "script, args, said",
    [
        ("profile_step.py", ["--config", "absent.yaml"], "absent.yaml: no such config file"),
        ("rnn_update_times.py", ["--config", "CONFIG", "--set", "train.bogus=1"], "unknown config key 'train.bogus'"),
        ("ct2_compare.py", ["gone", "--src", "data/train.de", "--ref", "data/train.en"], "gone: no such run"),
    ],
)
def test_scripts_end_bad_input_on_one_line(tmp_path, script, args, said):
    """As nmt's own commands: a missing config, an unknown key or a missing run is one line and exit 2."""
    import subprocess
    import sys
    from pathlib import Path

    config = tiny_config(tmp_path)
    path = Path(__file__).resolve().parent.parent / "scripts" / script
    args = [str(config) if a == "CONFIG" else a for a in args]
    done = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{script[:-3]}: error: ") and said in line


SEARCH = ["--base", "CONFIG", "--out", "o", "--variant", "a: train.lr_peak=1e-3"]


@pytest.mark.parametrize(
    "script, args",
    [
        ("rnn_update_times.py", ["--config", "CONFIG", "--updates", "0"]),  # trained on for ever
        ("profile_step.py", ["--config", "CONFIG", "--updates", "0"]),  # a division by zero
        ("profile_step.py", ["--config", "CONFIG", "--warmup", "-1"]),
        ("ct2_compare.py", ["RUN", "--repeats", "0"]),  # statistics.median of nothing
        ("ct2_compare.py", ["RUN", "--threads", "0"]),
        ("peer_speed.py", ["--updates", "-5"]),
        ("recipe_search.py", [*SEARCH, "--minutes", "1", "--parallel", "0"]),  # waited for ever
        ("recipe_search.py", [*SEARCH, "--minutes", "0"]),
        ("bench_scale.py", ["--pairs", "100", "0"]),
        ("gpu_check.py", ["--quick", "--max-minutes", "-1"]),
    ],
)
def test_scripts_refuse_counts_and_durations_below_their_least_on_one_line(tmp_path, script, args):
    """A count of 0 (or below) ran for ever or ended in a traceback; argparse now refuses it, before any work."""
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / script
    args = [str(tiny_config(tmp_path)) if a == "CONFIG" else a for a in args]
    done = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    option, value = [a for a in args if a.startswith("--")][-1], args[-1]
    last = done.stderr.splitlines()[-1]
    assert f"error: argument {option}: expected " in last and last.endswith(f"got '{value}'")
    assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()


class FakeGpu:
    """A GPU as the host sees it: each launch is queued, and runs only at a synchronize, one second
    each on a clock nothing else moves. A timing counts the queued work of its warm-up unless it
    synchronizes before it reads the clock."""

    def __init__(self):
        self.clock, self.queued = 0.0, 0

    def launch(self, *args, **kwargs) -> object:
        self.queued += 1
        return object()

    def synchronize(self, *args) -> None:
        self.clock, self.queued = self.clock + self.queued, 0

    def perf_counter(self) -> float:
        return self.clock


def test_matmul_peak_on_a_gpu_does_not_time_the_queued_warm_up(monkeypatch):
    from types import SimpleNamespace

    import torch

    from nmt import bench
    from nmt.device import Precision

    gpu = FakeGpu()
    fake_torch = SimpleNamespace(randn=gpu.launch, mm=gpu.launch, cuda=SimpleNamespace(synchronize=gpu.synchronize))
    monkeypatch.setattr(bench, "torch", fake_torch)
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=gpu.perf_counter))
    peak = bench.matmul_peak_gflops(torch.device("cuda"), Precision("cuda", "bf16"), sizes=(1000,), seconds=4)
    assert peak == pytest.approx(2 * 1000**3 / 1e9)  # one product a second: 2 GFLOP/s


def test_training_bench_on_a_gpu_does_not_time_the_queued_warm_up(monkeypatch):
    """train_step returns once its statistics are on the host, with the optimizer step still queued."""
    from types import SimpleNamespace

    import torch

    from nmt import bench

    gpu = FakeGpu()
    trainer = SimpleNamespace(
        device=torch.device("cuda"),
        cfg=SimpleNamespace(train=SimpleNamespace(accumulate=1)),
        epoch_plan=lambda: [[0, 1]] * 3,
        train_step=lambda group: gpu.launch() and {"trg_tokens": 10, "src_tokens": 10},
        model=SimpleNamespace(flops_per_token=lambda src_length, trg_length: 1.0),
    )
    monkeypatch.setattr(bench, "torch", SimpleNamespace(cuda=SimpleNamespace(synchronize=gpu.synchronize)))
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=gpu.perf_counter))
    result = bench.bench_training(trainer, updates=2, warmup=1, log=lambda line: None)
    assert result["first_pass_trg_tokens_per_s"] == pytest.approx(10.0)  # one update of 10 tokens a second
    assert result["first_pass_max_over_median_update"] == pytest.approx(1.0)


def test_peak_memory_on_a_gpu_is_the_peak_since_it_was_reset_on_that_gpu(monkeypatch):
    """The matmul peak's operands (and in make gpu-check the runs before) are not the bench's peak."""
    from types import SimpleNamespace

    import torch

    from nmt import bench

    peaks = {0: 2000 * 2**20, 1: 5000 * 2**20}  # bytes, by GPU: the process's peaks so far
    in_use = {0: 100 * 2**20, 1: 100 * 2**20}

    def reset_peak_memory_stats(device):
        peaks[device.index] = in_use[device.index]

    fake_cuda = SimpleNamespace(
        reset_peak_memory_stats=reset_peak_memory_stats, max_memory_allocated=lambda device: peaks[device.index]
    )
    monkeypatch.setattr(bench, "torch", SimpleNamespace(cuda=fake_cuda))
    gpu = torch.device("cuda", 1)
    bench.reset_peak_memory(gpu)
    peaks[1] += 300 * 2**20  # training and decoding
    assert bench._peak_memory_mb(gpu) == 400
