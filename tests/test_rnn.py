"""RNN baseline: attention masking, step-by-step == teacher forcing, padding invariance, learning, bf16."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nmt.models.attention import make_attention
from nmt.models.rnn import LSTMStepWeights, RNNConfig, RNNSeq2Seq, lstm_step

PAD, BOS, EOS = 0, 1, 2
VOCAB = 20
KINDS = ["dot", "general", "mlp"]


def tiny_config(**overrides) -> RNNConfig:
    values = dict(type="rnn", d_model=12, rnn_hidden=16, encoder_layers=2, decoder_layers=2, dropout=0.1)
    values.update(overrides)
    return RNNConfig(**values)


def make_model(seed: int = 0, **overrides) -> RNNSeq2Seq:
    torch.manual_seed(seed)
    return RNNSeq2Seq(tiny_config(**overrides), VOCAB, VOCAB, PAD).eval()


def random_batch(seed: int = 0, batch: int = 4, src_len: int = 7, trg_len: int = 6):
    """Source rows of different lengths (real tokens first, then PAD) and a BOS-first target."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (batch, src_len), generator=g)
    lengths = torch.tensor([src_len, 3, src_len - 1, 1][:batch])
    mask = torch.arange(src_len)[None, :] < lengths[:, None]  # (B, S)
    src = src.masked_fill(~mask, PAD)
    trg_in = torch.randint(3, VOCAB, (batch, trg_len), generator=g)
    trg_in[:, 0] = BOS
    return src, mask, trg_in


# ---- attention ----


