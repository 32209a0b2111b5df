"""Measured ``auto``: the decision rules on exact tables, the per-machine cache, and the real
measurement on this machine and under the ISA limits that make it behave like a poorer one."""

from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from nmt import autotune, kernel_timing, machine
from nmt.cli import main
from nmt.kernel_choice import NO_KERNEL, Choice, Request
from nmt.kernel_timing import MARGIN, decide, pick
from nmt.models.rnn import RNNConfig
from nmt.models.transformer import TransformerConfig

CPU = torch.device("cpu")
SMALL = TransformerConfig(d_model=32, ff_size=64, heads=4)


# ---------------------------------------------------------------------------- the rules


def test_pick_keeps_the_default_unless_another_is_clearly_faster():
    assert pick({"fp32": 100.0, "bf16": 40.0}, "fp32") == "bf16"
    assert pick({"fp32": 100.0, "bf16": 300.0}, "fp32") == "fp32"  # emulated bf16
    assert pick({"fp32": 100.0, "bf16": 100.0 * (1 - MARGIN / 2)}, "fp32") == "fp32"  # within noise


@pytest.mark.parametrize(
    "grid,expected",
    [
        ({"fp32/sdpa": 70, "fp32/explicit": 72, "bf16/sdpa": 51, "bf16/explicit": 42}, ("bf16", "explicit")),  # AMX
        ({"fp32/sdpa": 70, "fp32/explicit": 71, "bf16/sdpa": 216, "bf16/explicit": 208}, ("fp32", "sdpa")),  # emulated
        ({"fp32/sdpa": 60, "fp32/explicit": 80, "bf16/sdpa": 75, "bf16/explicit": 50}, ("bf16", "explicit")),
        ({"fp32/sdpa": 80, "fp32/explicit": 60, "bf16/sdpa": 90, "bf16/explicit": 59}, ("fp32", "explicit")),
    ],
)
def test_precision_is_judged_by_its_best_kernel(grid, expected):
    assert decide(grid, ["fp32", "bf16"], ["sdpa", "explicit"]) == expected


def test_fp16_must_beat_bf16_too():
    grid = {"fp32/sdpa": 100.0, "bf16/sdpa": 30.0, "fp16/sdpa": 29.5}
    assert decide(grid, ["fp32", "bf16", "fp16"], ["sdpa"]) == ("bf16", "sdpa")
    grid["fp16/sdpa"] = 20.0
    assert decide(grid, ["fp32", "bf16", "fp16"], ["sdpa"]) == ("fp16", "sdpa")
    assert decide({"fp32/sdpa": 100.0, "fp16/sdpa": 50.0}, ["fp32", "fp16"], ["sdpa"]) == ("fp16", "sdpa")


def test_auto_is_never_slower_than_fp32():
    rng = random.Random(0)
    for _ in range(500):
        grid = {f"{p}/{a}": rng.uniform(10, 100) for p in ("fp32", "bf16", "fp16") for a in ("sdpa", "explicit")}
        precision, kernel = decide(grid, ["fp32", "bf16", "fp16"], ["sdpa", "explicit"])
        assert grid[f"{precision}/{kernel}"] <= min(grid["fp32/sdpa"], grid["fp32/explicit"])


def _race_from_table(table: dict[str, float], ran: list[str]):
    """A ``race`` that runs every candidate once (so each must work) and reports ``table``'s times."""

    def fake(steps, device, rounds=3, usage=None):
        for name, step in steps.items():
            step()
            ran.append(name)
        return {name: table[name] for name in steps}

    return fake


TRAINING_TIMES = {"blas": 60.0, "onednn": 59.0, "fp32/sdpa": 50.0, "fp32/explicit": 51.0, "1": 90.0}


