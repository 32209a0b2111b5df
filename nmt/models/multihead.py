"""Multi-head attention (Vaswani et al., 2017, section 3.2), the Transformer's sublayers:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V                 per head
    MultiHead(x) = Concat(head_1, ..., head_h) W_O,  head_i = Attention(x W_Q_i, x W_K_i, x W_V_i)

computed through ``F.scaled_dot_product_attention`` or the explicit formula, whichever was measured
faster for the device and precision (see ``attention`` and nmt/kernel_timing.py). Masks are boolean and
True where attention is allowed, as SDPA expects; the only masks are key-padding masks over the
source (every source row has a real key: its EOS) and the causal mask of the decoder, so no softmax
row is ever fully masked and padding never yields NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nmt.models.dropout import dropout
from nmt.models.linear import Linear


def subsequent_mask(size: int, device: torch.device | None = None) -> torch.Tensor:
    """(T, T) bool, True at [i, j] iff j <= i: position i may attend to itself and the past only.

    The decoder passes ``is_causal=True`` to SDPA instead (same mask, no tensor); this helper
    documents the mask and serves tests and callers that need it explicitly.
    """
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def key_padding_mask(src_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) True at real tokens -> (B, 1, 1, S), broadcast over heads and query positions."""
    return src_mask[:, None, None, :]


class Packing:
    """The real (non-padding) slots of a (B, S) batch as flat row indices, ascending.

    On a CPU the encoder computes its linear layers, norms and dropouts on these N rows only:
    the time there is proportional to rows, and a length-sorted batch of 4096 tokens still has
    about 12% padding on the source side (Multi30k). Attention needs the (B, S) layout, so it
    unpacks around itself: padding slots then hold zeros, which the key-padding mask hides.
    """

    def __init__(self, src_mask: torch.Tensor):
        self.batch, self.length = src_mask.shape
        flat = src_mask.reshape(-1)
        self.rows = flat.nonzero().squeeze(1)  # (N,)
        self.padding = (~flat).nonzero().squeeze(1)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, C) -> (N, C), the real slots."""
        return x.reshape(self.batch * self.length, x.shape[-1]).index_select(0, self.rows)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C) -> (B, S, C), zeros at padding."""
        return _Unpack.apply(x, self).view(self.batch, self.length, x.shape[-1])


class _Unpack(torch.autograd.Function):
    """(N, C) -> (B*S, C): writes zeros into the padding rows only, not a whole zero tensor first."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, packing: Packing) -> torch.Tensor:
        ctx.rows = packing.rows
        out = x.new_empty(packing.batch * packing.length, x.shape[-1])
        out.index_fill_(0, packing.padding, 0.0)
        return out.index_copy_(0, packing.rows, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.index_select(0, ctx.rows), None


def split_heads(x: torch.Tensor, parts: int, heads: int) -> tuple[torch.Tensor, ...]:
    """(B, T, parts*D) -> ``parts`` views (B, H, T, D/H); no copy (SDPA accepts strided inputs)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _SplitHeads.apply(x, parts, heads)
    return _head_views(x, parts, heads)


