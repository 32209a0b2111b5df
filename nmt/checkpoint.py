"""Checkpoints that survive crashes and never execute code on load.

A checkpoint is written with ``files.atomic_write``, so a crash at any moment leaves either
the old file or the new one, complete.
A SHA-256 sidecar detects later truncation or corruption. Loading uses
``torch.load(weights_only=True)``: tensors and plain containers only, never pickled objects.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt import files, testhooks
from nmt.errors import NMTError
from nmt.saved_numbers import is_number, is_whole_number

FORMAT = "nmt-checkpoint-1"
_UPDATE_RE = re.compile(r"^(update|best)_(\d{8})\.pt$")  # average_*.pt files are named in index.json


class CheckpointNotWritten(NMTError):
    """A checkpoint file (or its index or checksum) the system refused to write; ``path`` was left as
    it was. ``storage``: the storage refused it (full, over quota, read-only, failing), so that
    freeing space and resuming helps."""

    def __init__(self, path: Path, reason: str, storage: bool):
        super().__init__(f"{path}: could not write checkpoint ({reason}); what was there before is intact")
        self.path, self.reason, self.storage = path, reason, storage


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old content or the new, never a mix."""
    try:
        files.atomic_write_bytes(path, data, before_rename=testhooks.checkpoint_before_rename)
    except OSError as e:
        raise CheckpointNotWritten(path, str(e.strerror or e), files.storage_error(e)) from None


def non_finite_tensors(state_dict: dict) -> list[str]:
    """Names of floating-point tensors holding NaN or inf."""
    return [
        name
        for name, t in state_dict.items()
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]


def save(payload: dict, path: Path) -> None:
    """Serialise ``payload`` (tensors and plain containers) atomically, with a SHA-256 sidecar.

    A model with non-finite weights is never written: it would poison every later resume.
    """
    bad = non_finite_tensors(payload.get("model", {}))
    if bad:
        raise NMTError(f"{path}: not written: the model has non-finite weights ({', '.join(bad[:3])})")
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **payload}, buffer)
    data = buffer.getvalue()
    sidecar = path.with_name(path.name + ".sha256")
    # The old file's digest goes first: a crash or a full disk between the two writes then leaves a
    # file without a digest (loaded unverified), not a good file that its old digest calls corrupted.
    sidecar.unlink(missing_ok=True)
    atomic_write_bytes(path, data)
    atomic_write_bytes(sidecar, hashlib.sha256(data).hexdigest().encode())


def recorded_digest(path: Path) -> str | None:
    """The SHA-256 of ``path`` its sidecar records (``save`` writes one), or None where there is none."""
    try:
        return path.with_name(path.name + ".sha256").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


class CheckpointGone(NMTError):
    """The checkpoint file is not there (any more): a trainer keeping fewer deleted it, say."""


_READ_ATTEMPTS = 20  # a trainer rewrites a file in milliseconds: more than this many in one read is no race


def _sidecar_digest(path: Path) -> str | None:
    """The digest in ``path``'s sidecar, or None where it has none (not written yet, or just removed)."""
    sidecar = path.with_name(path.name + ".sha256")
    try:
        return sidecar.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or e
        raise NMTError(f"{sidecar}: cannot read the checkpoint's checksum ({reason})") from None


