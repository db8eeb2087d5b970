"""Section 3, part 3 (notebook 03_capacity): full-attention and hybrid models on one GPU, served by kvlab's engine.

A hybrid model's sliding-window layers keep only their window, so vLLM gives them KV cache groups of their own in
one pool (kvlab.core.capacity.kv_cache_groups) and the engine frees each window's blocks as requests move past them
(kvlab.core.engine.kv_cache_manager.KVCacheManager, a manager per group as in vLLM 0.33, identical to it in make
parity). Two experiments: requests of nearly max_model_len all at once (how many run together), and one long-context
workload with shared system prompts (latency, preemptions, prefix hits, the blocks the windows give back). Every
model gets the same step cost, so what differs is memory alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvlab.core import capacity, validate
from kvlab.core.config import EngineConfig
from kvlab.core.cost import LinearStepCost
from kvlab.core.engine import Engine
from kvlab.core.models import get_gpu, get_model
from kvlab.core.workload import Workload
from kvlab.sections.shared import phrases

STEP_COST = LinearStepCost(8.0, 0.01)  # ms a step and a token: the same for every model (kvlab's choice)
FULL_LAYERS = " (every layer full)"  # a hybrid model's row with vLLM's hybrid manager off
SYSTEM_PROMPTS = 4  # distinct system prompts the long-context workload's requests share
SYSTEM_PROMPT_TOKENS = 1500
DOCUMENT_MEDIAN_TOKENS = 8000  # lognormal document after the system prompt (sigma 1.0)
OUTPUT_MEDIAN_TOKENS = 300  # lognormal output (sigma 0.8)
MAX_OUTPUT_TOKENS = 2000


def deployments(model_names, config: EngineConfig) -> list[tuple[str, object, EngineConfig]]:
    """(label, model, config) for each model; a model with sliding-window layers twice, with vLLM's hybrid manager
    and without it (label + FULL_LAYERS: every layer holds every token, one group)."""
    rows = []
    for name in validate.non_empty("models", model_names):
        model = get_model(name)
        rows.append((name, model, config))
        if model.sliding_window:
            rows.append((name + FULL_LAYERS, model, config.replace(hybrid_kv_cache=False)))
    return rows


def kv_cache_table(model_names, gpu_name: str, config: EngineConfig) -> pd.DataFrame:
    """Per deployment on one GPU at config's max_model_len: its KV cache groups, vLLM's blocks, the blocks one request
    of max_model_len needs and vLLM's "Maximum concurrency" (kvlab.core.capacity.plan_capacity, vLLM's sizing)."""
    gpu = get_gpu(gpu_name)
    rows = {}
    for label, model, setting in deployments(model_names, config):
        planned = capacity.plan_capacity(model, gpu.memory_gib, setting.scheduler.max_model_len, setting)
        if planned is None or not planned["starts"]:
            validate.fail("HYBRID_GPU", gpu_name, f"cannot hold one request of {label} at its max_model_len")
        groups = capacity.kv_cache_groups(model, setting)
        rows[label] = {
            "kv_cache_groups": describe(groups),
            "num_gpu_blocks": planned["num_gpu_blocks"],
            "blocks_per_request": planned["blocks_per_request"],
            "max_concurrency": planned["max_concurrency"],
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table


def describe(groups) -> str:
    """'1 (full attention)' or '7 (6 of a 1,024-token window, 1 full)': a deployment's KV cache groups, short."""
    windows = [g.sliding_window for g in groups if g.kind == "sliding_attention"]
    full = sum(g.kind == "full_attention" for g in groups)
    if not windows:
        return f"{full} (full attention)"
    return f"{len(groups)} ({len(windows)} of a {windows[0]:,}-token window, {full} full)"


def long_requests(num_requests: int, max_model_len: int, output_tokens: int = 256) -> Workload:
    """num_requests requests of max_model_len - output_tokens prompt tokens (no two alike) and output_tokens each,
    all arriving at 0."""
    n = validate.positive_int("num_requests", num_requests)
    prompt = max_model_len - output_tokens
    return Workload(np.zeros(n), np.full(n, prompt), np.full(n, output_tokens))


