"""Section 6's grids: the points (each one engine run of kvlab.core.engine under the paper's setting or another) and
serve(), which runs one. kvlab.studies.sweep.run serves a grid on local processes or a Dask cluster; serve() is
deterministic, so the numbers do not depend on where it ran. The allocation modes are the paper's: vLLM's paged
memory and its Orca reservation baselines."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from kvlab.core import allocator, validate
from kvlab.core.config import EngineConfig
from kvlab.core.cost import ConstantStepCost, MeasuredStepCost, RooflineStepCost, make_step_cost
from kvlab.core.engine import ALLOCATIONS, simulate, warm
from kvlab.core.profiles import measured_gpus
from kvlab.core.units import GIB, MIB
from kvlab.core.workload import Workload
from kvlab.studies import sweep
from kvlab.studies.paper_setting import PAPER_BLOCK_SIZE, TODAY, TODAY_FRACTIONS_GPU, PaperSetting, prefix_setting
from kvlab.studies.paper_workloads import TraceWorkload, variants
from kvlab.workloads import paper_datasets, synthetic

MODES = ("max", "pow2", "oracle", "paged")  # the order the paper shows them in
MODE_LABELS = allocator.POLICY_NAMES
DATASETS = ("ShareGPT", "Alpaca")
# The article's section 2 and its memory (section 1: 60 GiB at 0.5 MiB a token; requests up to 4,096 tokens).
ARTICLE_KV_GIB, ARTICLE_MIB_PER_TOKEN, ARTICLE_MAX_LEN = 60.0, 0.5, 4096


def serve(point: dict) -> dict:
    """One engine run of a sweep point: its labels and what the run measured (see metrics). A point holds the
    workload, the engine config, num_gpu_blocks, the step cost, the allocation and labels (plain values)."""
    config = point["config"]
    result = simulate(
        point["workload"],
        config,
        num_gpu_blocks=point["num_gpu_blocks"],
        cost=point["cost"],
        allocation=point["allocation"],
    )
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
    """serve() on every point through kvlab.studies.sweep.run (logged as name for the report's footer), one row
    per point in the points' order. The engine's compiled loops are loaded here first, so that every run takes them
    (runs of a few thousand requests would not load them each) and the workers forked next find them loaded."""
    warm.load()
    results, _ = sweep.run(serve, points, scheduler=scheduler or None, name=name)
    return pd.DataFrame(results)


def _point(workload: Workload, config: EngineConfig, num_gpu_blocks: int, cost, allocation: str, **labels) -> dict:
    validate.one_of("allocation", allocation, ALLOCATIONS)
    return {
        "workload": workload,
        "config": config,
        "num_gpu_blocks": num_gpu_blocks,
        "cost": cost,
        "allocation": allocation,
        "labels": labels,
    }


def seeds_of(seed: int, num_seeds: int) -> list[int]:
    """Seeds seed .. seed + num_seeds - 1."""
    validate.non_negative_int("seed", seed)
    return list(range(seed, seed + validate.positive_int("num_seeds", num_seeds)))


def paper_points(
    setting: PaperSetting,
    sets: dict,
    rates: dict,
    seeds: list[int],
    num_requests: int,
    modes=MODES,
    changed: tuple | None = None,
    **labels,
) -> list[dict]:
    """One point per dataset, rate (requests/s), seed and allocation mode: sets name -> dataset, rates name ->
    a rate or a list of rates. A seed's workload is the same for every mode and, its gaps divided by the rate,
    every rate. changed: (config, cost) in place of the setting's own."""
    config, cost = changed or (setting.config(), setting.cost())
    blocks = setting.num_gpu_blocks()
    points = []
    for name, dataset in sets.items():
        for rate in np.atleast_1d(rates[name]).tolist():
            for seed in seeds:
                workload = paper_datasets.workload(dataset, num_requests, rate, seed)
                for mode in modes:
                    points.append(
                        _point(
                            workload,
                            config,
                            blocks,
                            cost,
                            mode,
                            dataset=name,
                            variant=dataset.name,
                            mode=mode,
                            rate=float(rate),
                            seed=seed,
                            **labels,
                        )
                    )
    return points


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
                points.append(
                    _point(
                        workload,
                        config,
                        blocks,
                        cost,
                        mode,
                        dataset=dataset_name,
                        variant=name,
                        mode=mode,
                        rate=float(rate),
                        seed=seed,
                    )
                )
    return points


# What each modelling choice of the paper's system does to Fig. 13, one changed at a time (ablation_points).
ABLATIONS = {
    "mixed steps": "vLLM 0.33's scheduler without chunked prefill: waiting prompts, whole, in the same step as the "
    "decodes under one token budget (the paper's §4.3: an iteration's prompt and generation tokens in one sequence)",
    "roofline clock": "kvlab's roofline of the model on the GPU in place of the clock fitted to 2023's measurements",
}


def ablation_points(setting: PaperSetting, sets: dict, rates: dict, seeds: list[int], num_requests: int) -> list[dict]:
    """Fig. 13's runs (every mode, each dataset at its rate) with one of the setting's choices changed
    (ABLATIONS), labelled ablation=its name: the scheduler (vLLM 0.33's, synchronous, without chunked prefill, at
    the same token budget) or the clock (the roofline)."""
    mixed = setting.replace(scheduler_cls="v1")
    changed = {
        "mixed steps": (mixed.config().replace(enable_chunked_prefill=False), setting.cost()),
        "roofline clock": (setting.config(), setting.replace(step_cost="roofline").cost()),
    }
    return [
        point
        for ablation, pair in changed.items()
        for point in paper_points(setting, sets, rates, seeds, num_requests, changed=pair, ablation=ablation)
    ]


def today_cost(setting: PaperSetting) -> MeasuredStepCost | RooflineStepCost:
    """Today's step cost of the setting's model on its GPU: vLLM 0.33's measured one (kvlab.core.cost.measured;
    without an operator profile of the model, the roofline at the sustained fractions measured on the GPU, or on
    the measured GPU of the same chip, TODAY_FRACTIONS_GPU; a GPU with neither: the datasheet roofline)."""
    hardware = {"model": setting.model_spec, "gpu": setting.gpu_spec, "config": setting.replace(**TODAY).config()}
    fractions_gpu = TODAY_FRACTIONS_GPU.get(setting.gpu)
    if fractions_gpu is None and setting.gpu not in measured_gpus():
        return dataclasses.replace(
            make_step_cost("roofline", **hardware),
            provenance=f"roofline at the datasheet of {setting.gpu} (no measurement of it)",
        )
    return make_step_cost("measured", **hardware, fractions_gpu=fractions_gpu)


def today_points(setting: PaperSetting, sets: dict, rates: dict, seeds: list[int], num_requests: int) -> list[dict]:
    """Fig. 13's workloads served by today's vLLM: vLLM 0.33's scheduler, asynchronous (its default), its default
    step budget, on the measured step cost of the model on the GPU (kvlab.core.cost.measured: OPT-13B has no
    operator profile, so the roofline at the sustained fractions measured on an A100, as its source says)."""
    config = setting.replace(**TODAY).config().replace(async_scheduling=True)
    cost = today_cost(setting)
    return [
        _point(
            paper_datasets.workload(dataset, num_requests, rates[name], seed),
            config,
            setting.num_gpu_blocks(),
            cost,
            "paged",
            dataset=name,
            mode="paged",
            rate=float(rates[name]),
            seed=seed,
        )
        for name, dataset in sets.items()
        for seed in seeds
    ]


def knee_points(
    setting: PaperSetting,
    dataset_name: str,
    dataset,
    grid_rates,
    sustained: pd.DataFrame,
    bound_s: float,
    num_steps: int,
    seeds: list[int],
    num_requests: int,
) -> list[dict]:
    """A finer grid at each mode's knee on one dataset: from the rate it sustains under bound_s on the coarse grid
    (grid_rates; sustained: kvlab.sections.s06_memory_budget.tables.sustained_table) to the grid's next rate, num_steps
    geometric steps (both ends included), each rate for every seed. A mode sustaining no rate or every rate of the
    grid has no knee inside it and no points."""
    config, blocks, cost = setting.config(), setting.num_gpu_blocks(), setting.cost()
    grid = np.asarray(grid_rates, dtype=float)
    validate.positive_int("num_steps", num_steps)
    row = sustained.loc[(dataset_name, float(bound_s))]
    points = []
    for mode in MODES:
        low = float(row[MODE_LABELS[mode]])
        above = grid[grid > low] if low == low else grid[:0]
        if not len(above):
            continue
        for rate in np.geomspace(low, above[0], num_steps + 1).tolist():
            for seed in seeds:
                workload = paper_datasets.workload(dataset, num_requests, rate, seed)
                points.append(
                    _point(
                        workload,
                        config,
                        blocks,
                        cost,
                        mode,
                        dataset=dataset_name,
                        mode=mode,
                        rate=float(rate),
                        seed=seed,
                    )
                )
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


def block_points(
    setting: PaperSetting, sets: dict, rates: dict, block_sizes, seeds: list[int], num_requests: int
) -> list[dict]:
    """vLLM (paged) at each block size with the same KV memory (blocks of block_size tokens plus the null block)."""
    points = []
    for name, dataset in sets.items():
        for seed in seeds:
            workload = paper_datasets.workload(dataset, num_requests, rates[name], seed)
            for bs in block_sizes:
                points.append(
                    _point(
                        workload,
                        setting.config(bs),
                        setting.num_gpu_blocks(bs),
                        setting.cost(bs),
                        "paged",
                        dataset=name,
                        block_size=int(bs),
                        rate=float(rates[name]),
                        seed=seed,
                    )
                )
    return points


def block_runs(points: list[dict], scheduler: str | None = None) -> pd.DataFrame:
    """The block-size grid's runs, with each point's pool (blocks) and mean block-table entries per request
    (ceil(final length / block size) blocks at its longest)."""
    runs = run_grid("section 6: block sizes", points, scheduler)
    runs["num_gpu_blocks"] = [p["num_gpu_blocks"] for p in points]
    runs["block_table_entries"] = [
        float(
            np.mean(
                -(
                    -np.minimum(
                        p["workload"].prompt_tokens + p["workload"].output_tokens, p["config"].scheduler.max_model_len
                    )
                    // p["config"].cache.block_size
                )
            )
        )
        for p in points
    ]
    return runs


def memory_points(
    setting: PaperSetting, dataset, rate: float, kv_cache_gibs, seeds: list[int], num_requests: int
) -> list[dict]:
    """Every allocation mode at each KV-cache size (GiB), one dataset at one rate."""
    config, cost = setting.config(), setting.cost()
    points = []
    for seed in seeds:
        workload = paper_datasets.workload(dataset, num_requests, rate, seed)
        for gib in kv_cache_gibs:
            setting.check_fits("KV_CACHE_GIBS", gib)
            for mode in MODES:
                points.append(
                    _point(
                        workload,
                        config,
                        setting.num_gpu_blocks(kv_cache_gib=gib),
                        cost,
                        mode,
                        kv_cache_gib=float(gib),
                        mode=mode,
                        seed=seed,
                    )
                )
    return points


def trace_points(setting: PaperSetting, trace: TraceWorkload, rate_scales) -> list[dict]:
    """Every allocation mode on the trace at each rate scale (1 = its own timestamps)."""
    config, blocks, cost = setting.config(), setting.num_gpu_blocks(), setting.cost()
    return [
        _point(trace.at(scale), config, blocks, cost, mode, rate_scale=float(scale), mode=mode)
        for scale in rate_scales
        for mode in MODES
    ]


def article_points(
    num_requests: int, arrival_rate: float, ms_per_token: float, max_num_seqs_list, seed: int
) -> list[dict]:
    """The article's section 2 workload (Poisson arrivals, its output mix) in the engine: a constant step of
    ms_per_token, the article's memory (60 GiB at 0.5 MiB a token, blocks of 16, requests up to 4,096 tokens), one
    prompt token each (vLLM needs one; the article charges prompts nothing), every mode at each max_num_seqs."""
    workload = synthetic.article_s2_workload(num_requests, arrival_rate, "article", np.random.default_rng(seed))
    workload = Workload(
        workload.arrival_s, np.ones(num_requests, dtype=np.int64), workload.output_tokens, name=workload.name
    )
    bs = PAPER_BLOCK_SIZE
    blocks = int(ARTICLE_KV_GIB * GIB // (ARTICLE_MIB_PER_TOKEN * MIB * bs)) + 1
    cost = ConstantStepCost(ms_per_token)
    points = []
    for seqs in max_num_seqs_list:
        config = EngineConfig().replace(
            async_scheduling=False, block_size=bs, max_model_len=ARTICLE_MAX_LEN, max_num_seqs=int(seqs)
        )
        points += [_point(workload, config, blocks, cost, mode, max_num_seqs=int(seqs), mode=mode) for mode in MODES]
    return points


def prefix_points(trace: TraceWorkload, model: str, gpu: str, rate_scales) -> list[dict]:
    """The Mooncake window with prefix caching off and on at each rate scale. Mooncake's hash_ids name 512-token
    blocks; the engine gives two prompts equal tokens wherever they have equal hash ids at the same positions
    (Request.prompt_block_ids), so equal ids are equal tokens and a block of 16 inside them can be shared."""
    off, on, blocks, cost = prefix_setting(model, gpu)
    return [
        _point(trace.at(scale), config, blocks, cost, "paged", rate_scale=float(scale), caching=caching)
        for scale in rate_scales
        for caching, config in ((False, off), (True, on))
    ]


def scheduling_points(setting: PaperSetting, trace: TraceWorkload, rate_scales) -> list[dict]:
    """vLLM (paged) on the trace at each rate scale with vLLM 0.33's scheduler (TODAY), scheduled synchronously and
    asynchronously (a batch queue of two), on today's step cost (today_cost)."""
    blocks, cost = setting.num_gpu_blocks(), today_cost(setting)
    config = setting.replace(**TODAY).config()
    return [
        _point(
            trace.at(scale),
            config.replace(async_scheduling=mode),
            blocks,
            cost,
            "paged",
            rate_scale=float(scale),
            async_scheduling=mode,
        )
        for scale in rate_scales
        for mode in (False, True)
    ]