def _read_with_digest(path: Path) -> tuple[bytes, str | None]:
    """The bytes of ``path`` and the digest its sidecar records for exactly those bytes (None: no sidecar).

    A trainer may write the file again (``save``: old digest removed, file replaced, new digest
    written) or remove it (file, then digest) as it is read: the digest is read before and after
    the file, and only one that did not change in between belongs to the bytes read."""
    for _ in range(_READ_ATTEMPTS):
        before = _sidecar_digest(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointGone(f"{path}: cannot read checkpoint (No such file or directory)") from None
        except OSError as e:
            raise NMTError(f"{path}: cannot read checkpoint ({e.strerror or e})") from None
        after = _sidecar_digest(path)
        if before == after:
            return data, after
    raise NMTError(f"{path}: checkpoint is being written again and again as it is read; try again")


def load(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """Load and verify a checkpoint; any problem is an NMTError naming the file (``CheckpointGone``
    where the file is not there)."""
    data, expected = _read_with_digest(path)
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise NMTError(f"{path}: checkpoint is corrupted or truncated (checksum mismatch)")
    if not zipfile.is_zipfile(io.BytesIO(data)):  # torch.save writes a zip archive
        raise NMTError(f"{path}: not a checkpoint (not a PyTorch archive); the file is damaged or another kind of file")
    try:
        payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        text = str(e)
        if "Weights only load failed" in text or "Unsupported global" in text or "UnpicklingError" in type(e).__name__:
            raise NMTError(
                f"{path}: refused: the file holds Python objects, not just tensors (unsafe to load)"
            ) from None
        raise NMTError(f"{path}: checkpoint is unreadable ({type(e).__name__}); it may be truncated") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise NMTError(f"{path}: not an nmt checkpoint")
    _check_model_weights(path, payload.get("model"))
    return payload


def _check_model_weights(path: Path, model: Any) -> None:
    """Refuse weights no nmt run writes (``save`` never writes non-finite ones): a missing or
    malformed ``model`` failed later in a KeyError, and NaN weights translated every line into
    no hypothesis at all, an IndexError."""
    if not isinstance(model, dict) or not model:
        raise NMTError(f"{path}: not an nmt checkpoint (it holds no model weights)")
    if not all(isinstance(name, str) and isinstance(t, torch.Tensor) for name, t in model.items()):
        raise NMTError(f"{path}: not an nmt checkpoint (its model weights are not all named tensors)")
    bad = non_finite_tensors(model)
    if bad:
        raise NMTError(f"{path}: the model has non-finite weights ({', '.join(bad[:3])}); use another checkpoint")


def _mapped_entry(path: Path, key: str) -> dict | None:
    """Entry ``key`` of checkpoint ``path``, a dict, its tensors memory-mapped, not read (unverified:
    for a glance before ``load``); None where the file cannot be read so or holds no such dict."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - torch raises many types for bad files
        return None
    entry = state.get(key) if isinstance(state, dict) else None
    return entry if isinstance(entry, dict) else None


def model_bytes(path: Path) -> int | None:
    """The bytes the model's tensors in checkpoint ``path`` take once loaded (a tied tensor once),
    memory-mapped, not read; None where the file cannot be read so (``load`` then says why)."""
    model = _mapped_entry(path, "model")
    if model is None:
        return None
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.values()}
    return sum(storages.values())


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


def _index_entry_ok(entry: Any) -> bool:
    """A best or average entry: a file name in the checkpoint directory (never a path out of it) and a score."""
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not is_number(entry.get("score")):
        return False
    name = entry["file"]
    loss = entry.get("loss")
    return name not in ("", ".", "..") and "/" not in name and (loss is None or is_number(loss))


def _index_shape_ok(index: Any) -> bool:
    """Whether ``index`` has the shape ``CheckpointManager`` writes: the readers index into it."""
    if not isinstance(index, dict):
        return False
    best, average, last = index.get("best", []), index.get("average"), index.get("last_state")
    if not isinstance(best, list) or not all(map(_index_entry_ok, best)):
        return False
    if average not in (None, {}) and not _index_entry_ok(average):
        return False
    return last is None or is_whole_number(last)


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

    def read_index(self) -> dict:
        """The index as written; one that does not parse or is not of the shape written here (edited
        by hand, another program's file) is read as none, and the checkpoints' names speak instead."""
        try:
            index = json.loads(self.index_path.read_text())
        except (OSError, ValueError):
            return {"best": []}
        return index if _index_shape_ok(index) else {"best": []}

    def save_state(self, payload: dict, update: int) -> Path:
        path = self.directory / f"update_{update:08d}.pt"
        save(payload, path)
        # Recorded where it outlives the file: a run whose update_*.pt are gone is not taken for a new one.
        index = self.read_index()
        atomic_write_bytes(self.index_path, json.dumps({**index, "last_state": update}, indent=1).encode())
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
            atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        self._remove_unlisted_best(index)

    def _remove_unlisted_best(self, index: dict) -> None:
        """Delete the best checkpoints ``index`` (as written) does not name: the ones it dropped, and
        any a process killed between writing the index and deleting them left behind, which nothing
        would delete later. Not where it names none (unreadable, or no validation yet): its files
        are then all the run has."""
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
        save(payload, self.directory / name)
        best = sorted(best + [entry], key=_rank, reverse=True)
        index = {**index, "best": best[: self.keep_best]}
        atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        self._remove_unlisted_best(index)
        return True

    def save_average(
        self, payload: dict, name: str, score: float, updates: list[int], by_training: bool = False
    ) -> Path:
        """An averaged model (``nmt.average``), recorded in the index with its dev score. One made at the
        end of training (``by_training``) replaces the one training made before, whatever its name
        (a run that averaged fewer checkpoints than ``train.average_last`` and trained on); one made
        with ``nmt average`` is kept, to be chosen by name."""
        path = self.directory / name
        index = self.read_index()
        before = index.get("average") or {}
        if before.get("file") == name:
            # Written again under its name: the index stops naming it first, so a kill before the new
            # entry is written leaves no average recorded, not the old one's score and updates on new weights.
            index = {key: value for key, value in index.items() if key != "average"}
            atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        save(payload, path)
        index["average"] = {"file": name, "score": score, "updates": updates, "by_training": by_training}
        atomic_write_bytes(self.index_path, json.dumps(index, indent=1).encode())
        if by_training and before.get("by_training") and before.get("file") not in (None, name):
            _remove(self.directory / before["file"])
        return path

    def best_path(self) -> Path | None:
        """The best single checkpoint (the index is kept in ``best_rank`` order)."""
        for b in self.read_index().get("best", []):
            path = self.directory / b["file"]
            if path.exists():
                return path
        found = list_checkpoints(self.directory, "best")
        return found[0].path if found else None

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
        single checkpoint's, else the best single one."""
        best, average = self.best_path(), self.average_path()
        if average is not None and (best is None or average[1] > self.best_score()):
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
                state = load(info.path)
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
    hand or by another program: ``save`` writes every entry, each of its type and shape)."""
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
    return _mapped_entry(path, "progress") or {}


def last_state_recorded(directory: Path) -> int | None:
    """The update of the newest training state the run's index.json records as written (the file
    may be gone since), or None: none written yet, or by an earlier version that did not record it."""
    try:
        update = json.loads((directory / "index.json").read_text()).get("last_state")
    except (OSError, ValueError, AttributeError):
        return None
    return update if isinstance(update, int) else None


def rng_state(on_cuda: bool = False) -> dict[str, Any]:
    """The random state to save: Python's and torch's CPU generator, and with ``on_cuda`` (a run that
    computes on a GPU) the GPUs'. Reading a GPU's state initialises CUDA: a CPU run on a machine with
    a GPU would take GPU memory for it, and fail where another job holds the GPU."""
    import random

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if on_cuda:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def rng_state_problem(state: dict[str, Any]) -> str | None:
    """What in a saved random state ``set_rng_state`` could not put back, in words, or None. Each part
    is tried on a generator of its own, so that the process's are left as they are."""
    import random

    python, cpu, gpus = state.get("python"), state.get("torch"), state.get("cuda", [])
    try:
        version, internal, gauss = python
        random.Random().setstate((version, tuple(internal), gauss))
        if gauss is not None and not isinstance(gauss, float):
            raise TypeError("gauss")
    except (TypeError, ValueError, OverflowError):
        return "rng.python is not a Python random state"
    try:
        if not isinstance(cpu, torch.Tensor):
            raise TypeError("torch")
        torch.Generator().set_state(cpu)
    except (TypeError, RuntimeError):
        return "rng.torch is not a torch random state"
    if not isinstance(gpus, (list, tuple)) or not all(
        isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 for t in gpus
    ):
        return "rng.cuda is not a list of GPU random states"
    return None


def set_rng_state(state: dict[str, Any], on_cuda: bool = False) -> None:
    """Put back a state ``rng_state`` returned; the GPUs' part only with ``on_cuda`` (a run computing on
    a GPU): a CPU run resumed from a GPU run's checkpoint would otherwise initialise CUDA for nothing,
    and fail where another job holds the GPU."""
    import random

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if on_cuda and "cuda" in state and torch.cuda.is_available():
        # One state per GPU the saving process saw: a run saved where more were visible (8 ranks,
        # resumed with 4 on another machine) holds states for devices not here, which torch refuses.
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])
