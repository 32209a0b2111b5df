"""Plain values (parsed YAML) checked against typed dataclasses: the annotations say what each key
may hold, a table of range checks says more, and every error names the key (``train.lr_peak``),
with the closest known key for an unknown one. ``nmt.config`` describes the sections; this is
the machinery that holds a mapping against them.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import re
import types
import typing
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Literal

from nmt.errors import NMTError
from nmt.saved_numbers import is_number, is_whole_number

Check = tuple[Callable[[Any], bool], str]  # predicate, and what it requires ("must be > 0")

# Integers end up in C ints (SentencePiece's int32 fields, torch's thread count and sizes), where a
# larger one is an overflow traceback. No count or size of a real run comes near 2**31.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# PyYAML reads YAML 1.1, where 5e-4 (no dot) is a string. It is read as a number where a key takes
# one, and only there (an integer key where it is whole: 1e4): a string key keeps the text ("name: 1e3").
SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class Schema:
    """``ranges``: dotted key -> Check. ``special``: annotation -> converter(schema, value, key) for
    the annotations that need more than their type (a shorthand, a union chosen by a field).
    ``wide_ints``: the integer keys exempt from the 32-bit bound (their Check bounds them, if anything)."""

    def __init__(
        self,
        ranges: dict[str, Check],
        special: dict[Any, Callable[[Schema, Any, str], Any]],
        wide_ints: frozenset[str] = frozenset(),
    ):
        self.ranges, self.special, self.wide_ints = ranges, special, wide_ints

    def build(self, cls: type, values: dict, prefix: str) -> Any:
        """``cls(**values)`` with every value checked and converted; ``prefix`` names the section."""
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        known = list(fields)
        kwargs = {}
        for raw_key, value in values.items():
            key = f"{prefix}.{raw_key}" if prefix else str(raw_key)
            if raw_key not in known:
                close = difflib.get_close_matches(str(raw_key), known, n=1, cutoff=0.6)
                hint = f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""
                raise NMTError(f"unknown config key '{key}'{hint}")
            if value is None and _is_section(fields[raw_key]):
                value = {}  # its keys all commented out: YAML reads 'decode:' alone as null
            converted = self.convert(value, hints[raw_key], key)
            check = self.ranges.get(key)
            if check is not None and converted is not None and not check[0](converted):
                written = value if isinstance(value, str) else repr(value)  # a number in scientific notation
                raise NMTError(f"config key '{key}': {written} {check[1]}")
            if key not in self.wide_ints:
                _check_int32(converted, key)
            kwargs[raw_key] = converted
        return cls(**kwargs)

    def convert(self, value: Any, tp: Any, key: str) -> Any:
        """Check ``value`` against annotation ``tp``; return it converted (int -> float, list -> tuple)."""
        if tp in self.special:
            return self.special[tp](self, value, key)
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            return self._union(value, tp, key)
        if origin is Literal:
            if value not in typing.get_args(tp):
                raise NMTError(f"config key '{key}': {value!r} is not {type_name(tp)}")
            return value
        if origin is tuple:
            args = typing.get_args(tp)
            if not isinstance(value, (list, tuple)) or len(value) != len(args):
                raise NMTError(f"config key '{key}': expected {type_name(tp)}, got {value!r}")
            return tuple(self.convert(v, a, key) for v, a in zip(value, args))
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise NMTError(f"config key '{key}': expected a mapping, got {value!r}")
            return self.build(tp, value, key)
        return _scalar(value, tp, key)

    def _union(self, value: Any, tp: Any, key: str) -> Any:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return self.convert(value, inner[0], key)
        for alternative in inner:  # the first alternative that accepts the value
            try:
                return self.convert(value, alternative, key)
            except NMTError:
                pass
        raise NMTError(f"config key '{key}': expected {type_name(tp)}, got {value!r}")


def _is_section(f: dataclasses.Field) -> bool:
    """Whether a field holds a mapping of keys of its own whose defaults it starts from (``decode``,
    ``data.train``): not one whose default is none (``data.test``), where null says 'none'."""
    return dataclasses.is_dataclass(f.default_factory)


def _scalar(value: Any, tp: Any, key: str) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise NMTError(f"config key '{key}': expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, str) and SCIENTIFIC.fullmatch(value.strip()):
            value = _whole_or_text(value)
        if not is_whole_number(value):
            raise NMTError(f"config key '{key}': expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and SCIENTIFIC.fullmatch(value.strip()):
            value = float(value)
        if not is_number(value):
            raise NMTError(f"config key '{key}': expected a number, got {value!r}")
        return _finite(value, key)
    if tp is str:
        if not isinstance(value, str):
            raise NMTError(f"config key '{key}': expected a string, got {value!r}{quoting_hint(value)}")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")


def _whole_or_text(text: str) -> int | str:
    """The integer a number in scientific notation names (``1e4``: 10000), or the text where it is
    not whole (``5e-4``). Read exactly, as a decimal: a float would round ``1.0000000001e10``."""
    number = Decimal(text.strip())
    if number.adjusted() > 100:  # far beyond every bound; int() of 1e999999 would take seconds
        return text
    return int(number) if number == number.to_integral_value() else text


def quoting_hint(value: Any) -> str:
    """What a string key's error adds where YAML 1.1 read unquoted text as another type: the value
    shown is not what was written (src_lang: no, Norwegian, reads as false)."""
    if isinstance(value, bool):
        return " (YAML reads unquoted yes, no, on, off as true or false: quote the text, e.g. 'no')"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return " (YAML reads an unquoted date as a date: quote the text)"
    return ""


def _check_int32(value: Any, key: str) -> None:
    if not is_whole_number(value):
        return
    if value > INT32_MAX:
        raise NMTError(f"config key '{key}': {value!r} must be at most {INT32_MAX}")
    if value < INT32_MIN:
        raise NMTError(f"config key '{key}': {value!r} must be at least {INT32_MIN}")


def _finite(value: int | float, key: str) -> float:
    """``value`` as a float. Infinity passes range checks such as "> 0" and NaN would fail them
    only by accident, so both are refused here, for every float key."""
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the float range
        raise NMTError(f"config key '{key}': the integer is too large, not a finite number") from None
    if not math.isfinite(number):
        raise NMTError(f"config key '{key}': {number!r} is not a finite number")
    return number


def type_name(tp: Any) -> str:
    """How an error message names what an annotation accepts."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(names) + " or null"
    if origin is tuple:
        return "a list of " + str(len(typing.get_args(tp))) + " numbers"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))
