"""What counts as a number in a file nmt wrote and reads back."""

import subprocess
import sys

import pytest

from nmt.saved_numbers import is_number, is_whole_number


@pytest.mark.parametrize("value", [True, False, "3", None, [1]])
def test_a_bool_a_string_or_nothing_is_no_number(value):
    assert not is_number(value) and not is_whole_number(value)


def test_a_float_is_a_number_but_not_a_whole_one_and_nan_is_left_to_the_reader():
    assert is_whole_number(3) and is_number(3) and is_number(2.5) and not is_whole_number(3.0)
    assert is_number(float("nan")) and is_number(float("inf"))


def test_metrics_reads_them_without_torch():
    """plot and compare read metrics.jsonl through nmt.metrics, which loads no torch."""
    code = "import sys, nmt.metrics; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
