"""The training state, the thing a resume reads: what ``Trainer.save`` writes in ``update_N.pt``
(``training_state``: the model, the optimizer, the loss scaler, ``Progress``, the random generators'
state, which ``set_rng_state`` puts back, the run's fingerprint), and the checks that a saved one can be
restored (``resume_problem``).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

import torch

from nmt import checkpoint
from nmt.config import MAX_LENGTH_PENALTY
from nmt.rundir import fingerprint_problem
from nmt.saved_numbers import is_number, is_whole_number


@dataclass
class Progress:
    """Everything about where training stands, saved in every checkpoint."""

    update: int = 0
    epoch: int = 1
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    epoch_batches: int = 0  # batches in this epoch's plan (0: not known, a checkpoint of an earlier version)
    best_bleu: float = -1.0
    best_update: int = 0
    best_loss: float = math.inf  # dev loss of the best validation: breaks BLEU ties (inf: an earlier version's)
    bad_validations: int = 0  # validations since the last new best (early stopping)
    nonfinite_in_row: int = 0  # against train.max_nonfinite; fp16 overflows are not counted here
    skipped_updates: int = 0  # non-finite updates and fp16 overflows, over the whole run
    elapsed_seconds: float = 0.0  # wall time of training and validation over all sessions of the run
    trg_tokens: int = 0
    last_validated: int = -1
    world_size: int = 0  # processes (torchrun ranks) training it (0: not known, a checkpoint of an earlier version)
    update_batches: int = 0  # batches of the plan per update: train.accumulate x world_size (0: not known)
    # How the plan of epoch ``plan_epoch`` was made: [first batch, max_tokens, seed] for each batching it
    # had, from batch 0 on; a resume with other settings batches the pairs not yet trained on again.
    plan_epoch: int = 0  # 0: no plan yet (or a checkpoint of an earlier version)
    plan_batchings: list = field(default_factory=list)
    plan_data: str = ""  # digest of the training pairs' lengths, all a plan depends on besides the above
    # Digest of the dev set the validations were scored on (``nmt.validation.dev_digest``; "": none yet,
    # or a checkpoint of an earlier version): a resume on another would rank its scores with theirs.
    dev_data: str = ""
    # The decode.length_penalty validation's beam search scores with, that of the run's first validation
    # for its whole life (``nmt.validation.validation_length_penalty``): 'nmt tune-decode' changes the
    # config's. -1: none yet, or a checkpoint of an earlier version.
    validate_length_penalty: float = -1.0

    @property
    def update_epoch(self) -> int:
        """The epoch the last update's batches came from: ``epoch`` has moved on once they ended one."""
        return self.epoch - 1 if self.batch_in_epoch == 0 and self.update > 0 else self.epoch

    @classmethod
    def from_dict(cls, d: dict) -> Progress:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# The lowest value of Progress's whole-number fields that do not count from 0.
_PROGRESS_LOWEST = {"epoch": 1, "last_validated": -1}


def _whole(value: object, lowest: int) -> bool:
    return is_whole_number(value) and value >= lowest


def _number(value: object) -> bool:
    return is_number(value) and not math.isnan(value)


def progress_problem(saved: dict, update: int) -> str | None:
    """What in the ``progress`` of training state ``update_N.pt`` (``update`` its N) is not of the type
    and range ``Trainer.save`` writes, in words, or None. A field it lacks (a checkpoint of an earlier
    version) takes its default; the update is always there, and is the one the file is named for."""
    if not _whole(saved.get("update"), 0) or saved["update"] != update:
        return f"progress.update is {saved.get('update')!r}, the file is named for update {update}"
    for f in fields(Progress):
        if f.name not in saved:
            continue
        value, default = saved[f.name], f.default_factory() if f.default is MISSING else f.default
        said = f"progress.{f.name} is {value!r}"
        if isinstance(default, int) and not _whole(value, lowest := _PROGRESS_LOWEST.get(f.name, 0)):
            return f"{said}, not a whole number from {lowest} on"
        if isinstance(default, float) and not _number(value):
            return f"{said}, not a number"
        if isinstance(default, str) and not isinstance(value, str):
            return f"{said}, not a string"
    penalty = saved.get("validate_length_penalty", -1.0)
    if penalty != -1.0 and not 0 <= penalty <= MAX_LENGTH_PENALTY:
        return f"progress.validate_length_penalty is {penalty!r}, not -1 or a length penalty"
    elapsed = saved.get("elapsed_seconds", 0.0)
    if not (math.isfinite(elapsed) and elapsed >= 0):  # train.max_minutes and time-based schedules read it
        return f"progress.elapsed_seconds is {elapsed!r}, not a time"
    return _plan_problem(saved.get("plan_batchings", []), saved.get("plan_epoch", 0))


