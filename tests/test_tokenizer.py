"""SentencePiece training, reuse and the Tokenizer wrapper on a small generated corpus."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import sentencepiece as spm
import yaml
from conftest import PAIRS, tiny_config

from nmt.cli import main
from nmt.config import TokenizerConfig
from nmt.errors import NMTError
from nmt.signals import Terminated
from nmt.tokenizer import Tokenizer, load_tokenizers
from nmt.tokenizer_training import MAX_SENTENCE_BYTES, train_or_load_tokenizers

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


_TRAIN_IN_A_PROCESS = """
import sys
from pathlib import Path
from nmt.tokenizer import TokenizerConfig
from nmt.tokenizer_training import train_or_load_tokenizers
corpus, model, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
cfg = TokenizerConfig(type="unigram", vocab_size=120, input_sentence_size=150)
lines = corpus.read_text(encoding="utf-8").splitlines()
train_or_load_tokenizers(cfg, lines, [], model, model, seed=seed)
"""


def _trained_apart(tmp_path: Path, name: str, seed: int) -> Path:
    """A model trained by a process of its own on SRC + TRG, sampling 150 of its 800 lines."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(line + "\n" for line in SRC + TRG), encoding="utf-8")
    model = tmp_path / name / "spm.model"
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _TRAIN_IN_A_PROCESS, str(corpus), str(model), str(seed)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return model


def test_the_same_text_and_seed_give_the_same_model_bytes(tmp_path):
    # Two processes, as two runs are: SentencePiece's own sample differs from process to process, and
    # a model written by it records the temporary file name it was trained under.
    first, again = _trained_apart(tmp_path, "a", seed=3), _trained_apart(tmp_path, "b", seed=3)
    assert first.read_bytes() == again.read_bytes()
    vocab = first.with_suffix(".vocab").read_text(encoding="utf-8")
    assert vocab == again.with_suffix(".vocab").read_text(encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_file=str(first))
    assert vocab.splitlines() == [f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}" for i in range(sp.get_piece_size())]
    assert _trained_apart(tmp_path, "c", seed=4).read_bytes() != first.read_bytes()  # another sample


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_the_model_is_the_same_on_machines_with_other_core_counts(tmp_path, monkeypatch, model_type):
    # SentencePiece's unigram scores depend on how many threads share the sentences, and every model
    # records the count: the config's tokenizer.threads decides it, not the CPUs of the machine.
    def trained(name: str, cpus: int, **overrides) -> bytes:
        monkeypatch.setattr(os, "cpu_count", lambda: cpus)
        path = tmp_path / name / "spm.model"
        train_or_load_tokenizers(_cfg(type=model_type, **overrides), SRC, TRG, path, path)
        return path.read_bytes()

    laptop = trained("laptop", 2)
    assert trained("server", 64) == laptop
    assert trained("two-threads", 64, threads=2) != laptop  # the key is what SentencePiece is given


REWRITTEN = ["Er sagte … nichts！", "ein cafe\u0301 am ﬂuss"]  # an ellipsis, full-width "!", NFD, a ligature


@pytest.mark.parametrize(
    "rule,decoded",
    [
        ("nmt_nfkc", ["Er sagte ... nichts!", "ein caf\u00e9 am fluss"]),  # the default rewrites the text
        ("nmt_nfkc_cf", ["er sagte ... nichts!", "ein caf\u00e9 am fluss"]),  # and lower-cases it
        ("identity", REWRITTEN),  # identity keeps it
    ],
)
def test_normalization_rule(tmp_path, rule, decoded):
    # The rule is saved in the model: the tokenizer returned is the file loaded, as translate and the
    # CTranslate2 export (which copies the file) load it.
    tok, _ = train_or_load_tokenizers(_cfg(normalization=rule), SRC + REWRITTEN * 20, TRG, *_joint(tmp_path))
    assert tok.decode(tok.encode(REWRITTEN)) == decoded


