"""The config is checked once: wrong keys, types and ranges give one-line errors naming the key."""

import copy
import errno
import re
from dataclasses import replace
from pathlib import Path

import pytest

from nmt.batching import make_batch
from nmt.cli import main
from nmt.config import Config, config_from_dict, config_yaml, load_config
from nmt.config_checks import check_case_folding_scoring
from nmt.config_sources import apply_overrides
from nmt.corpus import filter_by_length
from nmt.errors import NMTError
from nmt.models import RNNConfig, TransformerConfig, build_model

MINIMAL = {"data": {"train": "d/train", "dev": "d/dev"}, "train": {"max_updates": 10, "warmup_updates": 2}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_shipped_configs_load_from_any_directory(tmp_path, monkeypatch):
    """Their relative paths are read against configs/, so they name the same files from anywhere."""
    root = Path(__file__).resolve().parent.parent
    paths = sorted((root / "configs").glob("*.yaml"))
    assert paths
    for path in paths:
        monkeypatch.chdir(root)
        here = load_config(Path("configs") / path.name)
        monkeypatch.chdir(tmp_path)
        there = load_config(path)
        assert here == there and isinstance(here, Config)
        assert Path(here.run_dir) == root / "runs" / path.stem
        if here.data.train.format != "hf":
            assert Path(here.data.train.path).parent.parent in (root / "data", root / "runs")
        assert isinstance(here.model, RNNConfig if here.model.type == "rnn" else TransformerConfig)


def test_relative_paths_follow_the_config_file_and_set_follows_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "exp" / "d").mkdir(parents=True)
    (tmp_path / "d").mkdir()
    path = tmp_path / "exp" / "c.yaml"
    path.write_text(
        "run_dir: runs/a\ndata: {train: d/train, dev: {path: ../d/dev}, test: wmt14}\ntrain: {max_minutes: 5}\n"
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config(path)
    assert cfg.run_dir == str(tmp_path / "exp" / "runs" / "a")
    assert cfg.data.train.path == str(tmp_path / "exp" / "d" / "train")
    assert cfg.data.dev.path == str(tmp_path / "d" / "dev")
    assert cfg.data.test.path == "wmt14"  # a hub dataset name, not a path
    cfg = load_config(path, ["run_dir=elsewhere", "data.dev=d/dev2"])
    assert cfg.run_dir == str(tmp_path / "elsewhere") and cfg.data.dev.path == str(tmp_path / "d" / "dev2")
    assert cfg.data.train.path == str(tmp_path / "exp" / "d" / "train")


def test_dot_dot_in_a_path_is_taken_in_the_file_system_after_a_symlinked_directory(tmp_path, monkeypatch):
    # project/configs/c.yaml reached through a link to project/configs: its '..' is project, as for
    # the shell's ls and every open(); a lexical one would name the link's parent
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "c.yaml").write_text(
        "run_dir: ../runs/a\ndata: {train: ../data/train, dev: ../data/dev}\ntrain: {max_minutes: 5}\n"
    )
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "configs").symlink_to(project / "configs")
    link = tmp_path / "elsewhere" / "configs" / "c.yaml"
    monkeypatch.chdir(tmp_path / "elsewhere")
    data = (str(project / "data" / "train"), str(project / "data" / "dev"))
    for cfg in (load_config(link), load_config("configs/../configs/c.yaml")):
        assert cfg.run_dir == str(project / "runs" / "a") and (cfg.data.train.path, cfg.data.dev.path) == data
    cfg = load_config(link, ["data.dev=configs/../d/dev", "run_dir=configs/../r"])  # so is a --set's
    assert (cfg.data.dev.path, cfg.run_dir) == (str(project / "d" / "dev"), str(project / "r"))
    through_real_dirs = tmp_path / "elsewhere" / ".." / "project" / "configs" / "c.yaml"
    assert load_config(through_real_dirs).run_dir == str(project / "runs" / "a")


def test_a_saved_config_writes_non_ascii_paths_and_names_as_they_are(tmp_path):
    # a run's config.yaml is read and edited by hand: "data/\\xFCbersetzung" is the path a user cannot find
    (tmp_path / "daten ü").mkdir()
    path = write(tmp_path, "name: Übersetzung 日本\ndata: {train: 'daten ü/train', dev: b}\ntrain: {max_minutes: 5}\n")
    cfg = load_config(path)
    text = config_yaml(cfg)
    assert "name: Übersetzung 日本" in text and f"path: {tmp_path}/daten ü/train" in text
    saved = tmp_path / "saved.yaml"
    saved.write_text(text, encoding="utf-8")
    assert load_config(saved) == cfg


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
        ("tokenizer", "vocab_size", 3, "tokenizer.vocab_size': 3 must be in .16, 16777216."),
        ("tokenizer", "character_coverage", 0.95, "tokenizer.character_coverage': 0.95 must be in .0.98, 1."),
        ("tokenizer", "normalization", "nfc", "tokenizer.normalization': 'nfc' is not one of 'nmt_nfkc', 'nfkc'"),
        ("tokenizer", "threads", 0, "tokenizer.threads': 0 must be in .1, 1024. .what SentencePiece accepts."),
        ("tokenizer", "threads", "auto", "tokenizer.threads': expected an integer"),
        ("data", "max_len_ratio", 0.5, "data.max_len_ratio': 0.5 must be >= 1"),  # the longer/shorter ratio is >= 1
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
    with pytest.raises(NMTError, match="schedule 'cosine' needs decay_updates, max_updates or max_minutes"):
        config_from_dict({"data": MINIMAL["data"], "train": {"max_epochs": 3, "schedule": "cosine"}})
    config_from_dict({"data": MINIMAL["data"], "train": {"max_minutes": 3, "schedule": "cosine"}})  # decays over time


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "train:\n  max_updates: 5\n  lr: [1, 2\n")
    with pytest.raises(NMTError, match=r"c.yaml: line \d+, column \d+: YAML does not parse"):
        load_config(path)


@pytest.mark.parametrize("character", ["\x00", "\x1b", "\x0c"])
def test_a_control_character_in_a_config_is_an_error_naming_its_line_and_column(tmp_path, character):
    path = write(tmp_path, f"data: {{train: a, dev: b}}\ntrain:\n  max_minutes: 5{character}\n")
    with pytest.raises(NMTError, match=r"c.yaml: line 3, column 17: YAML does not parse: unacceptable character"):
        load_config(path)


