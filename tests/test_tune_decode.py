"""nmt tune-decode: the grid on dev, the winner written into the run's config."""

import json
import math
import re

import pytest
import yaml
from conftest import NO_SPACE, refuse_writes, tiny_config, write_corpus

from nmt import checkpoint_choice, checkpoint_file
from nmt.cli import main
from nmt.config import DecodeConfig, load_config
from nmt.errors import NMTError
from nmt.run_config import kept_tuned_decode
from nmt.rundir import RunDir
from nmt.tune_decode import Trial, best_trial, grid, tune_decode


def test_best_trial_prefers_bleu_then_a_smaller_beam_then_a_penalty_near_one():
    trials = [Trial(5, 1.0, 30.0), Trial(2, 0.6, 30.001), Trial(2, 1.2, 30.0), Trial(8, 1.0, 29.0)]
    assert best_trial(trials) == Trial(2, 1.2, 30.0)  # 30.001 and 30.0 are equal to two decimals
    assert best_trial([Trial(4, 0.6, 31.0), *trials]) == Trial(4, 0.6, 31.0)


def test_tune_decode_writes_the_winner_into_the_run_config(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=40, validate_every=40)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    before = yaml.safe_load((run / "config.yaml").read_text())
    args = ["tune-decode", "--model", str(run), "--beam-sizes", "1,3", "--length-penalties", "0.5,1.5"]
    assert main(args) == 0
    report = json.loads((run / "tune_decode.json").read_text())
    assert [(t["beam_size"], t["length_penalty"]) for t in report["trials"]] == [(1, 1.0), (3, 0.5), (3, 1.5)]
    chosen = best_trial([Trial(**t) for t in report["trials"]])
    assert report["chosen"] == chosen.__dict__ and report["dev"] == before["data"]["dev"]["path"]
    cfg = RunDir.existing(run).config()
    assert (cfg.decode.beam_size, cfg.decode.length_penalty) == (chosen.beam_size, chosen.length_penalty)
    after = yaml.safe_load((run / "config.yaml").read_text())
    assert {k: v for k, v in after.items() if k != "decode"} == {k: v for k, v in before.items() if k != "decode"}
    assert main(["tune-decode", "--model", str(run), "--beam-sizes", "1,61"]) == 2
    assert "beam size 61 is more than the 60 words of the target vocabulary" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune-decode", "--model", str(run), "--beam-sizes", "0"])
    assert "argument --beam-sizes: expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_the_grid_tries_each_pair_once_in_the_order_given():
    tried = []

    def translate(decode):
        tried.append((decode.beam_size, decode.length_penalty))
        return ["a b c"]

    trials = grid(translate, ["a b c"], DecodeConfig(length_penalty=0.7), [1, 2, 2, 4], [1.0, 0.6, 1.0], lambda _: None)
    assert tried == [(1, 0.7), (2, 1.0), (2, 0.6), (4, 1.0), (4, 0.6)]  # greedy keeps the run's penalty
    assert [(t.beam_size, t.length_penalty) for t in trials] == tried


def test_a_non_finite_length_penalty_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tune-decode", "--model", str(tmp_path), "--beam-sizes", "1,2,2", "--length-penalties", "1,nan"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --length-penalties: expected a finite number, got 'nan'" in err
    with pytest.raises(NMTError, match=r"length penalties in \[0, 10\]"):
        tune_decode(RunDir(tmp_path), [2], [1.0, math.inf], "cpu", "auto", lambda _: None)
    assert not list(tmp_path.iterdir())  # refused before the run was read or locked


def test_resuming_with_the_original_config_keeps_the_tuned_decoding(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=10, validate_every=10, warmup_updates=1)  # decode: beam 3, alpha 1.0
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    assert main(["tune-decode", "--model", str(run), "--beam-sizes", "1", "--length-penalties", "0.5"]) == 0
    assert json.loads((run / "tune_decode.json").read_text())["before"] == {"beam_size": 3, "length_penalty": 1.0}
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=12"]) == 0
    assert "keeping beam 1, length penalty 1.0 ('nmt tune-decode')" in capsys.readouterr().err
    decode = RunDir.existing(run).config().decode
    assert (decode.beam_size, decode.length_penalty) == (1, 1.0)  # greedy won: the run's own penalty stays
    # A value of the user's own replaces the tuned one, and says so.
    assert main(["train", "--config", str(config), "--set", "train.max_updates=14", "--set", "decode.beam_size=2"]) == 0
    assert "replaces what 'nmt tune-decode' chose (1, 1.0)" in capsys.readouterr().err
    assert RunDir.existing(run).config().decode.beam_size == 2


