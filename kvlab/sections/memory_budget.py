"""Section 6 (notebook 06_memory_budget): serving under one memory budget, the vLLM paper's experiment.

kvlab runs the paper's setting (Kwon et al., SOSP 2023, arXiv 2309.06180: OPT-13B on one A100-40GB, a 12 GiB
KV cache) through its engine (kvlab.core.engine: vLLM 0.33's v1 scheduler over one block pool, with the paper's
Orca reservation baselines), with a roofline step cost of the model on the GPU (kvlab.core.cost: a model, where
the paper measured real kernels). The datasets are kvlab.workloads.paper_datasets, the real traces
kvlab.workloads.traces. Every grid is a list of points, each one engine run, that kvlab.sections.sweep.run
serves on local processes or a Dask cluster (serve() is deterministic, so the numbers do not depend on where it
ran). This module holds the points, the tables, the ledger rows and the figures the notebook's prose states.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvlab.core import capacity, models, validate
from kvlab.core.batching import simulate as slot_simulate
from kvlab.core.config import EngineConfig
from kvlab.core.cost import ConstantStepCost, TokenCost
from kvlab.core.engine import ALLOCATIONS, simulate
from kvlab.core.prefix_cache import replay
from kvlab.core.units import GIB, MIB
from kvlab.core.workload import Workload
from kvlab.sections import ledger, sweep
from kvlab.sections.paper_setting import PAPER_BLOCK_SIZE, PaperSetting, prefix_setting
from kvlab.workloads import paper_datasets, synthetic, traces

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
PARITY_CSV = DATA_DIR / "parity" / "scheduler.csv"
SECTION = 6
MODES = ("max", "pow2", "oracle", "paged")     # the order the paper shows them in
MODE_LABELS = {"max": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)", "paged": "vLLM"}
DATASETS = ("ShareGPT", "Alpaca")
# kvlab's rule for the best block size (chosen before its values were seen): every block size whose normalized
# latency is within 1% of the lowest counts as best, and kvlab's value is the smallest of them.
BEST_BLOCK_TOLERANCE = 0.01
# What is left between kvlab's Orca (Pow2) and (Oracle) and the paper's: both place reservations with the buddy
# allocation algorithm (§6.1; kvlab.core.buddy), but the paper's §6.5 says "due to the buddy allocation algorithm, the
# Orca baselines reserve the space for 1024 tokens for the request outputs".
BUDDY_NOTE = ("kvlab's Orca places reservations in power-of-two chunks of a buddy allocator as the paper's does "
              "(§6.1), but the paper's §6.5 says its Orca reserves 1,024 slots for a request's outputs")
PAPER_TOKEN_SLOTS = 15_700            # Table 1: "15.7K" token slots for OPT-13B's 12 GB of KV cache
# The article's section 2 and its memory (section 1: 60 GiB at 0.5 MiB a token; requests up to 4,096 tokens).
ARTICLE_KV_GIB, ARTICLE_MIB_PER_TOKEN, ARTICLE_MAX_LEN = 60.0, 0.5, 4096


def setting_table(setting: PaperSetting) -> pd.DataFrame:
    """The KV cache the runs use (the paper's Table 1 figure) beside what vLLM 0.33 would size on that GPU itself
    (kvlab.core.capacity.plan_capacity: memory x 0.9 - weights - activation peak - other memory)."""
    model, gpu = setting.model_spec, setting.gpu_spec
    planned = capacity.plan_capacity(model, gpu.memory_gib, setting.max_model_len, setting.config())
    per_token = setting.kv_bytes_per_token
    rows = {
        f"the paper's KV cache ({setting.kv_cache_gib:g} GiB)": {
            "kv_cache_gib": setting.kv_cache_gib, "num_gpu_blocks": setting.num_gpu_blocks(),
            "token_slots_tokens": setting.pool_tokens(), "kv_kib_per_token": per_token / 1024,
            "max_length_requests": setting.pool_tokens() // setting.max_model_len},
    }
    if planned is not None:
        tokens = (planned["num_gpu_blocks"] - 1) * setting.block_size
        rows[f"vLLM 0.33 on the {gpu.name} (kvlab.core.capacity)"] = {
            "kv_cache_gib": planned["available_kv_cache_bytes"] / GIB, "num_gpu_blocks": planned["num_gpu_blocks"],
            "token_slots_tokens": tokens, "kv_kib_per_token": per_token / 1024,
            "max_length_requests": tokens // setting.max_model_len}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "KV cache"
    return table


def cost_table(setting: PaperSetting, batch_sizes=(1, 8, 32, 128), context_tokens: int = 500) -> pd.DataFrame:
    """The roofline step cost: a decode step of batch_size requests of context_tokens each, and prefills (ms)."""
    cost = setting.cost()
    rows = {}
    for batch in batch_sizes:
        rows[f"decode: {batch} requests x {context_tokens} tokens"] = {
            "tokens": batch, "step_ms": 1000 * cost.step_s(batch, batch * (context_tokens + 1), batch,
                                                           batch * (context_tokens + 1))}
    for prompt in (512, 2048):
        rows[f"prefill: one prompt of {prompt} tokens"] = {"tokens": prompt,
                                                             "step_ms": 1000 * cost.step_s(prompt, prompt)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "step"
    return table


# ================================================================ one engine run
def serve(point: dict) -> dict:
    """One engine run of a sweep point: its labels and what the run measured (see metrics). A point holds the
    workload, the engine config, num_gpu_blocks, the step cost, the allocation and labels (plain values)."""
    config = point["config"]
    result = simulate(point["workload"], config, num_gpu_blocks=point["num_gpu_blocks"], cost=point["cost"],
                      allocation=point["allocation"])
    return dict(point["labels"]) | metrics(result, (point["num_gpu_blocks"] - 1) * config.cache.block_size)


def metrics(result, pool_tokens: int) -> dict:
    """What one run gives section 6: normalized latency (mean over requests of (finish - arrival) / output tokens,
    the paper's measure), latency and TTFT, requests batched and waiting (means over steps), the share of
    the pool's token slots holding token states and held by requests (mean over steps, %), the vLLM paper's Fig. 2
    split of the rest (reservation, internal fragmentation with the buddy's rounding in it, external fragmentation;
    kvlab.core.engine.records), preemptions, throughput, prefix-cache hits."""
    steps = result.steps
    n = result.num_requests
    outputs = result.num_output_tokens
    latency = result.finish_s - result.arrival_s
    makespan = float(result.finish_s.max() - result.arrival_s.min())
    num_steps = result.num_steps
    def mean(name: str) -> float:
        return float(steps[name].mean(dtype=np.float64)) if num_steps else 0.0

    kv, held = mean("num_kv_tokens"), mean("num_reserved_tokens")
    return {
        "num_requests": n,
        "normalized_latency_s": float(np.mean(latency / np.maximum(outputs, 1))),
        "mean_latency_s": float(latency.mean()),
        "mean_ttft_s": float(result.ttft_s.mean()),
        "p50_ttft_s": float(np.median(result.ttft_s)),
        "p95_ttft_s": float(np.percentile(result.ttft_s, 95)),
        "mean_tpot_s": result.summary()["mean_tpot_s"],
        "mean_batched_requests": mean("num_running"),
        "mean_waiting_requests": mean("num_waiting"),
        "token_states_pct": 100.0 * kv / pool_tokens,
        "held_pct": 100.0 * held / pool_tokens,
        "reservation_pct": 100.0 * mean("num_reservation_tokens") / pool_tokens,
        "internal_frag_pct": 100.0 * mean("num_internal_frag_tokens") / pool_tokens,
        "rounding_pct": 100.0 * mean("num_rounding_tokens") / pool_tokens,
        "external_frag_pct": 100.0 * mean("num_external_frag_tokens") / pool_tokens,
        "num_preemptions": int(result.num_preemptions.sum()),
        "preempted_requests_pct": 100.0 * float(np.mean(result.num_preemptions > 0)),
        "output_tokens_per_s": float(outputs.sum()) / makespan if makespan > 0 else float("nan"),
        "requests_per_s": n / makespan if makespan > 0 else float("nan"),
        "prompt_tokens": int(result.prompt_tokens.sum()),
        "hit_tokens": int(steps["num_hit_tokens"].sum()) if num_steps else 0,
        "num_steps": num_steps,
        "makespan_s": makespan,
    }


def run_grid(name: str, points: list[dict], scheduler: str | None = None) -> pd.DataFrame:
    """serve() on every point through kvlab.sections.sweep.run (logged as name for the report's footer), one row
    per point in the points' order."""
    results, _ = sweep.run(serve, points, scheduler=scheduler or None, name=name)
    return pd.DataFrame(results)


def _point(workload: Workload, config: EngineConfig, num_gpu_blocks: int, cost, allocation: str, **labels) -> dict:
    validate.one_of("allocation", allocation, ALLOCATIONS)
    return {"workload": workload, "config": config, "num_gpu_blocks": num_gpu_blocks, "cost": cost,
            "allocation": allocation, "labels": labels}


def seeds_of(seed: int, num_seeds: int) -> list[int]:
    """Seeds seed .. seed + num_seeds - 1."""
    validate.non_negative_int("seed", seed)
    return list(range(seed, seed + validate.positive_int("num_seeds", num_seeds)))


# ================================================================ the paper's datasets
def datasets(setting: PaperSetting, trace_dir=None, sharegpt_inputs: str = "turn",
             alpaca_lengths: str = "geometric") -> dict:
    """ShareGPT (from the processed file in the trace folder; requests longer than max_model_len dropped) and
    synthetic Alpaca, as the runs draw them: {"ShareGPT": LengthPool, "Alpaca": SyntheticLengths}."""
    prefill, decode = sharegpt_counts(trace_dir)
    return {"ShareGPT": paper_datasets.sharegpt_pool(prefill, decode, sharegpt_inputs, setting.max_model_len),
            "Alpaca": paper_datasets.alpaca_lengths(alpaca_lengths)}


def sharegpt_counts(trace_dir=None) -> tuple[np.ndarray, np.ndarray]:
    """The processed ShareGPT file's prefill and decode tokens per row, in file order (every row checked)."""
    path = traces.trace_path("sharegpt", trace_dir or None)
    load = traces.load_trace(path, "sharegpt", arrival_rate_per_s=1.0, rng=np.random.default_rng(0))
    return load.workload.prompt_tokens, load.workload.output_tokens


def length_table(setting: PaperSetting, trace_dir=None, num_draws: int = 200_000, seed: int = 0) -> pd.DataFrame:
    """Every dataset variant kvlab offers against the paper's Fig. 11 means: requests in the pool, dropped as longer
    than max_model_len, mean input and output tokens (a draw of num_draws for the synthetic families)."""
    prefill, decode = sharegpt_counts(trace_dir)
    rows = {}
    for inputs in paper_datasets.SHAREGPT_INPUTS:
        pool = paper_datasets.sharegpt_pool(prefill, decode, inputs, setting.max_model_len)
        rows[pool.name] = {"requests": pool.num_requests, "dropped_requests": pool.num_dropped,
                           "input_mean_tokens": pool.mean_tokens()["input"],
                           "output_mean_tokens": pool.mean_tokens()["output"],
                           "paper_input_mean_tokens": paper_datasets.SHAREGPT_MEAN_TOKENS["input"],
                           "paper_output_mean_tokens": paper_datasets.SHAREGPT_MEAN_TOKENS["output"]}
    for family in paper_datasets.ALPACA_FAMILIES:
        lengths = paper_datasets.alpaca_lengths(family)
        prompt, output = lengths.lengths(num_draws, np.random.default_rng(seed))
        rows[lengths.name] = {"requests": np.nan, "dropped_requests": np.nan,
                              "input_mean_tokens": float(prompt.mean()), "output_mean_tokens": float(output.mean()),
                              "paper_input_mean_tokens": paper_datasets.ALPACA_MEAN_TOKENS["input"],
                              "paper_output_mean_tokens": paper_datasets.ALPACA_MEAN_TOKENS["output"]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "dataset"
    return table


def conversation_figures(trace_dir=None) -> dict:
    """What the turn-input heuristic finds in the processed ShareGPT file: rows, conversations, turns per
    conversation, the mean prefill as processed and the mean new input (tokens)."""
    prefill, decode = sharegpt_counts(trace_dir)
    turns = paper_datasets.turn_inputs(prefill, decode)
    per = np.bincount(turns.conversation)
    return {"rows": len(prefill), "conversations": turns.num_conversations, "turns_mean": float(per.mean()),
            "turns_max": int(per.max()), "prefill_mean": float(prefill.mean()),
            "input_mean": float(turns.input_tokens.mean()), "input_p50": float(np.median(turns.input_tokens)),
            "first_turn_input_mean": float(turns.input_tokens[turns.turn == 0].mean())}


# ================================================================ the grids
def paper_points(setting: PaperSetting, sets: dict, rates: dict, seeds: list[int], num_requests: int,
                 modes=MODES, **labels) -> list[dict]:
    """One point per dataset, rate (requests/s), seed and allocation mode: sets name -> dataset, rates name ->
    a rate or a list of rates. A seed's workload is the same for every mode and, its gaps divided by the rate,
    every rate."""
    config, blocks, cost = setting.config(), setting.num_gpu_blocks(), setting.cost()
    points = []
    for name, dataset in sets.items():
        for rate in np.atleast_1d(rates[name]).tolist():
            for seed in seeds:
                workload = paper_datasets.workload(dataset, num_requests, rate, seed)
                for mode in modes:
                    points.append(_point(workload, config, blocks, cost, mode, dataset=name, variant=dataset.name,
                                         mode=mode, rate=float(rate), seed=seed, **labels))
    return points


def variants(setting: PaperSetting, trace_dir=None) -> dict:
    """Every dataset variant kvlab offers, name -> (the paper's dataset it stands for, the dataset): ShareGPT turn
    inputs and as processed, synthetic Alpaca of either family."""
    prefill, decode = sharegpt_counts(trace_dir)
    found = {}
    for inputs in paper_datasets.SHAREGPT_INPUTS:
        pool = paper_datasets.sharegpt_pool(prefill, decode, inputs, setting.max_model_len)
        found[pool.name] = ("ShareGPT", pool)
    for family in paper_datasets.ALPACA_FAMILIES:
        lengths = paper_datasets.alpaca_lengths(family)
        found[lengths.name] = ("Alpaca", lengths)
    return found


def fig13_points(setting: PaperSetting, trace_dir, rates: dict, seeds: list[int], num_requests: int) -> list[dict]:
    """Fig. 13's runs (every mode at the paper's rate of each dataset) on every dataset variant, labelled with the
    paper's dataset and the variant."""
    config, blocks, cost = setting.config(), setting.num_gpu_blocks(), setting.cost()
    points = []
    for name, (dataset_name, dataset) in variants(setting, trace_dir).items():
        rate = rates[dataset_name]
        for seed in seeds:
            workload = paper_datasets.workload(dataset, num_requests, rate, seed)
            for mode in MODES:
                points.append(_point(workload, config, blocks, cost, mode, dataset=dataset_name, variant=name,
                                     mode=mode, rate=float(rate), seed=seed))
    return points


def busy_rate(sustained: pd.DataFrame, bound_s: float, dataset: str = "ShareGPT") -> float:
    """The rate vLLM sustains on dataset under bound_s (requests/s; NaN when none): a rate at which its cache is busy,
    where the block size matters."""
    return float(sustained.loc[(dataset, float(bound_s)), "vLLM"])


def block_grid(sets: dict, rates: dict, busy: float, dataset: str = "ShareGPT") -> tuple[dict, dict]:
    """The block-size grid's datasets and rates: each dataset at Fig. 13's rate, and dataset again at the busy rate
    (as "<dataset>, busy"; left out when busy is NaN)."""
    grid_sets, grid_rates = dict(sets), dict(rates)
    if busy == busy:
        grid_sets[f"{dataset}, busy"] = sets[dataset]
        grid_rates[f"{dataset}, busy"] = busy
    return grid_sets, grid_rates


def block_points(setting: PaperSetting, sets: dict, rates: dict, block_sizes, seeds: list[int],
                 num_requests: int) -> list[dict]:
    """vLLM (paged) at each block size with the same KV memory (blocks of block_size tokens plus the null block)."""
    cost = setting.cost()
    points = []
    for name, dataset in sets.items():
        for seed in seeds:
            workload = paper_datasets.workload(dataset, num_requests, rates[name], seed)
            for bs in block_sizes:
                points.append(_point(workload, setting.config(bs), setting.num_gpu_blocks(bs), cost, "paged",
                                     dataset=name, block_size=int(bs), rate=float(rates[name]), seed=seed))
    return points


def memory_points(setting: PaperSetting, dataset, rate: float, kv_cache_gibs, seeds: list[int],
                  num_requests: int) -> list[dict]:
    """Every allocation mode at each KV-cache size (GiB), one dataset at one rate."""
    config, cost = setting.config(), setting.cost()
    points = []
    for seed in seeds:
        workload = paper_datasets.workload(dataset, num_requests, rate, seed)
        for gib in kv_cache_gibs:
            setting.check_fits("KV_CACHE_GIBS", gib)
            for mode in MODES:
                points.append(_point(workload, config, setting.num_gpu_blocks(kv_cache_gib=gib), cost, mode,
                                     kv_cache_gib=float(gib), mode=mode, seed=seed))
    return points


# ================================================================ the paper's figures
def _mean_over_seeds(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
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


def tolerance_table() -> pd.DataFrame:
    """The vLLM paper's figures kvlab holds itself to, with the tolerance each was given before kvlab's values were
    seen (data/paper_figures.csv)."""
    from kvlab.sections.present import label, published

    figures = ledger.paper_figures(SECTION)
    shown = []
    for _, r in figures.iterrows():
        kind, value, tolerance = r["tolerance_kind"], r["value"], r["tolerance"]
        rule = {"rel": f"within {100 * tolerance:g}% of the paper's value",
                "abs": f"within {tolerance:g} points of the paper's value",
                "range": f"inside the paper's range {value:g} to {tolerance:g}",
                "above": f"above {value:g}"}[kind]
        shown.append({"figure": r["table"], "row": r["row"], "measure": label(r["column"]),
                      "paper": published(r, int(r["decimals"])), "passes when": rule})
    return pd.DataFrame(shown)


def fig13_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Fig. 13: mean requests batched per allocation mode (mean over steps, then over seeds), kvlab beside the paper,
    one column pair per dataset."""
    mean = _mean_over_seeds(runs, ["dataset", "mode"])["mean_batched_requests"]
    table = pd.DataFrame(index=pd.Index([MODE_LABELS[m] for m in MODES], name="allocation"))
    for name, figure in (("ShareGPT", "fig13a"), ("Alpaca", "fig13b")):
        if name in mean.index.get_level_values("dataset"):
            table[f"{name}: kvlab"] = [mean.loc[(name, m)] for m in MODES]
            table[f"{name}: paper"] = paper_values(figure, "mean_batched_requests").reindex(table.index).to_numpy()
    return table


def fig2_table(runs: pd.DataFrame, dataset: str = "ShareGPT") -> pd.DataFrame:
    """Fig. 2: the share of the KV cache holding token states (mean over steps, %), kvlab beside the paper; also the
    share requests hold (blocks or reservations), the share of that holding token states, the paper's split of the
    rest (reservation: slots for the requests' future tokens; internal fragmentation: held beyond their final
    lengths, the buddy's rounding, shown apart too, included; external fragmentation: free slots in chunks too small
    for the waiting queue's head; others: the free rest), and the requests waiting (mean over steps: a queue means
    memory is the limit)."""
    mean = _mean_over_seeds(runs[runs["dataset"] == dataset], ["mode"])
    table = pd.DataFrame(index=pd.Index([MODE_LABELS[m] for m in MODES], name="allocation"))
    table["token_states_pct"] = [mean.loc[m, "token_states_pct"] for m in MODES]
    table["paper_token_states_pct"] = paper_values("fig2", "token_states_pct").reindex(table.index).to_numpy()
    table["held_pct"] = [mean.loc[m, "held_pct"] for m in MODES]
    table["token_states_of_held_pct"] = 100.0 * table["token_states_pct"] / table["held_pct"]
    for column in ("reservation_pct", "internal_frag_pct", "rounding_pct", "external_frag_pct"):
        table[column] = [mean.loc[m, column] for m in MODES]
    table["others_pct"] = 100.0 - table["held_pct"] - table["external_frag_pct"]
    table["mean_waiting_requests"] = [mean.loc[m, "mean_waiting_requests"] for m in MODES]
    return table


def variant_figures(table: pd.DataFrame, lengths: pd.DataFrame) -> dict:
    """The sensitivity to the dataset variant in numbers: per variant (keys sharegpt_turn, sharegpt_processed,
    alpaca_geometric, alpaca_gamma) vLLM's and Orca (Max)'s batch, vLLM's token-state share (%) and the mean input
    (tokens)."""
    out = {}
    for variant in table.index:
        key = variant.lower().replace(" (", "_").replace(")", "").replace("-cv0.5", "")
        out[f"{key}_vllm"] = table.loc[variant, "vLLM: batched"]
        out[f"{key}_oracle"] = table.loc[variant, "Orca (Oracle): batched"]
        out[f"{key}_max"] = table.loc[variant, "Orca (Max): batched"]
        out[f"{key}_vllm_pct"] = table.loc[variant, "vLLM: token states (%)"]
        out[f"{key}_input"] = lengths.loc[variant, "input_mean_tokens"] if variant in lengths.index else float("nan")
    return out


def variant_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Fig. 13's measure on every dataset variant (sensitivity): mean requests batched and the share of the KV cache
    holding token states (%), per variant and allocation mode."""
    mean = _mean_over_seeds(runs, ["variant", "mode"])
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
    mean = _mean_over_seeds(runs, ["dataset", "rate", "mode"])["normalized_latency_s"]
    wide = mean.unstack("mode")[list(MODES)]
    wide.columns = [MODE_LABELS[m] for m in MODES]
    return wide


def sustained_rate(rates, latencies, bound_s: float) -> tuple[float, str]:
    """The highest rate of the grid up to which normalized latency stays at or under bound_s (the rate before the
    first one over it), and a note: '' when the bound is crossed inside the grid, 'at least' when no rate of the grid
    is over it, 'none' when even the lowest rate is over it (rate NaN)."""
    rates = np.asarray(rates, dtype=float)
    latencies = np.asarray(latencies, dtype=float)
    if len(rates) == 0 or np.any(np.diff(rates) <= 0):
        validate.fail("rates", rates.tolist(), "must be one or more increasing rates")
    validate.positive_number("bound_s", bound_s)
    over = np.flatnonzero(~(latencies <= bound_s))
    if len(over) == 0:
        return float(rates[-1]), "at least"
    if over[0] == 0:
        return float("nan"), "none"
    return float(rates[over[0] - 1]), ""


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


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
                notes.append(f"{_and(under)} {'stays' if len(under) == 1 else 'stay'} under the bound at every rate "
                             f"of the grid, up to {curve.index[-1]:g}/s (a lower limit)")
            if over:
                notes.append(f"{_and(over)} {'is' if len(over) == 1 else 'are'} over the bound at every rate of the "
                             "grid")
            row["note"] = "; ".join(notes)
            rows.append(row)
    return pd.DataFrame(rows).set_index(["dataset", "bound_s"])


# How the notebook rounds length_table's and memory_table's columns.
LENGTH_DECIMALS = {"requests": 0, "dropped_requests": 0, "input_mean_tokens": 2, "output_mean_tokens": 2,
                   "paper_input_mean_tokens": 2, "paper_output_mean_tokens": 2}
MEMORY_DECIMALS = {"kv_cache_gib": 1, **{f"{m}: latency (s/token)": 3 for m in MODE_LABELS.values()},
                   **{f"{m}: batched": 2 for m in MODE_LABELS.values()},
                   "vLLM: preemptions per request": 3, "vLLM: requests preempted (%)": 1}
# How the notebook rounds block_table's columns.
BLOCK_DECIMALS = {"normalized_latency_s": 4, "num_preemptions": 0, "token_states_pct": 1, "token_states_of_held_pct": 1,
                  "block_table_entries": 1, "num_gpu_blocks": 0}


def block_table(runs: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Block size under the engine (vLLM, same KV memory), one dataset: normalized latency, output throughput,
    requests batched, preemptions, the share of the KV cache holding token states and of what requests hold (%,
    internal fragmentation is the rest), blocks in the pool and block-table entries per request (its bookkeeping)."""
    part = runs[runs["dataset"] == dataset]
    mean = _mean_over_seeds(part, ["block_size"])
    table = mean[["normalized_latency_s", "output_tokens_per_s", "mean_batched_requests", "num_preemptions",
                  "token_states_pct", "held_pct", "num_gpu_blocks", "block_table_entries"]].copy()
    table["token_states_of_held_pct"] = 100.0 * table["token_states_pct"] / table["held_pct"]
    table = table.drop(columns="held_pct")
    table.index.name = "block_size"
    return table


def block_runs(points: list[dict], scheduler: str | None = None) -> pd.DataFrame:
    """The block-size grid's runs, with each point's pool (blocks) and mean block-table entries per request
    (ceil(final length / block size) blocks at its longest)."""
    runs = run_grid("section 6: block sizes", points, scheduler)
    runs["num_gpu_blocks"] = [p["num_gpu_blocks"] for p in points]
    runs["block_table_entries"] = [
        float(np.mean(-(-np.minimum(p["workload"].prompt_tokens + p["workload"].output_tokens,
                                    p["config"].scheduler.max_model_len) // p["config"].cache.block_size)))
        for p in points]
    return runs


def best_block_size(table: pd.DataFrame, tolerance: float = BEST_BLOCK_TOLERANCE) -> tuple[int, list[int]]:
    """The smallest block size whose normalized latency is within tolerance of the lowest, and every such size."""
    latency = table["normalized_latency_s"]
    best = [int(b) for b in latency.index if latency[b] <= latency.min() * (1 + tolerance)]
    return min(best), best


def memory_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Recompute preemption against memory: per KV-cache size (GiB), each mode's normalized latency and requests
    batched, and vLLM's preemptions (per request) and share of requests preempted (Orca never preempts)."""
    mean = _mean_over_seeds(runs, ["kv_cache_gib", "mode"])
    sizes = list(dict.fromkeys(runs["kv_cache_gib"]))
    table = pd.DataFrame(index=pd.Index(sizes, name="kv_cache_gib"))
    for m in MODES:
        table[f"{MODE_LABELS[m]}: latency (s/token)"] = [mean.loc[(g, m), "normalized_latency_s"] for g in sizes]
    for m in MODES:
        table[f"{MODE_LABELS[m]}: batched"] = [mean.loc[(g, m), "mean_batched_requests"] for g in sizes]
    table["vLLM: preemptions per request"] = [mean.loc[(g, "paged"), "num_preemptions"] /
                                              mean.loc[(g, "paged"), "num_requests"] for g in sizes]
    table["vLLM: requests preempted (%)"] = [mean.loc[(g, "paged"), "preempted_requests_pct"] for g in sizes]
    return table


# ================================================================ real traces, the article's workload
@dataclass(frozen=True, eq=False)
class TraceWorkload:
    """A real trace kept at max_model_len (longer requests dropped), arrivals from its first request."""

    name: str
    workload: Workload
    num_rows: int
    num_dropped: int

    def at(self, rate_scale: float) -> Workload:
        """The trace with its arrival rate scaled: timestamps divided by rate_scale (1: its own timestamps)."""
        scale = validate.positive_number("rate_scale", rate_scale)
        w = self.workload
        return Workload(w.arrival_s / scale, w.prompt_tokens, w.output_tokens, w.prefix_hashes, w.prefix_block_tokens,
                        name=w.name)


def trace_workload(name: str, max_model_len: int, trace_dir=None, max_requests: int | None = None) -> TraceWorkload:
    """The trace called name (azure, mooncake) from the trace folder, its first max_requests requests, without those
    longer than max_model_len tokens (prompt + output), arrivals counted from the first request kept."""
    load = traces.load_trace(traces.trace_path(name, trace_dir or None), name, max_requests=max_requests, name=name)
    w = load.workload
    keep = w.prompt_tokens + w.output_tokens <= max_model_len
    if not keep.any():
        validate.fail("max_model_len", max_model_len, f"is shorter than every request of the {name} trace")
    index = np.flatnonzero(keep)
    hashes = tuple(w.prefix_hashes[i] for i in index) if w.prefix_hashes is not None else None
    arrival = w.arrival_s[keep]
    kept = Workload(arrival - arrival[0], w.prompt_tokens[keep], w.output_tokens[keep], hashes,
                    w.prefix_block_tokens if hashes is not None else None, name=name)
    return TraceWorkload(name, kept, w.num_requests, int((~keep).sum()))


def trace_points(setting: PaperSetting, trace: TraceWorkload, rate_scales) -> list[dict]:
    """Every allocation mode on the trace at each rate scale (1 = its own timestamps)."""
    config, blocks, cost = setting.config(), setting.num_gpu_blocks(), setting.cost()
    return [_point(trace.at(scale), config, blocks, cost, mode, rate_scale=float(scale), mode=mode)
            for scale in rate_scales for mode in MODES]


def trace_table(runs: pd.DataFrame, trace: TraceWorkload) -> pd.DataFrame:
    """Per rate scale and mode: the arrival rate, normalized latency, mean TTFT, requests batched, the share of the KV
    cache holding token states, preemptions and output throughput."""
    duration = float(trace.workload.arrival_s[-1])
    table = runs.assign(allocation=[MODE_LABELS[m] for m in runs["mode"]],
                        rate_per_s=[trace.workload.num_requests * s / duration for s in runs["rate_scale"]])
    table = table.set_index(["rate_scale", "allocation"])
    return table[["rate_per_s", "normalized_latency_s", "mean_ttft_s", "mean_batched_requests", "token_states_pct",
                  "num_preemptions", "output_tokens_per_s"]]


def trace_sustained(runs: pd.DataFrame, bound_s: float) -> pd.DataFrame:
    """On a trace's rate scales: the highest scale each mode sustains under bound_s (see sustained_rate)."""
    rows = {}
    for m in MODES:
        part = runs[runs["mode"] == m].sort_values("rate_scale")
        scale, note = sustained_rate(part["rate_scale"], part["normalized_latency_s"], bound_s)
        rows[MODE_LABELS[m]] = {"rate_scale": scale, "note": {"": "", "at least": "under the bound at every scale",
                                                              "none": "over the bound at every scale"}[note]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "allocation"
    return table


def article_points(num_requests: int, arrival_rate: float, ms_per_token: float, max_num_seqs_list,
                   seed: int) -> list[dict]:
    """The article's section 2 workload (Poisson arrivals, its output mix) in the engine: a constant step of
    ms_per_token, the article's memory (60 GiB at 0.5 MiB a token, blocks of 16, requests up to 4,096 tokens), one
    prompt token each (vLLM needs one; the article charges prompts nothing), every mode at each max_num_seqs."""
    workload = synthetic.article_s2_workload(num_requests, arrival_rate, "article", np.random.default_rng(seed))
    workload = Workload(workload.arrival_s, np.ones(num_requests, dtype=np.int64), workload.output_tokens,
                        name=workload.name)
    bs = PAPER_BLOCK_SIZE
    blocks = int(ARTICLE_KV_GIB * GIB // (ARTICLE_MIB_PER_TOKEN * MIB * bs)) + 1
    cost = ConstantStepCost(ms_per_token)
    points = []
    for seqs in max_num_seqs_list:
        config = EngineConfig().replace(async_scheduling=False, block_size=bs, max_model_len=ARTICLE_MAX_LEN,
                                        max_num_seqs=int(seqs))
        points += [_point(workload, config, blocks, cost, mode, max_num_seqs=int(seqs), mode=mode) for mode in MODES]
    return points


def article_table(runs: pd.DataFrame, points: list[dict], ms_per_token: float) -> pd.DataFrame:
    """The article's section 2 workload in the engine, per max_num_seqs and mode: mean latency, normalized latency,
    requests batched, the share of the KV cache holding token states; with section 2's continuous-batching slot model
    on the same workload (its mean latency) beside the engine at the same number of slots."""
    workload = points[0]["workload"]
    table = runs.assign(allocation=[MODE_LABELS[m] for m in runs["mode"]]).set_index(["max_num_seqs", "allocation"])
    table = table[["mean_latency_s", "normalized_latency_s", "mean_batched_requests", "token_states_pct"]].copy()
    slots = [slot_simulate(workload, "continuous", max_num_seqs=int(s), cost=TokenCost(ms_per_token)).summary()
             for s in table.index.get_level_values("max_num_seqs")]
    table["slot_model_mean_latency_s"] = [s["mean_latency_s"] for s in slots]
    return table


# ================================================================ prefix caching on Mooncake
def mooncake_window(model: str, trace_dir=None, num_requests: int | None = None) -> TraceWorkload:
    """The first num_requests requests of the Mooncake trace, kept at the model's own maximum length."""
    return trace_workload("mooncake", models.get_model(model).max_position_embeddings, trace_dir, num_requests)


def prefix_points(trace: TraceWorkload, model: str, gpu: str, rate_scales) -> list[dict]:
    """The Mooncake window with prefix caching off and on at each rate scale. Mooncake's hash_ids name 512-token
    blocks; the engine gives two prompts equal tokens wherever they have equal hash ids at the same positions
    (Request.prompt_block_ids), so equal ids are equal tokens and a block of 16 inside them can be shared."""
    off, on, blocks, cost = prefix_setting(model, gpu)
    return [_point(trace.at(scale), config, blocks, cost, "paged", rate_scale=float(scale), caching=caching)
            for scale in rate_scales for caching, config in ((False, off), (True, on))]


# How the notebook labels prefix_table's columns.
PREFIX_LABELS = {"rate_scale": "rate scale (x)", "hit_pct": "prompt tokens hit (%)",
                 "mean_ttft_off_s": "mean TTFT, off (s)", "mean_ttft_on_s": "mean TTFT, on (s)",
                 "ttft_saved_s": "mean TTFT saved (s)", "ttft_saved_pct": "mean TTFT saved (%)",
                 "p50_ttft_off_s": "p50 TTFT, off (s)", "p50_ttft_on_s": "p50 TTFT, on (s)",
                 "p95_ttft_off_s": "p95 TTFT, off (s)", "p95_ttft_on_s": "p95 TTFT, on (s)",
                 "preemptions_off": "preemptions, off", "preemptions_on": "preemptions, on",
                 "lru_same_size_saved_pct": "section 4 LRU, pool-sized: prefill saved (%)",
                 "lru_unbounded_saved_pct": "section 4 LRU, never evicts: prefill saved (%)"}


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
        rows[scale] = {"hit_pct": 100.0 * on["hit_tokens"] / on["prompt_tokens"],
                       "mean_ttft_off_s": off["mean_ttft_s"], "mean_ttft_on_s": on["mean_ttft_s"],
                       "ttft_saved_s": off["mean_ttft_s"] - on["mean_ttft_s"],
                       "ttft_saved_pct": 100.0 * (1 - on["mean_ttft_s"] / off["mean_ttft_s"]),
                       "p50_ttft_off_s": off["p50_ttft_s"], "p50_ttft_on_s": on["p50_ttft_s"],
                       "p95_ttft_off_s": off["p95_ttft_s"], "p95_ttft_on_s": on["p95_ttft_s"],
                       "preemptions_off": int(off["num_preemptions"]), "preemptions_on": int(on["num_preemptions"]),
                       "lru_same_size_saved_pct": 100.0 * lru.saved_fraction,
                       "lru_unbounded_saved_pct": 100.0 * unbounded.saved_fraction}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "rate_scale"
    return table


# ================================================================ synchronous and asynchronous scheduling
SCHEDULING_LABELS = {False: "synchronous (the paper's vLLM)", True: "asynchronous (vLLM 0.33's default)"}
SCHEDULING_DECIMALS = {"mean_ttft_s": 3, "p95_ttft_s": 3, "mean_tpot_ms": 2, "normalized_latency_s": 4, "held_pct": 2,
                       "token_states_pct": 2, "num_preemptions": 0, "output_tokens_per_s": 1}


def scheduling_points(setting: PaperSetting, trace: TraceWorkload, rate_scales) -> list[dict]:
    """vLLM (paged) on the trace at each rate scale, scheduled synchronously and asynchronously (a batch queue of two)."""
    blocks, cost = setting.num_gpu_blocks(), setting.cost()
    return [_point(trace.at(scale), setting.config().replace(async_scheduling=mode), blocks, cost, "paged",
                   rate_scale=float(scale), async_scheduling=mode)
            for scale in rate_scales for mode in (False, True)]


def scheduling_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per rate scale and scheduling mode: mean and p95 TTFT, mean TPOT, normalized latency, the KV cache held and
    holding token states (% of its slots, mean over steps), preemptions and output throughput."""
    table = runs.assign(scheduling=[SCHEDULING_LABELS[bool(m)] for m in runs["async_scheduling"]],
                        mean_tpot_ms=1e3 * runs["mean_tpot_s"]).set_index(["rate_scale", "scheduling"])
    return table[list(SCHEDULING_DECIMALS)]


def scheduling_figures(table: pd.DataFrame) -> dict:
    """What asynchronous scheduling changes at the lightest rate scale of the table, async against sync: the first
    token's delay (ms, and in steps of the synchronous mean TPOT), TPOT, the KV cache held, throughput, preemptions."""
    scale = min(table.index.get_level_values("rate_scale"))
    sync, async_ = (table.loc[(scale, SCHEDULING_LABELS[mode])] for mode in (False, True))
    delay_ms = 1e3 * (async_["mean_ttft_s"] - sync["mean_ttft_s"])
    return {"scale": scale, "ttft_delay_ms": delay_ms, "ttft_delay_steps": delay_ms / sync["mean_tpot_ms"],
            "sync_ttft_ms": 1e3 * sync["mean_ttft_s"], "async_ttft_ms": 1e3 * async_["mean_ttft_s"],
            "sync_tpot": sync["mean_tpot_ms"], "async_tpot": async_["mean_tpot_ms"],
            "sync_held": sync["held_pct"], "async_held": async_["held_pct"],
            "sync_throughput": sync["output_tokens_per_s"], "async_throughput": async_["output_tokens_per_s"],
            "sync_preemptions": int(sync["num_preemptions"]), "async_preemptions": int(async_["num_preemptions"])}


# ================================================================ make parity
def parity_table(path: str | Path = PARITY_CSV) -> pd.DataFrame:
    """make parity's summary for the scheduler (data/parity/scheduler.csv): per run, requests, steps, preemptions and
    the share of requests and steps identical to vLLM 0.33's own scheduler (%)."""
    table = pd.read_csv(path).set_index("run")
    table = table[["requests", "steps", "preemptions", "identical_requests_pct", "identical_steps_pct", "description"]]
    return table.rename(columns={"requests": "num_requests", "steps": "num_steps", "preemptions": "num_preemptions"})


# ================================================================ the ledger
def ledger_rows(fig13: pd.DataFrame, fig2: pd.DataFrame, sustained: pd.DataFrame, bound_s: float,
                sharegpt_blocks: pd.DataFrame, alpaca_blocks: pd.DataFrame, lengths: pd.DataFrame, fig13_runs: pd.DataFrame,
                setting: PaperSetting, rates: dict, sharegpt_name: str) -> pd.DataFrame:
    """Section 6's rows of the ledger (the vLLM paper's figures): kvlab's value and why it lies where it does."""
    rows = []

    def add(table, row, column, value, why):
        rows.append({"section": SECTION, "table": table, "row": row, "column": column, "reproduced": float(value),
                     "why": why})

    means = _mean_over_seeds(fig13_runs, ["dataset", "mode"])
    slots = setting.pool_tokens()
    for name, table in (("ShareGPT", "fig13a"), ("Alpaca", "fig13b")):
        if f"{name}: kvlab" not in fig13:
            continue
        for m in MODES:
            label = MODE_LABELS[m]
            mine, theirs = fig13.loc[label, f"{name}: kvlab"], fig13.loc[label, f"{name}: paper"]
            run = means.loc[(name, m)]
            if m == "max":
                why = (f"{slots:,} token slots hold {slots // setting.max_model_len} reservations of max_model_len "
                       f"{setting.max_model_len:,}: kvlab's {mine:.2f} is that count, less the steps with a free one")
            else:
                why = (f"kvlab {mine:.2f} against the paper's {theirs:.2f} ({mine / theirs:.2f}x) at {rates[name]:g} "
                       f"requests/s: its requests hold {run['held_pct']:.0f}% of the KV cache, "
                       f"{slots * run['held_pct'] / 100 / mine:,.0f} token slots each, and "
                       f"{run['mean_waiting_requests']:.1f} wait on average; ")
                if run["mean_waiting_requests"] >= 1:
                    why += (f"memory is the limit, and the paper's {theirs:.2f} in a full cache would be "
                            f"{slots / theirs:,.0f} slots each: {BUDDY_NOTE}")
                else:
                    why += ("memory is not the limit: kvlab's roofline step, a model, serves faster than the paper's "
                            "measured kernels, so requests leave before the cache fills")
            add(table, label, "mean_batched_requests", mine, why)
    for m in MODES:
        label = MODE_LABELS[m]
        mine, theirs = fig2.loc[label, "token_states_pct"], fig2.loc[label, "paper_token_states_pct"]
        why = (f"token states fill {mine:.1f}% of the KV cache and {fig2.loc[label, 'token_states_of_held_pct']:.1f}% "
               f"of what requests hold ({fig2.loc[label, 'held_pct']:.1f}% of the cache)")
        if m == "paged" and fig2.loc[label, "held_pct"] < 90:
            why += "; the paper's vLLM ran with its cache full, kvlab's is not full at this rate"
        if m in ("pow2", "oracle"):
            why += f"; {BUDDY_NOTE}"
        add("fig2", label, "token_states_pct", mine, why)
    part = sustained.xs("ShareGPT", level="dataset").loc[bound_s]
    for other, column, label in (("Orca (Oracle)", "vllm_over_oracle_x", "vLLM over Orca (Oracle)"),
                                 ("Orca (Max)", "vllm_over_max_x", "vLLM over Orca (Max)")):
        why = (f"sustained under {bound_s:g} s/token on the grid: vLLM {part['vLLM']:g}, {other} {part[other]:g} "
               "requests/s (kvlab's step cost is a roofline model; the paper measured kernels)")
        if part["note"]:
            why += f"; {part['note']}"
        add("s6.2", label, "sustained_rate_ratio_x", part[column], why)
    if len(sharegpt_blocks):
        best, ties = best_block_size(sharegpt_blocks)
        why = (f"normalized latency within {100 * BEST_BLOCK_TOLERANCE:g}% of the lowest at block sizes "
               f"{', '.join(map(str, ties))}; kvlab's value is the smallest")
        if best < 16:
            why += ("; kvlab's step cost has no per-block term, so small blocks never run slower (the paper's penalty "
                    "for small blocks is GPU kernel parallelism, which kvlab does not model)")
        add("fig18b", "ShareGPT", "best_block_size_tokens", best, why)
    if {16, 256} <= set(alpaca_blocks.index):       # else the row stays missing (BLOCK_SIZES lacks one of them)
        ratio = alpaca_blocks.loc[256, "normalized_latency_s"] / alpaca_blocks.loc[16, "normalized_latency_s"]
        why = (f"at {rates['Alpaca']:g} requests/s: {alpaca_blocks.loc[256, 'normalized_latency_s']:.3f} s/token at "
               f"block size 256 ({int(alpaca_blocks.loc[256, 'num_gpu_blocks']) - 1} usable blocks), "
               f"{alpaca_blocks.loc[16, 'normalized_latency_s']:.3f} at 16 "
               f"({int(alpaca_blocks.loc[16, 'num_gpu_blocks']) - 1}); {alpaca_blocks.loc[256, 'num_preemptions']:.0f} "
               "preemptions at block size 256: the pool "
               + ("ran out" if alpaca_blocks.loc[256, "num_preemptions"] > 0 else "never ran out at this rate"))
        add("fig18b", "Alpaca", "latency_256_over_16_x", ratio, why)
    fed = lengths.loc[sharegpt_name]
    for column, key in (("input_mean_tokens", "input"), ("output_mean_tokens", "output")):
        why = (f"{sharegpt_name}: {int(fed['requests']):,} requests of Microsoft's processed file (Llama-2 tokenizer, "
               f"outputs capped at 1,024) after dropping {int(fed['dropped_requests']):,} longer than "
               f"{setting.max_model_len:,} tokens; the paper tokenized its own ShareGPT sample with OPT's tokenizer")
        add("fig11", "ShareGPT", column, fed[column], why)
    return pd.DataFrame(rows)


# ================================================================ figures the prose states
def grid_figures(rates: dict, num_requests: int, num_seeds: int) -> dict:
    """The rate grids in words: per dataset (keys by its name in lower case) the lowest and highest rate and the
    largest step between neighbours (x); the requests per run and the seeds."""
    out = {"num_requests": num_requests, "num_seeds": num_seeds}
    for name, grid in rates.items():
        grid = np.asarray(grid, dtype=float)
        key = name.lower()
        out |= {f"{key}_low": grid.min(), f"{key}_high": grid.max(), f"{key}_points": len(grid),
                f"{key}_step": float(np.max(grid[1:] / grid[:-1])) if len(grid) > 1 else float("nan")}
    return out


def setting_figures(setting: PaperSetting) -> dict:
    """The setting in numbers: KV per token (KiB), blocks, token slots against the paper's 15.7K, max-length
    requests that fit, vLLM 0.33's own KV cache on the GPU (GiB, token slots), the model's weights and what vLLM keeps
    for activations and other memory (GiB)."""
    table = setting_table(setting)
    paper = table.iloc[0]
    out = {"kv_kib": setting.kv_bytes_per_token / 1024, "blocks": setting.num_gpu_blocks(),
           "slots": setting.pool_tokens(), "paper_slots": PAPER_TOKEN_SLOTS, "kv_gib": setting.kv_cache_gib,
           "max_requests": int(paper["max_length_requests"]), "model": setting.model, "gpu": setting.gpu,
           "block_size": setting.block_size, "max_model_len": setting.max_model_len,
           "weights_gib": setting.model_spec.num_params_b * 1e9 * 2 / GIB, "gpu_gib": setting.gpu_spec.memory_gib,
           "other_gib": capacity.ACTIVATION_PEAK_GIB + capacity.NON_TORCH_GIB,
           "layers": setting.model_spec.num_layers, "kv_heads": setting.model_spec.num_kv_heads,
           "head_dim": setting.model_spec.head_dim, "bandwidth": setting.gpu_spec.memory_bandwidth_gb_s,
           "tflops": setting.gpu_spec.bf16_dense_tflops}
    if len(table) > 1:
        vllm = table.iloc[1]
        out |= {"vllm_gib": float(vllm["kv_cache_gib"]), "vllm_slots": int(vllm["token_slots_tokens"]),
                "vllm_requests": int(vllm["max_length_requests"])}
    else:
        out |= {"vllm_gib": float("nan"), "vllm_slots": 0, "vllm_requests": 0}
    return out


def _more(a: float, b: float) -> str:
    return "more" if a > b else "fewer" if a < b else "as many"


def fig13_figures(fig13: pd.DataFrame, fig2: pd.DataFrame) -> dict:
    """Fig. 13 and Fig. 2 in numbers: per dataset vLLM's requests batched and its lead over Orca (Oracle) and Orca
    (Max), kvlab and the paper; per mode on the Fig. 2 dataset the share of the KV cache holding token states, held,
    token states of held (%) and requests waiting; whether kvlab's Orca (Pow2) and (Oracle) batch more or fewer
    requests than the paper's."""
    out = {}
    for name in DATASETS:
        if f"{name}: kvlab" not in fig13:
            continue
        mine, theirs = fig13[f"{name}: kvlab"], fig13[f"{name}: paper"]
        key = name.lower()
        out |= {f"{key}_vllm": mine["vLLM"], f"{key}_paper_vllm": theirs["vLLM"],
                f"{key}_max": mine["Orca (Max)"], f"{key}_oracle": mine["Orca (Oracle)"],
                f"{key}_pow2": mine["Orca (Pow2)"], f"{key}_paper_oracle": theirs["Orca (Oracle)"],
                f"{key}_paper_pow2": theirs["Orca (Pow2)"],
                f"{key}_over_oracle": mine["vLLM"] / mine["Orca (Oracle)"],
                f"{key}_paper_over_oracle": theirs["vLLM"] / theirs["Orca (Oracle)"],
                f"{key}_over_max": mine["vLLM"] / mine["Orca (Max)"],
                f"{key}_paper_over_max": theirs["vLLM"] / theirs["Orca (Max)"],
                f"{key}_pow2_words": _more(mine["Orca (Pow2)"], theirs["Orca (Pow2)"]),
                f"{key}_oracle_words": _more(mine["Orca (Oracle)"], theirs["Orca (Oracle)"])}
    if "sharegpt_pow2_words" in out:
        same = out["sharegpt_pow2_words"] == out["sharegpt_oracle_words"]
        out["sharegpt_orca_words"] = (f"both batch {out['sharegpt_pow2_words']} requests than the paper's" if same else
                                      f"batch {out['sharegpt_pow2_words']} and {out['sharegpt_oracle_words']} "
                                      "requests than the paper's")
    for m, key in (("vLLM", "vllm"), ("Orca (Max)", "max"), ("Orca (Pow2)", "pow2"), ("Orca (Oracle)", "oracle")):
        out |= {f"{key}_token_pct": fig2.loc[m, "token_states_pct"], f"{key}_held_pct": fig2.loc[m, "held_pct"],
                f"{key}_of_held_pct": fig2.loc[m, "token_states_of_held_pct"],
                f"{key}_waiting": fig2.loc[m, "mean_waiting_requests"],
                f"{key}_paper_pct": fig2.loc[m, "paper_token_states_pct"]}
    out["vllm_limit"] = ("memory is the limit" if out["vllm_waiting"] >= 1 else
                         "memory is not what limits it at this rate")
    return out


def sustained_figures(sustained: pd.DataFrame, bound_s: float, dataset: str = "ShareGPT") -> dict:
    """The default bound's sustained rates (requests/s) and ratios on one dataset, the range of the ratios over the
    bounds shown, and the other dataset's note at the default bound."""
    part = sustained.xs(dataset, level="dataset")
    row = part.loc[bound_s]
    others = [d for d in dict.fromkeys(sustained.index.get_level_values("dataset")) if d != dataset]
    other = sustained.loc[(others[0], bound_s)] if others else None
    ranges = ledger.paper_figures(SECTION).query("table == 's6.2'").set_index("row")

    def against(value: float, row: str) -> str:
        low, high = ranges.loc[row, "value"], ranges.loc[row, "tolerance"]
        return "within" if low <= value <= high else "below" if value < low else "above" if value > high else "not in"

    return {"max_words": against(row["vllm_over_max_x"], "vLLM over Orca (Max)"),
            "oracle_words": against(row["vllm_over_oracle_x"], "vLLM over Orca (Oracle)"),
            "other": others[0] if others else "", "other_note": (other["note"] or "every mode crosses the bound inside "
                                                                 "the grid") if other is not None else "",
            "other_vllm": other["vLLM"] if other is not None else float("nan"),
            "other_max": other["Orca (Max)"] if other is not None else float("nan"),
            "bound": bound_s, "vllm": row["vLLM"], "oracle": row["Orca (Oracle)"], "pow2": row["Orca (Pow2)"],
            "max": row["Orca (Max)"], "over_oracle": row["vllm_over_oracle_x"], "over_max": row["vllm_over_max_x"],
            "over_oracle_low": part["vllm_over_oracle_x"].min(), "over_oracle_high": part["vllm_over_oracle_x"].max(),
            "over_max_low": part["vllm_over_max_x"].min(), "over_max_high": part["vllm_over_max_x"].max(),
            "note": row["note"] or "every mode crosses the bound inside the grid"}


def saturation_figures(runs: pd.DataFrame, fig13: pd.DataFrame) -> dict:
    """Requests batched at the top rate of each dataset's grid (mean over seeds), per mode (keys like sharegpt_vllm),
    vLLM's over Orca (Oracle)'s and Orca (Max)'s there, and the paper's ratios at its Fig. 13 rate."""
    out = {}
    for name in dict.fromkeys(runs["dataset"]):
        part = runs[runs["dataset"] == name]
        top = part[part["rate"] == part["rate"].max()]
        mean = top.groupby("mode")["mean_batched_requests"].mean()
        key = name.lower()
        out |= {f"{key}_top_rate": float(part["rate"].max()),
                **{f"{key}_{m}": float(mean[m]) for m in MODES},
                f"{key}_over_oracle": float(mean["paged"] / mean["oracle"]),
                f"{key}_over_max": float(mean["paged"] / mean["max"])}
        if f"{name}: paper" in fig13:
            paper = fig13[f"{name}: paper"]
            out |= {f"{key}_paper_vllm": paper["vLLM"], f"{key}_paper_over_oracle": paper["vLLM"] / paper["Orca (Oracle)"],
                    f"{key}_paper_over_max": paper["vLLM"] / paper["Orca (Max)"]}
    return out


def block_figures(sharegpt: pd.DataFrame, alpaca: pd.DataFrame, busy: pd.DataFrame | None = None) -> dict:
    """The block-size tables in numbers: the best sizes, latency at the ends of the grid, the share of held memory
    holding token states at block 16 and the largest size, block-table entries at the smallest and largest size;
    at the busy rate (when run) the best size, latency at the ends and at 16, requests batched and preemptions."""
    best, ties = best_block_size(sharegpt)
    a_best, a_ties = best_block_size(alpaca)
    small, large = sharegpt.index.min(), sharegpt.index.max()
    out = {}
    if busy is not None and len(busy):
        b_best, b_ties = best_block_size(busy)
        out = {"busy_best": b_best, "busy_ties": ", ".join(map(str, b_ties)),
               "busy_latency_small": busy.loc[small, "normalized_latency_s"],
               "busy_latency_16": busy.loc[16, "normalized_latency_s"] if 16 in busy.index else float("nan"),
               "busy_latency_large": busy.loc[large, "normalized_latency_s"],
               "busy_batched_small": busy.loc[small, "mean_batched_requests"],
               "busy_batched_large": busy.loc[large, "mean_batched_requests"],
               "busy_preemptions_small": int(round(busy.loc[small, "num_preemptions"])),
               "busy_preemptions_large": int(round(busy.loc[large, "num_preemptions"]))}
    return out | {"best": best, "ties": ", ".join(map(str, ties)), "alpaca_best": a_best,
            "alpaca_ties": ", ".join(map(str, a_ties)), "small": small, "large": large,
            "latency_small": sharegpt.loc[small, "normalized_latency_s"],
            "latency_large": sharegpt.loc[large, "normalized_latency_s"],
            "alpaca_latency_small": alpaca.loc[small, "normalized_latency_s"],
            "alpaca_latency_large": alpaca.loc[large, "normalized_latency_s"],
            "alpaca_ratio": alpaca.loc[large, "normalized_latency_s"] / alpaca.loc[16, "normalized_latency_s"]
            if 16 in alpaca.index else float("nan"),
            "of_held_16": sharegpt.loc[16, "token_states_of_held_pct"] if 16 in sharegpt.index else float("nan"),
            "of_held_large": sharegpt.loc[large, "token_states_of_held_pct"],
            "alpaca_of_held_large": alpaca.loc[large, "token_states_of_held_pct"],
            "alpaca_batched_16": alpaca.loc[16, "mean_batched_requests"] if 16 in alpaca.index else float("nan"),
            "alpaca_batched_large": alpaca.loc[large, "mean_batched_requests"],
            "entries_small": sharegpt.loc[small, "block_table_entries"],
            "entries_large": sharegpt.loc[large, "block_table_entries"],
            "preemptions_large": int(round(sharegpt.loc[large, "num_preemptions"])),
            "alpaca_preemptions_large": int(round(alpaca.loc[large, "num_preemptions"]))}


def memory_figures(table: pd.DataFrame) -> dict:
    """The memory table in numbers: the smallest and largest KV cache, vLLM's preemptions per request at each, and
    its latency over Orca (Oracle)'s at the smallest."""
    small, large = table.index.min(), table.index.max()
    return {"small_gib": small, "large_gib": large,
            "preempt_small": table.loc[small, "vLLM: preemptions per request"],
            "preempted_pct_small": table.loc[small, "vLLM: requests preempted (%)"],
            "preempt_large": table.loc[large, "vLLM: preemptions per request"],
            "vllm_small": table.loc[small, "vLLM: latency (s/token)"],
            "oracle_small": table.loc[small, "Orca (Oracle): latency (s/token)"],
            "max_small": table.loc[small, "Orca (Max): latency (s/token)"],
            "vllm_large": table.loc[large, "vLLM: latency (s/token)"],
            "oracle_large": table.loc[large, "Orca (Oracle): latency (s/token)"]}


def trace_figures(trace: TraceWorkload, table: pd.DataFrame) -> dict:
    """The Azure runs in numbers: rows read, requests dropped as too long, requests and rate kept, and at its own
    timestamps (scale 1, or the largest scale run) each mode's requests batched and normalized latency."""
    w = trace.workload
    scale = 1.0 if 1.0 in table.index.get_level_values("rate_scale") else table.index.get_level_values("rate_scale").max()
    own = table.xs(scale, level="rate_scale")
    return {"rows": trace.num_rows, "dropped": trace.num_dropped, "requests": w.num_requests,
            "duration_min": float(w.arrival_s[-1]) / 60, "rate": w.num_requests / float(w.arrival_s[-1]),
            "prompt_mean": float(w.prompt_tokens.mean()), "output_mean": float(w.output_tokens.mean()),
            "scale": scale, **{f"{m}_batched": own.loc[MODE_LABELS[m], "mean_batched_requests"] for m in MODES},
            **{f"{m}_latency": own.loc[MODE_LABELS[m], "normalized_latency_s"] for m in MODES},
            "vllm_token_pct": own.loc["vLLM", "token_states_pct"], "max_token_pct": own.loc["Orca (Max)", "token_states_pct"]}


def article_workload_figures(table: pd.DataFrame) -> dict:
    """The article's workload in the engine in numbers: at the article's 8 slots, vLLM's mean latency against the
    slot model's, and how many requests each mode batches with 256 allowed."""
    seqs = sorted(set(table.index.get_level_values("max_num_seqs")))
    small, large = seqs[0], seqs[-1]
    def alike(seqs: int, column: str) -> str:
        values = table.xs(seqs, level="max_num_seqs")[column]
        return "the same for every allocation mode" if values.nunique() == 1 else "different across allocation modes"

    return {"slots": small, "many": large, "alike_small": alike(small, "mean_latency_s"),
            "alike_many": alike(large, "mean_batched_requests"),
            "engine_latency": table.loc[(small, "vLLM"), "mean_latency_s"],
            "slot_latency": table.loc[(small, "vLLM"), "slot_model_mean_latency_s"],
            "max_latency": table.loc[(small, "Orca (Max)"), "mean_latency_s"],
            **{f"{m}_batched_many": table.loc[(large, MODE_LABELS[m]), "mean_batched_requests"] for m in MODES},
            "vllm_latency_many": table.loc[(large, "vLLM"), "mean_latency_s"],
            "max_latency_many": table.loc[(large, "Orca (Max)"), "mean_latency_s"],
            "max_fit": int(ARTICLE_KV_GIB * 1024 / ARTICLE_MIB_PER_TOKEN) // ARTICLE_MAX_LEN}


def prefix_setting_figures(model: str, gpu: str, rate_scales) -> dict:
    """The prefix-caching set-up in words: model, GPU, the model's maximum length (tokens), the pool (tokens) and the
    rate scales run."""
    off, _, blocks, _ = prefix_setting(model, gpu)
    scales = [f"{s:g}x" for s in rate_scales]
    return {"model": model, "gpu": gpu, "max_len": off.scheduler.max_model_len,
            "pool_tokens": (blocks - 1) * off.cache.block_size, "scales": _and(scales)}


def prefix_figures(trace: TraceWorkload, table: pd.DataFrame, model: str, gpu: str) -> dict:
    """The prefix-caching runs in numbers: the window (requests, minutes, mean prompt), the pool (tokens), and per
    the first and last rate scale the hit share and the TTFT saved."""
    off, on, blocks, cost = prefix_setting(model, gpu)
    w = trace.workload
    first, last = table.index.min(), table.index.max()
    return {"requests": w.num_requests, "minutes": float(w.arrival_s[-1]) / 60, "prompt_mean": float(w.prompt_tokens.mean()),
            "pool_tokens": (blocks - 1) * off.cache.block_size, "model": model, "gpu": gpu,
            "dropped": trace.num_dropped, "max_len": off.scheduler.max_model_len,
            "low": first, "high": last,
            "hit_low": table.loc[first, "hit_pct"], "hit_high": table.loc[last, "hit_pct"],
            "saved_low": table.loc[first, "ttft_saved_s"], "saved_low_pct": table.loc[first, "ttft_saved_pct"],
            "saved_high": table.loc[last, "ttft_saved_s"], "saved_high_pct": table.loc[last, "ttft_saved_pct"],
            "ttft_off_low": table.loc[first, "mean_ttft_off_s"], "ttft_off_high": table.loc[last, "mean_ttft_off_s"],
            "lru_same": table.loc[first, "lru_same_size_saved_pct"],
            "lru_unbounded": table.loc[first, "lru_unbounded_saved_pct"]}


def ledger_figures(section_ledger: pd.DataFrame) -> dict:
    """The section's ledger in words: how many rows pass, and the rows within and outside their tolerance, each as
    'table row' in a list."""
    from kvlab.sections.present import label

    pairs = list(zip(section_ledger["table"], section_ledger["row"]))

    def listed(rows):
        names = [f"{r['table']} {r['row']}" + (f" {label(r['column'])}" if pairs.count((r["table"], r["row"])) > 1
                                                else "") for _, r in rows.iterrows()]
        return ", ".join(names) if names else "none"

    return {"passed": int((section_ledger["status"] == "pass").sum()), "total": len(section_ledger),
            "within": listed(section_ledger[section_ledger["status"] == "pass"]),
            "outside": listed(section_ledger[section_ledger["status"] == "fail"])}


def headline(fig13: pd.DataFrame, sustained: pd.DataFrame, bound_s: float, section_ledger: pd.DataFrame) -> list[str]:
    """The section's headline lines, fixed precision."""
    f = sustained_figures(sustained, bound_s)
    counts = section_ledger["status"].value_counts()
    lines = []
    for name in DATASETS:
        if f"{name}: kvlab" in fig13:
            lines.append(f"{name}, requests batched: vLLM {fig13.loc['vLLM', f'{name}: kvlab']:.2f} (paper "
                         f"{fig13.loc['vLLM', f'{name}: paper']:.2f}), Orca (Oracle) "
                         f"{fig13.loc['Orca (Oracle)', f'{name}: kvlab']:.2f} (paper "
                         f"{fig13.loc['Orca (Oracle)', f'{name}: paper']:.2f}), Orca (Max) "
                         f"{fig13.loc['Orca (Max)', f'{name}: kvlab']:.2f} (paper {fig13.loc['Orca (Max)', f'{name}: paper']:.2f})")
    lines.append(f"ShareGPT, sustained under {bound_s:g} s/token: vLLM {f['vllm']:.2f}/s, Orca (Oracle) {f['oracle']:.2f}/s "
                 f"({f['over_oracle']:.2f}x; paper 1.7-2.7x), Orca (Max) {f['max']:.2f}/s ({f['over_max']:.2f}x; paper 2.7-8x)")
    lines.append(f"ledger (the vLLM paper's figures): {counts.get('pass', 0)} pass, {counts.get('fail', 0)} fail, "
                 f"{counts.get('missing', 0)} missing of {len(section_ledger)}")
    return lines
