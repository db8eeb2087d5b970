"""The reproduction ledger: every figure the article publishes, and the vLLM paper's figures section 6
reproduces, set against kvlab's value.

Two sources, one file each, the one place that holds their figures and tolerances (same columns):
data/article_figures.csv (source "article", sections 1-3) and data/paper_figures.csv (source "vllm-paper":
Kwon et al., SOSP 2023, arXiv 2309.06180; section 6). The ledger's "article" column holds the published value
of whichever source. Tolerance kinds:
- ``abs``: pass when |printed - article| <= tolerance, where printed is kvlab's value rounded
  the way the article rounds (half up, to the article's number of decimals): with tolerance 0
  kvlab prints exactly what the article prints;
- ``rel``: pass when |reproduced - article| <= tolerance x |article|;
- ``band``: pass when the article's value lies inside kvlab's [band_low, band_high] (seed bands);
- ``range``: a published range: pass when value <= reproduced <= tolerance (the row's value is the range's
  low end, its tolerance the high end);
- ``above``: pass when reproduced > value.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pandas as pd

DATA_DIR = Path(__file__).resolve().parents[3] / "data"
ARTICLE_FIGURES_CSV = DATA_DIR / "article_figures.csv"
PAPER_FIGURES_CSV = DATA_DIR / "paper_figures.csv"
# Each source of published figures, its file, and how the report names it.
SOURCES = {"article": ARTICLE_FIGURES_CSV, "vllm-paper": PAPER_FIGURES_CSV}
SOURCE_NAMES = {"article": "the article", "vllm-paper": "the vLLM paper"}
KEY = ["section", "table", "row", "column"]
LEDGER_COLUMNS = [
    "source",
    "section",
    "table",
    "row",
    "column",
    "article",
    "reproduced",
    "band_low",
    "band_high",
    "tolerance",
    "status",
    "why",
]
STATUSES = ("pass", "fail", "missing", "not compared")
SECTIONS = (1, 2, 3)
PAPER_SECTIONS = (6,)
TOLERANCE_KINDS = ("abs", "rel", "band", "range", "above")


def article_figures(section: int | None = None) -> pd.DataFrame:
    """The article's published figures (data/article_figures.csv), optionally of one section."""
    figures = pd.read_csv(ARTICLE_FIGURES_CSV, dtype={"row": str, "table": str, "column": str})
    if section is not None:
        if section not in SECTIONS:
            raise ValueError(f"section={section!r} is not allowed: must be one of 1, 2, 3")
        figures = figures[figures["section"] == section]
    return figures.reset_index(drop=True)


def paper_figures(section: int | None = None) -> pd.DataFrame:
    """The vLLM paper's figures that kvlab reproduces (data/paper_figures.csv), optionally of one section."""
    figures = pd.read_csv(PAPER_FIGURES_CSV, dtype={"row": str, "table": str, "column": str})
    if section is not None:
        if section not in PAPER_SECTIONS:
            raise ValueError(
                f"section={section!r} is not allowed: the vLLM paper's figures are in section "
                + ", ".join(map(str, PAPER_SECTIONS))
            )
        figures = figures[figures["section"] == section]
    return figures.reset_index(drop=True)


def figures(section: int | None = None, sources=None) -> pd.DataFrame:
    """The published figures of sources (default: every source), with a first column "source", optionally of one
    section."""
    sources = tuple(SOURCES) if sources is None else tuple(sources)
    for source in sources:
        if source not in SOURCES:
            raise ValueError(f"source={source!r} is not allowed: must be one of {', '.join(SOURCES)}")
    if section is not None and section not in SECTIONS + PAPER_SECTIONS:
        raise ValueError(
            f"section={section!r} is not allowed: must be one of " + ", ".join(map(str, SECTIONS + PAPER_SECTIONS))
        )
    read = {"article": article_figures, "vllm-paper": paper_figures}
    parts = []
    for source in sources:
        part = read[source]()
        if section is not None:
            part = part[part["section"] == section]
        parts.append(part.assign(source=source))
    found = pd.concat(parts, ignore_index=True)
    return found[["source"] + [c for c in found.columns if c != "source"]]


def source_of(section: int) -> str:
    """The source whose figures a section reproduces: the vLLM paper's for section 6, else the article's."""
    return "vllm-paper" if section in PAPER_SECTIONS else "article"


