"""Repository-wide pytest hooks: what needs the real request traces is skipped, saying why, without them.

Notebook 04 is about the traces and is skipped whole. Notebooks 01 and 02 reproduce the article first and
only then rerun their sections on a trace: there nbval still checks every cell except those tagged
"needs-trace", so the article's figures and ledger stay tested on a machine without the files.
"""
from __future__ import annotations

import pytest

# Notebooks (by file name) that read the real trace files of data/traces.toml in every cell.
NOTEBOOKS_NEEDING_TRACES = {"04_traces.ipynb"}
# Cells with this tag (notebooks 01 and 02) read the trace of their TRACE parameter's default.
TRACE_CELL_TAG = "needs-trace"
TRACE_CELL_DEFAULT = "azure"


def pytest_collection_modifyitems(config, items):
    from kvlab.workloads import traces

    missing = traces.missing_traces()
    if not missing:
        return
    reason = (f"real trace files {', '.join(missing)} not in {traces.trace_dir()} "
              "(set TRACE_DIR or run make traces)")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        cell = getattr(item, "cell", None)  # an nbval notebook cell
        if item.path.name in NOTEBOOKS_NEEDING_TRACES:
            item.add_marker(skip)
        elif cell is not None and TRACE_CELL_TAG in cell.get("metadata", {}).get("tags", []) \
                and TRACE_CELL_DEFAULT in missing:
            item.add_marker(skip)
