"""A run stopped and resumed ends with exactly the parameters of the same run left alone."""

import json
import math
import os
import re
import shutil
import signal
import weakref
from pathlib import Path

import pytest
import torch
import yaml
from conftest import PAIRS, tiny_config, write_corpus

from nmt import checkpoint, checkpoint_file, epoch_plan, testhooks
from nmt.cli import main
from nmt.device import cpu_has_bf16
from nmt.epoch_plan import resumed_position, training_data_change
from nmt.errors import NMTError
from nmt.models.dropout import add_dropout, dropout
from nmt.models.linear import onednn_available
from nmt.tokenizer import Tokenizer
from nmt.trainer import Trainer
from nmt.training_state import Progress, rng_state, set_rng_state
from nmt.validation import dev_digest, dev_set_change

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN products")
needs_cpp_compiler = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="torch.compile on a CPU needs a C++ compiler"
)


def fail_train_step_at(monkeypatch, update: int, message: str):
    """Make the update after ``update`` raise RuntimeError(message); returns the real train_step, to put back."""
    step = Trainer.train_step

    def failing(self, group):
        if self.progress.update == update:
            raise RuntimeError(message)
        return step(self, group)

    monkeypatch.setattr(Trainer, "train_step", failing)
    return step


def final_weights(run_dir):
    [latest, *_] = checkpoint.list_checkpoints(run_dir / "checkpoints", "update")
    return latest.update, checkpoint_file.load(latest.path)["model"]


@pytest.mark.parametrize("library", ["blas", pytest.param("onednn", marks=needs_onednn)])
def test_stop_and_resume_equals_uninterrupted(tmp_path, library):
    # Dropout on, so the random-number state must be restored too; several epochs, so the
    # data order of a later epoch must continue as it would have.
    # One thread, one product library and one attention kernel in both: ``auto`` measured on a busy
    # machine may choose others for each run, and sums over other choices round differently.
    overrides = ["--set", "model.dropout=0.1", "--set", "train.threads=1", "--set", f"train.fp32_matmul={library}"]
    overrides += ["--set", "train.attention=sdpa"]
    straight = tiny_config(tmp_path / "a", max_updates=40, validate_every=10, max_tokens=128)
    assert main(["train", "--config", str(straight), *overrides]) == 0
    resumed = tiny_config(tmp_path / "b", max_updates=40, validate_every=10, max_tokens=128)
    assert main(["train", "--config", str(resumed), *overrides, "--set", "train.max_updates=17"]) == 0
    assert main(["train", "--config", str(resumed), *overrides]) == 0
    update_a, weights_a = final_weights(tmp_path / "a" / "run")
    update_b, weights_b = final_weights(tmp_path / "b" / "run")
    assert update_a == update_b == 40
    for name, tensor in weights_a.items():
        assert torch.equal(tensor, weights_b[name]), name


@needs_cpp_compiler
def test_a_compiled_model_drops_out_with_masks_the_saved_random_state_gives_again():
    """train.compile: the compiled graph makes its F.dropout masks itself (inductor's random numbers),
    from seeds it draws at each call from torch's generator, whose state a training state saves
    (``rng_state``). Restored, the calls after it drop out what they did in the run left alone, so a
    compiled run resumes bit for bit (a tiny Transformer, dropout 0.1, stopped at update 17 of 40 and
    resumed: bitwise equal; not restoring the state: 0.12 apart). Whole runs compile for a minute here."""

    def sublayer(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:  # as a residual connection drops out
        return add_dropout(x, dropout(h, 0.1), 0.1)

    step = torch.compile(sublayer, dynamic=True)
    x, h = torch.zeros(64, 32), torch.ones(64, 32)
    torch.manual_seed(0)
    first = step(x, h)
    saved = rng_state()
    second, third = step(x, h), step(x, h)
    assert (first == 0).any() and (first != 0).any()  # dropped out
    assert not torch.equal(first, second) and not torch.equal(second, third)  # new masks at every call
    set_rng_state(saved)
    assert torch.equal(step(x, h), second) and torch.equal(step(x, h), third)


def at_batch(monkeypatch, update: int, batch: int, action) -> None:
    """``action(compute_loss)`` stands in for the loss of update ``update``'s ``batch``-th batch (from 1);
    every other batch's loss is computed as usual."""
    import nmt.update_step

    at_update, compute = testhooks.at_update, nmt.update_step.teacher_forced_loss
    making = {"update": 0, "batches": 0}

    def starting(rank, number, when):
        if when == "start":
            making.update(update=number, batches=0)
        at_update(rank, number, when)

    def loss(*args, **kwargs):
        making["batches"] += 1
        if (making["update"], making["batches"]) == (update, batch):
            return action(lambda: compute(*args, **kwargs))
        return compute(*args, **kwargs)

    monkeypatch.setattr(testhooks, "at_update", starting)
    monkeypatch.setattr(nmt.update_step, "teacher_forced_loss", loss)


def sigterm_during(monkeypatch, update: int, batch: int) -> None:
    """This process SIGTERMs itself as update ``update`` has computed the loss of its ``batch``-th
    batch (from 1), as ``kill`` would between two batches: the update is made, then the run saved."""

    def compute_then_kill(compute_loss):
        result = compute_loss()
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    at_batch(monkeypatch, update, batch, compute_then_kill)


def run_outcome(run_dir: Path) -> tuple[dict, list[dict], dict]:
    """What a run leaves: every checkpoint (its wall time left out), metrics.jsonl's records without
    their wall-clock fields, and index.json."""
    files = {}
    for path in sorted((run_dir / "checkpoints").glob("*.pt")):
        payload = checkpoint_file.load(path)
        payload.get("progress", {}).pop("elapsed_seconds", None)
        files[path.name] = payload
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [{k: v for k, v in r.items() if k not in ("elapsed", "seconds")} for r in records]
    return files, records, json.loads((run_dir / "checkpoints" / "index.json").read_text())


def assert_same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


needs_bf16 = pytest.mark.skipif(not cpu_has_bf16(), reason="this CPU has no bf16 kernels")


@pytest.mark.parametrize(
    "model_type, train, stop",
    [
        # Between two validations: that state is not one of keep_last's, nor averaged at the end.
        pytest.param("transformer", {"keep_last": 2, "average_last": 2}, (16, 1), id="transformer"),
        # After the second batch of an update of three; the LSTM, in bf16.
        pytest.param(
            "rnn", {"accumulate": 3, "max_tokens": 64, "precision": "bf16"}, (8, 2), id="lstm-bf16", marks=needs_bf16
        ),
    ],
)
def test_a_run_stopped_by_a_signal_ends_with_the_checkpoints_and_metrics_of_the_run_left_alone(
    tmp_path, monkeypatch, capsys, model_type, train, stop
):
    settings = {"max_updates": 20, "validate_every": 5, "max_tokens": 128, "threads": 1, "fp32_matmul": "blas"}
    settings.update(attention="sdpa" if model_type == "transformer" else "auto", **train)  # the LSTM has no kernel
    dropout = ["--set", "model.dropout=0.1"]
    straight = tiny_config(tmp_path / "a", model_type, **settings)
    assert main(["train", "--config", str(straight), *dropout]) == 0
    stopped = tiny_config(tmp_path / "b", model_type, **settings)
    sigterm_during(monkeypatch, *stop)
    assert main(["train", "--config", str(stopped), *dropout]) == 143
    assert f"checkpoint written at update {stop[0]}" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["train", "--config", str(stopped), *dropout]) == 0
    files_a, records_a, index_a = run_outcome(tmp_path / "a" / "run")
    files_b, records_b, index_b = run_outcome(tmp_path / "b" / "run")
    assert sorted(files_b) == sorted(files_a)
    assert_same(files_b, files_a)
    assert records_b == records_a
    assert index_b == index_a


