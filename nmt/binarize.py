"""Binarized training data: token ids in memory-mappable shards, encoded once by worker processes.

Layout of a data directory (``<run_dir>/data/train/``)::

    shard-00000.src.npy   source ids of every kept pair, concatenated (uint16 when the vocabulary fits)
    shard-00000.trg.npy   target ids, likewise
    shard-00000.off.npy   int64 [2, n + 1]: where each source / target sentence starts
    shard-00000.json      written last: the shard is complete
    index.json            written last of all: the whole preparation is complete

Every file is written under a temporary name and renamed, so a crash leaves complete files
and hidden temporaries only. Training opens a directory only through ``index.json`` (``nmt.shards``); an
interrupted preparation, rerun with the same fingerprint, keeps its complete shards and
encodes the rest. No torch in this module: workers import it.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.pool
import os
import pickle
import re
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

import numpy as np

from nmt import testhooks
from nmt.corpus import clean_pairs, filter_by_length
from nmt.corpus_spec import Chunk
from nmt.errors import NMTError
from nmt.files import atomic_write, atomic_write_bytes, is_temporary
from nmt.shards import ARRAYS, INDEX
from nmt.signals import end_with_parent
from nmt.tokenizer import Tokenizer


def id_dtype(vocab_size: int) -> np.dtype:
    """Smallest integer type for token ids: half the disk and page cache of int32 for vocabularies up to 64k."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.int32)


def _shard_name(index: int) -> str:
    return f"shard-{index:05d}"


@dataclass(frozen=True)
class ShardSpec:
    """Everything a worker needs to encode one chunk into a shard (small and picklable)."""

    directory: str
    src_model: str
    trg_model: str
    max_len: int
    max_len_ratio: float
    dtype: str
    fingerprint: str
    threads: int = 1


def _flat(seqs: Sequence[Sequence[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(chain.from_iterable(seqs), dtype=dtype, count=int(offsets[-1]))
    return flat, offsets


def _save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save``'s bytes, the data written by Python's file object: numpy's own write of a file
    (``ndarray.tofile``) reports a disk that took part of the data as "N requested and M written",
    without the errno that says why (a full disk), where Python's raises the system's error."""
    array = np.ascontiguousarray(array)

    def write(f) -> None:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
        f.write(memoryview(array).cast("B"))

    atomic_write(path, write)


def _drop_unencoded(
    src_ids: list[list[int]], trg_ids: list[list[int]], cleaning: dict[str, int]
) -> tuple[list[list[int]], list[list[int]], dict[str, int]]:
    """The pairs with subwords on both sides, and ``cleaning`` counting the others as empty: a side of
    zero-width or control characters only survives stripping, but the tokenizer's normalization
    removes all of it, and a pair with nothing on one side teaches the model to invent the other."""
    filled = [i for i, (s, t) in enumerate(zip(src_ids, trg_ids)) if s and t]
    if len(filled) == len(src_ids):
        return src_ids, trg_ids, cleaning
    dropped = len(src_ids) - len(filled)
    counts = {**cleaning, "empty": cleaning["empty"] + dropped, "kept": cleaning["kept"] - dropped}
    return [src_ids[i] for i in filled], [trg_ids[i] for i in filled], counts


def encode_shard(spec: ShardSpec, index: int, src_lines: list[str], trg_lines: list[str]) -> dict:
    """Clean, encode, length-filter and write one shard; returns its metadata (also written as JSON, last)."""
    testhooks.encoding_shard(index)
    src_lines, trg_lines, cleaning = clean_pairs(src_lines, trg_lines)
    src_tok = Tokenizer.load(spec.src_model, threads=spec.threads)
    trg_tok = src_tok if spec.trg_model == spec.src_model else Tokenizer.load(spec.trg_model, threads=spec.threads)
    src_ids, trg_ids = src_tok.encode(src_lines), trg_tok.encode(trg_lines)
    src_ids, trg_ids, cleaning = _drop_unencoded(src_ids, trg_ids, cleaning)
    keep, report = filter_by_length(
        [len(s) for s in src_ids], [len(t) for t in trg_ids], spec.max_len, spec.max_len_ratio
    )
    if len(keep) < len(src_ids):
        src_ids, trg_ids = [src_ids[i] for i in keep], [trg_ids[i] for i in keep]
    dtype = np.dtype(spec.dtype)
    src_flat, src_off = _flat(src_ids, dtype)
    trg_flat, trg_off = _flat(trg_ids, dtype)
    directory, name = Path(spec.directory), _shard_name(index)
    arrays = {"src": src_flat, "trg": trg_flat, "off": np.stack([src_off, trg_off])}
    for key, array in arrays.items():
        _save_npy(directory / f"{name}.{key}.npy", array)
    meta = {
        "fingerprint": spec.fingerprint,
        **cleaning,
        **report,
        "src_tokens": int(src_off[-1]),
        "trg_tokens": int(trg_off[-1]),
        "bytes": {key: (directory / f"{name}.{key}.npy").stat().st_size for key in arrays},
    }
    atomic_write_bytes(directory / f"{name}.json", json.dumps(meta).encode())
    return meta


def _complete_shard(directory: Path, index: int, fingerprint: str) -> dict | None:
    """Metadata of a shard finished by an earlier, interrupted preparation with the same fingerprint."""
    name = _shard_name(index)
    try:
        meta = json.loads((directory / f"{name}.json").read_text())
        sizes = {key: (directory / f"{name}.{key}.npy").stat().st_size for key in ARRAYS}
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("fingerprint") != fingerprint or meta.get("bytes") != sizes:
        return None  # another preparation's, or edited: encoded again
    return meta


# The names the shard writer gives its files, and their temporaries (``files.temporary_name``):
# all it ever deletes, since a data directory may hold other files (another run put there, say).
_WRITTEN = re.compile(r"index\.json|shard-(?P<index>\d{5,})\.(json|src\.npy|trg\.npy|off\.npy)")
_TEMPORARY = re.compile(rf"\.(?:{_WRITTEN.pattern})\.tmp\d+")


def _written_here(path: Path) -> bool:
    """Whether ``path`` has a name the shard writer gives its files or their temporaries."""
    return bool(_WRITTEN.fullmatch(path.name) or _TEMPORARY.fullmatch(path.name))


def remove_shards(directory: Path) -> None:
    """Delete the shard writer's files in ``directory``, by their names, and nothing else there."""
    with _writing(directory):
        for path in directory.iterdir():
            if _written_here(path):
                path.unlink(missing_ok=True)


def _clear(directory: Path, keep_fingerprint: str) -> dict[int, dict]:
    """Remove the writer's temporaries and its shards of another fingerprint; returns the complete
    shards' metadata by index."""
    kept: dict[int, dict] = {}
    for path in directory.iterdir():
        if _TEMPORARY.fullmatch(path.name):
            path.unlink(missing_ok=True)
    for meta_path in sorted(directory.glob("shard-*.json")):
        named = _WRITTEN.fullmatch(meta_path.name)
        if named is None:
            continue
        index = int(named["index"])
        meta = _complete_shard(directory, index, keep_fingerprint)
        if meta is not None:
            kept[index] = meta
            continue
        for key in ARRAYS:
            (directory / f"{meta_path.stem}.{key}.npy").unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
    return kept


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])}


@contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """Block SIGINT, SIGTERM and SIGHUP while the pool starts. Its workers inherit the mask, so no Ctrl-C
    reaches one before ``_worker_init``; its threads keep it, so the main thread takes the signal.
    One that comes meanwhile is delivered, to the main thread, once unblocked."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _worker_init(parent: int) -> None:
    """The parent alone takes an interruption and ends the pool. A worker dying of a signal sent to
    the terminal's process group would lose its task (the parent would wait for its result for
    ever) or die holding the pool's queue lock (``terminate`` would wait for that lock for ever).
    A worker ends with its parent (``parent``, that process's pid), which a kill -9 gives no time
    to end the pool: out of the group, it would encode on its own, for nobody. SIGKILL, since a
    worker has nothing to save (a shard is renamed into place whole) and runs with signals blocked."""
    end_with_parent(parent, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(os, "setpgid"):  # POSIX: out of the group, a group's SIGTERM misses it, terminate() does not
        os.setpgid(0, 0)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _result(result: multiprocessing.pool.AsyncResult, workers: Sequence = (), directory: Path = Path()) -> dict:
    """Wait in short steps: a signal taken by one of the pool's threads only sets a flag that the
    main thread looks at when it runs, and an endless wait would never look. A pool replaces a
    worker that died (the kernel's out-of-memory killer, a kill -9) but loses its task, whose
    result would never come: a dead worker ends the wait with an error."""
    while True:
        try:
            return result.get(timeout=0.2)
        except multiprocessing.TimeoutError:
            dead = next((w for w in workers if not w.is_alive()), None)
            if dead is not None:
                raise NMTError(
                    f"{directory}: a worker encoding the training data died ({_how_it_ended(dead.exitcode)}); "
                    "the complete shards are kept: run again, with a smaller data.workers if memory ran out"
                ) from None


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"killed by {name}" + (", perhaps for want of memory" if name == "SIGKILL" else "")
    return f"exit status {exitcode}"


class _Pool(multiprocessing.pool.Pool):
    """A pool whose ``terminate()`` ends while its task thread is still sending a chunk."""

    @staticmethod
    def _help_stuff_finish(inqueue, task_handler, size) -> None:
        """Read and drop what the task thread writes into the workers' pipe until that thread ends.
        The stdlib's version stops once the pipe is empty, kills the workers, then waits for the
        thread; a chunk is megabytes, more than a pipe holds, and a thread still pickling one as the
        pipe was emptied waits for ever to write it where no worker reads (a Ctrl-C that hung)."""
        inqueue._rlock.acquire()  # held from here on, as the stdlib's: no worker takes another task
        while task_handler.is_alive():
            if inqueue._reader.poll(0.05):
                inqueue._reader.recv_bytes()


def _shut_down(pool: multiprocessing.pool.Pool) -> None:
    try:
        pool.terminate()
    except (EOFError, OSError, pickle.UnpicklingError):  # a worker died while sending; the rest still end
        pass
    pool.join()


@contextmanager
def _writing(directory: Path) -> Iterator[None]:
    """An OSError inside becomes one line naming the file that could not be written, or
    ``directory`` for a hidden temporary."""
    try:
        yield
    except OSError as error:
        path = Path(error.filename) if error.filename else directory
        where = directory if is_temporary(path) else path
        raise NMTError(f"{where}: cannot write the encoded training data ({error.strerror or error})") from None


def _summary(metas: list[dict]) -> dict:
    keys = ("read", "empty", "too_long", "bad_ratio", "kept", "src_tokens", "trg_tokens")
    return {key: sum(m.get(key, 0) for m in metas) for key in keys}


def binarize(
    chunks: Iterable[Chunk],
    spec: ShardSpec,
    workers: int,
    log: Callable[[str], None],
    encode: Callable[..., dict] | None = None,
) -> dict:
    """Encode ``chunks`` (one shard each) into ``spec.directory`` and write ``index.json`` last.

    With several workers, chunks go to a process pool while the next ones are read; at most
    two chunks per worker are in flight, so memory stays bounded however long the corpus.
    """
    encode = encode or encode_shard
    start = time.perf_counter()
    directory = Path(spec.directory)
    with _writing(directory):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / INDEX).unlink(missing_ok=True)  # from here on the directory is not a finished corpus
        finished = _clear(directory, spec.fingerprint)
    if finished:
        log(f"train: resuming an interrupted preparation; {len(finished)} complete shards kept")
    metas: dict[int, dict] = {}
    pending: deque = deque()
    stream = iter(chunks)
    head = [c for c in (next(stream, None), next(stream, None)) if c is not None]
    parallel = workers > 1 and len(head) > 1  # one chunk: no pool to start, encode here on every core
    local_spec = replace(spec, threads=os.cpu_count() or 1)
    pool = None
    try:
        pool_workers: list = []
        if parallel:
            before = {c.pid for c in multiprocessing.active_children()}
            with _stop_signals_blocked():
                context = multiprocessing.get_context("spawn")
                pool = _Pool(workers, initializer=_worker_init, initargs=(os.getpid(),), context=context)
            pool_workers = [c for c in multiprocessing.active_children() if c.pid not in before]
        with _writing(directory):  # a shard's write, here or in a worker (the corpus's read errors are NMTErrors)
            for index, (src, trg) in enumerate(chain(head, stream)):
                if index in finished:
                    metas[index] = finished[index]
                elif pool is None:
                    metas[index] = encode(local_spec, index, src, trg)
                else:
                    pending.append((index, pool.apply_async(encode, (spec, index, src, trg))))
                    while len(pending) >= 2 * workers:
                        i, result = pending.popleft()
                        metas[i] = _result(result, pool_workers, directory)
            while pending:
                i, result = pending.popleft()
                metas[i] = _result(result, pool_workers, directory)
    finally:
        if pool is not None:
            _shut_down(pool)
    ordered = [metas[i] for i in sorted(metas)]
    index = {
        "format": "nmt-shards-1",
        "fingerprint": spec.fingerprint,
        "dtype": spec.dtype,
        "workers": workers if pool is not None else 1,
        "seconds": round(time.perf_counter() - start, 3),
        "shards": [_shard_name(i) for i in sorted(metas) if metas[i]["kept"] > 0],
        **_summary(ordered),
        # The shards an interrupted preparation had finished, not encoded in these seconds.
        "resumed": {"shards": len(finished), "read": sum(m.get("read", 0) for m in finished.values())},
    }
    with _writing(directory):
        atomic_write_bytes(directory / INDEX, json.dumps(index, indent=1).encode())
    return index
