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


# ---------------------------------------------------------------- section 2: batching
POLICY_COLORS = {"static": "tab:red", "continuous": "tab:blue"}


def slot_timeline(results: list, until_s: float = 30.0) -> matplotlib.figure.Figure:
    """Each slot over time (s) for each policy: a request's own tokens solid, static padding hatched."""
    fig, axes = _figure(figsize=(9.0, 2.2 * len(results) + 0.6), nrows=len(results), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results):
        color = POLICY_COLORS.get(result.policy, "tab:grey")
        seen = result.start_s < until_s
        for slot in range(result.max_num_seqs):
            mine = seen & (result.slot == slot)
            start, done, finish = result.start_s[mine], result.done_s[mine], result.finish_s[mine]
            ax.broken_barh(list(zip(start, done - start)), (slot - 0.4, 0.8), facecolors=color, edgecolor="white",
                           linewidth=0.3)
            padded = finish > done
            ax.broken_barh(list(zip(done[padded], (finish - done)[padded])), (slot - 0.4, 0.8), facecolors="none",
                           edgecolor=color, hatch="////", linewidth=0.0)
        busy = float(np.clip(np.minimum(result.done_s, until_s) - result.start_s, 0, None)[seen].sum())
        padding = " (hatched: held by a finished request waiting for its batch)" if result.policy == "static" else ""
        ax.set_title(f"{result.policy}: slots busy {100 * busy / (result.max_num_seqs * until_s):.0f}% of the first "
                     f"{until_s:g} s{padding}", fontsize=9)
        ax.set_ylabel("slot")
        ax.set_yticks(range(result.max_num_seqs))
        ax.set_ylim(-0.6, result.max_num_seqs - 0.4)
    axes[-1, 0].set_xlim(0, until_s)
    axes[-1, 0].set_xlabel("time since the first arrival (s)")
    return fig


def latency_cdf(results: list) -> matplotlib.figure.Figure:
    """Share of requests served within each latency (s), one line per policy."""
    fig, ax = _figure()
    for result in results:
        latency = np.sort(result.latency_s)
        share = np.arange(1, len(latency) + 1) / len(latency)
        ax.step(latency, share, where="post", color=POLICY_COLORS.get(result.policy), label=result.policy)
        ax.axvline(result.latency_s.mean(), color=POLICY_COLORS.get(result.policy), ls=":", lw=1)
    ax.set_xlabel("latency: finish - arrival (s); dotted: mean")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def rate_sweep(sweep: pd.DataFrame, article: pd.DataFrame, column: str = "mean_latency_s",
               chosen_rate: float | None = None) -> matplotlib.figure.Figure:
    """A figure (median over seeds) against the arrival rate (requests/s), per policy, with the article's value."""
    fig, ax = _figure()
    for policy in sweep.index.get_level_values("policy").unique():
        part = sweep.xs(policy, level="policy")
        color = POLICY_COLORS.get(policy)
        ax.plot(part.index, part[column], "o-", color=color, label=f"{policy} (kvlab, median of seeds)")
        ax.axhline(article.loc[policy, column], color=color, ls="--", lw=1, label=f"{policy} (article)")
    if chosen_rate is not None:
        ax.axvline(chosen_rate, color="grey", ls=":", label=f"rate used: {chosen_rate:g}/s")
    ax.set_xlabel("arrival rate (requests/s, Poisson)")
    ax.set_ylabel(column.replace("_s", " (s)").replace("_", " "))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def variance_sweep(sweep: pd.DataFrame) -> matplotlib.figure.Figure:
    """Mean latency (s) of both policies against the coefficient of variation of output lengths."""
    fig, ax = _figure()
    family = sweep[sweep.index != "article mix"]
    for policy in ("static", "continuous"):
        color = POLICY_COLORS[policy]
        ax.plot(family["cv"], family[policy], "o-", color=color, label=f"{policy}, gamma lengths")
        ax.plot(sweep.loc["article mix", "cv"], sweep.loc["article mix", policy], "*", ms=14, color=color,
                label=f"{policy}, the article's mix")
    ax.set_xlabel("coefficient of variation of output length (std / mean)")
    ax.set_ylabel("mean latency (s), median of seeds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig
