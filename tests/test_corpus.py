"""Reading parallel text in every supported format, and the cleaning/filter reports."""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cache_hub_dataset, tiny_config

from nmt.config import CorpusConfig
from nmt.corpus import (
    clean_pairs,
    describe_drops,
    filter_by_length,
    iter_lines,
    iter_parallel,
    read_lines,
    read_parallel,
    resolve_format,
)
from nmt.errors import NMTError
from nmt.hf_corpus import hub_commit

DE = ["Guten Morgen", "Das Haus ist klein .", "Über allen Gipfeln"]
EN = ["Good morning", "The house is small .", "Over all the peaks"]


def _write(path: Path, lines: list[str], *, gz: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- read_lines


def test_read_lines_plain_and_gzip_agree(tmp_path):
    _write(tmp_path / "a.txt", DE)
    _write(tmp_path / "a.txt.gz", DE, gz=True)
    assert read_lines(tmp_path / "a.txt") == DE
    assert read_lines(tmp_path / "a.txt.gz") == DE


def test_read_lines_strips_bom_and_crlf(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + b"eins\r\nzwei\r\n\r\ndrei")
    assert read_lines(path) == ["eins", "zwei", "", "drei"]


@pytest.mark.parametrize(
    "data,lines",
    [
        (b"eins\rzwei\r\rdrei\r", ["eins", "zwei", "", "drei"]),  # old Mac: CR alone ends a line
        (b"\xef\xbb\xbfeins\rzwei\rdrei", ["eins", "zwei", "drei"]),
        (b"eins\rzwei\rdrei\r\n", ["eins", "zwei", "drei"]),  # a final newline added by a tool
        (b"ei\rns\nzwei\r\ndrei\n", ["ei\rns", "zwei", "drei"]),  # a stray CR inside a line is text
        (b"a\r\r\nb\r\r\nc\n", ["a\r", "b\r", "c"]),  # CR CRLF: the line keeps its stray CR
        (b"eins\r", ["eins"]),
    ],
)
def test_read_lines_with_cr_line_ends(tmp_path, monkeypatch, data, lines):
    import nmt.corpus

    path = tmp_path / "t.txt"
    path.write_bytes(data)
    assert read_lines(path) == lines
    monkeypatch.setattr(nmt.corpus, "_BLOCK_BYTES", 1)  # the same, a byte at a time
    assert read_lines(path) == lines


def test_a_file_is_judged_old_mac_by_its_start(tmp_path, monkeypatch):
    import nmt.corpus

    monkeypatch.setattr(nmt.corpus, "MAC_SAMPLE_BYTES", 16)
    monkeypatch.setattr(nmt.corpus, "_BLOCK_BYTES", 5)
    path = tmp_path / "t.txt"
    path.write_bytes(b"one\ntwo\nthree\nfour\r5\r6\r7\r8\r9\n")  # LF in its first 16 bytes
    assert read_lines(path) == ["one", "two", "three", "four\r5\r6\r7\r8\r9"]
    path.write_bytes(b"one\rtwo\rthree\rfour\n5\n6\n7\n8\n9\r")  # CR: universal newlines from there on
    assert read_lines(path) == ["one", "two", "three", "four", "5", "6", "7", "8", "9"]
    path.write_bytes(b"a\xffb\rc\rd\r")
    with pytest.raises(NMTError, match=r"t\.txt:1: not valid UTF-8"):
        read_lines(path)
    path.write_bytes(b"a\rb\rc\xff\r")
    with pytest.raises(NMTError, match=r"t\.txt:3: not valid UTF-8"):
        read_lines(path)


def test_read_lines_keeps_unicode_line_separators_inside_a_line(tmp_path):
    # U+2028 / U+0085 inside a sentence must not split it (would misalign parallel files).
    path = _write(tmp_path / "sep.txt", ["a\u2028b", "c\x85d"])
    assert read_lines(path) == ["a\u2028b", "c\x85d"]


def test_read_lines_empty_file(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    assert read_lines(tmp_path / "empty.txt") == []


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.de"
    path.write_bytes(b"ok\nalso ok\nbroken \xff\xfe here\n")
    with pytest.raises(NMTError) as err:
        read_lines(path)
    assert _one_line(err) == f"{path}:3: not valid UTF-8"


def test_invalid_utf8_in_gzip_names_line(tmp_path):
    path = tmp_path / "bad.de.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"one\ntwo \xc3\n")
    with pytest.raises(NMTError, match=r"bad\.de\.gz:2: not valid UTF-8"):
        read_lines(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(NMTError) as err:
        read_lines(tmp_path / "nope.txt")
    assert str(tmp_path / "nope.txt") in _one_line(err)
    with pytest.raises(NMTError) as err:
        read_lines(tmp_path)
    assert "directory" in _one_line(err) and str(tmp_path) in str(err.value)


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "x.gz"
    path.write_bytes(b"this is not gzip")
    with pytest.raises(NMTError, match="gzip"):
        read_lines(path)


def test_permission_denied_message(tmp_path, monkeypatch):
    # Exercised even as root, where chmod 000 does not stop reads.
    path = _write(tmp_path / "locked.txt", DE)

    def deny(file, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr("nmt.corpus.open", deny, raising=False)
    with pytest.raises(NMTError) as err:
        read_lines(path)
    assert _one_line(err) == f"{path}: permission denied"


def test_permission_denied(tmp_path):
    path = _write(tmp_path / "secret.txt", DE)
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running with privileges that ignore file permissions")
        with pytest.raises(NMTError) as err:
            read_lines(path)
        assert "permission denied" in _one_line(err) and str(path) in str(err.value)
    finally:
        path.chmod(0o644)


# --------------------------------------------------------------------------- plain and TSV corpora


def test_plain_prefix_with_mixed_gzip(tmp_path):
    _write(tmp_path / "train.de", DE)
    _write(tmp_path / "train.en.gz", EN, gz=True)
    spec = CorpusConfig(path=str(tmp_path / "train"))
    assert resolve_format(spec, "de", "en") == "plain"
    assert read_parallel(spec, "de", "en") == (DE, EN)


def test_a_side_in_both_plain_and_gzip_is_refused_not_guessed(tmp_path):
    _write(tmp_path / "train.de", DE)
    _write(tmp_path / "train.de.gz", DE[:1], gz=True)
    _write(tmp_path / "train.en", EN)
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "train")), "de", "en")
    message = _one_line(err)
    assert f"{tmp_path / 'train.de'} and {tmp_path / 'train.de.gz'} both exist" in message


def test_plain_max_pairs(tmp_path):
    _write(tmp_path / "c.de", DE)
    _write(tmp_path / "c.en", EN)
    src, trg = read_parallel(CorpusConfig(path=str(tmp_path / "c"), max_pairs=2), "de", "en")
    assert (src, trg) == (DE[:2], EN[:2])


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    _write(tmp_path / "c.de", DE)
    _write(tmp_path / "c.en", EN[:2])
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "c")), "de", "en")
    message = _one_line(err)
    assert f"{tmp_path / 'c.de'} has 3 lines" in message
    assert f"{tmp_path / 'c.en'} has 2" in message


