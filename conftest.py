"""Repository-wide pytest hooks: what needs the real request traces is skipped, saying why, without them; and the
report that tests/test_report_output.py reads is built once, beside the other tests, and its execution of each
notebook is the one nbval checks.

Notebook 04 is about the traces and is skipped whole. Notebooks 01 and 02 reproduce the article first and
only then rerun their sections on a trace: there nbval still checks every cell except those tagged
"needs-trace", so the article's figures and ledger stay tested on a machine without the files.

One execution of each notebook: where a test that reads the built report runs, `make report`'s build (params.yaml,
whose values are the notebooks' own defaults: tests/test_params.py) starts in a child process at the end of
collection, and nbval does not run the notebooks a second time: each cell's outputs in the build's executed copy
(papermill's) are compared with the committed ones by nbval's own comparison, so a drifted number fails the cell
that shows it, with nbval's message (tests/test_nbval_drift.py). `--nbval-executed DIR` compares with the executed
copies in DIR instead (report/notebooks after make report). Otherwise nbval runs each notebook itself, as always.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import IPyNbCell, IPyNbFile, coalesce_streams

ROOT = Path(__file__).resolve().parent
NOTEBOOK_DIR = ROOT / "notebooks"


def needs_traces(path: Path) -> bool:
    """A notebook that reads the real trace files in every cell says so in its metadata (kvlab.requires)."""
    try:
        return "traces" in json.loads(path.read_text()).get("metadata", {}).get("kvlab", {}).get("requires", [])
    except (OSError, ValueError):
        return False


# Cells with this tag (notebooks 01 and 02) read the trace of their TRACE parameter's default.
TRACE_CELL_TAG = "needs-trace"
TRACE_CELL_DEFAULT = "azure"


def skip_what_needs_missing_traces(items) -> None:
    """Mark the notebooks and cells that read a real trace file that is not there as skipped, saying why."""
    from kvlab.workloads import traces

    missing = traces.missing_traces()
    if not missing:
        return
    where = f"not in {traces.trace_dir()} (set TRACE_DIR or run make traces)"
    whole = pytest.mark.skip(reason=f"needs the real trace files {', '.join(missing)}, which are {where}")
    cells = pytest.mark.skip(
        reason=f"a cell on the {TRACE_CELL_DEFAULT} trace (TRACE's default), whose file is {where}"
    )
    for item in items:
        cell = getattr(item, "cell", None)  # an nbval notebook cell
        if item.path.suffix == ".ipynb" and needs_traces(item.path):
            item.add_marker(whole)
        elif (
            cell is not None
            and TRACE_CELL_TAG in cell.get("metadata", {}).get("tags", [])
            and TRACE_CELL_DEFAULT in missing
        ):
            item.add_marker(cells)


# ---------------------------------------------------------------- the whole report, built beside the other tests
# tests/test_report_output.py reads the report `make report` builds, at its defaults: most of its time is one core's
# work. So it is built once per session in a child process from the end of collection, while the other tests run, and
# the tests that read it (and the notebooks' cells, which check its executions) run last. Its sweeps run in its own
# process (SWEEP_SCHEDULER=serial). Under pytest-xdist (make test: a worker per core) the controller names one folder
# for the session; the first worker that needs the report starts the build there and the others wait for the exit
# status it leaves.
BUILD_REPORT = (
    "import sys; from pathlib import Path; from kvlab.report.build import build; "
    "build(Path(sys.argv[1]), [], Path(sys.argv[2]))"
)
BUILD_FOLDER_KEY = "kvlab_report_build"  # the session's build folder, in each xdist worker's workerinput


class ReportBuild:
    """`make report`'s build (params.yaml, no overrides) into folder/report, in a child process: started by the
    first process of the session that asks (it claims folder/started), waited for by the others (folder/exit)."""

    def __init__(self, folder: Path):
        self.folder, self.out, self.log = folder, folder / "report", folder / "build.log"
        self.exit, self.process = folder / "exit", None
        try:
            os.close(os.open(folder / "started", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return  # another worker of this session builds it
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", BUILD_REPORT, str(ROOT / "params.yaml"), str(self.out)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "SWEEP_SCHEDULER": "serial"},
                start_new_session=True,
            )  # its kernels: one group
        (folder / "pid").write_text(str(self.process.pid))

    def succeeded(self) -> bool:
        """Whether the build succeeded, once it is done."""
        if self.process is not None:
            self._finished(self.process.wait())
        while not self.exit.exists():
            time.sleep(0.2)
        return self.exit.read_text() == "0"

    def _finished(self, code: int) -> None:
        """Leave the build's exit status for the session's other processes (whole, by a rename)."""
        if not self.exit.exists():
            part = self.folder / "exit.part"
            part.write_text(str(code))
            part.replace(self.exit)

    def result(self) -> Path:
        """The built report's folder, once the build is done; the test fails with the build's last lines if it
        failed."""
        if not self.succeeded():
            tail = "\n".join(self.log.read_text().splitlines()[-15:])
            pytest.fail(f"the report build failed (exit {self.exit.read_text()}):\n{tail}", pytrace=False)
        return self.out

    def close(self, stopped: bool) -> None:
        """At the end of this process's session: the build ends (killed, with its kernels, where the session was
        stopped early: an interrupt, -x), so that no other process waits for it in vain."""
        if self.process is not None and self.process.poll() is None:
            if stopped:
                os.killpg(self.process.pid, signal.SIGKILL)
            self._finished(self.process.wait())


_report_build: ReportBuild | None = None
_build_folder: Path | None = None  # made (and removed) by this process: the xdist controller's, or a lone pytest's


def _runs(item) -> bool:
    """Whether a collected test will run: no skip mark, no skipif mark whose condition holds."""
    return not any(True for _ in item.iter_markers("skip")) and not any(
        mark.args and mark.args[0] is True for mark in item.iter_markers("skipif")
    )


def pytest_configure(config):
    global _build_folder
    if not hasattr(config, "workerinput"):  # the xdist controller or a lone pytest: the session's folder
        _build_folder = Path(tempfile.mkdtemp(prefix="kvlab-report-test-"))
    else:  # an xdist worker yields a core to the build, whose report the last tests wait for
        os.nice(5)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: each worker is told the session's build folder."""
    node.workerinput[BUILD_FOLDER_KEY] = str(_build_folder)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config, items):
    """Skip what needs missing traces; start the report's build (or join the session's) if a test that reads it will
    run, and run those tests and the cells of the notebooks it executes last (the build's time)."""
    global _report_build
    skip_what_needs_missing_traces(items)
    reading = [item for item in items if "built_report" in getattr(item, "fixturenames", ())]
    if not config.option.collectonly and any(_runs(item) for item in reading):
        worker = getattr(config, "workerinput", None)
        _report_build = ReportBuild(Path(worker[BUILD_FOLDER_KEY]) if worker else _build_folder)
        last = set(reading) | {
            item for item in items if isinstance(item, ExecutedCell) and item.path.parent == NOTEBOOK_DIR
        }
        items[:] = [item for item in items if item not in last] + [item for item in items if item in last]


