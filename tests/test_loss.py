"""Label-smoothed NLL against hand computations."""

import math

import pytest
import torch
import torch.nn.functional as F

from nmt.loss import label_smoothed_nll

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
