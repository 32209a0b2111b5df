"""metrics.jsonl read back (torn last line, resumed runs), derived tokens/s, ``nmt plot`` figures and
the TensorBoard event files, all from hand-written metrics."""

import json
import math
import sys
import time
from pathlib import Path

import pytest

from nmt.cli import main
from nmt.errors import NMTError
from nmt.metrics import (
    SCALARS,
    MetricsLog,
    TokenRate,
    moving_average,
    read_metrics,
    scalar_series,
    validations_trained_on,
)
from nmt.plot import TIME_LABEL, UPDATES_LABEL, load_run, plot_runs, run_labels, scalar_figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BY_NAME = {s.name: s for s in SCALARS}


def train(update: int, elapsed: float, tokens: int = 100, loss: float | None = None) -> dict:
    loss = 5.0 / update if loss is None else loss
    return {
        "type": "train",
        "update": update,
        "epoch": 1,
        "loss": loss,
        "nll": loss * 0.9,
        "lr": 1e-4 * update,
        "grad_norm": 2.0,
        "trg_tokens": tokens,
        "src_tokens": tokens,
        "elapsed": elapsed,
    }


def valid(update: int, elapsed: float, bleu: float, seconds: float = 4.0) -> dict:
    return {
        "type": "valid",
        "update": update,
        "epoch": 1,
        "dev_loss": 3.0 / update,
        "dev_ppl": math.exp(3.0 / update),
        "dev_bleu": bleu,
        "best_bleu": bleu,
        "elapsed": elapsed,
        "seconds": seconds,
    }


def write_run(run_dir: Path, records: list[dict], tail: str = "") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (run_dir / "metrics.jsonl").write_text(text, encoding="utf-8")
    return run_dir


# Session 1 logged updates 1-6 and validated at 4 (checkpoint there), then was killed; session 2
# resumed from update 4: its elapsed continues from the checkpoint's. The last line is being written.
RESUMED = [
    train(1, 1.0, 100),
    train(2, 2.0, 300),
    train(3, 2.5, 200),
    train(4, 3.5, 100),
    valid(4, 3.5, 10.0, seconds=5.0),
    train(5, 9.5, 400, loss=9.0),
    train(6, 10.5, 400, loss=9.0),
    valid(6, 10.5, 99.0),
    train(5, 4.0, 200),  # session 2
    train(6, 5.0, 600),
    valid(6, 5.0, 12.0, seconds=2.0),
    train(7, 8.0, 300),
    train(8, 8.5, 100),
]
TORN = '{"type": "train", "update": 9, "elaps'


@pytest.fixture
def resumed_run(tmp_path) -> Path:
    return write_run(tmp_path / "resumed", RESUMED, TORN)


@pytest.fixture
def long_run(tmp_path) -> Path:
    """150 updates of 2 s each and a validation of 10 s every 50: enough points to be smoothed."""
    records, clock = [], 0.0
    for u in range(1, 151):
        clock += 2.0
        records.append(train(u, clock, 1000, loss=6.0 * 0.99**u + 0.3 * (u % 2)))
        if u % 50 == 0:
            records.append(valid(u, clock, bleu=u / 5))
            clock += 10.0
    return write_run(tmp_path / "long", records)


def test_read_metrics_drops_the_rewound_session_and_the_torn_line(resumed_run):
    train_records, valid_records = read_metrics(resumed_run)
    assert [r["update"] for r in train_records] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [r["elapsed"] for r in train_records[4:]] == [4.0, 5.0, 8.0, 8.5]  # session 2's, not session 1's
    assert [(v["update"], v["dev_bleu"]) for v in valid_records] == [(4, 10.0), (6, 12.0)]


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    run = write_run(tmp_path / "r", [train(1, 1.0)], json.dumps(train(2, 2.0)))
    assert [r["update"] for r in read_metrics(run)[0]] == [1, 2]


