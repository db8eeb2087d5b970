"""The one way tables reach a reader: units in the headers, rounded to what they mean, thousands separators,
pass/fail marks, empty cells for missing values, no meaningless index, and wide tables split to fit a page.

Outputs that nbval compares must not depend on the machine: another CPU or BLAS kernel changes the last
bits of a floating-point result, so every number is formatted here, at the precision it is shown at,
and a negative zero never appears. A notebook cell ends with `present.table(frame, ...)`; the returned
Table shows as HTML in the notebook and the report and as aligned text elsewhere.
"""

from __future__ import annotations

import html
import math
import numbers
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvlab.sections.shared.ledger import round_half_up, table_name

# Column names follow kvlab's convention (units as suffixes); a suffix gives the unit shown and the decimals.
UNITS = [  # (suffix, unit shown, decimals), longest suffix first
    ("_requests_per_s", "requests/s", 2),
    ("_per_s", "/s", 2),
    ("_rps", "requests/s", 2),
    ("_tokens", "tokens", 0),
    ("_pct", "%", 1),
    ("_gib", "GiB", 2),
    ("_mib", "MiB", 2),
    ("_kib", "KiB", 1),
    ("_bytes", "B", 0),
    ("_ms", "ms", 2),
    ("_s", "s", 2),
    ("_x", "x", 2),
]
# Words shown other than as written.
WORDS = {
    "kv": "KV",
    "p50": "p50",
    "p95": "p95",
    "p99": "p99",
    "tp": "TP",
    "pp": "PP",
    "num": "",
    "max": "max",
    "gpu": "GPU",
    "vllm": "vLLM",
    "ttft": "TTFT",
    "tpot": "TPOT",
    "e2e": "E2E",
    "cv": "CV",
    "mla": "MLA",
    "gqa": "GQA",
    "fp8": "fp8",
}
# Names that read better as words (the whole column name).
LABELS = {
    "max_num_requests": "requests that fit",
    "num_requests": "requests",
    "max_concurrency": "max concurrency (x)",
    "max_concurrency_per_rank": "max concurrency per rank (x)",
    "max_concurrency_all_ranks": "max concurrency, all ranks (x)",
    "num_gpu_blocks": "GPU blocks",
    "gpu_kv_cache_tokens": "GPU KV cache (tokens)",
    "mean_latency_s": "mean latency (s)",
    "normalized_latency_s": "normalized latency (s/token)",
    "block_table_entries": "block-table entries per request",
    "idle_pct": "idle slot time (%)",
    "busy_slot_s": "busy slot time (s)",
    "throughput_rps": "throughput (requests/s)",
    "makespan_s": "total time (s)",
    "interarrival_cv": "inter-arrival CV",
    "kv_kib_per_token": "KV per token (KiB)",
    "kv_bytes_per_token": "KV per token (B)",
    "article_percentile": "article's percentile (%)",
    "block_size": "block size (tokens)",
    "arrival_rate": "arrival rate (requests/s)",
    "held_tokens": "token states (tokens)",
    "unused_in_last_block_tokens": "internal fragmentation, inside the last block (tokens)",
    "unused_beyond_last_block_tokens": "internal fragmentation, beyond the last block (tokens)",
    "context_tokens": "context (tokens)",
    "rate_per_s": "arrival rate (requests/s)",
    "max_model_len": "max_model_len (tokens)",
    "tensor_parallel_size": "tensor parallel size",
    "kv_cache_dtype": "KV cache dtype",
}
MARKS = {
    "pass": "✓ pass",
    "fail": "✗ fail",
    "missing": "– missing",
    "not compared": "· not compared",
    True: "✓",
    False: "✗",
}
MAX_COLUMNS = 9  # a table wider than this (index included) is split into parts that fit a page


def label(name) -> str:
    """The header of a column called name: words and its unit, e.g. mean_latency_s -> 'mean latency (s)'."""
    if not isinstance(name, str):
        return ", ".join(label(part) for part in name if part != "") if isinstance(name, tuple) else str(name)
    if name in LABELS:
        return LABELS[name]
    unit = next(((suffix, u) for suffix, u, _ in UNITS if name.endswith(suffix) and len(name) > len(suffix)), None)
    stem = name[: -len(unit[0])] if unit else name
    words = [WORDS.get(w, w) for w in stem.split("_")]
    text = " ".join(w for w in words if w)
    return f"{text} ({unit[1]})" if unit else text


def decimals_of(name, values: pd.Series) -> int | None:
    """Decimals a column is shown with: from its unit suffix, 0 for whole numbers, else 2; None for text."""
    if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
        return None
    if pd.api.types.is_integer_dtype(values):
        return 0
    if isinstance(name, str):
        for suffix, _, d in UNITS:
            if name.endswith(suffix):
                return d
    finite = values.dropna()
    if len(finite) and np.all(finite == np.round(finite)) and np.all(np.abs(finite) < 2**53):
        return 0
    return 2


