"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need", for translation.

    x_0 = sqrt(d) * E[tokens] + P[positions]                   (embeddings, then dropout)
    post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm:               x = x + Dropout(Sublayer(LayerNorm(x)))   (+ a final LayerNorm)
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V         (per head, h heads; multihead.py)
    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2

Incremental decoding keeps, per decoder layer, the cross-attention keys/values (computed once
per sentence by ``init_state``) and the self-attention keys/values of the prefix, grown by one
position a step (a fresh buffer each step, measured faster on CPU than preallocating, since beam
search must gather the rows anyway; see ``DecoderState`` and ``select_and_append``).

On a CPU the encoder computes on the real source positions only, not on the padding of a batch
(``Packing`` in multihead.py); its output then holds those rows, and ``EncoderOutput.padded``
restores the (B, S, D) layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from nmt.errors import NMTError
from nmt.models.base import Seq2Seq
from nmt.models.dropout import Dropout, add_dropout
from nmt.models.linear import Linear, compiling
from nmt.models.multihead import KV, CrossAttention, Packing, SelfAttention, key_padding_mask


@dataclass
class TransformerConfig:
    """The ``model:`` section of a config with ``type: transformer``."""

    type: Literal["transformer"] = "transformer"
    d_model: int = 256
    ff_size: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    heads: int = 4
    dropout: float = 0.1  # on embeddings and on every sublayer's output
    attention_dropout: float = 0.0  # on the attention weights
    activation_dropout: float = 0.0  # after the feed-forward ReLU
    norm: Literal["post", "pre"] = "post"  # post-norm as in Vaswani et al.; pre-norm trains more easily
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 1024  # longest source or target, in subwords with EOS/BOS
    tie_embeddings: bool = True  # share source and target embeddings (joint vocabulary)
    tie_output: bool = True  # output projection shares the target embedding matrix

    def check(self) -> None:
        if self.d_model % self.heads:
            raise NMTError(f"config key 'model.heads': d_model {self.d_model} is not divisible by {self.heads} heads")


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


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied at every position (dropout after the ReLU, if any)."""

    def __init__(self, d_model: int, ff_size: int, activation_dropout: float = 0.0):
        super().__init__()
        self.up = Linear(d_model, ff_size)
        self.down = Linear(ff_size, d_model)
        self.drop = Dropout(activation_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The ReLU overwrites the up-projection's output, which its backward does not need: no fresh
        # (tokens x ff_size) tensor (6-8% of the block's forward + backward, fp32 CPU). On rows, so that
        # the output written over is the product itself, not a view of it (autograd would copy it back).
        rows = x.reshape(-1, x.shape[-1])
        return self.down(self.drop(F.relu(self.up(rows), inplace=True))).view(x.shape)


class Residual(nn.Module):
    """The residual connection around a sublayer, with its LayerNorm placed post or pre.

    Use as ``h = r.enter(x); h = sublayer(h); x = r.exit(x, h)``.
    """

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.drop = Dropout(dropout)
        self.pre_norm = pre_norm

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) if self.pre_norm else x

    def exit(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        x = add_dropout(x, h, self.drop.p) if self.training else x + h
        return x if self.pre_norm else self.norm(x)


# ---------------------------------------------------------------------------- layers


@dataclass
class EncoderOutput:
    states: torch.Tensor  # (B, S, D); with ``packing``, the real positions only (N, D)
    mask: torch.Tensor  # (B, 1, 1, S) bool key-padding mask, True at real tokens
    packing: Packing | None = None

    def padded(self) -> torch.Tensor:
        """(B, S, D), zeros at padding when packed."""
        return self.states if self.packing is None else self.packing.unpack(self.states)


@dataclass
class DecoderState:
    """Everything one decoding step needs, for N hypotheses of n sentences.

    The cross-attention keys/values are kept once per SENTENCE (n rows), not per hypothesis:
    beam reordering never copies them, ``memory_rows`` says which sentence each hypothesis
    reads. When the hypotheses of each sentence are g consecutive rows (always so in beam
    search), ``group`` = g and the g queries of a sentence attend to its memory together.
    The self-attention caches are reordered lazily: ``reorder_state`` only composes
    ``self_index``, the next step gathers the rows while appending the new position.
    """

    memory_kv: list[KV]  # per decoder layer: cross-attention keys, values (n, H, S, hd)
    memory_mask: torch.Tensor  # (n, 1, 1, S) bool
    memory_rows: torch.Tensor  # (N,) long, the memory row of each hypothesis
    group: int  # g if memory_rows == [0]*g + [1]*g + ... + [n-1]*g, else 0
    self_kv: list[KV | None]  # per decoder layer: self-attention keys, values (N0, H, t, hd); None at t=0
    self_index: torch.Tensor | None  # (N,) rows of self_kv the hypotheses continue (a pending reorder) or None
    step: int = 0  # t: the position of the next input token
    record_attention: bool = False  # keep each step's cross-attention weights (attention maps)
    attention: torch.Tensor | None = None  # (N, L, H, S) fp32: the last step's, when recorded


def group_size(rows: torch.Tensor, n: int) -> int:
    """g if ``rows`` (N,) is arange(n) with each entry repeated g times in place, else 0."""
    N = rows.numel()
    if n == 0 or N % n:
        return 0
    g = N // n
    return g if torch.equal(rows, torch.arange(n, device=rows.device).repeat_interleave(g)) else 0


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.ff = FeedForward(cfg.d_model, cfg.ff_size, cfg.activation_dropout)
        self.res_attn = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_ff = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, packing: Packing | None = None) -> torch.Tensor:
        """x (B, S, D), or its real rows (N, D) with ``packing``."""
        x = self.res_attn.exit(x, self.attn(self.res_attn.enter(x), mask=mask, packing=packing))
        return self.res_ff.exit(x, self.ff(self.res_ff.enter(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.cross_attn = CrossAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.ff = FeedForward(cfg.d_model, cfg.ff_size, cfg.activation_dropout)
        self.res_self = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_cross = Residual(cfg.d_model, cfg.dropout, pre)
        self.res_ff = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: torch.Tensor, memory_kv: KV, memory_mask: torch.Tensor) -> torch.Tensor:
        """Teacher forcing over the whole prefix: x (B, T, D), causal self-attention."""
        x = self.res_self.exit(x, self.self_attn(self.res_self.enter(x), causal=True))
        return self._cross_and_ff(x, memory_kv, memory_mask)[0]

    def step(self, x: torch.Tensor, state: DecoderState, i: int) -> tuple[torch.Tensor, KV, torch.Tensor | None]:
        """One position x (N, 1, D), layer ``i`` of ``state``; returns the output, the grown self cache
        and, when the state records them, the cross-attention weights (N, H, S)."""
        h, cache = self.self_attn.step(self.res_self.enter(x), state.self_kv[i], state.self_index)
        x = self.res_self.exit(x, h)
        memory_kv, mask = state.memory_kv[i], state.memory_mask
        if not state.group:  # arbitrary rows: gather a memory copy per hypothesis
            rows = state.memory_rows
            memory_kv, mask = (memory_kv[0][rows], memory_kv[1][rows]), mask.index_select(0, rows)
        x, weights = self._cross_and_ff(x, memory_kv, mask, state.group, state.record_attention)
        return x, cache, weights

    def _cross_and_ff(
        self, x: torch.Tensor, memory_kv: KV, memory_mask: torch.Tensor, group: int = 0, weights: bool = False
    ):
        """group g > 0: x (n*g, 1, D) holds g consecutive queries per memory row, attending as (n, g, D).
        Returns the output and, with ``weights``, the cross-attention weights (N, H, S), else None."""
        h = self.res_cross.enter(x)
        if group:
            h = h.view(memory_mask.shape[0], group, -1)  # (n, g, D): one sentence's hypotheses share its memory
        w = None
        if weights:
            y, w = self.cross_attn.forward_with_weights(h, memory_kv, memory_mask)  # w (n, H, g, S)
            w = w.transpose(1, 2).reshape(x.shape[0], w.shape[1], w.shape[-1])  # (N, H, S)
        else:
            y = self.cross_attn(h, memory_kv, memory_mask)
        x = self.res_cross.exit(x, y.view_as(x))
        return self.res_ff.exit(x, self.ff(self.res_ff.enter(x))), w


# ---------------------------------------------------------------------------- model


class Transformer(Seq2Seq):
    def __init__(self, cfg: TransformerConfig, src_vocab_size: int, trg_vocab_size: int, pad_id: int):
        super().__init__()
        if cfg.d_model % cfg.heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by {cfg.heads} heads")
        if cfg.tie_embeddings and src_vocab_size != trg_vocab_size:
            raise ValueError(
                f"tie_embeddings needs one shared vocabulary, got sizes {src_vocab_size} and {trg_vocab_size}"
            )
        self.cfg, self.pad_id, self.d_model = cfg, pad_id, cfg.d_model
        self.max_positions = cfg.max_positions
        self.trg_embed = nn.Embedding(trg_vocab_size, cfg.d_model, padding_idx=pad_id)
        self.src_embed = (
            self.trg_embed if cfg.tie_embeddings else nn.Embedding(src_vocab_size, cfg.d_model, padding_idx=pad_id)
        )
        if cfg.positions == "learned":
            self.pos_embed = nn.Embedding(cfg.max_positions, cfg.d_model)
        else:
            self.pos_embed = None
            self.register_buffer("pos_table", sinusoidal_positions(cfg.max_positions, cfg.d_model), persistent=False)
        self.embed_drop = Dropout(cfg.dropout)
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

    def set_attention_kernel(self, kernel: str) -> None:
        """Every attention sublayer computes with ``kernel`` ("sdpa" or "explicit") from now on."""
        if kernel not in ("sdpa", "explicit"):
            raise ValueError(f"unknown attention kernel {kernel!r}: expected 'sdpa' or 'explicit'")
        self.attention_kernel = kernel
        for module in self.modules():
            if isinstance(module, (SelfAttention, CrossAttention)):
                module.kernel = kernel

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
        return self._embed(embedding, tokens, self.positions(start, tokens.shape[1]))

    def embed_packed(self, embedding: nn.Embedding, tokens: torch.Tensor, packing: Packing) -> torch.Tensor:
        """``embed`` of the real slots only: (B, S) ids -> (N, D)."""
        positions = self.positions(0, packing.length)[packing.rows % packing.length]  # (N, D)
        return self._embed(embedding, tokens.reshape(-1)[packing.rows], positions)

    def _embed(self, embedding: nn.Embedding, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """dropout(sqrt(d) * E[ids] + positions), the formula both layouts share."""
        return self.embed_drop(embedding(ids) * math.sqrt(self.d_model) + positions)

    def output_layer(self) -> tuple[torch.Tensor, None]:
        """With tie_output the target embedding matrix is the output projection."""
        return (self.trg_embed.weight if self.out_proj is None else self.out_proj.weight), None

    # -- Seq2Seq interface

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> EncoderOutput:
        mask = key_padding_mask(src_mask)  # (B, 1, 1, S)
        packing = None
        if src.device.type == "cpu" and not compiling() and not bool(src_mask.all()):
            # Compute on the real rows only (see Packing). Not on GPUs: there the row count hardly
            # sets the time at these sizes, and the packing's data-dependent size would cost a sync.
            # Not under torch.compile: the branch on the mask's values and the packing's size break
            # its graph (a long warning at the first update); the compiler gets the padded rows.
            packing = Packing(src_mask)
            x = self.embed_packed(self.src_embed, src, packing)  # (N, D)
        else:
            x = self.embed(self.src_embed, src)  # (B, S, D)
        for layer in self.encoder:
            x = layer(x, mask, packing)
        return EncoderOutput(self.encoder_norm(x), mask, packing)

    def decode_features(self, memory: EncoderOutput, trg_in: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.trg_embed, trg_in)  # (B, T, D)
        for layer in self.decoder:
            x = layer(x, layer.cross_attn.project_memory(memory.states, memory.packing), memory.mask)
        return self.decoder_norm(x)  # (B, T, D)

    def init_state(self, memory: EncoderOutput, record_attention: bool = False) -> DecoderState:
        memory_kv = [  # once per sentence; contiguous so that every step's matmuls read them in place
            tuple(t.contiguous() for t in layer.cross_attn.project_memory(memory.states, memory.packing))
            for layer in self.decoder
        ]
        rows = torch.arange(memory.mask.shape[0], device=memory.mask.device)
        return DecoderState(memory_kv, memory.mask, rows, 1, [None] * len(self.decoder), None, 0, record_attention)

    def decode_step(self, prev_tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        x = self.embed(self.trg_embed, prev_tokens[:, None], start=state.step)  # (N, 1, D)
        self_kv, weights = [], []
        for i, layer in enumerate(self.decoder):
            x, cache, w = layer.step(x, state, i)
            self_kv.append(cache)
            weights.append(w)
        logits = self.project(self.decoder_norm(x[:, 0]))  # (N, V): the only position computed
        attention = torch.stack(weights, dim=1) if state.record_attention else None  # (N, L, H, S)
        return logits, replace(state, self_kv=self_kv, self_index=None, step=state.step + 1, attention=attention)

    def step_attention(self, state: DecoderState) -> torch.Tensor | None:
        return state.attention

    def reorder_state(self, state: DecoderState, index: torch.Tensor) -> DecoderState:
        """Keep hypotheses ``index`` (N',): the self caches are gathered by the next step (lazily);
        the per-sentence memory only drops sentences no hypothesis reads any more."""
        rows = state.memory_rows.index_select(0, index)
        used, rows = torch.unique(rows, return_inverse=True)  # (n',), (N',) renumbered 0..n'-1
        memory_kv, mask = state.memory_kv, state.memory_mask
        if used.numel() < mask.shape[0]:
            memory_kv = [(k.index_select(0, used), v.index_select(0, used)) for k, v in memory_kv]
            mask = mask.index_select(0, used)
        if state.self_kv[0] is None:  # nothing cached yet
            self_index = None
        else:
            self_index = index if state.self_index is None else state.self_index.index_select(0, index)
        group = group_size(rows, used.numel())
        attention = None if state.attention is None else state.attention.index_select(0, index)
        return replace(
            state,
            memory_kv=memory_kv,
            memory_mask=mask,
            memory_rows=rows,
            group=group,
            self_index=self_index,
            attention=attention,
        )

    # -- accounting

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