@pytest.mark.parametrize("value", ["2023-02-30", "!!int abc", "9" * 5000])
def test_a_value_yaml_cannot_construct_is_an_error_naming_its_line(tmp_path, value):
    # PyYAML raises a bare ValueError for these (an impossible date, a tagged non-number, an integer
    # over Python's 4,300 digits), which the CLI printed as a traceback
    path = write(tmp_path, f"data: {{train: a, dev: b}}\ntrain: {{max_minutes: 5}}\nname: {value}\n")
    with pytest.raises(NMTError, match=r"c.yaml: line 3, column 7: YAML does not parse: cannot read the value"):
        load_config(path)
    valid = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_minutes: 5}\n")
    assert load_config(valid, ["name=2023-02-30"]).name == "2023-02-30"  # a --set keeps the text
    with pytest.raises(NMTError, match=r"--set train.max_updates=9+: config key 'train.max_updates'"):
        load_config(valid, ["train.max_updates=" + "9" * 5000])


def test_a_config_file_that_cannot_be_read_is_an_error_naming_it(tmp_path, monkeypatch):
    path = write(tmp_path, "data: {train: a, dev: b}\n")

    def failing_read(self, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Path, "read_text", failing_read)
    with pytest.raises(NMTError, match=r"c.yaml: cannot read the config file \(Input/output error\)"):
        load_config(path)


def test_missing_and_empty_config(tmp_path):
    with pytest.raises(NMTError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(NMTError, match="is empty"):
        load_config(write(tmp_path, "# nothing\n"))
    with pytest.raises(NMTError, match="is a directory"):
        load_config(tmp_path)


def test_overrides_parse_values_and_create_sections():
    values = {"data": {"train": "x", "dev": "y"}}
    keys = apply_overrides(
        values,
        [
            "train.max_updates=7",
            "train.warmup_updates=0",
            "train.lr_peak=3e-4",
            "model.norm=pre",
            "data.train.max_pairs=3",
        ],
    )
    assert keys == {"train.max_updates", "train.warmup_updates", "train.lr_peak", "model.norm", "data.train.max_pairs"}
    cfg = config_from_dict(values)
    assert cfg.train.max_updates == 7 and cfg.train.lr_peak == pytest.approx(3e-4)
    assert cfg.model.norm == "pre" and cfg.data.train.max_pairs == 3 and cfg.data.train.path == "x"


def test_save_and_reload_roundtrip(tmp_path):
    values = {**MINIMAL, "model": {"type": "rnn", "rnn_hidden": 32}}
    values["train"] = {"max_updates": 10, "warmup_updates": 2, "betas": [0.8, 0.9]}
    cfg = config_from_dict(values, tmp_path)
    (tmp_path / "saved.yaml").write_text(config_yaml(cfg))
    again = load_config(tmp_path / "saved.yaml")
    assert again == cfg and again.model.rnn_hidden == 32


def test_model_sections_by_type():
    rnn = config_from_dict({**MINIMAL, "model": {"type": "rnn", "rnn_hidden": 32, "heads": 4}}).model
    assert isinstance(rnn, RNNConfig) and rnn.rnn_hidden == 32 and rnn.max_positions is None
    assert not hasattr(rnn, "heads")  # a Transformer key at its default: accepted (older saved configs list it)
    with pytest.raises(NMTError, match="'model.heads': applies to model.type 'transformer', not 'rnn'"):
        config_from_dict({**MINIMAL, "model": {"type": "rnn", "heads": 8}})
    with pytest.raises(NMTError, match="'model.rnn_hidden': applies to model.type 'rnn', not 'transformer'"):
        config_from_dict({**MINIMAL, "model": {"rnn_hidden": 64}})
    with pytest.raises(NMTError, match=r"unknown config key 'model.rnn_hiden' \(did you mean 'model.rnn_hidden'\?\)"):
        config_from_dict({**MINIMAL, "model": {"type": "rnn", "rnn_hiden": 64}})
    with pytest.raises(NMTError, match="model.attention': 'dot' needs equal"):
        config_from_dict({**MINIMAL, "model": {"type": "rnn", "attention": "dot"}})


@pytest.mark.parametrize("kind", [["rnn"], {"rnn": None}, "RNN"])
def test_a_model_type_that_is_no_type_name_is_an_error_naming_the_key(kind):
    with pytest.raises(NMTError, match=r"config key 'model.type': .* is not one of 'transformer', 'rnn'$"):
        config_from_dict({**MINIMAL, "model": {"type": kind}})


@pytest.mark.parametrize(
    "keys,message",
    [
        ("dev: b, src_lang: no", r"'data.src_lang': expected a string, got False \(YAML reads unquoted yes, no"),
        ("dev: b, trg_lang: on", r"'data.trg_lang': expected a string, got True \(YAML reads unquoted yes, no"),
        ("dev: 2024-05-01", r"'data.dev': expected a path or a mapping, got datetime.date\(2024, 5, 1\) \(YAML reads"),
    ],
)
def test_a_string_that_yaml_read_as_another_type_says_to_quote_it(tmp_path, keys, message):
    with pytest.raises(NMTError, match=message):
        load_config(write(tmp_path, f"data: {{train: a, {keys}}}\ntrain: {{max_minutes: 5}}\n"))
    quoted = keys[: keys.rindex(" ") + 1] + f"'{keys[keys.rindex(' ') + 1 :]}'"
    load_config(write(tmp_path, f"data: {{train: a, {quoted}}}\ntrain: {{max_minutes: 5}}\n"))


@pytest.mark.parametrize("text,expected", [("5e-4", 5e-4), ("1E3", 1000.0), ("+2.5e-1", 0.25), (".5e1", 5.0)])
def test_scientific_notation_is_a_number_in_files_and_overrides(tmp_path, text, expected):
    file_text = f"data: {{train: a, dev: b}}\ntrain: {{max_minutes: 5, weight_decay: {text}}}\n"
    from_file = load_config(write(tmp_path, file_text))
    values = copy.deepcopy(MINIMAL)
    apply_overrides(values, [f"train.weight_decay={text}"])
    assert from_file.train.weight_decay == config_from_dict(values).train.weight_decay == pytest.approx(expected)


def test_scientific_notation_is_an_integer_where_a_key_takes_one_and_it_is_whole(tmp_path):
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: 1e4, max_tokens: '2.5E3'}\n")
    cfg = load_config(path, ["train.validate_every=1e3"])
    assert (cfg.train.max_updates, cfg.train.max_tokens, cfg.train.validate_every) == (10000, 2500, 1000)
    assert isinstance(cfg.train.max_updates, int)
    with pytest.raises(NMTError, match=r"config key 'train.max_updates': expected an integer, got '1.5e0'$"):
        load_config(path, ["train.max_updates=1.5e0"])
    with pytest.raises(NMTError, match=r"config key 'train.max_tokens': expected an integer, got '5e-4'$"):
        load_config(path, ["train.max_tokens=5e-4"])
    with pytest.raises(NMTError, match=r"config key 'train.max_tokens': 1000000000000 must be at most"):
        load_config(path, ["train.max_tokens=1e12"])