def _plan_problem(batchings: object, plan_epoch: int) -> str | None:
    """``Progress.plan_batchings``: [first batch, max_tokens, seed] for each batching of the plan of
    epoch ``plan_epoch``, the first from batch 0; none only before the first plan (plan_epoch 0)."""
    said = f"progress.plan_batchings is {batchings!r}"
    if not isinstance(batchings, list):
        return f"{said}, not a list of batchings"
    if not batchings and plan_epoch != 0:
        return f"{said}, with a plan for epoch {plan_epoch}"
    for batching in batchings:
        if not (isinstance(batching, list) and len(batching) == 3 and all(_whole(v, 0) for v in batching)):
            return f"{said}, not a list of [first batch, max_tokens, seed]"
        if batching[1] < 1:
            return f"{said}: max_tokens {batching[1]}"
    return None


def optimizer_state_problem(saved: dict, optimizer: torch.optim.Optimizer) -> str | None:
    """What in a saved ``optimizer.state_dict()`` ``optimizer`` (the model's AdamW, as built) could not
    take as its own, in words, or None: param_groups of its parameters' count and settings of its kinds
    (``param_group_problem``), and a state per parameter of its shape and of values a step leaves
    (``parameter_state_problem``). torch checks only the counts as it loads; a state of another shape
    failed at the first update, or corrupted memory in the fused kernel."""
    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        return "optimizer.param_groups is not a list of mappings"
    if not isinstance(state, dict):
        return "optimizer.state is not a mapping"
    if len(groups) != len(optimizer.param_groups):
        return f"optimizer.param_groups has {len(groups)} groups, not {len(optimizer.param_groups)}"
    shapes: dict[int, torch.Size] = {}
    for i, (group, own) in enumerate(zip(groups, optimizer.param_groups)):
        if (problem := param_group_problem(f"optimizer.param_groups[{i}]", group, own)) is not None:
            return problem
        shapes.update(zip(group["params"], (param.shape for param in own["params"])))
    if len(shapes) != sum(len(group["params"]) for group in groups):
        return "optimizer.param_groups name a parameter twice"
    for n, entry in state.items():
        if n not in shapes or not isinstance(entry, dict):
            return f"optimizer.state has an entry {n!r} for no parameter of the model"
        if (problem := parameter_state_problem(f"optimizer.state[{n}]", entry, shapes[n])) is not None:
            return problem
    return None


# A progress field of the versions in which an update is one AdamW step: since fp16 overflows stopped
# counting as updates (an earlier version's state may have one AdamW step fewer per overflow).
_ONE_STEP_PER_UPDATE_SINCE = "world_size"


def optimizer_steps_problem(saved: dict, progress: dict) -> str | None:
    """Whether AdamW's saved state ``saved`` (as ``optimizer_state_problem`` passed it) belongs to the
    training state of ``progress``, in words, or None. Every parameter has a gradient at every update,
    and an update skipped (non-finite, an fp16 overflow) steps none and is not counted: each parameter
    has a state of ``progress.update`` steps (none at update 0), whatever train.accumulate and the
    ranks. An earlier version's state (counting fp16 overflows as updates) may hold fewer, the same
    for all. Other steps are a state stitched from another run or update, which trained on from
    another place than its weights' (AdamW's bias correction and moments)."""
    update, exact = progress["update"], _ONE_STEP_PER_UPDATE_SINCE in progress
    ids = [n for group in saved["param_groups"] for n in group["params"]]
    steps = {n: _steps_taken(saved["state"].get(n) or {}) for n in ids}
    fewest, most = min(ids, key=steps.get, default=None), max(ids, key=steps.get, default=None)
    if fewest is not None and steps[fewest] != steps[most]:
        has = f"has {steps[fewest]} steps" if saved["state"].get(fewest) else "is missing"
        return (
            f"optimizer.state[{fewest}] {has}, optimizer.state[{most}] has {steps[most]}: "
            "AdamW steps every parameter at each update"
        )
    taken = steps[most] if most is not None else 0
    if taken > update or (exact and taken != update):
        steps_said = f"its AdamW state has {taken} steps, progress.update is {update}"
        return f"{steps_said}: the optimizer state is another update's"
    return None


