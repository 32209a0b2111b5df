"""A training run's log: each line on the console and in ``train.log`` in the run directory, with
the time it was written. Lines said before the file is open (the device's warnings, said before
rank 0 takes the run) are kept and written once it is; a disk that refuses a line closes the file
and stops the run, and the line a run ends on goes to the file only (the CLI prints it). The Trainer
holds one and says which rank writes to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from nmt.errors import NMTError
from nmt.files import naming


class TrainLog:
    def __init__(self, path: Path, print_line: Callable[[str], None]):
        self.path = path
        self._print = print_line
        self._file = None
        self._early: list[str] = []  # said before the file is open: on the console now, in the file once it is

    def line(self, message: str) -> None:
        """To the console and to the file."""
        self._print(message)
        self._to_file(message)

    def file_line(self, message: str) -> None:
        """To the file only: what the console shows otherwise (the progress bar's numbers)."""
        self._to_file(message)

    def keep_for_file(self, message: str) -> None:
        """``message``, said before the file is open, is written into it as it opens."""
        self._early.append(message)

    def open(self) -> None:
        try:
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise NMTError(f"{self.path}: cannot open the training log ({e.strerror})") from None
        for message in self._early:
            self._to_file(message)

    def _to_file(self, message: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(time.strftime("%Y-%m-%d %H:%M:%S ") + message + "\n")
            self._file.flush()
        except OSError as e:  # a full disk: the log goes on on the console only, and the run stops
            self.close()
            raise naming(e, self.path) from None

    def end(self, message: str) -> None:
        """``message`` in the file only (the CLI prints it on the console), where it is open; a disk
        that refuses it leaves the log as it was and the error the run stopped on in force."""
        try:
            self._to_file(message)
        except OSError:
            pass

    def close(self) -> None:
        """Close the file; lines that could not be written (a full disk) are given up."""
        log_file, self._file = self._file, None
        if log_file is not None:
            try:
                log_file.close()
            except OSError:
                pass
