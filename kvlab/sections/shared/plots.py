"""Figures for the report: fixed sizes, axes with units, nothing computed here but layout.

Every function returns a Figure: the matplotlib figure with a caption (its docstring's first line) that
the notebook shows as the image's alt text and the report as the figure's caption.
"""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

from kvlab.core.units import cdiv

FIGSIZE = (7.0, 4.2)
DPI = 100
# One style for every figure, with text large enough to read when the PDF prints a figure at half the page width.
STYLE = {
    "font.size": 11.5,
    "axes.labelsize": 11.5,
    "axes.titlesize": 11.5,
    "xtick.labelsize": 10.5,
    "ytick.labelsize": 10.5,
    "legend.fontsize": 10,
    "lines.linewidth": 1.8,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@dataclass(frozen=True, eq=False)
class Figure:
    """A figure with its caption; shows as a PNG whose alt text is the caption (and as the caption in text)."""

    figure: matplotlib.figure.Figure
    caption: str

    def png(self) -> bytes:
        """The figure as PNG bytes (no software or date metadata, so the same figure gives the same bytes)."""
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
        return buffer.getvalue()

    def _repr_mimebundle_(self, include=None, exclude=None):
        data = {"image/png": base64.b64encode(self.png()).decode("ascii"), "text/plain": f"Figure: {self.caption}"}
        return data, {"image/png": {"alt": self.caption}}

    def __getattr__(self, name):  # fig.axes, fig.savefig(...): the matplotlib figure's own
        return getattr(self.figure, name)


def captioned(function):
    """Wrap a plot function so that it returns a Figure captioned with the function's first docstring line."""
    caption = " ".join(function.__doc__.strip().split("\n\n")[0].split())  # the docstring's first paragraph

    @functools.wraps(function)
    def plot(*args, **kwargs) -> Figure:
        with plt.rc_context(STYLE):
            made = function(*args, **kwargs)
        return Figure(*made) if isinstance(made, tuple) else Figure(made, caption)  # (figure, its own caption)

    return plot


def _figure(figsize=FIGSIZE, **kwargs):
    """A new figure that pyplot forgets at once: a notebook shows it once, as the cell's value."""
    fig, ax = plt.subplots(figsize=figsize, dpi=100, layout="constrained", **kwargs)
    plt.close(fig)
    return fig, ax


@captioned
def requests_vs_context(fit: pd.DataFrame, label: str = "requests that fit") -> matplotlib.figure.Figure:
    """Requests that fit against the context length (tokens), log-log, with inverse proportion dashed."""
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


@captioned
def length_fit(lengths: np.ndarray, pmf: np.ndarray, bin_tokens: int = 64) -> matplotlib.figure.Figure:
    """Sampled request lengths per 64-token bin (log scale) against the distribution fitted to the article's totals."""
    fig, ax = _figure()
    edges = np.arange(0, len(pmf) + 1, bin_tokens)  # bins [e, e + bin), the last one closed
    counts, _ = np.histogram(lengths, bins=edges)
    by_length = np.concatenate([[0.0], pmf])  # by_length[l] = P(length = l)
    expected = np.add.reduceat(by_length, edges[:-1]) * len(lengths)
    ax.stairs(counts, edges, fill=True, alpha=0.5, label=f"{len(lengths):,} sampled requests")
    ax.stairs(expected, edges, color="black", label="fitted distribution (expected)")
    ax.set_yscale("log")
    ax.set_xlabel(f"request length (tokens, bins of {bin_tokens})")
    ax.set_ylabel("requests per bin")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


@captioned
def waste_vs_block_size(table: pd.DataFrame, article: pd.DataFrame | None = None) -> matplotlib.figure.Figure:
    """Waste (%), requests that fit and block-table entries per request against the block size (tokens, log scale)."""
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
    # One legend for both y axes, at the left middle: the curves there sit at the top and bottom.
    handles = top.get_legend_handles_labels()[0] + fits.get_legend_handles_labels()[0]
    top.legend(handles, [h.get_label() for h in handles], loc="center left")
    top.grid(True, alpha=0.3)
    bottom.plot(b, table["block_table_entries"], "o-", color="C2")
    bottom.set_yscale("log")
    bottom.set_ylabel("block-table entries per request")
    bottom.set_xscale("log", base=2)
    bottom.set_xlabel("block size (tokens, log scale)")
    bottom.grid(True, which="both", alpha=0.3)
    return fig


POLICY_PARTS = {
    "held_tokens": ("token states", "C0"),
    "unused_in_last_block_tokens": ("internal fragmentation: inside the last block", "C1"),
    "unused_beyond_last_block_tokens": ("internal fragmentation: beyond the last block", "C3"),
}


@captioned
def policy_bars(breakdown: pd.DataFrame) -> matplotlib.figure.Figure:
    """Where reserved KV slots go per policy (%): token states, and internal fragmentation inside and beyond the last
    block, in the vLLM paper's terms."""
    fig, ax = _figure()
    share = breakdown[list(POLICY_PARTS)].div(breakdown["reserved_tokens"], axis=0) * 100
    names = [name.replace(" (", "\n(") for name in share.index]  # "vLLM (blocks of 16)" on two lines
    bottom = np.zeros(len(share))
    for column, (label, color) in POLICY_PARTS.items():
        ax.bar(names, share[column], bottom=bottom, color=color, label=label, width=0.6)
        bottom += share[column].to_numpy()
    for i, held in enumerate(share["held_tokens"]):
        ax.annotate(f"{held:.1f}%\nheld", (i, 101), ha="center", va="bottom", fontsize=9.5)
    ax.set_ylim(0, 122)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("share of reserved KV slots (%)")
    ax.set_xlabel("reservation policy")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1, frameon=False)
    return fig


