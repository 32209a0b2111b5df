"""Fault injection: kill -9 and resume, SIGTERM and SIGINT, and hostile input to every command."""

import errno
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from conftest import NO_SPACE, PAIRS, refuse_writes, tiny_config

from nmt import checkpoint, checkpoint_file
from nmt.cli import main


def start_training(config: Path, *overrides: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "nmt", "train", "--config", str(config)]
    for o in overrides:
        args += ["--set", o]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_updates(run_dir: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> int:
    """Block until metrics.jsonl holds ``n`` training updates; return how many it holds."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.exists():
            count = metrics.read_text().count('"type": "train"')
            if count >= n:
                return count
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError(f"no {n} updates within {timeout} s")


def final_model(run_dir: Path):
    [latest, *_] = checkpoint.list_checkpoints(run_dir / "checkpoints", "update")
    return latest.update, checkpoint_file.load(latest.path)["model"]


# One thread, one product library and one attention kernel: ``auto`` does not cache what it measured on a
# busy machine, so two runs may choose others, and sums over other thread counts, by another library or
# another kernel round differently.
SETTINGS = [
    "model.dropout=0.1",
    "train.max_updates=400",  # still training when a signal comes at update 5, 15 or 25
    "train.validate_every=10",
    "train.max_tokens=128",
    "train.threads=1",
    "train.fp32_matmul=blas",
    "train.attention=sdpa",
]
# The kill -9 runs, killed at update 25 or 30 and resumed from the checkpoint before: 80 updates after it
# for a dropout mask, a batch or an AdamW moment restored wrongly to change the final weights.
KILLED = [*SETTINGS, "train.max_updates=100"]


def test_kill_9_then_resume_equals_uninterrupted(tmp_path):
    straight = tiny_config(tmp_path / "a")
    assert main(["train", "--config", str(straight), *sum((["--set", s] for s in KILLED), [])]) == 0

    killed = tiny_config(tmp_path / "b")
    proc = start_training(killed, *KILLED)
    wait_for_updates(tmp_path / "b" / "run", 25, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert main(["train", "--config", str(killed), *sum((["--set", s] for s in KILLED), [])]) == 0

    (ua, wa), (ub, wb) = final_model(tmp_path / "a" / "run"), final_model(tmp_path / "b" / "run")
    assert ua == ub == 100
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_sigterm_writes_checkpoint_and_exits_143(tmp_path):
    config = tiny_config(tmp_path)
    proc = start_training(config, *SETTINGS[1:], "train.validate_every=1000")
    wait_for_updates(tmp_path / "run", 5, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert "SIGTERM received: checkpoint written at update" in err and "resume with: nmt train --config" in err
    update, _ = final_model(tmp_path / "run")
    assert update >= 5


def test_sighup_writes_checkpoint_and_exits_129_unless_nohup_ignores_it(tmp_path):
    """A lost ssh session or closed terminal sends SIGHUP, whose default kills the run with no checkpoint."""
    config = tiny_config(tmp_path / "hup")
    proc = start_training(config, *SETTINGS[1:], "train.validate_every=1000")
    wait_for_updates(tmp_path / "hup" / "run", 5, proc)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 129 and "SIGHUP received: checkpoint written at update" in err, err
    assert final_model(tmp_path / "hup" / "run")[0] >= 5

    # Started by nohup (SIGHUP ignored): the hangup is not a stop.
    config = tiny_config(tmp_path / "nohup")
    args = [sys.executable, "-m", "nmt", "train", "--config", str(config), "--set", "train.max_updates=40"]
    ignore_hup = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, preexec_fn=ignore_hup)
    wait_for_updates(tmp_path / "nohup" / "run", 5, proc)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert final_model(tmp_path / "nohup" / "run")[0] == 40


def test_a_console_that_goes_away_does_not_stop_training(tmp_path):
    """``nmt train ... 2>&1 | head``, or a ``| tee`` that was killed: the console's pipe closes. The run
    went on to lose every update since its last checkpoint, exiting 0; now it trains on, and its
    lines go on into train.log, as fairseq's and Joey NMT's logging do."""
    config = tiny_config(tmp_path)
    args = [sys.executable, "-m", "nmt", "train", "--config", str(config)]
    for o in ("train.max_updates=60", "train.log_every=1", "train.validate_every=1000"):
        args += ["--set", o]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc.stderr.readline()
    proc.stderr.close()  # the reader exits
    assert proc.wait(timeout=180) == 0
    assert final_model(tmp_path / "run")[0] == 60
    log = (tmp_path / "run" / "train.log").read_text()
    assert "update 60 " in log and "best dev BLEU" in log


def test_second_sigint_exits_at_once_and_leaves_checkpoints_readable(tmp_path):
    config = tiny_config(tmp_path)
    proc = start_training(config, *SETTINGS[1:])
    wait_for_updates(tmp_path / "run", 15, proc)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    found = checkpoint.list_checkpoints(tmp_path / "run" / "checkpoints", "update")
    assert found and found[0].update >= 10  # validate_every 10: at least one was written before the signals
    for info in found:
        checkpoint_file.load(info.path)  # raises on a half-written file


# ---------------------------------------------------------------- hostile input, table-driven


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    config = tiny_config(tmp, max_updates=60, validate_every=60)
    assert main(["train", "--config", str(config)]) == 0
    return tmp


def translate(run: Path, input_path: Path, capsys, *extra):
    code = main(["translate", "--model", str(run / "run"), "--input", str(input_path), "--beam-size", "2", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_bom_crlf_and_blank_lines_are_handled(run, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_bytes(b"\xef\xbb\xbfder hund sieht die katze\r\n\r\ndie katze sieht den hund\r\n")
    code, out, err = translate(run, path, capsys)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == "" and "\r" not in out and "\ufeff" not in out


def test_unseen_characters_and_a_huge_line_are_translated(run, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("Ωμέγα 漢字 der hund\n" + "katze " * 200_000 + "\n", encoding="utf-8")
    code, out, err = translate(run, path, capsys, "--max-len-a", "0", "--max-len-b", "20")
    assert code == 0, err
    assert len(out.split("\n")[:-1]) == 2


def test_empty_input_gives_empty_output(run, tmp_path, capsys):
    path = tmp_path / "empty.txt"
    path.write_text("")
    code, out, err = translate(run, path, capsys)
    assert code == 0 and out == "", err


def _hostile_cases(run: Path, tmp: Path):
    data = run / "data"
    good = yaml.safe_load((run / "tiny.yaml").read_text())

    def config(name, mutate):
        cfg = yaml.safe_load(yaml.safe_dump(good))
        cfg["run_dir"] = str(tmp / f"run_{name}")
        mutate(cfg)
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return ["train", "--config", str(path)]

    blank = tmp / "blank"
    (tmp / "blank.de").write_text("\n\n  \n")
    (tmp / "blank.en").write_text("\n\n\n")
    (tmp / "adir.de").mkdir()
    (tmp / "adir.en").write_text("x\n")
    (tmp / "hyp_empty.txt").write_text("")
    (tmp / "hyp_short.txt").write_text("the dog\n")
    return [
        ("only blank lines", config("blank", lambda c: c["data"].update(train=str(blank))), "empty after cleaning"),
        ("directory for a file", config("adir", lambda c: c["data"].update(train=str(tmp / "adir"))), "adir.de"),
        (
            "vocabulary too large",
            config("vocab", lambda c: c["tokenizer"].update(vocab_size=5000)),
            "tokenizer.vocab_size",
        ),
        (
            "warmup beyond total",
            config("warm", lambda c: c["train"].update(warmup_updates=500, max_updates=100)),
            "train.warmup_updates",
        ),
        ("cuda without a GPU", config("cuda", lambda c: c["train"].update(device="cuda")), "train.device"),
        ("input is a directory", ["translate", "--model", str(run / "run"), "--input", str(data)], "directory"),
        (
            "empty hypotheses",
            ["eval-bleu", "--hyp", str(tmp / "hyp_empty.txt"), "--ref", str(data / "train.en")],
            "empty",
        ),
        (
            "hypothesis and reference lengths differ",
            ["eval-bleu", "--hyp", str(tmp / "hyp_short.txt"), "--ref", str(data / "train.en")],
            f"hyp_short.txt has 1 lines but {data / 'train.en'} has {len(PAIRS)}",
        ),
        ("input file missing", ["translate", "--model", str(run / "run"), "--input", str(tmp / "nope")], "nope"),
    ]


def test_hostile_inputs_give_one_line_errors(run, tmp_path, capsys):
    for name, argv, expected in _hostile_cases(run, tmp_path):
        if name == "cuda without a GPU" and torch.cuda.is_available():
            continue  # that row needs a machine without a GPU; the others still run
        code = main(argv)
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if "error:" in line]
        assert code == 2, f"{name}: exit {code}, {err!r}"
        assert "Traceback" not in err, name
        assert len(errors) == 1 and expected in errors[0], f"{name}: {err!r}"


def test_cpu_fallback_switch_runs_on_cpu_with_a_warning(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    config = tiny_config(tmp_path, max_updates=3, warmup_updates=1, validate_every=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a Python warning: a line of the run's log
        code = main(
            ["train", "--config", str(config), "--set", "train.device=cuda", "--set", "train.cpu_fallback=true"]
        )
    assert code == 0
    line = "warning: train.device is 'cuda' but no GPU is available: running on CPU (train.cpu_fallback)"
    assert capsys.readouterr().err.count(line) == 1
    assert line in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_permission_denied_input(run, tmp_path, capsys):
    path = tmp_path / "secret.txt"
    path.write_text("der hund\n")
    path.chmod(0)
    code, _, err = translate(run, path, capsys)
    assert code == 2 and "secret.txt" in err and "ermission" in err


def test_kill_9_during_a_checkpoint_write_then_resume(tmp_path):
    """The process dies between writing a checkpoint's temporary file and renaming it: the
    previous checkpoint is intact, resume continues from it and ends where a clean run ends."""
    straight = tiny_config(tmp_path / "a")
    settings = sum((["--set", s] for s in KILLED), [])
    assert main(["train", "--config", str(straight), *settings]) == 0

    crashed = tiny_config(tmp_path / "b")
    env = {**os.environ, "NMT_TEST_KILL_BEFORE_RENAME": "3"}  # dies writing update_00000030.pt
    args = [sys.executable, "-m", "nmt", "train", "--config", str(crashed), *settings]
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr
    ckpt_dir = tmp_path / "b" / "run" / "checkpoints"
    assert [c.update for c in checkpoint.list_checkpoints(ckpt_dir, "update")] == [20, 10]
    assert any(p.name.startswith(".update_00000030.pt.tmp") for p in ckpt_dir.iterdir())  # the torn write
    assert main(["train", "--config", str(crashed), *settings]) == 0
    assert not any(".tmp" in p.name for p in ckpt_dir.iterdir())  # cleaned up on resume

    (ua, wa), (ub, wb) = final_model(tmp_path / "a" / "run"), final_model(tmp_path / "b" / "run")
    assert ua == ub == 100
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_sigterm_before_training_starts_is_an_interruption_not_a_kill(tmp_path):
    # The dev set is a FIFO nobody writes: preparing the data blocks on it until the signal comes.
    config = tiny_config(tmp_path)
    values = yaml.safe_load(config.read_text())
    for lang in ("de", "en"):
        os.mkfifo(tmp_path / f"stuck.{lang}")
    values["data"]["dev"] = str(tmp_path / "stuck")
    config.write_text(yaml.safe_dump(values))
    proc = start_training(config)
    time.sleep(3)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "nmt train: interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("stop", [KeyboardInterrupt, "Terminated"])
def test_a_signal_during_the_final_validation_keeps_the_last_updates(tmp_path, monkeypatch, capsys, stop):
    # The loop's signal guard ends with the loop; a run bounded by max_minutes usually stops between
    # validations, so the final one is where a Ctrl-C or a scheduler's SIGTERM most often lands.
    from nmt import validation
    from nmt.signals import Terminated

    error = Terminated if stop == "Terminated" else stop
    config = tiny_config(tmp_path, max_updates=12, validate_every=1000, threads=1)
    real_dev_bleu = validation.dev_bleu

    def stopped(*args, **kwargs):
        raise error()

    monkeypatch.setattr(validation, "dev_bleu", stopped)
    code = main(["train", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == (143 if stop == "Terminated" else 130), err
    assert "received: checkpoint written at update 12" in err and "Traceback" not in err
    update, model = final_model(tmp_path / "run")
    assert update == 12
    state = checkpoint_file.load(tmp_path / "run" / "checkpoints" / "update_00000012.pt")
    assert state["progress"]["last_validated"] != 12

    # The resumed run trains no further and validates the update it stopped at.
    monkeypatch.setattr(validation, "dev_bleu", real_dev_bleu)
    assert main(["train", "--config", str(config)]) == 0
    assert (
        checkpoint_file.load(tmp_path / "run" / "checkpoints" / "update_00000012.pt")["progress"]["last_validated"]
        == 12
    )
    assert (tmp_path / "run" / "checkpoints" / "best_00000012.pt").exists()
    resumed = checkpoint_file.load(tmp_path / "run" / "checkpoints" / "best_00000012.pt")["model"]
    assert all(torch.equal(model[k], resumed[k]) for k in model)


@pytest.mark.parametrize("ending", ["signal", "bad setting", "out of memory"])
def test_train_log_ends_with_the_line_the_run_stopped_on(tmp_path, monkeypatch, capsys, ending):
    # Under nohup, behind a closed pipe or a lost ssh session the console's last line is lost:
    # the log must say why the run ended, and how to resume it.
    from nmt import update_step, validation
    from nmt.signals import Terminated

    config = tiny_config(tmp_path, max_updates=12, validate_every=1000, threads=1)
    overrides = []
    if ending == "signal":

        def stopped(*args, **kwargs):
            raise Terminated()

        monkeypatch.setattr(validation, "dev_bleu", stopped)
    elif ending == "out of memory":  # the console names what to lower: so must the log

        def out_of_memory(*args, **kwargs):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 2147483648 bytes.")

        monkeypatch.setattr(update_step, "teacher_forced_loss", out_of_memory)
    else:  # found as the tokenizer is trained, after train.log is open
        overrides = ["--set", "tokenizer.vocab_size=5000"]
    code = main(["train", "--config", str(config), *overrides])
    said = capsys.readouterr().err.splitlines()[-1]
    assert code == (143 if ending == "signal" else 2), said
    assert said.startswith("nmt train: error: ")
    last = (tmp_path / "run" / "train.log").read_text().splitlines()[-1]
    assert last.split(" ", 2)[2] == said.removeprefix("nmt train: ")


def file_times(run: Path) -> dict[Path, int]:
    """When each file of a run was last written; the log and the lock change on every start."""
    changing = ("train.log", "train.lock")
    return {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name not in changing}


def test_a_run_that_lost_its_tokenizer_is_refused_and_left_as_it_was(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=4, warmup_updates=2, validate_every=1000, threads=1)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    (run / "spm.model").unlink()
    before = file_times(run)
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=8"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("nmt train: error: ") and "spm.model: missing from a run that has checkpoints" in last
    assert "Traceback" not in err
    assert not (run / "spm.model").exists()
    assert file_times(run) == before


def comparable_records(run_dir: Path) -> list[dict]:
    """metrics.jsonl without its wall-clock fields."""
    import json

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed", "seconds")} for r in records]


def test_a_signal_during_a_validation_gives_it_up_and_the_resumed_run_validates_first(tmp_path, monkeypatch, capsys):
    # torchrun kills its ranks 30 s after passing a signal on, so a long validation must not run to
    # its end first: it is given up between two batches, and the resumed run does it again.
    from nmt import testhooks

    settings = ["--set", "decode.batch_tokens=16"]  # several decoding batches, a check after each
    train = {"max_updates": 6, "validate_every": 3, "warmup_updates": 2, "threads": 1, "fp32_matmul": "blas"}
    straight = tiny_config(tmp_path / "a", attention="explicit", **train)
    assert main(["train", "--config", str(straight), *settings]) == 0

    steps = []

    def signal_at_the_third_step():
        steps.append(1)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(testhooks, "validation_step", signal_at_the_third_step)
    stopped = tiny_config(tmp_path / "b", attention="explicit", **train)
    capsys.readouterr()
    assert main(["train", "--config", str(stopped), *settings]) == 143
    err = capsys.readouterr().err
    assert "SIGTERM received: checkpoint written at update 3" in err and "Traceback" not in err
    assert len(steps) == 3  # no batch decoded after the signal
    run = tmp_path / "b" / "run"
    assert checkpoint_file.load(run / "checkpoints" / "update_00000003.pt")["progress"]["last_validated"] == -1
    assert not any(r["type"] == "valid" for r in comparable_records(run)) and not (run / "dev.hyp").exists()

    monkeypatch.setattr(testhooks, "validation_step", None)
    assert main(["train", "--config", str(stopped), *settings]) == 0
    err = capsys.readouterr().err
    assert "validation at update 3:" in err
    assert "resuming at update 3 (epoch" in err and "no validation yet" in err and "best BLEU -1" not in err
    assert comparable_records(run) == comparable_records(tmp_path / "a" / "run")
    names = sorted(p.name for p in (run / "checkpoints").glob("*.pt"))
    assert names == sorted(p.name for p in (tmp_path / "a" / "run" / "checkpoints").glob("*.pt"))
    for name in names:
        a, b = (checkpoint_file.load(r / "checkpoints" / name) for r in (tmp_path / "a" / "run", run))
        assert a["progress"]["best_update"] == b["progress"]["best_update"], name
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), name


# ---------------------------------------------------------------- a full disk


class FillingFile:
    """A text file opened for appending on a disk that fills after ``room`` more writes: from then
    on every flush fails as a full disk's does, and so does the close that flushes last."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def write(self, text: str) -> int:
        self.room -= 1
        return self.file.write(text)

    def flush(self) -> None:
        if self.room < 0:
            raise OSError(errno.ENOSPC, NO_SPACE)
        self.file.flush()

    def close(self) -> None:
        self.file.close()
        if self.room < 0:
            raise OSError(errno.ENOSPC, NO_SPACE)


def filling_open(name: str, room: int):
    """``open`` giving a ``FillingFile`` for the appends to the file ``name``."""
    real_open = open

    def opener(path, mode="r", *args, **kw):
        file = real_open(path, mode, *args, **kw)
        return FillingFile(file, room) if Path(path).name == name and mode.startswith("a") else file

    return opener


@pytest.mark.parametrize("full", ["train.log", "metrics.jsonl", "dev.hyp", "checkpoints/update_00000030.pt"])
def test_a_disk_that_fills_during_training_stops_it_with_one_line_and_keeps_what_was_saved(
    tmp_path, monkeypatch, capsys, full
):
    from nmt import metrics, train_log

    config = tiny_config(tmp_path, max_updates=20, validate_every=10, log_every=5)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    saved = checkpoint_file.load(run / "checkpoints" / "update_00000020.pt")["model"]
    if full in ("dev.hyp", "checkpoints/update_00000030.pt"):  # the next validation's file: the only one refused
        refuse_writes(monkeypatch, Path(full).name)
    else:  # room for a few more lines, then none
        monkeypatch.setattr(train_log if full == "train.log" else metrics, "open", filling_open(full, 3), raising=False)
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=40"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    what = "checkpoint " if full.startswith("checkpoints/") else ""
    assert err.splitlines()[-1] == (
        f"nmt train: error: {run / full}: could not write {what}({NO_SPACE}); what the run wrote before is intact: "
        f"free space, then resume with: nmt train --config {config} --set train.max_updates=40"
    )
    kept = checkpoint_file.load(run / "checkpoints" / "update_00000020.pt")["model"]
    assert all(torch.equal(saved[k], kept[k]) for k in saved)
    assert list((run / "checkpoints").glob("best_*.pt"))  # the new best, where it was written before the state

    monkeypatch.undo()  # space freed: the run resumes and ends
    assert main(["train", "--config", str(config), "--set", "train.max_updates=40"]) == 0
    assert final_model(run)[0] == 40


def test_the_resume_command_a_full_disk_gives_keeps_the_set_options_and_resumes_the_run(tmp_path, monkeypatch, capsys):
    # Without its --set options the command trained the config file's own run_dir (or was refused
    # there as another model).
    config = tiny_config(tmp_path, max_updates=20, validate_every=10)
    run = tmp_path / "other run"
    argv = ["train", "--config", str(config), "--set", f"run_dir={run}", "--set", "model.d_model=32"]
    refuse_writes(monkeypatch, "update_00000020.pt")
    assert main(argv) == 2
    command = capsys.readouterr().err.splitlines()[-1].split("free space, then resume with: ")[1]
    assert shlex.split(command) == ["nmt", *argv]

    monkeypatch.undo()  # space freed
    assert main(shlex.split(command)[1:]) == 0
    assert final_model(run)[0] == 20
    assert not (tmp_path / "run").exists()


def test_a_full_disk_is_one_line_where_no_command_says_more(run, tmp_path, monkeypatch, capsys):
    refuse_writes(monkeypatch, "compare.md")
    capsys.readouterr()
    assert main(["compare", str(run / "run"), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        err.splitlines()[-1] == f"nmt compare: error: {tmp_path / 'cmp' / 'compare.md'}: could not write ({NO_SPACE})"
    )