def _record_penalties(monkeypatch, module) -> list[float]:
    """The decode.length_penalty of every dev_bleu call through ``module``, in order."""
    penalties = []
    dev_bleu = module.dev_bleu
    monkeypatch.setattr(
        module, "dev_bleu", lambda tr, cfg, *a: penalties.append(cfg.decode.length_penalty) or dev_bleu(tr, cfg, *a)
    )
    return penalties


@pytest.mark.parametrize("earlier_version", [False, True])
def test_validation_keeps_the_runs_length_penalty_after_tune_decode(tmp_path, monkeypatch, capsys, earlier_version):
    # Beam validation decoded with the tuned decode.length_penalty once resumed: its scores were ranked
    # against the best scored with the run's own (best checkpoints, patience, the average's standing).
    import nmt.validation

    config = tiny_config(tmp_path, max_updates=3, validate_every=3, warmup_updates=1, validate_beam_size=2)
    assert main(["train", "--config", str(config)]) == 0  # decode: beam 3, alpha 1.0
    run = tmp_path / "run"
    assert main(["tune-decode", "--model", str(run), "--beam-sizes", "2", "--length-penalties", "0.25"]) == 0
    state_path = run / "checkpoints" / "update_00000003.pt"
    if earlier_version:  # a state that recorded no penalty: the run's own, tune_decode.json's "before"
        state = checkpoint_file.load(state_path)
        assert state["progress"].pop("validate_length_penalty") == 1.0
        checkpoint_file.save(state, state_path)
    penalties = _record_penalties(monkeypatch, nmt.validation)
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=6"]) == 0
    log = capsys.readouterr().err
    assert "keeping beam 2, length penalty 0.25 ('nmt tune-decode')" in log
    assert "validation decodes with length penalty 1.0, the run's since its first validation, not " in log
    assert "decode.length_penalty 0.25" in log and RunDir.existing(run).config().decode.length_penalty == 0.25
    assert penalties == [1.0]
    assert (
        checkpoint_file.load(run / "checkpoints" / "update_00000006.pt")["progress"]["validate_length_penalty"] == 1.0
    )


def test_nmt_average_scores_with_the_validations_length_penalty_after_tune_decode(tmp_path, monkeypatch):
    # 'nmt average' ranks its average against the validations' best: it scored with the tuned
    # decode.length_penalty that tune-decode wrote into config.yaml, the validations with the run's own.
    import nmt.average

    config = tiny_config(tmp_path, max_updates=4, validate_every=2, warmup_updates=1, validate_beam_size=2)
    assert main(["train", "--config", str(config), "--set", "train.keep_last=2"]) == 0  # decode: alpha 1.0
    run = tmp_path / "run"
    assert main(["tune-decode", "--model", str(run), "--beam-sizes", "2", "--length-penalties", "0.25"]) == 0
    assert RunDir.existing(run).config().decode.length_penalty == 0.25
    penalties = _record_penalties(monkeypatch, nmt.average)
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    assert penalties == [1.0]


def test_beams_below_the_runs_nbest_are_left_out_so_the_config_stays_valid(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=10, validate_every=10, warmup_updates=1)  # decode: beam 3
    assert main(["train", "--config", str(config), "--set", "decode.nbest=2"]) == 0
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["tune-decode", "--model", str(run), "--beam-sizes", "1,2", "--length-penalties", "1"]) == 0
    assert "leaving out beam sizes 1, smaller than decode.nbest 2" in capsys.readouterr().err
    assert [t["beam_size"] for t in json.loads((run / "tune_decode.json").read_text())["trials"]] == [2]
    decode = RunDir.existing(run).config().decode  # loads: the written config passes load_config's checks
    assert (decode.beam_size, decode.nbest) == (2, 2)
    assert main(["tune-decode", "--model", str(run), "--beam-sizes", "1"]) == 2
    assert "every --beam-sizes value (1) is smaller than the run's decode.nbest 2" in capsys.readouterr().err


