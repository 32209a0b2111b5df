"""Fetch Multi30k task 1 (raw, cased) into a directory of plain parallel files.

    python scripts/get_multi30k.py --out data/multi30k [--langs de en]

With MULTI30K_DIR set, the files are copied from that directory (each as NAME or, as the
dataset's repository holds them, NAME.gz); otherwise they are downloaded (gzipped) from the public
multi30k/dataset GitHub repository. Every file is read and its line count checked before anything
is written, so a failure leaves --out as it was. Every failure is reported as one line on stderr
with exit code 2.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nmt.arg_types import user_path  # noqa: E402  (plain Python: fetching needs no torch)

URL_BASE = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
SPLITS = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
LANGS = ("de", "en", "fr")
TIMEOUT_S = 10.0
EXIT_ERROR = 2


class FetchError(Exception):
    """A one-line, user-facing failure."""


def file_names(langs: list[str]) -> list[str]:
    return [f"{split}.{lang}" for split in SPLITS for lang in langs]


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def expected_lines(name: str, override: int | None) -> int:
    return override if override is not None else SPLITS[name.rsplit(".", 1)[0]]


def count_data_lines(data: bytes) -> int:
    """Lines as ``count_lines`` counts them in a file: a last line without its newline is one."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def check_counts(out: Path, langs: list[str], override: int | None) -> None:
    """Each file has its split's line count (so every pair of files matches)."""
    for split in SPLITS:
        counts = {lang: count_lines(out / f"{split}.{lang}") for lang in langs}
        want = expected_lines(f"{split}.x", override)
        for lang, got in counts.items():
            if got != want:
                raise FetchError(f"{out / f'{split}.{lang}'} has {got} lines, expected {want}")


def check_data_counts(files: dict[str, bytes], origin: dict[str, str], override: int | None) -> None:
    """``check_counts`` on the files read, before any is written; ``origin`` names where each came from."""
    for name, data in files.items():
        got, want = count_data_lines(data), expected_lines(name, override)
        if got != want:
            raise FetchError(f"{origin[name]} has {got} lines, expected {want}")


def is_complete(out: Path, langs: list[str], override: int | None) -> bool:
    if not all((out / name).is_file() for name in file_names(langs)):
        return False
    try:
        check_counts(out, langs, override)
    except FetchError:
        return False
    return True


def write_atomic(dest: Path, data: bytes) -> None:
    # open() creates the file with the umask's permissions, as cp or a download would; mkstemp's
    # 0600 left the corpus unreadable to the other users of a shared data directory.
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.tmp"
    try:
        with tmp.open("wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def gunzip(data: bytes, where: str) -> bytes:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError) as e:
        raise FetchError(f"{where} is not a valid gzip file") from e


def read_local(src_dir: Path, langs: list[str]) -> tuple[dict[str, bytes], dict[str, str]]:
    """Each file of ``src_dir`` as plain text, read from NAME or else NAME.gz, and the path it came from."""
    if not src_dir.is_dir():
        raise FetchError(f"MULTI30K_DIR={src_dir} is not a directory")
    missing = [n for n in file_names(langs) if not (src_dir / n).is_file() and not (src_dir / f"{n}.gz").is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FetchError(f"MULTI30K_DIR={src_dir} lacks {missing[0]} (or {missing[0]}.gz){more}")
    files, origin = {}, {}
    for name in file_names(langs):
        plain = src_dir / name
        path = plain if plain.is_file() else src_dir / f"{name}.gz"
        data = path.read_bytes()
        files[name] = data if path is plain else gunzip(data, str(path))
        origin[name] = str(path)
    return files, origin


HOW_TO_GIVE_DATA = "set MULTI30K_DIR to a directory holding the files (NAME or NAME.gz)"


def download_one(url: str) -> bytes:
    """Fetch and gunzip one file; every failure becomes one FetchError line saying how else to give the data."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise FetchError(f"could not download {url}: HTTP {e.code}; {HOW_TO_GIVE_DATA}") from e
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        raise FetchError(f"could not download {url}: the machine seems offline; {HOW_TO_GIVE_DATA}") from e
    except http.client.HTTPException as e:  # IncompleteRead: fewer bytes than the server announced
        raise FetchError(f"could not download {url}: the download was cut off ({e!r}); {HOW_TO_GIVE_DATA}") from e
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise FetchError(f"could not download {url}: not a valid gzip file; {HOW_TO_GIVE_DATA}") from e


def download(url_base: str, langs: list[str]) -> tuple[dict[str, bytes], dict[str, str]]:
    base = url_base if url_base.endswith("/") else url_base + "/"
    files, origin = {}, {}
    for name in file_names(langs):
        origin[name] = f"{base}{name}.gz"
        files[name] = download_one(origin[name])
    return files, origin


def write_all(out: Path, files: dict[str, bytes]) -> None:
    """Write every file into ``out``; where one fails, remove those written and ``out`` if made here."""
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create {out}: {e.strerror}") from e
    written: list[Path] = []
    try:
        for name, data in files.items():
            write_atomic(out / name, data)
            written.append(out / name)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Get Multi30k task 1 (raw) as plain parallel files.")
    p.add_argument("--out", type=user_path, default=Path("data/multi30k"), help="output directory")
    p.add_argument("--langs", nargs="+", default=list(LANGS), choices=LANGS, help="languages to fetch")
    p.add_argument("--url-base", default=URL_BASE, help=argparse.SUPPRESS)
    # Tests use tiny fake corpora: every file is then expected to hold this many lines.
    p.add_argument("--expect-lines", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> str:
    out = Path(args.out)
    langs: list[str] = list(dict.fromkeys(args.langs))
    if is_complete(out, langs, args.expect_lines):
        return f"{out}: up to date"
    if out.exists() and not out.is_dir():
        raise FetchError(f"cannot create {out}: it is a file")
    # Everything is read and checked first: a wrong MULTI30K_DIR or a failed download writes nothing.
    local = os.environ.get("MULTI30K_DIR")
    if local:
        files, origin = read_local(Path(local), langs)
        source = local
    else:
        files, origin = download(args.url_base, langs)
        source = args.url_base
    check_data_counts(files, origin, args.expect_lines)
    write_all(out, files)
    return f"{out}: wrote {len(files)} files from {source}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(run(args))
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
