"""The embedded synthetic corpus: determinism, disjoint splits, reordering and agreement."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nmt import synthetic as syn
from nmt.errors import NMTError


def words(text: str) -> list[str]:
    return text.rstrip(".").lower().split()


def test_same_seed_same_pairs_different_seed_different() -> None:
    assert syn.generate_pairs(200, seed=3) == syn.generate_pairs(200, seed=3)
    assert syn.generate_pairs(200, seed=3) != syn.generate_pairs(200, seed=4)


def test_pairs_are_distinct_and_well_formed() -> None:
    pairs = syn.generate_pairs(500, seed=1)
    assert len({s for s, _ in pairs}) == 500
    for s, t in pairs:
        for text in (s, t):
            assert text[0].isupper() and text.endswith(".")
            assert all(w.isascii() and w.isalpha() and w.islower() for w in words(text))


def test_length_distribution_in_range() -> None:
    lengths = [len(words(s)) for s, _ in syn.generate_pairs(2000, seed=1)]
    assert min(lengths) >= 5 and max(lengths) <= 25
    assert 8 <= sum(lengths) / len(lengths) <= 16
    assert sum(n >= 14 for n in lengths) > 0.1 * len(lengths)


def test_lexicon_is_fixed_and_unambiguous() -> None:
    lex = syn.build_lexicon()
    assert lex == syn.LEXICON
    assert {n.gender for n in lex.nouns} == set(syn.GENDERS)
    for side in ("src", "trg"):
        stems = [getattr(w, side) for group in (lex.nouns, lex.verbs, lex.adjs, lex.preps, lex.advs) for w in group]
        assert len(stems) == len(set(stems))


def test_verb_moves_to_the_end() -> None:
    rng = random.Random(7)
    moved = 0
    for _ in range(500):
        s = syn.sample_sentence(rng)
        src, trg = syn.source_tokens(s), syn.target_tokens(s)
        assert trg[-1].startswith(s.verb.trg)
        src_pos = src.index(s.verb.src) / len(src)
        moved += src_pos < 0.8
    assert moved > 0.5 * 500


def test_articles_adjectives_and_verbs_agree() -> None:
    rng = random.Random(11)
    for _ in range(500):
        s = syn.sample_sentence(rng)
        trg = syn.target_tokens(s)
        subj = s.subj
        g, n = subj.noun.gender, subj.number
        noun_form = subj.noun.trg + (syn.TRG_NOUN_PL[g] if n == "pl" else "")
        if subj.det == "def":
            assert trg[:2] == [syn.TRG_DEF[(g, n)], noun_form]
        elif subj.det == "indef":
            assert trg[:2] == [syn.TRG_INDEF[g], noun_form]
        elif subj.det == "dem":
            assert trg[0] == noun_form and trg[1 + len(subj.adjs)] == syn.TRG_DEM[(g, n)]
        start = trg.index(noun_form) + 1
        # Adjectives follow the noun, mirrored, with the gender/number ending.
        expected_adjs = [a.trg + syn.TRG_ADJ_END[(g, n)] for a in reversed(subj.adjs)]
        assert trg[start : start + len(subj.adjs)] == expected_adjs
        assert trg[-1] == s.verb.trg + syn.TRG_VERB_END[n]
        if s.rel:
            assert syn.TRG_REL[(g, n)] in trg
            assert s.rel[0].trg + syn.TRG_VERB_END[n] in trg


def test_agreement_visible_in_rendered_text() -> None:
    """Plural subjects end the target sentence with a plural verb, singular ones with a singular verb."""
    rng = random.Random(5)
    for _ in range(300):
        s = syn.sample_sentence(rng)
        last = words(syn.render(syn.target_tokens(s)))[-1]
        assert last.endswith(syn.TRG_VERB_END[s.subj.number])


def test_corpus_splits_disjoint_and_sized(tmp_path: Path) -> None:
    prefixes = syn.write_synthetic_corpus(tmp_path, "xx", "yy", n_train=400, n_dev=50, n_test=60, seed=2)
    assert set(prefixes) == {"train", "dev", "test"}
    lines = {}
    for split, prefix in prefixes.items():
        src = Path(f"{prefix}.xx").read_text().splitlines()
        trg = Path(f"{prefix}.yy").read_text().splitlines()
        assert len(src) == len(trg)
        lines[split] = set(src)
    assert [len(lines[k]) for k in ("train", "dev", "test")] == [400, 50, 60]
    assert not lines["train"] & lines["dev"]
    assert not lines["train"] & lines["test"]
    assert not lines["dev"] & lines["test"]
    assert json.loads((tmp_path / "meta.json").read_text())["seed"] == 2


def test_second_call_does_not_rewrite(tmp_path: Path) -> None:
    syn.write_synthetic_corpus(tmp_path, n_train=100, n_dev=10, n_test=10, seed=1)
    files = sorted(tmp_path.iterdir())
    mtimes = [f.stat().st_mtime_ns for f in files]
    syn.write_synthetic_corpus(tmp_path, n_train=100, n_dev=10, n_test=10, seed=1)
    assert sorted(tmp_path.iterdir()) == files
    assert [f.stat().st_mtime_ns for f in files] == mtimes


def test_other_parameters_never_overwrite_a_corpus(tmp_path: Path) -> None:
    """Another run's corpus (here: the same directory asked with the languages swapped) is its
    training and test data: an error that says what differs and the way out, files untouched."""
    syn.write_synthetic_corpus(tmp_path, n_train=100, n_dev=10, n_test=10, seed=1)
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    asked = [
        (
            {"src_lang": "trg", "trg_lang": "src"},
            "src_lang=src, trg_lang=trg (its meta.json), not src_lang=trg, trg_lang=src",
        ),
        ({"seed": 2}, "seed=1 (its meta.json), not seed=2"),
        ({"n_train": 101}, "train=100 (its meta.json), not train=101"),
    ]
    for other, differs in asked:
        with pytest.raises(NMTError) as err:
            syn.write_synthetic_corpus(tmp_path, **{"n_train": 100, "n_dev": 10, "n_test": 10, **other})
        message = str(err.value)
        assert "\n" not in message and f"{tmp_path} holds one made with {differs}" in message
        assert f"delete {tmp_path}" in message and "data.train/dev/test elsewhere" in message
        assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before


def test_files_without_meta_json_are_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "train.src").write_text("mine\n")
    with pytest.raises(NMTError, match="train.src but no meta.json"):
        syn.write_synthetic_corpus(tmp_path, n_train=100, n_dev=10, n_test=10, seed=1)
    assert (tmp_path / "train.src").read_text() == "mine\n"


def test_interrupted_corpus_is_completed_by_the_same_parameters(tmp_path: Path) -> None:
    """meta.json is written first, so a write cut off after it leaves a directory that the same
    parameters finish (the same files) and other parameters refuse."""
    syn.write_synthetic_corpus(tmp_path, n_train=100, n_dev=10, n_test=10, seed=1)
    full = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    for name in ("train.src", "train.trg", "dev.trg"):
        (tmp_path / name).unlink()
    with pytest.raises(NMTError, match="not seed=2"):
        syn.write_synthetic_corpus(tmp_path, n_train=100, n_dev=10, n_test=10, seed=2)
    syn.write_synthetic_corpus(tmp_path, n_train=100, n_dev=10, n_test=10, seed=1)
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == full


def test_negative_size_is_user_error() -> None:
    with pytest.raises(NMTError):
        syn.generate_pairs(-1, seed=1)
