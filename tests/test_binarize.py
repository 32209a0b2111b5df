"""Binarized, memory-mapped training data: exact ids, full coverage, safe interrupted preparation."""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np
import pytest
from conftest import PAIRS, cache_hub_dataset, child_pids, running, tiny_config, write_corpus

from nmt import binarize as bz
from nmt import shards, signals, testhooks
from nmt.batching import token_batches
from nmt.config import Config, load_config
from nmt.corpus import clean_pairs, filter_by_length, iter_parallel
from nmt.errors import NMTError
from nmt.machine import usable_cpus
from nmt.prepare import prepare
from nmt.rundir import RunDir
from nmt.tokenizer import Tokenizer

WORDS = "der die das hund katze haus sieht läuft schnell klein groß alt neu ein eine kind".split()


def _random_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        src = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
        trg = " ".join(rng.choice(WORDS[::-1]) for _ in range(rng.randint(1, 12)))
        if i % 97 == 5:
            src = "   "  # dropped by cleaning
        if i % 101 == 7:
            trg = " ".join(["lang"] * 60)  # dropped by the length filter
        pairs.append((src, trg))
    return pairs


def _config(tmp_path: Path, n_pairs: int, **data):
    path = tiny_config(tmp_path)
    write_corpus(tmp_path / "data", "train", _random_pairs(n_pairs))
    sets = [f"data.{k}={v}" for k, v in {"shard_pairs": 100, "max_len": 40, **data}.items()]
    return load_config(path, sets)


def _direct_encoding(cfg, tok: Tokenizer):
    """What encoding the whole corpus at once, with the same cleaning and filter, gives."""
    src, trg = [], []
    for s, t in iter_parallel(cfg.data.train, "de", "en", 10**9):
        src += s
        trg += t
    src, trg, _ = clean_pairs(src, trg)
    src_ids, trg_ids = tok.encode(src), tok.encode(trg)
    keep, _ = filter_by_length([len(s) for s in src_ids], [len(t) for t in trg_ids], cfg.data.max_len, 3.0)
    return [src_ids[i] for i in keep], [trg_ids[i] for i in keep]


@pytest.mark.parametrize("workers", [1, 2])
def test_memory_mapped_ids_equal_direct_encoding(tmp_path, workers):
    cfg = _config(tmp_path, 950, workers=workers)
    lines = []
    data = prepare(cfg, RunDir(cfg.run_dir), lines.append)
    corpus = data.train
    src_ids, trg_ids = _direct_encoding(cfg, data.src_tok)
    assert len(corpus) == len(src_ids) and len(src_ids) < 950  # both filters dropped something
    got_src, got_trg = corpus.pairs(range(len(corpus)))
    assert [s.tolist() for s in got_src] == src_ids
    assert [t.tolist() for t in got_trg] == trg_ids
    assert corpus.src_lens.tolist() == [len(s) for s in src_ids]
    # Random access across shard boundaries, in any order.
    rows = [len(corpus) - 1, 0, 99, 100, 101, 555]
    assert [s.tolist() for s in corpus.pairs(rows)[0]] == [src_ids[i] for i in rows]
    directory = RunDir(cfg.run_dir).train_data_dir
    index = json.loads((directory / shards.INDEX).read_text())
    assert len(index["shards"]) == 10 and index["dtype"] == "uint16"
    # The shards are plain .npy files: a memory map of one holds its pairs' ids back to back.
    kept = json.loads((directory / "shard-00000.json").read_text())["kept"]
    mapped = np.load(directory / "shard-00000.trg.npy", mmap_mode="r")
    assert mapped.dtype == np.uint16 and mapped.tolist() == [t for ids in trg_ids[:kept] for t in ids]
    assert any("10 shards" in line for line in lines)


