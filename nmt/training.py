"""The training loop: update after update until a stopping rule fires, validating every
``train.validate_every`` updates, and stopping cleanly (checkpoint first) on SIGINT/SIGTERM, or
where another torchrun rank went away.

What one update does, and the model, data and checkpoints behind it, are the ``Trainer``'s
(nmt/trainer.py); this module only decides when.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nmt import checkpoint_choice, distributed, rank_failures
from nmt.batching import padding_fraction
from nmt.checkpoint_file import CheckpointNotWritten
from nmt.config import Config, TrainConfig
from nmt.errors import NMTError, error_line
from nmt.files import storage_error, write_error_message
from nmt.rundir import RunDir
from nmt.signals import SignalGuard
from nmt.trainer import Trainer
from nmt.training_state import Progress

RELEASE_EVERY = 100  # updates between two returns of the heap's free pages (Trainer.release_freed_memory)


def train(
    cfg: Config, log: Callable[[str], None], config_file: Path | None = None, overrides: list[str] | None = None
) -> Progress:
    """Train (or resume) the run ``cfg`` describes; ``config_file`` is the file it was read from, with
    the command line's ``--set`` ``overrides``."""
    trainer = Trainer(cfg, RunDir(cfg.run_dir), log)
    closing: contextlib.AbstractContextManager = contextlib.nullcontext()
    try:
        try:
            return run(trainer, config_file, overrides)
        except rank_failures.PeerLost:
            # torchrun SIGTERMs the ranks left as soon as it sees one fail: rank 0 has saved and only
            # ends now, and the signal would replace its report with 'interrupted'.
            closing = SignalGuard()
            raise
        except OSError as e:  # train.log, metrics.jsonl, dev.hyp, config.yaml
            if not storage_error(e):
                raise
            resume = _resume_once_there_is_space(trainer, config_file, overrides)
            raise NMTError(f"{write_error_message(e)}; {resume}") from None
        except CheckpointNotWritten as e:  # the largest files the run writes: the likeliest to fill a disk
            if not e.storage:
                raise
            resume = _resume_once_there_is_space(trainer, config_file, overrides)
            raise NMTError(f"{e.path}: could not write checkpoint ({e.reason}); {resume}") from None
        except Exception as e:  # a peer lost in the set-up, before there is a state to save
            if not (trainer.world.enabled and rank_failures.peer_lost(e)):
                raise
            closing = SignalGuard()  # torchrun's SIGTERM follows, as above
            raise rank_failures.PeerLost(rank_failures.peer_lost_message(trainer.world, e)) from None
    except (Exception, KeyboardInterrupt) as e:
        # The console may be gone (nohup, a closed pipe, a lost ssh session): train.log says why the run ended.
        trainer.log_end(how_it_ended(e))
        raise
    finally:
        with closing:
            trainer.close()
            distributed.shutdown()


def _resume_once_there_is_space(trainer: Trainer, config_file: Path | None, overrides: list[str] | None) -> str:
    """How to go on after a write the storage refused: the command that started the run, its --set
    options too (they may name the run_dir, or a model the config file does not)."""
    if config_file is None:  # the API: the run's resolved config holds every value
        resume = ["nmt", "train", "--config", str(trainer.run.config_path)]
    else:
        resume = ["nmt", "train", "--config", str(config_file), *(a for kv in overrides or [] for a in ("--set", kv))]
    return f"what the run wrote before is intact: free space, then resume with: {shlex.join(resume)}"


def how_it_ended(error: BaseException) -> str:
    """The line ``train.log`` ends with where a run stops on ``error``: what the console says of it."""
    from nmt.cli import out_of_memory, out_of_memory_message  # the console's words; cli imports this module

    if isinstance(error, NMTError):
        message = str(error).replace("\n", " ")
        return f"error: {message}"
    if out_of_memory(error):
        return f"error: {out_of_memory_message('train', error)}"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    return f"error: {error_line(error)}"


def run(trainer: Trainer, config_file: Path | None = None, overrides: list[str] | None = None) -> Progress:
    """Set ``trainer`` up, train it until a stopping rule fires, and validate the last update;
    ``config_file`` and its --set ``overrides`` are where its config was read from."""
    trainer.setup(config_file=config_file, overrides=overrides)
    trainer.save_before_failed_update = True
    p = trainer.progress
    note = extended_past_its_last_validation(trainer.cfg.train, p)
    if note is not None:
        trainer.log(note)
    with SignalGuard() as signals, saved_if_a_peer_is_lost(trainer):
        reason = run_loop(trainer, signals)
        trainer.log(f"stopping: {reason}")
        if p.last_validated != p.update:
            validate(trainer, signals)
    # Every rank reaches the end before any tears down (gloo aborted now and then when one rank
    # destroyed its group while another was still in its last collective): the others wait
    # here for rank 0's averaging.
    average = trainer.average if trainer.cfg.train.average_last else lambda: None
    try:
        with saved_if_a_peer_is_lost(trainer):
            rank_failures.agree(trainer.world, average, solo_work=True)
    except KeyboardInterrupt as e:  # past the signal guard: the updates since the last checkpoint stay
        trainer.save()
        raise trainer.interrupted(getattr(e, "signum", signal.SIGINT)) from None
    trainer.log(f"best dev BLEU {p.best_bleu:.2f} at update {p.best_update}; run directory {trainer.run}")
    note_retuning(trainer)
    return p


