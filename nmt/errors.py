"""The exception types the CLI turns into a one-line message and a non-zero exit, the one line
that names any other error in a log, and the memory a failed piece of work's traceback still holds."""

import traceback


def error_line(error: BaseException) -> str:
    """``Type: first line of the message``: an unexpected error named in one line of a log."""
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"


class NMTError(Exception):
    """A user-facing error: the message names the file, line or key at fault."""

    exit_code = 2


class SharedError(NMTError):
    """An error every torchrun rank raises alike, from values they agree on (the update's statistics,
    the signal they stop for): rank 0 alone reports it."""


class DamagedData(NMTError):
    """Damage in the prepared data every torchrun rank reads (a shard cut short, a token id outside
    the vocabulary), found by each rank whose batches touch it: at the same update, at another, or
    never. Rank 0 reports it where it finds it too; another rank after the wait for that report."""


def drop_failed_work(error: BaseException) -> None:
    """Free what the work that raised ``error`` still holds: its traceback keeps each finished frame's
    locals, the batch's activations among them, so a checkpoint written after running out of memory
    ran out as well. The traceback still prints; only the values are gone. The errors it was raised
    while handling hold frames too."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
