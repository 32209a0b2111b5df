"""A run's ``checkpoints/index.json``: the best checkpoints with their dev scores, the averaged model,
the newest training state written and the averages retired (``nmt.checkpoint.CheckpointManager``
writes it). Read here, checked for the shape written, and where it is lost or damaged an error
naming it: no other file holds the dev scores it ranks the best checkpoints by.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nmt.errors import NMTError
from nmt.saved_numbers import is_number, is_whole_number


def _index_entry_ok(entry: Any) -> bool:
    """A best or average entry: a file name in the checkpoint directory (never a path out of it) and a score."""
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not is_number(entry.get("score")):
        return False
    name = entry["file"]
    loss = entry.get("loss")
    return name not in ("", ".", "..") and "/" not in name and (loss is None or is_number(loss))


def _index_shape_problem(index: Any) -> str | None:
    """What in ``index`` is not of the shape ``CheckpointManager`` writes (the readers index into it),
    in words, or None."""
    if not isinstance(index, dict):
        return "not a mapping"
    best, average, last = index.get("best", []), index.get("average"), index.get("last_state")
    retired = index.get("retired", [])
    if not isinstance(best, list) or not all(map(_index_entry_ok, best)):
        return "'best' is not a list of checkpoint files with their scores"
    if average not in (None, {}) and not _index_entry_ok(average):
        return "'average' is not a checkpoint file with its score"
    if last is not None and not is_whole_number(last):
        return "'last_state' is not an update number"
    if not isinstance(retired, list) or not all(map(average_file_name, retired)):
        return "'retired' is not a list of average file names"
    return None


def average_file_name(name: Any) -> bool:
    """A name training gives its averages (``average_last_K.pt``), in the checkpoint directory."""
    return isinstance(name, str) and "/" not in name and name.startswith("average_") and name.endswith(".pt")


def read_index(path: Path) -> dict:
    """A run's ``checkpoints/index.json`` as written; {"best": []} where there is none yet (no
    validation, no training state). One that cannot be read, does not parse or is not of the shape
    written (truncated, edited by hand, another program's) is an error naming it: read as
    none, it sent translate's ``auto`` to another model, and training deleted the best checkpoints
    it no longer named at the next new best. So is one missing beside best checkpoints (deleted,
    left out of a copy of the run), for the same reasons."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        from nmt.checkpoint import list_checkpoints  # here: nmt.checkpoint imports this module

        if list_checkpoints(path.parent, "best"):
            raise NMTError(_missing_index(path)) from None
        return {"best": []}
    except (OSError, UnicodeDecodeError) as e:
        raise NMTError(_corrupt_index(path, f"cannot be read: {getattr(e, 'strerror', None) or e}")) from None
    try:
        index = json.loads(text)
    except ValueError as e:
        raise NMTError(_corrupt_index(path, f"not JSON ({e})")) from None
    problem = _index_shape_problem(index)
    if problem is not None:
        raise NMTError(_corrupt_index(path, f"not the index nmt writes: {problem}"))
    return index


def _corrupt_index(path: Path, why: str) -> str:
    return (
        f"{path}: {why}; it ranks the run's best checkpoints by their dev scores, which no other file holds: "
        + _restore_index(path, "it and the best_*.pt")
    )


def _missing_index(path: Path) -> str:
    return (
        f"{path}: missing beside the run's best checkpoints (best_*.pt), which it ranks by their dev scores "
        "and no other file holds: " + _restore_index(path, "the best_*.pt")
    )


def _restore_index(path: Path, to_move: str) -> str:
    """What to do about an index that is lost: restore it, decode without it, or move ``to_move`` away."""
    return (
        "restore it from a copy of the run (translate and eval-bleu still take --checkpoint last or a file "
        f"name there; to give the ranking up, move {to_move} out of {path.parent})"
    )


def last_state_recorded(directory: Path) -> int | None:
    """The update of the newest training state the run's index.json records as written (the file
    may be gone since), or None: none written yet, or by an earlier version that did not record it.
    An index that cannot be read is an error naming it (``read_index``)."""
    return read_index(directory / "index.json").get("last_state")
