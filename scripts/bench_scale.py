"""Data at scale: preparation throughput and memory on generated corpora, and the resident memory
of training with a small and a large corpus, which should be about the same.

    python scripts/bench_scale.py --pairs 100000 5000000 --updates 100

For each size: generate the synthetic language pair (nmt/synthetic.py), run ``nmt prepare`` and
then ``nmt train`` as subprocesses, sampling their memory from /proc every 0.1 s. Preparation
memory sums the whole process tree (the encoding workers included). Figures go to stdout and
to a JSON file.

Outputs: the generated corpora (scale-data-N) and the runs (scale-N) go into --workdir (default:
runs in the current directory), the figures into --json (default: WORKDIR/bench_scale.json);
both directories are made if missing, and checked before any work.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from nmt.arg_types import positive_int, user_path
from nmt.errors import NMTError
from nmt.files import check_output, check_output_dir
from nmt.synthetic import write_synthetic_corpus

ROOT = Path(__file__).resolve().parent.parent
# Where nothing is cached, ``nmt train`` measures its kernels (precision: auto) between these two lines:
# seconds of start-up that are not the data's, and that vary with the machine's load.
TUNING_START, TUNING_END = "auto: measuring", "auto: precision"


def _status_kib(pid: int) -> dict[str, int]:
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    fields[key] = int(value.split()[0])
    except OSError:
        pass
    return fields


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def note_first(seen: dict[str, float], line: str, now: float, wanted: list[str]) -> None:
    """Note in ``seen`` when each of ``wanted`` first appeared in a line."""
    for text in wanted:
        if text not in seen and text in line:
            seen[text] = now


def seconds_to_marker(seen: dict[str, float], marker: str | None) -> float | None:
    """When ``marker`` was printed, less the kernels' measurement where one ran."""
    if marker is None or marker not in seen:
        return None
    tuning = 0.0
    if TUNING_START in seen and TUNING_END in seen:
        tuning = seen[TUNING_END] - seen[TUNING_START]
    return seen[marker] - tuning