def _steps_taken(entry: dict) -> int:
    """The steps of a parameter's AdamW state (``_step_problem`` passed it); 0 for none yet."""
    step = entry.get("step", 0)
    return int(step.item() if isinstance(step, torch.Tensor) else step)


# AdamW's flags that no config key sets and that loading a state brings back: a saved one must be
# the optimizer's own as built. maximize makes training a gradient ascent; amsgrad wants a state
# never saved (a KeyError at the first update); capturable fails on a CPU, differentiable with the
# fused kernel. (foreach and fused say how a machine computes the same step, and may differ.)
_AS_BUILT = ("maximize", "amsgrad", "capturable", "differentiable")


def param_group_problem(said: str, group: dict, own: dict) -> str | None:
    """What in saved param group ``group`` (``said``: where, in words) the optimizer's group ``own``
    could not take, in words, or None: its parameters' count, its settings of the kinds of ``own``'s,
    and the flags that no config key sets as ``own`` has them. Its lr, betas, eps and weight_decay may
    be any number: the schedule sets lr before every update and the config the others on resume
    (``apply_optimizer_settings``), before any step."""
    ids = group.get("params")
    if not isinstance(ids, list) or not all(_whole(n, 0) for n in ids) or len(ids) != len(own["params"]):
        return f"{said}.params is not a list of the model's {len(own['params'])} parameters"
    for key, value in own.items():
        if key != "params" and key in group and not _same_kind(group[key], value):
            return f"{said}.{key} is {group[key]!r}, not like {value!r}"
    for key in _AS_BUILT:
        if key in group and key in own and bool(group[key]) != bool(own[key]):
            return f"{said}.{key} is {group[key]!r}, not {own[key]!r} as nmt builds AdamW"
    return None


def _same_kind(saved: object, own: object) -> bool:
    """Whether a saved param-group setting is of the kind of the optimizer's own: a flag (True, False or
    None: unset, as torch versions leave some), a number (nan too), or a tuple of as many numbers (betas)."""
    if own is None or isinstance(own, bool):
        return saved is None or isinstance(saved, bool)
    if isinstance(own, (int, float)):
        return is_number(saved)
    if isinstance(own, (tuple, list)):
        return isinstance(saved, (tuple, list)) and len(saved) == len(own) and all(map(is_number, saved))
    return True


# What AdamW keeps of a parameter it has stepped (without amsgrad, which nmt never sets): a step it
# loads without one of them ends in a KeyError.
_ADAMW_ENTRIES = ("step", "exp_avg", "exp_avg_sq")
# The running means of squared gradients: the step divides by their root.
_SQUARES = ("exp_avg_sq", "max_exp_avg_sq")


def parameter_state_problem(said: str, entry: dict, shape: torch.Size) -> str | None:
    """What in AdamW's saved state ``entry`` of a parameter of ``shape`` (``said``: where, in words) it
    could not go on from, in words, or None: each of its entries, of values a step leaves. An empty
    entry is a parameter not stepped yet; AdamW starts its state at the next step."""
    missing = [name for name in _ADAMW_ENTRIES if entry and name not in entry]
    if missing:
        return f"{said} has no {missing[0]}"
    for name, value in entry.items():
        problem = _step_problem(value) if name == "step" else _moment_problem(value, shape, name in _SQUARES)
        if problem is not None:
            return f"{said}.{name} {problem}"
    return None


def _step_problem(step: object) -> str | None:
    """The steps AdamW has taken a parameter, the exponent of its bias correction: a whole number from 0
    on, in a tensor of shape [] (a number before torch 1.12). A negative one turns the step around or
    makes it nan."""
    if isinstance(step, torch.Tensor) and step.shape == torch.Size([]) and not step.is_complex():
        step = step.item()
    elif not is_number(step):
        return "is not a tensor of shape []"
    if not (math.isfinite(step) and step >= 0 and step == int(step)):
        return f"is {step!r}, not a whole number of steps from 0 on"
    return None


