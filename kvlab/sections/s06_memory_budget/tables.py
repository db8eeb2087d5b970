"""Section 6's tables (notebook 06_memory_budget): the setting, the datasets, the paper's figures beside kvlab's, and
each grid's runs reduced to one table (means over seeds), with the decimals and labels the notebook shows them in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvlab.core import capacity, validate
from kvlab.core.batching import simulate as slot_simulate
from kvlab.core.cost import Batch
from kvlab.core.prefix_cache import replay
from kvlab.core.service_time import TokenServiceTime
from kvlab.core.units import GIB
from kvlab.sections.s06_memory_budget.runs import MODE_LABELS, MODES
from kvlab.sections.shared import ledger
from kvlab.sections.shared.present import joined, label, published
from kvlab.studies.paper_setting import PaperSetting, prefix_setting
from kvlab.studies.paper_workloads import TraceWorkload, sharegpt_counts
from kvlab.workloads import paper_datasets

DATA_DIR = Path(__file__).resolve().parents[3] / "data"
PARITY_CSV = DATA_DIR / "parity" / "scheduler.csv"
SECTION = 6
# kvlab's rule for the best block size (chosen before its values were seen): every block size whose normalized
# latency is within 1% of the lowest counts as best, and kvlab's value is the smallest of them.
BEST_BLOCK_TOLERANCE = 0.01
# How the notebook rounds length_table's and memory_table's columns.
LENGTH_DECIMALS = {
    "requests": 0,
    "dropped_requests": 0,
    "input_mean_tokens": 2,
    "output_mean_tokens": 2,
    "paper_input_mean_tokens": 2,
    "paper_output_mean_tokens": 2,
}
MEMORY_DECIMALS = {
    "kv_cache_gib": 1,
    **{f"{m}: latency (s/token)": 3 for m in MODE_LABELS.values()},
    **{f"{m}: batched": 2 for m in MODE_LABELS.values()},
    "vLLM: preemptions per request": 3,
    "vLLM: requests preempted (%)": 1,
}
# The Anyscale fit's table (vllm_2023_fit.fit_table) in words.
FIT_LABELS = {
    "max_tokens_cap": "max tokens cap",
    "blog_tokens_per_s": "Anyscale's blog (tokens/s)",
    "step_cost_tokens_per_s": "kvlab's step cost (tokens/s)",
    "residual_pct": "residual against the blog (%)",
    "rerun_tokens_per_s": "benchmark rerun, vLLM 0.1.2 (tokens/s)",
}
FIT_DECIMALS = {"blog_tokens_per_s": 0, "step_cost_tokens_per_s": 0, "rerun_tokens_per_s": 0, "residual_pct": 1}
# How the notebook rounds block_table's columns.
BLOCK_DECIMALS = {
    "normalized_latency_s": 4,
    "num_preemptions": 0,
    "token_states_pct": 1,
    "token_states_of_held_pct": 1,
    "block_table_entries": 1,
    "num_gpu_blocks": 0,
}
# How the notebook labels prefix_table's columns.
PREFIX_LABELS = {
    "rate_scale": "rate scale (x)",
    "hit_pct": "prompt tokens hit (%)",
    "mean_ttft_off_s": "mean TTFT, off (s)",
    "mean_ttft_on_s": "mean TTFT, on (s)",
    "ttft_saved_s": "mean TTFT saved (s)",
    "ttft_saved_pct": "mean TTFT saved (%)",
    "p50_ttft_off_s": "p50 TTFT, off (s)",
    "p50_ttft_on_s": "p50 TTFT, on (s)",
    "p95_ttft_off_s": "p95 TTFT, off (s)",
    "p95_ttft_on_s": "p95 TTFT, on (s)",
    "preemptions_off": "preemptions, off",
    "preemptions_on": "preemptions, on",
    "lru_same_size_saved_pct": "section 4 LRU, pool-sized: prefill saved (%)",
    "lru_unbounded_saved_pct": "section 4 LRU, never evicts: prefill saved (%)",
}
SCHEDULING_LABELS = {False: "synchronous", True: "asynchronous (vLLM 0.33's default)"}
SCHEDULING_DECIMALS = {
    "mean_ttft_s": 3,
    "p95_ttft_s": 3,
    "mean_tpot_ms": 2,
    "normalized_latency_s": 4,
    "held_pct": 2,
    "token_states_pct": 2,
    "num_preemptions": 0,
    "output_tokens_per_s": 1,
}


def setting_table(setting: PaperSetting) -> pd.DataFrame:
    """The KV cache the runs use (the paper's Table 1 figure) beside what vLLM 0.33 would size on that GPU itself
    (kvlab.core.capacity.plan_capacity: memory x 0.9 - weights - activation peak - other memory)."""
    model, gpu = setting.model_spec, setting.gpu_spec
    planned = capacity.plan_capacity(model, gpu.memory_gib, setting.max_model_len, setting.config())
    per_token = setting.kv_bytes_per_token
    rows = {
        f"the paper's KV cache ({setting.kv_cache_gib:g} GiB)": {
            "kv_cache_gib": setting.kv_cache_gib,
            "num_gpu_blocks": setting.num_gpu_blocks(),
            "token_slots_tokens": setting.pool_tokens(),
            "kv_kib_per_token": per_token / 1024,
            "max_length_requests": setting.pool_tokens() // setting.max_model_len,
        },
    }
    if planned is not None:
        tokens = (planned["num_gpu_blocks"] - 1) * setting.block_size
        rows[f"vLLM 0.33 on the {gpu.name} (as vLLM 0.33 sizes it)"] = {
            "kv_cache_gib": planned["available_kv_cache_bytes"] / GIB,
            "num_gpu_blocks": planned["num_gpu_blocks"],
            "token_slots_tokens": tokens,
            "kv_kib_per_token": per_token / 1024,
            "max_length_requests": tokens // setting.max_model_len,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "KV cache"
    return table


def cost_table(setting: PaperSetting, batch_sizes=(1, 8, 32, 128), context_tokens: int = 500) -> pd.DataFrame:
    """The roofline step cost: a decode step of batch_size requests of context_tokens each, and prefills (ms)."""
    cost = setting.cost()
    rows = {}
    for batch in batch_sizes:
        rows[f"decode: {batch} request{'s' * (batch != 1)} x {context_tokens} tokens"] = {
            "tokens": batch,
            "step_ms": 1000
            * cost.step_s(Batch(batch, batch * (context_tokens + 1), batch, batch * (context_tokens + 1))),
        }
    for prompt in (512, 2048):
        rows[f"prefill: one prompt of {prompt} tokens"] = {
            "tokens": prompt,
            "step_ms": 1000 * cost.step_s(Batch(prompt, prompt)),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "step"
    return table


def length_table(setting: PaperSetting, trace_dir=None, num_draws: int = 200_000, seed: int = 0) -> pd.DataFrame:
    """Every dataset variant kvlab offers against the paper's Fig. 11 means: requests in the pool, dropped as longer
    than max_model_len, mean input and output tokens (a draw of num_draws for the synthetic families)."""
    prefill, decode = sharegpt_counts(trace_dir)
    rows = {}
    for inputs in paper_datasets.SHAREGPT_INPUTS:
        pool = paper_datasets.sharegpt_pool(prefill, decode, inputs, setting.max_model_len)
        rows[pool.name] = {
            "requests": pool.num_requests,
            "dropped_requests": pool.num_dropped,
            "input_mean_tokens": pool.mean_tokens()["input"],
            "output_mean_tokens": pool.mean_tokens()["output"],
            "paper_input_mean_tokens": paper_datasets.SHAREGPT_MEAN_TOKENS["input"],
            "paper_output_mean_tokens": paper_datasets.SHAREGPT_MEAN_TOKENS["output"],
        }
    for family in paper_datasets.ALPACA_FAMILIES:
        lengths = paper_datasets.alpaca_lengths(family)
        prompt, output = lengths.lengths(num_draws, np.random.default_rng(seed))
        rows[lengths.name] = {
            "requests": np.nan,
            "dropped_requests": np.nan,
            "input_mean_tokens": float(prompt.mean()),
            "output_mean_tokens": float(output.mean()),
            "paper_input_mean_tokens": paper_datasets.ALPACA_MEAN_TOKENS["input"],
            "paper_output_mean_tokens": paper_datasets.ALPACA_MEAN_TOKENS["output"],
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "dataset"
    return table


def mean_over_seeds(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The runs' numeric columns averaged over seeds, by the labels in by (in the runs' order)."""
    numeric = [c for c in runs.columns if c not in by and pd.api.types.is_numeric_dtype(runs[c]) and c != "seed"]
    return runs.groupby(by, sort=False)[numeric].mean()


def paper_values(table: str, column: str) -> pd.Series:
    """The paper's figures of one table of data/paper_figures.csv, by row (its mode labels)."""
    figures = ledger.paper_figures(SECTION)
    figures = figures[(figures["table"] == table) & (figures["column"] == column)]
    return figures.set_index("row")["value"]


def chosen(runs: pd.DataFrame, sets: dict) -> pd.DataFrame:
    """The runs of the dataset variants the notebook chose (sets: name -> dataset)."""
    return runs[runs["variant"].isin([d.name for d in sets.values()])]


TODAY_COLUMNS = {
    "mean_batched_requests": "requests batched",
    "token_states_pct": "token states (%)",
    "normalized_latency_s": "normalized latency (s/token)",
    "mean_ttft_s": "mean TTFT (s)",
}


def today_table(paper_runs: pd.DataFrame, today_runs: pd.DataFrame) -> pd.DataFrame:
    """vLLM on Fig. 13's workloads two ways: the paper's system (the 2023 scheduler and step cost, paper_runs' paged
    runs) and today's (vLLM 0.33, asynchronous, its measured step cost: today_runs), means over seeds, one row per
    dataset."""
    rows = []
    for system, runs in (("the vLLM of 2023", paper_runs[paper_runs["mode"] == "paged"]), ("vLLM 0.33", today_runs)):
        for dataset, mean in mean_over_seeds(runs, ["dataset"]).iterrows():
            rows.append(
                {
                    "dataset": dataset,
                    "system": system,
                    "rate (requests/s)": mean["rate"],
                    **{name: mean[column] for column, name in TODAY_COLUMNS.items()},
                }
            )
    return pd.DataFrame(rows).sort_values(["dataset", "system"], kind="stable").set_index(["dataset", "system"])


def tolerance_table() -> pd.DataFrame:
    """The vLLM paper's figures kvlab holds itself to, with the tolerance each was given before kvlab's values were
    seen (data/paper_figures.csv)."""

    figures = ledger.paper_figures(SECTION)
    shown = []
    for _, r in figures.iterrows():
        kind, value, tolerance = r["tolerance_kind"], r["value"], r["tolerance"]
        rule = {
            "rel": f"within {100 * tolerance:g}% of the paper's value",
            "abs": f"within {tolerance:g} points of the paper's value",
            "range": f"inside the paper's range {value:g} to {tolerance:g}",
            "above": f"above {value:g}",
        }[kind]
        shown.append(
            {
                "figure": ledger.table_name(r["table"]),
                "row": r["row"],
                "measure": label(r["column"]),
                "paper": published(r, int(r["decimals"])),
                "passes when": rule,
            }
        )
    return pd.DataFrame(shown)


def fig13_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Fig. 13: mean requests batched per allocation mode (mean over steps, then over seeds), kvlab beside the paper,
    one column pair per dataset."""
    mean = mean_over_seeds(runs, ["dataset", "mode"])["mean_batched_requests"]
    table = pd.DataFrame(index=pd.Index([MODE_LABELS[m] for m in MODES], name="allocation"))
    for name, figure in (("ShareGPT", "fig13a"), ("Alpaca", "fig13b")):
        if name in mean.index.get_level_values("dataset"):
            table[f"{name}: kvlab"] = [mean.loc[(name, m)] for m in MODES]
            table[f"{name}: paper"] = paper_values(figure, "mean_batched_requests").reindex(table.index).to_numpy()
    return table


def ablation_table(fig13_runs: pd.DataFrame, ablation_runs: pd.DataFrame) -> pd.DataFrame:
    """Fig. 13 with one modelling choice changed at a time (runs.ablation_points): mean requests batched per mode
    (mean over steps, then seeds) and vLLM's normalized latency (s/token), the paper's figure, the section's runs
    ('as run') and each change, one row per (dataset, run)."""
    rows = []
    for name, figure in (("ShareGPT", "fig13a"), ("Alpaca", "fig13b")):
        paper = paper_values(figure, "mean_batched_requests")
        rows.append({"dataset": name, "run": "the paper", **{MODE_LABELS[m]: paper.get(MODE_LABELS[m]) for m in MODES}})
        for run_name, runs in [("as run", fig13_runs)] + [
            (a, ablation_runs[ablation_runs["ablation"] == a]) for a in dict.fromkeys(ablation_runs["ablation"])
        ]:
            mean = mean_over_seeds(runs[runs["dataset"] == name], ["mode"])
            if mean.empty:
                continue
            rows.append(
                {
                    "dataset": name,
                    "run": run_name,
                    **{MODE_LABELS[m]: mean.loc[m, "mean_batched_requests"] for m in MODES},
                    "vLLM: normalized latency (s/token)": mean.loc["paged", "normalized_latency_s"],
                }
            )
    return pd.DataFrame(rows).set_index(["dataset", "run"])


def regime_table(runs: pd.DataFrame, bound_s: float) -> pd.DataFrame:
    """The regime of each Fig. 13 run (mean over seeds): its normalized latency (s/token) and whether the mode
    sustains the rate (at most bound_s, the section's definition) or is saturated (past it), one column pair per
    dataset."""
    mean = mean_over_seeds(runs, ["dataset", "mode"])["normalized_latency_s"]
    table = pd.DataFrame(index=pd.Index([MODE_LABELS[m] for m in MODES], name="allocation"))
    for name in ("ShareGPT", "Alpaca"):
        if name in mean.index.get_level_values("dataset"):
            latency = [mean.loc[(name, m)] for m in MODES]
            table[f"{name}: normalized latency (s/token)"] = latency
            table[f"{name}: regime"] = ["sustained" if sustains(x, bound_s) else "saturated" for x in latency]
    return table


def fig2_table(runs: pd.DataFrame, dataset: str = "ShareGPT") -> pd.DataFrame:
    """Fig. 2: the share of the KV cache holding token states (mean over steps, %), kvlab beside the paper; also the
    share requests hold (blocks or reservations), the share of that holding token states, the paper's split of the
    rest (reservation: slots for the requests' future tokens; internal fragmentation: held beyond their final
    lengths, the buddy's rounding, shown apart too, included; external fragmentation: free slots in chunks too small
    for the waiting queue's head; free unfragmented: the free rest), and the requests waiting (mean over steps: a queue means
    memory is the limit)."""
    mean = mean_over_seeds(runs[runs["dataset"] == dataset], ["mode"])
    table = pd.DataFrame(index=pd.Index([MODE_LABELS[m] for m in MODES], name="allocation"))
    table["token_states_pct"] = [mean.loc[m, "token_states_pct"] for m in MODES]
    table["paper_token_states_pct"] = paper_values("fig2", "token_states_pct").reindex(table.index).to_numpy()
    table["held_pct"] = [mean.loc[m, "held_pct"] for m in MODES]
    table["token_states_of_held_pct"] = 100.0 * table["token_states_pct"] / table["held_pct"]
    for column in ("reservation_pct", "internal_frag_pct", "rounding_pct", "external_frag_pct"):
        table[column] = [mean.loc[m, column] for m in MODES]
    table["free_unfragmented_pct"] = 100.0 - table["held_pct"] - table["external_frag_pct"]
    table["mean_waiting_requests"] = [mean.loc[m, "mean_waiting_requests"] for m in MODES]
    return table


PAPER_FIG2_CSV = Path(__file__).resolve().parents[3] / "data" / "paper_fig2_split.csv"
# The paper's four shares of the KV cache (Fig. 2's legend), in its order.
FIG2_PARTS = {
    "token_states_pct": "token states",
    "reservation_pct": "reservation",
    "internal_frag_pct": "internal fragmentation",
    "external_frag_others_pct": "external fragmentation & others",
}


def fig2_split_table(fig2: pd.DataFrame, path: Path = PAPER_FIG2_CSV) -> pd.DataFrame:
    """Fig. 2's whole split, a kvlab row beside the paper's for each allocation, every share a % of the KV cache (a
    kvlab row sums to 100): kvlab's internal fragmentation without the buddy's rounding, which joins external
    fragmentation and the free rest as the paper's "external fragmentation & others" (the paper's Orca (Oracle), whose
    only internal waste is the rounding, shows none). The paper's bars (data/paper_fig2_split.csv) label only vLLM's
    token states: its other cells are NaN."""
    paper = pd.read_csv(path).set_index("allocation")
    kvlab = pd.DataFrame(
        {
            "token_states_pct": fig2["token_states_pct"],
            "reservation_pct": fig2["reservation_pct"],
            "internal_frag_pct": fig2["internal_frag_pct"] - fig2["rounding_pct"],
            "external_frag_others_pct": fig2["rounding_pct"]
            + fig2["external_frag_pct"]
            + fig2["free_unfragmented_pct"],
        }
    )
    rows = []
    for allocation in fig2.index:
        rows.append(pd.Series(kvlab.loc[allocation], name=f"{allocation}: kvlab"))
        rows.append(pd.Series(paper.reindex(columns=list(FIG2_PARTS)).loc[allocation], name=f"{allocation}: paper"))
    table = pd.DataFrame(rows)[list(FIG2_PARTS)]
    table.index.name = "allocation"
    return table.rename(columns={c: f"{name} (%)" for c, name in FIG2_PARTS.items()})


def variant_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Fig. 13's measure on every dataset variant (sensitivity): mean requests batched and the share of the KV cache
    holding token states (%), per variant and allocation mode."""
    mean = mean_over_seeds(runs, ["variant", "mode"])
    rows = []
    for variant in dict.fromkeys(runs["variant"]):
        row = {"dataset": variant}
        for m in MODES:
            row[f"{MODE_LABELS[m]}: batched"] = mean.loc[(variant, m), "mean_batched_requests"]
        for m in MODES:
            row[f"{MODE_LABELS[m]}: token states (%)"] = mean.loc[(variant, m), "token_states_pct"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("dataset")


def latency_curves(runs: pd.DataFrame) -> pd.DataFrame:
    """Normalized latency (s/token, mean over seeds) per dataset, rate and mode: index (dataset, rate), a column per
    mode label."""
    mean = mean_over_seeds(runs, ["dataset", "rate", "mode"])["normalized_latency_s"]
    wide = mean.unstack("mode")[list(MODES)]
    wide.columns = [MODE_LABELS[m] for m in MODES]
    return wide


PAPER_FIG12A_CSV = Path(__file__).resolve().parents[3] / "data" / "paper_fig12a_vllm.csv"


def paper_vllm_latency(rate_per_s: float, path: Path = PAPER_FIG12A_CSV) -> float | None:
    """The paper's vLLM normalized latency (s per token) on ShareGPT at rate_per_s, read from its Fig. 12a curve
    (data/paper_fig12a_vllm.csv): linear between the points read, None outside them (the curve stops at 2 requests/s)."""
    curve = pd.read_csv(path)
    rates, latency = curve["rate_per_s"].to_numpy(), curve["normalized_latency_s"].to_numpy()
    if not rates.min() <= rate_per_s <= rates.max():
        return None
    last = len(rates) - 1 - np.argmax(rates[::-1] <= rate_per_s)  # the last point at or below the rate
    if rates[last] == rate_per_s or last == len(rates) - 1:
        return float(latency[last])
    w = (rate_per_s - rates[last]) / (rates[last + 1] - rates[last])
    return float((1 - w) * latency[last] + w * latency[last + 1])


def sustains(normalized_latency_s, bound_s: float):
    """Whether a run (or each run of an array) sustains its rate: normalized latency at most bound_s (NaN: no)."""
    return normalized_latency_s <= bound_s


def sustained_rate(rates, latencies, bound_s: float) -> tuple[float, str]:
    """The highest rate of the grid up to which normalized latency stays at or under bound_s (the rate before the
    first one over it), and a note: '' when the bound is crossed inside the grid, 'at least' when no rate of the grid
    is over it, 'none' when even the lowest rate is over it (rate NaN)."""
    rates = np.asarray(rates, dtype=float)
    latencies = np.asarray(latencies, dtype=float)
    if len(rates) == 0 or np.any(np.diff(rates) <= 0):
        validate.fail("rates", rates.tolist(), "must be one or more increasing rates")
    validate.positive_number("bound_s", bound_s)
    over = np.flatnonzero(~sustains(latencies, bound_s))
    if len(over) == 0:
        return float(rates[-1]), "at least"
    if over[0] == 0:
        return float("nan"), "none"
    return float(rates[over[0] - 1]), ""


def sustained_table(curves: pd.DataFrame, bounds_s, bound_s: float | None = None) -> pd.DataFrame:
    """Per dataset and latency bound (s/token; bounds_s and bound_s, sorted): each mode's sustained rate
    (requests/s), vLLM's over Orca (Oracle)'s and Orca (Max)'s (x), and what the grid leaves open (a rate under the
    bound at every point of the grid is a lower limit; none under it is said, not an error)."""
    bounds = sorted({float(b) for b in bounds_s} | ({float(bound_s)} if bound_s is not None else set()))
    rows = []
    for dataset in dict.fromkeys(curves.index.get_level_values("dataset")):
        curve = curves.xs(dataset, level="dataset")
        for bound in bounds:
            row = {"dataset": dataset, "bound_s": float(bound)}
            under, over = [], []
            for m in MODES:
                rate, note = sustained_rate(curve.index, curve[MODE_LABELS[m]], bound)
                row[MODE_LABELS[m]] = rate
                (under if note == "at least" else over if note == "none" else []).append(MODE_LABELS[m])
            row["vllm_over_oracle_x"] = row["vLLM"] / row["Orca (Oracle)"]
            row["vllm_over_max_x"] = row["vLLM"] / row["Orca (Max)"]
            notes = []
            if under:
                notes.append(
                    f"{joined(under)} {'stays' if len(under) == 1 else 'stay'} under the bound at every rate "
                    f"of the grid, up to {curve.index[-1]:g}/s (a lower limit)"
                )
            if over:
                notes.append(
                    f"{joined(over)} {'is' if len(over) == 1 else 'are'} over the bound at every rate of the grid"
                )
            row["note"] = "; ".join(notes)
            rows.append(row)
    return pd.DataFrame(rows).set_index(["dataset", "bound_s"])


def knee_sustained(
    coarse: pd.DataFrame, knee_runs: pd.DataFrame, bound_s: float, dataset: str = "ShareGPT"
) -> pd.DataFrame:
    """sustained_table's row for dataset and bound_s, each mode's rate refined on its knee grid (knee_runs, normalized
    latency the mean over its seeds; a mode without knee runs, or over the bound at its knee's every rate, keeps the
    coarse rate), with the knee grid's step (step_x: each refined rate is known to within that factor) and its seeds."""
    row = coarse.loc[[(dataset, float(bound_s))]].copy()
    mean = mean_over_seeds(knee_runs, ["mode", "rate"])["normalized_latency_s"]
    steps = []
    for m in MODES:
        if m not in mean.index.get_level_values("mode"):
            continue
        curve = mean.xs(m, level="mode").sort_index()
        rate, note = sustained_rate(curve.index, curve.to_numpy(), bound_s)
        row[MODE_LABELS[m]] = rate if note != "none" else row[MODE_LABELS[m]].iloc[0]
        steps.append(float(curve.index[1] / curve.index[0]) if len(curve) > 1 else float("nan"))
    row["vllm_over_oracle_x"] = row["vLLM"] / row["Orca (Oracle)"]
    row["vllm_over_max_x"] = row["vLLM"] / row["Orca (Max)"]
    row["step_x"] = max(steps) if steps else float("nan")
    row["seeds"] = int(knee_runs["seed"].nunique()) if len(knee_runs) else 0
    return row


def block_table(runs: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Block size under the engine (vLLM, same KV memory), one dataset: normalized latency, output throughput,
    requests batched, preemptions, the share of the KV cache holding token states and of what requests hold (%,
    internal fragmentation is the rest), blocks in the pool and block-table entries per request (its bookkeeping)."""
    part = runs[runs["dataset"] == dataset]
    mean = mean_over_seeds(part, ["block_size"])
    table = mean[
        [
            "normalized_latency_s",
            "output_tokens_per_s",
            "mean_batched_requests",
            "num_preemptions",
            "token_states_pct",
            "held_pct",
            "num_gpu_blocks",
            "block_table_entries",
        ]
    ].copy()
    table["token_states_of_held_pct"] = 100.0 * table["token_states_pct"] / table["held_pct"]
    table = table.drop(columns="held_pct")
    table.index.name = "block_size"
    return table


def best_block_size(table: pd.DataFrame, tolerance: float = BEST_BLOCK_TOLERANCE) -> tuple[int, list[int]]:
    """The smallest block size whose normalized latency is within tolerance of the lowest, and every such size."""
    latency = table["normalized_latency_s"]
    best = [int(b) for b in latency.index if latency[b] <= latency.min() * (1 + tolerance)]
    return min(best), best


def memory_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Recompute preemption against memory: per KV-cache size (GiB), each mode's normalized latency and requests
    batched, and vLLM's preemptions (per request) and share of requests preempted (Orca never preempts)."""
    mean = mean_over_seeds(runs, ["kv_cache_gib", "mode"])
    sizes = list(dict.fromkeys(runs["kv_cache_gib"]))
    table = pd.DataFrame(index=pd.Index(sizes, name="kv_cache_gib"))
    for m in MODES:
        table[f"{MODE_LABELS[m]}: latency (s/token)"] = [mean.loc[(g, m), "normalized_latency_s"] for g in sizes]
    for m in MODES:
        table[f"{MODE_LABELS[m]}: batched"] = [mean.loc[(g, m), "mean_batched_requests"] for g in sizes]
    table["vLLM: preemptions per request"] = [
        mean.loc[(g, "paged"), "num_preemptions"] / mean.loc[(g, "paged"), "num_requests"] for g in sizes
    ]
    table["vLLM: requests preempted (%)"] = [mean.loc[(g, "paged"), "preempted_requests_pct"] for g in sizes]
    return table


def trace_table(runs: pd.DataFrame, trace: TraceWorkload) -> pd.DataFrame:
    """Per rate scale and mode: the arrival rate, normalized latency, mean TTFT, requests batched, the share of the KV
    cache holding token states, preemptions and output throughput."""
    duration = float(trace.workload.arrival_s[-1])
    table = runs.assign(
        allocation=[MODE_LABELS[m] for m in runs["mode"]],
        rate_per_s=[trace.workload.num_requests * s / duration for s in runs["rate_scale"]],
    )
    table = table.set_index(["rate_scale", "allocation"])
    return table[
        [
            "rate_per_s",
            "normalized_latency_s",
            "mean_ttft_s",
            "mean_batched_requests",
            "token_states_pct",
            "num_preemptions",
            "output_tokens_per_s",
        ]
    ]


def trace_sustained(runs: pd.DataFrame, bound_s: float) -> pd.DataFrame:
    """On a trace's rate scales: the highest scale each mode sustains under bound_s (see sustained_rate)."""
    rows = {}
    for m in MODES:
        part = runs[runs["mode"] == m].sort_values("rate_scale")
        scale, note = sustained_rate(part["rate_scale"], part["normalized_latency_s"], bound_s)
        rows[MODE_LABELS[m]] = {
            "rate_scale": scale,
            "note": {"": "", "at least": "under the bound at every scale", "none": "over the bound at every scale"}[
                note
            ],
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "allocation"
    return table


def article_table(runs: pd.DataFrame, points: list[dict], ms_per_token: float) -> pd.DataFrame:
    """The article's section 2 workload in the engine, per max_num_seqs and mode: mean latency, normalized latency,
    requests batched, the share of the KV cache holding token states; with section 2's continuous-batching slot model
    on the same workload (its mean latency) beside the engine at the same number of slots."""
    workload = points[0]["workload"]
    table = runs.assign(allocation=[MODE_LABELS[m] for m in runs["mode"]]).set_index(["max_num_seqs", "allocation"])
    table = table[["mean_latency_s", "normalized_latency_s", "mean_batched_requests", "token_states_pct"]].copy()
    slots = [
        slot_simulate(workload, "continuous", max_num_seqs=int(s), cost=TokenServiceTime(ms_per_token)).summary()
        for s in table.index.get_level_values("max_num_seqs")
    ]
    table["slot_model_mean_latency_s"] = [s["mean_latency_s"] for s in slots]
    return table


def prefix_table(runs: pd.DataFrame, trace: TraceWorkload, model: str, gpu: str) -> pd.DataFrame:
    """Per rate scale: the prompt tokens found in the prefix cache (%), mean / p50 / p95 TTFT with caching off and on
    and what caching saves (s, %), preemptions; beside section 4's LRU of 512-token blocks (kvlab.core.prefix_cache)
    holding as many tokens as the engine's pool, and one that never evicts."""
    off, _, num_gpu_blocks, _ = prefix_setting(model, gpu)
    pool_blocks = max(1, (num_gpu_blocks - 1) * off.cache.block_size // trace.workload.prefix_block_tokens)
    lru = replay(trace.workload, pool_blocks)
    unbounded = replay(trace.workload, None)
    rows = {}
    for scale in dict.fromkeys(runs["rate_scale"]):
        part = runs[runs["rate_scale"] == scale].set_index("caching")
        off, on = part.loc[False], part.loc[True]
        rows[scale] = {
            "hit_pct": 100.0 * on["hit_tokens"] / on["prompt_tokens"],
            "mean_ttft_off_s": off["mean_ttft_s"],
            "mean_ttft_on_s": on["mean_ttft_s"],
            "ttft_saved_s": off["mean_ttft_s"] - on["mean_ttft_s"],
            "ttft_saved_pct": 100.0 * (1 - on["mean_ttft_s"] / off["mean_ttft_s"]),
            "p50_ttft_off_s": off["p50_ttft_s"],
            "p50_ttft_on_s": on["p50_ttft_s"],
            "p95_ttft_off_s": off["p95_ttft_s"],
            "p95_ttft_on_s": on["p95_ttft_s"],
            "preemptions_off": int(off["num_preemptions"]),
            "preemptions_on": int(on["num_preemptions"]),
            "lru_same_size_saved_pct": 100.0 * lru.saved_fraction,
            "lru_unbounded_saved_pct": 100.0 * unbounded.saved_fraction,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "rate_scale"
    return table


def scheduling_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per rate scale and scheduling mode: mean and p95 TTFT, mean TPOT, normalized latency, the KV cache held and
    holding token states (% of its slots, mean over steps), preemptions and output throughput."""
    table = runs.assign(
        scheduling=[SCHEDULING_LABELS[bool(m)] for m in runs["async_scheduling"]],
        mean_tpot_ms=1e3 * runs["mean_tpot_s"],
    ).set_index(["rate_scale", "scheduling"])
    return table[list(SCHEDULING_DECIMALS)]


def parity_table(path: str | Path = PARITY_CSV) -> pd.DataFrame:
    """make parity's summary for the scheduler (data/parity/scheduler.csv): per run, requests, steps, preemptions and
    the share of requests and steps identical to vLLM 0.33's own scheduler (%)."""
    table = pd.read_csv(path).set_index("run")
    table = table[["requests", "steps", "preemptions", "identical_requests_pct", "identical_steps_pct", "description"]]
    return table.rename(columns={"requests": "num_requests", "steps": "num_steps", "preemptions": "num_preemptions"})