def round_half_up(value: float, decimals: int) -> float:
    """value rounded to decimals places, ties away from zero (as the article prints: 31.25 -> 31.3)."""
    return float(Decimal(repr(float(value))).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))


def as_printed(frame: pd.DataFrame, section: int, table: str) -> pd.DataFrame:
    """A wide table formatted the way the article prints it: its decimals per column, thousands separators."""
    figures = article_figures(section)
    figures = figures[figures["table"] == table]
    decimals = figures.groupby("column")["decimals"].first()
    out = frame.copy().astype(object)
    for column in frame.columns:
        if column not in decimals:
            raise ValueError(f"column={column!r} is not allowed: table {table!r} has {sorted(decimals.index)}")
        d = int(decimals[column])
        spec = f",.{d}f"
        out[column] = [format(round_half_up(v, d), spec) for v in frame[column]]
    return out


def from_table(section: int, table: str, frame: pd.DataFrame, *, band: pd.DataFrame | None = None) -> pd.DataFrame:
    """Reproduced values in long form from a wide table (index = row labels, columns = column labels).

    band, when given, is a frame of the same shape whose cells are (low, high) pairs.
    """
    long = frame.stack().rename("reproduced").reset_index()
    long.columns = ["row", "column", "reproduced"]
    long.insert(0, "table", table)
    long.insert(0, "section", section)
    long["row"] = long["row"].map(str)
    if band is not None:
        pairs = band.stack().reset_index(drop=True)
        long["band_low"] = [p[0] for p in pairs]
        long["band_high"] = [p[1] for p in pairs]
    return long


def _status(row) -> tuple[float, str]:
    if pd.isna(row["reproduced"]):
        return np.nan, "missing"
    article, reproduced, kind = row["value"], row["reproduced"], row["tolerance_kind"]
    difference = reproduced - article
    if kind == "band":
        low, high = row.get("band_low", np.nan), row.get("band_high", np.nan)
        if pd.isna(low) or pd.isna(high):
            return difference, "missing"
        return difference, "pass" if low <= article <= high else "fail"
    if kind == "range":
        return difference, "pass" if article <= reproduced <= float(row["tolerance"]) else "fail"
    if kind == "above":
        return difference, "pass" if reproduced > article else "fail"
    tolerance = float(row["tolerance"])
    if kind == "abs":
        printed = round_half_up(reproduced, int(row["decimals"]))
        # 1e-9 relative slack only absorbs binary floating-point noise in the subtraction.
        ok = abs(printed - article) <= tolerance + 1e-9 * max(1.0, abs(article))
    elif kind == "rel":
        ok = abs(difference) <= tolerance * abs(article)
    else:
        raise ValueError(f"tolerance_kind={kind!r} is not allowed: must be one of {', '.join(TOLERANCE_KINDS)}")
    return difference, "pass" if ok else "fail"


def compare(
    reproduced: pd.DataFrame | list[pd.DataFrame], section: int | None = None, sources=("article",)
) -> pd.DataFrame:
    """Join reproduced values with the published figures: source, article (the published value), reproduced,
    difference, tolerance, status.

    Every figure of the section (of its source), or without a section of the sources, appears; one kvlab did not
    reproduce is 'missing'.
    """
    if isinstance(reproduced, list):
        reproduced = pd.concat(reproduced, ignore_index=True) if reproduced else None
    if reproduced is None or reproduced.empty:
        reproduced = pd.DataFrame(columns=KEY + ["reproduced"])
    reproduced = reproduced.astype({"section": int, "table": str, "row": str, "column": str})
    published = figures(section, [source_of(section)] if section is not None else sources)
    unknown = reproduced.merge(published[KEY], on=KEY, how="left", indicator=True)
    unknown = unknown[unknown["_merge"] == "left_only"]
    if not unknown.empty:
        first = unknown.iloc[0]
        raise ValueError(
            f"reproduced figure {tuple(first[KEY])} is not allowed: it is not in "
            f"{SOURCES[source_of(int(first['section']))].name}"
        )
    merged = published.merge(reproduced, on=KEY, how="left")
    results = merged.apply(_status, axis=1, result_type="expand")
    merged["difference"], merged["status"] = results[0], results[1]
    merged = merged.rename(columns={"value": "article"})
    merged["tolerance"] = merged.apply(_tolerance_text, axis=1)
    merged["why"] = merged["why"].astype(object).fillna("") if "why" in merged else ""
    columns = ["source"] + KEY + ["article", "reproduced", "difference", "tolerance", "status", "why"]
    for extra in ("band_low", "band_high"):
        if extra in merged:
            columns.insert(columns.index("difference"), extra)
    return merged[columns]


