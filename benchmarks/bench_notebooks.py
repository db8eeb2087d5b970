"""Each notebook with its defaults (kernel start included), and the whole report as `make report` builds it."""

import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

import kvlab.report.build as report

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
# Targets from the issues, in seconds.
TARGETS_S = {"01_allocation": 15, "02_batching": 20, "03_capacity": 10}
REPORT_TARGET_S = 60


def main() -> None:
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        client = NotebookClient(notebook, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
        start = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - start
        target = f" (target < {TARGETS_S[path.stem]} s)" if path.stem in TARGETS_S else ""
        print(f"   notebooks/{path.name}: {seconds:.1f} s{target}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        report.build(report.ROOT / "params.yaml", [], Path(tmp) / "report", log=lambda *a, **k: None)
        seconds = time.perf_counter() - start
    print(
        f"   make report (all notebooks, HTML, PDF, ledger) on a set-up machine: {seconds:.1f} s "
        f"(target < {REPORT_TARGET_S} s)"
    )
