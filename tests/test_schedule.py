"""Learning-rate values at chosen steps, against the formulas worked by hand."""

import math
from dataclasses import replace

import pytest

from nmt.config import TrainConfig
from nmt.schedule import learning_rate


def test_inverse_sqrt():
    cfg = TrainConfig(lr_peak=1e-3, warmup_updates=100, schedule="inverse_sqrt", max_updates=1000)
    assert learning_rate(1, cfg) == pytest.approx(1e-5)
    assert learning_rate(50, cfg) == pytest.approx(5e-4)
    assert learning_rate(100, cfg) == pytest.approx(1e-3)
    assert learning_rate(400, cfg) == pytest.approx(5e-4)  # 1e-3 * sqrt(100/400)
    assert learning_rate(10000, cfg) == pytest.approx(1e-4)


def test_inverse_sqrt_floor_and_no_warmup():
    cfg = TrainConfig(lr_peak=1e-3, lr_min=3e-4, warmup_updates=0, schedule="inverse_sqrt", max_updates=10)
    assert learning_rate(1, cfg) == pytest.approx(1e-3)
    assert learning_rate(100, cfg) == pytest.approx(3e-4)  # 1e-4 would be below the floor


def test_cosine():
    cfg = TrainConfig(lr_peak=1.0, lr_min=0.1, warmup_updates=10, schedule="cosine", max_updates=110)
    assert learning_rate(10, cfg) == pytest.approx(1.0)
    assert learning_rate(60, cfg) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.5)) / 2)
    assert learning_rate(110, cfg) == pytest.approx(0.1)
    assert learning_rate(500, cfg) == pytest.approx(0.1)


def test_linear_with_decay_updates():
    cfg = TrainConfig(lr_peak=2.0, lr_min=0.0, warmup_updates=0, schedule="linear", decay_updates=100, max_updates=1000)
    assert learning_rate(25, cfg) == pytest.approx(1.5)
    assert learning_rate(100, cfg) == pytest.approx(0.0)


def test_constant_after_warmup():
    cfg = TrainConfig(lr_peak=0.5, warmup_updates=4, schedule="constant", max_updates=100)
    assert [learning_rate(u, cfg) for u in (1, 2, 4, 50)] == pytest.approx([0.125, 0.25, 0.5, 0.5])


def test_decay_over_a_wall_clock_budget():
    # No update count to decay over: progress is the share of max_minutes spent, capped by the ramp.
    cfg = TrainConfig(lr_peak=1.0, lr_min=0.2, warmup_updates=10, schedule="linear", max_minutes=10)
    assert learning_rate(5, cfg, elapsed_seconds=1.0) == pytest.approx(0.5)  # ramp 0.5 < decay 0.9987
    assert learning_rate(20, cfg, elapsed_seconds=150.0) == pytest.approx(1.0 - 0.8 * 0.25)
    assert learning_rate(20, cfg, elapsed_seconds=600.0) == pytest.approx(0.2)
    assert learning_rate(20, cfg, elapsed_seconds=900.0) == pytest.approx(0.2)  # past the budget: lr_min
    cosine = TrainConfig(lr_peak=1.0, warmup_updates=0, schedule="cosine", max_minutes=2)
    assert learning_rate(7, cosine, elapsed_seconds=60.0) == pytest.approx(0.5)
    # The update count still decides where one is given.
    by_updates = TrainConfig(lr_peak=1.0, warmup_updates=0, schedule="linear", max_updates=100, max_minutes=2)
    assert learning_rate(50, by_updates, elapsed_seconds=119.0) == pytest.approx(0.5)


def test_a_resume_that_moves_the_end_of_the_decay_is_named_with_both_rates():
    from nmt.schedule import horizon_change

    saved = TrainConfig(lr_peak=1.0, lr_min=0.0, warmup_updates=0, schedule="linear", max_updates=100)
    longer = replace(saved, max_updates=200)
    # Update 101 of the saved run would train at lr_min; of the longer one, halfway down its decay.
    assert horizon_change(saved, longer, 101, 0.0) == (
        "warning: train.max_updates 100 -> 200 moves the end of the linear decay: update 101 trains at learning rate "
        "4.95e-01, not 0.00e+00 as the run's config.yaml had it"
    )
    clock = TrainConfig(lr_peak=1.0, warmup_updates=0, schedule="cosine", max_minutes=30)
    assert horizon_change(clock, replace(clock, max_minutes=60), 88, 1800.0) == (
        "warning: train.max_minutes 30 -> 60 moves the end of the cosine decay: update 88 trains at learning rate "
        "5.00e-01, not 0.00e+00 as the run's config.yaml had it"
    )
    bounded = replace(clock, max_minutes=60.0, max_updates=500)  # now the update count decides
    assert "train.max_updates unset -> 500" in horizon_change(clock, bounded, 88, 900.0)


def test_a_resume_whose_decay_ends_where_it_did_is_not_warned_about():
    from nmt.schedule import horizon_change

    saved = TrainConfig(lr_peak=1.0, warmup_updates=10, schedule="linear", max_updates=100)
    assert horizon_change(saved, saved, 50, 0.0) is None
    assert horizon_change(saved, replace(saved, max_updates=200), 5, 0.0) is None  # still warming up
    fixed = replace(saved, decay_updates=100)
    assert horizon_change(fixed, replace(fixed, max_updates=200), 50, 0.0) is None  # decay_updates decides
    assert horizon_change(saved, replace(saved, max_updates=200, decay_updates=100), 50, 0.0) is None
    for schedule in ("inverse_sqrt", "constant"):  # no end to move
        endless = replace(saved, schedule=schedule)
        assert horizon_change(endless, replace(endless, max_updates=200, max_minutes=5), 50, 0.0) is None
    clock = TrainConfig(lr_peak=1.0, warmup_updates=0, schedule="linear", max_minutes=30, max_updates=100)
    assert horizon_change(clock, replace(clock, max_minutes=60), 50, 900.0) is None  # max_updates decides
