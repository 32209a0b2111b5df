"""Data-parallel training with torchrun on CPU (gloo): replicas stay identical, two ranks equal one
process on the same global batches, a run resumes with a different number of ranks, and rank 0
keeps the updates made when another rank dies."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import tiny_config, write_corpus

from nmt import checkpoint, checkpoint_file, distributed, rank_failures
from nmt.batching import token_batches
from nmt.config import load_config
from nmt.distributed import World, share
from nmt.errors import DamagedData, NMTError
from nmt.metrics import read_metrics
from nmt.models.linear import onednn_available
from nmt.prepare import prepare
from nmt.rank_failures import Outcome, PeerLost, Stopped
from nmt.resuming import world_size_change
from nmt.rundir import RunDir
from nmt.signals import Interrupted, SignalPending
from nmt.trainer import Trainer
from nmt.training_state import Progress

WORDS = "der die das hund katze maus sieht jagt läuft schnell klein groß".split()
UPDATES = 6


def _pairs(n: int) -> list[tuple[str, str]]:
    rng = random.Random(4)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 9))]
        out.append((" ".join(words), " ".join(reversed(words))))
    return out


def _command(config: Path, sets: list[str], nproc: int) -> list[str]:
    if nproc == 1:
        cmd = [sys.executable, "-m", "nmt", "train"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd += ["-m", "nmt", "train"]
    return cmd + ["--config", str(config)] + [a for s in sets for a in ("--set", s)]


def _train(config: Path, sets: list[str], nproc: int, env: dict) -> str:
    done = subprocess.run(_command(config, sets, nproc), env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def _train_at_once(config: Path, runs: list[tuple[list[str], int, dict]]) -> None:
    """``_train`` for each of ``runs`` (sets, processes, environment), all started at once: one
    process imports torch while torchrun's launcher does, which uses one core alone."""
    started = [
        subprocess.Popen(_command(config, sets, nproc), env=env, stderr=subprocess.PIPE, text=True)
        for sets, nproc, env in runs
    ]
    try:
        for process in started:
            err = process.communicate(timeout=240)[1]
            assert process.returncode == 0, err[-3000:]
    finally:
        for process in started:
            process.kill()
            process.wait()


def _weights(run_dir: Path, update: int) -> dict[str, torch.Tensor]:
    return checkpoint_file.load(run_dir / "checkpoints" / f"update_{update:08d}.pt")["model"]


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A corpus whose epoch has an odd number of batches, so one update has fewer batches than ranks."""
    root = tmp_path_factory.mktemp("ddp")
    config = tiny_config(root, max_updates=UPDATES, validate_every=1000, log_every=1, warmup_updates=2)
    write_corpus(root / "data", "train", _pairs(120))
    cfg = load_config(config)
    data = prepare(cfg, RunDir(cfg.run_dir), lambda m: None)
    for max_tokens in range(60, 200, 4):
        n = len(token_batches(data.train.src_lens, data.train.trg_lens, max_tokens, cfg.seed, 1))
        if n % 2 == 1 and 2 * UPDATES // 2 < n < 2 * UPDATES:  # the epoch ends inside the run
            break
    else:
        pytest.fail("no budget gives an odd number of batches")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    return root, config, Path(cfg.run_dir), max_tokens, env


def _run_dir(setup, name: str) -> list[str]:
    """Overrides for a fresh run directory that reuses the prepared tokenizer."""
    root, _, prepared, max_tokens, _ = setup
    run_dir = root / name
    run_dir.mkdir()
    shutil.copy(prepared / "spm.model", run_dir / "spm.model")
    shutil.copy(prepared / "spm.vocab", run_dir / "spm.vocab")
    return [f"run_dir={run_dir}", f"train.max_tokens={max_tokens}", "train.threads=1", "train.attention=sdpa"]


@pytest.mark.parametrize("library", ["blas", "onednn"])  # oneDNN hands some weight gradients over transposed
def test_two_gloo_ranks_equal_one_process_on_the_same_global_batches(setup, library):
    if library == "onednn" and not onednn_available():
        pytest.skip("this torch build has no oneDNN products")
    root, config, _, _, env = setup
    single = _run_dir(setup, f"single-{library}") + [f"train.fp32_matmul={library}"]
    digests = root / f"digests-{library}"
    digests.mkdir()
    ddp = _run_dir(setup, f"ddp-{library}") + [f"train.fp32_matmul={library}"]
    with_digests = {**env, "NMT_TEST_PARAM_DIGESTS": str(digests)}
    _train_at_once(config, [(single + ["train.accumulate=2"], 1, env), (ddp + ["train.accumulate=1"], 2, with_digests)])

    rank0 = (digests / "rank0.txt").read_text().splitlines()
    rank1 = (digests / "rank1.txt").read_text().splitlines()
    assert len(rank0) == UPDATES and rank0 == rank1  # identical parameters after every update
    diff = _max_diff(_weights(root / f"single-{library}", UPDATES), _weights(root / f"ddp-{library}", UPDATES))
    assert diff <= 1e-5
    log = (root / f"ddp-{library}" / "train.log").read_text()
    assert "x 2 ranks (gloo)" in log and f"fp32 matmul {library}" in log
    assert not log.count("model:") > 1  # rank 0 alone writes the log


@dataclass(frozen=True)
class StoppedAndResumed:
    """Two ranks stopped by SIGTERM in the validation due at update 3, then resumed on one process."""

    run: Path
    stopped_stderr: str
    validation_steps: int  # of the stopped validation, each where rank 0 looks for a signal
    progress_at_3: dict | None  # as the stop left it, before the resumed run wrote its own; None: no checkpoint
    resumed_stderr: str


@pytest.fixture(scope="module")
def stopped_and_resumed(setup) -> StoppedAndResumed:
    """The resume tests share one such run: a torchrun job and a resumed process cost seconds each."""
    # torchrun passes the signal on and kills the ranks 30 s later: rank 0 gives the validation up
    # at its next batch, where it would otherwise have decoded the whole dev set first.
    root, config, _, _, env = setup
    steps = root / "validation-steps"
    sets = _run_dir(setup, "stopped") + ["train.fp32_matmul=blas", "train.validate_every=3"]
    slow = {**env, "NMT_TEST_SLOW_VALIDATION": f"1:{steps}"}
    cmd = _command(config, sets + ["train.accumulate=1", "decode.batch_tokens=64"], 2)
    proc = subprocess.Popen(cmd, env=slow, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not steps.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    at_3 = root / "stopped" / "checkpoints" / "update_00000003.pt"
    progress = checkpoint_file.load(at_3)["progress"] if at_3.exists() else None  # the tests say what is wrong
    # Resumed on one process with the same global batches.
    resumed = _train(config, sets + ["train.accumulate=2"], 1, env)
    return StoppedAndResumed(root / "stopped", err, len(steps.read_text().splitlines()), progress, resumed)


def test_resume_with_a_different_number_of_ranks(setup, stopped_and_resumed):
    run = stopped_and_resumed
    assert run.progress_at_3 is not None and run.progress_at_3["world_size"] == 2
    assert _max_diff(_weights(run.run, UPDATES), _weights(_reference(setup), UPDATES)) <= 1e-5
    log = (run.run / "train.log").read_text()
    assert "resuming at update 3" in log
    assert "resuming on 1 process, not 2: an update still takes 2 batches (train.accumulate 2 x 1)" in log


def _finished_run(setup, made: str, name: str, ranks: int, accumulate: int) -> Path:
    """A run of ``ranks`` processes with ``train.accumulate`` and BLAS products, trained to UPDATES: the
    equivalence test's run ``made`` where it has made it, else ``name``, trained here once."""
    root, config, _, _, env = setup
    for run in (root / made, root / name):
        if (run / "checkpoints" / f"update_{UPDATES:08d}.pt").exists():
            return run
    sets = [f"train.accumulate={accumulate}", "train.fp32_matmul=blas"]
    _train(config, _run_dir(setup, name) + sets, ranks, env)
    return root / name


