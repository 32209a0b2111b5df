"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need", for translation.

    x_0 = sqrt(d) * E[tokens] + P[positions]                   (embeddings, then dropout)
    post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm:               x = x + Dropout(Sublayer(LayerNorm(x)))   (+ a final LayerNorm)
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V         (per head, h heads)
    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2

Attention goes through ``F.scaled_dot_product_attention`` (fused kernels on CPU and GPU).
Masks are boolean and True where attention is allowed, as SDPA expects; the only masks are
key-padding masks over the source (every source row has a real key: its EOS) and the causal
mask of the decoder, so no softmax row is ever fully masked and padding never yields NaN.

Incremental decoding keeps, per decoder layer, the cross-attention keys/values (computed once
per sentence by ``init_state``) and the self-attention keys/values of the prefix, grown by one
position a step (``torch.cat``; see ``DecoderState``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nmt.config import ModelConfig
from nmt.models.base import Seq2Seq

# ---------------------------------------------------------------------------- small pure helpers


def sinusoidal_positions(length: int, d_model: int) -> torch.Tensor:
    """P[pos, 2i] = sin(pos / 10000^(2i/d)),  P[pos, 2i+1] = cos(pos / 10000^(2i/d)).  -> (length, d)"""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angles = pos * inv_freq  # (L, ceil(d/2))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table


def subsequent_mask(size: int, device: torch.device | None = None) -> torch.Tensor:
    """(T, T) bool, True at [i, j] iff j <= i: position i may attend to itself and the past only.

    The decoder passes ``is_causal=True`` to SDPA instead (same mask, no tensor); this helper
    documents the mask and serves tests and callers that need it explicitly.
    """
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def key_padding_mask(src_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) True at real tokens -> (B, 1, 1, S), broadcast over heads and query positions."""
    return src_mask[:, None, None, :]


def split_heads(x: torch.Tensor, parts: int, heads: int) -> tuple[torch.Tensor, ...]:
    """(B, T, parts*D) -> ``parts`` views (B, H, T, D/H); no copy (SDPA accepts strided inputs)."""
    B, T, _ = x.shape
    return x.view(B, T, parts, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, hd) -> (B, T, H*hd)."""
    B, H, T, hd = x.shape
    return x.transpose(1, 2).reshape(B, T, H * hd)


# ---------------------------------------------------------------------------- sublayers


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused Q/K/V projection (d -> 3d)."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.d_model, self.dropout = heads, d_model, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), 3, self.heads)  # each (B, H, T, hd)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
        return self.out(merge_heads(y))  # (B, T, D)

    def step(self, x: torch.Tensor, cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One new position x (N, 1, D) attending to the cached prefix; cache (N, t, 2D) -> (N, t+1, 2D)."""
        qkv = self.qkv(x)  # (N, 1, 3D)
        D = self.d_model
        kv = qkv[..., D:] if cache is None else torch.cat([cache, qkv[..., D:]], dim=1)  # (N, t+1, 2D)
        (q,) = split_heads(qkv[..., :D], 1, self.heads)  # (N, H, 1, hd)
        k, v = split_heads(kv, 2, self.heads)  # (N, H, t+1, hd)
        y = F.scaled_dot_product_attention(q, k, v)  # the new position sees the whole prefix
        return self.out(merge_heads(y)), kv


class CrossAttention(nn.Module):
    """Multi-head attention from decoder queries to encoder memory; fused K/V projection (d -> 2d)."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def project_memory(self, memory: torch.Tensor) -> torch.Tensor:
        """Encoder output (B, S, D) -> keys and values (B, S, 2D); once per sentence."""
        return self.kv(memory)

    def forward(self, x: torch.Tensor, memory_kv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        (q,) = split_heads(self.q(x), 1, self.heads)  # (B, H, T, hd)
        k, v = split_heads(memory_kv, 2, self.heads)  # (B, H, S, hd)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(merge_heads(y))  # (B, T, D)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied at every position."""

    def __init__(self, d_model: int, ff_size: int):
        super().__init__()
        self.up = nn.Linear(d_model, ff_size)
        self.down = nn.Linear(ff_size, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)))


class Residual(nn.Module):
    """The residual connection around a sublayer, with its LayerNorm placed post or pre.

    Use as ``h = r.enter(x); h = sublayer(h); x = r.exit(x, h)``.
    """

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) if self.pre_norm else x

    def exit(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(h)
        return x if self.pre_norm else self.norm(x)


# ---------------------------------------------------------------------------- layers


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.ff = FeedForward(cfg.d_model, cfg.ff_size)
        self.res_attn = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_ff = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.res_attn.exit(x, self.attn(self.res_attn.enter(x), mask=mask))
        return self.res_ff.exit(x, self.ff(self.res_ff.enter(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.cross_attn = CrossAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.ff = FeedForward(cfg.d_model, cfg.ff_size)
        self.res_self = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_cross = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_ff = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: torch.Tensor, memory_kv: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        """Teacher forcing over the whole prefix: x (B, T, D), causal self-attention."""
        x = self.res_self.exit(x, self.self_attn(self.res_self.enter(x), causal=True))
        return self._cross_and_ff(x, memory_kv, memory_mask)

    def step(
        self, x: torch.Tensor, memory_kv: torch.Tensor, memory_mask: torch.Tensor, cache: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One position x (N, 1, D) with the self-attention cache of the prefix; returns the grown cache."""
        h, cache = self.self_attn.step(self.res_self.enter(x), cache)
        x = self.res_self.exit(x, h)
        return self._cross_and_ff(x, memory_kv, memory_mask), cache

    def _cross_and_ff(self, x: torch.Tensor, memory_kv: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        x = self.res_cross.exit(x, self.cross_attn(self.res_cross.enter(x), memory_kv, memory_mask))
        return self.res_ff.exit(x, self.ff(self.res_ff.enter(x)))


# ---------------------------------------------------------------------------- model


@dataclass
class EncoderOutput:
    states: torch.Tensor  # (B, S, D)
    mask: torch.Tensor  # (B, 1, 1, S) bool key-padding mask, True at real tokens


@dataclass
class DecoderState:
    """Everything one decoding step needs; every tensor has the hypotheses on dim 0."""

    memory_kv: list[torch.Tensor]  # per decoder layer: cross-attention keys|values (N, S, 2D), fixed
    self_kv: list[torch.Tensor | None]  # per decoder layer: self-attention keys|values (N, t, 2D); None at t=0
    memory_mask: torch.Tensor  # (N, 1, 1, S) bool
    step: int = 0  # t: the position of the next input token


class Transformer(Seq2Seq):
    def __init__(self, cfg: ModelConfig, src_vocab_size: int, trg_vocab_size: int, pad_id: int):
        super().__init__()
        if cfg.d_model % cfg.heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by {cfg.heads} heads")
        if cfg.tie_embeddings and src_vocab_size != trg_vocab_size:
            raise ValueError(
                f"tie_embeddings needs one shared vocabulary, got sizes {src_vocab_size} and {trg_vocab_size}"
            )
        self.cfg, self.pad_id, self.d_model = cfg, pad_id, cfg.d_model
        self.trg_embed = nn.Embedding(trg_vocab_size, cfg.d_model, padding_idx=pad_id)
        self.src_embed = (
            self.trg_embed if cfg.tie_embeddings else nn.Embedding(src_vocab_size, cfg.d_model, padding_idx=pad_id)
        )
        if cfg.positions == "learned":
            self.pos_embed = nn.Embedding(cfg.max_positions, cfg.d_model)
        else:
            self.pos_embed = None
            self.register_buffer("pos_table", sinusoidal_positions(cfg.max_positions, cfg.d_model), persistent=False)
        self.embed_drop = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.out_proj = None if cfg.tie_output else nn.Linear(cfg.d_model, trg_vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform linear weights, zero biases, N(0, d^-1/2) embeddings with a zero pad row."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, self.d_model**-0.5)
                if module.padding_idx is not None:
                    nn.init.zeros_(module.weight[module.padding_idx])

    # -- embeddings and output

    def positions(self, start: int, length: int) -> torch.Tensor:
        """Position encodings for positions start .. start+length-1 -> (length, D)."""
        end = start + length
        if self.pos_embed is not None:
            if end > self.cfg.max_positions:
                raise ValueError(f"position {end - 1} exceeds model.max_positions {self.cfg.max_positions}")
            return self.pos_embed.weight[start:end]
        if end > self.pos_table.shape[0]:  # sinusoids extend to any length
            self.pos_table = sinusoidal_positions(2 * end, self.d_model).to(self.pos_table.device)
        return self.pos_table[start:end]

    def embed(self, embedding: nn.Embedding, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """(B, T) ids -> (B, T, D) = dropout(sqrt(d) * E[ids] + P[start:start+T])."""
        x = embedding(tokens) * math.sqrt(self.d_model) + self.positions(start, tokens.shape[1])
        return self.embed_drop(x)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V) logits; with tie_output the target embedding matrix is the projection."""
        return F.linear(h, self.trg_embed.weight) if self.out_proj is None else self.out_proj(h)

    # -- Seq2Seq interface

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> EncoderOutput:
        mask = key_padding_mask(src_mask)  # (B, 1, 1, S)
        x = self.embed(self.src_embed, src)  # (B, S, D)
        for layer in self.encoder:
            x = layer(x, mask)
        return EncoderOutput(self.encoder_norm(x), mask)

    def decode(self, memory: EncoderOutput, trg_in: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.trg_embed, trg_in)  # (B, T, D)
        for layer in self.decoder:
            x = layer(x, layer.cross_attn.project_memory(memory.states), memory.mask)
        return self.project(self.decoder_norm(x))  # (B, T, V)

    def init_state(self, memory: EncoderOutput) -> DecoderState:
        memory_kv = [layer.cross_attn.project_memory(memory.states) for layer in self.decoder]
        return DecoderState(memory_kv, [None] * len(self.decoder), memory.mask, 0)

    def decode_step(self, prev_tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        x = self.embed(self.trg_embed, prev_tokens[:, None], start=state.step)  # (N, 1, D)
        self_kv = []
        for layer, memory_kv, cache in zip(self.decoder, state.memory_kv, state.self_kv):
            x, cache = layer.step(x, memory_kv, state.memory_mask, cache)
            self_kv.append(cache)
        logits = self.project(self.decoder_norm(x[:, 0]))  # (N, V)
        return logits, DecoderState(state.memory_kv, self_kv, state.memory_mask, state.step + 1)

    def reorder_state(self, state: DecoderState, index: torch.Tensor) -> DecoderState:
        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, index)

        return DecoderState(
            [pick(kv) for kv in state.memory_kv],
            [pick(kv) for kv in state.self_kv],
            state.memory_mask.index_select(0, index),
            state.step,
        )

    # -- accounting

    def num_parameters(self) -> int:
        """Trainable parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def flops_per_token(self, src_len: float, trg_len: float) -> float:
        """Approximate training FLOPs per target token for sentence pairs of these lengths.

        FLOPs = 6 x multiply-accumulates (2 per MAC, x3 for forward + backward), with
          encoder, per source token and layer:  4 d^2 (Q,K,V,O) + 2 d f (FFN) + 2 S d (scores, mix)
          decoder, per target token and layer:  4 d^2 + T d (causal self-attention, half of 2 T d)
                                                + 2 d^2 (cross Q, O) + 2 d^2 S/T (cross K, V over memory)
                                                + 2 S d + 2 d f
          output projection per target token:   d V
        The encoder cost is spread over the T target tokens of the pair (factor S/T).
        """
        d, f, S, T = self.d_model, self.cfg.ff_size, float(src_len), float(trg_len)
        enc = len(self.encoder) * (4 * d * d + 2 * d * f + 2 * S * d)
        dec = len(self.decoder) * (4 * d * d + T * d + 2 * d * d + 2 * d * d * S / T + 2 * S * d + 2 * d * f)
        out = d * self.trg_embed.num_embeddings
        return 6.0 * (enc * S / T + dec + out)
