"""Attention maps show the weights the search used: checked against the model's own teacher-forced
attention for every hypothesis of a batched, padded, reordered beam search."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import PAIRS, tiny_config

from nmt.cli import main
from nmt.models.multihead import attention_weights, split_heads
from nmt.models.rnn import RNNConfig, RNNSeq2Seq
from nmt.models.transformer import Transformer, TransformerConfig
from nmt.search import beam_search, greedy_search, max_output_lengths

PAD, BOS, EOS, V = 0, 1, 2, 23


def sources(lengths=(6, 3, 9, 4)):
    g = torch.Generator().manual_seed(1)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(3, V, (n - 1,), generator=g)
        src[i, n - 1] = EOS
    return src, src != PAD


def transformer(kernel: str) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=32, ff_size=64, encoder_layers=2, decoder_layers=2, heads=4, dropout=0.0)
    model = Transformer(cfg, V, V, PAD).eval()
    model.set_attention_kernel(kernel)
    return model


def teacher_forced_transformer_weights(model: Transformer, src, mask, hyp) -> torch.Tensor:
    """(steps, layers, heads, S): the cross-attention of a teacher-forced pass over the hypothesis,
    recomputed from what each cross-attention sublayer was given."""
    captured = []

    def hook(module, args, output):
        h, (k, _), m = args
        (q,) = split_heads(module.q(h), 1, module.heads)
        captured.append(attention_weights(q, k, m)[0])  # (H, T, S)

    handles = [layer.cross_attn.register_forward_hook(hook) for layer in model.decoder]
    ended = hyp.steps > len(hyp.tokens)
    trg_in = torch.tensor([[BOS] + hyp.tokens[: hyp.steps - 1] if ended else [BOS] + hyp.tokens[:-1]])
    with torch.no_grad():
        model(src, mask, trg_in)
    for h in handles:
        h.remove()
    return torch.stack(captured).permute(2, 0, 1, 3)  # (T, L, H, S)


def check_recorded(hyp, expected: torch.Tensor, n_src: int) -> None:
    got = hyp.attention
    assert got.shape[0] == hyp.steps == expected.shape[0]
    torch.testing.assert_close(got[..., :n_src], expected, atol=1e-5, rtol=1e-5)
    assert torch.all(got[..., n_src:] == 0)  # padding gets exactly nothing
    torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]))


@pytest.mark.parametrize("kernel", ["sdpa", "explicit"])
@pytest.mark.parametrize("beam", [1, 4])
def test_transformer_maps_are_the_weights_the_search_used(kernel, beam):
    model = transformer(kernel)
    src, mask = sources()
    limit = max_output_lengths(mask, 1.2, 4)
    if beam == 1:
        found = [[h] for h in greedy_search(model, src, mask, limit, BOS, EOS, attention=True)]
    else:
        found = beam_search(model, src, mask, limit, beam, 1.0, BOS, EOS, nbest=3, attention=True)
    for i, hyps in enumerate(found):
        n = int(mask[i].sum())
        for hyp in hyps:  # every n-best entry, each reordered with its own beam
            check_recorded(
                hyp, teacher_forced_transformer_weights(model, src[i : i + 1, :n], mask[i : i + 1, :n], hyp), n
            )


def test_rnn_maps_are_its_alignment():
    torch.manual_seed(0)
    cfg = RNNConfig(d_model=16, rnn_hidden=16, encoder_layers=1, decoder_layers=1, attention="general", dropout=0.0)
    model = RNNSeq2Seq(cfg, V, V, PAD).eval()
    src, mask = sources()
    found = beam_search(model, src, mask, max_output_lengths(mask, 1.2, 4), 3, 1.0, BOS, EOS, attention=True)
    for i, hyps in enumerate(found):
        n, hyp = int(mask[i].sum()), hyps[0]
        captured: list[torch.Tensor] = []
        handle = model.attention.register_forward_hook(lambda mod, args, out, into=captured: into.append(out[1][0]))
        trg_in = torch.tensor([[BOS] + (hyp.tokens if hyp.steps > len(hyp.tokens) else hyp.tokens[:-1])])
        with torch.no_grad():
            model(src[i : i + 1, :n], mask[i : i + 1, :n], trg_in)
        handle.remove()
        expected = torch.cat(captured)[:, None, None, :]  # (T, 1, 1, S)
        check_recorded(hyp, expected, n)


def test_translate_writes_maps_and_json(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=60, validate_every=60)
    assert main(["train", "--config", str(config)]) == 0
    src = tmp_path / "in.de"
    src.write_text(f"{PAIRS[0][0]}\n\n{PAIRS[3][0]}\n")
    out = tmp_path / "maps"
    args = ["translate", "--model", str(tmp_path / "run"), "-i", str(src), "--attention", str(out)]
    assert main(args + ["--attention-head", "2"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["00000.json", "00000.png", "00002.json", "00002.png"]
    rec = json.loads((out / "00002.json").read_text())
    assert rec["source"] == PAIRS[3][0] and rec["source_pieces"][-1] == "</s>"
    weights = torch.tensor(rec["weights"])
    assert weights.shape == (len(rec["target_pieces"]), len(rec["source_pieces"]))
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[0]))
    full = torch.tensor(rec["weights_by_layer_and_head"])  # (layers, heads, target, source)
    torch.testing.assert_close(weights, full[-1, 2])
    assert (out / "00000.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    for extra, message in (
        (["--attention-layer", "5"], "--attention-layer 5: the model has 1"),
        (["--attention-head", "x"], "--attention-head 'x': expected a number or 'mean'"),
    ):
        assert main(args + extra) == 2
        assert message in capsys.readouterr().err
    assert (
        main(
            ["translate", "--model", str(tmp_path / "run"), "-i", str(src), "--attention", str(tmp_path / "run" / "m")]
        )
        == 2
    )
    assert "inside the run directory" in capsys.readouterr().err


@pytest.mark.parametrize("source_pieces, output_pieces", [(5, 4), (561, 845)])
def test_heatmap_of_a_long_line_stays_small_and_labels_what_fits(source_pieces, output_pieces):
    pytest.importorskip("matplotlib")
    from nmt.attention_maps import heatmap

    # An RNN has no max_positions: a 561-piece line translated into 845 pieces made a 254 x 297-inch figure.
    src = [f"s{i}" for i in range(source_pieces)]
    trg = [f"t{i}" for i in range(output_pieces)]
    rec = {"source_pieces": src, "target_pieces": trg, "weights": torch.rand(output_pieces, source_pieces).tolist()}
    fig = heatmap(rec, "long line")
    width, height = fig.get_size_inches()
    assert width <= 40 and height <= 40  # at 110 dpi a PNG of at most 4,400 x 4,400 pixels
    ax = fig.axes[0]
    x_labels = [t.get_text() for t in ax.get_xticklabels()]
    y_labels = [t.get_text() for t in ax.get_yticklabels()]
    assert x_labels[0] == "s0" and y_labels[0] == "t0"
    if source_pieces < 10:  # short lines keep a label per piece
        assert x_labels == src and y_labels == trg
    else:  # at most one label per 0.3 inch: readable, and bounded
        assert len(x_labels) <= width / 0.3 and len(y_labels) <= height / 0.3
