"""One update of a run (``Trainer.train_step``): teacher forcing with label-smoothed cross-entropy
over a group of batches, gradient clipping and one AdamW step at the scheduled learning rate. Under
torchrun the group is shared out among the ranks and gradients are averaged by
DistributedDataParallel. Where an update fails before its optimizer step, the training state of the
one before is written first (``Trainer.save_before_failed_update``).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from nmt import distributed, rank_failures, testhooks
from nmt.batching import derived_seed, make_batch
from nmt.errors import DamagedData, drop_failed_work, error_line
from nmt.loss import teacher_forced_loss
from nmt.optimization import clip_gradients, exact_gradient_norm, gradient_norm, skip_nonfinite, skip_overflow
from nmt.schedule import learning_rate
from nmt.training_state import rng_state, set_rng_state


def rank_seed(seed: int, rank: int, update: int) -> int:
    """The dropout seed of one rank's share of one update: independent of how the run was resumed."""
    return derived_seed(seed, rank * 7_919 + update)


class UpdateStep:
    """``nmt.trainer.Trainer``'s one update, apart from its setup, validation and checkpoints. It uses
    the parts ``Trainer.setup`` makes (the model, its compiled or DDP replica, the optimizer, the
    gradient scaler, the precision, the device, the data) and writes the training state with
    ``Trainer.save``."""

    def train_step(self, group: list) -> dict | None:
        """Forward/backward over ``group`` (the update's batches as corpus index arrays, shared out
        among the ranks) and one optimizer step; returns the update's statistics, or None when it
        was skipped (a non-finite loss or gradient norm; in fp16 an overflow, which lowers the loss scale).

        The loss is summed over tokens and divided by the update's target-token count, so an
        update with accumulation, or over several ranks, equals one large batch.
        """
        cfg, data, world = self.cfg.train, self.data.train, self.world
        p = self.progress
        testhooks.at_update(world.rank, p.update + 1, "start")
        mine, weight = distributed.share(group, world), 1.0
        if not mine:  # fewer batches than ranks at the end of an epoch: join in with a zero-weight batch
            mine, weight = group[:1], 0.0
        if world.enabled:  # dropout masks differ per rank, and do not depend on how the run was resumed
            torch.manual_seed(rank_seed(self.cfg.seed, world.rank, p.update))
        # Every rank knows every pair's length, so the update's token count needs no communication.
        n_tokens = sum(int(data.trg_lens[rows].sum(dtype=np.int64)) + len(rows) for rows in group)
        lr = learning_rate(p.update + 1, cfg, p.elapsed_seconds)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        # The random state the update starts from: dropout draws from it, and a state written for a
        # failed update must not count the draws of its batches that ran (the resumed run redoes them).
        rng = rng_state(self.device.type == "cuda") if self.save_before_failed_update else None
        try:
            batches, sums = self._gradients(mine, weight, n_tokens)
        except Exception as e:  # nothing of this update is in the weights, the optimizer or the position yet
            drop_failed_work(e)
            self._save_before_failed_update(e, rng)
            raise
        self.scaler.unscale_(self.optimizer)
        grads = [param.grad for param in self.model.parameters() if param.grad is not None]
        # One device-to-host copy per update: a GPU otherwise waits for the host after every batch.
        loss_sum, nll_sum, grad_norm = torch.cat([sums, gradient_norm(grads).float().reshape(1)]).tolist()
        if not math.isfinite(grad_norm):  # an overflow of the sum, or of a gradient: fp64 tells which
            grad_norm = exact_gradient_norm(grads)
        src_tokens = sum(b.n_src_tokens for b in batches) * weight
        loss_sum, nll_sum, src_tokens = distributed.all_reduce([loss_sum, nll_sum, src_tokens], world, self.device)
        if self.scaler.is_enabled() and not math.isfinite(grad_norm):
            skip_overflow(self.optimizer, self.scaler, p, self.log)
            return None
        if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
            skip_nonfinite(self.optimizer, self.scaler, p, cfg.max_nonfinite, self.log)
            return None
        clip_gradients(grads, cfg.clip_norm, grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        p.nonfinite_in_row = 0
        p.update += 1
        p.trg_tokens += n_tokens
        testhooks.trace_parameters(self.model, world.rank, p.update)
        testhooks.at_update(world.rank, p.update, "end")
        return {
            "loss": loss_sum / n_tokens,
            "nll": nll_sum / n_tokens,
            "lr": lr,
            "grad_norm": grad_norm,
            "trg_tokens": n_tokens,
            "src_tokens": int(src_tokens),
        }

    def _gradients(self, mine: list, weight: float, n_tokens: int) -> tuple[list, torch.Tensor]:
        """Forward and backward over this rank's batches ``mine`` of an update of ``n_tokens`` target
        tokens: gradients summed into ``.grad``; returns the batches and the loss and nll summed on the device."""
        cfg, data, tok, world = self.cfg.train, self.data.train, self.data.trg_tok, self.world
        batches = [make_batch(*data.pairs(rows), rows, tok.pad_id, tok.bos_id, tok.eos_id) for rows in mine]
        for batch in batches:
            self._check_ids(batch)
        # DDP averages gradients over ranks; scaling by the world size turns that into the update's sum.
        loss_scale = world.world_size * weight
        sums = torch.zeros(2, device=self.device)  # loss and nll summed over the update, on the device
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            last = i == len(batches) - 1
            # Gradients are all-reduced once per update, in the last backward pass.
            with contextlib.nullcontext() if self.ddp is None or last else self.ddp.no_sync():
                loss, nll = teacher_forced_loss(
                    self.model, self.step_model, batch, cfg.label_smoothing, tok.pad_id, self.precision
                )
                self.scaler.scale(loss * loss_scale / n_tokens).backward()
            sums += torch.stack([loss.detach(), nll]) * weight
        return batches, sums

    def _save_before_failed_update(self, error: Exception, rng: dict | None) -> None:
        """Rank 0 writes the training state where an update failed before its optimizer step (out of
        memory with a batch, a damaged shard): that state is the last update's, whole, and without it
        every update since the last validation was lost. Not where another rank went away
        (``saved_if_a_peer_is_lost`` writes it then), nor at an update whose state is written already."""
        p = self.progress
        if not self.save_before_failed_update or rank_failures.peer_lost(error) or p.update == self._state_written_at:
            return
        self.optimizer.zero_grad(set_to_none=True)  # the failed update's gradients: memory the write may need
        if rng is not None:  # as the update found it: the process ends with the error
            set_rng_state(rng, self.device.type == "cuda")
        try:
            self.save()
        # A full disk, or no memory for the write either (torch.save then ends in a RuntimeError of its
        # own): the update's own error stays the one reported, with its advice.
        except Exception as e:
            self.log_end(f"update {p.update + 1} failed ({error_line(error)}); its state not written: {e}")
            return
        self.log(f"update {p.update + 1} failed ({error_line(error)}); {self._saved()}")

    def _check_ids(self, batch) -> None:
        """Token ids outside the vocabularies mean a damaged shard (one of the right size; a short one
        is found when the shards are opened): a one-line error instead of an IndexError deep in the
        embedding. Cheap: two maxima over a batch of ids, on the host."""
        for ids, vocab in ((batch.src, self.data.src_tok.vocab_size), (batch.trg_out, self.data.trg_tok.vocab_size)):
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= vocab:
                raise DamagedData(
                    f"{self.run.train_data_dir}: a training shard holds token id {low if low < 0 else high}, outside "
                    f"the vocabulary of {vocab}: the shard is damaged; delete that directory and train again to "
                    "encode the data anew"
                )
