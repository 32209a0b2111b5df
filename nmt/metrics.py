"""``metrics.jsonl``, the one record of a run's progress: writing it, reading it back (also while the
run is still writing it), and the scalars that plots and TensorBoard draw from it.

Training writes one ``"type": "train"`` record per update (update, epoch, loss, nll, lr, grad_norm,
trg_tokens, src_tokens, elapsed), one ``"type": "valid"`` record per validation (update, epoch,
dev_loss, dev_ppl, dev_bleu, best_bleu, elapsed, seconds) and, with ``train.average_last``, one
``"type": "average"`` record per average it makes (update, dev_bleu, best_bleu, updates: those
averaged). ``elapsed`` is wall time in seconds since the run began, summed over its sessions,
without start-up; a validation's time is in the gap between the train record of its update and the
next one.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from nmt.errors import NMTError
from nmt.files import naming
from nmt.saved_numbers import is_number

METRICS_FILE = "metrics.jsonl"
RATE_WINDOW = 20  # updates over which target tokens/s is averaged


class MetricsLog:
    """One JSON object per line; flushed so a killed run keeps what it logged."""

    def __init__(self, path: Path):
        self.path = path
        try:
            end_torn_tail(path)
            self.file = open(path, "a", encoding="utf-8")
        except OSError as e:
            raise NMTError(f"{path}: cannot write the run's metrics ({e.strerror or e})") from None

    def write(self, record: dict) -> None:
        """Raises OSError naming the file where the disk refuses the line; a line written in part
        is cut when the file is next opened (``end_torn_tail``)."""
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as e:
            self.close()
            raise naming(e, self.path) from None

    def close(self) -> None:
        try:
            self.file.close()
        except OSError:  # what the disk refused stays out: the resumed run writes those updates again
            pass


def end_torn_tail(path: Path, block: int = 1 << 16) -> None:
    """Before appending: a last line without its newline (a crash, a full disk) gets its newline
    where it is a whole record and is cut where it was written in part, so that the next record
    starts on a line of its own instead of being glued to the fragment."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        line_start = 0
        for end in range(size, 0, -block):
            start = max(0, end - block)
            f.seek(start)
            newline = f.read(end - start).rfind(b"\n")
            if newline >= 0:
                line_start = start + newline + 1
                break
        if line_start == size:
            return
        f.seek(line_start)
        try:  # a whole record as the reader takes one
            _parse_line(f.read(), path, 0)
        except NMTError:
            f.truncate(line_start)
        else:
            f.write(b"\n")


@dataclass(frozen=True)
class Scalar:
    """One quantity drawn from the records of one type."""

    name: str  # TensorBoard tag; the figure's file name with '/' as '_'
    kind: str  # the record type it comes from: "train" or "valid"
    key: str  # the record's key, or one ScalarStream derives
    title: str
    label: str  # axis label, with the unit
    smooth: bool = False  # noisy per update: plots add a moving average
    derived: bool = False
    from_zero: bool = False  # plots start the axis at 0, so that runs' ratios read right


SCALARS: tuple[Scalar, ...] = (
    Scalar("train/loss", "train", "loss", "Training loss", "training loss (nats/token, label-smoothed)", smooth=True),
    Scalar("train/nll", "train", "nll", "Training NLL", "training NLL (nats/token, no label smoothing)", smooth=True),
    Scalar("valid/loss", "valid", "dev_loss", "Dev loss", "dev loss (nats/token, no label smoothing)"),
    Scalar("valid/ppl", "valid", "dev_ppl", "Dev perplexity", "dev perplexity (exp of dev loss)"),
    Scalar(
        "valid/bleu",
        "valid",
        "dev_bleu",
        "Dev BLEU (greedy decoding unless train.validate_beam_size > 1)",
        "dev BLEU (sacreBLEU, 0-100)",
    ),
    Scalar("train/lr", "train", "lr", "Learning rate", "learning rate"),
    Scalar("train/grad_norm", "train", "grad_norm", "Gradient norm", "gradient L2 norm (before clipping)", smooth=True),
    Scalar(
        "train/trg_tokens_per_s",
        "train",
        "trg_tokens_per_s",
        f"Training speed (each point: the last {RATE_WINDOW} updates, validation time left out)",
        "target tokens/s",
        derived=True,
        from_zero=True,
    ),
)


class BadLine(NMTError):
    """A line of metrics.jsonl that is not a whole record: "PATH:NUMBER: REASON"."""

    def __init__(self, path: Path, number: int, reason: str):
        super().__init__(f"{path}:{number}: {reason}")
        self.number, self.reason = number, reason


