"""Data-parallel training across processes, GPUs and machines, on PyTorch's own engine.

``torchrun`` starts one ``nmt train`` per device and sets RANK, WORLD_SIZE and LOCAL_RANK;
without them everything here is a no-op for a single process. Gradients are averaged by
``DistributedDataParallel``; the few other values every rank must agree on (the update's
statistics, whether to stop, the validation outcome) travel through the small collectives below.

A failure is reported once: a step one rank does alone, or all do alike, ends with ``agree``,
which tells every rank how it went, so that the lowest rank with a message prints it and the
others end quietly, once torchrun stops them (``Stopped``); a rank whose peer went away says so in one line (rank 0
after saving the training state, see ``nmt.training.saved_if_a_peer_is_lost``).
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist

from nmt.errors import NMTError, SharedError
from nmt.signals import Interrupted, SignalPending, handlers_set, held_signals, terminating_signals

T = TypeVar("T")

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
_joined = False  # whether this process has joined the ranks' group (from then on they can agree)


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
    global _solo_work_group, _joined
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
        _joined = True


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


def _group(solo_work: bool) -> Any:
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


# How long a rank that ends quietly waits for the rank that reports: torchrun stops every rank as
# soon as one ends with a failure, so a quiet rank that left first would cut the report short.
REPORT_WAIT_S = 30.0


class Stopped(NMTError):
    """This rank ends because another failed and reports why: no message; torchrun's SIGTERM, once the
    reporting rank has exited, or else the failure's exit status.

    ``wait``: stay until torchrun ends this process (after the reporting rank has printed and
    exited) or ``REPORT_WAIT_S`` pass; not for a signal, where torchrun is already stopping every
    rank. ``fallback``: printed if the wait runs out, for an error the ranks could not agree on
    (before they joined), in case the rank meant to report it did not fail."""

    def __init__(self, exit_code: int, wait: bool = True, fallback: str = ""):
        super().__init__("")
        self.exit_code = exit_code
        self.wait = wait
        self.fallback = fallback

    def wait_for_report(self) -> str:
        """Wait as above (the command has ended); what to print if nobody ended this process."""
        if not self.wait:
            return ""
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        time.sleep(REPORT_WAIT_S)
        return self.fallback


class PeerLost(NMTError):
    """A collective failed because another rank went away or stopped answering."""

    exit_code = 1


@dataclass(frozen=True)
class Outcome:
    """How one rank's step failed, as the others learn it."""

    message: str
    exit_code: int
    signum: int | None = None  # a signal ended it


def _outcome(error: BaseException) -> Outcome:
    if isinstance(error, KeyboardInterrupt):
        signum = getattr(error, "signum", signal.SIGINT)
        return Outcome("interrupted", 128 + signum, signum)
    if isinstance(error, NMTError):
        return Outcome(str(error), error.exit_code)
    return Outcome(f"{type(error).__name__}: {error}", 1)  # a bug: that rank shows its traceback


def agree(world: World, work: Callable[[], T], solo_work: bool = False) -> T:
    """``work``'s result, once every rank knows that its step went well on all (every rank calls
    this; ``work`` may do nothing on some). Where it failed, a rank raises its own error unless a
    lower rank failed with the same message, so an error common to all is reported once, by rank
    0; the others end quietly (``Stopped``) with the first failure's exit status, or as
    interrupted (``SignalPending``) where a signal ended it. ``solo_work``: rank 0's work alone."""
    if not world.enabled:
        return work()
    error: BaseException | None = None
    result = None
    try:
        result = work()
    except (Exception, KeyboardInterrupt) as e:
        error = e
    outcomes: list[Outcome | None] = [None] * world.world_size
    # torchrun passes a signal to every rank: one waiting here, let out by it half-way through the
    # exchange, left the rank that was working (and interrupted) to report a lost peer instead.
    with held_signals():
        dist.all_gather_object(outcomes, None if error is None else _outcome(error), group=_group(solo_work))
    failed = [(rank, o) for rank, o in enumerate(outcomes) if o is not None]
    if not failed:
        return result
    if error is not None and _outcome(error).message not in {o.message for r, o in failed if r < world.rank}:
        raise error
    first = failed[0][1]
    if first.signum is not None:
        raise SignalPending(first.signum)
    raise Stopped(first.exit_code)


# What gloo says when the other end of a collective is gone, or silent past the timeout (NCCL
# raises DistBackendError).
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "pair closure", "timed out")


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank went away or stopped answering."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(phrase in text for phrase in _PEER_GONE)


def peer_lost_message(world: World, error: BaseException) -> str:
    """What this rank says where ``error`` is a collective failing because a peer went away (``peer_lost``)."""
    what = "stopped answering (see its messages)" if "timed out" in str(error).lower() else "stopped (see its message)"
    return f"rank {world.rank}: another rank {what}"


@contextmanager
def reported_once(world: World) -> Iterator[None]:
    """Around a torchrun rank's whole command: what its failure prints. An error every rank raises
    alike (``SharedError``, an interruption, a bad config before the ranks could agree) is printed
    by rank 0 alone (one per machine before they agree); an error of this rank's own keeps its
    message, which names the rank; a collective that failed because a peer went away becomes one
    line instead of gloo's traceback (rank 0 raises its own ``PeerLost``, naming its checkpoint, where
    training had begun)."""
    if not world.enabled:
        yield
        return
    try:
        yield
    except (Stopped, PeerLost):  # the message names this rank already
        raise
    except SharedError as e:
        if not world.is_main:
            raise Stopped(e.exit_code, wait=not isinstance(e, Interrupted)) from None
        raise
    except NMTError as e:
        if not _joined:  # every rank read the same config and found the same devices
            if world.local_rank > 0:
                raise Stopped(e.exit_code, fallback=f"rank {world.rank}: {e}") from None
            raise
        if not world.is_main:
            error = NMTError(f"rank {world.rank}: {e}")
            error.exit_code = e.exit_code
            raise error from None
        raise
    except KeyboardInterrupt as e:  # every rank had the signal: rank 0 says so
        if not world.is_main:
            raise Stopped(128 + getattr(e, "signum", signal.SIGINT), wait=False) from None
        raise
    except Exception as e:
        if not peer_lost(e):
            raise
        raise PeerLost(peer_lost_message(world, e)) from None
