"""The training loop: teacher forcing, label smoothing, warmup/decay, clipping, validation,
checkpoints, and exact resume from the run directory."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from nmt import autotune, checkpoint, distributed
from nmt.batching import make_batch, padding_fraction, token_batches
from nmt.config import Config, config_to_dict, load_config, save_config
from nmt.device import Precision, adamw, bf16_available, check_precision, prepare_cpu_process, select_device
from nmt.errors import NMTError
from nmt.loss import label_smoothed_nll
from nmt.models import build_model
from nmt.prepare import EncodedCorpus, Prepared, prepare
from nmt.schedule import learning_rate
from nmt.scoring import bleu_only
from nmt.translate import Translator

# Sections whose change makes a checkpoint unusable; everything else may change on resume.
_FROZEN_SECTIONS = ("model", "tokenizer")
_FROZEN_DATA_KEYS = ("src_lang", "trg_lang")


class Interrupted(NMTError):
    """Training stopped by a signal after writing a checkpoint."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Progress:
    """Everything about where training stands, saved in every checkpoint."""

    update: int = 0
    epoch: int = 1
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    best_bleu: float = -1.0
    best_update: int = 0
    bad_validations: int = 0  # validations since the last new best (early stopping)
    nonfinite_in_row: int = 0
    skipped_updates: int = 0
    elapsed_seconds: float = 0.0  # wall time of training and validation over all sessions of the run
    trg_tokens: int = 0
    last_validated: int = -1

    @classmethod
    def from_dict(cls, d: dict) -> Progress:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def check_resumable(old: Config, new: Config) -> None:
    """Refuse a config whose model or vocabulary differs from the checkpoint's."""
    a, b = config_to_dict(old), config_to_dict(new)
    diffs = []
    for section in _FROZEN_SECTIONS:
        for key, value in a[section].items():
            if b[section].get(key) != value:
                diffs.append(f"{section}.{key}: {value!r} -> {b[section].get(key)!r}")
    for key in _FROZEN_DATA_KEYS:
        if a["data"][key] != b["data"][key]:
            diffs.append(f"data.{key}: {a['data'][key]!r} -> {b['data'][key]!r}")
    if diffs:
        raise NMTError(
            "cannot resume: the config changed what the checkpoint was trained with ("
            + "; ".join(diffs)
            + "); use a new run_dir"
        )


def open_run_dir(cfg: Config, run_dir: Path) -> None:
    """Create (or reopen) a run directory and record the config, refusing one that cannot resume it."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NMTError(f"{run_dir}: cannot create run directory ({e.strerror})") from None
    if not os.access(run_dir, os.W_OK):
        raise NMTError(f"{run_dir}: run directory is not writable")
    saved = run_dir / "config.yaml"
    if saved.exists():
        check_resumable(load_config(saved), cfg)
    save_config(cfg, saved)


class _SignalGuard:
    """First SIGINT/SIGTERM: finish the step, checkpoint, exit. A second SIGINT: exit at once
    (safe, because every checkpoint write is atomic)."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame):
        if self.received is not None and signum == signal.SIGINT:
            os._exit(130)
        self.received = signum

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)


