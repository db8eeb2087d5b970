"""The vLLM paper as a second source of the ledger: its file, the range and above kinds, counts per source."""

import pandas as pd
import pytest

from kvlab.sections.shared import ledger, present


def _row(table, row, column, value, **extra):
    return pd.DataFrame([dict(section=6, table=table, row=row, column=column, reproduced=value, **extra)])


def _status(frame, table, row, column):
    return frame[(frame["table"] == table) & (frame["row"] == row) & (frame["column"] == column)]["status"].item()


def test_the_papers_figures_are_section_6_cite_the_paper_and_use_known_kinds():
    figures = ledger.paper_figures()
    assert set(figures["section"]) == {6} and len(figures) == 18
    assert figures["note"].str.contains("arXiv 2309.06180").all()
    assert set(figures["tolerance_kind"]) <= set(ledger.TOLERANCE_KINDS)
    ranges = figures[figures["tolerance_kind"] == "range"]
    assert (ranges["tolerance"] > ranges["value"]).all()
    assert list(ledger.figures(6)["source"].unique()) == ["vllm-paper"]
    assert list(ledger.figures(1)["source"].unique()) == ["article"]


@pytest.mark.parametrize("value, status", [(1.69, "fail"), (1.7, "pass"), (2.2, "pass"), (2.7, "pass"), (2.71, "fail")])
def test_range_passes_from_its_low_to_its_high_end_inclusive(value, status):
    out = ledger.compare(_row("s6.2", "vLLM over Orca (Oracle)", "sustained_rate_ratio_x", value), section=6)
    assert _status(out, "s6.2", "vLLM over Orca (Oracle)", "sustained_rate_ratio_x") == status
    assert out.set_index("row").loc["vLLM over Orca (Oracle)", "tolerance"] == "range 1.7..2.7"


@pytest.mark.parametrize("value, status", [(0.99, "fail"), (1.0, "fail"), (1.01, "pass")])
def test_above_passes_only_strictly_above(value, status):
    out = ledger.compare(_row("fig18b", "Alpaca", "latency_256_over_16_x", value), section=6)
    assert _status(out, "fig18b", "Alpaca", "latency_256_over_16_x") == status
    assert out.set_index("row").loc["Alpaca", "tolerance"] == "above 1"


def test_rel_and_abs_rows_of_the_paper():
    def status(table, row, column, value):
        return _status(ledger.compare(_row(table, row, column, value), section=6), table, row, column)

    assert status("fig13a", "Orca (Max)", "mean_batched_requests", 7.13) == "pass"  # 1.9% from 7.00
    assert status("fig13a", "Orca (Max)", "mean_batched_requests", 7.15) == "fail"  # 2.1%
    assert status("fig2", "vLLM", "token_states_pct", 91.3) == "pass"  # 5.0 points, as printed
    assert status("fig2", "vLLM", "token_states_pct", 91.2) == "fail"  # 5.1 points


def test_a_figure_the_paper_does_not_publish_is_an_error_naming_its_file():
    with pytest.raises(ValueError, match="is not in paper_figures.csv"):
        ledger.compare(_row("fig13a", "FasterTransformer", "mean_batched_requests", 1.0), section=6)


def test_collect_counts_each_source_apart(tmp_path):
    path = tmp_path / "06.csv"
    ledger.save(ledger.compare(_row("fig13a", "Orca (Max)", "mean_batched_requests", 7.0), section=6), path)
    both = ledger.collect([path], sources=tuple(ledger.SOURCES))
    assert list(both.columns) == ledger.LEDGER_COLUMNS
    assert len(both) == len(ledger.article_figures()) + len(ledger.paper_figures())
    assert ledger.summary(both, "vllm-paper") == {
        "total": 18,
        "compared": 18,
        "pass": 1,
        "fail": 0,
        "missing": 17,
        "not_compared": 0,
    }
    assert ledger.summary(both, "article")["pass"] == 0
    article_only = ledger.collect([path])  # the article's figures alone: section 6's rows are not among them
    assert len(article_only) == len(ledger.article_figures()) and set(article_only["source"]) == {"article"}


def test_the_front_page_counts_the_article_and_the_paper_separately(tmp_path):
    from kvlab.report import build, render

    path = tmp_path / "06.csv"
    ledger.save(ledger.compare(_row("fig13a", "Orca (Max)", "mean_batched_requests", 7.0), section=6), path)
    rows = ledger.collect([path], sources=tuple(ledger.SOURCES))
    index = render.index_body([], rows, build.provenance(), {}, "", {})
    article = len(ledger.article_figures())
    assert (
        f"<strong>0 of {article}</strong> figures the article publishes reproduced (0 not within tolerance, "
        f"{article} missing); <strong>1 of 18</strong> of the vLLM paper's (0 not within tolerance, 17 missing)."
    ) in index
    page = render.ledger_body(rows)
    assert "Section 6: the vLLM paper's figures" in page and "1.70 to 2.70" not in page and "1.7 to 2.7" in page


def test_a_published_range_shows_as_low_to_high_and_above_as_greater_than():
    shown = present.ledger(
        ledger.compare(_row("s6.2", "vLLM over Orca (Max)", "sustained_rate_ratio_x", 3.0), section=6), why=True
    )
    header = list(shown.header)
    assert "paper" in header and "article" not in header and header[-1] == "why"
    rows = {r[1]: r for r in shown.rows}
    assert rows["vLLM over Orca (Max)"][header.index("paper")] == "2.7 to 8.0"
    assert rows["Alpaca"][header.index("paper")] == "> 1.00"
