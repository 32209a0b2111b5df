"""Corpus BLEU and chrF through sacreBLEU, with its signatures printed beside the scores."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.error import URLError

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from nmt.errors import NMTError


@dataclass
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    n_sentences: int

    def summary(self) -> str:
        sentences = f"{self.n_sentences} sentence{'s' * (self.n_sentences != 1)}"
        return (
            f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  ({sentences})\n"
            f"  {self.bleu_signature}\n  {self.chrf_signature}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def check_line_counts(name: str, n_lines: int, refs: list[list[str]], ref_names: list[str]) -> None:
    """Every reference has ``n_lines`` lines, or a one-line error naming ``name`` (the hypotheses or
    the source), the first reference that differs, and both counts."""
    for ref_name, ref in zip(ref_names, refs):
        if len(ref) != n_lines:
            raise NMTError(f"{name} has {n_lines} lines but {ref_name} has {len(ref)}: they must align line by line")


def bleu_metric(tokenize: str = "13a", lowercase: bool = False, key: str = "decode.bleu_tokenize") -> BLEU:
    """sacreBLEU's BLEU with this tokenizer and casing. A tokenizer whose extra is not installed
    (ja-mecab, ko-mecab) or whose SentencePiece model cannot be downloaded (flores101, flores200)
    is a one-line error naming ``key`` (the config key or the option)."""
    try:
        return BLEU(tokenize=tokenize, lowercase=lowercase)
    except RuntimeError as e:  # sacreBLEU's own words end in the pip install that fixes it
        extra = re.search(r"pip install (\S+)", str(e))
        fix = f"pip install '{extra.group(1)}'" if extra else str(e).strip()
        raise NMTError(f"{key} {tokenize}: needs an extra: {fix}") from None
    except (OSError, URLError) as e:
        raise NMTError(f"{key} {tokenize}: cannot download its SentencePiece model ({e}); offline?") from None
    except KeyError:
        raise NMTError(f"{key} {tokenize}: not a tokenizer this sacreBLEU {sacrebleu.__version__} knows") from None


def check_run_bleu(tokenize: str, lowercase: bool, config_path: Path) -> None:
    """A run's BLEU scorer (its ``decode.bleu_tokenize``, ``bleu_lowercase``) can run here, or a one-line
    error naming the run's config.yaml: said before a command decodes anything with the run."""
    bleu_metric(tokenize, lowercase, f"{config_path}: decode.bleu_tokenize")


def corpus_scores(
    hyps: list[str],
    refs: list[list[str]],
    ref_names: list[str] | None = None,
    hyp_name: str = "the hypothesis input",
    tokenize: str = "13a",
    lowercase: bool = False,
) -> Scores:
    """BLEU (``tokenize``; sacreBLEU's default 13a, cased) and chrF of ``hyps`` against one or more
    reference streams."""
    names = ref_names or [f"reference {i + 1}" for i in range(len(refs))]
    if not hyps:
        raise NMTError(f"{hyp_name}: empty input, nothing to score")
    check_line_counts(hyp_name, len(hyps), refs, names)
    bleu = bleu_metric(tokenize, lowercase)
    chrf = CHRF(lowercase=lowercase)
    b = bleu.corpus_score(hyps, refs)
    c = chrf.corpus_score(hyps, refs)
    return Scores(
        bleu=b.score,
        chrf=c.score,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        n_sentences=len(hyps),
    )


def bleu_only(hyps: list[str], refs: list[str], tokenize: str = "13a", lowercase: bool = False) -> float:
    """Dev-set BLEU for validation (cheaper than computing chrF too)."""
    return bleu_metric(tokenize, lowercase).corpus_score(hyps, [refs]).score
