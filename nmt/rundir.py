"""The run directory: its layout, who may write what in it, the training lock, and the checks that
its config, tokenizer and checkpoints belong together.

    RUN_DIR/
      config.yaml                 the run's resolved config (every default filled in)
      spm.model | spm.SRC.model, spm.TRG.model    SentencePiece model(s), each with its .vocab and
                                  a .model.json record of what it was made from
      data/train/                 binarized training shards
      checkpoints/                update_N.pt (training state), best_N.pt, index.json
      metrics.jsonl, train.log, dev.hyp, tensorboard/
      train.lock                  held by the one 'nmt train' writing the run

Only the process holding the lock (``nmt train`` / ``nmt prepare``, rank 0 under torchrun) writes,
renames or deletes anything here. Readers (translate, eval-bleu, compare, plot, bench, export)
open a run with ``RunDir.existing`` and only read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from nmt.config import (
    Config,
    CorpusConfig,
    DecodeConfig,
    check_case_folding_scoring,
    config_to_dict,
    config_yaml,
    load_config,
)
from nmt.config_sources import apply_overrides, read_yaml
from nmt.corpus import local_corpus_gone, plain_paths
from nmt.errors import NMTError
from nmt.files import atomic_write_bytes, is_temporary
from nmt.metrics import METRICS_FILE, validations_trained_on
from nmt.synthetic import META_FILE, corpus_directory
from nmt.tensorboard import TENSORBOARD_DIR
from nmt.tokenizer import record_path

CONFIG = "config.yaml"
_CHOICES = ("auto", "best", "last", "average")  # the checkpoints --checkpoint names by role
_PICK_ATTEMPTS = 10  # a trainer deletes one file per validation: more in one pick is no race
_HEADER = "# The resolved config of this run, written by 'nmt train' (every default filled in).\n"

# Sections whose change makes a checkpoint unusable; everything else may change on resume.
_FROZEN_SECTIONS = ("model", "tokenizer")
_FROZEN_DATA_KEYS = ("src_lang", "trg_lang")
# What dev BLEU is measured with: the best checkpoints (keep_best, the averaged model's standing) and the
# patience count compare every validation's score, and scores measured two ways do not compare.
_DEV_SCORE_KEYS = (
    ("decode", "bleu_tokenize"),
    ("decode", "bleu_lowercase"),
    ("train", "validate_beam_size"),
    ("train", "validate_max_sentences"),
)


class RunLock:
    """An advisory lock on ``path`` (flock): held while the process lives, released by the kernel
    when it dies, however it dies, so a stale lock never blocks a resume. On a shared file system
    (NFS) Linux maps flock to the server's byte-range locks, so it excludes other machines too.
    The file names the holder (command, host and pid) for the error a second writer gets."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self, run_dir: Path, warn: Callable[[str], None], command: str = "train") -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX
            warn(f"{run_dir}: cannot lock the run directory on this system; do not train it twice at once")
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise NMTError(
                f"{self.path}: cannot open the run's lock file ({e.strerror}); "
                "this command writes into the run directory and needs write access to it"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, who = _holder_note(os.pread(fd, 512, 0))
            os.close(fd)
            doing = "training" if holder == "nmt train" else "writing"
            raise NMTError(
                f"{run_dir}: another '{holder}' is {doing} this run ({who}); "
                "wait for it to finish or stop it, or use another run_dir"
            ) from None
        except OSError as e:  # a file system without locks
            os.close(fd)
            warn(f"{run_dir}: cannot lock the run directory ({e.strerror}); do not train it twice at once")
            return
        self._fd = fd
        # The command on a line of its own: an earlier version's note is the second line alone.
        holder = f"nmt {command}\nhost {socket.gethostname()}, pid {os.getpid()}, since {time.strftime('%F %T')}\n"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
        except OSError:  # a full disk: the lock holds without the note (the command then says what it cannot write)
            pass

    def holder(self) -> str | None:
        """Who holds the lock now (as its file names them), or None where no process does; takes nothing."""
        try:
            import fcntl

            fd = os.open(self.path, os.O_RDONLY)
        except (ImportError, OSError):  # not POSIX, or never locked
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as the file closes
        except BlockingIOError:
            holder, who = _holder_note(os.pread(fd, 512, 0))
            return f"'{holder}', {who}"
        except OSError:  # a file system without locks
            return None
        finally:
            os.close(fd)
        return None

    def release(self) -> None:
        """Unlock; the file stays (removing it would let two processes lock different files)."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:  # a read-only remount: the holder's note stays, the lock goes
                pass
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def config_differences(old: Config, new: Config, sections: tuple[str, ...], data_keys: tuple[str, ...]) -> list[str]:
    """'section.key: old -> new' for every key of ``sections`` and ``data.<data_keys>`` that differs."""
    a, b = config_to_dict(old), config_to_dict(new)
    diffs = []
    for section in sections:
        for key in sorted(set(a[section]) | set(b[section])):
            if a[section].get(key) != b[section].get(key):
                diffs.append(f"{section}.{key}: {a[section].get(key)!r} -> {b[section].get(key)!r}")
    for key in data_keys:
        if a["data"][key] != b["data"][key]:
            diffs.append(f"data.{key}: {a['data'][key]!r} -> {b['data'][key]!r}")
    return diffs


def check_resumable(old: Config, new: Config) -> None:
    """Refuse a config whose model or vocabulary differs from the one the run was trained with, or
    that measures dev BLEU otherwise than the validations the run has ranked."""
    diffs = config_differences(old, new, _FROZEN_SECTIONS, _FROZEN_DATA_KEYS)
    if diffs:
        raise NMTError(
            "cannot resume: the config changed what the checkpoint was trained with ("
            + "; ".join(diffs)
            + "); use a new run_dir"
        )
    a, b = config_to_dict(old), config_to_dict(new)
    scoring = [
        f"{section}.{key}: {a[section][key]!r} -> {b[section][key]!r}"
        for section, key in _DEV_SCORE_KEYS
        if a[section][key] != b[section][key]
    ]
    if scoring:
        raise NMTError(
            "cannot resume: the config changed how dev BLEU is measured ("
            + "; ".join(scoring)
            + "), and the run's best checkpoints and patience count rank scores measured the old way: "
            "resume with the old value, or use a new run_dir"
        )


def _check_new_run_scoring(cfg: Config, config_file: Path | None) -> None:
    """``check_case_folding_scoring`` for a run that has ranked no scores yet, naming the config file."""
    try:
        check_case_folding_scoring(cfg)
    except NMTError as e:
        if config_file is None:
            raise
        raise NMTError(f"{config_file}: {e}") from None


def check_saved_corpora(
    cfg: Config, config_file: Path, splits: tuple[str, ...], fix: str = "", overrides: list[str] | None = None
) -> None:
    """Refuse, saying how to give their new place, the corpora of ``splits`` that a run's saved
    config.yaml (``config_file``) names by absolute path where nothing is now: the project was
    moved, or copied to another machine. ``fix`` is the command to give it to (empty: the one run now,
    whose ``--set`` may be added). A corpus path among the command line's ``overrides`` is the
    user's own, as is any other config's missing corpus: for the reader to report.

    With data.synthetic the corpus is written into data.train's directory before it is read: there
    only where that directory holds its meta.json (a generation to complete), else it would be
    written again at a place the user no longer works in (the project moved)."""
    if not _written_by_nmt(config_file):
        return
    try:
        saved = read_yaml(config_file).get("data")
    except NMTError:
        return
    if not isinstance(saved, dict):
        return
    d = cfg.data
    given = apply_overrides({}, overrides or [])
    gone = []
    for split in ("train", "dev", "test"):
        spec: CorpusConfig | None = getattr(d, split)
        path_key = f"data.{split}.path"
        if spec is None or any(path_key == key or path_key.startswith(key + ".") for key in given):
            continue  # given on the command line (itself, or within a section given whole)
        named_there = isinstance(saved.get(split), dict) and saved[split].get("path") == spec.path
        if named_there and local_corpus_gone(spec, d.src_lang, d.trg_lang) and not _synthetic_under_way(cfg, spec):
            gone.append(split)
    needed = [split for split in gone if split in splits]
    if not needed:
        return
    sets = " ".join(f"--set data.{s}.path=NEW_DIR/{Path(getattr(d, s).path).name}" for s in gone)
    where = f"with '{fix} {sets}'" if fix else f"with {sets}"
    missing = (
        f"{config_file}: config key 'data.{needed[0]}.path': no corpus at {getattr(d, needed[0]).path}, "
        "which this run's saved config names by absolute path"
    )
    if d.synthetic:
        raise NMTError(
            f"{missing}, and data.synthetic writes it only where a config or --set names it anew: give the "
            f"synthetic corpus's new place, or where to write it, {where}"
        )
    raise NMTError(f"{missing}: if the data moved, give its new place {where}")


def _synthetic_under_way(cfg: Config, spec: CorpusConfig) -> bool:
    """Whether data.synthetic completes ``spec`` where it is: it lies in the corpus directory, which
    holds the meta.json a generation cut off midway leaves."""
    if not cfg.data.synthetic:
        return False
    directory = corpus_directory(cfg.data.train.path)
    return Path(spec.path).parent == directory and (directory / META_FILE).is_file()


def _tune_report(report: Path) -> dict | None:
    """A tune_decode.json as written, or None where there is none (or none readable)."""
    try:
        tuned = json.loads(report.read_text())
    except (OSError, ValueError):  # never tuned
        return None
    return tuned if isinstance(tuned, dict) else None


def tuned_decode_report(report: Path) -> tuple[dict, dict] | None:
    """The "chosen" and "before" decoding of a tune_decode.json, or None where there is none."""
    return _chosen_and_before(_tune_report(report) or {})


def _chosen_and_before(tuned: dict) -> tuple[dict, dict] | None:
    try:
        chosen, before = dict(tuned["chosen"]), dict(tuned["before"])
    except (KeyError, TypeError, ValueError):  # never tuned, or by a version without "before"
        return None
    if not all(key in pair for pair in (chosen, before) for key in ("beam_size", "length_penalty")):
        return None
    return chosen, before


def tuned_checkpoint(report: Path) -> tuple[dict, str, str | None] | None:
    """The "chosen" pair of a tune_decode.json, the checkpoint it was tuned with and that file's
    SHA-256 as tuning found it; None where the report names no checkpoint (never tuned, or by an
    earlier version)."""
    recorded = _tune_report(report) or {}
    tuned, name, digest = _chosen_and_before(recorded), recorded.get("checkpoint"), recorded.get("checkpoint_sha256")
    if tuned is None or not isinstance(name, str):
        return None
    return tuned[0], name, digest if isinstance(digest, str) else None


def kept_tuned_decode(new: Config, saved: Config, report: Path, log: Callable[[str], None]) -> Config:
    """``new``, but with the beam size and length penalty 'nmt tune-decode' chose (its ``report``,
    tune_decode.json) where ``new`` only repeats the values they replaced: resuming with the config
    the run started from keeps the tuned decoding. A value of its own replaces them, with a warning, and so
    does a ``decode.nbest`` above the tuned beam (that pair would be an invalid config)."""
    tuned = tuned_decode_report(report)
    if tuned is None:
        return new
    chosen, before = tuned
    keys = ("beam_size", "length_penalty")
    now = {k: getattr(new.decode, k) for k in keys}
    in_force = {k: getattr(saved.decode, k) for k in keys}
    if in_force != {k: chosen[k] for k in keys} or now == in_force:
        return new
    if now == {k: before[k] for k in keys}:
        if new.decode.nbest > in_force["beam_size"]:  # the tuned beam cannot give this config's n-best lists
            log(
                f"warning: keeping the config's decode beam {now['beam_size']}, length penalty "
                f"{now['length_penalty']}, not what 'nmt tune-decode' chose ({in_force['beam_size']}, "
                f"{in_force['length_penalty']}): its decode.nbest {new.decode.nbest} is more than that beam"
            )
            return new
        tuned_text = f"beam {chosen['beam_size']}, length penalty {chosen['length_penalty']}"
        log(f"decode: keeping {tuned_text} ('nmt tune-decode')")
        return replace(new, decode=replace(new.decode, **in_force))
    log(
        f"warning: the config's decode beam {now['beam_size']}, length penalty {now['length_penalty']} replaces "
        f"what 'nmt tune-decode' chose ({in_force['beam_size']}, {in_force['length_penalty']}); run it again to re-tune"
    )
    return new


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_SETTING_TYPES = (str, int, float, bool, type(None))  # what a config's model section holds


def fingerprint_problem(recorded: object) -> str | None:
    """What in a checkpoint's ``fingerprint`` is not of the shape ``RunDir.fingerprint`` writes (the
    model section's settings, the SentencePiece models' digests), in words, or None. One without a
    fingerprint (an earlier version's) is matched by the shapes of its weights alone."""
    if recorded is None:
        return None
    if not isinstance(recorded, dict):
        return "fingerprint is not a mapping"
    model, tokenizer = recorded.get("model"), recorded.get("tokenizer")
    if not isinstance(model, dict) or not all(
        isinstance(key, str) and isinstance(value, _SETTING_TYPES) for key, value in model.items()
    ):
        return "fingerprint.model is not a mapping of the model's settings"
    if not isinstance(tokenizer, dict) or not all(
        isinstance(name, str) and isinstance(digest, str) for name, digest in tokenizer.items()
    ):
        return "fingerprint.tokenizer is not a mapping of SentencePiece models to their digests"
    return None


class RunDir:
    """One run directory. ``RunDir(path)`` names it; ``existing`` opens a finished or running run
    for reading; ``open_for_training`` makes the calling process its one writer."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = RunLock(self.path / "train.lock")
        self.writable = False

    # -- layout

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def train_data_dir(self) -> Path:
        return self.path / "data" / "train"

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def log_path(self) -> Path:
        return self.path / "train.log"

    @property
    def dev_hyp_path(self) -> Path:
        return self.path / "dev.hyp"

    @property
    def tune_decode_path(self) -> Path:
        return self.path / "tune_decode.json"

    @property
    def kernels_path(self) -> Path:
        """What ``auto`` chose when the run last started (``autotune.choose``'s ``run_record``)."""
        return self.path / "kernels.json"

    def tokenizer_paths(self, cfg: Config) -> tuple[Path, Path]:
        """The SentencePiece model file(s): one joint ``spm.model``, or one per language."""
        if cfg.tokenizer.joint:
            return self.path / "spm.model", self.path / "spm.model"
        return self.path / f"spm.{cfg.data.src_lang}.model", self.path / f"spm.{cfg.data.trg_lang}.model"

    def __str__(self) -> str:
        return str(self.path)

    # -- reading

    @classmethod
    def existing(cls, path: str | Path) -> RunDir:
        """A run directory that 'nmt train' made; a one-line error for anything else."""
        run = cls(path)
        if not run.path.exists():
            raise NMTError(f"{run.path}: no such run directory")
        if not run.path.is_dir():
            raise NMTError(f"{run.path}: is not a directory (expected a run directory made by 'nmt train')")
        if not run.config_path.exists():
            raise NMTError(f"{run.path}: not a run directory (no {CONFIG}): train one with 'nmt train --config FILE'")
        return run

    def config(self) -> Config:
        """The run's config, to use what it trained: a training setting an earlier version accepted
        and this one refuses (``train.attention: sdpa`` on an RNN) does not stop it; resuming with
        it as ``--config`` still checks it."""
        return load_config(self.config_path, training=False)

    def config_reading(self, *splits: str) -> Config:
        """The run's config, for a command that reads its corpora ``splits`` (see ``check_saved_corpora``)."""
        cfg = self.config()
        check_saved_corpora(cfg, self.config_path, splits, f"nmt prepare --config {shlex.quote(str(self.config_path))}")
        return cfg

    def checkpoints(self, cfg: Config):
        """The run's checkpoints; only the writer may clean up after a process that died mid-write."""
        from nmt.checkpoint import CheckpointManager

        return CheckpointManager(
            self.checkpoint_dir, cfg.train.keep_last, cfg.train.keep_best, clean=self.writable, create=self.writable
        )

    def model_checkpoint(self, cfg: Config, which: str = "auto") -> Path:
        """The checkpoint to translate with. ``auto``: the averaged model if its dev BLEU beats the
        best single checkpoint's, else the best (``best``), else the latest (``last``); ``average``;
        or a file name in ``checkpoints/``."""
        from nmt import checkpoint

        manager = self.checkpoints(cfg)
        latest = checkpoint.list_checkpoints(self.checkpoint_dir, "update")
        if which == "average":
            found = manager.average_path()
            if found is None:
                make = f"nmt average --model {self.path} --last N"
                raise NMTError(f"{self.path}: no averaged checkpoint: make one with '{make}'")
            return found[0]
        if which == "last":
            path = latest[0].path if latest else None
        elif which in ("auto", "best"):
            recorded = manager.read_index().get("best", [])
            if recorded and manager.best_path() is None:  # deleted, or left out of a copy of the run
                raise NMTError(
                    f"{self.checkpoint_dir / recorded[0]['file']}: the run's best checkpoint (recorded in "
                    "index.json) is missing: restore it (translate, eval-bleu and tune-decode also take "
                    "--checkpoint last, average or a file name)"
                )
            path = manager.model_path() if which == "auto" else manager.best_path()
            path = path or (latest[0].path if latest else None)
        else:
            path = self.checkpoint_dir / which
            if not which or Path(which).name != which or not path.is_file():
                raise NMTError(
                    f"--checkpoint {shlex.quote(which)}: no such checkpoint in {self.checkpoint_dir} "
                    "(give auto, best, average, last or a file name there)"
                )
        if path is None:
            raise NMTError(f"{self.path}: the run has no checkpoint yet: it is not a finished run")
        return path

    def load_model_checkpoint(self, cfg: Config, which: str = "auto", chosen: Path | None = None) -> tuple[Path, dict]:
        """The checkpoint ``which`` names (``model_checkpoint``; ``chosen`` where the caller has picked
        it already) and its loaded payload. A run being trained deletes best and training-state
        checkpoints as it writes better and newer ones (``keep_best``, ``keep_last``): one deleted
        after it was picked is picked again, so a reader gets the run's choice as it is now, never an
        error for a file the trainer has just replaced."""
        from nmt.checkpoint import CheckpointGone, load

        path = chosen or self.model_checkpoint(cfg, which)
        for _ in range(_PICK_ATTEMPTS):
            try:
                return path, load(path)
            except CheckpointGone:
                if which not in _CHOICES:  # a file named on the command line: no other will do
                    writer = self.writer()
                    if writer is None:
                        raise
                    raise NMTError(
                        f"--checkpoint {which}: {path} was deleted as it was read by the process writing "
                        f"the run ({writer}); 'nmt train' keeps train.keep_best best and train.keep_last newest "
                        "checkpoints: give auto, best, last or average"
                    ) from None
            path = self.model_checkpoint(cfg, which)
        return path, load(path)

    def retune_note(self, loaded: Path, which: str, decode: DecodeConfig, loaded_by: str) -> str | None:
        """A note where ``decode``'s beam size and length penalty are the pair 'nmt tune-decode' chose
        but ``loaded`` (``which``: see ``model_checkpoint``) is not the checkpoint it was tuned with:
        another file (a new best or average of a run trained on), or the same name written again;
        None otherwise. ``loaded_by`` says who loads it ("loaded", "translate loads now")."""
        from nmt.checkpoint import recorded_digest

        tuned = tuned_checkpoint(self.tune_decode_path)
        if tuned is None:
            return None
        chosen, tuned_with, digest = tuned
        if (chosen["beam_size"], chosen["length_penalty"]) != (decode.beam_size, decode.length_penalty):
            return None  # a pair of the user's own, from the command line or the config
        now = recorded_digest(loaded)
        rewritten = digest is not None and now is not None and digest != now
        if loaded.name == tuned_with and not rewritten:
            return None
        retune = ["nmt", "tune-decode", "--model", str(self.path)]
        retune += ["--checkpoint", which] if which != "auto" else []
        since = ", written again since" if loaded.name == tuned_with else ""
        return (
            f"note: beam {decode.beam_size}, length penalty {decode.length_penalty} were tuned by 'nmt tune-decode' "
            f"with {tuned_with}; the checkpoint {loaded_by} is {loaded.name}{since}: "
            f"'{shlex.join(retune)}' re-tunes them for it"
        )

    def model_files(self, cfg: Config) -> list[Path]:
        """The files translating with the run reads: no command may write over them."""
        files = [self.config_path, *set(self.tokenizer_paths(cfg))]
        return files + sorted(self.checkpoint_dir.glob("*.pt"))

    def own_directories(self) -> set[Path]:
        """The directories only the run's writers write in, and delete from: data/, checkpoints/, tensorboard/."""
        return {self.train_data_dir.parent, self.checkpoint_dir, self.path / TENSORBOARD_DIR}

    def owned_paths(self, cfg: Config) -> list[Path]:
        """The files and directories (with all they hold) that the run's writers make and keep."""
        tokenizers = sorted(set(self.tokenizer_paths(cfg)))
        return [
            self.config_path,
            *tokenizers,
            *(p.with_suffix(".vocab") for p in tokenizers),  # the pieces and scores, beside the model
            *(record_path(p) for p in tokenizers),
            *sorted(self.own_directories()),
            self.metrics_path,
            self.log_path,
            self.dev_hyp_path,
            self.tune_decode_path,
            self.kernels_path,
            self._lock.path,
        ]

    def check_output(self, output: Path, option: str, cfg: Config) -> None:
        """Refuse an output that is one of the run's own files, lies in one of its directories, or
        is a writer's temporary file: writing it would corrupt the run. A new file in the run
        directory (``RUN_DIR/test.hyp``) is the user's and fine."""
        target, run_real = _real(Path(output)), _real(self.path)
        for owned in self.owned_paths(cfg):
            real = _real(owned)
            if target == real or real in target.parents:
                where = f"is the run's own {real.name}" if target == real else f"lies in the run's own {real.name}/"
                raise NMTError(f"{option} {output}: {where}; writing it would corrupt the run: choose another file")
        if target.parent == run_real and is_temporary(target):
            raise NMTError(f"{option} {output}: is a temporary file of the run being written; choose another file")

    def fingerprint(self, cfg: Config) -> dict:
        """What a checkpoint records of the files it was trained with, to be matched on load."""
        src, trg = self.tokenizer_paths(cfg)
        return {
            "model": config_to_dict(cfg)["model"],
            "tokenizer": {p.name: file_sha256(p) for p in (src, trg) if p.exists()},
        }

    def check_checkpoint(self, path: Path, payload: dict, cfg: Config, model) -> None:
        """Refuse, naming what differs, a checkpoint that does not belong with this run's config.yaml
        and SentencePiece model(s): it would load wrongly or fail with a size mismatch."""
        recorded = payload.get("fingerprint")
        damaged = fingerprint_problem(recorded)
        if damaged is not None:  # written by hand or by another program: what it says cannot be matched
            raise NMTError(f"{path}: the checkpoint is damaged ({damaged}); use another checkpoint")
        where = f"{path}: does not match the run directory's {CONFIG} and SentencePiece model(s)"
        if recorded is not None:
            now = self.fingerprint(cfg)
            for key in sorted(set(recorded["model"]) | set(now["model"])):
                was, is_ = recorded["model"].get(key), now["model"].get(key)
                if was != is_:
                    raise NMTError(f"{where}: model.{key} is {was!r} in the checkpoint, {is_!r} in {CONFIG}")
            for name, digest in recorded["tokenizer"].items():
                if now["tokenizer"].get(name) != digest:
                    raise NMTError(f"{where}: {name} is not the SentencePiece model it was trained with")
        expected = model.state_dict()
        for name, tensor in payload["model"].items():
            if name not in expected:
                raise NMTError(f"{where}: it has a parameter {name} the model of {CONFIG} lacks")
            if tuple(tensor.shape) != tuple(expected[name].shape):
                raise NMTError(
                    f"{where}: {name} has shape {list(tensor.shape)} in the checkpoint, "
                    f"{list(expected[name].shape)} from {CONFIG} and the vocabulary"
                )
        missing = sorted(set(expected) - set(payload["model"]))
        if missing:
            raise NMTError(f"{where}: the checkpoint lacks {missing[0]}")

    # -- writing

    def open_for_training(
        self, cfg: Config, config_file: Path | None, log: Callable[[str], None], command: str = "train"
    ) -> Config:
        """Make this process the run's one writer: create the directory, take the lock, and refuse a
        config that cannot resume the run's checkpoints. The caller records the config
        (``write_config``) once its data is prepared and its checkpoint loaded, so a start that
        fails leaves the run's config.yaml, and the command that resumes it, as they were.

        The config a user wrote is never rewritten: ``run_dir`` may not be the directory of the
        config file given, unless that file is the run's own resolved config (a resume).

        Returns ``cfg``, with the decoding 'nmt tune-decode' chose for the run where ``cfg`` repeats
        what that replaced (``kept_tuned_decode``).
        """
        if config_file is not None and _real(config_file.absolute().parent) == _real(self.path):
            if not _written_by_nmt(config_file):
                raise NMTError(
                    f"{config_file}: run_dir is this config file's own directory; 'nmt train' writes the run's "
                    f"files there ({CONFIG} among them) and never rewrites a config you wrote: "
                    "set run_dir to a directory of its own, e.g. runs/NAME"
                )
            if _real(config_file) != _real(self.config_path):
                # A run's resolved config copied as a template keeps its 'run_dir: .': every copy in one
                # directory would train, and silently resume, the same run there.
                raise NMTError(
                    f"{config_file}: run_dir is this config file's own directory, and the file is not the "
                    f"{CONFIG} of a run there (a run's {CONFIG} copied keeps its 'run_dir: .'): "
                    "set run_dir to a directory of its own, e.g. runs/NAME"
                )
        if not (self.config_path.exists() and self.has_checkpoints()):  # a resume: check_resumable below
            _check_new_run_scoring(cfg, config_file)
        self.check_apart_from_corpora(cfg)
        self.check_apart_from_other_runs()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NMTError(f"{self.path}: cannot create run directory ({e.strerror})") from None
        if not os.access(self.path, os.W_OK):
            raise NMTError(f"{self.path}: run directory is not writable")
        self.lock(log, command)
        if self.config_path.exists():
            if not _written_by_nmt(self.config_path) and not self._is_earlier_run():
                raise NMTError(
                    f"{self.config_path}: exists and was not written by 'nmt train'; move it or choose another run_dir"
                )
            saved = self.config()
            if self.has_checkpoints():  # before the first, any key may change (prepare retrains SentencePiece)
                check_resumable(saved, cfg)
            cfg = kept_tuned_decode(cfg, saved, self.tune_decode_path, log)
        return cfg

    def check_apart_from_corpora(self, cfg: Config) -> None:
        """Refuse a run_dir whose own files or directories would be where a local corpus is read
        (a corpus in RUN_DIR/data/ meets the shards' data/train/), or that lies in a corpus's
        directory: the run would write into data other runs may share, before it fails on it."""
        run_real = _real(self.path)
        # By real path (a symlinked run or data directory), named as in the layout.
        directories = self.own_directories()
        owned = {
            _real(p): f"{p.relative_to(self.path)}{'/' if p in directories else ''}" for p in self.owned_paths(cfg)
        }
        for split in ("train", "dev", "test"):
            spec: CorpusConfig | None = getattr(cfg.data, split)
            if spec is None or not spec.path or not os.path.isabs(spec.path):
                continue  # a hub dataset by name has no files here
            corpus = _real(Path(spec.path))
            where = f"config key 'run_dir': {self.path}"
            if corpus == run_real or corpus in run_real.parents:  # a directory there is read as a dataset
                raise NMTError(
                    f"{where} is or lies in data.{split}'s corpus path {spec.path}: choose a run_dir outside it"
                )
            langs = (cfg.data.src_lang, cfg.data.trg_lang)
            read = [corpus, *(p for lang in langs for p in plain_paths(str(corpus), lang))]
            for path in read:
                for mine, name in owned.items():
                    if path == mine or mine in path.parents:
                        raise NMTError(
                            f"{where}: the run's own {name} would be data.{split}'s corpus "
                            f"{path}; choose a run_dir apart from the data (e.g. runs/NAME)"
                        )

    def check_apart_from_other_runs(self) -> None:
        """Refuse a run_dir that is or lies in another run's data/, checkpoints/ or tensorboard/: that
        run writes and deletes files there as its own (a nested run's files were lost with its shards)."""
        run_real = _real(self.path)
        for inside in (run_real, *run_real.parents):
            other = RunDir(inside.parent)
            # Every writer of a run takes its lock first, and the lock file stays.
            if inside in other.own_directories() and other._lock.path.is_file():
                where = "is" if inside == run_real else "lies in"
                raise NMTError(
                    f"config key 'run_dir': {self.path} {where} the run {other.path}'s own {inside.name}/ "
                    "(only that run writes there): choose a run_dir apart from it (e.g. runs/NAME)"
                )

    def check_not_starting_over(self) -> None:
        """Refuse to train from update 0 a run that has written training states but holds none now
        (update_*.pt deleted, to save disk say): a second history would be mixed with the first's best
        checkpoints, index and metrics. A first start that failed before its first training state
        (even while writing it, after its best checkpoint) starts again, as before."""
        from nmt.checkpoint import last_state_recorded, list_checkpoints

        if list_checkpoints(self.checkpoint_dir, "update"):
            return  # resumed from, or refused by load_latest_state where none is readable
        recorded = last_state_recorded(self.checkpoint_dir)
        averaged = sorted(p.name for p in self.checkpoint_dir.glob("average_*.pt"))
        validations, trained_on = validations_trained_on(self.metrics_path)
        if recorded is None and not averaged and not trained_on:
            return
        found = []
        models = sorted(p.name for p in self.checkpoint_dir.glob("*.pt"))
        if models:
            more = f" and {len(models) - 2} more" if len(models) > 2 else ""
            found.append(f"checkpoints/{', '.join(models[:2])}{more}")
        if recorded is not None:
            found.append(f"checkpoints/index.json, which records one at update {recorded}")
        if validations:
            found.append(f"{validations} validation{'s' if validations > 1 else ''} in {METRICS_FILE}")
        raise NMTError(
            f"{self.path}: no training-state checkpoint (checkpoints/update_*.pt) is left, but the run has "
            f"trained ({'; '.join(found)}): restore the update_*.pt files to resume, or train into a new run_dir "
            "to start over"
        )

    def has_checkpoints(self) -> bool:
        return self.checkpoint_dir.is_dir() and any(self.checkpoint_dir.glob("*.pt"))

    def lock(self, log: Callable[[str], None], command: str = "train") -> None:
        """Become the run's writer; ``command`` (``average`` adds a checkpoint) is named to the others."""
        self._lock.acquire(self.path, log, command)
        self.writable = True

    def write_config(self, cfg: Config) -> None:
        """The resolved config, with ``run_dir: .`` (the directory it lies in): the run can move."""
        text = config_yaml(cfg, run_dir=".", header=_HEADER)
        atomic_write_bytes(self.config_path, text.encode("utf-8"))

    def writer(self) -> str | None:
        """The process writing the run now ('nmt train', 'average', 'tune-decode'), or None."""
        return None if self.writable else self._lock.holder()

    def close(self) -> None:
        self._lock.release()
        self.writable = False

    def _is_earlier_run(self) -> bool:
        """A run of an earlier version, whose config.yaml has no header yet."""
        return self.checkpoint_dir.is_dir() or self.metrics_path.exists()


def _holder_note(note: bytes) -> tuple[str, str]:
    """The command holding a run's lock and who runs it (host, pid, since), as its note in
    train.lock names them; a note without the command (an earlier version's) was a trainer's."""
    lines = note.decode("utf-8", "replace").strip().splitlines()
    if len(lines) >= 2 and lines[0].startswith("nmt "):
        return lines[0], lines[1]
    return "nmt train", (lines[0] if lines else "") or "another process"


def _real(path: Path) -> Path:
    """``path`` with every symlink resolved: the same file however it is reached."""
    return Path(os.path.realpath(path))


def _written_by_nmt(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline() == _HEADER
    except (OSError, UnicodeDecodeError):
        return False