def test_metrics_log_round_trip_while_a_line_is_being_written(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write(train(1, 1.0))
    log.write(valid(1, 1.0, 3.0))
    log.file.write('{"type": "train", "upd')  # mid-write, as a reader may see it
    log.file.flush()
    assert read_metrics(tmp_path) == ([train(1, 1.0)], [valid(1, 1.0, 3.0)])
    log.close()


@pytest.mark.parametrize("block", [4, 1 << 16])
def test_a_resumed_run_appends_after_a_torn_or_unterminated_last_line(tmp_path, block, monkeypatch):
    # The fragment a crash left is cut; a whole record that only lacks its newline is kept.
    import nmt.metrics

    monkeypatch.setattr(nmt.metrics.end_torn_tail, "__defaults__", (block,))
    run = write_run(tmp_path / "torn", [train(1, 1.0)], '{"type": "train", "upd')
    log = MetricsLog(run / "metrics.jsonl")
    log.write(train(2, 2.0))
    log.close()
    assert read_metrics(run)[0] == [train(1, 1.0), train(2, 2.0)]
    run = write_run(tmp_path / "whole", [train(1, 1.0)], json.dumps(train(2, 2.0)))
    log = MetricsLog(run / "metrics.jsonl")
    log.write(train(3, 3.0))
    log.close()
    assert read_metrics(run)[0] == [train(1, 1.0), train(2, 2.0), train(3, 3.0)]
    run = write_run(tmp_path / "only", [], '{"type": "tra')  # no newline anywhere
    log = MetricsLog(run / "metrics.jsonl")
    log.write(train(1, 1.0))
    log.close()
    assert read_metrics(run)[0] == [train(1, 1.0)]


def test_metrics_that_cannot_be_written_are_a_one_line_error(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(NMTError, match="metrics.jsonl: cannot write the run's metrics"):
        MetricsLog(tmp_path / "metrics.jsonl")


def test_corrupt_middle_line_is_a_one_line_error(tmp_path):
    run = write_run(tmp_path / "bad", [train(1, 1.0)], 'garbage{\n{"type": "train", "update": 3, "elapsed": 3}\n')
    with pytest.raises(NMTError) as e:
        read_metrics(run)
    assert str(e.value).startswith(f"{run / 'metrics.jsonl'}:2: ")
    assert "\n" not in str(e.value)
    write_run(run, [train(1, 1.0), {"type": "valid", "update": 1}])
    with pytest.raises(NMTError, match=r"metrics.jsonl:2: valid record without a numeric 'elapsed'"):
        read_metrics(run)


def test_a_record_without_its_numbers_is_a_one_line_error_naming_its_line(tmp_path):
    # compare adds up trg_tokens: a string there was a TypeError traceback
    run = write_run(tmp_path / "bad", [train(1, 1.0), {**train(2, 2.0), "trg_tokens": "12"}, train(3, 3.0)])
    with pytest.raises(NMTError, match=r"metrics.jsonl:2: train record without a numeric 'trg_tokens'$"):
        read_metrics(run)
    write_run(run, [train(1, 1.0), {**valid(1, 1.0, 3.0), "dev_bleu": None}])
    with pytest.raises(NMTError, match=r"metrics.jsonl:2: valid record without a numeric 'dev_bleu'$"):
        read_metrics(run)


def test_plot_leaves_out_what_is_not_a_record_with_one_warning_and_draws_the_rest(tmp_path, capsys):
    records = [train(u, float(u)) for u in range(1, 9)] + [valid(8, 8.0, 20.0), train(9, 9.0)]
    lines = [json.dumps(r) for r in records]
    lines[2] = "garbage{"  # update 3
    lines[4] = json.dumps({**records[4], "loss": "5.0"})  # update 5
    lines[6] = json.dumps({k: v for k, v in records[6].items() if k != "lr"})  # update 7
    run = tmp_path / "run"
    write_run(run, [], "\n".join(lines) + "\n" + '{"type": "train", "update": 10, "el')  # a crash mid-line
    out = tmp_path / "plots"
    assert main(["plot", str(run), "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    path = run / "metrics.jsonl"
    warnings = [line for line in err if "warning" in line]
    assert warnings == [
        f"warning: {path}:3: not a JSON line (a corrupt metrics file): left out, and 2 more lines not a whole "
        "record (5, 7); the rest is plotted"
    ]
    cut = [line for line in err if line.startswith(f"{path}:11: ")]
    assert len(cut) == 1 and "cut short" in cut[0] and "corrupt" not in cut[0]
    assert (out / "train_loss.png").read_bytes().startswith(PNG_MAGIC)
    series = load_run(run, "run").series
    assert series["train/loss"].updates == [1, 2, 4, 6, 8, 9]
    assert series["valid/bleu"].values == [20.0]


def test_validations_trained_on_say_whether_a_training_state_was_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert validations_trained_on(path) == (0, 0)  # no file
    three = [train(1, 1.0), train(2, 2.0), train(3, 3.0)]
    write_run(tmp_path, three)
    assert validations_trained_on(path) == (0, 0)
    # Died as it wrote the training state of its first validation: none was written.
    write_run(tmp_path, [*three, valid(3, 3.5, 1.0)])
    assert validations_trained_on(path) == (1, 0)
    # Started again from update 0 after that: the earlier session's validation is no longer the run's.
    write_run(tmp_path, [*three, valid(3, 3.5, 1.0), train(1, 1.0), train(2, 2.0)])
    assert validations_trained_on(path) == (0, 0)
    # Trained on from its validation (a line that is not a record is skipped), or validated again.
    write_run(tmp_path, [*three, valid(3, 3.5, 1.0)], 'garbage{\n{"type": "train", "update": 4, "elapsed": 4}\n')
    assert validations_trained_on(path) == (1, 1)
    write_run(tmp_path, [*three, valid(3, 3.5, 1.0), train(4, 4.0), valid(4, 4.5, 2.0)])
    assert validations_trained_on(path) == (2, 1)


def test_tokens_per_second_by_hand(resumed_run):
    series = scalar_series(*read_metrics(resumed_run), window=2)["train/trg_tokens_per_s"]
    # update 1: no previous record; 5: a validation in its gap (4 -> 5); 7: likewise (6 -> 7).
    assert series.updates == [2, 3, 4, 6, 8]
    expected = [
        300 / 1.0,  # update 2: 300 tokens in 2.0 - 1.0 s
        (300 + 200) / (1.0 + 0.5),
        (200 + 100) / (0.5 + 1.0),
        (100 + 600) / (1.0 + 1.0),  # window of 2: the gaps of updates 4 and 6
        (600 + 100) / (1.0 + 0.5),
    ]
    assert series.values == pytest.approx(expected)
    assert series.seconds == [2.0, 2.5, 3.5, 5.0, 8.5]


def test_token_rate_starts_afresh_in_a_new_session():
    rate = TokenRate(window=3)
    assert rate.add(train(10, 50.0)) is None  # the first record a session sees has no gap
    assert rate.add(train(11, 51.0, 500)) == pytest.approx(500.0)
    assert rate.add(train(11, 52.0)) is None  # went back: a resumed session
    assert rate.add(train(12, 50.0)) is None  # elapsed went back: no rate, not a negative one


def test_moving_average_skips_non_finite_values():
    assert moving_average([1.0, 3.0, math.inf, 5.0], 2) == [1.0, 2.0, 3.0, 5.0]
    assert math.isnan(moving_average([math.nan], 3)[0])


def test_figure_has_both_axes_labelled_and_every_run_in_the_legend(resumed_run, long_run):
    runs = [load_run(d, label) for d, label in zip([long_run, resumed_run], ["long", "resumed"])]
    loss = BY_NAME["train/loss"]
    fig = scalar_figure(loss, runs)
    by_update, by_time = fig.axes
    assert (by_update.get_xlabel(), by_time.get_xlabel()) == (UPDATES_LABEL, TIME_LABEL)
    assert by_update.get_ylabel() == by_time.get_ylabel() == "training loss (nats/token, label-smoothed)"
    for ax in (by_update, by_time):
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["long", "resumed"]
    # Per run a faint raw line and the moving average over 150 // 50 = 3 updates.
    raw, smooth = by_update.get_lines()[:2]
    losses = [6.0 * 0.99**u + 0.3 * (u % 2) for u in range(1, 151)]
    assert list(raw.get_ydata()) == pytest.approx(losses)
    assert list(smooth.get_ydata()) == pytest.approx(moving_average(losses, 3))
    assert raw.get_alpha() < 0.5 and smooth.get_alpha() is None and smooth.get_label() == "long"
    # Wall time in minutes; the long run's validations (10 s each) are in it.
    assert by_time.get_lines()[0].get_xdata()[-1] == pytest.approx((150 * 2.0 + 2 * 10.0) / 60)
    bleu = scalar_figure(BY_NAME["valid/bleu"], runs)
    assert bleu.axes[1].get_ylabel() == "dev BLEU (sacreBLEU, 0-100)"
    assert bleu.axes[1].get_xlabel() == TIME_LABEL and "greedy" in bleu.get_suptitle()
    assert [list(line.get_ydata()) for line in bleu.axes[0].get_lines()] == [[10.0, 20.0, 30.0], [10.0, 12.0]]


def test_no_figure_for_a_scalar_no_run_has_yet(tmp_path):
    run = write_run(tmp_path / "young", [train(1, 1.0), train(2, 2.0)])
    assert scalar_figure(BY_NAME["valid/bleu"], [load_run(run, "young")]) is None


def test_plot_runs_writes_every_png_and_an_index(resumed_run, long_run, tmp_path):
    out = tmp_path / "plots"
    paths = plot_runs([long_run, resumed_run], out, lambda message: None)
    expected = [s.name.replace("/", "_") + ".png" for s in SCALARS]
    assert [p.name for p in paths] == expected
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert sorted(p.name for p in out.iterdir()) == sorted(expected + ["index.md"])  # no temporaries left
    index = (out / "index.md").read_text()
    assert all(f"]({name})" in index for name in expected)
    assert "| resumed |" in index and "| 12.00 |" in index


def average(update: int, bleu: float, updates: list[int]) -> dict:
    return {"type": "average", "update": update, "dev_bleu": bleu, "best_bleu": 30.0, "updates": updates}


def test_plot_marks_the_average_training_made_where_a_run_has_one(long_run, resumed_run, tmp_path):
    # 'nmt plot' left the "average" records out: the model auto may translate with was nowhere to see
    records = [json.loads(line) for line in (long_run / "metrics.jsonl").read_text().splitlines()]
    averaged = write_run(tmp_path / "averaged", [*records, average(150, 33.0, [100, 150])])
    rewound = write_run(tmp_path / "rewound", [*RESUMED[:8], average(6, 50.0, [4, 6]), *RESUMED[8:]])
    found: list[dict] = []
    read_metrics(rewound, averages=found)
    assert found == []  # made at the end of session 1, which session 2 went back over
    runs = [load_run(averaged, "averaged"), load_run(resumed_run, "resumed")]
    bleu = scalar_figure(BY_NAME["valid/bleu"], runs)
    for ax, x in zip(bleu.axes, (150, (150 * 2.0 + 2 * 10.0) / 60)):  # by update; by the minutes of its validation
        star = [line for line in ax.get_lines() if line.get_marker() == "*"]
        assert [(list(line.get_xdata()), list(line.get_ydata())) for line in star] == [([pytest.approx(x)], [33.0])]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["averaged", "averaged: average of its last checkpoints", "resumed"]
    loss = scalar_figure(BY_NAME["train/loss"], runs)
    assert not [line for line in loss.axes[0].get_lines() if line.get_marker() == "*"]
    plot_runs([averaged, resumed_run], tmp_path / "plots", lambda message: None)
    index = (tmp_path / "plots" / "index.md").read_text().splitlines()
    assert index[2].endswith("| best dev BLEU | average dev BLEU |")
    assert index[4].endswith("| 30.00 | 33.00 |") and index[5].endswith("| 12.00 | - |")
    plot_runs([resumed_run], tmp_path / "alone", lambda message: None)  # a run without one: as before
    index = (tmp_path / "alone" / "index.md").read_text().splitlines()
    assert index[2] == "| run | directory | updates | wall time | validations | best dev BLEU |"
    assert index[4].endswith("| 2 | 12.00 |")


def test_cli_plot_in_process(resumed_run, long_run, tmp_path, capsys):
    out = tmp_path / "cli-plots"
    assert main(["plot", str(long_run), str(resumed_run), "--out", str(out)]) == 0
    assert (out / "train_loss.png").read_bytes().startswith(PNG_MAGIC)
    assert "wrote 8 figures" in capsys.readouterr().err


def test_cli_plot_errors_come_before_any_work(resumed_run, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for argv, named in (
        (["plot", str(resumed_run), "--out", str(a_file)], f"--out {a_file}"),
        (["plot", str(resumed_run), "--out", str(a_file / "sub")], f"--out {a_file / 'sub'}"),
        (["plot", str(resumed_run), "--out", str(resumed_run / "figs")], f"--out {resumed_run / 'figs'}"),
        (["plot", str(resumed_run), str(tmp_path / "nothing"), "--out", str(tmp_path / "o")], tmp_path / "nothing"),
        # a PNG file's name: the figures went into a new directory of that name
        (["plot", str(resumed_run), "--out", str(tmp_path / "curves.png")], f"--out {tmp_path / 'curves.png'}"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"nmt plot: error: {named}: ")
    assert not (tmp_path / "o").exists() and not (resumed_run / "figs").exists()
    assert not (tmp_path / "curves.png").exists()
    (tmp_path / "old.png").mkdir()  # a directory of that name already there is the user's choice
    assert main(["plot", str(resumed_run), "--out", str(tmp_path / "old.png")]) == 0


def test_a_run_named_twice_is_refused_however_spelled(resumed_run, long_run, tmp_path, capsys, monkeypatch):
    """runs/a, runs/a/ and ./runs/a (or a link to it) are one run: drawn twice, its curves hid each other."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(resumed_run)
    for second in ("resumed", "resumed/", "./resumed", "link", str(resumed_run / ".." / "resumed")):
        assert main(["plot", "resumed", "long", second, "--out", "o"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"nmt plot: error: {Path(second)}: ") and "twice" in err
    assert not (tmp_path / "o").exists()


def test_missing_matplotlib_names_the_extra(resumed_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(NMTError, match=r"pip install 'nmt\[report\]'"):
        plot_runs([resumed_run], tmp_path / "o", lambda message: None)
    assert not (tmp_path / "o").exists()


def test_labels_are_directory_names_unless_two_share_one(tmp_path):
    assert run_labels([Path("runs/a"), Path("runs/b")]) == ["a", "b"]
    assert run_labels([Path("x/run"), Path("y/run")]) == ["x/run", "y/run"]


def _scalars(log_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"]}


def test_tensorboard_round_trip(tmp_path):
    from nmt.tensorboard import TensorBoardLog

    session1 = RESUMED[:8]
    start = time.time()
    log = TensorBoardLog(tmp_path)
    for record in session1:
        log.write(record)
    log.close()
    end = time.time()
    events = _scalars(tmp_path / "tensorboard")
    assert set(events) == {s.name for s in SCALARS}
    loss = events["train/loss"]
    assert [e.step for e in loss] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in session1 if r["type"] == "train"])
    assert all(start <= e.wall_time <= end for e in loss)
    assert [(e.step, e.value) for e in events["valid/bleu"]] == [(4, 10.0), (6, 99.0)]
    assert [e.value for e in events["valid/ppl"]] == pytest.approx([math.exp(3 / 4), math.exp(3 / 6)])
    rate = scalar_series(*read_metrics(write_run(tmp_path / "s1", session1)))["train/trg_tokens_per_s"]
    assert [(e.step, e.value) for e in events["train/trg_tokens_per_s"]] == [
        (u, pytest.approx(v)) for u, v in zip(rate.updates, rate.values)
    ]

    # Session 2 resumes from update 4: TensorBoard shows its updates 5 and 6, not the first session's.
    log = TensorBoardLog(tmp_path)
    for record in RESUMED[8:]:
        log.write(record)
    log.close()
    events = _scalars(tmp_path / "tensorboard")
    loss = events["train/loss"]
    assert [e.step for e in loss] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [e.value for e in loss][4:] == pytest.approx([5 / 5, 5 / 6, 5 / 7, 5 / 8])  # session 1 logged 9.0
    assert [(e.step, e.value) for e in events["valid/bleu"]] == [(4, 10.0), (6, 12.0)]


def test_missing_tensorboard_names_the_extra(tmp_path, monkeypatch):
    from nmt.tensorboard import TensorBoardLog

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(NMTError, match=r"pip install 'nmt\[tensorboard\]'"):
        TensorBoardLog(tmp_path)


def test_training_without_the_tensorboard_package_stops_before_preparing_the_data(tmp_path, monkeypatch, capsys):
    from conftest import tiny_config

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    config = tiny_config(tmp_path, max_updates=2, warmup_updates=1, tensorboard=True)
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "nmt train: error: train.tensorboard needs the tensorboard package: pip install 'nmt[tensorboard]'" in err
    assert not (tmp_path / "run" / "spm.model").exists()  # no SentencePiece, shards or kernel measurement first
    assert not (tmp_path / "run" / "data").exists()


def test_training_with_tensorboard_writes_the_same_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from conftest import tiny_config
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny_config(tmp_path, max_updates=6, validate_every=3, warmup_updates=2, log_every=1, tensorboard=True)
    assert main(["train", "--config", str(config)]) == 0
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    train, valid = read_metrics(tmp_path / "run")
    losses = [e.value for e in events.Scalars("train/loss")]
    assert [e.step for e in events.Scalars("train/loss")] == [r["update"] for r in train]
    assert losses == pytest.approx([r["loss"] for r in train])
    assert [e.value for e in events.Scalars("valid/bleu")] == pytest.approx([r["dev_bleu"] for r in valid])


def test_tensorboard_events_the_disk_refuses_are_one_error_naming_the_directory(tmp_path, capfd):
    import errno
    import threading

    from nmt.tensorboard import TensorBoardLog

    log = TensorBoardLog(tmp_path)
    log.write(RESUMED[0])

    def refused(*args, **kw):  # what the writer's thread raised at the next event
        raise OSError(errno.ENOSPC, "No space left on device")

    log._writer.add_scalar = refused
    with pytest.raises(OSError) as raised:
        log.write(RESUMED[1])
    assert raised.value.filename == str(tmp_path / "tensorboard")
    thread = threading.Thread(target=refused)  # the writer's thread itself: no traceback
    thread.start()
    thread.join()
    assert "Traceback" not in capfd.readouterr().err
    hook = threading.excepthook
    log.close()
    assert threading.excepthook is not hook  # the process's own hook is back once the run ends