def test_strings_that_only_resemble_numbers_stay_strings(tmp_path):
    cfg = load_config(write(tmp_path, "name: e5\ndata: {train: 1e5x, dev: b, src_lang: e1}\ntrain: {max_minutes: 5}\n"))
    assert cfg.name == "e5" and cfg.data.src_lang == "e1" and cfg.data.train.path.endswith("1e5x")


def test_scientific_notation_for_a_string_key_stays_the_text_written(tmp_path):
    text = "name: '1e3'\ndata: {train: 5e-4, dev: {path: b, revision: 2E5}}\ntrain: {max_minutes: 5, lr_peak: '1e-3'}\n"
    cfg = load_config(write(tmp_path, text), ["data.test=1e6"])
    assert cfg.name == "1e3" and cfg.data.dev.revision == "2E5"
    assert Path(cfg.data.train.path).name == "5e-4" and Path(cfg.data.test.path).name == "1e6"
    assert cfg.train.lr_peak == pytest.approx(1e-3)  # a key that takes a number reads it, quoted or not
    with pytest.raises(NMTError, match=r"config key 'model.dropout': 1e0 must be in \[0, 1\)"):
        load_config(write(tmp_path, text), ["model.dropout=1e0"])
    saved = tmp_path / "saved" / "config.yaml"
    saved.parent.mkdir()
    saved.write_text(config_yaml(cfg))
    assert load_config(saved) == cfg


@pytest.mark.parametrize(
    "section,key,value",
    [
        ("train", "lr_peak", float("inf")),
        ("train", "max_minutes", float("inf")),
        ("train", "lr_min", float("nan")),
        ("train", "betas", [0.9, float("inf")]),
        ("train", "max_minutes", 10**400),  # an integer too large for a float: "too large, not a finite number"
        ("model", "dropout", float("-inf")),
    ],
)
def test_float_keys_must_be_finite(section, key, value):
    values = {**MINIMAL, section: {**MINIMAL.get(section, {}), key: value}}
    with pytest.raises(NMTError, match=f"'{section}.{key}': .* not a finite number"):
        config_from_dict(values)


def test_infinity_in_a_file_or_override_is_rejected(tmp_path):
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: 5, warmup_updates: 1, lr_peak: .inf}\n")
    with pytest.raises(NMTError, match="'train.lr_peak': inf is not a finite number"):
        load_config(path)
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: 5, warmup_updates: 1}\n")
    with pytest.raises(NMTError, match="'train.lr_peak': inf is not a finite number"):
        load_config(path, ["train.lr_peak=1e400"])


def test_train_cross_key_bounds():
    with pytest.raises(NMTError, match=r"'train.lr_min': 1.0 exceeds train.lr_peak 0.0007"):
        config_from_dict({**MINIMAL, "train": {**MINIMAL["train"], "lr_peak": 7e-4, "lr_min": 1.0}})
    with pytest.raises(NMTError, match="'train.warmup_updates': 8 exceeds train.decay_updates 5"):
        config_from_dict(
            {**MINIMAL, "train": {"max_minutes": 5, "warmup_updates": 8, "decay_updates": 5, "schedule": "linear"}}
        )
    # Keys a schedule would ignore are refused, as the other model type's keys are.
    for schedule in ("inverse_sqrt", "constant"):
        with pytest.raises(NMTError, match=f"'train.decay_updates': schedule '{schedule}' does not use it"):
            config_from_dict({**MINIMAL, "train": {**MINIMAL["train"], "schedule": schedule, "decay_updates": 50}})
    with pytest.raises(NMTError, match="'train.lr_min': schedule 'constant' stays at lr_peak"):
        config_from_dict({**MINIMAL, "train": {**MINIMAL["train"], "schedule": "constant", "lr_min": 1e-5}})
    for schedule in ("cosine", "linear"):
        config_from_dict({**MINIMAL, "train": {**MINIMAL["train"], "schedule": schedule, "decay_updates": 50}})
    same = config_from_dict({**MINIMAL, "train": {**MINIMAL["train"], "lr_peak": 1e-3, "lr_min": 1e-3}})
    assert same.train.lr_min == same.train.lr_peak  # a flat rate after warmup is allowed


@pytest.mark.parametrize("rule", ["nmt_nfkc_cf", "nfkc_cf"])
def test_a_case_folding_tokenizer_needs_case_insensitive_bleu(rule):
    folding = config_from_dict({**MINIMAL, "tokenizer": {"normalization": rule}})
    with pytest.raises(NMTError, match=f"'decode.bleu_lowercase': tokenizer.normalization '{rule}' lower-cases"):
        check_case_folding_scoring(folding)
    check_case_folding_scoring(replace(folding, decode=replace(folding.decode, bleu_lowercase=True)))


def test_a_new_runs_scoring_error_names_the_line_or_the_set_that_gave_the_value(tmp_path, monkeypatch, capsys):
    # Checked as the run starts (open_for_training), which had the config file but not its --set
    # options: the error named the file alone, as though the file gave the value.
    monkeypatch.chdir(tmp_path)
    given = "data: {train: a, dev: a}\ntrain: {max_updates: 5, warmup_updates: 1}\n"
    given += "tokenizer: {normalization: nmt_nfkc_cf}\n"
    folding = "config key 'decode.bleu_lowercase': tokenizer.normalization 'nmt_nfkc_cf' lower-cases the translations"
    path = write(tmp_path, given + "decode: {bleu_lowercase: false}\n")
    assert main(["prepare", "--config", str(path)]) == 2
    assert f"nmt prepare: error: {path}: line 4, column 10: {folding}" in capsys.readouterr().err
    path = write(tmp_path, given)
    assert main(["prepare", "--config", str(path), "--set", "decode.bleu_lowercase=false"]) == 2
    assert f"nmt prepare: error: --set decode.bleu_lowercase=false: {folding}" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before anything is written


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_positions_must_cover_the_longest_training_pair(positions):
    """A pair of data.max_len subwords takes max_len + 1 positions (EOS on the source, BOS on the
    decoder input): the model must have that many, or training fails at the first long batch
    (learned), or trains on pairs longer than translation and export allow (sinusoidal)."""
    model = {"positions": positions, "max_positions": 16, "d_model": 32, "heads": 4, "ff_size": 32}
    data = {**MINIMAL["data"], "max_len": 64}
    with pytest.raises(NMTError, match="'model.max_positions': 16 must exceed data.max_len 64"):
        config_from_dict({**MINIMAL, "data": data, "model": model})
    with pytest.raises(NMTError, match="'model.max_positions': 64 must exceed data.max_len 64"):
        config_from_dict({**MINIMAL, "data": data, "model": {**model, "max_positions": 64}})
    cfg = config_from_dict({**MINIMAL, "data": data, "model": {**model, "max_positions": 65}})
    longest = [[5] * 64]
    batch = make_batch(longest, longest, [0], pad_id=0, bos_id=1, eos_id=2)
    out = build_model(cfg.model, 10, 10, pad_id=0)(batch.src, batch.src_mask, batch.trg_in)
    assert out.shape[1] == 65


