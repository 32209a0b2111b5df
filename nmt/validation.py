"""Validation's arithmetic: the dev loss (teacher-forced NLL per token), dev BLEU with its
hypotheses, the verdict kept in ``Progress`` (a new best, or one more bad validation towards
``train.patience``), the record and log line a validation leaves, the digest of the dev set it
scored on, by which a resume on another is refused, and the length penalty its beam search keeps.
``Trainer.validate`` runs them on rank 0 and does what has side effects: dev.hyp, the best
checkpoints, the training state, and what a failed validation still saves.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from nmt import checkpoint
from nmt.average import dev_bleu
from nmt.batching import make_batch, token_batches
from nmt.config import Config
from nmt.loss import teacher_forced_loss
from nmt.prepare import EncodedCorpus, Prepared
from nmt.saved_numbers import is_number
from nmt.training_state import Progress
from nmt.translate import Translator
from nmt.tune_decode import untuned_decode


def evaluate_loss(
    model,
    corpus: EncodedCorpus,
    tok,
    max_tokens: int,
    precision,
    device,
    between_batches: Callable[[], None] | None = None,
) -> float:
    """Mean per-token NLL (no smoothing) of the teacher-forced model on a corpus. ``between_batches``
    is called after each batch (it may raise to give the evaluation up).

    The NLL is summed on the device and read once at the end: reading it after every batch made a
    GPU wait for the host at each one. The sum is fp64, as Python's float sum of the batches' fp32
    values was, so the result is the same to the bit."""
    was_training = model.training
    model.eval()
    nll_total, tokens = torch.zeros((), dtype=torch.float64, device=device), 0
    try:
        with torch.inference_mode():
            for rows in token_batches(corpus.src_lens, corpus.trg_lens, max_tokens, None, 0):
                batch = make_batch(*corpus.pairs(rows), rows, tok.pad_id, tok.bos_id, tok.eos_id).to(device)
                _, nll = teacher_forced_loss(model, model, batch, 0.0, tok.pad_id, precision)
                nll_total += nll.double()
                tokens += batch.n_trg_tokens  # counted on the host as the batch was made: no device read
                if between_batches is not None:
                    between_batches()
    finally:
        model.train(was_training)
    return nll_total.item() / max(tokens, 1)


def dev_scores(
    model, translator: Translator, cfg: Config, data: Prepared, precision, device, step: Callable[[], None]
) -> tuple[float, float, list[str]]:
    """(dev loss, dev BLEU, its hypotheses); ``step`` is called after each dev batch of either."""
    dev_loss = evaluate_loss(model, data.dev, data.trg_tok, cfg.train.max_tokens, precision, device, step)
    bleu, hyps = dev_bleu(translator, cfg, data.dev_src, data.dev_trg, step)
    return dev_loss, bleu, hyps


def dev_digest(sources: list[str], references: list[str]) -> str:
    """SHA-256 of a dev set as validation reads it, its sources and references line by line (each
    line's length first: a dataset's text may hold newlines)."""
    digest = hashlib.sha256()
    for side in (sources, references):
        digest.update(len(side).to_bytes(8, "little"))
        for line in side:
            data = line.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def dev_set_change(p: Progress, digest: str) -> str | None:
    """Why a run resumed at ``p`` cannot validate on the dev set of ``digest``, or None: its best
    checkpoints, the patience count and the averaged model's standing compare every validation's
    score, and scores on two dev sets do not compare. A run that has not validated, or whose state
    an earlier version wrote (no digest), may take any."""
    if not p.dev_data or p.last_validated < 0 or p.dev_data == digest:
        return None
    return (
        "cannot resume: data.dev holds other sentences than the dev set this run's validations were "
        f"scored on (best BLEU {p.best_bleu:.2f} at update {p.best_update}), and the best checkpoints and "
        "train.patience compare those scores; give that dev set again (moved files are fine: it is "
        "recognised by its text), or use a new run_dir"
    )


def validation_length_penalty(p: Progress, cfg: Config, tune_report: Path) -> float:
    """The length penalty validation's beam search scores with: the one recorded at the run's first
    validation, for its whole life, since 'nmt tune-decode' writes another into the run's
    decode.length_penalty and the best checkpoints, patience and the averaged model's standing
    compare every validation's score. A run not validated yet, or a state of an earlier version,
    takes the run's own (``untuned_decode``: tune_decode.json's "before" where config.yaml holds the
    tuned pair)."""
    if p.last_validated >= 0 and is_number(p.validate_length_penalty) and p.validate_length_penalty >= 0:
        return p.validate_length_penalty
    return untuned_decode(cfg.decode, tune_report)["length_penalty"]


def validation_config(cfg: Config, penalty: float) -> Config:
    """``cfg`` as validation decodes with it: ``penalty`` (``validation_length_penalty``)."""
    return replace(cfg, decode=replace(cfg.decode, length_penalty=penalty))


def penalty_line(cfg: Config, penalty: float) -> str | None:
    """What the log says where validation's beam search scores with another ``penalty`` than
    decode.length_penalty; None where it does not, or validation is greedy (no penalty changes it)."""
    if cfg.train.validate_beam_size == 1 or penalty == cfg.decode.length_penalty:
        return None
    return (
        f"validation decodes with length penalty {penalty}, the run's since its first validation, not "
        f"decode.length_penalty {cfg.decode.length_penalty}: its scores rank against the earlier ones"
    )


def judge(p: Progress, bleu: float, dev_loss: float) -> bool:
    """Whether the validation at ``p.update`` is a new best (BLEU first, then the lower dev loss),
    kept in ``p``: a best resets the bad validations patience counts, any other is one more."""
    is_best = checkpoint.best_rank(bleu, dev_loss) > checkpoint.best_rank(p.best_bleu, p.best_loss)
    if is_best:
        p.best_bleu, p.best_loss, p.best_update, p.bad_validations = bleu, dev_loss, p.update, 0
    else:
        p.bad_validations += 1
    p.last_validated = p.update
    return is_best


def valid_record(p: Progress, dev_loss: float, bleu: float, seconds: float) -> dict:
    """The validation's record in metrics.jsonl; ``seconds`` it took."""
    return {
        "type": "valid",
        "update": p.update,
        "epoch": p.update_epoch,
        "dev_loss": dev_loss,
        "dev_ppl": math.exp(min(dev_loss, 50)),
        "dev_bleu": bleu,
        "best_bleu": p.best_bleu,
        "elapsed": p.elapsed_seconds,
        "seconds": seconds,
    }


def valid_line(p: Progress, record: dict, is_best: bool) -> str:
    """The validation's line in the log, a * where it is a new best."""
    return (
        f"validation at update {p.update}: dev loss {record['dev_loss']:.3f}, ppl {record['dev_ppl']:.2f}, "
        f"BLEU {record['dev_bleu']:.2f} (best {p.best_bleu:.2f} at update {p.best_update}){' *' if is_best else ''}"
    )
