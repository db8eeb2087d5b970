"""Shared test helpers, and the one list of programs outside Python that any test runs."""
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"

# Every program a test runs that neither Python (the pinned packages in .venv) nor make provides: its name on
# PATH and how a user gets it. A test that runs one carries needs_tool(name), so that without it the test is
# skipped, saying what is missing and the fix; tests/test_tools.py holds every test to that.
TOOLS = {
    "chromium": "make setup installs Debian's chromium when it runs as root or with passwordless sudo; "
                "otherwise: sudo apt-get install chromium",
}


def tool_path(name: str) -> str | None:
    """Where a program of TOOLS is on PATH (chromium may be called chromium-browser), or None."""
    if name not in TOOLS:
        raise KeyError(f"{name!r} is not in tests/conftest.py TOOLS: add it with the way to install it")
    return shutil.which(name) or (shutil.which("chromium-browser") if name == "chromium" else None)


def needs_tool(name: str):
    """A skip mark for a test that runs a program of TOOLS: skipped, with the fix, where it is missing."""
    return pytest.mark.skipif(tool_path(name) is None, reason=f"{name} is not installed (fix: {TOOLS[name]})")
