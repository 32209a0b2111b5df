"""Crash-safe file writes: a temporary file in the same directory, fsynced, then renamed.

A crash at any moment leaves either the old file or the new one, complete, never a mix.
No torch here: data-preparation workers import this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


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
