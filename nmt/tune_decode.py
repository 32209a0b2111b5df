"""``nmt tune-decode``: the beam size and length penalty that translate the run's dev set best,
written into the run's ``config.yaml`` (``decode.beam_size``, ``decode.length_penalty``), so that
``nmt translate`` and ``eval-bleu`` use them from then on. Chosen on dev only: a test set is never
read here.

Each (beam size, length penalty) pair is a full beam search of the dev set, since the penalty
changes which hypotheses survive, not only how the finished ones rank.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from nmt import checkpoint_choice
from nmt.config import MAX_LENGTH_PENALTY, DecodeConfig
from nmt.config_checks import check_beam_size
from nmt.corpus import clean_pairs, read_parallel
from nmt.errors import NMTError
from nmt.files import atomic_write_bytes
from nmt.run_config import empty_saved_corpus, tuned_decode_report
from nmt.rundir import RunDir
from nmt.scoring import bleu_only, check_run_bleu


@dataclass(frozen=True)
class Trial:
    beam_size: int
    length_penalty: float
    bleu: float


def best_trial(trials: list[Trial]) -> Trial:
    """The highest dev BLEU; among equal ones the smaller beam (faster), then the penalty nearest 1."""
    return max(trials, key=lambda t: (round(t.bleu, 2), -t.beam_size, -abs(t.length_penalty - 1.0)))


def grid(translate: Callable[[DecodeConfig], list[str]], refs: list[str], base: DecodeConfig, beams, penalties, log):
    """Every (beam size, penalty) pair scored on dev, each once (a repeated value is tried at its
    first place). Beam 1 is greedy, which no penalty changes: it is tried once, with ``base``'s
    penalty, so that a greedy winner leaves the run's penalty for a later ``--beam-size``."""
    beams, penalties = list(dict.fromkeys(beams)), list(dict.fromkeys(penalties))
    trials = []
    for beam in beams:
        for alpha in penalties if beam > 1 else [base.length_penalty]:
            hyps = translate(replace(base, beam_size=beam, length_penalty=alpha, nbest=1))
            bleu = bleu_only(hyps, refs, base.bleu_tokenize, base.bleu_lowercase)
            trials.append(Trial(beam, alpha, bleu))
            kept = " (greedy: the run's own)" if beam == 1 else ""
            log(f"beam {beam:2d}, length penalty {alpha:.2f}{kept}: dev BLEU {bleu:.2f}")
    return trials


def beams_for_nbest(beams: list[int], nbest: int, log: Callable[[str], None]) -> list[int]:
    """The beams that can give the run's ``decode.nbest`` hypotheses: a smaller one written into
    config.yaml would make the config invalid for every later command."""
    kept = [b for b in beams if b >= nbest]
    if not kept:
        raise NMTError(
            f"tune-decode: every --beam-sizes value ({', '.join(map(str, beams))}) is smaller than the run's "
            f"decode.nbest {nbest}; give beam sizes of at least {nbest}"
        )
    left_out = sorted(set(beams) - set(kept))
    if left_out:
        log(f"tune-decode: leaving out beam sizes {', '.join(map(str, left_out))}, smaller than decode.nbest {nbest}")
    return kept


def untuned_decode(decode: DecodeConfig, report: Path) -> dict:
    """The run's own beam size and length penalty, before any tuning: where ``decode`` holds what an
    earlier tune-decode chose, that tuning's "before" (so a resume with the run's first config keeps
    the latest tuned pair)."""
    keys = ("beam_size", "length_penalty")
    in_force = {k: getattr(decode, k) for k in keys}
    earlier = tuned_decode_report(report)
    if earlier is not None and {k: earlier[0].get(k) for k in keys} == in_force:
        return {k: earlier[1].get(k) for k in keys}
    return in_force


def tune_decode(run: RunDir, beams, penalties, device: str, which: str, log: Callable[[str], None]) -> Trial:
    """Search the grid on the run's dev set, write the winner into its config (holding the run's lock)."""
    from nmt.checkpoint_file import recorded_digest
    from nmt.translate import load_translator

    good_penalties = penalties and all(math.isfinite(a) and 0 <= a <= MAX_LENGTH_PENALTY for a in penalties)
    if not beams or any(b < 1 for b in beams) or not good_penalties:
        raise NMTError(f"tune-decode: beam sizes must be >= 1 and length penalties in [0, {MAX_LENGTH_PENALTY:g}]")
    cfg = run.config_reading("dev")
    # A tokenizer that cannot run is said now, not after the grid's first pass over the dev set
    check_run_bleu(cfg.decode.bleu_tokenize, cfg.decode.bleu_lowercase, run.config_path)
    for beam in beams:
        check_beam_size(beam, cfg.tokenizer.vocab_size, "tune-decode: beam size")
    beams = beams_for_nbest(beams, cfg.decode.nbest, log)
    run.lock(log, "tune-decode")
    try:
        run.checkpoints(cfg).read_index()  # one that cannot be read: said now, not after the grid
        src, ref, _ = clean_pairs(*read_parallel(cfg.data.dev, cfg.data.src_lang, cfg.data.trg_lang))
        if not src:  # sacreBLEU fails on no sentences with an IndexError
            problem = f"the corpus '{cfg.data.dev.path}' is empty after cleaning: no dev pair to tune on"
            raise empty_saved_corpus(run.config_path, "dev", problem)
        translator = load_translator(run, device, None, log, which)
        trials = grid(lambda d: [h[0] for h in translator.translate(src, d)], ref, cfg.decode, beams, penalties, log)
        best = best_trial(trials)
        before = untuned_decode(cfg.decode, run.tune_decode_path)
        cfg = replace(cfg, decode=replace(cfg.decode, beam_size=best.beam_size, length_penalty=best.length_penalty))
        trials_done = [t.__dict__ for t in trials]
        tuned_on = translator.checkpoint.name  # the one loaded: resolving ``which`` again might not give it
        report = {"dev": cfg.data.dev.path, "checkpoint": tuned_on, "chosen": best.__dict__, "before": before}
        report["checkpoint_sha256"] = recorded_digest(translator.checkpoint)  # a file written again is another
        report["trials"] = trials_done
        # The report first: one whose chosen pair config.yaml does not hold is ignored, so a disk that
        # fills between the two leaves the run decoding as before, not with a pair no report explains.
        atomic_write_bytes(run.tune_decode_path, json.dumps(report, indent=1).encode("utf-8"))
        run.write_config(cfg)
        default = tuned_on if which == "auto" else checkpoint_choice.model_checkpoint(run, cfg).name
    finally:
        run.close()
    if tuned_on != default:  # the pair is the run's, whichever checkpoint a later command loads
        log(
            f"warning: tuned with {tuned_on}, but translate and eval-bleu load {default} unless given "
            f"--checkpoint {tuned_on}"
        )
    log(
        f"chosen on dev: beam {best.beam_size}, length penalty {best.length_penalty} (dev BLEU {best.bleu:.2f}); "
        f"written to {run.config_path}"
    )
    return best
