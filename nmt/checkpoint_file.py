"""A checkpoint file: written so that it survives crashes, never executing code on load.

A checkpoint is written with ``files.atomic_write``, so a crash at any moment leaves either
the old file or the new one, complete.
A SHA-256 sidecar detects later truncation or corruption. Loading uses
``torch.load(weights_only=True)``: tensors and plain containers only, never pickled objects.
The directory of a run's checkpoints and its index are ``nmt.checkpoint``'s.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path
from typing import Any

import torch

from nmt import files, testhooks
from nmt.errors import NMTError

FORMAT = "nmt-checkpoint-1"


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


def mapped_entry(path: Path, key: str) -> dict | None:
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
    model = mapped_entry(path, "model")
    if model is None:
        return None
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.values()}
    return sum(storages.values())
