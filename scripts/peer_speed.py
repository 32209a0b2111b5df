"""Training speed against the fastest peer (fairseq 0.12), measured in one sitting, pair by pair.

    python scripts/peer_speed.py [--pairs 3] [--updates 40] [--set KEY=VALUE ...] [--json FILE]

Each pair runs ``nmt bench`` (the config's default choices, 4096-token batches as the peer's) and
then ``../shared/peers/fairseq_speed.sh`` right after it, on the same machine and environment, and
prints the ratio of their target tokens/s. This machine is shared and drifts: a single pair says
little, the median over pairs is the figure to report, with the range beside it. Environment knobs
such as ``ONEDNN_MAX_CPU_ISA`` reach both trainers, so one sitting can stand for a poorer CPU. So
does nmt's bound on OpenMP's spinning (``GOMP_SPINCOUNT=10000``, nmt/openmp.py), which nmt's CLI
sets for itself: fairseq otherwise spins 30 times longer, which costs it on cores another job shares.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nmt.arg_types import positive_int, user_path  # noqa: E402  (plain Python: no torch)
from nmt.openmp import limit_spinning  # noqa: E402  (plain Python: no torch)

ISA_KNOBS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
PEER_LINE = re.compile(r"([0-9][0-9.]*) target tokens/s")


class SittingError(Exception):
    """A step of the sitting failed; the message is one line for the user."""


def parse_peer_speed(output: str, command: str) -> float:
    """Target tokens/s from the last line of the peer script's output that states them."""
    found = PEER_LINE.findall(output)
    if not found:
        last = output.strip().splitlines()[-1] if output.strip() else "(no output)"
        raise SittingError(f"{command}: printed no 'target tokens/s'; its last line: {last}")
    return float(found[-1])


def _last_line(done: subprocess.CompletedProcess) -> str:
    """What a failed command said last: its stderr's last line, else its stdout's."""
    return (done.stderr.strip() or done.stdout.strip() or "(no output)").splitlines()[-1]


def summarize(pairs: list[dict]) -> dict:
    """Median and range of the per-pair ratios nmt / peer."""
    ratios = [p["nmt"] / p["peer"] for p in pairs]
    return {
        "count": len(pairs),
        "median_ratio": statistics.median(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
    }


def run_nmt(nmt: list[str], config: str, overrides: list[str], updates: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        sets = [arg for kv in ["train.max_tokens=4096", *overrides] for arg in ("--set", kv)]
        command = [*nmt, "bench", "--config", config, *sets, "--updates", str(updates), "--decode-sentences", "1"]
        try:
            done = subprocess.run(command + ["--json", str(out)], capture_output=True, text=True)
        except OSError as e:
            raise SittingError(f"cannot run {nmt[0]}: {e.strerror} (pass --nmt, or run make install)") from None
        if done.returncode != 0:
            raise SittingError(f"nmt bench exited with {done.returncode}: {_last_line(done)}")
        report = json.loads(out.read_text())
    train = report["training"]
    return {
        "tokens_per_s": train["trg_tokens_per_s"],
        "precision": report["precision"],
        "auto": report["auto"],
        "peak_gflops": report["matmul_peak_gflops"][report["precision"]],
        "utilization": train["utilization_vs_peak"],
        "machine": report["machine_name"],
    }


def run_peer(peer: Path, updates: int) -> float:
    done = subprocess.run(["bash", str(peer), str(updates)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SittingError(f"{peer} exited with {done.returncode}: {_last_line(done)}")
    return parse_peer_speed(done.stdout, str(peer))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=positive_int, default=3, help="nmt/peer pairs to run (default 3)")
    parser.add_argument("--updates", type=positive_int, default=40, help="timed nmt updates per run (default 40)")
    parser.add_argument("--peer-updates", type=positive_int, default=60, help="fairseq updates per run (default 60)")
    parser.add_argument("--config", type=user_path, default=str(ROOT / "configs" / "multi30k_transformer.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--peer",
        type=user_path,
        default=os.environ.get("FAIRSEQ_SPEED", str(ROOT.parent / "shared" / "peers" / "fairseq_speed.sh")),
        help="the peer's speed script (default ../shared/peers/fairseq_speed.sh, or $FAIRSEQ_SPEED)",
    )
    parser.add_argument("--nmt", default=str(ROOT / ".venv" / "bin" / "nmt"), help="the nmt command")
    parser.add_argument("--json", type=user_path, help="also write the pairs and their summary here")
    args = parser.parse_args(argv)
    peer = Path(args.peer)
    if not peer.is_file():
        print(f"peer_speed: no peer script at {peer} (pass --peer or set FAIRSEQ_SPEED)", file=sys.stderr)
        return 2
    knobs = {k: os.environ[k] for k in ISA_KNOBS if k in os.environ}
    # Set here, the spin limit nmt's CLI sets for itself reaches the peer too (a user's setting stays).
    spinning = limit_spinning()
    print(f"# environment: {' '.join(f'{k}={v}' for k, v in knobs.items()) or 'native ISA'}; {spinning}")
    pairs = []
    try:
        for i in range(1, args.pairs + 1):
            ours = run_nmt(shlex.split(args.nmt), args.config, args.overrides, args.updates)
            theirs = run_peer(peer, args.peer_updates)
            pairs.append({"nmt": ours["tokens_per_s"], "peer": theirs, **{k: ours[k] for k in ("precision", "auto")}})
            if i == 1:
                print(f"# machine: {ours['machine']}; nmt precision {ours['precision']}")
            print(
                f"pair {i}: nmt {ours['tokens_per_s']:,.0f} target tokens/s ({100 * ours['utilization']:.0f}% of the "
                f"{ours['precision']} matmul peak, {ours['peak_gflops']:.0f} GFLOP/s), fairseq {theirs:,.0f}: "
                f"{ours['tokens_per_s'] / theirs:.2f}x",
                flush=True,
            )
    except SittingError as e:
        print(f"peer_speed: {e}", file=sys.stderr)
        return 1
    summary = summarize(pairs)
    print(
        f"median {summary['median_ratio']:.2f}x over {summary['count']} pairs "
        f"({summary['min_ratio']:.2f}-{summary['max_ratio']:.2f}x)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"environment": knobs, "openmp": spinning, "pairs": pairs, "summary": summary}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
