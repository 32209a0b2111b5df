"""Learning-rate schedules: linear warmup to ``lr_peak``, then a decay.

All are pure functions of the update number (and, for a decay over a wall-clock budget, of the
run's elapsed time, which checkpoints keep), so a resumed run recomputes the rate it stopped at.
"""

from __future__ import annotations

import math
from dataclasses import replace

from nmt.config import TrainConfig

# What a cosine or linear decay runs over, the first one set (``learning_rate``).
HORIZON_KEYS = ("decay_updates", "max_updates", "max_minutes")


def learning_rate(update: int, cfg: TrainConfig, elapsed_seconds: float = 0.0) -> float:
    """Rate for update number ``update`` (1-based: the first optimizer step uses ``update=1``).

    warmup:        lr = lr_peak * update / warmup                     (update <= warmup)
    inverse_sqrt:  lr = lr_peak * sqrt(warmup / update)               (Vaswani et al., 2017)
    cosine:        lr = lr_min + (lr_peak - lr_min) * (1 + cos(pi * p)) / 2
    linear:        lr = lr_peak + (lr_min - lr_peak) * p
    constant:      lr = lr_peak
    with p = (update - warmup) / (decay_updates - warmup), clipped to [0, 1]. The inverse-sqrt
    decay never falls below ``lr_min``.

    A cosine or linear decay with no update count to reach (neither decay_updates nor max_updates)
    runs over the wall-clock budget instead: p = elapsed_seconds / (60 * max_minutes), and the
    warmup ramp caps the rate. A run then ends at ``lr_min`` whatever speed the machine trains at.
    """
    warmup = cfg.warmup_updates
    ramp = cfg.lr_peak * update / warmup if warmup > 0 else math.inf
    if cfg.schedule in ("cosine", "linear") and cfg.decay_updates is None and cfg.max_updates is None:
        assert cfg.max_minutes is not None, "config check guarantees a budget to decay over"
        return min(ramp, _decay(cfg, min(1.0, elapsed_seconds / (60.0 * cfg.max_minutes))))
    if warmup > 0 and update <= warmup:
        return ramp
    if cfg.schedule == "constant":
        return cfg.lr_peak
    if cfg.schedule == "inverse_sqrt":
        return max(cfg.lr_min, cfg.lr_peak * math.sqrt(max(warmup, 1) / update))
    total = cfg.decay_updates or cfg.max_updates
    assert total is not None, "config check guarantees decay_updates or max_updates"
    return _decay(cfg, min(1.0, max(0.0, (update - warmup) / max(1, total - warmup))))


def decay_horizon(cfg: TrainConfig) -> str | None:
    """The key whose value the decay runs over: decay_updates, max_updates or max_minutes; None for
    a schedule that has no end (inverse_sqrt, constant)."""
    if cfg.schedule not in ("cosine", "linear"):
        return None
    return next((key for key in HORIZON_KEYS if getattr(cfg, key) is not None), None)


def horizon_change(saved: TrainConfig, now: TrainConfig, update: int, elapsed_seconds: float) -> str | None:
    """The warning a resume logs where ``now`` moves the end of the decay ``saved`` (the run's config
    until now) ran over, so that the rate of ``update`` is not the one the run was heading for: a run
    extended with a larger train.max_minutes or max_updates goes back up its decay to where the longer
    run would be. None where the rate of ``update`` is the same, or the decay's end did not move."""
    horizons = (decay_horizon(saved), decay_horizon(now))
    keys = [k for k in HORIZON_KEYS if k in horizons and getattr(saved, k) != getattr(now, k)]
    moved = replace(saved, **{k: getattr(now, k) for k in HORIZON_KEYS})
    if not keys or decay_horizon(moved) is None:
        return None
    before = learning_rate(update, saved, elapsed_seconds)
    if math.isclose(learning_rate(update, moved, elapsed_seconds), before, rel_tol=1e-9):
        return None
    changes = ", ".join(f"train.{k} {_value(getattr(saved, k))} -> {_value(getattr(now, k))}" for k in keys)
    after = learning_rate(update, now, elapsed_seconds)
    return (
        f"warning: {changes} moves the end of the {saved.schedule} decay: update {update} trains at learning rate "
        f"{after:.2e}, not {before:.2e} as the run's config.yaml had it"
    )


def _value(value: object) -> str:
    return "unset" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _decay(cfg: TrainConfig, progress: float) -> float:
    """Cosine or linear from lr_peak (progress 0) to lr_min (progress 1)."""
    if cfg.schedule == "cosine":
        return cfg.lr_min + (cfg.lr_peak - cfg.lr_min) * (1.0 + math.cos(math.pi * progress)) / 2.0
    return cfg.lr_peak + (cfg.lr_min - cfg.lr_peak) * progress
