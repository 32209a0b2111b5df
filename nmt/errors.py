"""The exception types the CLI turns into a one-line message and a non-zero exit, and the one line
that names any other error in a log."""


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
