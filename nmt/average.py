"""Checkpoint averaging: the element-wise mean of the model weights of a run's last N
training-state checkpoints written by validations (Vaswani et al., 2017, averaged the last 5 or 20;
fairseq, OpenNMT-py and Marian all offer it), the ones ``train.keep_last`` keeps: not one a signal
wrote between two validations, which a run left alone never has. The average is scored on dev
like any validation and kept as ``checkpoints/average_last_N.pt``, N the number of checkpoints it
averages (weights only, checksummed, written atomically; ``index.json`` names it); translation uses
it by default where its dev BLEU beats the best single checkpoint's.

A run that ends with fewer checkpoints than ``train.average_last`` (it validated fewer times)
averages the ones it has, from 2 on; ``nmt average --last N`` asks for exactly N.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from nmt import checkpoint, checkpoint_file
from nmt.config import Config
from nmt.errors import NMTError
from nmt.models.base import Seq2Seq
from nmt.rundir import RunDir
from nmt.saved_numbers import is_whole_number
from nmt.scoring import bleu_only, check_run_bleu


def average_weights(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Mean of each floating-point tensor over ``states`` (summed in fp64, stored in its own dtype);
    other tensors (integer buffers) are taken from the last state."""
    if not states:
        raise ValueError("nothing to average")
    names = list(states[-1])
    for state in states:
        if list(state) != names:
            raise NMTError("the checkpoints to average hold different parameters")
    out = {}
    for name, last in states[-1].items():
        if last.is_floating_point():
            total = sum(state[name].to(torch.float64) for state in states)
            out[name] = (total / len(states)).to(last.dtype)
        else:
            out[name] = last.clone()
    return out


def dev_bleu(
    translator, cfg: Config, dev_src: list[str], dev_trg: list[str], between_batches: Callable[[], None] | None = None
) -> tuple[float, list[str]]:
    """dev BLEU and translations as validation makes them: ``train.validate_beam_size`` on the first
    ``train.validate_max_sentences`` sentences. ``between_batches`` is called after each decoding
    batch (it may raise to give the validation up)."""
    n = cfg.train.validate_max_sentences or len(dev_src)
    decode = replace(cfg.decode, beam_size=cfg.train.validate_beam_size, nbest=1)
    progress = None if between_batches is None else lambda tokens: between_batches()
    hyps = [h[0] for h in translator.translate(dev_src[:n], decode, progress)]
    return bleu_only(hyps, dev_trg[:n], cfg.decode.bleu_tokenize, cfg.decode.bleu_lowercase), hyps


def dev_scorer(translator, cfg: Config, dev_src: list[str], dev_trg: list[str]) -> Callable[[Seq2Seq], float]:
    """A model's dev BLEU as validation measures it, decoded with ``translator``'s settings."""

    def score(model: Seq2Seq) -> float:
        return dev_bleu(replace(translator, model=model), cfg, dev_src, dev_trg)[0]

    return score


def _why_fewer(cfg: Config, last: int) -> str:
    """What bounds the run's training-state checkpoints below ``last``."""
    if cfg.train.keep_last < last:
        return f"the run keeps train.keep_last {cfg.train.keep_last} (raise it before training)"
    return f"one is written per validation, every train.validate_every {cfg.train.validate_every} updates"


def checkpoints_to_average(
    run: RunDir, cfg: Config, last: int, log: Callable[[str], None], fewer_ok: bool
) -> list[checkpoint.CheckpointInfo]:
    """The run's last ``last`` training-state checkpoints written by validations, newest first
    (``checkpoint.validation_states``: those the run keeps and averages as a run left alone would).
    With ``fewer_ok`` (the end of training: the run validated fewer times) the ones there are, with a
    warning, and none where there is only one; else fewer is an error."""
    found = checkpoint.validation_states(run.checkpoint_dir)[:last]
    if len(found) >= last:
        return found
    if not fewer_ok:
        raise NMTError(
            f"{run.path}: {len(found)} training-state checkpoint(s) written by validations exist, {last} asked for; "
            f"{_why_fewer(cfg, last)}"
        )
    updates = ", ".join(str(info.update) for info in reversed(found)) or "none"
    have = (
        f"warning: train.average_last {last}, but the run has {len(found)} training-state checkpoint(s) "
        f"(updates {updates}; {_why_fewer(cfg, last)})"
    )
    if len(found) < 2:
        log(f"{have}: nothing to average, skipped")
        return []
    log(f"{have}: averaging those {len(found)}")
    return found


@dataclass(frozen=True)
class Averaged:
    """An average of the run's checkpoints, as the index records it."""

    updates: list[int]  # the training states averaged, oldest first
    bleu: float  # its dev score
    best_bleu: float  # the best single checkpoint's, as it was ranked against
    made: bool  # False where that very average existed already (a resumed run's end)


