"""The run directory has one owner: a training lock, readers that never delete or rewrite, outputs
that never destroy inputs, mismatches that are one-line errors, and a translate that streams.
Each case goes through the real ``nmt`` command: in a subprocess where it needs one of its own (a
lock another process holds, a signal, stdin, closed standard streams, dropped permissions), else in
this process."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import PAIRS, tiny_config

from nmt.cli import main
from nmt.config import load_config
from nmt.rundir import RunDir
from nmt.tokenizer import TokenizerConfig
from nmt.tokenizer_training import train_or_load_tokenizers


@pytest.fixture
def cli(capsys):
    """``nmt ARGS`` in this process, ended as the command would have: for a refusal, a message or an
    exit code that needs no process of its own (each one imports torch anew, about a second)."""

    def run(*args) -> subprocess.CompletedProcess:
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def one_line_error(done: subprocess.CompletedProcess, *expected: str) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr
    return done.stderr


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rundir")
    config = tiny_config(tmp, max_updates=60, validate_every=30)
    assert main(["train", "--config", str(config)]) == 0
    return tmp


def copy_run(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained / "run", run)
    return run


# ---------------------------------------------------------------------------- the lock


def start_training(config: Path, *sets: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "nmt", "train", "--config", str(config)]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_second_trainer_is_refused_naming_the_holder(tmp_path, cli):
    config = tiny_config(tmp_path, max_updates=100_000, validate_every=100_000)
    first = start_training(config)
    try:
        lock = tmp_path / "run" / "train.lock"
        wait_for(lambda: lock.exists() and lock.read_text().strip(), first)
        metrics = tmp_path / "run" / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, first)
        done = cli("train", "--config", config)
        one_line_error(done, "another 'nmt train' is training this run", f"pid {first.pid}", socket.gethostname())
        assert first.poll() is None  # the first one trains on, untouched
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 143


def test_a_killed_trainers_lock_never_blocks_the_resume(tmp_path, cli):
    config = tiny_config(tmp_path, max_updates=100_000, validate_every=5)
    proc = start_training(config)
    checkpoints = tmp_path / "run" / "checkpoints"
    wait_for(lambda: any(checkpoints.glob("update_*.pt")), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert "pid" in (tmp_path / "run" / "train.lock").read_text()  # the dead holder is still named in the file
    done = cli("train", "--config", config, "--set", "train.max_updates=12")
    assert done.returncode == 0, done.stderr
    assert "resuming at update" in done.stderr


@pytest.mark.parametrize("command", ["average", "tune-decode"])
def test_a_trainer_refused_by_another_command_names_that_command(trained, tmp_path, capsys, command):
    """'nmt average' and 'nmt tune-decode' hold the lock too: the refusal names them, not a trainer."""
    run = copy_run(trained, tmp_path)
    holder = RunDir(run)
    holder.lock(lambda message: None, command)
    try:
        assert main(["train", "--config", str(run / "config.yaml")]) == 2
        err = capsys.readouterr().err
        assert f"another 'nmt {command}' is writing this run (host {socket.gethostname()}, pid {os.getpid()}" in err
        assert "'nmt train'" not in err
    finally:
        holder.close()


def test_readers_never_delete_or_write_in_the_run(trained, tmp_path, cli):
    run = copy_run(trained, tmp_path)
    torn = run / "checkpoints" / ".update_00000099.pt.tmp4242"  # as a trainer writing right now leaves it
    torn.write_bytes(b"half a checkpoint")
    before = snapshot(run)
    out = tmp_path / "out.en"
    assert cli("translate", "--model", run, "-i", trained / "data" / "train.de", "-o", out).returncode == 0
    done = cli(
        "eval-bleu", "--model", run, "--src", trained / "data" / "train.de", "--ref", trained / "data" / "train.en"
    )
    assert done.returncode == 0, done.stderr
    assert cli("compare", run, "--out", tmp_path / "report").returncode == 0
    assert cli("plot", run, "--out", tmp_path / "figures").returncode == 0
    assert snapshot(run) == before


@pytest.mark.parametrize("which", ["auto", "best"])
def test_a_best_checkpoint_the_trainer_replaces_as_translate_picks_it_gives_the_new_best(
    trained, tmp_path, monkeypatch, capsys, which
):
    """With the default keep_best 1 every better validation deletes the best before it: a translate
    that picked that one just before gets the new best, not 'cannot read checkpoint'."""
    from nmt import checkpoint, checkpoint_file, translate

    run = copy_run(trained, tmp_path)
    checkpoints = checkpoint.CheckpointManager(run / "checkpoints", keep_last=2, keep_best=1, clean=False)
    picked = checkpoints.best_path()
    load_tokenizers = translate.load_tokenizers

    def trainer_writes_a_better_one(*paths):
        if picked.exists():
            checkpoints.save_best(checkpoint_file.load(picked), 999, score=1000.0)  # deletes the one picked
        return load_tokenizers(*paths)

    monkeypatch.setattr(translate, "load_tokenizers", trainer_writes_a_better_one)
    source = trained / "data" / "train.de"
    code = main(["translate", "--model", str(run), "-i", str(source), "--checkpoint", which, "--beam-size", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not picked.exists() and len(out.splitlines()) == len(PAIRS)
    loaded = translate.load_translator(RunDir.existing(run), "cpu", which=which)
    assert loaded.checkpoint.name == "best_00000999.pt"


# ---------------------------------------------------------------------------- outputs and inputs


def test_an_output_that_is_an_input_is_refused_however_it_is_named(trained, tmp_path, monkeypatch, cli):
    src = tmp_path / "test.de"
    shutil.copy(trained / "data" / "train.de", src)
    (tmp_path / "link.de").symlink_to(src)
    os.link(src, tmp_path / "hard.de")
    (tmp_path / "sub").mkdir()
    content = src.read_bytes()
    run = trained / "run"
    for output, cwd in (
        (src, tmp_path),
        ("../test.de", tmp_path / "sub"),
        (tmp_path / "link.de", tmp_path),
        (tmp_path / "hard.de", tmp_path),
    ):
        monkeypatch.chdir(cwd)
        done = cli("translate", "--model", run, "-i", src, "-o", output)
        one_line_error(done, "--output", "is the input")
        assert src.read_bytes() == content
    ref = tmp_path / "ref.en"
    shutil.copy(trained / "data" / "train.en", ref)
    done = cli("eval-bleu", "--model", run, "--src", src, "--ref", ref, "--output", ref)
    one_line_error(done, "--output", "is the input")
    assert ref.read_bytes() == (trained / "data" / "train.en").read_bytes()
    done = cli("translate", "--model", run, "-i", src, "-o", run / "spm.model")
    one_line_error(done, "is the input")


def test_an_output_that_is_one_of_the_runs_own_files_is_refused(trained, tmp_path, cli):
    run = copy_run(trained, tmp_path)
    [best] = (run / "checkpoints").glob("best_*.pt")
    src, ref = trained / "data" / "train.de", trained / "data" / "train.en"
    before = snapshot(run)
    for output in (
        run / "metrics.jsonl",
        run / "train.log",
        run / "dev.hyp",
        run / "spm.vocab",
        run / "spm.model.json",
        run / "checkpoints" / "index.json",
        best.with_name(best.name + ".sha256"),
        run / "checkpoints" / "notes.txt",
    ):
        done = cli("translate", "--model", run, "-i", src, "-o", output)
        one_line_error(done, f"--output {output}: ", "the run's own", "choose another file")
    done = cli("eval-bleu", "--model", run, "--src", src, "--ref", ref, "--output", run / "metrics.jsonl")
    one_line_error(done, "--output", "is the run's own metrics.jsonl")
    assert snapshot(run) == before
    # A new file of the user's in the run directory is fine, and so is writing it again.
    for _ in range(2):
        done = cli("eval-bleu", "--model", run, "--src", src, "--ref", ref, "--output", run / "test.hyp")
        assert done.returncode == 0, done.stderr
    assert (run / "test.hyp").read_text().splitlines() == [t for _, t in PAIRS]


def _permissions_bind() -> list[str]:
    """The prefix under which ``chmod`` binds the ``nmt`` command: none for a user; root needs
    setpriv to drop CAP_DAC_OVERRIDE (the test is skipped where it cannot)."""
    if os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search"
    prefix = ["setpriv", "--bounding-set", caps, "--inh-caps", caps]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("root writes files whatever their permissions, and setpriv cannot drop that here")
    return prefix


@pytest.mark.parametrize(
    "victim, mode, argv, said",
    [
        ("train.lock", 0o444, ["average", "--model", "{run}", "--last", "2"], "cannot open the run's lock file"),
        ("train.lock", 0o444, ["tune-decode", "--model", "{run}", "--beam-sizes", "1"], "cannot open the run's lock"),
        ("train.lock", 0o444, ["train", "--config", "{run}/config.yaml"], "cannot open the run's lock file"),
        ("train.log", 0o444, ["train", "--config", "{run}/config.yaml"], "cannot open the training log"),
        ("data/train", 0o555, ["train", "--config", "{run}/config.yaml"], "cannot write the encoded training data"),
    ],
)
def test_an_unwritable_file_of_the_run_is_a_one_line_error_naming_it(trained, tmp_path, victim, mode, argv, said):
    prefix = _permissions_bind()
    run = copy_run(trained, tmp_path)
    (run / "data" / "train" / "index.json").unlink()  # as if interrupted: the shards are written again
    (run / victim).chmod(mode)
    try:
        args = [sys.executable, "-m", "nmt", *(a.format(run=run) for a in argv)]
        done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=300)
    finally:
        (run / victim).chmod(0o755)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    error = done.stderr.splitlines()[-1]
    named = f"{run / victim}:" in error or f"{run / victim}/" in error  # a directory's file named as such
    assert "error:" in error and said in error and named, done.stderr


def test_unwritable_outputs_are_refused_before_any_work(trained, tmp_path, cli):
    src = trained / "data" / "train.de"
    done = cli("translate", "--model", trained / "run", "-i", src, "-o", tmp_path / "missing" / "out.en")
    one_line_error(done, "does not exist")
    (tmp_path / "report.md").write_text("mine")
    done = cli("compare", trained / "run", "--out", tmp_path / "report.md")
    one_line_error(done, "--out", "not a directory")
    assert (tmp_path / "report.md").read_text() == "mine"
    done = cli("compare", trained / "run", "--out", trained / "run" / "report")
    one_line_error(done, "inside the run directory")


def test_a_pipe_or_device_output_is_written_through_not_replaced(trained, tmp_path, cli):
    src, ref = trained / "data" / "train.de", trained / "data" / "train.en"
    read_end, write_end = os.pipe()  # what `--output >(wc -l)` names: /dev/fd/N
    with os.fdopen(read_end, "rb") as pipe:
        done = cli("translate", "--model", trained / "run", "-i", src, "-o", f"/dev/fd/{write_end}", "--beam-size", "1")
        os.close(write_end)
        assert done.returncode == 0, done.stderr
        assert pipe.read().decode().splitlines() == [t for _, t in PAIRS]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    done = cli("eval-bleu", "--model", trained / "run", "--src", src, "--ref", ref, "--output", fifo, "--json")
    assert done.returncode == 0, done.stderr
    assert '"bleu": 100.0' in done.stdout  # scored what it translated: a FIFO cannot give it back
    reader.join(timeout=60)
    assert received == ["".join(t + "\n" for _, t in PAIRS)] and fifo.is_fifo()


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="needs Linux's /proc")
def test_an_output_that_cannot_be_written_is_refused_before_translating(trained, cli):
    done = cli("translate", "--model", trained / "run", "-i", trained / "data" / "train.de", "-o", "/proc/version")
    one_line_error(done, "--output /proc/version", "no file can be written in /proc")


def test_a_config_in_its_own_run_directory_is_never_rewritten(tmp_path, monkeypatch, cli):
    config = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=1)
    mine = tmp_path / "config.yaml"
    values = yaml.safe_load(config.read_text())
    values["run_dir"] = "."
    mine.write_text("# my own notes\n" + yaml.safe_dump(values))
    text = mine.read_bytes()
    monkeypatch.chdir(tmp_path)
    done = cli("train", "--config", "config.yaml")
    one_line_error(
        done, "config.yaml: run_dir is this config file's own directory", "never rewrites a config you wrote"
    )
    assert mine.read_bytes() == text
    # The run's own resolved config, by contrast, resumes the run.
    values["run_dir"] = "run"
    mine.write_text(yaml.safe_dump(values))
    assert cli("train", "--config", mine).returncode == 0
    assert cli("train", "--config", tmp_path / "run" / "config.yaml", "--set", "train.max_updates=7").returncode == 0
    assert RunDir.existing(tmp_path / "run").config().train.max_updates == 7


def test_a_run_dir_that_would_write_where_the_corpus_is_read_is_refused_before_writing(tmp_path, cli):
    # The corpus is DATA/train.{de,en}: a run_dir of DATA's parent would put its shards' data/train/
    # beside those files, and DATA/train itself would be read as a dataset directory.
    made = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=1)
    config = tmp_path / "configs" / made.name  # its paths are absolute; run_dir may not be its directory
    config.parent.mkdir()
    made.rename(config)
    before = snapshot(tmp_path / "data")
    one_line_error(
        cli("train", "--config", config, "--set", f"run_dir={tmp_path}"),
        "config key 'run_dir'",
        "the run's own data/ would be data.train's corpus",
    )
    one_line_error(
        cli("train", "--config", config, "--set", f"run_dir={tmp_path / 'data' / 'train'}"),
        "is or lies in data.train's corpus path",
    )
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["train.de", "train.en"]
    assert snapshot(tmp_path / "data") == before
    # Another run on the same data is unharmed.
    assert cli("train", "--config", config).returncode == 0


def test_a_run_dir_in_another_runs_own_directories_is_refused_before_writing(trained, tmp_path, cli):
    # The other run writes and deletes files in its data/ and checkpoints/: a run there was lost
    # when the other one encoded its training data again.
    other = copy_run(trained, tmp_path)
    before = snapshot(other)
    for inside, where in (("data/train/nested", "lies in"), ("checkpoints/nested", "lies in"), ("data", "is")):
        one_line_error(
            cli("prepare", "--config", trained / "tiny.yaml", "--set", f"run_dir={other / inside}"),
            "config key 'run_dir'",
            f"{where} the run {other}'s own {Path(inside).parts[0]}/",
        )
    assert snapshot(other) == before
    # A data/ directory that is no run's is a place like any other.
    elsewhere = tmp_path / "project" / "data" / "a"
    elsewhere.parent.mkdir(parents=True)
    assert cli("prepare", "--config", trained / "tiny.yaml", "--set", f"run_dir={elsewhere}").returncode == 0


def test_a_runs_config_copied_as_a_template_does_not_train_into_its_own_directory(tmp_path, cli):
    # Two copies of a resolved config (run_dir: .) in one directory would otherwise train one run
    # there, the second silently resuming the first's checkpoints with its own settings.
    config = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=1)
    assert cli("train", "--config", config).returncode == 0
    templates = tmp_path / "templates"
    templates.mkdir()
    for name in ("a.yaml", "b.yaml"):
        shutil.copy(tmp_path / "run" / "config.yaml", templates / name)
    one_line_error(
        cli("train", "--config", templates / "a.yaml"),
        "a.yaml: run_dir is this config file's own directory, and the file is not the config.yaml of a run there",
    )
    assert sorted(p.name for p in templates.iterdir()) == ["a.yaml", "b.yaml"]
    # The run's own config.yaml, reached through a symlink to the run, still resumes it.
    (tmp_path / "link").symlink_to(tmp_path / "run")
    assert cli("train", "--config", tmp_path / "link" / "config.yaml", "--set", "train.max_updates=6").returncode == 0


def test_a_moved_projects_run_says_how_to_give_its_corpora_new_place(trained, tmp_path, cli):
    # A run's config.yaml names its corpora by absolute path: after the project moves (here: OLD to
    # NEW), resuming it, or reading its dev or test set, says which key to give the new place with.
    gone, data = tmp_path / "old" / "data" / "train", tmp_path / "new" / "data" / "train"
    shutil.copytree(trained / "data", data.parent)
    run = copy_run(trained, tmp_path / "new")
    saved = run / "config.yaml"
    saved.write_text(saved.read_text().replace(str(trained / "data"), str(gone.parent)))
    line = saved.read_text().splitlines().index(f"    path: {gone}") + 1  # data.train's, the first
    one_line_error(
        cli("train", "--config", saved),
        f"config.yaml: line {line}, column 5: config key 'data.train.path': no corpus at {gone}, which this run's",
        "if the data moved, give its new place with --set data.train.path=NEW_DIR/train",
    )
    one_line_error(
        cli("tune-decode", "--model", run, "--beam-sizes", "1"),
        "config key 'data.dev.path'",
        f"with 'nmt prepare --config {saved} --set data.train.path=NEW_DIR/train",
    )
    # A config of the user's own naming a missing corpus says so as ever.
    mine = yaml.safe_load((trained / "tiny.yaml").read_text())
    mine["data"].update(train=str(gone), dev=str(gone), test=str(gone))
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(mine))
    done = cli("prepare", "--config", tmp_path / "mine.yaml", "--set", f"run_dir={tmp_path / 'other'}")
    assert "no such corpus" in one_line_error(done) and "NEW_DIR" not in done.stderr
    # The hint works: prepare reads the data from its new place and records it in the run's config.
    new_place = [a for split in ("train", "dev", "test") for a in ("--set", f"data.{split}.path={data}")]
    assert cli("prepare", "--config", saved, *new_place).returncode == 0
    assert RunDir.existing(run).config().data.dev.path == str(data)


def test_a_moved_projects_synthetic_corpus_is_not_written_again_at_its_old_place(tmp_path, capsys):
    # data.synthetic writes the demo corpus into data.train's directory, which a run's config.yaml
    # names by absolute path: resuming a project moved from OLD to NEW with it wrote the corpus at
    # OLD again, outside the project. Refused as a moved corpus is, naming the key; a --set names the place.
    old, new = tmp_path / "old" / "demo", tmp_path / "new" / "demo"
    values = yaml.safe_load(tiny_config(tmp_path).read_text())
    splits = ("train", "dev", "test")
    values["data"].update(synthetic=True, synthetic_train_pairs=50, **{split: str(old / split) for split in splits})
    (tmp_path / "synthetic.yaml").write_text(yaml.safe_dump(values))
    run = RunDir(tmp_path / "new" / "run")
    run.path.mkdir(parents=True)
    run.write_config(load_config(tmp_path / "synthetic.yaml"))  # as the run trained at OLD has it, moved to NEW
    saved = str(run.config_path)
    assert main(["prepare", "--config", saved]) == 2
    err = capsys.readouterr().err
    line = run.config_path.read_text().splitlines().index(f"    path: {old / 'train'}") + 1  # the key's line, as ever
    place = f"{saved}: line {line}, column 5: config key 'data.train.path': no corpus at {old / 'train'}"
    assert err.count("\n") == 1 and place in err, err
    assert " ".join(f"--set data.{split}.path=NEW_DIR/{split}" for split in splits) in err
    assert not old.parent.exists()
    new_place = [a for split in splits for a in ("--set", f"data.{split}.path={new / split}")]
    assert main(["prepare", "--config", saved, *new_place]) == 0
    assert (new / "meta.json").is_file() and not old.parent.exists()
    # Where the project did not move, a generation cut off midway (its meta.json written) is completed.
    old.mkdir(parents=True)
    shutil.copy(new / "meta.json", old)
    run.write_config(load_config(tmp_path / "synthetic.yaml"))
    assert main(["prepare", "--config", saved]) == 0
    assert sorted(p.name for p in old.iterdir()) == sorted(p.name for p in new.iterdir())


# ---------------------------------------------------------------------------- mismatches


def test_a_swapped_tokenizer_of_the_same_size_is_named(trained, tmp_path, cli):
    run = copy_run(trained, tmp_path)
    other = [(s + " und so weiter", t + " and so on") for s, t in PAIRS]
    cfg = TokenizerConfig(type="bpe", vocab_size=60)
    train_or_load_tokenizers(
        cfg, [s for s, _ in other], [t for _, t in other], tmp_path / "o.model", tmp_path / "o.model"
    )
    shutil.copy(tmp_path / "o.model", run / "spm.model")
    done = cli("translate", "--model", run, "-i", trained / "data" / "train.de")
    one_line_error(done, "spm.model is not the SentencePiece model it was trained with", "best_")


def test_a_changed_config_is_named_with_its_key(trained, tmp_path, cli):
    run = copy_run(trained, tmp_path)
    values = yaml.safe_load((run / "config.yaml").read_text())
    values["model"]["ff_size"] = 256
    (run / "config.yaml").write_text(yaml.safe_dump(values))
    done = cli("translate", "--model", run, "-i", trained / "data" / "train.de")
    one_line_error(done, "model.ff_size is 128 in the checkpoint, 256 in config.yaml")


def _edit_config(run: Path, section: str, **values) -> None:
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved[section].update(values)
    (run / "config.yaml").write_text(yaml.safe_dump(saved))


@pytest.mark.parametrize(
    "model_type, train, key",
    [
        # accepted, and ignored, before the LSTM's kernel became an error; as was a decay the schedule does not use
        ("rnn", {"attention": "explicit"}, "train.attention"),
        ("transformer", {"schedule": "inverse_sqrt", "decay_updates": 100}, "train.decay_updates"),
    ],
)
def test_a_training_setting_refused_since_the_run_trained_does_not_stop_using_it(
    tmp_path, capsys, model_type, train, key
):
    config = tiny_config(tmp_path, model_type, max_updates=2, validate_every=2, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    run, src, ref = tmp_path / "run", tmp_path / "data" / "train.de", tmp_path / "data" / "train.en"
    _edit_config(run, "train", **train)  # what an earlier version wrote into config.yaml
    out = tmp_path / "out.txt"
    assert main(["translate", "--model", str(run), "-i", str(src), "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == len(PAIRS)
    assert main(["eval-bleu", "--model", str(run), "--src", str(src), "--ref", str(ref)]) == 0
    capsys.readouterr()
    # Training with that config is still refused, naming the key.
    assert main(["train", "--config", str(run / "config.yaml"), "--set", "train.max_updates=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"config key '{key}'" in err, err


def test_a_missing_best_checkpoint_is_named_not_replaced_by_another_model(trained, tmp_path, cli):
    # best_*.pt deleted to save disk, or left out of a copy: 'auto' used to fall back silently to the
    # averaged model or the newest training state, another model than the README promises.
    run = copy_run(trained, tmp_path)
    for best in (run / "checkpoints").glob("best_*.pt*"):
        best.unlink()
    source = tmp_path / "src.txt"
    source.write_text(PAIRS[0][0] + "\n")
    for which in ("auto", "best"):
        one_line_error(
            cli("translate", "--model", run, "--checkpoint", which, "--input", source),
            "checkpoints/best_0000",
            "the run's best checkpoint (recorded in index.json) is missing",
            "--checkpoint last",
        )
    assert cli("translate", "--model", run, "--checkpoint", "last", "--input", source).returncode == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["translate", "--checkpoint", "auto", "--input", "{source}"],
        ["eval-bleu", "--src", "{source}", "--ref", "{source}"],
        ["tune-decode", "--beam-sizes", "1", "--checkpoint", "last"],
        ["average", "--last", "2"],
        ["train"],
    ],
)
def test_an_index_cut_short_is_one_line_naming_it_before_any_work(trained, tmp_path, cli, argv):
    # read as none, translate's auto took the newest best checkpoint, average ranked its model against
    # no best score, and a resumed training deleted the best checkpoints at its next new best
    run = copy_run(trained, tmp_path)
    index = run / "checkpoints" / "index.json"
    index.write_bytes(index.read_bytes()[:40])
    source = tmp_path / "src.txt"
    source.write_text(PAIRS[0][0] + "\n")
    before = snapshot(run)
    command, *options = [a.format(source=source) for a in argv]
    where = ["--config", run / "config.yaml"] if command == "train" else ["--model", run]
    one_line_error(cli(command, *where, *options), f"{index}: not JSON", "restore it from a copy of the run")
    assert snapshot(run) == before
    assert cli("translate", "--model", run, "--checkpoint", "last", "--input", source).returncode == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["translate", "--checkpoint", "auto", "--input", "{source}"],
        ["eval-bleu", "--src", "{source}", "--ref", "{source}"],
        ["average", "--last", "2"],
        ["train", "--set", "train.max_updates=120"],
    ],
)
def test_a_missing_index_beside_best_checkpoints_is_one_line_naming_it(trained, tmp_path, cli, argv):
    # read as 'not validated yet': auto took the newest best_*.pt unranked, and a resumed training
    # deleted them all at its next new best
    run = copy_run(trained, tmp_path)
    index = run / "checkpoints" / "index.json"
    index.unlink()
    source = tmp_path / "src.txt"
    source.write_text(PAIRS[0][0] + "\n")
    before = snapshot(run)
    command, *options = [a.format(source=source) for a in argv]
    where = ["--config", run / "config.yaml"] if command == "train" else ["--model", run]
    one_line_error(
        cli(command, *where, *options),
        f"{index}: missing beside the run's best checkpoints (best_*.pt)",
        "restore it from a copy of the run",
        f"move the best_*.pt out of {run / 'checkpoints'}",
    )
    assert snapshot(run) == before
    assert cli("translate", "--model", run, "--checkpoint", "last", "--input", source).returncode == 0


def test_random_bytes_for_a_checkpoint_are_called_damaged(trained, tmp_path, cli):
    run = copy_run(trained, tmp_path)
    [best] = (run / "checkpoints").glob("best_*.pt")
    best.write_bytes(os.urandom(20_000))
    best.with_name(best.name + ".sha256").unlink()
    done = cli("translate", "--model", run, "-i", trained / "data" / "train.de")
    err = one_line_error(done, "not a checkpoint", "damaged")
    assert "Python objects" not in err


# ---------------------------------------------------------------------------- a translate that streams


def test_a_line_on_stdin_is_answered_before_the_input_ends(trained):
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt", "translate", "--model", str(trained / "run"), "--beam-size", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        answers = []
        for source, _ in PAIRS[:2]:
            proc.stdin.write(source.encode() + b"\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, "no answer while the input is still open"
            answers.append(proc.stdout.readline().decode().rstrip("\n"))
        assert answers == [t for _, t in PAIRS[:2]]
    finally:
        proc.communicate(timeout=60)  # closes stdin: the end of the input
    assert proc.returncode == 0


@pytest.mark.parametrize("stream", [False, True])
def test_blank_lines_on_stdin_keep_their_place_across_a_pause(trained, stream):
    (s0, t0), (s1, t1) = PAIRS[:2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt", "translate", "--model", str(trained / "run"), "--beam-size", "1"]
        + (["--stream"] if stream else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        proc.stdin.write(f"{s0}\n\n\n".encode())
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 120)  # answered: the pause has been read
        assert ready, "no answer while the input is still open"
        proc.stdin.write(f"\n{s1}\n\n".encode())  # a blank line after the pause, and one at the end
    finally:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.decode().split("\n") == [t0, "", "", "", t1, "", ""]  # the last "" follows the final newline


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_keeps_the_finished_prefix_and_the_old_output(trained, tmp_path, signum, code):
    out = tmp_path / "out.en"
    out.write_text("an older translation\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt", "translate", "--model", str(trained / "run"), "--stream", "-o", str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # A job started in the background (`make test &`) inherits SIGINT ignored, and Python then
        # rightly keeps ignoring it: give the child the disposition of a terminal's foreground job.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    proc.stdin.write("".join(s + "\n" for s, _ in PAIRS[:3]).encode())
    proc.stdin.flush()  # and keep stdin open: the command waits for more

    def three_lines_written() -> bool:
        found = list(tmp_path.glob(".out.en.tmp*"))
        return bool(found) and found[0].read_text().count("\n") == 3

    wait_for(three_lines_written, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert f"{out}.partial" in err.decode() and "Traceback" not in err.decode()
    assert (tmp_path / "out.en.partial").read_text().splitlines() == [t for _, t in PAIRS[:3]]
    assert out.read_text() == "an older translation\n" and not list(tmp_path.glob(".out.en.tmp*"))


@pytest.mark.parametrize(
    "source, options",
    [("file", []), ("fifo", []), ("fifo", ["--stream"]), ("stdin", []), ("stdin", ["--nbest", "2"])],
)
def test_bad_input_is_found_before_any_work_in_a_file_and_after_every_line_before_it_in_a_pipe(
    trained, tmp_path, monkeypatch, capsys, source, options
):
    """A regular file is read through first: its bad line is an error before anything is translated.
    A pipe (stdin, or --input <(...)) is read once, so every line before the bad one is translated
    first: OUT.partial holds them all, and the error counts input lines (not n-best ones)."""
    import nmt.corpus
    import nmt.streams

    monkeypatch.setattr(nmt.corpus, "_BLOCK_BYTES", 16)  # a file read a little at a time: the bad line
    monkeypatch.setattr(nmt.corpus, "MAC_SAMPLE_BYTES", 16)  # comes in a later block (one block: test_streams)
    monkeypatch.setattr(nmt.streams, "WINDOW_LINES", 2)  # and after a window is done
    data = "".join(s + "\n" for s, _ in PAIRS[:3]).encode() + b"\xff\xfe broken\n" + PAIRS[3][0].encode() + b"\n"
    source_file, out = tmp_path / "in.de", tmp_path / "out.en"
    source_file.write_bytes(data)
    out.write_text("an older translation\n")
    name = str(source_file)
    if source != "file":
        read_end, write_end = os.pipe()
        os.write(write_end, data)
        os.close(write_end)
        monkeypatch.setattr(sys, "stdin", os.fdopen(read_end, "rb"))
        name = "<stdin>" if source == "stdin" else f"/dev/fd/{read_end}"  # what --input <(...) names
    input_args = [] if source == "stdin" else ["-i", name]
    argv = ["translate", "--model", str(trained / "run"), *input_args, "-o", str(out), *options]
    assert main(argv) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert out.read_text() == "an older translation\n" and not list(tmp_path.glob(".out.en.tmp*"))
    if source == "file":
        assert error == f"nmt translate: error: {name}:4: not valid UTF-8"
        assert not (tmp_path / "out.en.partial").exists()
        return
    assert error == (
        f"nmt translate: error: {name}:4: not valid UTF-8; "
        f"the translations of the first 3 lines are in {out}.partial; {out} is unchanged"
    )
    kept = (tmp_path / "out.en.partial").read_text().splitlines()
    if options[:1] == ["--nbest"]:
        assert [line.split(" ||| ")[0] for line in kept] == ["0", "0", "1", "1", "2", "2"]
        kept = [line.split(" ||| ")[1] for line in kept[::2]]
    assert kept == [t for _, t in PAIRS[:3]]


@pytest.mark.parametrize("source", ["stdin", "fifo"])
def test_stdin_or_a_pipe_input_is_translated_with_a_progress_bar_on_a_terminal(trained, tmp_path, monkeypatch, source):
    """On a terminal the bar has no total for either (a pipe, --input <(...), is not counted first:
    it can be read only once), and the translation gets every line."""
    read_end, write_end = os.pipe()
    os.write(write_end, "".join(s + "\n" for s, _ in PAIRS).encode())
    os.close(write_end)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    out = tmp_path / "out.en"
    with os.fdopen(read_end, "rb") as pipe:
        monkeypatch.setattr(sys, "stdin", pipe)
        given = [] if source == "stdin" else ["-i", f"/dev/fd/{read_end}"]
        assert main(["translate", "--model", str(trained / "run"), *given, "-o", str(out)]) == 0
    assert out.read_text().splitlines() == [t for _, t in PAIRS]


def test_a_complete_translation_removes_an_earlier_partial_one(trained, tmp_path, cli):
    out = tmp_path / "out.en"
    (tmp_path / "out.en.partial").write_text("the prefix an interrupted run kept\n")
    done = cli("translate", "--model", trained / "run", "-i", trained / "data" / "train.de", "-o", out)
    assert done.returncode == 0, done.stderr
    assert out.read_text().splitlines() == [t for _, t in PAIRS]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.en"]


def test_nbest_beyond_the_beam_is_an_error(trained, cli):
    done = cli(
        "translate", "--model", trained / "run", "--nbest", "5", "--beam-size", "3", "-i", trained / "data" / "train.de"
    )
    one_line_error(done, "--nbest 5 is more than the beam size 3")


def test_progress_counts_source_tokens(trained):
    run = RunDir.existing(trained / "run")
    from nmt.translate import load_translator

    translator = load_translator(run, "cpu", "fp32")
    lines = [s for s, _ in PAIRS] * 5
    counted = []
    translator.translate(lines, run.config().decode, progress=counted.append)
    assert sum(counted) == sum(len(ids) + 1 for ids in translator.src_tok.encode(lines))


def test_the_progress_bar_ends_at_its_total_with_blank_and_cut_lines(trained, tmp_path, monkeypatch):
    """Blank lines (and lines the tokenizer leaves empty) are counted in the bar's total only if
    translated, and a line cut to the model's positions is counted whole: the bar ended at 7 of 11."""
    import tqdm

    from nmt.streams import CollectedLines, translate_into
    from nmt.translate import load_translator

    ended = []

    class Recorded(tqdm.tqdm):
        def close(self):
            ended.append((self.n, self.total))
            super().close()

    monkeypatch.setattr(tqdm, "tqdm", Recorded)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    run = RunDir.existing(trained / "run")
    translator = load_translator(run, "cpu", "fp32", lambda message: None)
    source = tmp_path / "in.de"
    source.write_text("\n".join([PAIRS[0][0], "", "  ", "\u200b", PAIRS[1][0], ""]) + "\n")
    sink = CollectedLines()
    translate_into(translator, source, sink, run.config().decode)
    assert sink.collected == [PAIRS[0][1], "", "", "", PAIRS[1][1], ""]
    assert ended and all(n == total > 0 for n, total in ended)  # tqdm may close twice
    translator.model.max_positions = 4  # sources cut to 3 subwords, outputs to 4 positions
    counted = []
    lines = [s for s, _ in PAIRS]
    translator.translate(lines, run.config().decode, progress=counted.append)
    assert sum(counted) == sum(len(ids) + 1 for ids in translator.src_tok.encode(lines))


