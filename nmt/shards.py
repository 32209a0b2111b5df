"""Reading a prepared training set: the shards ``nmt.binarize`` writes (their layout there), opened
through ``index.json`` only, read with positioned reads so that resident memory does not grow with
the corpus. No torch in this module.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nmt.errors import DamagedData, NMTError

INDEX = "index.json"
ARRAYS = ("src", "trg", "off")


def read_index(directory: Path) -> dict | None:
    """The preparation's ``index.json``; None where there is none that reads as one (an interrupted
    preparation, a file cut short or edited into something else)."""
    try:
        index = json.loads((directory / INDEX).read_text())
    except (OSError, ValueError):
        return None
    return index if isinstance(index, dict) else None


def _checked_index(directory: Path) -> dict:
    """``index.json`` with the shard names and pair count the reader relies on, else one line naming it."""
    index = read_index(directory)
    if index is None or index.get("format") != "nmt-shards-1":
        raise NMTError(f"{directory}: not a finished data preparation (no {INDEX}); run `nmt prepare` again")
    names = index.get("shards")
    named = isinstance(names, list) and all(isinstance(n, str) and _SHARD.fullmatch(n) for n in names)
    if not named or not _is_count(index.get("kept")):
        raise NMTError(f"{directory / INDEX}: not as the shard writer wrote it (edited?)")
    return index


_SHARD = re.compile(r"shard-\d{5,}")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shard_record(path: Path, fingerprint) -> dict:
    """A shard's ``.json``, checked for what the reader takes from it: the sizes of its files and its
    pair count, and that it was made by the preparation ``index.json`` records (its fingerprint).
    A missing, unreadable or hand-edited record is damage, as a truncated shard is."""
    try:
        meta = json.loads(path.read_text())
    except OSError as e:
        raise NMTError(f"{path}: unreadable shard record ({e.strerror})") from None
    except ValueError:
        raise NMTError(f"{path}: unreadable shard record (not JSON)") from None
    sizes = meta.get("bytes") if isinstance(meta, dict) else None
    if (
        not isinstance(sizes, dict)
        or not all(_is_count(sizes.get(k)) for k in ARRAYS)
        or not _is_count(meta.get("kept"))
    ):
        raise NMTError(f"{path}: shard record not as the shard writer wrote it (edited?)")
    if meta.get("fingerprint") != fingerprint:
        raise NMTError(f"{path}: shard made by another preparation than its {INDEX}")
    return meta


class _NpyReader:
    """Positioned reads (``pread``) from an ``.npy`` file's data.

    The same kernel page cache a memory map would use, but no page is mapped into the process:
    with ``np.load(mmap_mode="r")`` every page touched (and the fault-around pages next to it)
    counts in the trainer's resident memory, which then grows to the size of the shards.
    """

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            self.data_offset = f.tell()
        if fortran:
            raise ValueError("Fortran-ordered array")
        self.path, self.shape, self.dtype = path, shape, np.dtype(dtype)
        self.fd = os.open(path, os.O_RDONLY)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements ``start:stop`` of the flattened (C-order) array."""
        size = self.dtype.itemsize
        data = os.pread(self.fd, (stop - start) * size, self.data_offset + start * size)
        if len(data) != (stop - start) * size:
            raise DamagedData(f"{self.path}: shard is shorter than its header says (truncated?)")
        return np.frombuffer(data, dtype=self.dtype)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    __del__ = close


def _allow_open_files(n: int) -> None:
    """Three descriptors per shard stay open: raise the soft limit (up to the hard one) if needed."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < n + 256:
            target = n + 256 if hard == resource.RLIM_INFINITY else min(hard, n + 256)
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))
    except (ImportError, ValueError, OSError):
        pass


def _check_pair_count(offsets: _NpyReader, kept: int, record: Path) -> None:
    """The offsets hold [2, kept + 1] starts, as the shard's record counts its pairs."""
    if offsets.shape != (2, kept + 1):
        raise NMTError(
            f"{offsets.path}: shard offsets of shape {offsets.shape}, not (2, {kept + 1}) as {record} counts"
        )


class ShardedCorpus:
    """A prepared training set read straight from its shards: only the two length arrays live in RAM.

    ``pairs(rows)`` returns the ids of the requested pairs as small numpy arrays, read with
    positioned reads through the page cache, so resident memory does not grow with the corpus.
    """

    def __init__(self, directory: Path):
        index = _checked_index(directory)
        self.directory = directory
        _allow_open_files(3 * len(index["shards"]))
        self._files: list[dict[str, _NpyReader]] = []
        for name in index["shards"]:
            meta = _shard_record(directory / f"{name}.json", index.get("fingerprint"))
            files = {}
            for key in ARRAYS:
                path = directory / f"{name}.{key}.npy"
                try:
                    size = path.stat().st_size
                    if size != meta["bytes"][key]:
                        raise NMTError(f"{path}: shard has {size} bytes, expected {meta['bytes'][key]} (truncated?)")
                    files[key] = _NpyReader(path)
                except (OSError, ValueError) as e:
                    raise NMTError(f"{path}: unreadable shard ({e})") from None
            _check_pair_count(files["off"], meta["kept"], directory / f"{name}.json")
            self._files.append(files)
        counts = [files["off"].shape[1] - 1 for files in self._files]
        if sum(counts) != index["kept"]:  # a shard left out of the index, or its count edited
            raise NMTError(
                f"{directory / INDEX}: counts {index['kept']} pairs, its shards hold {sum(counts)} (edited?)"
            )
        self._starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self._starts[1:])
        self.src_lens = self._lengths(0)
        self.trg_lens = self._lengths(1)

    def _lengths(self, side: int) -> np.ndarray:
        parts = []
        for files in self._files:
            width = files["off"].shape[1]
            parts.append(np.diff(files["off"].read(side * width, (side + 1) * width)))
        lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return lengths.astype(np.uint16 if lengths.max(initial=0) < 2**16 else np.uint32)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def pairs(self, rows: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Source and target ids of the pairs at global indices ``rows``, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        shards = np.searchsorted(self._starts, rows, side="right") - 1
        src, trg = [], []
        for shard, local in zip(shards.tolist(), (rows - self._starts[shards]).tolist()):
            files = self._files[shard]
            off, width = files["off"], files["off"].shape[1]
            s0, s1 = off.read(local, local + 2).tolist()
            t0, t1 = off.read(width + local, width + local + 2).tolist()
            src.append(files["src"].read(s0, s1))
            trg.append(files["trg"].read(t0, t1))
        return src, trg

    def close(self) -> None:
        for files in self._files:
            for reader in files.values():
                reader.close()
        self._files = []
