"""Fetch Multi30k task 1 (raw, cased) into a directory of plain parallel files.

    python scripts/get_multi30k.py --out data/multi30k [--langs de en]

With MULTI30K_DIR set, the files are copied from that directory; otherwise they are
downloaded (gzipped) from the public multi30k/dataset GitHub repository. Every failure
is reported as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

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


def check_counts(out: Path, langs: list[str], override: int | None) -> None:
    """Each file has its split's line count (so every pair of files matches)."""
    for split in SPLITS:
        counts = {lang: count_lines(out / f"{split}.{lang}") for lang in langs}
        want = expected_lines(f"{split}.x", override)
        for lang, got in counts.items():
            if got != want:
                raise FetchError(f"{out / f'{split}.{lang}'} has {got} lines, expected {want}")


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


def copy_local(src_dir: Path, out: Path, langs: list[str]) -> None:
    if not src_dir.is_dir():
        raise FetchError(f"MULTI30K_DIR={src_dir} is not a directory")
    missing = [n for n in file_names(langs) if not (src_dir / n).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise FetchError(f"MULTI30K_DIR={src_dir} lacks {missing[0]}{more}")
    for name in file_names(langs):
        write_atomic(out / name, (src_dir / name).read_bytes())


def download_one(url: str) -> bytes:
    """Fetch and gunzip one file; network failures become one FetchError line."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise FetchError(f"could not download {url}: HTTP {e.code}") from e
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        raise FetchError(
            f"could not download {url}: the machine seems offline; set MULTI30K_DIR to a directory holding the files"
        ) from e
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise FetchError(f"could not download {url}: not a valid gzip file") from e


def download(url_base: str, out: Path, langs: list[str]) -> None:
    base = url_base if url_base.endswith("/") else url_base + "/"
    for name in file_names(langs):
        write_atomic(out / name, download_one(f"{base}{name}.gz"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Get Multi30k task 1 (raw) as plain parallel files.")
    p.add_argument("--out", type=Path, default=Path("data/multi30k"), help="output directory")
    p.add_argument("--langs", nargs="+", default=list(LANGS), choices=LANGS, help="languages to fetch")
    p.add_argument("--url-base", default=URL_BASE, help=argparse.SUPPRESS)
    # Tests use tiny fake corpora: every file is then expected to hold this many lines.
    p.add_argument("--expect-lines", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> str:
    out: Path = args.out
    langs: list[str] = list(dict.fromkeys(args.langs))
    if is_complete(out, langs, args.expect_lines):
        return f"{out}: up to date"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create {out}: {e.strerror}") from e
    local = os.environ.get("MULTI30K_DIR")
    if local:
        copy_local(Path(local), out, langs)
        source = local
    else:
        download(args.url_base, out, langs)
        source = args.url_base
    check_counts(out, langs, args.expect_lines)
    return f"{out}: wrote {len(file_names(langs))} files from {source}"


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