def test_batches_cover_every_pair_once_within_budget(tmp_path):
    cfg = _config(tmp_path, 700)
    corpus = prepare(cfg, RunDir(cfg.run_dir), lambda m: None).train
    for epoch in (1, 2):
        plan = token_batches(corpus.src_lens, corpus.trg_lens, 200, seed=5, epoch=epoch)
        flat = np.concatenate(list(plan))
        assert sorted(flat.tolist()) == list(range(len(corpus)))
        for rows in plan:
            src, trg = corpus.pairs(rows)
            longest = max(max(len(s), len(t)) + 1 for s, t in zip(src, trg))
            assert len(rows) == 1 or len(rows) * longest <= 200


def test_second_preparation_reuses_the_shards(tmp_path):
    cfg = _config(tmp_path, 300)
    prepare(cfg, RunDir(cfg.run_dir), lambda m: None)
    lines = []
    prepare(cfg, RunDir(cfg.run_dir), lines.append)
    assert any("reusing" in line for line in lines)
    # Changing the filter changes the fingerprint: the shards are rebuilt, not reused.
    lines.clear()
    prepare(replace(cfg, data=replace(cfg.data, max_len=20)), RunDir(cfg.run_dir), lines.append)
    assert not any("reusing" in line for line in lines)
    assert (
        f"train: the shards in {RunDir(cfg.run_dir).train_data_dir} were made from other data or settings"
        in "\n".join(lines)
    )


@pytest.mark.parametrize("layout", ["data_files", "save_to_disk"])
def test_a_changed_local_dataset_directory_is_encoded_again(tmp_path, monkeypatch, layout):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    dataset = tmp_path / "ds"

    def write(pairs):
        if layout == "save_to_disk":
            columns = {"de": [s for s, _ in pairs], "en": [t for _, t in pairs]}
            datasets.Dataset.from_dict(columns).save_to_disk(str(dataset))
        else:  # one level down: the directory's files are found recursively
            (dataset / "data").mkdir(parents=True, exist_ok=True)
            rows = "".join(json.dumps({"de": s, "en": t}) + "\n" for s, t in pairs)
            (dataset / "data" / "train.jsonl").write_text(rows, encoding="utf-8")

    write(PAIRS)
    cfg = load_config(tiny_config(tmp_path), [f"data.train={dataset}"])
    run = RunDir(cfg.run_dir)
    assert len(prepare(cfg, run, lambda m: None).train) == 8
    lines = []
    assert len(prepare(cfg, run, lines.append).train) == 8
    assert any("reusing 8 encoded pairs" in line for line in lines)  # unchanged: reused
    write(PAIRS[:5])
    lines.clear()
    assert len(prepare(cfg, run, lines.append).train) == 5
    assert not any("reusing" in line for line in lines)


def test_interrupted_preparation_is_detected_and_resumed(tmp_path, monkeypatch):
    cfg = _config(tmp_path, 640, workers=1)
    run_dir = Path(cfg.run_dir)
    directory = RunDir(run_dir).train_data_dir
    real_save = bz._save_npy

    def crash_in_shard_3(path, array):
        if path.name.startswith("shard-00003.trg"):
            # Die in the middle of the shard: one array renamed into place, the next one half-written.
            path.with_name(f".{path.name}.tmp99").write_bytes(b"\x93NUMPY half")
            raise KeyboardInterrupt
        real_save(path, array)

    monkeypatch.setattr(bz, "_save_npy", crash_in_shard_3)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, RunDir(run_dir), lambda m: None)
    assert not (directory / shards.INDEX).exists()
    assert (directory / "shard-00003.src.npy").exists() and not (directory / "shard-00003.json").exists()
    with pytest.raises(NMTError, match="not a finished data preparation"):
        shards.ShardedCorpus(directory)

    monkeypatch.setattr(bz, "_save_npy", real_save)
    calls = []
    real_encode = bz.encode_shard
    monkeypatch.setattr(bz, "encode_shard", lambda spec, i, *a: calls.append(i) or real_encode(spec, i, *a))
    lines = []
    resumed = prepare(cfg, RunDir(run_dir), lines.append).train
    assert any("3 complete shards kept" in line for line in lines)
    assert calls == [3, 4, 5, 6]  # shards 0-2 were complete and are not encoded again
    # The speed logged counts the 4 shards' 340 pairs encoded now, not the 640 of the corpus.
    said = next(line for line in lines if "pairs/s" in line)
    assert "7 shards (3 kept from the interrupted preparation; 340 pairs encoded now)" in said
    seconds = json.loads((directory / shards.INDEX).read_text())["seconds"]
    assert f"({340 / seconds:.0f} pairs/s)" in said
    assert not any(p.name.startswith(".") for p in directory.iterdir())  # torn temporaries removed
    fresh_cfg = replace(cfg, run_dir=str(tmp_path / "fresh"))
    fresh = prepare(fresh_cfg, RunDir(fresh_cfg.run_dir), lambda m: None).train
    rows = range(len(fresh))
    assert len(resumed) == len(fresh)
    assert [s.tolist() for s in resumed.pairs(rows)[1]] == [s.tolist() for s in fresh.pairs(rows)[1]]


