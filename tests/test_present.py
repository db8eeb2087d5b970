"""The one table formatter: what a reader sees does not depend on the machine's last bits, and reads well."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import ROOT
from kvlab.sections.shared import present

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12), st.integers(0, 4))
def test_a_number_shown_never_depends_on_its_last_bits_and_is_never_minus_zero(x, decimals):
    shown = present.cell(x, decimals)
    assert not re.fullmatch(r"-0(\.0*)?", shown)
    neighbour = present.cell(float(np.nextafter(x, math.inf)), decimals)
    if shown != neighbour:  # only a value on a rounding edge may change with its last bit
        edge = abs(x * 10**decimals - math.floor(x * 10**decimals) - 0.5)
        assert edge < 1e-6 * max(1.0, abs(x) * 10**decimals)


@pytest.mark.parametrize(
    "value, decimals, shown",
    [
        (-1.8e-14, 3, "0.000"),
        (31.25, 1, "31.3"),
        (15.625, 2, "15.63"),
        (1234567.891, 1, "1,234,567.9"),
        (81920000, None, "81,920,000"),
        (float("nan"), 2, ""),
        (None, 2, ""),
        (pd.NA, 2, ""),
        (True, None, "✓"),
        ("fail", None, "✗ fail"),
        ("pass", None, "✓ pass"),
        (float("inf"), 2, "∞"),
        ("text", None, "text"),
    ],
)
def test_cells(value, decimals, shown):
    assert present.cell(value, decimals) == shown


@pytest.mark.parametrize(
    "name, label",
    [
        ("mean_latency_s", "mean latency (s)"),
        ("p95_latency_s", "p95 latency (s)"),
        ("waste_pct", "waste (%)"),
        ("prompt_p99_tokens", "prompt p99 (tokens)"),
        ("available_kv_gib", "available KV (GiB)"),
        ("max_num_requests", "requests that fit"),
        ("block_size", "block size (tokens)"),
    ],
)
def test_labels_carry_units(name, label):
    assert present.label(name) == label


def test_a_meaningless_index_is_hidden_and_a_named_one_shown():
    plain = present.table(pd.DataFrame({"a_s": [1.234, 2.0]}))
    assert plain.header == ("a (s)",) and plain.rows == (("1.23",), ("2.00",))
    named = present.table(pd.DataFrame({"a_s": [1.0]}, index=pd.Index(["x"], name="policy")))
    assert named.header == ("policy", "a (s)") and named.index_columns == 1


def test_wide_tables_are_split_into_parts_that_repeat_the_index():
    frame = pd.DataFrame({f"c{i}_s": [float(i)] for i in range(20)}, index=pd.Index(["r"], name="row"))
    parts = present.table(frame).parts(9)
    assert len(parts) == 3 and all(p.header[0] == "row" and len(p.header) <= 9 for p in parts)
    assert [p.caption for p in parts] == ["part 1 of 3", "part 2 of 3", "part 3 of 3"]
    assert present.table(frame)._repr_html_().count("<table") == 3
    # eight columns beside a two-column index fill two parts of four, not seven and an orphan one
    eight = pd.DataFrame({f"c{i}_s": [float(i)] for i in range(8)}, index=pd.MultiIndex.from_tuples([("a", "b")]))
    assert [len(p.header) - 2 for p in present.table(eight).parts(9)] == [4, 4]


def outputs(path):
    for i, cell in enumerate(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"):
        for output in cell.get("outputs", []):
            yield i, output


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_table_in_the_notebooks_goes_through_the_formatter(path):
    for i, output in outputs(path):
        html = "".join(output.get("data", {}).get("text/html", ""))
        if "<table" in html:
            assert 'class="kvlab"' in html and 'class="dataframe"' not in html, f"{path.name} cell {i}: raw pandas"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_output_shows_float_noise_or_a_negative_zero(path):
    for i, output in outputs(path):
        text = "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))
        assert not re.search(r"(?<![\w.])-0\.0*(?![\d])", text), f"{path.name} cell {i} prints a negative zero"
        assert not re.search(r"\d\.\d{7,}", text), f"{path.name} cell {i} prints float noise"


def test_a_column_the_same_in_every_row_can_move_to_the_caption():
    frame = pd.DataFrame(
        {"gpus": [6, 8], "async": ["✓", "✓"], "share": ["0.70 / 0.90"] * 2}, index=pd.Index([1, 5], name="rank")
    )
    t = present.table(frame, caption="The best", same_in_caption=True)
    assert t.header == ("rank", "gpus") and t.caption == "The best (every row: async ✓; share 0.70 / 0.90)"
    assert present.table(frame).header == ("rank", "gpus", "async", "share")  # by default every column stays
    assert present.table(frame.iloc[:1], same_in_caption=True).header == ("rank", "gpus", "async", "share")
