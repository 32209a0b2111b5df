"""Reading Hugging Face datasets: a hub dataset, a ``save_to_disk`` directory or a directory of data files.

``iter_hf`` streams a dataset's rows in chunks of sentence pairs, as ``nmt/corpus.py`` does for text
files; every failure of the dataset, the network or the ``datasets`` package becomes a one-line
``NMTError`` naming the dataset (or the directory, column or config key) at fault.
"""

from __future__ import annotations

import csv
import logging
import re
import socket
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nmt.corpus_spec import Chunk, CorpusConfig, lone_data_file, looks_like_path
from nmt.errors import NMTError
from nmt.versions import OLDEST_DATASETS, older_than

_SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")  # written by Dataset(Dict).save_to_disk
_FULL_COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit hash, as the Hub names a dataset's revisions


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


def _lacks(pair: Any, lang: str) -> bool:
    """Whether a ``translation`` row holds no text in ``lang``. A null row has none in any language:
    an empty pair, as a null text is, not a row that lacks one."""
    return pair is not None and (not isinstance(pair, dict) or pair.get(lang) is None)


def _translation_side(pairs: list[Any], lang: str, spec: CorpusConfig, first_row: int) -> list[str]:
    """One language's texts of a batch of ``translation`` rows, the first row ``first_row`` of the
    split. A dict without ``lang`` is an error naming its row, one whose ``lang`` is null too: Arrow
    stores a key that some rows lack as null, so a dataset converted to Arrow (``save_to_disk``,
    ``streaming: false``) cannot tell them apart, where streamed JSON keeps each dict as written."""
    missing = next((i for i, pair in enumerate(pairs) if _lacks(pair, lang)), None)
    if missing is not None:
        pair = pairs[missing]
        held = [k for k, v in pair.items() if v is not None] if isinstance(pair, dict) else [type(pair).__name__]
        row = f"split '{spec.split}', row {first_row + missing}"
        available = ", ".join(held) or "none"
        raise NMTError(f"{spec.path}: {row}: column 'translation' has no language '{lang}' (available: {available})")
    texts = [None if p is None else p[lang] for p in pairs]
    return _text(texts, f"{spec.path}: column 'translation' (language '{lang}')")


def _columns(rows: dict[str, list[Any]], spec: CorpusConfig, src_lang: str, trg_lang: str, first_row: int) -> Chunk:
    """Source and target text of one batch of rows, in the hub's ``translation`` schema or named
    columns; ``first_row`` is the batch's first row in the split, counted from 0 (``dataset[i]``)."""
    names = list(rows)
    if spec.src_column is None and spec.trg_column is None and "translation" in names:
        src, trg = (_translation_side(rows["translation"], lang, spec, first_row) for lang in (src_lang, trg_lang))
        return src, trg
    sides = []
    for key, name in (("src_column", spec.src_column or src_lang), ("trg_column", spec.trg_column or trg_lang)):
        if name not in names:
            raise NMTError(f"{spec.path}: no column '{name}' (corpus {key}; available columns: {', '.join(names)})")
        sides.append(_text(rows[name], f"{spec.path}: column '{name}'"))
    return sides[0], sides[1]


def _csv_options(datasets: Any, source: str, hf_config: str | None, revision: str | None) -> dict[str, Any]:
    """What ``load_dataset`` is told for CSV (or TSV) data files, in a directory or a hub dataset
    (whose data files the same builder reads): every cell is text as written. pandas, which reads
    them for it, takes a cell of 'NA', 'N/A', 'None', 'null', 'nan' and a few more words as
    missing, and a pair whose side is "None" became an empty pair, dropped.
    A TSV file is not quoted, as a ``.tsv`` corpus file is not: with CSV quoting a sentence that
    starts with a quote lost its quotes, or, unbalanced, swallowed the lines after it into one pair."""
    builder = datasets.load_dataset_builder(source, hf_config, revision=revision)
    if builder.name != "csv":
        return {}
    options: dict[str, Any] = {"keep_default_na": False}
    if "\t" in (builder.config.sep, builder.config.delimiter):
        options["quoting"] = csv.QUOTE_NONE
    return options


def iter_hf(spec: CorpusConfig, src_lang: str, trg_lang: str, chunk: int) -> Iterator[Chunk]:
    """Chunks of a hub dataset, a ``save_to_disk`` directory or a directory of data files.

    Hub datasets and data files are read with ``streaming=True`` (unless ``streaming: false``):
    rows arrive batch by batch and nothing is converted to a full Arrow copy first.
    """
    datasets = _import_datasets(spec.path)
    from datasets.exceptions import DatasetsError

    local = Path(spec.path)
    is_local = local.is_dir()
    if local.is_file():
        raise lone_data_file(spec.path)
    if not is_local and looks_like_path(spec.path):  # not a hub name: do not ask the network for it
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
                    options = _csv_options(datasets, source, spec.hf_config, spec.revision)
                    dataset = datasets.load_dataset(
                        source,
                        spec.hf_config,
                        split=spec.split,
                        streaming=spec.streaming,
                        revision=spec.revision,
                        **options,
                    )
            batches = iter(dataset.iter(batch_size=chunk))
        first_row = 0
        while True:
            with _datasets_log_quiet():  # a streamed file fails as its batch is read
                rows = next(batches, None)
            if rows is None:
                return
            src, trg = _columns(rows, spec, src_lang, trg_lang, first_row)
            first_row += len(src)
            yield src, trg
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
