"""scripts/peer_speed.py, the one-sitting speed comparison with fairseq: parsing, the ratio it
reports, and one-line errors, with a stand-in peer script (no fairseq build needed) and, but for one
sitting with the real one, a stand-in ``nmt bench``."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "peer_speed.py"
sys.path.insert(0, str(ROOT / "scripts"))

import peer_speed  # noqa: E402


def test_parse_peer_speed_takes_the_last_figure():
    text = (
        "building ...\nfairseq 0.12 training: 1,000 nonsense\nfairseq 0.12 training: 2977.5 target tokens/s (median)\n"
    )
    assert peer_speed.parse_peer_speed(text, "peer.sh") == 2977.5


def test_parse_peer_speed_names_the_script_and_its_last_line():
    with pytest.raises(peer_speed.SittingError, match=r"peer.sh: printed no 'target tokens/s'; its last line: oops"):
        peer_speed.parse_peer_speed("starting\noops\n", "peer.sh")


def test_summarize_reports_median_and_range_of_ratios():
    pairs = [{"nmt": 300.0, "peer": 200.0}, {"nmt": 400.0, "peer": 200.0}, {"nmt": 330.0, "peer": 200.0}]
    assert peer_speed.summarize(pairs) == {"count": 3, "median_ratio": 1.65, "min_ratio": 1.5, "max_ratio": 2.0}


def _fake_peer(tmp_path: Path, body: str) -> Path:
    peer = tmp_path / "fake_fairseq_speed.sh"
    peer.write_text(f"#!/usr/bin/env bash\n{body}\n")
    return peer


def _fake_nmt(tmp_path: Path, *speeds: int) -> Path:
    """A stand-in ``nmt`` whose ``bench`` reports ``speeds`` target tokens/s, one per call, and records
    its arguments: for what the script does with a report (the real bench takes seconds)."""
    for call, speed in enumerate(speeds, 1):
        report = {
            "training": {"trg_tokens_per_s": speed, "utilization_vs_peak": 0.25},
            "precision": "fp32",
            "auto": {},
            "matmul_peak_gflops": {"fp32": 80.0},
            "machine_name": "a stand-in CPU",
        }
        (tmp_path / f"bench_{call}.json").write_text(json.dumps(report))
    nmt, calls = tmp_path / "fake_nmt.sh", tmp_path / "nmt_calls"
    nmt.write_text(
        f'#!/usr/bin/env bash\necho "$*" >>{calls}\nreport={tmp_path}/bench_$(wc -l <{calls}).json\n'
        'while [ $# -gt 0 ]; do case $1 in --json) cp "$report" "$2";; esac; shift; done\n'
    )
    nmt.chmod(0o755)
    return nmt


def _run(tmp_path: Path, peer: Path, *extra: str, nmt: str | None = None) -> subprocess.CompletedProcess:
    config = tiny_config(tmp_path)
    nmt = nmt or str(_fake_nmt(tmp_path, 300))
    args = ["--config", str(config), "--peer", str(peer), "--nmt", nmt, "--updates", "2", *extra]
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_sitting_prints_each_pair_and_the_median_ratio(tmp_path):
    peer = _fake_peer(tmp_path, 'echo "fairseq 0.12 training: 250 target tokens/s (median of 5 intervals)"')
    out = tmp_path / "sitting.json"
    done = _run(tmp_path, peer, "--pairs", "3", "--json", str(out), nmt=str(_fake_nmt(tmp_path, 300, 1000, 500)))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert [(p["nmt"], p["peer"]) for p in report["pairs"]] == [(300, 250.0), (1000, 250.0), (500, 250.0)]
    assert report["summary"] == {"count": 3, "median_ratio": 2.0, "min_ratio": 1.2, "max_ratio": 4.0}
    assert done.stdout.splitlines()[1:] == [
        "# machine: a stand-in CPU; nmt precision fp32",
        "pair 1: nmt 300 target tokens/s (25% of the fp32 matmul peak, 80 GFLOP/s), fairseq 250: 1.20x",
        "pair 2: nmt 1,000 target tokens/s (25% of the fp32 matmul peak, 80 GFLOP/s), fairseq 250: 4.00x",
        "pair 3: nmt 500 target tokens/s (25% of the fp32 matmul peak, 80 GFLOP/s), fairseq 250: 2.00x",
        "median 2.00x over 3 pairs (1.20-4.00x)",
    ]
    bench = f"bench --config {tmp_path / 'tiny.yaml'} --set train.max_tokens=4096 --updates 2 --decode-sentences 1"
    assert [call.split(" --json ")[0] for call in (tmp_path / "nmt_calls").read_text().splitlines()] == [bench] * 3


def test_relative_config_and_nmt_are_to_the_callers_directory(tmp_path):
    """As for any command: nmt bench ran in the repository and looked for a relative --config there.
    The one sitting with the real ``nmt bench``: its report is what the script reads."""
    tiny_config(tmp_path)
    peer = _fake_peer(tmp_path, 'echo "fairseq 0.12 training: 250 target tokens/s"')
    (tmp_path / "bin").mkdir()
    nmt = tmp_path / "bin" / "nmt"
    nmt.write_text(f'#!/usr/bin/env bash\nexec {sys.executable} -m nmt "$@"\n')
    nmt.chmod(0o755)
    args = ["--config", "tiny.yaml", "--nmt", "bin/nmt", "--peer", peer.name, "--updates", "2", "--pairs", "1"]
    args += ["--json", "sitting.json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's nmt, wherever the command runs
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    [pair] = json.loads((tmp_path / "sitting.json").read_text())["pairs"]
    assert pair["nmt"] > 0 and pair["peer"] == 250.0 and pair["precision"] == "fp32"
    ratio = pair["nmt"] / 250.0
    assert re.fullmatch(
        rf"pair 1: nmt .* target tokens/s \(\d+% of the fp32 matmul peak, \d+ GFLOP/s\), fairseq 250: {ratio:.2f}x",
        done.stdout.splitlines()[-2],
    )
    assert done.stdout.splitlines()[-1] == f"median {ratio:.2f}x over 1 pairs ({ratio:.2f}-{ratio:.2f}x)"


def test_failing_peer_is_one_line_naming_it(tmp_path):
    peer = _fake_peer(tmp_path, 'echo "no venv here" >&2; exit 3')
    done = _run(tmp_path, peer)
    assert done.returncode == 1
    assert done.stderr.strip() == f"peer_speed: {peer} exited with 3: no venv here"


def test_missing_peer_script_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--peer", str(tmp_path / "absent.sh")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"peer_speed: no peer script at {tmp_path / 'absent.sh'} (pass --peer or set FAIRSEQ_SPEED)"
    )


def test_missing_nmt_command_is_one_line(tmp_path):
    peer = _fake_peer(tmp_path, 'echo "fairseq 0.12 training: 250 target tokens/s"')
    absent = tmp_path / "no-venv" / "nmt"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--peer", str(peer), "--nmt", str(absent)], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"peer_speed: cannot run {absent}: No such file or directory (pass --nmt, or run make install)"
    )


def test_peer_spins_as_briefly_as_nmt(tmp_path, monkeypatch):
    """nmt's CLI bounds OpenMP's spin for itself; fairseq's 30x longer spin would cost it alone on shared cores."""
    from nmt.openmp import SPIN_COUNT

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    peer = tmp_path / "peer.sh"
    peer.write_text('#!/usr/bin/env bash\necho "spin=${GOMP_SPINCOUNT-unset}" >&2\nexit 3\n')
    done = _run(tmp_path, peer)
    assert done.stderr.strip() == f"peer_speed: {peer} exited with 3: spin={SPIN_COUNT}"
    assert done.stdout.splitlines()[0].endswith(f"; GOMP_SPINCOUNT={SPIN_COUNT}")