def test_binarize_resumes_only_unfinished_shards(tmp_path):
    cfg = _config(tmp_path, 450, workers=1)
    run_dir = Path(cfg.run_dir)
    prepare(cfg, RunDir(run_dir), lambda m: None)
    directory = RunDir(run_dir).train_data_dir
    (directory / shards.INDEX).unlink()
    (directory / "shard-00002.json").unlink()  # as if killed after shard 2's arrays, before its metadata
    calls = []
    spec_index = json.loads((directory / "shard-00000.json").read_text())["fingerprint"]
    tok = str(run_dir / "spm.model")
    spec = bz.ShardSpec(str(directory), tok, tok, cfg.data.max_len, 3.0, "uint16", spec_index)
    chunks = iter_parallel(cfg.data.train, "de", "en", cfg.data.shard_pairs)
    bz.binarize(chunks, spec, 1, lambda m: None, encode=lambda s, i, *a: calls.append(i) or bz.encode_shard(s, i, *a))
    assert calls == [2]
    assert len(shards.ShardedCorpus(directory)) > 0


def test_truncated_shard_is_refused_with_its_name(tmp_path):
    cfg = _config(tmp_path, 250)
    prepare(cfg, RunDir(cfg.run_dir), lambda m: None)
    victim = RunDir(cfg.run_dir).train_data_dir / "shard-00001.trg.npy"
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(NMTError) as err:
        shards.ShardedCorpus(victim.parent)
    assert str(victim) in str(err.value) and "truncated" in str(err.value)


def test_the_run_writer_encodes_damaged_shards_again(tmp_path):
    cfg = _config(tmp_path, 250)
    run = RunDir(cfg.run_dir)
    first = prepare(cfg, run, lambda m: None).train
    expected = first.pairs(range(len(first)))
    first.close()
    victim = run.train_data_dir / "shard-00001.trg.npy"
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(NMTError, match="truncated.*; delete .* and prepare again"):  # a reader may not touch them
        prepare(cfg, run, lambda m: None)
    logged = []
    run.lock(logged.append)
    try:
        again = prepare(cfg, run, logged.append).train
        assert any("truncated" in m and "encoding the training data again" in m for m in logged)
        got = again.pairs(range(len(again)))
        assert all(np.array_equal(a, b) for side in (0, 1) for a, b in zip(got[side], expected[side], strict=True))
        again.close()
    finally:
        run.close()


def _edit_json(path: Path, edit) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


# What a hand, a disk or a copy can do to the records the reader trusts, and the file it must name.
RECORD_DAMAGE = {
    "shard record deleted": ("shard-00001.json", lambda p: p.unlink()),
    "shard record cut short": ("shard-00001.json", lambda p: p.write_text(p.read_text()[:20])),
    "shard record a list": ("shard-00001.json", lambda p: p.write_text("[]")),
    "shard sizes removed": ("shard-00001.json", lambda p: _edit_json(p, lambda m: {**m, "bytes": None})),
    "shard count edited": ("shard-00001.json", lambda p: _edit_json(p, lambda m: {**m, "kept": m["kept"] - 1})),
    "shard of another preparation": ("shard-00001.json", lambda p: _edit_json(p, lambda m: {**m, "fingerprint": "x"})),
    "a shard left out of the index": (
        "index.json",
        lambda p: _edit_json(p, lambda m: {**m, "shards": m["shards"][:-1]}),
    ),
    "index without shards": (
        "index.json",
        lambda p: _edit_json(p, lambda m: {k: v for k, v in m.items() if k != "shards"}),
    ),
    "index a list": ("", lambda p: (p / "index.json").write_text("[]")),
}


