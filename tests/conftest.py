"""Shared test helpers, and the one list of programs outside Python that any test runs."""

import shutil
from pathlib import Path

import numpy as np
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


def draw_requests(draw, st) -> tuple:
    """A small workload's shape for the engine's property tests: (n, block_size, max_model_len, gaps in s, prompt
    and output tokens), from hypothesis's draw and strategies module."""
    n = draw(st.integers(1, 24))
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    max_model_len = draw(st.sampled_from([48, 128]))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.004, 0.008, 0.01, 0.023, 0.05, 0.3]), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    return n, bs, max_model_len, gaps, prompts, outputs


def assert_identical(python, loop) -> None:
    """Every request's times, tokens and preemptions and every step's record are the same bits."""
    for name in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens", "num_preemptions"):
        assert np.array_equal(getattr(python, name), getattr(loop, name), equal_nan=True), name  # arrival_s: sends
    for name in python.steps:
        assert np.array_equal(python.steps[name], loop.steps[name]), name
    np.testing.assert_equal(python.summary(), loop.summary())  # NaN where both have none


def assert_same(slow, fast) -> None:
    """Same times for every request, same records and batch for every step, same block tables freed in order."""
    for name in ("first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens", "num_preemptions"):
        assert np.array_equal(getattr(slow, name), getattr(fast, name)), name
    for name in slow.steps:
        assert np.array_equal(slow.steps[name], fast.steps[name]), name
    assert slow.scheduled == fast.scheduled
    assert slow.freed_tables == fast.freed_tables
