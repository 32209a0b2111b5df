"""What a run says about resuming: where a resumed run goes on and what changed since its training
state was written (AdamW's settings, the number of processes an update is shared out among), and,
once a run has stopped with its checkpoint written, the command that resumes it (under torchrun,
with its number of processes). The restoring itself is ``Trainer.setup``'s, the checks of a state
``nmt.training_state``'s.
"""

from __future__ import annotations

from pathlib import Path

from nmt.distributed import World
from nmt.training_state import Progress


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es")


def processes(world: World) -> str:
    """How many processes ``world`` has, in words: "2 processes", "16 processes, 8 per machine"."""
    text = _count(world.world_size, "process")
    if world.local_world_size != world.world_size:
        text += f", {world.local_world_size} per machine"
    return text


def world_size_change(saved: Progress, world: int, accumulate: int) -> str | None:
    """The line a resume on another number of processes than ``saved`` was trained on logs: an
    update takes train.accumulate x processes batches, so its size changes unless accumulate
    makes up for it. On the same number, the line another train.accumulate gives (the update's size
    changes as asked, said so that train.log shows where). None where nothing changed, or it is not
    known (an earlier version's)."""
    if saved.world_size == 0 or saved.update_batches <= 0:
        return None
    batches, before = accumulate * world, saved.update_batches
    if saved.world_size == world:
        if batches == before:
            return None
        return (
            f"resuming with train.accumulate {accumulate}: an update now takes {_count(batches, 'batch')}, not {before}"
        )
    change = f"resuming on {_count(world, 'process')}, not {saved.world_size}"
    if batches == before:
        return f"{change}: an update still takes {_count(batches, 'batch')} (train.accumulate {accumulate} x {world})"
    keep = "no train.accumulate keeps it"
    if before % world == 0:
        keep = f"--set train.accumulate={before // world} keeps it"
    return (
        f"warning: {change}: an update now takes {_count(batches, 'batch')} (train.accumulate {accumulate} x {world}), "
        f"not {before}; {keep}"
    )


def resumed_lines(p: Progress, changed: list[str], world_size: int, accumulate: int) -> list[str]:
    """What a run resumed at ``p`` logs: where it goes on, the AdamW settings the config ``changed``
    (``nmt.optimization.apply_optimizer_settings``), and another number of processes."""
    best = f"best BLEU {p.best_bleu:.2f}" if p.last_validated >= 0 else "no validation yet"
    lines = [f"resuming at update {p.update} (epoch {p.epoch}, batch {p.batch_in_epoch}), {best}"]
    if changed:
        lines.append(f"resuming with {'; '.join(changed)}: AdamW takes the config's, not the checkpoint's")
    change = world_size_change(p, world_size, accumulate)
    if change is not None:
        lines.append(change)
    return lines


def saved_line(config_path: Path, world: World, update: int) -> str:
    """Says that the checkpoint of ``update`` is written, and how to resume from it."""
    command = f"nmt train --config {config_path}"
    how = f"with: {command}"
    if world.enabled:  # the same ranks, so that an update keeps its batches
        how = f"with the same torchrun options ({processes(world)}): torchrun ... -m {command}"
    return f"checkpoint written at update {update}; resume {how}"
