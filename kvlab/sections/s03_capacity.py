"""Section 3 (notebook 03_capacity): the article's memory and fit tables, and real models counted as vLLM counts.

The mechanism (bytes per token, vLLM's budget, blocks and layer groups) is kvlab.core.capacity.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from kvlab.core import article, capacity, validate
from kvlab.core.config import EngineConfig
from kvlab.core.models import get_gpu, get_model
from kvlab.core.units import GIB, KIB, unit_bytes

ARTICLE_SHAPE = capacity.KVShape(article.NUM_LAYERS, article.NUM_KV_HEADS, article.HEAD_DIM, article.DTYPE_BYTES)
PARITY_DIR = Path(__file__).resolve().parents[2] / "data" / "parity"  # written by make parity


def memory_table(
    shape: capacity.KVShape, contexts: Iterable[int], concurrency: Iterable[int], unit: str = "GiB"
) -> pd.DataFrame:
    """KV memory (in unit) for each context length, for one request and for each concurrency level."""
    contexts = validate.non_empty("contexts", contexts)
    concurrency = [validate.positive_int("concurrency", c) for c in validate.non_empty("concurrency", concurrency)]
    scale = unit_bytes(unit)
    rows = {}
    for ctx in contexts:
        per = capacity.bytes_per_request(shape, ctx)
        rows[ctx] = {f"per_request_{unit.lower()}": per / scale}
        rows[ctx].update({f"{n}_requests_{unit.lower()}": n * per / scale for n in concurrency})
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "context_tokens"
    return table


def fit_table(
    shape: capacity.KVShape, gpu_memory: float, weights: float, contexts: Iterable[int], unit: str = "GiB"
) -> pd.DataFrame:
    """Requests that fit in gpu_memory less weights (both in unit), for each context length."""
    contexts = validate.non_empty("contexts", contexts)
    free = capacity.free_bytes(gpu_memory, weights, unit)
    return pd.DataFrame(
        {"max_num_requests": [capacity.max_num_requests(free, capacity.bytes_per_request(shape, c)) for c in contexts]},
        index=pd.Index(contexts, name="context_tokens"),
    )


# ---------------------------------------------------------------- part 2: real models
def model_table(names: Iterable[str], config: EngineConfig = EngineConfig()) -> pd.DataFrame:
    """Each catalog model's KV shape and KV bytes per token on one GPU, against the article's model."""
    rows = {}
    for name in validate.non_empty("names", names):
        spec = get_model(name)
        per_token = capacity.kv_bytes_per_token(spec, config)
        rows[spec.name] = {
            "attention": spec.attention,
            "num_layers": spec.num_layers,
            "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "sliding_layers": spec.num_sliding_layers,
            "sliding_window": spec.sliding_window,
            "kv_kib_per_token": per_token / KIB,
            "vs_article": per_token / ARTICLE_SHAPE.kv_bytes_per_token,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table


def concurrency_table(
    names: Iterable[str],
    gpu_memory_gib: float,
    contexts: Iterable[int],
    kv_cache_dtypes: Iterable[str],
    tensor_parallel_sizes: Iterable[int],
    config: EngineConfig = EngineConfig(),
) -> pd.DataFrame:
    """vLLM's maximum concurrency for every model x KV dtype x TP x context (NaN where the weights leave no block)."""
    rows = []
    for name in validate.non_empty("names", names):
        spec = get_model(name)
        for dtype in validate.non_empty("kv_cache_dtypes", kv_cache_dtypes):
            for tp in validate.non_empty("tensor_parallel_sizes", tensor_parallel_sizes):
                setting = config.replace(kv_cache_dtype=dtype, tensor_parallel_size=tp)
                for ctx in validate.non_empty("contexts", contexts):
                    result = capacity.plan_capacity(spec, gpu_memory_gib, ctx, setting)
                    rows.append(
                        {
                            "model": spec.name,
                            "kv_cache_dtype": dtype,
                            "tensor_parallel_size": tp,
                            "max_model_len": ctx,
                            "max_concurrency": float("nan") if result is None else result["max_concurrency"],
                        }
                    )
    return pd.DataFrame(rows)


