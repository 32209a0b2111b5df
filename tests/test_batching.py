"""Token-budget batch plans and padded batch tensors."""

from __future__ import annotations

import random

import pytest
import torch

from nmt.batching import (
    batch_shapes,
    epoch_batch_shapes,
    make_batch,
    padding_fraction,
    rebatched_rest,
    sentence_batches,
    token_batches,
)

PAD, BOS, EOS = 0, 2, 3


def _lengths(n: int, seed: int = 0, low: int = 1, high: int = 60) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)], [rng.randint(low, high) for _ in range(n)]


def _padded_size(batch: list[int], src_lens: list[int], trg_lens: list[int]) -> int:
    longest = max(max(src_lens[i] + 1, trg_lens[i] + 1) for i in batch)
    return len(batch) * longest


# --------------------------------------------------------------------------- token_batches


@pytest.mark.parametrize("seed", [None, 7])
def test_every_index_exactly_once_and_budget_respected(seed):
    src, trg = _lengths(3000)
    batches = token_batches(src, trg, max_tokens=500, seed=seed, epoch=0)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(3000))
    assert all(_padded_size(b, src, trg) <= 500 for b in batches)
    # Greedy cutting should fill batches reasonably, not emit one sentence per batch.
    assert len(batches) < 3000 / 5


@pytest.mark.parametrize("done", [0, 40, 290])
def test_a_plan_batched_again_midway_keeps_its_first_batches_and_uses_every_index_once(done):
    src, trg = _lengths(3000)
    plan = token_batches(src, trg, max_tokens=500, seed=7, epoch=2)
    again = rebatched_rest(plan, done, src, trg, max_tokens=200, seed=9, epoch=2)
    assert all((a == b).all() for a, b in zip(again[:done], plan[:done]))
    assert sorted(i for b in again for i in b.tolist()) == list(range(3000))
    assert all(_padded_size(b.tolist(), src, trg) <= 200 for b in again[done:])
    assert len(again) - done > len(plan) - done  # smaller batches: more of them for the same pairs


def test_budget_counts_the_extra_special_token():
    # 10 sentences of 49 subwords: 49+1 = 50 slots each, so exactly 10 fit in 500, not 11.
    batches = token_batches([49] * 11, [49] * 11, max_tokens=500, seed=None, epoch=0)
    assert sorted(len(b) for b in batches) == [1, 10]


def test_overlong_sentence_gets_its_own_batch():
    src = [5, 5, 300, 5]
    trg = [5, 900, 5, 5]
    batches = token_batches(src, trg, max_tokens=100, seed=3, epoch=1)
    assert sorted(map(sorted, batches)) == [[0, 3], [1], [2]]


def test_same_seed_and_epoch_reproduce_exactly():
    src, trg = _lengths(2000, seed=1)
    first = token_batches(src, trg, 400, seed=5, epoch=3)
    assert token_batches(list(src), list(trg), 400, seed=5, epoch=3).tolist() == first.tolist()


def test_different_epoch_or_seed_changes_order():
    src, trg = _lengths(2000, seed=1)
    base = token_batches(src, trg, 400, seed=5, epoch=0).tolist()
    assert token_batches(src, trg, 400, seed=5, epoch=1).tolist() != base
    assert token_batches(src, trg, 400, seed=6, epoch=0).tolist() != base
    # Shuffling changes the order of batches, not their number.
    assert len(token_batches(src, trg, 400, seed=5, epoch=1)) == len(base)


def test_each_epoch_takes_its_batches_in_another_order():
    """Two epochs' batches differ only among sentences of equal lengths, so their sizes and lengths,
    in plan order, show the order they come in: shuffled anew per epoch, not only within ties."""
    src, trg = _lengths(2000, seed=1)
    shapes = [
        [(len(b), max(trg[i] for i in b)) for b in token_batches(src, trg, 400, seed=5, epoch=epoch)]
        for epoch in (1, 2)
    ]
    assert sorted(shapes[0]) == sorted(shapes[1])  # the same batches, up to ties
    assert shapes[0] != shapes[1]


def test_seed_none_keeps_sorted_length_order():
    src, trg = _lengths(500, seed=2)
    batches = token_batches(src, trg, 300, seed=None, epoch=0)
    keys = [(trg[i], src[i], i) for b in batches for i in b]
    assert keys == sorted(keys)
    assert token_batches(src, trg, 300, seed=None, epoch=9).tolist() == batches.tolist()


def test_batches_group_similar_lengths():
    src, trg = _lengths(4000, seed=3)
    batches = token_batches(src, trg, 1000, seed=1, epoch=0)
    assert padding_fraction(batches, trg) < 0.1
    random_batches = [list(range(i, min(i + 30, 4000))) for i in range(0, 4000, 30)]
    assert padding_fraction(random_batches, trg) > 0.3


