"""Section 1 (notebook 01_allocation): the article's allocation table, seed bands, length families, ledger rows.

The mechanism (block accounting, reservation policies, the block allocator) is kvlab.core.allocator;
this module turns it into the section's tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from kvlab.core import allocator, article, validate
from kvlab.sections.s04_traces import NotebookTrace
from kvlab.sections.shared import ledger
from kvlab.workloads import synthetic, traces

ARTICLE_COLUMNS = ["reserved_tokens", "wasted_tokens", "waste_pct", "max_num_requests"]


def allocation_table(
    lengths,
    block_sizes=article.BLOCK_SIZES,
    *,
    max_len_tokens: int | None = None,
    memory_gib: float = article.MEMORY_GIB,
    mib_per_token: float = article.MIB_PER_TOKEN,
) -> pd.DataFrame:
    """kvlab.core.allocator.allocation_counts as a table: one row per block size (tokens)."""
    counts = allocator.allocation_counts(
        lengths, block_sizes, max_len_tokens=max_len_tokens, memory_gib=memory_gib, mib_per_token=mib_per_token
    )
    index = pd.Index(counts.pop("block_size").tolist(), name="block_size")
    return pd.DataFrame(counts, index=index)


def workload_table(lengths) -> pd.DataFrame:
    """Used tokens in total and per request (mean), as the article's one-row workload summary."""
    lengths = allocator.check_lengths(lengths)
    return pd.DataFrame(
        {"used_tokens": [int(lengths.sum())], "mean_tokens": [float(lengths.mean())]},
        index=pd.Index(["all"], name="workload"),
    )


def fit_ratio(
    table: pd.DataFrame, fine: int = article.FINE_BLOCK_SIZE, coarse: int = article.COARSE_BLOCK_SIZE
) -> float:
    """How many times more requests fit with block size fine than with coarse (the article's 7.1x)."""
    return table.loc[fine, "max_num_requests"] / table.loc[coarse, "max_num_requests"]


def policy_breakdown(
    lengths, policies=tuple(allocator.POLICIES), *, max_len_tokens: int, block_size: int = 16
) -> pd.DataFrame:
    """Tokens held, internal fragmentation and over-reservation (tokens, totals) per policy, and shares of reserved."""
    rows, labels = [], []
    for policy in validate.non_empty("policies", policies):
        rows.append(allocator.policy_split(lengths, policy, max_len_tokens=max_len_tokens, block_size=block_size))
        name = allocator.POLICY_NAMES[policy]
        labels.append(f"{name} (blocks of {block_size})" if policy == "paged" else name)
    return pd.DataFrame(rows, index=pd.Index(labels, name="policy"))


