"""The optimizer and the gradient arithmetic of one update: the config's AdamW settings put back over
a checkpoint's, the gradients' L2 norm (in fp64 where the fast sum overflows), clipping to
``train.clip_norm``, and the updates skipped for gradients that cannot be used (an fp16 overflow,
which lowers the loss scale, or a non-finite loss or norm), with the limits past which the run has
diverged. ``nmt.trainer.Trainer.train_step`` calls them in that order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nmt.config import TrainConfig
from nmt.errors import SharedError
from nmt.training_state import Progress

# fp16 stops when its loss scale falls below this (fairseq's min_loss_scale): from torch's initial
# 65536, 30 overflows (the scale grows back only after 2000 good updates in a row).
MIN_LOSS_SCALE = 1e-4


# AdamW's settings the config holds: key of a param group -> key of the train section.
OPTIMIZER_KEYS = {"betas": "betas", "eps": "adam_eps", "weight_decay": "weight_decay"}


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, t: TrainConfig) -> list[str]:
    """Set the config's betas, adam_eps and weight_decay in every param group of ``optimizer``;
    returns "train.KEY OLD -> NEW" for each that was other. A checkpoint's optimizer state brings
    back the settings it was saved with, which would override a config changed on resume (train
    keys may change then) while the run's config.yaml recorded the new value."""
    changed = []
    for group_key, config_key in OPTIMIZER_KEYS.items():
        wanted = getattr(t, config_key)
        saved = [_setting(group[group_key]) for group in optimizer.param_groups]
        other = [value for value in saved if value != _setting(wanted)]
        if other:
            changed.append(f"train.{config_key} {other[0]} -> {_setting(wanted)}")
        for group in optimizer.param_groups:
            group[group_key] = wanted
    return changed


def _setting(value: float | tuple[float, ...] | list[float]) -> float | list[float]:
    """A setting as it compares and prints alike whether a tuple (config) or a list (a loaded state)."""
    return list(value) if isinstance(value, (tuple, list)) else value


def gradient_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of ``grads`` (one device), a tensor there, summed as clip_grad_norm_ sums it: in
    the gradients' dtype, one kernel for all of them."""
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)))


def exact_gradient_norm(grads: list[torch.Tensor]) -> float:
    """The same norm summed in fp64, for where ``gradient_norm`` is not finite: fp32 squares overflow
    from 1.8e19 on (fp16 ones from 256), so that norm is inf for gradients that are all finite. This
    one is non-finite only where an element is, as the fp16 loss scaler judges an overflow."""
    norms = [torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms)).item() if norms else 0.0


def clip_gradients(grads: list[torch.Tensor], max_norm: float, norm: float) -> None:
    """Scale ``grads``, whose L2 norm is ``norm``, down to ``max_norm`` where it is larger (0: never),
    by clip_grad_norm_'s coefficient."""
    if max_norm <= 0:
        return
    coefficient = max_norm / (norm + 1e-6)
    if coefficient < 1.0:
        torch._foreach_mul_(grads, coefficient)


def skip_overflow(
    optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, p: Progress, log: Callable[[str], None]
) -> None:
    """fp16: inf or NaN gradients at this loss scale. Not an update: the step, the schedule and the
    counts stay, and the scaler halves the scale (unscale_ recorded the overflow), as it does now
    and then while it finds the largest scale the gradients fit. A scale below MIN_LOSS_SCALE means
    they overflow at any scale: the run has diverged."""
    optimizer.zero_grad(set_to_none=True)
    before = scaler.get_scale()
    scaler.update()
    if scaler.get_scale() >= before:
        # unscale_ judged the scaled gradients, all finite: only their unscaled values overflowed,
        # which a scale below 1 does. Halved all the same, or every update would be skipped at it.
        scaler.update(before * scaler.get_backoff_factor())
    p.skipped_updates += 1
    scale = scaler.get_scale()
    log(f"update {p.update + 1}: fp16 gradients overflowed, skipped; loss scale now {scale:g}")
    if scale < MIN_LOSS_SCALE:
        raise SharedError(  # every rank's gradients are the same after DDP's all-reduce, so is its scale
            f"training diverged: the fp16 loss scale fell to {scale:.2g}, below {MIN_LOSS_SCALE:g}, so the "
            "gradients overflow at any scale (lower train.lr_peak, raise train.warmup_updates, or set "
            "train.precision to bf16 or fp32)"
        )


def skip_nonfinite(
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    p: Progress,
    limit: int,
    log: Callable[[str], None],
) -> None:
    """A non-finite loss or gradient norm, no fp16 overflow (the gradients were finite at this scale:
    a target of probability 0 makes the loss inf and its gradient finite). Not an update: in fp16
    the loss scale stays, and the update is not one of the good ones that double it."""
    optimizer.zero_grad(set_to_none=True)
    # fp16: unscale_ ran, and the next update's unscale_ raises unless this one is ended. A plain
    # update() would count it as a good update towards growth_interval; a scale given ends it uncounted.
    scaler.update(scaler.get_scale())
    p.nonfinite_in_row += 1
    p.skipped_updates += 1
    log(f"update {p.update + 1}: non-finite loss or gradient norm, skipped ({p.nonfinite_in_row} in a row)")
    if p.nonfinite_in_row >= limit:
        raise SharedError(  # every rank skipped the same updates: their statistics are summed
            f"training diverged: {p.nonfinite_in_row} non-finite updates in a row "
            "(lower train.lr_peak or raise train.warmup_updates; config key 'train.max_nonfinite')"
        )