def test_a_resume_config_whose_nbest_exceeds_the_tuned_beam_keeps_its_own_decoding(tmp_path):
    config = tiny_config(tmp_path)  # decode: beam 3, length penalty 1.0
    saved = load_config(config, ["decode.beam_size=2", "decode.length_penalty=0.6"])  # as tune-decode left it
    report = tmp_path / "tune_decode.json"
    chosen = {"beam_size": 2, "length_penalty": 0.6, "bleu": 30.0}
    report.write_text(json.dumps({"chosen": chosen, "before": {"beam_size": 3, "length_penalty": 1.0}}))
    logged = []
    kept = kept_tuned_decode(load_config(config, ["decode.nbest=3"]), saved, report, logged.append)
    assert (kept.decode.beam_size, kept.decode.length_penalty, kept.decode.nbest) == (3, 1.0, 3)
    assert "its decode.nbest 3 is more than that beam" in logged[0]
    kept = kept_tuned_decode(load_config(config, ["decode.nbest=2"]), saved, report, logged.append)
    assert (kept.decode.beam_size, kept.decode.length_penalty, kept.decode.nbest) == (2, 0.6, 2)


def test_tuning_again_keeps_the_runs_own_decoding_as_before(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=10, validate_every=10, warmup_updates=1)  # decode: beam 3, alpha 1.0
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    for alpha in ("0.5", "0.8"):
        assert main(["tune-decode", "--model", str(run), "--beam-sizes", "2", "--length-penalties", alpha]) == 0
        assert json.loads((run / "tune_decode.json").read_text())["before"] == {"beam_size": 3, "length_penalty": 1.0}
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=12"]) == 0
    assert "keeping beam 2, length penalty 0.8 ('nmt tune-decode')" in capsys.readouterr().err
    decode = RunDir.existing(run).config().decode
    assert (decode.beam_size, decode.length_penalty) == (2, 0.8)


def test_the_report_names_the_checkpoint_tuned_with_and_a_different_default_is_said(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=40, validate_every=20)  # best_N and update_20, update_40
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    capsys.readouterr()
    args = ["tune-decode", "--model", str(run), "--beam-sizes", "1,2", "--length-penalties", "1"]
    assert main([*args, "--checkpoint", "update_00000020.pt"]) == 0
    report = json.loads((run / "tune_decode.json").read_text())
    assert report["checkpoint"] == "update_00000020.pt"
    default = checkpoint_choice.model_checkpoint(RunDir.existing(run), RunDir.existing(run).config()).name
    assert default != "update_00000020.pt"
    err = capsys.readouterr().err
    assert f"tuned with update_00000020.pt, but translate and eval-bleu load {default}" in err
    assert main(args) == 0  # the default checkpoint: nothing to say
    assert json.loads((run / "tune_decode.json").read_text())["checkpoint"] == default
    assert "but translate and eval-bleu load" not in capsys.readouterr().err


def test_the_report_names_the_checkpoint_loaded_not_a_second_resolution(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, max_updates=40, validate_every=20)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    loaded, load, resolve = [], checkpoint_file.load, checkpoint_choice.model_checkpoint

    def recorded_load(path, *args, **kwargs):
        loaded.append(path.name)
        return load(path, *args, **kwargs)

    def resolved_then_changed(run, cfg, which="auto"):  # the run's checkpoints change after the first look
        first = resolve(run, cfg, which)
        monkeypatch.setattr(checkpoint_choice, "model_checkpoint", lambda *_: run.checkpoint_dir / "update_00000020.pt")
        return first

    monkeypatch.setattr(checkpoint_file, "load", recorded_load)
    monkeypatch.setattr(checkpoint_choice, "model_checkpoint", resolved_then_changed)
    tune_decode(RunDir.existing(run), [1], [1.0], "cpu", "last", lambda _: None)
    assert loaded == ["update_00000040.pt"]
    assert json.loads((run / "tune_decode.json").read_text())["checkpoint"] == "update_00000040.pt"


def _note(run, tuned_with: str, loaded: str, by: str = "loaded", retune: str = "") -> str:
    return (
        f"note: beam 2, length penalty 0.6 were tuned by 'nmt tune-decode' with {tuned_with}; the checkpoint {by} "
        f"is {loaded}: 'nmt tune-decode --model {run}{retune}' re-tunes them for it"
    )


