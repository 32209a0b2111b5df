"""Data preparation for a run: read and clean the corpora, train or reuse SentencePiece,
encode, filter by length, and cache the encoded training set in the run directory.

The cache (``data/train.pt``: flat int32 ids + offsets) is keyed by a fingerprint of the
data config and the tokenizer files, so a resumed run starts without re-encoding.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nmt import checkpoint
from nmt.config import Config, CorpusConfig
from nmt.corpus import clean_pairs, describe_drops, filter_by_length, read_parallel
from nmt.errors import NMTError
from nmt.tokenizer import Tokenizer, train_or_load_tokenizers


@dataclass
class EncodedCorpus:
    src: list[list[int]]
    trg: list[list[int]]

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class Prepared:
    src_tok: Tokenizer
    trg_tok: Tokenizer
    train: EncodedCorpus
    dev_src: list[str]  # raw text, for BLEU
    dev_trg: list[str]
    dev: EncodedCorpus


def _flatten(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    return flat, offsets


def _unflatten(flat: torch.Tensor, offsets: torch.Tensor) -> list[list[int]]:
    ids = flat.tolist()
    bounds = offsets.tolist()
    return [ids[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


def _fingerprint(cfg: Config, tokenizers: list[Path]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(asdict(cfg.data), sort_keys=True, default=str).encode())
    for p in tokenizers:
        h.update(p.read_bytes())
    return h.hexdigest()


def _read_clean(spec: CorpusConfig, cfg: Config, split: str, log: Callable[[str], None]):
    src, trg = read_parallel(spec, cfg.data.src_lang, cfg.data.trg_lang)
    src, trg, report = clean_pairs(src, trg)
    if not src:
        raise NMTError(f"config key 'data.{split}': the corpus '{spec.path}' is empty after cleaning")
    log(f"{split}: {describe_drops(report)}")
    return src, trg


def prepare(cfg: Config, run_dir: Path, log: Callable[[str], None]) -> Prepared:
    (run_dir / "data").mkdir(parents=True, exist_ok=True)
    if cfg.data.synthetic:
        from nmt.synthetic import write_synthetic_corpus

        write_synthetic_corpus(
            Path(cfg.data.train.path).parent,
            src_lang=cfg.data.src_lang,
            trg_lang=cfg.data.trg_lang,
            n_train=cfg.data.synthetic_train_pairs,
            seed=cfg.data.synthetic_seed,
        )

    dev_src, dev_trg = _read_clean(cfg.data.dev, cfg, "dev", log)
    cached = _load_cached_train(cfg, run_dir, log)
    src_tok, trg_tok, train = cached if cached is not None else _encode_train(cfg, run_dir, log)
    dev = _encode(src_tok, trg_tok, dev_src, dev_trg, cfg.model.max_positions - 1)
    return Prepared(src_tok, trg_tok, train, dev_src, dev_trg, dev)


def _load_cached_train(cfg: Config, run_dir: Path, log: Callable[[str], None]):
    """(tokenizers, encoded training set) from an earlier preparation of this run, or None."""
    cache = run_dir / "data" / "train.pt"
    tok_paths = sorted(run_dir.glob("spm*.model"))
    if not (cache.exists() and tok_paths):
        return None
    try:
        payload = checkpoint.load(cache)
    except NMTError as e:
        log(f"{e}; re-encoding the training data")
        return None
    if payload.get("fingerprint") != _fingerprint(cfg, tok_paths):
        return None
    src_tok, trg_tok = train_or_load_tokenizers(cfg.tokenizer, [], [], run_dir, cfg.data.src_lang, cfg.data.trg_lang)
    train = EncodedCorpus(
        _unflatten(payload["src"], payload["src_offsets"]), _unflatten(payload["trg"], payload["trg_offsets"])
    )
    log(f"train: reusing {len(train)} encoded pairs from {cache}")
    return src_tok, trg_tok, train


def _encode_train(cfg: Config, run_dir: Path, log: Callable[[str], None]):
    """Read, clean, train or reuse SentencePiece, encode, length-filter, and cache the training set."""
    train_src, train_trg = _read_clean(cfg.data.train, cfg, "train", log)
    src_tok, trg_tok = train_or_load_tokenizers(
        cfg.tokenizer, train_src, train_trg, run_dir, cfg.data.src_lang, cfg.data.trg_lang
    )
    train = _encode(src_tok, trg_tok, train_src, train_trg)
    keep, report = filter_by_length(
        [len(s) for s in train.src], [len(t) for t in train.trg], cfg.data.max_len, cfg.data.max_len_ratio
    )
    if len(keep) < len(train):
        log(
            f"train: dropped {report.get('too_long', 0)} pairs over {cfg.data.max_len} subwords and "
            f"{report.get('bad_ratio', 0)} over length ratio {cfg.data.max_len_ratio}; kept {len(keep)}"
        )
    if not keep:
        raise NMTError("config key 'data.max_len': every training pair was dropped by the length filter")
    train = EncodedCorpus([train.src[i] for i in keep], [train.trg[i] for i in keep])
    src_flat, src_off = _flatten(train.src)
    trg_flat, trg_off = _flatten(train.trg)
    payload = {"src": src_flat, "src_offsets": src_off, "trg": trg_flat, "trg_offsets": trg_off}
    payload["fingerprint"] = _fingerprint(cfg, sorted(run_dir.glob("spm*.model")))
    checkpoint.save(payload, run_dir / "data" / "train.pt")
    return src_tok, trg_tok, train


def _encode(
    src_tok: Tokenizer, trg_tok: Tokenizer, src: list[str], trg: list[str], limit: int | None = None
) -> EncodedCorpus:
    """Encode both sides; ``limit`` truncates (dev pairs are scored whole but must fit the model)."""
    src_ids, trg_ids = src_tok.encode(src), trg_tok.encode(trg)
    if limit is not None:
        src_ids, trg_ids = [s[:limit] for s in src_ids], [t[:limit] for t in trg_ids]
    return EncodedCorpus(src_ids, trg_ids)
