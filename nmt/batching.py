"""Token-budget batches of similar-length sentences, and the padded tensors built from them.

Budget (as in fairseq): a batch of n sentences costs ``n * max(longest src, longest trg)``
padded slots, counting the EOS on the source and the BOS/EOS on the target, and must stay
within ``max_tokens``. Lengths passed in here are plain subword counts; the +1 for the
special token is added here, once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_SPECIALS_PER_SIDE = 1  # source: x1..xn </s>; target: <s> y1..ym  /  y1..ym </s>


@dataclass
class Batch:
    src: torch.Tensor  # [B, S] long, padded with pad_id; each row ends with EOS
    src_mask: torch.Tensor  # [B, S] bool, True at real tokens (EOS included)
    trg_in: torch.Tensor | None  # [B, T] long: BOS y1..ym, None when translating
    trg_out: torch.Tensor | None  # [B, T] long: y1..ym EOS, None when translating
    n_trg_tokens: int  # real tokens in trg_out (loss normalizer)
    n_src_tokens: int  # real tokens in src, EOS included
    indices: list[int]  # corpus index of each row

    def to(self, device: torch.device | str) -> Batch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return Batch(
            src=move(self.src),
            src_mask=move(self.src_mask),
            trg_in=move(self.trg_in),
            trg_out=move(self.trg_out),
            n_trg_tokens=self.n_trg_tokens,
            n_src_tokens=self.n_src_tokens,
            indices=self.indices,
        )


def _length_mask(lengths: np.ndarray) -> torch.Tensor:
    """[B, max(lengths)] bool, True in the first ``lengths[b]`` slots of row b."""
    lens = torch.from_numpy(lengths)
    return torch.arange(int(lens.max())).unsqueeze(0) < lens.unsqueeze(1)


def _padded(
    seqs: Sequence[Sequence[int]], lengths: np.ndarray, mask: torch.Tensor, pad_id: int, *, first: bool, special: int
) -> torch.Tensor:
    """Rows of ``seqs`` with ``special`` added first (BOS) or last (EOS), padded to ``mask``'s shape."""
    flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs] + [np.zeros(0, dtype=np.int64)])
    starts = np.cumsum(lengths) - lengths  # where each sentence starts in ``flat``
    flat = np.insert(flat, starts if first else starts + lengths, special)
    out = torch.full(mask.shape, pad_id, dtype=torch.long)
    out[mask] = torch.from_numpy(flat)  # boolean-mask assignment fills row-major: the concatenation order
    return out