FIG2_COLORS = ("#4c9a2a", "#e0b43c", "#c8553d", "#9aa3ab")  # the paper's legend order: states, reservation, int., ext.


@captioned
def fig2_split(table: pd.DataFrame) -> matplotlib.figure.Figure:
    """Fig. 2's split of the KV cache (%), kvlab's bar above the paper's for each allocation: token states,
    reservation, internal fragmentation, external fragmentation & others (the paper labels only vLLM's token states;
    its bar's unlabelled rest is left blank)."""
    fig, ax = _figure(figsize=(FIGSIZE[0], 4.2))
    names = list(table.index)[::-1]  # the first allocation on top
    left = np.zeros(len(names))
    for column, color in zip(table.columns, FIG2_COLORS):
        values = table.loc[names, column].fillna(0.0).to_numpy()
        ax.barh(names, values, left=left, color=color, label=column.removesuffix(" (%)"), height=0.7)
        for y, (x, v) in enumerate(zip(left, values)):
            if v >= 6:
                ax.annotate(f"{v:.1f}", (x + v / 2, y), ha="center", va="center", fontsize=9, color="white")
        left += values
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the KV cache (%)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.42, -0.16), ncol=2, frameon=False)
    return fig


@captioned
def allocation_band(
    runs: pd.DataFrame, article: pd.DataFrame, column: str = "wasted_tokens", label: str = "wasted tokens"
) -> matplotlib.figure.Figure:
    """How far the article's figure (x) lies from kvlab's seed median per block size, against the spread over seeds."""
    fig, ax = _figure()
    sizes = [b for b in article.index if b in set(runs.index)]  # the article's units that this run counted too
    article = article.loc[sizes]
    medians = [np.median(runs.loc[runs.index == b, column]) for b in sizes]
    data = [100 * (runs.loc[runs.index == b, column].to_numpy() / m - 1) for b, m in zip(sizes, medians)]
    ax.boxplot(data, whis=(5, 95), showfliers=False)
    ax.plot(
        range(1, len(sizes) + 1),
        100 * (article[column].to_numpy() / np.array(medians) - 1),
        "x",
        color="black",
        ms=10,
        label="article",
    )
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(1, len(sizes) + 1), [f"{b:,}" for b in sizes])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel(f"{label}: % from the seed median\n(box 25-75%, whiskers 5-95%)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig, (
        f"The article's {label} (x) against the spread of kvlab's seeds per block size, as % from the "
        "seed median (boxes 25-75%, whiskers 5-95%)."
    )