def test_seed_in_the_range_torch_accepts():
    import torch

    lowest, highest = -(2**63), 2**64 - 1
    for seed in (lowest, highest):
        torch.Generator().manual_seed(seed)  # accepted by torch: so by the config too
        assert config_from_dict({**MINIMAL, "seed": seed}).seed == seed
    for seed in (lowest - 1, highest + 1, 99999999999999999999):
        with pytest.raises((RuntimeError, ValueError)):
            torch.Generator().manual_seed(seed)
        with pytest.raises(NMTError, match=f"config key 'seed': {seed} must be in"):
            config_from_dict({**MINIMAL, "seed": seed})


@pytest.mark.parametrize("split", ["train", "dev", "test"])
@pytest.mark.parametrize("value", [-5, 0])
def test_max_pairs_must_be_positive(split, value):
    """A negative count would slice off the end of the corpus ('all but the last 5'), 0 read nothing."""
    values = copy.deepcopy(MINIMAL)
    apply_overrides(values, [f"data.{split}.path=d/{split}", f"data.{split}.max_pairs={value}"])
    with pytest.raises(NMTError, match=f"config key 'data.{split}.max_pairs': {value} must be > 0"):
        config_from_dict(values)


def test_duplicate_keys_in_a_file_are_an_error_naming_the_line(tmp_path):
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: 3, max_updates: 5}\n")
    with pytest.raises(NMTError, match=r"c.yaml: line 2, column 25: duplicate key 'train.max_updates'"):
        load_config(path)
    path = write(tmp_path, "train:\n  max_updates: 3\ndata: {train: a, dev: b}\ntrain:\n  max_minutes: 5\n")
    with pytest.raises(NMTError, match=r"c.yaml: line 4, column 1: duplicate key 'train'"):
        load_config(path)
    merged = "data:\n  train: a\n  dev: &dev {path: b}\n  test: {<<: *dev, max_pairs: 3}\ntrain: {max_minutes: 5}\n"
    path = write(tmp_path, merged)
    assert load_config(path).data.test.max_pairs == 3  # a merge key is no duplicate


@pytest.mark.parametrize(
    "written, read_as, key",
    [
        ("seed: 010", "8 (octal)", "seed"),
        ("seed: -010", "-8 (octal)", "seed"),
        ("train: {max_updates: 5, warmup_updates: 01}", "1 (octal)", "train.warmup_updates"),
        ("train: {max_minutes: 1:30}", "90 (base 60)", "train.max_minutes"),
        ("train: {max_minutes: 5, lr_peak: 1:30.5}", "90.5 (base 60)", "train.lr_peak"),
        ("train: {max_minutes: 5, betas: [0.9, 0700]}", "448 (octal)", "train.betas"),
    ],
)
def test_a_number_yaml_reads_in_another_base_is_an_error_naming_key_and_line(tmp_path, capsys, written, read_as, key):
    """YAML 1.1 reads a leading zero as octal and colons as base 60; whoever writes seed: 010 means ten."""
    path = write(tmp_path, "data: {train: a, dev: b}\n" + written + "\n")
    value = written.split(": ")[-1].strip("}]").split(", ")[-1]
    message = f"config key '{key}': YAML 1.1 reads {value} as {read_as}: write the number in decimal"
    with pytest.raises(NMTError, match=r"c\.yaml: line 2, column \d+: " + re.escape(message)):
        load_config(path)
    plain = write(tmp_path, "data: {train: a, dev: b}\n")
    assert main(["prepare", "--config", str(plain), "--set", f"{key}={value}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"--set {key}={value}" in line and f"config key '{key}': YAML 1.1 reads {value} as" in line


def test_numbers_that_say_their_base_or_group_digits_are_read_as_written(tmp_path):
    text = "data: {train: a, dev: b}\nseed: 0x10\ntrain: {max_updates: 1_000, warmup_updates: 0b11, lr_peak: '010'}\n"
    with pytest.raises(NMTError, match="'train.lr_peak': expected a number, got '010'"):  # quoted: text
        load_config(write(tmp_path, text))
    cfg = load_config(write(tmp_path, text.replace("'010'", "0.001")))
    assert (cfg.seed, cfg.train.max_updates, cfg.train.warmup_updates, cfg.train.lr_peak) == (16, 1000, 3, 0.001)


def test_a_recursive_yaml_anchor_is_a_one_line_error(tmp_path):
    path = write(tmp_path, "data: {train: a, dev: b}\nextra: &x [*x]\n")
    with pytest.raises(NMTError, match=r"c.yaml: a YAML alias refers to a value that contains it"):
        load_config(path)


def test_a_set_value_cut_by_a_yaml_comment_is_an_error(tmp_path):
    # the shell passes "data.train=/data/run #2/train" whole; YAML read ' #2/train' as a comment
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_minutes: 5}\n")
    cut = r"^--set data.train=/data/run #2/train: ' #' starts a YAML comment, which left '/data/run': quote the value"
    with pytest.raises(NMTError, match=cut):
        load_config(path, ["data.train=/data/run #2/train"])
    with pytest.raises(NMTError, match=r"^--set train.max_updates=5 # five: ' #' starts a YAML comment, which left 5"):
        load_config(path, ["train.max_updates=5 # five"])
    cfg = load_config(path, ["data.train='/data/run #2/train'", "name=run#2", "data.dev={path: 'b #1'}"])
    assert (cfg.data.train.path, cfg.name, Path(cfg.data.dev.path).name) == ("/data/run #2/train", "run#2", "b #1")


def test_repeated_set_overrides_keep_the_last():
    values = copy.deepcopy(MINIMAL)
    apply_overrides(values, ["train.max_updates=3", "train.max_updates=5"])
    assert config_from_dict(values).train.max_updates == 5


def test_max_len_ratio_of_one_keeps_the_pairs_of_equal_length():
    ratio = config_from_dict({**MINIMAL, "data": {**MINIMAL["data"], "max_len_ratio": 1}}).data.max_len_ratio
    kept, _ = filter_by_length([3, 3, 4], [3, 4, 3], max_len=10, max_ratio=ratio)
    assert kept == [0]


def test_errors_name_the_set_override_that_gave_the_bad_value(tmp_path):
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: 5, warmup_updates: 1}\n")
    with pytest.raises(NMTError, match=r"^--set train.max_updates=abc: config key 'train.max_updates': expected an"):
        load_config(path, ["train.lr_peak=0.1", "train.max_updates=abc"])
    with pytest.raises(NMTError, match=r"^--set train.lr_pek=1: unknown config key 'train.lr_pek'"):
        load_config(path, ["train.lr_pek=1"])
    with pytest.raises(NMTError, match=r"^--set data.dev={path: b, max_pairs: -5}: config key 'data.dev.max_pairs'"):
        load_config(path, ["data.dev={path: b, max_pairs: -5}"])
    with pytest.raises(NMTError, match=r"^--set train.max_updates=0: config key 'train.max_updates': 0 must be"):
        load_config(path, ["train.max_updates=abc", "train.max_updates=0"])  # the last --set of a key counts
    bad_file = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: abc}\n")
    with pytest.raises(
        NMTError, match=r"^\S*c.yaml: line 2, column 9: config key 'train.max_updates': expected an integer"
    ):
        load_config(bad_file, ["train.lr_peak=0.1", "train.max_minutes=5"])