def test_peer_keeps_the_users_wait_policy(tmp_path, monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    peer = tmp_path / "peer.sh"
    peer.write_text('#!/usr/bin/env bash\necho "spin=${GOMP_SPINCOUNT-unset} policy=$OMP_WAIT_POLICY" >&2\nexit 3\n')
    done = _run(tmp_path, peer)
    assert done.stderr.strip() == f"peer_speed: {peer} exited with 3: spin=unset policy=PASSIVE"


def _spin_in_peer_scripts(env: dict) -> str:
    """What scripts/fairseq_peer.sh (sourced by peer_decode.sh and peer_quality.sh) leaves fairseq to spin by."""
    script = f'root={ROOT}; source {ROOT / "scripts" / "fairseq_peer.sh"}; echo "${{GOMP_SPINCOUNT-unset}}"'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True).stdout.strip()


def test_decoding_and_quality_peers_spin_as_briefly_as_nmt():
    from nmt.openmp import SPIN_COUNT

    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    assert _spin_in_peer_scripts(clean) == str(SPIN_COUNT)
    assert _spin_in_peer_scripts({**clean, "OMP_WAIT_POLICY": "PASSIVE"}) == "unset"
    assert _spin_in_peer_scripts({**clean, "GOMP_SPINCOUNT": "5"}) == "5"


def test_quality_race_names_the_kernels_of_every_precision(tmp_path):
    """scripts/quality_race.sh states each nmt run's kernels from its log; an fp32 choice names its library too."""
    choices = {
        "fp32": "precision fp32, fp32 matmul onednn, attention sdpa, 1 thread",
        "bf16": "precision bf16, attention explicit, 1 thread",
    }
    for name, choice in choices.items():
        log = tmp_path / f"{name}.log"
        log.write_text(f"oneDNN kernel cache: 1024 kernels\nauto: {choice} (measured now on a CPU; ms per step: x)\n")
        script = f"root={ROOT}; source {ROOT / 'scripts' / 'fairseq_peer.sh'}; nmt_kernels {log}"
        said = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.strip()
        assert said == choice


