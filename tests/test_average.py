"""Checkpoint averaging: the mean of the last N checkpoints, kept in the run's checkpoint format,
used by translation where its dev BLEU beats the best single checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from conftest import tiny_config

from nmt import checkpoint, checkpoint_file
from nmt.average import average_weights
from nmt.cli import main
from nmt.config import config_from_dict
from nmt.errors import NMTError
from nmt.runlock import RunLock


def test_average_weights_is_the_elementwise_mean():
    a = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "steps": torch.tensor(4)}
    c = {"w": torch.tensor([2.0, 1.0]), "steps": torch.tensor(5)}
    out = average_weights([a, b, c])
    assert torch.equal(out["w"], torch.tensor([2.0, 3.0])) and out["steps"].item() == 5
    bf16 = average_weights([{"w": torch.tensor([1.0], dtype=torch.bfloat16)}, {"w": torch.tensor([2.0])}])
    assert bf16["w"].dtype == torch.float32  # the last state's dtype
    with pytest.raises(NMTError, match="different parameters"):
        average_weights([a, {"v": torch.tensor([1.0])}])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("average")
    config = tiny_config(tmp, max_updates=40, validate_every=10, keep_last=3, average_last=3, lr_peak=0.003)
    assert main(["train", "--config", str(config)]) == 0
    return tmp


def test_training_ends_with_the_average_of_its_last_checkpoints(run):
    directory = run / "run" / "checkpoints"
    index = json.loads((directory / "index.json").read_text())
    assert index["average"]["updates"] == [20, 30, 40] and index["average"]["file"] == "average_last_3.pt"
    averaged = checkpoint_file.load(directory / "average_last_3.pt")  # checksummed, weights only
    states = [checkpoint_file.load(directory / f"update_{u:08d}.pt")["model"] for u in (20, 30, 40)]
    for name, tensor in averaged["model"].items():
        expected = (states[0][name].double() + states[1][name].double() + states[2][name].double()) / 3
        torch.testing.assert_close(tensor, expected.to(tensor.dtype), rtol=0, atol=1e-6, msg=name)
    records = [json.loads(line) for line in (run / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records].count("average") == 1


@pytest.mark.parametrize("average_wins", [True, False])
def test_compare_shows_the_average_training_made_and_which_one_auto_takes(run, tmp_path, capsys, average_wins):
    # 'nmt compare' left the "average" record out: its table said nothing of the model auto decodes test with
    copied = tmp_path / "run"
    shutil.copytree(run / "run", copied)
    index_path = copied / "checkpoints" / "index.json"
    index = json.loads(index_path.read_text())
    best = index["best"][0]
    score = best["score"] + 1 if average_wins else -1.0  # the index ranks them for auto
    index["average"] = {"file": "average_last_3.pt", "score": score, "updates": [20, 30, 40], "by_training": True}
    index_path.write_text(json.dumps(index))
    records = [json.loads(line) for line in (copied / "metrics.jsonl").read_text().splitlines()]
    [record] = [r for r in records if r["type"] == "average"]
    assert main(["compare", str(copied), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    table = (tmp_path / "report" / "compare.md").read_text().splitlines()
    assert "| best dev BLEU | average dev BLEU | auto takes | test decoding |" in table[0]
    cells = [c.strip() for c in table[2].split("|")]
    taken = "average_last_3.pt" if average_wins else best["file"]
    assert cells[7:10] == [f"{best['score']:.2f}", f"{record['dev_bleu']:.2f}", taken]
    assert any(line.startswith("Average dev BLEU: the model training averaged") for line in table)
    [summary] = json.loads((tmp_path / "report" / "compare.json").read_text())
    assert summary["average"] == {
        "update": 40,
        "dev_bleu": record["dev_bleu"],
        "best_bleu": record["best_bleu"],
        "updates": [20, 30, 40],
        "auto_takes": taken,
    }


def test_compare_tables_of_runs_without_an_average_are_as_before():
    from nmt.compare import RunSummary, _record, markdown_table

    plain = RunSummary("a", "rnn", 1_000_000, 60.0, 10, 5.0, curve=[{"dev_bleu": 3.0}])
    head = (
        "| run | model | parameters | training time | updates | target tokens/s | best dev BLEU "
        "| test decoding | test BLEU | test chrF | greedy sent/s | beam-5 sent/s |"
    )
    assert markdown_table([plain]).splitlines()[0] == head and "average" not in _record(plain)
    averaged = RunSummary("b", "rnn", 1_000_000, 60.0, 10, 5.0, average={"dev_bleu": 4.0, "auto_takes": "x.pt"})
    rows = markdown_table([plain, averaged]).splitlines()
    assert "| 3.00 | - | - | - |" in rows[2] and "| - | 4.00 | x.pt | - |" in rows[3]


def test_resuming_a_finished_run_does_not_average_again(run, capsys):
    metrics = (run / "run" / "metrics.jsonl").read_text()
    assert main(["train", "--config", str(run / "tiny.yaml")]) == 0
    assert "exists already" in capsys.readouterr().err
    assert (run / "run" / "metrics.jsonl").read_text() == metrics


def test_translation_uses_the_average_only_where_dev_says_it_helps(run, capsys):
    directory = run / "run" / "checkpoints"
    index_path = directory / "index.json"
    index = json.loads(index_path.read_text())
    source = str(run / "data" / "train.de")
    translate = ["translate", "--model", str(run / "run"), "-i", source, "--beam-size", "1"]
    outputs = {}
    for which in ("best", "average", "last"):
        assert main([*translate, "--checkpoint", which]) == 0
        outputs[which] = capsys.readouterr().out
    manager = checkpoint.CheckpointManager(directory, 3, 1, clean=False, create=False)
    for average_score, chosen in ((index["best"][0]["score"] + 1, "average_last_3.pt"), (-1.0, "best_")):
        index["average"]["score"] = average_score
        index_path.write_text(json.dumps(index))
        assert manager.model_path().name.startswith(chosen)
    assert main([*translate, "--checkpoint", "nope.pt"]) == 2
    assert "--checkpoint nope.pt: no such checkpoint" in capsys.readouterr().err


def test_nmt_average_command_and_its_errors(run, capsys):
    assert main(["average", "--model", str(run / "run"), "--last", "2"]) == 0
    err = capsys.readouterr().err
    assert "average of updates 30, 40: dev BLEU" in err
    assert (run / "run" / "checkpoints" / "average_last_2.pt").exists()
    assert main(["average", "--model", str(run / "run"), "--last", "5"]) == 2
    err = capsys.readouterr().err
    said = "3 training-state checkpoint(s) written by validations exist, 5 asked for; the run keeps train.keep_last 3"
    assert said in err
    lock = RunLock(run / "run" / "train.lock")
    lock.acquire(run / "run", print)
    try:
        assert main(["average", "--model", str(run / "run"), "--last", "2"]) == 2
        assert "another 'nmt train' is training this run" in capsys.readouterr().err
    finally:
        lock.release()


def test_nmt_average_leaves_out_a_state_a_signal_wrote_between_validations(run, tmp_path, capsys):
    # A run stopped by SIGTERM or Ctrl-C at update 45 keeps that update's training state to resume
    # from; 'nmt average --last 3' takes the last 3 validations wrote, as keep_last counts them and
    # training's own average_last takes them, not the signal's.
    copied = tmp_path / "run"
    shutil.copytree(run / "run", copied, ignore=shutil.ignore_patterns("average_*"))
    directory = copied / "checkpoints"
    index = json.loads((directory / "index.json").read_text())
    (directory / "index.json").write_text(json.dumps({k: v for k, v in index.items() if k != "average"}))
    state = checkpoint_file.load(directory / "update_00000040.pt")
    state["progress"].update(update=45, last_validated=40)  # as the trainer saves it on a signal
    checkpoint.CheckpointManager(directory, 3, 1).save_state(state, 45)
    assert [c.update for c in checkpoint.list_checkpoints(directory, "update")] == [45, 40, 30, 20]
    assert main(["average", "--model", str(copied), "--last", "3"]) == 0
    assert "average of updates 20, 30, 40: dev BLEU" in capsys.readouterr().err
    assert json.loads((directory / "index.json").read_text())["average"]["updates"] == [20, 30, 40]
    assert main(["average", "--model", str(copied), "--last", "4"]) == 2
    assert "3 training-state checkpoint(s) written by validations exist, 4 asked for" in capsys.readouterr().err


def test_nmt_average_of_more_than_the_run_has_says_so_before_loading_a_model(run, capsys, monkeypatch):
    import nmt.translate

    def no_loading(*args, **kwargs):
        raise AssertionError("loaded a model (and measured kernels, read the dev set) before counting checkpoints")

    monkeypatch.setattr(nmt.translate, "load_translator", no_loading)
    assert main(["average", "--model", str(run / "run"), "--last", "5"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "3 training-state checkpoint(s) written by validations exist, 5 asked for" in line


@pytest.mark.parametrize("last", ["1", "0", "two"])
def test_nmt_average_of_fewer_than_two_is_refused_before_touching_the_run(run, capsys, last):
    index = (run / "run" / "checkpoints" / "index.json").read_bytes()
    with pytest.raises(SystemExit) as exit_:
        main(["average", "--model", str(run / "run"), "--last", last])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    said = f"argument --last: expected an integer >= 2 (checkpoints to average), got {last!r}"
    assert err.strip().splitlines()[-1].endswith(said)
    assert not (run / "run" / "checkpoints" / "average_last_1.pt").exists()
    assert (run / "run" / "checkpoints" / "index.json").read_bytes() == index


def test_average_last_needs_the_checkpoints_kept(tmp_path):
    values = yaml.safe_load(tiny_config(tmp_path).read_text())
    values["train"].update(average_last=4, keep_last=2)
    with pytest.raises(NMTError, match="train.average_last': 4 needs train.keep_last >= 4"):
        config_from_dict(values)


def test_a_run_with_fewer_checkpoints_than_average_last_averages_those_it_has(tmp_path, capsys):
    # Two validations (updates 10 and 20) for average_last 5: the run ends normally with their average.
    config = tiny_config(tmp_path, max_updates=20, validate_every=10, keep_last=5, average_last=5)
    assert main(["train", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "train.average_last 5, but the run has 2 training-state checkpoint(s) (updates 10, 20;" in err
    assert "averaging those 2" in err and "best dev BLEU" in err
    directory = tmp_path / "run" / "checkpoints"
    index = json.loads((directory / "index.json").read_text())
    assert index["average"]["file"] == "average_last_2.pt" and index["average"]["updates"] == [10, 20]
    assert (
        main(
            [
                "translate",
                "--model",
                str(tmp_path / "run"),
                "-i",
                str(tmp_path / "data" / "train.de"),
                "--checkpoint",
                "average",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 0  # finished: the same average, not made again
    err = capsys.readouterr().err
    assert "exists already" in err and "best dev BLEU" in err
    # By hand, N is what was asked for: the error says how many exist, not keep_last (which is 5).
    assert main(["average", "--model", str(tmp_path / "run"), "--last", "5"]) == 2
    err = capsys.readouterr().err
    assert "2 training-state checkpoint(s) written by validations exist, 5 asked for; one is written per" in err
    assert "keep_last" not in err


def test_a_run_with_one_checkpoint_skips_averaging(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=5, validate_every=10, warmup_updates=2, average_last=2)
    assert main(["train", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "the run has 1 training-state checkpoint(s) (updates 5;" in err and "nothing to average, skipped" in err
    assert "best dev BLEU" in err
    index = json.loads((tmp_path / "run" / "checkpoints" / "index.json").read_text())
    assert "average" not in index


def test_training_s_own_average_replaces_its_earlier_one_and_keeps_one_made_by_hand(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=20, validate_every=10, keep_last=5, average_last=3)
    directory = tmp_path / "run" / "checkpoints"
    assert main(["train", "--config", str(config)]) == 0  # two validations: average_last_2.pt
    assert (directory / "average_last_2.pt").exists()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=30"]) == 0
    assert (directory / "average_last_3.pt").exists()
    assert not (directory / "average_last_2.pt").exists()  # training's earlier one, named nowhere now
    assert not (directory / "average_last_2.pt.sha256").exists()
    assert main(["average", "--model", str(tmp_path / "run"), "--last", "2"]) == 0  # by hand: kept
    assert main(["train", "--config", str(config), "--set", "train.max_updates=40"]) == 0
    index = json.loads((directory / "index.json").read_text())
    assert index["average"]["file"] == "average_last_3.pt" and index["average"]["updates"] == [20, 30, 40]
    assert (directory / "average_last_2.pt").exists()
    capsys.readouterr()


class Killed(BaseException):
    """Where the process died (SIGKILL): nothing after it runs, no handler saves a state."""


def test_a_kill_before_the_average_s_metrics_record_leaves_a_resume_that_writes_it(tmp_path, monkeypatch):
    # The average is written and recorded in index.json before its "average" record in metrics.jsonl:
    # killed between the two, the resumed run found the average made and wrote no record.
    from nmt.trainer import Trainer

    config = tiny_config(tmp_path, max_updates=20, validate_every=10, keep_last=2, average_last=2)
    real = Trainer.write_metrics

    def killed_at_the_average_record(self, record):
        if record["type"] == "average":
            raise Killed
        real(self, record)

    monkeypatch.setattr(Trainer, "write_metrics", killed_at_the_average_record)
    with pytest.raises(Killed):
        main(["train", "--config", str(config)])
    monkeypatch.undo()
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert '"average"' not in metrics.read_text()
    average = json.loads((tmp_path / "run" / "checkpoints" / "index.json").read_text())["average"]
    assert average["updates"] == [10, 20]

    for _ in range(2):  # resumed, then run again: one record, as a run left alone has
        assert main(["train", "--config", str(config)]) == 0
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        averages = [r for r in records if r["type"] == "average"]
        assert len(averages) == 1 and records[-1] == averages[0]
        assert averages[0]["update"] == 20 and averages[0]["dev_bleu"] == average["score"]


@pytest.mark.parametrize("lower_kept", [False, True])
def test_nmt_average_on_a_run_whose_best_checkpoint_is_missing_says_so(run, tmp_path, capsys, lower_kept):
    # index.json names best_*.pt, the file is gone: the average was ranked against its score and
    # 'the best single checkpoint stays the default' was said, though translate's auto fails for it.
    # With a lower best kept (keep_best above 1), auto and best loaded that one, saying nothing.
    copied = tmp_path / "run"
    shutil.copytree(run / "run", copied, ignore=shutil.ignore_patterns("best_*", "average_*"))
    index_path = copied / "checkpoints" / "index.json"
    index = json.loads(index_path.read_text())
    recorded = index["best"][0]["file"]
    if lower_kept:  # the second best of keep_best 2, ranked below the one missing
        for suffix in ("", ".sha256"):
            shutil.copy(
                run / "run" / "checkpoints" / (recorded + suffix), copied / "checkpoints" / f"best_00000005.pt{suffix}"
            )
        index["best"].append({"file": "best_00000005.pt", "score": -1.0, "update": 5})
    index_path.write_text(json.dumps({k: v for k, v in index.items() if k != "average"}))
    assert main(["average", "--model", str(copied), "--last", "2"]) == 0
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("average of updates 30, 40")]
    assert f"the best single checkpoint recorded in index.json, {recorded}, is missing" in line
    assert "default" not in line and "--checkpoint average" in line
    translate = ["translate", "--model", str(copied), "-i", str(run / "data" / "train.de"), "--beam-size", "1"]
    for which in ("auto", "best"):
        assert main([*translate, "--checkpoint", which]) == 2
        err = capsys.readouterr().err
        assert f"{recorded}: the run's best checkpoint (recorded in index.json) is missing" in err
        assert ("--checkpoint best_00000005.pt takes the next best kept" in err) == lower_kept
    if lower_kept:
        assert main([*translate, "--checkpoint", "best_00000005.pt"]) == 0
    assert main([*translate, "--checkpoint", "average"]) == 0
