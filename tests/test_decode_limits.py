"""Output length limits (decode.max_len_a / max_len_b) and the model's positions: a large limit is
capped at the positions the decoder has, and only a source longer than the model's positions is
truncated, with a warning naming its line."""

import json

import pytest
import yaml
from conftest import PAIRS, tiny_config, write_corpus

from nmt.cli import main
from nmt.config import config_from_dict
from nmt.errors import NMTError

MAX_POSITIONS = 32


@pytest.fixture(scope="module")
def run_with_huge_limits(tmp_path_factory):
    """A tiny Transformer with learned positions, trained with max_len_a 1000 and max_len_b 5000:
    far more output steps than its 32 positions."""
    tmp = tmp_path_factory.mktemp("limits")
    config = tiny_config(tmp)
    values = yaml.safe_load(config.read_text())
    values["model"].update(positions="learned", max_positions=MAX_POSITIONS)
    values["decode"].update(max_len_a=1000.0, max_len_b=5000)
    values["data"]["max_len"] = MAX_POSITIONS - 1  # the longest training pair the positions hold
    config.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config)]) == 0
    return tmp


def test_large_limits_keep_every_source_whole(run_with_huge_limits, capsys):
    run, src = run_with_huge_limits / "run", run_with_huge_limits / "data" / "train.de"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["dev_bleu"] for r in records if r["type"] == "valid"][-1] == pytest.approx(100.0)
    capsys.readouterr()
    assert main(["translate", "--model", str(run), "--input", str(src), "--beam-size", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [t for _, t in PAIRS] and "warning" not in err


def test_a_source_longer_than_the_positions_is_truncated_with_a_warning(run_with_huge_limits, tmp_path, capsys):
    long_line = " ".join(["die katze sieht den hund"] * 20)  # well over 31 subwords
    source = tmp_path / "in.de"
    source.write_text(f"{PAIRS[0][0]}\n{long_line}\n\n{PAIRS[1][0]}\n{long_line}\n")
    run = run_with_huge_limits / "run"
    capsys.readouterr()
    assert main(["translate", "--model", str(run), "--input", str(source), "--beam-size", "1"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 5 and lines[0] == PAIRS[0][1] and lines[2] == "" and lines[3] == PAIRS[1][1]
    warnings = [line for line in err.splitlines() if line.startswith("warning")]
    assert warnings == [
        f"warning: input lines 2, 5 (2 lines) are longer than the model's positions allow ({MAX_POSITIONS - 1} "
        f"subwords): translated from the first {MAX_POSITIONS - 1} subwords only"
    ]


def test_dev_pairs_longer_than_the_positions_are_said_once_in_the_log(tmp_path):
    """A dev pair with a side over max_positions - 1 subwords is scored cut to them (dev loss) and its
    long source translated from its beginning (dev BLEU): train.log says so once, counting the pairs
    and the sources validation cuts, not at every validation."""
    kernels = {"attention": "explicit", "fp32_matmul": "blas", "threads": 1}  # nothing to measure
    config = tiny_config(tmp_path, max_updates=2, warmup_updates=1, validate_every=1, **kernels)
    values = yaml.safe_load(config.read_text())
    long_src, long_trg = " ".join([PAIRS[1][0]] * 20), " ".join([PAIRS[1][1]] * 20)  # well over 31 subwords
    dev = [PAIRS[0], (long_src, long_trg), (PAIRS[2][0], long_trg), (long_src, PAIRS[3][1])]
    values["data"]["dev"] = str(write_corpus(tmp_path / "data", "dev", dev))
    values["model"].update(positions="learned", max_positions=MAX_POSITIONS)
    values["data"]["max_len"] = MAX_POSITIONS - 1
    values["train"]["validate_max_sentences"] = 3  # the last long source is not translated
    config.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config)]) == 0
    log = (tmp_path / "run" / "train.log").read_text().splitlines()
    assert sum("validation at update" in line for line in log) == 2
    limit = MAX_POSITIONS - 1
    assert [line.split(" ", 2)[2] for line in log if "warning" in line] == [
        f"warning: dev: 3 of 4 pairs have a side longer than model.max_positions {MAX_POSITIONS} allows ({limit} "
        f"subwords): the dev loss scores only their first {limit} subwords; validation translates 1 of them from "
        f"their first {limit} source subwords, and dev BLEU scores that against the whole reference"
    ]


def config_with_decode(key: str, value) -> dict:
    return {
        "data": {"train": "d/train", "dev": "d/dev"},
        "train": {"max_updates": 10, "warmup_updates": 2},
        "decode": {key: value},
    }


def command_line_errors(tmp_path, capsys, option: str, value: str) -> list[str]:
    """The error lines of ``nmt translate OPTION VALUE``, which argparse must refuse (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(["translate", "--model", str(tmp_path), option, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    return [line for line in err.splitlines() if "error" in line]


@pytest.mark.parametrize(
    "key,value",
    [("max_len_a", float("inf")), ("max_len_a", float("nan")), ("max_len_a", -1.0), ("length_penalty", float("nan"))],
)
def test_non_finite_or_negative_decode_values_in_a_config_are_refused(key, value):
    with pytest.raises(NMTError, match=f"config key 'decode.{key}': .*(is not a finite number|must be >= 0)"):
        config_from_dict(config_with_decode(key, value))


@pytest.mark.parametrize("option,value", [("--max-len-a", "inf"), ("--max-len-a", "nan"), ("--max-len-b", "-1")])
def test_non_finite_or_negative_limits_on_the_command_line_are_refused(tmp_path, capsys, option, value):
    assert command_line_errors(tmp_path, capsys, option, value) == [
        f"nmt translate: error: argument {option}: "
        + ("expected a finite number" if value != "-1" else "expected an integer >= 0")
        + f", got '{value}'"
    ]


@pytest.mark.parametrize("key,value", [("length_penalty", 400.0), ("max_len_b", 2**31 + 1), ("max_len_b", 10**20)])
def test_decode_values_beyond_float_or_int64_range_are_refused_in_a_config(key, value):
    # length**400 overflows a float at the first validation; a * src + 10**20 leaves int64.
    with pytest.raises(NMTError, match=rf"config key 'decode.{key}': .* must be in \[0, "):
        config_from_dict(config_with_decode(key, value))


@pytest.mark.parametrize("option,value", [("--length-penalty", "400"), ("--max-len-b", "99999999999999999999")])
def test_decode_values_beyond_range_on_the_command_line_are_refused(tmp_path, capsys, option, value):
    assert command_line_errors(tmp_path, capsys, option, value) == [
        f"nmt translate: error: argument {option}: expected "
        + ("a number in [0, 10]" if option == "--length-penalty" else f"an integer in [0, {2**31}]")
        + f", got '{value}'"
    ]


def test_text_the_tokenizer_never_saw_is_named_in_a_warning(run_with_huge_limits, tmp_path, capsys):
    """Characters absent from the training text reach the model as one unknown piece, which it was
    never trained to write: the translation drops them without a word unless one is said."""
    source = tmp_path / "in.de"
    source.write_text(f"{PAIRS[0][0]}\n{PAIRS[1][0]} 😀\n\nQuokka {PAIRS[2][0]}\n")
    capsys.readouterr()
    assert main(["translate", "--model", str(run_with_huge_limits / "run"), "--input", str(source)]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 4
    warnings = [line for line in err.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: input lines 2, 4 (2 lines) hold text the tokenizer")
    assert "'😀'" in warnings[0] and "'Q'" in warnings[0]
