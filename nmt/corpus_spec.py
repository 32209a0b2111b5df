"""What names a corpus: a corpus entry of the config (``CorpusConfig``), whether its path is meant as
a local path or a hub dataset name, and the chunk of pairs every reader yields.

Both readers use these, the text-file one (``nmt/corpus.py``) and the Hugging Face one
(``nmt/hf_corpus.py``), so they sit below both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nmt.errors import NMTError


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


Chunk = tuple[list[str], list[str]]


def looks_like_path(path: str, base: Path = Path(".")) -> bool:
    """A string meant as a file prefix rather than a hub name ('wmt14', 'Helsinki-NLP/opus-100');
    a relative one is read against ``base``."""
    if os.path.isabs(path) or path.startswith((".", "~")) or "\\" in path or path.count("/") > 1:
        return True
    parent = os.path.dirname(path)
    return bool(parent) and (base / parent).is_dir()


def absolute_path(base: Path, path: str | Path) -> str:
    """``path`` made absolute against ``base``, without '.' and '..', each '..' taken in the file
    system as opening the path takes it: after a symlinked directory it leads to the parent of the
    link's target, where os.path.normpath would drop the link's own name and name another place."""
    joined = Path(base, path).absolute()
    result = Path(joined.anchor)
    for part in joined.parts[1:]:
        if part == "..":
            result = result.resolve().parent  # a '..' of a path that does not exist yet is lexical
        elif part != ".":
            result = result / part
    return str(result)


def lone_data_file(path: str) -> NMTError:
    # A .parquet or .jsonl file was read as a missing prefix ("no such corpus: x.parquet.de").
    return NMTError(
        f"{path}: a file, but neither TSV (.tsv, .tsv.gz) nor a PREFIX of plain files; "
        "a Hugging Face data file (.parquet, .jsonl, .csv) is read from the directory holding it: name that"
    )
