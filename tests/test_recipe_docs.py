"""The recipe searches the docs describe: their commands train the variants their tables name."""

from __future__ import annotations

import glob
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from nmt.cli import main
from nmt.config import load_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from recipe_search import parse_variant  # noqa: E402


def search_command(doc: Path) -> tuple[Path, dict[str, list[str]]]:
    """The base config and the variants (name -> --set overrides) of the recipe_search command in ``doc``."""
    block = re.search(r"```sh\n(.*?)```", doc.read_text(), re.S).group(1)
    words = shlex.split(block.replace("\\\n", " ").splitlines()[0])
    base = ROOT / words[words.index("--base") + 1]
    variants = dict(parse_variant(words[i + 1]) for i, w in enumerate(words) if w == "--variant")
    return base, variants


def test_rnn_recipe_search_command_trains_the_variants_of_its_table():
    # (max_tokens, lr_peak, schedule, dropout) as docs/rnn_recipe.md's table describes each variant:
    # `base` is the peers' recipe, the others change it.
    described = {
        "base": (4096, 1e-3, "inverse_sqrt", 0.2),
        "lr2e-3": (4096, 2e-3, "inverse_sqrt", 0.2),
        "lr2e-3-tok2048-linear": (2048, 2e-3, "linear", 0.2),
        "lr3e-3-tok2048-linear": (2048, 3e-3, "linear", 0.2),
        "lr2e-3-tok1024-linear": (1024, 2e-3, "linear", 0.2),
        "lr2e-3-tok2048-linear-drop0.3": (2048, 2e-3, "linear", 0.3),
    }
    base, variants = search_command(ROOT / "docs" / "rnn_recipe.md")
    assert base == ROOT / "configs" / "multi30k_rnn.yaml"
    assert variants.keys() == described.keys()
    for name, sets in variants.items():
        # what scripts/recipe_search.py's command() adds for a 15-minute budget
        cfg = load_config(base, [*sets, "train.max_minutes=15", "train.max_updates=null"])
        trained = (cfg.train.max_tokens, cfg.train.lr_peak, cfg.train.schedule, cfg.model.dropout)
        assert trained == described[name], name
    # The winner is the shipped config's recipe.
    shipped = load_config(base).train
    assert (shipped.max_tokens, shipped.lr_peak, shipped.schedule) == described["lr2e-3-tok1024-linear"][:3]


def plot_command(doc: Path) -> list[str]:
    """The words of the ``nmt plot`` line in ``doc``'s command block."""
    block = re.search(r"```sh\n(.*?)```", doc.read_text(), re.S).group(1)
    line = next(line for line in block.splitlines() if line.startswith("nmt plot "))
    return shlex.split(line)


def write_search_round(out: Path, names: list[str]) -> None:
    """What scripts/recipe_search.py leaves in its --out: a run directory per variant, its log beside
    it, and the results table."""
    for name in names:
        (out / name).mkdir(parents=True)
        records = [
            {"type": "train", "update": 1, "epoch": 1, "loss": 5.0, "nll": 4.9, "lr": 1e-3, "grad_norm": 1.0}
            | {"trg_tokens": 100, "src_tokens": 100, "elapsed": 1.0},
            {"type": "valid", "update": 1, "epoch": 1, "dev_loss": 4.0, "dev_ppl": 54.6, "dev_bleu": 1.0}
            | {"best_bleu": 1.0, "elapsed": 2.0, "seconds": 1.0},
        ]
        (out / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (out / f"{name}.log").write_text("training log\n")
    (out / "results.md").write_text("| rank | variant |\n")
    (out / "results.json").write_text("[]\n")


@pytest.mark.parametrize("doc", ["recipe_search.md", "rnn_recipe.md"])
def test_the_docs_plot_command_draws_the_runs_of_a_search(doc, tmp_path, monkeypatch):
    # The plot line's globs must pick the variants' run directories only: recipe_search.py writes
    # NAME.log, results.md and results.json beside them, which 'nmt plot' refuses as runs.
    words = plot_command(ROOT / "docs" / doc)
    patterns = [w for w in words[2:] if "*" in w]
    assert patterns
    monkeypatch.chdir(tmp_path)
    for pattern in patterns:
        write_search_round(Path(pattern.split("*")[0]), ["base", "lr2e-3"])
    expanded = [path for w in words[2:] for path in (sorted(glob.glob(w)) if "*" in w else [w])]
    assert main([words[1], *expanded]) == 0
    assert (tmp_path / words[words.index("--out") + 1] / "index.md").is_file()