@pytest.mark.parametrize("kind", KINDS + ["bilinear", "additive"])
def test_attention_weights_masked_and_normalised(kind):
    torch.manual_seed(0)
    att = make_attention(kind, 8, 8, 10)
    keys = torch.randn(3, 5, 8)  # (B, S, Hk)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    query = torch.randn(3, 8) * 5  # large scores: masking must still give exact zeros
    context, weights = att(query, keys, att.precompute_keys(keys), mask)
    assert context.shape == (3, 8) and weights.shape == (3, 5)
    assert weights.dtype == torch.float32
    assert torch.all(weights[~mask] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))
    assert torch.all(weights[mask] > 0)
    # Extra padded keys (garbage values, masked) do not change the context.
    padded_keys = torch.cat([keys, torch.randn(3, 4, 8) * 100], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    context2, weights2 = att(query, padded_keys, att.precompute_keys(padded_keys), padded_mask)
    torch.testing.assert_close(context2, context, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(weights2[:, :5], weights, atol=1e-6, rtol=1e-6)


def test_attention_sequence_query_matches_single_steps():
    torch.manual_seed(0)
    att = make_attention("mlp", 6, 8, 5)
    keys, query = torch.randn(2, 4, 8), torch.randn(2, 3, 6)  # query (B, T, Hq)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    pk = att.precompute_keys(keys)
    context, weights = att(query, keys, pk, mask)  # (B, T, Hk), (B, T, S)
    for t in range(3):
        c_t, w_t = att(query[:, t], keys, pk, mask)
        torch.testing.assert_close(context[:, t], c_t, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(weights[:, t], w_t, atol=1e-6, rtol=1e-6)


def test_attention_errors():
    with pytest.raises(ValueError, match="same size"):
        make_attention("dot", 8, 16, 8)
    with pytest.raises(ValueError, match="unknown attention"):
        make_attention("cosine", 8, 8, 8)


# ---- model ----

MODEL_VARIANTS = [
    dict(rnn_cell=cell, rnn_bidirectional=bi, input_feeding=feed, attention=kind)
    for cell, bi, feed, kind in itertools.product(["lstm", "gru"], [True, False], [True, False], KINDS)
    if not (kind == "dot" and bi)  # dot needs H_enc == H_dec; checked in test_dot_with_bidirectional_raises
]


def variant_id(v: dict) -> str:
    direction = "bi" if v["rnn_bidirectional"] else "uni"
    feeding = "feed" if v["input_feeding"] else "nofeed"
    return f"{v['rnn_cell']}-{direction}-{feeding}-{v['attention']}"


@pytest.mark.parametrize("variant", MODEL_VARIANTS, ids=variant_id)
def test_decode_step_matches_teacher_forcing(variant):
    model = make_model(**variant)
    src, mask, trg_in = random_batch()
    with torch.no_grad():
        full = model(src, mask, trg_in)  # (B, T, V)
        assert full.shape == (4, 6, VOCAB)
        state = model.init_state(model.encode(src, mask))
        for t in range(3):
            logits, state = model.decode_step(trg_in[:, t], state)
            torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)
        # Beam search reorders rows (a permutation with a duplicate) and drops finished ones.
        index = torch.tensor([2, 0, 0, 3])
        state = model.reorder_state(state, index)
        assert state.step == 3
        for t in range(3, 5):
            logits, state = model.decode_step(trg_in[index, t], state)
            torch.testing.assert_close(logits, full[index, t], atol=1e-5, rtol=1e-5)
        keep = torch.tensor([3, 1])
        state = model.reorder_state(state, keep)
        logits, state = model.decode_step(trg_in[index[keep], 5], state)
        torch.testing.assert_close(logits, full[index[keep], 5], atol=1e-5, rtol=1e-5)
        assert logits.shape == (2, VOCAB) and state.memory.outputs.size(0) == 2


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_decode_steps_are_luongs_formulas_with_input_feeding(cell):
    """Each step written out with the model's own modules: x_t = [E y_{t-1}; h̃_{t-1}] (h̃_0 = 0) through
    nn.LSTM/GRU, c_t = attention(h_t), h̃_t = tanh(W_c [h_t; c_t]), logits = W_o P h̃_t + b. Teacher
    forcing and decode_step share the feeding, so only this sees h̃ not fed (or fed stale)."""
    model = make_model(rnn_cell=cell, input_feeding=True)
    src, mask, trg_in = random_batch()
    with torch.no_grad():
        memory = model.encode(src, mask)
        state = model.init_state(memory)
        hidden = state.hidden if cell == "gru" else (state.hidden, state.cell)
        feed = torch.zeros(src.shape[0], model.hidden_size)
        for t in range(4):
            logits, state = model.decode_step(trg_in[:, t], state)
            x = torch.cat([model.trg_embed(trg_in[:, t]), feed], dim=-1)[:, None]  # (B, 1, E + H)
            out, hidden = model.decoder(x, hidden)
            context, _ = model.attention(out[:, 0], memory.outputs, memory.keys, mask)
            feed = torch.tanh(model.combine(torch.cat([out[:, 0], context], dim=-1)))
            torch.testing.assert_close(logits, model.generator(model.out_proj(feed)), atol=1e-5, rtol=1e-5)


def test_dot_with_bidirectional_raises():
    with pytest.raises(ValueError, match="same size"):
        make_model(attention="dot", rnn_bidirectional=True)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("feed", [True, False])
def test_source_padding_does_not_change_logits(cell, feed):
    model = make_model(rnn_cell=cell, input_feeding=feed)
    src, mask, trg_in = random_batch()
    extra = 5
    src_padded = torch.cat([src, torch.full((4, extra), PAD)], dim=1)
    mask_padded = torch.cat([mask, torch.zeros(4, extra, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        ref = model(src, mask, trg_in)
        padded = model(src_padded, mask_padded, trg_in)
        # Each sentence alone (no padding at all) gives the same logits as in the batch.
        for b in range(4):
            n = int(mask[b].sum())
            alone = model(src[b : b + 1, :n], mask[b : b + 1, :n], trg_in[b : b + 1])
            torch.testing.assert_close(alone[0], ref[b], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_each_decoder_layer_starts_from_its_encoder_layers_final_state(cell):
    """Bridge: decoder layer l starts from tanh(W_h[l] [h_fwd; h_bwd]) (and c likewise for an LSTM) of
    encoder layer min(l, L_enc - 1), as nn.LSTM/GRU itself returns them (h_n, layer-major) for each
    sentence alone. The decoding tests share init_state between both paths, so only this sees a
    decoder layer started from another layer's state."""
    model = make_model(rnn_cell=cell, encoder_layers=2, decoder_layers=3, rnn_bidirectional=True)
    src, mask, _ = random_batch()
    with torch.no_grad():
        state = model.init_state(model.encode(src, mask))
        for b in range(src.shape[0]):
            n = int(mask[b].sum())
            _, final = model.encoder(model.src_embed(src[b : b + 1, :n]))
            h_n, c_n = final if cell == "lstm" else (final, None)  # (layers * 2, 1, H), layer-major
            sides = [(h_n, model.bridge_h, state.hidden)]
            if cell == "lstm":
                sides.append((c_n, model.bridge_c, state.cell))
            for ends, bridge, started in sides:
                for layer, source in enumerate([0, 1, 1]):
                    want = torch.tanh(bridge[layer](torch.cat([ends[2 * source, 0], ends[2 * source + 1, 0]])))
                    torch.testing.assert_close(started[layer, b], want, atol=1e-5, rtol=1e-5)


def test_tied_weights_and_parameter_count():
    tied = make_model(tie_embeddings=True, tie_output=True)
    assert tied.src_embed.weight is tied.trg_embed.weight is tied.generator.weight
    untied = make_model(tie_embeddings=False, tie_output=False)
    assert untied.src_embed.weight is not untied.trg_embed.weight
    # Untied: a second embedding table [V, d_model] and an output matrix [V, H] instead of the
    # h̃ -> d_model projection [d_model, H] that tying needs.
    expected_gap = VOCAB * 12 + VOCAB * 16 - 12 * 16
    assert untied.num_parameters() - tied.num_parameters() == expected_gap
    with pytest.raises(ValueError, match="joint vocabulary"):
        RNNSeq2Seq(tiny_config(tie_embeddings=True), VOCAB, VOCAB + 1, PAD)


def greedy(model: RNNSeq2Seq, src: torch.Tensor, mask: torch.Tensor, max_len: int) -> list[list[int]]:
    """Greedy decoding with decode_step; finished rows keep emitting PAD."""
    state = model.init_state(model.encode(src, mask))
    prev = torch.full((src.size(0),), BOS)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    out = []
    for _ in range(max_len):
        logits, state = model.decode_step(prev, state)
        prev = logits.argmax(-1).masked_fill(done, PAD)
        out.append(prev)
        done |= prev == EOS
        if done.all():
            break
    hyps = torch.stack(out, dim=1).tolist()
    return [h[: h.index(EOS)] if EOS in h else h for h in hyps]


def test_tiny_model_learns_four_pairs():
    pairs = [  # target: source reversed, each id mapped to id + 5; different lengths
        ([3, 4, 5, 6], [11, 10, 9, 8]),
        ([7, 3, 9], [14, 8, 12]),
        ([10, 11, 4, 8, 5], [10, 13, 9, 16, 15]),
        ([6, 6, 12], [17, 11, 11]),
    ]
    torch.manual_seed(0)
    cfg = tiny_config(d_model=32, rnn_hidden=48, encoder_layers=1, decoder_layers=1, dropout=0.0)
    model = RNNSeq2Seq(cfg, VOCAB, VOCAB, PAD)
    s_len = max(len(s) for s, _ in pairs)
    t_len = max(len(t) for _, t in pairs) + 1
    src = torch.tensor([s + [PAD] * (s_len - len(s)) for s, _ in pairs])
    mask = src != PAD
    trg_in = torch.tensor([[BOS] + t + [PAD] * (t_len - 1 - len(t)) for _, t in pairs])
    trg_out = torch.tensor([t + [EOS] + [PAD] * (t_len - 1 - len(t)) for _, t in pairs])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead (~3 s instead of minutes on a busy box)
    try:
        for _ in range(150):  # converges in ~30 updates; the margin keeps it robust to seeds
            logits = model(src, mask, trg_in)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), trg_out.reshape(-1), ignore_index=PAD)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    assert losses[0] > 2.0 and losses[-1] < 0.05  # from ~ln(20) to near zero
    model.eval()
    with torch.no_grad():
        assert greedy(model, src, mask, max_len=10) == [t for _, t in pairs]


@pytest.mark.parametrize("feed", [True, False])
def test_autocast_bf16_forward(feed):
    model = make_model(input_feeding=feed, d_model=32, rnn_hidden=32)
    src, mask, trg_in = random_batch()
    with torch.no_grad():
        ref = model(src, mask, trg_in)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(src, mask, trg_in)
            state = model.init_state(model.encode(src, mask))
            step_logits, _ = model.decode_step(trg_in[:, 0], state)
    assert torch.isfinite(low).all() and torch.isfinite(step_logits).all()
    # bf16 keeps 8 significand bits (relative rounding error 2^-9 ~ 0.2%); after a few dozen
    # roundings through recurrence, attention and output layer the measured error is ~0.5% of the
    # largest logit, so 5% leaves a 10x margin while still catching e.g. a mask or state mix-up.
    scale = ref.abs().max()
    assert (low.float() - ref).abs().max() < 0.05 * scale
    assert (step_logits.float() - ref[:, 0]).abs().max() < 0.05 * scale
    # Training under autocast: the backward pass runs and gives finite gradients.
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(src, mask, trg_in).float().logsumexp(-1).mean()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.encoder.weight_ih_l0.grad is not None and model.combine.weight.grad is not None


def test_lstm_step_equals_nn_lstm_values_and_gradients():
    """The decoder's hand-written LSTM step computes what nn.LSTM does, and trains its parameters."""
    torch.manual_seed(0)
    emb_size, feed_size, hidden_size = 5, 3, 4
    lstm = nn.LSTM(emb_size + feed_size, hidden_size, num_layers=2, batch_first=True)
    emb, feed = torch.randn(6, emb_size), torch.randn(6, feed_size)
    h0, c0 = torch.randn(2, 6, hidden_size), torch.randn(2, 6, hidden_size)

    out, (h_ref, c_ref) = lstm(torch.cat([emb, feed], -1).unsqueeze(1), (h0, c0))
    (h_ref.sum() + 2 * c_ref.sum()).backward()
    grads_ref = [p.grad.clone() for p in lstm.parameters()]
    lstm.zero_grad()

    weights = LSTMStepWeights.of(lstm, emb_size)
    top, h, c = lstm_step(weights.project(emb), feed, h0, c0, weights, dropout=lambda x: x)
    torch.testing.assert_close(h, h_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(c, c_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(top, out[:, 0], atol=1e-6, rtol=1e-5)
    (h.sum() + 2 * c.sum()).backward()
    for p, g in zip(lstm.parameters(), grads_ref):
        torch.testing.assert_close(p.grad, g, atol=1e-6, rtol=1e-5)


# ---- reordering ----


def assert_memory_rows(state, memory, rows: list[int]) -> None:
    """Row i of the state's memory is row rows[i] of ``encode``'s."""
    for name in ("outputs", "keys", "mask"):
        assert torch.equal(getattr(state.memory, name), getattr(memory, name)[rows]), name


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_reorder_copies_the_memory_only_when_rows_change_sentence(cell):
    """Beams reordered within their sentences keep the memory (N, S, H_enc) as it is, not copied;
    the first step's K rows per sentence, rows taking another sentence's place and sentences
    leaving select it. Either way each row reads its own sentence's memory, and the next step
    is the same as from a state whose memory was copied row by row."""
    model = make_model(rnn_cell=cell)
    src, mask, _ = random_batch(batch=3)
    tokens = torch.tensor([5, 6, 7, 8, 9, 10])
    with torch.no_grad():
        memory = model.encode(src, mask)
        _, state = model.decode_step(torch.full((3,), BOS), model.init_state(memory))
        beams = model.reorder_state(state, torch.tensor([0, 0, 1, 1, 2, 2]))  # K = 2 per sentence
        assert_memory_rows(beams, memory, [0, 0, 1, 1, 2, 2])
        _, beams = model.decode_step(tokens, beams)

        within = torch.tensor([1, 0, 2, 2, 5, 4])
        reordered = model.reorder_state(beams, within)
        assert reordered.memory is beams.memory
        copied = replace(reordered, memory=beams.memory.index_select(within))
        assert torch.equal(model.decode_step(tokens, reordered)[0], model.decode_step(tokens, copied)[0])

        across = model.reorder_state(reordered, torch.tensor([2, 3, 0, 1, 4, 5]))  # same N, sentences swapped
        assert_memory_rows(across, memory, [1, 1, 0, 0, 2, 2])
        left = model.reorder_state(reordered, torch.tensor([0, 1, 4, 5]))  # sentence 1 leaves
        assert_memory_rows(left, memory, [0, 0, 2, 2])
        assert torch.equal(left.hidden, reordered.hidden[:, [0, 1, 4, 5]])