def cell(value, decimals: int | None) -> str:
    """One value as shown: a number rounded to decimals with thousands separators and never -0, a mark for
    pass/fail and booleans, an empty cell for a missing value, text as it is."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, str) and value in MARKS):
        return MARKS[bool(value) if isinstance(value, (bool, np.bool_)) else value]
    if isinstance(value, numbers.Number) and not isinstance(value, numbers.Integral):
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        d = 2 if decimals is None else decimals
        return f"{round_half_up(float(value), d) + 0.0:,.{d}f}"  # + 0.0: a rounded -0.0 becomes 0.0
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    return str(value)


@dataclass(frozen=True)
class Table:
    """A formatted table: header labels, rows of text, which columns are the index, a caption."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]
    index_columns: int = 0
    caption: str = ""

    def parts(self, max_columns: int = MAX_COLUMNS) -> list[Table]:
        """The table split into parts of at most max_columns columns, each repeating the index columns, the columns
        shared out evenly (no part left with a column or two of its own)."""
        body = list(range(self.index_columns, len(self.header)))
        per = max(1, max_columns - self.index_columns)
        if len(self.header) <= max_columns:
            return [self]
        num_parts = -(-len(body) // per)
        per = -(-len(body) // num_parts)
        chunks = [body[i : i + per] for i in range(0, len(body), per)]
        out = []
        for k, chunk in enumerate(chunks, 1):
            keep = list(range(self.index_columns)) + chunk
            caption = f"{self.caption} (part {k} of {len(chunks)})" if self.caption else f"part {k} of {len(chunks)}"
            out.append(
                Table(
                    tuple(self.header[i] for i in keep),
                    tuple(tuple(r[i] for i in keep) for r in self.rows),
                    tuple(self.numeric[i] for i in keep),
                    self.index_columns,
                    caption,
                )
            )
        return out

    def _repr_html_(self) -> str:
        return "\n".join(part._html() for part in self.parts())

    def _html(self) -> str:
        def cls(i):
            kinds = ["index"] if i < self.index_columns else []
            kinds += ["num"] if self.numeric[i] else []
            return f' class="{" ".join(kinds)}"' if kinds else ""

        head = "".join(f"<th{cls(i)}>{html.escape(h)}</th>" for i, h in enumerate(self.header))
        body = "".join(
            "<tr>"
            + "".join(
                f"<{'th' if i < self.index_columns else 'td'}{cls(i)}>{html.escape(v)}</{'th' if i < self.index_columns else 'td'}>"
                for i, v in enumerate(row)
            )
            + "</tr>\n"
            for row in self.rows
        )
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return f'<table class="kvlab">{caption}<thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>'

    def __repr__(self) -> str:
        widths = [max([len(h)] + [len(r[i]) for r in self.rows]) for i, h in enumerate(self.header)]

        def line(values):
            return "  ".join(
                v.rjust(w) if self.numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))
            ).rstrip()

        lines = ([self.caption] if self.caption else []) + [line(self.header)] + [line(r) for r in self.rows]
        return "\n".join(lines)


def table(
    frame: pd.DataFrame | pd.Series,
    decimals: dict | int | None = None,
    labels: dict | None = None,
    *,
    caption: str = "",
    index: bool | None = None,
    same_in_caption: bool = False,
) -> Table:
    """frame as a Table: each column labelled with its unit (labels override) and rounded (decimals: one int for
    every number column, or per column; default from the unit suffix), the index shown only when it means
    something (index=None: unless it is 0..n-1). same_in_caption: a column that reads the same in every row (of two
    or more) leaves the table for its caption ("every row: GPU memory share 0.70 / 0.90")."""
    if isinstance(frame, pd.Series):
        frame = frame.to_frame()
    labels = labels or {}
    if index is None:
        index = not (isinstance(frame.index, pd.RangeIndex) and frame.index.name is None)
    data = frame.reset_index() if index else frame.reset_index(drop=True)
    index_columns = frame.index.nlevels if index else 0
    header, columns, numeric = [], [], []
    for position, name in enumerate(data.columns):
        values = data.iloc[:, position]
        if isinstance(decimals, dict):
            d = decimals.get(name, decimals_of(name, values))
        elif isinstance(decimals, int) and pd.api.types.is_float_dtype(values):
            d = decimals
        else:
            d = decimals_of(name, values)
        header.append(labels.get(name, label(name)))
        columns.append([cell(v, d) for v in values.tolist()])
        numeric.append(
            pd.api.types.is_numeric_dtype(values)
            and not pd.api.types.is_bool_dtype(values)
            or all(re.fullmatch(r"-?[\d,]+(\.\d+)?%?|", v or "") for v in columns[-1])
        )
    if same_in_caption and len(frame) > 1:
        same = [i for i in range(index_columns, len(columns)) if len(set(columns[i])) == 1]
        if same:
            every = "; ".join(f"{header[i]} {columns[i][0]}" for i in same)
            caption = f"{caption} (every row: {every})" if caption else f"every row: {every}"
            keep = [i for i in range(len(columns)) if i not in same]
            header, columns, numeric = [header[i] for i in keep], [columns[i] for i in keep], [numeric[i] for i in keep]
    rows = tuple(zip(*columns)) if columns else ()
    return Table(tuple(header), tuple(tuple(r) for r in rows), tuple(numeric), index_columns, caption)