def _moment_problem(moment: object, shape: torch.Size, is_square: bool) -> str | None:
    """A running mean of the gradients (exp_avg) or of their squares (``is_square``): floats of the
    parameter's shape, each finite and a square's from 0 on. One nan or inf made every update after it
    non-finite (skipped until train.max_nonfinite ended the run as diverged); an inf square froze the
    parameter for ever; a negative one made it nan."""
    if not isinstance(moment, torch.Tensor) or moment.shape != shape:
        return f"is not a tensor of shape {list(shape)}"
    if not moment.is_floating_point():
        return f"is a tensor of {moment.dtype}, not of floats"
    if moment.numel() == 0:
        return None
    # One pass for both bounds (a nan makes both nan): isfinite().all() took ten times as long.
    least, most = (bound.item() for bound in torch.aminmax(moment))
    if not (math.isfinite(least) and math.isfinite(most)):
        return "holds values that are not finite"
    if is_square and least < 0:
        return "holds values below 0"
    return None


# What GradScaler.state_dict() holds where it is enabled (fp16), each a number; {} where it is not.
_SCALER_ENTRIES = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def scaler_state_problem(saved: object) -> str | None:
    """What in a saved loss scaler's state (``Trainer.save``'s, {} where it had none) is not of the kind
    written, in words, or None."""
    if saved is None or saved == {}:
        return None
    if not isinstance(saved, dict) or not all(_number(saved.get(key)) for key in _SCALER_ENTRIES):
        return "scaler is not a loss scaler's state"
    if not (math.isfinite(saved["scale"]) and saved["scale"] > 0):
        return f"scaler.scale is {saved['scale']!r}, not a positive number"
    return None


def rng_state(on_cuda: bool = False) -> dict[str, Any]:
    """The random state to save: Python's and torch's CPU generator, and with ``on_cuda`` (a run that
    computes on a GPU) the GPUs'. Reading a GPU's state initialises CUDA: a CPU run on a machine with
    a GPU would take GPU memory for it, and fail where another job holds the GPU."""
    import random

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if on_cuda:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def rng_state_problem(state: dict[str, Any]) -> str | None:
    """What in a saved random state ``set_rng_state`` could not put back, in words, or None. Each part
    is tried on a generator of its own, so that the process's are left as they are."""
    import random

    python, cpu, gpus = state.get("python"), state.get("torch"), state.get("cuda", [])
    try:
        version, internal, gauss = python
        random.Random().setstate((version, tuple(internal), gauss))
        if gauss is not None and not isinstance(gauss, float):
            raise TypeError("gauss")
    except (TypeError, ValueError, OverflowError):
        return "rng.python is not a Python random state"
    try:
        if not isinstance(cpu, torch.Tensor):
            raise TypeError("torch")
        torch.Generator().set_state(cpu)
    except (TypeError, RuntimeError):
        return "rng.torch is not a torch random state"
    if not isinstance(gpus, (list, tuple)) or not all(
        isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 for t in gpus
    ):
        return "rng.cuda is not a list of GPU random states"
    return None


def set_rng_state(state: dict[str, Any], on_cuda: bool = False) -> None:
    """Put back a state ``rng_state`` returned; the GPUs' part only with ``on_cuda`` (a run computing on
    a GPU): a CPU run resumed from a GPU run's checkpoint would otherwise initialise CUDA for nothing,
    and fail where another job holds the GPU."""
    import random

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if on_cuda and "cuda" in state and torch.cuda.is_available():
        # One state per GPU the saving process saw: a run saved where more were visible (8 ranks,
        # resumed with 4 on another machine) holds states for devices not here, which torch refuses.
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


def training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    progress: Progress,
    on_cuda: bool,
    fingerprint: dict,
) -> dict:
    """The whole training state, as ``Trainer.save`` writes it; ``resume_problem`` checks each part."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler.is_enabled() else {},
        "progress": asdict(progress),
        "rng": rng_state(on_cuda),
        "fingerprint": fingerprint,
    }


def resume_problem(info: checkpoint.CheckpointInfo, state: dict, optimizer: torch.optim.Optimizer) -> str | None:
    """What in training state ``state`` (file ``info``) a resume could not restore into ``optimizer``
    (the model's, as built) and the rest, or None: every part is checked before any is restored, so
    that a damaged state is passed over whole and the trainer never goes on half restored from it."""
    return (
        fingerprint_problem(state.get("fingerprint"))
        or progress_problem(state["progress"], info.update)
        or rng_state_problem(state["rng"])
        or optimizer_state_problem(state["optimizer"], optimizer)
        or optimizer_steps_problem(state["optimizer"], state["progress"])
        or scaler_state_problem(state.get("scaler"))
    )
