"""An embedded synthetic language pair so the demo trains and scores fully offline.

The source language is SVO with adjectives before the noun, a gender-free lexicon and
invariant verbs. The target language is SOV (the verb moves to the end, also inside
relative clauses), puts adjectives after the noun in mirrored order, uses postpositions,
and makes articles, adjectives and relative pronouns agree with the noun's gender and
number, and verbs agree with their subject's number. Both vocabularies are generated
from a fixed lexicon seed, so the language never changes; the corpus seed only picks
which sentences are drawn.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nmt.errors import NMTError
from nmt.files import atomic_write_bytes

CORPUS_VERSION = 1
META_FILE = "meta.json"  # written first: it claims its directory for the corpus
LEXICON_SEED = 20240601
N_NOUNS, N_VERBS, N_ADJS, N_PREPS, N_ADVS = 40, 20, 16, 5, 5
GENDERS = ("m", "f")
NUMBERS = ("sg", "pl")

# Source function words (fixed, invariant).
SRC_DEF, SRC_INDEF, SRC_DEM, SRC_REL = "ta", "en", "dis", "wel"
SRC_NUMS = ("tuo", "tre", "fir", "fem")
SRC_PLURAL = "i"

# Target function words: (gender, number) -> form.
TRG_DEF = {("m", "sg"): "lo", ("f", "sg"): "la", ("m", "pl"): "lor", ("f", "pl"): "lar"}
TRG_INDEF = {"m": "un", "f": "una"}
TRG_DEM = {("m", "sg"): "sto", ("f", "sg"): "sta", ("m", "pl"): "stor", ("f", "pl"): "star"}
TRG_REL = {("m", "sg"): "ku", ("f", "sg"): "ka", ("m", "pl"): "kus", ("f", "pl"): "kas"}
TRG_NUMS = ("dua", "tri", "kwar", "fen")
TRG_NOUN_PL = {"m": "en", "f": "ar"}
TRG_ADJ_END = {("m", "sg"): "o", ("f", "sg"): "a", ("m", "pl"): "os", ("f", "pl"): "as"}
TRG_VERB_END = {"sg": "et", "pl": "ont"}


@dataclass(frozen=True)
class Noun:
    src: str
    trg: str
    gender: str


@dataclass(frozen=True)
class Word:
    src: str
    trg: str


@dataclass(frozen=True)
class Lexicon:
    nouns: tuple[Noun, ...]
    verbs: tuple[Word, ...]
    adjs: tuple[Word, ...]
    preps: tuple[Word, ...]
    advs: tuple[Word, ...]


# ---------------------------------------------------------------- lexicon


def _make_stem(rng: random.Random, onsets: str, vowels: str, codas: str, n_syll: int) -> str:
    parts = [rng.choice(onsets) + rng.choice(vowels) for _ in range(n_syll)]
    if rng.random() < 0.5:
        parts.append(rng.choice(codas))
    return "".join(parts)


Forms = Callable[[str], list[str]]


def _fresh_stems(rng: random.Random, n: int, taken: set[str], style: tuple[str, str, str], forms: Forms) -> list[str]:
    """Draw n stems whose inflected forms collide with nothing already taken."""
    stems: list[str] = []
    while len(stems) < n:
        stem = _make_stem(rng, *style, n_syll=rng.choice((2, 2, 3)))
        surface = forms(stem)
        # The stem is reserved too, so no two words share a stem across word classes.
        new = {stem, *surface}
        if len(set(surface)) == len(surface) and taken.isdisjoint(new):
            taken.update(new)
            stems.append(stem)
    return stems


def build_lexicon(seed: int = LEXICON_SEED) -> Lexicon:
    """The fixed word-for-word table; every surface form is unique within its language."""
    rng = random.Random(seed)
    src_style = ("bdfgklmnprstvz", "aeiou", "nrsl")
    trg_style = ("bcdfghjmnprtvwz", "aeiouy", "mnrx")
    src_taken = {SRC_DEF, SRC_INDEF, SRC_DEM, SRC_REL, *SRC_NUMS}
    trg_taken = {*TRG_DEF.values(), *TRG_INDEF.values(), *TRG_DEM.values(), *TRG_REL.values(), *TRG_NUMS}

    def plain(stem: str) -> list[str]:
        return [stem]

    def src_noun(stem: str) -> list[str]:
        return [stem, stem + SRC_PLURAL]

    def trg_noun(stem: str) -> list[str]:
        return [stem, stem + TRG_NOUN_PL["m"], stem + TRG_NOUN_PL["f"]]

    def trg_adj(stem: str) -> list[str]:
        return [stem + end for end in TRG_ADJ_END.values()]

    def trg_verb(stem: str) -> list[str]:
        return [stem + end for end in TRG_VERB_END.values()]

    def pairs(n: int, src_forms: Forms, trg_forms: Forms) -> list[tuple[str, str]]:
        src = _fresh_stems(rng, n, src_taken, src_style, src_forms)
        trg = _fresh_stems(rng, n, trg_taken, trg_style, trg_forms)
        return list(zip(src, trg))

    nouns = tuple(Noun(s, t, GENDERS[i % 2]) for i, (s, t) in enumerate(pairs(N_NOUNS, src_noun, trg_noun)))
    return Lexicon(
        nouns=nouns,
        verbs=tuple(Word(s, t) for s, t in pairs(N_VERBS, plain, trg_verb)),
        adjs=tuple(Word(s, t) for s, t in pairs(N_ADJS, plain, trg_adj)),
        preps=tuple(Word(s, t) for s, t in pairs(N_PREPS, plain, plain)),
        advs=tuple(Word(s, t) for s, t in pairs(N_ADVS, plain, plain)),
    )


LEXICON = build_lexicon()


# ---------------------------------------------------------------- grammar


@dataclass(frozen=True)
class NounPhrase:
    noun: Noun
    number: str
    det: str  # "def" | "indef" | "dem" | "num"
    num_idx: int
    adjs: tuple[Word, ...]


def _sample_np(rng: random.Random, lex: Lexicon) -> NounPhrase:
    noun = rng.choice(lex.nouns)
    det = rng.choice(("def", "def", "indef", "dem", "num"))
    number = "pl" if det == "num" else ("sg" if det == "indef" else rng.choice(NUMBERS))
    n_adj = rng.choices((0, 1, 2), weights=(5, 4, 1))[0]
    return NounPhrase(noun, number, det, rng.randrange(len(SRC_NUMS)), tuple(rng.sample(lex.adjs, n_adj)))


def _src_np(np_: NounPhrase) -> list[str]:
    det = {"def": SRC_DEF, "indef": SRC_INDEF, "dem": SRC_DEM, "num": SRC_NUMS[np_.num_idx]}[np_.det]
    noun = np_.noun.src + (SRC_PLURAL if np_.number == "pl" else "")
    return [det, *(a.src for a in np_.adjs), noun]


def _trg_np(np_: NounPhrase) -> list[str]:
    """Target NP: determiner, noun, adjectives in mirrored order; demonstratives follow."""
    g, n = np_.noun.gender, np_.number
    noun = np_.noun.trg + (TRG_NOUN_PL[g] if n == "pl" else "")
    adjs = [a.trg + TRG_ADJ_END[(g, n)] for a in reversed(np_.adjs)]
    if np_.det == "dem":
        return [noun, *adjs, TRG_DEM[(g, n)]]
    det = {"def": TRG_DEF[(g, n)], "indef": TRG_INDEF[g], "num": TRG_NUMS[np_.num_idx]}[np_.det]
    return [det, noun, *adjs]


@dataclass(frozen=True)
class Sentence:
    subj: NounPhrase
    rel: tuple[Word, NounPhrase] | None  # relative clause on the subject: verb + object
    verb: Word
    obj: NounPhrase
    pp: tuple[Word, NounPhrase] | None
    adv: Word | None


def sample_sentence(rng: random.Random, lex: Lexicon = LEXICON) -> Sentence:
    subj = _sample_np(rng, lex)
    rel = (rng.choice(lex.verbs), _sample_np(rng, lex)) if rng.random() < 0.35 else None
    verb, obj = rng.choice(lex.verbs), _sample_np(rng, lex)
    pp = (rng.choice(lex.preps), _sample_np(rng, lex)) if rng.random() < 0.5 else None
    adv = rng.choice(lex.advs) if rng.random() < 0.3 else None
    return Sentence(subj, rel, verb, obj, pp, adv)


def source_tokens(s: Sentence) -> list[str]:
    """SVO: subj [wel verb obj] verb obj [prep np] [adv]."""
    toks = _src_np(s.subj)
    if s.rel:
        toks += [SRC_REL, s.rel[0].src, *_src_np(s.rel[1])]
    toks += [s.verb.src, *_src_np(s.obj)]
    if s.pp:
        toks += [s.pp[0].src, *_src_np(s.pp[1])]
    if s.adv:
        toks.append(s.adv.src)
    return toks


def target_tokens(s: Sentence) -> list[str]:
    """SOV: subj [rel obj verb] obj [np postp] [adv] verb; verbs agree with their subject."""
    end = TRG_VERB_END[s.subj.number]
    toks = _trg_np(s.subj)
    if s.rel:
        toks += [TRG_REL[(s.subj.noun.gender, s.subj.number)], *_trg_np(s.rel[1]), s.rel[0].trg + end]
    toks += _trg_np(s.obj)
    if s.pp:
        toks += [*_trg_np(s.pp[1]), s.pp[0].trg]
    if s.adv:
        toks.append(s.adv.trg)
    toks.append(s.verb.trg + end)
    return toks


def render(tokens: list[str]) -> str:
    """Sentence-initial capital and a final period attached to the last word."""
    text = " ".join(tokens) + "."
    return text[0].upper() + text[1:]


def generate_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """n distinct (source, target) sentence pairs, deterministic for a given seed."""
    if n < 0:
        raise NMTError(f"synthetic corpus size must be >= 0, got {n}")
    rng = random.Random(seed)
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for _ in range(max(100 * n, 1000)):
        if len(pairs) == n:
            return pairs
        s = sample_sentence(rng)
        src = render(source_tokens(s))
        if src not in seen:
            seen.add(src)
            pairs.append((src, render(target_tokens(s))))
    if len(pairs) < n:
        raise NMTError(f"could not draw {n} distinct synthetic sentences (got {len(pairs)})")
    return pairs


# ---------------------------------------------------------------- files


def write_synthetic_corpus(
    out_dir: Path,
    src_lang: str = "src",
    trg_lang: str = "trg",
    n_train: int = 6000,
    n_dev: int = 300,
    n_test: int = 300,
    seed: int = 1,
) -> dict[str, Path]:
    """Write train/dev/test parallel files; dev and test sources never occur in train.

    Returns split name -> file prefix (append ".{lang}"). A second call with the same
    parameters finds meta.json and the files in place and writes nothing; a directory holding
    a corpus made with other parameters, or files of these names without meta.json, is an
    error: its files may be another run's training or test data.
    """
    out_dir = Path(out_dir)
    sizes = {"train": n_train, "dev": n_dev, "test": n_test}
    prefixes = {split: out_dir / split for split in sizes}
    meta = {"version": CORPUS_VERSION, "seed": seed, "src_lang": src_lang, "trg_lang": trg_lang, **sizes}
    files = [prefixes[s].with_name(f"{s}.{lang}") for s in sizes for lang in (src_lang, trg_lang)]
    meta_path = out_dir / META_FILE
    _refuse_other_corpus(out_dir, meta_path, meta, files)
    if meta_path.is_file() and all(f.is_file() for f in files):
        return prefixes
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NMTError(f"cannot create synthetic corpus directory {out_dir}: {e.strerror}") from e
    # meta.json comes first: it claims the directory, so an interrupted write leaves files that
    # the same parameters complete (the corpus is deterministic) and other parameters refuse.
    atomic_write_bytes(meta_path, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    # Held-out splits come first so that one dedupe pass keeps them disjoint from train.
    pairs = generate_pairs(n_test + n_dev + n_train, seed)
    bounds = {"test": (0, n_test), "dev": (n_test, n_test + n_dev), "train": (n_test + n_dev, len(pairs))}
    for split, (lo, hi) in bounds.items():
        chunk = pairs[lo:hi]
        for side, lang in enumerate((src_lang, trg_lang)):
            atomic_write_bytes(out_dir / f"{split}.{lang}", "".join(p[side] + "\n" for p in chunk).encode())
    return prefixes


def corpus_directory(train_path: str) -> Path:
    """Where ``data.synthetic`` writes the corpus: the directory of ``data.train``'s path."""
    return Path(train_path).parent


def _refuse_other_corpus(out_dir: Path, meta_path: Path, meta: dict, files: list[Path]) -> None:
    """Raise unless the directory is free for this corpus or already holds it (complete or not)."""
    way_out = f"delete {out_dir} to write it anew, or point data.train/dev/test elsewhere"
    if not meta_path.exists():
        present = [f.name for f in files if f.exists()]
        if present:
            raise NMTError(
                f"synthetic corpus: {out_dir} holds {', '.join(present)} but no meta.json, "
                f"so they are not a synthetic corpus it would rewrite; {way_out}"
            )
        return
    try:
        found = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise NMTError(f"synthetic corpus: {meta_path} cannot be read ({e}); {way_out}") from e
    if found == meta:
        return
    if not isinstance(found, dict):
        found = {}
    keys = [k for k in meta if found.get(k) != meta[k]] or sorted(set(found) - set(meta))
    made = ", ".join(f"{k}={found.get(k)}" for k in keys)
    asked = ", ".join(f"{k}={meta.get(k)}" for k in keys)
    raise NMTError(
        f"synthetic corpus: {out_dir} holds one made with {made} (its {meta_path.name}), not {asked}; "
        f"it is not overwritten: {way_out}"
    )
