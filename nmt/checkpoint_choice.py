"""Which of a run's checkpoints a command translates with: ``auto`` (the average where its dev
BLEU beats the best single checkpoint's, else the best, else the latest), ``best``, ``last``,
``average`` or a file name in ``checkpoints/``; picked again where the trainer deletes it as it is
read; and the note where it is not the checkpoint 'nmt tune-decode' tuned the run's decoding with.
Only reads the run (``nmt.rundir``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from nmt.config import Config, DecodeConfig
from nmt.errors import NMTError
from nmt.run_config import tuned_checkpoint
from nmt.rundir import RunDir

_CHOICES = ("auto", "best", "last", "average")  # the checkpoints --checkpoint names by role
_PICK_ATTEMPTS = 10  # a trainer deletes one file per validation: more in one pick is no race


def model_checkpoint(run: RunDir, cfg: Config, which: str = "auto") -> Path:
    """The checkpoint to translate with. ``auto``: the averaged model if its dev BLEU beats the
    best single checkpoint's, else the best (``best``), else the latest (``last``); ``average``;
    or a file name in ``checkpoints/``."""
    from nmt import checkpoint

    manager = run.checkpoints(cfg)
    latest = checkpoint.list_checkpoints(run.checkpoint_dir, "update")
    if which == "average":
        found = manager.average_path()
        if found is None:
            make = f"nmt average --model {run.path} --last N"
            raise NMTError(f"{run.path}: no averaged checkpoint: make one with '{make}'")
        return found[0]
    if which == "last":
        path = latest[0].path if latest else None
    elif which in ("auto", "best"):  # the best one ranked first missing is an error naming it (best_path)
        path = manager.model_path() if which == "auto" else manager.best_path()
        path = path or (latest[0].path if latest else None)
    else:
        path = run.checkpoint_dir / which
        if not which or Path(which).name != which or not path.is_file():
            raise NMTError(
                f"--checkpoint {shlex.quote(which)}: no such checkpoint in {run.checkpoint_dir} "
                "(give auto, best, average, last or a file name there)"
            )
    if path is None:
        raise NMTError(f"{run.path}: the run has no checkpoint yet: it is not a finished run")
    return path


def load_model_checkpoint(
    run: RunDir, cfg: Config, which: str = "auto", chosen: Path | None = None
) -> tuple[Path, dict]:
    """The checkpoint ``which`` names (``model_checkpoint``; ``chosen`` where the caller has picked
    it already) and its loaded payload. A run being trained deletes best and training-state
    checkpoints as it writes better and newer ones (``keep_best``, ``keep_last``): one deleted
    after it was picked is picked again, so a reader gets the run's choice as it is now, never an
    error for a file the trainer has just replaced."""
    from nmt.checkpoint_file import CheckpointGone, load

    path = chosen or model_checkpoint(run, cfg, which)
    for _ in range(_PICK_ATTEMPTS):
        try:
            return path, load(path)
        except CheckpointGone:
            if which not in _CHOICES:  # a file named on the command line: no other will do
                writer = run.writer()
                if writer is None:
                    raise
                raise NMTError(
                    f"--checkpoint {which}: {path} was deleted as it was read by the process writing "
                    f"the run ({writer}); 'nmt train' keeps train.keep_best best and train.keep_last newest "
                    "checkpoints: give auto, best, last or average"
                ) from None
        path = model_checkpoint(run, cfg, which)
    return path, load(path)


def retune_note(run: RunDir, loaded: Path, which: str, decode: DecodeConfig, loaded_by: str) -> str | None:
    """A note where ``decode``'s beam size and length penalty are the pair 'nmt tune-decode' chose
    but ``loaded`` (``which``: see ``model_checkpoint``) is not the checkpoint it was tuned with:
    another file (a new best or average of a run trained on), or the same name written again;
    None otherwise. ``loaded_by`` says who loads it ("loaded", "translate loads now")."""
    from nmt.checkpoint_file import recorded_digest

    tuned = tuned_checkpoint(run.tune_decode_path)
    if tuned is None:
        return None
    chosen, tuned_with, digest = tuned
    if (chosen["beam_size"], chosen["length_penalty"]) != (decode.beam_size, decode.length_penalty):
        return None  # a pair of the user's own, from the command line or the config
    now = recorded_digest(loaded)
    rewritten = digest is not None and now is not None and digest != now
    if loaded.name == tuned_with and not rewritten:
        return None
    retune = ["nmt", "tune-decode", "--model", str(run.path)]
    retune += ["--checkpoint", which] if which != "auto" else []
    since = ", written again since" if loaded.name == tuned_with else ""
    return (
        f"note: beam {decode.beam_size}, length penalty {decode.length_penalty} were tuned by 'nmt tune-decode' "
        f"with {tuned_with}; the checkpoint {loaded_by} is {loaded.name}{since}: "
        f"'{shlex.join(retune)}' re-tunes them for it"
    )