@pytest.mark.parametrize(
    "decoding, expected",
    [
        (
            {"blas/sdpa": 40.0, "blas/explicit": 39.0, "onednn/sdpa": 35.0, "onednn/explicit": 33.0},
            ("explicit", "onednn"),
        ),
        ({"blas/sdpa": 40.0, "blas/explicit": 39.0, "onednn/sdpa": 41.0, "onednn/explicit": 39.5}, ("sdpa", "blas")),
        (
            {"blas/sdpa": 40.0, "blas/explicit": 36.0, "onednn/sdpa": 41.0, "onednn/explicit": 39.5},
            ("explicit", "blas"),
        ),
    ],
)
def test_decoding_gets_its_own_measured_kernel_and_library(monkeypatch, decoding, expected):
    """Training's pair (here blas, sdpa: oneDNN and explicit within the margin) is decoding's default,
    replaced only by a pair that decodes MARGIN faster."""
    if not autotune.onednn_available():
        pytest.skip("this torch build has no oneDNN")
    ran: list[str] = []
    threads = str(machine.usable_cpus())
    table = {**TRAINING_TIMES, threads: 50.0, **decoding}
    monkeypatch.setattr(kernel_timing, "race", _race_from_table(table, ran))
    shape = kernel_timing.tuning_shape(SMALL, 50, 4096, 100, "cpu")
    choice = kernel_timing.measure(Request(precision="fp32"), shape, CPU)
    assert (choice.precision, choice.attention, choice.fp32_matmul) == ("fp32", "sdpa", "blas")
    assert choice.decoding() == expected
    assert choice.timings["decoding"] == decoding
    assert set(decoding) <= set(ran)  # every pair really took its decoding steps
    described = choice.describe()
    assert ("decoding with" in described) == (expected != ("sdpa", "blas"))


def test_decoding_in_bf16_measures_the_kernel_only(monkeypatch):
    """The library serves only fp32 products: in bf16 the decoding candidates are the kernels."""
    ran: list[str] = []
    threads = str(machine.usable_cpus())
    table = {**TRAINING_TIMES, "bf16/sdpa": 30.0, "bf16/explicit": 20.0, threads: 20.0, "sdpa": 10.0, "explicit": 12.0}
    monkeypatch.setattr(kernel_timing, "race", _race_from_table(table, ran))
    monkeypatch.setattr(kernel_timing, "bf16_available", lambda device: True)
    monkeypatch.setattr(kernel_timing, "precision_candidates", lambda device_type, bf16: ["fp32", "bf16"])
    shape = kernel_timing.tuning_shape(SMALL, 50, 4096, 100, "cpu")
    choice = kernel_timing.measure(Request(), shape, CPU)
    assert (choice.precision, choice.attention) == ("bf16", "explicit")
    assert choice.timings["decoding"] == {"sdpa": 10.0, "explicit": 12.0}
    assert choice.decoding()[0] == "sdpa"  # 17% faster in decoding steps


# ---------------------------------------------------------------------------- the cache


@pytest.fixture
def counted(monkeypatch):
    """``measure`` replaced by a counter that returns a fixed choice."""
    calls = []

    def fake(request, shape, device, world_threads=None):
        calls.append(request)
        timings = {"precision/attention": {"fp32/explicit": 1.0}}
        threads = machine.usable_cpus()
        return Choice("fp32", "explicit", threads, timings, "measured", "x", decode_fp32_matmul="onednn")

    monkeypatch.setattr(autotune, "measure", fake)
    return calls


def _choose(cache: Path, request: Request | None = None, log=None) -> Choice:
    return autotune.choose(request or Request(), SMALL, 50, 4096, 100, CPU, log or (lambda m: None), cache=cache)


def test_second_run_pays_nothing(tmp_path, counted):
    first = _choose(tmp_path)
    second = _choose(tmp_path)
    assert len(counted) == 1
    assert first.source == "measured" and second.source == "cached"
    assert (second.precision, second.attention, second.threads) == ("fp32", "explicit", machine.usable_cpus())
    assert second.decoding() == ("explicit", "onednn")  # the decoding choice is cached with the rest
    assert "cached" in second.describe() and "fp32/explicit 1.0" in second.describe()


def test_cache_key_follows_the_machine_and_the_request(tmp_path, counted, monkeypatch):
    _choose(tmp_path)
    _choose(tmp_path, Request(precision="fp32"))  # another request: measured on its own
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # another (emulated) machine
    _choose(tmp_path)
    assert len(counted) == 3
    entries = json.loads((tmp_path / autotune.CACHE_FILE).read_text())["entries"]
    assert len(entries) == 3


def test_another_torch_or_another_cpu_flag_is_measured_again(tmp_path, counted, monkeypatch):
    """A measurement holds for one torch build and one instruction set: after a torch upgrade, or on a
    CPU with one flag more (not one of the few the log names), the cached choice is not served."""
    _choose(tmp_path)
    monkeypatch.setattr(torch, "__version__", "99.0.0")
    _choose(tmp_path)
    model, identity, flags = machine.cpu_model_and_flags()
    monkeypatch.setattr(machine, "cpu_model_and_flags", lambda: (model, identity, [*flags, "zz_new_flag"]))
    _choose(tmp_path)
    assert len(counted) == 3
    _choose(tmp_path)  # nothing changed since: cached
    assert len(counted) == 3


