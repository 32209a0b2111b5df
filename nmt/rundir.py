"""The run directory: its layout, who may write what in it, and the checks that its config, tokenizer
and checkpoints belong together. The lock is ``nmt.runlock``; whether a config fits the run (a
resume, the saved corpora, the tuned decoding) is ``nmt.run_config``; which checkpoint a reader
translates with is ``nmt.checkpoint_choice``.

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
import os
import shlex
from collections.abc import Callable
from pathlib import Path

from nmt.config import Config, CorpusConfig, check_with_place, config_to_dict, config_yaml, load_config
from nmt.config_checks import check_training_corpora
from nmt.corpus import plain_paths
from nmt.errors import NMTError
from nmt.files import atomic_write_bytes, is_temporary
from nmt.metrics import METRICS_FILE, validations_trained_on
from nmt.models import same_model_value
from nmt.run_config import (
    CONFIG_HEADER,
    check_new_run_scoring,
    check_resumable,
    check_saved_corpora,
    kept_tuned_decode,
    written_by_nmt,
)
from nmt.runlock import RunLock
from nmt.tensorboard import TENSORBOARD_DIR
from nmt.tokenizer import record_path

CONFIG = "config.yaml"


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
                if not same_model_value(key, was, is_):
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
        self,
        cfg: Config,
        config_file: Path | None,
        log: Callable[[str], None],
        command: str = "train",
        overrides: list[str] | None = None,
    ) -> Config:
        """Make this process the run's one writer: create the directory, take the lock, and refuse a
        config whose training corpora are missing, or that cannot resume the run's checkpoints. The
        caller records the config (``write_config``) once its data is prepared and its checkpoint
        loaded, so a start that fails leaves the run's config.yaml, and the command that resumes it,
        as they were.

        The config a user wrote is never rewritten: ``run_dir`` may not be the directory of the
        config file given, unless that file is the run's own resolved config (a resume).

        Returns ``cfg``, with the decoding 'nmt tune-decode' chose for the run where ``cfg`` repeats
        what that replaced (``kept_tuned_decode``). ``config_file`` and ``overrides`` (its --set options)
        are where ``cfg`` was read from, which an error in its values names.
        """
        if config_file is not None and _real(config_file.absolute().parent) == _real(self.path):
            if not written_by_nmt(config_file):
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
            check_new_run_scoring(cfg, config_file, overrides)
        check_with_place(check_training_corpora, cfg, config_file, overrides)
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
            if not written_by_nmt(self.config_path) and not self._is_earlier_run():
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
        (even while writing it, after its best checkpoint) starts again, as before. An index.json that
        cannot be read is refused first, naming it: the run would lose its best checkpoints' ranking."""
        from nmt.checkpoint import list_checkpoints
        from nmt.checkpoint_index import last_state_recorded

        recorded = last_state_recorded(self.checkpoint_dir)
        if list_checkpoints(self.checkpoint_dir, "update"):
            return  # resumed from, or refused by load_latest_state where none is readable
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
        text = config_yaml(cfg, run_dir=".", header=CONFIG_HEADER)
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


def _real(path: Path) -> Path:
    """``path`` with every symlink resolved: the same file however it is reached."""
    return Path(os.path.realpath(path))
