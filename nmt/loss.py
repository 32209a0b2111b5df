"""Label-smoothed cross-entropy (Szegedy et al., 2016, "Rethinking the Inception Architecture").

The target distribution for a gold token y over a vocabulary of V types is

    q(k) = (1 - eps) * [k == y] + eps / V          for every k in 0..V-1,

i.e. the smoothing mass is spread uniformly over the WHOLE vocabulary, the pad column and the
gold column included (so q(y) = 1 - eps + eps/V). The loss per token is the cross-entropy

    H(q, p) = -sum_k q(k) log p(k) = (1 - eps) * (-log p(y)) + (eps / V) * (-sum_k log p(k)),

which needs only one log_softmax, one gather and one row sum: no dense one-hot tensor.

Training calls ``teacher_forced_loss``. In fp32 on a CPU it applies the model's output layer
itself, block of rows by block, so that the (N, V) logits never exist whole
(``projected_label_smoothed_nll``); elsewhere the model makes the logits and
``label_smoothed_nll`` takes them.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from nmt.models.linear import onednn_affine, onednn_mm, onednn_rows_product


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


def _exp_in_place(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Overwrite fp32 logits z (rows, V) with e = exp(z - max) row by row; return sum_k e_k and the
    log-sum-exp of the original logits, each (rows,)."""
    top = z.amax(dim=-1, keepdim=True)
    exp_sum = z.sub_(top).exp_().sum(-1)
    return exp_sum, top.squeeze(-1) + exp_sum.log()


def _exp_to_gradient(
    e: torch.Tensor, exp_sum: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, smoothing: float
) -> None:
    """Turn e = exp(z - max) (rows, V) in place into weight * (p - q): p = e / exp_sum,
    q = (1 - eps) [k == y] + eps / V; target (rows, 1), weight (rows,). A multiply and a subtract
    are 2.5x faster than one addcmul."""
    vocab = e.shape[-1]
    e.mul_((weight / exp_sum)[:, None]).sub_((weight * (smoothing / vocab))[:, None])
    e.scatter_add_(-1, target, (weight * -(1.0 - smoothing))[:, None])


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
                exp_sum[i:j], lse[i:j] = _exp_in_place(z)
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
            for i, j in _row_chunks(logits.shape[0], vocab, logits.device.type):
                _exp_to_gradient(logits[i:j], norm[i:j], target[i:j, None], weight[i:j], eps)
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