def test_a_key_twice_in_a_set_value_is_an_error_as_in_a_file(tmp_path):
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: 5, warmup_updates: 1}\n")
    twice = r"^--set data.train=\{path: a, path: b\}: line 1, column 11: duplicate key 'path'$"
    with pytest.raises(NMTError, match=twice):
        load_config(path, ["data.train={path: a, path: b}"])


# Beyond 32 bits an integer key overflows a C int (SentencePiece, torch's thread count) or a torch size.
HUGE = 10**20


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("tokenizer.vocab_size", 3_000_000_000, "3000000000 must be in \\[16, 16777216\\]"),
        ("data.shard_pairs", HUGE, f"{HUGE} must be at most 2147483647"),
        ("train.threads", HUGE, f"{HUGE} must be auto or in \\[1, 1024\\]"),
        # within 32 bits, but generating the corpus in memory would run for hours
        ("data.synthetic_train_pairs", 2**31 - 1, "2147483647 must be in \\[1, 100000000\\]"),
        ("train.max_updates", 2**31, "2147483648 must be at most 2147483647"),
        ("decode.batch_tokens", HUGE, f"{HUGE} must be at most 2147483647"),
        ("model.d_model", HUGE, f"{HUGE} must be in \\[1, 16777216\\]"),
        ("model.ff_size", 2**24 + 1, "16777217 must be in \\[1, 16777216\\]"),
        ("model.max_positions", HUGE, f"{HUGE} must be in \\[1, 16777216\\]"),
        ("tokenizer.input_sentence_size", HUGE, f"{HUGE} must be 0 \\(every sentence\\) or in \\[101, "),
        # below 2**31, yet past what libgomp can start (a segfault at 100,000) or Python can build
        ("train.threads", 100_000, "100000 must be auto or in \\[1, 1024\\]"),
        ("model.encoder_layers", 100_000, "100000 must be in \\[1, 1024\\]"),
        ("model.decoder_layers", 1025, "1025 must be in \\[1, 1024\\]"),
    ],
)
def test_integer_keys_too_large_for_what_reads_them_are_errors(tmp_path, key, value, message):
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_updates: 5, warmup_updates: 1}\n")
    with pytest.raises(NMTError, match=f"^--set {key}={value}: config key '{key}': {message}"):
        load_config(path, [f"{key}={value}"])


def test_thread_and_layer_bounds_are_inclusive():
    deepest = {"encoder_layers": 1024, "decoder_layers": 1024}
    config = config_from_dict({**MINIMAL, "model": deepest, "train": {**MINIMAL["train"], "threads": 1024}})
    assert (config.model.encoder_layers, config.model.decoder_layers, config.train.threads) == (1024, 1024, 1024)
    with pytest.raises(NMTError, match=r"'model.encoder_layers': 1025 must be in \[1, 1024\]"):
        config_from_dict({**MINIMAL, "model": {"type": "rnn", "encoder_layers": 1025}})


def test_rnn_hidden_is_bounded_as_a_width():
    with pytest.raises(NMTError, match=f"config key 'model.rnn_hidden': {HUGE} must be in"):
        config_from_dict({**MINIMAL, "model": {"type": "rnn", "rnn_hidden": HUGE}})


