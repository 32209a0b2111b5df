"""Stopping on SIGINT/SIGTERM/SIGHUP without losing work: the first signal lets the update finish
(or gives up a validation between two of its batches) and a checkpoint be written; a second SIGINT
exits at once (safe: every checkpoint write is atomic). SIGHUP (the terminal or ssh session went
away) stops a command as SIGTERM does, unless it was started ignoring it (``nohup``)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from nmt.errors import SharedError


class Interrupted(SharedError):
    """Training stopped by a signal after writing a checkpoint; exits 128 + the signal number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class SignalPending(KeyboardInterrupt):
    """A signal held by a ``SignalGuard``, raised by long work that checks for one between its steps."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class SignalGuard:
    """While active, SIGINT and SIGTERM are recorded in ``received`` instead of stopping the process."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame):
        if self.received is not None and signum == signal.SIGINT:
            os._exit(130)
        self.received = signum

    def check(self) -> None:
        """Raise ``SignalPending`` if a signal has come: where long work can stop between two steps."""
        if self.received is not None:
            raise SignalPending(self.received)

    def __enter__(self) -> SignalGuard:
        for s in (signal.SIGINT, *terminating_signals()):
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)


def terminating_signals() -> list[int]:
    """SIGTERM, and SIGHUP unless this process ignores it (started by ``nohup``, which means to keep
    running when the terminal goes away; its default would kill the process with no checkpoint)."""
    hangup = getattr(signal, "SIGHUP", None)  # POSIX only
    ignored = hangup is None or signal.getsignal(hangup) is signal.SIG_IGN
    return [signal.SIGTERM] if ignored else [signal.SIGTERM, hangup]


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP), raised where the work is as Ctrl-C raises KeyboardInterrupt: the same
    clean-up runs."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


@contextmanager
def handlers_set(signums: Iterable[int], handler) -> Iterator[None]:
    """While active, ``handler`` handles each of ``signums``; the previous handlers come back after.
    Outside the main thread, which cannot set handlers, nothing changes."""
    previous = {}
    try:
        for s in signums:
            previous[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While active, SIGTERM (and SIGHUP: ``terminating_signals``) raises ``Terminated`` instead of
    killing the process at once, so a command stopped by ``kill``, a job scheduler or a lost ssh
    session keeps what it finished, as after Ctrl-C. (Outside the main thread Python delivers
    signals to the main thread anyway.)"""
    with handlers_set(terminating_signals(), _raise_terminated):
        yield


@contextmanager
def held_signals() -> Iterator[None]:
    """While active, SIGINT and the terminating signals are only noted; once the block has ended well,
    each goes to the handler that was in place (raising, say, ``Terminated``). A block that raises
    ends with its own error, which the process ends on anyway."""
    received: list[int] = []
    with handlers_set((signal.SIGINT, *terminating_signals()), lambda signum, frame: received.append(signum)):
        yield
    for signum in received:
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signum)


# prctl's request for a signal when the parent dies (linux/prctl.h)
_PR_SET_PDEATHSIG = 1
# A variable torchrun sets in every rank it starts; a rank started by hand (RANK, WORLD_SIZE) lacks it.
TORCHRUN_VARIABLE = "TORCHELASTIC_RUN_ID"


def _ask_for_signal_at_parent_death(signum: int) -> bool:
    """Ask the kernel for ``signum`` when this process's parent dies (Linux only); whether it took it."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl in this libc
        return False


def end_with_parent(parent: int, signum: int) -> None:
    """``signum`` to this process when its parent, ``parent`` as the parent itself knew its pid, dies
    (Linux only). The kernel's request does not fire for a parent gone before it was made, and this
    process is then some other's child already: ``signum`` is sent at once."""
    if _ask_for_signal_at_parent_death(signum) and os.getppid() != parent:
        os.kill(os.getpid(), signum)


def end_with_torchrun() -> None:
    """Under torchrun: SIGTERM when torchrun dies, so a ``kill -9`` of torchrun (or its own crash)
    does not leave the ranks training on their own, holding the run's lock: they go the way of a
    SIGTERM (the training state written, then exit); at once where the parent changed since this
    process first looked. Without torchrun nothing changes: a plain ``nmt train``'s parent is the
    user's shell."""
    if not os.environ.get(TORCHRUN_VARIABLE):
        return
    end_with_parent(os.getppid(), signal.SIGTERM)
