"""Checkpoints: atomic writes, corruption detection, refusal of pickled code (checkpoint_file); a run's
directory of them, its retention and index (checkpoint)."""

import os
import pickle
from pathlib import Path

import pytest
import torch

from nmt import checkpoint, checkpoint_file, checkpoint_index, testhooks
from nmt.errors import NMTError


def payload(value: float) -> dict:
    return {"model": {"w": torch.full((3, 3), value)}, "progress": {"update": int(value)}, "optimizer": {}, "rng": {}}


def test_roundtrip(tmp_path):
    path = tmp_path / "update_00000001.pt"
    checkpoint_file.save(payload(1.0), path)
    loaded = checkpoint_file.load(path)
    assert torch.equal(loaded["model"]["w"], torch.full((3, 3), 1.0))
    assert loaded["progress"]["update"] == 1


def test_crash_between_write_and_rename_keeps_previous(tmp_path, monkeypatch):
    path = tmp_path / "update_00000001.pt"
    checkpoint_file.save(payload(1.0), path)

    def crash(tmp):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(testhooks, "before_rename", crash)
    with pytest.raises(NMTError, match="could not write checkpoint.*what was there before is intact"):
        checkpoint_file.save(payload(2.0), path)
    assert checkpoint_file.load(path)["progress"]["update"] == 1
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_sidecar_that_cannot_be_written_leaves_the_new_file_loadable(tmp_path, monkeypatch):
    # average_last_N.pt and best files are written again under the same name: the old digest must
    # not outlive its file, or the new checkpoint, complete, is called corrupted.
    path = tmp_path / "average_last_2.pt"
    checkpoint_file.save(payload(1.0), path)

    def sidecar_refused(tmp):
        if tmp.name.startswith(f".{path.name}.sha256"):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(testhooks, "before_rename", sidecar_refused)
    with pytest.raises(NMTError, match="average_last_2.pt.sha256: could not write checkpoint"):
        checkpoint_file.save(payload(2.0), path)
    assert checkpoint_file.load(path)["progress"]["update"] == 2


def test_a_checkpoint_written_again_as_it_is_read_loads_whole(tmp_path, monkeypatch):
    # 'nmt translate' reading average_last_2.pt just as training's end (or 'nmt average') writes it
    # again: the bytes read are the old file's, the digest found after them the new one's.
    path = tmp_path / "average_last_2.pt"
    checkpoint_file.save(payload(1.0), path)
    read_bytes = Path.read_bytes

    def read_then_written_again(self: Path) -> bytes:
        data = read_bytes(self)
        if self == path and not written_again:
            written_again.append(self)
            checkpoint_file.save(payload(2.0), path)
        return data

    written_again: list[Path] = []
    monkeypatch.setattr(Path, "read_bytes", read_then_written_again)
    assert checkpoint_file.load(path)["progress"]["update"] == 2
    assert written_again


def test_a_checksum_file_that_cannot_be_read_is_one_line(tmp_path):
    path = tmp_path / "best_00000001.pt"
    checkpoint_file.save(payload(1.0), path)
    sidecar = path.with_name(path.name + ".sha256")
    sidecar.unlink()
    sidecar.mkdir()
    with pytest.raises(NMTError, match=r"best_00000001.pt.sha256: cannot read the checkpoint's checksum"):
        checkpoint_file.load(path)