def log_headline(log_table: pd.DataFrame) -> str:
    """One line on a vllm_log_table: the models with the most and the fewest requests at once (x, at how many
    GPUs, and their own max_model_len where it is below the table's), the one that needs the most GPUs and
    those that fit on none of the tensor parallel sizes."""
    fits = log_table[log_table["max_concurrency"].notna()]
    longest = int(log_table["max_model_len"].max()) if len(log_table) else 0

    def said(name, row):
        clamp = f", its {int(row['max_model_len']):,}-token limit" if row["max_model_len"] < longest else ""
        return f"{name.split('/')[-1]} {row['max_concurrency']:.2f}x (TP {int(row['tensor_parallel_size'])}{clamp})"

    parts = []
    if len(fits):
        most, fewest = fits["max_concurrency"].idxmax(), fits["max_concurrency"].idxmin()
        parts.append(f"most requests at once {said(most, fits.loc[most])}")
        if fewest != most:
            parts.append(f"fewest {said(fewest, fits.loc[fewest])}")
        widest = fits["tensor_parallel_size"].idxmax()
        if fits.loc[widest, "tensor_parallel_size"] > 1 and widest not in (most, fewest):
            parts.append(f"needing the most GPUs to fit, {said(widest, fits.loc[widest])}")
    unfit = [name.split("/")[-1] for name in log_table.index if name not in fits.index]
    if unfit:
        parts.append(f"fit on no tensor parallel size: {', '.join(unfit)}")
    return "; ".join(parts) or "no model"