# ---------------------------------------------------------------- seed robustness
def allocation_band(
    name: str,
    num_requests: int,
    seeds,
    block_sizes=article.BLOCK_SIZES,
    *,
    low_pct: float = 5,
    high_pct: float = 95,
    **table_kwargs,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """allocation_table over many seeds of a length family: (all seeds long, band of (low, high) per cell).

    The band holds the low_pct and high_pct percentiles over seeds (numpy's linear interpolation).
    """
    seeds = validate.non_empty("seeds", seeds)
    frames = []
    for seed in seeds:
        lengths = synthetic.sample_lengths(name, num_requests, np.random.default_rng(seed))
        frames.append(allocation_table(lengths, block_sizes, **table_kwargs).assign(seed=seed))
    runs = pd.concat(frames)
    grouped = runs.drop(columns="seed").groupby(level="block_size", sort=False)
    low, high = grouped.quantile(low_pct / 100), grouped.quantile(high_pct / 100)
    band = pd.DataFrame({c: list(zip(low[c], high[c])) for c in low.columns}, index=low.index)
    return runs, band


# ---------------------------------------------------------------- sensitivity to the length family
# Families one parameter away from the fitted default, each with the article's mean of 567 tokens
# (uniform on 1..1,133 tokens has mean 567), so that only the shape of the distribution differs.
MEAN_567_FAMILIES = {
    "article-s1": {},
    "exponential": {"mean_tokens": article.MEAN_TOKENS},
    "uniform": {"low_tokens": 1, "high_tokens": 2 * article.MEAN_TOKENS - 1},
    "constant": {"tokens": article.MEAN_TOKENS},
}


def family_table(
    families: dict = MEAN_567_FAMILIES,
    num_requests: int = article.NUM_REQUESTS_S1,
    seed: int = 0,
    block_sizes=article.BLOCK_SIZES,
    *,
    max_len_tokens: int = article.MAX_LEN_TOKENS,
    **table_kwargs,
) -> pd.DataFrame:
    """Waste % and requests that fit per block size (tokens) for several length families, same seed.

    families maps a kvlab.workloads length family to its parameters. One row per family: the mean
    length (tokens), waste_at_B_pct and requests_that_fit_at_B for every block size B.
    """
    rows = {}
    for name, params in validate.non_empty("families", families.items()):
        lengths = synthetic.sample_lengths(
            name, num_requests, np.random.default_rng(seed), max_len_tokens=max_len_tokens, **params
        )
        table = allocation_table(lengths, block_sizes, max_len_tokens=max_len_tokens, **table_kwargs)
        row = {"mean_tokens": float(lengths.mean())}
        row.update({f"waste_at_{b}_pct": table.loc[b, "waste_pct"] for b in table.index})
        row.update({f"requests_that_fit_at_{b}": int(table.loc[b, "max_num_requests"]) for b in table.index})
        rows[name] = row
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "lengths"
    return frame


# ---------------------------------------------------------------- fitting the article's lengths
@dataclass(frozen=True)
class LengthFit:
    """The article-s1 parameters that best reproduce the published section 1 totals, and how well."""

    params: dict
    table: pd.DataFrame  # per published figure: article, expected under the fit, relative difference
    max_relative_error: float


def article_s1_targets() -> dict:
    """The section 1 totals the fit aims at, from data/article_figures.csv: used tokens and reserved per unit."""
    figures = ledger.article_figures(1)
    used = figures.query("table == 'workload' and column == 'used_tokens'")["value"].iloc[0]
    reserved = figures.query("table == 'allocation' and column == 'reserved_tokens'")
    return {
        "num_requests": article.NUM_REQUESTS_S1,
        "used_tokens": int(used),
        "reserved_tokens": {int(r): int(v) for r, v in zip(reserved["row"], reserved["value"])},
    }


def expected_totals(pmf: np.ndarray, num_requests: int, block_sizes) -> np.ndarray:
    """Expected used tokens, then expected reserved tokens for each block size, over num_requests lengths."""
    lengths = np.arange(1, len(pmf) + 1, dtype=np.float64)
    used = num_requests * float(pmf @ lengths)
    reserved = [num_requests * b * float(pmf @ np.ceil(lengths / b)) for b in block_sizes]
    return np.array([used, *reserved])


def fit_article_lengths(targets: dict | None = None, start=(5.5, 1.0, 0.1)) -> LengthFit:
    """Fit article-s1's (log_mean, log_sigma, uniform_share) to the article's totals by least squares.

    The objective is the sum of squared relative errors of the expected used total and the expected
    reserved totals (one per reservation unit), minimised by scipy's Nelder-Mead from start to far
    below the 4 decimals kept; the table is computed from the rounded parameters, so it is the same
    on every machine.
    """
    targets = targets or article_s1_targets()
    n = targets["num_requests"]
    blocks = sorted(targets["reserved_tokens"], reverse=True)
    goal = np.array([targets["used_tokens"], *(targets["reserved_tokens"][b] for b in blocks)], dtype=np.float64)
    max_len = max(blocks)

    def params_of(x):
        return {
            "log_mean": float(x[0]),
            "log_sigma": abs(float(x[1])) + 1e-9,
            "uniform_share": float(np.clip(x[2], 0.0, 1.0)),
        }

    def loss(x):
        got = expected_totals(synthetic.article_s1_pmf(max_len_tokens=max_len, **params_of(x)), n, blocks)
        return float(np.sum(((got - goal) / goal) ** 2))

    simplex = np.array(start, dtype=np.float64) + np.vstack([np.zeros(3), np.diag([0.3, 0.2, 0.05])])
    best = minimize(
        loss,
        np.array(start, dtype=np.float64),
        method="Nelder-Mead",
        options={"initial_simplex": simplex, "xatol": 1e-8, "fatol": 1e-16, "maxiter": 4000},
    ).x
    params = {k: round(v, 4) for k, v in params_of(best).items()}
    got = expected_totals(synthetic.article_s1_pmf(max_len_tokens=max_len, **params), n, blocks)
    labels = ["used (tokens)"] + [f"reserved with {b}-token blocks (tokens)" for b in blocks]
    table = pd.DataFrame({"article": goal, "expected_under_fit": got}, index=pd.Index(labels, name="figure"))
    table["relative_error_pct"] = 100 * (table["expected_under_fit"] - table["article"]) / table["article"]
    return LengthFit(params, table, float(np.abs(table["relative_error_pct"]).max() / 100))


# ---------------------------------------------------------------- the article's figures, for comparison
def article_table() -> pd.DataFrame:
    """The article's section 1 table (data/article_figures.csv), one row per reservation unit (tokens)."""
    figures = ledger.article_figures(1).query("table == 'allocation'")
    table = figures.pivot(index="row", columns="column", values="value")[ARTICLE_COLUMNS]
    table.index = table.index.astype(int).rename("block_size")
    return table.sort_index(ascending=False)


def claims_table(table: pd.DataFrame) -> pd.DataFrame:
    """The article's headline claim from an allocation table: requests that fit with 16 over 4,096 tokens; no row
    when BLOCK_SIZES leaves either out (the ledger then lists the claim as missing)."""
    present = {article.FINE_BLOCK_SIZE, article.COARSE_BLOCK_SIZE} <= set(table.index)
    ratios = [fit_ratio(table)] if present else []
    return pd.DataFrame({"fit_ratio": ratios}, index=pd.Index(["16 vs 4096"][: len(ratios)], name="claim"))


def band_check(band: pd.DataFrame, article_figures: pd.DataFrame) -> pd.DataFrame:
    """Per block size and figure: the article's value, the seed band (low, high), and whether it lies inside; only
    the article's block sizes that the band has (BLOCK_SIZES may leave some out)."""
    rows = []
    for block_size in (b for b in article_figures.index if b in band.index):
        for column in article_figures.columns:
            low, high = band.loc[block_size, column]
            value = article_figures.loc[block_size, column]
            rows.append(
                {
                    "block_size": block_size,
                    "figure": column,
                    "article": value,  # column: its name, e.g. waste_pct
                    "band_low": low,
                    "band_high": high,
                    "inside": bool(low <= value <= high),
                }
            )
    columns = ["block_size", "figure", "article", "band_low", "band_high", "inside"]
    return pd.DataFrame(rows, columns=columns).set_index(["block_size", "figure"])


def ledger_rows(workload: pd.DataFrame, table: pd.DataFrame, band: pd.DataFrame) -> pd.DataFrame:
    """Section 1's rows of the reproduction ledger: the workload, the allocation table with its band, the claim."""
    return ledger.compare(
        [
            ledger.from_table(1, "workload", workload),
            ledger.from_table(1, "allocation", table[ARTICLE_COLUMNS], band=band[ARTICLE_COLUMNS]),
            ledger.from_table(1, "claims", claims_table(table)),
        ],
        section=1,
    )


# ---------------------------------------------------------------- the same table on a real trace
def trace_allocation_table(
    trace: NotebookTrace, block_sizes, *, max_len_tokens: int, memory_gib: float, mib_per_token: float
) -> pd.DataFrame:
    """Section 1's waste table on the trace's lengths (prompt + output, those over max_len_tokens dropped).

    Empty (same columns) when the trace is not available. Columns as allocation_table plus
    num_requests and dropped_over_max_len.
    """
    columns = [
        "num_requests",
        "dropped_over_max_len",
        "reserved_tokens",
        "used_tokens",
        "wasted_tokens",
        "waste_pct",
        "max_num_requests",
        "block_table_entries",
    ]
    if trace.load is None:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="block_size"))
    lengths, dropped = traces.request_lengths(trace.load.workload, max_len_tokens, over_max_len="drop")
    table = allocation_table(
        lengths, block_sizes, max_len_tokens=max_len_tokens, memory_gib=memory_gib, mib_per_token=mib_per_token
    )
    table.insert(0, "dropped_over_max_len", dropped)
    table.insert(0, "num_requests", len(lengths))
    return table


