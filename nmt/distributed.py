"""Data-parallel training across processes, GPUs and machines, on PyTorch's own engine.

``torchrun`` starts one ``nmt train`` per device and sets RANK, WORLD_SIZE and LOCAL_RANK;
without them everything here is a no-op for a single process. Gradients are averaged by
``DistributedDataParallel``; the few other values every rank must agree on (the update's
statistics, whether to stop, the validation outcome) travel through the small collectives below.
"""

from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

# Rank 0 works alone while the others wait: it prepares the data (SentencePiece and the encoding
# of a WMT corpus take an hour or more), measures kernels, validates and averages. Those waits go
# through a gloo group of their own with a long timeout. Every other collective (each update's
# gradients and statistics) keeps PyTorch's default timeout, 30 min on gloo and 10 min on NCCL,
# so a rank that stops or hangs mid-training ends the job within that, not hours later.
SOLO_WORK_TIMEOUT = timedelta(hours=6)
_solo_work_group: Any = None  # the group for those waits, once ``init`` has made it


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def world_from_environment() -> World:
    """The process's place in a ``torchrun`` job (a world of one without torchrun)."""
    world_size = _env_int("WORLD_SIZE", 1)
    return World(
        rank=_env_int("RANK", 0),
        world_size=world_size,
        local_rank=_env_int("LOCAL_RANK", 0),
        local_world_size=_env_int("LOCAL_WORLD_SIZE", world_size),
    )


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(world: World, device: torch.device) -> None:
    global _solo_work_group
    if world.enabled and not dist.is_initialized():
        dist.init_process_group(backend=backend_for(device), rank=world.rank, world_size=world.world_size)
        _solo_work_group = dist.new_group(backend="gloo", timeout=SOLO_WORK_TIMEOUT)


def shutdown() -> None:
    global _solo_work_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _solo_work_group = None


def exit_rank(code: int) -> NoReturn:
    """End this torchrun rank now with ``code``, its output flushed, skipping interpreter exit.

    After ``destroy_process_group`` the group of a DistributedDataParallel job stays alive (DDP
    keeps a reference; gloo's worker and transport threads still run), and tearing it down during
    interpreter exit aborted a finished rank now and then: SIGABRT, "terminate called without an
    active exception", about one two-rank CPU run in a hundred here, which torchrun reports as a
    failed job. By the time a rank ends, the run has closed everything it writes.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _group(solo_work: bool) -> Any:
    """The group a collective goes through: ``solo_work``, one where ranks wait for rank 0's work alone."""
    return _solo_work_group if solo_work else None


def barrier(world: World, solo_work: bool = False) -> None:
    """Every rank waits for the others; ``solo_work``: for rank 0's work alone (SOLO_WORK_TIMEOUT)."""
    if world.enabled:
        dist.barrier(group=_group(solo_work))


def no_buffer_sync() -> dict[str, bool]:
    """DDP keyword that skips syncing buffers before every forward (ours are constants), in this torch's name."""
    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def share(group: list, world: World) -> list:
    """This rank's batches of one update's ``group``: round-robin, so every rank gets one when it can."""
    return group[world.rank :: world.world_size]


def all_reduce(values: list[float], world: World, device: torch.device, op: str = "sum") -> list[float]:
    """Sum (or max) of each value over the ranks; float64, so token counts stay exact."""
    if not world.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def broadcast(obj: Any, world: World, solo_work: bool = False) -> Any:
    """Rank 0's ``obj`` on every rank (a small picklable value); ``solo_work``: the others wait
    for rank 0's work alone (SOLO_WORK_TIMEOUT)."""
    if not world.enabled:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0, group=_group(solo_work))
    return holder[0]
