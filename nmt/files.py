"""Crash-safe file writes: a temporary file in the same directory, fsynced, then renamed.

A crash at any moment leaves either the old file or the new one, complete, never a mix. Outputs
are checked against the command's inputs before any work starts, so none can overwrite one.
No torch here: data-preparation workers import this module.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from nmt.errors import NMTError


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_name(path: Path) -> Path:
    """Hidden, per-process temporary name beside ``path``; ``is_temporary`` recognises it."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and ".tmp" in path.name


def atomic_write(
    path: Path,
    write: Callable[[object], None],
    before_rename: Callable[[Path], None] | None = None,
) -> None:
    """Call ``write(binary_file)`` on a temporary file, then rename it to ``path``.

    Raises OSError (after removing the temporary file) when the disk refuses the write.
    """
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes, before_rename: Callable[[Path], None] | None = None) -> None:
    atomic_write(path, lambda f: f.write(data), before_rename)


def check_output(path: Path, inputs: Iterable[Path], option: str) -> None:
    """Refuse, before any work starts, an output that cannot be written or that would destroy an
    input: the same file however it is reached (relative path, symlink, hard link)."""
    if path.is_dir():
        raise NMTError(f"{option} {path}: is a directory, expected a file name")
    if path.exists():
        for source in inputs:
            if source.exists() and os.path.samefile(path, source):
                raise NMTError(f"{option} {path}: is the input {source}; write the output to another file")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise NMTError(f"{option} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise NMTError(f"{option} {path}: the directory {parent} is not writable")


def check_output_dir(out_dir: Path, run_dirs: Iterable[Path], option: str = "--out") -> None:
    """Before any work: ``out_dir`` is made (if need be) and proven writable, and lies outside every
    run directory read, since commands that read a run never write into it."""
    if out_dir.exists() and not out_dir.is_dir():
        raise NMTError(f"{option} {out_dir}: exists and is not a directory")
    for run_dir in run_dirs:
        if out_dir.absolute() == run_dir.absolute() or run_dir.absolute() in out_dir.absolute().parents:
            raise NMTError(f"{option} {out_dir}: is inside the run directory {run_dir}; write elsewhere")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise NMTError(f"{option} {out_dir}: is not a writable directory ({e.strerror})") from None


class LineWriter:
    """Text lines written to a temporary file beside ``path``, which becomes ``path`` only when
    complete (``commit``): an earlier file of that name stays untouched until then. ``keep_partial``
    keeps what was written as ``PATH.partial`` instead (an interrupted command). The temporary
    file is made at the first write, so a command that fails before any output leaves nothing."""

    def __init__(self, path: Path):
        self.path = path
        self.lines = 0
        self._tmp = temporary_name(path)
        self._file = None

    def _opened(self):
        if self._file is None:
            self._file = open(self._tmp, "w", encoding="utf-8", newline="\n")
        return self._file

    def write(self, lines: Iterable[str]) -> None:
        f = self._opened()
        for line in lines:
            f.write(line + "\n")
            self.lines += 1
        f.flush()

    def commit(self) -> None:
        f = self._opened()
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(self._tmp, self.path)
        fsync_dir(self.path.parent)

    def keep_partial(self) -> Path:
        self._opened().close()
        partial = self.path.with_name(self.path.name + ".partial")
        os.replace(self._tmp, partial)
        return partial

    def discard(self) -> None:
        if self._file is not None:
            self._file.close()
        self._tmp.unlink(missing_ok=True)
