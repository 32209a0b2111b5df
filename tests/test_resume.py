"""A run stopped and resumed ends with exactly the parameters of the same run left alone."""

import torch
from conftest import tiny_config

from nmt import checkpoint
from nmt.cli import main


def final_weights(run_dir):
    [latest, *_] = checkpoint.list_checkpoints(run_dir / "checkpoints", "update")
    return latest.update, checkpoint.load(latest.path)["model"]


def test_stop_and_resume_equals_uninterrupted(tmp_path):
    # Dropout on, so the random-number state must be restored too; several epochs, so the
    # data order of a later epoch must continue as it would have.
    straight = tiny_config(tmp_path / "a", max_updates=40, validate_every=10, max_tokens=128)
    assert main(["train", "--config", str(straight), "--set", "model.dropout=0.1"]) == 0
    resumed = tiny_config(tmp_path / "b", max_updates=40, validate_every=10, max_tokens=128)
    overrides = ["--set", "model.dropout=0.1"]
    assert main(["train", "--config", str(resumed), *overrides, "--set", "train.max_updates=17"]) == 0
    assert main(["train", "--config", str(resumed), *overrides]) == 0
    update_a, weights_a = final_weights(tmp_path / "a" / "run")
    update_b, weights_b = final_weights(tmp_path / "b" / "run")
    assert update_a == update_b == 40
    for name, tensor in weights_a.items():
        assert torch.equal(tensor, weights_b[name]), name


def test_changed_model_is_refused_on_resume(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=5, validate_every=5, warmup_updates=2)
    assert main(["train", "--config", str(config)]) == 0
    assert main(["train", "--config", str(config), "--set", "model.d_model=32"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err and "model.d_model: 64 -> 32" in err
