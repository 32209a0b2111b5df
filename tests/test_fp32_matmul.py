"""fp32 CPU products through oneDNN (``train.fp32_matmul: onednn``) compute what the BLAS path
computes: each layer's value and gradients, the loss's output layer, whole training steps, decoding
and translation; the choice is measured, cached and checked like the other ``auto`` keys."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import PAIRS, padded_training_batch, tiny_config

from nmt import autotune, kernel_timing
from nmt.cli import main
from nmt.device import Precision
from nmt.errors import NMTError
from nmt.kernel_choice import NO_KERNEL, Choice, Request
from nmt.loss import projected_label_smoothed_nll, projection_block_rows, teacher_forced_loss
from nmt.models import build_model, linear
from nmt.models.linear import Linear, onednn_affine, onednn_available, onednn_mm, onednn_rows_product
from nmt.models.rnn import RNNConfig
from nmt.models.transformer import TransformerConfig
from nmt.rundir import RunDir
from nmt.search import beam_search, greedy_search
from nmt.translate import load_translator

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN products")
PAD = 0


@needs_onednn
def test_onednn_mm_is_the_product_of_plain_and_transposed_operands():
    g = torch.Generator().manual_seed(0)
    a, b, c = torch.randn(40, 24, generator=g), torch.randn(30, 40, generator=g), torch.randn(24, 7, generator=g)
    torch.testing.assert_close(onednn_mm(a, c), a @ c)
    torch.testing.assert_close(onednn_mm(a.t(), b.t()), a.t() @ b.t())  # both transposed views


@needs_onednn
@pytest.mark.parametrize("widths", [(24, 56), (56, 24), (32, 32)])
def test_onednn_rows_product_sums_over_rows_whichever_operand_is_narrower(widths):
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(70, widths[0], generator=g), torch.randn(70, widths[1], generator=g)
    product = onednn_rows_product(a, b)
    assert product.shape == widths
    torch.testing.assert_close(product, a.t() @ b)


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(6, 32), (3, 5, 32), "transposed"])
@pytest.mark.parametrize("out_features", [48, 20])  # wider and narrower than the input
def test_onednn_linear_equals_the_affine_map_in_value_and_gradients(bias, shape, out_features):
    torch.manual_seed(0)
    layer = Linear(32, out_features, bias=bias)
    layer.fp32_matmul = "onednn"
    x = torch.randn(32, 6).t() if shape == "transposed" else torch.randn(*shape)
    x.requires_grad_()
    y = layer(x)
    reference = F.linear(x, layer.weight, layer.bias)
    assert y.shape == reference.shape
    torch.testing.assert_close(y, reference)
    g = torch.randn_like(y)
    inputs = [t for t in (x, layer.weight, layer.bias) if t is not None]
    got = torch.autograd.grad(y, inputs, g)
    want = torch.autograd.grad(reference, inputs, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@needs_onednn
def test_onednn_products_are_reproducible():
    """Resuming a run must give the uninterrupted run's bits: the same product twice, the same bits."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(300, 256, generator=g), torch.randn(256, 1000, generator=g)
    assert torch.equal(onednn_mm(a, b), onednn_mm(a, b))


@needs_onednn
@pytest.mark.parametrize("sentences", [3, 160])  # one block of rows; two, whose weight gradients add up
def test_projected_loss_through_onednn_equals_the_blas_path(sentences):
    g = torch.Generator().manual_seed(3)
    features = torch.randn(sentences, 7, 16, generator=g)
    weight, bias = torch.randn(50, 16, generator=g), torch.randn(50, generator=g)
    target = torch.randint(1, 50, (sentences, 7), generator=g)
    target[2, 4:] = PAD
    assert (sentences * 7 > projection_block_rows(50)) == (sentences == 160)
    results = []
    for library in ("blas", "onednn"):
        leaves = [t.clone().requires_grad_() for t in (features, weight, bias)]
        loss, nll = projected_label_smoothed_nll(*leaves, target, 0.1, PAD, library)
        results.append((loss, nll, torch.autograd.grad(0.5 * loss, leaves)))
    (loss_a, nll_a, grads_a), (loss_b, nll_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a)
    torch.testing.assert_close(nll_b, nll_a)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a)


def _model_and_batch(model_type: str = "transformer"):
    cfg = TransformerConfig(d_model=32, ff_size=64, heads=4, dropout=0.0, encoder_layers=2, decoder_layers=2)
    if model_type == "rnn":
        cfg = RNNConfig(d_model=32, rnn_hidden=24, encoder_layers=2, decoder_layers=2, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg, 40, 40, PAD)
    return model, padded_training_batch(4, 9, 8, 40, PAD)


