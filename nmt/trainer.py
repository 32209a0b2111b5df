"""The Trainer: one model with its optimizer, data and run directory, and the four things a
training loop asks of them (``setup``, ``train_step``, ``validate``, ``save``). The loop itself
(stopping rules, logging, validation cadence, signals) is ``nmt.training.train``; one update
(``train_step``) is ``nmt.update_step``.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict

import torch

from nmt import autotune, distributed, rank_failures, testhooks
from nmt.average import average_last, dev_scorer
from nmt.batching import BatchPlan, epoch_batch_shapes
from nmt.config import Config, config_to_dict
from nmt.device import (
    Precision,
    adamw,
    bf16_available,
    check_precision,
    keep_freed_memory,
    release_freed_memory,
    select_device,
    size_onednn_cache,
)
from nmt.epoch_plan import EpochPlans, continue_epoch
from nmt.errors import NMTError, drop_failed_work, error_line
from nmt.files import atomic_write_bytes, storage_error
from nmt.metrics import MetricsLog, has_record
from nmt.model_memory import check_training_fits
from nmt.models import build_model
from nmt.optimization import apply_optimizer_settings
from nmt.prepare import Prepared, prepare
from nmt.resuming import resumed_lines, saved_line
from nmt.rundir import RunDir
from nmt.schedule import horizon_change
from nmt.scoring import bleu_metric
from nmt.signals import Interrupted
from nmt.train_log import TrainLog
from nmt.training_kernels import choose_kernels
from nmt.training_state import Progress, resume_problem, set_rng_state, training_state
from nmt.translate import Translator
from nmt.update_step import UpdateStep
from nmt.validation import (
    dev_digest,
    dev_scores,
    dev_set_change,
    judge,
    penalty_line,
    valid_line,
    valid_record,
    validation_config,
    validation_length_penalty,
)


def _told_already(message: str) -> None:
    """Where validation's translator reports dev sources cut to the model's positions:
    ``nmt.prepare`` said so once for the dev set."""


class Trainer(UpdateStep):
    def __init__(self, cfg: Config, run: RunDir, log: Callable[[str], None]):
        self.cfg = cfg
        self.run = run
        self.train_log = TrainLog(run.log_path, log)
        self.metrics: list = []  # metrics.jsonl, and TensorBoard with train.tensorboard (rank 0)
        self.progress = Progress()
        self.world = distributed.world_from_environment()
        self._epochs: EpochPlans | None = None  # the training pairs' epoch plans, once the data is prepared
        self._state_written_at = 0  # the update of the newest training state written or resumed from (0: none)
        self._dev_data: str | None = None  # the dev set's digest, once asked (``nmt.validation.dev_digest``)
        # Set by the training loop (``nmt.training.run``): an update that fails before its optimizer step
        # first writes the state of the one before. Off elsewhere: ``nmt bench`` never writes a checkpoint.
        self.save_before_failed_update = False

    def log(self, message: str) -> None:
        """To the console and to ``train.log`` in the run directory (rank 0 only)."""
        if self.world.is_main:
            self.train_log.line(message)

    def log_to_file(self, message: str) -> None:
        """To ``train.log`` only (rank 0): a line the console shows as a progress bar instead."""
        if self.world.is_main:
            self.train_log.file_line(message)

    def log_end(self, message: str) -> None:
        """``message`` in ``train.log`` only (the CLI prints it on the console): ``TrainLog.end``."""
        self.train_log.end(message)

    # -- setup ------------------------------------------------------------------------------

    def setup(self, resume: bool = True, config_file=None, overrides: list[str] | None = None) -> None:
        """Device, run directory (rank 0 takes its lock), data, kernels, model, optimizer; then
        the latest checkpoint's state when ``resume`` and there is one. ``config_file`` and its --set
        ``overrides``: where ``cfg`` was read from, for the errors in its values."""
        cfg, world = self.cfg, self.world

        def warn(message: str) -> None:
            self.train_log.keep_for_file(message)
            self.log(message)

        self.device = select_device(cfg.train.device, fallback_to_cpu=cfg.train.cpu_fallback, warn=warn)
        # Before any work, and before the ranks join: every rank finds the same, and says it alike.
        check_precision(cfg.train.precision, self.device.type, bf16_available(self.device))
        autotune.check_fp32_matmul(cfg.train.fp32_matmul, self.device.type)
        bleu_metric(cfg.decode.bleu_tokenize, cfg.decode.bleu_lowercase)  # a missing extra: before training, not at dev
        if cfg.train.tensorboard and world.is_main:  # rank 0 writes the events
            from nmt.tensorboard import check_available

            check_available()
        if self.device.type == "cpu":
            keep_freed_memory()
        if world.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", world.local_rank)
            torch.cuda.set_device(self.device)
        distributed.init(world, self.device)
        distributed.check_same_config(config_to_dict(cfg), world)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        # Rank 0 takes the run and prepares the data while the others wait; they then find it done
        # and only open it. Each step ends with every rank knowing whether it went well everywhere.
        rank_failures.agree(
            world, lambda: self._take_run(config_file, overrides, resume) if world.is_main else None, solo_work=True
        )
        self.data: Prepared = rank_failures.agree(
            world, lambda: self.data if world.is_main else prepare(self.cfg, self.run, self.log, made_by_rank_0=True)
        )
        cfg = self.cfg
        tok = self.data.trg_tok
        # Before anything of the model's size is allocated (auto's measurement builds one layer of it):
        # a model that cannot fit is one line, not the OOM killer's silent exit 137.
        rank_failures.agree(
            world,
            lambda: check_training_fits(
                cfg.model, self.data.src_tok.vocab_size, tok.vocab_size, tok.pad_id, self.device, self._ranks_here()
            ),
        )
        if self.device.type == "cpu":  # after the data, before the first product (auto's measurement)
            self._size_kernel_cache()
        self.choice = choose_kernels(self.cfg, self.run, self.device, world, tok.vocab_size, resume, self.log)
        self.precision = Precision(self.device.type, self.choice.precision)
        torch.manual_seed(cfg.seed)  # the same initial weights however long the measurement ran
        self.model = build_model(cfg.model, self.data.src_tok.vocab_size, tok.vocab_size, tok.pad_id).to(self.device)
        self.model.set_attention_kernel(self.choice.attention)
        self.model.set_fp32_matmul(self.choice.fp32_matmul)
        t = cfg.train
        self.optimizer = adamw(
            self.model.parameters(), lr=t.lr_peak, betas=t.betas, eps=t.adam_eps, weight_decay=t.weight_decay
        )
        self.scaler = self.precision.grad_scaler()
        self.checkpoints = self.run.checkpoints(cfg)  # read-only on ranks > 0: they only resume from it
        if world.is_main:
            self.metrics = [MetricsLog(self.run.metrics_path)]
            if t.tensorboard:
                from nmt.tensorboard import TensorBoardLog

                self.metrics.append(TensorBoardLog(self.run.path))
        # Dev sources too long for the model were said once as the data was prepared, not at every validation.
        self.translator = Translator(
            self.model, self.data.src_tok, tok, self.device, self.precision, _told_already, self.choice.decoding()
        )
        rank_failures.agree(world, lambda: self._resume_and_record(resume))
        self.progress.world_size, self.progress.update_batches = world.world_size, t.accumulate * world.world_size
        self.ddp = None
        if world.enabled:  # after resume: DDP starts every rank from rank 0's weights
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=device_ids, **distributed.no_buffer_sync())
        replica = self.ddp if self.ddp is not None else self.model
        # Every batch has another shape (sentences x length): compile for symbolic shapes once.
        self.step_model = torch.compile(replica, dynamic=True) if t.compile else replica
        ranks = f" x {world.world_size} ranks ({distributed.backend_for(self.device)})" if world.enabled else ""
        self.log(
            f"model: {cfg.model.type}, {self.model.num_parameters() / 1e6:.2f}M parameters; device "
            f"{self.device}{ranks}, precision {self.precision.name}; {len(self.data.train)} training pairs"
        )

    def _ranks_here(self) -> int:
        """The training processes that share this process's memory: those on its machine on a CPU;
        on GPUs each rank has its own."""
        return self.world.local_world_size if self.world.enabled and self.device.type == "cpu" else 1

    def _take_run(self, config_file, overrides: list[str] | None, resume: bool) -> None:
        """Rank 0: the run's lock (refusing a config that cannot resume it, and, where ``resume``, a
        run that has trained but lost its training states), its log (with the messages said before
        it was open), and its data prepared (tokenizers, shards)."""
        self.cfg = self.run.open_for_training(self.cfg, config_file, self.log, overrides=overrides)
        if resume:
            self.run.check_not_starting_over()
        self.train_log.open()
        self.data = prepare(self.cfg, self.run, self.log)

    def _resume_and_record(self, resume: bool) -> None:
        if resume:
            self._resume()
        if self.world.is_main:  # the run's config.yaml changes only once the run has started with it
            self.run.write_config(self.cfg)

    def _size_kernel_cache(self) -> None:
        """oneDNN's kernel cache: room for every batch shape of an epoch where that is affordable
        (``nmt.device.onednn_cache_capacity``), unless ONEDNN_PRIMITIVE_CACHE_CAPACITY says otherwise.
        Counted without an epoch's plan: a resumed run's epoch is not known yet, and each plan made
        sorts every pair (``epoch_batch_shapes``)."""
        data = self.data.train
        shapes = epoch_batch_shapes(data.src_lens, data.trg_lens, self.cfg.train.max_tokens)
        chosen_by = "ONEDNN_PRIMITIVE_CACHE_CAPACITY; " if "ONEDNN_PRIMITIVE_CACHE_CAPACITY" in os.environ else ""
        capacity = size_onednn_cache(shapes, self.world.local_world_size)
        self.log(f"oneDNN kernel cache: {capacity} kernels ({chosen_by}batch shapes in an epoch: {shapes})")

    def _resume(self) -> None:
        found = self.checkpoints.load_latest_state(
            self.log, lambda info, state: resume_problem(info, state, self.optimizer)
        )
        if found is None:
            return
        path, state = found
        self.run.check_checkpoint(path, state, self.cfg, self.model)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        changed = apply_optimizer_settings(self.optimizer, self.cfg.train)
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress.from_dict(state["progress"])
        if self.world.is_main and (change := dev_set_change(self.progress, self._dev_digest())) is not None:
            raise NMTError(change)
        self._state_written_at = self.progress.update
        set_rng_state(state["rng"], self.device.type == "cuda")
        p = self.progress
        for line in resumed_lines(p, changed, self.world.world_size, self.cfg.train.accumulate):
            self.log(line)
        if (line := penalty_line(self.cfg, self._validation_penalty())) is not None:
            self.log(line)
        if self.world.is_main and self.run.config_path.exists():  # config.yaml is still the run's config until now
            change = horizon_change(self.run.config().train, self.cfg.train, p.update + 1, p.elapsed_seconds)
            if change is not None:
                self.log(change)
        self._continue_epoch()

    # -- the data of an epoch ---------------------------------------------------------------

    def epoch_plan(self) -> BatchPlan:
        """The batches of the current epoch, shuffled per (seed, epoch): the same on every rank and
        after every resume (``nmt.epoch_plan.EpochPlans.current``)."""
        return self._plans().current(self.progress, self._batching())

    def _plans(self) -> EpochPlans:
        if self._epochs is None:
            self._epochs = EpochPlans(self.data.train.src_lens, self.data.train.trg_lens)
        return self._epochs

    def _batching(self) -> list[int]:
        """The config's settings an epoch's plan is made with (``nmt.epoch_plan.BATCHING_KEYS``)."""
        return [self.cfg.train.max_tokens, self.cfg.seed]

    def _continue_epoch(self) -> None:
        """Where a resumed run goes on in its epoch (``nmt.epoch_plan.continue_epoch``)."""
        continue_epoch(self.progress, self._plans().data_digest(), self._batching(), self.epoch_plan, self.log)

    def write_metrics(self, record: dict) -> None:
        for sink in self.metrics:
            sink.write(record)

    def release_freed_memory(self) -> None:
        """On a CPU, the heap's free pages back to the system: the loop calls this every
        ``RELEASE_EVERY`` updates and after validation (``nmt.device.release_freed_memory``)."""
        if self.device.type == "cpu":
            release_freed_memory()

    # -- validation and checkpoints ---------------------------------------------------------

    def validate(self, check_signal: Callable[[], None] = lambda: None) -> dict | None:
        """Dev loss and BLEU, the best model kept, a training-state checkpoint (all on rank 0);
        every rank then shares the verdict (best score, patience). Returns rank 0's record.

        ``check_signal`` raises ``SignalPending`` where a signal has come. Rank 0 calls it as it
        starts, after each dev batch and once done, and every rank then raises what it raised: a
        validation given up so has written nothing (torchrun would kill the ranks before a long
        one ended); the caller saves the training state, and the resumed run validates again."""
        world = self.world
        record = rank_failures.agree(
            world, lambda: self._validate_here(check_signal) if world.is_main else None, solo_work=True
        )
        if world.enabled:
            keys = ("best_bleu", "best_loss", "best_update", "bad_validations", "last_validated")
            shared = distributed.broadcast({k: getattr(self.progress, k) for k in keys}, world)
            for key, value in shared.items():
                setattr(self.progress, key, value)
        return record

    def _validate_here(self, check_signal: Callable[[], None]) -> dict:
        cfg, p, data = self.cfg, self.progress, self.data
        start = time.perf_counter()

        def step() -> None:
            testhooks.validating()
            check_signal()

        step()
        penalty = self._validation_penalty()
        try:
            validating = validation_config(cfg, penalty)
            dev_loss, bleu, hyps = dev_scores(
                self.model, self.translator, validating, data, self.precision, self.device, step
            )
            self._write_dev_hyp(hyps)
        except Exception as e:  # the updates since the last checkpoint stay safe, whatever failed here
            drop_failed_work(e)
            self.save()
            self.log(f"validation at update {p.update} failed ({error_line(e)}); checkpoint written")
            raise
        p.dev_data, p.validate_length_penalty = self._dev_digest(), penalty
        is_best = judge(p, bleu, dev_loss)
        record = valid_record(p, dev_loss, bleu, time.perf_counter() - start)
        self.write_metrics(record)
        self.log(valid_line(p, record, is_best))
        # The states saved here hold the validation's time, as the loop's clock will once it returns:
        # a run resumed from them counts it in train.max_minutes, as the run left alone does.
        p.elapsed_seconds += time.perf_counter() - start
        # With keep_best N above 1 a validation that is no new best may still rank among the N best
        # (dev BLEU 15 after 10 and 20): save_best keeps it where it does, and drops the one it pushes out.
        if is_best or cfg.train.keep_best > 1:
            payload = {"model": self.model.state_dict(), "progress": asdict(p), **self._fingerprint()}
            self.checkpoints.save_best(payload, p.update, bleu, dev_loss)
        self.save()
        check_signal()  # one that came as the validation ended stops the run now, on every rank
        return record

    def _write_dev_hyp(self, hyps: list[str]) -> None:
        """dev.hyp, the validation's translations. A full disk stays the OSError the CLI words for it;
        any other refusal (a directory of that name, no permission) is one line naming the file."""
        path = self.run.dev_hyp_path
        try:
            atomic_write_bytes(path, ("\n".join(hyps) + "\n").encode("utf-8"))
        except OSError as e:
            if storage_error(e):
                raise
            raise NMTError(f"{path}: cannot write the validation's translations ({e.strerror or e})") from None

    def _validation_penalty(self) -> float:
        """The length penalty validation scores with (``validation_length_penalty``)."""
        return validation_length_penalty(self.progress, self.cfg, self.run.tune_decode_path)

    def _dev_digest(self) -> str:
        if self._dev_data is None:
            self._dev_data = dev_digest(self.data.dev_src, self.data.dev_trg)
        return self._dev_data

    def average(self) -> None:
        """``train.average_last``: the mean of the last N checkpoints, scored on dev and kept; it
        becomes the model translation uses where its dev BLEU beats the best single one (rank 0).
        A run that validated fewer than N times averages what it has (a warning), from 2 on."""
        if not self.world.is_main:
            return
        validating = validation_config(self.cfg, self._validation_penalty())  # ranked against validations
        score = dev_scorer(self.translator, validating, self.data.dev_src, self.data.dev_trg)
        last = self.cfg.train.average_last
        averaged = average_last(self.run, self.cfg, last, self.model, score, self.log, fewer_ok=True)
        if averaged is None:
            return
        record = {
            "type": "average",
            "update": self.progress.update,
            "dev_bleu": averaged.bleu,
            "best_bleu": averaged.best_bleu,
            "updates": averaged.updates,
        }
        # The index records the average before this line is written: a run killed between the two
        # finds the average made as it resumes, and writes the line it lacks.
        if averaged.made or not has_record(self.run.metrics_path, record):
            self.write_metrics(record)

    def save(self) -> None:
        """A checkpoint of the whole training state (rank 0; the others hold the same state)."""
        if not self.world.is_main:
            return
        on_cuda, fingerprint = self.device.type == "cuda", self.run.fingerprint(self.cfg)
        state = training_state(self.model, self.optimizer, self.scaler, self.progress, on_cuda, fingerprint)
        self.checkpoints.save_state(state, self.progress.update)
        self._state_written_at = self.progress.update

    def _saved(self) -> str:
        """Says that the checkpoint is written, and how to resume from it (``saved_line``)."""
        return saved_line(self.run.config_path, self.world, self.progress.update)

    def interrupted(self, signum: int) -> Interrupted:
        """What ends a run stopped by a signal once its checkpoint is written."""
        return Interrupted(f"{signal.Signals(signum).name} received: {self._saved()}", signum)

    def peer_lost(self, error: BaseException) -> rank_failures.PeerLost:
        """What ends rank 0 once it has saved the training state after ``error``, a collective that
        failed because another rank went away."""
        return rank_failures.PeerLost(f"{rank_failures.peer_lost_message(self.world, error)}; {self._saved()}")

    def _fingerprint(self) -> dict:
        return {"fingerprint": self.run.fingerprint(self.cfg)}

    def close(self) -> None:
        """Release the run's files (log, metrics, shards, lock); safe to call at any point."""
        for sink in self.metrics:
            sink.close()
        self.metrics = []
        self.train_log.close()
        data = getattr(self, "data", None)
        if data is not None:
            data.train.close()
        self.run.close()