def vllm_log_table(
    names: Iterable[str],
    gpu_memory_gib: float,
    max_model_len: int,
    tensor_parallel_sizes: Iterable[int] = (1, 2, 4, 8),
    config: EngineConfig = EngineConfig(),
) -> pd.DataFrame:
    """vLLM's log figures per model at the smallest TP whose KV cache holds one request of max_model_len.

    max_model_len is capped, as vLLM caps it, at the model's max_position_embeddings.
    """
    rows = {}
    for name in validate.non_empty("names", names):
        spec = get_model(name)
        length = min(max_model_len, spec.max_position_embeddings or max_model_len)
        row = {
            "max_model_len": length,
            "tensor_parallel_size": float("nan"),
            "available_kv_gib": float("nan"),
            "num_gpu_blocks": float("nan"),
            "gpu_kv_cache_tokens": float("nan"),
            "max_concurrency": float("nan"),
        }
        for tp in validate.non_empty("tensor_parallel_sizes", tensor_parallel_sizes):
            result = capacity.plan_capacity(spec, gpu_memory_gib, length, config.replace(tensor_parallel_size=tp))
            if result is not None and result["starts"]:
                row = {
                    "max_model_len": length,
                    "tensor_parallel_size": tp,
                    "available_kv_gib": round(result["available_kv_cache_bytes"] / GIB, 2),
                    "num_gpu_blocks": result["num_gpu_blocks"],
                    "gpu_kv_cache_tokens": result["gpu_kv_cache_tokens"],
                    "max_concurrency": round(result["max_concurrency"], 2),
                }
                break
        rows[spec.name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table.astype({c: "Int64" for c in ("tensor_parallel_size", "num_gpu_blocks", "gpu_kv_cache_tokens")})


# ---------------------------------------------------------------- part 3: kvlab against vLLM's own code
# Data parallelism in part 2: a mixture-of-experts model beside a dense one of about its size (kvlab's choice).
DATA_PARALLEL_MODELS = ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-32B")
DATA_PARALLEL_SIZES = (1, 2, 4)


def data_parallel_table(
    names: Iterable[str],
    gpu_memory_gib: float,
    max_model_len: int,
    data_parallel_sizes: Iterable[int] = DATA_PARALLEL_SIZES,
    config: EngineConfig = EngineConfig(),
) -> pd.DataFrame:
    """Each model on 1 to N data-parallel ranks of one GPU each (expert parallelism on for a mixture-of-experts
    model, as vLLM serves one): the weights a GPU holds (GiB), one rank's KV blocks and maximum concurrency at
    max_model_len (vLLM's log line of that rank; each rank is one GPU, so also per GPU), and all the ranks'."""
    rows = []
    for name in validate.non_empty("names", names):
        spec = get_model(name)
        length = min(max_model_len, spec.max_position_embeddings or max_model_len)
        for dp in validate.non_empty("data_parallel_sizes", data_parallel_sizes):
            setting = config.replace(data_parallel_size=dp, enable_expert_parallel=dp > 1 and spec.expert_params_b > 0)
            weights_gib = capacity.estimated_weights_gib(spec, "bf16", setting)
            result = capacity.plan_capacity(spec, gpu_memory_gib, length, setting)
            starts = result is not None and result["starts"]
            rows.append(
                {
                    "model": spec.name,
                    "data_parallel_size": dp,
                    "expert_parallel": setting.parallel.enable_expert_parallel,
                    "weights_per_gpu_gib": round(weights_gib, 2),
                    "num_gpu_blocks_per_rank": result["num_gpu_blocks"] if starts else 0,
                    "max_concurrency_per_rank": round(result["max_concurrency"], 2) if starts else 0.0,
                    "max_concurrency_all_ranks": round(dp * result["max_concurrency"], 2) if starts else 0.0,
                }
            )
    return pd.DataFrame(rows).set_index(["model", "data_parallel_size"])


def data_parallel_figures(table: pd.DataFrame) -> dict:
    """The figures notebook 03's data-parallel paragraph states, per model ("moe": the one served with expert
    parallelism, "dense": the other): its weights per GPU and one GPU's concurrency on the fewest and the most ranks,
    and their ratio."""
    out = {}
    for model, rows in table.groupby(level="model", sort=False):
        first, last = rows.iloc[0], rows.iloc[-1]
        one, many = float(first["max_concurrency_per_rank"]), float(last["max_concurrency_per_rank"])
        out["moe" if rows["expert_parallel"].any() else "dense"] = {
            "model": model.split("/")[-1],
            "ranks": int(rows.index.get_level_values("data_parallel_size")[-1]),
            "weights_one": float(first["weights_per_gpu_gib"]),
            "weights_many": float(last["weights_per_gpu_gib"]),
            "concurrency_one": one,
            "concurrency_many": many,
            "gain": many / one if one else float("nan"),
        }
    return out


# What data parallelism does to latency: the mixture-of-experts model, GPU and workload of section 5's one real
# DP 2 + EP run (kvlab's choice: the deployment kvlab is checked against), at its own arrival rate and at twice it.
DATA_PARALLEL_RUN = "llmservingsim/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507"
LOAD_FACTORS = (1, 2)
DEPLOYMENTS = ("one GPU", "two replicas", "DP 2 + EP")
MEASURE_WORDS = {"mean_ttft_s": "mean TTFT", "mean_tpot_ms": "mean TPOT", "mean_e2e_s": "mean E2E latency"}
REAL_RUN = "DP 2 + EP: the real vLLM run"  # the row of what vLLM itself measured on the same requests (load 1x)


def data_parallel_serving_table(
    run_name: str = DATA_PARALLEL_RUN, load_factors: Iterable[int] = LOAD_FACTORS, rank_rules: str = "0.33"
):
    """A mixture-of-experts model served three ways on its run's GPU by kvlab's engine and measured clock, with the
    run's settings and requests (arrival times divided by the load factor): on one GPU; on two replicas of one GPU
    each, the requests dealt in turn (a plain load balancer: kvlab's choice); and on two GPUs as data-parallel ranks
    with expert parallelism (kvlab.core.engine.DataParallelEngine: lockstep, vLLM 0.33's rank choice). Per row: GPUs,
    KV blocks per GPU, mean TTFT (s), mean TPOT (ms), mean E2E latency (s), and the share of rank-steps that ran
    a dummy batch (%; data parallelism only); at load 1x a last row of what the real vLLM run measured. rank_rules:
    whose rank choice the ranks make (kvlab.core.engine.data_parallel.DP_RULES: vLLM 0.33's, or the run's own)."""
    from kvlab.core.cost import make_step_cost
    from kvlab.core.engine import DataParallelEngine, simulate
    from kvlab.core.workload import Workload
    from kvlab.studies.plan import percentile_metrics
    from kvlab.workloads.vllm_runs import load_vllm_run

    run = load_vllm_run(run_name)
    model, gpu = get_model(run.settings["model"]), get_gpu(run.settings["gpu"])
    base = run.engine_config(data_parallel_size=1, enable_expert_parallel=False)
    length = base.scheduler.max_model_len
    rows = []
    for factor in validate.non_empty("load_factors", load_factors):
        validate.positive_int("load_factor", factor)
        w = run.workload
        w = Workload(w.arrival_s / factor, w.prompt_tokens, w.output_tokens, name=w.name)
        for deployment in DEPLOYMENTS:
            data_parallel = deployment == "DP 2 + EP"
            config = base.replace(data_parallel_size=2, enable_expert_parallel=True) if data_parallel else base
            blocks = capacity.plan_capacity(model, gpu.memory_gib, length, config)["num_gpu_blocks"]
            cost = make_step_cost("measured", model=model, gpu=gpu, config=config)
            first_token, finish, dummy_pct = np.empty(w.num_requests), np.empty(w.num_requests), float("nan")
            if data_parallel:
                engine = DataParallelEngine(w, config, num_gpu_blocks=blocks, cost=cost, vllm_version=rank_rules)
                result = engine.run()
                first_token[:], finish[:] = result.first_token_s, result.finish_s
                dummy_pct = 100 * engine.ranks.num_dummy_batches / (2 * result.num_steps)
            else:
                for rank in range(1 + (deployment == "two replicas")):
                    mine = np.arange(rank, w.num_requests, 1 + (deployment == "two replicas"))
                    part = Workload(w.arrival_s[mine], w.prompt_tokens[mine], w.output_tokens[mine], name=w.name)
                    result = simulate(part, config, num_gpu_blocks=blocks, cost=cost)
                    first_token[mine], finish[mine] = result.first_token_s, result.finish_s
            metrics = percentile_metrics(w.arrival_s, w.output_tokens, first_token, finish)
            rows.append(
                {
                    "load": f"{factor}x",
                    "deployment": deployment,
                    "gpus": 1 if deployment == "one GPU" else 2,
                    "num_gpu_blocks_per_gpu": blocks,
                    **{name: metrics[name] for name in ("mean_ttft_s", "mean_tpot_ms", "mean_e2e_s")},
                    "dummy_batch_pct": dummy_pct,
                }
            )
        if factor == 1:  # what vLLM measured on these requests: the check on the clock's rows
            real = percentile_metrics(w.arrival_s, w.output_tokens, run.first_token_s, run.finish_s)
            rows.append(
                {"load": "1x", "deployment": REAL_RUN, "gpus": 2, "num_gpu_blocks_per_gpu": float("nan")}
                | {name: real[name] for name in ("mean_ttft_s", "mean_tpot_ms", "mean_e2e_s")}
                | {"dummy_batch_pct": float("nan")}
            )
    table = pd.DataFrame(rows).set_index(["load", "deployment"])
    table.attrs |= {"model": model.name.split("/")[-1], "gpu": gpu.name, "num_requests": w.num_requests}
    return table


def data_parallel_serving_figures(table: pd.DataFrame) -> dict:
    """The figures notebook 03's paragraph on data-parallel latency states: per load ("1x", "2x") each
    deployment's row as a dict (the real run's too, at 1x), the model, GPU and requests served, and the clock's
    error on the real run (%, kvlab's DP 2 + EP row against vLLM's, per measure)."""
    out = dict(table.attrs) | {
        load: {deployment: rows.loc[(load, deployment)].to_dict() for deployment in rows.index.get_level_values(1)}
        for load, rows in table.groupby(level="load", sort=False)
    }
    if REAL_RUN in out.get("1x", {}):
        kvlab, real = out["1x"]["DP 2 + EP"], out["1x"][REAL_RUN]
        error = {m: 100 * (kvlab[m] / real[m] - 1) for m in MEASURE_WORDS}
        out["clock_error_pct"], out["weakest_measure"] = error, MEASURE_WORDS[max(error, key=lambda m: abs(error[m]))]
    return out


def parity_table(folder: str | Path = PARITY_DIR) -> pd.DataFrame:
    """make parity's capacity result (data/parity/capacity_summary.csv) by model family: the models, their KV
    caches, the grid's cases, how many vLLM refused, and how many kvlab computes exactly as vLLM 0.33 does
    (num_gpu_blocks, the token figure, the concurrency, whether it starts and why not); a last row for all."""
    summary = pd.read_csv(Path(folder) / "capacity_summary.csv")
    table = summary.groupby("family", sort=False).agg(
        models=("model", "size"),
        kv_cache=("kv_cache", lambda kinds: ", ".join(dict.fromkeys(kinds))),
        cases=("cases", "sum"),
        refused_by_vllm=("refused_by_vllm", "sum"),
        identical=("identical", "sum"),
    )
    table.loc["all"] = [len(summary), "", *table[["cases", "refused_by_vllm", "identical"]].sum()]
    table["identical_pct"] = (100 * table["identical"] / table["cases"]).round(2)
    return table


def parity_differences(folder: str | Path = PARITY_DIR) -> pd.DataFrame:
    """Every case and figure where kvlab and vLLM 0.33 differ, with the reason (data/parity/capacity_differences.csv)."""
    return pd.read_csv(Path(folder) / "capacity_differences.csv")


# ---------------------------------------------------------------- the figures the notebook's prose states
# Each function below returns the numbers one paragraph of notebook 03 states, so that the notebook only formats them.
def fit_figures(shape: capacity.KVShape, fit: pd.DataFrame, gpu_memory_gib: float, weights_gib: float) -> dict:
    """From the fit table: the memory left for the KV cache (GiB), the shortest and longest context (tokens) and
    their ratio (x), the requests that fit at each and their ratio (x), and the requests the longest context's
    memory per request divides into the free memory before rounding down."""
    free = float(capacity.free_bytes(gpu_memory_gib, weights_gib, "GiB"))
    shortest, longest = fit.index.min(), fit.index.max()
    most, fewest = int(fit.loc[shortest, "max_num_requests"]), int(fit.loc[longest, "max_num_requests"])
    return {
        "free_gib": free / GIB,
        "gpu_gib": gpu_memory_gib,
        "weights_gib": weights_gib,
        "shortest": shortest,
        "longest": longest,
        "context_ratio": longest / shortest,
        "most": most,
        "fewest": fewest,
        "requests_ratio": most / fewest if fewest else float("nan"),
        "exact_at_longest": free / capacity.bytes_per_request(shape, longest),
    }


# The models the prose names, whatever TABLE_MODELS holds.
EXAMPLES = {
    "llama3": "meta-llama/Llama-3.1-8B-Instruct",
    "llama70b": "meta-llama/Llama-3.1-70B-Instruct",
    "gemma3": "google/gemma-3-27b-it",
    "deepseek_v3": "deepseek-ai/DeepSeek-V3",
}


def example_figures(
    config: EngineConfig, gpu_name: str, tensor_parallel_sizes: Iterable[int], kv_cache_dtypes: Iterable[str]
) -> dict:
    """What the prose says about the models it names (EXAMPLES): KV bytes per token against the article's shape
    (x and %), heads and layers, parameters (billions), weights as vLLM loads them (GiB, on one GPU and on each of
    the most GPUs tried; 16-bit unless the checkpoint is quantized) and the checkpoint's quantization; Gemma 3's
    sliding-window layers, and the tokens in flight (config's batches in flight x max_num_batched_tokens) where its
    lines bend, and that plus its window; vLLM's budget terms kvlab assumes (GiB); the GPU's memory (GiB), the part vLLM may use (GiB), the GPU
    counts and KV dtypes tried (in words) and the most GPUs tried."""
    sizes = [str(n) for n in validate.non_empty("tensor_parallel_sizes", tensor_parallel_sizes)]
    dtypes = list(validate.non_empty("kv_cache_dtypes", kv_cache_dtypes))
    out = {
        "gpu_gib": get_gpu(gpu_name).memory_gib,
        "max_gpus": max(int(n) for n in sizes),
        "gpu_counts": sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} or {sizes[-1]}",
        "kv_dtypes": " or ".join(dtypes),
        "gpu_memory_utilization": config.cache.gpu_memory_utilization,
        "activation_peak_gib": capacity.ACTIVATION_PEAK_GIB,
        "non_torch_gib": capacity.NON_TORCH_GIB,
        "block_size": config.cache.block_size,
        "batches_in_flight": config.max_concurrent_batches,
        "max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
        "in_flight_tokens": config.max_in_flight_tokens,
    }
    for key, name in EXAMPLES.items():
        spec = get_model(name)
        ratio = capacity.kv_bytes_per_token(spec, config) / ARTICLE_SHAPE.kv_bytes_per_token
        out.update(
            {
                f"{key}_vs_article": ratio,
                f"{key}_vs_article_pct": 100 * ratio,
                f"{key}_heads": spec.num_attention_heads,
                f"{key}_kv_heads": spec.num_kv_heads,
                f"{key}_layers": spec.num_layers,
                f"{key}_sliding_layers": spec.num_sliding_layers,
                f"{key}_global_layers": spec.num_layers - spec.num_sliding_layers,
                f"{key}_window": spec.sliding_window,
                f"{key}_params_b": spec.num_params_b,
                f"{key}_weights_gib": capacity.estimated_weights_gib(spec, "bf16"),
                f"{key}_weights_max_gpus_gib": capacity.estimated_weights_gib(
                    spec, "bf16", config.replace(tensor_parallel_size=out["max_gpus"])
                ),
                f"{key}_quantization": spec.quantization,
            }
        )
    out["usable_gib"] = out["gpu_gib"] * out["gpu_memory_utilization"]
    out["gemma3_beyond_tokens"] = out["in_flight_tokens"] + out["gemma3_window"]
    return out


