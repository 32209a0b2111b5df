"""The plan of an epoch's batches across resumes: the settings and data it is made with, the plan
made again from that record, and where a resumed run goes on in it. The record itself is kept in
``Progress`` (``plan_epoch``, ``plan_data``, ``plan_batchings``); the plan is ``nmt.batching``'s."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from nmt.batching import BatchPlan, rebatched_rest, token_batches
from nmt.training_state import Progress

BATCHING_KEYS = ("train.max_tokens", "seed")  # what an epoch's plan is made with, besides the data


def batching_changes(before: list[int], now: list[int]) -> str:
    """'train.max_tokens 512 -> 1024; seed 1 -> 7' for the batching settings (BATCHING_KEYS) that differ."""
    return "; ".join(f"{key} {a} -> {b}" for key, a, b in zip(BATCHING_KEYS, before, now) if a != b)


def resumed_position(epoch: int, done: int, saved_batches: int, batches: int) -> tuple[int, int]:
    """(epoch, batch) to resume at when ``done`` of the epoch's ``saved_batches`` were consumed and
    its plan now has ``batches``: the same place when the plan is unchanged, else the same fraction
    of the epoch (the next epoch once that is all of it). ``saved_batches`` 0 means unknown."""
    if saved_batches in (0, batches) and done < batches:
        return epoch, done
    at = round(done * batches / saved_batches) if saved_batches else batches
    return (epoch + 1, 0) if at >= batches else (epoch, at)


def lengths_digest(src_lens: np.ndarray, trg_lens: np.ndarray) -> str:
    """SHA-256 of the training pairs' lengths: the same digest, the same plans for the same settings."""
    digest = hashlib.sha256()
    for lengths in (src_lens, trg_lens):
        digest.update(f"{lengths.dtype.str}:{lengths.size};".encode())
        digest.update(memoryview(np.ascontiguousarray(lengths)).cast("B"))
    return digest.hexdigest()


def made_plan(src_lens: np.ndarray, trg_lens: np.ndarray, epoch: int, batchings: list) -> BatchPlan:
    """The plan of ``epoch`` made again from its record ``batchings`` (``Progress.plan_batchings``):
    batched whole with the first settings, the rest batched again at each change."""
    [_, max_tokens, seed], *changes = batchings
    plan = token_batches(src_lens, trg_lens, max_tokens, seed, epoch)
    for done, max_tokens, seed in changes:
        plan = rebatched_rest(plan, done, src_lens, trg_lens, max_tokens, seed, epoch)
    return plan


class EpochPlans:
    """The current epoch's plan of a run's training pairs, made again only where the epoch or its
    record in ``Progress`` changed, and the pairs' ``lengths_digest``, computed once."""

    def __init__(self, src_lens: np.ndarray, trg_lens: np.ndarray):
        self.src_lens, self.trg_lens = src_lens, trg_lens
        self._plan: tuple[tuple, BatchPlan] | None = None  # (what it was made with, the plan)
        self._lengths_digest: str | None = None

    def current(self, p: Progress, batching: list[int]) -> BatchPlan:
        """The batches of epoch ``p.epoch``, shuffled per (seed, epoch). A new epoch is batched whole
        with ``batching`` (the config's BATCHING_KEYS values); one a resume changed them in keeps the
        batches it trained on and batches the rest again (``Progress.plan_batchings``)."""
        if p.plan_epoch != p.epoch or p.plan_data != self.data_digest():
            p.plan_epoch, p.plan_data = p.epoch, self.data_digest()
            p.plan_batchings = [[0, *batching]]
        made_with = (p.epoch, tuple(tuple(b) for b in p.plan_batchings))
        if self._plan is None or self._plan[0] != made_with:
            self._plan = (made_with, made_plan(self.src_lens, self.trg_lens, p.epoch, p.plan_batchings))
        return self._plan[1]

    def data_digest(self) -> str:
        """``lengths_digest`` of the training pairs, computed once."""
        if self._lengths_digest is None:
            self._lengths_digest = lengths_digest(self.src_lens, self.trg_lens)
        return self._lengths_digest


def training_data_change(p: Progress, data_digest: str) -> str | None:
    """The warning a run resumed at ``p`` logs where its training pairs now have another
    ``lengths_digest`` (``data_digest``) than those its epoch plan was made from: other sentences in
    data.train, or other pairs kept by data.max_len / max_len_ratio. The epoch is then batched from
    the new data, not as the interrupted run would have gone on. Not refused: a corpus cleaned or
    grown mid-run is the user's to train on, and the dev set, by which the run's scores rank, is
    checked on its own. The lengths are all a plan depends on, and are read from the shards anyway:
    no corpus is hashed for this. A state of an earlier version (no digest) takes any data."""
    if not p.plan_data or p.plan_data == data_digest:
        return None
    said = (
        f"warning: the training data changed since the training state of update {p.update} was written "
        "(other pairs, or pairs of other lengths: data.train's text, or data.max_len / max_len_ratio)"
    )
    if p.batch_in_epoch == 0:
        return f"{said}: the run trains on the new data from epoch {p.epoch}, which starts now"
    return (
        f"{said}: the rest of epoch {p.epoch} is batched from the new data, not the batches the interrupted "
        "run would have trained on, so in this epoch some pairs may be trained on twice and others not at all"
    )


def continue_epoch(
    p: Progress,
    data_digest: str,
    batching: list[int],
    epoch_plan: Callable[[], BatchPlan],
    log: Callable[[str], None],
) -> None:
    """Where a resumed run goes on in its epoch. With the same training data, at the same batch:
    where train.max_tokens or the seed changed, the pairs of the epoch not yet trained on are
    batched again under the new values, so that each is trained on once in the epoch, as in
    every other. With other training data (pairs of other lengths) the old plan cannot be made
    again: the run goes on at the same fraction of the new data's epoch.

    ``data_digest`` and ``batching`` are what the run has now (``lengths_digest``, BATCHING_KEYS'
    values); ``epoch_plan`` is the current epoch's plan as ``p`` records it (``Trainer.epoch_plan``)."""
    change = training_data_change(p, data_digest)
    if change is not None:
        log(change)
    same_data = p.plan_data == data_digest and bool(p.plan_batchings)
    changes = batching_changes(p.plan_batchings[-1][1:], batching) if p.plan_batchings else ""
    if same_data and p.plan_epoch == p.epoch:
        if changes:
            p.plan_batchings.append([p.batch_in_epoch, *batching])
            plan = epoch_plan()
            left = plan.bounds[p.batch_in_epoch :]
            pairs = int((left[:, 1] - left[:, 0]).sum())
            log(
                f"resuming with {changes}: the {pairs} pairs of epoch {p.epoch} not yet trained on are batched "
                f"again with the new values ({len(left)} batches left of {len(plan)}); the epochs after it are "
                "batched whole with them"
            )
        return
    if same_data and p.batch_in_epoch == 0:
        if changes:
            log(f"resuming with {changes}: from epoch {p.epoch}, which starts now")
        return
    batches = len(epoch_plan())
    moved = resumed_position(p.epoch, p.batch_in_epoch, p.epoch_batches, batches)
    if moved != (p.epoch, p.batch_in_epoch):
        log(
            f"the epoch now has {batches} batches, not {p.epoch_batches or 'as many as'} (the training data "
            f"or, in a checkpoint of an earlier version, train.max_tokens changed): continuing at epoch "
            f"{moved[0]}, batch {moved[1]}"
        )
        p.epoch, p.batch_in_epoch = moved
