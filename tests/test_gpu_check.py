"""scripts/gpu_check.py (make gpu-check) runs its whole logic on a CPU with --quick, so it cannot rot
between the rare sessions that have a GPU."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_corpus

from nmt.synthetic import generate_pairs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402


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
    assert re.search(r"PASS  CUDA-marked tests +\d+ skipped", summary)  # collected, and skipped without a GPU
    assert "PASS  fp16 + GradScaler, 60 updates" in summary  # on the CPU through the tests' hook
    assert "nmt bench, Transformer-base, eager" in summary and "nmt bench, Transformer-base, compiled" in summary
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    for label in ("eager", "compiled") if gpu_check.has_cpp_compiler() else ("eager",):
        assert figures[f"bench_{label}"]["training"]["trg_tokens_per_s"] > 0


def test_a_failing_bench_is_reported_as_a_row_not_a_crash(tmp_path, monkeypatch):
    """One scarce GPU session must still print its summary when, say, torch.compile has no Triton."""
    data = tmp_path / "multi30k"
    for split in ("train", "val", "test_2016_flickr"):
        write_corpus(data, split, generate_pairs(20, seed=1))

    def fake_bench(cfg, *args):
        if cfg.train.compile:
            raise RuntimeError("Cannot find a working triton installation\n(details)")
        train = {"trg_tokens_per_s": 1000.0, "trg_tokens_per_update": 500.0, "model_gflops": 400.0}
        return {
            "training": {**train, "utilization_vs_peak": 0.4},
            "matmul_peak_gflops": {"bf16": 1000.0},
            "precision": "bf16",
            "auto": {"precision": "bf16", "attention": "sdpa"},
            "decoding": {"beam5": {"sentences_per_s": 50.0}},
        }

    monkeypatch.setattr(gpu_check.bench, "run_bench", fake_bench)
    report = gpu_check.Report()
    gpu_check.check_bench(report, tmp_path, data, quick=False)
    verdicts = {check: (verdict, text) for check, verdict, text in report.rows}
    assert verdicts["nmt bench, Transformer-base, eager"][0] == "PASS"  # 40% >= the 35% target
    assert verdicts["nmt bench, Transformer-base, compiled"] == (
        "FAIL",
        "RuntimeError: Cannot find a working triton installation",
    )
    assert report.failed and "bench_compiled" not in report.figures


def _falling(updates: int) -> list[float]:
    return [8.0 - 6.0 * i / updates for i in range(updates)]


def test_cuda_tests_pass_on_a_gpu_only_where_every_one_ran_and_in_quick_where_none_failed():
    assert gpu_check.tests_passed(0, "9 passed, 1436 deselected in 40.10s", quick=False)
    assert not gpu_check.tests_passed(0, "8 passed, 1 skipped, 1436 deselected in 40.10s", quick=False)
    assert not gpu_check.tests_passed(0, "9 skipped, 1436 deselected in 2.25s", quick=False)  # no GPU seen
    assert not gpu_check.tests_passed(1, "1 failed, 8 passed, 1436 deselected in 40.10s", quick=False)
    assert gpu_check.tests_passed(0, "9 skipped, 1436 deselected in 2.25s", quick=True)
    assert not gpu_check.tests_passed(2, "9 skipped, 1436 deselected, 1 error in 2.25s", quick=True)  # an import
    assert not gpu_check.tests_passed(5, "1445 deselected in 2.25s", quick=True)  # none marked: none collected


def test_fp16_verdict_passes_calibration_and_fails_a_frozen_or_overflowing_run():
    ok, text = gpu_check.fp16_verdict(_falling(100), 100, 65536.0 / 2**5, 5)  # calibrated down to 2048
    assert ok and "loss scale 2048; 5 overflowing updates skipped" in text
    assert not gpu_check.fp16_verdict(_falling(100), 100, 0.0, 5)[0]  # the scale collapsed
    assert not gpu_check.fp16_verdict(_falling(100), 100, 0.5, 17)[0]  # more overflows than calibrating takes
    assert not gpu_check.fp16_verdict(_falling(90), 100, 2048.0, 5)[0]  # not every update was made
    assert not gpu_check.fp16_verdict([5.0] * 100, 100, 2048.0, 0)[0]  # the loss did not fall


def test_fp16_check_reports_a_diverged_run_as_a_row_and_a_calibrated_one_as_passed(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from nmt.errors import NMTError

    message = "training diverged: the fp16 loss scale fell to 6.1e-05, below 0.0001 (...)"

    def diverged(cfg):
        raise NMTError(message)

    monkeypatch.setattr(gpu_check, "train_run", diverged)
    report = gpu_check.Report()
    gpu_check.check_fp16(report, tmp_path, "cuda", 100)  # a crash here would lose the whole summary screen
    assert report.rows == [("fp16 + GradScaler, 100 updates", "FAIL", message)]

    scaler = SimpleNamespace(get_scale=lambda: 4096.0, is_enabled=lambda: True)
    trainer = SimpleNamespace(scaler=scaler, progress=SimpleNamespace(skipped_updates=4))
    records = [{"loss": loss} for loss in _falling(100)]
    monkeypatch.setattr(gpu_check, "train_run", lambda cfg: (trainer, records, 1.0))
    gpu_check.check_fp16(report, tmp_path, "cuda", 100)
    assert report.rows[1][:2] == ("fp16 + GradScaler, 100 updates", "PASS")
    assert "4 overflowing updates skipped" in report.rows[1][2]


def test_fp16_check_in_quick_trains_fp16_on_the_cpu_and_puts_the_hook_back(tmp_path, monkeypatch):
    """--quick runs the fp16 check end to end on a CPU, as it would run on a GPU, instead of skipping it."""
    from types import SimpleNamespace

    from nmt import testhooks
    from nmt.device import check_precision

    monkeypatch.delenv(testhooks.FP16_ON_CPU, raising=False)
    trained = []

    def train_run(cfg):
        check_precision(cfg.train.precision, "cpu", False)  # the trainer's refusal, unless fp16 may run here
        trained.append((cfg.train.precision, cfg.train.device, cfg.train.max_updates))
        scaler = SimpleNamespace(get_scale=lambda: 65536.0, is_enabled=lambda: True)
        trainer = SimpleNamespace(scaler=scaler, progress=SimpleNamespace(skipped_updates=0))
        return trainer, [{"loss": loss} for loss in _falling(60)], 1.0

    monkeypatch.setattr(gpu_check, "train_run", train_run)
    report = gpu_check.Report()
    gpu_check.check_fp16(report, tmp_path, "cpu", 60)
    assert trained == [("fp16", "cpu", 60)]
    assert report.rows[0][:2] == ("fp16 + GradScaler, 60 updates", "PASS")
    assert not testhooks.fp16_on_cpu()  # users keep the rule that fp16 needs a GPU


def _fake_bench(cfg, *args):
    train = {"trg_tokens_per_s": 1000.0, "trg_tokens_per_update": 500.0, "model_gflops": 400.0}
    return {
        "training": {**train, "utilization_vs_peak": 0.4},
        "matmul_peak_gflops": {"bf16": 1000.0, "fp32": 500.0},
        "precision": "bf16",
        "auto": {"precision": "bf16", "attention": "sdpa"},
        "decoding": {"beam5": {"sentences_per_s": 50.0}},
    }


def _summary(text: str) -> dict[str, tuple[str, str]]:
    """check -> (verdict, figures) from the summary screen, where columns are two spaces apart."""
    rows = {}
    for line in text.split("== gpu-check on")[1].splitlines()[1:]:
        if line.startswith("gpu-check: results in "):  # the screen's last line, no row
            break
        verdict, rest = line.split(" ", 1)
        check, _, figures = rest.strip().partition("  ")
        rows[check] = (verdict, figures.strip())
    return rows


def test_a_check_that_raises_is_a_failed_row_and_the_others_and_the_summary_still_run(tmp_path, monkeypatch, capsys):
    """A CUDA error in the first training must not end the scarce GPU session without its summary screen."""
    data = tmp_path / "multi30k"
    write_corpus(data, "train", generate_pairs(20, seed=1))

    def cuda_error(cfg):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCompile with TORCH_USE_CUDA_DSA")

    monkeypatch.setattr(gpu_check, "train_run", cuda_error)
    monkeypatch.setattr(gpu_check, "cpu_has_bf16", lambda: True)  # the agreement check runs on any CPU
    monkeypatch.setattr(gpu_check.bench, "run_bench", _fake_bench)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--quick", "--data", str(data), "--out", str(tmp_path / "out")])
    code = gpu_check.main()
    rows = _summary(capsys.readouterr().out)
    error = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert code == 1
    assert rows["bf16 vs fp32, first 10 updates"] == ("FAIL", error)
    assert rows["bf16 + SDPA + fused AdamW"] == ("FAIL", error)
    assert rows["batched beam search"][0] == "info" and "not run" in rows["batched beam search"][1]
    assert rows["nmt bench, Transformer-base, eager"][0] == "info"  # the checks after the failures ran
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["rows"]


def test_without_multi30k_only_the_bench_is_not_run(tmp_path, monkeypatch, capsys):
    """A GPU machine without network and without a copy of Multi30k still runs every other check."""
    ran = []
    monkeypatch.setattr(gpu_check, "check_agreement", lambda report, *args: ran.append("agreement"))
    monkeypatch.setattr(gpu_check, "check_bf16_training", lambda report, out, *args: ran.append("bf16") or out)
    monkeypatch.setattr(gpu_check, "check_fp16", lambda report, *args: ran.append("fp16"))
    monkeypatch.setattr(gpu_check, "check_beam", lambda report, *args: ran.append("beam"))
    monkeypatch.setattr(gpu_check.bench, "run_bench", _fake_bench)
    argv = ["gpu_check.py", "--quick", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", argv)
    code = gpu_check.main()
    rows = _summary(capsys.readouterr().out)
    assert code == 1 and ran == ["agreement", "bf16", "fp16", "beam"]
    verdict, text = rows["nmt bench, Transformer-base"]
    assert verdict == "FAIL" and text.startswith(f"not run: no Multi30k in {tmp_path / 'nowhere'}")


def test_cuda_tests_that_hang_are_stopped_and_reported_with_their_output(tmp_path, monkeypatch, capsys):
    # a real process and timeout: subprocess hands its output over as bytes
    hanging = [sys.executable, "-c", "import time; print('tests/test_cuda.py ....', flush=True); time.sleep(30)"]
    monkeypatch.setattr(gpu_check, "cuda_test_command", lambda: hanging)
    monkeypatch.setattr(gpu_check, "TESTS_TIMEOUT_S", 2)
    report = gpu_check.Report()
    gpu_check.check_tests(report, quick=False)
    assert report.rows == [
        ("CUDA-marked tests", "FAIL", f"not finished in {gpu_check.TESTS_TIMEOUT_S} s: stopped (their output is above)")
    ]
    assert "tests/test_cuda.py ...." in capsys.readouterr().out


def _make_gpu_check(bin_dir: Path, venv: Path) -> subprocess.CompletedProcess:
    """``make gpu-check`` with ``bin_dir`` (its fake python3) first on PATH and ``venv`` as .venv."""
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MAKEFLAGS", None)
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "gpu-check", f"VENV={venv}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_uses_a_python_whose_torch_sees_a_gpu_and_installs_nothing(tmp_path):
    """A GPU machine has no network: `make gpu-check` must run on its own Python, not pip-install a .venv."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    fake = bin_dir / "python3"  # its torch "sees a GPU": every call succeeds, and is logged
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    done = _make_gpu_check(bin_dir, venv)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    assert "scripts/gpu_check.py --data data/multi30k" in calls
    assert not any("venv" in call or "pip" in call for call in calls) and not venv.exists()
    assert "gpu-check: python3" in done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_without_a_gpu_fails_at_once_without_fetching_multi30k(tmp_path):
    """No Python sees a GPU: the check's own one line, not a Multi30k download (and its error) first."""
    bin_dir, venv, log = tmp_path / "bin", tmp_path / "venv", tmp_path / "calls.log"
    no_gpu = f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in *gpu_check.py*) echo "no GPU" >&2; exit 2;; esac\nexit 1\n'
    for python in (bin_dir / "python3", venv / "bin" / "python"):
        python.parent.mkdir(parents=True, exist_ok=True)
        python.write_text(no_gpu)
        python.chmod(0o755)
    (venv / ".installed").touch()  # installed: make has nothing to do there
    done = _make_gpu_check(bin_dir, venv)
    assert done.returncode == 2, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    assert [call for call in calls if "scripts/" in call] == ["scripts/gpu_check.py"]
    assert done.stderr.splitlines()[0] == "no GPU"


