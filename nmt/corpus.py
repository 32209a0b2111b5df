"""Reading and cleaning parallel text: plain file pairs, TSV files and Hugging Face datasets.

Every reader streams: ``iter_parallel`` yields aligned chunks of sentence pairs, so a corpus
of millions of pairs is never held in memory at once. Every failure caused by the user's data
becomes a one-line ``NMTError`` naming the file and line (or the dataset and column) at fault.
Hugging Face datasets are read by ``nmt/hf_corpus.py``; this module chooses the format and reads
text files.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from dataclasses import replace
from itertools import chain, islice
from pathlib import Path

import numpy as np

from nmt.corpus_spec import Chunk, CorpusConfig, absolute_path, lone_data_file, looks_like_path
from nmt.errors import NMTError
from nmt.hf_corpus import iter_hf

_BOM = b"\xef\xbb\xbf"
_BLOCK_BYTES = 1 << 22  # text is decoded 4 MiB at a time: one C-level decode per block, flat memory
MAC_SAMPLE_BYTES = 1 << 16  # a file's first bytes, whose line ends tell whether it is an old-Mac file
CHUNK_PAIRS = 50_000  # pairs per chunk when a caller does not choose


# --------------------------------------------------------------------------- text files


def _os_error(path: Path, error: BaseException) -> NMTError:
    if isinstance(error, FileNotFoundError):
        return NMTError(f"{path}: no such file")
    if isinstance(error, IsADirectoryError):
        return NMTError(f"{path}: is a directory, expected a text file")
    if isinstance(error, PermissionError):
        return NMTError(f"{path}: permission denied")
    if isinstance(error, (gzip.BadGzipFile, EOFError, zlib.error)):
        return NMTError(f"{path}: not a valid gzip file (corrupt or truncated)")
    return NMTError(f"{path}: cannot read ({getattr(error, 'strerror', None) or error})")


def _blocks(path: Path) -> Iterator[bytes]:
    """Raw bytes of a file (``.gz`` decompressed), block by block."""
    try:
        f = gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")
        with f:
            while block := f.read(_BLOCK_BYTES):
                yield block
    except (OSError, EOFError, zlib.error) as e:
        raise _os_error(path, e) from None


def decode_lines(name: str | Path, data: bytes, lines_before: int) -> tuple[list[str], NMTError | None]:
    """The lines of ``data`` (cut before its final newline, so a blank last line is kept) up to
    the first that is not valid UTF-8, and the error naming that one (None: every line is valid):
    a reader hands on the lines before a bad one, then reports it."""
    try:
        text = data.decode("utf-8")  # one decode per block; locate the bad line only on failure
        bad = None
    except UnicodeDecodeError as e:
        start = data.rfind(b"\n", 0, e.start) + 1  # where the bad line begins
        line_no = lines_before + data.count(b"\n", 0, start) + 1
        bad = NMTError(f"{name}:{line_no}: not valid UTF-8")
        if start == 0:
            return [], bad
        text = data[: start - 1].decode("utf-8")  # every byte before e.start decodes
    lines = text.split("\n")
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]  # CRLF endings
    return lines, bad


def _old_mac(start: bytes) -> bool:
    """Whether a file that starts with ``start`` ends its lines with CR alone (old Mac): more lone
    CRs than LFs (a CR at its end may start a CRLF)."""
    start = start[:-1] if start.endswith(b"\r") else start
    return start.count(b"\r") - start.count(b"\r\n") > start.count(b"\n")


def _lf_ended(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """A file's bytes with its lines ended by LF. Most files already are (or by CRLF), and a CR
    elsewhere in them is text, kept in its line. An old-Mac file, as its first ``MAC_SAMPLE_BYTES``
    tell, has every CR, LF and CRLF turned into one LF, as Python's universal newlines read it."""
    head: list[bytes] = []
    size = 0
    for block in blocks:
        head.append(block)
        size += len(block)
        if size >= MAC_SAMPLE_BYTES:
            break
    start = b"".join(head)
    if not _old_mac(start[:MAC_SAMPLE_BYTES]):
        yield start
        yield from blocks
        return
    held = b""
    for block in chain([start], blocks):
        data = held + block
        held = b"\r" if data.endswith(b"\r") else b""  # perhaps half of a CRLF split between blocks
        yield data[: len(data) - len(held)].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if held:
        yield b"\n"