def test_truncated_checkpoint_detected(tmp_path):
    path = tmp_path / "update_00000001.pt"
    checkpoint_file.save(payload(1.0), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(NMTError, match="corrupted or truncated"):
        checkpoint_file.load(path)
    # Without the sidecar the zip reader must still notice.
    path.with_name(path.name + ".sha256").unlink()
    with pytest.raises(NMTError, match="not a checkpoint .* damaged"):
        checkpoint_file.load(path)


def test_random_bytes_are_not_called_unsafe(tmp_path):
    path = tmp_path / "best_00000001.pt"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(NMTError) as err:
        checkpoint_file.load(path)
    assert "not a checkpoint (not a PyTorch archive)" in str(err.value) and "Python objects" not in str(err.value)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch EXPLOITED",))


def test_malicious_checkpoint_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "update_00000001.pt"
    torch.save({"format": checkpoint_file.FORMAT, "model": _Exploit()}, path)
    with pytest.raises(NMTError, match="refused"):
        checkpoint_file.load(path)
    assert not (tmp_path / "EXPLOITED").exists()
    # A raw pickle (not a torch zip) with the same trick.
    path.write_bytes(pickle.dumps(_Exploit(), protocol=2))
    with pytest.raises(NMTError):
        checkpoint_file.load(path)
    assert not (tmp_path / "EXPLOITED").exists()


def test_manager_keeps_last_k_and_best_n(tmp_path):
    m = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=2)
    for u in (1, 2, 3, 4):
        m.save_state(payload(float(u)), u)
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "update")] == [4, 3]
    assert m.save_best(payload(1.0), 1, score=10.0)
    assert m.save_best(payload(2.0), 2, score=30.0)
    assert not m.save_best(payload(3.0), 3, score=5.0)  # worse than both kept
    assert m.save_best(payload(4.0), 4, score=20.0)
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "best")] == [4, 2]
    assert m.best_path().name == "best_00000002.pt"


def test_a_keep_best_lowered_on_resume_holds_from_the_next_state_written_as_keep_last_does(tmp_path):
    before = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=3)
    for update, score in ((1, 10.0), (2, 20.0), (3, 30.0)):
        assert before.save_best(payload(float(update)), update, score=score)
        before.save_state(payload(float(update)), update)
    # Resumed with keep_best 1 and keep_last 1; its next validation is no new best, so nothing is saved as one.
    after = checkpoint.CheckpointManager(tmp_path, keep_last=1, keep_best=1)
    after.save_state(payload(4.0), 4)
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "update")] == [4]
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "best")] == [3]
    assert [b["file"] for b in after.read_index()["best"]] == ["best_00000003.pt"]


def test_a_best_checkpoint_a_kill_left_as_it_was_replaced_is_removed_at_the_next_state(tmp_path, monkeypatch):
    # The index is written before the best checkpoints it drops are deleted: a SIGKILL between the two
    # left best_1 there for good, past keep_best.
    m = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=1)
    assert m.save_best(payload(1.0), 1, score=10.0)

    def killed(path):
        raise KeyboardInterrupt  # where the process died

    monkeypatch.setattr(checkpoint, "_remove", killed)
    with pytest.raises(KeyboardInterrupt):
        m.save_best(payload(2.0), 2, score=20.0)
    monkeypatch.undo()
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "best")] == [2, 1]

    resumed = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=1)
    resumed.save_state(payload(2.0), 2)  # no new best need come
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "best")] == [2]
    assert sorted(p.name for p in tmp_path.glob("best_*")) == ["best_00000002.pt", "best_00000002.pt.sha256"]


def test_a_kill_between_the_first_best_checkpoint_and_its_index_leaves_a_run_that_resumes(tmp_path, monkeypatch):
    # A best_*.pt without an index is refused as a run whose index was lost; the first validation
    # wrote its best checkpoint before any index existed, so a kill between the two writes left that.
    m = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=1)
    real = checkpoint_file.atomic_write_bytes

    def killed_before_the_entry(path, data):
        if path.name == "index.json" and b"best_00000001.pt" in data:
            raise KeyboardInterrupt  # where the process died
        real(path, data)

    monkeypatch.setattr(checkpoint_file, "atomic_write_bytes", killed_before_the_entry)
    with pytest.raises(KeyboardInterrupt):
        m.save_best(payload(1.0), 1, score=10.0)
    monkeypatch.undo()
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "best")] == [1]

    resumed = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=1)
    assert resumed.read_index()["best"] == []  # not validated yet, as far as the run knows
    assert resumed.save_best(payload(1.0), 1, score=10.0)  # the resumed run validates update 1 again
    assert [b["file"] for b in resumed.read_index()["best"]] == ["best_00000001.pt"]


