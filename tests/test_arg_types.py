"""The argparse types that nmt's options and the scripts share."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.arg_types import int_at_least, non_negative_int, positive_float, positive_int


@pytest.mark.parametrize("text", ["0", "-3", "two", "1.5", ""])
def test_a_count_below_its_least_or_not_an_integer_is_refused_in_the_same_words(text):
    with pytest.raises(argparse.ArgumentTypeError, match=rf"^expected an integer >= 1, got {text!r}$"):
        positive_int(text)


def test_the_least_and_why_it_is_so_are_said():
    assert non_negative_int("0") == 0 and int_at_least(2, "checkpoints to average")("2") == 2
    with pytest.raises(
        argparse.ArgumentTypeError, match=r"^expected an integer >= 2 \(checkpoints to average\), got '1'$"
    ):
        int_at_least(2, "checkpoints to average")("1")


@pytest.mark.parametrize(
    "text,said",
    [
        ("0", "a number > 0"),
        ("-1", "a number > 0"),
        ("nan", "a finite number"),
        ("inf", "a finite number"),
        ("x", "a number"),
    ],
)
def test_a_duration_is_a_finite_number_above_zero(text, said):
    assert positive_float("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError, match=rf"^expected {said}, got {text!r}$"):
        positive_float(text)


def test_the_types_load_no_torch():
    """scripts/peer_speed.py reads its arguments before it starts the trainers, without torch."""
    code = "import sys, nmt.arg_types; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize(
    "script,args,said",
    [
        ("peer_speed.py", ["--peer=~/none.sh"], "no peer script at HOME/none.sh"),
        ("profile_step.py", ["--config=~/none.yaml"], "HOME/none.yaml: no such config file"),
        ("rnn_update_times.py", ["--config=~/none.yaml"], "HOME/none.yaml: no such config file"),
        ("bench_scale.py", ["--workdir=~/taken"], "HOME/taken"),
        ("ct2_compare.py", ["~/run", "--src=~/none.de"], "HOME/none.de"),
        ("get_multi30k.py", ["--out=~/taken"], "cannot create HOME/taken: it is a file"),
        (
            "recipe_search.py",
            ["--base=~/none.yaml", "--out=~/o", "--minutes=1", "--variant=a: seed=2"],
            "HOME/none.yaml",
        ),
    ],
)
def test_the_scripts_path_options_expand_a_leading_tilde_as_nmts_do(tmp_path, script, args, said):
    """The shell leaves '~' in '--config=~/x' (and in a quoted path): each script failed on a path
    named '~/x' in its working directory, or wrote one there."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "taken").write_text("a file where a directory is asked for\n")
    env = {**os.environ, "HOME": str(home), "MULTI30K_DIR": str(home / "none")}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and said.replace("HOME", str(home)) in done.stderr, done.stderr
    assert not (tmp_path / "~").exists()
