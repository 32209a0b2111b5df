"""SentencePiece training, reuse and the Tokenizer wrapper on a small generated corpus."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from nmt.config import TokenizerConfig
from nmt.errors import NMTError
from nmt.tokenizer import Tokenizer, load_tokenizers, train_or_load_tokenizers

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vi", "do", "pe", "zu", "ho"]


def _sentences(seed: int, n: int = 400) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(150)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) + " ." for _ in range(n)]


SRC = _sentences(1)
TRG = [s.upper() for s in _sentences(2)]  # a different alphabet, so joint and separate vocabs differ


def _joint(directory: Path) -> tuple[Path, Path]:
    return directory / "spm.model", directory / "spm.model"


def _cfg(**overrides) -> TokenizerConfig:
    values = {"type": "unigram", "vocab_size": 120, "joint": True}
    values.update(overrides)
    return TokenizerConfig(**values)


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_joint_model_ids_and_round_trip(tmp_path, model_type):
    src_tok, trg_tok = train_or_load_tokenizers(_cfg(type=model_type), SRC, TRG, *_joint(tmp_path))
    assert src_tok is trg_tok
    assert src_tok.model_path == tmp_path / "spm.model"
    assert (src_tok.pad_id, src_tok.unk_id, src_tok.bos_id, src_tok.eos_id) == (0, 1, 2, 3)
    assert src_tok.vocab_size == 120
    lines = SRC[:5] + TRG[:5]
    ids = src_tok.encode(lines)
    assert all(row and min(row) > 3 for row in ids)  # no specials, no unknowns on training text
    assert src_tok.decode(ids) == lines
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary training prefix is gone


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_separate_models(tmp_path, model_type):
    cfg = _cfg(type=model_type, joint=False, vocab_size=60)
    src_tok, trg_tok = train_or_load_tokenizers(cfg, SRC, TRG, tmp_path / "spm.de.model", tmp_path / "spm.en.model")
    assert src_tok is not trg_tok
    assert src_tok.model_path == tmp_path / "spm.de.model"
    assert trg_tok.model_path == tmp_path / "spm.en.model"
    assert trg_tok.decode(trg_tok.encode(TRG[:3])) == TRG[:3]
    # The source model never saw upper case, so target text maps to unknown pieces there.
    assert src_tok.unk_id in src_tok.encode(["KALO"])[0]
    loaded_src, loaded_trg = load_tokenizers(tmp_path / "spm.de.model", tmp_path / "spm.en.model")
    assert loaded_src.encode(SRC[:3]) == src_tok.encode(SRC[:3])
    assert loaded_trg.encode(TRG[:3]) == trg_tok.encode(TRG[:3])


def test_decode_ignores_pad_bos_eos(tmp_path):
    tok, _ = train_or_load_tokenizers(_cfg(), SRC, TRG, *_joint(tmp_path))
    ids = tok.encode(SRC[:2])
    noisy = [[tok.bos_id] + row + [tok.eos_id, tok.pad_id, tok.pad_id] for row in ids]
    assert tok.decode(noisy) == SRC[:2]
    assert tok.encode([]) == [] and tok.decode([]) == []


def test_existing_model_is_reused_not_retrained(tmp_path):
    train_or_load_tokenizers(_cfg(), SRC, TRG, *_joint(tmp_path))
    model = tmp_path / "spm.model"
    before = model.stat().st_mtime_ns
    content = model.read_bytes()
    # Different text and settings: a retrain would change the file.
    tok, _ = train_or_load_tokenizers(_cfg(vocab_size=90), SRC[:50], TRG[:50], *_joint(tmp_path))
    assert model.stat().st_mtime_ns == before
    assert model.read_bytes() == content
    assert tok.vocab_size == 120


def test_vocab_too_large_names_config_key(tmp_path):
    with pytest.raises(NMTError) as err:
        train_or_load_tokenizers(_cfg(vocab_size=8000), SRC[:100], TRG[:100], *_joint(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("config key 'tokenizer.vocab_size': 8000 is larger than this corpus supports")
    assert "(at most " in message
    assert not list(tmp_path.iterdir())  # nothing half-written that a later run would reuse


def test_vocab_too_small_names_config_key(tmp_path):
    with pytest.raises(NMTError, match=r"tokenizer\.vocab_size"):
        train_or_load_tokenizers(_cfg(vocab_size=16), SRC, TRG, *_joint(tmp_path))


def test_load_missing_or_corrupt_model(tmp_path):
    with pytest.raises(NMTError, match="no such SentencePiece model"):
        Tokenizer.load(tmp_path / "spm.model")
    (tmp_path / "spm.model").write_bytes(b"garbage")
    with pytest.raises(NMTError, match="not a SentencePiece model"):
        load_tokenizers(*_joint(tmp_path))
