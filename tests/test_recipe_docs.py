"""The recipe searches the docs describe: their commands train the variants their tables name."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

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
