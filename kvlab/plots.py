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
