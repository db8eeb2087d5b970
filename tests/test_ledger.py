"""The reproduction ledger: every article figure, rounding as the article rounds, statuses."""

import re

import pandas as pd
import pytest

from conftest import SHARED
from kvlab.sections.shared import ledger


@pytest.mark.parametrize(
    "value, decimals, printed",
    [
        (31.25, 1, 31.3),
        (15.625, 2, 15.63),
        (15.625, 1, 15.6),
        (0.48828125, 2, 0.49),
        (2.5, 0, 3.0),
        (-2.5, 0, -3.0),
    ],
)
def test_round_half_up_matches_the_article(value, decimals, printed):
    assert ledger.round_half_up(value, decimals) == printed


def _rows(section, table, row, column, value, **extra):
    return pd.DataFrame([dict(section=section, table=table, row=row, column=column, reproduced=value, **extra)])


def _status(frame, row, column):
    return frame[(frame["row"] == row) & (frame["column"] == column)]["status"].item()


def test_abs_zero_tolerance_passes_only_the_printed_digits():
    ok = ledger.compare(_rows(3, "memory", "8000", "8_requests_gib", 31.25), section=3)
    assert _status(ok, "8000", "8_requests_gib") == "pass"
    bad = ledger.compare(_rows(3, "memory", "8000", "8_requests_gib", 31.2), section=3)
    assert _status(bad, "8000", "8_requests_gib") == "fail"


def test_rel_tolerance_and_missing_rows():
    out = ledger.compare(_rows(1, "workload", "all", "used_tokens", 11336014 * 1.019), section=1).set_index("column")
    assert out.loc["used_tokens", "status"] == "pass"
    assert out.loc["mean_tokens", "status"] == "missing"
    out = ledger.compare(_rows(1, "workload", "all", "used_tokens", 11336014 * 1.021), section=1).set_index("column")
    assert out.loc["used_tokens", "status"] == "fail"


def test_band_passes_when_the_article_value_is_inside():
    inside = _rows(2, "mixed", "static", "mean_latency_s", 140.0, band_low=120.0, band_high=160.0)
    outside = _rows(2, "mixed", "static", "mean_latency_s", 140.0, band_low=120.0, band_high=150.0)
    assert ledger.compare(inside, section=2).iloc[0]["status"] in {"pass"}
    got = ledger.compare(outside, section=2)
    assert got[got["column"] == "mean_latency_s"].iloc[0]["status"] == "fail"


def test_unknown_figure_is_an_error():
    with pytest.raises(ValueError, match="is not in article_figures.csv"):
        ledger.compare(_rows(3, "memory", "1000", "7_requests_gib", 1.0))


def test_collect_gives_every_article_figure(tmp_path):
    path = tmp_path / "03.csv"
    ledger.save(ledger.compare(_rows(3, "fit", "1000", "max_num_requests", 131), section=3), path)
    full = ledger.collect([path, tmp_path / "absent.csv"])
    assert list(full.columns) == ledger.LEDGER_COLUMNS
    assert len(full) == len(ledger.article_figures())
    assert full["status"].value_counts().to_dict() == {"missing": len(full) - 1, "pass": 1}


def _figures_md_numbers(section_text):
    """Numbers printed in the markdown tables of one FIGURES.md section (cells only, not set-up prose)."""
    numbers, in_body = [], False
    for line in section_text.splitlines():
        if not line.startswith("|"):
            in_body = False
        elif set(line) <= set("|-: "):
            in_body = True  # the separator: rows below it are data, the one above is the header
        elif in_body:
            for cell in line.strip("|").split("|")[1:]:
                m = re.search(r"-?[\d,]+(?:\.\d+)?", cell)
                if m:
                    numbers.append(float(m.group().replace(",", "")))
    return numbers


@pytest.mark.skipif(not (SHARED / "article" / "FIGURES.md").exists(), reason="../shared/article/FIGURES.md is absent")
def test_every_number_in_the_article_tables_is_in_the_ledger():
    text = (SHARED / "article" / "FIGURES.md").read_text()
    parts = re.split(r"^## Section (\d)", text, flags=re.M)
    figures = ledger.article_figures()
    checked = 0
    for number, body in zip(parts[1::2], parts[2::2]):
        values = set(figures[figures["section"] == int(number)]["value"].round(6))
        for v in _figures_md_numbers(body):
            assert round(v, 6) in values, f"section {number}: {v} is in FIGURES.md but not in the ledger"
            checked += 1
    assert checked >= 55


@pytest.mark.parametrize(
    "percentile, named", [(28.5, "29th"), (7.5, "8th"), (3.0, "3rd"), (11.5, "12th"), (0.5, "1st")]
)
def test_a_seed_percentile_is_named_rounded_half_up(percentile, named):
    from kvlab.sections import s02_batching as batching

    note = batching.band_note(pd.Series({"article_percentile": percentile, "num_seeds": 200}))
    assert note == f"The article's value lies at the {named} percentile of kvlab's 200 seeds."


def test_a_source_tables_key_is_shown_as_a_reader_names_it():
    assert ledger.table_name("fig13a") == "Fig. 13a" and ledger.table_name("fig2") == "Fig. 2"
    assert ledger.table_name("s6.2") == "§6.2"
    assert ledger.table_name("allocation") == "allocation" and ledger.table_name("figure") == "figure"
    assert ledger.table_name("equal150") == "equal outputs (150 tokens)"
    # every source table reads as words, a figure or a part: no key with digits run into it (equal150, fig13a)
    for table in set(ledger.article_figures(1)["table"]) | set(ledger.figures()["table"]):
        assert re.fullmatch(r"[A-Za-z' ]+(\(\d+ tokens\))?|Fig\. \d+[a-z]?|§[\d.]+", ledger.table_name(table)), table
