"""scripts/get_multi30k.py run as a subprocess: local copy, idempotence, clear errors."""

from __future__ import annotations

import functools
import gzip
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "get_multi30k.py"
SPLITS = ("train", "val", "test_2016_flickr")


def run_script(args: list[str], multi30k_dir: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MULTI30K_DIR"}
    if multi30k_dir is not None:
        env["MULTI30K_DIR"] = str(multi30k_dir)
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def make_fake(root: Path, langs: tuple[str, ...], n: int) -> Path:
    root.mkdir()
    for split in SPLITS:
        for lang in langs:
            (root / f"{split}.{lang}").write_text("".join(f"{split} {lang} {i}\n" for i in range(n)))
    return root


def test_copies_from_multi30k_dir_then_up_to_date(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "fake", ("de", "en"), 5)
    out = tmp_path / "out"
    args = ["--out", str(out), "--langs", "de", "en", "--expect-lines", "5"]
    first = run_script(args, fake)
    assert first.returncode == 0, first.stderr
    for split in SPLITS:
        for lang in ("de", "en"):
            assert (out / f"{split}.{lang}").read_text() == (fake / f"{split}.{lang}").read_text()
    assert not list(out.glob(".*tmp"))
    mtime = (out / "train.de").stat().st_mtime_ns
    time.sleep(0.01)
    second = run_script(args, fake)
    assert second.returncode == 0 and "up to date" in second.stdout
    assert (out / "train.de").stat().st_mtime_ns == mtime


def test_files_get_the_umask_permissions_as_cp_gives_them(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "fake", ("de", "en"), 5)
    out = tmp_path / "out"
    old_umask = os.umask(0o022)  # the child inherits it
    try:
        res = run_script(["--out", str(out), "--langs", "de", "en", "--expect-lines", "5"], fake)
    finally:
        os.umask(old_umask)
    assert res.returncode == 0, res.stderr
    modes = {(out / f"{split}.{lang}").stat().st_mode & 0o777 for split in SPLITS for lang in ("de", "en")}
    assert modes == {0o644}


def test_wrong_line_count_is_one_line_error(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "fake", ("de", "en"), 5)
    (fake / "val.en").write_text("only one line\n")
    res = run_script(["--out", str(tmp_path / "out"), "--langs", "de", "en", "--expect-lines", "5"], fake)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "val.en" in res.stderr and "Traceback" not in res.stderr


def test_missing_file_in_multi30k_dir_is_named(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "fake", ("de", "en"), 5)
    (fake / "test_2016_flickr.de").unlink()
    res = run_script(["--out", str(tmp_path / "out"), "--langs", "de", "en", "--expect-lines", "5"], fake)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "test_2016_flickr.de" in res.stderr
    assert "Traceback" not in res.stderr


def test_offline_download_fails_with_one_clear_line(tmp_path: Path) -> None:
    start = time.monotonic()
    res = run_script(["--out", str(tmp_path / "out"), "--url-base", "http://127.0.0.1:9/"], None)
    assert time.monotonic() - start < 15
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "could not download" in res.stderr and "MULTI30K_DIR" in res.stderr


def test_a_wrong_multi30k_dir_writes_nothing_into_out(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "fake", ("de", "en"), 5)
    (fake / "val.en").write_text("only one line\n")
    out = tmp_path / "out"
    res = run_script(["--out", str(out), "--langs", "de", "en", "--expect-lines", "5"], fake)
    assert res.returncode == 2 and str(fake / "val.en") in res.stderr
    assert not out.exists(), "the wrong files were copied before the check"


def test_gzipped_files_in_multi30k_dir_are_read_as_the_dataset_ships_them(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "fake", ("de", "en"), 5)
    texts = {path.name: path.read_bytes() for path in fake.iterdir()}
    for name, data in texts.items():
        (fake / name).unlink()
        (fake / f"{name}.gz").write_bytes(gzip.compress(data))
    out = tmp_path / "out"
    res = run_script(["--out", str(out), "--langs", "de", "en", "--expect-lines", "5"], fake)
    assert res.returncode == 0, res.stderr
    assert {path.name: path.read_bytes() for path in out.iterdir()} == texts


def test_a_file_missing_in_both_forms_names_the_gzipped_one_too(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "fake", ("de", "en"), 5)
    (fake / "val.de").unlink()
    res = run_script(["--out", str(tmp_path / "out"), "--langs", "de", "en", "--expect-lines", "5"], fake)
    assert res.returncode == 2 and "lacks val.de (or val.de.gz)" in res.stderr


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory and the URL of an HTTP server on this machine that serves it (a 404 for what it lacks)."""
    root = tmp_path / "served"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_error_says_how_to_give_the_data_and_leaves_no_half_filled_out(
    tmp_path: Path, served: tuple[Path, str]
) -> None:
    root, url = served
    fake = make_fake(tmp_path / "fake", ("de", "en"), 5)
    for lang in ("de", "en"):  # the train files only: val.de.gz is a 404
        (root / f"train.{lang}.gz").write_bytes(gzip.compress((fake / f"train.{lang}").read_bytes()))
    out = tmp_path / "out"
    res = run_script(["--out", str(out), "--langs", "de", "en", "--expect-lines", "5", "--url-base", url], None)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "val.de.gz: HTTP 404" in res.stderr and "MULTI30K_DIR" in res.stderr
    assert not out.exists(), "the files downloaded before the failure were left behind"


def makefile_multi30k_dir(project: Path, env_value: str | None) -> str:
    """MULTI30K_DIR as the Makefile in ``project`` exports it to its recipes."""
    env = {k: v for k, v in os.environ.items() if k != "MULTI30K_DIR"}
    if env_value is not None:
        env["MULTI30K_DIR"] = env_value
    show = 'show: ; @echo "[$$MULTI30K_DIR]"'
    done = subprocess.run(
        ["make", "--no-print-directory", f"--eval={show}", "show"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()[1:-1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_makefile_downloads_on_a_fresh_machine_and_copies_where_shared_data_exists(tmp_path: Path) -> None:
    project = tmp_path / "clone"
    project.mkdir()
    shutil.copy(SCRIPT.parents[1] / "Makefile", project / "Makefile")
    # a fresh machine: no ../shared beside the clone, so the script must be left to download
    assert makefile_multi30k_dir(project, None) == ""
    shared = tmp_path / "shared" / "data" / "multi30k"
    shared.mkdir(parents=True)
    assert makefile_multi30k_dir(project, None) == "", "an empty directory is not the data"
    (shared / "train.de.gz").write_bytes(gzip.compress(b"x\n"))  # as the dataset's repository has it
    assert makefile_multi30k_dir(project, None) == str(shared)
    (shared / "train.de.gz").unlink()
    (shared / "train.de").write_text("x\n")
    assert makefile_multi30k_dir(project, None) == str(shared)
    assert makefile_multi30k_dir(project, "/elsewhere") == "/elsewhere"


class CutOffHandler(http.server.BaseHTTPRequestHandler):
    """Promises 1,000 bytes and sends a few: a download cut off mid-file."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"\x1f\x8b\x08\x00cut")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_download_cut_off_mid_file_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import get_multi30k
    finally:
        sys.path.remove(str(SCRIPT.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CutOffHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with pytest.raises(get_multi30k.FetchError, match=r"train\.de\.gz: the download was cut off .*MULTI30K_DIR"):
            get_multi30k.download_one(f"{url}train.de.gz")
    finally:
        server.shutdown()
        server.server_close()