def average_last(
    run: RunDir,
    cfg: Config,
    last: int,
    model: Seq2Seq,
    score: Callable[[Seq2Seq], float],
    log: Callable[[str], None],
    fewer_ok: bool = False,
) -> Averaged | None:
    """Average the run's last ``last`` training-state checkpoints into a copy of ``model``, score it
    with ``score`` (dev BLEU) and keep it as ``average_last_K.pt``, K the number averaged; returns
    it, also where that very average exists already (not ``made``), or None where (``fewer_ok``,
    see ``checkpoints_to_average``) there is nothing to average."""
    if not run.writable:
        raise RuntimeError("averaging writes into the run: open it for writing first")
    found = checkpoints_to_average(run, cfg, last, log, fewer_ok)
    if not found:
        return None
    updates = [info.update for info in reversed(found)]  # oldest first
    manager = run.checkpoints(cfg)
    best = manager.best_score()
    done = manager.read_index().get("average") or {}
    if done.get("updates") == updates and manager.average_path() is not None:
        log(f"the average of updates {', '.join(map(str, updates))} exists already (dev BLEU {done['score']:.2f})")
        return Averaged(updates, done["score"], best, made=False)
    payloads = [checkpoint_file.load(info.path) for info in reversed(found)]
    for info, payload in zip(reversed(found), payloads):
        run.check_checkpoint(info.path, payload, cfg, model)
    averaged = copy.deepcopy(model)
    averaged.load_state_dict(average_weights([p["model"] for p in payloads]))
    bleu = score(averaged)
    name = f"average_last_{len(found)}.pt"
    payload = {"model": averaged.state_dict()}
    if "fingerprint" in payloads[-1]:
        payload["fingerprint"] = payloads[-1]["fingerprint"]
    manager.save_average(payload, name, bleu, updates, by_training=fewer_ok)  # fewer_ok: training's own
    log(
        f"average of updates {', '.join(map(str, updates))}: dev BLEU {bleu:.2f} against the best single "
        f"checkpoint's {best:.2f}; {run.checkpoint_dir / name} {_verdict(manager, bleu > best)}"
    )
    return Averaged(updates, bleu, best, made=True)


def _verdict(manager: checkpoint.CheckpointManager, better: bool) -> str:
    """What translation's ``auto`` now takes (``nmt.checkpoint_choice``), said of the average just kept:
    it, the best single checkpoint, or nothing where the recorded best's file is missing."""
    missing = manager.missing_best()
    if missing is not None:
        return (
            f"kept, but the best single checkpoint recorded in index.json, {missing.name}, is missing: "
            "--checkpoint auto and best fail until it is restored; --checkpoint average takes this average"
        )
    return "used by default" if better else "kept, but the best single checkpoint stays the default"


def config_as_validated(run: RunDir, cfg: Config, state_path: Path) -> Config:
    """``cfg`` as the run's validations decode with it: the length penalty the training state at
    ``state_path`` recorded for them (``nmt.validation.validation_length_penalty``), since the average
    is ranked against their scores and 'nmt tune-decode' may have written another into config.yaml."""
    from nmt import validation
    from nmt.training_state import Progress

    saved = checkpoint_file.mapped_entry(state_path, "progress") or {}  # a glance: averaging loads it
    validated = saved.get("last_validated", -1)  # a damaged state is refused later, when averaged
    recorded = Progress(
        last_validated=validated if is_whole_number(validated) else -1,
        validate_length_penalty=saved.get("validate_length_penalty", -1.0),
    )
    penalty = validation.validation_length_penalty(recorded, cfg, run.tune_decode_path)
    return validation.validation_config(cfg, penalty)


def average_run(run: RunDir, last: int, device: str, log: Callable[[str], None]) -> Averaged | None:
    """``nmt average``: lock the run (no trainer may be writing it), average, score on its dev set."""
    from nmt.corpus import clean_pairs, read_parallel
    from nmt.translate import load_translator

    cfg = run.config_reading("dev")
    # A tokenizer that cannot run is said now, not after the first averaged model's pass over the dev set
    check_run_bleu(cfg.decode.bleu_tokenize, cfg.decode.bleu_lowercase, run.config_path)
    run.lock(log, "average")
    try:
        found = checkpoints_to_average(run, cfg, last, log, fewer_ok=False)  # too few: said now, not after loading
        run.checkpoints(cfg).read_index()  # and an index that cannot be read (the best score is ranked against)
        translator = load_translator(run, device, None, log, which="last")
        dev_src, dev_trg, _ = clean_pairs(*read_parallel(cfg.data.dev, cfg.data.src_lang, cfg.data.trg_lang))
        score = dev_scorer(translator, config_as_validated(run, cfg, found[0].path), dev_src, dev_trg)
        return average_last(run, cfg, last, translator.model, score, log)
    finally:
        run.close()