def _without_bom(blocks: Iterator[bytes]) -> Iterator[bytes]:
    first = b""
    for block in blocks:
        first += block
        if len(first) >= len(_BOM):
            break
    yield first.removeprefix(_BOM)
    yield from blocks


def iter_lines(path: str | Path) -> Iterator[str]:
    """Lines of a UTF-8 text file (``.gz`` decompressed), without line terminators.

    Only ``\\n`` ends a line (``\\r\\n`` too), except in a file whose lines end in ``\\r`` alone
    (old Mac, see ``_lf_ended``): ``str.splitlines`` would also split on U+2028, U+0085 and a
    stray CR, and silently misalign parallel files. A line that is not valid UTF-8 is an error
    naming it, raised once the lines before it are read.
    """
    path = Path(path)
    pending, lines_before = b"", 0
    for block in _lf_ended(_without_bom(_blocks(path))):
        data = pending + block
        cut = data.rfind(b"\n")
        if cut < 0:
            pending = data
            continue
        pending = data[cut + 1 :]
        lines, bad = decode_lines(path, data[:cut], lines_before)
        lines_before += len(lines)
        yield from lines
        if bad is not None:
            raise bad
    if pending:  # a last line without a final newline
        lines, bad = decode_lines(path, pending, lines_before)
        yield from lines
        if bad is not None:
            raise bad


def read_lines(path: str | Path) -> list[str]:
    return list(iter_lines(path))


def _chunks(pairs: Iterator[tuple[str, str]], size: int) -> Iterator[Chunk]:
    while batch := list(islice(pairs, size)):
        src, trg = zip(*batch)
        yield list(src), list(trg)


# --------------------------------------------------------------------------- plain and TSV


def plain_paths(prefix: str, lang: str) -> list[Path]:
    """Candidate files for one side of a plain corpus: plain text or gzip, never both."""
    return [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]


def _existing_plain_file(prefix: str, lang: str) -> Path | None:
    found = [p for p in plain_paths(prefix, lang) if p.exists()]
    if len(found) > 1:  # both prefix.de and prefix.de.gz: which one is the data is not ours to guess
        raise NMTError(f"{found[0]} and {found[1]} both exist: which one is the corpus? Move the other away")
    return found[0] if found else None


def _plain_file(prefix: str, lang: str) -> Path:
    found = _existing_plain_file(prefix, lang)
    return found if found is not None else plain_paths(prefix, lang)[0]  # iter_lines names the missing one


def _misaligned(src_path: Path, n_src: int, trg_path: Path, n_trg: int) -> NMTError:
    return NMTError(f"{src_path} has {n_src} lines but {trg_path} has {n_trg}: parallel files must align line by line")


def _iter_plain(prefix: str, src_lang: str, trg_lang: str) -> Iterator[tuple[str, str]]:
    src_path, trg_path = _plain_file(prefix, src_lang), _plain_file(prefix, trg_lang)
    src_lines, trg_lines = iter_lines(src_path), iter_lines(trg_path)
    n = 0
    for s in src_lines:
        t = next(trg_lines, None)
        if t is None:
            raise _misaligned(src_path, n + 1 + sum(1 for _ in src_lines), trg_path, n)
        n += 1
        yield s, t
    extra = sum(1 for _ in trg_lines)
    if extra:
        raise _misaligned(src_path, n, trg_path, n + extra)


def _tsv_header(line: str, src_lang: str, trg_lang: str) -> bool | None:
    """Whether a TSV file's first ``line`` is a header naming the run's two languages: False for
    'SRC<TAB>TRG', True for 'TRG<TAB>SRC' (its columns swapped), None for any other line, which is
    data. A data-files directory's TSV is read by its header's column names, so the same header
    means the same on a ``.tsv`` corpus file; any other header (``source<TAB>target``) names no
    language, and a pair is what the file holds without one."""
    if line == f"{src_lang}\t{trg_lang}":
        return False
    if line == f"{trg_lang}\t{src_lang}":
        return True
    return None


