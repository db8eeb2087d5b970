"""Shared test helpers, and the one list of programs outside Python that any test runs."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


def assert_same(slow, fast) -> None:
    """Same times for every request, same records and batch for every step, same block tables freed in order."""
    for name in ("first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens", "num_preemptions"):
        assert np.array_equal(getattr(slow, name), getattr(fast, name)), name
    for name in slow.steps:
        assert np.array_equal(slow.steps[name], fast.steps[name]), name
    assert slow.scheduled == fast.scheduled
    assert slow.freed_tables == fast.freed_tables


# ---------------------------------------------------------------- the whole report, built beside the other tests
# tests/test_report_output.py reads the report `make report` builds, at its defaults: a third of make test's time,
# most of it one core's work while the other tests leave the second core idle. So it is built in a child process
# from the end of collection, while the other tests run, and the tests that read it run last. Its sweeps run in
# its own process (SWEEP_SCHEDULER=serial): a core for the build, the other for the tests and their sweeps.
BUILD_REPORT = ("import sys; from pathlib import Path; from kvlab.report.build import build; "
                "build(Path(sys.argv[1]), [], Path(sys.argv[2]))")


class ReportBuild:
    """`make report`'s build (params.yaml, no overrides) into a temporary folder, in a child process."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="kvlab-report-test-"))
        self.out = self.folder / "report"
        self.log = self.folder / "build.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([sys.executable, "-c", BUILD_REPORT, str(ROOT / "params.yaml"),
                                             str(self.out)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                            env={**os.environ, "SWEEP_SCHEDULER": "serial"},
                                            start_new_session=True)   # its kernels: one group

    def result(self) -> Path:
        """The built report's folder, once the build is done; the test fails with the build's last lines if it
        failed."""
        if self.process.wait() != 0:
            tail = "\n".join(self.log.read_text().splitlines()[-15:])
            pytest.fail(f"the report build failed (exit {self.process.returncode}):\n{tail}", pytrace=False)
        return self.out

    def close(self) -> None:
        if self.process.poll() is None:     # the session ended first (an interrupt, -x): stop it and its kernels
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_report_build: ReportBuild | None = None


def _runs(item) -> bool:
    """Whether a collected test will run: no skip mark, no skipif mark whose condition holds."""
    return not any(True for _ in item.iter_markers("skip")) and \
        not any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif"))


@pytest.hookimpl(trylast=True)              # after -k and -m have deselected
def pytest_collection_modifyitems(config, items):
    """Start the report's build if a test that reads it will run, and run those tests last (the build's time)."""
    global _report_build
    reading = [item for item in items if "built_report" in getattr(item, "fixturenames", ())]
    if not config.option.collectonly and any(_runs(item) for item in reading):
        _report_build = ReportBuild()
        last = set(reading)
        items[:] = [item for item in items if item not in last] + reading


def pytest_sessionfinish(session, exitstatus):
    if _report_build is not None:
        _report_build.close()


@pytest.fixture(scope="session")
def built_report() -> Path:
    """The report `make report` builds at its defaults (built beside the other tests from the end of collection)."""
    if _report_build is None:
        pytest.fail("the report build was not started at collection", pytrace=False)
    return _report_build.result()
