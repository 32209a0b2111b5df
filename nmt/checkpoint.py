"""A run's directory of checkpoints: the last training states and the best models, ``index.json``
recording the best ones' dev scores (``nmt.checkpoint_index``), and which training states validations
wrote. Each file is a checkpoint file (``nmt.checkpoint_file``): atomic, checksummed, loaded as tensors only.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nmt import checkpoint_file
from nmt.checkpoint_index import average_file_name, read_index
from nmt.errors import NMTError
from nmt.saved_numbers import is_whole_number

_UPDATE_RE = re.compile(r"^(update|best)_(\d{8})\.pt$")  # average_*.pt files are named in index.json
_REREADS = 10  # a trainer replaces its best once per validation: more in one read is no race


def best_rank(bleu: float, loss: float | None) -> tuple[float, float]:
    """How validations rank for the best checkpoint and for patience: the higher dev BLEU, and at
    equal BLEU the lower dev loss (early in training BLEU ties at 0 while the loss falls). A loss not
    recorded (an earlier version) ranks as infinite."""
    return bleu, -(math.inf if loss is None else loss)


@dataclass
class CheckpointInfo:
    path: Path
    kind: str  # "update" (full training state) or "best" (model weights for translation)
    update: int


# What in a training state (its file, its content) a resume could not restore, in words; None: nothing.
StateProblem = Callable[[CheckpointInfo, dict], str | None]


def list_checkpoints(directory: Path, kind: str) -> list[CheckpointInfo]:
    """Checkpoints of one kind, newest first."""
    found = []
    if directory.is_dir():
        for p in directory.iterdir():
            m = _UPDATE_RE.match(p.name)
            if m and m.group(1) == kind:
                found.append(CheckpointInfo(p, kind, int(m.group(2))))
    return sorted(found, key=lambda c: c.update, reverse=True)


def _rank(entry: dict) -> tuple[float, float]:
    """``best_rank`` of an index entry."""
    return best_rank(entry["score"], entry.get("loss"))


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".sha256").unlink(missing_ok=True)


class CheckpointManager:
    """Keeps the last K training-state checkpoints and the best N model checkpoints of a run.

    ``index.json`` records the best checkpoints with their dev scores; it is rewritten
    atomically after each new file is complete, and old files are deleted only after that.
    """

    def __init__(self, directory: Path, keep_last: int, keep_best: int, clean: bool = True, create: bool = True):
        self.directory = directory
        self.keep_last = keep_last
        self.keep_best = keep_best
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        self.index_path = directory / "index.json"
        if clean:  # only the process that writes checkpoints may remove temporaries
            for torn in directory.glob(".*.tmp*"):  # temporary files of a process that died mid-write
                torn.unlink(missing_ok=True)
            for digest in directory.glob("*.pt.sha256"):  # a kill between deleting a checkpoint and its digest
                if not digest.with_name(digest.name.removesuffix(".sha256")).exists():
                    digest.unlink(missing_ok=True)
            self._finish_retiring()

    def read_index(self) -> dict:
        """The index as written (``read_index``: an unreadable one is an error naming it)."""
        return read_index(self.index_path)

    def _finish_retiring(self) -> None:
        """Delete the averages training made and the index records as retired (``save_average``): a
        process killed between the index that replaced one and its deletion left it, named nowhere
        else. An index that cannot be read is left to the readers, which name it."""
        try:
            index = self.read_index()
        except NMTError:
            return
        self._remove_retired(index)

    def _remove_retired(self, index: dict) -> None:
        """Delete the files ``index`` (as written) records as retired, then the record."""
        if "retired" not in index:
            return
        for name in index["retired"]:
            _remove(self.directory / name)
        index = {key: value for key, value in index.items() if key != "retired"}
        checkpoint_file.atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())

    def save_state(self, payload: dict, update: int) -> Path:
        path = self.directory / f"update_{update:08d}.pt"
        checkpoint_file.save(payload, path)
        # Recorded where it outlives the file: a run whose update_*.pt are gone is not taken for a new one.
        index = self.read_index()
        checkpoint_file.atomic_write_bytes(
            self.index_path, json.dumps({**index, "last_state": update}, indent=1).encode()
        )
        self._remove_old_states(update, written_by_validation(payload.get("progress", {})))
        self._remove_extra_best()
        return path

    def _remove_extra_best(self) -> None:
        """Best checkpoints past ``keep_best`` (there only where keep_best was lowered on resume, which
        holds from the next state written, as keep_last does, not from the next new best), and those
        the index does not name (``_remove_unlisted_best``)."""
        index = self.read_index()
        best = sorted(index.get("best", []), key=_rank, reverse=True)
        if len(best) > self.keep_best:
            index = {**index, "best": best[: self.keep_best]}
            checkpoint_file.atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        self._remove_unlisted_best(index)

    def _remove_unlisted_best(self, index: dict) -> None:
        """Delete the best checkpoints ``index`` (as written) does not name: the ones it dropped, and
        any a process killed between writing the index and deleting them left behind, which nothing
        would delete later. Not where it names none (no validation yet): its files are then all the run has."""
        listed = {b["file"] for b in index.get("best", [])}
        if not listed:
            return
        for info in list_checkpoints(self.directory, "best"):
            if info.path.name not in listed:
                _remove(info.path)

    def _remove_old_states(self, newest: int, newest_validated: bool) -> None:
        """``keep_last`` counts the states validations wrote, the ones a run left alone has. A state
        written between two validations (a signal, a lost rank, a failed validation) is kept while it
        is the newest, to resume from, and removed once a newer one is written: counted, it pushed a
        validation's state out, which the run left alone keeps and averages (``train.average_last``)."""
        validated = int(newest_validated)
        for old in list_checkpoints(self.directory, "update"):  # newest first
            if old.update == newest:
                continue
            if not written_by_validation(_state_progress(old.path)):
                if old.update < newest:
                    _remove(old.path)
                continue
            validated += 1
            if validated > self.keep_last:
                _remove(old.path)

    def save_best(self, payload: dict, update: int, score: float, loss: float | None = None) -> bool:
        """Save if ``score`` (dev BLEU) and ``loss`` (dev loss) rank among the best N (``best_rank``);
        returns whether it was kept."""
        index = self.read_index()
        name = f"best_{update:08d}.pt"
        # A run resumed from an older state validates again at updates whose best checkpoint the
        # interrupted attempt already wrote: that entry is replaced, never counted twice.
        best = [b for b in index.get("best", []) if b["file"] != name and (self.directory / b["file"]).exists()]
        entry = {"file": name, "score": score, "update": update}
        if loss is not None and math.isfinite(loss):
            entry["loss"] = loss
        if len(best) >= self.keep_best and _rank(entry) <= min(map(_rank, best)):
            return False
        if not self.index_path.exists():
            # The index first: a best_*.pt without one is refused as a run whose index was lost
            # (``read_index``), and a kill between the two writes must leave a run that resumes.
            checkpoint_file.atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        checkpoint_file.save(payload, self.directory / name)
        best = sorted(best + [entry], key=_rank, reverse=True)
        index = {**index, "best": best[: self.keep_best]}
        checkpoint_file.atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        self._remove_unlisted_best(index)
        return True

    def save_average(
        self, payload: dict, name: str, score: float, updates: list[int], by_training: bool = False
    ) -> Path:
        """An averaged model (``nmt.average``), recorded in the index with its dev score. One made at the
        end of training (``by_training``) replaces the one training made before, whatever its name
        (a run that averaged fewer checkpoints than ``train.average_last`` and trained on); one made
        with ``nmt average`` is kept, to be chosen by name. The replaced file is recorded as retired
        by the index that names the new one, and deleted after it: a kill between the two leaves
        the record, and the next writer deletes it (``_finish_retiring``), where by name alone it
        could not tell training's file from one of the user's."""
        path = self.directory / name
        index = self.read_index()
        before = index.get("average") or {}
        if before.get("file") == name:
            # Written again under its name: the index stops naming it first, so a kill before the new
            # entry is written leaves no average recorded, not the old one's score and updates on new weights.
            index = {key: value for key, value in index.items() if key != "average"}
            checkpoint_file.atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        checkpoint_file.save(payload, path)
        index["average"] = {"file": name, "score": score, "updates": updates, "by_training": by_training}
        retired = [file for file in index.get("retired", []) if file != name]
        replaced = before.get("file")
        if by_training and before.get("by_training") and replaced != name and average_file_name(replaced):
            retired.append(replaced)
        index = {key: value for key, value in index.items() if key != "retired"}
        if retired:  # the record outlives the files while they are deleted
            index["retired"] = retired
        checkpoint_file.atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        self._remove_retired(index)
        return path

    def _ranked(self) -> tuple[list[dict], bool]:
        """The best checkpoints the index records, best first (``best_rank``), and whether the first one's
        file is there (True where none is recorded). A file missing is looked for in the index read
        again: a trainer names a new best there before it deletes the one it pushed out."""
        index = self.read_index()
        for _ in range(_REREADS):
            ranked = sorted(index.get("best", []), key=_rank, reverse=True)
            if not ranked or (self.directory / ranked[0]["file"]).exists():
                return ranked, True
            again = self.read_index()
            if again == index:
                break
            index = again
        return ranked, False

    def best_path(self) -> Path | None:
        """The best single checkpoint: the one the index ranks first, or where it records none (a kill
        between the first best_*.pt and its record) the newest best_*.pt. One ranked first but missing is
        an error naming it, though lower ones are kept (``keep_best``): they are not the model ranked."""
        return self._best_of(*self._ranked())

    def _best_of(self, ranked: list[dict], present: bool) -> Path | None:
        if not ranked:
            found = list_checkpoints(self.directory, "best")
            return found[0].path if found else None
        if not present:
            kept = [b["file"] for b in ranked[1:] if (self.directory / b["file"]).exists()]
            take = f"--checkpoint {kept[0]} takes the next best kept; " if kept else ""
            raise NMTError(
                f"{self.directory / ranked[0]['file']}: the run's best checkpoint (recorded in index.json) is "
                f"missing: restore it ({take}translate, eval-bleu and tune-decode also take --checkpoint last, "
                "average or a file name)"
            )
        return self.directory / ranked[0]["file"]

    def missing_best(self) -> Path | None:
        """The best checkpoint the index ranks first where its file is missing (deleted, left out of a copy
        of the run), else None: translation's ``auto`` and ``best`` refuse the run then (``best_path``)."""
        ranked, present = self._ranked()
        return None if present else self.directory / ranked[0]["file"]

    def best_score(self) -> float:
        """The best single checkpoint's dev score (-inf before the first validation)."""
        return max((b["score"] for b in self.read_index().get("best", [])), default=float("-inf"))

    def average_path(self) -> tuple[Path, float] | None:
        """The averaged model and its dev score, if the run has one."""
        entry = self.read_index().get("average")
        if entry and (self.directory / entry["file"]).exists():
            return self.directory / entry["file"], entry["score"]
        return None

    def model_path(self) -> Path | None:
        """What translation uses by default: the averaged model where its dev score beats the best
        single checkpoint's (the one ``best_path`` loads, read from the same index), else that one."""
        ranked, present = self._ranked()
        best, average = self._best_of(ranked, present), self.average_path()
        if average is not None and (not ranked or average[1] > ranked[0]["score"]):
            return average[0]
        return best

    def load_latest_state(
        self, warn: Callable[[str], None], problem: StateProblem | None = None
    ) -> tuple[Path, dict] | None:
        """Newest readable training state and its file; corrupt ones are reported and skipped, and so are
        those in which ``problem`` (the resuming trainer's check of each part) finds something it could
        not restore.

        None for a run without training states. When there are some and none is readable, an error:
        starting over would silently drop the run's progress and mix a new run's best checkpoints
        with the old one's."""
        found = list_checkpoints(self.directory, "update")
        for info in found:
            try:
                state = checkpoint_file.load(info.path)
                _check_training_state(info, state, problem)
                return info.path, state
            except NMTError as e:
                warn(f"{e}; trying an older checkpoint")
        if found:
            raise NMTError(
                f"{self.directory}: none of the run's {len(found)} training-state checkpoints (update_*.pt) is "
                "readable; restore one, or train into a new run_dir to start over"
            )
        return None