def band(bands: pd.DataFrame, caption: str = "") -> Table:
    """A band table (kvlab.sections.s02_batching.band_table) as a Table: per policy and figure, the article's value,
    kvlab's median and 5-95% band over seeds, the article's percentile among the seeds, and whether it is inside."""
    frame = bands.reset_index()
    frame["column"] = [label(c) for c in frame["column"]]
    return table(
        frame.rename(columns={"row": "policy", "column": "figure"}),
        {"article": 2, "median": 2, "band_low": 2, "band_high": 2, "article_percentile": 1},
        {"band_low": "band low", "band_high": "band high", "inside": "inside the band", "num_seeds": "seeds"},
        caption=caption,
    )


def published(row, decimals: int) -> str:
    """A published figure as shown: its value at the source's precision, a range 'low to high' (tolerance kind
    range: the value is the low end, the tolerance the high end), or '> value' (kind above)."""
    kind = row.get("tolerance_kind", "")
    if kind == "range":
        return f"{cell(float(row['value']), decimals)} to {cell(float(row['tolerance']), decimals)}"
    if kind == "above":
        return f"> {cell(float(row['value']), decimals)}"
    return cell(row["value"], decimals)


def ledger(rows: pd.DataFrame, caption: str = "", *, why: bool = False) -> Table:
    """A section's ledger rows (kvlab.sections.shared.ledger.compare) as a Table: each figure at the source's printed
    precision (a published range as 'low to high'), the seed band where there is one, the tolerance, a pass/fail
    mark and, with why, the reason a figure lies where it does. The published value's column is headed by its
    source: "article", or "paper" for the vLLM paper's figures."""
    from kvlab.sections.shared.ledger import KEY, figures

    published_figures = figures().set_index(KEY)
    shown = []
    for _, r in rows.iterrows():
        key = (r["section"], r["table"], r["row"], r["column"])
        figure = published_figures.loc[key] if key in published_figures.index else None
        d = int(figure["decimals"]) if figure is not None else 2
        source = figure["source"] if figure is not None else "article"
        band = (
            f"{cell(r['band_low'], d)} to {cell(r['band_high'], d)}"
            if "band_low" in r and not pd.isna(r.get("band_low"))
            else ""
        )
        row = {
            "table": table_name(r["table"]),
            "row": r["row"],
            "figure": label(r["column"]),
            "paper" if source == "vllm-paper" else "article": published(figure, d)
            if figure is not None
            else cell(r["article"], d),
            "kvlab": cell(r["reproduced"], d),
            "kvlab's 5-95% band": band,
            # the tolerance the status is judged by: a band only where it is (section 2), not wherever
            # a band is shown beside the default seed's value (section 1)
            "tolerance": "band" if str(r["tolerance"]).startswith(("band", "5-95% band")) else r["tolerance"],
            "status": MARKS.get(r["status"], r["status"]),
        }
        if why:
            row["why"] = "" if pd.isna(r.get("why", "")) else str(r.get("why", ""))
        shown.append(row)
    frame = pd.DataFrame(shown)
    if not frame["kvlab's 5-95% band"].any():
        frame = frame.drop(columns="kvlab's 5-95% band")
    banded = frame["tolerance"].eq("band").any()
    legend = (
        "The kvlab column is the figure as this section computes it, "
        + (
            "the median over seeds where the tolerance is the band (the published figure must lie in it), "
            "else its default seed's run"
            if banded
            else "from its default settings and seed"
        )  # fmt: skip
        + "; status says whether it lies within the tolerance of the published figure"
    )
    return Table(
        tuple(frame.columns),
        tuple(tuple(map(str, row)) for row in frame.itertuples(index=False)),
        tuple(c in ("article", "paper", "kvlab") for c in frame.columns),
        0,
        f"{caption}. {legend}" if caption else legend,
    )


@dataclass(frozen=True)
class Prose:
    """Markdown whose numbers come from the outputs it describes: shown as text in the notebook and the report."""

    text: str

    def _repr_markdown_(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def prose(text: str) -> Prose:
    """text (Markdown, usually an f-string formatting the cell's results) shown as prose, not as code output: each
    paragraph (paragraphs are parted by a blank line) on one line, so that a formatted number at the start of a
    line can never begin a Markdown list, except a paragraph that starts as a list or a table."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    return Prose(
        "\n\n".join(
            p
            if re.match(r"([-*|]|\d+\.)\s", p)  # a paragraph that starts as a list or table
            else " ".join(line.strip() for line in p.splitlines())
            for p in paragraphs
        )
    )


def rounded(frame: pd.DataFrame, decimals: int | dict = 2) -> pd.DataFrame:
    """frame with its float columns rounded (pandas' round: an int, or column -> decimals) and -0.0 shown as 0.0."""
    out = frame.round(decimals)
    floats = out.select_dtypes("float").columns
    out[floats] = out[floats] + 0.0  # IEEE: -0.0 + 0.0 is +0.0, every other value is unchanged
    return out


def joined(words: list[str]) -> str:
    """Words as prose lists them: 'a', 'a and b', 'a, b and c'."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