def test_relative_data_and_out_are_read_against_the_working_directory(tmp_path, monkeypatch):
    """make runs the script as `gpu_check.py --data data/multi30k`: the bench must read that Multi30k, not
    configs/data/multi30k (a config resolves relative paths against its own directory)."""
    write_corpus(tmp_path / "data" / "multi30k", "train", generate_pairs(20, seed=1))
    monkeypatch.chdir(tmp_path)
    seen = []

    def recording_bench(cfg, *args):
        seen.append((cfg.data.train.path, cfg.data.dev.path, cfg.run_dir))
        return _fake_bench(cfg, *args)

    monkeypatch.setattr(gpu_check.bench, "run_bench", recording_bench)
    gpu_check.check_bench(gpu_check.Report(), Path("out"), Path("data/multi30k"), quick=False)
    data = tmp_path / "data" / "multi30k"
    assert seen[0] == (str(data / "train"), str(data / "val"), str(tmp_path / "out" / "bench-eager"))
    cfg = gpu_check.demo_config(Path("out"), "agree-fp32", [])
    assert cfg.run_dir == str(tmp_path / "out" / "agree-fp32")
    assert cfg.data.train.path == str(tmp_path / "out" / "demo-data" / "train")


def test_a_check_past_max_minutes_is_stopped_with_the_summary_screen_and_json(tmp_path):
    """A compile or a hang that outlasts the GPU session would lose the summary screen: the whole check
    stops at --max-minutes, the check then running a FAIL row, and exits 1."""
    out = tmp_path / "out"
    command = [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--quick", "--max-minutes", "0.05"]
    command += ["--data", str(tmp_path / "nowhere"), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _summary(done.stdout)
    stopped = [
        check for check, (verdict, text) in rows.items() if text == "not finished within --max-minutes 0.05: stopped"
    ]
    assert len(stopped) == 1 and rows[stopped[0]][0] == "FAIL"
    assert "nmt bench, Transformer-base" not in rows  # the checks after it were not run
    saved = json.loads((out / "gpu_check.json").read_text())["rows"]
    assert [check for check, verdict, _ in saved if verdict == "FAIL"] == stopped


def test_the_deadline_names_the_check_it_stopped(tmp_path, monkeypatch, capsys):
    exits = []
    monkeypatch.setattr(gpu_check.os, "_exit", exits.append)
    report = gpu_check.Report()
    report.add("CUDA-marked tests", True, "9 passed")
    report.running = "fp16 + GradScaler"
    gpu_check.start_deadline(report, 0.001, tmp_path, lambda: "gpu-check on GPU (60 s)").join()
    assert exits == [1]
    assert report.rows[-1] == ("fp16 + GradScaler", "FAIL", "not finished within --max-minutes 0.001: stopped")
    summary = capsys.readouterr().out.split("== gpu-check on GPU (60 s) ==")[1]
    assert "PASS  CUDA-marked tests  9 passed" in summary and "FAIL  fp16 + GradScaler" in summary
    assert json.loads((tmp_path / "gpu_check.json").read_text())["rows"][-1][0] == "fp16 + GradScaler"


def test_the_deadline_kills_the_process_it_waits_for_and_what_that_started(tmp_path):
    """os._exit ends the check, not its children: a hung pytest (and its workers) would go on holding
    the GPU after the check had reported. The deadline kills the whole session of each child."""
    pids = tmp_path / "pids"
    script = f"""
import sys
import time
sys.path.insert(0, {str(Path(gpu_check.__file__).parent)!r})
import gpu_check
from pathlib import Path
report = gpu_check.Report()
gpu_check.start_deadline(report, 0.03, Path({str(tmp_path)!r}), lambda: "t")
child = ("import os, subprocess, sys, time; "
         "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
         "open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{w.pid}}'); time.sleep(60)")
gpu_check.run_child(report, [sys.executable, "-c", child], 300)
with report.lock:  # as main() ends: the deadline's summary and exit come first
    pass
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "not finished within --max-minutes 0.03: stopped" in done.stdout
    time.sleep(0.5)
    for pid in map(int, pids.read_text().split()):
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text(), f"process {pid} still runs"


def test_without_a_gpu_the_one_line_error_goes_to_stderr(tmp_path, monkeypatch, capsys):
    """As the Makefile's gpu-check and every nmt error expect: stdout stays for results."""
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "out")])
    assert gpu_check.main() == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("gpu-check: error: no CUDA GPU is visible") and captured.err.count("\n") == 1


