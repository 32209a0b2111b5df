"""Argument types the scripts share: counts and durations of at least one, or more than zero.

A plain ``type=int`` took ``--updates 0`` or ``--parallel -1`` and ended in a division by zero,
a statistics error or a loop that never ends; these refuse such a value as argparse refuses any
other (one line, exit 2). Plain Python, no torch: peer_speed.py imports it without loading torch.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a duration)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


positive_int = int_at_least(1)
