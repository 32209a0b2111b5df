"""SentencePiece subword models: a small typed wrapper, the ``tokenizer:`` section and the files
beside a model. Training one is ``nmt.tokenizer_training``.

Every model has the same special ids (pad=0, unk=1, bos=2, eos=3), so batching and the
models never need to ask which id is which.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import sentencepiece as spm

from nmt.errors import NMTError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass
class TokenizerConfig:
    """The ``tokenizer:`` section: how SentencePiece is trained."""

    type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = 8000
    joint: bool = True  # one model for both languages (needed to tie src/trg embeddings)
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000  # sentences sampled to train SentencePiece; 0: every sentence
    # SentencePiece's normalization rule, saved in the model and applied to every line it encodes:
    # nmt_nfkc rewrites text (NFKC: "…" -> "...", full-width -> ASCII), _cf also lower-cases, identity keeps it
    normalization: Literal["nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"] = "nmt_nfkc"
    # SentencePiece's training threads. The unigram trainer splits the sentences among them and adds
    # up their float sums, so the count changes its scores, piece ids and segmentations (a bpe model
    # only records it): a number of the config, not the machine's core count, so that one config
    # gives one model everywhere
    threads: int = 16


class Tokenizer:
    """A loaded SentencePiece model with the project's fixed special ids."""

    def __init__(self, processor: spm.SentencePieceProcessor, model_path: Path, threads: int | None = None) -> None:
        self._sp = processor
        self._model_path = model_path
        self._specials = frozenset((PAD_ID, BOS_ID, EOS_ID))
        self._threads = threads or os.cpu_count() or 1

    @classmethod
    def load(cls, path: str | Path, threads: int | None = None) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise NMTError(f"{path}: no such SentencePiece model file")
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (RuntimeError, OSError) as e:
            raise NMTError(f"{path}: not a SentencePiece model ({str(e).strip().splitlines()[0]})") from None
        found = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise NMTError(f"{path}: special ids pad/unk/bos/eos are {found}, expected (0, 1, 2, 3)")
        return cls(processor, path, threads)

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def model_path(self) -> Path:
        return self._model_path

    def encode(self, lines: list[str]) -> list[list[int]]:
        """Subword ids of each line, without BOS/EOS (batching adds those)."""
        if not lines:
            return []
        return self._sp.encode(lines, out_type=int, num_threads=self._threads)

    def unknown_text(self, lines: list[str], encoded: list[list[int]]) -> list[list[str]]:
        """Per line, the stretches of it that encode to the unknown id (text whose characters the
        model never saw in training), as written in the line; empty for a line without any.
        ``encoded``: the lines' ids (``encode``), which the caller has already."""
        found: list[list[str]] = [[] for _ in lines]
        with_unknown = [i for i, ids in enumerate(encoded) if UNK_ID in ids]
        if not with_unknown:
            return found
        protos = self._sp.encode([lines[i] for i in with_unknown], out_type="proto", num_threads=self._threads)
        for i, proto in zip(with_unknown, protos):
            found[i] = [piece.surface for piece in proto.pieces if piece.id == UNK_ID]
        return found

    def pieces(self, ids: list[int]) -> list[str]:
        """The subword pieces of ``ids`` as the model sees them (attention-map labels)."""
        return [self._sp.id_to_piece(i) for i in ids]

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Detokenized text, one line per sentence; pad/bos/eos ids are dropped rather than rendered."""
        cleaned = [[i for i in row if i not in self._specials] for row in ids]
        if not cleaned:
            return []
        return [_one_line(text) for text in self._sp.decode(cleaned, num_threads=self._threads)]


_LINE_BREAK = re.compile(r"\r\n?|\n")


def _one_line(text: str) -> str:
    """``text`` with its line breaks as spaces. Under ``nfkc`` and ``identity`` a LF or CR inside a
    training sentence (a Hugging Face dataset's text; a lone CR in a file's line) becomes a piece
    the model can write, and a translation holding one would put two output lines where the input
    had one, misaligning every line after it."""
    return _LINE_BREAK.sub(" ", text) if "\n" in text or "\r" in text else text


# --------------------------------------------------------------------------- file layout


def load_tokenizers(src_path: Path, trg_path: Path) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenizers; one object twice when both paths name one joint model."""
    src = Tokenizer.load(src_path)
    return src, (src if src_path == trg_path else Tokenizer.load(trg_path))


def record_path(model_path: Path) -> Path:
    """The record of what a model was made from, written beside it: ``spm.model`` -> ``spm.model.json``."""
    return model_path.with_name(model_path.name + ".json")


def read_record(model_path: Path) -> dict | None:
    """The record written with ``model_path``: None when there is none (a model of an earlier
    version, or one put there by hand), ``{}`` when it cannot be read."""
    try:
        recorded = json.loads(record_path(model_path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return {}
    return recorded if isinstance(recorded, dict) else {}


def remove_model(model_path: Path) -> None:
    """Delete a model with its ``.vocab`` and record; the model first, so that nothing is left to reuse."""
    for path in (model_path, model_path.with_suffix(".vocab"), record_path(model_path)):
        path.unlink(missing_ok=True)
