"""Section 4 (notebook 04_traces): real request traces against the article's assumptions, and prefix caching.

The loaders are kvlab.workloads.traces; the LRU prefix cache is kvlab.core.prefix_cache. Notebooks 01
and 02 open their trace through open_trace, which says in one sentence when a file is missing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvlab.core import article, validate
from kvlab.core.prefix_cache import distinct_blocks, replay
from kvlab.core.workload import Workload
from kvlab.workloads import synthetic
from kvlab.workloads.traces import TraceLoad, load_trace, missing_traces, read_manifest, trace_path

# What the article assumes, for comparison with the traces (it gives no arrival rate).
ARTICLE_MEAN_TOKENS = article.MEAN_TOKENS
# The article's row of article_comparison: two of its workloads, section 1's request lengths (mean 567 tokens) and
# section 2's output mix; the mean output (207) is kvlab's reading of that mix (each range read as uniform), not a
# number the article gives.
ARTICLE_ROW = "article (lengths: its section 1; outputs: its section 2, mean read by kvlab)"
ARTICLE_MAX_TOKENS = article.MAX_LEN_TOKENS
ARTICLE_KV_BYTES_PER_TOKEN = int(
    article.MIB_PER_TOKEN * 2**20
)  # the article's 0.5 MB (MiB) per token, to size a cache in GiB
TRACE_NAMES = {"azure": "Azure", "mooncake": "Mooncake", "sharegpt": "ShareGPT"}  # as the prose names them
KVLAB_ARRIVAL_RATE_PER_S = (
    synthetic.S2_ARRIVAL_RATE_PER_S
)  # section 2's Poisson rate: kvlab's choice, not the article's


def summary_table(workloads: dict[str, Workload]) -> pd.DataFrame:
    """Per trace: requests, duration (s), rate (requests/s), prompt and output token percentiles, inter-arrival CV."""
    rows = {}
    for name, w in workloads.items():
        gaps = np.diff(w.arrival_s)
        duration = float(w.arrival_s[-1] - w.arrival_s[0])
        rows[name] = {
            "requests": w.num_requests,
            "duration_s": round(duration, 1),
            "rate_per_s": round(w.num_requests / duration, 2) if duration > 0 else float("nan"),
            "prompt_mean_tokens": round(float(w.prompt_tokens.mean()), 1),
            "prompt_p50_tokens": int(np.percentile(w.prompt_tokens, 50, method="lower")),
            "prompt_p99_tokens": int(np.percentile(w.prompt_tokens, 99, method="lower")),
            "prompt_max_tokens": int(w.prompt_tokens.max()),
            "output_mean_tokens": round(float(w.output_tokens.mean()), 1),
            "output_p50_tokens": int(np.percentile(w.output_tokens, 50, method="lower")),
            "output_p99_tokens": int(np.percentile(w.output_tokens, 99, method="lower")),
            "output_max_tokens": int(w.output_tokens.max()),
            "interarrival_cv": round(float(gaps.std() / gaps.mean()), 2)
            if len(gaps) and gaps.mean() > 0
            else float("nan"),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "trace"
    return table


def article_comparison(workloads: dict[str, Workload]) -> pd.DataFrame:
    """The article's assumed figures against each trace's: mean length, share over 4,096 tokens, output mix, rate."""

    def row(w: Workload) -> dict:
        total = w.prompt_tokens + w.output_tokens
        out = w.output_tokens
        duration = float(w.arrival_s[-1] - w.arrival_s[0])
        return {
            "mean_tokens_per_request": round(float(total.mean()), 1),
            "over_4096_tokens_pct": round(100 * float((total > ARTICLE_MAX_TOKENS).mean()), 1),
            "output_40_to_200_tokens_pct": round(100 * float(((out >= 40) & (out <= 200)).mean()), 1),
            "output_400_to_1000_tokens_pct": round(100 * float(((out >= 400) & (out <= 1000)).mean()), 1),
            "output_mean_tokens": float(out.mean()),  # unrounded: the table and the prose round it once
            "rate_per_s": round(w.num_requests / duration, 2) if duration > 0 else float("nan"),
        }

    assumed = {
        "mean_tokens_per_request": float(ARTICLE_MEAN_TOKENS),
        "over_4096_tokens_pct": 0.0,
        "output_40_to_200_tokens_pct": 85.0,
        "output_400_to_1000_tokens_pct": 15.0,
        "output_mean_tokens": article.MEAN_OUTPUT_TOKENS,
        "rate_per_s": float("nan"),
    }  # the article gives no rate
    table = pd.DataFrame.from_dict({ARTICLE_ROW: assumed} | {n: row(w) for n, w in workloads.items()}, orient="index")
    table.index.name = "source"
    return table


def arrival_rate(workload: Workload, window_s: float = 60.0) -> pd.Series:
    """Arrival rate (requests/s) in consecutive windows of window_s seconds, indexed by window start (min).

    The last window is dropped when the trace ends inside it (its rate would be too low), unless it is the only one.
    """
    window_s = validate.positive_number("window_s", window_s)
    window = (workload.arrival_s // window_s).astype(np.int64)
    num_windows = max(1, int(workload.arrival_s[-1] // window_s))
    counts = np.bincount(window, minlength=num_windows)[:num_windows]
    index = pd.Index(np.arange(num_windows) * window_s / 60.0, name="window_start_min")
    return pd.Series(counts / window_s, index=index, name=f"{workload.name or 'trace'} requests/s")


@dataclass(frozen=True, eq=False)
class NotebookTrace:
    """The trace a notebook asked for: loaded, or None with a plain sentence saying why not."""

    name: str  # azure, mooncake, sharegpt, or "" for none
    load: TraceLoad | None  # None when no trace was asked for or its file is missing
    note: str  # one sentence for the reader, without absolute paths

    @property
    def available(self) -> bool:
        """True when the trace was loaded."""
        return self.load is not None

    def with_others(self, others: dict) -> dict:
        """others (name -> workload or lengths) plus this trace's workload when it was loaded."""
        return dict(others) | ({self.name: self.load.workload} if self.load is not None else {})


