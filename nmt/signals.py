"""Stopping on SIGINT/SIGTERM without losing work: the first signal lets the update finish (or
gives up a validation between two of its batches) and a checkpoint be written; a second SIGINT
exits at once (safe: every checkpoint write is atomic)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
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
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the work is as Ctrl-C raises KeyboardInterrupt: the same clean-up runs."""

    signum = signal.SIGTERM


def _raise_terminated(signum, frame):
    raise Terminated()


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While active, SIGTERM raises ``Terminated`` instead of killing the process at once, so a
    command stopped by ``kill`` or a job scheduler keeps what it finished, as after Ctrl-C."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread, where Python delivers signals anyway
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