# tab, CR, Unicode spaces, ZWSP, control; the zero-width non-joiner and a direction mark (Persian, Arabic)
SPACING = ["ka\tlo\rmi", "ne\u00a0ru\u3000sa", "te\u200bvi\x01do", "pe  zu", "ho\u200cmi\u200fka"]


@pytest.mark.parametrize(
    "rule,decoded",
    [
        # all spaces; control characters removed
        ("nmt_nfkc", ["ka lo mi", "ne ru sa", "te vido", "pe zu", "ho mi ka"]),
        # NFKC's spaces (and CR decoded as one)
        ("nfkc", ["ka\tlo mi", "ne ru sa", "te\u200bvi\x01do", "pe zu", "ho\u200cmi\u200fka"]),
        # runs of spaces only
        ("identity", ["ka\tlo mi", "ne\u00a0ru\u3000sa", "te\u200bvi\x01do", "pe zu", "ho\u200cmi\u200fka"]),
    ],
)
def test_what_each_rule_does_to_white_space_and_control_characters_on_both_sides(tmp_path, rule, decoded):
    """As the README's tokenizer.normalization says, for a joint model and for each side's own."""
    cfg = _cfg(normalization=rule, vocab_size=60)  # the upper-case target alone holds no more
    joint, _ = train_or_load_tokenizers(cfg, SRC + SPACING * 20, TRG + SPACING * 20, *_joint(tmp_path / "joint"))
    src, trg = train_or_load_tokenizers(
        replace(cfg, joint=False), SRC + SPACING * 20, TRG + SPACING * 20, tmp_path / "s.model", tmp_path / "t.model"
    )
    for tok in (joint, src, trg):
        assert tok.decode(tok.encode(SPACING)) == decoded


def test_a_line_break_the_vocabulary_holds_is_decoded_as_a_space(tmp_path):
    """Under identity a LF inside a sentence (a Hugging Face dataset's text) or a lone CR is a piece;
    a decoded sentence holding one was two lines of `nmt translate`'s output for one input line."""
    broken = ["ka lo\nmi ne", "ru\rsa te", "vi\r\ndo"]
    tok, _ = train_or_load_tokenizers(_cfg(normalization="identity"), SRC + broken * 20, TRG, *_joint(tmp_path))
    ids = tok.encode(broken)
    assert any(tok.pieces(row).count("\n") for row in ids)  # the model can write it
    assert tok.decode(ids) == ["ka lo mi ne", "ru sa te", "vi do"]


TAGGED = ["ka <s> lo </s> mi", "ne <unk> ru <pad> sa"]  # "<", ">" and "/" are nowhere else in the text


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_text_holding_the_special_pieces_names_is_text_and_round_trips(tmp_path, model_type):
    """SentencePiece's trainer blanks its own piece names out of the text it trains on: the "<", ">"
    and "/" found only inside them were unknown, and "ka <s> lo" came back as "ka  ⁇ s ⁇  lo"."""
    tok, _ = train_or_load_tokenizers(_cfg(type=model_type), SRC + TAGGED * 20, TRG, *_joint(tmp_path))
    ids = tok.encode(TAGGED)
    assert all(min(row) > 3 for row in ids)  # neither a special id nor unknown
    assert tok.decode(ids) == TAGGED


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


def test_the_lowest_character_coverage_the_config_accepts_trains(tmp_path):
    # config.py bounds tokenizer.character_coverage below by 0.98: SentencePiece must accept it.
    tok, _ = train_or_load_tokenizers(_cfg(character_coverage=0.98), SRC, TRG, *_joint(tmp_path))
    assert tok.vocab_size == 120


def test_vocab_too_small_names_config_key(tmp_path):
    with pytest.raises(NMTError, match=r"tokenizer\.vocab_size"):
        train_or_load_tokenizers(_cfg(vocab_size=16), SRC, TRG, *_joint(tmp_path))


