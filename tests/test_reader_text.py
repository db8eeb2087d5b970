"""Reader-facing text (the notebooks' prose and tables as committed, which the report shows without code) names no
Python identifier of kvlab's: no module path, constant, call or assignment."""

import html
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
PATTERNS = {
    "a module path": re.compile(r"\bkvlab\.[a-z_]+\b"),
    "a constant": re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b"),
    "a call": re.compile(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\("),
    "an assignment": re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+ = "),
}


def reader_texts(notebook: dict):
    """(cell index, text) of what a reader sees: markdown cells, and the Markdown and HTML (tags dropped) outputs."""
    for i, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "markdown":
            yield i, "".join(cell["source"])
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/markdown" in data:
                yield i, "".join(data["text/markdown"])
            if "text/html" in data:
                yield i, html.unescape(re.sub(r"<[^>]+>", " ", "".join(data["text/html"])))


# Names a reader types to act on the report's advice, as they would a command's flag: the environment variables kvlab
# reads (kvlab.workloads.traces: "set TRACE_DIR or run make traces").
ENVIRONMENT_VARIABLES = {"TRACE_DIR"}


def identifiers(text: str) -> list[str]:
    """What in text reads as a Python identifier of kvlab's, each with what it is (an environment variable a reader
    is told to set is not one)."""
    return [
        f"{what}: {m.group(0)!r}"
        for what, p in PATTERNS.items()
        for m in p.finditer(text)
        if m.group(0) not in ENVIRONMENT_VARIABLES
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_python_identifier_in_what_the_report_shows(path):
    found = [f"cell {i}: {hit}" for i, text in reader_texts(json.loads(path.read_text())) for hit in identifiers(text)]
    assert not found, found


def test_the_check_finds_each_kind():
    text = "(kvlab.core.buddy) STAND_IN_CONFIG, num_gpu_blocks = 984 and check_workload(w)"
    assert len(identifiers(text)) == 4
    assert identifiers("vLLM's max_num_seqs of 256, 1,000 requests, Fig. 13a, GiB") == []
    assert identifiers("set TRACE_DIR or run make traces") == []
