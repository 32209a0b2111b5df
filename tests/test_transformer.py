"""Transformer: masking, padding invariance, incremental decoding, autocast, tying."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import padded_training_batch

from nmt.device import Precision
from nmt.loss import teacher_forced_loss
from nmt.models import build_model
from nmt.models.linear import Linear
from nmt.models.multihead import Packing, split_heads, subsequent_mask
from nmt.models.transformer import FeedForward, Transformer, TransformerConfig, sinusoidal_positions

PAD, BOS, EOS, V = 0, 1, 2, 23


KERNELS = ["sdpa", "explicit"]


def make(norm="post", seed=0, kernel="sdpa", **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(d_model=32, ff_size=64, encoder_layers=2, decoder_layers=2, heads=4, norm=norm, **kw)
    model = Transformer(cfg, V, V, PAD).eval()
    model.set_attention_kernel(kernel)
    return model


def batch(B=3, S=7, T=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (B, S), generator=g)
    src[:, -1] = EOS
    trg_in = torch.randint(3, V, (B, T), generator=g)
    trg_in[:, 0] = BOS
    return src, torch.ones(B, S, dtype=torch.bool), trg_in


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_is_causal(norm, kernel):
    model = make(norm, kernel=kernel)
    src, mask, trg = batch()
    base = model(src, mask, trg)
    for j in range(1, trg.shape[1]):
        changed = trg.clone()
        changed[:, j] = (changed[:, j] + 5) % V
        out = model(src, mask, changed)
        torch.testing.assert_close(out[:, :j], base[:, :j], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[:, j], base[:, j], atol=1e-3)  # the changed position does see it


def test_both_attention_kernels_compute_the_same_function():
    """SDPA and the explicit formula: same logits and gradients, with source padding and the causal mask."""
    src, mask, trg = batch(B=3, S=7, T=6)
    mask[1, 4:] = False
    src[1, 4:] = PAD
    outputs = {}
    for kernel in KERNELS:
        model = make("pre", kernel=kernel, dropout=0.0).train()  # training mode: the masked training paths
        logits = model(src, mask, trg)
        logits.float().pow(2).mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outputs[kernel] = (logits.detach(), grads)
    (a, ga), (b, gb) = outputs["sdpa"], outputs["explicit"]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert ga.keys() == gb.keys() and len(ga) > 10
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-5, rtol=1e-4, msg=name)


def test_unknown_attention_kernel_is_refused():
    with pytest.raises(ValueError, match="attention kernel"):
        make().set_attention_kernel("flash")


def test_subsequent_mask():
    m = subsequent_mask(4)
    assert m.dtype == torch.bool and m[2, 2] and m[2, 0] and not m[1, 2] and not m[0, 3]


def test_sinusoidal_positions_are_the_papers_from_position_0():
    """P[pos, 2i] = sin(pos / 10000^(2i/d)), P[pos, 2i+1] = cos(pos / 10000^(2i/d)) (Vaswani et al., 2017,
    section 3.5), entry by entry, an odd d included; position t of a sentence reads row t. The other tests
    compare the model with itself and the export writes this very table, so only this sees it shifted or swapped."""
    for d in (6, 7):
        table = sinusoidal_positions(5, d)
        assert table.shape == (5, d)
        for pos in range(5):
            for j in range(d):
                angle = pos / 10000 ** (2 * (j // 2) / d)
                want = math.sin(angle) if j % 2 == 0 else math.cos(angle)
                assert table[pos, j].item() == pytest.approx(want, abs=1e-6), (d, pos, j)
    model = make()
    torch.testing.assert_close(model.positions(0, 7), sinusoidal_positions(7, 32))
    torch.testing.assert_close(model.positions(3, 4), sinusoidal_positions(7, 32)[3:])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_source_padding_changes_nothing(norm, kernel):
    model = make(norm, kernel=kernel)
    src, mask, trg = batch(S=5)
    padded = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    mem, mem_p = model.encode(src, mask), model.encode(padded, padded_mask)
    torch.testing.assert_close(mem_p.padded()[:, :5], mem.padded(), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(mem_p.padded()).all()  # padded rows attend to real keys: no NaN
    torch.testing.assert_close(model(padded, padded_mask, trg), model(src, mask, trg), atol=1e-5, rtol=1e-5)


def test_mixed_lengths_in_one_batch_match_single_sentences():
    model = make("pre")
    src, mask, trg = batch(B=2, S=6)
    mask[0, 3:] = False
    src[0, 3:] = PAD
    src[0, 2] = EOS
    both = model(src, mask, trg)
    alone = model(src[:1, :3], mask[:1, :3], trg[:1])
    torch.testing.assert_close(both[:1], alone, atol=1e-5, rtol=1e-5)


def test_a_compiled_model_encodes_padded_rows_without_a_graph_break():
    """train.compile on a CPU: the packed encoder's branch on the mask's values (and the packing's
    data-dependent size) broke torch.compile's graph, with a 15-line warning at the first update."""
    dynamo = pytest.importorskip("torch._dynamo")  # tracing only: no C++ compiler needed
    model = make()
    src, mask, trg = batch(B=2, S=6)
    mask[0, 3:] = False
    src[0, 3:] = PAD
    explained = dynamo.explain(model)(src, mask, trg)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_compiled_training_step_has_no_graph_break(precision):
    """train.compile: the byte-mask dropout's in-place random_ broke torch.compile's graph at every
    dropout (39 breaks in this 2+2-layer model's step), so the compiler fused nothing across them. Under
    tracing dropout is F.dropout; the forward of a training step (model and loss, every dropout on,
    the explicit attention whose weights go through ``dropout``) is one graph."""
    dynamo = pytest.importorskip("torch._dynamo")  # tracing only: no C++ compiler needed
    model = make(kernel="explicit", dropout=0.1, attention_dropout=0.1, activation_dropout=0.1).train()
    torch.manual_seed(2)
    batch = padded_training_batch(3, 7, 6, V, PAD)
    dynamo.reset()  # a graph another test traced would be reused, not explained

    def step(batch):
        return teacher_forced_loss(model, model, batch, 0.1, PAD, Precision("cpu", precision))

    explained = dynamo.explain(step)(batch)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_packed_encoder_gradients_equal_each_sentence_alone(norm):
    """A padded batch (encoded on its real rows only, see Packing) gives the same parameter
    gradients as its sentences run one by one without padding (and so without packing)."""
    src, mask, trg = batch(B=3, S=7, T=6)
    lengths = [3, 7, 5]
    for b, n in enumerate(lengths):
        mask[b, n:] = False
        src[b, n:] = PAD
        src[b, n - 1] = EOS
    model = make(norm, dropout=0.0).train()
    model(src, mask, trg).pow(2).sum().backward()
    together = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    for b, n in enumerate(lengths):
        model(src[b : b + 1, :n], mask[b : b + 1, :n], trg[b : b + 1]).pow(2).sum().backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(together[k], p.grad, atol=1e-4, rtol=1e-4, msg=k)