def test_padding_fraction_exact():
    # Batch [0, 1]: target slots 2 * (3+1) = 8, real (1+1) + (3+1) = 6 -> 2 padding; batch [2]: none.
    assert padding_fraction([[0, 1], [2]], [1, 3, 5]) == pytest.approx(2 / 14)
    assert padding_fraction([], []) == 0.0


def test_batch_shapes_counts_distinct_sentence_counts_and_longest_sides():
    src, trg = _lengths(3000)
    plan = token_batches(src, trg, 512, seed=7, epoch=1)
    shapes = {(len(b), max(src[i] for i in b), max(trg[i] for i in b)) for b in plan.tolist()}
    assert 1 < len(shapes) < len(plan)  # some batches share a shape
    assert batch_shapes(plan, src, trg) == len(shapes)
    assert batch_shapes(token_batches([], [], 512, 7, 1), [], []) == 0


@pytest.mark.parametrize("high, max_tokens", [(8, 40), (60, 512), (400, 2000)])  # many ties; a 32-bit key
def test_epoch_batch_shapes_are_those_of_every_epoch_s_plan(high, max_tokens):
    src, trg = _lengths(3000, high=high)
    shapes = epoch_batch_shapes(src, trg, max_tokens)
    for seed, epoch in [(None, 0), (7, 1), (7, 2), (11, 5)]:
        assert batch_shapes(token_batches(src, trg, max_tokens, seed, epoch), src, trg) == shapes
    assert epoch_batch_shapes([], [], max_tokens) == 0


def test_empty_corpus_gives_no_batches():
    assert len(token_batches([], [], 100, seed=1, epoch=0)) == 0
    assert sentence_batches([], 100) == []


def test_large_lengths_still_sorted():
    # Lengths above 16 bits take the wide-key sorting path.
    src = [70_000, 3, 70_001, 3]
    trg = [2, 70_000, 2, 4]
    batches = token_batches(src, trg, 10, seed=None, epoch=0)
    assert batches.tolist() == [[0], [2], [3], [1]]


# --------------------------------------------------------------------------- sentence_batches


def test_sentence_batches_sorted_by_source_with_budget():
    lengths = [10, 3, 50, 3, 7, 200]
    batches = sentence_batches(lengths, max_tokens=40)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(6))
    assert [lengths[i] for i in flat] == sorted(lengths)
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] + 1 for i in b) <= 40
    assert [5] in batches  # overlong on its own


# --------------------------------------------------------------------------- make_batch


def test_make_batch_shapes_masks_and_specials():
    src = [[10, 11, 12], [20]]
    trg = [[30], [40, 41, 42, 43]]
    batch = make_batch(src, trg, [7, 4], PAD, BOS, EOS)
    assert batch.src.tolist() == [[10, 11, 12, EOS], [20, EOS, PAD, PAD]]
    assert batch.src_mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert batch.trg_in.tolist() == [[BOS, 30, PAD, PAD, PAD], [BOS, 40, 41, 42, 43]]
    assert batch.trg_out.tolist() == [[30, EOS, PAD, PAD, PAD], [40, 41, 42, 43, EOS]]
    assert batch.src.dtype == torch.long and batch.src_mask.dtype == torch.bool
    assert batch.n_trg_tokens == 2 + 5
    assert batch.n_src_tokens == 4 + 2
    assert batch.indices == [7, 4]


def test_make_batch_empty_target_sentence():
    batch = make_batch([[5]], [[]], [0], PAD, BOS, EOS)
    assert batch.trg_in.tolist() == [[BOS]]
    assert batch.trg_out.tolist() == [[EOS]]


def test_make_batch_without_target_for_translation():
    batch = make_batch([[5, 6], [7]], None, [0, 1], PAD, BOS, EOS)
    assert batch.trg_in is None and batch.trg_out is None
    assert batch.n_trg_tokens == 0
    assert batch.src.shape == (2, 3)


def test_make_batch_respects_nonzero_pad_id():
    batch = make_batch([[5, 6], [7]], [[8], [9, 9]], [0, 1], pad_id=1, bos_id=BOS, eos_id=EOS)
    assert batch.src.tolist() == [[5, 6, EOS], [7, EOS, 1]]
    assert batch.trg_out.tolist() == [[8, EOS, 1], [9, 9, EOS]]


def test_batch_to_device_keeps_content():
    batch = make_batch([[5, 6]], [[8]], [3], PAD, BOS, EOS)
    moved = batch.to("cpu")
    assert torch.equal(moved.src, batch.src) and torch.equal(moved.trg_out, batch.trg_out)
    assert moved.indices == [3] and moved.n_trg_tokens == batch.n_trg_tokens
    assert make_batch([[1]], None, [0], PAD, BOS, EOS).to("cpu").trg_in is None


def test_padding_fraction_of_a_plan_equals_that_of_its_batches():
    src, trg = _lengths(1500, seed=4)
    plan = token_batches(src, trg, 600, seed=2, epoch=1)
    assert padding_fraction(plan, trg) == pytest.approx(padding_fraction(plan.tolist(), trg))
