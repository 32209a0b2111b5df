"""The interface every model implements, so training and search never ask which model they drive.

Conventions:
- ``src``: LongTensor [B, S] of source ids, padded with ``pad_id``.
- ``src_mask``: BoolTensor [B, S], True at real tokens, False at padding.
- ``trg_in``: LongTensor [B, T], the target shifted right (BOS first): teacher forcing input.
- Logits are returned unnormalised, [B, T, V]; search applies log_softmax in fp32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nmt.models.linear import Linear, affine


class Seq2Seq(nn.Module):
    """Encoder-decoder with a teacher-forced forward pass and incremental decoding."""

    pad_id: int
    max_positions: int | None = None  # longest sequence (source or target) the model accepts; None: any
    fp32_matmul: str = "blas"  # library of fp32 CPU products (``set_fp32_matmul``)
    attention_kernel: str = "sdpa"  # (``set_attention_kernel``)

    def forward(
        self, src: torch.Tensor, src_mask: torch.Tensor, trg_in: torch.Tensor, features_only: bool = False
    ) -> torch.Tensor:
        """Teacher forcing: logits [B, T, V] for every target position at once; with ``features_only``
        the decoder's output [B, T, D] before the output layer (``output_layer``), for a loss that
        applies that layer itself (nmt/loss.py: ``projected_label_smoothed_nll``)."""
        features = self.decode_features(self.encode(src, src_mask), trg_in)
        return features if features_only else self.project(features)

    def set_attention_kernel(self, kernel: str) -> None:
        """Compute attention with ``kernel`` ("sdpa" or "explicit"); models without such a choice ignore it."""
        self.attention_kernel = kernel

    def set_fp32_matmul(self, library: str) -> None:
        """Compute fp32 CPU products with ``library``: "blas" (torch's BLAS, MKL on x86) or "onednn", in
        every ``Linear``, the output layer and the training loss's (nmt/models/linear.py says why)."""
        self.fp32_matmul = library
        for module in self.modules():
            if isinstance(module, Linear):
                module.fp32_matmul = library

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> Any:
        """Run the encoder once; the result is what the decoder attends to (model-specific)."""
        raise NotImplementedError

    def decode_features(self, memory: Any, trg_in: torch.Tensor) -> torch.Tensor:
        """Decoder over a whole target prefix [B, T] -> its output [B, T, D], before the output layer."""
        raise NotImplementedError

    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight [V, D] and bias [V] (or None) that map decoder output to logits."""
        raise NotImplementedError

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Decoder output [..., D] -> logits [..., V], through ``output_layer`` (which the fp32 CPU
        training loss applies by itself: logits must depend on nothing else)."""
        weight, bias = self.output_layer()
        return affine(features, weight, bias, self.fp32_matmul)

    def init_state(self, memory: Any, record_attention: bool = False) -> Any:
        """Decoder state before the first step: caches of keys/values, RNN hidden state, ...
        With ``record_attention`` every step keeps the attention weights it used (``step_attention``)."""
        raise NotImplementedError

    def decode_step(self, prev_tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """One step: prev_tokens [N] (the last emitted token) -> logits [N, V] and the new state.

        The state carries the step index and every cache it needs, so a step costs O(1) in the
        prefix length for the RNN and O(t) attention (no recomputation) for the Transformer.
        """
        raise NotImplementedError

    def reorder_state(self, state: Any, index: torch.Tensor) -> Any:
        """Select rows of every tensor in the state (beam reordering, finished sentences leaving)."""
        raise NotImplementedError

    def step_attention(self, state: Any) -> torch.Tensor | None:
        """The weights over the source of the last step, (N, layers, heads, S) fp32, rows summing to
        1 and exactly 0 at padding, if ``state`` records them (``init_state(record_attention=True)``)."""
        return None

    def num_parameters(self) -> int:
        """Trainable parameters, each shared (tied) tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def flops_per_token(self, src_len: float, trg_len: float) -> float:
        """Approximate training FLOPs (forward + backward) per target token, for sentence pairs of
        ``src_len`` and ``trg_len`` tokens: what utilisation against a matmul peak is computed from."""
        raise NotImplementedError