def test_missing_target_side_names_file(tmp_path):
    _write(tmp_path / "c.de", DE)
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "c"), format="plain"), "de", "en")
    assert str(tmp_path / "c.en") in _one_line(err)


def test_auto_plain_files_beside_a_directory_of_the_prefix_are_ambiguous(tmp_path, capsys):
    from nmt.cli import main

    (tmp_path / "c2").mkdir()
    _write(tmp_path / "c2" / "train.de", DE)
    _write(tmp_path / "c2" / "train.en", EN)
    (tmp_path / "c2" / "train").mkdir()
    prefix = str(tmp_path / "c2" / "train")
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=prefix), "de", "en")
    assert _one_line(err) == (
        f"{prefix}: both plain files ({prefix}.de, {prefix}.en) and a directory of that name exist: "
        "set the corpus's format: plain (the files) or format: hf (the directory)"
    )
    assert read_parallel(CorpusConfig(path=prefix, format="plain"), "de", "en") == (DE, EN)
    # The same in training: one line, exit 2, before anything is trained; format plain trains.
    config = tiny_config(tmp_path, max_updates=2, validate_every=2, warmup_updates=1)
    (tmp_path / "data" / "train").mkdir()
    assert main(["train", "--config", str(config)]) == 2
    assert "train: both plain files" in capsys.readouterr().err
    plain = [arg for split in ("train", "dev", "test") for arg in ("--set", f"data.{split}.format=plain")]
    assert main(["train", "--config", str(config), *plain]) == 0


@pytest.mark.parametrize("command", ["prepare", "train"])
@pytest.mark.parametrize("split", ["train", "dev"])
def test_a_missing_corpus_names_its_config_key_and_where_it_was_given(tmp_path, capsys, split, command):
    # The error named the files alone, and a config names three corpora; then the key alone, checked
    # once the config's file and --set options were out of reach.
    from nmt.cli import main

    config = tiny_config(tmp_path)
    missing = tmp_path / "nowhere" / "corpus"
    assert main([command, "--config", str(config), "--set", f"data.{split}={missing}"]) == 2
    no_such = f"config key 'data.{split}': no such corpus: {missing}.de / {missing}.en"
    assert capsys.readouterr().err.splitlines()[-1] == f"nmt {command}: error: --set data.{split}={missing}: {no_such}"
    text = config.read_text()
    config.write_text(text.replace(f"{split}: {tmp_path / 'data' / 'train'}", f"{split}: {missing}"))
    line = config.read_text().splitlines().index(f"  {split}: {missing}") + 1
    assert main([command, "--config", str(config)]) == 2
    place = f"{config}: line {line}, column 3"
    assert capsys.readouterr().err.splitlines()[-1] == f"nmt {command}: error: {place}: {no_such}"
    assert not (tmp_path / "run").exists()  # found before any work


def test_auto_missing_path_like_prefix(tmp_path):
    prefix = str(tmp_path / "nothing")
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=prefix), "de", "en")
    assert _one_line(err) == f"no such corpus: {prefix}.de / {prefix}.en"