def open_trace(
    name: str,
    directory: str | os.PathLike | None = None,
    *,
    max_requests: int | None = None,
    arrival_rate_per_s: float = synthetic.S2_ARRIVAL_RATE_PER_S,
    seed: int = 0,
) -> NotebookTrace:
    """The trace name ("" for none) from trace_dir(directory), its first max_requests requests.

    A missing file is not an error: the result says so in .note and holds no load. ShareGPT (no
    timestamps) gets Poisson arrivals at arrival_rate_per_s (requests/s) from default_rng(seed).
    """
    if not name:
        return NotebookTrace(
            "",
            None,
            "No real trace chosen (TRACE is empty): the real-trace tables "
            "below are empty and the figures show the article's assumptions only.",
        )
    path = trace_path(name, directory or None)
    if not path.is_file():
        return NotebookTrace(
            name,
            None,
            f"The {name} trace is not available ({path.name} is not in the trace "
            "folder; set TRACE_DIR or run make traces): the real-trace tables below "
            "are empty and the figures show the article's assumptions only.",
        )
    timed = name != "sharegpt"
    load = load_trace(
        path,
        name,
        max_requests=max_requests,
        name=name,
        arrival_rate_per_s=None if timed else arrival_rate_per_s,
        rng=None if timed else np.random.default_rng(seed),
    )
    w = load.workload
    arrivals = (
        f"over {w.arrival_s[-1]:,.1f} s of its own timestamps"
        if timed
        else f"with Poisson arrivals at {arrival_rate_per_s:g} requests/s (seed {seed}; the file has no timestamps)"
    )
    first = f"the first {w.num_requests:,}" if max_requests is not None else f"all {w.num_requests:,}"
    return NotebookTrace(name, load, f"The {name} trace: {first} requests, {arrivals}.")