def summary(ledger: pd.DataFrame, source: str | None = None) -> dict:
    """Counts of pass / fail / missing / not compared rows; total and compared (the rows not set aside); of one
    source's rows when source is given."""
    if source is not None:
        if source not in SOURCES:
            raise ValueError(f"source={source!r} is not allowed: must be one of {', '.join(SOURCES)}")
        ledger = ledger[ledger["source"] == source] if "source" in ledger else ledger.iloc[:0]
    counts = ledger["status"].value_counts()
    found = {s.replace(" ", "_"): int(counts.get(s, 0)) for s in STATUSES}
    return {"total": int(len(ledger)), "compared": int(len(ledger)) - found["not_compared"], **found}


def set_aside(ledger: pd.DataFrame, sections: dict[int, str]) -> pd.DataFrame:
    """ledger with the rows of sections (section -> why) marked 'not compared', the reason as their why: a
    section run with other parameters than the article's cannot be held to the article's figures."""
    out = ledger.copy()
    for section, why in sections.items():
        rows = out["section"] == section
        out.loc[rows, "status"] = "not compared"
        out.loc[rows, "why"] = why
    return out


def save(ledger: pd.DataFrame, path: str | Path | None) -> None:
    """Write a section's ledger rows to path (CSV); do nothing when path is empty."""
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ledger.to_csv(path, index=False, float_format="%.10g")


def collect(paths: list[str | Path], sources=("article",)) -> pd.DataFrame:
    """The full ledger (every figure of sources; the report asks for all of SOURCES) from the sections' saved rows,
    in the report's columns."""
    parts = [pd.read_csv(p, dtype={"row": str, "table": str, "column": str}) for p in paths if Path(p).exists()]
    reproduced = [p[[c for c in p.columns if c in KEY + ["reproduced", "band_low", "band_high", "why"]]] for p in parts]
    reproduced = [p for p in reproduced if p["section"].map(source_of).isin(sources).all()] if reproduced else []
    ledger = compare(reproduced, sources=sources)
    for column in ("band_low", "band_high"):
        if column not in ledger:
            ledger[column] = np.nan
    return ledger[LEDGER_COLUMNS]


def _tolerance_text(row) -> str:
    """The tolerance as a person reads it: 'abs 0', 'rel 0.02', 'band 140.1..160.2', 'range 1.7..2.7', 'above 1'."""
    if row["tolerance_kind"] == "range":
        return f"range {float(row['article']):g}..{float(row['tolerance']):g}"
    if row["tolerance_kind"] == "above":
        return f"above {float(row['article']):g}"
    if row["tolerance_kind"] == "band":
        low, high = row.get("band_low", np.nan), row.get("band_high", np.nan)
        return "5-95% band" if pd.isna(low) else f"band {low:.6g}..{high:.6g}"
    if row["tolerance_kind"] == "rel":
        return f"rel {float(row['tolerance']):g}"
    return f"abs {float(row['tolerance']):g}"


# The article's tables (data/article_figures.csv) as a reader names them; the vLLM paper's are its figures and parts.
ARTICLE_TABLE_NAMES = {
    "workload": "the workload",
    "mixed": "the article's mix",
    "equal150": "equal outputs (150 tokens)",
    "slots": "slot use",
    "fit": "requests that fit",
    "memory": "KV memory",
    "model": "the model",
}


def table_name(table: str) -> str:
    """A source table's key as a reader names it: fig13a -> Fig. 13a, s6.2 -> §6.2, the article's by
    ARTICLE_TABLE_NAMES (equal150 -> equal outputs (150 tokens)); any other key as it is."""
    figure = re.fullmatch(r"fig(\d+)([a-z]?)", table)
    if figure:
        return f"Fig. {figure.group(1)}{figure.group(2)}"
    part = re.fullmatch(r"s(\d+(?:\.\d+)*)", table)
    return f"§{part.group(1)}" if part else ARTICLE_TABLE_NAMES.get(table, table)
