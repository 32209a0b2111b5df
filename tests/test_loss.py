"""Label-smoothed NLL against hand computations."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import padded_training_batch

import nmt.loss as loss_module
from nmt.loss import label_smoothed_nll, projected_label_smoothed_nll

PAD = 0


def hand_loss(logits, target, eps):
    """Explicit loops: q(k) = (1 - eps) [k == y] + eps / V over all V columns, pad rows skipped."""
    loss = nll = 0.0
    B, T, V = logits.shape
    for b in range(B):
        for t in range(T):
            y = int(target[b, t])
            if y == PAD:
                continue
            row = [float(x) for x in logits[b, t]]
            lse = math.log(sum(math.exp(x) for x in row))
            logp = [x - lse for x in row]
            nll += -logp[y]
            loss += -sum(((1 - eps) * (k == y) + eps / V) * logp[k] for k in range(V))
    return loss, nll


def example():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g) * 3
    target = torch.tensor([[3, 1, PAD], [4, PAD, PAD]])
    return logits, target


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_hand_computation(eps):
    logits, target = example()
    loss, nll = label_smoothed_nll(logits, target, eps, PAD)
    exp_loss, exp_nll = hand_loss(logits, target, eps)
    assert loss.item() == pytest.approx(exp_loss, rel=1e-5)
    assert nll.item() == pytest.approx(exp_nll, rel=1e-5)
    if eps > 0:
        assert loss.item() != pytest.approx(nll.item(), rel=1e-3)


def test_pad_positions_ignored():
    logits, target = example()
    loss, nll = label_smoothed_nll(logits, target, 0.1, PAD)
    scrambled = logits.clone()
    scrambled[target == PAD] = torch.randn(int((target == PAD).sum()), 5) * 100
    loss2, nll2 = label_smoothed_nll(scrambled, target, 0.1, PAD)
    assert loss2.item() == pytest.approx(loss.item()) and nll2.item() == pytest.approx(nll.item())


def test_no_smoothing_equals_cross_entropy_sum():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, 11, generator=g)
    target = torch.randint(0, 11, (4, 6), generator=g)
    loss, nll = label_smoothed_nll(logits, target, 0.0, PAD)
    ref = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref)


def test_bf16_logits_computed_in_fp32():
    logits, target = example()
    loss, nll = label_smoothed_nll(logits.bfloat16(), target, 0.1, PAD)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
    exp_loss, _ = hand_loss(logits.bfloat16().float(), target, 0.1)
    assert loss.item() == pytest.approx(exp_loss, rel=1e-5)


def test_gradient_flows_and_minimum_is_smoothed_distribution():
    """The smoothed loss is minimised by p = q, not by the one-hot: check the gradient there is 0."""
    V, eps, y = 5, 0.2, 3
    q = torch.full((V,), eps / V)
    q[y] += 1 - eps
    logits = q.log().view(1, 1, V).clone().requires_grad_(True)
    loss, _ = label_smoothed_nll(logits, torch.tensor([[y]]), eps, PAD)
    loss.backward()
    assert logits.grad.abs().max() < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_closed_form_gradient_equals_autograd_of_the_formula(dtype):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11).to(dtype).requires_grad_()
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = PAD
    loss, _ = label_smoothed_nll(logits, target, 0.1, PAD)
    (0.7 * loss).backward()
    closed_form = logits.grad.float().clone()
    logits.grad = None
    lp = torch.log_softmax(logits.float(), -1)
    per_token = 0.9 * -lp.gather(-1, target[..., None]).squeeze(-1) - (0.1 / 11) * lp.sum(-1)
    (0.7 * (per_token * (target != PAD)).sum()).backward()
    assert torch.allclose(closed_form, logits.grad.float(), atol=1e-6 if dtype == torch.float32 else 1e-2)
    assert closed_form[0, 3:].abs().max() == 0  # padding gets no gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reused_logits_give_the_same_gradients_and_hold_them(dtype):
    """``reuse_logits`` (training) writes the gradient over the logits: the same loss and gradients
    reach the layer below as without it (fp32 computes p from the exponentials the forward pass kept,
    so equal up to rounding), and the logits' storage then holds exactly that gradient."""
    torch.manual_seed(1)
    h = torch.randn(4, 6, 8)
    target = torch.randint(1, 37, (4, 6))
    target[1, 4:] = PAD
    grads, losses = [], []
    for reuse in (False, True):
        w = torch.randn(37, 8, generator=torch.Generator().manual_seed(2)).requires_grad_()
        logits = F.linear(h.to(dtype), w.to(dtype))  # as the model's tied output projection
        loss, _ = label_smoothed_nll(logits, target, 0.1, PAD, reuse_logits=reuse)
        losses.append(loss.item())
        seen = []
        logits.register_hook(seen.append)
        (loss / 20).backward()
        grads.append(w.grad)
        if reuse:
            assert seen[0].data_ptr() == logits.data_ptr()  # no second (N, V) tensor
            assert torch.equal(logits.detach(), seen[0])
    if dtype == torch.float32:
        assert losses[0] == pytest.approx(losses[1], rel=1e-6)
        assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-8)
    else:  # bf16 logits recompute p in the backward pass either way
        assert losses[0] == losses[1] and torch.equal(grads[0], grads[1])


