"""Standard input read in windows: one line per input line, whatever the pauses and however the
input ends. A real pipe stands for stdin; a pause is a window taken before the next chunk is written."""

from __future__ import annotations

import os
import sys

import pytest

from nmt.streams import input_windows


def windows_over_a_pipe(monkeypatch, chunks: list[bytes]) -> list[list[str]]:
    """The windows read from a pipe that receives ``chunks``, pausing after each but the last,
    which ends the input: a pause hands over what has arrived, so each chunk is one window."""
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as pipe:
        monkeypatch.setattr(sys, "stdin", pipe)
        windows = input_windows(None)
        received = []
        for chunk in chunks[:-1]:
            os.write(write_end, chunk)
            received.append(next(windows))  # returns once all that arrived is read: the pause
        os.write(write_end, chunks[-1])
        os.close(write_end)
        return received + list(windows)


@pytest.mark.parametrize(
    "chunks, expected",
    [
        ([b"a\n\n"], [["a", ""]]),  # a blank last line
        ([b"a\n\n\n", b"b\n"], [["a", "", ""], ["b"]]),  # a pause right after a blank line
        ([b"a\n", b"\nb\n\nc"], [["a"], ["", "b", "", "c"]]),  # one before it; a last line without newline
    ],
)
def test_stdin_gives_one_line_per_input_line_across_pauses(monkeypatch, chunks, expected):
    assert windows_over_a_pipe(monkeypatch, chunks) == expected