def test_a_resumed_run_keeps_the_kernels_it_started_with(tmp_path, monkeypatch):
    """A run resumed on the same machine computes in the kernels it started with, even where the
    machine's cache was cleared or a measurement on busy cores (never cached) would choose others:
    other kernels round otherwise, and the resumed run would not be the run left alone. On another
    machine it chooses again and says so."""
    picks = iter([("fp32", "sdpa", "blas"), ("bf16", "explicit", "onednn"), ("bf16", "explicit", "onednn")])

    def measure(request, shape, device, world_threads=None):
        precision, attention, library = next(picks)
        timings = {"precision/attention": {f"{precision}/{attention}": 1.0}}
        return Choice(precision, attention, 1, timings, "measured", "x", cpu_use=0.3, fp32_matmul=library)

    monkeypatch.setattr(autotune, "measure", measure)
    monkeypatch.setattr(autotune, "bf16_available", lambda device: True)
    record, lines = tmp_path / "run" / "kernels.json", []

    def choose(cache: str) -> Choice:
        log = lines.append
        return autotune.choose(Request(), SMALL, 50, 4096, 100, CPU, log, cache=tmp_path / cache, run_record=record)

    first = choose("cache-1")  # busy cores: not cached, but recorded by the run
    assert first.source == "measured" and not (tmp_path / "cache-1" / autotune.CACHE_FILE).exists()
    resumed = choose("cache-2")  # an empty cache: the machine's choice would now be measured again
    assert resumed.source == "kept" and "kept from the run's start" in resumed.describe()
    assert (resumed.precision, resumed.attention, resumed.fp32_matmul) == ("fp32", "sdpa", "blas")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # resumed on another (emulated) machine
    moved = choose("cache-2")
    assert moved.source == "measured" and (moved.precision, moved.fp32_matmul) == ("bf16", "onednn")
    assert any("holds the choice for other settings, another machine or another torch" in m for m in lines)
    again = choose("cache-3")  # resumed there once more: the new choice was recorded
    assert again.source == "kept" and again.precision == "bf16"


def test_a_reader_does_not_decode_in_a_choice_the_run_measured_on_busy_cores(tmp_path, monkeypatch):
    """A run that started while other jobs shared the cores keeps what they favoured (here one
    thread, as a Multi30k run did beside another job: then translated at half speed); the run's
    resumes keep it, but a reader of the run (nmt translate) decodes in this machine's own choice."""
    picks = iter([(1, 0.45), (2, 0.97), (1, 0.95)])

    def measure(request, shape, device, world_threads=None):
        threads, use = next(picks)
        timings = {"threads": {str(threads): 1.0}}
        return Choice("fp32", "sdpa", threads, timings, "measured", "x", cpu_use=use, fp32_matmul="blas")

    monkeypatch.setattr(autotune, "measure", measure)
    monkeypatch.setattr(autotune, "usable_cpus", lambda: 2)
    record, cache, lines = tmp_path / "run" / "kernels.json", tmp_path / "cache", []

    def choose(use: str) -> Choice:
        return autotune.choose(
            Request(), SMALL, 50, 4096, 100, CPU, lines.append, cache=cache, run_record=record, record_use=use
        )

    assert choose("start").threads == 1  # busy cores: recorded by the run, not cached
    kept_for_life = "(45% of the CPU time its threads would have had alone), and the run keeps it for its life"
    assert sum(kept_for_life in m for m in lines) == 1  # the run is told, and how to train in the machine's own
    assert lines[-1].endswith(
        "or name train.fp32_matmul, train.precision, train.attention and train.threads in the config"
    )
    assert choose("resume").source == "kept"  # the run itself computes on as it started
    assert sum(kept_for_life in m for m in lines) == 2  # and told again when it resumes
    read = choose("read")
    assert (read.source, read.threads) == ("measured", 2)
    assert any(
        "precision, attention kernel and threads were measured while other jobs shared the cores (45%" in m
        for m in lines
    )
    assert (choose("read").source, choose("read").threads) == ("cached", 2)  # the idle measurement was cached
    record.write_text(record.read_text().replace("0.45", "0.9"))  # a record measured on idle cores is the reader's
    assert (choose("read").source, choose("read").threads) == ("kept", 1)
    assert choose("resume").source == "kept" and sum("keeps it for its life" in m for m in lines) == 2