def _head_views(x: torch.Tensor, parts: int, heads: int) -> tuple[torch.Tensor, ...]:
    B, T, _ = x.shape
    return x.view(B, T, parts, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


class _SplitHeads(torch.autograd.Function):
    """``split_heads`` with a backward that writes the parts' gradients straight into one (B, T, parts*D)
    tensor: one pass, where autograd through view/permute/unbind stacks them and then copies the
    stack into the projection's layout (two passes, about 2% of an fp32 CPU training step)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, parts: int, heads: int):
        ctx.parts = parts
        ctx.set_materialize_grads(False)  # a part without a gradient is zeroed in place, not handed over as zeros
        return _head_views(x, parts, heads)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        present = next(g for g in grads if g is not None)
        B, H, T, hd = present.shape
        out = present.new_empty(B, T, ctx.parts, H, hd)
        for i, g in enumerate(grads):
            part = out.select(2, i)  # (B, T, H, hd)
            part.zero_() if g is None else part.copy_(g.transpose(1, 2))
        return out.view(B, T, ctx.parts * H * hd), None, None


def select_and_append(cache: torch.Tensor, index: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """cat([cache[index], new], dim=2): cache (N, H, t, hd), index (N',) or None, new (N', H, 1, hd).

    -> (N', H, t+1, hd), contiguous. With an index the rows are gathered straight into the grown
    buffer: one pass over the cache instead of two (index_select, then cat); beam search
    reorders the cache every step.
    """
    if index is None:
        return torch.cat([cache, new], dim=2)
    N, H, t, hd = new.shape[0], cache.shape[1], cache.shape[2], cache.shape[3]
    out = cache.new_empty(N, H, t + 1, hd)
    torch.index_select(cache, 0, index, out=out[:, :, :t])
    out[:, :, t:] = new
    return out


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    causal: bool = False,
    kernel: str = "sdpa",
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(hd) + mask) V: q (B, H, Tq, hd), k and v (B, H, Tk, hd) -> (B, H, Tq, hd).

    ``kernel`` "sdpa" is PyTorch's fused ``scaled_dot_product_attention``; "explicit" is the
    formula itself, two batched matmuls and a softmax in fp32. Which is faster depends on the
    device and the precision (on one AMX CPU: SDPA 1.7x faster in fp32, 5.6x slower in bf16, for
    training at NMT's short lengths), so ``auto`` measures it (nmt/kernel_timing.py).
    """
    if kernel == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
    weights = attention_weights(q, k, mask, causal).to(v.dtype)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return weights @ v


def attention_weights(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(hd) + mask) in fp32: q (B, H, Tq, hd), k (B, H, Tk, hd) -> (B, H, Tq, Tk).
    Each row sums to 1; masked keys get exactly 0."""
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # (B, H, Tq, Tk)
    if causal:
        Tq, Tk = scores.shape[-2:]
        future = ~subsequent_mask(Tk, scores.device)[Tk - Tq :]  # (Tq, Tk), True where j > i
        scores = scores.masked_fill(future, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, hd) -> (B, T, H*hd)."""
    B, H, T, hd = x.shape
    return x.transpose(1, 2).reshape(B, T, H * hd)


# ---------------------------------------------------------------------------- sublayers

KV = tuple[torch.Tensor, torch.Tensor]  # keys and values, each (B, H, T, hd)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused Q/K/V projection (d -> 3d)."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.d_model, self.dropout = heads, d_model, dropout
        self.kernel = "sdpa"  # see ``attention``; set by Transformer.set_attention_kernel
        self.qkv = Linear(d_model, 3 * d_model)
        self.out = Linear(d_model, d_model)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False, packing: Packing | None = None
    ) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D); or, with ``packing``, the real rows (N, D) -> (N, D)."""
        qkv = self.qkv(x)
        if packing is not None:
            qkv = packing.unpack(qkv)
        q, k, v = split_heads(qkv, 3, self.heads)  # each (B, H, T, hd)
        p = self.dropout if self.training else 0.0
        y = merge_heads(attention(q, k, v, mask, p, causal, self.kernel))  # (B, T, D)
        return self.out(y if packing is None else packing.pack(y))

    def step(self, x: torch.Tensor, cache: KV | None, index: torch.Tensor | None) -> tuple[torch.Tensor, KV]:
        """One new position x (N, 1, D) attending to the prefix: cache[index] (N, H, t, hd) -> (N, H, t+1, hd).

        The caches are head-major and contiguous, so the attention matmuls read them in place.
        """
        q, k, v = split_heads(self.qkv(x), 3, self.heads)  # each (N, H, 1, hd)
        if cache is None:
            k, v = k.contiguous(), v.contiguous()
        else:
            k, v = select_and_append(cache[0], index, k), select_and_append(cache[1], index, v)  # (N, H, t+1, hd)
        y = attention(q, k, v, kernel=self.kernel)  # (N, H, 1, hd): the new position sees the whole prefix
        return self.out(merge_heads(y)), (k, v)


class CrossAttention(nn.Module):
    """Multi-head attention from decoder queries to encoder memory; fused K/V projection (d -> 2d)."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.kernel = "sdpa"  # see ``attention``; set by Transformer.set_attention_kernel
        self.q = Linear(d_model, d_model)
        self.kv = Linear(d_model, 2 * d_model)
        self.out = Linear(d_model, d_model)

    def project_memory(self, memory: torch.Tensor, packing: Packing | None = None) -> KV:
        """Encoder output (B, S, D), or its real rows (N, D) with ``packing`` -> keys and values,
        views (B, H, S, hd); once per sentence."""
        kv = self.kv(memory)
        k, v = split_heads(kv if packing is None else packing.unpack(kv), 2, self.heads)
        return k, v

    def forward(self, x: torch.Tensor, memory_kv: KV, mask: torch.Tensor) -> torch.Tensor:
        (q,) = split_heads(self.q(x), 1, self.heads)  # (B, H, T, hd)
        k, v = memory_kv  # (B, H, S, hd)
        p = self.dropout if self.training else 0.0
        y = attention(q, k, v, mask, p, kernel=self.kernel)  # (B, H, T, hd)
        return self.out(merge_heads(y))  # (B, T, D)

    def forward_with_weights(self, x: torch.Tensor, memory_kv: KV, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``forward`` in eval mode, by the explicit formula, also returning the weights it used:
        (B, T, D) and (B, H, T, S) fp32 (attention maps)."""
        (q,) = split_heads(self.q(x), 1, self.heads)
        k, v = memory_kv
        weights = attention_weights(q, k, mask)  # (B, H, T, S)
        return self.out(merge_heads(weights.to(v.dtype) @ v)), weights