@pytest.mark.parametrize("damage", RECORD_DAMAGE)
def test_a_damaged_shard_record_or_index_is_one_line_naming_it_and_the_writer_encodes_again(tmp_path, damage):
    """A traceback (FileNotFoundError, JSONDecodeError, KeyError, AttributeError) before, or with the
    index's shard list shortened, a run trained on fewer pairs than were prepared, saying nothing."""
    cfg = _config(tmp_path, 350)
    run = RunDir(cfg.run_dir)
    first = prepare(cfg, run, lambda m: None).train
    expected = first.pairs(range(len(first)))
    first.close()
    name, do = RECORD_DAMAGE[damage]
    victim = run.train_data_dir / name
    do(victim)
    with pytest.raises(NMTError) as err:
        shards.ShardedCorpus(run.train_data_dir)
    assert str(victim) in str(err.value) and "\n" not in str(err.value)
    run.lock(lambda m: None)
    try:
        again = prepare(cfg, run, lambda m: None).train
        got = again.pairs(range(len(again)))
        assert all(np.array_equal(a, b) for side in (0, 1) for a, b in zip(got[side], expected[side], strict=True))
        again.close()
    finally:
        run.close()


def _foreign_files(directory: Path) -> dict[Path, bytes]:
    """Files the shard writer did not make, some with names like its own, and another run nested there."""
    foreign = {
        directory / "notes.txt": b"mine",
        directory / "shard-notes.json": b"{}",
        directory / ".notes.tmp1": b"a temporary of another program",
        directory / "other-run" / "config.yaml": b"run_dir: .",
        directory / "other-run" / "checkpoints" / "update_5.pt": b"weights",
    }
    for path, data in foreign.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return foreign


@pytest.mark.parametrize("change", ["damaged shard", "other fingerprint"])
def test_encoding_again_deletes_only_the_files_the_shard_writer_made(tmp_path, change):
    cfg = _config(tmp_path, 250)
    run = RunDir(cfg.run_dir)
    prepare(cfg, run, lambda m: None).train.close()
    foreign = _foreign_files(run.train_data_dir)
    if change == "damaged shard":
        victim = run.train_data_dir / "shard-00001.trg.npy"
        victim.write_bytes(victim.read_bytes()[:-10])
    else:
        cfg = _config(tmp_path, 250, max_len=30)
    run.lock(lambda m: None)
    try:
        again = prepare(cfg, run, lambda m: None).train
        assert len(again) > 0
        again.close()
    finally:
        run.close()
    assert {path: path.read_bytes() for path in foreign} == foreign


def test_id_dtype_is_the_smallest_that_holds_the_vocabulary():
    assert bz.id_dtype(8000) == np.uint16
    assert bz.id_dtype(65536) == np.uint16
    assert bz.id_dtype(65537) == np.int32


def test_empty_training_corpus_is_one_line_error(tmp_path):
    cfg = _config(tmp_path, 10)
    write_corpus(tmp_path / "data", "train", [(" ", "x"), ("y", "")])
    with pytest.raises(NMTError, match="empty after cleaning"):
        prepare(cfg, RunDir(cfg.run_dir), lambda m: None)