@dataclass(frozen=True)
class LeftOut:
    """A line ``read_metrics`` left out, where asked to go on without it."""

    number: int
    reason: str
    cut_short: bool = False  # the last line, without its newline: a run stopped (or still writing) mid-line


def read_metrics(
    run_dir: Path, left_out: list[LeftOut] | None = None, averages: list[dict] | None = None
) -> tuple[list[dict], list[dict]]:
    """The train and the valid records of a run, in the order written; with ``averages``, its average
    records (those with a numeric update and dev_bleu) are put there.

    Safe on a run still training: a last line without its newline is being written and is left
    out. Records a resumed run went back over (it restarted from a checkpoint older than its last
    logged update) are dropped, so updates only increase. A line that is not a whole record (not
    JSON, or a field missing or not a number) is an error naming it, or, with ``left_out``, left
    out and listed there, as is a last line cut short.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise NMTError(f"{run_dir}: no {METRICS_FILE}: not a run directory made by 'nmt train'")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise NMTError(f"{path}: cannot read ({e.strerror})") from None
    return parse_metrics(data, path, left_out, averages)


def elapsed_at(update: int, records: list[dict]) -> float:
    """The wall time (seconds) of an average record, which has none: that of the last of ``records``
    at or before its update (the validation just before it), as the average is made once training ends."""
    return max((float(r["elapsed"]) for r in records if r["update"] <= update), default=0.0)


def validations_trained_on(path: Path) -> tuple[int, int]:
    """The validations of the run's history in ``path`` (as ``read_metrics`` takes it), and how many of
    them the run trained on from: each but the last, and that one too where a train record of a
    later update follows it. Training goes on from a validation only once its training state is
    written, so a run with any such has written one. Lenient, unlike ``read_metrics``: a line that is
    not a record is skipped. (0, 0) where there is no file."""
    try:
        data = path.read_bytes()
    except OSError:
        return 0, 0
    train: list[dict] = []
    valid: list[dict] = []
    for number, line in enumerate(data.split(b"\n"), 1):
        try:
            _add(_parse_line(line, path, number), train, valid, path, number)
        except NMTError:
            continue
    if not valid:
        return 0, 0
    trained_past_last = bool(train) and train[-1]["update"] > valid[-1]["update"]
    return len(valid), len(valid) - 1 + trained_past_last


def has_record(path: Path, record: dict) -> bool:
    """Whether ``path`` holds ``record`` on a line of its own (a file that cannot be read holds none;
    a line that is not a record is skipped)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    kind = json.dumps(record.get("type")).encode()
    for line in data.split(b"\n"):
        if kind in line:  # most lines are train records: parsed only where they could match
            try:
                if json.loads(line) == record:
                    return True
            except ValueError:
                continue
    return False


def parse_metrics(
    data: bytes, path: Path, left_out: list[LeftOut] | None = None, averages: list[dict] | None = None
) -> tuple[list[dict], list[dict]]:
    """See ``read_metrics``."""
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    train: list[dict] = []
    valid: list[dict] = []

    def take(line: bytes, number: int) -> None:
        try:
            _add(_whole_record(line, path, number), train, valid, path, number, averages)
        except BadLine as e:
            if left_out is None:
                raise
            left_out.append(LeftOut(e.number, e.reason))

    for number, line in enumerate(lines, 1):
        if line.strip():
            take(line, number)
    if torn.strip():
        number = len(lines) + 1
        try:  # complete but for its newline: keep it; cut short: it is still being written
            _parse_line(torn, path, number)
        except BadLine:
            if left_out is not None:
                left_out.append(LeftOut(number, "cut short", cut_short=True))
        else:
            take(torn, number)
    return train, valid


def _parse_line(line: bytes, path: Path, number: int) -> dict:
    try:
        record = json.loads(line.decode("utf-8"))
    except ValueError:  # includes UnicodeDecodeError
        raise BadLine(path, number, "not a JSON line (a corrupt metrics file)") from None
    if not isinstance(record, dict):
        raise BadLine(path, number, "not a JSON object (a corrupt metrics file)")
    return record


# The numbers every record of a type holds, as training writes them; what reads them back (the
# plots, compare's tokens/s) adds them up or draws them.
NUMBERS = {
    "train": ("update", "elapsed", "loss", "nll", "lr", "grad_norm", "trg_tokens"),
    "valid": ("update", "elapsed", "dev_loss", "dev_ppl", "dev_bleu"),
}


