"""The places where tests reach into a running process, all here so production code shows them.

- ``NMT_TEST_KILL_BEFORE_RENAME=N``: a training process SIGKILLs itself during its N-th write of
  a training-state checkpoint, after the temporary file is complete and before the rename (the
  fault-injection tests). In-process tests set ``before_rename`` to a callable instead.
- ``NMT_TEST_PARAM_DIGESTS=DIR``: each rank appends a SHA-256 of its weights to ``DIR/rankR.txt``
  after every update (the data-parallel equivalence test).
- ``NMT_TEST_HOLD_SHARD=N:FILE``: the encoding of training shard N writes its process id to FILE,
  then never ends
  (the tests that interrupt a data preparation while its workers encode).
- ``NMT_TEST_FP16_ON_CPU=1``: fp16 counts as runnable on a CPU (torch has fp16 autocast and a
  GradScaler there), so tests run the fp16 training path, loss scaling included, without a GPU.
  Users keep the rule that fp16 needs one.
- ``NMT_TEST_SLOW_VALIDATION=SECONDS:FILE``: at each step of a validation, where it looks for a
  signal, rank 0 appends a line to FILE and sleeps SECONDS (the tests that interrupt a validation).
  In-process tests set ``validation_step`` to a callable instead.
- ``NMT_TEST_RANK_DIES=R:N:WHEN``: rank R SIGKILLs itself at update N, as the host's out-of-memory
  killer would: WHEN ``start`` as it starts the update, ``end`` once it has made it, before the
  ranks agree on the clock (the tests of a torchrun job whose rank died).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

KILL_BEFORE_RENAME = "NMT_TEST_KILL_BEFORE_RENAME"
PARAM_DIGESTS = "NMT_TEST_PARAM_DIGESTS"
HOLD_SHARD = "NMT_TEST_HOLD_SHARD"
FP16_ON_CPU = "NMT_TEST_FP16_ON_CPU"
SLOW_VALIDATION = "NMT_TEST_SLOW_VALIDATION"
RANK_DIES = "NMT_TEST_RANK_DIES"

before_rename: Callable[[Path], None] | None = None  # set by in-process tests
validation_step: Callable[[], None] | None = None  # set by in-process tests
_state_writes = 0  # training-state checkpoints written by this process, for KILL_BEFORE_RENAME


def checkpoint_before_rename(tmp: Path) -> None:
    """Called by every checkpoint write between the complete temporary file and its rename."""
    global _state_writes
    if before_rename is not None:
        before_rename(tmp)
    target = os.environ.get(KILL_BEFORE_RENAME)
    if target and re.match(r"\.update_\d{8}\.pt\.tmp", tmp.name):
        _state_writes += 1
        if _state_writes == int(target):
            os.kill(os.getpid(), signal.SIGKILL)


def trace_parameters(model, rank: int, update: int) -> None:
    """After each update: with PARAM_DIGESTS set, append a digest of ``model``'s weights."""
    directory = os.environ.get(PARAM_DIGESTS)
    if not directory:
        return
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    with open(Path(directory) / f"rank{rank}.txt", "a", encoding="utf-8") as f:
        f.write(f"{update} {digest.hexdigest()}\n")


def encoding_shard(index: int) -> None:
    """Called as the encoding of training shard ``index`` starts (in a worker process, or not)."""
    held, _, marker = os.environ.get(HOLD_SHARD, "").partition(":")
    if held and int(held) == index:
        Path(marker).write_text(str(os.getpid()))
        while True:
            time.sleep(1)


def fp16_on_cpu() -> bool:
    """Whether tests have let fp16 run on a CPU (FP16_ON_CPU)."""
    return os.environ.get(FP16_ON_CPU) == "1"


def validating() -> None:
    """Called by rank 0 at each step of a validation (before it, after each batch), before it looks for a signal."""
    if validation_step is not None:
        validation_step()
    seconds, _, marker = os.environ.get(SLOW_VALIDATION, "").partition(":")
    if seconds:
        with open(marker, "a", encoding="utf-8") as f:
            f.write("step\n")
        time.sleep(float(seconds))


def at_update(rank: int, update: int, when: str) -> None:
    """Called by every rank as it starts update ``update`` (``when`` "start") and once it has made it ("end")."""
    if os.environ.get(RANK_DIES) == f"{rank}:{update}:{when}":
        os.kill(os.getpid(), signal.SIGKILL)
