"""Reading and cleaning parallel text: plain file pairs, TSV files and Hugging Face datasets.

Every reader streams: ``iter_parallel`` yields aligned chunks of sentence pairs, so a corpus
of millions of pairs is never held in memory at once. Every failure caused by the user's data
becomes a one-line ``NMTError`` naming the file and line (or the dataset and column) at fault.
"""

from __future__ import annotations

import csv
import gzip
import logging
import os
import re
import socket
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from itertools import chain, islice
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np

from nmt.errors import NMTError
from nmt.versions import OLDEST_DATASETS, older_than


@dataclass
class CorpusConfig:
    """One parallel corpus: plain ``PREFIX.SRC``/``PREFIX.TRG`` files, a TSV file, or a HF dataset."""

    path: str = ""  # prefix, .tsv file, local dataset directory, or hub dataset name
    format: Literal["auto", "plain", "tsv", "hf"] = "auto"
    hf_config: str | None = None  # hub dataset configuration, e.g. "de-en" for wmt14
    revision: str | None = None  # hub dataset: branch, tag or commit to read (None: the default branch)
    split: str = "train"  # hub/local dataset split
    src_column: str | None = None  # one column per language; default: `translation` dict or the language code
    trg_column: str | None = None
    max_pairs: int | None = None  # read at most this many pairs
    streaming: bool = True  # hf: stream rows instead of converting the whole dataset to Arrow first


# Read by the Hugging Face reader only: a plain or TSV corpus would ignore them.
HF_ONLY_KEYS = ("hf_config", "revision", "split", "src_column", "trg_column", "streaming")


def hf_keys_changed(spec: CorpusConfig) -> list[str]:
    """The Hugging-Face-only keys of ``spec`` set to other than their defaults."""
    default = CorpusConfig()
    return [name for name in HF_ONLY_KEYS if getattr(spec, name) != getattr(default, name)]


_BOM = b"\xef\xbb\xbf"
_SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")  # written by Dataset(Dict).save_to_disk
_BLOCK_BYTES = 1 << 22  # text is decoded 4 MiB at a time: one C-level decode per block, flat memory
MAC_SAMPLE_BYTES = 1 << 16  # a file's first bytes, whose line ends tell whether it is an old-Mac file
CHUNK_PAIRS = 50_000  # pairs per chunk when a caller does not choose
_FULL_COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit hash, as the Hub names a dataset's revisions

Chunk = tuple[list[str], list[str]]


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


def _iter_tsv(path: Path) -> Iterator[tuple[str, str]]:
    for line_no, line in enumerate(iter_lines(path), start=1):
        left, sep, right = line.partition("\t")
        if not sep or "\t" in right:
            n_tabs = line.count("\t")
            raise NMTError(f"{path}:{line_no}: expected 'source<TAB>target' (exactly one tab), found {n_tabs} tabs")
        yield left, right


def _is_tsv(path: str) -> bool:
    return path.endswith(".tsv") or path.endswith(".tsv.gz")


# --------------------------------------------------------------------------- Hugging Face datasets


def _first_line(error: BaseException) -> str:
    # datasets' build errors say only "An error occurred while generating the dataset"; the cause says why.
    cause = error.__cause__ if error.__cause__ is not None else error
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__


def hub_where(spec: CorpusConfig) -> str:
    """'hub dataset NAME (config C, revision R)': how messages name a hub dataset."""
    named = [f"config '{spec.hf_config}'"] if spec.hf_config else []
    named += [f"revision '{spec.revision}'"] if spec.revision else []
    return f"hub dataset '{spec.path}'" + (f" ({', '.join(named)})" if named else "")