def availability_note(directory: str | os.PathLike | None = None) -> str:
    """One sentence for the report: whether the real trace files were in trace_dir(directory), and which."""
    missing = missing_traces(directory)
    names = list(read_manifest())
    if not missing:
        return f"Real request traces were available ({', '.join(names)}): the real-trace cells ran on them."
    have = [n for n in names if n not in missing]
    text = (
        f"Real request traces were not available ({', '.join(missing)} missing from the trace folder; "
        "set TRACE_DIR or run make traces)"
    )
    if have:
        text += f"; present: {', '.join(have)}"
    return text + ": the cells that need a missing trace show that it is absent instead of its figures."


def hit_rate_curve(
    workload: Workload, cache_sizes_blocks: Sequence[int], kv_bytes_per_token: int | None = None
) -> pd.DataFrame:
    """Hit rate and prefill tokens saved per cache size (blocks), then a row "unbounded" (an LRU that never evicts).

    cache_tokens is the cache size in prompt tokens; for "unbounded" it is the size that holds every
    distinct block of the trace, the smallest cache that reaches the limit. With kv_bytes_per_token
    a column cache_gib gives the KV memory (GiB) such a cache holds.
    """
    if kv_bytes_per_token is not None:
        kv_bytes_per_token = validate.positive_int("kv_bytes_per_token", kv_bytes_per_token)
    sizes = sorted(
        {
            validate.positive_int("cache_sizes_blocks", s)
            for s in validate.non_empty("cache_sizes_blocks", cache_sizes_blocks)
        }
    )
    rows = [replay(workload, s) for s in sizes] + [replay(workload, None)]
    block_tokens = workload.prefix_block_tokens
    table = pd.DataFrame(
        {
            "cache_tokens": [s * block_tokens for s in sizes] + [distinct_blocks(workload) * block_tokens],
            "hit_rate_pct": [round(100 * r.hit_rate, 2) for r in rows],
            "prefill_tokens_saved": [r.prefill_tokens_saved for r in rows],
            "prefill_saved_pct": [round(100 * r.saved_fraction, 2) for r in rows],
        },
        index=pd.Index(sizes + ["unbounded"], dtype=object, name="cache_blocks"),
    )
    if kv_bytes_per_token is not None:
        table.insert(1, "cache_gib", (table["cache_tokens"] * kv_bytes_per_token / 2**30).round(1))
    return table


# ---------------------------------------------------------------- the figures the notebooks' prose states
def prose(trace: NotebookTrace, text: str, figures: dict):
    """A paragraph about the trace: text (Markdown whose {names} are the keys of figures, formatted as str.format
    does, e.g. "{mean_tokens:,.0f}") as prose when the trace was loaded, else one line that there is none."""
    from kvlab.sections.shared import present

    if trace.load is None or not figures:
        return present.prose("(No trace was loaded, so there is nothing to describe here.)")
    return present.prose(text.format(**figures))


def comparison_figures(compare: pd.DataFrame) -> dict:
    """From article_comparison: per trace (keys by its first word, lower case: azure, mooncake, sharegpt) its mean
    request length over the article's (x), its share over 4,096 tokens and its short and long output shares (%),
    its mean output (tokens); and the article's assumed mean length and output mean."""
    out = {
        "article_mean_tokens": ARTICLE_MEAN_TOKENS,
        "article_output_mean": article.MEAN_OUTPUT_TOKENS,
        "article_max_tokens": ARTICLE_MAX_TOKENS,
    }
    for name, row in compare.drop(index=ARTICLE_ROW, errors="ignore").iterrows():
        key = name.split()[0].lower()
        out[f"{key}_vs_article"] = row["mean_tokens_per_request"] / ARTICLE_MEAN_TOKENS
        out[f"{key}_over_max_pct"] = row["over_4096_tokens_pct"]
        out[f"{key}_short_pct"] = row["output_40_to_200_tokens_pct"]
        out[f"{key}_long_pct"] = row["output_400_to_1000_tokens_pct"]
        out[f"{key}_output_mean"] = row["output_mean_tokens"]
    return out