def run_measured(cmd: list[str], marker: str | None = None) -> dict:
    """Run ``cmd``; peak RSS of its process tree and of the process itself, and when ``marker`` was printed
    (the kernels' measurement left out: the figure is the start-up that the data costs)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    peak = {"tree_rss": 0, "rss": 0, "anon": 0}
    last: dict[str, int] = {}
    seen: dict[str, float] = {}
    wanted = [TUNING_START, TUNING_END] + ([marker] if marker else [])

    def read_stderr():
        for line in proc.stderr:
            sys.stderr.write("    " + line)
            note_first(seen, line, time.perf_counter() - start, wanted)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    while proc.poll() is None:
        own = _status_kib(proc.pid)
        if own:
            last = own
        tree = sum(_status_kib(p).get("VmRSS", 0) for p in _tree(proc.pid))
        peak["tree_rss"] = max(peak["tree_rss"], tree)
        peak["rss"] = max(peak["rss"], own.get("VmRSS", 0))
        peak["anon"] = max(peak["anon"], own.get("RssAnon", 0))
        time.sleep(0.1)
    reader.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    mib = 1024
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "peak_tree_rss_mib": round(peak["tree_rss"] / mib),
        "peak_rss_mib": round(peak["rss"] / mib),
        "peak_anon_mib": round(peak["anon"] / mib),
        "final_rss_mib": round(last.get("VmRSS", 0) / mib),
        "final_anon_mib": round(last.get("RssAnon", 0) / mib),
        "final_file_mib": round(last.get("RssFile", 0) / mib),
        "marker_seconds": None if (at := seconds_to_marker(seen, marker)) is None else round(at, 1),
    }


def bench_size(n: int, updates: int, workdir: Path, config: Path) -> dict:
    data_dir, run_dir = workdir / f"scale-data-{n}", workdir / f"scale-{n}"
    start = time.perf_counter()
    write_synthetic_corpus(data_dir, "src", "trg", n_train=n, n_dev=300, n_test=300, seed=1)
    generated = time.perf_counter() - start
    shutil.rmtree(run_dir, ignore_errors=True)
    nmt = [sys.executable, "-m", "nmt"]
    sets = ["--set", f"run_dir={run_dir}", "--set", f"data.train={data_dir / 'train'}"]
    sets += ["--set", f"data.dev={data_dir / 'dev'}"]
    print(f"== {n} pairs: nmt prepare", file=sys.stderr)
    prep = run_measured(nmt + ["prepare", "--config", str(config)] + sets)
    print(f"== {n} pairs: nmt train, {updates} updates", file=sys.stderr)
    train = run_measured(
        nmt
        + ["train", "--config", str(config)]
        + sets
        + ["--set", f"train.max_updates={updates}", "--set", f"train.warmup_updates={min(50, updates)}"],
        marker="epoch 1:",
    )
    index = json.loads((run_dir / "data" / "train" / "index.json").read_text())
    return {
        "pairs": n,
        "generate_seconds": round(generated, 1),
        "shards": len(index["shards"]),
        "tokens": index["src_tokens"] + index["trg_tokens"],
        "prepare": {**prep, "pairs_per_second": round(n / prep["seconds"])},
        "encode": {
            "seconds": index["seconds"],
            "workers": index["workers"],
            "pairs_per_second": round(n / index["seconds"]),
        },
        "train": train,
    }


JSON_NAME = "bench_scale.json"


def output_paths(workdir: str | None, json_path: str | None) -> tuple[Path, Path]:
    """The work directory and the JSON file, absolute: a relative path is the caller's (nmt runs in
    ROOT), and nothing defaults into the repository wherever the script is run from."""
    directory = Path("runs" if workdir is None else workdir).absolute()
    return directory, (directory / JSON_NAME if json_path is None else Path(json_path).absolute())


def check_outputs(workdir: Path, json_path: Path, config: Path) -> None:
    """Both made where missing and proven writable before any work: not a traceback hours later."""
    check_output_dir(workdir, [], "--workdir")
    if not json_path.parent.exists():
        try:
            json_path.parent.mkdir(parents=True)
        except OSError as e:
            raise NMTError(f"--json {json_path}: cannot make its directory ({e.strerror})") from None
    check_output(json_path, [config], "--json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=positive_int, nargs="+", default=[100_000, 5_000_000])
    parser.add_argument("--updates", type=positive_int, default=100)
    parser.add_argument(
        "--config", type=user_path, default=str(ROOT / "configs" / "scale.yaml"), help="default: configs/scale.yaml"
    )
    parser.add_argument(
        "--workdir",
        type=user_path,
        help="where the generated corpora (scale-data-N) and runs (scale-N) go, made if missing "
        "(default: runs in the current directory)",
    )
    parser.add_argument("--json", type=user_path, help=f"the figures as JSON (default: WORKDIR/{JSON_NAME})")
    args = parser.parse_args()
    workdir, json_path = output_paths(args.workdir, args.json)
    config = Path(args.config).absolute()
    check_outputs(workdir, json_path, config)
    results = [bench_size(n, args.updates, workdir, config) for n in args.pairs]
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    print(
        "| pairs | prepare s (all) | pairs/s (all) | read+encode pairs/s | prepare peak RSS (tree) "
        "| train start s | train peak RSS | peak anon | file-backed at end |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        p, t = r["prepare"], r["train"]
        print(
            f"| {r['pairs']:,} | {p['seconds']} | {p['pairs_per_second']:,} | {r['encode']['pairs_per_second']:,} "
            f"| {p['peak_tree_rss_mib']} MiB | "
            f"{t['marker_seconds']} | {t['peak_rss_mib']} MiB | {t['peak_anon_mib']} MiB | {t['final_file_mib']} MiB |"
        )


if __name__ == "__main__":
    try:
        main()
    except NMTError as e:  # an output that cannot be written: one line, as nmt's commands say it
        print(f"bench_scale: error: {e}", file=sys.stderr)
        sys.exit(2)
