"""Standard input read in windows: one line per input line, whatever the pauses and however the
input ends. A real pipe stands for stdin; a pause is a window taken before the next chunk is written."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from nmt.errors import NMTError
from nmt.streams import input_windows, open_output


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


def windows_until_error(windows) -> tuple[list[list[str]], str]:
    """The windows handed on before reading stopped, and the error it stopped with."""
    received = []
    with pytest.raises(NMTError) as stopped:
        for window in windows:
            received.append(window)
    return received, str(stopped.value)


@pytest.mark.parametrize("source", ["pipe", "unreadable fd", "file"])
def test_every_line_before_a_bad_one_is_handed_on_before_the_error(monkeypatch, tmp_path, source):
    """Read as one chunk (stdin) or one block (a file), the lines before a line that is not UTF-8
    are still translated, so an output's .partial holds all of them."""
    data = b"a\nb\n\nc\n\xff x\nd\n"
    if source == "file":
        path = tmp_path / "in.txt"
        path.write_bytes(data)
        name = str(path)
    elif source == "pipe":
        read_end, write_end = os.pipe()
        os.write(write_end, data)
        os.close(write_end)
        monkeypatch.setattr(sys, "stdin", os.fdopen(read_end, "rb"))
        path, name = None, "<stdin>"
    else:  # no file descriptor (embedding): read whole
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        path, name = None, "<stdin>"
    windows, error = windows_until_error(input_windows(path, 3))
    assert windows == [["a", "b", ""], ["c"]]
    assert error == f"{name}:5: not valid UTF-8"


@pytest.mark.parametrize("name", ["missing/", "missing/.", "missing//"])
def test_an_output_named_as_a_directory_is_refused_not_written_as_a_file(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NMTError, match="names a directory, expected a file name"):
        open_output(name, [], "--output")
    assert list(tmp_path.iterdir()) == []
    assert open_output("missing.txt", [], "--output").path == Path("missing.txt")  # a file name is one