def _reference(setup) -> Path:
    """One process with ``train.accumulate: 2``: what two ranks with 1 must equal."""
    return _finished_run(setup, "single-blas", "single", ranks=1, accumulate=2)


def test_a_signal_during_a_validation_stops_every_rank_with_a_checkpoint(setup, stopped_and_resumed):
    run = stopped_and_resumed
    err = run.stopped_stderr
    assert err.count("SIGTERM received: checkpoint written at update 3") == 1, err[-3000:]  # rank 0 says it
    assert "resume with the same torchrun options (2 processes): torchrun ... -m nmt train --config" in err
    assert "[rank" not in err  # no rank's traceback (torchrun prefixes them; its own, for the signal, stays)
    assert run.validation_steps <= 2  # of dozens of decoding batches
    assert run.progress_at_3 is not None and run.progress_at_3["last_validated"] != 3

    # Resumed, the update it stopped at is validated first.
    log = run.resumed_stderr
    assert log.index("validation at update 3:") < log.index("validation at update 6:")
    assert _max_diff(_weights(run.run, UPDATES), _weights(_reference(setup), UPDATES)) <= 1e-5


# Each rank: the timeout nmt gives the default group (none: PyTorch's default) and the solo-work group's;
# then, with the default group made with 1 s instead, whether the others outlast 2 s of rank 0's work
# alone, waiting in the group made for that, and in the default one. The 1 s is given as the group is
# made (gloo on torch 2.5 and older keeps that timeout and ignores one set later), on a store that
# waits 60 s for the other rank to start.
WAITS = """
import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
from nmt import distributed, rank_failures

given = {}
init_process_group = dist.init_process_group


def short_default_timeout(**kwargs):  # the update's collectives time out in 1 s, the store's waits not
    given.update(kwargs)
    init_process_group(**{**kwargs, "timeout": timedelta(seconds=1)})


dist.init_process_group = short_default_timeout
world = distributed.world_from_environment()
distributed.init(world, torch.device("cpu"))
print(given.get("timeout"), distributed._solo_work_group._get_backend(torch.device("cpu")).options._timeout)
for solo_work in (True, False):
    try:
        rank_failures.agree(world, lambda: time.sleep(2) if world.is_main else None, solo_work=solo_work)
        print("waited")
    except RuntimeError:
        print("timed out")
sys.stdout.flush()
distributed.exit_rank(0)
"""


