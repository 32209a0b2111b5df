"""Crash-safe file writes: a temporary file in the same directory, fsynced, then renamed.

A crash at any moment leaves either the old file or the new one, complete, never a mix. A symlink
to a file has its target replaced (the link stays); a FIFO, a device (/dev/null) or a pipe named
as /dev/fd/N is written in place, since a rename would put a plain file where it was. Outputs
are checked against the command's inputs before any work starts, so none can overwrite one.
No torch here: data-preparation workers import this module.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from nmt.errors import NMTError

# What the storage refuses (a full disk or quota, a file-size limit, a read-only mount, a failing
# disk), as against a bug: the CLI says these in one line, naming the file.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


def storage_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in STORAGE_ERRNOS


def naming(error: OSError, path: Path, *hidden: Path) -> OSError:
    """``error`` naming ``path``: a failed write or flush names no file, and a failed temporary file
    (one of ``hidden``) is not the name the user knows."""
    # One without errno (numpy's short write) keeps its own words: a file name would replace them.
    if error.errno is not None and (error.filename is None or error.filename in {str(h) for h in hidden}):
        error.filename = str(path)
    return error


STDOUT = "<stdout>"  # standard output's name in errors, as "<stdin>" is standard input's


def check_stdout(why: str) -> None:
    """Refuse, before any work, a standard output that is closed (``>&-``): ``print`` drops its
    text there without an error, so a command whose result goes there ended 0 and showed nothing."""
    if sys.stdout is None:
        raise NMTError(f"standard output is closed: {why}")


def write_stdout(text: str) -> None:
    """``text`` on standard output, flushed; a write refused there (``> FILE`` on a full disk)
    names ``<stdout>``, since Python's error names no file."""
    check_stdout("nowhere to write")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        raise naming(e, Path(STDOUT)) from None


def write_error_message(error: OSError) -> str:
    """'FILE: could not write (No space left on device)'."""
    return f"{error.filename or 'a file'}: could not write ({error.strerror or error})"


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


def written_in_place(path: Path) -> bool:
    """Whether ``path`` is opened and written as it is instead of replaced by a rename: an existing
    file that is not a regular one (a FIFO, a device, a process substitution's pipe), or a file some
    process holds open, named through /dev/stdout or /dev/fd/N (``>> log`` must keep the log)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return False  # no file to write: the rename fails, naming it
    return not stat.S_ISREG(mode) or _names_an_open_file(path)


def _names_an_open_file(path: Path) -> bool:
    """Whether a link on the way from ``path`` to its file is a /proc/PID/fd/N entry."""
    name = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        if re.fullmatch(r"/proc/\d+(/task/\d+)?/fd", os.path.realpath(os.path.dirname(name))):
            return True
        if not os.path.islink(name):
            return False
        name = os.path.join(os.path.dirname(name), os.readlink(name))
    return False


def replaced_file(path: Path) -> Path:
    """The file a rename replaces: a symlink's target, so that the link stays a link."""
    return Path(os.path.realpath(path))


def open_in_place(path: Path, mode: str = "ab", **kw):
    """Append-mode open of a ``written_in_place`` output: a pipe or device takes the bytes as they
    come, and a file held open (``>> log``) keeps what it had."""
    return open(path, mode, **kw)


def atomic_write(
    path: Path,
    write: Callable[[object], None],
    before_rename: Callable[[Path], None] | None = None,
) -> None:
    """Call ``write(binary_file)`` on a temporary file, then rename it to ``path`` (to its target,
    for a symlink); a ``written_in_place`` path gets the bytes directly.

    Raises OSError naming ``path`` (after removing the temporary file) when the disk refuses the
    write; ``path`` is then as it was.
    """
    if written_in_place(path):
        try:
            with open_in_place(path) as f:
                write(f)
        except OSError as e:
            raise naming(e, path) from None
        return
    target = replaced_file(path)
    tmp = temporary_name(target)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename(tmp)
        os.replace(tmp, target)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            naming(e, path, tmp)
        raise
    fsync_dir(target.parent)


def atomic_write_bytes(path: Path, data: bytes, before_rename: Callable[[Path], None] | None = None) -> None:
    atomic_write(path, lambda f: f.write(data), before_rename)