def test_a_count_beyond_its_bound_is_a_one_line_error_from_the_command_line(tmp_path, capsys):
    # 2**31 - 1 torch threads made libgomp abort the process instead (here: no such corpus).
    corpus = tmp_path / "none"
    path = write(tmp_path, f"data: {{train: {corpus}, dev: {corpus}}}\ntrain: {{max_updates: 5, warmup_updates: 1}}\n")
    assert main(["train", "--config", str(path), "--set", f"train.threads={2**31 - 1}"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"nmt train: error: --set train.threads={2**31 - 1}: config key 'train.threads': {2**31 - 1} must be auto "
        "or in [1, 1024]\n"
    )


def test_integer_bounds_leave_room_for_every_real_value():
    import torch

    from nmt.config import MAX_WIDTH

    int32_max = 2**31 - 1
    values = copy.deepcopy(MINIMAL)
    apply_overrides(values, [f"data.shard_pairs={int32_max}", f"train.validate_every={int32_max}"])
    assert config_from_dict(values).data.shard_pairs == int32_max
    # Seeds and corpus sizes are not C ints: they keep their own ranges.
    apply_overrides(values, [f"seed={2**64 - 1}", f"data.synthetic_seed={HUGE}", f"data.train.max_pairs={HUGE}"])
    cfg = config_from_dict(values)
    assert cfg.seed == 2**64 - 1 and cfg.data.synthetic_seed == cfg.data.train.max_pairs == HUGE
    # The widest LSTM layer (4 gates) still has a size torch can compute; two int32 widths do not.
    torch.empty(4 * MAX_WIDTH, MAX_WIDTH, device="meta")
    with pytest.raises(RuntimeError, match="overflow"):
        torch.empty(4 * int32_max, int32_max, device="meta")
    cfg = config_from_dict({**MINIMAL, "model": {"d_model": MAX_WIDTH, "ff_size": MAX_WIDTH, "heads": 1}})
    assert cfg.model.d_model == cfg.model.ff_size == MAX_WIDTH
    # The synthetic corpus's bound is itself allowed (threads and layers: test_thread_and_layer_bounds_are_inclusive).
    apply_overrides(values, [f"data.synthetic_train_pairs={10**8}"])
    assert config_from_dict(values).data.synthetic_train_pairs == 10**8


def test_tokenizer_bounds_are_what_sentencepiece_accepts(tmp_path):
    import sentencepiece as spm

    from nmt.config import MAX_WIDTH

    def train(**options):
        lines = [f"sentence number {i} of a few" for i in range(200)]
        options = {"num_threads": 1, "minloglevel": 2, **options}
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "m"), **options)

    with pytest.raises(RuntimeError, match="Vocabulary size too high"):  # parsed, and refused at once
        train(vocab_size=MAX_WIDTH)
    with pytest.raises(ValueError, match="cannot parse"):  # an int32 field
        train(vocab_size=2**31)
    assert config_from_dict({**MINIMAL, "tokenizer": {"vocab_size": MAX_WIDTH}}).tokenizer.vocab_size == MAX_WIDTH
    with pytest.raises(RuntimeError, match="num_threads"):
        train(vocab_size=30, num_threads=1025)
    train(vocab_size=30, num_threads=1024)
    for threads in (0, 1025):
        with pytest.raises(NMTError, match=f"'tokenizer.threads': {threads} must be in \\[1, 1024\\]"):
            config_from_dict({**MINIMAL, "tokenizer": {"threads": threads}})
    assert config_from_dict({**MINIMAL, "tokenizer": {"threads": 1024}}).tokenizer.threads == 1024
    with pytest.raises(RuntimeError, match="input_sentence_size"):
        train(vocab_size=30, input_sentence_size=100)
    for size in (0, 101, 2**64 - 1):
        train(vocab_size=30, input_sentence_size=size)
        values = copy.deepcopy(MINIMAL)
        apply_overrides(values, [f"tokenizer.input_sentence_size={size}"])
        assert config_from_dict(values).tokenizer.input_sentence_size == size
    for size in (1, 100, 2**64):
        values = copy.deepcopy(MINIMAL)
        apply_overrides(values, [f"tokenizer.input_sentence_size={size}"])
        with pytest.raises(NMTError, match=f"'tokenizer.input_sentence_size': {size} must be 0 \\(every sentence\\)"):
            config_from_dict(values)


@pytest.mark.parametrize("text", ["=5", ".max_updates=5", "train.=5", "train..max_updates=5", " . =5"])
def test_a_set_with_an_empty_key_part_is_an_error(text):
    with pytest.raises(NMTError, match=f"^--set {re.escape(repr(text))}: expected section.key=value$"):
        apply_overrides(copy.deepcopy(MINIMAL), [text])


def test_a_corpus_string_replaces_only_the_path_whatever_the_order(tmp_path, monkeypatch):
    one = copy.deepcopy(MINIMAL)
    apply_overrides(one, ["data.train.max_pairs=50", "data.train=other"])
    two = copy.deepcopy(MINIMAL)
    apply_overrides(two, ["data.train=other", "data.train.max_pairs=50"])
    assert config_from_dict(one).data.train == config_from_dict(two).data.train
    assert config_from_dict(one).data.train.max_pairs == 50
    (tmp_path / "exp").mkdir()
    for name in ("other.de", "exp/a.de"):
        (tmp_path / name).write_text("x\n")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "exp" / "c.yaml"
    path.write_text("data: {train: {path: a, max_pairs: 50}, dev: b}\ntrain: {max_minutes: 5}\n")
    cfg = load_config(path, ["data.train=other"])
    assert cfg.data.train.path == str(tmp_path / "other") and cfg.data.train.max_pairs == 50
    # A --set of another key of the corpus leaves the file's path relative to the file.
    assert load_config(path, ["data.train.max_pairs=5"]).data.train.path == str(tmp_path / "exp" / "a")
    assert load_config(path, ["data.train={path: other}"]).data.train.path == str(tmp_path / "other")
    # And an error in the file's part of the corpus names the file, not the --set of the path.
    path.write_text("data: {train: {path: a, max_pairs: -1}, dev: b}\ntrain: {max_minutes: 5}\n")
    with pytest.raises(NMTError, match=r"^\S*c.yaml: line 1, column 25: config key 'data.train.max_pairs'"):
        load_config(path, ["data.train=other"])


def test_an_ambiguous_corpus_from_a_set_names_the_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("both.de", "both.de.gz", "both.en"):
        (tmp_path / name).write_text("x\n")
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_minutes: 5}\n")
    message = r"^--set data.train=both: config key 'data.train': \S*both.de and \S*both.de.gz both exist"
    with pytest.raises(NMTError, match=message):
        load_config(path, ["data.train=both"])


@pytest.mark.parametrize(
    "override,message",
    [
        ('run_dir=""', "config key 'run_dir': empty"),
        ('data.test=""', "config key 'data.test': the corpus path is empty"),
        ('data.train=""', "config key 'data.train': no training corpus given"),
    ],
)
def test_an_empty_path_is_an_error_naming_the_key(tmp_path, override, message):
    path = write(tmp_path, "data: {train: a, dev: b, test: c}\ntrain: {max_minutes: 5}\n")
    with pytest.raises(NMTError, match=f"^--set {override}: {message}"):
        load_config(path, [override])


@pytest.mark.parametrize(
    "key,value",
    [("src_column", "de"), ("trg_column", "en"), ("split", "validation"), ("hf_config", "de-en"), ("streaming", False)],
)
def test_hugging_face_keys_on_a_plain_or_tsv_corpus_are_errors(tmp_path, monkeypatch, key, value):
    datasets = pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    for name in ("a.de", "a.en", "b.de", "b.en", "c.tsv"):
        (tmp_path / name).write_text("x\n")
    split = datasets.Dataset.from_dict({"de": ["x"], "en": ["y"]})
    datasets.DatasetDict({"train": split, "validation": split}).save_to_disk(str(tmp_path / "ds"))
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_minutes: 5}\n")
    for corpus, fmt in (("a", "plain"), ("c.tsv", "tsv"), ("{path: a, format: plain}", "plain")):
        with pytest.raises(NMTError, match=f"config key 'data.train.{key}': applies to Hugging Face datasets .* {fmt}"):
            load_config(path, [f"data.train={corpus}", f"data.train.{key}={value}"])
    (tmp_path / "files").mkdir()  # a directory of data files: load_dataset takes a configuration name for it
    (tmp_path / "files" / "train.jsonl").write_text('{"de": "x", "en": "y"}\n')
    hf = "files" if key == "hf_config" else "ds"  # save_to_disk output has no configurations to choose
    assert getattr(load_config(path, [f"data.train={hf}", f"data.train.{key}={value}"]).data.train, key) == value