def test_a_digest_a_kill_left_without_its_checkpoint_is_removed_when_the_writer_starts(tmp_path, monkeypatch):
    # A checkpoint is deleted before its digest: a SIGKILL between the two left update_1.pt.sha256
    # for good, a digest of no file among the run's checkpoints.
    m = checkpoint.CheckpointManager(tmp_path, keep_last=1, keep_best=1)
    m.save_state(training_state(1), 1)
    real_unlink = Path.unlink

    def killed_after_the_checkpoint(path, missing_ok=False):
        real_unlink(path, missing_ok=missing_ok)
        if path.name == "update_00000001.pt":
            raise KeyboardInterrupt  # where the process died

    monkeypatch.setattr(Path, "unlink", killed_after_the_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        m.save_state(training_state(2), 2)
    monkeypatch.undo()
    assert (tmp_path / "update_00000001.pt.sha256").exists() and not (tmp_path / "update_00000001.pt").exists()

    checkpoint.CheckpointManager(tmp_path, keep_last=1, keep_best=1)  # the resumed run's
    assert sorted(p.name for p in tmp_path.glob("update_*")) == ["update_00000002.pt", "update_00000002.pt.sha256"]


def test_an_unreadable_index_stops_the_writer_before_a_best_checkpoint_is_replaced(tmp_path):
    # read as none, it made a worse validation the best (its entry alone) and deleted best_1
    m = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=1)
    assert m.save_best(payload(1.0), 1, score=10.0)
    m.index_path.write_text('{"best": [{"file": "best_0000')  # cut off mid-write by another program
    with pytest.raises(NMTError, match=r"index\.json: not JSON .*restore it from a copy of the run"):
        m.save_best(payload(2.0), 2, score=5.0)
    with pytest.raises(NMTError, match=r"index\.json: not JSON"):
        m.save_state(payload(2.0), 2)
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "best")] == [1]
    assert checkpoint_file.load(tmp_path / "update_00000002.pt")["progress"]["update"] == 2  # written before
    assert m.index_path.read_text() == '{"best": [{"file": "best_0000'


def training_state(update: int, validated: bool = True) -> dict:
    """A training state as a validation writes it, or (``validated`` False) as a signal between two does."""
    progress = {"update": update, "last_validated": update if validated else update - 1}
    return {"model": {"w": torch.full((3, 3), float(update))}, "progress": progress}


def test_a_state_written_between_validations_is_kept_only_while_it_is_the_newest(tmp_path):
    # keep_last counts what validations wrote, as in a run that was never stopped.
    m = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=1)
    for update in (5, 10):
        m.save_state(training_state(update), update)
    m.save_state(training_state(12, validated=False), 12)  # SIGTERM at update 12
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "update")] == [12, 10, 5]
    m.save_state(training_state(13, validated=False), 13)  # resumed, and stopped again
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "update")] == [13, 10, 5]
    m.save_state(training_state(15), 15)
    assert [c.update for c in checkpoint.list_checkpoints(tmp_path, "update")] == [15, 10]
    assert sorted(p.name for p in tmp_path.glob("*.sha256")) == [f"update_000000{u}.pt.sha256" for u in (10, 15)]


def test_best_checkpoints_rank_equal_bleu_by_the_lower_dev_loss(tmp_path):
    m = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=1)
    assert m.save_best(payload(1.0), 1, score=10.0)  # an earlier version's entry: no loss recorded
    assert m.save_best(payload(2.0), 2, score=10.0, loss=3.0)
    assert m.save_best(payload(3.0), 3, score=10.0, loss=2.0)
    assert not m.save_best(payload(4.0), 4, score=10.0, loss=2.5)
    assert not m.save_best(payload(5.0), 5, score=9.0, loss=0.5)  # BLEU first
    assert [b["file"] for b in m.read_index()["best"]] == ["best_00000003.pt"]
    assert m.best_path().name == "best_00000003.pt"


