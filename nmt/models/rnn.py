"""Attentional RNN encoder-decoder (Bahdanau et al., 2015; Luong et al., 2015), the baseline.

Encoder: embeddings -> multi-layer (bi)LSTM/GRU over packed sequences, so padding never enters
the recurrence. Outputs h^enc_1..h^enc_S [B, S, H_enc], H_enc = 2 * rnn_hidden if bidirectional.

Bridge: the decoder starts from the encoder's final states, per decoder layer l
    h^dec_0[l] = tanh(W_h[l] [h_fwd; h_bwd])     (and c^dec_0[l] = tanh(W_c[l] [c_fwd; c_bwd]) for LSTM)
taking encoder layer min(l, encoder_layers - 1).

Decoder step t (y_{t-1} the previous target token, h̃_{t-1} the previous attentional vector):
    x_t  = [E y_{t-1}; h̃_{t-1}]                 (input feeding; just E y_{t-1} without it)
    h_t  = RNN(x_t, h_{t-1})                      top-layer output, the attention query
    c_t  = attention(h_t, h^enc)                  context (see attention.py)
    h̃_t  = tanh(W_c [h_t; c_t])                   Luong's attentional vector
    p_t  = softmax(W_o P h̃_t + b_o)               P: h̃ -> d_model when W_o is the target embedding

Teacher forcing runs the same ``_step`` as incremental decoding: one step at a time with input
feeding (h̃_{t-1} must exist before step t), or over all T positions in one call without it.

Single LSTM steps are computed here (``lstm_step``), not by ``nn.LSTM``: on CPUs nn.LSTM runs
each call through oneDNN's reference RNN primitive, which reorders the weights and opens a dozen
parallel regions per call, forward and backward, for a few small matrix products. Here a step is
one matrix product per layer on [input; h] with the embedding's share of the first layer computed
for all positions at once. On a 2-core Xeon, fp32: the tiny LSTM config's updates are 17% faster
with 38% fewer parallel regions (each a wait when the cores are shared, see nmt/openmp.py), the
Multi30k LSTM's 4% faster. The parameters stay in the ``nn.LSTM`` (same names in checkpoints),
which still runs whole sequences (the encoder; the decoder without input feeding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.errors import NMTError
from nmt.models.attention import make_attention
from nmt.models.base import Seq2Seq
from nmt.models.dropout import Dropout


@dataclass
class RNNConfig:
    """The ``model:`` section of a config with ``type: rnn``."""

    type: Literal["rnn"] = "rnn"
    d_model: int = 256  # embedding size
    rnn_cell: Literal["lstm", "gru"] = "lstm"
    rnn_hidden: int = 512
    rnn_bidirectional: bool = True  # encoder only; the decoder runs left to right
    encoder_layers: int = 3
    decoder_layers: int = 3
    attention: Literal["dot", "general", "bilinear", "mlp", "additive"] = "mlp"
    input_feeding: bool = True  # feed the previous attentional vector into the next step (Luong et al.)
    dropout: float = 0.1
    tie_embeddings: bool = True  # share source and target embeddings (joint vocabulary)
    tie_output: bool = True  # output layer shares the target embedding matrix
    max_positions: ClassVar[int | None] = None  # a recurrence has no length limit

    def check(self) -> None:
        if self.attention == "dot" and self.rnn_bidirectional:
            raise NMTError(
                "config key 'model.attention': 'dot' needs equal query and key sizes; "
                "use 'general' or 'mlp' with a bidirectional encoder, or set model.rnn_bidirectional: false"
            )


@dataclass
class RNNMemory:
    """What ``encode`` returns: everything the decoder reads from the source, batch-first."""

    outputs: torch.Tensor  # (B, S, H_enc) encoder states, the attention keys and values
    keys: torch.Tensor  # (B, S, *) attention.precompute_keys(outputs)
    mask: torch.Tensor  # (B, S) True at real tokens
    final_h: torch.Tensor  # (L_enc, B, H_enc) final encoder state per layer, [fwd; bwd]
    final_c: torch.Tensor | None  # (L_enc, B, H_enc) final LSTM cell; None for GRU

    def index_select(self, index: torch.Tensor) -> RNNMemory:
        return RNNMemory(
            outputs=self.outputs.index_select(0, index),
            keys=self.keys.index_select(0, index),
            mask=self.mask.index_select(0, index),
            final_h=self.final_h.index_select(1, index),
            final_c=None if self.final_c is None else self.final_c.index_select(1, index),
        )


@dataclass
class RNNState:
    """Decoder state between steps; ``reorder_state`` selects rows of every tensor in it."""

    memory: RNNMemory
    sources: torch.Tensor  # (N,) long: the row of ``encode``'s batch whose memory each row holds a copy of
    hidden: torch.Tensor  # (L_dec, N, H) decoder RNN hidden state
    cell: torch.Tensor | None  # (L_dec, N, H) LSTM cell; None for GRU
    feed: torch.Tensor  # (N, H) previous attentional vector h̃ (zeros before the first step)
    step: int  # target tokens consumed so far
    lstm: LSTMStepWeights | None = None  # an LSTM decoder's weights for single steps; None for GRU
    record_attention: bool = False  # keep each step's attention weights (attention maps)
    attention: torch.Tensor | None = None  # (N, 1, 1, S) fp32: the last step's alignment, when recorded


def final_states_by_layer(final: torch.Tensor, layers: int, directions: int) -> torch.Tensor:
    """PyTorch's (L * D, B, H) final states, layer-major -> (L, B, D * H), i.e. [fwd; bwd] per layer."""
    _, batch, hidden = final.shape
    final = final.view(layers, directions, batch, hidden).permute(0, 2, 1, 3)  # (L, B, D, H)
    return final.reshape(layers, batch, directions * hidden)


