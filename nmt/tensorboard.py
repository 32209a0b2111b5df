"""``train.tensorboard: true``: the scalars of ``metrics.jsonl`` (see ``nmt.metrics.SCALARS``) also as
TensorBoard event files in ``RUN_DIR/tensorboard/``; same interface as ``MetricsLog``."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nmt.errors import NMTError
from nmt.files import naming, storage_error
from nmt.metrics import ScalarStream

TENSORBOARD_DIR = "tensorboard"
FLUSH_SECONDS = 10  # a flush per update would make the training loop wait for the writer's thread


def _summary_writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise NMTError("train.tensorboard needs the tensorboard package: pip install 'nmt[tensorboard]'") from None
    return SummaryWriter


def check_available() -> None:
    """The one-line error of a missing tensorboard package, for ``nmt train`` to say before any work:
    the writer is opened only once the data is prepared, minutes in on a large corpus."""
    _summary_writer_class()


class TensorBoardLog:
    """Takes the records written to ``metrics.jsonl``; tags are ``train/loss``, ``valid/bleu``, ...,
    the step is the record's update and the wall time the moment it was written. Events reach the
    file every few seconds and on ``close``; ``metrics.jsonl`` stays the record that survives a kill."""

    def __init__(self, run_dir: Path):
        self.log_dir = Path(run_dir) / TENSORBOARD_DIR
        self._writer_class = _summary_writer_class()  # a missing package fails at start-up, not mid-run
        self._thread_hooks = (threading.excepthook, functools.partial(_quiet_storage_errors, threading.excepthook))
        threading.excepthook = self._thread_hooks[1]
        self._writer = None
        self._stream = ScalarStream()

    def _open(self, first_step: int):
        resumed = self.log_dir.is_dir() and any(self.log_dir.glob("events.out.tfevents.*"))
        # A resumed run restarts at its checkpoint: TensorBoard hides what an earlier session logged
        # from that step on (the same records read_metrics drops).
        return self._writer_class(
            log_dir=str(self.log_dir), purge_step=first_step if resumed else None, flush_secs=FLUSH_SECONDS
        )

    def write(self, record: dict) -> None:
        values = self._stream.add(record)
        if not values:
            return
        step = int(record["update"])
        if self._writer is None:
            # A validation is logged after its update's train record, which an earlier session kept.
            self._writer = self._open(step if record.get("type") == "train" else step + 1)
        now = time.time()
        try:  # the writer's thread failed (a full disk): it says so at the next event
            for scalar, value in values:
                self._writer.add_scalar(scalar.name, value, global_step=step, walltime=now)
        except OSError as e:
            self._writer = None
            raise naming(e, self.log_dir) from None

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()  # its thread has ended once this returns
            except OSError:  # its last events are lost to a full disk; metrics.jsonl, the record, has them
                pass
        before, ours = self._thread_hooks
        if threading.excepthook is ours:  # the process's hook, as it was before the run
            threading.excepthook = before


def _quiet_storage_errors(
    otherwise: Callable[[threading.ExceptHookArgs], object], args: threading.ExceptHookArgs
) -> None:
    """No traceback from TensorBoard's writer thread where the disk refuses its events: the training
    loop gets the same error at its next event (``TensorBoardLog.write``) and says it in one line."""
    if storage_error(args.exc_value):
        return
    otherwise(args)
