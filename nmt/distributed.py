"""Data-parallel training across processes, GPUs and machines, on PyTorch's own engine.

``torchrun`` starts one ``nmt train`` per device and sets RANK, WORLD_SIZE and LOCAL_RANK;
without them everything here is a no-op for a single process. Gradients are averaged by
``DistributedDataParallel``; the few other values every rank must agree on (the update's
statistics, whether to stop, the validation outcome) travel through the small collectives below.
A failure is reported once, by one rank: see ``nmt.rank_failures``.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from nmt.errors import NMTError, SharedError
from nmt.signals import handlers_set, terminating_signals

# Rank 0 works alone while the others wait: it prepares the data (SentencePiece and the encoding
# of a WMT corpus take an hour or more), measures kernels, validates and averages. Those waits go
# through a gloo group of their own with a long timeout. Every other collective (each update's
# gradients and statistics) keeps PyTorch's default timeout, 30 min on gloo and 10 min on NCCL,
# so a rank that stops or hangs mid-training ends the job within that, not hours later.
SOLO_WORK_TIMEOUT = timedelta(hours=6)
# Joining: the ranks meet at MASTER_ADDR:MASTER_PORT (torchrun's store) before any work. torchrun starts
# them together, so a wait longer than this is an address not reached or a rank that never came; with
# PyTorch's default (the collectives' 30 min) such a job said nothing for half an hour.
JOIN_TIMEOUT = timedelta(minutes=5)
JOIN_TIMEOUT_VARIABLE = "NMT_JOIN_TIMEOUT_S"  # seconds, for ranks started by hand minutes apart
_solo_work_group: Any = None  # the group for those waits, once ``init`` has made it
joined = False  # whether this process has joined the ranks' group (from then on they can agree)


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
    global _solo_work_group, joined
    if world.enabled and not dist.is_initialized():
        _check_store_address(world)
        join_timeout = join_timeout_from_environment()
        started = time.monotonic()
        try:
            with _signals_end_the_process():
                _join(world, backend_for(device), join_timeout)
                _solo_work_group = dist.new_group(backend="gloo", timeout=SOLO_WORK_TIMEOUT)
        # the ranks' store: a port taken, an address not reached; no peer was lost. A DistError, but a
        # plain RuntimeError for a taken port on torch 2.5 and older
        except RuntimeError as e:
            waited = ""
            if time.monotonic() - started >= join_timeout.total_seconds():
                waited = f"; waited {_seconds(join_timeout)} s, which {JOIN_TIMEOUT_VARIABLE} sets"
            raise NMTError(
                f"rank {world.rank}: cannot join the other ranks{_store_address()} ({_first_line(e)}){waited}"
            ) from None
        joined = True


def _check_store_address(world: World) -> None:
    """env:// needs both; PyTorch's own error for one not set was a ValueError traceback."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    if missing:
        raise NMTError(
            f"rank {world.rank}: cannot join the other ranks: {' and '.join(missing)} not set (torchrun sets "
            "them; ranks started another way with RANK and WORLD_SIZE need MASTER_ADDR and MASTER_PORT too)"
        )


def join_timeout_from_environment() -> timedelta:
    """How long a rank waits for the store at MASTER_ADDR:MASTER_PORT and for every rank to reach it."""
    value = os.environ.get(JOIN_TIMEOUT_VARIABLE, "").strip()
    if not value:
        return JOIN_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise NMTError(f"{JOIN_TIMEOUT_VARIABLE}={value!r}: expected a number of seconds greater than 0")
    return timedelta(seconds=seconds)


def _seconds(duration: timedelta) -> str:
    return f"{duration.total_seconds():g}"


def collective_timeout(backend: str) -> timedelta:
    """PyTorch's default timeout for ``backend``'s collectives (30 min on gloo, 10 min on NCCL)."""
    from torch.distributed import constants

    if backend == "nccl" and isinstance(constants.default_pg_nccl_timeout, timedelta):
        return constants.default_pg_nccl_timeout
    return constants.default_pg_timeout