def pytest_sessionfinish(session, exitstatus):
    if _report_build is not None:
        _report_build.close(stopped=exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop))
    if _build_folder is not None:  # every process of the session is done with it
        pid = _build_folder / "pid"
        if pid.exists() and not (_build_folder / "exit").exists():  # a worker that started it was killed
            try:
                os.killpg(int(pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(_build_folder, ignore_errors=True)


@pytest.fixture(scope="session")
def built_report() -> Path:
    """The report `make report` builds at its defaults (built beside the other tests from the end of collection)."""
    if _report_build is None:
        pytest.fail("the report build was not started at collection", pytrace=False)
    return _report_build.result()


# ---------------------------------------------------------------- nbval on an execution made once
INJECTED_TAG = "injected-parameters"  # papermill's cell of the parameters it was given
OUTPUT_PARAMETERS = {"LEDGER_CSV"}  # where the report has a notebook write its ledger rows: no output shows it


def pytest_addoption(parser):
    parser.getgroup("nbval").addoption(
        "--nbval-executed",
        metavar="DIR",
        default=None,
        help="compare each notebook's committed outputs with its executed copy in DIR (papermill's, at the "
        "notebook's defaults, e.g. report/notebooks) instead of running it",
    )


def executed_folder(config, notebook: Path) -> Path | None:
    """Where an executed copy of notebook is to be compared with its committed outputs, or None: nbval runs it."""
    if config.option.nbval_executed:
        return Path(config.option.nbval_executed)
    if _report_build is not None and notebook.parent == NOTEBOOK_DIR and _report_build.succeeded():
        return _report_build.out / "notebooks"
    return None  # (a build that failed says why in the tests that read it; nbval then runs the notebook itself)


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path, parent):
    """nbval's notebooks, as ExecutedNotebook: the same cells and checks, on an execution made once where there is one."""
    collectors = yield
    return [ExecutedNotebook.from_parent(parent, path=file_path) if type(c) is IPyNbFile else c for c in collectors]


class ExecutedNotebook(IPyNbFile):
    """nbval's notebook, whose cells compare an executed copy of it where there is one instead of running it."""

    executed = None  # the executed copy's code cells, papermill's own left out; None: nbval runs the notebook

    def collect(self):
        for cell in super().collect():
            yield ExecutedCell.from_parent(
                self, name=cell.name, cell_num=cell.cell_num, cell=cell.cell, options=cell.options
            )

    def setup(self):
        folder = executed_folder(self.config, self.path)
        if folder is None:
            return super().setup()
        from kvlab.report.params import notebook_parameters

        copy_path = folder / self.path.name
        if not copy_path.exists():
            pytest.fail(f"{self.path.name}: no executed copy {copy_path} to compare", pytrace=False)
        executed = nbformat.read(copy_path, as_version=4)
        defaults = notebook_parameters(self.path)
        given = executed.metadata.get("papermill", {}).get("parameters", {})
        other = {
            name: value
            for name, value in given.items()
            if name not in OUTPUT_PARAMETERS and (name not in defaults or defaults[name] != value)
        }
        if other:
            pytest.fail(f"{copy_path} ran with other values than {self.path.name}'s defaults: {other}", pytrace=False)
        cells = [c for c in executed.cells if c.cell_type == "code" and INJECTED_TAG not in c.metadata.get("tags", [])]
        if [c.source for c in cells] != [c.source for c in self.nb.cells if c.cell_type == "code"]:
            pytest.fail(f"{copy_path} is not an execution of {self.path}: their code cells differ", pytrace=False)
        self.setup_sanitize_files()
        self.executed = cells


class ExecutedCell(IPyNbCell):
    """nbval's cell: its committed outputs against those of the executed copy, by nbval's comparison and message."""

    def runtest(self):
        if self.parent.executed is None:
            return super().runtest()
        if self.options["skip"]:
            pytest.skip()
        outs = coalesce_streams(copy.deepcopy(self.parent.executed[self.cell_num].outputs))
        self.test_outputs = outs
        error = next((o for o in outs if o.output_type == "error"), None)
        if error is not None and not self.options["check_exception"]:
            self.raise_cell_error("Cell execution caused an exception", "\n" + "\n".join(error.traceback))
        # as nbval's runtest ends, on the outputs it would have read from a kernel
        unrun = self.cell.execution_count is None
        if unrun and self.cell.outputs:
            self.raise_cell_error("Unrun reference cell has outputs")
        if self.options["check"] and not unrun and not self.compare_outputs(outs, coalesce_streams(self.cell.outputs)):
            self.raise_cell_error("Cell outputs differ", "\n".join(self.comparison_traceback))