def test_run_layout(tmp_path):
    cfg = yaml.safe_load(tiny_config(tmp_path).read_text())
    from nmt.config import config_from_dict

    joint = config_from_dict(cfg)
    cfg["tokenizer"]["joint"] = False
    cfg["model"]["tie_embeddings"] = False
    separate = config_from_dict(cfg)
    run = RunDir(tmp_path / "r")
    assert run.tokenizer_paths(joint) == (tmp_path / "r" / "spm.model",) * 2
    assert run.tokenizer_paths(separate) == (tmp_path / "r" / "spm.de.model", tmp_path / "r" / "spm.en.model")


@pytest.mark.parametrize(
    "fd, said", [(0, "standard input is closed: give --input FILE"), (1, "standard output is closed")]
)
def test_a_closed_standard_stream_is_a_one_line_error(trained, fd, said):
    args = ["translate", "--model", trained / "run"] + (["-i", trained / "data" / "train.de"] if fd == 1 else [])
    done = subprocess.run(
        [sys.executable, "-m", "nmt", *map(str, args)],
        stdin=None if fd == 1 else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if fd == 0 else None,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.close(fd),
        timeout=300,
    )
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_lock_holds_where_the_disk_has_no_room_for_the_holders_note(tmp_path):
    from nmt.errors import NMTError
    from nmt.runlock import RunLock

    path = tmp_path / "train.lock"
    path.symlink_to("/dev/full")  # every write refused, as on a full disk
    # flock on /dev/full is machine-wide: release it whatever happens, or another test run fails
    lock = RunLock(path)
    lock.acquire(tmp_path, warn=lambda message: None)
    try:
        with pytest.raises(NMTError, match="another 'nmt train' is training this run"):
            RunLock(path).acquire(tmp_path, warn=lambda message: None)
    finally:
        lock.release()
    again = RunLock(path)
    again.acquire(tmp_path, warn=lambda message: None)
    again.release()