def _checked_fields(record: dict, path: Path, number: int) -> dict:
    """``record``, or BadLine where a train or valid record lacks one of its numbers."""
    kind = record.get("type")
    for key in NUMBERS.get(kind, ()):
        if not is_number(record.get(key)):
            raise BadLine(path, number, f"{kind} record without a numeric '{key}'")
    return record


def _whole_record(line: bytes, path: Path, number: int) -> dict:
    return _checked_fields(_parse_line(line, path, number), path, number)


def _add(
    record: dict, train: list[dict], valid: list[dict], path: Path, number: int, averages: list[dict] | None = None
) -> None:
    kind = record.get("type")
    if kind == "average" and averages is not None and all(is_number(record.get(k)) for k in ("update", "dev_bleu")):
        averages.append(record)
    if kind not in ("train", "valid"):
        return  # an average (above), or a record type of a later version
    for key in ("update", "elapsed"):
        if not is_number(record.get(key)):
            raise BadLine(path, number, f"{kind} record without a numeric '{key}'")
    # A resumed run restarts at its checkpoint: what was logged after it belongs to no run any more.
    # (A validation follows the train record of its own update, so that one stays.)
    update = record["update"]
    while train and (train[-1]["update"] > update or (kind == "train" and train[-1]["update"] == update)):
        train.pop()
    while valid and valid[-1]["update"] >= update:
        valid.pop()
    while averages and averages[-1]["update"] >= update:  # made at the end of a session gone back over
        averages.pop()
    (train if kind == "train" else valid).append(record)


class TokenRate:
    """Target tokens/s, record by record: tokens of the last ``window`` updates over their time.

    An update's time is the ``elapsed`` gap to the previous train record. A gap holding a
    validation is left out (its update has no rate), as is the first update seen and one that
    goes back (a new session).
    """

    def __init__(self, window: int = RATE_WINDOW):
        self._previous: dict | None = None
        self._validated = False
        self._gaps: deque[tuple[float, float]] = deque(maxlen=window)

    def add(self, record: dict) -> float | None:
        if record.get("type") == "valid":
            self._validated = True
            return None
        previous, self._previous = self._previous, record
        validated, self._validated = self._validated, False
        if previous is None or validated or record["update"] <= previous["update"]:
            return None
        seconds = record["elapsed"] - previous["elapsed"]
        if not seconds > 0:
            return None
        self._gaps.append((record.get("trg_tokens", 0), seconds))
        return sum(t for t, _ in self._gaps) / sum(s for _, s in self._gaps)


class ScalarStream:
    """Records in the order written -> the (scalar, value) pairs each one gives."""

    def __init__(self, window: int = RATE_WINDOW):
        self._rate = TokenRate(window)

    def add(self, record: dict) -> list[tuple[Scalar, float]]:
        derived = {"trg_tokens_per_s": self._rate.add(record)}
        values = []
        for scalar in SCALARS:
            if scalar.kind != record.get("type"):
                continue
            value = derived.get(scalar.key) if scalar.derived else record.get(scalar.key)
            if is_number(value):
                values.append((scalar, float(value)))
        return values


@dataclass
class Series:
    """One scalar of one run: x by update and by elapsed seconds, and y."""

    updates: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def in_written_order(train: list[dict], valid: list[dict]) -> list[dict]:
    """Merge read_metrics' lists back into file order: a validation follows its update's train record."""
    return sorted(train + valid, key=lambda r: (r["update"], r["type"] == "valid"))


def scalar_series(train: list[dict], valid: list[dict], window: int = RATE_WINDOW) -> dict[str, Series]:
    """Every scalar of a run, by name; a scalar the run has no value for is absent."""
    series: dict[str, Series] = {}
    stream = ScalarStream(window)
    for record in in_written_order(train, valid):
        for scalar, value in stream.add(record):
            s = series.setdefault(scalar.name, Series())
            s.updates.append(int(record["update"]))
            s.seconds.append(float(record["elapsed"]))
            s.values.append(value)
    return series


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` values, skipping non-finite ones (NaN where none is finite)."""
    out = []
    total, count = 0.0, 0
    for i, value in enumerate(values):
        if math.isfinite(value):
            total, count = total + value, count + 1
        if i >= window:
            old = values[i - window]
            if math.isfinite(old):
                total, count = total - old, count - 1
        out.append(total / count if count else math.nan)
    return out
