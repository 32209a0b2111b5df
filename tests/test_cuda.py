"""What only a GPU can show: the CUDA kernels compute what the CPU ones do, fused AdamW and fp16
loss scaling behave, autotune picks a fast precision, and a tiny model overfits to BLEU 100 on the
GPU. Skipped without one; ``make gpu-check`` runs them (their logic is covered on CPU elsewhere)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config

from nmt import autotune
from nmt.cli import main
from nmt.device import cuda_has_bf16
from nmt.kernel_choice import Request
from nmt.kernel_timing import decide
from nmt.loss import fp32_block_rows, label_smoothed_nll
from nmt.models.transformer import Transformer, TransformerConfig
from nmt.search import beam_search, greedy_search, max_output_lengths

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)"),
]
GPU = torch.device("cuda")
PAD, BOS, EOS = 0, 1, 2


def _model(seed: int = 0, V: int = 50, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(d_model=64, ff_size=128, encoder_layers=2, decoder_layers=2, heads=4, dropout=0.0, **kw)
    return Transformer(cfg, V, V, PAD).eval()


def _sources(n: int, V: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (n,), generator=g)
    src = torch.full((n, int(lengths.max())), PAD)
    for i, length in enumerate(lengths.tolist()):
        src[i, : length - 1] = torch.randint(3, V, (length - 1,), generator=g)
        src[i, length - 1] = EOS
    return src, src != PAD


def test_loss_and_gradient_on_gpu_equal_cpu_across_several_blocks():
    V = 32000
    N = fp32_block_rows(V, "cuda") + 37  # two blocks on the GPU, hundreds on the CPU
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(1, N, V, generator=g) * 3).requires_grad_()
    target = torch.randint(0, V, (1, N), generator=g)
    target[0, ::7] = PAD
    results = []
    for device in ("cpu", "cuda"):
        x = logits.detach().to(device).requires_grad_()
        loss, nll = label_smoothed_nll(x, target.to(device), 0.1, PAD)
        loss.backward()
        results.append((loss.item(), nll.item(), x.grad.cpu()))
    (l_cpu, n_cpu, g_cpu), (l_gpu, n_gpu, g_gpu) = results
    assert l_gpu == pytest.approx(l_cpu, rel=1e-5) and n_gpu == pytest.approx(n_cpu, rel=1e-5)
    torch.testing.assert_close(g_gpu, g_cpu, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_kernels_agree_on_gpu(dtype):
    src, mask = _sources(6, 50)
    trg = torch.randint(3, 50, (6, 9))
    outputs = []
    for kernel in ("sdpa", "explicit"):
        model = _model().to(GPU)
        model.set_attention_kernel(kernel)
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            outputs.append(model(src.to(GPU), mask.to(GPU), trg.to(GPU)).float())
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(outputs[0], outputs[1], atol=tolerance, rtol=tolerance)


def test_incremental_decoding_on_gpu_matches_the_forward_pass():
    model = _model().to(GPU)
    src, mask = _sources(5, 50)
    trg = torch.randint(3, 50, (5, 7))
    src, mask, trg = src.to(GPU), mask.to(GPU), trg.to(GPU)
    with torch.no_grad():
        full = model(src, mask, trg)
        state = model.init_state(model.encode(src, mask))
        for t in range(trg.shape[1]):
            logits, state = model.decode_step(trg[:, t], state)
            torch.testing.assert_close(logits, full[:, t], atol=1e-4, rtol=1e-4)


def test_greedy_and_beam_search_on_gpu_find_what_the_cpu_finds():
    """fp32 on both: the same hypotheses, or (where two scores tie to rounding) ones scored the same."""
    model = _model(V=40)
    src, mask = _sources(24, 40)
    limit = max_output_lengths(mask, 1.5, 5)
    cpu_beam = beam_search(model, src, mask, limit, 5, 1.0, BOS, EOS)
    cpu_greedy = [h.tokens for h in greedy_search(model, src, mask, torch.full_like(limit, 20), BOS, EOS)]
    model.to(GPU)
    src, mask, limit = src.to(GPU), mask.to(GPU), limit.to(GPU)
    gpu_beam = beam_search(model, src, mask, limit, 5, 1.0, BOS, EOS)
    gpu_greedy = [h.tokens for h in greedy_search(model, src, mask, torch.full_like(limit, 20), BOS, EOS)]
    for cpu_hyps, gpu_hyps in zip(cpu_beam, gpu_beam):
        assert gpu_hyps[0].score(1.0) == pytest.approx(cpu_hyps[0].score(1.0), abs=1e-4)  # the best one's score
    assert sum(a == b for a, b in zip(cpu_greedy, gpu_greedy)) >= len(cpu_greedy) - 1


def test_fused_adamw_on_gpu_matches_the_plain_loop():
    torch.manual_seed(0)
    weights = [torch.randn(64, 32), torch.randn(32)]
    grads = [[torch.randn_like(w) for w in weights] for _ in range(5)]
    finals = []
    for fused in (True, False):
        params = [torch.nn.Parameter(w.clone().to(GPU)) for w in weights]
        opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.01, fused=fused)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.to(GPU)
            opt.step()
        finals.append([p.detach().cpu() for p in params])
    for a, b in zip(*finals):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_fp16_grad_scaler_on_gpu_skips_an_overflowing_step():
    w = torch.nn.Parameter(torch.ones(2, device=GPU))
    opt = torch.optim.AdamW([w], lr=1.0, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    scale = scaler.get_scale()
    scaler.scale((w * torch.tensor([float("inf"), 1.0], device=GPU)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(w.detach().cpu(), torch.ones(2)) and scaler.get_scale() < scale
    opt.zero_grad()
    scaler.scale((w * 2).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(w.detach().cpu(), torch.ones(2))  # a finite step is taken


def test_autotune_on_gpu_picks_a_half_precision_where_tensor_cores_exist(tmp_path):
    model = TransformerConfig(d_model=512, ff_size=2048, heads=8, norm="pre")
    choice = autotune.choose(Request(), model, 8000, 16384, 128, GPU, print, cache=tmp_path)
    grid = choice.timings["precision/attention"]
    precisions = list(dict.fromkeys(k.split("/")[0] for k in grid))
    assert (choice.precision, choice.attention) == decide(grid, precisions, ["sdpa", "explicit"])
    assert choice.threads is None
    if cuda_has_bf16():
        assert choice.precision in ("bf16", "fp16")


def test_tiny_model_overfits_to_bleu_100_on_gpu_and_its_checkpoint_translates_on_cpu(tmp_path, capsys):
    config = tiny_config(tmp_path, precision="auto", device="cuda")
    assert main(["train", "--config", str(config)]) == 0
    data, run = tmp_path / "data", str(tmp_path / "run")
    for device in ("cuda", "cpu"):
        capsys.readouterr()
        args = ["eval-bleu", "--model", run, "--src", str(data / "train.de"), "--ref", str(data / "train.en")]
        assert main(args + ["--json", "--device", device]) == 0
        assert json.loads(capsys.readouterr().out)["bleu"] == pytest.approx(100.0)