def run_packed(rnn: nn.RNNBase, x: torch.Tensor, mask: torch.Tensor):
    """Run ``rnn`` over the real tokens only: x (B, S, E), mask (B, S) -> outputs (B, S, H), final states.

    Outputs are zero at padded positions. Assumes real tokens come first in each row.
    """
    lengths = mask.sum(dim=1).clamp(min=1).cpu()  # (B,); pack_padded_sequence wants them on the CPU
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    outputs, final = rnn(packed)
    outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=x.size(1))
    return outputs, final


@dataclass
class LSTMStepWeights:
    """The decoder LSTM's parameters arranged for one step at a time; built once per decoding call,
    so gradients flow back to the ``nn.LSTM`` parameters."""

    embedded: torch.Tensor  # (4H, E) W_ih of layer 1 on the embedding: applied to all positions at once
    bias: torch.Tensor  # (L, 4H) b_ih + b_hh per layer
    recurrent: list[torch.Tensor]  # per layer [W_ih (rest of the input) | W_hh]: (4H, input + H)

    @classmethod
    def of(cls, lstm: nn.LSTM, emb_size: int) -> LSTMStepWeights:
        w_ih = [getattr(lstm, f"weight_ih_l{i}") for i in range(lstm.num_layers)]
        w_hh = [getattr(lstm, f"weight_hh_l{i}") for i in range(lstm.num_layers)]
        bias = torch.stack(
            [getattr(lstm, f"bias_ih_l{i}") + getattr(lstm, f"bias_hh_l{i}") for i in range(lstm.num_layers)]
        )
        recurrent = [torch.cat([w_ih[0][:, emb_size:], w_hh[0]], dim=1)]
        recurrent += [torch.cat([w_ih[i], w_hh[i]], dim=1) for i in range(1, lstm.num_layers)]
        return cls(w_ih[0][:, :emb_size], bias, recurrent)

    def project(self, emb: torch.Tensor) -> torch.Tensor:
        """Embedded targets (..., E) -> the first layer's input projection, bias included (..., 4H)."""
        return F.linear(emb, self.embedded, self.bias[0])