def _join(world: World, backend: str, join_timeout: timedelta) -> None:
    """``init_process_group`` as torchrun's environment asks (env://), but with the store reached,
    and every rank met there, within ``join_timeout``: only then does the store take the collectives'
    timeout, which the group keeps, as it would have without ours."""
    store, _, _ = next(dist.rendezvous("env://", world.rank, world.world_size, timeout=join_timeout))
    timeout = collective_timeout(backend)
    store.set_timeout(timeout)
    # the prefix PyTorch's own env:// start puts on the store, which torchrun's agent shares
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore("default_pg", store),
        rank=world.rank,
        world_size=world.world_size,
        timeout=timeout,
    )


@contextmanager
def _signals_end_the_process() -> Iterator[None]:
    """While the ranks join: SIGINT and SIGTERM end the process at once. It waits inside the store's
    C++ call, where Python's handlers cannot run, for every rank, one of which may have failed before
    joining (an error only its config or machine has): torchrun's SIGTERM, once that rank has
    reported, was ignored, and the others ended only by its SIGKILL 30 s later. Nothing is written yet."""
    with handlers_set((signal.SIGINT, *terminating_signals()), signal.SIG_DFL):
        yield


def _store_address() -> str:
    """where the ranks meet (MASTER_ADDR:MASTER_PORT, which torchrun sets), if known."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f" at {address}:{port}" if address and port else ""


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


# Keys that name files: a machine may see the same files under other paths (another mount point,
# or a config file in another directory, against which relative paths are resolved).
PATH_KEYS = frozenset({"run_dir", "data.train.path", "data.dev.path", "data.test.path"})


def _flat(values: dict, prefix: str = "") -> dict[str, Any]:
    """``values`` (a config as nested dicts) as {"train.lr_peak": 0.001, ...}."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(rank0: dict, other: dict) -> list[str]:
    """'key: rank 0's value, not this one' for each config key (but the paths) where two ranks differ."""
    a, b = _flat(rank0), _flat(other)
    keys = sorted((set(a) | set(b)) - PATH_KEYS)
    return [f"{key} {b.get(key)!r}, not {a.get(key)!r}" for key in keys if a.get(key) != b.get(key)]


def check_same_config(config: dict, world: World) -> None:
    """Every rank must train with rank 0's config (paths apart): with another learning rate one rank's
    replica drifts apart, with another batch size or seed it takes other batches, with another model
    DDP fails in a traceback. Every rank learns every config, so all raise the same error, and rank 0
    reports it, naming the first rank that differs and its keys."""
    if not world.enabled:
        return
    configs: list[dict | None] = [None] * world.world_size
    dist.all_gather_object(configs, config)
    for rank, other in enumerate(configs):
        differences = config_differences(configs[0] or {}, other or {})
        if differences:
            raise SharedError(
                f"rank {rank} was given another config than rank 0 ({'; '.join(differences)}): give every "
                "rank the same config file and --set options"
            )


# The groups ``shutdown`` has destroyed, still referenced: Python never frees them. Before torch 2.8
# freeing a gloo group holds the GIL while it waits for the group's worker threads, and a worker still
# releasing the last collective's tensors waits for the GIL: rank 0 hung at exit now and then (torch
# 2.3.1, CPU). The process ends soon after (``exit_rank``), which reclaims them.
_destroyed_groups: list[Any] = []


def shutdown() -> None:
    global _solo_work_group
    if dist.is_initialized():
        _destroyed_groups.extend(group for group in (dist.group.WORLD, _solo_work_group) if group is not None)
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


def collective_group(solo_work: bool) -> Any:
    """The group a collective goes through: ``solo_work``, one where ranks wait for rank 0's work alone."""
    return _solo_work_group if solo_work else None


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


def broadcast(obj: Any, world: World) -> Any:
    """Rank 0's ``obj`` on every rank (a small picklable value)."""
    if not world.enabled:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
