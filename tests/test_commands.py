"""What the commands after training do with their output and their edge cases (nmt/commands.py)."""

import errno
import io
import sys

import pytest
from conftest import PAIRS, write_corpus

from nmt.cli import main


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


class FullDisk(io.StringIO):
    """Standard output on a full disk (``> /dev/full``): every write is refused."""

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def hyp_and_ref(tmp_path):
    return write_corpus(tmp_path, "test", PAIRS[:3]).with_suffix(".en")


@pytest.mark.parametrize("json_option", [[], ["--json"]])
def test_eval_bleu_on_a_full_disk_names_standard_output(hyp_and_ref, capsys, monkeypatch, json_option):
    """Python's error names no file: the line said 'a file: could not write'."""
    monkeypatch.setattr(sys, "stdout", FullDisk())
    code, _, err = run_cli(["eval-bleu", "--hyp", hyp_and_ref, "--ref", hyp_and_ref, *json_option], capsys)
    assert code == 2
    assert err == "nmt eval-bleu: error: <stdout>: could not write (No space left on device)\n"


def test_eval_bleu_with_standard_output_closed_is_an_error_not_a_lost_score(hyp_and_ref, capsys, monkeypatch):
    """``>&-``: print dropped the scores and the command ended 0."""
    monkeypatch.setattr(sys, "stdout", None)
    code, _, err = run_cli(["eval-bleu", "--hyp", hyp_and_ref, "--ref", hyp_and_ref], capsys)
    assert code == 2
    assert err == "nmt eval-bleu: error: standard output is closed: eval-bleu prints the scores there\n"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    from conftest import tiny_config

    tmp_path = tmp_path_factory.mktemp("commands")
    assert main(["train", "--config", str(tiny_config(tmp_path, max_updates=60))]) == 0
    return tmp_path


def test_translate_to_standard_output_on_a_full_disk_names_it(trained_run, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", FullDisk())
    code, _, err = run_cli(
        ["translate", "--model", trained_run / "run", "--input", trained_run / "data/train.de"], capsys
    )
    assert code == 2
    assert err.endswith("nmt translate: error: <stdout>: could not write (No space left on device)\n")


def test_compare_takes_a_copy_of_the_same_test_set_elsewhere_as_comparable(trained_run, tmp_path, capsys):
    """The test set was told by its path: two runs each with its own copy of the same files were
    'Not comparable'. Each run's log line names its directory, as its table row does, not the
    config's name, which two runs of one config share."""
    import json
    import shutil

    import yaml

    other = tmp_path / "other"
    shutil.copytree(trained_run / "run", other)
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["data"]["test"]["path"] = str(write_corpus(tmp_path / "copy", "train", PAIRS))
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "report"
    code, _, err = run_cli(["compare", trained_run / "run", other, "--out", out], capsys)
    assert code == 0, err
    assert "do not compare" not in err and "Not comparable" not in (out / "compare.md").read_text()
    assert f"\n{trained_run / 'run'}: test BLEU" in "\n" + err and f"\n{other}: test BLEU" in err
    summaries = json.loads((out / "compare.json").read_text())
    assert summaries[0]["test_set"] != summaries[1]["test_set"]
    assert summaries[0]["test_digest"] == summaries[1]["test_digest"]


def stdin_of(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_eval_bleu_reads_the_hypotheses_or_a_reference_from_standard_input_as_dash(hyp_and_ref, capsys, monkeypatch):
    """``nmt translate ... | nmt eval-bleu --hyp - --ref REF``, as sacreBLEU and fairseq-score are
    fed: '-' was 'no such file'."""
    text = hyp_and_ref.read_bytes()
    stdin_of(monkeypatch, text)
    code, out, err = run_cli(["eval-bleu", "--hyp", "-", "--ref", hyp_and_ref], capsys)
    assert (code, err) == (0, "") and out.startswith("BLEU 100.00  chrF 100.00  (3 sentences)")
    stdin_of(monkeypatch, text)
    code, out, err = run_cli(["eval-bleu", "--hyp", hyp_and_ref, "--ref", "-"], capsys)
    assert (code, err) == (0, "") and out.startswith("BLEU 100.00")
    stdin_of(monkeypatch, text.split(b"\n", 1)[1])
    code, out, err = run_cli(["eval-bleu", "--hyp", "-", "--ref", hyp_and_ref], capsys)
    assert (
        code == 2
        and err == f"nmt eval-bleu: error: <stdin> has 2 lines but {hyp_and_ref} has 3: they must align line by line\n"
    )
    stdin_of(monkeypatch, b"a\n\xff\n")
    code, out, err = run_cli(["eval-bleu", "--hyp", "-", "--ref", hyp_and_ref], capsys)
    assert code == 2 and err == "nmt eval-bleu: error: <stdin>:2: not valid UTF-8\n"


@pytest.mark.parametrize("twice", [["--hyp", "-", "--ref", "-"], ["--model", "run", "--src", "-", "--ref", "-"]])
def test_standard_input_named_twice_is_a_one_line_error(capsys, twice):
    code, out, err = run_cli(["eval-bleu", *twice], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "standard input can be read once" in err
