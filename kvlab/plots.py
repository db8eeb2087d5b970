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


def _finish(fig, ax, xlabel: str, ylabel: str, ylim_bottom: float | None = None) -> matplotlib.figure.Figure:
    """Axis labels (with units), an optional lower y limit, a grid and the legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim_bottom is not None:
        ax.set_ylim(ylim_bottom, None)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def length_cdfs(workloads: dict, column: str = "prompt_tokens", marks: dict[str, float] | None = None
                ) -> matplotlib.figure.Figure:
    """Empirical CDF of a token column (prompt_tokens or output_tokens) per workload, log x, with labelled marks."""
    fig, ax = _figure()
    for name, w in workloads.items():
        ax.ecdf(np.maximum(getattr(w, column), 1), label=name)
    for i, (label, x) in enumerate((marks or {}).items()):
        ax.axvline(x, color="grey", linestyle=("--", ":", "-.")[i % 3], label=label)
    ax.set_xscale("log")
    return _finish(fig, ax, column.replace("_", " ").replace("tokens", "(tokens, log scale)"), "share of requests")


def interarrival_cdfs(workloads: dict, max_ratio: float = 5.0) -> matplotlib.figure.Figure:
    """CDF of inter-arrival time / its mean per workload, against Poisson arrivals (1 - e^-x, dashed)."""
    fig, ax = _figure()
    for name, w in workloads.items():
        gaps = np.diff(w.arrival_s)
        ax.ecdf(gaps / gaps.mean(), label=name)
    x = np.linspace(0, max_ratio, 200)
    ax.plot(x, 1 - np.exp(-x), "--", color="black", label="Poisson arrivals (exponential gaps)")
    ax.set_xlim(0, max_ratio)
    return _finish(fig, ax, "inter-arrival time / mean inter-arrival time (1)", "share of gaps")


def arrival_rates(rates: dict[str, pd.Series]) -> matplotlib.figure.Figure:
    """Arrival rate (requests/s) per time window against time (min), one line per trace."""
    fig, ax = _figure()
    for name, series in rates.items():
        ax.step(series.index, series.to_numpy(), where="post", label=name)
    return _finish(fig, ax, "time since the first request (min)", "arrival rate (requests/s)", ylim_bottom=0)


def prefix_hit_rate(curve: pd.DataFrame) -> matplotlib.figure.Figure:
    """Prefix-cache hit rate and prefill saved (%) against cache size (blocks, log x); dashed: unbounded cache."""
    fig, ax = _figure()
    bounded = curve.drop(index="unbounded")
    limit = curve.loc["unbounded"]
    x = bounded.index.to_numpy(dtype=float)
    for column, label, color in (("hit_rate_pct", "block hit rate", "C0"),
                                 ("prefill_saved_pct", "prefill tokens saved", "C1")):
        ax.semilogx(x, bounded[column], "o-", color=color, label=label)
        ax.axhline(limit[column], color=color, linestyle="--", label=f"{label}, unbounded cache ({limit[column]:.1f}%)")
    return _finish(fig, ax, "cache size (prefix blocks, log scale)", "% of blocks / of prompt tokens", ylim_bottom=0)
