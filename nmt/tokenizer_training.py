"""Training a SentencePiece model (``train_or_load_tokenizers``): the text it trains on (the lines
that fit its length limit, sampled by a seeded generator), its failures as errors naming the config
key and the side, and the files it writes (record, ``.vocab``, model, each renamed into place). The
model, once written, is loaded as ``nmt.tokenizer.Tokenizer``.
"""

from __future__ import annotations

import io
import itertools
import json
import random
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

from nmt.errors import NMTError
from nmt.files import atomic_write_bytes
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, TokenizerConfig, record_path

MAX_SENTENCE_BYTES = 4192  # SentencePiece's default max_sentence_length, passed so that _fits agrees with it

_TOO_HIGH = re.compile(r"Vocabulary size too high.*?<=\s*(\d+)", re.DOTALL)
_TOO_SMALL = re.compile(r"smaller than required_chars\.\s*(\d+)\s*vs\s*(\d+)")


SIDES = ("source", "target")


class SideError(NMTError):
    """SentencePiece could not train on one side's text. ``side`` says whose (0 source, 1 target,
    None both: a joint model), for the caller to name the files."""

    def __init__(self, message: str, side: int | None):
        super().__init__(message)
        self.side = side


def _vocab_error(message: str, vocab_size: int, side: int | None) -> SideError:
    """Translate SentencePiece's trainer failure into an error naming the config key, and the side
    where each has its own model (tokenizer.joint false): the size is that of each side's vocabulary."""
    key = "config key 'tokenizer.vocab_size'"
    corpus = "this corpus" if side is None else f"the {SIDES[side]} side of this corpus"
    if "Vocabulary size too high" in message:
        match = _TOO_HIGH.search(message)
        bound = f" (at most {match.group(1)})" if match else ""
        return SideError(f"{key}: {vocab_size} is larger than {corpus} supports{bound}", side)
    match = _TOO_SMALL.search(message)
    if match:
        return SideError(
            f"{key}: {vocab_size} is smaller than the {match.group(2)} characters and special pieces {corpus} "
            "needs (raise it or lower tokenizer.character_coverage)",
            side,
        )
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    where = "" if side is None else f" on the {SIDES[side]} side"
    return SideError(f"SentencePiece training failed{where}: {first}", side)


class NoLineFits(SideError):
    """Every line given to SentencePiece is over its length limit, which it skips: nothing is left to
    train on."""

    def __init__(self, side: int | None):
        super().__init__(
            f"every line is longer than SentencePiece's limit of {MAX_SENTENCE_BYTES} bytes, "
            "so there is nothing to train the vocabulary on",
            side,
        )


def _fits(line: str) -> bool:
    """Whether SentencePiece trains on ``line`` rather than skipping it (it counts UTF-8 bytes)."""
    return len(line) <= MAX_SENTENCE_BYTES // 4 or len(line.encode()) <= MAX_SENTENCE_BYTES


# SentencePiece's names of its pad, unk, bos and eos pieces. Its trainer replaces each in a training
# sentence with a space, so a character found only inside one (the "<" and ">" of text that writes
# "<s>") was left out of the vocabulary and came out of a translation as " ⁇ ".
_PIECE_NAMES = re.compile("|".join(re.escape(name) for name in ("<pad>", "<unk>", "<s>", "</s>")))


def _keeping_piece_names(line: str) -> str:
    """``line`` with a space before the ">" of each piece name in it, which the trainer then reads as
    any other text: only what SentencePiece trains on, never what it encodes."""
    return _PIECE_NAMES.sub(lambda name: name.group()[:-1] + " >", line) if "<" in line else line


class _TrainingText:
    """What SentencePiece trains on: the non-empty lines that fit its length limit (it would skip the
    others), with the piece names in them kept as text (``_keeping_piece_names``), all of them or,
    with ``sample`` > 0, that many drawn by a generator seeded with ``seed``.
    SentencePiece's own sampler takes no seed (and in recent versions draws differently in every
    process), so two runs of one config got two vocabularies; ours leaves it no more lines than it keeps.

    It notes whether any line fitted, and keeps an interrupt that SentencePiece would turn into a
    RuntimeError."""

    def __init__(self, lines: Iterable[str], sample: int, seed: int):
        self.lines, self.sample, self.seed = lines, sample, seed
        self.count, self.any_fits, self.all_read = 0, False, False
        self.interrupt: KeyboardInterrupt | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            if self.sample == 0:
                yield from self._fitting()
            else:
                yield from _drain(_reservoir(self._fitting(), self.sample, random.Random(self.seed)))
        except KeyboardInterrupt as e:  # SentencePiece turns it into a RuntimeError: kept to raise again
            self.interrupt = e
            raise

    def _fitting(self) -> Iterator[str]:
        for line in self.lines:
            if line:
                self.count += 1
                line = _keeping_piece_names(line)
                if _fits(line):
                    self.any_fits = True
                    yield line
        self.all_read = True

    @property
    def all_too_long(self) -> bool:
        return self.all_read and self.count > 0 and not self.any_fits


