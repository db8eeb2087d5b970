"""KV-cache capacity: bytes per token, memory per request, and how many requests fit."""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

import pandas as pd

from kvlab import validate

UNIT_BYTES = {"GiB": 2**30, "GB": 10**9, "MiB": 2**20, "MB": 10**6}


def unit_bytes(unit: str) -> int:
    """Bytes in one unit (GiB = 2^30, GB = 10^9, MiB, MB)."""
    validate.one_of("unit", unit, UNIT_BYTES)
    return UNIT_BYTES[unit]


def exact(x: float | int) -> int | float:
    """An integral float as int (so byte counts print without '.0')."""
    return int(x) if float(x).is_integer() else x


@dataclass(frozen=True)
class KVShape:
    """The per-token KV footprint of a decoder: layers x KV heads x head dim x bytes per value."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: float = 2

    def __post_init__(self):
        validate.positive_int("num_layers", self.num_layers)
        validate.positive_int("num_kv_heads", self.num_kv_heads)
        validate.positive_int("head_dim", self.head_dim)
        validate.positive_number("dtype_bytes", self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int | float:
        """Bytes of K and V for one token over all layers (the factor 2 is K plus V)."""
        return exact(2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes)


ARTICLE_SHAPE = KVShape(num_layers=32, num_kv_heads=32, head_dim=128, dtype_bytes=2)


def bytes_per_request(shape: KVShape, context_tokens: int) -> int | float:
    """KV bytes one request holds at a context length of context_tokens (bytes)."""
    context_tokens = validate.positive_int("context_tokens", context_tokens)
    return exact(shape.kv_bytes_per_token * context_tokens)


def free_bytes(gpu_memory: float, weights: float, unit: str = "GiB") -> Fraction:
    """Memory left for the KV cache once the weights are loaded (bytes, exact)."""
    validate.positive_number("gpu_memory", gpu_memory)
    validate.non_negative_number("weights", weights)
    if weights >= gpu_memory:
        validate.fail("weights", weights, f"must be below the GPU memory ({gpu_memory:g} {unit})")
    return (Fraction(gpu_memory) - Fraction(weights)) * unit_bytes(unit)


def max_num_requests(free: Fraction | float, request_bytes: float) -> int:
    """Requests of request_bytes each that fit in free bytes: floor(free / request_bytes)."""
    validate.non_negative_number("free_bytes", float(free))
    validate.positive_number("bytes_per_request", request_bytes)
    return math.floor(Fraction(free) / Fraction(request_bytes))


def memory_table(
    shape: KVShape, contexts: Iterable[int], concurrency: Iterable[int], unit: str = "GiB"
) -> pd.DataFrame:
    """KV memory (in unit) for each context length, for one request and for each concurrency level."""
    contexts = validate.non_empty("contexts", contexts)
    concurrency = [validate.positive_int("concurrency", c) for c in validate.non_empty("concurrency", concurrency)]
    scale = unit_bytes(unit)
    rows = {}
    for ctx in contexts:
        per = bytes_per_request(shape, ctx)
        rows[ctx] = {f"per_request_{unit.lower()}": per / scale}
        rows[ctx].update({f"{n}_requests_{unit.lower()}": n * per / scale for n in concurrency})
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "context_tokens"
    return table


def fit_table(
    shape: KVShape, gpu_memory: float, weights: float, contexts: Iterable[int], unit: str = "GiB"
) -> pd.DataFrame:
    """Requests that fit in gpu_memory less weights (both in unit), for each context length."""
    contexts = validate.non_empty("contexts", contexts)
    free = free_bytes(gpu_memory, weights, unit)
    table = pd.DataFrame(
        {"max_num_requests": [max_num_requests(free, bytes_per_request(shape, c)) for c in contexts]},
        index=pd.Index(contexts, name="context_tokens"),
    )
    return table


def capacity(
    shape: KVShape, gpu_memory: float, weights: float, context_tokens: int, unit: str = "GiB"
) -> dict:
    """Headline capacity figures for one context length, as plain numbers (bytes and counts)."""
    free = free_bytes(gpu_memory, weights, unit)
    per = bytes_per_request(shape, context_tokens)
    return {
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "bytes_per_request": per,
        "free_bytes": exact(float(free)),
        "max_num_requests": max_num_requests(free, per),
    }


# ================================================================ real models, vLLM's accounting
# Everything below computes what vLLM computes when it sizes its KV cache (vllm/v1/core/kv_cache_utils.py
# and vllm/v1/kv_cache_interface.py): bytes per block and layer (page_size_bytes), whole blocks out
# of the available memory (get_num_blocks), and the two figures it logs, "GPU KV cache size: N tokens"
# and "Maximum concurrency for L tokens per request: X.XXx".

KV_CACHE_DTYPES = ("fp16", "bf16", "fp8", "int8", "int4")
# Bytes per cached value; int8 and int4 add scales (see page_size_bytes).
KV_CACHE_DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
WEIGHT_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
GIB = 2**30


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CacheConfig:
    """vLLM's settings that shape the KV cache (names as vLLM's flags)."""

    block_size: int = 16
    kv_cache_dtype: str = "bf16"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    hybrid_kv_cache: bool = True

    def __post_init__(self):
        validate.positive_int("block_size", self.block_size)
        validate.one_of("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        validate.positive_int("tensor_parallel_size", self.tensor_parallel_size)
        validate.positive_int("pipeline_parallel_size", self.pipeline_parallel_size)
        validate.positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        validate.one_of("hybrid_kv_cache", self.hybrid_kv_cache, [True, False])


def kv_heads_per_gpu(model, tensor_parallel_size: int = 1) -> int:
    """K/V heads one GPU caches: max(1, kv_heads // TP), heads replicated when TP > kv_heads; 1 for MLA."""
    tp = validate.positive_int("tensor_parallel_size", tensor_parallel_size)
    if model.num_attention_heads % tp:
        validate.fail("tensor_parallel_size", tp,
                      f"must divide num_attention_heads ({model.num_attention_heads}) of {model.name}")
    if model.attention == "mla":
        return 1  # the latent is not split by tensor parallelism: every GPU holds all of it
    kv = model.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        validate.fail("tensor_parallel_size", tp,
                      f"must divide num_kv_heads ({kv}) or be a multiple of it ({model.name})")
    return max(1, kv // tp)


def kv_bytes_per_token_per_layer(model, kv_cache_dtype: str = "bf16", tensor_parallel_size: int = 1) -> float:
    """KV bytes one token adds to one layer on one GPU, scales included (vLLM's page size / block size)."""
    validate.one_of("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)
    heads = kv_heads_per_gpu(model, tensor_parallel_size)
    if model.attention == "mla":  # one latent of kv_lora_rank + qk_rope_head_dim values, no K/V factor 2
        if kv_cache_dtype in ("int8", "int4"):
            validate.fail("kv_cache_dtype", kv_cache_dtype, "must be fp16, bf16 or fp8 for mla (as in vLLM)")
        return model.head_dim * KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
    d = model.head_dim
    if kv_cache_dtype == "int4":  # vLLM's nvfp4 layout: d/2 bytes of packed values + d/16 fp8 block scales
        return 2 * heads * (d // 2 + d // 16)
    per_token = 2 * heads * d * KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
    if kv_cache_dtype == "int8":  # vLLM's int8_per_token_head: one fp32 scale per token, head and K/V
        per_token += 2 * heads * 4
    return per_token


def page_size_bytes(model, config: CacheConfig = CacheConfig()) -> int:
    """Bytes of one block of one layer on one GPU (vLLM's page_size_bytes)."""
    return int(config.block_size * kv_bytes_per_token_per_layer(model, config.kv_cache_dtype, config.tensor_parallel_size))


def kv_bytes_per_token(model, config: CacheConfig = CacheConfig()) -> int | float:
    """KV bytes per token on one GPU of the stage with the most layers, every layer counted (bytes)."""
    from kvlab.models import stage_layers

    layers = max(len(s) for s in stage_layers(model.num_layers, config.pipeline_parallel_size))
    return exact(layers * kv_bytes_per_token_per_layer(model, config.kv_cache_dtype, config.tensor_parallel_size))


def available_kv_cache_bytes(gpu_memory_gib: float, weights_gib: float, gpu_memory_utilization: float = 0.9,
                             activation_peak_gib: float = 2.0, non_torch_gib: float = 0.4) -> float:
    """vLLM's KV budget per GPU: memory x gpu_memory_utilization - weights - activation peak - non-torch (bytes).

    Defaults: activation peak 2.0 GiB and non-torch memory 0.4 GiB, typical of the public vLLM logs
    (1-3 GiB and 0.25-0.45 GiB); pass what your own log says for an exact figure.
    """
    total = validate.positive_number("gpu_memory_gib", gpu_memory_gib)
    util = validate.fraction("gpu_memory_utilization", gpu_memory_utilization)
    weights = validate.non_negative_number("weights_gib", weights_gib)
    act = validate.non_negative_number("activation_peak_gib", activation_peak_gib)
    other = validate.non_negative_number("non_torch_gib", non_torch_gib)
    return (total * util - weights - act - other) * GIB


def _group_layout(n_full: int, n_sliding: int, hybrid: bool) -> tuple[int, int, int]:
    """(layers per group, full-attention groups, sliding-window groups) of one stage, as vLLM groups them."""
    if n_sliding and n_full and not hybrid:  # vLLM without its hybrid manager: every layer holds every token
        return n_full + n_sliding, 1, 0
    if not n_sliding or not n_full:
        return n_full + n_sliding, int(n_full > 0), int(n_sliding > 0)
    size = min(n_full, n_sliding)  # vLLM pads the last group of a type; the n:1 patterns need no padding
    return size, _cdiv(n_full, size), _cdiv(n_sliding, size)


def vllm_capacity(model, available_kv_bytes: float | Iterable[float], max_model_len: int,
                  config: CacheConfig = CacheConfig()) -> dict:
    """What vLLM logs for this model and per-GPU KV budget: num_gpu_blocks, GPU KV cache size, max concurrency.

    Uniform models: num_gpu_blocks = floor(available / page_size / layers of the stage), tokens =
    blocks x block_size, concurrency = blocks / ceil(max_model_len / block_size). Models with
    sliding-window and full-attention layers (Gemma 2/3) follow vLLM's hybrid manager: the layers
    form groups of min(#full, #sliding) layers that share one pool of blocks; a sliding-window group
    holds at most ceil(min(window - 1 + max_num_batched_tokens, max_model_len) / block_size) + 1
    blocks of a request. With pipeline parallelism the stage with the fewest blocks binds;
    available_kv_bytes is one budget for every GPU or one per pipeline stage.
    """
    from kvlab.models import stage_layers

    pp = config.pipeline_parallel_size
    budgets = list(available_kv_bytes) if isinstance(available_kv_bytes, Iterable) else [available_kv_bytes] * pp
    if len(budgets) != pp:
        validate.fail("available_kv_bytes", budgets, f"must be one number or one per pipeline stage ({pp})")
    budgets = [validate.non_negative_number("available_kv_bytes", b) for b in budgets]
    max_model_len = validate.positive_int("max_model_len", max_model_len)
    page = page_size_bytes(model, config)
    bs = config.block_size
    full_blocks = _cdiv(max_model_len, bs)
    window_blocks = (_cdiv(min(model.sliding_window - 1 + config.max_num_batched_tokens, max_model_len), bs) + 1
                     if model.sliding_window else 0)
    stages = []
    for available, layers in zip(budgets, stage_layers(model.num_layers, pp)):
        n_sliding = sum(model.is_sliding(i) for i in layers)
        size, g_full, g_sliding = _group_layout(len(layers) - n_sliding, n_sliding, config.hybrid_kv_cache)
        per_request = g_full * full_blocks + g_sliding * window_blocks
        num_blocks = int(available // page // size)
        stages.append((num_blocks, size, g_full + g_sliding, per_request, available))
    num_blocks, size, num_groups, per_request, available = min(stages)
    if num_blocks == 0:
        needed = per_request * page * size
        validate.fail("available_kv_gib", round(available / GIB, 4),
                      f"fits no KV block of {page * size:,} B ({size} layers x {page:,} B); one request of "
                      f"{max_model_len:,} tokens needs {needed / GIB:.2f} GiB, {(needed - available) / GIB:.2f} GiB more")
    return {
        "kv_bytes_per_token": kv_bytes_per_token(model, config),
        "page_size_bytes": page,
        "available_kv_cache_bytes": exact(available),
        "num_kv_cache_groups": num_groups,
        "layers_per_group": size,
        "num_gpu_blocks": num_blocks,
        "gpu_kv_cache_tokens": num_blocks // num_groups * bs,
        "blocks_per_request": per_request,
        "max_model_len": max_model_len,
        "max_concurrency": num_blocks / per_request,
        "fits_one_request": num_blocks >= per_request,
    }


def vllm_log_lines(result: dict) -> list[str]:
    """The lines vLLM prints for a capacity result (its own wording and rounding)."""
    return [
        f"Available KV cache memory: {result['available_kv_cache_bytes'] / GIB:.2f} GiB",
        f"GPU KV cache size: {result['gpu_kv_cache_tokens']:,} tokens",
        f"Maximum concurrency for {result['max_model_len']:,} tokens per request: {result['max_concurrency']:.2f}x",
    ]


# ---------------------------------------------------------------- planner tables (notebook 03, part 2)
def model_table(names: Iterable[str], kv_cache_dtype: str = "bf16") -> pd.DataFrame:
    """Each catalog model's KV shape and KV bytes per token on one GPU, against the article's model."""
    from kvlab.models import get_model

    rows = {}
    for name in validate.non_empty("names", names):
        spec = get_model(name)
        per_token = kv_bytes_per_token(spec, CacheConfig(kv_cache_dtype=kv_cache_dtype))
        rows[spec.name] = {
            "attention": spec.attention, "num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "sliding_layers": spec.num_sliding_layers,
            "sliding_window": spec.sliding_window, "kv_kib_per_token": per_token / 2**10,
            "vs_article": per_token / ARTICLE_SHAPE.kv_bytes_per_token,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table


def plan_capacity(model, gpu_memory_gib: float, max_model_len: int, config: CacheConfig = CacheConfig(),
                  gpu_memory_utilization: float = 0.9, weight_bytes_per_param: float = 2,
                  activation_peak_gib: float = 2.0, non_torch_gib: float = 0.4) -> dict | None:
    """vllm_capacity on one GPU model, weights estimated from the parameter count; None when no block fits."""
    from kvlab.models import weights_bytes_per_gpu

    weights_gib = weights_bytes_per_gpu(model, weight_bytes_per_param, config.tensor_parallel_size,
                                        config.pipeline_parallel_size) / GIB
    available = available_kv_cache_bytes(gpu_memory_gib, weights_gib, gpu_memory_utilization,
                                         activation_peak_gib, non_torch_gib)
    if available < page_size_bytes(model, config) * model.num_layers:  # less than one block on every layer
        return None
    return vllm_capacity(model, available, max_model_len, config)


def concurrency_table(names: Iterable[str], gpu_memory_gib: float, contexts: Iterable[int],
                      kv_cache_dtypes: Iterable[str], tensor_parallel_sizes: Iterable[int],
                      gpu_memory_utilization: float = 0.9, block_size: int = 16) -> pd.DataFrame:
    """vLLM's maximum concurrency for every model x KV dtype x TP x context (NaN where the weights leave no block)."""
    from kvlab.models import get_model

    rows = []
    for name in validate.non_empty("names", names):
        spec = get_model(name)
        for dtype in validate.non_empty("kv_cache_dtypes", kv_cache_dtypes):
            for tp in validate.non_empty("tensor_parallel_sizes", tensor_parallel_sizes):
                config = CacheConfig(block_size=block_size, kv_cache_dtype=dtype, tensor_parallel_size=tp)
                for ctx in validate.non_empty("contexts", contexts):
                    result = plan_capacity(spec, gpu_memory_gib, ctx, config, gpu_memory_utilization)
                    rows.append({"model": spec.name, "kv_cache_dtype": dtype, "tensor_parallel_size": tp,
                                 "max_model_len": ctx,
                                 "max_concurrency": float("nan") if result is None else result["max_concurrency"]})
    return pd.DataFrame(rows)


def vllm_log_table(names: Iterable[str], gpu_memory_gib: float, max_model_len: int,
                   tensor_parallel_sizes: Iterable[int] = (1, 2, 4, 8), kv_cache_dtype: str = "bf16",
                   gpu_memory_utilization: float = 0.9, block_size: int = 16) -> pd.DataFrame:
    """vLLM's log figures per model at the smallest TP whose KV cache holds one request of max_model_len.

    max_model_len is capped, as vLLM caps it, at the model's max_position_embeddings.
    """
    from kvlab.models import get_model

    rows = {}
    for name in validate.non_empty("names", names):
        spec = get_model(name)
        length = min(max_model_len, spec.max_position_embeddings or max_model_len)
        row = {"max_model_len": length, "tensor_parallel_size": float("nan"), "available_kv_gib": float("nan"), "num_gpu_blocks": float("nan"),
               "gpu_kv_cache_tokens": float("nan"), "max_concurrency": float("nan")}
        for tp in validate.non_empty("tensor_parallel_sizes", tensor_parallel_sizes):
            config = CacheConfig(block_size=block_size, kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=tp)
            result = plan_capacity(spec, gpu_memory_gib, length, config, gpu_memory_utilization)
            if result is not None and result["fits_one_request"]:
                row = {"max_model_len": length, "tensor_parallel_size": tp, "available_kv_gib": round(result["available_kv_cache_bytes"] / GIB, 2),
                       "num_gpu_blocks": result["num_gpu_blocks"], "gpu_kv_cache_tokens": result["gpu_kv_cache_tokens"],
                       "max_concurrency": round(result["max_concurrency"], 2)}
                break
        rows[spec.name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table.astype({c: "Int64" for c in ("tensor_parallel_size", "num_gpu_blocks", "gpu_kv_cache_tokens")})