def check_output(path: Path, inputs: Iterable[Path], option: str) -> None:
    """Refuse, before any work starts, an output that cannot be written or that would destroy an
    input: the same file however it is reached (relative path, symlink, hard link)."""
    if path.is_dir():
        raise NMTError(f"{option} {path}: is a directory, expected a file name")
    if path.exists():
        for source in inputs:
            if _same_file(path, source):
                raise NMTError(f"{option} {path}: is the input {source}; write the output to another file")
    if written_in_place(path):
        reason = _in_place_write_error(path)
        if reason:
            raise NMTError(f"{option} {path}: cannot be written ({reason})")
        return
    parent = replaced_file(path).parent
    if not parent.is_dir():  # "does not exist" of a file there (out.txt/x) sent the user looking for nothing
        problem = "is a file, not a directory" if parent.exists() else "does not exist"
        raise NMTError(f"{option} {path}: the directory {parent} {problem}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise NMTError(f"{option} {path}: the directory {parent} is not writable")
    try:  # the temporary file must be possible there (not so in /proc, say, or on a read-only mount)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise NMTError(f"{option} {path}: no file can be written in {parent} ({e.strerror})") from None


def _in_place_write_error(path: Path) -> str | None:
    """Why ``path`` cannot be opened for writing, or None. A FIFO is only asked, not opened: opening
    and closing it would end its reader's input."""
    if stat.S_ISFIFO(os.stat(path).st_mode):
        return None if os.access(path, os.W_OK) else "permission denied"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    except OSError as e:
        return e.strerror
    os.close(fd)
    return None


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file; not where either is gone (a checkpoint a running trainer
    deleted between the look and the comparison is no output's input)."""
    try:
        return os.path.samefile(a, b)
    except FileNotFoundError:
        return False


# The names of files, not of a directory to write into: images, documents, data.
FILE_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg", ".pdf", ".md", ".json", ".txt")


def check_output_dir(out_dir: Path, run_dirs: Iterable[Path], option: str = "--out") -> None:
    """Before any work: ``out_dir`` is made (if need be) and proven writable, and lies outside every
    run directory read, since commands that read a run never write into it."""
    if out_dir.exists() and not out_dir.is_dir():
        raise NMTError(f"{option} {out_dir}: exists and is not a directory")
    # `--out curves.png` meant one file, and would get a new directory of that name holding the PNGs
    if not out_dir.exists() and out_dir.suffix.lower() in FILE_SUFFIXES:
        raise NMTError(
            f"{option} {out_dir}: names a {out_dir.suffix} file, but is the directory the files are written "
            "into (made if missing): give a directory"
        )
    check_outside_runs(out_dir, run_dirs, option)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise NMTError(f"{option} {out_dir}: is not a writable directory ({e.strerror})") from None


def check_outside_runs(out_dir: Path, run_dirs: Iterable[Path], option: str) -> None:
    """Refuse an output directory that is, or lies inside, a run directory read (however named)."""
    real = Path(os.path.realpath(out_dir))
    for run_dir in run_dirs:
        run_real = Path(os.path.realpath(run_dir))
        if real == run_real or run_real in real.parents:
            raise NMTError(f"{option} {out_dir}: is inside the run directory {run_dir}; write elsewhere")


def check_distinct_runs(run_dirs: list[Path]) -> None:
    """Refuse a run directory named twice, however spelled (``runs/a``, ``./runs/a``, ``runs/b/../a``,
    a link to it): its row or curves would be there twice. The directories exist (checked first)."""
    for i, run_dir in enumerate(run_dirs):
        first = next((earlier for earlier in run_dirs[:i] if _same_file(earlier, run_dir)), None)
        if first is not None:
            same = "" if str(first) == str(run_dir) else f" (the same directory as {first})"
            raise NMTError(f"{run_dir}: the run is named twice{same}; give each run once")


class LineWriter:
    """Text lines written to a temporary file beside ``path`` (beside its target, for a symlink),
    which becomes that file only when complete (``commit``): an earlier file of that name stays
    untouched until then, and a ``PATH.partial`` left by an earlier run goes. ``keep_partial`` keeps
    what was written as ``PATH.partial`` instead (an interrupted command). The temporary file is
    made at the first write, so a command that fails before any output leaves nothing. A
    ``written_in_place`` path (a FIFO, /dev/null) takes the lines directly, and an interruption
    leaves nothing more to keep."""

    def __init__(self, path: Path):
        self.path = path
        self.lines = 0
        self.in_place = written_in_place(path)
        self._target = path if self.in_place else replaced_file(path)
        self._tmp = path if self.in_place else temporary_name(self._target)
        self.partial = self._target.with_name(self._target.name + ".partial")
        self._file = None

    def _opened(self):
        if self._file is None:
            if self.in_place:
                self._file = open_in_place(self.path, "a", encoding="utf-8", newline="\n")
            else:
                self._file = open(self._tmp, "w", encoding="utf-8", newline="\n")
        return self._file

    def write(self, lines: Iterable[str]) -> None:
        try:
            f = self._opened()
            for line in lines:
                f.write(line + "\n")
                self.lines += 1
            f.flush()
        except OSError as e:
            raise self._failed(e) from None

    def commit(self) -> None:
        try:
            f = self._opened()
            f.flush()
            if self.in_place:
                f.close()
                return
            os.fsync(f.fileno())
            f.close()
            os.replace(self._tmp, self._target)
        except OSError as e:
            raise self._failed(e) from None
        if self.partial.is_file() or self.partial.is_symlink():  # what an earlier, interrupted run kept is stale
            self.partial.unlink()
        fsync_dir(self._target.parent)

    def _failed(self, error: OSError) -> NMTError:
        """The one-line error of a write the system refused (a full disk): the temporary file goes at
        once, to give its space back, and there is nothing left to keep."""
        self.discard()
        self.lines = 0
        unchanged = "" if self.in_place else f"; {self.path} is unchanged"
        return NMTError(f"{self.path}: could not write the output ({error.strerror or error}){unchanged}")

    def keep_partial(self) -> Path | None:
        """``PATH.partial`` holding the lines written so far (None when written in place)."""
        self._opened().close()
        if self.in_place:
            return None
        os.replace(self._tmp, self.partial)
        return self.partial

    def discard(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:  # its last buffered lines could not be written either: they go with it
                pass
        if not self.in_place:
            self._tmp.unlink(missing_ok=True)
