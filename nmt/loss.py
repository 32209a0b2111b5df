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


def fp32_block_rows(vocab: int, device_type: str) -> int:
    """Rows of logits to take at a time for fp32 work over the vocabulary (here and in search).

    On a CPU a block's fp32 copy (rows x vocab x 4 bytes) stays about 2 MB, so it runs in cache
    instead of streaming an (N, V) fp32 tensor through memory (2-3x faster). A GPU wants few, large
    kernels instead: blocks of up to 256 MB, which only bound the temporary memory (a 32k vocabulary
    would otherwise mean 16-row blocks: thousands of launches per step).
    """
    budget = 1 << 19 if device_type == "cpu" else 1 << 26
    return max(1, budget // vocab)


def _row_chunks(n_rows: int, vocab: int, device_type: str):
    step = fp32_block_rows(vocab, device_type)
    return ((i, min(i + step, n_rows)) for i in range(0, n_rows, step))


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Forward: per-token H(q, p) and -log p(y) from fp32 log-sum-exps. Backward in one pass:
    dH/dlogits = p - q, computed chunk by chunk from the saved logits and log-sum-exps.

    Autograd through log_softmax, gather and sum would keep an (N, V) fp32 tensor and build
    three more in the backward pass; this keeps only the logits and N log-sum-exps.

    With ``reuse_logits`` the gradient is written over the saved logits (as Megatron-LM's
    vocabulary-parallel cross-entropy does), block by block while each block is in cache: no second
    (N, V) tensor is allocated and streamed through memory. The graph can then be backpropagated
    once only, and the caller must not read the logits after the loss. fp32 logits then already
    hold exp(z - max) after the forward pass, which computed it for the log-sum-exp anyway: the
    backward pass scales it into p - q in one pass instead of computing the exponentials again.
    """

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, target: torch.Tensor, keep: torch.Tensor, smoothing: float, reuse_logits: bool
    ):
        n_rows, vocab = logits.shape
        exp_in_place = reuse_logits and logits.dtype == torch.float32
        lse = logits.new_empty(n_rows, dtype=torch.float32)  # log sum_k exp(z_k)
        row_sum = logits.new_empty(n_rows, dtype=torch.float32)  # sum_k z_k
        picked = logits.gather(-1, target[:, None]).squeeze(-1).float()  # z_y, before the logits are overwritten
        exp_sum = logits.new_empty(n_rows, dtype=torch.float32) if exp_in_place else None  # sum_k exp(z_k - max)
        for i, j in _row_chunks(n_rows, vocab, logits.device.type):
            z = logits[i:j].float()  # (rows, V)
            torch.sum(z, dim=-1, out=row_sum[i:j])
            if exp_in_place:  # z is the logits' own block: keep exp(z - max) in it for the backward pass
                top = z.amax(dim=-1, keepdim=True)
                torch.sum(z.sub_(top).exp_(), dim=-1, out=exp_sum[i:j])
                torch.add(top.squeeze(-1), exp_sum[i:j].log(), out=lse[i:j])
            else:
                torch.logsumexp(z, dim=-1, out=lse[i:j])
        nll = lse - picked  # -log p(y)
        uniform = vocab * lse - row_sum  # -sum_k log p(k)
        loss = ((1.0 - smoothing) * nll + (smoothing / vocab) * uniform) * keep
        nll = nll * keep
        ctx.save_for_backward(logits, target, keep, exp_sum if exp_in_place else lse)
        ctx.smoothing, ctx.reuse_logits, ctx.exp_in_place = smoothing, reuse_logits, exp_in_place
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        logits, target, keep, norm = ctx.saved_tensors
        eps, vocab = ctx.smoothing, logits.shape[-1]
        weight = grad_loss * keep  # (N,)
        if ctx.exp_in_place:  # logits hold e = exp(z - max), norm = sum e: p - eps/V = e / norm - eps/V
            scale, shift = (weight / norm)[:, None], (weight * (eps / vocab))[:, None]
            for i, j in _row_chunks(logits.shape[0], vocab, logits.device.type):
                g = logits[i:j].mul_(scale[i:j]).sub_(shift[i:j])  # w (p - eps/V); 2.5x faster than one addcmul
                g.scatter_add_(-1, target[i:j, None], weight[i:j, None] * -(1.0 - eps))
            return logits, None, None, None, None
        lse = norm
        grad = logits if ctx.reuse_logits else torch.empty_like(logits)
        in_place = grad.dtype == torch.float32  # then p goes straight into the gradient: no temporary, no copy
        for i, j in _row_chunks(logits.shape[0], vocab, logits.device.type):
            z = logits[i:j]
            g = torch.sub(z, lse[i:j, None], out=grad[i:j]) if in_place else z.float() - lse[i:j, None]
            g.exp_().sub_(eps / vocab)  # p - eps/V, (rows, V) in fp32
            g.scatter_add_(-1, target[i:j, None], torch.full_like(g[:, :1], -(1.0 - eps)))
            g.mul_(weight[i:j, None])
            if not in_place:
                grad[i:j] = g
        return grad, None, None, None, None


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int, reuse_logits: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, T, V) in any float dtype, target (B, T) -> (loss_sum, nll_sum), fp32 scalars.

    Both sums run over the tokens with target != pad_id; ``nll_sum`` is the plain negative
    log-likelihood (for perplexity), ``loss_sum`` the label-smoothed loss H(q, p) above.
    log_softmax is computed in fp32 even when the logits are bf16/fp16. ``reuse_logits``: the
    backward pass overwrites ``logits`` with their gradient (training, where nothing reads them
    again; see ``_SmoothedCrossEntropy``).
    """
    V = logits.shape[-1]
    target = target.reshape(-1)
    keep = (target != pad_id).float()  # (N,)
    loss, nll = _SmoothedCrossEntropy.apply(logits.reshape(-1, V), target, keep, smoothing, reuse_logits)
    return loss.sum(), nll.sum()
