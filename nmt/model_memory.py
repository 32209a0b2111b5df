"""Whether a model can fit where it is to run, known before any of it is allocated.

A model too large for the machine was killed by the kernel's OOM killer with no message (exit 137),
or failed in the start-up kernel measurement with advice to lower train.max_tokens, which does not
help. Training builds the model on torch's meta device (shapes only, no memory) and counts its
parameters; translation reads the size of the checkpoint's tensors without reading them. Where the
memory no run can do without is more than there is, it stops with one line naming the model's size
keys. Only what is certain counts: for training the weights, gradients and AdamW's two moments
(16 bytes a parameter in fp32) and the model's buffers, for translation the weights; never
activations, which depend on the batch, so a model that fits is never refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.device import memory_bytes
from nmt.errors import NMTError
from nmt.models import ModelConfig, build_model

# Beside each fp32 weight, training holds its gradient and AdamW's two moments, alike in size.
TRAINING_COPIES = 4


@dataclass(frozen=True)
class ModelSize:
    """What a model holds as allocated: its parameters (each tied tensor once) and their bytes, and
    the bytes of its buffers (the sinusoidal position table)."""

    parameters: int
    parameter_bytes: int
    buffer_bytes: int

    @property
    def training_bytes(self) -> int:
        """The least training holds: weights, gradients and AdamW's moments, and the buffers."""
        return TRAINING_COPIES * self.parameter_bytes + self.buffer_bytes


def model_size(cfg: ModelConfig, src_vocab_size: int, trg_vocab_size: int, pad_id: int) -> ModelSize:
    """The size of the model ``cfg`` describes, built on the meta device: nothing is allocated."""
    with torch.device("meta"):
        model = build_model(cfg, src_vocab_size, trg_vocab_size, pad_id)
    params = list(model.parameters())  # each shared (tied) tensor once
    return ModelSize(
        sum(p.numel() for p in params),
        sum(p.numel() * p.element_size() for p in params),
        sum(b.numel() * b.element_size() for b in model.buffers()),
    )


def device_memory(device: torch.device, processes: int = 1) -> tuple[int | None, str]:
    """The memory a model on ``device`` can have at most, and what that is in words (read after the
    figure): a GPU's total memory, or on a CPU what this process may use (the machine's, or its
    cgroup's limit where lower), its share where ``processes`` ranks train on the machine. None
    where it cannot be read."""
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        return properties.total_memory, f"memory the GPU ({properties.name}) has"
    total = memory_bytes()
    if total is None or processes <= 1:
        return total, "memory this process may use"
    return total // processes, f"memory each of {processes} training processes has of this machine's {_gb(total)}"


def size_keys(cfg: ModelConfig, src_vocab_size: int, trg_vocab_size: int) -> str:
    """The keys that make the model's size, with their values: what to lower. A Transformer's
    max_positions sizes its position table (a parameter when learned, else a buffer): 2^24 learned
    positions of 128 dimensions are 2.1 billion parameters."""
    width = ["d_model", "ff_size"] if cfg.type == "transformer" else ["d_model", "rnn_hidden"]
    depth = ["encoder_layers", "decoder_layers"] + (["max_positions"] if cfg.type == "transformer" else [])
    keys = [f"model.{k} {getattr(cfg, k)}" for k in (*width, *depth)]
    vocab = str(src_vocab_size) if src_vocab_size == trg_vocab_size else f"{src_vocab_size} and {trg_vocab_size}"
    return ", ".join(keys) + f", tokenizer.vocab_size {vocab}"


def _gb(n: int) -> str:
    """Bytes in GB: tenths, or two significant digits below 0.1 GB (a container's small limit)."""
    gb = n / 1e9
    return f"{gb:,.1f} GB" if gb >= 0.1 else f"{gb:.2g} GB"


def check_training_fits(
    cfg: ModelConfig,
    src_vocab_size: int,
    trg_vocab_size: int,
    pad_id: int,
    device: torch.device,
    processes: int = 1,
) -> None:
    """Refuse, in one line naming the size keys, a model whose weights, gradients and AdamW moments
    alone are more than ``device`` has (``device_memory``)."""
    size = model_size(cfg, src_vocab_size, trg_vocab_size, pad_id)
    memory, where = device_memory(device, processes)
    if memory is None or size.training_bytes <= memory:
        return
    raise NMTError(
        f"the model is too large to train here ({size_keys(cfg, src_vocab_size, trg_vocab_size)}): its "
        f"{size.parameters:,} parameters need {_gb(size.training_bytes)} for weights, gradients and AdamW's two "
        f"moments alone (16 bytes a parameter in fp32), more than the {_gb(memory)} of {where}"
    )


def check_weights_fit(weight_bytes: int | None, device: torch.device, checkpoint: Path, keys: str) -> None:
    """Refuse, in one line naming the checkpoint and the size ``keys`` (``size_keys``), a model
    whose ``weight_bytes`` (``nmt.checkpoint_file.model_bytes``; None: not known) alone are more than
    ``device`` has: translation holds no more that is certain."""
    memory, where = device_memory(device)
    if memory is None or weight_bytes is None or weight_bytes <= memory:
        return
    raise NMTError(
        f"{checkpoint}: the model is too large to load here ({keys}): its weights alone take "
        f"{_gb(weight_bytes)}, more than the {_gb(memory)} of {where}"
    )