def test_commands_loading_another_checkpoint_than_the_tuned_one_say_so(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=40, validate_every=20)
    assert main(["train", "--config", str(config)]) == 0
    run, data = tmp_path / "run", tmp_path / "data"
    tune = ["tune-decode", "--model", str(run), "--beam-sizes", "2", "--length-penalties", "0.6"]
    assert main([*tune, "--checkpoint", "update_00000020.pt"]) == 0
    default = checkpoint_choice.model_checkpoint(RunDir.existing(run), RunDir.existing(run).config()).name
    capsys.readouterr()
    translate = ["translate", "--model", run, "-i", data / "train.de", "-o", tmp_path / "out.en"]
    commands = [
        translate,
        ["eval-bleu", "--model", run, "--src", data / "train.de", "--ref", data / "train.en"],
        ["compare", run, "--out", tmp_path / "report"],
    ]
    for args in commands:
        assert main([str(a) for a in args]) == 0
        err = capsys.readouterr().err
        assert err.count("note: ") == 1 and _note(run, "update_00000020.pt", default) in err, args[0]
    assert main([str(a) for a in [*translate, "--checkpoint", "last"]]) == 0
    err = capsys.readouterr().err
    assert _note(run, "update_00000020.pt", "update_00000040.pt", retune=" --checkpoint last") in err
    # The checkpoint tuned with, or a pair of the user's own: nothing to say.
    for options in (["--checkpoint", "update_00000020.pt"], ["--length-penalty", "1"], ["--beam-size", "3"]):
        assert main([str(a) for a in [*translate, *options]]) == 0
        assert "note: " not in capsys.readouterr().err, options
    assert main(tune) == 0  # tuned again, with the default
    capsys.readouterr()
    assert main([str(a) for a in translate]) == 0
    assert "note: " not in capsys.readouterr().err


def test_a_tuned_run_trained_on_says_when_its_checkpoint_is_no_longer_the_tuned_one(tmp_path, capsys):
    config = tiny_config(tmp_path, max_updates=40, validate_every=20)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    tune = ["tune-decode", "--model", str(run), "--beam-sizes", "2", "--length-penalties", "0.6"]
    assert main(tune) == 0
    tuned_with = json.loads((run / "tune_decode.json").read_text())["checkpoint"]
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--set", "train.max_updates=80"]) == 0
    default = checkpoint_choice.model_checkpoint(RunDir.existing(run), RunDir.existing(run).config()).name
    assert default != tuned_with  # a new best
    assert _note(run, tuned_with, default, by="translate loads now") in capsys.readouterr().err
    # An average made again under the same name is another checkpoint too.
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    assert main([*tune, "--checkpoint", "average_last_2.pt"]) == 0
    translate = ["translate", "--model", str(run), "-i", str(tmp_path / "data" / "train.de"), "--checkpoint"]
    capsys.readouterr()
    assert main([*translate, "average_last_2.pt"]) == 0
    assert "note: " not in capsys.readouterr().err
    assert main(["train", "--config", str(config), "--set", "train.max_updates=100"]) == 0
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    capsys.readouterr()
    assert main([*translate, "average_last_2.pt"]) == 0
    since = "average_last_2.pt, written again since"
    assert _note(run, "average_last_2.pt", since, retune=" --checkpoint average_last_2.pt") in capsys.readouterr().err


def test_a_disk_that_refuses_the_report_leaves_the_run_decoding_as_before(tmp_path, monkeypatch, capsys):
    config = tiny_config(tmp_path, max_updates=40, validate_every=40)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    before = (run / "config.yaml").read_bytes()
    refuse_writes(monkeypatch, "tune_decode.json")
    capsys.readouterr()
    assert main(["tune-decode", "--model", str(run), "--beam-sizes", "1,2", "--length-penalties", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"nmt tune-decode: error: {run / 'tune_decode.json'}: could not write ({NO_SPACE})"
    assert (run / "config.yaml").read_bytes() == before and not (run / "tune_decode.json").exists()


def test_a_dev_set_empty_after_cleaning_is_an_error_naming_its_key_in_the_runs_config(tmp_path, capsys):
    # sacreBLEU scored no sentences with an IndexError: a traceback, after loading the model
    config = tiny_config(tmp_path, max_updates=4, warmup_updates=1, validate_every=4)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "run"
    before = (run / "config.yaml").read_bytes()
    dev = write_corpus(tmp_path / "data", "train", [("", "the dog"), (" ", "")])  # the run's dev, emptied since
    capsys.readouterr()
    assert main(["tune-decode", "--model", str(run), "--beam-sizes", "1,2"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert re.fullmatch(
        rf"nmt tune-decode: error: {re.escape(str(run / 'config.yaml'))}: line \d+, column \d+: config key "
        rf"'data.dev.path': the corpus '{re.escape(str(dev))}' is empty after cleaning: no dev pair to tune on",
        line,
    )
    assert (run / "config.yaml").read_bytes() == before and not (run / "tune_decode.json").exists()
