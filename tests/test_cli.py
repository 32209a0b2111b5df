"""End to end through the `nmt` command: overfit a handful of pairs to BLEU 100, score with
sacreBLEU's own numbers, and turn every kind of bad input into a one-line error."""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import yaml
from conftest import PAIRS, tiny_config, write_corpus

from nmt.cli import build_parser, main
from nmt.config import config_from_dict
from nmt.errors import NMTError


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("overfit")
    config = tiny_config(tmp_path)
    assert main(["train", "--config", str(config)]) == 0
    return tmp_path


def test_tiny_transformer_overfits_to_bleu_100(trained_run, capsys):
    run = trained_run / "run"
    src = trained_run / "data" / "train.de"
    ref = trained_run / "data" / "train.en"
    for name in ("config.yaml", "spm.model", "metrics.jsonl", "train.log"):
        assert (run / name).exists(), name
    code, out, err = run_cli(["eval-bleu", "--model", run, "--src", src, "--ref", ref, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["bleu"] == pytest.approx(100.0)
    code, out, _ = run_cli(["translate", "--model", run, "--input", src, "--beam-size", "1"], capsys)
    assert code == 0
    assert out.splitlines() == [t for _, t in PAIRS]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["type"] == "train"]
    assert len(train_records) == 120 and train_records[-1]["loss"] < train_records[0]["loss"] / 5
    assert any(r["type"] == "valid" and r["dev_bleu"] == pytest.approx(100.0) for r in records)


def test_eval_bleu_scores_the_best_translation_of_a_run_whose_config_asks_for_nbest(trained_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run / "run", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["decode"]["nbest"] = 2  # translate's n-best lists; eval-bleu has no such option
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    src, ref = trained_run / "data" / "train.de", trained_run / "data" / "train.en"
    out_file = tmp_path / "hyp.en"
    code, out, err = run_cli(
        ["eval-bleu", "--model", run, "--src", src, "--ref", ref, "--json", "--output", out_file], capsys
    )
    assert code == 0, err
    assert json.loads(out)["bleu"] == pytest.approx(100.0)
    assert out_file.read_text().splitlines() == [t for _, t in PAIRS]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_run_trained_in_a_precision_this_device_lacks_decodes_in_auto_with_one_warning(
    trained_run, tmp_path, capsys, monkeypatch, precision
):
    """fp16 trained on a GPU, or bf16 on a CPU with bf16 units, then decoded on a CPU without it: the
    checkpoints hold fp32 weights, so every decoding command runs; only --precision naming it is an error."""
    import shutil

    import nmt.autotune
    import nmt.kernel_timing
    import nmt.translate

    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "cache"))  # bf16 "missing" must not meet a cached bf16
    if precision == "bf16":
        monkeypatch.setattr(nmt.translate, "bf16_available", lambda device: False)
        monkeypatch.setattr(nmt.autotune, "bf16_available", lambda device: False)
        monkeypatch.setattr(nmt.kernel_timing, "bf16_available", lambda device: False)
    run = tmp_path / "run"
    shutil.copytree(trained_run / "run", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["precision"] = precision
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    src, ref = trained_run / "data" / "train.de", trained_run / "data" / "train.en"
    commands = [
        ["translate", "--model", run, "--input", src],
        ["eval-bleu", "--model", run, "--src", src, "--ref", ref],
        ["average", "--model", run, "--last", "2"],
        ["tune-decode", "--model", run, "--beam-sizes", "1,2", "--length-penalties", "1.0"],
    ]
    for args in commands:
        code, _, err = run_cli(args, capsys)
        assert code == 0, (args[0], err)
        warnings = [line for line in err.splitlines() if "warning:" in line]
        assert len(warnings) == 1, (args[0], err)
        assert f"the run's train.precision {precision} cannot run here" in warnings[0]
        assert re.search(r"decoding in (fp32|bf16), auto's choice on this machine", warnings[0])
        assert precision not in warnings[0].split("decoding in")[1]
    code, _, err = run_cli(["translate", "--model", run, "--input", src, "--precision", precision], capsys)
    assert code == 2 and f"--precision: {precision} is" in err  # asked for by name: still an error


def test_translate_nbest_and_stdin(trained_run, capsys, monkeypatch):
    import io

    run = trained_run / "run"
    stdin = io.TextIOWrapper(io.BytesIO(b"der hund sieht die katze\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, _ = run_cli(["translate", "--model", run, "--nbest", "3"], capsys)
    assert code == 0
    lines = [line.split(" ||| ") for line in out.splitlines()]  # Moses/Marian: INDEX ||| TEXT ||| F0= LP ||| SCORE
    assert len(lines) == 3 and all(len(f) == 4 and f[0] == "0" and f[2].startswith("F0= ") for f in lines)
    assert lines[0][1] == "the dog sees the cat"
    log_probs, scores = [float(f[2][4:]) for f in lines], [float(f[3]) for f in lines]
    assert scores == sorted(scores, reverse=True) and all(lp < 0 for lp in log_probs)
    for lp, score in zip(log_probs, scores):  # length penalty 1: score = log p / length, a whole length
        assert any(abs(lp / n - score) <= 2e-5 for n in range(1, 40)), (lp, score)


def test_a_line_the_tokenizer_encodes_to_nothing_is_blank_as_a_blank_line(trained_run, tmp_path, capsys):
    """Zero-width and control characters only: SentencePiece's normalization removes them all, so
    the model would see EOS alone and invent a sentence."""
    run = trained_run / "run"
    source = tmp_path / "in.de"
    invisible = ["\u200b", "\x01\x02", "\ufeff\u200b"]
    source.write_text("\n".join(["der hund sieht die katze", *invisible, "die katze sieht den hund"]) + "\n")
    code, out, err = run_cli(["translate", "--model", run, "--input", source, "--beam-size", "1"], capsys)
    assert code == 0, err
    assert out.split("\n") == ["the dog sees the cat", "", "", "", "the cat sees the dog", ""]
    code, out, err = run_cli(["translate", "--model", run, "--input", source, "--nbest", "2"], capsys)
    assert code == 0, err
    blank = [line for line in out.splitlines() if line.split(" ||| ")[0] in ("1", "2", "3")]
    assert blank == [f"{i} |||  ||| F0= 0.00000 ||| 0.00000" for i in (1, 2, 3)]


def test_translate_nbest_1_writes_plain_text(trained_run, capsys):
    """One hypothesis per line is plain text, as fairseq's --nbest 1: n-best lines only for two or more."""
    run, src = trained_run / "run", trained_run / "data" / "train.de"
    code, out, err = run_cli(["translate", "--model", run, "--input", src, "--nbest", "1", "--beam-size", "1"], capsys)
    assert code == 0, err
    assert out.splitlines() == [t for _, t in PAIRS]


def test_a_run_whose_config_asks_for_nbest_writes_nbest_lines_unless_given_nbest_1(
    trained_run, tmp_path, capsys, monkeypatch
):
    import io
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run / "run", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["decode"]["nbest"] = 2  # beam 3
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    src = trained_run / "data" / "train.de"
    code, out, err = run_cli(["translate", "--model", run, "--input", src], capsys)
    assert code == 0, err
    lines = [line.split(" ||| ") for line in out.splitlines()]
    assert [f[0] for f in lines] == [str(i // 2) for i in range(2 * len(PAIRS))]
    for args in (["--input", src, "--nbest", "1"], ["--stream", "--nbest", "1", "--beam-size", "1"]):
        stdin = io.TextIOWrapper(io.BytesIO(src.read_bytes()), encoding="utf-8")
        monkeypatch.setattr(sys, "stdin", stdin)
        code, out, err = run_cli(["translate", "--model", run, *args], capsys)
        assert code == 0, err
        assert out.splitlines() == [t for _, t in PAIRS], args
    code, out, err = run_cli(["translate", "--model", run, "--input", src, "--beam-size", "1"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert (
        f"decode.nbest 2 in {run / 'config.yaml'} is more than the beam size 1: "
        "give --nbest 1 (one translation per line), or --beam-size 2 or more"
    ) in err
    code, _, err = run_cli(["translate", "--model", run, "--input", src, "--nbest", "4"], capsys)
    assert code == 2 and f"--nbest 4 is more than the beam size 3 (decode.beam_size in {run / 'config.yaml'})" in err


@pytest.mark.parametrize("option, value", [("--attention-layer", "0"), ("--attention-head", "1")])
def test_attention_choice_without_attention_is_an_error(trained_run, capsys, option, value):
    argv = ["translate", "--model", trained_run / "run", "--input", trained_run / "data" / "train.de", option, value]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"{option} {value}: needs --attention DIR" in err


@pytest.mark.parametrize("which", ["--input", "--output"])
def test_the_attention_directory_may_hold_neither_input_nor_output(trained_run, tmp_path, capsys, which):
    maps = tmp_path / "maps"
    maps.mkdir()
    named = maps / "00000.json"  # the name line 0's map gets
    named.write_text("".join(s + "\n" for s, _ in PAIRS))
    other = ["--output", tmp_path / "out.en"] if which == "--input" else ["--input", trained_run / "data" / "train.de"]
    argv = ["translate", "--model", trained_run / "run", which, named, *other, "--attention", maps]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and f"{which} {named}: lies in the --attention directory" in err, err
    assert named.read_text() == "".join(s + "\n" for s, _ in PAIRS) and sorted(maps.iterdir()) == [named]


def test_train_again_resumes_and_stops(trained_run, capsys):
    run = trained_run / "run"
    metrics = (run / "metrics.jsonl").read_text()
    checkpoints = {p.name: p.read_bytes() for p in (run / "checkpoints").glob("*.pt")}
    code, _, err = run_cli(["train", "--config", trained_run / "tiny.yaml"], capsys)
    assert code == 0
    assert "resuming at update 120" in err and "stopping: reached train.max_updates 120" in err
    assert (run / "metrics.jsonl").read_text() == metrics  # no update ran, no validation either
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").glob("*.pt")} == checkpoints


def test_eval_bleu_equals_sacrebleu(tmp_path, capsys):
    hyps = ["the cat sat on the mat", "a dog runs in the park today", "hello world"]
    refs1 = ["the cat sat on a mat", "a dog is running in the park", "hello there world"]
    refs2 = ["there is a cat on the mat", "the dog runs in a park today", "hello world"]
    for name, lines in (("hyp", hyps), ("r1", refs1), ("r2", refs2)):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    code, out, _ = run_cli(
        ["eval-bleu", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "r1", "--ref", tmp_path / "r2", "--json"], capsys
    )
    assert code == 0
    got = json.loads(out)
    assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs1, refs2]).score)
    assert got["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs1, refs2]).score)
    assert got["bleu_signature"].startswith("nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp")
    code, out, _ = run_cli(["eval-bleu", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "r1"], capsys)
    assert code == 0 and "BLEU" in out and "chrF" in out and "nrefs:1" in out


def test_a_path_option_written_with_equals_expands_a_leading_tilde(trained_run, tmp_path, capsys, monkeypatch):
    # the shell expands '~' only where it starts a word: '--model=~/runs/x' reached nmt as written,
    # and was "no such run"
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "src.txt").write_text(PAIRS[0][0] + "\n")
    (tmp_path / "ref.txt").write_text(PAIRS[0][1] + "\n")
    home_run = tmp_path / "runs" / "x"
    home_run.parent.mkdir()
    home_run.symlink_to(trained_run / "run")
    code, out, err = run_cli(
        ["translate", "--model=~/runs/x", "--input=~/src.txt", "--output=~/out.txt", "--beam-size=1"], capsys
    )
    assert code == 0, err
    assert (tmp_path / "out.txt").read_text() == PAIRS[0][1] + "\n"
    code, out, err = run_cli(["eval-bleu", "--hyp=~/out.txt", "--ref=~/ref.txt", "--ref=~/ref.txt", "--json"], capsys)
    assert code == 0 and json.loads(out)["bleu"] == pytest.approx(100.0), err
    code, out, err = run_cli(["train", "--config=~/nowhere.yaml"], capsys)
    assert code == 2 and f"{tmp_path / 'nowhere.yaml'}: no such config file" in err, err


def test_eval_bleu_line_counts_that_differ_name_both_files_and_counts(trained_run, tmp_path, capsys):
    run, src, ref = trained_run / "run", trained_run / "data" / "train.de", trained_run / "data" / "train.en"
    short = tmp_path / "short.en"
    short.write_text("the dog\nthe cat\n")
    hyp = tmp_path / "hyp.en"
    hyp.write_text(ref.read_text())
    code, out, err = run_cli(["eval-bleu", "--hyp", hyp, "--ref", ref, "--ref", short], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{hyp} has 8 lines but {short} has 2" in err
    code, out, err = run_cli(["eval-bleu", "--hyp", short, "--ref", ref], capsys)
    assert code == 2 and f"{short} has 2 lines but {ref} has 8" in err
    # With --model every reference is checked against the source before anything is translated.
    output = tmp_path / "out.en"
    argv = ["eval-bleu", "--model", run, "--src", src, "--ref", ref, "--ref", short, "--output", output]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and f"{src} has 8 lines but {short} has 2" in err
    assert not output.exists()


def test_eval_bleu_model_translates_a_source_from_stdin_or_a_pipe(trained_run, capsys, monkeypatch):
    """Standard input or a pipe (`--src <(...)`) can be read only once: counting its lines first
    crashed on stdin and left the pipe empty for the translation."""
    import io
    import os

    run, src, ref = trained_run / "run", trained_run / "data" / "train.de", trained_run / "data" / "train.en"
    stdin = io.TextIOWrapper(io.BytesIO(src.read_bytes()), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, err = run_cli(["eval-bleu", "--model", run, "--src", "-", "--ref", ref, "--beam-size", "1"], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert "BLEU 100.00" in out and f"({len(PAIRS)} sentences)" in out
    for text, expected in ((src.read_bytes(), "BLEU 100.00"), (b"der hund sieht die katze\n", "has 1 lines but")):
        read_end, write_end = os.pipe()
        os.write(write_end, text)  # a few hundred bytes: the pipe holds them
        os.close(write_end)
        try:
            argv = ["eval-bleu", "--model", run, "--src", f"/dev/fd/{read_end}", "--ref", ref, "--beam-size", "1"]
            code, out, err = run_cli(argv, capsys)
        finally:
            os.close(read_end)
        assert expected in out + err, err
    assert code == 2 and f"translation of /dev/fd/{read_end} has 1 lines but {ref} has {len(PAIRS)}" in err


def test_validation_scores_its_translations_against_the_references_as_eval_bleu_does():
    """Validation's dev BLEU is sacreBLEU's corpus BLEU of the translations against the references,
    cased and 13a-tokenized, the number eval-bleu gives: on these lines the direction matters (the short
    hypotheses pay the brevity penalty), and so do case and the tokenizer."""
    from types import SimpleNamespace

    from nmt.average import dev_bleu
    from nmt.config import DecodeConfig, TrainConfig
    from nmt.scoring import corpus_scores

    hyps = ["The cat sat on the mat.", "a dog runs in the park", "Hello world!"]
    refs = ["the cat sat on the mat today.", "a dog is running in the big park", "hello world!"]

    class Fixed:  # a translator whose translations are ``hyps``
        def translate(self, lines, decode, progress=None):
            return [[hyps[i]] for i in range(len(lines))]

    want = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert want != pytest.approx(sacrebleu.corpus_bleu(refs, [hyps]).score)
    assert want != pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score)
    assert want != pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score)
    cfg = SimpleNamespace(train=TrainConfig(), decode=DecodeConfig())
    assert dev_bleu(Fixed(), cfg, ["ein satz"] * 3, refs) == (pytest.approx(want), hyps)
    assert corpus_scores(hyps, [refs]).bleu == pytest.approx(want)


def test_eval_bleu_refuses_hyp_with_options_for_translating(trained_run, tmp_path, capsys):
    run, src, ref = trained_run / "run", trained_run / "data" / "train.de", trained_run / "data" / "train.en"
    hyp = tmp_path / "hyp.en"
    hyp.write_text("a wrong translation\n" * len(PAIRS))
    for extra, named in (
        (["--model", run, "--src", src], "--model, --src"),  # was: --hyp ignored, a fresh translation scored
        (["--output", tmp_path / "out.en"], "--output"),
        (["--src", src], "--src"),
        (["--beam-size", "2"], "--beam-size"),
        (["--checkpoint", "best"], "--checkpoint"),
        (["--device", "cpu"], "--device"),
    ):
        code, out, err = run_cli(["eval-bleu", "--hyp", hyp, "--ref", ref, *extra], capsys)
        assert code == 2 and out == "" and err.count("\n") == 1, (extra, err)
        assert f"conflicting options: --hyp with {named}:" in err
    assert not (tmp_path / "out.en").exists()


def _bad_inputs(tmp_path: Path):
    """(name, argv, expected substring of the one-line error)."""
    good = tiny_config(tmp_path)
    data = tmp_path / "data"
    cases = []

    def config_with(name: str, text: str) -> Path:
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        return p

    base = yaml.safe_load(good.read_text())

    def variant(name, mutate):
        cfg = yaml.safe_load(yaml.safe_dump(base))
        cfg["run_dir"] = str(tmp_path / f"run_{name}")
        mutate(cfg)
        return config_with(name, yaml.safe_dump(cfg))

    cases.append(("missing config", ["train", "--config", tmp_path / "nope.yaml"], "nope.yaml: no such config file"))
    cases.append(("yaml syntax", ["train", "--config", config_with("syntax", "train: [1, 2\n")], "YAML does not parse"))
    cases.append(
        (
            "unknown key",
            ["train", "--config", variant("unk", lambda c: c["train"].update(max_update=3))],
            "did you mean 'train.max_updates'",
        )
    )
    cases.append(
        (
            "wrong type",
            ["train", "--config", variant("type", lambda c: c["model"].update(d_model="big"))],
            "model.d_model': expected an integer",
        )
    )
    cases.append(
        (
            "out of range",
            ["train", "--config", variant("range", lambda c: c["train"].update(label_smoothing=2))],
            "train.label_smoothing",
        )
    )

    (data / "short.de").write_text("a\nb\nc\n")
    (data / "short.en").write_text("a\nb\n")
    cases.append(
        (
            "line counts differ",
            ["train", "--config", variant("counts", lambda c: c["data"].update(train=str(data / "short")))],
            "3",
        )
    )
    (data / "bad.de").write_bytes(b"gut\nschl\xffcht\n")
    (data / "bad.en").write_text("good\nbad\n")
    cases.append(
        (
            "invalid utf-8",
            ["train", "--config", variant("utf8", lambda c: c["data"].update(train=str(data / "bad")))],
            "bad.de:2",
        )
    )
    (data / "empty.de").write_text("\n  \n")
    (data / "empty.en").write_text("x\n\n")
    cases.append(
        (
            "empty after cleaning",
            ["train", "--config", variant("empty", lambda c: c["data"].update(train=str(data / "empty")))],
            "empty after cleaning",
        )
    )
    cases.append(
        (
            "missing corpus",
            ["train", "--config", variant("nocorpus", lambda c: c["data"].update(train=str(data / "nothere")))],
            "nothere",
        )
    )
    cases.append(
        ("translate non-run", ["translate", "--model", data, "--input", data / "train.de"], "not a run directory")
    )
    cases.append(
        (
            "translate missing run",
            ["translate", "--model", tmp_path / "norun", "--input", data / "train.de"],
            "no such run directory",
        )
    )
    cases.append(
        ("eval-bleu missing hyp", ["eval-bleu", "--hyp", tmp_path / "none.txt", "--ref", data / "train.en"], "none.txt")
    )
    (tmp_path / "two.txt").write_text("a\nb\n")
    cases.append(
        (
            "eval-bleu length mismatch",
            ["eval-bleu", "--hyp", tmp_path / "two.txt", "--ref", data / "train.en"],
            f"{tmp_path / 'two.txt'} has 2 lines but {data / 'train.en'} has 8",
        )
    )
    return cases


def test_bad_inputs_give_one_line_errors(tmp_path, capsys):
    for name, argv, expected in _bad_inputs(tmp_path):
        code, out, err = run_cli(argv, capsys)
        lines = [line for line in err.splitlines() if "error" in line]
        assert code != 0, name
        assert "Traceback" not in err, name
        assert len(lines) == 1 and expected in lines[0], f"{name}: {err!r}"


def test_bad_input_exit_code_in_a_real_process(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "nmt.cli", "translate", "--model", str(tmp_path), "--input", "x"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "not a run directory" in result.stderr


def test_tiny_rnn_overfits_to_bleu_100(tmp_path, capsys):
    config = tiny_config(tmp_path, model_type="rnn", max_updates=150, validate_every=150, lr_peak=0.01)
    assert main(["train", "--config", str(config)]) == 0
    src, ref = tmp_path / "data" / "train.de", tmp_path / "data" / "train.en"
    code, out, err = run_cli(["eval-bleu", "--model", tmp_path / "run", "--src", src, "--ref", ref, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["bleu"] == pytest.approx(100.0)


def test_rnn_with_compile_is_a_one_line_error_before_any_work(tmp_path, capsys):
    """torch.compile fails on the RNN's 2-layer decoder with dropout (a traceback from inductor at the
    first update) and takes minutes per batch shape elsewhere: refused, naming the key."""
    config = tiny_config(tmp_path, model_type="rnn", compile=True)
    code, _, err = run_cli(["train", "--config", config], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.strip().count("\n") == 0 and "config key 'train.compile': not for model.type 'rnn'" in err
    line = config.read_text().splitlines().index("  compile: true") + 1  # where the value came from: file and line
    assert err.startswith(f"nmt train: error: {config}: line {line}, column 3: config key"), err
    assert not (tmp_path / "run" / "checkpoints").exists()
    # given on the command line, the --set is named, as the device and precision refusals name theirs
    config = tiny_config(tmp_path, model_type="rnn")
    code, _, err = run_cli(["train", "--config", config, "--set", "train.compile=true"], capsys)
    assert code == 2 and err.startswith("nmt train: error: --set train.compile=true: config key 'train.compile'"), err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_compare_two_finished_runs(trained_run, tmp_path, capsys):
    rnn_dir = tmp_path / "rnn"
    config = tiny_config(rnn_dir, model_type="rnn", max_updates=20, validate_every=10)
    assert main(["train", "--config", str(config)]) == 0
    capsys.readouterr()
    out = tmp_path / "report"
    code, stdout, err = run_cli(["compare", trained_run / "run", rnn_dir / "run", "--out", out], capsys)
    assert code == 0, err
    table = (out / "compare.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 3  # header + two runs
    assert "| transformer |" in rows[1] and "| rnn |" in rows[2]
    cells = [c.strip() for c in rows[1].split("|")]
    assert cells[7] == "100.00" and cells[9] == "100.00"  # the overfit transformer: best dev and test BLEU
    assert float(cells[11]) > 0 and float(cells[12]) > 0  # greedy and beam-5 sentences/s
    # Test is scored with each run's own decoding settings (the tiny config's beam 3), not beam 5:
    # the barely trained LSTM's score is the one eval-bleu gives with its config.
    rnn_cells = [c.strip() for c in rows[2].split("|")]
    assert cells[8] == rnn_cells[8] == "beam 3, lp 1"
    src, ref = tmp_path / "rnn" / "data" / "train.de", tmp_path / "rnn" / "data" / "train.en"
    code, out_json, err = run_cli(
        ["eval-bleu", "--model", rnn_dir / "run", "--src", src, "--ref", ref, "--json"], capsys
    )
    assert code == 0, err
    assert rnn_cells[9] == f"{json.loads(out_json)['bleu']:.2f}"
    assert (out / "compare.png").stat().st_size > 1000
    assert rows[1] in stdout and rows[2] in stdout


def test_compare_scores_test_as_eval_bleu_does_blank_lines_included(trained_run, tmp_path, capsys):
    """A test set with a blank source line and another blank reference: compare scores every line,
    as eval-bleu --model does and sacreBLEU would, instead of dropping those pairs (BLEU 100)."""
    import shutil

    pairs = list(PAIRS)
    pairs[1] = ("", pairs[1][1])
    pairs[3] = (pairs[3][0], "")
    test = write_corpus(tmp_path / "data", "test", pairs)
    run = tmp_path / "run"
    shutil.copytree(trained_run / "run", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["test"] = str(test)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "report"
    code, _, err = run_cli(["compare", run, "--out", out], capsys)
    assert code == 0, err
    compared = json.loads((out / "compare.json").read_text())[0]["test"]
    args = ["eval-bleu", "--model", run, "--src", f"{test}.de", "--ref", f"{test}.en", "--output", tmp_path / "hyp"]
    code, out_json, err = run_cli([*args, "--json"], capsys)
    assert code == 0, err
    evaluated = json.loads(out_json)
    assert compared == evaluated and compared["n_sentences"] == len(PAIRS)
    hyps = (tmp_path / "hyp").read_text().splitlines()
    assert evaluated["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [[t for _, t in pairs]]).score)
    assert evaluated["bleu"] < 100


def test_compare_with_an_empty_test_set_names_its_key_in_the_runs_config(trained_run, tmp_path, capsys):
    # the error named no file: "the hypothesis input: empty input, nothing to score"
    import shutil

    test = write_corpus(tmp_path / "data", "test", [])
    run = tmp_path / "run"
    shutil.copytree(trained_run / "run", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["test"] = {"path": str(test)}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    code, stdout, err = run_cli(["compare", run, "--out", tmp_path / "report"], capsys)
    assert code == 2 and stdout == ""
    assert re.fullmatch(
        rf"nmt compare: error: {re.escape(str(run / 'config.yaml'))}: line \d+, column \d+: config key "
        rf"'data.test.path': the corpus '{re.escape(str(test))}' holds no line: nothing to score\n",
        err.splitlines(keepends=True)[-1],
    )


def test_compare_without_matplotlib_fails_before_decoding(trained_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import then raises ImportError
    out = tmp_path / "report"
    code, stdout, err = run_cli(["compare", trained_run / "run", "--out", out], capsys)
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and "pip install 'nmt[report]'" in err  # no test set decoded first
    assert not out.exists()


def _japanese_scored_copy(trained_run: Path, copy: Path, monkeypatch) -> Path:
    """A copy of the trained run that scores BLEU with ja-mecab, whose extra (MeCab) is missing here,
    and no model loading: a command that decodes before it checks the scorer fails the test."""
    import shutil

    import nmt.translate

    shutil.copytree(trained_run / "run", copy)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["decode"]["bleu_tokenize"] = "ja-mecab"
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setitem(sys.modules, "MeCab", None)  # sacreBLEU's ja extra, missing

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded to decode")

    monkeypatch.setattr(nmt.translate, "load_translator", no_loading)
    return copy


def test_compare_says_a_runs_bleu_tokenizer_that_cannot_run_before_decoding(trained_run, tmp_path, capsys, monkeypatch):
    """The second run scoring with ja-mecab, whose extra is missing: refused, naming its config, before the
    first run's test set is decoded (it was said after, without naming the run)."""
    japanese = _japanese_scored_copy(trained_run, tmp_path / "japanese", monkeypatch)
    out = tmp_path / "report"
    code, stdout, err = run_cli(["compare", trained_run / "run", japanese, "--out", out], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert (
        f"{japanese / 'config.yaml'}: decode.bleu_tokenize ja-mecab: needs an extra: pip install 'sacrebleu[ja]'" in err
    )
    assert not out.exists()


def test_compare_help_says_each_run_decodes_test_with_its_own_settings(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "test BLEU/chrF (each run decoded with its config's decode section" in text
    assert "test BLEU/chrF (beam 5)" not in text


@pytest.mark.parametrize("command", ["translate", "export"])
def test_translate_and_export_help_name_the_averaged_model_they_load_where_dev_prefers_it(command, capsys):
    """Both load checkpoint_choice.model_checkpoint's choice: the average where its dev BLEU beats the best."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "averaged model where its dev BLEU beats the best checkpoint's, else the best checkpoint" in text
    assert "a run's best checkpoint" not in text


def test_relative_paths_in_a_config_follow_it_from_any_directory(tmp_path):
    """The CLI run from elsewhere: data and run_dir are found beside the config file, not the working directory."""
    config = tiny_config(tmp_path / "project", max_updates=3, validate_every=3, warmup_updates=1)
    values = yaml.safe_load(config.read_text())
    values["run_dir"] = "runs/tiny"
    for split in ("train", "dev", "test"):
        values["data"][split] = "data/train"
    config.write_text(yaml.safe_dump(values))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "nmt", "train", "--config", str(config)], cwd=elsewhere, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "project" / "runs" / "tiny" / "checkpoints").is_dir()
    assert not any(elsewhere.iterdir())
    saved = yaml.safe_load((tmp_path / "project" / "runs" / "tiny" / "config.yaml").read_text())
    assert saved["run_dir"] == "." and saved["data"]["train"]["path"] == str(tmp_path / "project" / "data" / "train")


def _typed_options(parser: argparse.ArgumentParser):
    """Every option of every subcommand that converts its value (``type=``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _typed_options(sub)
        elif action.option_strings and action.type is not None:
            yield action


def _reads_floats(action) -> bool:
    try:
        value = action.type("0.5")
    except (argparse.ArgumentTypeError, ValueError):
        return False
    return isinstance(value, float) or (isinstance(value, list) and isinstance(value[0], float))


def test_every_float_option_refuses_nan_and_inf():
    floats = [action for action in _typed_options(build_parser()) if _reads_floats(action)]
    assert {"--length-penalty", "--max-len-a", "--length-penalties"} <= {a.option_strings[0] for a in floats}
    for action in floats:
        for bad in ("nan", "inf", "-inf", "1e999"):
            with pytest.raises(argparse.ArgumentTypeError, match="finite"):
                action.type(bad)


def test_nan_length_penalty_is_a_one_line_error(tmp_path, capsys):
    argv = ["translate", "--model", tmp_path, "--length-penalty", "nan", "--beam-size", "4", "--nbest", "2"]
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if "error" in line] == [
        "nmt translate: error: argument --length-penalty: expected a finite number, got 'nan'"
    ]


def test_a_beam_wider_than_the_vocabulary_is_a_one_line_error(trained_run, tmp_path, capsys):
    run, src, out = trained_run / "run", trained_run / "data" / "train.de", tmp_path / "out.en"
    for beam in ("61", "99999999999"):  # the tiny run's target vocabulary has 60 words
        code, _, err = run_cli(["translate", "--model", run, "--input", src, "-o", out, "--beam-size", beam], capsys)
        assert code == 2 and "Traceback" not in err and not out.exists()
        assert err.splitlines() == [
            f"nmt translate: error: --beam-size {beam} is more than the 60 words of the target vocabulary: "
            "give at most 60"
        ]
    values = yaml.safe_load((run / "config.yaml").read_text())
    for key in ("decode.beam_size", "train.validate_beam_size"):
        section, name = key.split(".")
        wide = {**values, section: {**values[section], name: 61}}
        with pytest.raises(NMTError, match=f"config key '{key}': 61 is more than the 60 words"):
            config_from_dict(wide)


def _allocation_failure():
    import torch

    torch.empty(9_999_999_999_900)  # 40 TB: torch's CPU allocator refuses it


@pytest.mark.parametrize(
    "command,error,expected",
    [
        ("translate", None, "out of memory (tried to allocate 39999999999600 bytes): try a smaller --batch-tokens"),
        ("eval-bleu", MemoryError(), "out of memory: try a smaller --batch-tokens or --beam-size"),
        ("train", "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has", "(tried to allocate 2.00 GiB): try a"),
        # oneDNN's on a CPU with no memory left for a kernel (a d_model 512 model under ulimit -v 2000000)
        ("train", RuntimeError("could not create a primitive"), "out of memory: try a smaller train.max_tokens"),
    ],
)
def test_out_of_memory_is_a_one_line_error_naming_what_to_lower(
    monkeypatch, tmp_path, capsys, command, error, expected
):
    import torch

    from nmt import commands

    def fail(args):
        if error is None:
            _allocation_failure()
        # torch.cuda's name: torch.OutOfMemoryError, the same class, is torch >= 2.5's
        raise torch.cuda.OutOfMemoryError(error) if isinstance(error, str) else error

    name = {"translate": "cmd_translate", "eval-bleu": "cmd_eval_bleu", "train": "cmd_train"}[command]
    monkeypatch.setattr(commands, name, fail)
    argv = {
        "translate": ["translate", "--model", tmp_path],
        "eval-bleu": ["eval-bleu", "--hyp", tmp_path, "--ref", tmp_path],
        "train": ["train", "--config", tmp_path],
    }[command]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"nmt {command}: error: ")
    assert expected in err
    if command == "train":
        assert "train.max_tokens" in err


@pytest.mark.parametrize("command", [["train", "--config"], ["translate", "--model"]])
def test_a_torch_older_than_the_floor_is_refused_in_one_line(monkeypatch, tmp_path, capsys, command):
    """torch 2.2 has no torch.amp.GradScaler: `nmt train` stopped in an AttributeError traceback."""
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "2.2.2+cu121" if name == "torch" else real_version(name)
    )
    code, _, err = run_cli([*command, tmp_path / "missing"], capsys)
    assert code == 2
    assert err == (
        f"nmt {command[0]}: error: torch 2.2.2+cu121 is older than 2.4.1, the oldest nmt runs on: "
        "pip install 'torch>=2.4.1'\n"
    )


def test_the_dependency_floors_are_pyprojects_and_later_releases_pass():
    from nmt import versions

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    for package, oldest in versions.OLDEST.items():
        assert f'"{package}>={oldest}",' in pyproject
    assert versions.release("2.13.0+cpu") == (2, 13, 0) and versions.release("2.4.0a0+git1a2b") == (2, 4, 0)
    for later in ("2.4.1", "2.4.1+cu121", "2.5.0", "2.13.0+cpu", "3.0"):
        assert versions.release(later) >= versions.release(versions.OLDEST["torch"])
    for older in ("2.2.2", "2.3.1", "2.4.0", "1.13.1"):
        assert versions.release(older) < versions.release(versions.OLDEST["torch"])
    versions.check_dependencies()  # the packages running this test


def test_every_package_nmt_imports_is_declared_in_pyproject():
    """A package imported by nmt's own code must be a dependency of its own (or an extra's), not one
    that only arrives with another (numpy came with torch's users, sacrebleu and datasets)."""
    import ast
    import importlib.metadata

    root = Path(__file__).parents[1]
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    declared = {re.sub(r"[-_.]+", "-", name).lower() for name in re.findall(r'"([A-Za-z0-9_.-]+)[\[<>=!~]', pyproject)}
    imported = set()
    for path in (root / "nmt").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = sorted(imported - set(sys.stdlib_module_names) - {"nmt", "__future__"})
    distributions = importlib.metadata.packages_distributions()
    for module in third_party:
        names = distributions.get(module, [module])
        assert any(re.sub(r"[-_.]+", "-", name).lower() in declared for name in names), module


def test_a_sentencepiece_older_than_its_floor_is_refused_in_one_line(monkeypatch, capsys):
    """sentencepiece 0.2.0-0.2.2 turn a tab into ' ⁇ ' under nfkc or identity normalization, in silence."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.2.2" if name == "sentencepiece" else real(name))
    code, out, err = run_cli(["eval-bleu", "--hyp", "x", "--ref", "x"], capsys)
    assert code == 2 and err == (
        "nmt eval-bleu: error: sentencepiece 0.2.2 is older than 0.2.3, the oldest nmt runs on: "
        "pip install 'sentencepiece>=0.2.3'\n"
    )


@pytest.mark.parametrize(
    "message", ["shape mismatch", "could not create a primitive descriptor for a matmul primitive"]
)
def test_other_runtime_errors_are_not_called_out_of_memory(monkeypatch, tmp_path, message):
    from nmt import commands

    def fail(args):
        raise RuntimeError(message)

    monkeypatch.setattr(commands, "cmd_translate", fail)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        main(["translate", "--model", str(tmp_path)])


def test_a_model_whose_weights_cannot_fit_is_refused_before_its_checkpoint_is_read(trained_run, monkeypatch, capsys):
    import nmt.checkpoint_file
    import nmt.model_memory
    from nmt import checkpoint_choice
    from nmt.models import build_model
    from nmt.rundir import RunDir

    run = trained_run / "run"
    cfg = RunDir(run).config()
    path = checkpoint_choice.model_checkpoint(RunDir(run), cfg, "auto")
    weights = sum(p.numel() * 4 for p in build_model(cfg.model, 60, 60, 0).parameters())  # a tied one once
    src = trained_run / "data" / "train.de"
    monkeypatch.setattr(nmt.model_memory, "memory_bytes", lambda: weights)  # just enough: translates
    code, out, _ = run_cli(["translate", "--model", run, "--input", src, "--beam-size", "1"], capsys)
    assert code == 0 and out.splitlines() == [t for _, t in PAIRS]

    def load(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(nmt.model_memory, "memory_bytes", lambda: weights - 1)
    monkeypatch.setattr(nmt.checkpoint_file, "load", load)
    code, _, err = run_cli(["translate", "--model", run, "--input", src], capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert err == (
        f"nmt translate: error: {path}: the model is too large to load here (model.d_model 64, model.ff_size 128, "
        "model.encoder_layers 1, model.decoder_layers 1, model.max_positions 1024, tokenizer.vocab_size 60): its "
        "weights alone take "
        f"{weights / 1e9:.2g} GB, more than the {(weights - 1) / 1e9:.2g} GB of memory this process may use\n"
    )


def test_compare_says_when_runs_translate_different_test_sets(trained_run, tmp_path, capsys):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(trained_run / "run", other)
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["data"]["test"]["path"] = str(write_corpus(tmp_path / "data", "test", PAIRS[:3]))
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "report"
    code, _, err = run_cli(["compare", trained_run / "run", other, "--out", out], capsys)
    assert code == 0, err
    assert "different directions or test sets" in err
    table = (out / "compare.md").read_text()
    assert "**Not comparable:**" in table and str(tmp_path / "data" / "test") in table
    summaries = json.loads((out / "compare.json").read_text())
    assert [s["direction"] for s in summaries] == ["de->en", "de->en"]


def test_compare_refuses_a_run_named_twice_however_spelled(tmp_path, capsys, monkeypatch):
    """Before any run is read or decoded: the same directory twice made two identical rows."""
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.yaml").write_text("not read\n")
    for second in ("runs/a", "runs/a/", "./runs/a", "runs/b/../a"):
        code, stdout, err = run_cli(["compare", "runs/a", "runs/b", second, "--out", "report"], capsys)
        assert code == 2 and stdout == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f"nmt compare: error: {Path(second)}: ") and "twice" in err
    assert not (tmp_path / "report").exists()


def test_compare_warns_about_a_run_being_written(trained_run, tmp_path, capsys):
    from nmt.rundir import RunDir

    writer = RunDir(trained_run / "run")
    writer.lock(lambda message: None)  # as 'nmt train' holds it while it trains
    try:
        code, _, err = run_cli(["compare", trained_run / "run", "--out", tmp_path / "report"], capsys)
    finally:
        writer.close()
    assert code == 0, err
    assert "is being written ('nmt train', host " in err and "at the checkpoint it has now, not as finished" in err
    code, _, err = run_cli(["compare", trained_run / "run", "--out", tmp_path / "again"], capsys)
    assert code == 0 and "being written" not in err


def test_an_empty_checkpoint_name_is_a_one_line_error_not_auto(trained_run, tmp_path, capsys):
    run, data, out = trained_run / "run", trained_run / "data", tmp_path / "out"
    src, ref = data / "train.de", data / "train.en"
    commands = {
        "translate": ["translate", "--model", run, "--input", src, "-o", out],
        "eval-bleu": ["eval-bleu", "--model", run, "--src", src, "--ref", ref, "-o", out],
        "tune-decode": ["tune-decode", "--model", run, "--beam-sizes", "1", "--length-penalties", "1"],
    }
    config = (run / "config.yaml").read_bytes()
    for command, args in commands.items():
        code, _, err = run_cli([*args, "--checkpoint", ""], capsys)
        assert code == 2 and not out.exists()
        assert err.splitlines() == [
            f"nmt {command}: error: --checkpoint '': no such checkpoint in {run / 'checkpoints'} "
            "(give auto, best, average, last or a file name there)"
        ]
    assert (run / "config.yaml").read_bytes() == config and not (run / "tune_decode.json").exists()


def test_eval_bleu_tokenize_and_lowercase_score_as_sacrebleu_does(tmp_path, capsys):
    """Chinese has no spaces: 13a scores a near-perfect hypothesis 0, sacreBLEU's zh tokenizer does not."""
    hyps = ["这是 一个 测试", "你好世界", "The Cat"]
    refs = ["这是一个测试", "你好 世界", "the cat"]
    (tmp_path / "hyp").write_text("\n".join(hyps) + "\n")
    (tmp_path / "ref").write_text("\n".join(refs) + "\n")
    base = ["eval-bleu", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "ref", "--json"]
    for options, tokenize, lowercase in (
        ([], "13a", False),
        (["--tokenize", "zh"], "zh", False),
        (["--lowercase"], "13a", True),
    ):
        code, out, err = run_cli(base + options, capsys)
        assert code == 0, err
        got = json.loads(out)
        assert got["bleu"] == pytest.approx(
            sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize, lowercase=lowercase).score
        )
        assert got["chrf"] == pytest.approx(
            sacrebleu.metrics.CHRF(lowercase=lowercase).corpus_score(hyps, [refs]).score
        )
        assert f"tok:{tokenize}|" in got["bleu_signature"]
        assert ("case:lc" if lowercase else "case:mixed") in got["bleu_signature"]
    assert (
        json.loads(run_cli(base, capsys)[1])["bleu"]
        < json.loads(run_cli(base + ["--tokenize", "zh"], capsys)[1])["bleu"]
    )
    code, out, err = run_cli(base + ["--tokenize", "kanji"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--tokenize 'kanji' is not one of" in err


def test_a_bleu_tokenizer_that_cannot_run_is_one_line_naming_the_option_or_key(
    trained_run, tmp_path, capsys, monkeypatch
):
    """ja-mecab without sacreBLEU's extra, or flores200 offline (it downloads its model), is said before
    anything is translated or trained: at the first validation a run would have trained for nothing."""
    from urllib.error import URLError

    import nmt.scoring

    real = nmt.scoring.BLEU

    def bleu(tokenize="13a", lowercase=False):
        if tokenize == "ja-mecab":  # sacreBLEU's own words without its extra
            raise RuntimeError("\nJapanese tokenization requires extra dependencies\n\n    pip install sacrebleu[ja]\n")
        if tokenize == "flores200":
            raise URLError("Name or service not known")
        return real(tokenize=tokenize, lowercase=lowercase)

    monkeypatch.setattr(nmt.scoring, "BLEU", bleu)
    (tmp_path / "hyp").write_text("a b\n")
    code, out, err = run_cli(
        ["eval-bleu", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "hyp", "--tokenize", "ja-mecab"], capsys
    )
    assert (
        code == 2 and err.count("\n") == 1 and "--tokenize ja-mecab: needs an extra: pip install 'sacrebleu[ja]'" in err
    )
    src, ref = trained_run / "data" / "train.de", trained_run / "data" / "train.en"
    output = tmp_path / "out.en"
    argv = ["eval-bleu", "--model", trained_run / "run", "--src", src, "--ref", ref, "--output", output]
    code, out, err = run_cli(argv + ["--tokenize", "flores200"], capsys)
    assert code == 2 and "--tokenize flores200: cannot download its SentencePiece model" in err and "offline?" in err
    assert not output.exists()  # nothing was translated
    config = tiny_config(tmp_path / "new")
    code, out, err = run_cli(["train", "--config", config, "--set", "decode.bleu_tokenize=ja-mecab"], capsys)
    assert code == 2 and "decode.bleu_tokenize ja-mecab: needs an extra" in err
    assert not list((tmp_path / "new").rglob("*.pt"))


def test_tune_decode_average_and_eval_bleu_say_a_run_bleu_tokenizer_that_cannot_run_before_decoding(
    trained_run, tmp_path, capsys, monkeypatch
):
    """A run whose decode.bleu_tokenize needs an extra not installed here (a run trained elsewhere) is
    refused by tune-decode, average and eval-bleu --model before any model is loaded, naming its config:
    tune-decode and average scored only after a whole pass over the dev set (a grid point, an averaged model)."""
    run = _japanese_scored_copy(trained_run, tmp_path / "run", monkeypatch)
    src, ref = trained_run / "data" / "train.de", trained_run / "data" / "train.en"
    for argv in (
        ["tune-decode", "--model", run, "--beam-sizes", "1"],
        ["average", "--model", run, "--last", "2"],
        ["eval-bleu", "--model", run, "--src", src, "--ref", ref],
    ):
        code, out, err = run_cli(argv, capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert (
            f"{run / 'config.yaml'}: decode.bleu_tokenize ja-mecab: needs an extra: pip install 'sacrebleu[ja]'" in err
        )


def test_a_run_scores_bleu_with_its_decode_bleu_tokenize(trained_run, tmp_path, capsys):
    """The run's decode.bleu_tokenize and bleu_lowercase reach eval-bleu --model (and dev BLEU, which
    calls the same scorer); --tokenize and --no-lowercase override them."""
    import shutil
    from types import SimpleNamespace

    from nmt.average import dev_bleu
    from nmt.config import DecodeConfig, TrainConfig

    run = tmp_path / "run"
    shutil.copytree(trained_run / "run", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["decode"].update(bleu_tokenize="char", bleu_lowercase=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    src, ref = trained_run / "data" / "train.de", trained_run / "data" / "train.en"
    argv = ["eval-bleu", "--model", run, "--src", src, "--ref", ref, "--json", "--beam-size", "1"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "tok:char|" in json.loads(out)["bleu_signature"] and "case:lc" in json.loads(out)["bleu_signature"]
    code, out, err = run_cli(argv + ["--tokenize", "intl", "--no-lowercase"], capsys)
    assert "tok:intl|" in json.loads(out)["bleu_signature"] and "case:mixed" in json.loads(out)["bleu_signature"]

    hyps, refs = ["Ab cd", "e f g"], ["ab c d", "e fg"]

    class Fixed:
        def translate(self, lines, decode, progress=None):
            return [[h] for h in hyps]

    cfg = SimpleNamespace(train=TrainConfig(), decode=DecodeConfig(bleu_tokenize="char", bleu_lowercase=True))
    want = sacrebleu.corpus_bleu(hyps, [refs], tokenize="char", lowercase=True).score
    assert want != pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert dev_bleu(Fixed(), cfg, ["x", "y"], refs)[0] == pytest.approx(want)


@pytest.mark.parametrize("values", ["1,,2", "1,2,", ",1", " , "])
def test_a_number_list_with_an_empty_item_is_refused_not_shortened(values, capsys):
    # '1,,2' was tuned as [1, 2] without a word: a value the user left out, or a typo.
    with pytest.raises(SystemExit) as exit_:
        main(["tune-decode", "--model", "run", "--length-penalties", values])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert f"argument --length-penalties: expected comma-separated numbers, got {values!r} (an empty item)" in err


def _checkpoint_help(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    start = out.index("  --checkpoint")
    end = out.index("\n  --", start + 1)
    return " ".join(out[start:end].split())


def test_the_commands_that_read_a_runs_model_show_one_checkpoint_option(capsys):
    """translate, eval-bleu and tune-decode take the same --checkpoint values: one metavar, one wording."""
    translate = _checkpoint_help("translate", capsys)
    assert translate.startswith("--checkpoint WHICH auto (default: the averaged model")
    assert _checkpoint_help("eval-bleu", capsys) == translate
    assert _checkpoint_help("tune-decode", capsys) == translate
