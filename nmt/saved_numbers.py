"""Whether a value read back from a file (JSON and ``torch.save`` that nmt wrote, a YAML config) is
a number of the kind meant.

Python counts a bool as an int, and JSON, YAML and ``torch.save`` keep true and false as bools, so
a damaged or hand-edited file could pass ``isinstance(value, int)`` with ``true`` where an update
number belongs. NaN and infinity are numbers here: whoever reads the value decides whether they
mean anything. Plain Python, no torch: metrics.py, which plot and compare read, imports it.
"""

from __future__ import annotations


def is_whole_number(value: object) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