def model_range(models: pd.DataFrame) -> dict:
    """From model_table: the most and the least KV per token against the article's shape (x), the least as a
    fraction 1/N, and which models they are."""
    ratio = models["vs_article"]
    return {
        "most": float(ratio.max()),
        "least": float(ratio.min()),
        "least_one_in": float(1 / ratio.min()),
        "most_model": ratio.idxmax(),
        "least_model": ratio.idxmin(),
    }


def fp8_range(concurrency: pd.DataFrame) -> dict:
    """fp8 over bf16 maximum concurrency for every model, TP and context where both start: the lowest and highest
    ratio (x), and the ratio in words ("2.00 times", or "1.98 to 2.00 times" where they differ at 2 decimals)."""
    wide = concurrency.pivot_table(
        index=["model", "tensor_parallel_size", "max_model_len"], columns="kv_cache_dtype", values="max_concurrency"
    )
    ratio = (wide["fp8"] / wide["bf16"]).dropna() if {"fp8", "bf16"} <= set(wide.columns) else pd.Series([np.nan])
    low, high = f"{ratio.min():.2f}", f"{ratio.max():.2f}"
    return {
        "fp8_low": float(ratio.min()),
        "fp8_high": float(ratio.max()),
        "fp8_ratio": f"{low} times" if low == high else f"{low} to {high} times",
    }
