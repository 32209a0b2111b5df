"""A model too large for the memory there is stops in one line before anything of its size is
allocated, counting only what is certain: a model that fits is never refused."""

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_config

import nmt.model_memory
from nmt import autotune
from nmt.cli import main
from nmt.config import load_config
from nmt.errors import NMTError
from nmt.model_memory import check_training_fits, device_memory, model_size
from nmt.models import build_model
from nmt.rundir import RunDir
from nmt.trainer import Trainer

VOCAB = 60  # the tiny config's tokenizer.vocab_size, which SentencePiece gives exactly


def _training_bytes_by_hand(model) -> tuple[int, int]:
    """(parameters, bytes): fp32 weight, gradient and AdamW's two moments for each parameter (a tied
    one once), and the buffers."""
    parameters = sum(p.numel() for p in model.parameters())
    return parameters, 16 * parameters + sum(b.numel() * b.element_size() for b in model.buffers())


@pytest.mark.parametrize(
    "model_type, overrides",
    [
        ("transformer", []),
        ("transformer", ["model.positions=learned", "model.tie_output=false", "model.norm=post"]),
        ("rnn", []),
        ("rnn", ["model.rnn_cell=gru", "model.attention=mlp", "model.input_feeding=false"]),
    ],
)
def test_the_size_counted_on_the_meta_device_is_the_built_models(tmp_path, model_type, overrides):
    cfg = load_config(tiny_config(tmp_path, model_type), overrides)
    size = model_size(cfg.model, VOCAB, VOCAB, 0)
    parameters, training_bytes = _training_bytes_by_hand(build_model(cfg.model, VOCAB, VOCAB, 0))
    assert (size.parameters, size.training_bytes) == (parameters, training_bytes)


def _fake_memory(monkeypatch, total: int) -> None:
    monkeypatch.setattr(nmt.model_memory, "memory_bytes", lambda: total)


def test_a_model_too_large_to_train_stops_in_one_line_before_the_kernel_measurement(tmp_path, monkeypatch, capsys):
    config = tiny_config(tmp_path, precision="auto")
    cfg = load_config(config)
    parameters, need = _training_bytes_by_hand(build_model(cfg.model, VOCAB, VOCAB, 0))
    _fake_memory(monkeypatch, need - 1)

    def measure(*args, **kwargs):
        raise AssertionError("the kernel measurement ran")

    monkeypatch.setattr(autotune, "measure", measure)
    assert main(["train", "--config", str(config)]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == (
        "nmt train: error: the model is too large to train here (model.d_model 64, model.ff_size 128, "
        "model.encoder_layers 1, model.decoder_layers 1, model.max_positions 1024, tokenizer.vocab_size 60): its "
        f"{parameters:,} parameters "
        f"need {need / 1e9:.2g} GB for weights, gradients and AdamW's two moments alone (16 bytes a parameter in "
        f"fp32), more than the {(need - 1) / 1e9:.2g} GB of memory this process may use"
    )
    assert not list((tmp_path / "run" / "checkpoints").glob("*.pt"))


def test_a_model_that_just_fits_is_not_refused(tmp_path, monkeypatch):
    """No activations or other guesses: memory for exactly the weights, gradients, moments and buffers
    is enough for the check."""
    cfg = load_config(tiny_config(tmp_path))
    _fake_memory(monkeypatch, _training_bytes_by_hand(build_model(cfg.model, VOCAB, VOCAB, 0))[1])
    trainer = Trainer(cfg, RunDir(cfg.run_dir), lambda message: None)
    trainer.setup()
    assert trainer.train_step([list(range(8))]) is not None
    trainer.close()


def test_the_demo_with_a_16m_wide_model_is_refused_naming_its_keys():
    cfg = load_config("configs/demo.yaml", ["model.d_model=16777216", "model.heads=1"])
    with pytest.raises(NMTError, match=r"^the model is too large to train here \(model.d_model 16777216, ") as err:
        check_training_fits(cfg.model, 320, 320, 0, torch.device("cpu"))
    assert "tokenizer.vocab_size 320): its 6,755,474,401,658,880 parameters need 108,087,659.1 GB" in str(err.value)


def test_learned_positions_too_many_to_train_are_refused_naming_model_max_positions(monkeypatch):
    # 2^24 learned positions of 128 dimensions are 2.1 billion parameters: the key to lower is
    # max_positions, not the widths and layers the demo's 0.97M parameters come from.
    _fake_memory(monkeypatch, 8 * 10**9)
    cfg = load_config("configs/demo.yaml", ["model.positions=learned", "model.max_positions=16777216"])
    with pytest.raises(NMTError, match="model.decoder_layers 2, model.max_positions 16777216, tokenizer") as err:
        check_training_fits(cfg.model, 320, 320, 0, torch.device("cpu"))
    assert "its 2,148,450,816 parameters" in str(err.value)


def test_on_a_gpu_its_total_memory_is_what_there_is(tmp_path, monkeypatch):
    cfg = load_config(tiny_config(tmp_path))
    need = _training_bytes_by_hand(build_model(cfg.model, VOCAB, VOCAB, 0))[1]
    _fake_memory(monkeypatch, 10**15)  # the host's memory does not count
    gpu = SimpleNamespace(total_memory=need - 1, name="Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    with pytest.raises(NMTError, match=r"more than the .* GB of memory the GPU \(Fake GPU\) has$"):
        check_training_fits(cfg.model, VOCAB, VOCAB, 0, torch.device("cuda"))
    gpu.total_memory = need
    check_training_fits(cfg.model, VOCAB, VOCAB, 0, torch.device("cuda"))


def test_training_processes_on_one_cpu_machine_share_its_memory(monkeypatch):
    _fake_memory(monkeypatch, 8 * 10**9)
    assert device_memory(torch.device("cpu")) == (8 * 10**9, "memory this process may use")
    assert device_memory(torch.device("cpu"), 2) == (
        4 * 10**9,
        "memory each of 2 training processes has of this machine's 8.0 GB",
    )
    _fake_memory(monkeypatch, None)  # not readable: no check
    assert device_memory(torch.device("cpu"))[0] is None