def test_packing_round_trip_and_unpack_gradient():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    packing = Packing(mask)
    assert packing.rows.tolist() == [0, 1, 4, 5, 6, 7, 8]
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    padded = packing.unpack(x)
    assert padded.shape == (3, 4, 5)
    assert padded[~mask].eq(0).all() and torch.equal(padded[mask], x)
    assert torch.equal(packing.pack(padded), x)
    torch.autograd.gradcheck(packing.unpack, (x,))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_incremental_decoding_matches_forward(norm, kernel):
    model = make(norm, kernel=kernel, dropout=0.3)  # dropout must be off in eval mode
    src, mask, trg = batch(B=3, S=7, T=6)
    mask[1, 4:] = False
    src[1, 4:] = PAD
    with torch.no_grad():
        full = model(src, mask, trg)  # (B, T, V)
        state = model.init_state(model.encode(src, mask))
        for t in range(trg.shape[1]):
            logits, state = model.decode_step(trg[:, t], state)
            torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_incremental_decoding_after_reorder(kernel):
    """Rows duplicated, permuted and dropped mid-sentence continue as their source rows."""
    model = make("post", kernel=kernel)
    src, mask, trg = batch(B=3, S=7, T=6)
    with torch.no_grad():
        full = model(src, mask, trg)
        state = model.init_state(model.encode(src, mask))
        state = model.reorder_state(state, torch.tensor([0, 0, 1, 1, 2, 2]))  # beams, grouped
        rows = torch.tensor([0, 0, 1, 1, 2, 2])
        for t in range(3):
            logits, state = model.decode_step(trg[rows, t], state)
            torch.testing.assert_close(logits, full[rows, t], atol=1e-5, rtol=1e-5)
        plans = [torch.tensor([1, 0, 3, 2, 5, 4]), torch.tensor([4, 5, 0, 1]), torch.tensor([3, 1, 2])]
        for t, index in zip(range(3, 6), plans):  # within-sentence swaps, a sentence leaving, ungrouped rows
            state = model.reorder_state(state, index)
            rows = rows[index]
            logits, state = model.decode_step(trg[rows, t], state)
            torch.testing.assert_close(logits, full[rows, t], atol=1e-5, rtol=1e-5)
        assert state.group == 0  # the last plan is not grouped: exercised the gather path


