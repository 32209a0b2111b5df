"""Label-smoothed cross-entropy (Szegedy et al., 2016, "Rethinking the Inception Architecture").

The target distribution for a gold token y over a vocabulary of V types is

    q(k) = (1 - eps) * [k == y] + eps / V          for every k in 0..V-1,

i.e. the smoothing mass is spread uniformly over the WHOLE vocabulary, the pad column and the
gold column included (so q(y) = 1 - eps + eps/V). The loss per token is the cross-entropy

    H(q, p) = -sum_k q(k) log p(k) = (1 - eps) * (-log p(y)) + (eps / V) * (-sum_k log p(k)),

which needs only one log_softmax, one gather and one row sum: no dense one-hot tensor.
"""

from __future__ import annotations

import torch


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, T, V) in any float dtype, target (B, T) -> (loss_sum, nll_sum), fp32 scalars.

    Both sums run over the tokens with target != pad_id; ``nll_sum`` is the plain negative
    log-likelihood (for perplexity), ``loss_sum`` the label-smoothed loss H(q, p) above.
    log_softmax is computed in fp32 even when the logits are bf16/fp16.
    """
    lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # (B, T, V)
    keep = target != pad_id  # (B, T)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    if smoothing == 0.0:
        return nll_sum, nll_sum
    uniform = -lprobs.sum(dim=-1)  # (B, T): -sum_k log p(k)
    uniform_sum = uniform.masked_fill(~keep, 0.0).sum()
    vocab = lprobs.shape[-1]
    loss_sum = (1.0 - smoothing) * nll_sum + (smoothing / vocab) * uniform_sum
    return loss_sum, nll_sum
