"""A number the prose states is printed as the tables beside it print it: a figure a table shows at 2 decimals is not
quoted at 1 (27.2% beside a table's 27.19) or at 3. Checked over the committed notebooks: each number of 3 or more
significant digits in a notebook's prose against every number its tables and printed lines show."""

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
# Pairs that round to each other but are different quantities (notebook, the prose's number, the table's): each
# says what the two are.
DIFFERENT_QUANTITIES = {
    ("02_batching", "17.4", "17.38"): "the longest arrival gap over the mean gap; continuous batching's mean queue (s)",
    ("06_memory_budget", "14.37", "14.4"): "Orca (Oracle)'s batch at 8 requests/s; its batch at 2 in the variant table",
    ("06_memory_budget", "2.55", "2.551"): "vLLM's batch over Orca (Oracle)'s; vLLM's normalized latency at 8/s",
    (
        "06_memory_budget",
        "14.3",
        "14.30",
    ): "the AMD kernel's block-1 slowdown (%); Orca (Oracle)'s batch with mixed steps",
    ("06_memory_budget", "16.9", "16.887"): "requests in the system over time (Little's law); the batch over steps",
    ("05_calibration", "20.0", "19.98"): "a term's share of a miss over another's; a step's time on the A100 (ms)",
    ("05_calibration", "11.8", "11.82"): "Qwen3-32B's TPOT gap to vLLM (ms); a step's time on the H100 (ms)",
    (
        "05_calibration",
        "25.21",
        "25.2",
    ): "Qwen3-32B's mean wait before a first step (s); what Llama-3.1-8B's dense layers add to TPOT (ms)",
}


def decimals(number: str) -> int:
    return len(number.split(".")[1]) if "." in number else 0


def significant(number: str) -> int:
    return len(number.replace(".", "").lstrip("0"))


def rounds_to(number: str, places: int) -> Decimal:
    return Decimal(number).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


def texts(notebook: dict) -> tuple[list[str], str]:
    """(the prose a notebook shows: its Markdown outputs, everything else it prints: tables and lines)."""
    prose, printed = [], []
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/markdown" in data:
                prose.append("".join(data["text/markdown"]))
            elif "text/plain" in data:
                printed.append("".join(data["text/plain"]))
            if "text" in output:
                printed.append("".join(output["text"]))
    return prose, "\n".join(printed)


def mismatches(prose: list[str], printed: str) -> list[tuple[str, str]]:
    """(prose number, table number) pairs that are one figure at two roundings: both of 3 or more significant digits,
    of different decimals, the one rounding (half up) to the other."""
    shown = {n.replace(",", "") for n in NUMBER.findall(printed)}
    shown = {n for n in shown if decimals(n) and significant(n) >= 3}
    found = []
    for text in prose:
        for raw in NUMBER.findall(text):
            x = raw.replace(",", "")
            if x in shown or not decimals(x) or significant(x) < 3:
                continue
            for y in shown:
                if decimals(y) != decimals(x) and (
                    rounds_to(y, decimals(x)) == Decimal(x) or rounds_to(x, decimals(y)) == Decimal(y)
                ):
                    found.append((x, y))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_quotes_a_figure_at_its_tables_rounding(path):
    found = [
        pair
        for pair in mismatches(*texts(json.loads(path.read_text())))
        if (path.stem, *pair) not in DIFFERENT_QUANTITIES
    ]
    assert not found, f"{path.stem}: prose number and the table's: {found}"


def test_the_check_finds_a_figure_at_two_roundings_and_only_that():
    table = "waste (%)  27.19\nlatency (s)  363.35"
    assert mismatches(["leaves 27.2% empty"], table) == [("27.2", "27.19")]
    assert mismatches(["from 363.4 s"], table) == [("363.4", "363.35")]
    assert mismatches(["leaves 27.19% empty, 0.5 s, 4,096 tokens"], table) == []
