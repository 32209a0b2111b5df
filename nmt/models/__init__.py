"""Model registry: ``model.type`` in the config -> its config class and its ``Seq2Seq``."""

from __future__ import annotations

from nmt.models.attention import attention_kind
from nmt.models.base import Seq2Seq
from nmt.models.rnn import RNNConfig, RNNSeq2Seq
from nmt.models.transformer import Transformer, TransformerConfig

ModelConfig = TransformerConfig | RNNConfig
MODEL_CONFIGS: dict[str, type] = {"transformer": TransformerConfig, "rnn": RNNConfig}


def build_model(cfg: ModelConfig, src_vocab_size: int, trg_vocab_size: int, pad_id: int) -> Seq2Seq:
    """Construct the model ``cfg`` describes (weights freshly initialised)."""
    if isinstance(cfg, TransformerConfig):
        return Transformer(cfg, src_vocab_size, trg_vocab_size, pad_id)
    if isinstance(cfg, RNNConfig):
        return RNNSeq2Seq(cfg, src_vocab_size, trg_vocab_size, pad_id)
    raise TypeError(f"no model for config {type(cfg).__name__}")


def same_model_value(key: str, a, b) -> bool:
    """Whether two values of ``model.<key>`` build the same model: an RNN's attention synonyms
    ('general' and 'bilinear', 'mlp' and 'additive') do, so a checkpoint of one loads as the other."""
    if key == "attention" and isinstance(a, str) and isinstance(b, str):
        return attention_kind(a) == attention_kind(b)
    return a == b
