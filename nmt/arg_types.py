"""Argparse types for counts, numbers and paths, shared by the ``nmt`` command and scripts/.

A plain ``type=int`` or ``type=float`` took ``--updates 0``, ``--parallel -1`` or ``nan`` and
ended in a division by zero, a loop that never ends or a traceback; these refuse such a value as
argparse refuses any other (one line, exit 2). Plain Python, no torch: peer_speed.py imports it
without loading torch, and cli.py before limit_spinning has run.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable


def int_at_least(low: int, why: str = "") -> Callable[[str], int]:
    """An integer of at least ``low``; ``why``, where given, says in the error what the least is for."""
    expected = f"an integer >= {low}" + (f" ({why})" if why else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def finite_float(text: str) -> float:
    """A number; float() also reads 'nan', 'inf' and '1e999', which no option means."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A number above 0 (a duration)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def user_path(text: str) -> str:
    """A file or directory path, a leading ``~`` or ``~user`` expanded: the shell does that only where
    the path starts a word (``--model ~/runs/x``), not in ``--model=~/runs/x``."""
    return os.path.expanduser(text)
