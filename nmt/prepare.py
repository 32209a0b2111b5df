"""Data preparation for a run: read and clean the corpora, train or reuse SentencePiece, and
binarize the training set into memory-mapped shards in the run directory.

The training corpus is streamed chunk by chunk, never held in memory whole. Shards are
keyed by a fingerprint of the training-data config, the corpus files and the tokenizer
models (``nmt.provenance``), so a resumed run (or ``nmt train`` after ``nmt prepare``) starts
without re-encoding.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from nmt.binarize import ShardSpec, binarize, id_dtype, remove_shards
from nmt.config import Config, CorpusConfig
from nmt.corpus import (
    check_corpus_exists,
    clean_pairs,
    describe_drops,
    is_hub_dataset,
    iter_parallel,
    read_parallel,
    resolve_format,
)
from nmt.errors import NMTError
from nmt.files import atomic_write_bytes
from nmt.hf_corpus import hub_commit, hub_where
from nmt.machine import usable_cpus
from nmt.provenance import changes_since_made, corpus_files, shards_fingerprint, tokenizer_records
from nmt.rundir import RunDir
from nmt.shards import ShardedCorpus, read_index
from nmt.tokenizer import Tokenizer, remove_model
from nmt.tokenizer_training import SideError, train_or_load_tokenizers


@dataclass
class EncodedCorpus:
    """A small encoded corpus held in memory (dev and test sets)."""

    src: list[list[int]]
    trg: list[list[int]]

    def __len__(self) -> int:
        return len(self.src)

    @property
    def src_lens(self) -> np.ndarray:
        return np.array([len(s) for s in self.src], dtype=np.int64)

    @property
    def trg_lens(self) -> np.ndarray:
        return np.array([len(t) for t in self.trg], dtype=np.int64)

    def pairs(self, rows) -> tuple[list[list[int]], list[list[int]]]:
        return [self.src[i] for i in rows], [self.trg[i] for i in rows]


@dataclass
class Prepared:
    src_tok: Tokenizer
    trg_tok: Tokenizer
    train: ShardedCorpus
    dev_src: list[str]  # raw text, for BLEU
    dev_trg: list[str]
    dev: EncodedCorpus


HUB_PIN = "hub_commit.json"  # in the run's data directory: the hub commit its data was made from


def _pinned_to_commit(cfg: Config, run: RunDir, log: Callable[[str], None], keep_the_runs: bool) -> Config:
    """``cfg`` with a hub training dataset's revision resolved to a commit. The shards' fingerprint
    and the tokenizers' records hold the training config, so a new commit on the Hub makes them
    again, and every read of the corpus gets that one commit's text even if the Hub moves on during
    preparation. ``keep_the_runs`` (a resumed run, a rank opening rank 0's data): the commit the run's
    data was made from, asking nothing of the Hub, so that a resume trains on the same text as the
    run left alone would, offline too; a new run, or another ``revision``, asks again."""
    d = cfg.data
    if not is_hub_dataset(d.train, d.src_lang, d.trg_lang):
        return cfg
    asked = {"path": d.train.path, "hf_config": d.train.hf_config, "revision": d.train.revision}
    pin_path = run.train_data_dir.parent / HUB_PIN
    pinned = _read_pin(pin_path) if keep_the_runs else None
    if pinned is not None and pinned.get("asked") == asked and isinstance(pinned.get("commit"), str):
        commit = pinned["commit"]
        log(f"train: {hub_where(d.train)} at commit {commit}, the one this run's data was made from")
    else:
        commit = hub_commit(d.train)
        log(f"train: {hub_where(d.train)} at commit {commit}")
        if run.writable:
            pin = json.dumps({"asked": asked, "commit": commit}, indent=1).encode()
            atomic_write_bytes(pin_path, pin)
    return replace(cfg, data=replace(d, train=replace(d.train, revision=commit)))


def _read_pin(path: Path) -> dict | None:
    try:
        pinned = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: the Hub is asked
        return None
    return pinned if isinstance(pinned, dict) else None


def _empty_corpus(split: str, spec: CorpusConfig) -> NMTError:
    return NMTError(f"config key 'data.{split}': the corpus '{spec.path}' is empty after cleaning")


def _read_clean(spec: CorpusConfig, cfg: Config, split: str, log: Callable[[str], None]):
    src, trg = read_parallel(spec, cfg.data.src_lang, cfg.data.trg_lang)
    src, trg, report = clean_pairs(src, trg)
    if not src:
        raise _empty_corpus(split, spec)
    log(f"{split}: {describe_drops(report)}")
    return src, trg


def _train_chunks(cfg: Config) -> Iterator[tuple[list[str], list[str]]]:
    return iter_parallel(cfg.data.train, cfg.data.src_lang, cfg.data.trg_lang, cfg.data.shard_pairs)


def _train_side(cfg: Config, side: int) -> Iterator[str]:
    """One side of the cleaned training corpus, streamed (SentencePiece samples from it)."""
    for chunk in _train_chunks(cfg):
        yield from clean_pairs(*chunk)[side]


def _naming_the_files(cfg: Config, error: SideError) -> NMTError:
    """``error`` naming the training file(s) it is about: its side's, or both for a joint model."""
    d = cfg.data
    langs = (d.src_lang, d.trg_lang) if error.side is None else ((d.src_lang, d.trg_lang)[error.side],)
    dataset = Path(d.train.path).is_dir() and d.train.format != "plain"
    files = [] if dataset else corpus_files(d.train, *langs)  # a dataset: its key
    where = ", ".join(map(str, files)) or f"config key 'data.train' ({d.train.path})"
    return NMTError(f"{where}: {error}")


def _tokenizers(cfg: Config, run: RunDir, log: Callable[[str], None]) -> tuple[Tokenizer, Tokenizer]:
    d = cfg.data
    resolve_format(d.train, d.src_lang, d.trg_lang)  # a missing corpus fails here, before anything is trained
    paths = run.tokenizer_paths(cfg)
    records = tokenizer_records(cfg, paths)
    for path, wanted in dict(zip(paths, records)).items():
        changes = changes_since_made(cfg, run, path, wanted)
        if changes:
            log(
                f"{path.name}: made from other settings or text ({'; '.join(changes)}); "
                "no checkpoint yet: training SentencePiece again"
            )
            remove_model(path)
    missing = [p for p in paths if not p.exists()]
    if missing and run.has_checkpoints():  # a new tokenizer would not be the one the model was trained with
        raise NMTError(
            f"{missing[0]}: missing from a run that has checkpoints; its model was trained with it: restore it"
        )
    # Only a tokenizer still to train reads the corpus here: a resumed run does not touch it.
    if missing and next(_train_side(cfg, 0), None) is None:
        raise _empty_corpus("train", d.train)
    try:
        return train_or_load_tokenizers(
            cfg.tokenizer, _train_side(cfg, 0), _train_side(cfg, 1), *paths, seed=cfg.seed, records=records
        )
    except SideError as e:
        raise _naming_the_files(cfg, e) from None


def _all_filtered(summary: dict, max_len: int, max_len_ratio: float) -> NMTError:
    """Every pair dropped by the length filters: the error names the key that dropped most of them."""
    too_long, bad_ratio = summary["too_long"], summary["bad_ratio"]
    counts = [f"{too_long} over data.max_len {max_len} subwords"] if too_long else []
    counts += [f"{bad_ratio} over data.max_len_ratio {max_len_ratio}"] if bad_ratio else []
    key = "data.max_len" if too_long >= bad_ratio else "data.max_len_ratio"
    return NMTError(f"config key '{key}': every training pair was dropped by the length filter ({', '.join(counts)})")


def encoding_workers(asked: int | None, cpus: int, log: Callable[[str], None]) -> int:
    """The encoding processes to start: ``data.workers``, or one per CPU this process may use;
    never more than those, since encoding is bound by them (and a mistyped 100000 would start that
    many processes). ``cpus`` is the process's affinity, not the machine's count: under taskset or
    in a container's cpuset the other CPUs are not ours."""
    if asked is None:
        return cpus
    if asked > cpus:
        usable = f"{cpus} CPU" + ("s" if cpus > 1 else "")
        log(f"train: data.workers {asked} is more than the {usable} this process may use: one process per CPU")
        return cpus
    return asked


def _encoding_speed(summary: dict) -> str:
    """How many shards were made, by how many processes, how fast: counting only the pairs encoded
    now, not those of the shards an interrupted preparation had finished."""
    resumed = summary["resumed"]
    read = summary["read"] - resumed["read"]
    rate = read / max(summary["seconds"], 1e-9)
    shards = f"{len(summary['shards'])} shards"
    if resumed["shards"]:
        shards += f" ({resumed['shards']} kept from the interrupted preparation; {read} pairs encoded now)"
    return (
        f"{shards}, read and encoded by {summary['workers']} process(es) in {summary['seconds']:.1f} s "
        f"({rate:.0f} pairs/s)"
    )


def _binarized_train(
    cfg: Config, run: RunDir, src_tok: Tokenizer, trg_tok: Tokenizer, log, made_by_rank_0: bool = False
) -> ShardedCorpus:
    d = cfg.data
    directory = run.train_data_dir
    tok_paths = sorted({src_tok.model_path, trg_tok.model_path})
    fingerprint = shards_fingerprint(cfg, tok_paths)
    index = read_index(directory)
    # The other ranks of a torchrun job open what rank 0 has just prepared: another machine may see
    # the corpus under another path, or its copy with other file times, and with its own fingerprint
    # every rank there would encode the shards again under the others' feet.
    if index is not None and (index.get("fingerprint") == fingerprint or made_by_rank_0):
        try:
            corpus = ShardedCorpus(directory)
        except NMTError as damage:
            if not run.writable:  # only the run's writer may delete and rebuild them
                raise NMTError(f"{damage}; delete {directory} and prepare again") from None
            log(f"train: {damage}; encoding the training data again")
            remove_shards(directory)  # by name: what else is there (another run, say) is not ours
        else:
            log(f"train: reusing {len(corpus)} encoded pairs in {len(index['shards'])} shards from {directory}")
            return corpus
    elif index is not None:
        log(
            f"train: the shards in {directory} were made from other data or settings (data.train's files, "
            "data.max_len, max_len_ratio or shard_pairs, the tokenizer); encoding the training data again"
        )
    workers = encoding_workers(d.workers, usable_cpus(), log)
    spec = ShardSpec(
        directory=str(directory),
        src_model=str(src_tok.model_path),
        trg_model=str(trg_tok.model_path),
        max_len=d.max_len,
        max_len_ratio=d.max_len_ratio,
        dtype=id_dtype(max(src_tok.vocab_size, trg_tok.vocab_size)).name,
        fingerprint=fingerprint,
    )
    summary = binarize(_train_chunks(cfg), spec, workers, log)
    log(f"train: {describe_drops(summary, d.max_len, d.max_len_ratio)}; {_encoding_speed(summary)}")
    if summary["kept"] == 0:
        if summary["read"] == summary["empty"]:
            raise _empty_corpus("train", d.train)
        raise _all_filtered(summary, d.max_len, d.max_len_ratio)
    return ShardedCorpus(directory)


def prepare(cfg: Config, run: RunDir, log: Callable[[str], None], made_by_rank_0: bool = False) -> Prepared:
    """The run's tokenizers, training shards and dev set: made by the run's writer, then found
    complete and only opened by everyone else (the other ranks of a torchrun job, which say
    ``made_by_rank_0``: they take its shards as they are)."""
    run.train_data_dir.parent.mkdir(parents=True, exist_ok=True)
    if cfg.data.synthetic:
        from nmt.synthetic import corpus_directory, write_synthetic_corpus

        write_synthetic_corpus(
            corpus_directory(cfg.data.train.path),
            src_lang=cfg.data.src_lang,
            trg_lang=cfg.data.trg_lang,
            n_train=cfg.data.synthetic_train_pairs,
            seed=cfg.data.synthetic_seed,
        )
    d = cfg.data
    # Checked as the run was opened (naming the config's line), but not the corpus data.synthetic has
    # just written, nor on the other ranks (rank 0 read the training corpus).
    for split in ("dev",) if made_by_rank_0 else ("train", "dev"):
        check_corpus_exists(getattr(d, split), d.src_lang, d.trg_lang, f"data.{split}")
    dev_src, dev_trg = _read_clean(cfg.data.dev, cfg, "dev", log)
    cfg = _pinned_to_commit(cfg, run, log, keep_the_runs=made_by_rank_0 or run.has_checkpoints())
    src_tok, trg_tok = _tokenizers(cfg, run, log)
    train = _binarized_train(cfg, run, src_tok, trg_tok, log, made_by_rank_0)
    dev = _encode_dev(cfg, src_tok, trg_tok, dev_src, dev_trg, log)
    return Prepared(src_tok, trg_tok, train, dev_src, dev_trg, dev)


def _encode_dev(
    cfg: Config, src_tok: Tokenizer, trg_tok: Tokenizer, src: list[str], trg: list[str], log: Callable[[str], None]
) -> EncodedCorpus:
    """Both sides encoded, each cut to the ``model.max_positions - 1`` subwords the model holds (its
    EOS takes the last position). The pairs cut are said here, once a session: validation's
    translator, which cuts their sources again at every validation, says nothing then."""
    src_ids, trg_ids = src_tok.encode(src), trg_tok.encode(trg)
    if not any(s and t for s, t in zip(src_ids, trg_ids)):  # dev BLEU 0 and a loss on EOS alone, all run long
        raise NMTError(
            f"{_empty_corpus('dev', cfg.data.dev)}: every pair has a side the tokenizer encodes to no subword "
            "(zero-width or control characters only)"
        )
    if cfg.model.max_positions is None:
        return EncodedCorpus(src_ids, trg_ids)
    limit = cfg.model.max_positions - 1
    cut = [i for i, (s, t) in enumerate(zip(src_ids, trg_ids)) if len(s) > limit or len(t) > limit]
    if cut:
        validated = cfg.train.validate_max_sentences or len(src_ids)
        translated = sum(1 for i in cut if i < validated and len(src_ids[i]) > limit)
        log(dev_cut_warning(len(cut), len(src_ids), translated, cfg.model.max_positions))
    return EncodedCorpus([s[:limit] for s in src_ids], [t[:limit] for t in trg_ids])


def dev_cut_warning(cut: int, pairs: int, translated: int, max_positions: int) -> str:
    """The warning for ``cut`` of the dev set's ``pairs`` with a side over ``max_positions - 1``
    subwords, ``translated`` of them with a source over it among the sentences validation translates."""
    limit = max_positions - 1
    message = (
        f"warning: dev: {cut} of {pairs} pairs have a side longer than model.max_positions {max_positions} allows "
        f"({limit} subwords): the dev loss scores only their first {limit} subwords"
    )
    if translated:
        message += (
            f"; validation translates {translated} of them from their first {limit} source subwords, and dev BLEU "
            "scores that against the whole reference"
        )
    return message
