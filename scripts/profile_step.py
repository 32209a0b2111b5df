"""Where a training update's time goes: torch.profiler over real updates of a config.

    python scripts/profile_step.py --config configs/multi30k_transformer.yaml [--set KEY=VALUE ...]

Prints the operators by self time (CPU) or the kernels by GPU time (CUDA), and on a GPU the
fraction of each update's wall time that the GPU spent in kernels (the rest is waiting for the host).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nmt.openmp import limit_spinning  # noqa: E402

limit_spinning()  # as the CLI does, before torch loads the OpenMP runtime

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from nmt.arg_types import non_negative_int, positive_int, user_path  # noqa: E402
from nmt.bench import scratch_trainer, update_groups  # noqa: E402
from nmt.config import load_config  # noqa: E402
from nmt.errors import NMTError  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=user_path, required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--updates", type=positive_int, default=5, help="profiled updates (default 5)")
    parser.add_argument("--warmup", type=non_negative_int, default=3, help="untimed updates first (default 3)")
    parser.add_argument("--rows", type=positive_int, default=30, help="table rows (default 30)")
    args = parser.parse_args()

    trainer = scratch_trainer(load_config(args.config, args.set), "profile", lambda m: print(m, file=sys.stderr))
    cuda = trainer.device.type == "cuda"
    groups = update_groups(trainer, args.warmup + args.updates)
    for group in groups[: args.warmup]:
        trainer.train_step(group)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for group in groups[args.warmup :]:
            trainer.train_step(group)
        if cuda:
            torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / args.updates
    events = prof.key_averages()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=args.rows))
    line = f"{trainer.choice.describe()}\nwall time per update {1e3 * wall:.1f} ms (profiler overhead included)"
    if cuda:
        kernel_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
        busy_ms = kernel_us / 1e3 / args.updates
        line += f"; GPU busy {busy_ms:.1f} ms per update = {100 * busy_ms / (1e3 * wall):.0f}%"
    print(line)
    trainer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NMTError as e:  # a config, key, file or run that is not right: one line, as nmt's commands say it
        print(f"profile_step: error: {e}", file=sys.stderr)
        sys.exit(2)