def _fake_decode_sitting(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of scripts/peer_decode.sh beside stand-ins for fairseq, sacrebleu, nmt and Multi30k's test set;
    each stand-in trainer records the update count its model was trained for, and each scorer prints it."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("peer_decode.sh", "fairseq_peer.sh"):
        shutil.copy(ROOT / "scripts" / name, root / "scripts" / name)
    (root / "data" / "multi30k").mkdir(parents=True)
    for lang in ("de", "en"):
        (root / "data" / "multi30k" / f"test_2016_flickr.{lang}").write_text("x\n")
    venv, work = tmp_path / "venv", tmp_path / "work"
    (venv / "bin").mkdir(parents=True)
    (work / "bin").mkdir(parents=True)
    (work / "bin" / "dict.en.txt").write_text("")
    args = "while [ $# -gt 0 ]; do case $1 in"  # each stand-in takes the options it needs
    stand_ins = {
        # fairseq-train ... --max-update N --save-dir DIR: a "model" holding N, trained on from the one
        # there (the call and that count go to $CALLS), and the line fairseq ends a finished training with
        "fairseq-train": f"{args} --max-update) n=$2;; --save-dir) d=$2;; esac; shift; done\n"
        'echo "fairseq-train from $(cat "$d/checkpoint_last.pt" 2>/dev/null || echo 0)" >>"$CALLS"\n'
        'mkdir -p "$d"; echo "$n" >"$d/checkpoint_last.pt"\n'
        'echo "2026-01-01 00:00:00 | INFO | fairseq_cli.train | done training in 1.0 seconds"',
        "fairseq-generate": f'{args} --path) p=$2;; esac; shift; done\nprintf "D-0\\t0\\t%s\\n" "$(cat "$p")"',
        "sacrebleu": f'{args} -i) f=$2;; esac; shift; done\ncat "$f"',
        # nmt train --set run_dir=R --set train.max_updates=N, and nmt translate --model R -o OUT
        "nmt": f"cmd=$1; {args} run_dir=*) r=${{1#*=}};; train.max_updates=*) n=${{1#*=}};; --model) r=$2;;\n"
        "-o) o=$2;; esac; shift; done\n"
        'if [ "$cmd" = train ]; then echo "nmt train from $(cat "$r/n" 2>/dev/null || echo 0)" >>"$CALLS"\n'
        'mkdir -p "$r/checkpoints"; echo "$n" >"$r/checkpoints/index.json"; echo "$n" >"$r/n"\n'
        'echo "2026-01-01 00:00:00 best dev BLEU 1.00 at update $n; run directory $r" >>"$r/train.log"\n'
        'else cp "$r/n" "$o"; fi',
    }
    for name, body in stand_ins.items():
        path = venv / "bin" / name
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(0o755)
    env = {**os.environ, "FAIRSEQ_VENV": str(venv), "WORK": str(work), "NMT": str(venv / "bin" / "nmt")}
    env["CALLS"] = str(tmp_path / "calls")
    return root, env


def test_peer_decode_trains_both_models_again_for_another_update_count(tmp_path):
    root, env = _fake_decode_sitting(tmp_path)
    for updates in ("500", "200"):
        done = subprocess.run(
            ["bash", str(root / "scripts" / "peer_decode.sh"), updates], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == (
            f"fairseq: {updates}  nmt: {updates}  (test_2016_flickr BLEU after {updates} updates)"
        )


def test_peer_decode_trains_on_a_model_whose_training_was_interrupted_and_keeps_a_finished_one(tmp_path):
    """A sitting stopped mid-training leaves a checkpoint (fairseq) and an index.json (nmt): those models
    had 174 of 500 updates and were decoded as if finished. Now only a log's closing line marks one done."""
    root, env = _fake_decode_sitting(tmp_path)
    work, run = Path(env["WORK"]), root / "runs" / "peer_decode_nmt_500"
    (work / "ckpt_decode_500").mkdir()
    (work / "ckpt_decode_500" / "checkpoint_last.pt").write_text("174\n")
    (work / "train_decode_500.log").write_text("epoch 002 | loss 6.1 | num_updates 174\n")
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "index.json").write_text("174\n")
    (run / "n").write_text("174\n")
    (run / "train.log").write_text("2026-01-01 00:00:00 update 174 loss 6.1\n")
    command = ["bash", str(root / "scripts" / "peer_decode.sh"), "500"]
    for _ in range(2):
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "fairseq: 500  nmt: 500  (test_2016_flickr BLEU after 500 updates)"
    # resumed from the interrupted models once; the second sitting trained nothing
    assert (tmp_path / "calls").read_text().splitlines() == ["fairseq-train from 174", "nmt train from 174"]
    assert (work / "train_decode_500.log").read_text().startswith("epoch 002"), "the earlier log was overwritten"


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_quality_race_with_one_usable_cpu_fails_on_one_line(tmp_path):
    """Its trainers run one per CPU, on the first two the process may use: with one, it says so at once."""
    cpu = min(os.sched_getaffinity(0))
    env = {**os.environ, "FAIRSEQ_VENV": str(tmp_path / "none"), "WORK": str(tmp_path / "none")}
    command = ["taskset", "-c", str(cpu), "bash", str(ROOT / "scripts" / "quality_race.sh"), "1"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"quality_race: needs two CPUs, one per trainer; this process may run on CPU {cpu} only\n"