def _iter_tsv(path: Path, src_lang: str, trg_lang: str) -> Iterator[tuple[str, str]]:
    swapped = False
    for line_no, line in enumerate(iter_lines(path), start=1):
        if line_no == 1 and (header := _tsv_header(line, src_lang, trg_lang)) is not None:
            swapped = header
            continue
        left, sep, right = line.partition("\t")
        if not sep or "\t" in right:
            n_tabs = line.count("\t")
            raise NMTError(f"{path}:{line_no}: expected 'source<TAB>target' (exactly one tab), found {n_tabs} tabs")
        yield (right, left) if swapped else (left, right)


def _is_tsv(path: str) -> bool:
    return path.endswith(".tsv") or path.endswith(".tsv.gz")


# --------------------------------------------------------------------------- format choice


def anchor_corpus(spec: CorpusConfig, base: Path, src_lang: str, trg_lang: str) -> CorpusConfig:
    """``spec`` with a relative local path made absolute against ``base`` (the directory of the
    config file that names it); a hub dataset name ('wmt14') is left as it is."""
    path = spec.path
    if not path or os.path.isabs(path):
        return spec
    if path.startswith("~"):
        return replace(spec, path=os.path.expanduser(path))
    local = base / path
    if spec.format == "hf":
        is_local = local.is_dir()
    elif spec.format == "auto":
        named_files = any(_existing_plain_file(str(local), lang) for lang in (src_lang, trg_lang))
        is_local = local.exists() or named_files or looks_like_path(path, base)
    else:
        is_local = True
    return replace(spec, path=absolute_path(base, path)) if is_local else spec


def local_corpus_gone(spec: CorpusConfig, src_lang: str, trg_lang: str) -> bool:
    """Whether ``spec`` names a local corpus by absolute path where nothing is: no file or directory
    of that name, nor either language's PREFIX.LANG. A hub dataset by name is never gone."""
    path = spec.path
    if not path or not os.path.isabs(path):
        return False
    named = [Path(path), *plain_paths(path, src_lang), *plain_paths(path, trg_lang)]
    return not any(p.exists() for p in named)


def resolve_format(spec: CorpusConfig, src_lang: str, trg_lang: str) -> str:
    """The concrete format ('plain', 'tsv', 'hf') of a corpus spec with ``format: auto``."""
    if spec.format != "auto":
        return spec.format
    path = spec.path
    if _is_tsv(path):
        return "tsv"
    if Path(path).is_dir():
        # PREFIX.SRC beside a directory PREFIX: which one is the corpus is not ours to guess.
        files = [str(f) for lang in (src_lang, trg_lang) if (f := _existing_plain_file(path, lang)) is not None]
        if files:
            raise NMTError(
                f"{path}: both plain files ({', '.join(files)}) and a directory of that name exist: "
                "set the corpus's format: plain (the files) or format: hf (the directory)"
            )
        return "hf"
    if _existing_plain_file(path, src_lang) is not None:
        return "plain"
    if Path(path).is_file():
        raise lone_data_file(path)
    if looks_like_path(path) or _existing_plain_file(path, trg_lang) is not None:
        raise NMTError(f"no such corpus: {path}.{src_lang} / {path}.{trg_lang}")
    return "hf"


def check_corpus_exists(spec: CorpusConfig, src_lang: str, trg_lang: str, key: str) -> None:
    """Refuse a local corpus whose files are missing, or that is no corpus of a format (a lone
    .parquet file, plain files beside a directory of their name), naming the config ``key`` that
    gave it: read later, the error named the files alone, and a config holds several corpora."""
    try:
        resolve_format(spec, src_lang, trg_lang)
    except NMTError as e:
        raise NMTError(f"config key '{key}': {e}") from None


def is_hub_dataset(spec: CorpusConfig, src_lang: str, trg_lang: str) -> bool:
    """Whether ``spec`` names a dataset on the Hugging Face Hub (not a local file or directory)."""
    return resolve_format(spec, src_lang, trg_lang) == "hf" and not Path(spec.path).is_dir()


