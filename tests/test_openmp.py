"""Idle OpenMP threads spin briefly: set by the CLI before torch loads the runtime, unless the user chose."""

import os
import subprocess
import sys

import pytest

from nmt.openmp import SPIN_COUNT, limit_spinning

KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def test_limit_spinning_keeps_what_the_user_set(monkeypatch):
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert limit_spinning() == "OMP_WAIT_POLICY=ACTIVE"
    assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "5000")
    assert limit_spinning() == "GOMP_SPINCOUNT=5000"
    assert os.environ["GOMP_SPINCOUNT"] == "5000"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    assert limit_spinning() == f"GOMP_SPINCOUNT={SPIN_COUNT}"
    assert os.environ["GOMP_SPINCOUNT"] == str(SPIN_COUNT)


@pytest.mark.parametrize("user, expected", [({}, str(SPIN_COUNT)), ({"GOMP_SPINCOUNT": "5000"}, "5000")])
def test_the_runtime_reads_the_cli_setting(tmp_path, user, expected):
    """The runtime itself reports its spin count (OMP_DISPLAY_ENV): the CLI set it before torch loaded it."""
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env.update(user, OMP_DISPLAY_ENV="VERBOSE")
    result = subprocess.run(
        [sys.executable, "-m", "nmt", "train", "--config", str(tmp_path / "missing.yaml")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "missing.yaml" in result.stderr
    if "GOMP_SPINCOUNT" not in result.stderr:
        pytest.skip("torch here does not use GNU OpenMP")
    assert f"GOMP_SPINCOUNT = '{expected}'" in result.stderr


def test_importing_the_cli_does_not_load_torch():
    # The CLI bounds the OpenMP spin before torch loads the runtime: a module-level import that
    # pulls torch into nmt.cli would load it first.
    code = "import sys, nmt.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