FEW_PIECES = ["ka lo .", "lo ka ."] * 200  # too few pieces for 60
# 200 characters, the word boundary and the 4 specials: more than 60
MANY_CHARACTERS = [" ".join(chr(0x4E00 + i + j) for j in range(5)) for i in range(0, 200, 5)]


@pytest.mark.parametrize("side", [0, 1])
@pytest.mark.parametrize(
    "text, says",
    [
        pytest.param(FEW_PIECES, "60 is larger than the {side} side of this corpus supports (at most ", id="too-large"),
        pytest.param(
            MANY_CHARACTERS,
            "60 is smaller than the 205 characters and special pieces the {side} side of this corpus needs",
            id="too-small",
        ),
    ],
)
def test_a_vocab_size_one_side_cannot_support_names_that_side(tmp_path, side, text, says):
    """With tokenizer.joint false each side has a model of tokenizer.vocab_size pieces: the error says
    which side's text cannot support it."""
    lines = [SRC, TRG]
    lines[side] = text
    paths = tmp_path / "spm.de.model", tmp_path / "spm.en.model"
    with pytest.raises(NMTError) as err:
        train_or_load_tokenizers(_cfg(joint=False, vocab_size=60), *lines, *paths)
    message = str(err.value)
    assert err.value.side == side and "\n" not in message
    assert message.startswith("config key 'tokenizer.vocab_size': " + says.format(side=("source", "target")[side]))


def test_prepare_names_the_file_of_the_side_whose_text_cannot_support_the_vocab_size(tmp_path, capsys):
    config = tiny_config(tmp_path)
    values = yaml.safe_load(config.read_text())
    values["tokenizer"].update(joint=False, vocab_size=60)
    values["model"]["tie_embeddings"] = False
    (tmp_path / "few.de").write_text("".join(line + "\n" for line in SRC), encoding="utf-8")
    (tmp_path / "few.en").write_text("".join(line + "\n" for line in FEW_PIECES), encoding="utf-8")
    values["data"]["train"] = str(tmp_path / "few")
    config.write_text(yaml.safe_dump(values))
    assert main(["prepare", "--config", str(config)]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(
        f"nmt prepare: error: {tmp_path}/few.en: config key 'tokenizer.vocab_size': 60 is larger than the target "
        "side of this corpus supports (at most "
    )


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, Terminated])
def test_an_interrupt_while_sentencepiece_reads_stays_an_interrupt(tmp_path, interrupt):
    # SentencePiece reports an exception from its sentence iterator as a RuntimeError of its own;
    # the CLI must still see Ctrl-C or SIGTERM (exit 130/143), not "SentencePiece training failed".
    def stopped_midway():
        yield from SRC[:50]
        raise interrupt()

    with pytest.raises(interrupt):
        train_or_load_tokenizers(_cfg(), stopped_midway(), TRG, *_joint(tmp_path))
    assert not list(tmp_path.iterdir())