def test_a_split_of_a_saved_dataset_without_splits_is_an_error_naming_the_key(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    for name in ("a.de", "a.en"):
        (tmp_path / name).write_text("x\n")
    datasets.Dataset.from_dict({"de": ["x"], "en": ["y"]}).save_to_disk(str(tmp_path / "single"))
    path = write(tmp_path, "data: {train: a, dev: {path: single, split: validation}}\ntrain: {max_minutes: 5}\n")
    with pytest.raises(NMTError, match="config key 'data.dev.split': split 'validation', but .*single holds one"):
        load_config(path)
    assert load_config(path, ["data.dev.split=train"]).data.dev.split == "train"


@pytest.mark.parametrize("split", ["dev", "test"])
def test_a_held_out_dataset_reading_the_training_split_is_refused_as_a_run_starts(tmp_path, monkeypatch, capsys, split):
    # 'dev: ds' on a saved DatasetDict takes split's default, train: dev BLEU would rank checkpoints on training pairs.
    datasets = pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    pairs = {"de": ["ein Haus", "ein Hund"], "en": ["a house", "a dog"]}
    splits = {name: datasets.Dataset.from_dict(pairs) for name in ("train", "validation", "test")}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "ds"))
    held_out = {"dev": "{path: ds, split: validation}", "test": "{path: ds, split: test}"}
    held_out[split] = "ds"
    path = write(
        tmp_path,
        f"run_dir: run\ndata: {{train: ds, dev: {held_out['dev']}, test: {held_out['test']}}}\n"
        "tokenizer: {vocab_size: 20}\ntrain: {max_updates: 5, warmup_updates: 1}\n",
    )
    capsys.readouterr()  # save_to_disk's progress bars
    assert main(["prepare", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    column = path.read_text().splitlines()[1].index(f"{split}:") + 1  # the line of data.SPLIT
    place = f"c.yaml: line 2, column {column}"
    assert f"{place}: config key 'data.{split}': reads split 'train' of {tmp_path / 'ds'}, the same data as" in err
    assert f"name its own split (data.{split}.split" in err
    assert not (tmp_path / "run").exists()  # refused before anything is written


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_a_configuration_named_for_a_saved_dataset_is_an_error_naming_the_key(tmp_path, monkeypatch, split):
    datasets = pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    for name in ("a.de", "a.en"):
        (tmp_path / name).write_text("x\n")
    splits = {"train": datasets.Dataset.from_dict({"de": ["x"], "en": ["y"]})}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "saved"))
    path = write(tmp_path, "data: {train: a, dev: a, test: a}\ntrain: {max_minutes: 5}\n")
    with pytest.raises(NMTError, match=f"config key 'data.{split}.hf_config': 'de-en', but .*saved is a dataset saved"):
        load_config(path, [f"data.{split}=saved", f"data.{split}.hf_config=de-en"])
    assert getattr(load_config(path, [f"data.{split}=saved"]).data, split).path == str(tmp_path / "saved")


def test_hugging_face_keys_at_their_defaults_are_accepted_on_any_corpus(tmp_path):
    """A run's saved config lists every key, the Hugging Face ones at their defaults for plain corpora."""
    for name in ("a.de", "a.en", "b.de", "b.en"):
        (tmp_path / name).write_text("x\n")
    cfg = load_config(write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_minutes: 5}\n"))
    (tmp_path / "saved.yaml").write_text(config_yaml(cfg))
    assert "streaming: true" in (tmp_path / "saved.yaml").read_text()
    assert load_config(tmp_path / "saved.yaml") == cfg


def test_a_set_through_a_yaml_alias_changes_that_key_only(tmp_path):
    """`test: *held` is the anchor's own object as PyYAML reads it: a --set on data.test.path changed
    data.dev.path too, and the run validated on the test set in silence."""
    (tmp_path / "c.yaml").write_text(
        "data:\n  src_lang: de\n  trg_lang: en\n  train: tr\n  dev: &held {path: dv}\n  test: *held\n"
        "train:\n  max_updates: 10\n  warmup_updates: 1\n"
    )
    cfg = load_config(tmp_path / "c.yaml", [f"data.test.path={tmp_path / 'other'}"])
    assert Path(cfg.data.dev.path).name == "dv" and cfg.data.test.path == str(tmp_path / "other")


def test_an_error_a_set_causes_through_another_key_names_that_set_with_the_file(tmp_path):
    """d_model 90 given on the command line against the file's 4 heads: the check names model.heads,
    which no --set gave, so the error named the file alone, which is free of it."""
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_minutes: 5}\nmodel: {d_model: 128, heads: 4}\n")
    heads = r"config key 'model.heads': d_model 90 is not divisible by 4 heads"
    # only the culprit is named, and the line of the file's key the error names, as an error of the file's own does
    with pytest.raises(
        NMTError, match=rf"^{re.escape(str(path))}: line 3, column 23 with --set model.d_model=90: {heads}$"
    ):
        load_config(path, ["train.lr_peak=0.01", "model.d_model=90", "name=x"])
    ff = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_minutes: 5}\nmodel: {ff_size: 512}\n")
    rnn = r"config key 'model.ff_size': applies to model.type 'transformer', not 'rnn'"
    with pytest.raises(NMTError, match=rf"^{re.escape(str(ff))}: line 3, column 9 with --set model.type=rnn: {rnn}$"):
        load_config(ff, ["model.type=rnn"])
    # Neither causes it alone (each leaves the other limit): both are named.
    two = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_epochs: 5, max_minutes: 5}\n")
    # The key the error names is the file's default (no line to name): the file alone.
    limits = r"config key 'train.max_updates': set at least one of max_updates, max_epochs, max_minutes"
    with pytest.raises(
        NMTError,
        match=rf"^{re.escape(str(two))} with --set train.max_epochs=null, --set train.max_minutes=null: {limits}",
    ):
        load_config(two, ["train.max_epochs=null", "train.max_minutes=null"])
    assert load_config(two, ["train.max_epochs=null"]).train.max_minutes == 5


