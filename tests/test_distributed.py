"""Data-parallel training with torchrun on CPU (gloo): replicas stay identical, two ranks equal one
process on the same global batches, and a run resumes with a different number of ranks."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_config, write_corpus

from nmt import checkpoint
from nmt.batching import token_batches
from nmt.config import load_config
from nmt.distributed import World, share
from nmt.models.linear import onednn_available
from nmt.prepare import prepare
from nmt.rundir import RunDir

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


def _weights(run_dir: Path, update: int) -> dict[str, torch.Tensor]:
    return checkpoint.load(run_dir / "checkpoints" / f"update_{update:08d}.pt")["model"]


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
    return [f"run_dir={run_dir}", f"train.max_tokens={max_tokens}", "train.threads=1"]


@pytest.mark.parametrize("library", ["blas", "onednn"])  # oneDNN hands some weight gradients over transposed
def test_two_gloo_ranks_equal_one_process_on_the_same_global_batches(setup, library):
    if library == "onednn" and not onednn_available():
        pytest.skip("this torch build has no oneDNN products")
    root, config, _, _, env = setup
    single = _run_dir(setup, f"single-{library}") + [f"train.fp32_matmul={library}"]
    _train(config, single + ["train.accumulate=2"], 1, env)
    digests = root / f"digests-{library}"
    digests.mkdir()
    ddp = _run_dir(setup, f"ddp-{library}") + [f"train.fp32_matmul={library}"]
    _train(config, ddp + ["train.accumulate=1"], 2, {**env, "NMT_TEST_PARAM_DIGESTS": str(digests)})

    rank0 = (digests / "rank0.txt").read_text().splitlines()
    rank1 = (digests / "rank1.txt").read_text().splitlines()
    assert len(rank0) == UPDATES and rank0 == rank1  # identical parameters after every update
    diff = _max_diff(_weights(root / f"single-{library}", UPDATES), _weights(root / f"ddp-{library}", UPDATES))
    assert diff <= 1e-5
    log = (root / f"ddp-{library}" / "train.log").read_text()
    assert "x 2 ranks (gloo)" in log and f"fp32 matmul {library}" in log
    assert not log.count("model:") > 1  # rank 0 alone writes the log


def test_resume_with_a_different_number_of_ranks(setup):
    root, config, _, _, env = setup
    resumed = _run_dir(setup, "resumed")
    _train(config, resumed + ["train.accumulate=1", "train.max_updates=3"], 2, env)
    _train(config, resumed + ["train.accumulate=2"], 1, env)  # the same global batch on one process
    assert _max_diff(_weights(root / "resumed", UPDATES), _weights(_reference(setup), UPDATES)) <= 1e-5
    assert "resuming at update 3" in (root / "resumed" / "train.log").read_text()


def _reference(setup) -> Path:
    """One process with ``train.accumulate: 2``: what two ranks with 1 must equal."""
    root, config, _, _, env = setup
    if not (root / "single").exists():
        _train(config, _run_dir(setup, "single") + ["train.accumulate=2"], 1, env)
    return root / "single"


def test_a_signal_during_a_validation_stops_every_rank_with_a_checkpoint(setup):
    # torchrun passes the signal on and kills the ranks 30 s later: rank 0 gives the validation up
    # at its next batch, where it would otherwise have decoded the whole dev set first.
    root, config, _, _, env = setup
    steps = root / "validation-steps"
    sets = _run_dir(setup, "stopped") + ["train.accumulate=1", "train.validate_every=3", "decode.batch_tokens=64"]
    slow = {**env, "NMT_TEST_SLOW_VALIDATION": f"1:{steps}"}
    proc = subprocess.Popen(_command(config, sets, 2), env=slow, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not steps.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert "SIGTERM received: checkpoint written at update 3" in err, err[-3000:]
    assert len(steps.read_text().splitlines()) <= 2  # of dozens of decoding batches
    state = checkpoint.load(root / "stopped" / "checkpoints" / "update_00000003.pt")
    assert state["progress"]["last_validated"] != 3

    # Resumed on one process with the same global batches: the update it stopped at is validated first.
    log = _train(config, sets[:-3] + ["train.accumulate=2", "train.validate_every=3"], 1, env)
    assert log.index("validation at update 3:") < log.index("validation at update 6:")
    assert _max_diff(_weights(root / "stopped", UPDATES), _weights(_reference(setup), UPDATES)) <= 1e-5


# Each rank: the timeouts of its two groups; then, with the default group's cut to 1 s, whether the
# others outlast 3 s of rank 0's work alone, waiting in the group made for that, and in the default one.
WAITS = """
import sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
from nmt import distributed

world = distributed.world_from_environment()
distributed.init(world, torch.device("cpu"))
cpu = torch.device("cpu")
default, solo = dist.group.WORLD._get_backend(cpu), distributed._solo_work_group._get_backend(cpu)
print(default.options._timeout, solo.options._timeout)
default._set_default_timeout(timedelta(seconds=1))
for solo_work in (True, False):
    if world.is_main:
        time.sleep(3)
    try:
        distributed.barrier(world, solo_work=solo_work)
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
    assert rank1 == ["0:30:00 6:00:00", "waited", "timed out"]


def test_share_gives_every_rank_its_round_robin_part():
    group = [[1], [2], [3]]
    assert [share(group, World(rank=r, world_size=2)) for r in (0, 1)] == [[[1], [3]], [[2]]]
    assert share(group[:1], World(rank=1, world_size=2)) == []  # the trainer then adds a zero-weight batch


def test_exit_rank_flushes_output_and_keeps_the_exit_code():
    """A rank ends by os._exit (no interpreter teardown): what it printed must still arrive, and its
    exit status must be the run's, since torchrun judges the job by it."""
    code = "import sys; from nmt.distributed import exit_rank; print('done'); sys.stderr.write('note'); exit_rank(143)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output to a pipe is then buffered
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (143, "done\n", "note")
