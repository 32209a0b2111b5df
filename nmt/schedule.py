"""Learning-rate schedules: linear warmup to ``lr_peak``, then a decay.

All are pure functions of the update number, so a resumed run recomputes the
exact rate from the step it restored.
"""

from __future__ import annotations

import math

from nmt.config import TrainConfig


def learning_rate(update: int, cfg: TrainConfig) -> float:
    """Rate for update number ``update`` (1-based: the first optimizer step uses ``update=1``).

    warmup:        lr = lr_peak * update / warmup                     (update <= warmup)
    inverse_sqrt:  lr = lr_peak * sqrt(warmup / update)               (Vaswani et al., 2017)
    cosine:        lr = lr_min + (lr_peak - lr_min) * (1 + cos(pi * p)) / 2
    linear:        lr = lr_peak + (lr_min - lr_peak) * p
    constant:      lr = lr_peak
    with p = (update - warmup) / (decay_updates - warmup), clipped to [0, 1]. The inverse-sqrt
    decay never falls below ``lr_min``.
    """
    warmup = cfg.warmup_updates
    if warmup > 0 and update <= warmup:
        return cfg.lr_peak * update / warmup
    if cfg.schedule == "constant":
        return cfg.lr_peak
    if cfg.schedule == "inverse_sqrt":
        return max(cfg.lr_min, cfg.lr_peak * math.sqrt(max(warmup, 1) / update))
    total = cfg.decay_updates or cfg.max_updates
    assert total is not None, "config check guarantees decay_updates or max_updates"
    progress = min(1.0, max(0.0, (update - warmup) / max(1, total - warmup)))
    if cfg.schedule == "cosine":
        return cfg.lr_min + (cfg.lr_peak - cfg.lr_min) * (1.0 + math.cos(math.pi * progress)) / 2.0
    return cfg.lr_peak + (cfg.lr_min - cfg.lr_peak) * progress