def _reservoir(lines: Iterable[str], size: int, rng: random.Random) -> list[str]:
    """``size`` of ``lines`` chosen uniformly in one pass (reservoir sampling); all of them, in order,
    when there are no more."""
    sample: list[str] = []
    for seen, line in enumerate(lines):
        if seen < size:
            sample.append(line)
        else:
            slot = rng.randrange(seen + 1)
            if slot < size:
                sample[slot] = line
    return sample


def _drain(sample: list[str]) -> Iterator[str]:
    """The sample's lines in order, each let go once SentencePiece has its copy, so that the sample is
    not held twice."""
    sample.reverse()
    while sample:
        yield sample.pop()


def _vocab_text(processor: spm.SentencePieceProcessor) -> str:
    """The ``.vocab`` file SentencePiece writes beside a model: each piece and its score (%g)."""
    size = processor.get_piece_size()
    return "".join(f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n" for i in range(size))


def _write(path: Path, data: bytes) -> None:
    try:
        atomic_write_bytes(path, data)
    except OSError as e:
        raise NMTError(f"{path}: cannot write the SentencePiece model ({e.strerror})") from None


def _off_the_main_thread(work: Callable[..., object], **kwargs) -> None:
    """``work(**kwargs)`` in a thread of its own while this one waits in short joins, its exception
    raised here. SentencePiece's C++ training does not return to Python until it ends (a minute and
    more on a 2M-sentence sample), and Python runs a signal's handler on the main thread only when
    that thread runs Python: Ctrl-C or SIGTERM then waited for the whole training. Here the handler
    runs within a tenth of a second and raises from the join; the training left behind is a daemon
    thread, which ends with the process."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work(**kwargs)
        except BaseException as e:  # handed to the waiting thread, raised there
            failure.append(e)

    thread = threading.Thread(target=run, name="sentencepiece-training", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if failure:
        raise failure[0]


def _train_model(
    cfg: TokenizerConfig, sentences: Iterable[str], model_path: Path, side: int | None, seed: int, record: dict | None
) -> None:
    """Train in memory, then write ``record`` (what it was made from), the ``.vocab`` and the model,
    each under a temporary name renamed into place. The model's rename is what makes it visible for
    reuse, so an interrupted run leaves no half-written ``.model`` behind. The bytes depend only on
    the text, the settings (``threads`` among them) and ``seed``: no file name of the training, and
    nothing of the machine, is in them."""
    text = _TrainingText(sentences, cfg.input_sentence_size, seed)
    model = io.BytesIO()
    try:
        _off_the_main_thread(
            spm.SentencePieceTrainer.train,
            sentence_iterator=iter(text),
            model_writer=model,
            model_type=cfg.type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            normalization_rule_name=cfg.normalization,
            input_sentence_size=cfg.input_sentence_size,  # never more lines than this: nothing left to sample
            max_sentence_length=MAX_SENTENCE_BYTES,
            shuffle_input_sentence=True,
            num_threads=cfg.threads,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            minloglevel=2,
        )
    except RuntimeError as e:
        if text.interrupt is not None:  # Ctrl-C or SIGTERM while SentencePiece read the corpus
            raise text.interrupt from None
        if text.all_too_long:  # SentencePiece says only "!sentences_.empty()"
            raise NoLineFits(side) from None
        raise _vocab_error(str(e), cfg.vocab_size, side) from None
    proto = model.getvalue()
    model_path.parent.mkdir(parents=True, exist_ok=True)
    # The record first: a model without one is taken for an earlier version's and reused, so a kill
    # between the model and its record left a model the next start reused whatever its settings. A
    # record without its model is trained again, and rewritten.
    if record is not None:
        _write(record_path(model_path), (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    # The .model file appearing, last, is the signal that training finished.
    _write(model_path.with_suffix(".vocab"), _vocab_text(spm.SentencePieceProcessor(model_proto=proto)).encode())
    _write(model_path, proto)


def train_or_load_tokenizers(
    cfg: TokenizerConfig,
    src_lines: Iterable[str],
    trg_lines: Iterable[str],
    src_path: Path,
    trg_path: Path,
    seed: int = 1,
    records: tuple[dict | None, dict | None] = (None, None),
) -> tuple[Tokenizer, Tokenizer]:
    """Reuse the model file(s) if present, else train them from the given text: one joint model
    from both sides when ``src_path == trg_path``, else one per side. A model trained here gets its
    side's entry of ``records`` (what it is made from) written beside it (``record_path``); whether
    an existing model still fits is for the caller to decide, before (``remove_model``).

    The text may be a lazy stream: ``input_sentence_size`` sentences are sampled from it, drawn by a
    generator seeded with ``seed`` (the config's), so the same text and config give the same model.
    """
    if src_path == trg_path:
        if not src_path.exists():
            _train_model(cfg, itertools.chain(src_lines, trg_lines), src_path, None, seed, records[0])
        joint = Tokenizer.load(src_path)
        return joint, joint
    for side, (path, lines) in enumerate(((src_path, src_lines), (trg_path, trg_lines))):
        if not path.exists():
            _train_model(cfg, lines, path, side, seed, records[side])
    return Tokenizer.load(src_path), Tokenizer.load(trg_path)
