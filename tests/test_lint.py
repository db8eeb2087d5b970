"""The code is linted and formatted by ruff (pinned in requirements.lock, configured in pyproject.toml)."""

import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["ruff check", "ruff format --check"])
def test_ruff_passes(command):
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, f"ruff {' '.join(command)} (fix: make format):\n{done.stdout}{done.stderr}"