def test_auto_bare_name_means_hub():
    assert resolve_format(CorpusConfig(path="wmt14"), "de", "en") == "hf"
    assert resolve_format(CorpusConfig(path="Some-Org/some-corpus-xyz"), "de", "en") == "hf"


@pytest.mark.parametrize("gz", [False, True])
def test_tsv(tmp_path, gz):
    name = "c.tsv.gz" if gz else "c.tsv"
    path = _write(tmp_path / name, [f"{d}\t{e}" for d, e in zip(DE, EN)], gz=gz)
    spec = CorpusConfig(path=str(path))
    assert resolve_format(spec, "de", "en") == "tsv"
    assert read_parallel(spec, "de", "en") == (DE, EN)


def test_tsv_bad_line_names_file_and_line(tmp_path):
    path = _write(tmp_path / "c.tsv", ["a\tb", "c\td", "no tab here", "e\tf"])
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(path)), "de", "en")
    assert _one_line(err).startswith(f"{path}:3:")
    path = _write(tmp_path / "d.tsv", ["a\tb\tc"])
    with pytest.raises(NMTError, match=r"d\.tsv:1:"):
        read_parallel(CorpusConfig(path=str(path)), "de", "en")


def test_a_tsv_header_naming_the_two_languages_is_skipped_and_read_as_a_data_directory_reads_it(tmp_path, monkeypatch):
    # It was trained on as the pair ('de', 'en'), where a data-files directory's TSV takes the same
    # line as its column names: the same file said other things in the two places.
    data_dir = _data_files_dir(tmp_path, monkeypatch, "tsv")
    pairs = [f"{d}\t{e}" for d, e in zip(DE, EN)]
    for header, expected in (("de\ten", (DE, EN)), ("en\tde", (EN, DE))):  # by name: the columns swapped
        _write(tmp_path / "c.tsv", [header, *pairs])
        _write(data_dir / "train.tsv", [header, *pairs])
        assert read_parallel(CorpusConfig(path=str(tmp_path / "c.tsv")), "de", "en") == expected
        assert read_parallel(CorpusConfig(path=str(data_dir)), "de", "en") == expected


@pytest.mark.parametrize("first", ["source\ttarget", "DE\tEN", "de\tfr", "en\ten"])
def test_a_tsv_first_line_that_names_not_the_two_languages_is_a_pair(tmp_path, first):
    path = _write(tmp_path / "c.tsv", [first, *(f"{d}\t{e}" for d, e in zip(DE, EN))])
    src, trg = read_parallel(CorpusConfig(path=str(path)), "de", "en")
    assert (src[0], trg[0]) == tuple(first.split("\t")) and (src[1:], trg[1:]) == (DE, EN)


def test_only_a_tsv_files_first_line_can_be_its_header(tmp_path):
    path = _write(tmp_path / "c.tsv", ["a\tb", "de\ten"])
    assert read_parallel(CorpusConfig(path=str(path)), "de", "en") == (["a", "de"], ["b", "en"])


def test_tsv_crlf_does_not_leak_carriage_return(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_bytes(b"a\tb\r\nc\td\r\n")
    assert read_parallel(CorpusConfig(path=str(path)), "de", "en") == (["a", "c"], ["b", "d"])


def test_corpora_with_old_mac_line_ends_read_pair_by_pair(tmp_path):
    cr = lambda lines: "".join(line + "\r" for line in lines).encode("utf-8")  # noqa: E731
    (tmp_path / "mac.de").write_bytes(cr(DE))
    (tmp_path / "mac.en").write_bytes(cr(EN))
    assert read_parallel(CorpusConfig(path=str(tmp_path / "mac")), "de", "en") == (DE, EN)
    _write(tmp_path / "mac.en", EN)  # one side LF: the pairs are the same
    assert read_parallel(CorpusConfig(path=str(tmp_path / "mac")), "de", "en") == (DE, EN)
    (tmp_path / "mac.tsv").write_bytes(cr([f"{d}\t{e}" for d, e in zip(DE, EN)]))
    assert read_parallel(CorpusConfig(path=str(tmp_path / "mac.tsv")), "de", "en") == (DE, EN)


# --------------------------------------------------------------------------- Hugging Face datasets


@pytest.mark.parametrize("installed", ["2.14.0", "2.17.1"])
def test_a_datasets_older_than_the_floor_is_refused_in_one_line(tmp_path, monkeypatch, installed):
    """datasets 2.14, pyproject's old floor, has no datasets.exceptions: a ModuleNotFoundError traceback."""
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: installed if name == "datasets" else real_version(name)
    )
    (tmp_path / "ds").mkdir()
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "ds"), format="hf"), "de", "en")
    assert _one_line(err) == (
        f"{tmp_path / 'ds'}: reading a Hugging Face dataset needs datasets 2.18 or later, not {installed}: "
        "pip install 'datasets>=2.18'"
    )


def test_the_datasets_floor_is_pyprojects():
    from nmt import hf_corpus

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"datasets>={hf_corpus.OLDEST_DATASETS}",' in pyproject
    hf_corpus._check_datasets_version("corpus")  # the datasets running this test


