"""Repository-wide pytest hooks: notebooks that need the real request traces are skipped, saying why, without them."""
from __future__ import annotations

import pytest

# Notebooks (by file name) that read the real trace files of data/traces.toml.
NOTEBOOKS_NEEDING_TRACES = {"04_traces.ipynb"}


def pytest_collection_modifyitems(config, items):
    from kvlab import traces

    missing = traces.missing_traces()
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"real trace files {', '.join(missing)} not in {traces.trace_dir()} "
                                   "(set TRACE_DIR or run make traces)")
    for item in items:
        if item.path.name in NOTEBOOKS_NEEDING_TRACES:
            item.add_marker(skip)