# ---------------------------------------------------------------- the figures the notebook's prose states
# Each function below returns the numbers one paragraph of notebook 01 states, so that the notebook only formats
# them (kvlab.sections.shared.present.prose); a figure a table does not hold is NaN, never an error.
def _at(frame: pd.DataFrame, row, column) -> float:
    """frame.loc[row, column] as a float, NaN when the row or column is not there (other parameters)."""
    try:
        return float(frame.loc[row, column])
    except KeyError:
        return float("nan")


def fit_figures(fit: LengthFit) -> dict:
    """The fitted mixture in words: the lognormal's median (tokens) and share (%), the uniform share (%), the
    largest relative error over the published totals (%) and how many totals there are."""
    p = fit.params
    return {
        "median_tokens": float(np.exp(p["log_mean"])),
        "log_mean": p["log_mean"],
        "log_sigma": p["log_sigma"],
        "lognormal_pct": 100 * (1 - p["uniform_share"]),
        "uniform_pct": 100 * p["uniform_share"],
        "max_error_pct": 100 * fit.max_relative_error,
        "num_totals": len(fit.table),
    }


def match_figures(table: pd.DataFrame, article_figures: pd.DataFrame) -> dict:
    """kvlab's allocation table against the article's, both printed the article's way, over their common units:
    how many units print the same waste (%) and requests that fit, the units (tokens) where requests that fit
    differ with both values, and the largest relative difference of the reserved and wasted totals (%)."""
    units = [b for b in article_figures.index if b in table.index]
    mine = ledger.as_printed(table.loc[units, ARTICLE_COLUMNS], 1, "allocation")
    theirs = ledger.as_printed(article_figures.loc[units], 1, "allocation")
    fit_differs = [
        f"{mine.loc[b, 'max_num_requests']} against the article's {theirs.loc[b, 'max_num_requests']} at {b:,} tokens"
        for b in units
        if mine.loc[b, "max_num_requests"] != theirs.loc[b, "max_num_requests"]
    ]
    totals = table.loc[units, ["reserved_tokens", "wasted_tokens"]].astype(float)
    article_totals = article_figures.loc[units, ["reserved_tokens", "wasted_tokens"]].astype(float)
    return {
        "units": len(units),
        "waste_same": int((mine["waste_pct"] == theirs["waste_pct"]).sum()),
        "fit_same": int((mine["max_num_requests"] == theirs["max_num_requests"]).sum()),
        "fit_differs": "; ".join(fit_differs) or "none",
        "max_total_difference_pct": float((100 * (totals - article_totals).abs() / article_totals).to_numpy().max()),
    }