def iter_parallel(spec: CorpusConfig, src_lang: str, trg_lang: str, chunk_pairs: int = CHUNK_PAIRS) -> Iterator[Chunk]:
    """Aligned (source, target) chunks of at most ``chunk_pairs`` pairs, ``spec.max_pairs`` in all."""
    fmt = resolve_format(spec, src_lang, trg_lang)
    if fmt == "hf":
        chunks = iter_hf(spec, src_lang, trg_lang, chunk_pairs)
    else:
        path = spec.path
        pairs = _iter_tsv(Path(path), src_lang, trg_lang) if fmt == "tsv" else _iter_plain(path, src_lang, trg_lang)
        chunks = _chunks(pairs, chunk_pairs)
    left = spec.max_pairs
    for src, trg in chunks:
        if left is not None:
            src, trg = src[:left], trg[:left]
            left -= len(src)
        if src:
            yield src, trg
        if left == 0:
            return


def read_parallel(spec: CorpusConfig, src_lang: str, trg_lang: str) -> Chunk:
    """The whole corpus (dev and test sets), aligned, at most ``spec.max_pairs`` pairs."""
    src: list[str] = []
    trg: list[str] = []
    for s, t in iter_parallel(spec, src_lang, trg_lang):
        src.extend(s)
        trg.extend(t)
    return src, trg


# --------------------------------------------------------------------------- cleaning


def clean_pairs(src: list[str], trg: list[str]) -> tuple[list[str], list[str], dict[str, int]]:
    """Strip surrounding whitespace and drop pairs with an empty side."""
    kept_src: list[str] = []
    kept_trg: list[str] = []
    for s, t in zip(src, trg):
        s, t = s.strip(), t.strip()
        if s and t:
            kept_src.append(s)
            kept_trg.append(t)
    n_read = min(len(src), len(trg))
    report = {"read": n_read, "empty": n_read - len(kept_src), "kept": len(kept_src)}
    return kept_src, kept_trg, report


def filter_by_length(
    src_lens: list[int], trg_lens: list[int], max_len: int, max_ratio: float
) -> tuple[list[int], dict[str, int]]:
    """Indices of pairs within ``max_len`` subwords per side and ``max_ratio`` length ratio.

    A pair that is both too long and unbalanced counts as ``too_long`` only.
    """
    src_arr = np.asarray(src_lens, dtype=np.int64)
    trg_arr = np.asarray(trg_lens, dtype=np.int64)
    too_long = (src_arr > max_len) | (trg_arr > max_len)
    longer = np.maximum(np.maximum(src_arr, trg_arr), 1)
    shorter = np.maximum(np.minimum(src_arr, trg_arr), 1)
    bad_ratio = ~too_long & (longer > max_ratio * shorter)
    keep = np.flatnonzero(~too_long & ~bad_ratio)
    report = {"too_long": int(too_long.sum()), "bad_ratio": int(bad_ratio.sum()), "kept": int(keep.size)}
    return keep.tolist(), report


def describe_drops(report: dict[str, int], max_len: int | None = None, max_ratio: float | None = None) -> str:
    """One line such as 'read 29000 pairs, dropped 3 empty, 12 over 128 tokens, 4 over ratio 3.0; kept 28981'.

    ``report`` is the merge of the ``clean_pairs`` and ``filter_by_length`` reports (later ``kept`` wins).
    """
    drops = []
    if "empty" in report:
        drops.append(f"{report['empty']} empty")
    if "too_long" in report:
        drops.append(f"{report['too_long']} over {max_len if max_len is not None else 'max'} tokens")
    if "bad_ratio" in report:
        drops.append(f"{report['bad_ratio']} over ratio {max_ratio if max_ratio is not None else 'max'}")
    head = f"read {report.get('read', report.get('kept', 0))} pairs"
    dropped = ", dropped " + ", ".join(drops) if drops else ""
    return f"{head}{dropped}; kept {report.get('kept', 0)}"
