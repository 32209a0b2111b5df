"""The byte-mask dropout: the rate it applies, unbiased scaling, seeding, and its gradient."""

import pytest
import torch

from nmt.models.dropout import Dropout, add_dropout, byte_dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_rate_and_unbiased_scale(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = byte_dropout(x, p)
    p_eff = round(256 * p) / 256
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p_eff) < 0.003  # 1e6 samples: std about 3e-4
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - p_eff)))
    assert abs(y.mean().item() - 1.0) < 0.005


def test_seeded_and_eval_is_identity():
    x = torch.randn(64, 32)
    torch.manual_seed(1)
    a = byte_dropout(x, 0.1)
    torch.manual_seed(1)
    b = byte_dropout(x, 0.1)
    assert torch.equal(a, b)
    module = Dropout(0.1).eval()
    assert module(x) is x


def test_gradient_is_the_mask():
    torch.manual_seed(0)
    x = torch.randn(50, 40, requires_grad=True)
    y = byte_dropout(x, 0.2)
    y.sum().backward()
    scale = 256 / (256 - round(256 * 0.2))
    expected = (y.detach() != 0).float() * scale
    assert torch.allclose(x.grad, expected)


def test_bf16_keeps_dtype():
    x = torch.randn(10, 10, dtype=torch.bfloat16)
    assert byte_dropout(x, 0.1).dtype == torch.bfloat16


def test_add_dropout_is_the_sum_with_the_same_mask():
    """The residual form draws byte_dropout's mask from the same stream: x + dropout(h), with the
    gradient of x passed on as it is and that of h masked and scaled."""
    x = torch.randn(40, 30, requires_grad=True)
    h = torch.randn(40, 30, requires_grad=True)
    torch.manual_seed(3)
    y = add_dropout(x, h, 0.2)
    torch.manual_seed(3)
    reference = x + byte_dropout(h, 0.2)
    assert torch.allclose(y, reference, atol=1e-6)
    g = torch.randn_like(y)
    gx, gh = torch.autograd.grad(y, (x, h), g)
    rx, rh = torch.autograd.grad(reference, (x, h), g)
    assert torch.equal(gx, g) and torch.equal(gx, rx)
    assert torch.allclose(gh, rh)
    assert ((gh == 0) == (reference.detach() == x.detach())).all()  # dropped exactly where h was


def test_add_dropout_of_a_bf16_sublayer_keeps_the_dtypes():
    x = torch.randn(8, 16, requires_grad=True)  # the fp32 residual stream under autocast
    h = torch.randn(8, 16, dtype=torch.bfloat16, requires_grad=True)
    y = add_dropout(x, h, 0.1)
    assert y.dtype == torch.float32
    gx, gh = torch.autograd.grad(y.sum(), (x, h))
    assert gx.dtype == torch.float32 and gh.dtype == torch.bfloat16


def test_add_dropout_without_dropout_is_the_sum():
    x, h = torch.randn(4, 4), torch.randn(4, 4)
    assert torch.equal(add_dropout(x, h, 0.0), x + h)


@pytest.mark.parametrize("p", [0.001, 0.002, 0.01, 0.999])
def test_a_rate_bytes_cannot_apply_is_applied_exactly(p):
    """Byte masks round a rate to 1/256: 0.001 would drop nothing, 0.999 everything, 0.002 twice as
    much. Such rates are applied as asked, by the module and by the residual sum alike."""
    x = torch.ones(1000, 1000)
    torch.manual_seed(0)
    dropped = (Dropout(p).train()(x) == 0).float().mean().item()
    summed = add_dropout(torch.zeros_like(x), x, p)
    dropped_in_sum = (summed == 0).float().mean().item()
    tolerance = 5 * (p * (1 - p) / x.numel()) ** 0.5  # 5 standard deviations of 1e6 draws
    assert abs(dropped - p) < tolerance and abs(dropped_in_sum - p) < tolerance
    kept = summed[summed != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - p)))


def test_a_rate_of_one_drops_everything_in_the_residual_sum_too():
    # bytes_apply(1.0) held (0 <= 0.02 * 0): the residual sum built a byte mask of scale 1 / 0
    x, h = torch.randn(4, 8), torch.randn(4, 8)
    assert torch.equal(add_dropout(x, h, 1.0), x) and torch.equal(dropout(h, 1.0), torch.zeros_like(h))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.9])
def test_the_usual_rates_keep_byte_masks(p):
    """From 0.1 to 0.9 the byte masks' rate is within 2% of p and of 1 - p: they stay, as p_eff."""
    torch.manual_seed(0)
    y = Dropout(p).train()(torch.ones(1000, 1000))
    torch.manual_seed(0)
    assert torch.equal(y, byte_dropout(torch.ones(1000, 1000), p))
