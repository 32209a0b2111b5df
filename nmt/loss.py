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


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Forward: per-token H(q, p) and -log p(y). Backward in one pass: dH/dlogits = p - q.

    Autograd through log_softmax, gather and sum would build three (N, V) tensors in the
    backward pass (a dense scatter for the gather among them); the closed form needs one, written
    in place over the saved log-probabilities.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, keep: torch.Tensor, smoothing: float):
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # (N, V)
        nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)  # (N,)
        loss = (1.0 - smoothing) * nll - (smoothing / lprobs.shape[-1]) * lprobs.sum(-1)  # (N,)
        loss, nll = loss * keep, nll * keep
        ctx.save_for_backward(lprobs, target, keep)
        ctx.smoothing, ctx.logits_dtype = smoothing, logits.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        lprobs, target, keep = ctx.saved_tensors
        eps, vocab = ctx.smoothing, lprobs.shape[-1]
        grad = lprobs.exp_()  # p, (N, V), reusing the saved buffer
        grad.sub_(eps / vocab)
        grad.scatter_add_(-1, target[:, None], torch.full_like(grad[:, :1], -(1.0 - eps)))
        grad.mul_((grad_loss * keep)[:, None])
        return grad.to(ctx.logits_dtype), None, None, None


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, T, V) in any float dtype, target (B, T) -> (loss_sum, nll_sum), fp32 scalars.

    Both sums run over the tokens with target != pad_id; ``nll_sum`` is the plain negative
    log-likelihood (for perplexity), ``loss_sum`` the label-smoothed loss H(q, p) above.
    log_softmax is computed in fp32 even when the logits are bf16/fp16.
    """
    V = logits.shape[-1]
    target = target.reshape(-1)
    keep = (target != pad_id).float()  # (N,)
    loss, nll = _SmoothedCrossEntropy.apply(logits.reshape(-1, V), target, keep, smoothing)
    return loss.sum(), nll.sum()