def test_a_reader_speaks_of_a_busy_measurement_only_for_what_is_still_auto(tmp_path, monkeypatch):
    """A run whose config names its precision and threads, measured on busy cores: its reader says
    (and measures again) only the attention kernel left to auto, not a busy choice of threads or
    precision the config fixed."""

    def measure(request, shape, device, world_threads=None):
        timings = {"precision/attention": {"fp32/sdpa": 1.0}}
        return Choice("fp32", "sdpa", 2, timings, "measured", "x", cpu_use=0.4, fp32_matmul="blas")

    monkeypatch.setattr(autotune, "measure", measure)
    monkeypatch.setattr(autotune, "usable_cpus", lambda: 2)
    record, lines = tmp_path / "run" / "kernels.json", []
    request = Request("fp32", "auto", 2, "blas")

    def choose(use: str) -> Choice:
        log = lines.append
        return autotune.choose(
            request, SMALL, 50, 4096, 100, CPU, log, cache=tmp_path, run_record=record, record_use=use
        )

    choose("start")
    # The run's own advice names the key still left to auto, not the ones the config already gives.
    assert lines[-1].endswith("or name train.attention in the config")
    lines.clear()
    assert choose("read").source == "measured"
    assert lines[0].startswith("auto: the run's attention kernel was measured while other jobs shared the cores (40%")
    assert lines[1].startswith("auto: measuring attention kernel on ")
    said = [line.split(" (")[0] for line in lines[:2]]  # what they name, not the CPU time's wording
    assert not any("threads" in line or "precision" in line for line in said)


def test_nothing_auto_measures_nothing(tmp_path, counted):
    choice = _choose(tmp_path, Request("fp32", "explicit", 1, "blas"))
    assert (choice.precision, choice.attention, choice.threads, choice.source) == ("fp32", "explicit", 1, "config")
    assert not counted and not (tmp_path / autotune.CACHE_FILE).exists()


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff garbage",
        b"[1, 2, 3]",
        b'{"format": "something-else", "entries": {}}',
        b'{"format": "nmt-autotune-%d", "entries": []}' % autotune.VERSION,
        b'{"format": "nmt-autotune-%d", "entr' % autotune.VERSION,  # cut short: text, but not JSON
    ],
)
def test_damaged_or_foreign_cache_is_ignored_and_rewritten(tmp_path, counted, content):
    (tmp_path / autotune.CACHE_FILE).write_bytes(content)
    assert _choose(tmp_path).source == "measured"
    assert _choose(tmp_path).source == "cached"  # rewritten, readable
    assert len(counted) == 1


def test_a_malformed_entry_is_measured_again(tmp_path, counted):
    _choose(tmp_path)
    path = tmp_path / autotune.CACHE_FILE
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry["precision"] = "fp8"  # not a precision this code knows
    path.write_text(json.dumps(data))
    assert _choose(tmp_path).source == "measured"
    assert len(counted) == 2


def test_a_choice_another_process_cached_while_this_one_measured_is_kept(tmp_path, monkeypatch):
    """Two runs measuring at once (``nmt train`` and ``nmt translate`` of another model): the one
    that ends last writes the cache as it is then, not as it was when it started measuring."""
    other = Request(precision="fp32")

    def measure(request, shape, device, world_threads=None):
        if request != other:  # while this run measures, the other caches its choice
            _choose(tmp_path, other)
        return Choice("fp32", "sdpa", 1, {"threads": {"1": 1.0}}, "measured", "x")

    monkeypatch.setattr(autotune, "measure", measure)
    _choose(tmp_path)
    entries = json.loads((tmp_path / autotune.CACHE_FILE).read_text())["entries"]
    assert len(entries) == 2
    assert _choose(tmp_path).source == _choose(tmp_path, other).source == "cached"


