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
from kvlab.sections import ledger
from kvlab.sections.traces import NotebookTrace
from kvlab.workloads import synthetic, traces

ARTICLE_COLUMNS = ["reserved_tokens", "wasted_tokens", "waste_pct", "max_num_requests"]


def allocation_table(lengths, block_sizes=article.BLOCK_SIZES, *, max_len_tokens: int | None = None,
                     memory_gib: float = article.MEMORY_GIB, mib_per_token: float = article.MIB_PER_TOKEN) -> pd.DataFrame:
    """kvlab.core.allocator.allocation_counts as a table: one row per block size (tokens)."""
    counts = allocator.allocation_counts(lengths, block_sizes, max_len_tokens=max_len_tokens,
                                         memory_gib=memory_gib, mib_per_token=mib_per_token)
    index = pd.Index(counts.pop("block_size").tolist(), name="block_size")
    return pd.DataFrame(counts, index=index)


def workload_table(lengths) -> pd.DataFrame:
    """Used tokens in total and per request (mean), as the article's one-row workload summary."""
    lengths = allocator.check_lengths(lengths)
    return pd.DataFrame({"used_tokens": [int(lengths.sum())], "mean_tokens": [float(lengths.mean())]},
                        index=pd.Index(["all"], name="workload"))


def fit_ratio(table: pd.DataFrame, fine: int = article.FINE_BLOCK_SIZE, coarse: int = article.COARSE_BLOCK_SIZE) -> float:
    """How many times more requests fit with block size fine than with coarse (the article's 7.1x)."""
    return table.loc[fine, "max_num_requests"] / table.loc[coarse, "max_num_requests"]


def policy_breakdown(lengths, policies=tuple(allocator.POLICIES), *, max_len_tokens: int,
                     block_size: int = 16) -> pd.DataFrame:
    """Tokens held, internal fragmentation and over-reservation (tokens, totals) per policy, and shares of reserved."""
    rows, labels = [], []
    for policy in validate.non_empty("policies", policies):
        rows.append(allocator.policy_split(lengths, policy, max_len_tokens=max_len_tokens, block_size=block_size))
        labels.append(f"paged (block {block_size})" if policy == "paged" else policy)
    return pd.DataFrame(rows, index=pd.Index(labels, name="policy"))


# ---------------------------------------------------------------- seed robustness
def allocation_band(name: str, num_requests: int, seeds, block_sizes=article.BLOCK_SIZES, *,
                    low_pct: float = 5, high_pct: float = 95, **table_kwargs) -> tuple[pd.DataFrame, pd.DataFrame]:
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


def family_table(families: dict = MEAN_567_FAMILIES, num_requests: int = article.NUM_REQUESTS_S1, seed: int = 0,
                 block_sizes=article.BLOCK_SIZES, *, max_len_tokens: int = article.MAX_LEN_TOKENS,
                 **table_kwargs) -> pd.DataFrame:
    """Waste % and requests that fit per block size (tokens) for several length families, same seed.

    families maps a kvlab.workloads length family to its parameters. One row per family: the mean
    length (tokens), waste_at_B_pct and requests_that_fit_at_B for every block size B.
    """
    rows = {}
    for name, params in validate.non_empty("families", families.items()):
        lengths = synthetic.sample_lengths(name, num_requests, np.random.default_rng(seed),
                                           max_len_tokens=max_len_tokens, **params)
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
    table: pd.DataFrame   # per published figure: article, expected under the fit, relative difference
    max_relative_error: float


def article_s1_targets() -> dict:
    """The section 1 totals the fit aims at, from data/article_figures.csv: used tokens and reserved per unit."""
    figures = ledger.article_figures(1)
    used = figures.query("table == 'workload' and column == 'used_tokens'")["value"].iloc[0]
    reserved = figures.query("table == 'allocation' and column == 'reserved_tokens'")
    return {"num_requests": article.NUM_REQUESTS_S1, "used_tokens": int(used),
            "reserved_tokens": {int(r): int(v) for r, v in zip(reserved["row"], reserved["value"])}}


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
        return {"log_mean": float(x[0]), "log_sigma": abs(float(x[1])) + 1e-9,
                "uniform_share": float(np.clip(x[2], 0.0, 1.0))}

    def loss(x):
        got = expected_totals(synthetic.article_s1_pmf(max_len_tokens=max_len, **params_of(x)), n, blocks)
        return float(np.sum(((got - goal) / goal) ** 2))

    simplex = np.array(start, dtype=np.float64) + np.vstack([np.zeros(3), np.diag([0.3, 0.2, 0.05])])
    best = minimize(loss, np.array(start, dtype=np.float64), method="Nelder-Mead",
                    options={"initial_simplex": simplex, "xatol": 1e-8, "fatol": 1e-16, "maxiter": 4000}).x
    params = {k: round(v, 4) for k, v in params_of(best).items()}
    got = expected_totals(synthetic.article_s1_pmf(max_len_tokens=max_len, **params), n, blocks)
    labels = ["used_tokens"] + [f"reserved_tokens @ {b}" for b in blocks]
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
    """The article's headline claim from an allocation table: requests that fit with 16 over 4,096 tokens."""
    return pd.DataFrame({"fit_ratio": [fit_ratio(table)]}, index=pd.Index(["16 vs 4096"], name="claim"))


def band_check(band: pd.DataFrame, article_figures: pd.DataFrame) -> pd.DataFrame:
    """Per block size and figure: the article's value, the seed band (low, high), and whether it lies inside."""
    rows = []
    for block_size in article_figures.index:
        for column in article_figures.columns:
            low, high = band.loc[block_size, column]
            value = article_figures.loc[block_size, column]
            rows.append({"block_size": block_size, "figure": column, "article": value,  # column: its name, e.g. waste_pct
                         "band_low": low, "band_high": high, "inside": bool(low <= value <= high)})
    return pd.DataFrame(rows).set_index(["block_size", "figure"])


def ledger_rows(workload: pd.DataFrame, table: pd.DataFrame, band: pd.DataFrame) -> pd.DataFrame:
    """Section 1's rows of the reproduction ledger: the workload, the allocation table with its band, the claim."""
    return ledger.compare([
        ledger.from_table(1, "workload", workload),
        ledger.from_table(1, "allocation", table[ARTICLE_COLUMNS], band=band[ARTICLE_COLUMNS]),
        ledger.from_table(1, "claims", claims_table(table)),
    ], section=1)


# ---------------------------------------------------------------- the same table on a real trace
def trace_allocation_table(trace: NotebookTrace, block_sizes, *, max_len_tokens: int,
                           memory_gib: float, mib_per_token: float) -> pd.DataFrame:
    """Section 1's waste table on the trace's lengths (prompt + output, those over max_len_tokens dropped).

    Empty (same columns) when the trace is not available. Columns as allocation_table plus
    num_requests and dropped_over_max_len.
    """
    columns = ["num_requests", "dropped_over_max_len", "reserved_tokens", "used_tokens", "wasted_tokens",
               "waste_pct", "max_num_requests", "block_table_entries"]
    if trace.load is None:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="block_size"))
    lengths, dropped = traces.request_lengths(trace.load.workload, max_len_tokens, over_max_len="drop")
    table = allocation_table(lengths, block_sizes, max_len_tokens=max_len_tokens,
                             memory_gib=memory_gib, mib_per_token=mib_per_token)
    table.insert(0, "dropped_over_max_len", dropped)
    table.insert(0, "num_requests", len(lengths))
    return table