# ---------------------------------------------------------------- section 2: batching
POLICY_COLORS = {"static": "tab:red", "continuous": "tab:blue"}


@captioned
def slot_timeline(results: list, until_s: float = 30.0) -> matplotlib.figure.Figure:
    """Each slot over time (s) for each policy: a request's own tokens solid, static padding hatched."""
    fig, axes = _figure(figsize=(9.0, 2.2 * len(results) + 0.6), nrows=len(results), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results):
        color = POLICY_COLORS.get(result.policy, "tab:grey")
        seen = result.start_s < until_s
        for slot in range(result.max_num_seqs):
            mine = seen & (result.slot == slot)
            start, done, finish = result.start_s[mine], result.done_s[mine], result.finish_s[mine]
            ax.broken_barh(
                list(zip(start, done - start)), (slot - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.3
            )
            padded = finish > done
            ax.broken_barh(
                list(zip(done[padded], (finish - done)[padded])),
                (slot - 0.4, 0.8),
                facecolors="none",
                edgecolor=color,
                hatch="////",
                linewidth=0.0,
            )
        busy = float(np.clip(np.minimum(result.done_s, until_s) - result.start_s, 0, None)[seen].sum())
        padding = " (hatched: held by a finished request waiting for its batch)" if result.policy == "static" else ""
        ax.set_title(
            f"{result.policy}: slots busy {100 * busy / (result.max_num_seqs * until_s):.0f}% of the first "
            f"{until_s:g} s{padding}",
            fontsize=9,
        )
        ax.set_ylabel("slot")
        ax.set_yticks(range(result.max_num_seqs))
        ax.set_ylim(-0.6, result.max_num_seqs - 0.4)
    axes[-1, 0].set_xlim(0, until_s)
    axes[-1, 0].set_xlabel("time since the first arrival (s)")
    return fig


@captioned
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


RATE_SWEEP_LABELS = {"mean_latency_s": "mean latency (s)", "makespan_s": "total time, makespan (s)"}


@captioned
def rate_sweep(
    sweep: pd.DataFrame, article: pd.DataFrame, column: str = "mean_latency_s", chosen_rate: float | None = None
) -> matplotlib.figure.Figure:
    """A figure (median over seeds) against the arrival rate (requests/s), per policy, with the article's value."""
    what = RATE_SWEEP_LABELS.get(column, column)
    fig, ax = _figure()
    for policy in sweep.index.get_level_values("policy").unique():
        part = sweep.xs(policy, level="policy")
        color = POLICY_COLORS.get(policy)
        ax.plot(part.index, part[column], "o-", color=color, label=f"{policy} (kvlab, median of seeds)")
        ax.axhline(article.loc[policy, column], color=color, ls="--", lw=1, label=f"{policy} (article)")
    if chosen_rate is not None:
        ax.axvline(chosen_rate, color="grey", ls=":", label=f"rate used: {chosen_rate:g}/s")
    ax.set_xlabel("arrival rate (requests/s, Poisson)")
    ax.set_ylabel(RATE_SWEEP_LABELS.get(column, column.replace("_s", " (s)").replace("_", " ")))
    values = np.concatenate([sweep[column].to_numpy(dtype=float), article[column].to_numpy(dtype=float)])
    pad = 0.06 * (values.max() - values.min())  # the article's lines must not sit on the frame
    ax.set_ylim(values.min() - pad, values.max() + pad)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    return fig, (
        f"{what[0].upper() + what[1:]} against the Poisson arrival rate (requests/s), median over seeds per "
        "policy, with the article's value dashed and kvlab's chosen rate dotted."
    )


@captioned
def variance_sweep(sweep: pd.DataFrame) -> matplotlib.figure.Figure:
    """Mean latency (s) of both policies as output lengths spread (coefficient of variation), the article's mix starred."""
    fig, ax = _figure()
    family = sweep[sweep.index != "article mix"]
    for policy in ("static", "continuous"):
        color = POLICY_COLORS[policy]
        ax.plot(family["cv"], family[policy], "o-", color=color, label=f"{policy}, gamma lengths")
        ax.plot(
            sweep.loc["article mix", "cv"],
            sweep.loc["article mix", policy],
            "*",
            ms=14,
            color=color,
            label=f"{policy}, the article's mix",
        )
    ax.set_xlabel("coefficient of variation of output length (std / mean)")
    ax.set_ylabel("mean latency (s), median of seeds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
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


@captioned
def length_cdfs(
    workloads: dict, column: str = "prompt_tokens", marks: dict[str, float] | None = None
) -> matplotlib.figure.Figure:
    """Share of requests at or below each length (tokens, log scale), one line per workload, with the article's marks.

    A value of workloads may also be an array of token counts (e.g. lengths drawn from the article's assumption).
    """
    fig, ax = _figure()
    for name, w in workloads.items():
        ax.ecdf(np.maximum(w if isinstance(w, np.ndarray) else getattr(w, column), 1), label=name)
    for i, (label, x) in enumerate((marks or {}).items()):
        ax.axvline(x, color="grey", linestyle=("--", ":", "-.")[i % 3], label=label)
    ax.set_xscale("log")
    label = "request length, prompt + output" if column == "total_tokens" else column.replace("_tokens", "")
    label = label.replace("_", " ")
    names = list(marks or {})
    marked = (
        ""
        if not names
        else f"; the vertical line marks {names[0]}"
        if len(names) == 1
        else f"; vertical lines mark {', '.join(names[:-1])} and {names[-1]}"
    )
    return (
        _finish(fig, ax, label + " (tokens, log scale)", "share of requests"),
        f"Share of requests at or below each {label} (tokens, log scale), one line per workload{marked}.",
    )


INTERARRIVAL_MAX_RATIO = 5.0  # the gap figure's right edge, in mean gaps


@captioned
def interarrival_cdfs(workloads: dict, max_ratio: float = INTERARRIVAL_MAX_RATIO) -> matplotlib.figure.Figure:
    """Share of gaps between arrivals at or below each multiple of the mean gap, against Poisson arrivals (dashed)."""
    fig, ax = _figure()
    for name, w in workloads.items():
        gaps = np.diff(w.arrival_s)
        ax.ecdf(gaps / gaps.mean(), label=name)
    x = np.linspace(0, max_ratio, 200)
    ax.plot(x, 1 - np.exp(-x), "--", color="black", label="Poisson arrivals (exponential gaps)")
    ax.set_xlim(0, max_ratio)
    return _finish(fig, ax, "inter-arrival time / mean inter-arrival time (1)", "share of gaps")


@captioned
def arrival_rates(rates: dict[str, pd.Series]) -> matplotlib.figure.Figure:
    """Arrival rate (requests/s) per time window against time (min), one line per trace."""
    fig, ax = _figure()
    for name, series in rates.items():
        ax.step(series.index, series.to_numpy(), where="post", label=name)
    return _finish(fig, ax, "time since the first request (min)", "arrival rate (requests/s)", ylim_bottom=0)


@captioned
def prefix_hit_rate(curve: pd.DataFrame) -> matplotlib.figure.Figure:
    """Prefix-cache hit rate and prefill saved (%) against the cache size (512-token blocks, log scale), unbounded dashed."""
    fig, ax = _figure()
    bounded = curve.drop(index="unbounded")
    limit = curve.loc["unbounded"]
    x = bounded.index.to_numpy(dtype=float)
    for column, label, color in (
        ("hit_rate_pct", "block hit rate", "C0"),
        ("prefill_saved_pct", "prefill tokens saved", "C1"),
    ):
        ax.semilogx(x, bounded[column], "o-", color=color, label=label)
        ax.axhline(limit[column], color=color, linestyle="--", label=f"{label}, unbounded cache ({limit[column]:.1f}%)")
    return _finish(fig, ax, "cache size (prefix blocks, log scale)", "% of blocks / of prompt tokens", ylim_bottom=0)


@captioned
def concurrency_vs_context(table: pd.DataFrame, gpu: str = "") -> matplotlib.figure.Figure:
    """vLLM's maximum concurrency against the tokens per request, one panel per model, a line per GPU count and KV dtype."""
    names = list(dict.fromkeys(table["model"]))
    cols = 2
    rows = cdiv(len(names), cols)
    fig, axes = _figure(figsize=(9.0, 3.2 * rows), nrows=rows, ncols=cols, sharex=True, squeeze=False)
    tps = sorted(table["tensor_parallel_size"].unique())
    colors = dict(zip(tps, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = dict(zip(sorted(table["kv_cache_dtype"].unique()), ["-", "--", ":", "-."]))
    for ax, name in zip(axes.flat, names):
        part = table[table["model"] == name]
        for (dtype, tp), line in part.groupby(["kv_cache_dtype", "tensor_parallel_size"]):
            ax.loglog(
                line["max_model_len"],
                line["max_concurrency"],
                styles[dtype],
                color=colors[tp],
                marker=".",
                label=f"TP={tp}, {dtype} KV",
            )
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_title(name.split("/")[-1], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("tokens per request (max_model_len)")
    for ax in axes[:, 0]:
        ax.set_ylabel("max concurrency (requests)")
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8)
    if gpu:
        fig.suptitle(
            f"vLLM's maximum concurrency on {gpu} (a missing line: the weights leave no KV block)", fontsize=10
        )
    return fig


@captioned
def hybrid_serving(served: pd.DataFrame) -> matplotlib.figure.Figure:
    """The long-context workload on each deployment (section 3, part 3): mean running batch and mean TTFT, side by
    side; a hybrid model's bar beside its every-layer-full one."""
    fig, (left, right) = _figure(figsize=(9.0, 3.2), ncols=2)
    names = [name.split("/")[-1] for name in served.index]
    # blue: a model with windows as vLLM keeps them (it has an every-layer-full twin); grey: every layer full, that
    # twin or a model of full attention alone
    windowed = {name for name in served.index if f"{name} (every layer full)" in served.index}
    colors = ["tab:blue" if name in windowed else "tab:grey" for name in served.index]
    for ax, column, label in (
        (left, "mean_running", "mean running batch (requests)"),
        (right, "mean_ttft_s", "mean TTFT (s)"),
    ):
        ax.barh(names, served[column], color=colors)
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.grid(True, axis="x", alpha=0.3)
    right.set_yticklabels([])
    fig.suptitle(
        "The same workload and step cost on one GPU: windows as vLLM keeps them (blue), every layer full (grey)",
        fontsize=10,
    )
    return fig


# ---------------------------------------------------------------- section 6: serving under one memory budget
MODE_COLORS = {"Orca (Max)": "tab:red", "Orca (Pow2)": "tab:orange", "Orca (Oracle)": "tab:green", "vLLM": "tab:blue"}


def _plain_log2(axis) -> None:
    """A log axis of base 2 labelled with plain numbers (0.25, 1, 4, ...), no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=2))
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(NullFormatter())


@captioned
def trace_vs_rate(table: pd.DataFrame, bound_s: float) -> matplotlib.figure.Figure:
    """A real trace at fractions of its own arrival rate: normalized latency (s per output token, log scale; the bound
    dashed) and requests batched (mean over steps) against the arrival rate (requests/s), a line per allocation mode."""
    fig, (left, right) = _figure(figsize=(FIGSIZE[0], 3.6), ncols=2)
    for name, rows in table.groupby(level="allocation", sort=False):
        rows = rows.sort_values("rate_per_s")
        style = {"color": MODE_COLORS.get(name), "marker": "o", "markersize": 3.5, "label": name}
        left.plot(rows["rate_per_s"], rows["normalized_latency_s"], **style)
        right.plot(rows["rate_per_s"], rows["mean_batched_requests"], **style)
    left.axhline(bound_s, color="grey", linestyle="--", linewidth=1)
    left.set_yscale("log")
    left.set_ylabel("normalized latency (s/token)")
    right.set_ylabel("requests batched (mean)")
    for ax in (left, right):
        ax.set_xlabel("arrival rate (requests/s)")
        ax.grid(True, alpha=0.3)
    right.legend(frameon=False, fontsize=9)
    return fig


@captioned
def decode_steps(steps: pd.DataFrame) -> matplotlib.figure.Figure:
    """Measured decode step time (ms) against the tokens each request has cached (log scale), a line per batch size
    (requests), one panel per GPU that measured them."""
    devices = list(dict.fromkeys(steps["device"]))
    fig, axes = _figure(figsize=(FIGSIZE[0], 3.8), ncols=max(1, len(devices)), squeeze=False)
    for ax, device in zip(axes[0], devices):
        rows = steps[steps["device"] == device]
        for batch, part in rows.groupby("batch_size"):
            part = part.sort_values("context_tokens")
            ax.plot(part["context_tokens"], part["decode_step_ms"], marker="o", markersize=3.5, label=f"{batch}")
        ax.set_xscale("log", base=2)
        _plain_log2(ax.xaxis)
        ax.set_xlabel("context (tokens per request)")
        ax.set_ylabel("decode step (ms)")
        ax.set_title(device, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(title="batch size", frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


@captioned
def term_shares(view: pd.DataFrame, gaps: dict[str, float]) -> matplotlib.figure.Figure:
    """What each term of the measured clock adds to a run's mean TPOT (ms, bars), one panel per real run, against the
    gap between kvlab's clock and vLLM (dashed: kvlab short of vLLM when left of 0): a term shorter than the gap cannot
    close it alone by being mis-sized."""
    runs = list(dict.fromkeys(view.index.get_level_values("run")))
    fig, axes = _figure(figsize=(FIGSIZE[0], 1.2 + 1.6 * len(runs)), nrows=len(runs), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        adds = view.loc[run, "adds_tpot_ms"].drop("none").sort_values()
        ax.barh(list(adds.index), adds.to_numpy(), color="tab:blue", height=0.6)
        ax.axvline(
            gaps[run], color="tab:red", linestyle="--", linewidth=1.2, label=f"kvlab - vLLM: {gaps[run]:+.1f} ms"
        )
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.set_title(run, fontsize=10, loc="left")
        ax.legend(frameon=False, fontsize=8.5, loc="lower right")
        ax.tick_params(axis="y", labelsize=8.5)
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("mean TPOT the term adds (ms)")
    return fig


@captioned
def latency_vs_rate(
    curves: pd.DataFrame, bound_s: float, sustained: pd.DataFrame | None = None
) -> matplotlib.figure.Figure:
    """Normalized latency (s per output token, log scale) against the request rate (requests/s, log scale), one panel
    per dataset and a line per allocation mode, the latency bound dashed and each mode's sustained rate marked."""
    names = list(dict.fromkeys(curves.index.get_level_values("dataset")))
    fig, axes = _figure(figsize=(9.0, 3.8), ncols=len(names), squeeze=False)
    for ax, name in zip(axes[0], names):
        part = curves.xs(name, level="dataset")
        for mode in part.columns:
            color = MODE_COLORS.get(mode)
            ax.plot(part.index, part[mode], "o-", ms=3, color=color, label=mode)
            if sustained is not None and (name, bound_s) in sustained.index:
                rate = sustained.loc[(name, bound_s), mode]
                if rate == rate:
                    ax.plot([rate], [part.loc[rate, mode]], "s", ms=8, mfc="none", color=color)
        ax.axhline(bound_s, color="black", ls="--", lw=1, label=f"bound {bound_s:g} s/token")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log2(ax.xaxis)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("request rate (requests/s, Poisson)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].set_ylabel("normalized latency (s/token)")
    axes[0, 0].legend(fontsize=8)
    return fig


@captioned
def batched_vs_rate(runs: pd.DataFrame, fig13: pd.DataFrame, rates: dict) -> matplotlib.figure.Figure:
    """Requests batched (mean over steps) against the request rate (requests/s, log scale), one panel per dataset and a
    line per allocation mode; stars: the paper's Fig. 13 at its rate."""
    names = list(dict.fromkeys(runs["dataset"]))
    fig, axes = _figure(figsize=(9.0, 3.8), ncols=len(names), squeeze=False)
    mean = runs.groupby(["dataset", "mode", "rate"])["mean_batched_requests"].mean()
    labels = {"max": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)", "paged": "vLLM"}
    for ax, name in zip(axes[0], names):
        for mode, label in labels.items():
            part = mean.loc[(name, mode)]
            color = MODE_COLORS[label]
            ax.plot(part.index, part.to_numpy(), "o-", ms=3, color=color, label=label)
            column = f"{name}: paper"
            if column in fig13:
                ax.plot([rates[name]], [fig13.loc[label, column]], "*", ms=12, color=color)
        ax.set_xscale("log", base=2)
        _plain_log2(ax.xaxis)
        ax.set_title(f"{name} (stars: the paper at {rates[name]:g} requests/s)", fontsize=10)
        ax.set_xlabel("request rate (requests/s, Poisson)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].set_ylabel("requests batched (mean over steps)")
    axes[0, 0].legend(fontsize=8)
    return fig


@captioned
def block_size_tradeoff(tables: dict[str, pd.DataFrame]) -> matplotlib.figure.Figure:
    """Block size (tokens, log scale) under the engine, one line per dataset and rate: normalized latency relative to
    block 16 (left); the share of the memory requests hold that holds token states, solid, and block-table entries
    per request, dotted (right)."""
    fig, (left, right) = _figure(figsize=(9.0, 3.8), ncols=2)
    entries = right.twinx()
    for i, (name, table) in enumerate(tables.items()):
        color = f"C{i}"
        x = table.index.to_numpy(dtype=float)
        base = table.loc[16, "normalized_latency_s"] if 16 in table.index else table["normalized_latency_s"].min()
        left.plot(x, table["normalized_latency_s"] / base, "o-", color=color, label=name)
        right.plot(x, table["token_states_of_held_pct"], "o-", color=color, label=name)
        entries.plot(x, table["block_table_entries"], "s:", color=color, ms=3)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        _plain_log2(ax.xaxis)
        ax.set_xlabel("block size (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    entries.set_yscale("log", base=2)
    entries.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    left.set_ylabel("normalized latency / at block 16")
    left.legend(fontsize=8)
    right.set_ylabel("token states / memory held (%), solid")
    entries.set_ylabel("block-table entries per request, dotted")
    right.legend(fontsize=7, loc="lower left")
    return fig


@captioned
def preemption_vs_memory(table: pd.DataFrame) -> matplotlib.figure.Figure:
    """KV-cache size (GiB): normalized latency per allocation mode (left, log scale) and vLLM's recompute preemptions
    per request (right)."""
    fig, (left, right) = _figure(figsize=(9.0, 3.8), ncols=2)
    x = table.index.to_numpy(dtype=float)
    for mode, color in MODE_COLORS.items():
        left.semilogy(x, table[f"{mode}: latency (s/token)"], "o-", color=color, label=mode)
    left.set_xlabel("KV cache (GiB)")
    left.set_ylabel("normalized latency (s/token)")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    right.plot(x, table["vLLM: preemptions per request"], "o-", color=MODE_COLORS["vLLM"])
    right.set_xlabel("KV cache (GiB)")
    right.set_ylabel("vLLM: preemptions per request")
    right.set_ylim(0, None)
    right.grid(True, alpha=0.3)
    return fig


STEP_COST_COLORS = {"roofline": "tab:grey", "measured": "tab:blue", "composed": "tab:orange"}


@captioned
def check_scatter(requests: pd.DataFrame) -> matplotlib.figure.Figure:
    """Each request's E2E latency (s) in kvlab against vLLM's, one panel per real vLLM run, one colour per clock;
    dashed: kvlab equals vLLM."""
    runs = list(dict.fromkeys(requests.index.get_level_values("run")))
    fig, axes = _figure(figsize=(9.0, 3.4), ncols=len(runs), squeeze=False)
    for ax, run in zip(axes[0], runs):
        mine = requests.xs(run, level="run")
        for cost_name in dict.fromkeys(mine.index.get_level_values("step_cost")):
            r = mine.xs(cost_name, level="step_cost")
            ax.scatter(
                r["vllm_e2e_s"],
                r["kvlab_e2e_s"],
                s=6,
                alpha=0.5,
                color=STEP_COST_COLORS.get(cost_name),
                label=cost_name,
                linewidths=0,
            )
        top = float(np.nanmax(mine[["vllm_e2e_s", "kvlab_e2e_s"]].to_numpy())) * 1.05
        ax.plot([0, top], [0, top], "--", color="black", lw=1)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_aspect("equal")
        ax.set_title(mine["label"].iloc[0], fontsize=9.5)
        ax.set_xlabel("vLLM's E2E latency (s)")
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_ylabel("kvlab's E2E latency (s)")
    axes[0, 0].legend(fontsize=8, markerscale=2)
    return fig


@captioned
def plan_pareto(served: pd.DataFrame, objectives: dict, words: dict, units: dict) -> matplotlib.figure.Figure:
    """Requests/s per GPU against each objective's p95 latency (log scale), one point per configuration served on
    the whole workload: filled where it meets every objective, hollow where it misses; the objective dashed and the
    best configuration labelled.

    served: kvlab.sections.s07_plan.served_table; objectives: metric name -> limit; words, units: their names.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    names = list(objectives)
    fig, axes = _figure(figsize=(9.0, 3.8), ncols=len(names), squeeze=False, sharey=True)
    meets = served[served["meets"]]
    misses = served[~served["meets"]]
    for ax, name in zip(axes[0], names):
        ax.plot(
            misses[name],
            misses["requests_per_s_per_gpu"],
            "o",
            ms=7,
            mfc="none",
            color="tab:red",
            label="misses an objective",
        )
        ax.plot(
            meets[name], meets["requests_per_s_per_gpu"], "o", ms=7, color="tab:green", label="meets every objective"
        )
        ax.axvline(
            objectives[name], color="black", ls="--", lw=1, label=f"objective: {objectives[name]:g} {units[name]}"
        )
        for _, row in served[served["best"]].iterrows():
            ax.annotate(
                f"best: TP {row['tensor_parallel_size']} x {row['num_replicas']}",
                (row[name], row["requests_per_s_per_gpu"]),
                xytext=(8, -12),
                textcoords="offset points",
                fontsize=9,
            )
        ax.set_xscale("log")
        # ticks at 1, 2 and 5 of each decade, so a range narrower than a decade still has labelled ticks
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{words[name]} ({units[name]}, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[0, 0].set_ylabel("requests/s per GPU")
    axes[0, 0].set_ylim(0, 1.3 * float(served["requests_per_s_per_gpu"].max()) if len(served) else 1)
    return fig


@captioned
def fleet_routers(table: pd.DataFrame) -> matplotlib.figure.Figure:
    """Each router's share of prompt tokens found in the instances' prefix caches (%) and p95 time to first token
    (s, log scale), at each arrival rate."""
    fig, (hits, ttft) = _figure(figsize=(FIGSIZE[0], 4.2), nrows=2, sharex=True)
    routers = list(dict.fromkeys(table["router"]))
    scales = list(dict.fromkeys(table["rate_scale"]))
    width = 0.8 / len(scales)
    for k, scale in enumerate(scales):
        rows = table[table["rate_scale"] == scale].set_index("router").loc[routers]
        x = np.arange(len(routers)) + (k - (len(scales) - 1) / 2) * width
        label = f"{scale:g}x the trace's arrival rate"
        hits.bar(x, rows["prefix_hit_pct"], width, label=label)
        ttft.bar(x, rows["p95_ttft_s"], width, label=label)
    hits.set_ylabel("prefix hits (%)")
    ttft.set_ylabel("p95 TTFT (s)")
    ttft.set_yscale("log")
    ttft.set_xticks(range(len(routers)), routers, rotation=20)
    ttft.set_xlabel("router")
    hits.legend(frameon=False)
    return fig