def long_context_workload(num_requests: int, arrival_rate: float, max_model_len: int, seed: int):
    """(Workload, prompt token ids): Poisson arrivals at arrival_rate (requests/s); each prompt one of SYSTEM_PROMPTS
    system prompts of SYSTEM_PROMPT_TOKENS, then its own document (lognormal, median DOCUMENT_MEDIAN_TOKENS); a
    lognormal output (median OUTPUT_MEDIAN_TOKENS); each request at most max_model_len tokens. kvlab's choice: no
    trace gives contents this long."""
    n = validate.positive_int("num_requests", num_requests)
    rng = np.random.default_rng(seed)
    systems = [rng.integers(1_000, 50_000, SYSTEM_PROMPT_TOKENS) for _ in range(SYSTEM_PROMPTS)]
    output = np.clip(rng.lognormal(np.log(OUTPUT_MEDIAN_TOKENS), 0.8, n), 1, MAX_OUTPUT_TOKENS).astype(np.int64)
    room = max_model_len - SYSTEM_PROMPT_TOKENS - output
    document = np.clip(rng.lognormal(np.log(DOCUMENT_MEDIAN_TOKENS), 1.0, n), 1, room).astype(np.int64)
    which = rng.integers(0, SYSTEM_PROMPTS, n)
    ids = [np.concatenate([systems[s], rng.integers(1_000, 50_000, d)]) for s, d in zip(which, document)]
    arrival = np.cumsum(rng.exponential(1 / arrival_rate, n))
    workload = Workload(arrival - arrival[0], np.array([len(x) for x in ids]), output)
    return workload, ids


def serve(label: str, model, config: EngineConfig, num_gpu_blocks: int, workload: Workload, ids=None) -> dict:
    """One run of the engine on the deployment's pool and KV cache groups, summarised: requests running at once
    (peak and mean), preemptions, TTFT, TPOT, prefix hits and the blocks the windows gave back."""
    engine = Engine(
        workload,
        config,
        num_gpu_blocks=num_gpu_blocks,
        cost=STEP_COST,
        prompt_token_ids=ids,
        kv_cache_groups=capacity.engine_kv_cache_groups(model, config),
    )
    result = engine.run()
    steps, summary = result.steps, result.summary()
    hit_tokens = int(steps["num_hit_tokens"].sum())
    return {
        "model": label,
        "peak_running": int(steps["num_running"].max()),
        "mean_running": float(steps["num_running"].mean()),
        "num_preemptions": summary["num_preemptions"],
        "mean_ttft_s": summary["mean_ttft_s"],
        "p95_ttft_s": summary["p95_ttft_s"],
        "mean_tpot_ms": 1e3 * summary["mean_tpot_s"],
        "prefix_hit_pct": 100.0 * hit_tokens / int(workload.prompt_tokens.sum()),
        "window_blocks_returned_per_request": getattr(engine.kv_cache_manager, "num_window_freed", 0)
        / workload.num_requests,
        "makespan_s": float(result.finish_s.max()),
    }


def at_once_table(kv_table: pd.DataFrame, model_names, config: EngineConfig, num_requests: int) -> pd.DataFrame:
    """num_requests requests of nearly max_model_len arriving together, served on each deployment's pool: how many
    run at once in the engine beside vLLM's logged "Maximum concurrency"."""
    workload = long_requests(num_requests, config.scheduler.max_model_len)
    rows = []
    for label, model, setting in deployments(model_names, config):
        row = serve(label, model, setting, int(kv_table.loc[label, "num_gpu_blocks"]), workload)
        rows.append({"model": label, "vllm_max_concurrency": kv_table.loc[label, "max_concurrency"]} | row)
    return pd.DataFrame(rows).set_index("model")[
        ["vllm_max_concurrency", "peak_running", "num_preemptions", "mean_ttft_s", "makespan_s"]
    ]


def workload_table(kv_table: pd.DataFrame, model_names, config: EngineConfig, workload: Workload, ids) -> pd.DataFrame:
    """The long-context workload served on each deployment's pool with prefix caching (serve)."""
    setting = config.replace(enable_prefix_caching=True)
    rows = [
        serve(label, model, cfg, int(kv_table.loc[label, "num_gpu_blocks"]), workload, ids)
        for label, model, cfg in deployments(model_names, setting)
    ]
    return pd.DataFrame(rows).set_index("model").drop(columns="makespan_s")