def test_hf_saved_dataset_with_translation_column(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"de": d, "en": e} for d, e in zip(DE, EN)]
    datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(tmp_path / "ds"))
    spec = CorpusConfig(path=str(tmp_path / "ds"))
    assert resolve_format(spec, "de", "en") == "hf"
    assert read_parallel(spec, "de", "en") == (DE, EN)
    assert read_parallel(spec, "en", "de") == (EN, DE)
    assert read_parallel(CorpusConfig(path=str(tmp_path / "ds"), max_pairs=1), "de", "en") == (DE[:1], EN[:1])


def test_hf_saved_dataset_dict_with_language_columns(tmp_path):
    datasets = pytest.importorskip("datasets")
    splits = {
        "train": datasets.Dataset.from_dict({"de": DE, "en": EN}),
        "validation": datasets.Dataset.from_dict({"de": DE[:1], "en": EN[:1]}),
    }
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dd"))
    assert read_parallel(CorpusConfig(path=str(tmp_path / "dd")), "de", "en") == (DE, EN)
    dev = CorpusConfig(path=str(tmp_path / "dd"), split="validation")
    assert read_parallel(dev, "de", "en") == (DE[:1], EN[:1])
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "dd"), split="test"), "de", "en")
    assert "'test'" in _one_line(err) and "validation" in str(err.value)


def test_hf_split_of_a_saved_dataset_without_splits_is_an_error(tmp_path):
    # save_to_disk of a Dataset (not a DatasetDict) has no splits: 'validation' would read the one there is.
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"de": DE, "en": EN}).save_to_disk(str(tmp_path / "single"))
    assert read_parallel(CorpusConfig(path=str(tmp_path / "single"), split="train"), "de", "en") == (DE, EN)
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "single"), split="validation"), "de", "en")
    assert _one_line(err) == (
        f"config key 'split': split 'validation', but {tmp_path / 'single'} holds one dataset without splits "
        "(save_to_disk of a Dataset, not a DatasetDict): remove the key, or name that split's own directory"
    )


@pytest.mark.parametrize("saved", ["Dataset", "DatasetDict"])
def test_hf_config_of_a_saved_dataset_is_an_error(tmp_path, saved):
    # load_from_disk takes no configuration name: the one saved would be read whatever the key said.
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict({"de": DE, "en": EN})
    (dataset if saved == "Dataset" else datasets.DatasetDict({"train": dataset})).save_to_disk(str(tmp_path / "ds"))
    assert read_parallel(CorpusConfig(path=str(tmp_path / "ds")), "de", "en") == (DE, EN)
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "ds"), hf_config="de-en"), "de", "en")
    assert _one_line(err) == (
        f"config key 'hf_config': 'de-en', but {tmp_path / 'ds'} is a dataset saved with save_to_disk, which holds "
        "the one configuration it was saved from and has no others to choose: remove the key"
    )


def test_hf_named_columns_and_missing_column(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"source": DE, "target": EN}).save_to_disk(str(tmp_path / "ds"))
    spec = CorpusConfig(path=str(tmp_path / "ds"), src_column="source", trg_column="target")
    assert read_parallel(spec, "de", "en") == (DE, EN)
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "ds")), "de", "en")
    message = _one_line(err)
    assert "'de'" in message and "source" in message and "target" in message


def test_hf_translation_column_missing_language(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"de": d, "en": e} for d, e in zip(DE, EN)]
    datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "ds")), "fr", "en")
    assert "'fr'" in _one_line(err) and "de, en" in str(err.value)