def test_a_side_the_tokenizer_encodes_to_nothing_is_dropped_and_counted_as_empty(tmp_path):
    """Zero-width or control characters only survive str.strip(); SentencePiece's normalization then
    removes them all, which left a pair with no subword on one side to train on."""
    cfg = _config(tmp_path, 10)
    invisible = [("\u200b", "the dog sleeps"), ("der hund schläft", "\x01\x02"), ("\ufeff", "\u200b")]
    write_corpus(tmp_path / "data", "train", PAIRS + invisible)
    lines: list[str] = []
    corpus = prepare(cfg, RunDir(cfg.run_dir), lines.append).train
    assert any(f"train: read {len(PAIRS) + 3} pairs, dropped 3 empty," in line for line in lines), lines
    assert len(corpus) == len(PAIRS)
    assert min(corpus.src_lens.tolist() + corpus.trg_lens.tolist()) > 0
    corpus.close()


def test_a_dev_set_with_a_side_encoded_to_nothing_in_every_pair_is_one_line_error(tmp_path):
    """Such a dev set passed cleaning, and the run validated on it to the end: dev BLEU 0 and a dev
    loss on EOS alone at every validation. A dev set with some such pairs is kept as it is."""
    cfg = _config(tmp_path, 10)
    dev = write_corpus(tmp_path / "data", "dev", [("\u200b", "the dog sleeps"), ("der hund schläft", "\x01\x02")])
    cfg = replace(cfg, data=replace(cfg.data, dev=replace(cfg.data.dev, path=str(dev))))
    with pytest.raises(NMTError, match=rf"^config key 'data.dev': the corpus '{dev}' is empty after cleaning: every"):
        prepare(cfg, RunDir(cfg.run_dir), lambda m: None)
    write_corpus(tmp_path / "data", "dev", [("\u200b", "the dog sleeps"), ("der hund schläft", "the dog sleeps")])
    prepared = prepare(cfg, RunDir(cfg.run_dir), lambda m: None)
    assert len(prepared.dev) == 2
    prepared.train.close()


@pytest.mark.parametrize(
    "data,key,counts",
    [
        ({"max_len_ratio": 1.5}, "data.max_len_ratio", r"\(4 over data.max_len_ratio 1.5\)"),
        ({"max_len": 3}, "data.max_len", r"\(4 over data.max_len 3 subwords\)"),
    ],
)
def test_every_pair_filtered_names_the_key_that_dropped_them(tmp_path, data, key, counts):
    path = tiny_config(tmp_path)
    write_corpus(tmp_path / "data", "train", [("hund", "the dog sees the cat today")] * 4)
    cfg = load_config(path, ["tokenizer.vocab_size=20", *(f"data.{k}={v}" for k, v in data.items())])
    with pytest.raises(NMTError, match=f"^config key '{key}': every training pair was dropped .*{counts}"):
        prepare(cfg, RunDir(cfg.run_dir), lambda m: None)


