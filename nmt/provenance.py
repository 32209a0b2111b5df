"""What a run's prepared data is made from, and what changed since: the local files a corpus reads
and their stamps (size and modification time), the training shards' fingerprint, and the record
written beside each SentencePiece model, with the rule for reusing one (``changes_since_made``).
``nmt.prepare`` makes the data again where these say it was made from something else.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from nmt.config import Config, CorpusConfig
from nmt.corpus import plain_paths
from nmt.run_config import config_differences
from nmt.rundir import RunDir
from nmt.tokenizer import read_record


def _dataset_files(directory: Path) -> list[Path]:
    """Every file under a local dataset directory, recursively, in a stable order: the Arrow files
    and json state of a ``save_to_disk`` directory, or the data files (and any README that
    configures them) of a data-files directory."""
    found: list[Path] = []
    seen: set[str] = set()
    for root, dirs, files in os.walk(directory, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:  # a symlink back up the tree
            dirs.clear()
            continue
        seen.add(real)
        # git's own store is never read as data, and `git status` rewrites its index.
        dirs[:] = sorted(d for d in dirs if d != ".git")
        found += [Path(root, f) for f in sorted(files)]
    return [f for f in found if f.is_file()]


def corpus_files(spec: CorpusConfig, *langs: str) -> list[Path]:
    """The local files a corpus spec reads for ``langs``. A hub dataset by name has none: what is
    made from it is keyed by the commit its revision resolves to (see ``nmt.prepare._pinned_to_commit``)."""
    path = Path(spec.path)
    if path.is_file():
        return [path]
    found = _dataset_files(path) if path.is_dir() and spec.format != "plain" else []
    plain = [] if spec.format == "hf" else [p for lang in langs for p in plain_paths(spec.path, lang) if p.is_file()]
    return found + plain


def file_stamps(files: list[Path]) -> list[str]:
    """'path:size:mtime_ns' of each file: how the shards and the SentencePiece records know that a
    corpus file changed without reading it."""
    return [f"{f}:{stat.st_size}:{stat.st_mtime_ns}" for f in files for stat in (f.stat(),)]


def shards_fingerprint(cfg: Config, tokenizers: list[Path]) -> str:
    """What the shards depend on: not ``data.workers``, which only changes how fast they are made."""
    d = cfg.data
    h = hashlib.sha256()
    keys = {
        "train": d.train.__dict__,
        "langs": (d.src_lang, d.trg_lang),
        "filter": (d.max_len, d.max_len_ratio),
        "shard_pairs": d.shard_pairs,
        "synthetic": (d.synthetic, d.synthetic_seed, d.synthetic_train_pairs),
    }
    h.update(json.dumps(keys, sort_keys=True, default=str).encode())
    for stamp in file_stamps(corpus_files(d.train, d.src_lang, d.trg_lang)):
        h.update(stamp.encode())
    for p in tokenizers:
        h.update(p.read_bytes())
    return h.hexdigest()


def _as_json(value):
    """``value`` as it reads back from JSON (tuples become lists), to compare with a record read."""
    return json.loads(json.dumps(value, default=str))


def tokenizer_records(cfg: Config, paths: tuple[Path, Path]) -> tuple[dict, dict]:
    """What each SentencePiece model is made from, recorded beside it: the tokenizer section, the
    seed its sample is drawn with, its language(s), and the training corpus: its config and the
    files it reads for those languages, known as the shard fingerprint knows them."""
    d = cfg.data

    def record(*langs: str) -> dict:
        files = file_stamps(corpus_files(d.train, *langs))
        made_from = {"tokenizer": cfg.tokenizer.__dict__, "seed": cfg.seed, "langs": langs, "train": d.train.__dict__}
        return _as_json({**made_from, "files": files})

    if paths[0] == paths[1]:
        joint = record(d.src_lang, d.trg_lang)
        return joint, joint
    return record(d.src_lang), record(d.trg_lang)


def _record_changes(recorded: dict, wanted: dict) -> list[str]:
    """'key: old -> new' for what differs between a model's record and what it would be made from now."""
    if not recorded:
        return ["its record is unreadable"]
    changes = []
    for section, prefix in (("tokenizer", "tokenizer."), ("train", "data.train.")):
        old, new = recorded.get(section), wanted[section]
        old = old if isinstance(old, dict) else {}
        changes += [
            f"{prefix}{k}: {old.get(k)!r} -> {new.get(k)!r}"
            for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)
        ]
    for key, name in (("seed", "seed"), ("langs", "languages")):
        if recorded.get(key) != wanted[key]:
            changes.append(f"{name}: {recorded.get(key)!r} -> {wanted[key]!r}")
    if recorded.get("train") == wanted["train"] and recorded.get("files") != wanted["files"]:
        known = set(recorded.get("files") or ())
        changed = [stamp.rsplit(":", 2)[0] for stamp in wanted["files"] if stamp not in known]
        changes.append(f"the training text changed ({changed[0] if changed else 'a file is gone'})")
    return changes or (["its record differs"] if recorded != wanted else [])


def changes_since_made(cfg: Config, run: RunDir, path: Path, wanted: dict) -> list[str]:
    """What changed since the SentencePiece model ``path`` was made, to say why it is trained again;
    empty when it is reused. The one rule for reusing a model:

    - A run with checkpoints keeps its model, whatever changed: its checkpoints were trained with it
      (``check_checkpoint`` refuses any other). Only the run's writer ever trains one again.
    - Before that, a model is reused when the record written with it matches ``wanted``.
    - A model without a record (made by an earlier version, or put there by hand) is reused unless
      the run's config.yaml says it was made with other tokenizer settings, languages or corpus.
    """
    if not path.exists() or not run.writable or run.has_checkpoints():
        return []
    recorded = read_record(path)
    if recorded is not None:
        return _record_changes(recorded, wanted)
    if not run.config_path.exists():
        return []
    return config_differences(run.config(), cfg, ("tokenizer",), ("src_lang", "trg_lang", "train"))
