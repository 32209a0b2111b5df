"""The exception types the CLI turns into a one-line message and a non-zero exit."""


class NMTError(Exception):
    """A user-facing error: the message names the file, line or key at fault."""

    exit_code = 2


class SharedError(NMTError):
    """An error every torchrun rank raises alike, from values they agree on (the update's statistics,
    the signal they stop for): rank 0 alone reports it."""