def test_a_check_across_keys_against_a_default_names_the_line_of_the_key_the_file_gives(tmp_path):
    # warmup_updates is the default 1000, which no line of the file gives: the error named the file alone.
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain:\n  lr_peak: 0.001\n  max_updates: 30\n")
    warmup = "config key 'train.warmup_updates': 1000 exceeds train.max_updates"
    with pytest.raises(NMTError, match=rf"^{re.escape(str(path))}: line 4, column 3: {warmup} 30$"):
        load_config(path)
    # A --set that replaces the file's key: its line holds no value in force, so the file and the --set.
    with pytest.raises(NMTError, match=rf"^{re.escape(str(path))} with --set train.max_updates=20: {warmup} 20$"):
        load_config(path, ["train.max_updates=20"])


def test_an_error_the_file_has_itself_names_the_file_whatever_is_set(tmp_path):
    path = write(tmp_path, "data: {train: a, dev: b}\ntrain: {max_minutes: 5}\nmodel: {d_model: 90, heads: 4}\n")
    with pytest.raises(
        NMTError, match=rf"^{re.escape(str(path))}: line 3, column 22: config key 'model.heads': d_model 90 is not"
    ):
        load_config(path, ["train.lr_peak=0.01"])


def test_a_section_with_all_its_keys_commented_out_takes_its_defaults(tmp_path):
    # 'decode:' alone on a line is YAML's null: it was "expected a mapping, got None"
    given = "data:\n  train: d/train\n  dev: d/dev\n  test:\ntrain: {max_updates: 10, warmup_updates: 2}\n"
    commented = "tokenizer:\n#  vocab_size: 8000\nmodel:\n#  type: rnn\ndecode:\n#  beam_size: 8\n"
    cfg = load_config(write(tmp_path, given + commented))
    assert cfg == load_config(write(tmp_path, given))
    assert cfg.model == TransformerConfig() and cfg.data.test is None  # a corpus left empty is none, as before
    # a --set fills a null section; a null data section or corpus is refused as one not written is
    cfg = load_config(write(tmp_path, given + "decode:\n"), ["decode.beam_size=3"])
    assert cfg.decode.beam_size == 3
    for text, place in (("data:\n", "line 1, column 1"), ("data:\n  train:\n  dev: d/dev\n", "line 2, column 3")):
        with pytest.raises(NMTError, match=f"c.yaml: {place}: config key 'data.train': no training corpus given$"):
            load_config(write(tmp_path, text))


@pytest.mark.parametrize("value", ["[1, 2]", "5", "beam"])
def test_a_section_that_is_no_mapping_is_a_one_line_error_naming_it(tmp_path, capsys, value):
    for section in ("decode", "model", "data"):
        path = write(tmp_path, f"{section}: {value}\n")
        assert main(["train", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{path}: line 1, column 1: config key '{section}': expected a " in err, err


LINED = """\
data:
  train: &corpus
    path: a
    max_pairs: 5
  dev:
    <<: *corpus
    path: b
train:
  max_minutes: 5
  lr_peak: 0.001
  betas:
    - 0.9
    - 0.98
decode: {beam_size: 4}
"""


@pytest.mark.parametrize(
    "written, replaced, place, message",
    [
        ("lr_peak: 0.001", "lr_peak: fast", "line 10, column 3", "config key 'train.lr_peak': expected a number"),
        ("- 0.98", "- 1.5", "line 11, column 3", "config key 'train.betas': [0.9, 1.5] must be two numbers"),
        ("decode: {beam_size: 4}", "decode: [1, 2]", "line 14, column 1", "config key 'decode': expected a mapping"),
        ("decode: {beam_size: 4}", "decode: {beam_size: 0}", "line 14, column 10", "config key 'decode.beam_size': 0"),
        (
            "  lr_peak:",
            "  lr_pek:",
            "line 10, column 3",
            "unknown config key 'train.lr_pek' (did you mean 'train.lr_peak'?)",
        ),
        # a key a merge ('<<: *corpus') gives is where its anchor writes it; one written after the merge, there
        ("max_pairs: 5", "max_pairs: -5", "line 4, column 5", "config key 'data.train.max_pairs': -5 must be > 0"),
        ("    path: b\n", "    path: b\n    max_pairs: 0\n", "line 8, column 5", "config key 'data.dev.max_pairs': 0"),
    ],
)
def test_an_error_in_the_file_names_the_line_of_its_key(tmp_path, written, replaced, place, message):
    path = write(tmp_path, LINED.replace(written, replaced))
    with pytest.raises(NMTError) as error:
        load_config(path)
    assert str(error.value).startswith(f"{path}: {place}: {message}"), error.value


def test_an_error_a_set_gives_or_a_default_holds_names_no_line(tmp_path):
    path = write(tmp_path, LINED)
    with pytest.raises(NMTError, match=r"^--set train.lr_peak=fast: config key 'train.lr_peak'"):
        load_config(path, ["train.lr_peak=fast"])
    # max_updates is nowhere in the file: the file is named, no line
    with pytest.raises(NMTError, match=rf"^{re.escape(str(path))}: config key 'train.max_updates': set at least"):
        load_config(write(tmp_path, LINED.replace("  max_minutes: 5\n", "")))


@pytest.mark.parametrize("value", ["[1, 2]", "5", "beam"])
def test_a_set_into_a_section_that_is_no_mapping_is_the_files_error(tmp_path, capsys, value):
    """--set decode.beam_size=5 over 'decode: [1, 2]' made the section {beam_size: 5}: the file's was never reported."""
    for section, key in (("decode", "beam_size=5"), ("model", "d_model=64"), ("data", "src_lang=fr")):
        path = write(tmp_path, f"{section}: {value}\n")
        assert main(["train", "--config", str(path)]) == 2
        alone = capsys.readouterr().err
        assert main(["train", "--config", str(path), "--set", f"{section}.{key}"]) == 2
        assert capsys.readouterr().err == alone
    path = write(tmp_path, f"data: {{train: a, dev: {value}}}\ntrain: {{max_minutes: 5}}\n")
    if value != "beam":  # a string is the corpus's path
        message = rf"^{re.escape(str(path))}: line 1, column 18: config key 'data.dev': expected a path or a mapping"
        with pytest.raises(NMTError, match=message):
            load_config(path, ["data.dev.max_pairs=5"])
    # a --set that gives the section first makes the later one its own
    path = write(tmp_path, f"data: {{train: a, dev: b}}\ntrain: {{max_minutes: 5}}\ndecode: {value}\n")
    assert load_config(path, ["decode={nbest: 2}", "decode.beam_size=3"]).decode.beam_size == 3
    with pytest.raises(NMTError, match=r"^--set decode=7: config key 'decode': expected a mapping, got 7$"):
        load_config(path, ["decode=7"])