def note_retuning(trainer: Trainer) -> None:
    """A tuned run trained on may now translate with a checkpoint its decoding pair was not tuned
    with (a new best or average): said once here, as the run ends, and by each command that loads it."""
    run, cfg = trainer.run, trainer.cfg
    if trainer.world.is_main and run.tune_decode_path.exists():
        try:
            loaded = checkpoint_choice.model_checkpoint(run, cfg)
        except NMTError:  # its best checkpoint is missing: translate says so, the finished run stands
            return
        note = checkpoint_choice.retune_note(run, loaded, "auto", cfg.decode, "translate loads now")
        if note is not None:
            trainer.log(note)


@contextlib.contextmanager
def saved_if_a_peer_is_lost(trainer: Trainer) -> Iterator[None]:
    """Around training once set up: where a collective fails because another rank went away (killed,
    out of memory, crashed), rank 0 saves the training state it holds and says so; the other ranks
    end as before (``rank_failures.reported_once``). That state is a consistent one wherever the
    failure surfaces:

    - in ``train_step`` (DDP's gradient all-reduce, the statistics): before the optimizer step, so
      it is the last update's, and the resumed run makes this update from its start;
    - in the loop's agreement on clock and signal: the update is complete, and its metrics line is
      written before it propagates (``run_loop``); a validation it was due is made on resume;
    - in a validation: one that ended on rank 0 has written its checkpoint (written again here);
      one given up (torchrun's SIGTERM) or failed left ``last_validated`` behind, so the resumed
      run makes it first; in the final averaging: the last validation's state, which is kept.

    Nothing in the save is a collective, and torchrun's SIGTERM, which follows at once, is held
    off until it is written (atomic: a SIGKILL then loses nothing older). At update 0 there is
    nothing to keep: the error stays as it was."""
    try:
        yield
    except Exception as e:
        if not (trainer.world.is_main and rank_failures.peer_lost(e)) or trainer.progress.update == 0:
            raise
        with SignalGuard():
            trainer.save()
        raise trainer.peer_lost(e) from None


def stop_reason(t: TrainConfig, p: Progress) -> str | None:
    """The stopping rule that holds now, if any."""
    if t.max_updates is not None and p.update >= t.max_updates:
        return f"reached train.max_updates {t.max_updates}"
    if t.max_epochs is not None and p.epoch > t.max_epochs:
        return f"reached train.max_epochs {t.max_epochs}"
    if t.max_minutes is not None and p.elapsed_seconds >= t.max_minutes * 60:
        return f"reached train.max_minutes {t.max_minutes}"
    if t.patience is not None and p.bad_validations >= t.patience:
        return (
            f"no improvement in {t.patience} validations (train.patience: no higher dev BLEU, "
            "nor an equal one with a lower dev loss)"
        )
    return None


def validates_at(t: TrainConfig, update: int) -> bool:
    """Whether ``update`` is one the run validates after (every ``train.validate_every``)."""
    return update % t.validate_every == 0


def extended_past_its_last_validation(t: TrainConfig, p: Progress) -> str | None:
    """The warning a run resumed to train on logs where it had ended at an update off the
    ``validate_every`` grid: the validation it ended with, which a run left alone to the new end
    does not make, stays one of its validations (patience, best and kept checkpoints). None otherwise."""
    if p.update == 0 or p.last_validated != p.update or validates_at(t, p.update):
        return None
    if stop_reason(t, p) is not None:
        return None
    return (
        f"warning: the run ended at update {p.update} with a validation off train.validate_every {t.validate_every}, "
        f"which a run trained to the new end without stopping does not make; it stays one of this run's: it counts "
        f"for train.patience ({p.bad_validations} without improvement now) and may be kept by train.keep_last, "
        "keep_best and average_last"
    )


def validation_due(t: TrainConfig, p: Progress) -> bool:
    """Whether the update a run resumes at still lacks the validation it was due (one given up for a
    signal, or failed): the resumed run does it first, as an uninterrupted run would have."""
    return p.update > 0 and validates_at(t, p.update) and p.last_validated != p.update


def validate(trainer: Trainer, signals: SignalGuard) -> None:
    """Validate now. A signal that comes meanwhile ends the run at once (rank 0 gives the
    validation up between two batches): the training state is saved, to be validated on resume."""
    try:
        trainer.validate(signals.check)
    except KeyboardInterrupt as e:
        trainer.save()
        raise trainer.interrupted(getattr(e, "signum", signal.SIGINT)) from None


