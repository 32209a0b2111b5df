"""Reading and cleaning parallel text: plain file pairs, TSV files and Hugging Face datasets.

Every failure caused by the user's data becomes a one-line ``NMTError`` naming the file and
line (or the dataset and column) at fault; nothing here lets a traceback escape for bad input.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from nmt.config import CorpusConfig
from nmt.errors import NMTError

_BOM = b"\xef\xbb\xbf"
_SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")  # written by Dataset(Dict).save_to_disk


# --------------------------------------------------------------------------- text files


def _read_bytes(path: Path) -> bytes:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except FileNotFoundError:
        raise NMTError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise NMTError(f"{path}: is a directory, expected a text file") from None
    except PermissionError:
        raise NMTError(f"{path}: permission denied") from None
    except (gzip.BadGzipFile, EOFError, zlib.error):
        raise NMTError(f"{path}: not a valid gzip file (corrupt or truncated)") from None
    except OSError as e:
        raise NMTError(f"{path}: cannot read ({e.strerror or e})") from None


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (``.gz`` decompressed), without line terminators.

    Only ``\\n`` ends a line: ``str.splitlines`` would also split on U+2028, U+0085 etc.
    and silently misalign parallel files.
    """
    path = Path(path)
    data = _read_bytes(path)
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    try:
        text = data.decode("utf-8")  # one decode per file; locate the bad line only on failure
    except UnicodeDecodeError as e:
        line_no = data.count(b"\n", 0, e.start) + 1
        raise NMTError(f"{path}:{line_no}: not valid UTF-8") from None
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline terminates the last line, it does not start a new one
    return lines


# --------------------------------------------------------------------------- plain and TSV


def plain_paths(prefix: str, lang: str) -> list[Path]:
    """Candidate files for one side of a plain corpus, preferred first."""
    return [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]


def _existing_plain_file(prefix: str, lang: str) -> Path | None:
    return next((p for p in plain_paths(prefix, lang) if p.exists()), None)


def _read_plain(prefix: str, src_lang: str, trg_lang: str) -> tuple[list[str], list[str]]:
    sides = []
    for lang in (src_lang, trg_lang):
        found = _existing_plain_file(prefix, lang)
        path = found if found is not None else plain_paths(prefix, lang)[0]  # read_lines names it
        sides.append((path, read_lines(path)))
    (src_path, src), (trg_path, trg) = sides
    if len(src) != len(trg):
        raise NMTError(
            f"{src_path} has {len(src)} lines but {trg_path} has {len(trg)}: parallel files must align line by line"
        )
    return src, trg


def _read_tsv(path: Path, max_pairs: int | None) -> tuple[list[str], list[str]]:
    lines = read_lines(path)
    if max_pairs is not None:
        lines = lines[:max_pairs]
    src: list[str] = []
    trg: list[str] = []
    for line_no, line in enumerate(lines, start=1):
        left, sep, right = line.partition("\t")
        if not sep or "\t" in right:
            n_tabs = line.count("\t")
            raise NMTError(f"{path}:{line_no}: expected 'source<TAB>target' (exactly one tab), found {n_tabs} tabs")
        src.append(left)
        trg.append(right)
    return src, trg


def _is_tsv(path: str) -> bool:
    return path.endswith(".tsv") or path.endswith(".tsv.gz")


# --------------------------------------------------------------------------- Hugging Face datasets


def _first_line(error: BaseException) -> str:
    # datasets' build errors say only "An error occurred while generating the dataset"; the cause says why.
    cause = error.__cause__ if error.__cause__ is not None else error
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__


def _hub_load(spec: CorpusConfig) -> Any:
    """``load_dataset`` from the hub, turning its network and lookup failures into one-line errors."""
    import datasets
    from datasets.exceptions import DatasetNotFoundError, DatasetsError

    where = f"hub dataset '{spec.path}'" + (f" (config '{spec.hf_config}')" if spec.hf_config else "")
    try:
        return datasets.load_dataset(spec.path, spec.hf_config, split=spec.split)
    except DatasetNotFoundError:
        raise NMTError(f"{where}: not found on the Hugging Face Hub, and no local corpus of that name") from None
    except DatasetsError as e:  # before OSError: some of these are FileNotFoundError subclasses
        raise NMTError(f"{where}: {_first_line(e)}") from None
    except (ConnectionError, TimeoutError, OSError) as e:
        # datasets/huggingface_hub wrap offline mode, DNS and HTTP failures into these.
        raise NMTError(f"{where}: could not be downloaded; the machine seems offline ({_first_line(e)})") from None
    except ValueError as e:  # unknown config or split
        raise NMTError(f"{where}: {_first_line(e)}") from None