def _data_files_dir(tmp_path: Path, monkeypatch, name: str) -> Path:
    """An empty directory ``tmp_path/name`` for data files ``datasets`` reads, its cache kept under
    ``tmp_path`` (not ~/.cache); skips the test without ``datasets``."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    data_dir = tmp_path / name
    data_dir.mkdir()
    return data_dir


def test_hf_directory_of_jsonl_files(tmp_path, monkeypatch):
    data_dir = _data_files_dir(tmp_path, monkeypatch, "jsonl")
    rows = [json.dumps({"translation": {"de": d, "en": e}}) for d, e in zip(DE, EN)]
    (data_dir / "train.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert read_parallel(CorpusConfig(path=str(data_dir)), "de", "en") == (DE, EN)


@pytest.mark.parametrize("streaming", [True, False])
def test_hf_directory_with_broken_jsonl(tmp_path, monkeypatch, streaming):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    data_dir = tmp_path / "jsonl"
    data_dir.mkdir()
    (data_dir / "train.jsonl").write_text('{"de": "a", "en": "b"}\n{broken\n', encoding="utf-8")
    printed = io.StringIO()
    handler = logging.StreamHandler(printed)  # beside the stderr handler datasets gives its logger
    logging.getLogger("datasets").addHandler(handler)
    try:
        with pytest.raises(NMTError) as err:
            read_parallel(CorpusConfig(path=str(data_dir), streaming=streaming), "de", "en")
    finally:
        logging.getLogger("datasets").removeHandler(handler)
    assert _one_line(err).startswith(f"{data_dir}: cannot load as a dataset")
    # the error is the only line: datasets' own "Failed to load JSON from file ..." is not printed before it
    assert "Failed to load JSON" not in printed.getvalue()


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"train.jsonl": b""}, "its data files hold no rows"),
        ({"train.jsonl.gz": gzip.compress(b"")}, "its data files hold no rows"),
        ({"train.jsonl.gz": gzip.compress(b'{"de": "a", "en": "b"}\n' * 1000)[:60]}, "Compressed file ended"),
        (
            {"train-0.jsonl": b'{"de": "a", "en": "b"}\n', "train-1.jsonl.gz": gzip.compress(b"x" * 9000)[:40]},
            "Compressed file ended",
        ),
    ],
    ids=["empty", "empty-gz", "truncated-gz", "truncated-second-file"],
)
def test_hf_directory_with_an_empty_or_truncated_data_file_is_one_line(tmp_path, monkeypatch, streaming, files, says):
    # datasets let a StopIteration (no rows) and an EOFError (a cut .gz) through: tracebacks
    data_dir = _data_files_dir(tmp_path, monkeypatch, "data")
    for name, content in files.items():
        (data_dir / name).write_bytes(content)
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(data_dir), streaming=streaming), "de", "en")
    assert _one_line(err).startswith(f"{data_dir}: cannot load as a dataset: ")
    assert says in str(err.value)


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("name", ["train.csv", "train.tsv"])
def test_hf_csv_cells_that_pandas_calls_missing_are_read_as_text(tmp_path, monkeypatch, streaming, name):
    # pandas read "None", "NA", "null" as missing: those pairs became empty and were dropped
    data_dir = _data_files_dir(tmp_path, monkeypatch, "csv")
    sep = "," if name.endswith(".csv") else "\t"
    rows = [("de", "en"), ("Keiner", "None"), ("NA", "Sodium"), ("null", "zero"), ("nan", "n/a"), ("", "empty")]
    (data_dir / name).write_text("".join(f"{de}{sep}{en}\n" for de, en in rows), encoding="utf-8")
    src, trg = read_parallel(CorpusConfig(path=str(data_dir), streaming=streaming), "de", "en")
    assert (src, trg) == (["Keiner", "NA", "null", "nan", ""], ["None", "Sodium", "zero", "n/a", "empty"])


@pytest.mark.parametrize("name", ["train.csv", "train.tsv"])
def test_a_hub_datasets_csv_cells_are_read_as_text_too(tmp_path, monkeypatch, name):
    """A hub dataset of CSV/TSV files goes through the same builder as a directory of them; here
    'someorg/pairs' is served from one (no network in tests): the options reach it as they would."""
    datasets = pytest.importorskip("datasets")
    data_dir = _data_files_dir(tmp_path, monkeypatch, "hub")
    sep = "," if name.endswith(".csv") else "\t"
    pairs = [("Keiner", "None"), ("NA", "Sodium"), ("null", "zero")]
    if sep == "\t":  # and a TSV file is not read with CSV quoting
        pairs.append(('"Ja, sagte er', '"Yes," he said'))
    (data_dir / name).write_text("".join(f"{de}{sep}{en}\n" for de, en in [("de", "en"), *pairs]), encoding="utf-8")
    asked = []

    def served(load):
        def call(path, *args, revision=None, **kwargs):
            asked.append((path, revision))
            return load(str(data_dir) if path == "someorg/pairs" else path, *args, **kwargs)

        return call

    monkeypatch.setattr(datasets, "load_dataset_builder", served(datasets.load_dataset_builder))
    monkeypatch.setattr(datasets, "load_dataset", served(datasets.load_dataset))
    monkeypatch.setattr("nmt.hf_corpus._hub_unreachable", lambda: None)
    spec = CorpusConfig(path="someorg/pairs", format="hf", revision="main")
    src, trg = read_parallel(spec, "de", "en")
    assert list(zip(src, trg)) == pairs
    assert len(asked) == 2 and set(asked) == {("someorg/pairs", "main")}  # the builder asked of that revision


@pytest.mark.parametrize("streaming", [True, False])
def test_hf_tsv_data_file_is_not_read_with_csv_quoting(tmp_path, monkeypatch, streaming):
    # CSV quoting took the quotes off '"Ja"', and an unbalanced one merged the next lines into its pair
    data_dir = _data_files_dir(tmp_path, monkeypatch, "tsv")
    de = ['"Ja, sagte er', "zwei", '"Ja"', 'Er sagt "ja"']
    en = ["Yes, he said", "two", '"Yes"', 'He says "yes"']
    rows = ["de\ten", *(f"{s}\t{t}" for s, t in zip(de, en))]
    (data_dir / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert read_parallel(CorpusConfig(path=str(data_dir), streaming=streaming), "de", "en") == (de, en)


def test_datasets_warnings_still_print_while_its_error_lines_are_kept_quiet():
    from nmt.hf_corpus import _datasets_log_quiet

    printed = io.StringIO()
    handler = logging.StreamHandler(printed)  # as the stderr handler datasets gives its logger
    library = logging.getLogger("datasets")
    library.addHandler(handler)
    try:
        log = logging.getLogger("datasets.builder")
        with _datasets_log_quiet():
            log.warning("using the latest cached version")
            log.error("Failed to load JSON from file")
        log.error("an error outside a read")
    finally:
        library.removeHandler(handler)
    assert printed.getvalue().splitlines() == ["using the latest cached version", "an error outside a read"]


@pytest.mark.parametrize(
    "columns, found",
    [
        ({"de": [d.split() for d in DE], "en": EN}, "column 'de' holds list, not text"),  # pre-tokenized
        ({"de": DE, "en": [None, 2, 3]}, "column 'en' holds int, not text"),  # the null before is no excuse
        (
            {"translation": [{"de": i, "en": e} for i, e in enumerate(EN)]},
            "column 'translation' (language 'de') holds int, not text",
        ),
    ],
)
def test_hf_saved_dataset_column_that_is_not_text_is_refused(tmp_path, columns, found):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "ds")), "de", "en")
    assert _one_line(err) == f"{tmp_path / 'ds'}: {found}"


@pytest.mark.parametrize("value, kind", [(7, "int"), (["Guten", "Morgen"], "list")])
def test_hf_data_file_column_that_is_not_text_is_refused_at_its_row(tmp_path, monkeypatch, value, kind):
    data_dir = _data_files_dir(tmp_path, monkeypatch, "jsonl")
    rows = [json.dumps({"de": None, "en": EN[0]})] + [json.dumps({"de": value, "en": e}) for e in EN[1:]]
    (data_dir / "train.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    chunks = iter_parallel(CorpusConfig(path=str(data_dir)), "de", "en", chunk_pairs=1)
    assert next(chunks) == ([""], [EN[0]])  # a null is still empty text, left to cleaning
    with pytest.raises(NMTError) as err:
        next(chunks)
    assert _one_line(err) == f"{data_dir}: column 'de' holds {kind}, not text"


def test_hub_offline_gives_one_line_error(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Both libraries read the variables at import time; set the parsed flags too.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    spec = CorpusConfig(path="made-up-org-xyz/no-such-corpus-42", hf_config="de-en")
    with pytest.raises(NMTError) as err:
        read_parallel(spec, "de", "en")
    message = _one_line(err)
    assert "could not be downloaded" in message and "offline" in message
    assert "made-up-org-xyz/no-such-corpus-42" in message


_NO_HUB = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once
_PROXIES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def test_unreachable_hub_fails_at_once_and_leaves_no_offline_mode_behind(tmp_path, monkeypatch, capfd):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants as hub

    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", _NO_HUB)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for name in _PROXIES:  # behind a proxy the Hub is not probed
        monkeypatch.delenv(name, raising=False)
    start = time.monotonic()
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path="made-up-org-xyz/no-such-corpus-42"), "de", "en")
    assert time.monotonic() - start < 10  # the Hub's retries with back-off alone sleep 23 s
    message = _one_line(err)
    assert message.startswith("hub dataset 'made-up-org-xyz/no-such-corpus-42': could not be downloaded")
    assert "offline (127.0.0.1:9: " in message
    assert capfd.readouterr().err == ""  # no retry warnings
    assert datasets.config.HF_HUB_OFFLINE is False and hub.HF_HUB_OFFLINE is False  # restored


def test_nmt_prepare_with_an_unreachable_hub_prints_one_line(tmp_path):
    config = tiny_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in _PROXIES and not k.endswith("_OFFLINE")}
    env.update(HF_ENDPOINT=_NO_HUB, HF_HOME=str(tmp_path / "hf"))
    args = ["prepare", "--config", str(config), "--set", "data.dev=made-up-org-xyz/no-such-corpus-42"]
    done = subprocess.run(
        [sys.executable, "-m", "nmt", *args],
        cwd=Path(__file__).resolve().parents[1],  # this checkout's nmt
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "nmt prepare: error: hub dataset 'made-up-org-xyz/no-such-corpus-42': could not be downloaded; "
        "the machine seems offline (127.0.0.1:9: Connection refused)"
    ]


def test_hf_missing_local_directory_is_not_looked_up_on_the_hub(tmp_path):
    missing = tmp_path / "no_such_dataset"
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(missing), format="hf"), "de", "en")
    assert _one_line(err) == f"{missing}: no such dataset directory"


# --------------------------------------------------------------------------- cleaning and filtering


def test_clean_pairs_strips_and_drops_empty():
    src = ["  a b ", "", "c", "d\r", "   "]
    trg = ["x", "y", "  ", "w", "v"]
    kept_src, kept_trg, report = clean_pairs(src, trg)
    assert kept_src == ["a b", "d"]
    assert kept_trg == ["x", "w"]
    assert report == {"read": 5, "empty": 3, "kept": 2}


def test_filter_by_length_counts_and_indices():
    src_lens = [5, 200, 10, 1, 0, 6]
    trg_lens = [6, 5, 40, 3, 2, 6]
    keep, report = filter_by_length(src_lens, trg_lens, max_len=128, max_ratio=3.0)
    # 1: too long; 2: ratio 4.0; 3: ratio exactly 3.0 kept; 4: zero length counts as 1 -> ratio 2.0
    assert keep == [0, 3, 4, 5]
    assert report == {"too_long": 1, "bad_ratio": 1, "kept": 4}


def test_filter_by_length_keeps_a_side_of_exactly_max_len():
    """A side with more than max_len subwords is too long: max_len itself is kept, on either side
    (a pair of max_len subwords then fills max_len + 1 positions with its EOS or BOS)."""
    keep, report = filter_by_length([10, 11, 10, 9], [10, 10, 11, 10], max_len=10, max_ratio=3.0)
    assert keep == [0, 3]
    assert report == {"too_long": 2, "bad_ratio": 0, "kept": 2}


def test_describe_drops_one_line():
    report = {"read": 29000, "empty": 3, "too_long": 12, "bad_ratio": 4, "kept": 28981}
    text = describe_drops(report, max_len=128, max_ratio=3.0)
    assert text == "read 29000 pairs, dropped 3 empty, 12 over 128 tokens, 4 over ratio 3.0; kept 28981"


# --------------------------------------------------------------------------- streaming


def test_iter_lines_across_tiny_blocks_equals_whole_file(tmp_path, monkeypatch):
    import nmt.corpus

    lines = ["Grüße aus Köln", "", "zwei\u2028teile", "ende ohne newline"]
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8"))
    monkeypatch.setattr(nmt.corpus, "_BLOCK_BYTES", 3)  # splits multi-byte characters and CRLF pairs
    assert list(iter_lines(path)) == lines


def test_iter_lines_names_the_bad_line_in_a_later_block(tmp_path, monkeypatch):
    import nmt.corpus

    path = tmp_path / "bad.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(50)) + b"bad \xff\n" + b"after\n")
    monkeypatch.setattr(nmt.corpus, "_BLOCK_BYTES", 16)
    with pytest.raises(NMTError) as err:
        list(iter_lines(path))
    assert _one_line(err) == f"{path}:51: not valid UTF-8"


def test_iter_parallel_chunks_and_max_pairs(tmp_path):
    _write(tmp_path / "c.de", [f"de {i}" for i in range(23)])
    _write(tmp_path / "c.en", [f"en {i}" for i in range(23)])
    chunks = list(iter_parallel(CorpusConfig(path=str(tmp_path / "c")), "de", "en", chunk_pairs=10))
    assert [len(s) for s, _ in chunks] == [10, 10, 3]
    assert chunks[2] == (["de 20", "de 21", "de 22"], ["en 20", "en 21", "en 22"])
    limited = list(iter_parallel(CorpusConfig(path=str(tmp_path / "c"), max_pairs=15), "de", "en", chunk_pairs=10))
    assert [len(s) for s, _ in limited] == [10, 5]


def test_line_count_mismatch_found_when_streaming_past_the_first_chunk(tmp_path):
    _write(tmp_path / "c.de", [f"de {i}" for i in range(25)])
    _write(tmp_path / "c.en", [f"en {i}" for i in range(27)])
    with pytest.raises(NMTError) as err:
        list(iter_parallel(CorpusConfig(path=str(tmp_path / "c")), "de", "en", chunk_pairs=10))
    assert f"{tmp_path / 'c.de'} has 25 lines" in _one_line(err) and "has 27" in str(err.value)


def test_hf_local_dataset_in_hub_schema_is_streamed_without_an_arrow_copy(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    data_dir = tmp_path / "wmt_like"
    data_dir.mkdir()
    de = [f"Satz {i}" for i in range(250)]
    en = [f"sentence {i}" for i in range(250)]
    rows = [json.dumps({"translation": {"de": d, "en": e}}) for d, e in zip(de, en)]
    (data_dir / "train.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    chunks = list(iter_parallel(CorpusConfig(path=str(data_dir)), "de", "en", chunk_pairs=100))
    assert [len(s) for s, _ in chunks] == [100, 100, 50]
    assert [x for s, _ in chunks for x in s] == de and [x for _, t in chunks for x in t] == en
    assert not list(cache.rglob("*.arrow"))  # nothing was materialized
    # streaming: false converts to Arrow first (the datasets cache), with the same result.
    spec = CorpusConfig(path=str(data_dir), streaming=False)
    assert read_parallel(spec, "de", "en") == (de, en)
    assert list(cache.rglob("*.arrow"))


def test_hub_revision_is_read_and_offline_needs_it_cached(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    pairs = list(zip(DE, EN))
    cache_hub_dataset(cache, "someorg/corpus42", "a" * 40, pairs, config="de-en")
    spec = CorpusConfig(path="someorg/corpus42", hf_config="de-en", revision="a" * 40)
    assert hub_commit(spec) == "a" * 40
    assert read_parallel(spec, "de", "en") == (DE, EN)
    # Offline, datasets would read the commit it has whatever the revision: another one is an error.
    with pytest.raises(NMTError) as err:
        hub_commit(replace(spec, revision="b" * 40))
    assert _one_line(err) == (
        f"hub dataset 'someorg/corpus42' (config 'de-en', revision '{'b' * 40}'): the datasets cache holds commit "
        f"{'a' * 40}, not this one, and it cannot be downloaded offline: it needs the network"
    )
    with pytest.raises(NMTError) as err:
        hub_commit(replace(spec, hf_config="fr-en", revision=None))
    assert _one_line(err).startswith(
        "hub dataset 'someorg/corpus42' (config 'fr-en'): could not be downloaded; the machine seems offline, "
        "and the datasets cache does not hold it"
    )


def test_a_revision_of_a_local_dataset_directory_is_an_error(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"de": DE, "en": EN}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(tmp_path / "ds"), revision="v2"), "de", "en")
    assert _one_line(err) == (
        f"config key 'revision': 'v2', but {tmp_path / 'ds'} is a local directory, read as it is; "
        "a revision chooses a commit of a hub dataset: remove the key"
    )


def test_hf_translation_rows_that_are_null_are_empty_pairs(tmp_path):
    # A null row is no text in either language: an empty pair for cleaning to drop, as a null text.
    datasets = pytest.importorskip("datasets")
    rows = [{"de": DE[0], "en": EN[0]}, None, {"de": DE[2], "en": EN[2]}]
    datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(tmp_path / "ds"))
    assert read_parallel(CorpusConfig(path=str(tmp_path / "ds")), "de", "en") == (
        [DE[0], "", DE[2]],
        [EN[0], "", EN[2]],
    )


@pytest.mark.parametrize("source", ["save_to_disk", "jsonl streamed", "jsonl in Arrow"])
def test_a_translation_row_without_a_language_is_an_error_naming_its_row(tmp_path, monkeypatch, source):
    # Arrow stores the key a row lacks as null: that row was an empty pair, dropped in silence, where
    # streamed JSONL named the language missing (and no row).
    rows = [{"de": d, "en": e} for d, e in zip(DE, EN)] + [{"en": "Hello"}, {"de": "Tschüss", "en": "Bye"}]
    if source == "save_to_disk":
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(tmp_path / "ds"))
        spec = CorpusConfig(path=str(tmp_path / "ds"))
    else:
        data_dir = _data_files_dir(tmp_path, monkeypatch, "ds")
        lines = [json.dumps({"translation": row}) for row in rows]
        (data_dir / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        spec = CorpusConfig(path=str(data_dir), streaming=source == "jsonl streamed")
    with pytest.raises(NMTError) as err:
        list(iter_parallel(spec, "de", "en", chunk_pairs=2))  # row 3 is the second batch's first
    assert _one_line(err) == (
        f"{tmp_path / 'ds'}: split 'train', row 3: column 'translation' has no language 'de' (available: en)"
    )


def test_a_dataset_without_the_datasets_package_is_one_line(tmp_path, monkeypatch):
    directory = tmp_path / "ds"
    directory.mkdir()
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(directory), format="hf"), "de", "en")
    assert _one_line(err) == (
        f"{directory}: reading a Hugging Face dataset needs the 'datasets' package, which cannot be imported: "
        "pip install datasets"
    )


def test_a_lone_data_file_in_a_config_names_its_key_and_where_it_was_given(tmp_path, capsys):
    # As a missing corpus does: the error named the file alone, not the key (nor the line) that gave it.
    from nmt.cli import main

    config = tiny_config(tmp_path)
    data_file = tmp_path / "train.parquet"
    data_file.write_bytes(b"PAR1")  # a file is all it takes: no format reads one
    lone = f"config key 'data.train': {data_file}: a file, but neither TSV (.tsv, .tsv.gz) nor a PREFIX of plain files"
    assert main(["prepare", "--config", str(config), "--set", f"data.train={data_file}"]) == 2
    assert capsys.readouterr().err.startswith(f"nmt prepare: error: --set data.train={data_file}: {lone}")
    config.write_text(config.read_text().replace(f"train: {tmp_path / 'data' / 'train'}", f"train: {data_file}"))
    line = config.read_text().splitlines().index(f"  train: {data_file}") + 1
    assert main(["prepare", "--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith(f"nmt prepare: error: {config}: line {line}, column 3: {lone}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fmt", ["auto", "hf"])
def test_a_lone_data_file_is_named_as_a_file_not_a_missing_corpus(tmp_path, fmt):
    datasets = pytest.importorskip("datasets")
    data_file = tmp_path / "train.parquet"
    datasets.Dataset.from_dict({"de": DE, "en": EN}).to_parquet(str(data_file))
    with pytest.raises(NMTError) as err:
        read_parallel(CorpusConfig(path=str(data_file), format=fmt), "de", "en")
    assert _one_line(err) == (
        f"{data_file}: a file, but neither TSV (.tsv, .tsv.gz) nor a PREFIX of plain files; "
        "a Hugging Face data file (.parquet, .jsonl, .csv) is read from the directory holding it: name that"
    )
    assert read_parallel(CorpusConfig(path=str(tmp_path), format=fmt), "de", "en") == (DE, EN)
