"""A failure across the ranks of a ``torchrun`` job, agreed on and reported once.

A step one rank does alone, or all do alike, ends with ``agree``, which tells every rank how it
went, so that the lowest rank with a message prints it and the others end quietly, once torchrun
stops them (``Stopped``); a rank whose peer went away says so in one line (rank 0 after saving
the training state, see ``nmt.training.saved_if_a_peer_is_lost``). ``reported_once`` wraps a
rank's whole command. Without torchrun (a world of one) ``agree`` just runs the step.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch.distributed as dist

from nmt import distributed
from nmt.distributed import World
from nmt.errors import DamagedData, NMTError, SharedError
from nmt.signals import Interrupted, SignalPending, held_signals

T = TypeVar("T")

# How long a rank that ends quietly waits for the rank that reports: torchrun stops every rank as
# soon as one ends with a failure, so a quiet rank that left first would cut the report short.
REPORT_WAIT_S = 30.0


class Stopped(NMTError):
    """This rank ends because another failed and reports why: no message; torchrun's SIGTERM, once the
    reporting rank has exited, or else the failure's exit status.

    ``wait``: stay until torchrun ends this process (after the reporting rank has printed and
    exited) or ``REPORT_WAIT_S`` pass; not for a signal, where torchrun is already stopping every
    rank. ``fallback``: printed if the wait runs out, for an error the ranks could not agree on
    (before they joined, or damage in the data found during an update), in case the rank meant to
    report it did not fail."""

    def __init__(self, exit_code: int, wait: bool = True, fallback: str = ""):
        super().__init__("")
        self.exit_code = exit_code
        self.wait = wait
        self.fallback = fallback

    def wait_for_report(self) -> str:
        """Wait as above (the command has ended); what to print if nobody ended this process."""
        if not self.wait:
            return ""
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        time.sleep(REPORT_WAIT_S)
        return self.fallback


class PeerLost(NMTError):
    """A collective failed because another rank went away or stopped answering."""

    exit_code = 1


@dataclass(frozen=True)
class Outcome:
    """How one rank's step failed, as the others learn it."""

    message: str
    exit_code: int
    signum: int | None = None  # a signal ended it


def _outcome(error: BaseException) -> Outcome:
    if isinstance(error, KeyboardInterrupt):
        signum = getattr(error, "signum", signal.SIGINT)
        return Outcome("interrupted", 128 + signum, signum)
    if isinstance(error, NMTError):
        return Outcome(str(error), error.exit_code)
    return Outcome(f"{type(error).__name__}: {error}", 1)  # a bug: that rank shows its traceback


def agree(world: World, work: Callable[[], T], solo_work: bool = False) -> T:
    """``work``'s result, once every rank knows that its step went well on all (every rank calls
    this; ``work`` may do nothing on some). Where it failed, a rank raises its own error unless a
    lower rank failed with the same message, so an error common to all is reported once, by rank
    0; the others end quietly (``Stopped``) with the first failure's exit status, or as
    interrupted (``SignalPending``) where a signal ended it. ``solo_work``: rank 0's work alone."""
    if not world.enabled:
        return work()
    error: BaseException | None = None
    result = None
    try:
        result = work()
    except (Exception, KeyboardInterrupt) as e:
        error = e
    outcomes: list[Outcome | None] = [None] * world.world_size
    # torchrun passes a signal to every rank: one waiting here, let out by it half-way through the
    # exchange, left the rank that was working (and interrupted) to report a lost peer instead.
    with held_signals():
        dist.all_gather_object(
            outcomes, None if error is None else _outcome(error), group=distributed.collective_group(solo_work)
        )
    failed = [(rank, o) for rank, o in enumerate(outcomes) if o is not None]
    if not failed:
        return result
    if error is not None and _outcome(error).message not in {o.message for r, o in failed if r < world.rank}:
        raise error
    first = failed[0][1]
    if first.signum is not None:
        raise SignalPending(first.signum)
    raise Stopped(first.exit_code)


# What gloo says when the other end of a collective is gone, or silent past the timeout (NCCL
# raises DistBackendError).
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "pair closure", "timed out")


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank went away or stopped answering."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(phrase in text for phrase in _PEER_GONE)


def peer_lost_message(world: World, error: BaseException) -> str:
    """What this rank says where ``error`` is a collective failing because a peer went away (``peer_lost``)."""
    what = "stopped answering (see its messages)" if "timed out" in str(error).lower() else "stopped (see its message)"
    return f"rank {world.rank}: another rank {what}"


@contextmanager
def reported_once(world: World) -> Iterator[None]:
    """Around a torchrun rank's whole command: what its failure prints. An error every rank raises
    alike (``SharedError``, an interruption, a bad config before the ranks could agree) is printed
    by rank 0 alone (one per machine before they agree); an error of this rank's own keeps its
    message, which names the rank; a collective that failed because a peer went away becomes one
    line instead of gloo's traceback (rank 0 raises its own ``PeerLost``, naming its checkpoint, where
    training had begun)."""
    if not world.enabled:
        yield
        return
    try:
        yield
    except (Stopped, PeerLost):  # the message names this rank already
        raise
    except SharedError as e:
        if not world.is_main:
            raise Stopped(e.exit_code, wait=not isinstance(e, Interrupted)) from None
        raise
    except NMTError as e:
        if not distributed.joined:  # every rank read the same config and found the same devices
            if world.local_rank > 0:
                raise Stopped(e.exit_code, fallback=f"rank {world.rank}: {e}") from None
            raise
        if not world.is_main:
            # Agreeing on every update's batches would cost a host synchronisation each: rank 0,
            # reading the same data, reports the damage if it found it too, and this rank otherwise.
            if isinstance(e, DamagedData):
                raise Stopped(e.exit_code, fallback=f"rank {world.rank}: {e}") from None
            error = NMTError(f"rank {world.rank}: {e}")
            error.exit_code = e.exit_code
            raise error from None
        raise
    except KeyboardInterrupt as e:  # every rank had the signal: rank 0 says so
        if not world.is_main:
            raise Stopped(128 + getattr(e, "signum", signal.SIGINT), wait=False) from None
        raise
    except Exception as e:
        if not peer_lost(e):
            raise
        raise PeerLost(peer_lost_message(world, e)) from None