@needs_onednn
@pytest.mark.parametrize("model_type", ["transformer", "rnn"])  # the LSTM: its output layer and loss
def test_a_training_step_through_onednn_equals_the_blas_step(model_type, monkeypatch):
    model, batch = _model_and_batch(model_type)
    calls = []
    monkeypatch.setattr(linear, "onednn_affine", lambda *args: calls.append(1) or F.linear(*args))
    results = []
    for library in ("blas", "onednn"):
        calls.clear()
        model.set_fp32_matmul(library)
        model.zero_grad(set_to_none=True)
        loss, _ = teacher_forced_loss(model, model, batch, 0.1, PAD, Precision("cpu", "fp32"))
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        assert bool(calls) == (library == "onednn")
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_set_fp32_matmul_reaches_every_linear_layer_and_the_output_layer(monkeypatch):
    model, batch = _model_and_batch()
    model.set_fp32_matmul("onednn")
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    assert layers and all(m.fp32_matmul == "onednn" for m in layers) and model.fp32_matmul == "onednn"
    calls = []
    monkeypatch.setattr(linear, "onednn_affine", lambda *args: calls.append(1) or F.linear(*args))
    with torch.no_grad():  # validation and translation: every layer and the output layer
        model(batch.src, batch.src_mask, batch.trg_in)
    assert len(calls) == len(layers) + 1
    calls.clear()
    model(batch.src, batch.src_mask, batch.trg_in, features_only=True)  # training: the loss applies the output layer
    assert len(calls) == len(layers)


@needs_onednn
def test_decoding_through_onednn_finds_what_the_blas_finds():
    """Greedy and beam search take the same steps with either library: each step's logits agree,
    and so do the hypotheses and their scores."""
    model, batch = _model_and_batch()
    with torch.no_grad():
        model.trg_embed.weight.mul_(4.0)  # the tied output layer: confident steps, far from ties
    model.eval()
    limit = torch.full((batch.src.shape[0],), 7)
    found = {}
    for library in ("blas", "onednn"):
        model.set_fp32_matmul(library)
        with torch.no_grad():
            state = model.init_state(model.encode(batch.src, batch.src_mask))
            logits = []
            for token in batch.trg_in.T[:4]:  # teacher-forced steps through the caches
                step, state = model.decode_step(token, state)
                logits.append(step)
            greedy = greedy_search(model, batch.src, batch.src_mask, limit, 1, 2)
            beam = beam_search(model, batch.src, batch.src_mask, limit, 3, 1.0, 1, 2, nbest=2)
        found[library] = (torch.stack(logits), greedy, beam)
    (logits_a, greedy_a, beam_a), (logits_b, greedy_b, beam_b) = found["blas"], found["onednn"]
    torch.testing.assert_close(logits_b, logits_a, rtol=1e-5, atol=1e-5)
    assert [h.tokens for h in greedy_b] == [h.tokens for h in greedy_a]
    assert [[h.tokens for h in n] for n in beam_b] == [[h.tokens for h in n] for n in beam_a]
    for n_a, n_b in zip(beam_a, beam_b):
        assert [h.log_prob for h in n_b] == pytest.approx([h.log_prob for h in n_a], rel=1e-5)


@needs_onednn
def test_translation_uses_the_library_the_run_names(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, max_updates=30, validate_every=30, fp32_matmul="onednn")
    assert main(["train", "--config", str(config)]) == 0
    run = RunDir.existing(tmp_path / "run")
    translator = load_translator(run, "cpu")
    model = translator.model
    assert model.fp32_matmul == "onednn" and all(
        m.fp32_matmul == "onednn" for m in model.modules() if isinstance(m, Linear)
    )
    lines = [s for s, _ in PAIRS]
    attention, library = translator.kernels  # the pair each translation decodes with
    assert library == "onednn"
    calls = []
    monkeypatch.setattr(linear, "onednn_affine", lambda *args: calls.append(1) or onednn_affine(*args))
    through_onednn = translator.translate(lines, run.config().decode)
    assert calls
    calls.clear()
    blas = dataclasses.replace(translator, kernels=(attention, "blas"))
    through_blas = blas.translate(lines, run.config().decode)
    assert not calls
    assert through_blas == through_onednn
    monkeypatch.setattr(autotune, "onednn_available", lambda: False)  # a torch build without oneDNN
    with pytest.raises(NMTError, match="train.fp32_matmul.*cannot send products to oneDNN"):
        load_translator(run, "cpu")


# ---------------------------------------------------------------------------- the measured choice

CPU = torch.device("cpu")
SMALL = TransformerConfig(d_model=32, ff_size=64, heads=4)


@pytest.fixture
def counted(monkeypatch):
    calls = []

    def fake(request, shape, device, world_threads=None):
        calls.append(request)
        return Choice("fp32", "sdpa", 1, {"fp32 matmul": {"blas": 2.0, "onednn": 1.0}}, "measured", "x", None, "onednn")

    monkeypatch.setattr(autotune, "measure", fake)
    return calls


def _choose(tmp_path, request: Request, model=SMALL) -> Choice:
    return autotune.choose(request, model, 50, 4096, 100, CPU, lambda m: None, cache=tmp_path)