@pytest.mark.parametrize("keep_best", [1, 2])
def test_a_best_checkpoint_saved_again_after_a_resume_is_kept(tmp_path, keep_best):
    # An attempt wrote best_2 and was killed before its training state; the resumed run validates
    # at update 2 again (the same score, or another where validation settings changed).
    m = checkpoint.CheckpointManager(tmp_path, keep_last=2, keep_best=keep_best)
    assert m.save_best(payload(1.0), 1, score=10.0)
    assert m.save_best(payload(2.0), 2, score=20.0)
    m.save_best(payload(2.0), 2, score=20.0)
    assert m.save_best(payload(2.5), 2, score=25.0)
    assert [b["file"] for b in m.read_index()["best"]][:1] == ["best_00000002.pt"]
    assert m.best_path() == tmp_path / "best_00000002.pt"
    assert m.save_best(payload(3.0), 3, score=30.0)
    index = m.read_index()["best"]
    expected = ["best_00000003.pt", "best_00000002.pt"][:keep_best]
    assert [b["file"] for b in index] == expected
    assert sorted(p.name for p in tmp_path.glob("best_*.pt")) == sorted(expected)
    assert m.best_path().name == "best_00000003.pt"
    if keep_best == 2:
        assert (
            index[1]["score"] == 25.0 and checkpoint_file.load(tmp_path / expected[1])["model"]["w"][0, 0].item() == 2.5
        )


def test_a_missing_best_ranked_first_is_named_though_lower_ones_are_kept(tmp_path):
    """keep_best 3, best_2 (dev BLEU 40) deleted: auto ranked the average (30) against 40 and loaded
    best_3 (20), which the average beats, and best loaded best_3 as the best, both saying nothing."""
    m = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=3)
    for update, score in ((1, 10.0), (2, 40.0), (3, 20.0)):
        assert m.save_best(payload(float(update)), update, score=score)
    m.save_average(payload(9.0), "average_last_3.pt", 30.0, [1, 2, 3], by_training=True)
    assert m.model_path() == m.best_path() == tmp_path / "best_00000002.pt"
    (tmp_path / "best_00000002.pt").unlink()
    for choose in (m.model_path, m.best_path):
        with pytest.raises(NMTError) as refused:
            choose()
        assert str(refused.value).startswith(f"{tmp_path / 'best_00000002.pt'}: the run's best checkpoint")
        assert "--checkpoint best_00000003.pt takes the next best kept" in str(refused.value)
    assert m.missing_best() == tmp_path / "best_00000002.pt"
    for lower in ("best_00000003.pt", "best_00000001.pt"):  # none kept to name: the advice alone
        (tmp_path / lower).unlink()
    with pytest.raises(NMTError, match=r"missing: restore it \(translate, eval-bleu"):
        m.best_path()


def test_a_best_replaced_as_its_index_is_read_is_no_missing_best(tmp_path, monkeypatch):
    # keep_best 1: a reader reads the index, the trainer names a new best and deletes the one before
    m = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=1)
    assert m.save_best(payload(1.0), 1, score=10.0)
    stale = m.read_index()
    assert m.save_best(payload(2.0), 2, score=20.0) and not (tmp_path / "best_00000001.pt").exists()
    read = m.read_index
    reads = iter([stale])
    monkeypatch.setattr(m, "read_index", lambda: next(reads, None) or read())
    assert m.best_path() == tmp_path / "best_00000002.pt"


def test_resume_falls_back_past_a_corrupt_newest(tmp_path):
    m = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=1)
    m.save_state(payload(1.0), 1)
    m.save_state(payload(2.0), 2)
    newest = tmp_path / "update_00000002.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    warnings = []
    path, state = m.load_latest_state(warnings.append)
    assert state["progress"]["update"] == 1 and path.name == "update_00000001.pt"
    assert len(warnings) == 1 and "update_00000002.pt" in warnings[0]