def test_only_waits_for_rank_0_s_work_alone_have_the_long_timeout(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "WORLD_SIZE": "2"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", WAITS], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE
        )
        for r in (0, 1)
    ]
    rank1 = ranks[1].communicate(timeout=120)[0].decode().splitlines()
    ranks[0].kill()  # its last wait may never end: rank 1 gave up on it
    ranks[0].wait()
    assert rank1 == ["0:30:00 6:00:00", "waited", "timed out"]  # PyTorch's default for gloo, and ours


@pytest.mark.parametrize(
    "sets, message",
    [
        (["data.train=/nowhere/corpus"], "no such corpus: /nowhere/corpus"),  # found by rank 0 alone
        (["train.no_such_key=1"], "train.no_such_key"),  # found by every rank, before they can agree
        (["model.d_model=32"], "model.d_model: 64 -> 32"),  # a resume refused (by rank 0, as it takes the run)
    ],
)
def test_bad_input_under_torchrun_is_one_line_from_rank_0(setup, sets, message):
    root, config, _, _, env = setup
    run_dir = _reference(setup)  # a run with checkpoints, left as it was
    cmd = _command(config, [f"run_dir={run_dir}", "train.threads=1", *sets], 2)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    ours = done.stderr.split("ChildFailedError")[0]  # torchrun's report of the failed job follows
    assert ours.count("nmt train: error:") == 1 and message in ours, ours[-3000:]
    assert "[rank" not in ours  # no rank's traceback (torchrun prefixes them)
    # Root cause: rank 0's error, not a rank stopped before it could report (torchrun names the first failure).
    root_cause = done.stderr.split("Root Cause")[1]
    assert "rank      : 0" in root_cause and "exitcode  : 2" in root_cause, root_cause