def test_nmt_prepare_then_train_reuses_the_shards(tmp_path, capsys):
    from nmt.cli import main

    config = tiny_config(tmp_path, max_updates=3, validate_every=3, warmup_updates=1)
    assert main(["prepare", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "prepared 8 training pairs" in err and (tmp_path / "run" / "data" / "train" / shards.INDEX).exists()
    assert main(["train", "--config", str(config)]) == 0
    assert "train: reusing 8 encoded pairs in 1 shards" in capsys.readouterr().err


def test_reusing_prepared_shards_does_not_read_the_training_corpus(tmp_path, monkeypatch):
    import nmt.prepare

    cfg = _config(tmp_path, 300)
    prepare(cfg, RunDir(cfg.run_dir), lambda m: None)

    def no_reading(*args, **kwargs):
        raise AssertionError("the training corpus was read again")

    monkeypatch.setattr(nmt.prepare, "iter_parallel", no_reading)
    lines = []
    assert len(prepare(cfg, RunDir(cfg.run_dir), lines.append).train) > 0
    assert any("reusing" in line for line in lines)


def test_a_shard_damaged_in_place_is_a_one_line_error_not_an_index_error(tmp_path, capsys):
    from nmt.cli import main

    config = tiny_config(tmp_path, max_updates=3, validate_every=3, warmup_updates=1)
    assert main(["prepare", "--config", str(config)]) == 0
    victim = tmp_path / "run" / "data" / "train" / "shard-00000.trg.npy"
    data = victim.read_bytes()
    victim.write_bytes(data[:-20] + b"\xff" * 20)  # the same size: only the ids tell
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "a training shard holds token id" in err and "the shard is damaged" in err and "IndexError" not in err


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes of a file fail with EFBIG, as a disk that fills up mid-write fails
    with ENOSPC: the kernel takes part of a write and refuses the rest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal that kills
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_shard_the_disk_takes_only_in_part_is_one_line_naming_the_file_and_why(tmp_path, monkeypatch, capsys):
    """numpy's own write said "N requested and M written": neither the reason nor the file."""
    from nmt.cli import main

    real_save = bz._save_npy

    def on_a_small_disk(path: Path, array: np.ndarray) -> None:
        with file_size_limit(1024):
            real_save(path, array)

    monkeypatch.setattr(bz, "_save_npy", on_a_small_disk)
    config = tiny_config(tmp_path)
    write_corpus(tmp_path / "data", "train", _random_pairs(400))
    assert main(["prepare", "--config", str(config), "--set", "data.workers=1"]) == 2
    shard = tmp_path / "run" / "data" / "train" / "shard-00000.src.npy"
    err = capsys.readouterr().err.splitlines()
    reason = os.strerror(errno.EFBIG)  # "File too large"
    assert err[-1] == f"nmt prepare: error: {shard}: cannot write the encoded training data ({reason})"
    assert not any(path.name.startswith(".") for path in shard.parent.iterdir())  # no temporary left


def test_a_shard_is_written_as_numpy_saves_it(tmp_path):
    for array in (np.arange(300, dtype=np.uint16), np.zeros(0, np.int32), np.arange(12).reshape(2, 6)[:, ::2]):
        bz._save_npy(tmp_path / "a.npy", array)
        np.save(tmp_path / "b.npy", array, allow_pickle=False)
        assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_the_process_group_while_workers_encode_stops_cleanly(tmp_path, capsys, signum, code):
    """Ctrl-C reaches every process of the terminal's group, and so may SIGTERM: the command says it
    was interrupted, with no worker's traceback and no wait for a result that never comes; the next
    run keeps the finished shards."""
    from nmt.cli import main

    proc, argv, held = _prepare_holding_shard_0(tmp_path)
    os.killpg(proc.pid, signum)
    err = _finished(proc)
    assert proc.returncode == code, err
    assert "nmt prepare: interrupted; run it again to go on: it keeps the shards it finished" in err, err
    assert "Traceback" not in err, err
    assert main(argv) == 0
    assert "3 complete shards kept" in capsys.readouterr().err
    assert len(shards.ShardedCorpus(tmp_path / "run" / "data" / "train")) > 0


def test_a_worker_killed_from_outside_ends_the_preparation_with_an_error_not_a_wait(tmp_path, capsys):
    """The pool replaces a worker the out-of-memory killer took, and its task is lost: waiting for
    that shard would never end."""
    from nmt.cli import main

    proc, argv, held = _prepare_holding_shard_0(tmp_path)
    os.kill(int(held.read_text()), signal.SIGKILL)
    err = _finished(proc)
    assert proc.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert "a worker encoding the training data died (killed by SIGKILL" in last and "data.workers" in last
    assert "Traceback" not in err
    assert main(argv) == 0
    assert "3 complete shards kept" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent's death signal is Linux's")
def test_workers_end_with_a_preparation_killed_by_sigkill(tmp_path):
    """A kill -9 of nmt prepare (or of nmt train as it prepares) gives it no time to end its pool,
    and its workers, out of its process group, went on encoding for nobody."""
    proc, argv, held = _prepare_holding_shard_0(tmp_path)
    workers = [pid for pid in child_pids(proc.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
    try:
        assert len(workers) == 2 and int(held.read_text()) in workers, workers
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while any(running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(running(pid) for pid in workers)
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def test_a_worker_whose_parent_is_gone_before_it_asks_ends_at_once(monkeypatch):
    """The kernel's signal at the parent's death is not sent for a parent that died before the request."""
    sent = []
    monkeypatch.setattr(signals, "_ask_for_signal_at_parent_death", lambda signum: True)
    monkeypatch.setattr(os, "getppid", lambda: 1)  # reparented to init
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append(signum))
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)
    monkeypatch.setattr(os, "setpgid", lambda pid, group: None, raising=False)
    bz._worker_init(4321)
    assert sent == [signal.SIGKILL]


def _prepare_holding_shard_0(tmp_path: Path) -> tuple[subprocess.Popen, list[str], Path]:
    """``nmt prepare`` with two workers, in a session of its own, once one worker holds shard 0
    for ever (its pid in the returned file) and the other, done with shards 1-3, waits for a task."""
    config = tiny_config(tmp_path)
    write_corpus(tmp_path / "data", "train", _random_pairs(600))
    argv = ["prepare", "--config", str(config)]
    for option in ("data.workers=2", "data.shard_pairs=100", "data.max_len=40"):
        argv += ["--set", option]
    held = tmp_path / "held"
    env = {**os.environ, testhooks.HOLD_SHARD: f"0:{held}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    directory = tmp_path / "run" / "data" / "train"
    done = [directory / f"{bz._shard_name(i)}.json" for i in (1, 2, 3)]
    deadline = time.monotonic() + 120
    while not (held.exists() and held.read_text() and all(p.exists() for p in done)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the workers never reached shard 3"
        time.sleep(0.05)
    return proc, argv, held


def _finished(proc: subprocess.Popen) -> str:
    """``proc``'s stderr once it ends, which must be within a minute."""
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("still running 60 s later") from None


class _SlowToSend:
    """A task argument that takes a second to pickle, then is more than a pipe holds: the pool's task
    thread is still pickling it as the pool is stopped, and writes it after the pipe was last read."""

    def __reduce__(self):
        time.sleep(1.0)
        return bytes, (bytes(1 << 20),)


def test_stopping_the_pool_while_a_large_chunk_is_on_its_way_to_the_workers_does_not_hang():
    """Ctrl-C while 100,000-pair chunks (megabytes each) go to busy workers: the pool's own terminate()
    empties their pipe once, then waits for ever on a task thread that wrote one more chunk into it."""
    pool = bz._Pool(
        1, initializer=bz._worker_init, initargs=(os.getpid(),), context=multiprocessing.get_context("spawn")
    )
    pool.apply_async(time.sleep, (60,))  # the worker is busy encoding
    pool.apply_async(len, (_SlowToSend(),))
    time.sleep(0.3)  # the pool's task thread is pickling the next chunk
    stopping = threading.Thread(target=bz._shut_down, args=(pool,), daemon=True)
    stopping.start()
    stopping.join(20)
    assert not stopping.is_alive(), "the pool never stopped"


def test_waiting_for_a_shard_lets_a_signal_another_thread_took_interrupt_it():
    """A signal to the process may land on any thread not blocking it; Python then only sets a flag
    that the main thread reads when it runs, which a wait without end never does."""
    release = threading.Event()

    def signal_then_release():
        time.sleep(0.5)  # the main thread is waiting by then
        os.kill(os.getpid(), signal.SIGINT)
        release.wait(10)  # a wait that missed the signal ends here, too late
        release.set()

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # the kernel picks another thread
    try:
        with ThreadPool(1) as pool:
            result = pool.apply_async(release.wait)
            threading.Thread(target=signal_then_release, daemon=True).start()
            start = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                bz._result(result)
            release.set()
            assert time.monotonic() - start < 5
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def test_more_workers_than_cpus_start_one_process_per_cpu(tmp_path):
    cpus = usable_cpus()
    cfg = _config(tmp_path, 450, workers=cpus + 3)
    lines = []
    prepare(cfg, RunDir(cfg.run_dir), lines.append)
    index = json.loads((RunDir(cfg.run_dir).train_data_dir / shards.INDEX).read_text())
    assert index["workers"] == cpus  # a pool of one per CPU (none on one CPU)
    assert any(f"data.workers {cpus + 3} is more than the {cpus} CPU" in line for line in lines)


def test_workers_are_bounded_by_the_cpus_this_process_may_use(tmp_path, monkeypatch):
    # Under taskset, or in a container's cpuset, the process may run on fewer CPUs than the machine has.
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    cfg = _config(tmp_path, 450, workers=3)
    lines = []
    prepare(cfg, RunDir(cfg.run_dir), lines.append)
    index = json.loads((RunDir(cfg.run_dir).train_data_dir / shards.INDEX).read_text())
    assert index["workers"] == 1
    assert "train: data.workers 3 is more than the 1 CPU this process may use: one process per CPU" in lines


def _offline(monkeypatch, cache: Path) -> None:
    """No network, as HF_HUB_OFFLINE=1 gives (both libraries read it at import: set their flags)."""
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _hub_run(tmp_path, monkeypatch) -> tuple[Path, Path, Config, RunDir]:
    """Offline, commit a*40 of hub dataset someorg/corpus42 in the cache (and its path there), and a
    run training on it, locked as its writer (which may train SentencePiece again)."""
    cache = tmp_path / "cache"
    _offline(monkeypatch, cache)
    first = cache_hub_dataset(cache, "someorg/corpus42", "a" * 40, PAIRS)
    cfg = load_config(tiny_config(tmp_path), ["data.train=someorg/corpus42"])
    run = RunDir(cfg.run_dir)
    Path(cfg.run_dir).mkdir()
    run.lock(lambda m: None, "prepare")
    return cache, first, cfg, run


def test_a_new_commit_of_a_hub_dataset_is_encoded_again(tmp_path, monkeypatch):
    # Offline, load_dataset reads the latest commit in its cache: one downloaded since is new text.
    cache, first, cfg, run = _hub_run(tmp_path, monkeypatch)
    lines = []
    assert len(prepare(cfg, run, lines.append).train) == 8
    assert f"train: hub dataset 'someorg/corpus42' at commit {'a' * 40}" in lines
    lines.clear()
    assert len(prepare(cfg, run, lines.append).train) == 8
    assert any("reusing 8 encoded pairs" in line for line in lines)  # the same commit: reused
    os.utime(first, (1, 1))  # older than the next one
    cache_hub_dataset(cache, "someorg/corpus42", "b" * 40, PAIRS[:5])
    lines.clear()
    assert len(prepare(cfg, run, lines.append).train) == 5
    assert not any("reusing" in line for line in lines)
    assert any(f"data.train.revision: '{'a' * 40}' -> '{'b' * 40}'" in line for line in lines)  # SentencePiece too
    run.close()


def test_a_resumed_run_keeps_the_hub_commit_its_data_was_made_from(tmp_path, monkeypatch):
    # Resumed after a new commit reached the Hub, and then with no copy of the dataset at all
    # (offline, cache emptied), the run trains on the text it started with, asking nothing.
    cache, first, cfg, run = _hub_run(tmp_path, monkeypatch)
    assert len(prepare(cfg, run, lambda m: None).train) == 8
    monkeypatch.setattr(RunDir, "has_checkpoints", lambda self: True)
    os.utime(first, (1, 1))
    cache_hub_dataset(cache, "someorg/corpus42", "b" * 40, PAIRS[:5])
    for _ in range(2):
        lines = []
        assert len(prepare(cfg, run, lines.append).train) == 8
        assert (
            f"train: hub dataset 'someorg/corpus42' at commit {'a' * 40}, the one this run's data was made from"
            in lines
        )
        assert any("reusing 8 encoded pairs" in line for line in lines)
        shutil.rmtree(cache, ignore_errors=True)
    # Another revision asked on resume is looked up, not taken from the pin.
    with pytest.raises(NMTError, match=r"revision .v2.\): could not be downloaded; the machine seems offline"):
        prepare(
            load_config(tiny_config(tmp_path), ["data.train=someorg/corpus42", "data.train.revision=v2"]), run, print
        )
    run.close()