@pytest.mark.parametrize(
    "edit",
    [
        {"precision": "fp16"},  # a GPU's precision
        {"precision": "bf16"},  # on a CPU without bf16 kernels
        {"threads": 10**9},  # libgomp kills the process
        {"decode_fp32_matmul": "mkl"},  # not a library this code knows
    ],
)
def test_a_cached_entry_that_cannot_run_here_is_measured_again_and_rewritten(tmp_path, counted, monkeypatch, edit):
    monkeypatch.setattr(autotune, "bf16_available", lambda device: False)
    first = _choose(tmp_path)
    path = tmp_path / autotune.CACHE_FILE
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry.update(edit)
    path.write_text(json.dumps(data))
    again = _choose(tmp_path)
    assert again.source == "measured" and len(counted) == 2
    assert _choose(tmp_path).source == "cached"  # rewritten
    for entry in json.loads(path.read_text())["entries"].values():
        assert (entry["precision"], entry["threads"]) == (first.precision, first.threads)


def test_threads_the_request_names_are_cached_even_beyond_the_cpus(tmp_path, monkeypatch):
    """threads: 64 on a smaller machine is the user's choice, not an entry to measure again each run."""
    many = machine.usable_cpus() * 4

    def measure(request, shape, device, world_threads=None):
        return Choice("fp32", "sdpa", int(request.threads), {"x": {"y": 1.0}}, "measured", "x")

    monkeypatch.setattr(autotune, "measure", measure)
    assert _choose(tmp_path, Request(threads=many)).source == "measured"
    assert _choose(tmp_path, Request(threads=many)).source == "cached"


def test_an_unwritable_cache_never_stops_a_run(tmp_path, counted):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    messages = []
    choice = _choose(blocker / "cache", log=messages.append)
    assert choice.precision == "fp32"
    assert any("could not write the cache" in m for m in messages)


# ---------------------------------------------------------------------------- naming the machine

INTEL_VM = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 1
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_bf16

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: another
stepping\t: 7
flags\t\t: fpu
"""

ARM = """processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm crc32
CPU implementer\t: 0x41
CPU part\t: 0xd0c
"""


def test_cpuinfo_gives_the_first_processors_name_identity_and_flags():
    model, identity, flags = machine.parse_cpuinfo(INTEL_VM)
    assert model == "Intel(R) Xeon(R) Processor"  # not the numeric "model" field
    assert identity == "GenuineIntel family 6 model 167 stepping 1"
    assert flags == sorted(["fpu", "sse2", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"])
    assert machine.parse_cpuinfo(ARM) == ("", "", ["asimd", "crc32", "evtstrm", "fp"])
    assert machine.parse_cpuinfo("") == ("", "", [])


def test_machine_name_shows_the_identity_where_there_is_one():
    info = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_id": "GenuineIntel family 6 model 167 stepping 1"}
    info |= {"notable_flags": ["avx2", "amx_bf16"], "cpus": 2, "isa_env": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert machine.machine_name(info) == (
        "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167 stepping 1) [avx2 amx_bf16], 2 CPUs, "
        "ONEDNN_MAX_CPU_ISA=AVX2"
    )
    assert machine.machine_name(info | {"cpu_id": ""}).startswith("Intel(R) Xeon(R) Processor [avx2")


# ---------------------------------------------------------------------------- real measurements

X86 = platform.machine().lower() in ("x86_64", "amd64")


def _cpu_flags() -> set[str]:
    return set(machine.cpu_model_and_flags()[2])


HAS_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= _cpu_flags()

# An AVX2-only CPU, as far as each library that picks kernels by instruction set can be told:
# oneDNN (bf16, some fp32), ATen's own vectorised kernels, and MKL (the fp32 matrix products).
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}

# Runs in a fresh process, because oneDNN and ATen read the ISA limits once, at start-up.
PROBE = """
import json, time, torch
from nmt import kernel_timing
from nmt.kernel_choice import Request
from nmt.models.rnn import RNNConfig
from nmt.models.transformer import TransformerConfig
from nmt.device import cpu_has_bf16

def gflops(dtype, n=512, seconds=0.3):
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        calls += 1
    return 2 * n**3 * calls / (time.perf_counter() - start) / 1e9

model = TransformerConfig(d_model=256, ff_size=1024, heads=4, norm="pre")  # the Multi30k benchmark's shapes
shape = kernel_timing.tuning_shape(model, 8000, 4096, 128, "cpu")
choice = kernel_timing.measure(Request(threads=2), shape, torch.device("cpu"))
bf16 = cpu_has_bf16()
print(json.dumps({"choice": choice.to_dict(), "bf16_kernels": bf16,
                  "fp32_gflops": gflops(torch.float32), "bf16_gflops": gflops(torch.bfloat16) if bf16 else None}))
