"""Notebooks 01 and 02: the real-trace cells are tagged for conftest.py and sit after the ledger, before the headline."""

import json

import pytest

from conftest import ROOT

TAG = "needs-trace"


@pytest.mark.parametrize("name", ["01_allocation.ipynb", "02_batching.ipynb"])
def test_trace_cells_are_tagged_and_between_ledger_and_headline(name):
    cells = json.loads((ROOT / "notebooks" / name).read_text())["cells"]
    code = [
        (i, "".join(c["source"]), TAG in c["metadata"].get("tags", []))
        for i, c in enumerate(cells)
        if c["cell_type"] == "code" and "parameters" not in c["metadata"].get("tags", [])
    ]
    uses_trace = [i for i, src, _ in code if "traces." in src or "trace." in src or "trace_" in src]
    tagged = [i for i, _, is_tagged in code if is_tagged]
    assert tagged and tagged == uses_trace  # every cell that touches the trace is skipped without the files
    ledger = next(i for i, src, _ in code if "ledger_rows(" in src or "ledger.compare(" in src)
    assert ledger < min(tagged) and max(tagged) < code[-1][0]  # the headline (last cell) needs no trace
    params = next(c for c in cells if "parameters" in c["metadata"].get("tags", []))
    assert 'TRACE = "azure"' in "".join(params["source"]) and 'TRACE_DIR = ""' in "".join(params["source"])
