"""Each training update's time beside its batch shape: is a slow update a new shape, or waiting?

    python scripts/rnn_update_times.py --config CONFIG [--set KEY=VALUE ...] [--updates 40]

Runs real updates in the training order (epoch after epoch) in a scratch run directory and prints,
per update: the batch shape (sentences x source length x target length; * where the shape is new),
wall time, the process's CPU time (all threads), and its voluntary and involuntary context switches.
An update whose wall time far exceeds its CPU time was waiting, not computing.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nmt.openmp import limit_spinning  # noqa: E402

OPENMP = limit_spinning()  # as the CLI does; GOMP_SPINCOUNT=300000 brings back GNU OpenMP's default

import torch  # noqa: E402

from nmt.arg_types import positive_int, user_path  # noqa: E402
from nmt.batching import token_batches  # noqa: E402
from nmt.bench import scratch_trainer  # noqa: E402
from nmt.config import load_config  # noqa: E402
from nmt.errors import NMTError  # noqa: E402


def _switches() -> tuple[int, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # summed over the process's threads
    return usage.ru_nvcsw, usage.ru_nivcsw


def training_groups(trainer, count: int):
    """The first ``count`` updates' (epoch, batch group) in the order ``nmt train`` runs them."""
    data, cfg = trainer.data.train, trainer.cfg
    epoch = 1
    while True:
        batches = token_batches(data.src_lens, data.trg_lens, cfg.train.max_tokens, cfg.seed, epoch)
        for i in range(0, len(batches), cfg.train.accumulate):
            yield epoch, batches[i : i + cfg.train.accumulate]
            count -= 1
            if count == 0:
                return
        epoch += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=user_path, required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--updates", type=positive_int, default=40, help="updates to run (default 40)")
    args = parser.parse_args()

    trainer = scratch_trainer(load_config(args.config, args.set), "times", lambda m: print(m, file=sys.stderr))
    data = trainer.data.train
    print(
        f"# {trainer.cfg.model.type}, {torch.get_num_threads()} threads, precision {trainer.precision.name}, {OPENMP}"
    )
    print("update epoch  shape (BxSxT)    wall ms   cpu ms  vol.sw  invol.sw")
    seen, walls, new_walls = set(), [], []
    for update, (epoch, group) in enumerate(training_groups(trainer, args.updates), start=1):
        shapes = [(len(rows), int(data.src_lens[rows].max()) + 1, int(data.trg_lens[rows].max()) + 1) for rows in group]
        new = any(s not in seen for s in shapes)
        seen.update(shapes)
        vol, invol = _switches()
        cpu, wall = time.process_time(), time.perf_counter()
        trainer.train_step(group)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        vol2, invol2 = _switches()
        walls.append(wall)
        if new:
            new_walls.append(wall)
        shape = ",".join("x".join(map(str, s)) for s in shapes) + ("*" if new else "")
        ms = f"{1e3 * wall:8.1f} {1e3 * cpu:8.1f}"
        print(f"{update:6d} {epoch:5d}  {shape:14s} {ms} {vol2 - vol:7d} {invol2 - invol:9d}")
    median = statistics.median(walls)
    print(
        f"# median {1e3 * median:.1f} ms, max {1e3 * max(walls):.1f} ms, max/median {max(walls) / median:.2f}; "
        f"updates on a new shape: median {1e3 * statistics.median(new_walls):.1f} ms ({len(new_walls)} of {len(walls)})"
    )
    trainer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NMTError as e:  # a config, key, file or run that is not right: one line, as nmt's commands say it
        print(f"rnn_update_times: error: {e}", file=sys.stderr)
        sys.exit(2)