def lstm_step(
    projected: torch.Tensor,
    feed: torch.Tensor | None,
    hidden: torch.Tensor,
    cell: torch.Tensor,
    weights: LSTMStepWeights,
    dropout: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One position through all layers, as nn.LSTM computes it (gates i, f, g, o; ``dropout`` between layers).

    projected (N, 4H) from ``weights.project``; feed (N, H') the rest of the first layer's input, or None;
    hidden, cell (L, N, H). Returns the top layer's output (N, H) and the new hidden and cell (L, N, H),
    in fp32 under autocast too.
    """
    hs, cs = [], []
    x = feed
    # unbind, not indexing: an indexed tensor's gradient is a zero-filled copy of the whole, per step.
    for layer, (w, h, c) in enumerate(zip(weights.recurrent, hidden.unbind(0), cell.unbind(0))):
        inputs = h if x is None else torch.cat([x.to(h.dtype), h], dim=-1)
        base = projected if layer == 0 else weights.bias[layer]
        gates = torch.addmm(base, inputs, w.t()).float()  # (N, 4H)
        # One sigmoid over all four gates (g's share unused): fewer kernels, each a parallel region.
        i, f, _, o = torch.sigmoid(gates).chunk(4, dim=-1)
        g = torch.tanh(gates.narrow(-1, 2 * h.size(-1), h.size(-1)))
        c = torch.addcmul(f * c, i, g)
        h = o * torch.tanh(c)
        hs.append(h)
        cs.append(c)
        x = dropout(h) if layer + 1 < len(weights.recurrent) else None
    return hs[-1], torch.stack(hs), torch.stack(cs)


class RNNSeq2Seq(Seq2Seq):
    """LSTM/GRU encoder-decoder with attention, input feeding and optional tied embeddings."""

    def __init__(self, cfg: RNNConfig, src_vocab_size: int, trg_vocab_size: int, pad_id: int):
        super().__init__()
        self.cfg, self.pad_id = cfg, pad_id
        self.hidden_size = cfg.rnn_hidden
        self.cell_type = cfg.rnn_cell
        self.input_feeding = cfg.input_feeding
        self.encoder_layers, self.decoder_layers = cfg.encoder_layers, cfg.decoder_layers
        self.directions = 2 if cfg.rnn_bidirectional else 1
        emb, hid = cfg.d_model, cfg.rnn_hidden
        enc_size = self.directions * hid  # H_enc
        rnn_class = {"lstm": nn.LSTM, "gru": nn.GRU}[cfg.rnn_cell]

        self.src_embed = nn.Embedding(src_vocab_size, emb, padding_idx=pad_id)
        if cfg.tie_embeddings:
            if src_vocab_size != trg_vocab_size:
                raise ValueError(
                    f"tie_embeddings needs one joint vocabulary, got source {src_vocab_size} "
                    f"and target {trg_vocab_size} entries"
                )
            self.trg_embed = self.src_embed
        else:
            self.trg_embed = nn.Embedding(trg_vocab_size, emb, padding_idx=pad_id)
        self.dropout = Dropout(cfg.dropout)

        self.encoder = rnn_class(
            emb,
            hid,
            num_layers=cfg.encoder_layers,
            bidirectional=cfg.rnn_bidirectional,
            dropout=cfg.dropout if cfg.encoder_layers > 1 else 0.0,
            batch_first=True,
        )
        self.bridge_h = nn.ModuleList(nn.Linear(enc_size, hid) for _ in range(cfg.decoder_layers))
        self.bridge_c = (
            nn.ModuleList(nn.Linear(enc_size, hid) for _ in range(cfg.decoder_layers))
            if cfg.rnn_cell == "lstm"
            else None
        )

        self.decoder = rnn_class(
            emb + hid if cfg.input_feeding else emb,
            hid,
            num_layers=cfg.decoder_layers,
            dropout=cfg.dropout if cfg.decoder_layers > 1 else 0.0,
            batch_first=True,
        )
        self.attention = make_attention(cfg.attention, hid, enc_size, hid)
        self.combine = nn.Linear(hid + enc_size, hid, bias=False)  # W_c
        if cfg.tie_output:
            self.out_proj = nn.Identity() if hid == emb else nn.Linear(hid, emb, bias=False)  # P
            self.generator = nn.Linear(emb, trg_vocab_size)
            self.generator.weight = self.trg_embed.weight  # W_o = E_trg, [V, d_model]
        else:
            self.out_proj = nn.Identity()
            self.generator = nn.Linear(hid, trg_vocab_size)
        self._init_embeddings(emb)

    def _init_embeddings(self, emb: int) -> None:
        """N(0, 1/d_model): logits through a tied output matrix start at unit scale; pad row zero."""
        tables = [self.src_embed] if self.trg_embed is self.src_embed else [self.src_embed, self.trg_embed]
        for table in tables:
            nn.init.normal_(table.weight, std=emb**-0.5)
            with torch.no_grad():
                table.weight[self.pad_id].zero_()

    def flops_per_token(self, src_len: float, trg_len: float) -> float:
        """Approximate training FLOPs per target token for sentence pairs of these lengths.

        6 x multiply-accumulates (forward + backward), with g = 4 gates (LSTM) or 3 (GRU),
        E the embedding size, H the hidden size, H_enc = directions * H, V the vocabulary:
          encoder, per source token:  sum over layers and directions of g H (input + H)
          attention keys, per source token:  H_enc H (general, mlp; none for dot)
          decoder, per target token:  sum over layers of g H (input + H), input E (+ H with input feeding)
          attention, per target token:  S H (scores) + S H_enc (context) (+ H^2 for mlp's query)
          combine + output:  (H + H_enc) H + [H E] + E V     ([H E] when the output goes through E)
          bridge, per sentence:  layers x H_enc H (x2 for LSTM)
        Source-side costs are spread over the T target tokens of the pair (factor S/T).
        """
        c, S, T = self.cfg, float(src_len), float(trg_len)
        g = 4 if c.rnn_cell == "lstm" else 3
        E, H = c.d_model, c.rnn_hidden
        D = 2 if c.rnn_bidirectional else 1
        H_enc = D * H
        enc = sum(D * g * H * ((E if layer == 0 else H_enc) + H) for layer in range(c.encoder_layers))
        keys = 0 if c.attention == "dot" else H_enc * H
        dec_in = E + (H if c.input_feeding else 0)
        dec = sum(g * H * ((dec_in if layer == 0 else H) + H) for layer in range(c.decoder_layers))
        att = S * H + S * H_enc + (H * H if c.attention in ("mlp", "additive") else 0)
        out = (H + H_enc) * H + (H * E if isinstance(self.out_proj, nn.Linear) else 0)
        out += self.generator.in_features * self.generator.out_features
        bridge = c.decoder_layers * H_enc * H * (2 if c.rnn_cell == "lstm" else 1)
        return 6.0 * ((enc + keys) * S / T + dec + att + out + bridge / T)

    # ---- encoder ----

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> RNNMemory:
        x = self.dropout(self.src_embed(src))  # (B, S, E)
        outputs, final = run_packed(self.encoder, x, src_mask)  # (B, S, H_enc)
        outputs = self.dropout(outputs)
        final_h, final_c = final if self.cell_type == "lstm" else (final, None)
        final_h = final_states_by_layer(final_h, self.encoder_layers, self.directions)  # (L_enc, B, H_enc)
        if final_c is not None:
            final_c = final_states_by_layer(final_c, self.encoder_layers, self.directions)
        keys = self.attention.precompute_keys(outputs)  # (B, S, *)
        return RNNMemory(outputs, keys, src_mask, final_h, final_c)

    def init_state(self, memory: RNNMemory, record_attention: bool = False) -> RNNState:
        """Bridge: h^dec_0[l] = tanh(W_h[l] h^enc_final[min(l, L_enc - 1)]), likewise c for LSTM."""
        source_layer = [min(layer, self.encoder_layers - 1) for layer in range(self.decoder_layers)]
        hidden = torch.stack([torch.tanh(w(memory.final_h[j])) for w, j in zip(self.bridge_h, source_layer)])
        cell = None
        if self.bridge_c is not None:
            cell = torch.stack([torch.tanh(w(memory.final_c[j])) for w, j in zip(self.bridge_c, source_layer)])
        batch = memory.outputs.size(0)
        sources = torch.arange(batch, device=memory.outputs.device)
        feed = memory.outputs.new_zeros(batch, self.hidden_size)  # (N, H)
        lstm = LSTMStepWeights.of(self.decoder, self.trg_embed.embedding_dim) if cell is not None else None
        return RNNState(memory, sources, hidden, cell, feed, 0, lstm, record_attention)  # hidden, cell: (L_dec, N, H)

    # ---- decoder ----

    def _step(self, emb: torch.Tensor, state: RNNState, projected: bool = False) -> tuple[torch.Tensor, RNNState]:
        """Embedded targets (N, t, E) -> attentional vectors h̃ (N, t, H); t == 1 with input feeding.

        ``projected``: one position of an LSTM decoder, ``emb`` already through ``state.lstm.project`` (N, 1, 4H).
        """
        if projected:
            feed = state.feed if self.input_feeding else None
            out, hidden, cell = lstm_step(emb.squeeze(1), feed, state.hidden, state.cell, state.lstm, self.dropout)
            out = out.unsqueeze(1)  # (N, 1, H)
        else:
            x = emb
            if self.input_feeding:
                x = torch.cat([emb, state.feed.unsqueeze(1).to(emb.dtype)], dim=-1)  # (N, 1, E + H)
            if state.cell is None:
                out, hidden = self.decoder(x, state.hidden)  # (N, t, H)
                cell = None
            else:
                out, (hidden, cell) = self.decoder(x, (state.hidden, state.cell))
        mem = state.memory
        context, weights = self.attention(out, mem.outputs, mem.keys, mem.mask)  # (N, t, H_enc), (N, t, S)
        h_tilde = self.dropout(torch.tanh(self.combine(torch.cat([out, context.to(out.dtype)], dim=-1))))
        attention = weights[:, -1, None, None, :] if state.record_attention else None  # (N, 1, 1, S)
        feed = h_tilde.squeeze(1) if h_tilde.size(1) == 1 else h_tilde[:, -1]  # a view: no zero-filled gradient
        new_state = replace(
            state, hidden=hidden, cell=cell, feed=feed, step=state.step + emb.size(1), attention=attention
        )
        return h_tilde, new_state  # (N, t, H)

    def _logits(self, h_tilde: torch.Tensor) -> torch.Tensor:
        """h̃ (..., H) -> logits (..., V)."""
        return self.project(self.out_proj(h_tilde))  # the generator, through output_layer as training uses it

    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.generator.weight, self.generator.bias

    def decode_features(self, memory: RNNMemory, trg_in: torch.Tensor) -> torch.Tensor:
        state = self.init_state(memory)
        emb = self.dropout(self.trg_embed(trg_in))  # (B, T, E)
        if self.input_feeding:
            lstm = state.lstm is not None
            if lstm:
                emb = state.lstm.project(emb)  # (B, T, 4H): one matrix product for every position
            steps = []
            for emb_t in emb.unbind(1):  # not emb[:, t]: see lstm_step
                h_tilde, state = self._step(emb_t.unsqueeze(1), state, projected=lstm)  # (B, 1, H)
                steps.append(h_tilde)
            h_tilde = torch.cat(steps, dim=1)  # (B, T, H)
        else:
            h_tilde, state = self._step(emb, state)  # (B, T, H), all positions in one call
        return self.out_proj(h_tilde)  # (B, T, E): the generator's input

    def decode_step(self, prev_tokens: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, RNNState]:
        emb = self.dropout(self.trg_embed(prev_tokens).unsqueeze(1))  # (N, 1, E)
        lstm = state.lstm is not None
        if lstm:
            emb = state.lstm.project(emb)  # (N, 1, 4H)
        h_tilde, state = self._step(emb, state, projected=lstm)  # (N, 1, H)
        return self._logits(h_tilde.squeeze(1)), state  # (N, V)

    def reorder_state(self, state: RNNState, index: torch.Tensor) -> RNNState:
        """Keep rows ``index`` (N',). Rows of one sentence hold equal copies of its memory, so when
        every kept row reads the sentence its position read before (beams reordered within their
        sentences: every step of a beam search but the first and those where sentences finish),
        the memory (N, S, H_enc) stays as it is rather than being copied row by row."""
        sources = state.sources.index_select(0, index)
        same_sentences = torch.equal(sources, state.sources)  # False for a different N'
        return replace(
            state,
            memory=state.memory if same_sentences else state.memory.index_select(index),
            sources=sources,
            hidden=state.hidden.index_select(1, index),
            cell=None if state.cell is None else state.cell.index_select(1, index),
            feed=state.feed.index_select(0, index),
            attention=None if state.attention is None else state.attention.index_select(0, index),
        )

    def step_attention(self, state: RNNState) -> torch.Tensor | None:
        return state.attention
