"""Where translations come from and go to: input read in windows (a file, or stdin as it arrives),
output lines to stdout, to a file that appears only when complete, or to memory; and what an
interruption keeps. ``translate_into`` runs a translator between the two.

Input is translated window by window, so output appears as soon as a window is done: a line typed
at a terminal is answered at once, a large file never sits in memory whole, and an interrupted
command keeps what it finished (``OUTPUT.partial``), leaving an older OUTPUT as it was.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from nmt.config import DecodeConfig
from nmt.corpus import decode_lines, iter_lines
from nmt.errors import NMTError
from nmt.files import LineWriter, check_output, write_stdout
from nmt.signals import Interrupted, sigterm_interrupts

WINDOW_LINES = 20_000  # lines translated together: sorted into length-homogeneous batches


def input_windows(path: Path | None, lines_per_window: int = WINDOW_LINES) -> Iterator[list[str]]:
    """The input's lines in consecutive windows of at most ``lines_per_window``. Standard input
    yields what has arrived whenever it pauses, so a line typed at a terminal is answered at once
    while piped text still comes in large windows; a file yields full windows. A file's lines are
    those the corpus readers see (``iter_lines``); on standard input only ``\\n`` ends a line."""
    if path is None:
        yield from _stdin_windows(lines_per_window)
        return
    yield from line_windows(iter_lines(path), lines_per_window)


def line_windows(lines: Iterable[str], lines_per_window: int = WINDOW_LINES) -> Iterator[list[str]]:
    """``lines`` in consecutive windows of at most ``lines_per_window``, as a file is read. Where
    reading stops at bad input, the lines read before it come first, then the error: every line
    before a bad one is translated, and an output's ``.partial`` holds them all."""
    window: list[str] = []
    try:
        for line in lines:
            window.append(line)
            if len(window) == lines_per_window:
                yield window
                window = []
    except NMTError:
        if window:
            yield window
        raise
    if window:
        yield window


def _stdin_windows(lines_per_window: int) -> Iterator[list[str]]:
    """Standard input's windows; at a line that is not UTF-8 it stops reading, hands on every line
    before that one, then reports it (as ``line_windows`` does for a file)."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests, embedding): read it whole
        fd = None
    if fd is None:
        data = sys.stdin.buffer.read()
        lines, bad = _split(data.removesuffix(b"\n"), 0) if data else ([], None)
        for start in range(0, len(lines), lines_per_window):
            yield lines[start : start + lines_per_window]
        if bad is not None:
            raise bad
        return
    pending, window, lines_before, bad = b"", [], 0, None
    while bad is None:
        while len(window) >= lines_per_window:
            yield window[:lines_per_window]
            lines_before += lines_per_window
            window = window[lines_per_window:]
        # Block only when there is nothing to translate; otherwise translate what has arrived.
        if window and not select.select([fd], [], [], 0)[0]:
            yield window
            lines_before += len(window)
            window = []
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        pending += chunk
        cut = pending.rfind(b"\n")
        if cut >= 0:
            lines, bad = _split(pending[:cut], lines_before + len(window))
            window += lines
            pending = pending[cut + 1 :]
    if pending and bad is None:
        lines, bad = _split(pending, lines_before + len(window))
        window += lines
    for start in range(0, len(window), lines_per_window):
        yield window[start : start + lines_per_window]
    if bad is not None:
        raise bad


def _split(data: bytes, lines_before: int) -> tuple[list[str], NMTError | None]:
    """The lines of ``data``, which the caller has cut before its final newline (so a blank last
    line is kept), decoded up to a bad one, and the one-line error naming that (``decode_lines``)."""
    if lines_before == 0 and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return decode_lines("<stdin>", data, lines_before)


class StdoutLines:
    """Standard output as a destination for lines: each window's lines as soon as they are done."""

    def __init__(self):
        self.lines = 0

    def write(self, lines: list[str]) -> None:
        write_stdout("".join(line + "\n" for line in lines))
        self.lines += len(lines)

    def commit(self) -> None:
        pass

    def discard(self) -> None:
        pass


class CollectedLines(StdoutLines):
    """Lines kept in memory (eval-bleu scores its translations without writing them anywhere)."""

    def __init__(self):
        super().__init__()
        self.collected: list[str] = []

    def write(self, lines: list[str]) -> None:
        self.collected += lines
        self.lines += len(lines)


class CollectedFileLines(LineWriter):
    """A file output whose lines are also kept in memory: eval-bleu scores what it wrote, which a
    pipe or /dev/null cannot give back."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.collected: list[str] = []

    def write(self, lines: list[str]) -> None:
        self.collected += lines
        super().write(lines)


def open_output(path: str | None, inputs: list[Path], option: str, collect: bool = False):
    """Where a command's lines go (stdout for None or '-'), checked before any work starts against
    every input (``files.check_output``); with ``collect`` they are also kept (``collected``), and
    stdout gets nothing."""
    if path is None or path == "-":
        if sys.stdout is None and not collect:  # started with stdout closed (>&-)
            raise NMTError(f"standard output is closed: give {option} FILE")
        return CollectedLines() if collect else StdoutLines()
    check_file_name(path, option)
    check_output(Path(path), inputs, option)
    return CollectedFileLines(Path(path)) if collect else LineWriter(Path(path))


def check_file_name(path: str, option: str) -> None:
    """Refuse an output name that names a directory by its spelling (``out/``, ``out/.``):
    ``Path`` drops the trailing slash or dot, so ``-o missing/`` would be written as a file named
    ``missing``, where ``cp`` and a shell's ``>`` refuse it."""
    if os.path.basename(path) in ("", ".", "..") and not Path(path).is_dir():
        example = f"{path.rstrip('/.')}/out.txt"
        raise NMTError(f"{option} {path}: names a directory, expected a file name (e.g. {example})")