def test_an_interrupt_while_sentencepiece_trains_stops_it_at_once(tmp_path, monkeypatch):
    # Its C++ training does not return to Python until it ends, and Python runs a signal's handler on
    # the main thread only: trained there, Ctrl-C or SIGTERM waited for the whole training.
    import _thread
    import threading

    import nmt.tokenizer_training

    training, release, on_main = threading.Event(), threading.Event(), []

    def train(**options):  # stands for the C++ training: blocks until released
        on_main.append(threading.current_thread() is threading.main_thread())
        training.set()
        release.wait(60)

    monkeypatch.setattr(nmt.tokenizer_training.spm.SentencePieceTrainer, "train", train)
    threading.Thread(target=lambda: training.wait(60) and _thread.interrupt_main(), daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            train_or_load_tokenizers(_cfg(), SRC, TRG, *_joint(tmp_path))
        assert on_main == [False] and not release.is_set()  # raised while the training still ran
    finally:
        release.set()
    assert not list(tmp_path.iterdir())


def _over_the_limit(line: str) -> str:
    """``line`` repeated until SentencePiece skips it as too long (it trains on none of it)."""
    return " ".join([line] * (MAX_SENTENCE_BYTES // len(line) + 1))


def test_a_side_whose_lines_are_all_over_the_limit_is_named(tmp_path):
    some_too_long = SRC + [_over_the_limit(s) for s in SRC[:5]]  # skipped for the vocabulary only
    all_too_long = [_over_the_limit(t) for t in TRG[:20]]
    paths = tmp_path / "spm.de.model", tmp_path / "spm.en.model"
    with pytest.raises(NMTError) as err:
        train_or_load_tokenizers(_cfg(joint=False, vocab_size=60), some_too_long, all_too_long, *paths)
    assert err.value.side == 1 and "\n" not in str(err.value)
    assert str(err.value).startswith(f"every line is longer than SentencePiece's limit of {MAX_SENTENCE_BYTES} bytes")
    assert paths[0].exists() and not paths[1].exists()


def _prepare_error(tmp_path: Path, capsys, src: bytes, trg: bytes) -> str:
    """The one line `nmt prepare` writes for a training corpus of ``src`` and ``trg`` bytes."""
    config = tiny_config(tmp_path)
    (tmp_path / "long.de").write_bytes(src)
    (tmp_path / "long.en").write_bytes(trg)
    values = yaml.safe_load(config.read_text())
    values["data"]["train"] = str(tmp_path / "long")
    config.write_text(yaml.safe_dump(values))
    assert main(["prepare", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "sentences_" not in err
    return err.splitlines()[-1]


def test_prepare_names_the_files_whose_lines_are_all_over_the_limit(tmp_path, capsys):
    lines = "".join(_over_the_limit(s) + "\n" for s in SRC[:20]).encode()
    error = _prepare_error(tmp_path, capsys, lines, lines.upper())
    assert error == (
        f"nmt prepare: error: {tmp_path}/long.de, {tmp_path}/long.en: every line is longer than SentencePiece's "
        f"limit of {MAX_SENTENCE_BYTES} bytes, so there is nothing to train the vocabulary on"
    )


def test_prepare_trains_on_a_corpus_with_cr_line_ends_as_on_lf(tmp_path, capsys):
    # Read as one line each, such files were once a single pair, or nothing SentencePiece would take.
    models = []
    for name, end in (("lf", "\n"), ("mac", "\r")):
        config = tiny_config(tmp_path / name)
        data = tmp_path / name / "data"
        for lang, side in (("de", 0), ("en", 1)):
            (data / f"train.{lang}").write_bytes("".join(pair[side] + end for pair in PAIRS).encode())
        assert main(["prepare", "--config", str(config)]) == 0
        assert f"train: read {len(PAIRS)} pairs" in capsys.readouterr().err
        models.append((tmp_path / name / "run" / "spm.model").read_bytes())
    assert models[0] == models[1]


def test_load_missing_or_corrupt_model(tmp_path):
    with pytest.raises(NMTError, match="no such SentencePiece model"):
        Tokenizer.load(tmp_path / "spm.model")
    (tmp_path / "spm.model").write_bytes(b"garbage")
    with pytest.raises(NMTError, match="not a SentencePiece model"):
        load_tokenizers(*_joint(tmp_path))


def test_unknown_text_names_what_the_model_never_saw_as_written(tmp_path):
    tok, _ = train_or_load_tokenizers(_cfg(), SRC, TRG, *_joint(tmp_path))
    lines = [SRC[0], "kalo 😀 mi", "", "ka\u0301lo Qx"]  # emoji, a combining accent, letters never seen
    assert tok.unknown_text(lines, tok.encode(lines)) == [[], ["😀"], [], ["a\u0301", "Qx"]]  # "á" as NFKC composes it
