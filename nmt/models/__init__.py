"""Model registry: ``model.type`` in the config -> a ``Seq2Seq``."""

from __future__ import annotations

from nmt.config import ModelConfig
from nmt.models.base import Seq2Seq


def build_model(cfg: ModelConfig, src_vocab_size: int, trg_vocab_size: int, pad_id: int) -> Seq2Seq:
    """Construct the model named by ``cfg.type`` (weights freshly initialised)."""
    if cfg.type == "transformer":
        from nmt.models.transformer import Transformer

        return Transformer(cfg, src_vocab_size, trg_vocab_size, pad_id)
    if cfg.type == "rnn":
        from nmt.models.rnn import RNNSeq2Seq

        return RNNSeq2Seq(cfg, src_vocab_size, trg_vocab_size, pad_id)
    raise ValueError(f"unknown model type {cfg.type!r} (expected 'transformer' or 'rnn')")
