"""The user's console (stderr): progress, warnings and errors.

A console that goes away (the reader of a pipe exits, as ``| head`` or a killed ``| tee`` do; a
terminal hangs up) does not stop the work, as it does not stop fairseq's or Joey NMT's: its
lines are dropped from then on, and a training run keeps them in its ``train.log``.
"""

from __future__ import annotations

import os
import sys


def say(message: str) -> None:
    """``message`` as a line on stderr, above any progress bar."""
    from tqdm import tqdm

    try:
        tqdm.write(message, file=sys.stderr)
    except OSError:  # EPIPE from a closed pipe, EIO from a hung-up terminal
        drop_output()


def drop_output() -> None:
    """Send whatever the process writes to stderr from now on to /dev/null: the console is gone."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # no real stderr (closed, or replaced by a test)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
