"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class NMTError(Exception):
    """A user-facing error: the message names the file, line or key at fault."""

    exit_code = 2
