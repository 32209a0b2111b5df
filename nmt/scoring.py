"""Corpus BLEU and chrF through sacreBLEU, with its signatures printed beside the scores."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import sacrebleu

from nmt.errors import NMTError


@dataclass
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    n_sentences: int

    def summary(self) -> str:
        return (
            f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  ({self.n_sentences} sentences)\n"
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


def corpus_scores(
    hyps: list[str], refs: list[list[str]], ref_names: list[str] | None = None, hyp_name: str = "the hypothesis input"
) -> Scores:
    """BLEU (13a, cased) and chrF of ``hyps`` against one or more reference streams."""
    names = ref_names or [f"reference {i + 1}" for i in range(len(refs))]
    if not hyps:
        raise NMTError(f"{hyp_name}: empty input, nothing to score")
    check_line_counts(hyp_name, len(hyps), refs, names)
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(hyps, refs)
    c = chrf.corpus_score(hyps, refs)
    return Scores(
        bleu=b.score,
        chrf=c.score,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        n_sentences=len(hyps),
    )


def bleu_only(hyps: list[str], refs: list[str]) -> float:
    """Dev-set BLEU for validation (cheaper than computing chrF too)."""
    return sacrebleu.corpus_bleu(hyps, [refs]).score