def make_batch(
    src_ids: Sequence[Sequence[int]],
    trg_ids: Sequence[Sequence[int]] | None,
    indices: Sequence[int],
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Batch:
    """Pad one batch of id lists or arrays; ``trg_ids`` None builds a source-only batch for translation."""
    if len(src_ids) == 0:
        raise ValueError("make_batch needs at least one sentence")
    src_lens = np.fromiter((len(s) for s in src_ids), dtype=np.int64, count=len(src_ids))
    src_mask = _length_mask(src_lens + 1)
    src = _padded(src_ids, src_lens, src_mask, pad_id, first=False, special=eos_id)
    n_src_tokens = int(src_lens.sum()) + len(src_ids)
    rows = np.asarray(indices, dtype=np.int64).tolist()
    if trg_ids is None:
        return Batch(src, src_mask, None, None, 0, n_src_tokens, rows)
    if len(trg_ids) != len(src_ids):
        raise ValueError(f"make_batch: {len(src_ids)} source but {len(trg_ids)} target sentences")
    trg_lens = np.fromiter((len(t) for t in trg_ids), dtype=np.int64, count=len(trg_ids))
    trg_mask = _length_mask(trg_lens + 1)
    trg_in = _padded(trg_ids, trg_lens, trg_mask, pad_id, first=True, special=bos_id)
    trg_out = _padded(trg_ids, trg_lens, trg_mask, pad_id, first=False, special=eos_id)
    return Batch(src, src_mask, trg_in, trg_out, int(trg_lens.sum()) + len(trg_ids), n_src_tokens, rows)


# --------------------------------------------------------------------------- batch plans


def _greedy_cuts(sizes_sorted: np.ndarray, max_tokens: int) -> list[int]:
    """Batch sizes (row counts) cutting ``sizes_sorted`` greedily under ``n * max(size) <= max_tokens``.

    A batch starting at size s can hold at most ``max_tokens // s`` rows, so each step looks at
    that short window only: O(n) total work in numpy, not a Python loop over sentences.
    """
    counts: list[int] = []
    start, n = 0, len(sizes_sorted)
    row_counts = np.arange(1, min(n, max_tokens) + 1, dtype=np.int64)
    while start < n:
        capacity = max(1, max_tokens // int(sizes_sorted[start]))
        window = sizes_sorted[start : start + capacity]
        padded_tokens = row_counts[: len(window)] * np.maximum.accumulate(window)
        # padded_tokens is non-decreasing, so the rows that fit form a prefix.
        fits = int(np.count_nonzero(padded_tokens <= max_tokens))
        take = max(1, fits)  # a sentence over budget on its own still gets a batch
        counts.append(take)
        start += take
    return counts


class BatchPlan(Sequence):
    """An epoch's batches as slices of one index array: numpy ints, not millions of Python ones.

    ``plan[i]`` is batch i (an int array of corpus indices); ``plan[i:j]`` a list of them.
    """

    def __init__(self, order: np.ndarray, bounds: np.ndarray):
        self.order = order  # corpus indices, grouped batch after batch
        self.bounds = bounds  # [n_batches, 2] start/end of each batch in ``order``, in plan order

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        start, end = self.bounds[i]
        return self.order[start:end]

    def tolist(self) -> list[list[int]]:
        return [b.tolist() for b in self]


def _plan(order: np.ndarray, counts: list[int]) -> BatchPlan:
    ends = np.cumsum(np.asarray(counts, dtype=np.int64))
    bounds = np.stack([ends - np.asarray(counts, dtype=np.int64), ends], axis=1)
    return BatchPlan(_index(order), bounds)


def _narrow(key: np.ndarray) -> np.ndarray:
    """Smallest unsigned dtype holding ``key``: numpy's stable sort is a radix sort up to 16 bits."""
    for dtype in (np.uint16, np.uint32):
        if key.size == 0 or int(key.max()) <= np.iinfo(dtype).max:
            return key.astype(dtype)
    return key


def _index(order: np.ndarray) -> np.ndarray:
    """Corpus indices as int32 where they fit: half the memory of argsort's int64 on big corpora."""
    return order.astype(np.int32) if order.size < 2**31 else order


def _length_order(src: np.ndarray, trg: np.ndarray, tie_seed: int | None) -> np.ndarray:
    """Indices sorted by (trg, src); ties in random order for a seed, by index otherwise."""
    radix = int(src.max()) + 1
    key = _narrow(trg.astype(np.int64) * radix + src)  # (trg, src) lexicographic as one integer
    if tie_seed is None:
        return _index(np.argsort(key, kind="stable"))
    # LSD radix: order by random noise first, then stably by length; far faster than lexsort.
    noise = np.random.default_rng(tie_seed).integers(0, 2**16, size=key.size, dtype=np.uint16)
    by_noise = _index(np.argsort(noise, kind="stable"))
    del noise
    return by_noise[np.argsort(key[by_noise], kind="stable")]


def derived_seed(seed: int, stream: int) -> int:
    """A seed of its own for one use of the run's ``seed``: an epoch's batch order (stream = the
    epoch), a rank's dropout in one update (see ``Trainer.train_step``)."""
    return (seed * 1_000_003 + stream) % (2**63)


def token_batches(
    src_lens: Sequence[int], trg_lens: Sequence[int], max_tokens: int, seed: int | None, epoch: int
) -> BatchPlan:
    """Corpus indices grouped into length-bucketed batches; every index appears exactly once.

    Pure: the same arguments always give the same list (the trainer resumes mid-epoch by
    recomputing it). ``seed`` None keeps the sorted order and breaks ties by index (dev/test);
    otherwise ties are broken randomly and the batch order is shuffled, both per (seed, epoch).
    """
    src = np.asarray(src_lens, dtype=np.int32) + _SPECIALS_PER_SIDE
    trg = np.asarray(trg_lens, dtype=np.int32) + _SPECIALS_PER_SIDE
    if src.shape != trg.shape:
        raise ValueError(f"token_batches: {src.size} source but {trg.size} target lengths")
    if src.size == 0:
        return _plan(np.zeros(0, dtype=np.int32), [])
    order = _length_order(src, trg, None if seed is None else derived_seed(seed, epoch))
    sizes = np.maximum(src, trg)[order]
    plan = _plan(order, _greedy_cuts(sizes, max_tokens))
    if seed is not None:
        # The same permutation a list of the batches would get from random.shuffle with this seed.
        permutation = list(range(len(plan)))
        random.Random(derived_seed(seed, epoch)).shuffle(permutation)
        plan.bounds = plan.bounds[permutation]
    return plan


def _positions(bounds: np.ndarray) -> np.ndarray:
    """Positions in a plan's index array of the batches ``bounds`` names, batch after batch."""
    if len(bounds) == 0:
        return np.zeros(0, dtype=np.int64)
    sizes = (bounds[:, 1] - bounds[:, 0]).astype(np.int64)
    offsets = np.cumsum(sizes) - sizes
    return np.repeat(bounds[:, 0].astype(np.int64) - offsets, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)


def rebatched_rest(
    plan: BatchPlan,
    done: int,
    src_lens: Sequence[int],
    trg_lens: Sequence[int],
    max_tokens: int,
    seed: int,
    epoch: int,
) -> BatchPlan:
    """``plan`` with its first ``done`` batches as they are and the pairs of the others batched
    again (``token_batches``) under ``max_tokens`` and ``seed``: an epoch whose batching changed
    midway still trains on each of its pairs once."""
    kept = plan.order[_positions(plan.bounds[:done])]
    rest = np.sort(plan.order[_positions(plan.bounds[done:])])
    src, trg = np.asarray(src_lens)[rest], np.asarray(trg_lens)[rest]
    again = token_batches(src, trg, max_tokens, seed, epoch)
    sizes = (plan.bounds[:done, 1] - plan.bounds[:done, 0]).astype(np.int64)
    ends = np.cumsum(sizes)
    bounds = np.concatenate([np.stack([ends - sizes, ends], axis=1), again.bounds + len(kept)]).astype(np.int64)
    return BatchPlan(_index(np.concatenate([kept, rest[again.order]])), bounds.reshape(-1, 2))


def sentence_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Decoding batches sorted by source length, budget ``n * (longest src + EOS) <= max_tokens``.

    Callers restore the input order from the indices.
    """
    sizes = np.asarray(lengths, dtype=np.int64) + _SPECIALS_PER_SIDE
    if sizes.size == 0:
        return []
    order = np.argsort(_narrow(sizes), kind="stable")
    return _plan(order, _greedy_cuts(sizes[order], max_tokens)).tolist()


def batch_shapes(plan: BatchPlan, src_lens: Sequence[int], trg_lens: Sequence[int]) -> int:
    """How many distinct padded shapes (sentences, longest source, longest target) a plan's batches
    have: every one is a new set of matrix shapes for the kernels compiled per shape (oneDNN's)."""
    if len(plan) == 0:
        return 0
    starts = np.sort(plan.bounds[:, 0])  # the plan's index array is batch after batch
    rows = np.diff(np.append(starts, plan.order.size))
    src = np.maximum.reduceat(np.asarray(src_lens, dtype=np.int64)[plan.order], starts)
    trg = np.maximum.reduceat(np.asarray(trg_lens, dtype=np.int64)[plan.order], starts)
    return len(np.unique(np.stack([rows, src, trg], axis=1), axis=0))


def epoch_batch_shapes(src_lens: Sequence[int], trg_lens: Sequence[int], max_tokens: int) -> int:
    """``batch_shapes`` of every epoch's whole plan under ``max_tokens`` (``token_batches``), whatever
    its seed and epoch: pairs that tie in (trg, src) order have the same lengths, so each epoch cuts
    the same sorted lengths into the same shapes, only in another order. Counted from the sorted
    lengths alone, without making a plan: no pair indices sorted, no shuffle."""
    src = np.asarray(src_lens, dtype=np.int64) + _SPECIALS_PER_SIDE
    trg = np.asarray(trg_lens, dtype=np.int64) + _SPECIALS_PER_SIDE
    if src.size == 0:
        return 0
    radix = int(src.max()) + 1
    key = np.sort(_narrow(trg * radix + src))  # (trg, src) lexicographic, as token_batches orders the pairs
    trg, src = np.divmod(key, key.dtype.type(radix))  # in the key's narrow type: 7x faster than int64
    counts = np.asarray(_greedy_cuts(np.maximum(src, trg), max_tokens), dtype=np.int64)
    starts = np.cumsum(counts) - counts
    shapes = np.stack([counts, np.maximum.reduceat(src, starts), np.maximum.reduceat(trg, starts)], axis=1)
    return len(np.unique(shapes, axis=0))


def padding_fraction(batches: Sequence[Sequence[int]], trg_lens: Sequence[int]) -> float:
    """Share of padded target slots (``n * longest trg`` per batch, BOS/EOS counted) that are padding:
    the target side is what the loss and the output projection pay for."""
    if isinstance(batches, BatchPlan):  # the plan's index array is already batch after batch
        flat, starts = batches.order, np.sort(batches.bounds[:, 0])
        rows = np.diff(np.append(starts, flat.size))
    else:
        nonempty = [np.asarray(b, dtype=np.int64) for b in batches if len(b)]
        flat = np.concatenate(nonempty) if nonempty else np.zeros(0, dtype=np.int64)
        rows = np.array([len(b) for b in nonempty], dtype=np.int64)
        starts = np.cumsum(rows) - rows
    if flat.size == 0:
        return 0.0
    lens = (np.asarray(trg_lens, dtype=np.int32) + _SPECIALS_PER_SIDE)[flat]
    slots = int((np.maximum.reduceat(lens, starts).astype(np.int64) * rows).sum())
    return 1.0 - float(lens.sum(dtype=np.int64)) / slots
