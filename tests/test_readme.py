"""The README's and docs' commands and the README's config reference agree with the code: every
subcommand and option they show exists, every --set key loads, every config named is shipped, every
file a command block reads was written earlier in the block or is fetched data, the config reference
lists every config key with the defaults it states, and the command reference every subcommand and
option with the defaults it states."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import typing
from pathlib import Path

import pytest

from nmt.cli import build_parser
from nmt.config import Config, DataConfig, DecodeConfig, TrainConfig, config_from_dict, load_config
from nmt.corpus_spec import CorpusConfig
from nmt.errors import NMTError
from nmt.models.rnn import RNNConfig
from nmt.models.transformer import TransformerConfig
from nmt.tokenizer import TokenizerConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = {path.name: path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))}
SUBCOMMANDS = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
# Words of a command line that stand for what the reader fills in.
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\.\.\.")


def shell_blocks(text: str) -> list[str]:
    """The ```sh blocks of a Markdown text, continuation lines joined."""
    return [m.group(1).replace("\\\n", " ") for m in re.finditer(r"```sh\n(.*?)```", text, re.S)]


def nmt_commands(text: str) -> list[list[str]]:
    """Every `nmt SUBCOMMAND ...` of a Markdown text, from its shell blocks and inline code, as words
    from the subcommand on (comments, pipes and the reference's [optional] brackets dropped)."""
    lines = [line.split("#")[0] for block in shell_blocks(text) for line in block.splitlines()]
    prose = re.sub(r"\s+", " ", re.sub(r"```.*?```", "", text, flags=re.S))
    lines += re.findall(r"`([^`]*)`", prose)
    commands = []
    for line in lines:
        for part in re.split(r"[|;]", line.replace("[", " ").replace("]", " ")):
            words = part.split()
            for i, word in enumerate(words[:-1]):
                if word == "nmt" and re.fullmatch(r"[a-z][a-z-]+", words[i + 1]):
                    commands.append(words[i + 1 :])
    return commands


ALL_COMMANDS = [(name, words) for name, text in {"README.md": README, **DOCS}.items() for words in nmt_commands(text)]


def test_the_commands_are_found():
    names = {words[0] for _, words in ALL_COMMANDS}
    assert {"train", "prepare", "translate", "eval-bleu", "average", "tune-decode", "plot", "export"} <= names


@pytest.mark.parametrize(("doc", "words"), ALL_COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_each_command_names_a_subcommand_options_configs_and_keys_that_exist(doc, words):
    subcommand, args = words[0], words[1:]
    assert subcommand in SUBCOMMANDS, f"{doc}: nmt {subcommand}"
    options = {o for action in SUBCOMMANDS[subcommand]._actions for o in action.option_strings}
    for word in args:
        if word.startswith("-") and len(word) > 1 and not word[1].isdigit():
            assert word.split("=")[0] in options, f"{doc}: nmt {subcommand} {word}"
    configs = [w for w in args if re.fullmatch(r"configs/[\w.]+\.yaml", w)]
    for config in configs:
        assert (ROOT / config).is_file(), f"{doc}: {config}"
    sets = [args[i + 1] for i, w in enumerate(args[:-1]) if w == "--set" and not PLACEHOLDER.search(args[i + 1])]
    for override in sets:
        load_config(ROOT / (configs[0] if configs else "configs/multi30k_transformer.yaml"), [override])


def known_run_dirs() -> set[str]:
    """Run directories the shipped configs and the Makefile's targets train, relative to the root."""
    runs = {str(Path(load_config(c).run_dir).relative_to(ROOT)) for c in sorted((ROOT / "configs").glob("*.yaml"))}
    makefile = (ROOT / "Makefile").read_text()
    runs |= {f"runs/{name}_shared" for name in re.findall(r"\$\(call train_peer_recipe,(\w+)\)", makefile)}
    return runs


def test_the_readme_blocks_read_only_what_earlier_commands_wrote_or_fetched_data():
    # A block is a sequence to copy and run: a file one of its commands reads is written by an
    # earlier one (-o/--output), or is data the Makefile fetches (data/), and a run directory it
    # names is one a shipped config or make target trains.
    reads_file = ("-i", "--input", "--hyp", "--src", "--ref")
    runs = known_run_dirs()
    for block in shell_blocks(README):
        written: set[str] = set()
        for line in block.splitlines():
            words = shlex.split(line.split("#")[0])
            if "nmt" not in words:
                continue
            args = words[words.index("nmt") + 1 :]
            for option, value in zip(args, args[1:]):
                if option in reads_file:
                    assert value in written or value.startswith("data/"), f"{line.strip()}: {value}"
                if option == "--model":
                    assert value in runs, f"{line.strip()}: {value}"
                if option in ("-o", "--output"):
                    written.add(value)


# ---------------------------------------------------------------------------- config reference

REFERENCE = README[README.index("## Config reference") : README.index("## Layout")]
SECTIONS = {
    "data": (DataConfig, CorpusConfig),
    "tokenizer": (TokenizerConfig,),
    "model": (TransformerConfig, RNNConfig),
    "train": (TrainConfig,),
    "decode": (DecodeConfig,),
}


def section_text(section: str) -> str:
    """The reference's paragraph(s) on one section: from '**section**:' to the next section's."""
    match = re.search(rf"\*\*{section}\*\*:(.*?)(?=\n\*\*\w+\*\*:|\Z)", REFERENCE, re.S)
    assert match, section
    return match.group(1)


@pytest.mark.parametrize("section", SECTIONS)
def test_the_config_reference_lists_every_key_and_choice(section):
    text = section_text(section)
    named = set(re.findall(r"`([\w.]+)", text))
    for cls in SECTIONS[section]:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert f.name in named, f"{section}.{f.name} is missing from the README's config reference"
            choices = [c for t in (hints[f.name], *typing.get_args(hints[f.name])) for c in literal_values(t)]
            for choice in choices:
                assert f"`{choice}`" in text, f"{section}.{f.name}: choice {choice!r} is not in the reference"


def literal_values(annotation) -> tuple:
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()


def test_the_top_level_keys_are_those_the_reference_names():
    top = {f.name for f in dataclasses.fields(Config)} - set(SECTIONS)
    assert "three top-level\nkeys (`name`, `run_dir`, `seed`)" in REFERENCE
    assert top == {"name", "run_dir", "seed"}


# The defaults the README states, as it words them, and the value each stands for.
AUTO_KEYS_DEFAULT = "`train.precision`, `train.attention`,\n`train.fp32_matmul` and `train.threads` default to `auto`"
STATED_DEFAULTS = [
    ("`shard_pairs` (pairs per binarized shard,\ndefault 100,000)", DataConfig, "shard_pairs", 100_000),
    ("`workers` (encoding processes, default and at most one per CPU", DataConfig, "workers", None),
    ("`revision` (a branch,\ntag or commit; default the dataset's default branch)", CorpusConfig, "revision", None),
    ("`streaming: false` converts them", CorpusConfig, "streaming", True),
    ("`nmt_nfkc` (the default)", TokenizerConfig, "normalization", "nmt_nfkc"),
    ("`threads` (SentencePiece's training threads, default 16,", TokenizerConfig, "threads", 16),
    ("`character_coverage: 1.0` (the default)", TokenizerConfig, "character_coverage", 1.0),
    ("The default sample (2M sentences)", TokenizerConfig, "input_sentence_size", 2_000_000),
    ("`model.max_positions` positions (1,024 by default)", TransformerConfig, "max_positions", 1024),
    ("`validate_beam_size` (default 1, greedy)", TrainConfig, "validate_beam_size", 1),
    ("`validate_max_sentences` dev sentences\n(default all)", TrainConfig, "validate_max_sentences", None),
    ("plus its compilation) and is off by default", TrainConfig, "compile", False),
    *((AUTO_KEYS_DEFAULT, TrainConfig, key, "auto") for key in ("precision", "attention", "fp32_matmul", "threads")),
    ("trained with `tokenizer.threads` (16)", TokenizerConfig, "threads", 16),
    ("`13a`, the default, for languages written with spaces", DecodeConfig, "bleu_tokenize", "13a"),
    ("`bleu_lowercase` (case-insensitive\nBLEU and chrF; default false)", DecodeConfig, "bleu_lowercase", False),
]


@pytest.mark.parametrize(("phrase", "cls", "key", "default"), STATED_DEFAULTS, ids=lambda v: str(v)[:40])
def test_each_default_the_readme_states_is_the_code_s(phrase, cls, key, default):
    assert " ".join(phrase.split()) in " ".join(README.split()), phrase
    assert getattr(cls(), key) == default


# ---------------------------------------------------------------------------- command reference

COMMAND_REFERENCE = README[README.index("## Command reference") : README.index("## Config reference")]


def command_entries() -> dict[str, str]:
    """The command reference's items, by the subcommand each opens with (`nmt SUBCOMMAND ...`)."""
    entries: dict[str, str] = {}
    for item in re.split(r"\n- ", COMMAND_REFERENCE)[1:]:
        match = re.match(r"`nmt ([a-z-]+)", item)
        if match:
            entries[match.group(1)] = entries.get(match.group(1), "") + item
    return entries


COMMAND_ENTRIES = command_entries()


@pytest.mark.parametrize("subcommand", sorted(SUBCOMMANDS))
def test_the_command_reference_lists_every_subcommand_and_its_options(subcommand):
    # The reverse of the check above: an option the parser has and its item does not name (its long
    # or short spelling, a positional by its metavar) is one the reader cannot learn of from it.
    entry = COMMAND_ENTRIES.get(subcommand)
    assert entry, f"nmt {subcommand} has no item in the README's command reference"
    for action in SUBCOMMANDS[subcommand]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        names = action.option_strings or [action.metavar or action.dest.upper()]
        named = any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", entry) for name in names)
        assert named, f"nmt {subcommand} {names[0]} is missing from its item in the README's command reference"


# The CLI defaults the command reference states, as it words them, and the value each stands for.
STATED_OPTION_DEFAULTS = [
    ("[--beam-sizes 1,2,4,5,8]", "tune-decode", "beam_sizes", [1, 2, 4, 5, 8]),
    ("[--length-penalties 0,0.6,0.8,1,1.2,1.5]", "tune-decode", "length_penalties", [0, 0.6, 0.8, 1, 1.2, 1.5]),
    ("`nmt compare RUN_DIR [RUN_DIR ...] [--out DIR]` (default `report`)", "compare", "out", "report"),
]


@pytest.mark.parametrize(("phrase", "subcommand", "dest", "default"), STATED_OPTION_DEFAULTS, ids=lambda v: str(v)[:40])
def test_each_option_default_the_command_reference_states_is_the_parser_s(phrase, subcommand, dest, default):
    assert " ".join(phrase.split()) in " ".join(COMMAND_REFERENCE.split()), phrase
    assert SUBCOMMANDS[subcommand].get_default(dest) == default


# The ranges the config reference states, as it words them: (phrase, key, lowest, highest allowed).
STATED_RANGES = [
    ("`synthetic_train_pairs`\ntraining pairs, at most 10^8", "data.synthetic_train_pairs", 1, 10**8),
    ("`character_coverage` (in [0.98, 1], what SentencePiece accepts)", "tokenizer.character_coverage", 0.98, 1.0),
    ("`threads` (SentencePiece's training threads, default 16, in [1, 1024])", "tokenizer.threads", 1, 1024),
    ("`encoder_layers` and `decoder_layers` are\nat most 1,024", "model.encoder_layers", 1, 1024),
    ("`encoder_layers` and `decoder_layers` are\nat most 1,024", "model.decoder_layers", 1, 1024),
    ("widths (`d_model`, `ff_size`, `rnn_hidden`, `max_positions`) at most 2^24", "model.d_model", 1, 2**24),
    ("widths (`d_model`, `ff_size`, `rnn_hidden`, `max_positions`) at most 2^24", "model.ff_size", 1, 2**24),
    ("widths (`d_model`, `ff_size`, `rnn_hidden`, `max_positions`) at most 2^24", "model.rnn_hidden", 1, 2**24),
    ("widths (`d_model`, `ff_size`, `rnn_hidden`, `max_positions`) at most 2^24", "model.max_positions", 1, 2**24),
    ("`threads` (`auto` or a number in [1, 1024]", "train.threads", 1, 1024),
]


def config_takes(key: str, value) -> bool:
    """Whether a minimal config with ``key`` set to ``value`` passes the checks of every config (not
    training's, which compare keys: max_positions against data.max_len)."""
    values = {"data": {"train": "t", "dev": "d"}}
    section, name = key.split(".")
    values.setdefault(section, {})[name] = value
    if key == "model.rnn_hidden":
        values["model"]["type"] = "rnn"
    if key == "model.d_model":
        values["model"]["heads"] = 1  # which divides any width
    try:
        config_from_dict(values, training=False)
    except NMTError:
        return False
    return True


@pytest.mark.parametrize(("phrase", "key", "lowest", "highest"), STATED_RANGES, ids=lambda v: str(v)[:40])
def test_each_range_the_config_reference_states_is_the_code_s(phrase, key, lowest, highest):
    assert " ".join(phrase.split()) in " ".join(REFERENCE.split()), phrase
    step = 1 if isinstance(lowest, int) else 0.001
    assert config_takes(key, lowest) and config_takes(key, highest), key
    assert not config_takes(key, lowest - step) and not config_takes(key, highest + step), key