# What a resume reads of a training state besides the model, each a mapping (Trainer._resume).
TRAINING_STATE_ENTRIES = ("optimizer", "progress", "rng")


def _check_training_state(info: CheckpointInfo, state: dict, problem: StateProblem | None) -> None:
    """Refuse a state a resume would fail on with a traceback, or restore wrongly (damaged, written by
    hand or by another program: ``Trainer.save`` writes every entry, each of its type and shape)."""
    for key in TRAINING_STATE_ENTRIES:
        if not isinstance(state.get(key), dict):
            raise NMTError(f"{info.path}: not a training state nmt can resume (no '{key}' mapping)")
    found = problem(info, state) if problem is not None else None
    if found is not None:
        raise NMTError(f"{info.path}: not a training state nmt can resume ({found})")


def written_by_validation(progress: dict) -> bool:
    """Whether a training state's ``progress`` was saved by the validation of its update, not by an
    interruption between two validations. One that does not say (an earlier version's), or says it in
    other than update numbers (damaged: its model may still be averaged), counts as one, as an
    unreadable one does."""
    update = progress.get("update")
    validated = progress.get("last_validated", update)
    if not all(map(is_whole_number, (update, validated))):
        return True
    return validated == update


def validation_states(directory: Path) -> list[CheckpointInfo]:
    """The training states validations wrote, newest first: the ones ``keep_last`` counts and
    averaging takes. One a signal wrote between two validations, kept only to resume from, is not."""
    found = list_checkpoints(directory, "update")
    return [info for info in found if written_by_validation(_state_progress(info.path))]


def _state_progress(path: Path) -> dict:
    """The ``progress`` a training state holds, its tensors memory-mapped, not read; {} where the
    file cannot be read (it then counts as a validation's, as every state did before)."""
    return checkpoint_file.mapped_entry(path, "progress") or {}
