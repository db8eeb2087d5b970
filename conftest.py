"""Repository-wide pytest hooks: what needs the real request traces is skipped, saying why, without them.

Notebook 04 is about the traces and is skipped whole. Notebooks 01 and 02 reproduce the article first and
only then rerun their sections on a trace: there nbval still checks every cell except those tagged
"needs-trace", so the article's figures and ledger stay tested on a machine without the files.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest


def needs_traces(path: Path) -> bool:
    """A notebook that reads the real trace files in every cell says so in its metadata (kvlab.requires)."""
    try:
        return "traces" in json.loads(path.read_text()).get("metadata", {}).get("kvlab", {}).get("requires", [])
    except (OSError, ValueError):
        return False


# Cells with this tag (notebooks 01 and 02) read the trace of their TRACE parameter's default.
TRACE_CELL_TAG = "needs-trace"
TRACE_CELL_DEFAULT = "azure"


def pytest_collection_modifyitems(config, items):
    from kvlab.workloads import traces

    missing = traces.missing_traces()
    if not missing:
        return
    where = f"not in {traces.trace_dir()} (set TRACE_DIR or run make traces)"
    whole = pytest.mark.skip(reason=f"needs the real trace files {', '.join(missing)}, which are {where}")
    cells = pytest.mark.skip(reason=f"a cell on the {TRACE_CELL_DEFAULT} trace (TRACE's default), whose file is {where}")
    for item in items:
        cell = getattr(item, "cell", None)  # an nbval notebook cell
        if item.path.suffix == ".ipynb" and needs_traces(item.path):
            item.add_marker(whole)
        elif cell is not None and TRACE_CELL_TAG in cell.get("metadata", {}).get("tags", []) \
                and TRACE_CELL_DEFAULT in missing:
            item.add_marker(cells)
