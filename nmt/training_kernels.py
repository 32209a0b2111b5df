"""What a training run computes in, chosen before its model is built: precision, attention kernel,
fp32 matmul library and threads, the config's or measured where it says auto (rank 0 measures
alone and every rank takes its choice; a resumed run keeps the choice it started with).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nmt import autotune, checkpoint, distributed, rank_failures
from nmt.config import Config
from nmt.distributed import World
from nmt.kernel_choice import Choice, Request
from nmt.machine import usable_cpus
from nmt.rundir import RunDir


def choose_kernels(
    cfg: Config,
    run: RunDir,
    device: torch.device,
    world: World,
    vocab_size: int,
    resume: bool,
    log: Callable[[str], None],
) -> Choice:
    """Precision, attention kernel and threads: the config's, or measured where it says auto.
    Rank 0 measures alone and every rank takes its choice; ranks on one machine share its cores.
    A run that resumes from a training state keeps the choice it started with (``kernels.json``);
    a resume in other kernels would not compute what the run left alone would have. A run with
    no training state (new, or a first start that failed before its first) chooses afresh."""
    world_threads = None
    if world.enabled and device.type == "cpu" and cfg.train.threads in ("auto", None):
        world_threads = max(1, usable_cpus() // world.local_world_size)

    def measure() -> Choice | None:
        if not world.is_main:
            return None
        request, t, d = Request.from_train(cfg.train), cfg.train, cfg.data
        has_trained = bool(checkpoint.list_checkpoints(run.checkpoint_dir, "update"))
        return autotune.choose(
            request,
            cfg.model,
            vocab_size,
            t.max_tokens,
            d.max_len,
            device,
            log,
            world_threads,
            run_record=run.kernels_path if resume else None,
            record_use="resume" if has_trained else "start",
        )

    choice = distributed.broadcast(rank_failures.agree(world, measure, solo_work=True), world)
    autotune.apply_threads(choice)
    log(("auto: " if choice.timings else "kernels: ") + choice.describe())
    return choice