def agreed_clock(trainer: Trainer, elapsed: float) -> float:
    """The run's wall time as every rank takes it (the latest rank's), so that ``max_minutes`` stops
    them all at the same update: a rank that stopped alone would leave the others in a collective."""
    if not trainer.world.enabled:
        return elapsed
    return distributed.all_reduce([elapsed], trainer.world, trainer.device, op="max")[0]


def run_loop(trainer: Trainer, signals: SignalGuard) -> str:
    """Update until a stopping rule fires; returns it. Wall time (validation included) adds up
    over every session of the run, so ``max_minutes`` counts the whole run."""
    t, p = trainer.cfg.train, trainer.progress
    per_update = t.accumulate * trainer.world.world_size
    clock_base, clock_start = p.elapsed_seconds, time.perf_counter()
    report = Report(trainer)
    trainer.release_freed_memory()  # what preparing the data freed
    try:
        if validation_due(t, p):
            validate(trainer, signals)
            p.elapsed_seconds = agreed_clock(trainer, clock_base + time.perf_counter() - clock_start)
            report.restart_window()
        while (reason := stop_reason(t, p)) is None:
            plan = trainer.epoch_plan()
            if p.batch_in_epoch == 0:
                report.epoch(plan)
            group = plan[p.batch_in_epoch : p.batch_in_epoch + per_update]
            stats = trainer.train_step(group)
            p.batch_in_epoch += len(group)
            p.epoch_batches = len(plan)
            if p.batch_in_epoch >= len(plan):
                p.epoch, p.batch_in_epoch, p.epoch_batches = p.epoch + 1, 0, 0
            p.elapsed_seconds = clock_base + time.perf_counter() - clock_start
            # What every rank agreed on: one that comes during the validation is rank 0's to act on
            # there; on the other ranks it waits for the next update's agreement.
            stop = signals.received
            if trainer.world.enabled:  # one clock and one signal for all ranks, so they stop together
                try:
                    p.elapsed_seconds, signum = distributed.all_reduce(
                        [p.elapsed_seconds, float(stop or 0)], trainer.world, trainer.device, op="max"
                    )
                except Exception as e:  # the update is made: its line goes before its checkpoint
                    if stats is not None and rank_failures.peer_lost(e):
                        report.update(stats)
                    raise
                # One that came during the exchange, which the others may not have had yet, waits too.
                stop = int(signum) or None
                signals.received = stop or signals.received
            if stats is not None:
                report.update(stats)
                validating = validates_at(t, p.update)
                if validating:
                    validate(trainer, signals)
                    p.elapsed_seconds = agreed_clock(trainer, clock_base + time.perf_counter() - clock_start)
                    report.restart_window()
                if validating or p.update % RELEASE_EVERY == 0:  # validation's decoding frees blocks of its own
                    trainer.release_freed_memory()
            if stop is not None:
                trainer.save()
                raise trainer.interrupted(stop)
    finally:
        report.close()
    return reason


class Report:
    """What the loop tells the user: metrics.jsonl every update, a log line every ``log_every``
    updates (or a progress bar on a terminal), with the throughput since the last line."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.bar = None
        if sys.stderr.isatty() and trainer.world.is_main:
            from tqdm import tqdm

            t = trainer.cfg.train
            self.bar = tqdm(total=t.max_updates, initial=trainer.progress.update, unit="upd", dynamic_ncols=True)
        self.restart_window()

    def restart_window(self) -> None:
        self.window_tokens, self.window_start = 0, time.perf_counter()

    def epoch(self, plan) -> None:
        trainer, p = self.trainer, self.trainer.progress
        if p.epoch == 1 or len(plan) >= trainer.cfg.train.log_every:
            data = trainer.data.train
            padding = padding_fraction(plan, data.trg_lens)
            trainer.log(f"epoch {p.epoch}: {len(plan)} batches, padding {100 * padding:.1f}% of target slots")

    def update(self, stats: dict) -> None:
        trainer, p = self.trainer, self.trainer.progress
        record = {"type": "train", "update": p.update, "epoch": p.update_epoch, **stats}
        trainer.write_metrics({**record, "elapsed": round(p.elapsed_seconds, 3)})
        self.window_tokens += stats["trg_tokens"]
        if p.update % trainer.cfg.train.log_every == 0:
            rate = self.window_tokens / max(time.perf_counter() - self.window_start, 1e-9)
            self.restart_window()
            line = (
                f"update {p.update} epoch {p.update_epoch} loss {stats['loss']:.3f} lr {stats['lr']:.2e} "
                f"|g| {stats['grad_norm']:.2f} {rate:.0f} tgt tok/s"
            )
            if self.bar is None:
                trainer.log(line)
            else:  # the bar shows it on the terminal; train.log keeps the line, as a run without one
                trainer.log_to_file(line)
                self.bar.set_postfix_str(f"loss {stats['loss']:.3f} lr {stats['lr']:.1e} {rate:.0f} tok/s")
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
