"""The run directory's lock (``train.lock``): the one process writing a run holds it, and a second
writer is told which command, host and pid holds it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from nmt.errors import NMTError


class RunLock:
    """An advisory lock on ``path`` (flock): held while the process lives, released by the kernel
    when it dies, however it dies, so a stale lock never blocks a resume. On a shared file system
    (NFS) Linux maps flock to the server's byte-range locks, so it excludes other machines too.
    The file names the holder (command, host and pid) for the error a second writer gets."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self, run_dir: Path, warn: Callable[[str], None], command: str = "train") -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX
            warn(f"{run_dir}: cannot lock the run directory on this system; do not train it twice at once")
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise NMTError(
                f"{self.path}: cannot open the run's lock file ({e.strerror}); "
                "this command writes into the run directory and needs write access to it"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, who = _holder_note(os.pread(fd, 512, 0))
            os.close(fd)
            doing = "training" if holder == "nmt train" else "writing"
            raise NMTError(
                f"{run_dir}: another '{holder}' is {doing} this run ({who}); "
                "wait for it to finish or stop it, or use another run_dir"
            ) from None
        except OSError as e:  # a file system without locks
            os.close(fd)
            warn(f"{run_dir}: cannot lock the run directory ({e.strerror}); do not train it twice at once")
            return
        self._fd = fd
        # The command on a line of its own: an earlier version's note is the second line alone.
        holder = f"nmt {command}\nhost {socket.gethostname()}, pid {os.getpid()}, since {time.strftime('%F %T')}\n"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
        except OSError:  # a full disk: the lock holds without the note (the command then says what it cannot write)
            pass

    def holder(self) -> str | None:
        """Who holds the lock now (as its file names them), or None where no process does; takes nothing."""
        try:
            import fcntl

            fd = os.open(self.path, os.O_RDONLY)
        except (ImportError, OSError):  # not POSIX, or never locked
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as the file closes
        except BlockingIOError:
            holder, who = _holder_note(os.pread(fd, 512, 0))
            return f"'{holder}', {who}"
        except OSError:  # a file system without locks
            return None
        finally:
            os.close(fd)
        return None

    def release(self) -> None:
        """Unlock; the file stays (removing it would let two processes lock different files)."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:  # a read-only remount: the holder's note stays, the lock goes
                pass
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def _holder_note(note: bytes) -> tuple[str, str]:
    """The command holding a run's lock and who runs it (host, pid, since), as its note in
    train.lock names them; a note without the command (an earlier version's) was a trainer's."""
    lines = note.decode("utf-8", "replace").strip().splitlines()
    if len(lines) >= 2 and lines[0].startswith("nmt "):
        return lines[0], lines[1]
    return "nmt train", (lines[0] if lines else "") or "another process"