"""


def _probe(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe_until(env: dict[str, str], holds, tries: int = 3) -> dict:
    """A probe whose timings satisfy ``holds``, measured up to ``tries`` times: other jobs sharing
    the cores can slow one side of a single measurement by more than the margin under test, but
    not every one of three in a row. The last result is returned either way, for the assertions."""
    for _ in range(tries):
        result = _probe(env)
        if holds(result):
            break
    return result


def _emulated_bf16_is_slower(result: dict) -> bool:
    grid = result["choice"]["timings"]["precision/attention"]
    bf16 = min(grid["bf16/sdpa"], grid["bf16/explicit"])
    return result["bf16_gflops"] < result["fp32_gflops"] and bf16 > min(grid["fp32/sdpa"], grid["fp32/explicit"])


def _check_consistent(result: dict) -> dict:
    choice = result["choice"]
    grid = choice["timings"]["precision/attention"]
    precisions = list(dict.fromkeys(k.split("/")[0] for k in grid))
    kernels = list(dict.fromkeys(k.split("/")[1] for k in grid))
    assert (choice["precision"], choice["attention"]) == decide(grid, precisions, kernels)
    libraries = choice["timings"].get("fp32 matmul")
    assert choice["fp32_matmul"] == (pick(libraries, "blas") if libraries else "blas")
    decoding = choice["timings"]["decoding"]  # "library/kernel" in fp32, the kernel alone in bf16
    if choice["precision"] == "fp32":
        picked = pick(decoding, f"{choice['fp32_matmul']}/{choice['attention']}").split("/")
        assert [choice["decode_fp32_matmul"], choice["decode_attention"]] == picked
    else:
        assert choice["decode_attention"] == pick(decoding, choice["attention"])
    return choice


@pytest.mark.skipif(not X86, reason="ONEDNN_MAX_CPU_ISA names x86 instruction sets")
def test_avx2_only_machine_trains_in_fp32():
    """Without AVX-512 oneDNN has no bf16 kernels (a bf16 matmul crawls): bf16 is not even a candidate."""
    result = _probe(AVX2)
    choice = _check_consistent(result)
    assert not result["bf16_kernels"]
    assert choice["precision"] == "fp32"
    assert all(k.startswith("fp32/") for k in choice["timings"]["precision/attention"])


@pytest.mark.skipif(not HAS_AVX512, reason="emulating bf16 on AVX-512 needs an AVX-512 CPU")
def test_emulated_bf16_is_measured_slower_and_not_chosen():
    """AVX-512 without AVX512-BF16/AMX: torch calls bf16 supported, but it is emulated and slower."""
    result = _probe_until({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, _emulated_bf16_is_slower)
    choice = _check_consistent(result)
    assert result["bf16_kernels"]  # what the old rule looked at, and why it chose bf16 here
    assert result["bf16_gflops"] < result["fp32_gflops"]  # an independent check: bf16 really is slower here
    grid = choice["timings"]["precision/attention"]
    assert min(grid["bf16/sdpa"], grid["bf16/explicit"]) > min(grid["fp32/sdpa"], grid["fp32/explicit"])
    assert choice["precision"] == "fp32"


def test_this_machine_gets_the_faster_precision():
    """Unlimited: where bf16 matmuls run far faster than fp32 (AMX), bf16 must be chosen; where they
    run slower (emulated), fp32; either way the choice follows the measured step times. The products'
    peaks and the steps are timed apart: another job on the cores can slow one and not the other, so
    up to three probes are taken."""

    def expected(result: dict) -> str | None:
        bf16, fp32 = result["bf16_gflops"], result["fp32_gflops"]
        if bf16 is not None and bf16 > 3 * fp32:
            return "bf16"
        return "fp32" if bf16 is None or bf16 < fp32 else None

    result = _probe_until({}, lambda r: expected(r) in (None, r["choice"]["precision"]))
    choice = _check_consistent(result)
    if expected(result) is not None:
        assert choice["precision"] == expected(result)


# ---------------------------------------------------------------------------- through the commands


def test_train_logs_the_choice_and_translate_reuses_it(tmp_path, capsys, monkeypatch):
    # Cached even when other jobs share the cores (which keeps a measurement out of the cache), so
    # that a busy machine does not fail the test.
    monkeypatch.setattr(autotune, "BUSY_CPU_USE", 0.0)
    config = tiny_config(tmp_path, precision="auto", max_updates=20, validate_every=20)
    assert main(["train", "--config", str(config)]) == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "auto: precision" in log and "ms per tuning step" in log
    trained = log.split("auto: precision ")[1].split(" (")[0]  # e.g. "bf16, attention explicit, 2 threads"
    capsys.readouterr()
    assert main(["translate", "--model", str(tmp_path / "run"), "-i", str(tmp_path / "data" / "train.de")]) == 0
    err = capsys.readouterr().err
    assert f"auto: precision {trained} (kept from the run's start" in err


def test_set_overrides_the_measurement(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=2, validate_every=2, warmup_updates=1)
    sets = ["train.precision=fp32", "train.attention=explicit", "train.threads=1", "train.fp32_matmul=blas"]
    assert main(["train", "--config", str(config)] + [a for s in sets for a in ("--set", s)]) == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "kernels: precision fp32, fp32 matmul blas, attention explicit, 1 thread (from the config)" in log


LSTM = RNNConfig(d_model=32, rnn_hidden=32, encoder_layers=1, decoder_layers=1)


def test_the_lstm_has_no_attention_kernel_to_measure_or_name(tmp_path, monkeypatch):
    """The RNN's attention is its own products: auto measures no kernel for it, and neither the log
    nor the cache names one, whether measured or named by the config."""
    ran: list[str] = []
    cpus = machine.usable_cpus()
    table = {"blas": 60.0, "onednn": 59.0, "fp32": 50.0, str(max(1, cpus // 2)): 90.0, str(cpus): 50.0}
    monkeypatch.setattr(kernel_timing, "race", _race_from_table(table, ran))
    choose = autotune.choose
    measured = choose(Request("fp32"), LSTM, 50, 4096, 100, CPU, lambda m: None, cache=tmp_path)
    assert measured.attention == NO_KERNEL and "fp32/" not in " ".join(ran)
    assert "precision" in measured.timings and "precision/attention" not in measured.timings
    cached = choose(Request("fp32"), LSTM, 50, 4096, 100, CPU, lambda m: None, cache=tmp_path)
    assert cached.source == "cached"
    for choice in (measured, cached):
        assert "attention" not in choice.describe() and "sdpa" not in choice.describe()
    monkeypatch.setattr(autotune, "measure", lambda *args: pytest.fail("nothing is left to measure"))
    named = choose(Request("fp32", "auto", 1, "blas"), LSTM, 50, 4096, 100, CPU, lambda m: None, cache=tmp_path)
    assert named.describe() == "precision fp32, fp32 matmul blas, 1 thread (from the config)"


def test_an_attention_kernel_named_for_the_lstm_is_a_config_error(tmp_path, capsys):
    config = tiny_config(tmp_path, "rnn", max_updates=2, warmup_updates=1)
    for kernel in ("sdpa", "explicit"):
        assert main(["train", "--config", str(config), "--set", f"train.attention={kernel}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "config key 'train.attention'" in err and "model.type 'rnn'" in err
    assert not (tmp_path / "run").exists()  # refused before any work


def _nmt(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nmt", *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(not X86, reason="ONEDNN_MAX_CPU_ISA names x86 instruction sets")
def test_tiny_model_overfits_to_bleu_100_on_an_avx2_only_machine(tmp_path):
    config = tiny_config(tmp_path, precision="auto")
    done = _nmt(["train", "--config", str(config)], AVX2)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "auto: precision fp32" in done.stderr
    data = tmp_path / "data"
    args = ["eval-bleu", "--model", str(tmp_path / "run"), "--src", str(data / "train.de")]
    done = _nmt(args + ["--ref", str(data / "train.en"), "--json"], AVX2)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["bleu"] == pytest.approx(100.0)


@pytest.mark.skipif(not X86, reason="ONEDNN_MAX_CPU_ISA names x86 instruction sets")
def test_bf16_asked_for_where_it_cannot_run_is_a_one_line_error(tmp_path):
    config = tiny_config(tmp_path)
    done = _nmt(["train", "--config", str(config), "--set", "train.precision=bf16"], AVX2)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "train.precision': bf16 is not available on this CPU" in done.stderr
    assert not (tmp_path / "run").exists()  # refused before any work


@pytest.mark.parametrize("use, cached", [(0.5, False), (0.95, True), (None, True)])
def test_a_measurement_on_shared_cores_is_used_but_not_cached(tmp_path, monkeypatch, use, cached):
    """Taken beside another job, 1 thread can beat 2; cached, that would slow every later run."""
    calls = []

    def fake(request, shape, device, world_threads=None):
        calls.append(request)
        return Choice("fp32", "sdpa", 1, {"threads": {"2": 90.0, "1": 60.0}}, "measured", "x", use)

    monkeypatch.setattr(autotune, "measure", fake)
    messages = []
    first = _choose(tmp_path, log=messages.append)
    assert first.threads == 1  # this run goes with what it measured
    second = _choose(tmp_path)
    assert len(calls) == (1 if cached else 2)
    assert second.source == ("cached" if cached else "measured")
    assert any("not cached" in m for m in messages) != cached


def test_cpu_use_is_cpu_time_over_wall_time_and_threads():
    assert kernel_timing.cpu_use([(1.0, 2.0), (1.0, 1.8)], threads=2) == pytest.approx(0.95)
    assert kernel_timing.cpu_use([(2.0, 2.4)], threads=2) == pytest.approx(0.6)
    assert kernel_timing.cpu_use([], threads=2) == 1.0


def test_validation_decodes_with_the_decoding_choice_and_training_keeps_its_own(tmp_path, monkeypatch):
    """A run whose decoding choice differs from training's: every search step runs with decoding's
    kernel and library, every training forward pass (before and after each validation) with training's."""
    from nmt.config import DecodeConfig
    from nmt.models.transformer import Transformer
    from nmt.rundir import RunDir
    from nmt.translate import load_translator

    if not autotune.onednn_available():
        pytest.skip("this torch build has no oneDNN")
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))  # the faked choice stays out of the session cache

    def fake(request, shape, device, world_threads=None):
        timings = {"decoding": {"blas/sdpa": 2.0, "onednn/explicit": 1.0}}
        return Choice("fp32", "sdpa", 1, timings, "measured", "x", None, "blas", "explicit", "onednn")

    monkeypatch.setattr(autotune, "measure", fake)
    seen: dict[str, set] = {"decode": set(), "train": set()}

    def kernels(model: Transformer) -> tuple[str, str]:
        layer = model.decoder[0]
        return layer.self_attn.kernel, layer.ff.up.fp32_matmul

    def recorded(name: str, method):
        def wrapper(self, *args, **kwargs):
            seen[name].add((kernels(self), self.training))
            return method(self, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(Transformer, "decode_step", recorded("decode", Transformer.decode_step))
    monkeypatch.setattr(Transformer, "decode_features", recorded("train", Transformer.decode_features))
    config = tiny_config(tmp_path, precision="auto", max_updates=4, validate_every=2, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    assert seen["decode"] == {(("explicit", "onednn"), False)}
    training = {k for k, is_training in seen["train"] if is_training}
    assert training == {("sdpa", "blas")}
    log = (tmp_path / "run" / "train.log").read_text()
    assert "decoding with attention explicit, fp32 matmul onednn" in log
    seen["decode"].clear()  # nmt translate: the same choice, from the cache
    load_translator(RunDir(tmp_path / "run"), "cpu").translate(["ein kleiner test"], DecodeConfig())
    assert seen["decode"] == {(("explicit", "onednn"), False)}


def test_translate_decodes_in_the_runs_own_choice_and_never_writes_its_record(tmp_path, monkeypatch):
    """nmt translate of a run takes its choice from RUN_DIR/kernels.json, as validation decoded, where
    the machine's cache no longer holds it (cleared, or since replaced) instead of measuring another.
    (One the run measured on busy cores it does not take: test_a_reader_does_not_decode_in_...)"""
    import shutil

    from nmt.rundir import RunDir
    from nmt.translate import load_translator

    picks = iter(["explicit", "sdpa"])

    def measure(request, shape, device, world_threads=None):
        attention = next(picks)
        timings = {"attention": {attention: 1.0}}
        return Choice("fp32", attention, 1, timings, "measured", "x", 0.9, "blas")

    monkeypatch.setattr(autotune, "measure", measure)
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))
    config = tiny_config(tmp_path, max_updates=4, validate_every=4, warmup_updates=2, attention="auto")
    assert main(["train", "--config", str(config)]) == 0
    shutil.rmtree(tmp_path / "cache")
    record = tmp_path / "run" / "kernels.json"
    written = record.read_bytes()
    translator = load_translator(RunDir(tmp_path / "run"), "cpu")
    assert translator.kernels == ("explicit", "blas")
    assert record.read_bytes() == written