def figures(kv_table: pd.DataFrame, at_once: pd.DataFrame, served: pd.DataFrame) -> list[dict]:
    """The figures the prose quotes, one dict per hybrid model: its rows (the table's columns) and its every-layer-full
    rows (the same names, suffix _full)."""
    pairs = []
    for label in kv_table.index:
        full = label + FULL_LAYERS
        if full in kv_table.index:
            pair = {"model": label}
            for suffix, row in (("", label), ("_full", full)):
                for prefix, frame in (("", kv_table), ("at_once_", at_once), ("", served)):
                    pair |= {f"{prefix}{k}{suffix}": v for k, v in frame.loc[row].to_dict().items()}
            pairs.append(pair)
    return pairs


def prose(pair: dict, num_at_once: int, max_model_len: int) -> str:
    """What one hybrid model's windows change, in words built from its figures (figures)."""
    p = pair
    verbs = ("rises", "falls", "stays the same")
    more = p["at_once_peak_running"] > int(p["max_concurrency"])
    held = (
        "more than vLLM's figure; the likely reason, from vLLM's code rather than a run here: vLLM counts each window "
        "at its admission cap (the window less one plus the tokens in flight, two steps' budget under asynchronous "
        "scheduling), while a running request's window holds only the blocks its last chunk still attends to"
        if more
        else "as vLLM's figure says"
    )
    return (
        f"{p['model']} keeps its layers in {p['kv_cache_groups']} KV cache groups sharing {p['num_gpu_blocks']:,} "
        f"blocks ({p['num_gpu_blocks_full']:,} with every layer full). At {max_model_len:,} tokens a request, vLLM "
        f"logs a maximum concurrency of {p['max_concurrency']:.2f}, against {p['max_concurrency_full']:.2f} with "
        f"every layer full. Of {num_at_once} such requests sent together, {int(p['at_once_peak_running'])} run at "
        f"once against {int(p['at_once_peak_running_full'])}, {held}. On the long-context workload, from every layer full to "
        f"windows, the mean running batch {phrases.change(p['mean_running_full'], p['mean_running'], 1, verbs)}, "
        f"preemptions {phrases.change(p['num_preemptions_full'], p['num_preemptions'], 0)} and mean TTFT "
        f"{phrases.change(p['mean_ttft_s_full'], p['mean_ttft_s'], 2, verbs, unit='s')}. The windows give back "
        f"{p['window_blocks_returned_per_request']:,.0f} blocks a request as it moves past them. Prefix hits "
        f"{phrases.change(p['prefix_hit_pct_full'], p['prefix_hit_pct'], 1, unit='% of the prompt tokens')}"
        + (
            "; the likely reason, from vLLM's code rather than a run here: a window caches its blocks only at a "
            "prompt's end and where prompts part (vLLM's default retention interval of 0), so a hit needs full "
            "attention and every window to find it."
            if phrases.direction(p["prefix_hit_pct_full"], p["prefix_hit_pct"], 1) == "fall"
            else "."
        )
    )


def baseline(model: str, served: pd.DataFrame, at_once: pd.DataFrame) -> str:
    """A full-attention model's figures on the same workloads, in words."""
    row, once = served.loc[model], at_once.loc[model]
    return (
        f"{model}, full attention throughout, runs {int(once['peak_running'])} of the long requests at once; on the "
        f"long-context workload its mean running batch is {row['mean_running']:.1f} requests, with "
        f"{int(row['num_preemptions'])} preemptions and a mean TTFT of {row['mean_ttft_s']:.2f} s."
    )


def plain_models(kv_table: pd.DataFrame) -> list[str]:
    """The deployments of models without sliding-window layers (no every-layer-full twin)."""
    hybrids = {m.removesuffix(FULL_LAYERS) for m in kv_table.index if m.endswith(FULL_LAYERS)}
    return [m for m in kv_table.index if m not in hybrids and not m.endswith(FULL_LAYERS)]