def projection_block_rows(vocab: int) -> int:
    """Rows per block when the output layer and the loss run together (``projected_label_smoothed_nll``):
    about 16 MB of fp32 logits, and 256 to 1024 rows, so that each block's three matrix products
    stay large enough to run near the matmul peak."""
    return min(1024, max(256, (1 << 22) // vocab))


def _block_loss(z, target, keep, smoothing: float, losses, nlls, gradient: bool) -> None:
    """Per-token H(q, p) and -log p(y) of fp32 logits ``z`` (rows, V), target (rows, 1) and keep
    (rows,) into ``losses`` and ``nlls``; with ``gradient``, z is overwritten by keep * (p - q).
    Pieces of about 2 MB (``fp32_block_rows``) go through all their passes over the vocabulary while
    in cache; the arithmetic on one number per row is done once for the block, not per piece (a
    thousand small operations fewer per update at 4,000 tokens)."""
    rows, vocab = z.shape
    picked = z.gather(1, target).squeeze(1)  # z_y, before z is overwritten
    row_sum, exp_sum, top = z.new_empty(rows), z.new_empty(rows), z.new_empty(rows, 1)
    for a, b in _row_chunks(rows, vocab, "cpu"):
        zz = z[a:b]
        torch.sum(zz, 1, out=row_sum[a:b])
        torch.amax(zz, 1, keepdim=True, out=top[a:b])
        torch.sum(zz.sub_(top[a:b]).exp_(), 1, out=exp_sum[a:b])  # e = exp(z - max) in place
        if gradient:
            _exp_to_gradient(zz, exp_sum[a:b], target[a:b], keep[a:b], smoothing)
    lse = top.squeeze(1) + exp_sum.log()
    nll = lse - picked
    torch.mul((1.0 - smoothing) * nll + (smoothing / vocab) * (vocab * lse - row_sum), keep, out=losses)
    torch.mul(nll, keep, out=nlls)


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The output layer z = h W^T + b and ``_SmoothedCrossEntropy`` together, block of rows by block.

    Each block's logits are made, turned into their loss and their gradient p - q, and consumed by
    the two gradient products (dh = (p - q) W, dW += (p - q)^T h) while they are still in cache, so
    the (N, V) logits never exist whole: on a 2-core Xeon (model 167; fp32, 4,000 tokens, V = 8,000) the
    projection and loss take 20-25% less time than a whole product followed by the loss (14% with
    AVX2 only). The gradients are computed in the forward pass for a loss weight of 1 per token and
    scaled by the incoming gradient in the backward pass: the graph can be backpropagated once only.
    With ``fp32_matmul`` "onednn" all three products are oneDNN's. It writes each block's share of
    dW anew, to be added, where the BLAS adds it in place, and is still faster: on a 2-core AMD EPYC
    (512-1,024 rows, V = 8,000, D = 256) 432-461 GFLOP/s with the sum against MKL's 232.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, keep, smoothing: float, fp32_matmul: str):
        n_rows, vocab = hidden.shape[0], weight.shape[0]
        onednn = fp32_matmul == "onednn"
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        losses = hidden.new_empty(n_rows)
        nlls = hidden.new_empty(n_rows)
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.empty_like(weight) if want_weight and not onednn else None
        grad_bias = torch.zeros_like(bias) if want_bias else None
        step = projection_block_rows(vocab)
        want_any = want_hidden or want_weight or want_bias
        block = None if onednn else hidden.new_empty(min(step, n_rows), vocab)
        for i in range(0, n_rows, step):
            j = min(i + step, n_rows)
            h, t, k = hidden[i:j], target[i:j, None], keep[i:j]
            if onednn:  # (rows, V) logits
                z = onednn_affine(h, weight, bias)
            else:
                z = torch.mm(h, weight.t(), out=block[: j - i])
                if bias is not None:
                    z.add_(bias)
            _block_loss(z, t, k, smoothing, losses[i:j], nlls[i:j], gradient=want_any)
            if not want_any:
                continue
            if want_hidden:
                if onednn:
                    grad_hidden[i:j] = onednn_mm(z, weight)
                else:
                    torch.mm(z, weight, out=grad_hidden[i:j])
            if want_weight and onednn:  # a (V, D) view of a (D, V) product, as every block's share
                grad_weight = onednn_rows_product(z, h) if i == 0 else grad_weight.add_(onednn_rows_product(z, h))
            elif want_weight:
                torch.mm(z.t(), h, out=grad_weight) if i == 0 else grad_weight.addmm_(z.t(), h)
            if want_bias:
                grad_bias += z.sum(0)
        ctx.grads = (grad_hidden, grad_weight, grad_bias)
        nll_sum = nlls.sum()
        ctx.mark_non_differentiable(nll_sum)
        return losses.sum(), nll_sum

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        grads, ctx.grads = ctx.grads, None
        return (*(None if g is None else g.mul_(grad_loss) for g in grads), None, None, None, None)


def projected_label_smoothed_nll(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    smoothing: float,
    pad_id: int,
    fp32_matmul: str = "blas",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``label_smoothed_nll`` of the logits features W^T + b, without ever making all of them.

    features (B, T, D) fp32, weight (V, D), bias (V,) or None, target (B, T) -> (loss_sum, nll_sum).
    Training in fp32 on a CPU uses it (see ``_ProjectedSmoothedCrossEntropy``); its gradient is
    computed with the loss, so the graph can be backpropagated once only.
    """
    target = target.reshape(-1)
    keep = (target != pad_id).to(features.dtype)
    return _ProjectedSmoothedCrossEntropy.apply(
        features.reshape(-1, features.shape[-1]), weight, bias, target, keep, smoothing, fp32_matmul
    )


def projects_with_loss(device_type: str, precision_name: str) -> bool:
    """Whether training applies the output layer inside the loss (``projected_label_smoothed_nll``):
    in fp32 on a CPU, where the logits' trips through memory cost most. Elsewhere the model makes
    the logits (under autocast, in the precision chosen for the product)."""
    return device_type == "cpu" and precision_name == "fp32"


def teacher_forced_loss(model, forward, batch, smoothing: float, pad_id: int, precision) -> tuple[torch.Tensor, ...]:
    """(loss_sum, nll_sum) of ``batch`` under teacher forcing, as one training step computes them.

    ``forward`` is the model's call (the model itself, or its DDP or compiled wrapper), ``model``
    the bare model, whose ``output_layer`` the loss then applies on fp32 CPUs. The logits'
    gradient is written over them (``reuse_logits``): backpropagate once.
    """
    if projects_with_loss(batch.src.device.type, precision.name):
        features = forward(batch.src, batch.src_mask, batch.trg_in, features_only=True)
        weight, bias = model.output_layer()
        return projected_label_smoothed_nll(features, weight, bias, batch.trg_out, smoothing, pad_id, model.fp32_matmul)
    with precision.autocast():
        logits = forward(batch.src, batch.src_mask, batch.trg_in)
    return label_smoothed_nll(logits, batch.trg_out, smoothing, pad_id, reuse_logits=True)