@needs_onednn
def test_auto_library_is_measured_only_where_it_can_matter(tmp_path, counted):
    assert _choose(tmp_path, Request("fp32", "sdpa", 1, "auto")).fp32_matmul == "onednn"
    assert len(counted) == 1
    assert _choose(tmp_path, Request("fp32", "sdpa", 1, "auto")).source == "cached"
    rnn = RNNConfig(d_model=16, rnn_hidden=16, encoder_layers=1, decoder_layers=1)  # its output layer takes it too
    assert _choose(tmp_path, Request("fp32", "sdpa", 1, "auto"), rnn).fp32_matmul == "onednn"
    assert len(counted) == 2
    # bf16 has no fp32 products, a named library is not measured: nothing to measure
    bf16 = _choose(tmp_path, Request("bf16", "sdpa", 1, "auto"))
    assert (bf16.source, bf16.fp32_matmul) == ("config", "blas")
    named = _choose(tmp_path, Request("fp32", "sdpa", 1, "onednn"))
    assert (named.source, named.fp32_matmul) == ("config", "onednn")
    assert len(counted) == 2


def test_a_cached_entry_with_an_unknown_library_is_measured_again(tmp_path, counted, monkeypatch):
    monkeypatch.setattr(autotune, "measures_fp32_matmul", lambda *args: True)
    _choose(tmp_path, Request("fp32", "sdpa", 1, "auto"))
    path = tmp_path / autotune.CACHE_FILE
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry["fp32_matmul"] = "atlas"
    path.write_text(json.dumps(data))
    assert _choose(tmp_path, Request("fp32", "sdpa", 1, "auto")).source == "measured"
    assert len(counted) == 2


@needs_onednn
def test_the_measurement_times_both_libraries_and_keeps_the_faster(monkeypatch):
    """The real measurement: both libraries are timed on fp32 steps, and the choice follows the
    figures by ``pick``'s rule (the BLAS unless oneDNN is MARGIN faster)."""
    shape = kernel_timing.tuning_shape(SMALL, 50, 256, 16, "cpu")
    choice = kernel_timing.measure(Request("fp32", "sdpa", 1, "auto"), shape, CPU)
    options = choice.timings["fp32 matmul"]
    assert set(options) == {"blas", "onednn"} and all(ms > 0 for ms in options.values())
    assert choice.fp32_matmul == kernel_timing.pick(options, "blas")
    assert f"fp32 matmul {choice.fp32_matmul}," in choice.describe()


@needs_onednn
def test_decoding_is_measured_with_both_libraries_for_the_lstm_too():
    """The real decoding measurement on the LSTM baseline (no attention choice: its library only):
    its steps run with each library and the choice follows ``pick``'s rule from training's library."""
    rnn = RNNConfig(d_model=16, rnn_hidden=16, encoder_layers=1, decoder_layers=1)
    shape = kernel_timing.tuning_shape(rnn, 50, 256, 16, "cpu")
    choice = kernel_timing.measure(Request("fp32", "auto", 1, "auto"), shape, CPU)
    decoding = choice.timings["decoding"]
    assert set(decoding) == {"blas", "onednn"} and all(ms > 0 for ms in decoding.values())
    assert choice.decoding() == (NO_KERNEL, kernel_timing.pick(decoding, choice.fp32_matmul))


def test_an_unknown_library_is_a_one_line_error(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=2, warmup_updates=1)
    assert main(["train", "--config", str(config), "--set", "train.fp32_matmul=mkl"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.fp32_matmul" in err and "mkl" in err
    assert not (tmp_path / "run").exists()  # refused before any work


def test_onednn_on_a_gpu_or_without_onednn_is_refused_by_name(monkeypatch):
    autotune.check_fp32_matmul("blas", "cuda")
    with pytest.raises(NMTError, match="train.fp32_matmul.*CPU library"):
        autotune.check_fp32_matmul("onednn", "cuda")
    monkeypatch.setattr(autotune, "onednn_available", lambda: False)  # for check_fp32_matmul
    monkeypatch.setattr(kernel_timing, "onednn_available", lambda: False)  # for measures_fp32_matmul
    autotune.check_fp32_matmul("auto", "cpu")
    with pytest.raises(NMTError, match="train.fp32_matmul.*cannot send products to oneDNN"):
        autotune.check_fp32_matmul("onednn", "cpu")
    assert not kernel_timing.measures_fp32_matmul(Request("fp32", "sdpa", 1, "auto"), "cpu")


def test_a_compiled_layer_leaves_its_products_to_the_compiler():
    """torch.compile cannot lower the oneDNN op with a transposed weight: under tracing the layer
    takes the plain path, and the compiled layer computes the affine map and its gradients."""
    torch.manual_seed(0)
    layer = Linear(16, 24)
    layer.fp32_matmul = "onednn"
    x = torch.randn(5, 16, requires_grad=True)
    y = torch.compile(layer, dynamic=False)(x)
    reference = F.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(y, reference)
    g = torch.randn_like(y)
    inputs = (x, layer.weight, layer.bias)
    for got, want in zip(torch.autograd.grad(y, inputs, g), torch.autograd.grad(reference, inputs, g)):
        torch.testing.assert_close(got, want)