def test_resume_refuses_to_start_over_when_every_state_is_corrupt(tmp_path):
    m = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=1)
    m.save_state(payload(1.0), 1)
    m.save_state(payload(2.0), 2)
    for name in ("update_00000001.pt", "update_00000002.pt"):
        (tmp_path / name).write_bytes((tmp_path / name).read_bytes()[:100])
    warnings = []
    with pytest.raises(NMTError, match="none of the run's 2 training-state checkpoints"):
        m.load_latest_state(warnings.append)
    assert len(warnings) == 2
    assert checkpoint.CheckpointManager(tmp_path / "fresh", keep_last=3, keep_best=1).load_latest_state(print) is None


def test_non_finite_weights_are_never_written(tmp_path):
    bad = payload(1.0)
    bad["model"]["w"][1, 1] = float("nan")
    path = tmp_path / "update_00000001.pt"
    with pytest.raises(NMTError, match="non-finite weights \\(w\\)"):
        checkpoint_file.save(bad, path)
    assert not path.exists()


def test_a_kill_while_an_average_is_written_again_never_leaves_its_old_score_on_its_new_weights(tmp_path, monkeypatch):
    """Training writes average_last_N.pt again under its name as it goes on: killed after the new weights
    and before the index recorded them, the index's score and updates were the old average's, and
    --checkpoint auto chose the new weights by a score that was not theirs."""
    m = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=1)
    m.save_best(payload(5.0), 5, score=40.0)
    m.save_average(payload(1.0), "average_last_3.pt", 45.0, [1, 2, 3], by_training=True)
    assert m.model_path() == tmp_path / "average_last_3.pt"  # 45 beats the best's 40
    real = checkpoint_file.atomic_write_bytes

    def killed_before_recording(path, data):
        if path.name == "index.json" and b"[\n   2,\n   3,\n   4\n  ]" in data:
            raise KeyboardInterrupt  # as a second Ctrl-C's os._exit, or SIGKILL, stops it there
        return real(path, data)

    monkeypatch.setattr(checkpoint_file, "atomic_write_bytes", killed_before_recording)
    with pytest.raises(KeyboardInterrupt):
        m.save_average(payload(2.0), "average_last_3.pt", 30.0, [2, 3, 4], by_training=True)
    monkeypatch.setattr(checkpoint_file, "atomic_write_bytes", real)
    assert torch.equal(checkpoint_file.load(tmp_path / "average_last_3.pt")["model"]["w"], torch.full((3, 3), 2.0))
    # The index names no average now (the next end of training or 'nmt average' makes it again): the
    # best single checkpoint is what translation loads.
    assert m.average_path() is None and m.read_index().get("average") is None
    assert m.model_path() == tmp_path / "best_00000005.pt"
    m.save_average(payload(2.0), "average_last_3.pt", 30.0, [2, 3, 4], by_training=True)
    assert m.read_index()["average"]["updates"] == [2, 3, 4] and m.average_path()[1] == 30.0


@pytest.mark.parametrize(
    "model,message",
    [
        (None, "it holds no model weights"),
        ([1, 2], "it holds no model weights"),
        ({}, "it holds no model weights"),
        ({"w": "text"}, "its model weights are not all named tensors"),
        ({"w": torch.full((2, 2), float("nan"))}, r"the model has non-finite weights \(w\); use another checkpoint"),
    ],
)
def test_a_checkpoint_without_usable_weights_is_refused_on_load(tmp_path, model, message):
    # written past save(), which refuses them: by hand, another program or a damaged run
    path = tmp_path / "best_00000001.pt"
    weights = {} if model is None else {"model": model}
    torch.save({"format": checkpoint_file.FORMAT, "progress": {"update": 1}, **weights}, path)
    with pytest.raises(NMTError, match=f"best_00000001.pt: .*{message}"):
        checkpoint_file.load(path)