def test_changed_model_is_refused_on_resume(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=2)
    assert main(["train", "--config", str(config)]) == 0
    assert main(["train", "--config", str(config), "--set", "model.d_model=32"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err and "model.d_model: 64 -> 32" in err


@pytest.mark.parametrize(
    "change, named",
    [
        ("decode.bleu_tokenize=char", "decode.bleu_tokenize: '13a' -> 'char'"),
        ("decode.bleu_lowercase=true", "decode.bleu_lowercase: False -> True"),
        ("train.validate_beam_size=2", "train.validate_beam_size: 1 -> 2"),
        ("train.validate_max_sentences=4", "train.validate_max_sentences: None -> 4"),
        # Validation's output is cut at a * source length + b: shorter, its BLEU falls with the cut.
        ("decode.max_len_a=0.5", "decode.max_len_a: 1.5 -> 0.5"),
        ("decode.max_len_b=2", "decode.max_len_b: 4 -> 2"),
    ],
)
def test_a_resume_that_measures_dev_bleu_otherwise_is_refused(tmp_path, capsys, change, named):
    # The best checkpoints and the patience count rank the run's earlier scores: new ones measured
    # with another tokenizer, case or beam would be ranked against them as if they compared.
    config = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=2)
    assert main(["train", "--config", str(config)]) == 0
    index = (tmp_path / "run" / "checkpoints" / "index.json").read_bytes()
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=10", "--set", change]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "cannot resume" in line and named in line and "dev BLEU" in line
    assert (tmp_path / "run" / "checkpoints" / "index.json").read_bytes() == index
    # Before the run's first checkpoint nothing was ranked yet: any key may change.
    fresh = tiny_config(tmp_path / "fresh", max_updates=5, validate_every=5, warmup_updates=2)
    assert main(["train", "--config", str(fresh), "--set", change]) == 0


def test_a_resume_on_another_dev_set_is_refused_and_on_the_same_one_moved_is_not(tmp_path, capsys):
    # Its scores would be ranked against the run's earlier ones (best checkpoints, patience) as if
    # they compared: a dev set with one sentence changed resumed in silence.
    config = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=2)
    assert main(["train", "--config", str(config)]) == 0
    index = (tmp_path / "run" / "checkpoints" / "index.json").read_bytes()
    other = tmp_path / "other"
    other.mkdir()
    for lang in ("de", "en"):
        lines = (tmp_path / "data" / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        (other / f"moved.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (other / f"changed.{lang}").write_text("\n".join([lines[0] + " x", *lines[1:]]) + "\n", encoding="utf-8")
    capsys.readouterr()
    more = ["--set", "train.max_updates=10"]
    assert main(["train", "--config", str(config), *more, "--set", f"data.dev={other / 'changed'}"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("nmt train: error: cannot resume: data.dev holds other sentences than the dev set")
    assert (tmp_path / "run" / "checkpoints" / "index.json").read_bytes() == index
    assert main(["train", "--config", str(config), *more, "--set", f"data.dev={other / 'moved'}"]) == 0
    assert final_weights(tmp_path / "run")[0] == 10


def test_the_dev_digest_tells_lines_apart_and_an_earlier_version_s_state_takes_any_dev_set():
    assert dev_digest(["a\nb"], ["c"]) != dev_digest(["a", "b"], ["c"])  # a dataset's text may hold newlines
    assert dev_digest(["a", "b"], ["c"]) != dev_digest(["a"], ["b", "c"])
    assert dev_digest(["a"], ["b"]) == dev_digest(["a"], ["b"])
    validated = Progress(update=5, last_validated=5, dev_data=dev_digest(["a"], ["b"]))
    assert dev_set_change(validated, dev_digest(["a"], ["b"])) is None
    assert dev_set_change(validated, dev_digest(["a"], ["c"])).startswith("cannot resume: data.dev holds other")
    assert dev_set_change(Progress(update=5, last_validated=5), dev_digest(["a"], ["c"])) is None  # no digest
    assert dev_set_change(Progress(update=3, dev_data="x"), "y") is None  # nothing ranked yet


def test_a_case_folding_run_an_earlier_version_started_with_cased_bleu_resumes(tmp_path, capsys):
    # Such a run (bleu_lowercase false, ranked by cased BLEU) was refused both ways: the config check
    # asked for bleu_lowercase true, and the resume refused a change of how dev BLEU is measured.
    config = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=2)
    folding = ["--set", "tokenizer.normalization=nmt_nfkc_cf"]
    capsys.readouterr()
    assert main(["train", "--config", str(config), *folding]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    set_there = f"{config} with --set tokenizer.normalization=nmt_nfkc_cf"  # the --set that caused it
    assert line.startswith(f"nmt train: error: {set_there}: config key 'decode.bleu_lowercase'"), line
    assert not (tmp_path / "run").exists()
    lowercase = ["--set", "decode.bleu_lowercase=true"]
    assert main(["train", "--config", str(config), *folding, *lowercase]) == 0
    # As an earlier version wrote it: no check then, cased dev BLEU.
    saved = tmp_path / "run" / "config.yaml"
    saved.write_text(saved.read_text().replace("bleu_lowercase: true", "bleu_lowercase: false"))
    assert main(["train", "--config", str(config), *folding, "--set", "train.max_updates=10"]) == 0
    assert final_weights(tmp_path / "run")[0] == 10


def test_resumed_position_keeps_the_place_in_an_unchanged_epoch():
    assert resumed_position(3, 7, 10, 10) == (3, 7)
    assert resumed_position(3, 7, 0, 10) == (3, 7)  # a checkpoint that did not record the plan's size


def test_resumed_position_keeps_the_fraction_of_a_changed_epoch():
    assert resumed_position(3, 6, 10, 5) == (3, 3)  # twice the batch size: half as many batches
    assert resumed_position(3, 9, 10, 4) == (4, 0)  # round(3.6) = 4: all of it
    assert resumed_position(3, 10, 20, 40) == (3, 20)
    assert resumed_position(2, 19, 20, 8) == (3, 0)  # round(7.6) = 8: the epoch is done
    assert resumed_position(2, 9, 0, 4) == (3, 0)  # unknown size, past the end of the new plan


def test_resume_with_bigger_batches_goes_on_where_the_old_ones_left_off(tmp_path, capsys):
    # Small batches, stopped late in the first epoch; one batch then holds the whole corpus, so the
    # saved batch index lies past the end of the new plan.
    config = tiny_config(tmp_path, max_updates=3, validate_every=100, max_tokens=40, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    state = checkpoint_file.load(final_path(tmp_path / "run"))["progress"]
    assert state["epoch"] == 1 and state["batch_in_epoch"] == 3 and state["epoch_batches"] > 3
    capsys.readouterr()
    bigger = ["--set", "train.max_tokens=1024", "--set", "train.max_updates=12"]
    assert main(["train", "--config", str(config), *bigger]) == 0
    err = capsys.readouterr().err
    assert "resuming with train.max_tokens 40 -> 1024: the " in err and "ZeroDivision" not in err
    update, _ = final_weights(tmp_path / "run")
    assert update == 12


def test_a_resumed_run_makes_the_plan_of_its_epoch_once(tmp_path, monkeypatch):
    # Each plan made sorts every training pair: the oneDNN cache's size was counted on a plan of
    # epoch 1, made before the resumed epoch was known, and then made again for that epoch.
    config = tiny_config(tmp_path, max_updates=7, validate_every=100, max_tokens=128, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    assert checkpoint_file.load(final_path(tmp_path / "run"))["progress"]["epoch"] == 4
    made = []
    token_batches = epoch_plan.token_batches
    monkeypatch.setattr(epoch_plan, "token_batches", lambda *args: made.append(args[-1]) or token_batches(*args))
    assert main(["train", "--config", str(config), "--set", "train.max_updates=8"]) == 0
    assert made == [4]


def record_epochs(monkeypatch) -> dict[int, list[int]]:
    """The corpus indices each update trains on, by the epoch they come from, over every start."""
    trained: dict[int, list[int]] = {}
    step = Trainer.train_step

    def recording(self, group):
        trained.setdefault(self.progress.epoch, []).extend(i for rows in group for i in rows.tolist())
        return step(self, group)

    monkeypatch.setattr(Trainer, "train_step", recording)
    return trained


def test_an_epoch_resumed_with_other_batches_and_seed_trains_on_each_of_its_pairs_once(tmp_path, monkeypatch, capsys):
    # Stopped after 2 of epoch 1's batches; resumed with smaller batches and another seed, stopped again
    # in that epoch, and resumed with them again: the epoch's plan is made the same way on each start.
    trained = record_epochs(monkeypatch)
    config = tiny_config(tmp_path, max_updates=2, validate_every=100, max_tokens=24, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    state = checkpoint_file.load(final_path(tmp_path / "run"))["progress"]
    assert (state["epoch"], state["batch_in_epoch"]) == (1, 2) and state["epoch_batches"] > 2
    capsys.readouterr()
    changed = ["--set", "train.max_tokens=10", "--set", "seed=11"]
    assert main(["train", "--config", str(config), *changed, "--set", "train.max_updates=4"]) == 0
    assert checkpoint_file.load(final_path(tmp_path / "run"))["progress"]["epoch"] == 1
    err = capsys.readouterr().err
    assert "resuming with train.max_tokens 24 -> 10; seed 3 -> 11: the " in err
    assert "pairs of epoch 1 not yet trained on are batched again with the new values" in err
    assert main(["train", "--config", str(config), *changed, "--set", "train.max_updates=20"]) == 0
    assert "resuming with" not in capsys.readouterr().err  # the settings it went on with are the run's now
    assert sorted(trained[1]) == list(range(len(PAIRS)))
    assert sorted(trained[2]) == list(range(len(PAIRS)))


def test_a_resume_on_other_training_data_warns_that_the_epoch_is_batched_from_it(tmp_path, capsys):
    # The shards were encoded again and the epoch's plan made from them in silence: the interrupted
    # run's batches were not the ones it went on with, and nothing said why.
    config = tiny_config(tmp_path, max_updates=2, validate_every=100, max_tokens=24, warmup_updates=1)
    dev = ["--set", f"data.dev={write_corpus(tmp_path / 'dev', 'dev', PAIRS)}"]  # the same dev set throughout
    assert main(["train", "--config", str(config), *dev]) == 0
    for lang in ("de", "en"):  # the same text, other file times: encoded again, the same pairs
        os.utime(tmp_path / "data" / f"train.{lang}", ns=(10**18, 10**18))
    capsys.readouterr()
    assert main(["train", "--config", str(config), *dev, "--set", "train.max_updates=3"]) == 0
    err = capsys.readouterr().err
    assert "train: reusing" not in err and "training data changed" not in err
    state = checkpoint_file.load(final_path(tmp_path / "run"))["progress"]
    assert (state["epoch"], state["batch_in_epoch"]) == (1, 3)
    write_corpus(tmp_path / "data", "train", PAIRS[:-1])
    assert main(["train", "--config", str(config), *dev, "--set", "train.max_updates=4"]) == 0
    warning = (
        "warning: the training data changed since the training state of update 3 was written (other pairs, or "
        "pairs of other lengths: data.train's text, or data.max_len / max_len_ratio): the rest of epoch 1 is "
        "batched from the new data, not the batches the interrupted run would have trained on, so in this epoch "
        "some pairs may be trained on twice and others not at all"
    )
    assert warning in capsys.readouterr().err.splitlines()
    assert warning in (tmp_path / "run" / "train.log").read_text(encoding="utf-8")


def test_the_training_data_change_is_said_where_the_state_knows_its_data():
    p = Progress(update=8, epoch=2, batch_in_epoch=0, plan_data="a")
    assert training_data_change(p, "a") is None
    assert training_data_change(p, "b").endswith(": the run trains on the new data from epoch 2, which starts now")
    assert training_data_change(Progress(update=8, epoch=2, batch_in_epoch=3), "b") is None  # an earlier version's


def test_adamw_settings_changed_on_resume_are_the_ones_the_optimizer_goes_on_with(tmp_path, capsys):
    """train.betas, adam_eps and weight_decay may change on resume, as other train keys: loading the
    checkpoint's optimizer state must not bring its own back."""
    config = tiny_config(tmp_path, max_updates=3, validate_every=3, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    capsys.readouterr()
    changed = ["train.betas=[0.8,0.9]", "train.adam_eps=1e-3", "train.weight_decay=0.1", "train.max_updates=5"]
    assert main(["train", "--config", str(config), *[a for s in changed for a in ("--set", s)]]) == 0
    [group] = checkpoint_file.load(final_path(tmp_path / "run"))["optimizer"]["param_groups"]
    assert (tuple(group["betas"]), group["eps"], group["weight_decay"]) == ((0.8, 0.9), 1e-3, 0.1)
    assert (
        "resuming with train.betas [0.9, 0.98] -> [0.8, 0.9]; train.adam_eps 1e-08 -> 0.001; "
        "train.weight_decay 0.0 -> 0.1: AdamW takes the config's, not the checkpoint's"
    ) in capsys.readouterr().err
    capsys.readouterr()
    assert (
        main(
            [
                "train",
                "--config",
                str(config),
                *[a for s in changed for a in ("--set", s)],
                "--set",
                "train.max_updates=6",
            ]
        )
        == 0
    )
    assert "AdamW takes" not in capsys.readouterr().err  # nothing changed this time


def final_path(run_dir):
    [latest, *_] = checkpoint.list_checkpoints(run_dir / "checkpoints", "update")
    return latest.path


def test_a_failed_resume_leaves_the_run_config_as_it_was(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=2)
    assert main(["train", "--config", str(config)]) == 0
    saved = (tmp_path / "run" / "config.yaml").read_bytes()
    missing = ["--set", f"data.train={tmp_path / 'nowhere'}", "--set", "train.max_updates=9"]
    assert main(["train", "--config", str(tmp_path / "run" / "config.yaml"), *missing]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert (tmp_path / "run" / "config.yaml").read_bytes() == saved


def test_before_the_first_checkpoint_a_failed_start_can_be_fixed_in_place(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=3, validate_every=3, warmup_updates=1)
    assert main(["train", "--config", str(config), "--set", "tokenizer.vocab_size=50000"]) == 2
    assert "vocab_size" in capsys.readouterr().err
    assert main(["train", "--config", str(config), "--set", "tokenizer.vocab_size=70"]) == 0
    assert "cannot resume" not in capsys.readouterr().err


def test_a_tokenizer_made_for_other_settings_is_trained_again_before_the_first_checkpoint(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=3, validate_every=3, warmup_updates=1)
    assert main(["prepare", "--config", str(config)]) == 0
    first = (tmp_path / "run" / "spm.model").read_bytes()
    assert main(["train", "--config", str(config), "--set", "tokenizer.vocab_size=70"]) == 0
    assert "training SentencePiece again" in capsys.readouterr().err
    assert (tmp_path / "run" / "spm.model").read_bytes() != first
    assert Tokenizer.load(tmp_path / "run" / "spm.model").vocab_size == 70


def test_a_tokenizer_left_by_a_failed_first_start_is_trained_again_with_the_fixed_settings(tmp_path, capsys):
    # The first start fails after SentencePiece is trained, before config.yaml is written.
    config = tiny_config(tmp_path)
    assert main(["prepare", "--config", str(config), "--set", "data.max_len=1"]) == 2
    assert "every training pair was dropped" in capsys.readouterr().err
    model = tmp_path / "run" / "spm.model"
    assert Tokenizer.load(model).vocab_size == 60
    assert not (tmp_path / "run" / "config.yaml").exists()
    fixed = ["--set", "tokenizer.type=unigram", "--set", "tokenizer.vocab_size=50"]
    assert main(["prepare", "--config", str(config), *fixed]) == 0
    err = capsys.readouterr().err
    assert "spm.model: made from other settings or text (tokenizer.type: 'bpe' -> 'unigram'; " in err
    assert "tokenizer.vocab_size: 60 -> 50); no checkpoint yet: training SentencePiece again" in err
    assert Tokenizer.load(model).vocab_size == 50
    assert json.loads((tmp_path / "run" / "spm.model.json").read_text())["tokenizer"]["type"] == "unigram"
    # Prepared again unchanged, the model is reused.
    before = model.read_bytes()
    assert main(["prepare", "--config", str(config), *fixed]) == 0
    assert "training SentencePiece again" not in capsys.readouterr().err
    assert model.read_bytes() == before


@pytest.mark.parametrize("killed_after", ["spm.model.json", "spm.vocab", "spm.model"])
def test_a_first_start_killed_as_it_writes_the_tokenizer_leaves_none_the_next_start_reuses(
    tmp_path, monkeypatch, killed_after
):
    # Killed just after one of the tokenizer's files is written. spm.model used to come before its
    # record, and a model without a record (an earlier version's) is reused where no config.yaml says
    # otherwise: the next start, with other settings, trained on the killed start's 60 pieces, not 50.
    import nmt.tokenizer_training

    config = tiny_config(tmp_path)
    real = nmt.tokenizer_training._write

    def killed(path, data):
        real(path, data)
        if path.name == killed_after:
            raise KeyboardInterrupt  # as a second Ctrl-C's os._exit, or SIGKILL, stops it here

    monkeypatch.setattr(nmt.tokenizer_training, "_write", killed)
    assert main(["prepare", "--config", str(config)]) != 0
    monkeypatch.setattr(nmt.tokenizer_training, "_write", real)
    run = tmp_path / "run"
    assert (run / killed_after).exists() and not (run / "config.yaml").exists()
    assert main(["prepare", "--config", str(config), "--set", "tokenizer.vocab_size=50"]) == 0
    assert Tokenizer.load(run / "spm.model").vocab_size == 50
    assert json.loads((run / "spm.model.json").read_text())["tokenizer"]["vocab_size"] == 50


def test_a_source_model_left_by_a_failed_first_start_is_trained_again(tmp_path, capsys):
    # Separate vocabularies: the source model is written, then the target side is too small for 200.
    config = tiny_config(tmp_path)
    separate = ["--set", "tokenizer.joint=false", "--set", "model.tie_embeddings=false"]
    assert main(["prepare", "--config", str(config), *separate, "--set", "tokenizer.vocab_size=200"]) == 2
    assert (
        f"{tmp_path}/data/train.en: config key 'tokenizer.vocab_size': 200 is larger than the target side of this "
        "corpus supports" in capsys.readouterr().err
    )
    src, trg = tmp_path / "run" / "spm.de.model", tmp_path / "run" / "spm.en.model"
    assert Tokenizer.load(src).vocab_size == 200 and not trg.exists()
    assert main(["prepare", "--config", str(config), *separate, "--set", "tokenizer.vocab_size=150"]) == 0
    assert (
        "spm.de.model: made from other settings or text (tokenizer.vocab_size: 200 -> 150)" in capsys.readouterr().err
    )
    assert Tokenizer.load(src).vocab_size == Tokenizer.load(trg).vocab_size == 150


def _upper_case_corpus(tmp_path) -> None:
    """The training corpus rewritten in place, same paths and sizes, other text."""
    for lang in ("de", "en"):
        path = tmp_path / "data" / f"train.{lang}"
        path.write_text(path.read_text(encoding="utf-8").upper(), encoding="utf-8")


def test_a_tokenizer_is_trained_again_when_the_training_text_changed_before_the_first_checkpoint(tmp_path, capsys):
    config = tiny_config(tmp_path)
    assert main(["prepare", "--config", str(config)]) == 0
    model = tmp_path / "run" / "spm.model"
    first = model.read_bytes()
    _upper_case_corpus(tmp_path)
    capsys.readouterr()
    assert main(["prepare", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    changed = f"spm.model: made from other settings or text (the training text changed ({tmp_path}/data/train.de))"
    assert changed in err and "training SentencePiece again" in err
    assert model.read_bytes() != first
    tok = Tokenizer.load(model)
    assert tok.unk_id not in sum(tok.encode((tmp_path / "data" / "train.de").read_text().splitlines()), [])


def test_a_run_with_checkpoints_keeps_its_tokenizer_when_the_training_text_changed(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=2, validate_every=2, warmup_updates=1)
    dev = ["--set", f"data.dev={write_corpus(tmp_path / 'dev', 'dev', PAIRS)}"]  # the same dev set throughout
    assert main(["train", "--config", str(config), *dev]) == 0
    model = tmp_path / "run" / "spm.model"
    first = model.read_bytes()
    _upper_case_corpus(tmp_path)
    capsys.readouterr()
    assert main(["train", "--config", str(config), *dev, "--set", "train.max_updates=4"]) == 0
    assert "training SentencePiece again" not in capsys.readouterr().err
    assert model.read_bytes() == first  # the checkpoints were trained with it


def test_a_validation_that_fails_keeps_the_updates_before_it(tmp_path, monkeypatch, capsys):
    import nmt.validation

    def broken(*args, **kwargs):
        raise RuntimeError("something nobody foresaw")

    config = tiny_config(tmp_path, max_updates=10, validate_every=7, warmup_updates=1)
    monkeypatch.setattr(nmt.validation, "dev_bleu", broken)
    with pytest.raises(RuntimeError, match="nobody foresaw"):
        main(["train", "--config", str(config)])
    update, _ = final_weights(tmp_path / "run")
    assert update == 7
    assert (
        "validation at update 7 failed (RuntimeError: something nobody foresaw); checkpoint written"
        in (tmp_path / "run" / "train.log").read_text()
    )


def test_a_dev_hyp_that_cannot_be_written_is_one_line_and_keeps_the_updates_before_it(tmp_path, capsys):
    # A directory where dev.hyp goes: an IsADirectoryError traceback, and the updates since the last
    # training state were lost with it.
    config = tiny_config(tmp_path, max_updates=10, validate_every=7, warmup_updates=1)
    (tmp_path / "run" / "dev.hyp").mkdir(parents=True)
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"nmt train: error: {tmp_path / 'run' / 'dev.hyp'}: cannot write the validation's translations (Is a directory)"
    )
    assert final_weights(tmp_path / "run")[0] == 7
    assert "validation at update 7 failed (" in (tmp_path / "run" / "train.log").read_text()


def out_of_memory_at(monkeypatch, update: int, batch: int, action=None) -> None:
    """The ``batch``-th batch (from 1) of update ``update`` runs out of memory as torch's CPU allocator
    does (or as ``action(compute_loss)`` makes it)."""

    def fail(compute_loss):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 2147483648 bytes.")

    at_batch(monkeypatch, update, batch, action or fail)


def test_an_update_that_runs_out_of_memory_keeps_the_updates_before_it(tmp_path, monkeypatch, capsys):
    # Out of memory in the second batch of update 5, two updates past the last validation: the state
    # of update 4 is written, and the run resumed from it ends as the run left alone. With dropout:
    # the first batch's masks drew random numbers, which the state written must not count.
    train = {"max_updates": 8, "validate_every": 3, "max_tokens": 40, "accumulate": 2, "warmup_updates": 1}
    train |= {"threads": 1, "fp32_matmul": "blas", "attention": "sdpa"}

    def with_dropout(path):
        config = yaml.safe_load(path.read_text())
        config["model"]["dropout"] = 0.1
        path.write_text(yaml.safe_dump(config))
        return path

    straight = with_dropout(tiny_config(tmp_path / "a", **train))
    assert main(["train", "--config", str(straight)]) == 0
    config = with_dropout(tiny_config(tmp_path / "b", **train))
    out_of_memory_at(monkeypatch, update=5, batch=2)
    assert main(["train", "--config", str(config)]) == 2
    assert "nmt train: error: out of memory" in capsys.readouterr().err
    assert final_weights(tmp_path / "b" / "run")[0] == 4
    assert (
        "update 5 failed (RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 2147483648 "
        "bytes.); checkpoint written at update 4; resume with: nmt train --config"
    ) in (tmp_path / "b" / "run" / "train.log").read_text()
    monkeypatch.undo()
    assert main(["train", "--config", str(config)]) == 0
    update_a, weights_a = final_weights(tmp_path / "a" / "run")
    update_b, weights_b = final_weights(tmp_path / "b" / "run")
    assert update_a == update_b == 8
    for name, tensor in weights_a.items():
        assert torch.equal(tensor, weights_b[name]), name


@pytest.mark.parametrize("write_fails", ["disk full", "out of memory"])
def test_an_update_out_of_memory_whose_state_cannot_be_written_still_says_out_of_memory(
    tmp_path, monkeypatch, capsys, write_fails
):
    # A disk full as well, or no memory left for the write (torch.save then fails with a RuntimeError
    # of its own): the advice to lower train.max_tokens is what the user needs, not lost to the write's error
    config = tiny_config(tmp_path, max_updates=8, validate_every=3, max_tokens=40, accumulate=2, warmup_updates=1)
    real_save = Trainer.save

    def save(self):
        if self.progress.update == 4 and write_fails == "disk full":
            raise checkpoint_file.CheckpointNotWritten(Path("update_00000004.pt"), "No space left on device", True)
        if self.progress.update == 4:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4888896 vs 3840272")
        real_save(self)

    monkeypatch.setattr(Trainer, "save", save)
    out_of_memory_at(monkeypatch, update=5, batch=2)
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "nmt train: error: out of memory" in err and "train.max_tokens" in err
    log = (tmp_path / "run" / "train.log").read_text()
    assert "update 5 failed (RuntimeError: DefaultCPUAllocator" in log and "its state not written" in log
    assert final_weights(tmp_path / "run")[0] == 3  # the validation's state stays


def test_an_update_out_of_memory_frees_its_tensors_before_its_state_is_written(tmp_path, monkeypatch, capsys):
    # The error's traceback holds the failed update's frames, and with them its activations: the write
    # of the state, made while they were held, ran out of memory too and the state was lost.
    config = tiny_config(tmp_path, max_updates=8, validate_every=3, max_tokens=40, accumulate=2, warmup_updates=1)
    held = []

    def fail(compute_loss):
        activations = compute_loss()  # as the batch's forward pass left them when it ran out
        held.append(weakref.ref(activations[0]))
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 2147483648 bytes.")

    freed_at_save = []
    real_save = Trainer.save

    def save(self):
        if self.progress.update == 4:
            freed_at_save.append(held[0]() is None)
        real_save(self)

    monkeypatch.setattr(Trainer, "save", save)
    out_of_memory_at(monkeypatch, update=5, batch=2, action=fail)
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "nmt train: error: out of memory" in err and "Traceback" not in err
    assert freed_at_save == [True]
    assert final_weights(tmp_path / "run")[0] == 4


def test_a_trainer_outside_the_training_loop_writes_no_checkpoint_for_a_failed_update(tmp_path, monkeypatch):
    # nmt bench's scratch trainer never writes one: a checkpoint there would make the next bench refuse it.
    from nmt.config import load_config
    from nmt.rundir import RunDir

    cfg = load_config(tiny_config(tmp_path, max_tokens=40, warmup_updates=1))
    trainer = Trainer(cfg, RunDir(cfg.run_dir), lambda message: None)
    trainer.setup(resume=False)
    plan = trainer.epoch_plan()
    trainer.train_step([plan[0]])
    out_of_memory_at(monkeypatch, update=2, batch=1)
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        trainer.train_step([plan[1]])
    trainer.close()
    assert checkpoint.list_checkpoints(tmp_path / "run" / "checkpoints", "update") == []


def _run_files(run_dir) -> dict:
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("deleted", ["update_*", "*"])
def test_a_run_whose_training_states_are_gone_is_refused_not_started_over(tmp_path, capsys, deleted):
    # A finished run whose update_*.pt were deleted (to save disk), or its whole checkpoints/ directory.
    config = tiny_config(tmp_path, max_updates=6, validate_every=3, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    for path in (run / "checkpoints").glob(deleted):
        path.unlink()
    before = _run_files(run)
    capsys.readouterr()
    assert main(["train", "--config", str(run / "config.yaml"), "--set", "train.max_updates=9"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        f"nmt train: error: {run}: no training-state checkpoint (checkpoints/update_*.pt) is left, but the run has "
        "trained ("
    )
    assert line.endswith(
        "2 validations in metrics.jsonl): restore the update_*.pt files to resume, or train into a new run_dir to "
        "start over"
    )
    if deleted == "update_*":
        found = r"\(checkpoints/best_\d{8}\.pt; checkpoints/index\.json, which records one at update 6; "
        assert re.search(found, line), line
    after = _run_files(run)
    assert after.pop(Path("train.lock")) == b"" and before.pop(Path("train.lock")) == b""
    assert after == before  # neither the log nor the metrics nor the checkpoints were written


def test_a_run_with_one_validation_and_no_metrics_left_is_refused_by_its_index(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=3, validate_every=3, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    for path in [*(run / "checkpoints").glob("update_*"), run / "metrics.jsonl"]:
        path.unlink()
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=6"]) == 2
    assert "(checkpoints/best_00000003.pt; checkpoints/index.json, which records one at update 3)" in (
        capsys.readouterr().err
    )
    assert not (run / "metrics.jsonl").exists()


def test_a_first_start_that_died_writing_its_first_training_state_starts_again(tmp_path, monkeypatch, capsys):
    # It validated (a best checkpoint, index.json, a validation in metrics.jsonl), then died before
    # its training state was renamed into place: there is nothing to resume from, and nothing lost.
    from nmt import testhooks

    def dies(tmp):
        if tmp.name.startswith(".update_"):
            raise RuntimeError("killed while writing the training state")

    config = tiny_config(tmp_path, max_updates=6, validate_every=3, warmup_updates=1)
    monkeypatch.setattr(testhooks, "before_rename", dies)
    with pytest.raises(RuntimeError, match="killed while writing"):
        main(["train", "--config", str(config)])
    run = tmp_path / "run"
    assert (run / "checkpoints" / "best_00000003.pt").exists() and (run / "checkpoints" / "index.json").exists()
    assert not list((run / "checkpoints").glob("update_*"))
    monkeypatch.setattr(testhooks, "before_rename", None)
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 0
    assert "resuming" not in capsys.readouterr().err
    assert final_weights(run)[0] == 6


def test_a_first_start_that_failed_before_its_first_checkpoint_starts_again(tmp_path, monkeypatch, capsys):
    # It trained a few updates (train records in metrics.jsonl), then failed: nothing to resume from.
    config = tiny_config(tmp_path, max_updates=6, validate_every=5, warmup_updates=1)
    step = fail_train_step_at(monkeypatch, 3, "a failure before the first validation")
    with pytest.raises(RuntimeError, match="before the first validation"):
        main(["train", "--config", str(config)])
    run = tmp_path / "run"
    assert (run / "metrics.jsonl").read_text().count('"train"') == 3 and not list(run.glob("checkpoints/*"))
    monkeypatch.setattr(Trainer, "train_step", step)
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 0
    assert "resuming" not in capsys.readouterr().err
    assert final_weights(run)[0] == 6


def test_a_run_resumed_from_a_validation_counts_its_time(tmp_path, monkeypatch):
    # train.max_minutes counts validations: the state a validation saves holds its time, or a run
    # killed after it and resumed would train that much longer than the run left alone.
    import time

    config = tiny_config(tmp_path, max_updates=5, validate_every=3, warmup_updates=1)
    monkeypatch.setattr(testhooks, "validation_step", lambda: time.sleep(0.1))  # slower than an update
    step = fail_train_step_at(monkeypatch, 3, "killed")  # update 4 fails, after update 3's validation
    with pytest.raises(RuntimeError, match="killed"):
        main(["train", "--config", str(config)])
    monkeypatch.setattr(Trainer, "train_step", step)
    assert main(["train", "--config", str(config)]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [valid] = [r for r in records if r["type"] == "valid" and r["update"] == 3]
    [resumed] = [r for r in records if r["type"] == "train" and r["update"] == 4]
    assert resumed["elapsed"] >= round(valid["elapsed"] + valid["seconds"], 3)


def test_extending_a_run_decayed_over_its_time_budget_warns_of_the_rate_it_goes_back_to(tmp_path, capsys):
    # README's workflow: a linear decay over train.max_minutes, resumed with a larger budget. The
    # first run stops at its budget (at lr_min); twice that budget puts the next update halfway up.
    budget = {"max_updates": None, "max_epochs": 10_000, "schedule": "linear", "warmup_updates": 1}
    config = tiny_config(tmp_path, max_minutes=0.001, validate_every=10_000, **budget)
    assert main(["train", "--config", str(config)]) == 0
    state = checkpoint_file.load(final_path(tmp_path / "run"))["progress"]
    update, elapsed = state["update"], state["elapsed_seconds"]
    capsys.readouterr()
    longer = f"train.max_minutes={2 * elapsed / 60!r}"
    assert main(["train", "--config", str(tmp_path / "run" / "config.yaml"), "--set", longer]) == 0
    err = capsys.readouterr().err
    warning = (
        f"warning: train.max_minutes 0.001 -> {2 * elapsed / 60:g} moves the end of the linear decay: update "
        f"{update + 1} trains at learning rate 5.00e-03, not 0.00e+00 as the run's config.yaml had it"
    )
    assert warning in err.splitlines(), err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [resumed] = [r for r in records if r["type"] == "train" and r["update"] == update + 1]
    assert resumed["lr"] == pytest.approx(5e-3)  # the documented formula, kept


@pytest.mark.parametrize("first_end, warned", [(7, True), (5, False)])
def test_a_run_extended_from_an_end_off_the_validation_grid_warns_that_its_last_validation_stays(
    tmp_path, capsys, first_end, warned
):
    config = tiny_config(tmp_path, max_updates=10, validate_every=5, warmup_updates=1, patience=4)
    assert main(["train", "--config", str(config), "--set", f"train.max_updates={first_end}"]) == 0
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    note = "warning: the run ended at update 7 with a validation off train.validate_every 5"
    assert (note in err) == warned and err.count("warning: the run ended") == int(warned)
    assert main(["train", "--config", str(config), "--set", "train.max_updates=10"]) == 0
    assert "warning: the run ended" not in capsys.readouterr().err  # a finished run stays finished: nothing to say


def test_a_resumed_run_computes_in_the_kernels_it_started_with(tmp_path, monkeypatch, capsys):
    """Under auto, a resume does not measure again: a measurement on busy cores (not cached) or a
    cleared cache could choose another attention kernel or product library, which round otherwise."""
    from nmt import autotune
    from nmt.kernel_choice import Choice

    picks = iter([("explicit", "blas"), ("sdpa", "onednn")])

    def measure(request, shape, device, world_threads=None):
        attention, library = next(picks)
        return Choice("fp32", attention, 1, {"attention": {attention: 1.0}}, "measured", "x", 0.2, library)

    monkeypatch.setattr(autotune, "measure", measure)
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))  # not the session's: this shape may be cached there
    config = tiny_config(tmp_path, max_updates=20, validate_every=10, attention="auto", fp32_matmul="auto")
    assert main(["train", "--config", str(config)]) == 0
    assert main(["train", "--config", str(config), "--set", "train.max_updates=30"]) == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert (
        "kept from the run's start" in log
        and "attention explicit" in log.split("kept from the run's start")[0].splitlines()[-1]
    )
    assert "attention sdpa" not in log


def test_a_first_start_that_failed_before_its_first_state_chooses_again(tmp_path, monkeypatch, capsys):
    """kernels.json from a start that trained nothing binds nothing: the next start chooses afresh
    (the config may even have changed, as it may before a first checkpoint) and says no resumed run
    changes kernels."""
    from nmt import autotune, trainer
    from nmt.kernel_choice import Choice

    picks = iter([("explicit", "blas"), ("sdpa", "onednn")])

    def measure(request, shape, device, world_threads=None):
        attention, library = next(picks)
        return Choice("fp32", attention, 1, {"attention": {attention: 1.0}}, "measured", "x", 0.2, library)

    def fail(*args, **kwargs):  # after the choice was recorded, before any training state
        raise NMTError("the first start failed")

    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))
    config = tiny_config(tmp_path, max_updates=10, validate_every=10, attention="auto", fp32_matmul="auto")
    with monkeypatch.context() as m:
        m.setattr(autotune, "measure", measure)
        m.setattr(trainer, "build_model", fail)
        assert main(["train", "--config", str(config)]) == 2
    assert (tmp_path / "run" / "kernels.json").exists()
    monkeypatch.setattr(autotune, "measure", measure)
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "model.d_model=16"]) == 0
    err = capsys.readouterr().err
    assert "auto: precision fp32, fp32 matmul onednn, attention sdpa" in err and "measured now" in err
    assert "kept from the run's start" not in err and "resumed run" not in err


def test_a_resume_whose_kernels_record_cannot_be_read_says_it_chooses_again(tmp_path, monkeypatch, capsys):
    """A kernels.json damaged, or written by another version of nmt, is no choice to keep: the
    resume says so, as for a record of another machine, rather than change kernels in silence."""
    from nmt import autotune
    from nmt.kernel_choice import Choice

    picks = iter([("explicit", "blas"), ("sdpa", "onednn")])

    def measure(request, shape, device, world_threads=None):
        attention, library = next(picks)
        return Choice("fp32", attention, 1, {"attention": {attention: 1.0}}, "measured", "x", 0.2, library)

    monkeypatch.setattr(autotune, "measure", measure)
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))
    config = tiny_config(tmp_path, max_updates=10, validate_every=10, attention="auto", fp32_matmul="auto")
    assert main(["train", "--config", str(config)]) == 0
    (tmp_path / "run" / "kernels.json").write_text('{"format": "nmt-autotune-1", "entries": {}}\n')
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=15"]) == 0
    err = capsys.readouterr().err
    assert "kernels.json cannot be read, or was written by another version of nmt; choosing again" in err
    assert "attention sdpa" in err


@pytest.fixture(scope="module")
def run_with_two_states(tmp_path_factory) -> Path:
    """A finished run with training states at updates 3 and 6; copy it before resuming it."""
    tmp_path = tmp_path_factory.mktemp("two-states")
    config = tiny_config(tmp_path, max_updates=6, validate_every=3, warmup_updates=1, threads=1, attention="sdpa")
    assert main(["train", "--config", str(config), "--set", "train.fp32_matmul=blas"]) == 0
    return tmp_path / "run"


def damage_state(path: Path, damage) -> None:
    """Rewrite training state ``path`` with ``damage(state)`` applied, its checksum dropped (as by hand)."""
    state = torch.load(path, weights_only=True)
    damage(state)
    torch.save(state, path)
    path.with_name(path.name + ".sha256").unlink()


def _set(part: str, key, value):
    return lambda state: state[part].__setitem__(key, value)


def _first_optimizer_state(key: str, value):
    return lambda state: state["optimizer"]["state"][0].__setitem__(key, value)


def _param_group(key: str, value):
    return lambda state: state["optimizer"]["param_groups"][0].__setitem__(key, value)


def _every_optimizer_state(key: str, fill: float):
    """Set ``key`` of every parameter's AdamW state to ``fill`` throughout."""

    def damage(state):
        for entry in state["optimizer"]["state"].values():
            entry[key] = torch.full_like(entry[key], fill)

    return damage


@pytest.mark.parametrize(
    "damage, said",
    [
        (_set("optimizer", "param_groups", 5), "optimizer.param_groups is not a list of mappings"),
        (lambda s: s["optimizer"]["param_groups"][0]["params"].pop(), "optimizer.param_groups[0].params is not a"),
        (_first_optimizer_state("exp_avg", torch.zeros(3)), "optimizer.state[0].exp_avg is not a tensor of shape"),
        (lambda s: s["optimizer"]["param_groups"].append({}), "optimizer.param_groups has 2 groups, not 1"),
        (_param_group("maximize", True), "optimizer.param_groups[0].maximize is True, not False as nmt builds AdamW"),
        (_param_group("amsgrad", True), "optimizer.param_groups[0].amsgrad is True, not False as nmt builds AdamW"),
        (_param_group("capturable", True), "optimizer.param_groups[0].capturable is True, not False"),
        (_param_group("differentiable", True), "optimizer.param_groups[0].differentiable is True, not False"),
        (
            _every_optimizer_state("exp_avg_sq", math.inf),
            "optimizer.state[0].exp_avg_sq holds values that are not finite",
        ),
        (_every_optimizer_state("exp_avg_sq", -1.0), "optimizer.state[0].exp_avg_sq holds values below 0"),
        (_every_optimizer_state("exp_avg", math.nan), "optimizer.state[0].exp_avg holds values that are not finite"),
        (
            _every_optimizer_state("step", -3.0),
            "optimizer.state[0].step is -3.0, not a whole number of steps from 0 on",
        ),
        (_every_optimizer_state("step", math.nan), "optimizer.state[0].step is nan, not a whole number of steps"),
        (_every_optimizer_state("step", 2.5), "optimizer.state[0].step is 2.5, not a whole number of steps"),
        (_first_optimizer_state("step", "x"), "optimizer.state[0].step is not a tensor of shape []"),
        (lambda s: s["optimizer"]["state"][0].pop("exp_avg_sq"), "optimizer.state[0] has no exp_avg_sq"),
        # stitched: the optimizer state of another update, or with a parameter's entry left out
        (_every_optimizer_state("step", 3.0), "its AdamW state has 3 steps, progress.update is 6: the optimizer"),
        (_every_optimizer_state("step", 7.0), "its AdamW state has 7 steps, progress.update is 6: the optimizer"),
        (lambda s: s["optimizer"]["state"].pop(2), "optimizer.state[2] is missing, optimizer.state[0] has 6"),
        (_first_optimizer_state("step", torch.tensor(5.0)), "optimizer.state[0] has 5 steps, optimizer.state[1] has 6"),
        (
            lambda s: s["optimizer"]["state"][0].__setitem__("exp_avg", s["optimizer"]["state"][0]["exp_avg"].long()),
            "optimizer.state[0].exp_avg is a tensor of torch.int64, not of floats",
        ),
        (_set("progress", "update", "x"), "progress.update is 'x', the file is named for update 6"),
        (_set("progress", "update", 2), "progress.update is 2, the file is named for update 6"),
        (_set("progress", "epoch", 0), "progress.epoch is 0, not a whole number from 1 on"),
        (_set("progress", "best_bleu", "x"), "progress.best_bleu is 'x', not a number"),
        (_set("progress", "plan_batchings", "x"), "progress.plan_batchings is 'x', not a list of batchings"),
        (_set("rng", "python", 5), "rng.python is not a Python random state"),
        (_set("rng", "torch", torch.zeros(3, dtype=torch.uint8)), "rng.torch is not a torch random state"),
        (lambda s: s.__setitem__("scaler", {"scale": "x"}), "scaler is not a loss scaler's state"),
        (lambda s: s.__setitem__("fingerprint", [1, 2]), "fingerprint is not a mapping"),
        (lambda s: s["fingerprint"].pop("tokenizer"), "fingerprint.tokenizer is not a mapping of SentencePiece"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_training_state_with_a_damaged_field_is_passed_over_for_the_one_before(
    run_with_two_states, tmp_path, capsys, damage, said
):
    # Each ended the resume in a traceback (KeyError, TypeError, ValueError, a crash in the fused AdamW),
    # or, for an update not the file's, trained on from the wrong update; some after half the state was restored.
    # AdamW's maximize trained on silently, by gradient ascent, an inf exp_avg_sq with every parameter
    # frozen; a negative step or a nan moment made every update non-finite, ended as 'training diverged'.
    run = tmp_path / "run"
    shutil.copytree(run_with_two_states, run)
    damage_state(run / "checkpoints" / "update_00000006.pt", damage)
    capsys.readouterr()
    assert main(["train", "--config", str(run / "config.yaml"), "--set", "train.max_updates=4"]) == 0
    log = capsys.readouterr().err
    passed_over = f"{run / 'checkpoints' / 'update_00000006.pt'}: not a training state nmt can resume ({said}"
    assert passed_over in log and "; trying an older checkpoint" in log
    assert "resuming at update 3 (epoch 4, batch 0)" in log
    assert checkpoint_file.load(run / "checkpoints" / "update_00000004.pt")["progress"]["update"] == 4


@pytest.mark.parametrize("steps, resumes", [(4.0, True), (6.0, True), (7.0, False)])
def test_an_earlier_versions_state_may_hold_fewer_adamw_steps_than_updates(
    run_with_two_states, tmp_path, capsys, steps, resumes
):
    # A version before world_size was recorded counted fp16 overflows as updates, AdamW not stepping.
    run = tmp_path / "run"
    shutil.copytree(run_with_two_states, run)

    def earlier_version(state):
        for key in ("world_size", "update_batches", "plan_epoch", "plan_batchings", "plan_data", "dev_data"):
            state["progress"].pop(key)
        _every_optimizer_state("step", steps)(state)

    damage_state(run / "checkpoints" / "update_00000006.pt", earlier_version)
    capsys.readouterr()
    assert main(["train", "--config", str(run / "config.yaml"), "--set", "train.max_updates=7"]) == 0
    log = capsys.readouterr().err
    assert ("resuming at update 6 (epoch 7, batch 0)" in log) == resumes, log
    assert ("the optimizer state is another update's" in log) != resumes


def test_adamw_settings_a_resume_replaces_may_be_any_number_in_a_training_state(run_with_two_states, tmp_path, capsys):
    # The schedule sets lr before every update and the config betas, eps and weight_decay on resume: a
    # saved nan lr passed a sound state over.
    run = tmp_path / "run"
    shutil.copytree(run_with_two_states, run)
    settings = {"lr": math.nan, "betas": (1.5, math.nan), "eps": -1.0, "weight_decay": math.inf}
    damage_state(
        run / "checkpoints" / "update_00000006.pt", lambda s: s["optimizer"]["param_groups"][0].update(settings)
    )
    capsys.readouterr()
    assert main(["train", "--config", str(run / "config.yaml"), "--set", "train.max_updates=7"]) == 0
    log = capsys.readouterr().err
    assert "resuming at update 6 (epoch 7, batch 0)" in log and "trying an older checkpoint" not in log
    state = checkpoint_file.load(run / "checkpoints" / "update_00000007.pt")
    [group] = state["optimizer"]["param_groups"]
    assert (tuple(group["betas"]), group["eps"], group["weight_decay"]) == ((0.9, 0.98), 1e-8, 0.0)
    assert math.isfinite(group["lr"]) and all(torch.isfinite(w).all() for w in state["model"].values())


def test_a_run_whose_training_states_are_all_damaged_is_refused_in_one_line(run_with_two_states, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_with_two_states, run)
    for update in (3, 6):
        damage_state(run / "checkpoints" / f"update_{update:08d}.pt", _set("rng", "python", 5))
    capsys.readouterr()
    assert main(["train", "--config", str(run / "config.yaml"), "--set", "train.max_updates=9"]) == 2
    *said, line = capsys.readouterr().err.strip().splitlines()
    warning = "(rng.python is not a Python random state); trying an older checkpoint"
    assert len([w for w in said if w.endswith(warning)]) == 2
    assert line == (
        f"nmt train: error: {run / 'checkpoints'}: none of the run's 2 training-state checkpoints (update_*.pt) is "
        "readable; restore one, or train into a new run_dir to start over"
    )


def test_a_checkpoint_with_a_damaged_fingerprint_is_refused_in_one_line(run_with_two_states, tmp_path, capsys):
    # translate, average and export matched it against the run with a TypeError traceback
    run = tmp_path / "run"
    shutil.copytree(run_with_two_states, run)
    damage_state(run / "checkpoints" / "update_00000006.pt", lambda s: s.__setitem__("fingerprint", [1, 2]))
    source = str(run_with_two_states.parent / "data" / "train.de")
    capsys.readouterr()
    for command in (
        ["translate", "--model", str(run), "-i", source, "--checkpoint", "update_00000006.pt"],
        ["average", "--model", str(run), "--last", "2"],
    ):
        assert main(command) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line == (
            f"nmt {command[0]}: error: {run / 'checkpoints' / 'update_00000006.pt'}: the checkpoint is damaged "
            "(fingerprint is not a mapping); use another checkpoint"
        )


@pytest.mark.parametrize(
    "damage",
    [_set("optimizer", "param_groups", 5), _set("progress", "update", "x"), _set("rng", "python", 5)],
    ids=["optimizer", "progress", "rng"],
)
def test_translate_and_average_read_only_the_model_of_a_damaged_training_state(
    run_with_two_states, tmp_path, capsys, damage
):
    # A resume passes it over; its model is sound. nmt average took a damaged progress for an
    # interruption's state and said that only 1 state written by a validation existed.
    run = tmp_path / "run"
    shutil.copytree(run_with_two_states, run)
    damage_state(run / "checkpoints" / "update_00000006.pt", damage)
    source = str(run_with_two_states.parent / "data" / "train.de")
    args = ["--model", str(run), "-i", source, "-o", str(tmp_path / "out.en"), "--checkpoint", "update_00000006.pt"]
    assert main(["translate", *args]) == 0
    assert len((tmp_path / "out.en").read_text().splitlines()) == len(PAIRS)
    capsys.readouterr()
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    assert "average of updates 3, 6: dev BLEU" in capsys.readouterr().err


def test_an_attention_synonym_resumes_and_another_kind_is_refused(tmp_path, capsys):
    # 'bilinear' builds the module 'general' does, with the same parameters: the checkpoint fits.
    config = tiny_config(tmp_path, "rnn", max_updates=5, validate_every=5, warmup_updates=2)
    assert main(["train", "--config", str(config), "--set", "model.attention=general"]) == 0
    longer = ["--set", "train.max_updates=6"]
    assert main(["train", "--config", str(config), "--set", "model.attention=bilinear", *longer]) == 0
    assert "resuming at update 5" in capsys.readouterr().err
    assert main(["train", "--config", str(config), "--set", "model.attention=mlp", *longer]) == 2
    assert "cannot resume" in capsys.readouterr().err


def test_a_resume_with_another_accumulate_says_what_an_update_now_takes(tmp_path, capsys):
    # It was accepted without a word: the update's size changed and train.log did not show where.
    config = tiny_config(tmp_path, max_updates=2, validate_every=2, warmup_updates=1)
    assert main(["train", "--config", str(config)]) == 0
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=3", "--set", "train.accumulate=2"]) == 0
    line = "resuming with train.accumulate 2: an update now takes 2 batches, not 1"
    assert line in capsys.readouterr().err and line in (tmp_path / "run" / "train.log").read_text()