def input_file(path: str | None, option: str) -> Path | None:
    """A readable input file, or None for stdin; a one-line error otherwise."""
    if path is None or path == "-":
        if sys.stdin is None:  # started with stdin closed (<&-)
            raise NMTError(f"standard input is closed: give {option} FILE")
        return None
    source = Path(path)
    if not source.exists():
        raise NMTError(f"{option} {path}: no such file")
    if source.is_dir():
        raise NMTError(f"{option} {path}: is a directory, expected a text file")
    return source


def check_text(source: Path | None) -> None:
    """Read a regular input file through once before any work (about half a second per 100 MB),
    so that a line that is not UTF-8 is an error at once, not after translating every line before
    it. Standard input, a pipe or a FIFO can be read only once: a bad line there is found as it is
    translated (``translate_into`` then keeps the lines before it)."""
    if source is not None and source.is_file():
        for _ in iter_lines(source):
            pass


def progress_bar(source: Path | None, tokenizer):
    """A progress bar on a terminal, counting source tokens (a sentence costs by its length, so the
    ETA holds); its total is known for a regular file, counted window by window before translating
    (a pipe, ``--input <(...)``, can be read only once: it is left to the translation)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    from nmt.translate import is_translated

    total = None
    if source is not None and source.is_file():  # the lines translated, as the translator counts them
        total = sum(
            len(ids) + 1
            for window in input_windows(source)
            for line, ids in zip(window, tokenizer.encode(window))
            if is_translated(line, ids)
        )
    return tqdm(total=total, unit="tok", unit_scale=True, file=sys.stderr, dynamic_ncols=True)


def translate_lines(translator, lines: list[str], decode: DecodeConfig) -> list[str]:
    """The best translation of every line (a blank one stays blank), in the windows
    ``translate_into`` reads a file in: ``nmt compare`` scores a test set it holds in memory
    exactly as ``eval-bleu --model`` scores the same lines from their files."""
    from nmt.translate import translate_stream

    out: list[str] = []
    translate_stream(translator, line_windows(lines), replace(decode, nbest=1), out.extend)
    return out


class _TranslatedWindows:
    """Input windows passed on to a translator, counting the input lines of those it has done (a
    window is done when the next is asked for): what an output holds when reading stops at bad
    input, however many output lines (n-best) each input line has."""

    def __init__(self, windows: Iterator[list[str]]):
        self.windows = windows
        self.lines = 0

    def __iter__(self) -> Iterator[list[str]]:
        for window in self.windows:
            yield window
            self.lines += len(window)


def translate_into(
    translator,
    source: Path | None,
    sink,
    decode: DecodeConfig,
    stream: bool = False,
    attention=None,
) -> int:
    """Translate ``source`` (stdin if None) into ``sink`` window by window (``stream``: stdin line by
    line; ``decode.nbest`` above 1: n-best lines, see ``translate_stream``); returns the lines read.
    Interrupted (SIGINT, or SIGTERM: exit 143) or stopped by bad input midway, a file output keeps
    what was done as OUTPUT.partial and leaves an older OUTPUT untouched; any failure leaves no
    temporary file behind."""
    from nmt.translate import translate_stream

    bar = None
    windows = _TranslatedWindows(input_windows(source, 1 if stream else WINDOW_LINES))
    with sigterm_interrupts():
        try:
            bar = progress_bar(source, translator.src_tok)
            progress = None if bar is None else bar.update  # a tqdm without a total has no truth value
            done = translate_stream(translator, iter(windows), decode, sink.write, progress, attention)
        except KeyboardInterrupt as e:
            message = f"interrupted after {sink.lines} output lines"
            partial = sink.keep_partial() if isinstance(sink, LineWriter) else None
            if partial is not None:
                message = f"interrupted: the {sink.lines} lines done are in {partial}; {sink.path} is unchanged"
            raise Interrupted(message, getattr(e, "signum", signal.SIGINT)) from None
        except NMTError as e:  # bad input found midway (a line that is not UTF-8): keep what is done
            if not (isinstance(sink, LineWriter) and windows.lines):
                sink.discard()
                raise
            partial = sink.keep_partial()
            if partial is None:
                raise
            kept = f"the translations of the first {windows.lines} lines are in {partial}; {sink.path} is unchanged"
            raise NMTError(f"{e}; {kept}") from None
        except BaseException:
            sink.discard()
            raise
        finally:
            if bar is not None:
                bar.close()
        sink.commit()
    return done
