"""How long idle OpenMP threads spin; decided in the environment, before torch loads its OpenMP runtime.

torch's CPU build runs the parallel parts of ATen, MKL and oneDNN on one team of GNU OpenMP threads,
and an update opens hundreds to thousands of parallel regions (configs/tiny_rnn.yaml over a
thousand: a region per small kernel, per target position, forward and backward). A thread that
waits, at the end of a region or for the next one, spins 300,000 ``pause`` instructions before it
sleeps: 3.7 ms on a 2-core Xeon. On cores shared with another job that spin is the stall: the
thread spins on a core while the teammate it waits for is waiting for a core, region after region.
Measured on that config beside one busy loop: 1-3.6 s per update (0.065 s alone), single updates
up to 6 s; beside another training job, updates of 17-18 s.

A bounded spin keeps what spinning is for (a teammate that is running answers within
microseconds, instead of being woken up) and drops the rest. 10,000 spins (0.12 ms here) cost
nothing measurable when the machine is idle (LSTM and Transformer, Multi30k and tiny, fp32 and
bf16) and bring those updates to 0.26-0.43 s, none over 1.7x the median. Not spinning at all
(OMP_WAIT_POLICY=PASSIVE) was faster still under contention but 3x slower on the idle machine
(tiny LSTM; 1.4x on Multi30k's): waking a sleeping thread costs about 0.1 ms per region in this VM.
"""

from __future__ import annotations

import os

SPIN_COUNT = 10_000
# GOMP_SPINCOUNT is GNU OpenMP's own knob; a wait policy the user chose overrides ours.
_USER_KEYS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def limit_spinning() -> str:
    """Have idle OpenMP threads sleep after 10,000 spins instead of 300,000; returns the setting in force.

    The runtime reads its environment once, when torch is first imported, so this takes effect in a
    process that has not imported torch yet (the CLI calls it first thing) and in its children. A
    spin count or wait policy the user set is kept.
    """
    for key in _USER_KEYS:
        if key in os.environ:
            return f"{key}={os.environ[key]}"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return f"GOMP_SPINCOUNT={SPIN_COUNT}"