def block_size_figures(powers: pd.DataFrame) -> dict:
    """From the table over every power-of-two block size: how waste and block-table entries change per halving
    (the range of the ratios, from 256 down to 16 tokens for waste and from 128 down to 16 for entries), the
    entries at a few sizes, the requests that fit at 4,096, 256, 64 and 16 tokens, and the share of the gain
    from 4,096 to 16 tokens already there at 256 (%)."""
    waste = [_at(powers, b // 2, "waste_pct") / _at(powers, b, "waste_pct") for b in (256, 128, 64, 32)]
    entries = [
        _at(powers, b // 2, "block_table_entries") / _at(powers, b, "block_table_entries") for b in (128, 64, 32)
    ]
    fit = {b: _at(powers, b, "max_num_requests") for b in (4096, 256, 64, 16)}
    return {
        "waste_halving_low": min(waste),
        "waste_halving_high": max(waste),
        "entries_doubling_low": min(entries),
        "entries_doubling_high": max(entries),
        **{f"entries_{b}": _at(powers, b, "block_table_entries") for b in (4096, 2048, 1024, 128, 64, 16)},
        **{f"waste_{b}_pct": _at(powers, b, "waste_pct") for b in (4096, 256, 16)},
        **{f"fit_{b}": v for b, v in fit.items()},
        "fit_gain_64_to_16_pct": 100 * (fit[16] / fit[64] - 1),
        "fit_ratio": fit[16] / fit[4096],
        "gain_at_256_pct": 100 * (fit[256] - fit[4096]) / (fit[16] - fit[4096]),
    }


def policy_figures(breakdown: pd.DataFrame) -> dict:
    """Waste (%) of each policy of policy_breakdown, by its key: max, pow2, oracle, paged (NaN if absent)."""
    key = {name: policy for policy, name in allocator.POLICY_NAMES.items()}
    waste = {key[label.split(" (blocks")[0]]: float(v) for label, v in breakdown["waste_pct"].items()}
    return {f"{p}_waste_pct": waste.get(p, float("nan")) for p in ("max", "pow2", "oracle", "paged")}


def band_figures(checked: pd.DataFrame, num_requests: int, block_size: int = 64) -> dict:
    """What the seed band says: figures inside it, all figures, those outside (in words), and for the wasted
    tokens at block_size: the article's value and the band, per request, and the (B - 1) / 2 tokens per request
    that whole-token lengths spread smoothly over many blocks waste on average."""
    from kvlab.sections.shared.present import label

    outside = [
        f"{label(figure).split(' (')[0]} at {b:,}-token blocks"
        for (b, figure), row in checked.iterrows()
        if not row["inside"]
    ]
    key = (block_size, "wasted_tokens")
    found = key in checked.index
    return {
        "inside": int(checked["inside"].sum()),
        "total": len(checked),
        "outside": ", ".join(outside) or "none",
        "num_outside": len(outside),
        "block_size": block_size,
        "article_wasted": checked.loc[key, "article"] if found else float("nan"),
        "band_low": checked.loc[key, "band_low"] if found else float("nan"),
        "band_high": checked.loc[key, "band_high"] if found else float("nan"),
        "article_per_request": checked.loc[key, "article"] / num_requests if found else float("nan"),
        "band_low_per_request": checked.loc[key, "band_low"] / num_requests if found else float("nan"),
        "smooth_per_request": (block_size - 1) / 2,
        "article_waste_pct": checked.loc[(block_size, "waste_pct"), "article"]
        if (block_size, "waste_pct") in checked.index
        else float("nan"),
    }


def family_figures(families: pd.DataFrame) -> dict:
    """What the length-family table says: the range of the means (and their spread, %), the waste at 4,096
    tokens over all families, the largest spread of waste (points) at 256, 64 and 16 tokens over the smooth
    families (all but constant), their range at 1,024 tokens and of requests that fit at 16 tokens, and the tail
    (tokens) that one request of the article's mean length leaves unused in its last 16- and 64-token block."""
    smooth = families.drop(index="constant", errors="ignore")

    def column(frame, name):
        return frame[name] if name in frame else pd.Series([float("nan")])

    spreads = [
        float(column(smooth, f"waste_at_{b}_pct").max() - column(smooth, f"waste_at_{b}_pct").min())
        for b in (256, 64, 16)
    ]
    means = families["mean_tokens"]
    return {
        "mean_low": float(means.min()),
        "mean_high": float(means.max()),
        "mean_spread_pct": float(100 * (means.max() - means.min()) / means.min()),
        "waste_4096_low": float(column(families, "waste_at_4096_pct").min()),
        "waste_4096_high": float(column(families, "waste_at_4096_pct").max()),
        "fine_spread_points": max(spreads),
        "waste_1024_low": float(column(smooth, "waste_at_1024_pct").min()),
        "waste_1024_high": float(column(smooth, "waste_at_1024_pct").max()),
        "fit_16_low": float(column(smooth, "requests_that_fit_at_16").min()),
        "fit_16_high": float(column(smooth, "requests_that_fit_at_16").max()),
        "constant_tail_16": -article.MEAN_TOKENS % 16,
        "constant_tail_64": -article.MEAN_TOKENS % 64,
        "uniform_high_tokens": MEAN_567_FAMILIES["uniform"]["high_tokens"],
    }


def trace_figures(trace: NotebookTrace, trace_table: pd.DataFrame, table: pd.DataFrame, *, max_len_tokens: int) -> dict:
    """What the real-trace part says about the trace's waste table: the trace's name, its mean request length
    (used tokens / requests, tokens), the waste (%) and requests that fit at the coarsest and finest block size
    (and what fits at the finest in table, the synthetic lengths' table), the share of its requests longer than
    the article's 4,096 tokens (%) and the article's mean; {} when the trace is not available."""
    from kvlab.sections.s04_traces import TRACE_NAMES

    if trace.load is None or trace_table.empty:
        return {}
    coarse, fine = max(trace_table.index), min(trace_table.index)
    lengths, _ = traces.request_lengths(trace.load.workload)
    return {
        "name": TRACE_NAMES.get(trace.name, trace.name),
        "requests": int(trace_table["num_requests"].iloc[0]),
        "fine_fit_fitted": _at(table, fine, "max_num_requests"),
        "dropped": int(trace_table["dropped_over_max_len"].iloc[0]),
        "max_len_tokens": max_len_tokens,
        "mean_tokens": float(trace_table["used_tokens"].iloc[0] / trace_table["num_requests"].iloc[0]),
        "article_mean_tokens": article.MEAN_TOKENS,
        "article_max_tokens": article.MAX_LEN_TOKENS,
        "coarse": coarse,
        "fine": fine,
        "coarse_waste_pct": float(trace_table.loc[coarse, "waste_pct"]),
        "fine_waste_pct": float(trace_table.loc[fine, "waste_pct"]),
        "coarse_fit": int(trace_table.loc[coarse, "max_num_requests"]),
        "fine_fit": int(trace_table.loc[fine, "max_num_requests"]),
        "over_article_max_pct": 100 * float((lengths > article.MAX_LEN_TOKENS).mean()),
        "shape": TRACE_SHAPES.get(trace.name, ""),
    }


# What the request-length figure shows for a trace, read off the figure (empty: nothing said).
TRACE_SHAPES = {
    "azure": "Azure's lengths climb in two steps, near 500 and near 1,500 tokens, unlike the smooth fitted curve.",
}