def test_two_reorders_without_a_step_compose():
    model = make("pre")
    src, mask, trg = batch(B=2, T=4)
    with torch.no_grad():
        full = model(src, mask, trg)
        state = model.init_state(model.encode(src, mask))
        rows = torch.arange(2)
        for t in range(4):
            if t == 2:
                for index in (torch.tensor([1, 0]), torch.tensor([0, 0, 1])):
                    state, rows = model.reorder_state(state, index), rows[index]
            logits, state = model.decode_step(trg[rows, t], state)
            torch.testing.assert_close(logits, full[rows, t], atol=1e-5, rtol=1e-5)
        assert rows.tolist() == [1, 1, 0]


def test_bf16_autocast_close_to_fp32():
    """bf16 keeps 8 mantissa bits (relative error 2^-9 ~ 0.2% per rounding); through 4 layers of
    matmuls the logits (std ~1) drift by a few 1e-2 at most. 0.1 absolute, with the argmax
    agreeing almost everywhere, separates "bf16 rounding" from a real bug (wrong mask, NaN)."""
    model = make("post")
    src, mask, trg = batch(B=4, S=9, T=8)
    with torch.no_grad():
        ref = model(src, mask, trg)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(src, mask, trg)
    assert low.dtype == torch.bfloat16  # output stays in the autocast dtype
    assert (low.float() - ref).abs().max() < 0.1
    assert (low.float().argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_bf16_incremental_decoding_runs_and_is_close():
    model = make("pre")
    src, mask, trg = batch(B=2, T=4)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(src, mask, trg)
        state = model.init_state(model.encode(src, mask))
        for t in range(4):
            logits, state = model.decode_step(trg[:, t], state)
            assert (logits.float() - full[:, t].float()).abs().max() < 0.1


def test_tying_shares_storage():
    tied = make(tie_embeddings=True, tie_output=True)
    assert tied.src_embed.weight.data_ptr() == tied.trg_embed.weight.data_ptr()
    assert tied.out_proj is None
    untied = make(tie_embeddings=False, tie_output=False)
    assert untied.src_embed.weight.data_ptr() != untied.trg_embed.weight.data_ptr()
    assert untied.out_proj.weight.data_ptr() != untied.trg_embed.weight.data_ptr()
    n_tied, n_untied = tied.num_parameters(), untied.num_parameters()
    assert n_untied - n_tied == 2 * V * 32  # one embedding and one output matrix saved
    with pytest.raises(ValueError):
        Transformer(TransformerConfig(d_model=32, heads=4, tie_embeddings=True), V, V + 1, PAD)


def test_tied_output_gradient_reaches_embedding():
    model = make(tie_embeddings=True, tie_output=True).train()
    src, mask, trg = batch()
    loss = F.cross_entropy(model(src, mask, trg).flatten(0, 1), trg.flatten())
    loss.backward()
    assert model.trg_embed.weight.grad is not None and model.trg_embed.weight.grad.abs().sum() > 0


def test_init():
    model = make(tie_embeddings=False)
    assert model.src_embed.weight[PAD].abs().sum() == 0 and model.trg_embed.weight[PAD].abs().sum() == 0
    std = model.trg_embed.weight[3:].std().item()
    assert abs(std - 32**-0.5) < 0.05
    assert model.decoder[0].cross_attn.kv.bias.abs().sum() == 0


def test_learned_positions_variant():
    model = make("pre", positions="learned", max_positions=16)
    src, mask, trg = batch()
    out = model(src, mask, trg)
    assert out.shape == (3, 6, V) and torch.isfinite(out).all()
    with torch.no_grad():
        state = model.init_state(model.encode(src, mask))
        logits, _ = model.decode_step(trg[:, 0], state)
    torch.testing.assert_close(logits, out[:, 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        model(src, mask, torch.full((1, 17), 5))


def test_flops_per_token_equals_an_independent_count():
    """torch's FlopCounterMode counts every matrix product of a real forward and backward pass; the
    formula counts the decoder's causal self-attention as half (only the past is used), the counter
    the whole T x T square: that is the one known difference."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = TransformerConfig(d_model=32, ff_size=64, encoder_layers=2, decoder_layers=3, heads=4, dropout=0.0)
    model = build_model(cfg, V, V, PAD)
    assert isinstance(model, Transformer)
    model.set_attention_kernel("explicit")
    B, S, T = 3, 7, 5
    src = torch.randint(4, V, (B, S))
    trg = torch.randint(4, V, (B, T))
    with FlopCounterMode(display=False) as counter:
        model(src, torch.ones(B, S, dtype=torch.bool), trg).float().sum().backward()
    counted_per_token = counter.get_total_flops() / (B * T)
    causal_square = 6 * cfg.decoder_layers * T * cfg.d_model
    assert model.flops_per_token(S, T) + causal_square == pytest.approx(counted_per_token, rel=1e-9)


# -- the fast CPU forms of the layers compute what the plain formulas do, values and gradients


def _grads(output: torch.Tensor, grad: torch.Tensor, inputs) -> list[torch.Tensor]:
    return list(torch.autograd.grad(output, inputs, grad))


@pytest.mark.parametrize("shape", [(6, 32), (3, 5, 32)])
def test_linear_equals_the_affine_map(shape):
    torch.manual_seed(0)
    layer = Linear(32, 48)
    x = torch.randn(*shape, requires_grad=True)
    y = layer(x)
    reference = F.linear(x, layer.weight, layer.bias)
    assert y.shape == reference.shape
    assert torch.allclose(y, reference, atol=1e-6)
    g = torch.randn_like(y)
    inputs = (x, layer.weight, layer.bias)
    for got, want in zip(_grads(y, g, inputs), _grads(reference, g, inputs)):
        assert torch.allclose(got, want, atol=1e-5)
    assert set(layer.state_dict()) == {"weight", "bias"}  # checkpoints and exports see an nn.Linear


def test_linear_under_bf16_autocast_is_nn_linear():
    layer = Linear(32, 48)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, reference = layer(x), F.linear(x, layer.weight, layer.bias)
    assert y.dtype == torch.bfloat16 and torch.equal(y, reference)


def test_split_heads_gradient_equals_autograd_of_the_views():
    torch.manual_seed(0)
    B, T, H, hd = 3, 5, 4, 8
    x = torch.randn(B, T, 3 * H * hd, requires_grad=True)
    q, k, v = split_heads(x, 3, H)
    plain = x.view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4).unbind(0)
    for got, want in zip((q, k, v), plain):
        assert torch.equal(got, want)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    reference = F.scaled_dot_product_attention(*plain, is_causal=True)
    g = torch.randn_like(y)
    assert torch.equal(_grads(y, g, [x])[0], _grads(reference, g, [x])[0])
    # a part nothing depends on gets a zero gradient, the others theirs
    q, k, v = split_heads(x, 3, H)
    (grad,) = _grads(q * 2.0, torch.ones_like(q), [x])
    parts = grad.view(B, T, 3, -1)
    assert torch.equal(parts[:, :, 0], torch.full_like(parts[:, :, 0], 2.0))
    assert parts[:, :, 1:].abs().max() == 0


def test_feed_forward_equals_the_formula():
    torch.manual_seed(0)
    ff = FeedForward(16, 64)
    x = torch.randn(3, 5, 16, requires_grad=True)
    y = ff(x)
    reference = F.linear(F.relu(F.linear(x, ff.up.weight, ff.up.bias)), ff.down.weight, ff.down.bias)
    assert torch.allclose(y, reference, atol=1e-6)
    g = torch.randn_like(y)
    inputs = [x, ff.up.weight, ff.up.bias, ff.down.weight, ff.down.bias]
    for got, want in zip(_grads(y, g, inputs), _grads(reference, g, inputs)):
        assert torch.allclose(got, want, atol=1e-5)