def test_out_defaults_to_runs_under_the_working_directory_and_is_named(tmp_path, monkeypatch, capsys):
    """Run from elsewhere than the checkout, the results go where the user is (runs/gpu-check, as
    every nmt run_dir is read), not into the checkout's runs/, and the summary says where."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gpu_check, "run_checks", lambda report, args, device: report.add("a check", True, "fine"))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--quick", "--data", str(tmp_path / "nowhere")])
    assert gpu_check.main() == 0
    written = tmp_path / "runs" / "gpu-check" / "gpu_check.json"
    assert json.loads(written.read_text())["rows"] == [["a check", "PASS", "fine"]]
    assert capsys.readouterr().out.splitlines()[-1] == f"gpu-check: results in {written}"


def test_an_out_that_cannot_be_a_directory_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file\n")
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--quick", "--out", str(taken / "gpu-check")])
    assert gpu_check.main() == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-check: error: --out {taken / 'gpu-check'}: ") and err.count("\n") == 1, err


def test_a_python_without_the_packages_is_named_in_one_line():
    """On a GPU machine without network the Python is the machine's own: what it lacks is named,
    with the pip install that fixes it, instead of an ImportError's traceback before any result."""
    assert gpu_check.missing_packages({"json": "json", "nmt_no_such_module": "nmt-no-such"}) == ["nmt-no-such"]
    assert gpu_check.missing_packages(gpu_check.NEEDED) == []  # the test suite's own Python has them all
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.argv = ['gpu_check.py']; sys.path[:0] = [{str(ROOT)!r}]; "
            "import importlib.util as u; real = u.find_spec; "
            "u.find_spec = lambda name, *a: None if name == 'sacrebleu' else real(name, *a); "
            f"import runpy; runpy.run_path({str(ROOT / 'scripts' / 'gpu_check.py')!r}, run_name='__main__')",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith("gpu-check: error: ") and "lacks sacrebleu: pip install sacrebleu" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