@pytest.mark.parametrize(
    "index",
    [
        "[1]",
        '{"best": "best_00000001.pt"}',
        '{"best": [{"file": 5, "score": 10}]}',
        '{"best": [{"file": "best_00000001.pt", "score": "high"}]}',
        '{"best": [], "average": 5}',
        '{"best": [{"file": "../outside.pt", "score": 99}]}',
        '{"best": [], "last_state": "2"}',
    ],
)
def test_an_index_of_another_shape_is_an_error_naming_it(tmp_path, index):
    # edited by hand or written by another program: its readers indexed into it and failed
    # (AttributeError, TypeError), or followed a name out of the checkpoint directory; read as none,
    # they took the newest best checkpoint for the best, and forgot the scores
    m = checkpoint.CheckpointManager(tmp_path / "checkpoints", keep_last=2, keep_best=1)
    assert m.save_best(payload(1.0), 1, score=10.0)
    checkpoint_file.save(payload(9.0), tmp_path / "outside.pt")
    m.index_path.write_text(index)
    readers = [m.read_index, m.best_path, m.model_path, m.best_score, m.average_path]
    for read in [
        *readers,
        lambda: checkpoint_index.last_state_recorded(m.directory),
        lambda: m.save_state(payload(2.0), 2),
    ]:
        with pytest.raises(NMTError, match=r"checkpoints/index\.json: not the index nmt writes: .*restore it"):
            read()
    assert m.index_path.read_text() == index


def test_a_missing_index_is_a_run_not_validated_yet(tmp_path):
    m = checkpoint.CheckpointManager(tmp_path / "checkpoints", keep_last=2, keep_best=1)
    assert m.read_index() == {"best": []} and checkpoint_index.last_state_recorded(m.directory) is None
    m.save_state(payload(2.0), 2)
    assert m.read_index() == {"best": [], "last_state": 2}


@pytest.mark.parametrize("entry", ["optimizer", "progress", "rng"])
def test_a_training_state_without_what_a_resume_reads_is_passed_over(tmp_path, entry):
    # a resume from it ended in a KeyError traceback
    m = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=1)
    m.save_state(payload(1.0), 1)
    m.save_state({key: value for key, value in payload(2.0).items() if key != entry}, 2)
    warnings = []
    path, state = m.load_latest_state(warnings.append)
    assert path.name == "update_00000001.pt" and state["progress"]["update"] == 1
    assert warnings == [
        f"{tmp_path / 'update_00000002.pt'}: not a training state nmt can resume (no '{entry}' mapping); "
        "trying an older checkpoint"
    ]


def test_training_s_earlier_average_a_kill_left_unnamed_is_removed_when_the_writer_starts(tmp_path, monkeypatch):
    # A run averaged 2 checkpoints, trained on and averaged 3: the index names average_last_3.pt before
    # average_last_2.pt is deleted, and a kill between the two left training's file, named nowhere, for
    # good. One made with 'nmt average' and no longer named is the user's, and stays.
    m = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=1)
    m.save_best(payload(5.0), 5, score=40.0)
    m.save_average(payload(1.0), "average_last_4.pt", 30.0, [1, 2, 3, 4])  # by hand
    m.save_average(payload(2.0), "average_last_2.pt", 35.0, [4, 5], by_training=True)

    def killed(path):
        raise KeyboardInterrupt  # where the process died

    monkeypatch.setattr(checkpoint, "_remove", killed)
    with pytest.raises(KeyboardInterrupt):
        m.save_average(payload(3.0), "average_last_3.pt", 36.0, [5, 6, 7], by_training=True)
    monkeypatch.undo()
    assert (tmp_path / "average_last_2.pt").exists()
    assert m.average_path() == (tmp_path / "average_last_3.pt", 36.0)

    resumed = checkpoint.CheckpointManager(tmp_path, keep_last=3, keep_best=1)  # the resumed run's
    averages = ["average_last_3.pt", "average_last_3.pt.sha256", "average_last_4.pt", "average_last_4.pt.sha256"]
    assert sorted(p.name for p in tmp_path.glob("average_*")) == averages
    assert resumed.average_path() == (tmp_path / "average_last_3.pt", 36.0)
    assert "retired" not in resumed.read_index()