def test_a_rank_whose_peer_died_says_so_in_one_line(setup):
    root, config, _, _, env = setup
    sets = _run_dir(setup, "killed") + ["train.validate_every=2"]
    killed = {**env, "NMT_TEST_KILL_BEFORE_RENAME": "1"}  # rank 0, as it writes its first checkpoint
    done = subprocess.run(_command(config, sets, 2), env=killed, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    ours = done.stderr.split("ChildFailedError")[0]
    assert "[rank" not in ours and "Connection closed" not in ours, ours[-3000:]
    # Rank 1 says why it ends, unless torchrun's SIGTERM to it came first (then it ends interrupted).
    said = "nmt train: error: rank 1: another rank stopped (see its message)" in ours
    failures = done.stderr.split("Failures:")[1]
    assert said or "exitcode  : 143" in failures or "SIGTERM" in failures
    assert ours.count("nmt train: error:") == int(said)


def _train_two_ranks_running(
    setup, script: Path, text: str, run_name: str, max_updates: int | None = None
) -> subprocess.CompletedProcess:
    """``nmt train`` on two torchrun ranks that each run ``text`` (written to ``script``) as their
    main, into a fresh run directory ``run_name``."""
    _, config, _, _, env = setup
    script.write_text(text)
    sets = _run_dir(setup, run_name) + ([] if max_updates is None else [f"train.max_updates={max_updates}"])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), "train"]
    cmd += ["--config", str(config)] + [a for s in sets for a in ("--set", s)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


_DIES_IN_SETUP = """
import os, signal, sys
from nmt import trainer
from nmt.cli import main

loading = trainer.Trainer._resume_and_record

def dies(self, *args, **kwargs):  # rank 1, killed as the ranks load the checkpoint
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return loading(self, *args, **kwargs)

trainer.Trainer._resume_and_record = dies
sys.exit(main(sys.argv[1:]))
"""


def test_a_peer_lost_in_the_set_up_ends_train_log_with_the_console_s_line(setup, tmp_path):
    # train.log ended on gloo's own error ('error: RuntimeError: [.../pair.cc:553] Connection closed
    # by peer ... GLHF!'), where the console said 'rank 0: another rank stopped (see its message)'.
    root = setup[0]
    done = _train_two_ranks_running(setup, tmp_path / "dies_in_setup.py", _DIES_IN_SETUP, "died-in-setup")
    assert done.returncode != 0
    ours = done.stderr.split("ChildFailedError")[0]
    said = "nmt train: error: rank 0: another rank stopped (see its message)"
    assert ours.count("nmt train: error:") == 1 and f"{said}\n" in ours, ours[-3000:]
    last = (root / "died-in-setup" / "train.log").read_text().splitlines()[-1]
    assert last.split(" ", 2)[2] == said.removeprefix("nmt train: "), last


def _two_ranks(setup) -> Path:
    """Two ranks with ``train.accumulate: 1`` left alone: what a resumed two-rank run must equal."""
    return _finished_run(setup, "ddp-blas", "two-ranks", ranks=2, accumulate=1)


@pytest.mark.parametrize("when, saved_at", [("start", 3), ("end", 4)])
def test_rank_0_saves_when_a_peer_dies_and_the_resumed_run_ends_as_one_left_alone(setup, when, saved_at):
    # As the host's out-of-memory killer would: rank 1 gets SIGKILL at update 4, as it starts it
    # (rank 0 cannot make it without rank 1's gradients) or once it has made it (so has rank 0,
    # but not the validation it was due).
    root, config, _, _, env = setup
    name = f"peer-died-{when}"
    sets = _run_dir(setup, name) + ["train.accumulate=1", "train.fp32_matmul=blas", "train.validate_every=4"]
    died = {**env, "NMT_TEST_RANK_DIES": f"1:4:{when}"}
    done = subprocess.run(_command(config, sets, 2), env=died, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    ours = done.stderr.split("ChildFailedError")[0]
    said = (
        f"nmt train: error: rank 0: another rank stopped (see its message); checkpoint written at update {saved_at}; "
        "resume with the same torchrun options (2 processes): torchrun ... -m nmt train --config "
        f"{root / name / 'config.yaml'}\n"
    )
    assert ours.count("nmt train: error:") == 1 and said in ours, ours[-3000:]
    assert "[rank" not in ours and "Connection closed" not in ours
    checkpoints = checkpoint.list_checkpoints(root / name / "checkpoints", "update")
    assert [c.update for c in checkpoints] == [saved_at]  # none but the one rank 0 wrote as it ended
    assert checkpoint_file.load(checkpoints[0].path)["progress"]["last_validated"] == -1
    train, valid = read_metrics(root / name)
    assert [r["update"] for r in train] == list(range(1, saved_at + 1)) and not valid  # an update made has its line

    log = _train(config, sets, 2, env)
    assert f"resuming at update {saved_at} " in log
    assert log.count("validation at update 4:") == 1 and log.index("validation at update 4:") < log.index("update 5 ")
    assert _max_diff(_weights(root / name, UPDATES), _weights(_two_ranks(setup), UPDATES)) == 0.0


def _gathered(monkeypatch, outcomes: list) -> None:
    """The outcomes every rank sends in ``agree``, as if gathered from two processes."""

    def all_gather_object(into, mine, group=None):
        into[:] = [mine if o == "mine" else o for o in outcomes]

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)


def test_agree_reports_each_failure_once_and_ends_the_other_ranks_with_its_status(monkeypatch):
    rank1 = World(rank=1, world_size=2)

    def fail(message: str, code: int = 2):
        def work():
            error = NMTError(message)
            error.exit_code = code
            raise error

        return work

    _gathered(monkeypatch, [Outcome("no such corpus", 3), None])  # rank 0 failed alone
    with pytest.raises(Stopped) as stopped:
        rank_failures.agree(rank1, lambda: None)
    assert stopped.value.exit_code == 3 and str(stopped.value) == ""

    _gathered(monkeypatch, [Outcome("cannot resume", 2), "mine"])  # both alike: rank 0 reports it
    with pytest.raises(Stopped):
        rank_failures.agree(rank1, fail("cannot resume"))

    _gathered(monkeypatch, [Outcome("cannot resume", 2), "mine"])  # an error of its own stays visible
    with pytest.raises(NMTError, match="damaged shard"):
        rank_failures.agree(rank1, fail("damaged shard"))

    _gathered(monkeypatch, [Outcome("interrupted", 143, signal.SIGTERM), None])  # rank 0 stopped for a signal
    with pytest.raises(SignalPending) as pending:
        rank_failures.agree(rank1, lambda: None)
    assert pending.value.signum == signal.SIGTERM

    _gathered(monkeypatch, [None, None])
    assert rank_failures.agree(rank1, lambda: 7) == 7


def test_a_rank_reports_only_what_is_its_own(monkeypatch):
    rank1 = World(rank=1, world_size=2, local_rank=1, local_world_size=2)

    def ended(error: BaseException) -> BaseException:
        with pytest.raises(BaseException) as raised:
            with rank_failures.reported_once(rank1):
                raise error
        return raised.value

    lost = ended(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1234."))
    assert isinstance(lost, PeerLost) and str(lost) == "rank 1: another rank stopped (see its message)"
    timeout = ended(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 1800000ms for recv"))
    assert str(timeout) == "rank 1: another rank stopped answering (see its messages)"
    interrupted = ended(Interrupted("SIGTERM received: checkpoint written at update 3", signal.SIGTERM))
    assert isinstance(interrupted, Stopped) and interrupted.exit_code == 143 and str(interrupted) == ""
    assert isinstance(ended(NMTError("train.no_such_key: unknown key")), Stopped)  # before the ranks joined
    monkeypatch.setattr(distributed, "joined", True)
    own = ended(NMTError("no GPU 1"))
    assert str(own) == "rank 1: no GPU 1" and own.exit_code == 2
    damaged = ended(DamagedData("a training shard holds token id 999"))  # rank 0 reports it if it found it too
    assert isinstance(damaged, Stopped) and damaged.wait and damaged.exit_code == 2
    assert damaged.fallback == "rank 1: a training shard holds token id 999"
    bug = ended(ValueError("a bug"))
    assert isinstance(bug, ValueError)  # with its traceback
    saved = PeerLost("rank 0: another rank stopped (see its message); checkpoint written at update 3; resume ...")
    with pytest.raises(PeerLost) as rank0:  # rank 0's own, once it has saved: as it is
        with rank_failures.reported_once(World(rank=0, world_size=2, local_world_size=2)):
            raise saved
    assert rank0.value is saved


GONE = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1234.")


@pytest.mark.parametrize(
    "rank, update, error, saves",
    [
        (0, 3, GONE, True),
        (1, 3, GONE, False),  # the other ranks never write
        (0, 0, GONE, False),  # no update yet: nothing to keep
        (0, 3, ValueError("a bug"), False),
        (0, 3, NMTError("a training shard holds token id 999"), False),
    ],
)
def test_only_rank_0_saves_for_a_lost_peer_once_an_update_is_made(tmp_path, rank, update, error, saves):
    from nmt.training import saved_if_a_peer_is_lost

    cfg = load_config(tiny_config(tmp_path))
    trainer = Trainer(cfg, RunDir(cfg.run_dir), lambda m: None)
    trainer.world, trainer.progress.update = World(rank=rank, world_size=2, local_world_size=2), update
    saved: list[int] = []
    trainer.save = lambda: saved.append(trainer.progress.update)
    with pytest.raises(Exception) as raised:
        with saved_if_a_peer_is_lost(trainer):
            raise error
    if not saves:
        assert raised.value is error and saved == []
        return
    assert saved == [update] and isinstance(raised.value, PeerLost) and raised.value.exit_code == 1
    assert str(raised.value) == (
        "rank 0: another rank stopped (see its message); checkpoint written at update 3; resume with the same "
        f"torchrun options (2 processes): torchrun ... -m nmt train --config {tmp_path / 'run' / 'config.yaml'}"
    )


def test_a_resume_on_another_number_of_processes_says_what_keeps_the_update_s_size():
    def change(world_size: int, update_batches: int, world: int, accumulate: int) -> str | None:
        return world_size_change(Progress(world_size=world_size, update_batches=update_batches), world, accumulate)

    same = "resuming on 1 process, not 2: an update still takes 2 batches (train.accumulate 2 x 1)"
    assert change(2, 2, 1, 2) == same
    assert change(2, 2, 1, 1) == (
        "warning: resuming on 1 process, not 2: an update now takes 1 batch (train.accumulate 1 x 1), not 2; "
        "--set train.accumulate=2 keeps it"
    )
    assert change(2, 6, 4, 1).endswith("not 6; no train.accumulate keeps it")
    assert change(2, 2, 2, 1) is None  # the same number
    assert change(2, 2, 2, 3) == "resuming with train.accumulate 3: an update now takes 6 batches, not 2"
    assert change(1, 4, 1, 1) == "resuming with train.accumulate 1: an update now takes 1 batch, not 4"
    assert change(0, 0, 2, 1) is None  # a checkpoint of an earlier version: not known


def test_the_resume_hint_of_a_torchrun_job_names_its_processes(tmp_path):
    cfg = load_config(tiny_config(tmp_path))
    trainer = Trainer(cfg, RunDir(cfg.run_dir), lambda m: None)
    trainer.progress.update = 7
    trainer.world = World(rank=0, world_size=16, local_rank=0, local_world_size=8)
    assert str(trainer.interrupted(signal.SIGTERM)) == (
        "SIGTERM received: checkpoint written at update 7; resume with the same torchrun options "
        f"(16 processes, 8 per machine): torchrun ... -m nmt train --config {tmp_path / 'run' / 'config.yaml'}"
    )
    trainer.world = World()
    alone = str(trainer.interrupted(signal.SIGINT))
    assert alone.endswith(f"resume with: nmt train --config {tmp_path / 'run' / 'config.yaml'}")


def test_share_gives_every_rank_its_round_robin_part():
    group = [[1], [2], [3]]
    assert [share(group, World(rank=r, world_size=2)) for r in (0, 1)] == [[[1], [3]], [[2]]]
    assert share(group[:1], World(rank=1, world_size=2)) == []  # the trainer then adds a zero-weight batch


def test_exit_rank_flushes_output_and_keeps_the_exit_code():
    """A rank ends by os._exit (no interpreter teardown): what it printed must still arrive, and its
    exit status must be the run's, since torchrun judges the job by it."""
    code = "import sys; from nmt.distributed import exit_rank; print('done'); sys.stderr.write('note'); exit_rank(143)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output to a pipe is then buffered
    env["PYTHONPATH"] = str(Path(__file__).parent.parent)  # this checkout's nmt, whatever the working directory
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (143, "done\n", "note")


def test_ranks_take_the_latest_clock_after_a_validation(monkeypatch):
    # Each rank reads its own clock after a validation; one a millisecond ahead would stop at
    # max_minutes alone and leave the other waiting in a collective. They take the latest.
    from types import SimpleNamespace

    from nmt.training import agreed_clock

    other_rank = 100.002

    def all_reduce(tensor, op=None):
        assert op == torch.distributed.ReduceOp.MAX
        tensor.copy_(torch.maximum(tensor, torch.full_like(tensor, other_rank)))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    trainer = SimpleNamespace(world=World(rank=0, world_size=2), device=torch.device("cpu"))
    assert agreed_clock(trainer, 100.001) == other_rank
    assert agreed_clock(trainer, 100.003) == 100.003
    alone = SimpleNamespace(world=World(rank=0, world_size=1), device=torch.device("cpu"))
    assert agreed_clock(alone, 100.001) == 100.001


def test_a_kernel_setting_no_rank_can_run_is_one_line_from_rank_0(setup, tmp_path):
    # As a torch build without oneDNN (or a GPU job) meets train.fp32_matmul: onednn: every rank
    # finds it alike, so rank 0 alone says so.
    root, config, _, _, env = setup
    script = tmp_path / "no_onednn.py"
    script.write_text(
        "import sys\nimport nmt.autotune\nnmt.autotune.onednn_available = lambda: False\n"
        "from nmt.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    cmd += [
        "train",
        "--config",
        str(config),
        "--set",
        f"run_dir={tmp_path / 'run'}",
        "--set",
        "train.fp32_matmul=onednn",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    ours = done.stderr.split("ChildFailedError")[0]
    assert done.returncode != 0
    assert ours.count("nmt train: error:") == 1 and "cannot send products to oneDNN" in ours, ours[-3000:]


_QUIET_RANK = """
import sys
from nmt import cli, rank_failures
rank_failures.REPORT_WAIT_S = float(sys.argv[1])
stop = rank_failures.Stopped(2, wait=sys.argv[2] == "wait", fallback=sys.argv[3])
def fail(args):
    open(sys.argv[4], "w").close()  # the command has failed
    raise stop
args = cli.build_parser().parse_args(["train", "--config", "x.yaml"])
args.func = fail
sys.exit(cli._run(args))
"""


def test_a_quiet_rank_stays_until_torchrun_stops_it_so_the_report_gets_out(tmp_path):
    """torchrun SIGTERMs every rank once one ends with a failure: a rank ending quietly at once cut
    the reporting rank's message short (it printed 'interrupted' instead, CI saw it once)."""
    script = tmp_path / "quiet.py"
    script.write_text(_QUIET_RANK)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}  # this checkout's nmt, not an installed one

    def rank(report_wait_s: str, wait: str, fallback: str, failed: str) -> subprocess.Popen:
        command = [sys.executable, str(script), report_wait_s, wait, fallback, str(tmp_path / failed)]
        return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)

    # The three at once: each pays a second to import torch, and the first then waits 2 s anyway.
    waiting = rank("600", "wait", "", "failed")
    # Nobody stopped it: after the wait it says what it knows; for a signal it does not wait at all.
    late = rank("0.5", "wait", "rank 1: no GPU 1", "failed-late")
    start = time.monotonic()
    signal_stop = rank("600", "no", "", "failed-signal")
    try:
        failed = tmp_path / "failed"
        deadline = time.monotonic() + 120
        while not failed.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)
        assert failed.exists() and waiting.poll() is None  # failed, and now waiting
        waiting.terminate()  # as torchrun does once the reporting rank has exited
        assert waiting.wait(timeout=30) == -signal.SIGTERM and waiting.stderr.read() == ""
        said = late.communicate(timeout=120)[1]
        assert (late.returncode, said) == (2, "nmt train: error: rank 1: no GPU 1\n")
        said = signal_stop.communicate(timeout=120)[1]
        assert signal_stop.returncode == 2 and said == ""
        assert time.monotonic() - start < 120
    finally:
        for process in (waiting, late, signal_stop):
            process.kill()
            process.wait()


def test_a_rank_given_another_config_is_one_line_from_rank_0(setup, tmp_path):
    # As a second machine whose copy of the config, or whose --set, says another learning rate: its
    # replica drifted apart from rank 0's in silence (another model: a DDP traceback).
    root, config, _, _, env = setup
    script = tmp_path / "rank_1_differs.py"
    script.write_text(
        "import os, sys\nfrom nmt.cli import main\nargs = sys.argv[1:]\n"
        "if os.environ['RANK'] == '1':\n    args += ['--set', 'train.lr_peak=0.05']\nsys.exit(main(args))\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), "train"]
    cmd += ["--config", str(config), "--set", f"run_dir={tmp_path / 'run'}", "--set", "train.threads=1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    ours = done.stderr.split("ChildFailedError")[0]
    assert done.returncode != 0 and "[rank" not in ours, ours[-3000:]
    assert (
        ours.count("nmt train: error:") == 1
        and (
            "nmt train: error: rank 1 was given another config than rank 0 (train.lr_peak 0.05, not 0.01): give every "
            "rank the same config file and --set options"
        )
        in ours
    ), ours[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert "rank      : 0" in done.stderr.split("Root Cause")[1]


def test_ranks_compare_their_configs_but_not_their_paths():
    rank0 = {"run_dir": "/a/run", "data": {"train": {"path": "/a/train", "max_pairs": None}}, "train": {"lr": 1}}
    elsewhere = {"run_dir": "/b/run", "data": {"train": {"path": "/b/train", "max_pairs": None}}, "train": {"lr": 1}}
    assert distributed.config_differences(rank0, elsewhere) == []
    other = {**elsewhere, "train": {"lr": 2}, "data": {"train": {"path": "/b/train", "max_pairs": 5}}}
    assert distributed.config_differences(rank0, other) == ["data.train.max_pairs 5, not None", "train.lr 2, not 1"]


def test_another_rank_opens_the_shards_rank_0_prepared_where_its_corpus_looks_other(tmp_path):
    # A second machine's copy of the corpus (other file times; or the same files under another
    # mount): its ranks encoded the training data again, into the shards the others had open.
    cfg = load_config(tiny_config(tmp_path))
    prepare(cfg, RunDir(cfg.run_dir), lambda m: None).train.close()  # as rank 0 has, before the others open it
    index = Path(cfg.run_dir) / "data" / "train" / "index.json"
    written = index.stat().st_mtime_ns
    corpus = tmp_path / "data" / "train.de"
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    said: list[str] = []
    data = prepare(cfg, RunDir(cfg.run_dir), said.append, made_by_rank_0=True)  # another rank
    data.train.close()
    assert index.stat().st_mtime_ns == written and len(data.train) == 8
    assert any(m.startswith("train: reusing 8 encoded pairs") for m in said), said


_OTHER_MACHINE = """
import os, sys
import nmt.prepare, nmt.provenance
from nmt.cli import main
if os.environ["RANK"] == "1":  # its copy of the corpus has other file times, as on another machine
    stamps, binarize = nmt.provenance.file_stamps, nmt.prepare.binarize
    nmt.provenance.file_stamps = lambda files: [stamp + "1" for stamp in stamps(files)]
    def encoding(*args, **kwargs):
        print("rank 1 encodes the training data", file=sys.stderr, flush=True)
        return binarize(*args, **kwargs)
    nmt.prepare.binarize = encoding
sys.exit(main(sys.argv[1:]))
"""


def test_the_other_ranks_train_on_rank_0_s_shards_without_encoding_again(setup, tmp_path):
    done = _train_two_ranks_running(setup, tmp_path / "other_machine.py", _OTHER_MACHINE, "other-machine", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 1 encodes" not in done.stderr


@pytest.mark.parametrize("unset", [("MASTER_ADDR",), ("MASTER_PORT",), ("MASTER_ADDR", "MASTER_PORT")])
def test_a_rank_without_the_store_s_address_says_which_variable_is_missing(monkeypatch, unset):
    # RANK and WORLD_SIZE set by hand without them: PyTorch's ValueError ended in a traceback.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    for name in unset:
        monkeypatch.delenv(name)
    with pytest.raises(NMTError, match=f"rank 1: cannot join the other ranks: {' and '.join(unset)} not set"):
        distributed.init(World(rank=1, world_size=2), torch.device("cpu"))
    assert not torch.distributed.is_initialized()


def test_a_rank_that_cannot_join_the_others_says_why_not_that_a_peer_stopped(tmp_path):
    # Ranks started with MASTER_ADDR and MASTER_PORT (a batch system, not torchrun) whose port is
    # taken: gloo's DistNetworkError read 'rank 0: another rank stopped (see its message)'.
    import socket

    config = tiny_config(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "OMP_NUM_THREADS": "1"}
        env.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = [sys.executable, "-m", "nmt", "train", "--config", str(config)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"nmt train: error: rank 0: cannot join the other ranks at 127.0.0.1:{port} ("
    ), done.stderr[-3000:]
    assert "address already in use" in lines[0]


_INTERRUPTED_IMPORTING_TORCH = """
import sys
from nmt.cli import main

class InterruptOnce:  # the signal comes while torch is half imported
    done = False

    def find_spec(self, name, path=None, target=None):
        if name == "torch._meta_registrations" and not InterruptOnce.done:
            InterruptOnce.done = True
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, InterruptOnce())
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("rank, said", [("0", "nmt train: interrupted\n"), ("1", "")])
def test_a_rank_interrupted_while_importing_torch_says_so_in_one_line(tmp_path, rank, said):
    # torchrun's SIGTERM (a peer killed at start, or Ctrl-C) as a rank imports torch: after
    # 'interrupted', main imported nmt.distributed for the rank's exit, and with it torch again,
    # which failed half-way in a traceback, exit status 1. Every rank has the signal, and each said
    # 'interrupted' (eight lines from eight GPUs): rank 0 says it, as it does once the ranks have joined.
    config = tiny_config(tmp_path)
    script = tmp_path / "interrupted.py"
    script.write_text(_INTERRUPTED_IMPORTING_TORCH)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "OMP_NUM_THREADS": "1"}
    env.update(WORLD_SIZE="2", RANK=rank, LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    done = subprocess.run(
        [sys.executable, str(script), "train", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr == said, done.stderr[-3000:]
    assert done.returncode == 128 + signal.SIGINT


def test_a_rank_whose_peers_never_come_gives_up_after_the_join_timeout(tmp_path):
    # Rank 0 of two, started by hand, whose rank 1 never comes (or, as seen from rank 1, an address
    # not reached): the store's wait was the collectives' 30 min, with nothing said meanwhile.
    import socket

    config = tiny_config(tmp_path)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "OMP_NUM_THREADS": "1"}
    env.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env[distributed.JOIN_TIMEOUT_VARIABLE] = "1"
    cmd = [sys.executable, "-m", "nmt", "train", "--config", str(config)]
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"nmt train: error: rank 0: cannot join the other ranks at 127.0.0.1:{port} (")
    assert lines[0].endswith("; waited 1 s, which NMT_JOIN_TIMEOUT_S sets"), lines[0]
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan"])
def test_a_join_timeout_that_is_not_a_positive_number_of_seconds_is_refused(monkeypatch, value):
    monkeypatch.setenv(distributed.JOIN_TIMEOUT_VARIABLE, value)
    with pytest.raises(NMTError, match=f"NMT_JOIN_TIMEOUT_S='{value}': expected a number of seconds"):
        distributed.join_timeout_from_environment()


def test_the_join_timeout_defaults_to_minutes_and_reads_seconds(monkeypatch):
    monkeypatch.delenv(distributed.JOIN_TIMEOUT_VARIABLE, raising=False)
    assert distributed.join_timeout_from_environment() == distributed.JOIN_TIMEOUT
    monkeypatch.setenv(distributed.JOIN_TIMEOUT_VARIABLE, "90")
    assert distributed.join_timeout_from_environment().total_seconds() == 90


def test_ranks_waiting_to_join_one_that_failed_alone_end_at_torchrun_s_sigterm(setup, tmp_path):
    # An error only rank 1 finds before the ranks join (its own --set): it reports after its wait,
    # and torchrun SIGTERMs rank 0, which waits in the store's C++ call for rank 1 to join. Python's
    # handler never ran there, so rank 0 ended only by torchrun's SIGKILL 30 s later.
    root, config, _, _, env = setup
    script = tmp_path / "rank_1_alone.py"
    script.write_text(
        "import os, sys\nfrom nmt import rank_failures\nfrom nmt.cli import main\n"
        "rank_failures.REPORT_WAIT_S = 1.0\nargs = sys.argv[1:]\n"
        "if os.environ['RANK'] == '1':\n    args += ['--set', 'train.no_such_key=1']\nsys.exit(main(args))\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), "train"]
    cmd += ["--config", str(config), "--set", f"run_dir={tmp_path / 'run'}", "--set", "train.threads=1"]
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    ours = done.stderr.split("ChildFailedError")[0]
    assert ours.count("nmt train: error:") == 1 and "rank 1: --set train.no_such_key=1: unknown config key" in ours
    # rank 0's, then the root cause: rank 1's (torchrun 2.5 and older name the root cause alone)
    failures = done.stderr.split("Failures:")[1]
    assert "exitcode  : -15" in failures or "<NO_OTHER_FAILURES>" in failures, failures
    assert "SIGKILL" not in failures, failures
    assert time.monotonic() - start < 25


_DAMAGED_AFTER_UPDATE_1 = """
import sys
from pathlib import Path
from nmt import rank_failures, shards, testhooks
from nmt.cli import main

rank_failures.REPORT_WAIT_S = float(sys.argv[1])
finds, run_dir = sys.argv[2], Path(sys.argv[3])
hook = testhooks.at_update


def damage(rank, update, when):
    hook(rank, update, when)
    if (update, when) != (1, "end"):  # before the ranks agree on the clock: update 2 reads the damage
        return
    if finds == "both" and rank == 0:  # the shards cut short to their headers: every read falls short
        for path in (run_dir / "data" / "train").glob("shard-*.src.npy"):
            header = shards._NpyReader(path).data_offset
            with open(path, "r+b") as f:
                f.truncate(header)
    if finds == "rank 1" and rank == 1:  # its own copy cut short, as on a machine of its own
        read = shards.os.pread
        shards.os.pread = lambda fd, n, offset: read(fd, n, offset)[:-1]


testhooks.at_update = damage
sys.exit(main(sys.argv[4:]))
"""


@pytest.mark.parametrize("finds", ["both", "rank 1"])
def test_a_shard_found_cut_short_during_training_is_reported_once(setup, tmp_path, finds):
    # Both ranks read the damaged shard at update 2 and both printed its line; a failure that only
    # rank 1 finds must still be reported, by rank 1 (after its wait for rank 0's report).
    root, config, _, _, env = setup
    name = f"damaged-{finds.replace(' ', '-')}"
    sets = _run_dir(setup, name)
    script = tmp_path / "damaged.py"
    script.write_text(_DAMAGED_AFTER_UPDATE_1)
    wait_s = "60" if finds == "both" else "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), wait_s]
    cmd += [finds, str(root / name), "train", "--config", str(config)] + [a for s in sets for a in ("--set", s)]
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    ours = done.stderr.split("ChildFailedError")[0]
    assert done.returncode != 0 and "[rank" not in ours, ours[-3000:]
    said = [line for line in ours.splitlines() if line.startswith("nmt train: error: ")]
    reporter = "nmt train: error: " + ("rank 1: " if finds == "rank 1" else "") + str(root / name / "data" / "train")
    shard = [line for line in said if "shard is shorter than its header says (truncated?)" in line]
    assert len(shard) == 1 and shard[0].startswith(reporter), ours[-3000:]
    assert time.monotonic() - start < 50  # rank 1 ended by torchrun, not at the end of its wait
