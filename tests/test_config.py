"""The config is checked once: wrong keys, types and ranges give one-line errors naming the key."""

from pathlib import Path

import pytest

from nmt.config import Config, apply_overrides, config_from_dict, load_config, save_config
from nmt.errors import NMTError

MINIMAL = {"data": {"train": "d/train", "dev": "d/dev"}, "train": {"max_updates": 10, "warmup_updates": 2}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_shipped_configs_load():
    for path in sorted(Path("configs").glob("*.yaml")):
        cfg = load_config(path)
        assert isinstance(cfg, Config)
        assert cfg.model.d_model % cfg.model.heads == 0


def test_corpus_shorthand_and_float_parsing(tmp_path):
    cfg = load_config(
        write(
            tmp_path, "data: {train: a/train, dev: a/dev}\ntrain: {max_updates: 5, lr_peak: 5e-4, warmup_updates: 1}\n"
        )
    )
    assert cfg.data.train.path == "a/train" and cfg.data.train.format == "auto"
    assert cfg.train.lr_peak == pytest.approx(5e-4)


def test_unknown_key_suggests_closest(tmp_path):
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: 5, lr_pek: 0.1}\n")
    with pytest.raises(NMTError, match=r"unknown config key 'train.lr_pek' \(did you mean 'train.lr_peak'\?\)"):
        load_config(path)


def test_unknown_section(tmp_path):
    with pytest.raises(NMTError, match="unknown config key 'modle'.*'model'"):
        load_config(write(tmp_path, "modle: {}\n"))


@pytest.mark.parametrize(
    "section,key,value,message",
    [
        ("train", "max_tokens", "many", "train.max_tokens': expected an integer"),
        ("train", "max_tokens", -5, "train.max_tokens': -5 must be > 0"),
        ("model", "dropout", 1.5, "model.dropout': 1.5 must be in"),
        ("model", "type", "lstm", "model.type': 'lstm' is not one of"),
        ("train", "betas", [0.9], "train.betas': expected a list of 2"),
        ("model", "tie_output", "yes", "model.tie_output': expected true or false"),
        ("tokenizer", "vocab_size", 3, "tokenizer.vocab_size': 3 must be >= 16"),
    ],
)
def test_wrong_type_or_range(section, key, value, message):
    values = {**MINIMAL, section: {**MINIMAL.get(section, {}), key: value}}
    with pytest.raises(NMTError, match=message.replace("(", r"\(")):
        config_from_dict(values)


def test_consistency_checks():
    with pytest.raises(NMTError, match="train.warmup_updates': 20 exceeds train.max_updates 10"):
        config_from_dict({**MINIMAL, "train": {"max_updates": 10, "warmup_updates": 20}})
    with pytest.raises(NMTError, match="model.heads"):
        config_from_dict({**MINIMAL, "model": {"d_model": 30, "heads": 4}})
    with pytest.raises(NMTError, match="at least one of max_updates"):
        config_from_dict({"data": MINIMAL["data"]})
    with pytest.raises(NMTError, match="tokenizer.joint"):
        config_from_dict({**MINIMAL, "tokenizer": {"joint": False}})


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "train:\n  max_updates: 5\n  lr: [1, 2\n")
    with pytest.raises(NMTError, match=r"c.yaml: line \d+, column \d+: YAML does not parse"):
        load_config(path)


def test_missing_and_empty_config(tmp_path):
    with pytest.raises(NMTError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(NMTError, match="is empty"):
        load_config(write(tmp_path, "# nothing\n"))
    with pytest.raises(NMTError, match="is a directory"):
        load_config(tmp_path)


def test_overrides_parse_values_and_create_sections():
    values = apply_overrides(
        {"data": {"train": "x", "dev": "y"}},
        [
            "train.max_updates=7",
            "train.warmup_updates=0",
            "train.lr_peak=3e-4",
            "model.norm=pre",
            "data.train.max_pairs=3",
        ],
    )
    cfg = config_from_dict(values)
    assert cfg.train.max_updates == 7 and cfg.train.lr_peak == pytest.approx(3e-4)
    assert cfg.model.norm == "pre" and cfg.data.train.max_pairs == 3 and cfg.data.train.path == "x"


def test_save_and_reload_roundtrip(tmp_path):
    cfg = config_from_dict({**MINIMAL, "train": {"max_updates": 10, "warmup_updates": 2, "betas": [0.8, 0.9]}})
    save_config(cfg, tmp_path / "saved.yaml")
    again = load_config(tmp_path / "saved.yaml")
    assert again == cfg