def prompt_figures(summary: pd.DataFrame) -> dict:
    """From summary_table: each trace's mean and median prompt over the article's mean whole request (x), keys by
    the trace name's first word in lower case."""
    out = {}
    for name, row in summary.iterrows():
        key = name.split()[0].lower()
        out[f"{key}_prompt_vs_article"] = row["prompt_mean_tokens"] / ARTICLE_MEAN_TOKENS
        out[f"{key}_prompt_p50_vs_article"] = row["prompt_p50_tokens"] / ARTICLE_MEAN_TOKENS
    return out


def gap_figures(workload: Workload) -> dict:
    """A trace's gaps between arrivals: the share that is zero (%), the smallest and largest non-zero gap (s) and
    the non-zero gaps in words, to 0.1 s ("3.0 s" when all are equal at that precision, else "0.1 to 12.0 s")."""
    gaps = np.diff(workload.arrival_s)
    positive = gaps[gaps > 0]
    low = float(positive.min()) if len(positive) else float("nan")
    high = float(positive.max()) if len(positive) else float("nan")
    shown = (f"{low:.1f}", f"{high:.1f}")
    return {
        "zero_gaps_pct": 100 * float((gaps == 0).mean()),
        "smallest_gap_s": low,
        "largest_gap_s": high,
        "nonzero_gaps": f"{shown[0]} s" if shown[0] == shown[1] else f"{shown[0]} to {shown[1]} s",
    }


def rate_figures(rates: pd.Series) -> dict:
    """An arrival rate over time (arrival_rate): its first, lowest, highest and last window (requests/s) and when
    the highest starts (min)."""
    return {
        "first": float(rates.iloc[0]),
        "low": float(rates.min()),
        "high": float(rates.max()),
        "last": float(rates.iloc[-1]),
        "peak_min": float(rates.idxmax()),
    }


def prefix_figures(
    workload: Workload, curve: pd.DataFrame, kv_bytes_per_token: int = ARTICLE_KV_BYTES_PER_TOKEN
) -> dict:
    """What the prefix-cache table (hit_rate_curve) says: the block size (tokens) and its KV memory (MiB) at
    kv_bytes_per_token; the share of requests whose first block is the trace's most common first block (%); the
    prefill saved (%) and memory (GiB) of the smallest cache, of the cache that fills the KV memory the article's
    section 3 leaves (its GPU memory less its weights, in blocks; NaN when the table has no such row), of the two
    largest bounded caches, and of the cache that never evicts."""
    firsts = pd.Series([h[0] for h in workload.prefix_hashes if len(h)])
    block_mib = workload.prefix_block_tokens * kv_bytes_per_token / 2**20
    budget_gib = article.GPU_MEMORY_GIB - article.WEIGHTS_GIB
    budget_blocks = int(budget_gib * 1024 // block_mib)
    bounded = curve.drop(index="unbounded", errors="ignore")

    def row(size, prefix):
        found = size in bounded.index
        return {
            f"{prefix}_blocks": size,
            f"{prefix}_gib": float(bounded.loc[size, "cache_gib"])
            if found and "cache_gib" in bounded
            else float("nan"),
            f"{prefix}_saved_pct": float(bounded.loc[size, "prefill_saved_pct"]) if found else float("nan"),
        }

    return {
        "block_tokens": workload.prefix_block_tokens,
        "block_mib": block_mib,
        "shared_first_block_pct": 100 * float(firsts.value_counts().iloc[0] / workload.num_requests),
        "budget_gib": budget_gib,
        "article_gpu_gib": article.GPU_MEMORY_GIB,
        **row(bounded.index[0], "smallest"),
        **row(budget_blocks, "budget"),
        **row(bounded.index[max(0, len(bounded) - 2)], "large"),
        **row(bounded.index[-1], "largest"),
        "unbounded_saved_pct": float(curve.loc["unbounded", "prefill_saved_pct"]),
        "unbounded_hit_pct": float(curve.loc["unbounded", "hit_rate_pct"]),
    }