def _hub_error(spec: CorpusConfig, error: BaseException, unreachable: str | None = None) -> NMTError:
    """One line for ``load_dataset``'s network and lookup failures (raised at load or mid-stream);
    ``unreachable`` is why the Hub could not be reached, if that was found out beforehand."""
    import datasets.config
    from datasets.exceptions import DatasetNotFoundError, DatasetsError

    where = hub_where(spec)
    offline = unreachable is not None or getattr(datasets.config, "HF_HUB_OFFLINE", False)
    if offline and isinstance(error, ValueError) and "cache" in str(error):
        # Offline, datasets looks only in its cache, and says so without a word about the network.
        return NMTError(
            f"{where}: could not be downloaded; the machine seems offline, and the datasets cache does not hold it "
            f"({_first_line(error)})"
        )
    if isinstance(error, DatasetNotFoundError):
        return NMTError(f"{where}: not found on the Hugging Face Hub, and no local corpus of that name")
    if isinstance(error, DatasetsError):  # before OSError: some of these are FileNotFoundError subclasses
        return NMTError(f"{where}: {_first_line(error)}")
    if isinstance(error, (ConnectionError, TimeoutError, OSError)):
        # datasets/huggingface_hub wrap offline mode, DNS and HTTP failures into these.
        why = unreachable or _first_line(error)
        return NMTError(f"{where}: could not be downloaded; the machine seems offline ({why})")
    return NMTError(f"{where}: {_first_line(error)}")  # ValueError: unknown config or split


def _hub_unreachable() -> str | None:
    """Why no connection to the Hub can be opened (no DNS, refused, timed out), or None.

    Without this, a Hub that cannot be reached is retried with back-off for about half a minute,
    with a warning per try, before the same error."""
    import datasets.config
    import huggingface_hub.constants

    if getattr(datasets.config, "HF_HUB_OFFLINE", False):
        return None  # already offline: the libraries do not try the network
    url = urlsplit(datasets.config.HF_ENDPOINT)
    proxies = urllib.request.getproxies()
    if not url.hostname or (
        (proxies.get(url.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(url.hostname)
    ):
        return None  # behind a proxy only the proxy knows; leave it to the libraries
    address = (url.hostname, url.port or (443 if url.scheme == "https" else 80))
    timeout = getattr(huggingface_hub.constants, "HF_HUB_ETAG_TIMEOUT", 10)  # the Hub's own metadata timeout
    try:
        socket.create_connection(address, timeout=timeout).close()
    except OSError as e:
        return f"{address[0]}:{address[1]}: {e.strerror or str(e) or type(e).__name__}"
    return None


@contextmanager
def _offline_hub() -> Iterator[None]:
    """The libraries' offline mode for one call: a cached copy is used, or the error comes at once.
    Their module-level flags are restored on the way out, so nothing outlives the call."""
    import datasets.config
    import huggingface_hub.constants

    flags = [m for m in (datasets.config, huggingface_hub.constants) if hasattr(m, "HF_HUB_OFFLINE")]
    saved = [m.HF_HUB_OFFLINE for m in flags]
    for module in flags:
        module.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for module, value in zip(flags, saved):
            module.HF_HUB_OFFLINE = value


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


@contextmanager
def _datasets_log_quiet() -> Iterator[None]:
    """Keep ``datasets``' own error log lines ("Failed to load JSON from file ...") off stderr while
    it reads: its failure becomes one NMTError line, and the log line before it was a second. Its
    warnings (a cached copy used offline, say) still print."""
    handlers = list(logging.getLogger("datasets").handlers)
    for handler in handlers:
        handler.addFilter(_below_error)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_below_error)


def _check_datasets_version(corpus: str) -> None:
    """Refuse a datasets older than OLDEST_DATASETS in one line, before importing it (which may fail)."""
    installed = older_than("datasets", OLDEST_DATASETS)
    if installed is not None:
        raise NMTError(
            f"{corpus}: reading a Hugging Face dataset needs datasets {OLDEST_DATASETS} or later, "
            f"not {installed}: pip install 'datasets>={OLDEST_DATASETS}'"
        )


def _import_datasets(corpus: str) -> Any:
    """The ``datasets`` package (a dependency, yet an environment may lack it or hold an older one):
    without it, one line naming ``corpus``, the dataset that needs it."""
    _check_datasets_version(corpus)
    try:
        import datasets
    except ImportError:
        raise NMTError(
            f"{corpus}: reading a Hugging Face dataset needs the 'datasets' package, which cannot be imported: "
            "pip install datasets"
        ) from None
    return datasets


def _local_error(path: Path, error: BaseException) -> NMTError:
    return NMTError(f"{path}: cannot load as a dataset: {_first_line(error)}")


def _saved_dataset(directory: Path) -> bool:
    """Whether ``directory`` is one that ``Dataset(Dict).save_to_disk`` wrote."""
    return any((directory / marker).is_file() for marker in _SAVED_DATASET_MARKERS)


def check_saved_split(spec: CorpusConfig, key: str = "split") -> None:
    """A split other than the default asked of a directory ``save_to_disk`` wrote from one Dataset
    (not a DatasetDict) would be ignored, the one dataset read whatever its split: an error naming
    ``key``, the corpus's ``split`` key."""
    local = Path(spec.path)
    single = (local / "state.json").is_file() and not (local / "dataset_dict.json").exists()
    if spec.split == CorpusConfig.split or not single:
        return
    raise NMTError(
        f"config key '{key}': split '{spec.split}', but {local} holds one dataset without splits "
        "(save_to_disk of a Dataset, not a DatasetDict): remove the key, or name that split's own directory"
    )


def check_saved_config(spec: CorpusConfig, key: str = "hf_config") -> None:
    """A configuration name chooses among a hub dataset's configurations (``load_dataset``'s
    ``name``); a directory ``save_to_disk`` wrote holds the one it was saved from, and
    ``load_from_disk`` takes no name, so the key would be ignored: an error naming ``key``."""
    local = Path(spec.path)
    if spec.hf_config is None or not _saved_dataset(local):
        return
    raise NMTError(
        f"config key '{key}': '{spec.hf_config}', but {local} is a dataset saved with save_to_disk, which holds "
        "the one configuration it was saved from and has no others to choose: remove the key"
    )


def check_local_revision(spec: CorpusConfig, key: str = "revision") -> None:
    """A revision chooses a commit of a hub dataset; a local directory is read as it is now, and
    ``load_dataset`` ignores the revision asked of it: an error naming ``key``."""
    if spec.revision is None or not Path(spec.path).is_dir():
        return
    raise NMTError(
        f"config key '{key}': '{spec.revision}', but {spec.path} is a local directory, read as it is; "
        "a revision chooses a commit of a hub dataset: remove the key"
    )


def is_hub_dataset(spec: CorpusConfig, src_lang: str, trg_lang: str) -> bool:
    """Whether ``spec`` names a dataset on the Hugging Face Hub (not a local file or directory)."""
    return resolve_format(spec, src_lang, trg_lang) == "hf" and not Path(spec.path).is_dir()


def hub_commit(spec: CorpusConfig) -> str:
    """The commit of the hub dataset ``spec`` that reading it gets now: its ``revision`` (the
    default branch if none) as the Hub resolves it, or, offline, the commit held in the ``datasets``
    cache, which is what ``load_dataset`` reads offline. Data prepared from a hub dataset is keyed
    by it, so that a new commit on the Hub is noticed."""
    datasets = _import_datasets(hub_where(spec))
    from datasets.exceptions import DatasetsError

    unreachable = _hub_unreachable()
    try:
        with _datasets_log_quiet(), _offline_hub() if unreachable else nullcontext():
            builder = datasets.load_dataset_builder(spec.path, spec.hf_config, revision=spec.revision)
    except (DatasetsError, ValueError, OSError, ConnectionError, TimeoutError) as e:
        raise _hub_error(spec, e, unreachable) from None
    commit = str(builder.hash)
    if spec.revision is not None and _FULL_COMMIT.fullmatch(spec.revision) and commit != spec.revision:
        # Offline, datasets reads the latest commit it has cached, whatever the revision asks.
        raise NMTError(
            f"{hub_where(spec)}: the datasets cache holds commit {commit}, not this one, and it cannot be "
            "downloaded offline: it needs the network"
        )
    return commit


def _load_saved(path: Path, spec: CorpusConfig) -> Any:
    """A dataset written by ``save_to_disk``: Arrow files, memory-mapped, so already streamable."""
    import datasets

    check_saved_config(spec)
    check_saved_split(spec)
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if spec.split not in loaded:
            raise NMTError(f"{path}: no split '{spec.split}' (available: {', '.join(loaded.keys())})")
        return loaded[spec.split]
    return loaded


def _text(values: list[Any], where: str) -> list[str]:
    """The strings of one column; nulls become '' (dropped by cleaning). Anything else is refused:
    str() of a token list or a number would be trained on as if it were a sentence."""
    bad = next((v for v in values if v is not None and not isinstance(v, str)), None)
    if bad is not None:
        raise NMTError(f"{where} holds {type(bad).__name__}, not text")
    return ["" if v is None else v for v in values]


def _columns(rows: dict[str, list[Any]], spec: CorpusConfig, src_lang: str, trg_lang: str) -> Chunk:
    """Source and target text of one batch of rows, in the hub's ``translation`` schema or named columns."""
    names = list(rows)
    if spec.src_column is None and spec.trg_column is None and "translation" in names:
        pairs = rows["translation"]
        sides = []
        for lang in (src_lang, trg_lang):
            # A null row has no text in any language: an empty pair, as a null text is.
            missing = [p for p in pairs if p is not None and (not isinstance(p, dict) or lang not in p)]
            if missing:
                keys = ", ".join(missing[0]) if isinstance(missing[0], dict) else type(missing[0]).__name__
                raise NMTError(f"{spec.path}: column 'translation' has no language '{lang}' (available: {keys})")
            texts = [None if p is None else p[lang] for p in pairs]
            sides.append(_text(texts, f"{spec.path}: column 'translation' (language '{lang}')"))
        return sides[0], sides[1]
    sides = []
    for key, name in (("src_column", spec.src_column or src_lang), ("trg_column", spec.trg_column or trg_lang)):
        if name not in names:
            raise NMTError(f"{spec.path}: no column '{name}' (corpus {key}; available columns: {', '.join(names)})")
        sides.append(_text(rows[name], f"{spec.path}: column '{name}'"))
    return sides[0], sides[1]


def _csv_options(datasets: Any, directory: str, hf_config: str | None) -> dict[str, Any]:
    """What ``load_dataset`` is told for a directory of CSV (or TSV) data files: every cell is text
    as written. pandas, which reads them for it, takes a cell of 'NA', 'N/A', 'None', 'null', 'nan'
    and a few more words as missing, and a pair whose side is "None" became an empty pair, dropped.
    A TSV file is not quoted, as a ``.tsv`` corpus file is not: with CSV quoting a sentence that
    starts with a quote lost its quotes, or, unbalanced, swallowed the lines after it into one pair."""
    builder = datasets.load_dataset_builder(directory, hf_config)
    if builder.name != "csv":
        return {}
    options: dict[str, Any] = {"keep_default_na": False}
    if "\t" in (builder.config.sep, builder.config.delimiter):
        options["quoting"] = csv.QUOTE_NONE
    return options


def _iter_hf(spec: CorpusConfig, src_lang: str, trg_lang: str, chunk: int) -> Iterator[Chunk]:
    """Chunks of a hub dataset, a ``save_to_disk`` directory or a directory of data files.

    Hub datasets and data files are read with ``streaming=True`` (unless ``streaming: false``):
    rows arrive batch by batch and nothing is converted to a full Arrow copy first.
    """
    datasets = _import_datasets(spec.path)
    from datasets.exceptions import DatasetsError

    local = Path(spec.path)
    is_local = local.is_dir()
    if local.is_file():
        raise _lone_data_file(spec.path)
    if not is_local and _looks_like_path(spec.path):  # not a hub name: do not ask the network for it
        raise NMTError(f"{spec.path}: no such dataset directory")
    check_local_revision(spec)
    unreachable = None
    fail = (lambda e: _local_error(local, e)) if is_local else (lambda e: _hub_error(spec, e, unreachable))
    try:
        with _datasets_log_quiet():
            if is_local and _saved_dataset(local):
                dataset = _load_saved(local, spec)
            else:
                unreachable = None if is_local else _hub_unreachable()
                with _offline_hub() if unreachable else nullcontext():
                    source = str(local) if is_local else spec.path
                    options = _csv_options(datasets, source, spec.hf_config) if is_local else {}
                    dataset = datasets.load_dataset(
                        source,
                        spec.hf_config,
                        split=spec.split,
                        streaming=spec.streaming,
                        revision=spec.revision,
                        **options,
                    )
            batches = iter(dataset.iter(batch_size=chunk))
        while True:
            with _datasets_log_quiet():  # a streamed file fails as its batch is read
                rows = next(batches, None)
            if rows is None:
                return
            yield _columns(rows, spec, src_lang, trg_lang)
    except NMTError:
        raise
    except StopIteration:
        # datasets infers the columns from the first rows it finds and has no error for finding none
        # (every data file empty): the bare StopIteration became "generator raised StopIteration".
        where = f"{local}: cannot load as a dataset" if is_local else hub_where(spec)
        raise NMTError(f"{where}: its data files hold no rows") from None
    except (DatasetsError, ValueError, OSError, ConnectionError, TimeoutError, EOFError, zlib.error) as e:
        # EOFError, zlib.error: a truncated or corrupt .gz data file, which datasets passes on as it is.
        raise fail(e) from None


# --------------------------------------------------------------------------- format choice


def _looks_like_path(path: str, base: Path = Path(".")) -> bool:
    """A string meant as a file prefix rather than a hub name ('wmt14', 'Helsinki-NLP/opus-100');
    a relative one is read against ``base``."""
    if os.path.isabs(path) or path.startswith((".", "~")) or "\\" in path or path.count("/") > 1:
        return True
    parent = os.path.dirname(path)
    return bool(parent) and (base / parent).is_dir()


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
        is_local = local.exists() or named_files or _looks_like_path(path, base)
    else:
        is_local = True
    return replace(spec, path=os.path.normpath(local.absolute())) if is_local else spec


def local_corpus_gone(spec: CorpusConfig, src_lang: str, trg_lang: str) -> bool:
    """Whether ``spec`` names a local corpus by absolute path where nothing is: no file or directory
    of that name, nor either language's PREFIX.LANG. A hub dataset by name is never gone."""
    path = spec.path
    if not path or not os.path.isabs(path):
        return False
    named = [Path(path), *plain_paths(path, src_lang), *plain_paths(path, trg_lang)]
    return not any(p.exists() for p in named)


def _lone_data_file(path: str) -> NMTError:
    # A .parquet or .jsonl file was read as a missing prefix ("no such corpus: x.parquet.de").
    return NMTError(
        f"{path}: a file, but neither TSV (.tsv, .tsv.gz) nor a PREFIX of plain files; "
        "a Hugging Face data file (.parquet, .jsonl, .csv) is read from the directory holding it: name that"
    )


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
        raise _lone_data_file(path)
    if _looks_like_path(path) or _existing_plain_file(path, trg_lang) is not None:
        raise NMTError(f"no such corpus: {path}.{src_lang} / {path}.{trg_lang}")
    return "hf"


def iter_parallel(spec: CorpusConfig, src_lang: str, trg_lang: str, chunk_pairs: int = CHUNK_PAIRS) -> Iterator[Chunk]:
    """Aligned (source, target) chunks of at most ``chunk_pairs`` pairs, ``spec.max_pairs`` in all."""
    fmt = resolve_format(spec, src_lang, trg_lang)
    if fmt == "hf":
        chunks = _iter_hf(spec, src_lang, trg_lang, chunk_pairs)
    else:
        pairs = _iter_tsv(Path(spec.path)) if fmt == "tsv" else _iter_plain(spec.path, src_lang, trg_lang)
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
