"""Attention maps: for each output piece, the weights the decoder put on each source piece while
choosing it, as recorded by the search itself (``Hypothesis.attention``), not recomputed.

``nmt translate --attention DIR`` writes, per translated line N, ``DIR/NNNNN.json`` (the pieces, the
chosen weights, and every layer and head) and ``DIR/NNNNN.png`` (a heatmap: source pieces along
x, output pieces down y). The Transformer records cross-attention per decoder layer and head
(choose one, or the mean); the RNN records its single alignment (one layer, one head).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.errors import NMTError
from nmt.files import atomic_write, atomic_write_bytes
from nmt.models import ModelConfig, TransformerConfig
from nmt.search import Hypothesis
from nmt.tokenizer import Tokenizer


@dataclass(frozen=True)
class Selection:
    """Which weights a map shows: a layer and a head (indices; negative counts from the end), or the
    mean over them (None)."""

    layer: int | None = -1
    head: int | None = None

    @staticmethod
    def parse(text: str, option: str) -> int | None:
        if text == "mean":
            return None
        try:
            return int(text)
        except ValueError:
            raise NMTError(f"{option} {text!r}: expected a number or 'mean'") from None

    def check(self, layers: int, heads: int) -> None:
        for name, index, size in (("--attention-layer", self.layer, layers), ("--attention-head", self.head, heads)):
            if index is not None and not -size <= index < size:
                raise NMTError(f"{name} {index}: the model has {size} (0..{size - 1}, or negative from the end)")

    def describe(self) -> str:
        layer = "mean of layers" if self.layer is None else f"layer {self.layer}"
        return f"{layer}, {'mean of heads' if self.head is None else f'head {self.head}'}"

    def apply(self, weights: torch.Tensor) -> torch.Tensor:
        """(steps, layers, heads, S) -> (steps, S); a mean of distributions is still one (rows sum to 1)."""
        w = weights.mean(dim=1) if self.layer is None else weights[:, self.layer]
        return w.mean(dim=1) if self.head is None else w[:, self.head]


def choose(layer: str | None, head: str | None, model: ModelConfig) -> Selection:
    """``--attention-layer`` and ``--attention-head`` as given (a number or 'mean'; None: not given,
    the last layer and the mean of its heads), checked against what ``model`` records."""
    default = Selection()
    selection = Selection(
        default.layer if layer is None else Selection.parse(layer, "--attention-layer"),
        default.head if head is None else Selection.parse(head, "--attention-head"),
    )
    selection.check(*recorded_shape(model))
    return selection


def recorded_shape(model: ModelConfig) -> tuple[int, int]:
    """(layers, heads) a model records: the RNN has one alignment, the Transformer one per decoder
    layer and head."""
    if isinstance(model, TransformerConfig):
        return model.decoder_layers, model.heads
    return 1, 1


def figure_class():
    """matplotlib's Figure (no pyplot: nothing global), or the error naming the extra to install."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise NMTError("attention maps need matplotlib: pip install 'nmt[report]'") from None
    return Figure


def labels(src_tok: Tokenizer, trg_tok: Tokenizer, src_ids: list[int], hyp: Hypothesis) -> tuple[list[str], ...]:
    """Source pieces with their EOS, and the output pieces, with EOS when the hypothesis ended on it."""
    target = trg_tok.pieces(hyp.tokens) + (["</s>"] if hyp.steps > len(hyp.tokens) else [])
    return src_tok.pieces(src_ids) + ["</s>"], target


def record(index: int, source: str, translation: str, src: list[str], trg: list[str], hyp: Hypothesis, sel: Selection):
    weights = hyp.attention  # (steps, layers, heads, S)
    return {
        "line": index,
        "source": source,
        "translation": translation,
        "source_pieces": src,
        "target_pieces": trg,
        "selection": {"layer": sel.layer, "head": sel.head},
        "weights": sel.apply(weights).tolist(),  # [target piece][source piece]
        "weights_by_layer_and_head": weights.permute(1, 2, 0, 3).tolist(),  # [layer][head][target][source]
    }


# A side's inches per labelled piece, and the most inches a side gets: a line of 561 source and 845
# output pieces (an RNN has no max_positions to stop it) made a 254 x 297-inch figure whose PNG
# took 24 GB and was killed; at 40 inches (4,400 pixels at 110 dpi) a PNG needs about 80 MB.
SOURCE_PIECE_INCHES, OUTPUT_PIECE_INCHES = 0.45, 0.35
MAX_SIDE_INCHES = 40.0


@dataclass(frozen=True)
class Axis:
    """One side of a heatmap: its length in inches and every ``step``-th piece labelled."""

    inches: float
    step: int


def axis_layout(pieces: int, inches_per_piece: float, margin: float, least: float) -> Axis:
    """Room for every piece's label up to MAX_SIDE_INCHES; past it, every step-th label, the cells narrower."""
    step = max(1, math.ceil(pieces * inches_per_piece / (MAX_SIDE_INCHES - margin)))
    return Axis(min(MAX_SIDE_INCHES, max(least, inches_per_piece * pieces + margin)), step)


def heatmap(rec: dict, title: str):
    """A matplotlib Figure of one record's chosen weights."""
    Figure = figure_class()
    src, trg, weights = rec["source_pieces"], rec["target_pieces"], rec["weights"]
    x = axis_layout(len(src), SOURCE_PIECE_INCHES, margin=2.0, least=4.0)
    y = axis_layout(len(trg), OUTPUT_PIECE_INCHES, margin=1.5, least=3.0)
    fig = Figure(figsize=(x.inches, y.inches))
    ax = fig.add_subplot()
    image = ax.imshow(weights, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(0, len(src), x.step), src[:: x.step], rotation=60, ha="right", fontsize=9)
    ax.set_yticks(range(0, len(trg), y.step), trg[:: y.step], fontsize=9)
    ax.set_xlabel("source pieces")
    ax.set_ylabel("output pieces")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="attention weight")
    fig.tight_layout()
    return fig


class AttentionWriter:
    """Writes the JSON and PNG of each translated line into ``out_dir`` (each file atomically)."""

    def __init__(self, out_dir: Path, src_tok: Tokenizer, trg_tok: Tokenizer, selection: Selection, images: bool):
        self.out_dir, self.src_tok, self.trg_tok = out_dir, src_tok, trg_tok
        self.selection, self.images = selection, images
        self.written = 0

    def __call__(self, index: int, source: str, translation: str, hyp: Hypothesis) -> None:
        src_ids = self.src_tok.encode([source])[0][: hyp.attention.shape[-1] - 1]  # as truncated for the model
        src, trg = labels(self.src_tok, self.trg_tok, src_ids, hyp)
        rec = record(index, source, translation, src, trg, hyp, self.selection)
        stem = self.out_dir / f"{index:05d}"
        atomic_write_bytes(stem.with_suffix(".json"), json.dumps(rec, ensure_ascii=False).encode("utf-8"))
        if self.images:
            fig = heatmap(rec, f"line {index} ({self.selection.describe()})")
            atomic_write(stem.with_suffix(".png"), lambda f: fig.savefig(f, format="png", dpi=110))
        self.written += 1
