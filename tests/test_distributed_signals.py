"""Signals to a torchrun job of two gloo ranks before training starts: what the console and train.log
say, and which rank says it (README: an interruption is rank 0's to report)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import child_pids, running, tiny_config

from nmt import rank_failures, signals, testhooks
from nmt.distributed import World
from nmt.runlock import RunLock
from nmt.signals import Terminated, sigterm_interrupts

CHECKOUT = str(Path(__file__).parent.parent)  # this checkout's nmt, not an installed one


def _wait_for(path: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), f"{path} never appeared"


def test_a_signal_while_rank_0_prepares_the_data_is_an_interruption(tmp_path):
    # torchrun's SIGTERM (or Ctrl-C) while rank 0 encoded the corpus and rank 1 waited for it: rank 1
    # left the wait at once, and rank 0 said 'rank 0: another rank stopped (see its message)', exit 1,
    # where there was no other message: the job had been interrupted.
    config = tiny_config(tmp_path)
    held = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": CHECKOUT, "OMP_NUM_THREADS": "1", testhooks.HOLD_SHARD: f"0:{held}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "nmt"]
    cmd += ["train", "--config", str(config), "--set", "train.threads=1"]
    job = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(held)  # rank 0 encodes shard 0; rank 1 waits for it
        job.send_signal(signal.SIGTERM)
        err = job.communicate(timeout=120)[1]
    finally:
        job.kill()
        job.wait()
    ours = err.split("Traceback")[0]  # torchrun's own SignalException traceback follows
    assert "another rank" not in ours and ours.count("nmt train: interrupted\n") == 1, ours[-3000:]
    last = (tmp_path / "run" / "train.log").read_text().splitlines()[-1]
    assert last.split(" ", 2)[2] == "interrupted", last


def test_a_signal_during_the_ranks_exchange_is_acted_on_once_it_is_complete(monkeypatch):
    exchanged = []

    def all_gather_object(into, mine, group=None):  # torchrun's SIGTERM comes while the ranks exchange
        os.kill(os.getpid(), signal.SIGTERM)
        exchanged.append(mine)
        into[:] = [mine, None]

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    with sigterm_interrupts(), pytest.raises(Terminated):
        rank_failures.agree(World(rank=0, world_size=2), lambda: "done")
    assert exchanged == [None]  # this rank's outcome went out whole: the others learn how its step went


_SIGNAL_AS_THE_RANKS_AGREE = """
import os, signal, sys
from nmt import distributed
from nmt.cli import main

exchange, exchanges = distributed.all_reduce, []


def signalled(values, world, device, op="sum"):
    if op == "max" and len(values) == 2:  # the loop's clock and signal, after each update
        exchanges.append(values)
        if len(exchanges) == 3:  # Ctrl-C, passed on by torchrun as this rank has sent its values
            os.kill(os.getpid(), signal.SIGINT)
    return exchange(values, world, device, op)


distributed.all_reduce = signalled
sys.exit(main(sys.argv[1:]))
"""


def test_a_signal_while_the_ranks_agree_on_it_stops_them_at_the_next_update(tmp_path):
    # The ranks took the signal they agreed on in place of the one each had recorded meanwhile: a
    # Ctrl-C that came then was lost on every rank, and the job trained on until torchrun, 30 s
    # later, killed the ranks with the updates since the last validation.
    config = tiny_config(tmp_path, max_updates=8, validate_every=1000, warmup_updates=2)
    script = tmp_path / "signalled.py"
    script.write_text(_SIGNAL_AS_THE_RANKS_AGREE)
    env = {**os.environ, "PYTHONPATH": CHECKOUT, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    cmd += ["train", "--config", str(config), "--set", "train.threads=1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    ours = done.stderr.split("ChildFailedError")[0]
    assert done.returncode != 0 and ours.count("nmt train: error:") == 1, ours[-3000:]
    assert "nmt train: error: SIGINT received: checkpoint written at update 4; resume with" in ours, ours[-3000:]
    assert "exitcode  : 130" in done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent's death signal is Linux's")
def test_ranks_whose_torchrun_is_killed_write_their_state_and_end(tmp_path):
    # kill -9 of torchrun left its ranks training on their own, rank 0 holding train.lock, so the
    # next nmt train was refused as locked until the user found and killed them.
    config = tiny_config(tmp_path, max_updates=100_000, validate_every=100_000, log_every=100_000, warmup_updates=1)
    digests = tmp_path / "digests"
    digests.mkdir()
    env = {**os.environ, "PYTHONPATH": CHECKOUT, "OMP_NUM_THREADS": "1", testhooks.PARAM_DIGESTS: str(digests)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "nmt"]
    cmd += ["train", "--config", str(config), "--set", "train.threads=1"]
    err = tmp_path / "stderr"
    ranks: list[int] = []
    with open(err, "w") as stderr:
        job = subprocess.Popen(cmd, env=env, stderr=stderr, start_new_session=True)
    try:
        _wait_for(digests / "rank0.txt")  # training runs
        ranks = child_pids(job.pid)  # torchrun starts each rank in a session of its own
        assert len(ranks) == 2, ranks
        job.kill()
        job.wait()
        deadline = time.monotonic() + 20
        while any(running(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(running(pid) for pid in ranks), err.read_text()[-3000:]
    finally:
        for pid in [job.pid, *ranks]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        job.wait()
    said = err.read_text()
    assert RunLock(tmp_path / "run" / "train.lock").holder() is None
    written = re.search(r"SIGTERM received: checkpoint written at update (\d+)", said)
    assert written, said[-3000:]
    update = int(written.group(1))
    resume = [sys.executable, "-m", "nmt", "train", "--config", str(config), "--set", "train.threads=1"]
    resume += ["--set", f"train.max_updates={update + 1}"]
    resumed = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0 and f"resuming at update {update} " in resumed.stderr, resumed.stderr[-3000:]


def test_only_a_torchrun_rank_asks_for_sigterm_at_its_parent_s_death(monkeypatch):
    asked, sent, parents = [], [], iter([100, 1])
    monkeypatch.setattr(signals, "_ask_for_signal_at_parent_death", lambda signum: asked.append(signum) or True)
    monkeypatch.setattr(os, "getppid", lambda: next(parents))
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append(signum))
    monkeypatch.delenv(signals.TORCHRUN_VARIABLE, raising=False)
    signals.end_with_torchrun()  # a plain nmt train: its parent is the user's shell
    assert asked == [] and sent == []
    monkeypatch.setenv(signals.TORCHRUN_VARIABLE, "none")
    signals.end_with_torchrun()  # torchrun died before the request: it would never fire
    assert asked == [signal.SIGTERM] and sent == [signal.SIGTERM]
