"""Figures for the report: fixed sizes, axes with units, nothing computed here but layout."""
from __future__ import annotations

import matplotlib

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

FIGSIZE = (7.0, 4.2)


def _figure(figsize=FIGSIZE, **kwargs):
    """A new figure that pyplot forgets at once: a notebook shows it once, as the cell's value."""
    fig, ax = plt.subplots(figsize=figsize, dpi=100, layout="constrained", **kwargs)
    plt.close(fig)
    return fig, ax


def requests_vs_context(fit: pd.DataFrame, label: str = "requests that fit") -> matplotlib.figure.Figure:
    """Requests that fit against context length, log-log, with the 1/context line through the first point."""
    fig, ax = _figure()
    ctx = fit.index.to_numpy(dtype=float)
    n = fit["max_num_requests"].to_numpy(dtype=float)
    ax.loglog(ctx, n, "o-", label=label)
    ideal = n[0] * ctx[0] / ctx  # inverse proportion: N x context = constant
    ax.loglog(ctx, ideal, "--", color="grey", label="inverse proportion (N x context = const)")
    for x, y in zip(ctx, n):
        ax.annotate(f"{int(y)}", (x, y), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("requests that fit")
    ax.set_ylim(0.5, None)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def length_fit(lengths: np.ndarray, pmf: np.ndarray, bin_tokens: int = 64) -> matplotlib.figure.Figure:
    """Histogram of sampled request lengths against the fitted distribution, per bin of bin_tokens (log y)."""
    fig, ax = _figure()
    edges = np.arange(0, len(pmf) + 1, bin_tokens)      # bins [e, e + bin), the last one closed
    counts, _ = np.histogram(lengths, bins=edges)
    by_length = np.concatenate([[0.0], pmf])             # by_length[l] = P(length = l)
    expected = np.add.reduceat(by_length, edges[:-1]) * len(lengths)
    ax.stairs(counts, edges, fill=True, alpha=0.5, label=f"{len(lengths):,} sampled requests")
    ax.stairs(expected, edges, color="black", label="fitted distribution (expected)")
    ax.set_yscale("log")
    ax.set_xlabel(f"request length (tokens, bins of {bin_tokens})")
    ax.set_ylabel("requests per bin")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def waste_vs_block_size(table: pd.DataFrame, article: pd.DataFrame | None = None) -> matplotlib.figure.Figure:
    """Waste %, requests that fit and block-table entries per request against block size (log2 x)."""
    fig, (top, bottom) = _figure(figsize=(7.0, 6.0), nrows=2, sharex=True)
    b = table.index.to_numpy(dtype=float)
    top.plot(b, table["waste_pct"], "o-", color="C3", label="waste (% of reserved)")
    top.set_ylabel("waste (% of reserved)", color="C3")
    fits = top.twinx()
    fits.plot(b, table["max_num_requests"], "s-", color="C0", label="requests that fit")
    fits.set_ylabel("requests that fit in the budget", color="C0")
    if article is not None:
        a = article.index.to_numpy(dtype=float)
        top.plot(a, article["waste_pct"], "x", color="black", ms=9, label="article")
        fits.plot(a, article["max_num_requests"], "x", color="black", ms=9)
    top.legend(loc="upper center")
    top.grid(True, alpha=0.3)
    bottom.plot(b, table["block_table_entries"], "o-", color="C2")
    bottom.set_yscale("log")
    bottom.set_ylabel("block-table entries per request")
    bottom.set_xscale("log", base=2)
    bottom.set_xlabel("block size (tokens, log scale)")
    bottom.grid(True, which="both", alpha=0.3)
    return fig


POLICY_PARTS = {"tokens_held": ("tokens held", "C0"), "internal_fragmentation": ("internal fragmentation", "C1"),
                "over_reservation": ("over-reservation", "C3")}


def policy_bars(breakdown: pd.DataFrame) -> matplotlib.figure.Figure:
    """Stacked bars per policy: tokens held, internal fragmentation, over-reservation (% of reserved)."""
    fig, ax = _figure()
    share = breakdown[list(POLICY_PARTS)].div(breakdown["reserved_tokens"], axis=0) * 100
    bottom = np.zeros(len(share))
    for column, (label, color) in POLICY_PARTS.items():
        ax.bar(share.index, share[column], bottom=bottom, color=color, label=label)
        bottom += share[column].to_numpy()
    for i, held in enumerate(share["tokens_held"]):
        ax.annotate(f"{held:.1f}% held", (i, 101), ha="center", va="bottom")
    ax.set_ylim(0, 110)
    ax.set_ylabel("share of reserved KV slots (%)")
    ax.set_xlabel("reservation policy")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def allocation_band(runs: pd.DataFrame, article: pd.DataFrame, column: str = "wasted_tokens",
                    label: str = "wasted tokens") -> matplotlib.figure.Figure:
    """The spread over seeds of one allocation-table column per block size, as % from the seed median; article as x."""
    fig, ax = _figure()
    sizes = list(article.index)
    medians = [np.median(runs.loc[runs.index == b, column]) for b in sizes]
    data = [100 * (runs.loc[runs.index == b, column].to_numpy() / m - 1) for b, m in zip(sizes, medians)]
    ax.boxplot(data, whis=(5, 95), showfliers=False)
    ax.plot(range(1, len(sizes) + 1), 100 * (article[column].to_numpy() / np.array(medians) - 1), "x",
            color="black", ms=10, label="article")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(1, len(sizes) + 1), [f"{b:,}" for b in sizes])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel(f"{label}: % from the seed median\n(box 25-75%, whiskers 5-95%)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig
