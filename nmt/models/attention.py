"""Attention for the RNN decoder: dot, general (bilinear) and MLP (additive) scoring.

Given a query q (the decoder state) and keys k_1..k_S (the encoder states), every kind computes

    e_s = score(q, k_s)
    a   = softmax(e masked at padding)        # a_s = 0 at padding, sum_s a_s = 1
    c   = sum_s a_s k_s                        # the context vector

and they differ only in the score:

    dot:                score = qᵀ k                        (Luong et al., 2015)
    general / bilinear: score = qᵀ W k                      (Luong et al., 2015)
    mlp / additive:     score = vᵀ tanh(W₁ q + W₂ k + b)    (Bahdanau et al., 2015)

The part that depends only on the keys (W k, W₂ k + b) is computed once per sentence by
``precompute_keys`` and reused at every decoder step, so a step costs one small matmul and one
weighted sum. Queries may be one step [B, Hq] or a whole sequence [B, T, Hq] (decoders without
input feeding attend for all target positions at once).
"""

from __future__ import annotations

import torch
from torch import nn


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis in fp32, exactly 0 where ``mask`` is False.

    scores (B, T, S), mask (B, S) True at real keys -> weights (B, T, S) float32.
    The dtype's minimum rather than -inf keeps a (degenerate) all-padding row finite.
    """
    scores = scores.float().masked_fill(~mask[:, None, :], torch.finfo(torch.float32).min)
    return scores.softmax(dim=-1)


def weighted_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """c_t = sum_s a_ts v_s: weights (B, T, S), values (B, S, H) -> (B, T, H)."""
    return torch.bmm(weights.to(values.dtype), values)


class Attention(nn.Module):
    """Base class: subclasses define ``precompute_keys`` and ``score``."""

    def precompute_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, S, Hk) -> what ``score`` needs of them, computed once per sentence."""
        raise NotImplementedError

    def score(self, query: torch.Tensor, projected_keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, Hq), projected keys (B, S, *) -> unnormalised scores (B, T, S)."""
        raise NotImplementedError

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, projected_keys: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Hq) or (B, T, Hq) -> context (B, [T,] Hk) and weights (B, [T,] S) in fp32."""
        one_step = query.dim() == 2
        if one_step:
            query = query.unsqueeze(1)  # (B, 1, Hq)
        weights = masked_softmax(self.score(query, projected_keys), mask)  # (B, T, S)
        context = weighted_sum(weights, keys)  # (B, T, Hk)
        if one_step:
            return context.squeeze(1), weights.squeeze(1)
        return context, weights


class DotAttention(Attention):
    """score = qᵀ k; no parameters, needs query and key of the same size."""

    def precompute_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return keys

    def score(self, query: torch.Tensor, projected_keys: torch.Tensor) -> torch.Tensor:
        return torch.bmm(query, projected_keys.transpose(1, 2))  # (B, T, Hq) @ (B, Hq, S)


class BilinearAttention(Attention):
    """score = qᵀ W k, with W k precomputed: (B, S, Hk) -> (B, S, Hq)."""

    def __init__(self, query_size: int, key_size: int):
        super().__init__()
        self.key_proj = nn.Linear(key_size, query_size, bias=False)  # W

    def precompute_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return self.key_proj(keys)  # (B, S, Hq)

    def score(self, query: torch.Tensor, projected_keys: torch.Tensor) -> torch.Tensor:
        return torch.bmm(query, projected_keys.transpose(1, 2))  # (B, T, Hq) @ (B, Hq, S)


class AdditiveAttention(Attention):
    """score = vᵀ tanh(W₁ q + W₂ k + b), with W₂ k + b precomputed: (B, S, Hk) -> (B, S, D)."""

    def __init__(self, query_size: int, key_size: int, hidden_size: int):
        super().__init__()
        self.query_proj = nn.Linear(query_size, hidden_size, bias=False)  # W₁
        self.key_proj = nn.Linear(key_size, hidden_size, bias=True)  # W₂, b
        self.v = nn.Linear(hidden_size, 1, bias=False)  # v

    def precompute_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return self.key_proj(keys)  # (B, S, D)

    def score(self, query: torch.Tensor, projected_keys: torch.Tensor) -> torch.Tensor:
        q = self.query_proj(query)  # (B, T, D)
        hidden = torch.tanh(q[:, :, None, :] + projected_keys[:, None, :, :])  # (B, T, S, D)
        return self.v(hidden).squeeze(-1)  # (B, T, S)


# Other names of a score in the literature: each builds the module (parameters named alike) of the one it maps to.
SYNONYMS = {"bilinear": "general", "additive": "mlp"}


def attention_kind(name: str) -> str:
    """The scoring function ``name`` builds: 'bilinear' is 'general', 'additive' is 'mlp'."""
    return SYNONYMS.get(name, name)


def make_attention(kind: str, query_size: int, key_size: int, hidden_size: int) -> Attention:
    """Build the scoring function named ``kind`` (dot, general/bilinear, mlp/additive)."""
    name, kind = kind, attention_kind(kind)
    if kind == "dot":
        if query_size != key_size:
            raise ValueError(
                f"dot attention needs query and key of the same size, got {query_size} and {key_size} "
                "(a bidirectional encoder doubles the key size: use 'general' or 'mlp' attention)"
            )
        return DotAttention()
    if kind == "general":
        return BilinearAttention(query_size, key_size)
    if kind == "mlp":
        return AdditiveAttention(query_size, key_size, hidden_size)
    raise ValueError(f"unknown attention kind {name!r}: expected dot, general, bilinear, mlp or additive")
