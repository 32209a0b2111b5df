"""Output writing: what a rename may replace and what must be written in place (a FIFO, a device,
a pipe named /dev/fd/N, a file held open), a symlink's target replaced, and unwritable outputs refused."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from nmt.errors import NMTError
from nmt.files import LineWriter, atomic_write_bytes, check_output


def read_fifo_in_background(path: Path) -> tuple[threading.Thread, list[bytes]]:
    received: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as f:
            received.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, received


def test_a_fifo_is_written_into_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader, received = read_fifo_in_background(fifo)
    atomic_write_bytes(fifo, b"figure bytes\n")
    reader.join(timeout=30)
    assert received == [b"figure bytes\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]


def test_line_writer_writes_a_fifo_in_place(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_output(fifo, [], "--output")  # checking it must not open it: that would end its reader's input
    reader, received = read_fifo_in_background(fifo)
    writer = LineWriter(fifo)
    writer.write(["one", "two"])
    writer.commit()
    reader.join(timeout=30)
    assert received == [b"one\ntwo\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]


def test_a_pipe_named_dev_fd_is_written_in_place(tmp_path):
    read_end, write_end = os.pipe()
    try:
        name = Path(f"/dev/fd/{write_end}")
        check_output(name, [], "--output")
        writer = LineWriter(name)
        writer.write(["through the pipe"])
        writer.commit()
        assert os.read(read_end, 1000) == b"through the pipe\n"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_file_held_open_for_appending_keeps_what_it_had(tmp_path):
    log = tmp_path / "log"
    log.write_text("earlier\n")
    inode = log.stat().st_ino
    with open(log, "a") as held:  # as the shell's `>> log` holds it for /dev/stdout
        atomic_write_bytes(Path(f"/dev/fd/{held.fileno()}"), b"later\n")
    assert log.read_text() == "earlier\nlater\n" and log.stat().st_ino == inode


def test_a_symlink_keeps_pointing_at_its_replaced_target(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    atomic_write_bytes(link, b"new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    writer = LineWriter(link)
    writer.write(["newer"])
    assert target.read_text() == "new\n"  # untouched until complete
    writer.commit()
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_text() == "newer\n"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["out.txt"]


def test_an_output_under_a_file_says_the_file_is_no_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(NMTError, match=r"notes.txt/out: the directory .*notes.txt is a file, not a directory"):
        check_output(tmp_path / "notes.txt" / "out", [], "--output")
    with pytest.raises(NMTError, match=r"--output .*missing/out: the directory .*missing does not exist"):
        check_output(tmp_path / "missing" / "out", [], "--output")


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="needs Linux's /proc")
def test_an_output_no_file_can_be_written_beside_is_refused(tmp_path):
    with pytest.raises(NMTError, match=r"--output /proc/version: no file can be written in /proc"):
        check_output(Path("/proc/version"), [], "--output")


def test_a_refused_write_is_one_error_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import errno

    out = tmp_path / "out.txt"
    out.write_text("an older output\n")
    writer = LineWriter(out)
    writer.write(["one", "two"])

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(
        NMTError, match=r"out.txt: could not write the output \(No space left on device\); .* is unchanged"
    ):
        writer.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"] and out.read_text() == "an older output\n"
    writer.discard()  # the caller's clean-up after the error is harmless


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="Linux's always-full device")
def test_a_device_that_refuses_the_bytes_is_one_error(tmp_path):
    writer = LineWriter(Path("/dev/full"))
    with pytest.raises(NMTError, match=r"/dev/full: could not write the output \(No space left on device\)$"):
        writer.write(["a line"])


def test_a_partial_of_the_same_name_that_is_a_directory_is_left_alone(tmp_path):
    out = tmp_path / "out.txt"
    (tmp_path / "out.txt.partial").mkdir()
    writer = LineWriter(out)
    writer.write(["done"])
    writer.commit()
    assert out.read_text() == "done\n" and (tmp_path / "out.txt.partial").is_dir()


def test_an_input_deleted_as_the_output_is_checked_is_not_a_traceback(tmp_path, monkeypatch):
    # A running trainer deletes a checkpoint (keep_best) between the look and the comparison.
    out, gone = tmp_path / "out.txt", tmp_path / "best_00000010.pt"
    out.write_text("an older output\n")
    gone.write_bytes(b"model")

    def deleted_first(a, b):
        Path(b).unlink(missing_ok=True)
        raise FileNotFoundError(2, "No such file or directory", str(b))

    monkeypatch.setattr(os.path, "samefile", deleted_first)
    check_output(out, [gone], "-o")  # the output is no input: nothing to refuse