# -- the output layer and the loss together, block by block (fp32 CPU training)


def projected_example(bias: bool):
    g = torch.Generator().manual_seed(3)
    features = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64)
    b = torch.randn(9, generator=g, dtype=torch.float64) if bias else None
    target = torch.tensor([[3, 1, 8, 2, PAD], [4, 7, PAD, PAD, PAD]])
    return features, weight, b, target


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("block_rows", [1, 3, 1024])
def test_projected_loss_matches_hand_computation_and_autograd_of_the_formula(monkeypatch, bias, block_rows):
    """Every block size (one row, blocks that do not divide the rows, one block; the loss's passes in
    pieces of two rows) gives the hand computation's loss over features W^T + b, and gradients for
    features, W and b that equal autograd through the formula, scaled by the incoming gradient;
    padding rows get none."""
    monkeypatch.setattr(loss_module, "projection_block_rows", lambda vocab: block_rows)
    monkeypatch.setattr(loss_module, "fp32_block_rows", lambda vocab, device_type: 2)  # pieces within blocks
    features, weight, b, target = projected_example(bias)
    logits = F.linear(features, weight, b)
    want_loss, want_nll = hand_loss(logits, target, 0.1)
    leaves = [t.clone().requires_grad_() for t in (features, weight, b) if t is not None]
    loss, nll = projected_label_smoothed_nll(leaves[0], leaves[1], leaves[2] if bias else None, target, 0.1, PAD)
    assert loss.item() == pytest.approx(want_loss, rel=1e-12)
    assert nll.item() == pytest.approx(want_nll, rel=1e-12)
    got = torch.autograd.grad(0.37 * loss, leaves)
    formula = [t.clone().requires_grad_() for t in (features, weight, b) if t is not None]
    lp = torch.log_softmax(F.linear(*formula), -1)
    per_token = 0.9 * -lp.gather(-1, target[..., None]).squeeze(-1) - (0.1 / 9) * lp.sum(-1)
    want = torch.autograd.grad(0.37 * (per_token * (target != PAD)).sum(), formula)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert got[0][0, 4].abs().max() == 0 and got[0][1, 2:].abs().max() == 0


def test_projected_loss_without_gradients_gives_the_same_sums():
    features, weight, b, target = projected_example(bias=True)
    with_graph = projected_label_smoothed_nll(features.requires_grad_(), weight, b, target, 0.1, PAD)
    with torch.inference_mode():
        without = projected_label_smoothed_nll(features, weight, b, target, 0.1, PAD)
    assert [t.item() for t in without] == [t.item() for t in with_graph]


@pytest.mark.parametrize("model_type", ["transformer", "rnn"])
def test_training_loss_on_a_cpu_in_fp32_equals_the_loss_of_the_models_logits(model_type):
    """``teacher_forced_loss`` (fp32 CPU: the loss applies the output layer, tied to the target
    embeddings in the Transformer, with a bias in the RNN) gives the loss and the gradient of every
    parameter that the model's own logits do."""
    from nmt.device import Precision
    from nmt.loss import projects_with_loss, teacher_forced_loss
    from nmt.models import build_model
    from nmt.models.rnn import RNNConfig
    from nmt.models.transformer import TransformerConfig

    assert projects_with_loss("cpu", "fp32") and not projects_with_loss("cpu", "bf16")
    cfg = TransformerConfig(d_model=16, ff_size=32, heads=2, dropout=0.0) if model_type == "transformer" else None
    cfg = cfg or RNNConfig(d_model=16, rnn_hidden=16, encoder_layers=1, decoder_layers=1, dropout=0.0, tie_output=False)
    torch.manual_seed(0)
    model = build_model(cfg, 23, 23, PAD)
    batch = padded_training_batch(3, 6, 5, 23, PAD)
    results = []
    for projected in (True, False):
        model.zero_grad(set_to_none=True)
        if projected:
            loss, nll = teacher_forced_loss(model, model, batch, 0.1, PAD, Precision("cpu", "fp32"))
        else:
            logits = model(batch.src, batch.src_mask, batch.trg_in)
            loss, nll = label_smoothed_nll(logits, batch.trg_out, 0.1, PAD)
        (loss / 7).backward()
        results.append((loss.item(), nll.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_a, nll_a, grads_a), (loss_b, nll_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-6) and nll_a == pytest.approx(nll_b, rel=1e-6)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7, msg=name)
