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


def concurrency_vs_context(table: pd.DataFrame, gpu: str = "") -> matplotlib.figure.Figure:
    """vLLM's maximum concurrency against max_model_len, one panel per model, a line per TP and KV dtype."""
    names = list(dict.fromkeys(table["model"]))
    cols = 2
    rows = -(-len(names) // cols)
    fig, axes = _figure(figsize=(9.0, 3.2 * rows), nrows=rows, ncols=cols, sharex=True, squeeze=False)
    tps = sorted(table["tensor_parallel_size"].unique())
    colors = dict(zip(tps, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = dict(zip(sorted(table["kv_cache_dtype"].unique()), ["-", "--", ":", "-."]))
    for ax, name in zip(axes.flat, names):
        part = table[table["model"] == name]
        for (dtype, tp), line in part.groupby(["kv_cache_dtype", "tensor_parallel_size"]):
            ax.loglog(line["max_model_len"], line["max_concurrency"], styles[dtype], color=colors[tp], marker=".",
                      label=f"TP={tp}, {dtype} KV")
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_title(name.split("/")[-1], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("tokens per request (max_model_len)")
    for ax in axes[:, 0]:
        ax.set_ylabel("max concurrency (requests)")
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8)
    if gpu:
        fig.suptitle(f"vLLM's maximum concurrency on {gpu} (a missing line: the weights leave no KV block)", fontsize=10)
    return fig