def _local_load(path: Path, spec: CorpusConfig) -> Any:
    import datasets
    from datasets.exceptions import DatasetsError

    try:
        if any((path / marker).exists() for marker in _SAVED_DATASET_MARKERS):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if spec.split not in loaded:
                    available = ", ".join(loaded.keys())
                    raise NMTError(f"{path}: no split '{spec.split}' (available: {available})")
                return loaded[spec.split]
            return loaded
        return datasets.load_dataset(str(path), spec.hf_config, split=spec.split)
    except NMTError:
        raise
    except (DatasetsError, ValueError, OSError) as e:
        raise NMTError(f"{path}: cannot load as a dataset: {_first_line(e)}") from None


def _arrow_strings(column: Any) -> list[str]:
    """A pyarrow (chunked) array of text as Python strings; nulls become '' (dropped by cleaning)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = pc.cast(column, pa.string())
    return pc.fill_null(column, "").to_pylist()


def _struct_keys(arrow_type: Any) -> list[str]:
    import pyarrow as pa

    if not pa.types.is_struct(arrow_type):
        return []
    return [arrow_type.field(i).name for i in range(arrow_type.num_fields)]


def _dataset_columns(table: Any, spec: CorpusConfig, src_lang: str, trg_lang: str) -> tuple[list[str], list[str]]:
    import pyarrow.compute as pc

    names = table.column_names
    uses_translation = spec.src_column is None and spec.trg_column is None and "translation" in names
    sides = []
    if uses_translation:
        column = table.column("translation")
        keys = _struct_keys(column.type)
        for lang in (src_lang, trg_lang):
            if lang not in keys:
                raise NMTError(
                    f"{spec.path}: column 'translation' has no language '{lang}' (available: {', '.join(keys)})"
                )
            sides.append(_arrow_strings(pc.struct_field(column, lang)))
    else:
        for key, name in (("src_column", spec.src_column or src_lang), ("trg_column", spec.trg_column or trg_lang)):
            if name not in names:
                raise NMTError(f"{spec.path}: no column '{name}' (corpus {key}; available columns: {', '.join(names)})")
            sides.append(_arrow_strings(table.column(name)))
    return sides[0], sides[1]


def _read_hf(spec: CorpusConfig, src_lang: str, trg_lang: str) -> tuple[list[str], list[str]]:
    local = Path(spec.path)
    dataset = _local_load(local, spec) if local.is_dir() else _hub_load(spec)
    n_rows = len(dataset) if spec.max_pairs is None else min(len(dataset), spec.max_pairs)
    # Arrow columns convert to Python lists in C; row-by-row iteration is ~100x slower on WMT sizes.
    table = dataset.with_format("arrow")[:n_rows]
    return _dataset_columns(table, spec, src_lang, trg_lang)


# --------------------------------------------------------------------------- format choice


def _looks_like_path(path: str) -> bool:
    """A string meant as a file prefix rather than a hub name ('wmt14', 'Helsinki-NLP/opus-100')."""
    if os.path.isabs(path) or path.startswith((".", "~")) or "\\" in path or path.count("/") > 1:
        return True
    parent = os.path.dirname(path)
    return bool(parent) and os.path.isdir(parent)


def resolve_format(spec: CorpusConfig, src_lang: str, trg_lang: str) -> str:
    """The concrete format ('plain', 'tsv', 'hf') of a corpus spec with ``format: auto``."""
    if spec.format != "auto":
        return spec.format
    path = spec.path
    if _is_tsv(path):
        return "tsv"
    if Path(path).is_dir():
        return "hf"
    if _existing_plain_file(path, src_lang) is not None:
        return "plain"
    if _looks_like_path(path) or _existing_plain_file(path, trg_lang) is not None:
        raise NMTError(f"no such corpus: {path}.{src_lang} / {path}.{trg_lang}")
    return "hf"


def read_parallel(spec: CorpusConfig, src_lang: str, trg_lang: str) -> tuple[list[str], list[str]]:
    """Source and target sentences of one corpus, aligned, at most ``spec.max_pairs`` of them."""
    fmt = resolve_format(spec, src_lang, trg_lang)
    if fmt == "tsv":
        return _read_tsv(Path(spec.path), spec.max_pairs)
    if fmt == "hf":
        return _read_hf(spec, src_lang, trg_lang)
    src, trg = _read_plain(spec.path, src_lang, trg_lang)
    if spec.max_pairs is not None:
        src, trg = src[: spec.max_pairs], trg[: spec.max_pairs]
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