class MetricsLog:
    """One JSON object per line; flushed so a killed run keeps what it logged."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def evaluate_loss(model, corpus: EncodedCorpus, tok, max_tokens: int, precision, device, smoothing: float) -> float:
    """Mean per-token NLL (no smoothing) of the teacher-forced model on a corpus."""
    was_training = model.training
    model.eval()
    nll_total, tokens = 0.0, 0
    with torch.inference_mode(), precision.autocast():
        for rows in token_batches(corpus.src_lens, corpus.trg_lens, max_tokens, None, 0):
            batch = make_batch(*corpus.pairs(rows), rows, tok.pad_id, tok.bos_id, tok.eos_id).to(device)
            logits = model(batch.src, batch.src_mask, batch.trg_in)
            _, nll = label_smoothed_nll(logits, batch.trg_out, smoothing, tok.pad_id)
            nll_total += nll.item()
            tokens += batch.n_trg_tokens
    model.train(was_training)
    return nll_total / max(tokens, 1)


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, log: Callable[[str], None]):
        self.cfg = cfg
        self.run_dir = run_dir
        self._print = log
        self._log_file = None
        self.progress = Progress()
        self.world = distributed.world_from_environment()

    def log(self, message: str) -> None:
        """To the console and to ``train.log`` in the run directory (rank 0 only)."""
        if not self.world.is_main:
            return
        self._print(message)
        if self._log_file is not None:
            self._log_file.write(time.strftime("%Y-%m-%d %H:%M:%S ") + message + "\n")
            self._log_file.flush()

    # -- set-up -------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg, run_dir, world = self.cfg, self.run_dir, self.world
        self.device = select_device(cfg.train.device, fallback_to_cpu=cfg.train.cpu_fallback)
        check_precision(cfg.train.precision, self.device.type, bf16_available(self.device))  # before any work
        if self.device.type == "cpu":
            prepare_cpu_process()
        if world.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", world.local_rank)
            torch.cuda.set_device(self.device)
        distributed.init(world, self.device)
        if world.is_main:
            open_run_dir(cfg, run_dir)
            self._log_file = open(run_dir / "train.log", "a", encoding="utf-8")
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        # Rank 0 prepares (tokenizers, shards); the others then find it done and only open it.
        if world.is_main:
            self.data: Prepared = prepare(cfg, run_dir, self.log)
        distributed.barrier(world)
        if not world.is_main:
            self.data = prepare(cfg, run_dir, self.log)
        tok = self.data.trg_tok
        self.choice = self._choose_kernels(tok.vocab_size)
        self.precision = Precision(self.device.type, self.choice.precision)
        torch.manual_seed(cfg.seed)  # the same initial weights however long the measurement ran
        self.model = build_model(cfg.model, self.data.src_tok.vocab_size, tok.vocab_size, tok.pad_id).to(self.device)
        self.model.set_attention_kernel(self.choice.attention)
        t = cfg.train
        self.optimizer = adamw(
            self.model.parameters(), lr=t.lr_peak, betas=t.betas, eps=t.adam_eps, weight_decay=t.weight_decay
        )
        self.scaler = self.precision.grad_scaler()
        self.checkpoints = checkpoint.CheckpointManager(
            run_dir / "checkpoints", t.keep_last, t.keep_best, clean=world.is_main
        )
        self.metrics = MetricsLog(run_dir / "metrics.jsonl") if world.is_main else None
        self.translator = Translator(self.model, self.data.src_tok, tok, self.device, self.precision)
        self._resume()
        self.ddp = None
        if world.enabled:  # after resume: DDP starts every rank from rank 0's weights
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=device_ids, **distributed.no_buffer_sync())
        replica = self.ddp if self.ddp is not None else self.model
        # Every batch has another shape (sentences x length): compile for symbolic shapes once.
        self.step_model = torch.compile(replica, dynamic=True) if t.compile else replica
        n_params = sum(p.numel() for p in self.model.parameters())
        ranks = f" x {world.world_size} ranks ({distributed.backend_for(self.device)})" if world.enabled else ""
        self.log(
            f"model: {cfg.model.type}, {n_params / 1e6:.2f}M parameters; device {self.device}{ranks}, "
            f"precision {self.precision.name}; {len(self.data.train)} training pairs"
        )

    def _choose_kernels(self, vocab_size: int) -> autotune.Choice:
        """Precision, attention kernel and threads: the config's, or measured where it says auto.
        Rank 0 measures alone and every rank takes its choice; ranks on one machine share its cores."""
        cfg, world = self.cfg, self.world
        world_threads = None
        if world.enabled and self.device.type == "cpu" and cfg.train.threads in ("auto", None):
            world_threads = max(1, autotune.usable_cpus() // world.local_world_size)
        choice = None
        if world.is_main:
            request = autotune.Request.from_train(cfg.train)
            choice = autotune.choose(
                request,
                cfg.model,
                vocab_size,
                cfg.train.max_tokens,
                cfg.data.max_len,
                self.device,
                self.log,
                world_threads,
            )
        choice = distributed.broadcast(choice, world)
        autotune.apply_threads(choice)
        self.log(("auto: " if choice.timings else "kernels: ") + choice.describe())
        return choice

    def _resume(self) -> None:
        state = self.checkpoints.load_latest_state(self.log)
        if state is None:
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress.from_dict(state["progress"])
        checkpoint.set_rng_state(state["rng"])
        p = self.progress
        self.log(
            f"resuming at update {p.update} (epoch {p.epoch}, batch {p.batch_in_epoch}), best BLEU {p.best_bleu:.2f}"
        )

    def _state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
            "progress": asdict(self.progress),
            "rng": checkpoint.rng_state(),
        }

    # -- one update ------------------------------------------------------------------------
    def _update(self, group: list) -> dict | None:
        """Forward/backward over ``group`` (accumulated batches, shared out among the ranks) and one
        optimizer step.

        The loss is summed over tokens and divided by the update's target-token count, so an
        update with accumulation, or over several ranks, equals one large batch. Returns None
        when skipped as non-finite.
        """
        cfg, data, tok, world = self.cfg.train, self.data.train, self.data.trg_tok, self.world
        p = self.progress
        mine, weight = distributed.share(group, world), 1.0
        if not mine:  # fewer batches than ranks at the end of an epoch: join in with a zero-weight batch
            mine, weight = group[:1], 0.0
        if world.enabled:  # dropout masks differ per rank, and do not depend on how the run was resumed
            torch.manual_seed(_rank_seed(self.cfg.seed, world.rank, p.update))
        batches = [make_batch(*data.pairs(rows), rows, tok.pad_id, tok.bos_id, tok.eos_id) for rows in mine]
        # Every rank knows every pair's length, so the update's token count needs no communication.
        n_tokens = sum(int(data.trg_lens[rows].sum(dtype=np.int64)) + len(rows) for rows in group)
        # DDP averages gradients over ranks; scaling by the world size turns that into the update's sum.
        loss_scale = world.world_size * weight
        lr = learning_rate(p.update + 1, cfg)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(2, device=self.device)  # loss and nll summed over the update, on the device
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            last = i == len(batches) - 1
            # Gradients are all-reduced once per update, in the last backward pass.
            with contextlib.nullcontext() if self.ddp is None or last else self.ddp.no_sync():
                with self.precision.autocast():
                    logits = self.step_model(batch.src, batch.src_mask, batch.trg_in)
                loss, nll = label_smoothed_nll(logits, batch.trg_out, cfg.label_smoothing, tok.pad_id)
                self.scaler.scale(loss * loss_scale / n_tokens).backward()
            sums += torch.stack([loss.detach(), nll]) * weight
        self.scaler.unscale_(self.optimizer)
        max_norm = cfg.clip_norm if cfg.clip_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        # One device-to-host copy per update: a GPU otherwise waits for the host after every batch.
        loss_sum, nll_sum, grad_norm = torch.cat([sums, norm.float().reshape(1)]).tolist()
        src_tokens = sum(b.n_src_tokens for b in batches) * weight
        loss_sum, nll_sum, src_tokens = distributed.all_reduce([loss_sum, nll_sum, src_tokens], world, self.device)
        finite = math.isfinite(loss_sum) and (math.isfinite(grad_norm) or self.scaler.is_enabled())
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            p.nonfinite_in_row += 1
            p.skipped_updates += 1
            self.log(
                f"update {p.update + 1}: non-finite loss or gradient norm, skipped ({p.nonfinite_in_row} in a row)"
            )
            if p.nonfinite_in_row >= cfg.max_nonfinite:
                raise NMTError(
                    f"training diverged: {p.nonfinite_in_row} non-finite updates in a row "
                    "(lower train.lr_peak or raise train.warmup_updates; config key 'train.max_nonfinite')"
                )
            return None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        p.nonfinite_in_row = 0
        p.update += 1
        p.trg_tokens += n_tokens
        _trace_parameters(self.model, world.rank, p.update)
        return {
            "loss": loss_sum / n_tokens,
            "nll": nll_sum / n_tokens,
            "lr": lr,
            "grad_norm": grad_norm,
            "trg_tokens": n_tokens,
            "src_tokens": int(src_tokens),
        }

    # -- validation ------------------------------------------------------------------------
    def validate(self) -> dict | None:
        """Rank 0 validates and checkpoints; every rank then shares its verdict (best score, patience)."""
        record = self._validate_here() if self.world.is_main else None
        if self.world.enabled:
            keys = ("best_bleu", "best_update", "bad_validations", "last_validated")
            shared = distributed.broadcast({k: getattr(self.progress, k) for k in keys}, self.world)
            for key, value in shared.items():
                setattr(self.progress, key, value)
        return record

    def _validate_here(self) -> dict:
        cfg, p, data = self.cfg, self.progress, self.data
        start = time.perf_counter()
        dev_loss = evaluate_loss(
            self.model, data.dev, data.trg_tok, cfg.train.max_tokens, self.precision, self.device, 0.0
        )
        n = cfg.train.validate_max_sentences or len(data.dev)
        decode = cfg.decode.__class__(**{**asdict(cfg.decode), "beam_size": cfg.train.validate_beam_size, "nbest": 1})
        hyps = [h[0] for h in self.translator.translate(data.dev_src[:n], decode)]
        bleu = bleu_only(hyps, data.dev_trg[:n])
        (self.run_dir / "dev.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        is_best = bleu > p.best_bleu
        if is_best:
            p.best_bleu, p.best_update, p.bad_validations = bleu, p.update, 0
        else:
            p.bad_validations += 1
        p.last_validated = p.update
        record = {
            "type": "valid",
            "update": p.update,
            "epoch": p.epoch,
            "dev_loss": dev_loss,
            "dev_ppl": math.exp(min(dev_loss, 50)),
            "dev_bleu": bleu,
            "best_bleu": p.best_bleu,
            "elapsed": p.elapsed_seconds,
            "seconds": time.perf_counter() - start,
        }
        self.metrics.write(record)
        self.log(
            f"validation at update {p.update}: dev loss {dev_loss:.3f}, ppl {record['dev_ppl']:.2f}, "
            f"BLEU {bleu:.2f} (best {p.best_bleu:.2f} at update {p.best_update}){' *' if is_best else ''}"
        )
        if is_best:
            self.checkpoints.save_best({"model": self.model.state_dict(), "progress": asdict(p)}, p.update, bleu)
        self.checkpoints.save_state(self._state(), p.update)
        return record

    # -- the loop --------------------------------------------------------------------------
    def _should_stop(self) -> str | None:
        t, p = self.cfg.train, self.progress
        if t.max_updates is not None and p.update >= t.max_updates:
            return f"reached train.max_updates {t.max_updates}"
        if t.max_minutes is not None and p.elapsed_seconds >= t.max_minutes * 60:
            return f"reached train.max_minutes {t.max_minutes}"
        if t.patience is not None and p.bad_validations >= t.patience:
            return f"no improvement in {t.patience} validations (train.patience)"
        return None

    def run(self) -> Progress:
        self._setup()
        t, p = self.cfg.train, self.progress
        src_lens, trg_lens = self.data.train.src_lens, self.data.train.trg_lens
        interactive = sys.stderr.isatty()
        bar = None
        if interactive:
            from tqdm import tqdm

            bar = tqdm(total=t.max_updates, initial=p.update, unit="upd", dynamic_ncols=True, file=sys.stderr)
        window_tokens, window_start = 0, time.perf_counter()
        # Wall time, validation included, accumulated over every session of the run.
        clock_base, clock_start = p.elapsed_seconds, time.perf_counter()
        reason = self._should_stop()
        with _SignalGuard() as guard:
            while reason is None:
                if t.max_epochs is not None and p.epoch > t.max_epochs:
                    reason = f"reached train.max_epochs {t.max_epochs}"
                    break
                batches = token_batches(src_lens, trg_lens, t.max_tokens, self.cfg.seed, p.epoch)
                per_update = t.accumulate * self.world.world_size
                if p.batch_in_epoch == 0 and (p.epoch == 1 or len(batches) >= t.log_every):
                    self.log(
                        f"epoch {p.epoch}: {len(batches)} batches, padding "
                        f"{100 * padding_fraction(batches, src_lens, trg_lens):.1f}% of target slots"
                    )
                while p.batch_in_epoch < len(batches) and reason is None:
                    group = batches[p.batch_in_epoch : p.batch_in_epoch + per_update]
                    stats = self._update(group)
                    p.batch_in_epoch += len(group)
                    p.elapsed_seconds = clock_base + time.perf_counter() - clock_start
                    if self.world.enabled:  # one clock and one signal for all ranks, so they stop together
                        p.elapsed_seconds, signum = distributed.all_reduce(
                            [p.elapsed_seconds, float(guard.received or 0)], self.world, self.device, op="max"
                        )
                        guard.received = int(signum) or None
                    if stats is not None:
                        window_tokens += stats["trg_tokens"]
                        self._write_metrics(
                            {
                                "type": "train",
                                "update": p.update,
                                "epoch": p.epoch,
                                **stats,
                                "elapsed": round(p.elapsed_seconds, 3),
                            }
                        )
                        if p.update % t.log_every == 0:
                            rate = window_tokens / max(time.perf_counter() - window_start, 1e-9)
                            window_tokens, window_start = 0, time.perf_counter()
                            line = (
                                f"update {p.update} epoch {p.epoch} loss {stats['loss']:.3f} lr {stats['lr']:.2e} "
                                f"|g| {stats['grad_norm']:.2f} {rate:.0f} tgt tok/s"
                            )
                            if bar is None:
                                self.log(line)
                            else:
                                bar.set_postfix_str(f"loss {stats['loss']:.3f} lr {stats['lr']:.1e} {rate:.0f} tok/s")
                        if bar is not None:
                            bar.update(1)
                        if p.update % t.validate_every == 0:
                            self.validate()
                            p.elapsed_seconds = clock_base + time.perf_counter() - clock_start
                            window_tokens, window_start = 0, time.perf_counter()
                    if guard.received is not None:
                        self._stop_on_signal(guard.received)
                    reason = self._should_stop()
                if p.batch_in_epoch >= len(batches):
                    p.epoch += 1
                    p.batch_in_epoch = 0
        if bar is not None:
            bar.close()
        self.log(f"stopping: {reason}")
        if p.last_validated != p.update:
            self.validate()
        self._close_metrics()
        self.log(f"best dev BLEU {p.best_bleu:.2f} at update {p.best_update}; run directory {self.run_dir}")
        return p

    def close(self) -> None:
        """Release the run's files (log, metrics, shards); safe to call at any point."""
        self._close_metrics()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        data = getattr(self, "data", None)
        if data is not None:
            data.train.close()

    def _write_metrics(self, record: dict) -> None:
        if self.metrics is not None:
            self.metrics.write(record)

    def _close_metrics(self) -> None:
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()

    def _stop_on_signal(self, signum: int) -> None:
        if self.world.is_main:
            self.checkpoints.save_state(self._state(), self.progress.update)
        self._close_metrics()
        name = signal.Signals(signum).name
        raise Interrupted(
            f"{name} received: checkpoint written at update {self.progress.update}; "
            f"resume with: nmt train --config {self.run_dir / 'config.yaml'}",
            128 + signum,
        )


def _rank_seed(seed: int, rank: int, update: int) -> int:
    return (seed * 1_000_003 + rank * 7_919 + update) % (2**63)


def _trace_parameters(model: torch.nn.Module, rank: int, update: int) -> None:
    """Test hook: NMT_TEST_PARAM_DIGESTS=DIR makes each rank append a digest of its weights after every update."""
    directory = os.environ.get("NMT_TEST_PARAM_DIGESTS")
    if not directory:
        return
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    with open(Path(directory) / f"rank{rank}.txt", "a", encoding="utf-8") as f:
        f.write(f"{update} {digest.hexdigest()}\n")


def train(cfg: Config, log: Callable[[str], None]) -> Progress:
    trainer = Trainer(cfg, Path(cfg.run_dir), log)
    try:
        progress = trainer.run()
        # Every rank reaches the end before any tears down: gloo aborted now and then when one
        # rank destroyed its group while another was still in its last collective.
        distributed.barrier(trainer.world)
        return progress
    finally:
        trainer.close()
        distributed.shutdown()
