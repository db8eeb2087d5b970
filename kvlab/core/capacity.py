"""KV-cache capacity: bytes per token, memory per request, and how many requests fit.

Two accountings: the article's (KV bytes per token x context against GPU memory less the weights)
and vLLM's (per-layer pages, whole blocks of a memory budget, layer groups of hybrid models), the
latter computing what vLLM logs at start-up.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

from kvlab.core import validate
from kvlab.core.config import KV_CACHE_DTYPES, CacheConfig, EngineConfig
from kvlab.core.units import GIB, as_written, cdiv, exact, unit_bytes


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


def bytes_per_request(shape: KVShape, context_tokens: int) -> int | float:
    """KV bytes one request holds at a context length of context_tokens (bytes)."""
    context_tokens = validate.in_range("context_tokens", context_tokens, "tokens")
    return exact(shape.kv_bytes_per_token * context_tokens)


def free_bytes(gpu_memory: float, weights: float, unit: str = "GiB") -> Fraction:
    """Memory left for the KV cache once the weights are loaded (bytes, exact)."""
    validate.in_range("gpu_memory", gpu_memory, "memory_gib")
    validate.non_negative_number("weights", weights)
    if weights >= gpu_memory:
        validate.fail("weights", weights, f"must be below the GPU memory ({gpu_memory:g} {unit})")
    return (Fraction(gpu_memory) - Fraction(weights)) * unit_bytes(unit)


def max_num_requests(free: Fraction | float, request_bytes: Fraction | float) -> int:
    """Requests of request_bytes each that fit in free bytes: floor(free / request_bytes), exact.

    Floats are read as written (0.1 is 1/10), so 61,440 MiB / 2,048 MiB is 30 and not 29.999...
    """
    validate.non_negative_number("free_bytes", float(free))
    validate.positive_number("bytes_per_request", float(request_bytes))
    return math.floor(as_written(free) / as_written(request_bytes))


def capacity(shape: KVShape, gpu_memory: float, weights: float, context_tokens: int, unit: str = "GiB") -> dict:
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

# Bytes per cached value; int8 and int4 add scales (see kv_bytes_per_token_per_layer).
KV_CACHE_DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
WEIGHT_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}

# vLLM's memory budget defaults: activation peak 2.0 GiB and non-torch memory 0.4 GiB are typical of the
# public vLLM logs (1-3 GiB and 0.25-0.45 GiB); pass what your own log says for an exact figure.
GPU_MEMORY_UTILIZATION = CacheConfig().gpu_memory_utilization
ACTIVATION_PEAK_GIB = 2.0
NON_TORCH_GIB = 0.4


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


def page_size_bytes(model, config: EngineConfig = EngineConfig()) -> int:
    """Bytes of one block of one layer on one GPU (vLLM's page_size_bytes)."""
    return int(config.cache.block_size * kv_bytes_per_token_per_layer(
        model, config.cache.kv_cache_dtype, config.parallel.tensor_parallel_size))


def kv_bytes_per_token(model, config: EngineConfig = EngineConfig()) -> int | float:
    """KV bytes per token on one GPU of the stage with the most layers, every layer counted (bytes)."""
    from kvlab.core.models import stage_layers

    layers = max(len(s) for s in stage_layers(model.num_layers, config.parallel.pipeline_parallel_size))
    return exact(layers * kv_bytes_per_token_per_layer(model, config.cache.kv_cache_dtype,
                                                       config.parallel.tensor_parallel_size))


def available_kv_cache_bytes(gpu_memory_gib: float, weights_gib: float,
                             gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                             activation_peak_gib: float = ACTIVATION_PEAK_GIB,
                             non_torch_gib: float = NON_TORCH_GIB) -> float:
    """vLLM's KV budget per GPU: memory x gpu_memory_utilization - weights - activation peak - non-torch (bytes)."""
    return MemoryBudget(gpu_memory_gib, weights_gib, gpu_memory_utilization, activation_peak_gib,
                        non_torch_gib).available_kv_bytes


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory as vLLM splits it: gpu_memory_gib x gpu_memory_utilization, less the weights, the
    activation peak and non-torch memory (NCCL, CUDA context), leaves the KV cache (all GiB)."""

    gpu_memory_gib: float
    weights_gib: float
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    activation_peak_gib: float = ACTIVATION_PEAK_GIB
    non_torch_gib: float = NON_TORCH_GIB

    def __post_init__(self):
        validate.in_range("gpu_memory_gib", self.gpu_memory_gib, "memory_gib")
        validate.non_negative_number("weights_gib", self.weights_gib)
        validate.fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        validate.non_negative_number("activation_peak_gib", self.activation_peak_gib)
        validate.non_negative_number("non_torch_gib", self.non_torch_gib)

    @property
    def usable_gib(self) -> float:
        """gpu_memory_gib x gpu_memory_utilization (GiB)."""
        return self.gpu_memory_gib * self.gpu_memory_utilization

    @property
    def reserved_gib(self) -> float:
        """What vLLM holds before the KV cache: weights + activation peak + non-torch memory (GiB)."""
        return self.weights_gib + self.activation_peak_gib + self.non_torch_gib

    @property
    def available_kv_bytes(self) -> float:
        """KV-cache memory per GPU (bytes; negative when the rest does not fit)."""
        return (self.usable_gib - self.weights_gib - self.activation_peak_gib - self.non_torch_gib) * GIB

    def as_dict(self) -> dict:
        """The budget's settings by name (GiB and the fraction)."""
        return dataclasses.asdict(self)


def estimated_weights_gib(model, weight_dtype: str = "bf16", config: EngineConfig = EngineConfig()) -> float:
    """Weights one GPU holds: parameters x bytes per parameter of weight_dtype / (TP x PP) (GiB)."""
    from kvlab.core.models import weights_bytes_per_gpu

    validate.one_of("weight_dtype", weight_dtype, WEIGHT_DTYPE_BYTES)
    return weights_bytes_per_gpu(model, WEIGHT_DTYPE_BYTES[weight_dtype], config.parallel.tensor_parallel_size,
                                 config.parallel.pipeline_parallel_size) / GIB


def _group_layout(n_full: int, n_sliding: int, hybrid: bool) -> tuple[int, int, int]:
    """(layers per group, full-attention groups, sliding-window groups) of one stage, as vLLM groups them."""
    if n_sliding and n_full and not hybrid:  # vLLM without its hybrid manager: every layer holds every token
        return n_full + n_sliding, 1, 0
    if not n_sliding or not n_full:
        return n_full + n_sliding, int(n_full > 0), int(n_sliding > 0)
    size = min(n_full, n_sliding)  # vLLM pads the last group of a type; the n:1 patterns need no padding
    return size, cdiv(n_full, size), cdiv(n_sliding, size)


def vllm_capacity(model, available_kv_bytes: float | Iterable[float], max_model_len: int,
                  config: EngineConfig = EngineConfig()) -> dict:
    """What vLLM logs for this model and per-GPU KV budget: num_gpu_blocks, GPU KV cache size, max concurrency.

    Uniform models: num_gpu_blocks = floor(available / page_size / layers of the stage), tokens =
    blocks x block_size, concurrency = blocks / ceil(max_model_len / block_size). Models with
    sliding-window and full-attention layers (Gemma 2/3) follow vLLM's hybrid manager: the layers
    form groups of min(#full, #sliding) layers that share one pool of blocks; a sliding-window group
    holds at most ceil(min(window - 1 + max_num_batched_tokens, max_model_len) / block_size) + 1
    blocks of a request. With pipeline parallelism the stage with the fewest blocks binds;
    available_kv_bytes is one budget for every GPU or one per pipeline stage.
    """
    from kvlab.core.models import stage_layers

    pp = config.parallel.pipeline_parallel_size
    budgets = list(available_kv_bytes) if isinstance(available_kv_bytes, Iterable) else [available_kv_bytes] * pp
    if len(budgets) != pp:
        validate.fail("available_kv_bytes", budgets, f"must be one number or one per pipeline stage ({pp})")
    budgets = [validate.non_negative_number("available_kv_bytes", b) for b in budgets]
    max_model_len = validate.in_range("max_model_len", max_model_len, "tokens")
    page = page_size_bytes(model, config)
    bs = config.cache.block_size
    full_blocks = cdiv(max_model_len, bs)
    window_blocks = (cdiv(min(model.sliding_window - 1 + config.scheduler.max_num_batched_tokens, max_model_len), bs)
                     + 1 if model.sliding_window else 0)
    stages = []
    for available, layers in zip(budgets, stage_layers(model.num_layers, pp)):
        n_sliding = sum(model.is_sliding(i) for i in layers)
        size, g_full, g_sliding = _group_layout(len(layers) - n_sliding, n_sliding, config.cache.hybrid_kv_cache)
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


def plan_capacity(model, gpu_memory_gib: float, max_model_len: int, config: EngineConfig = EngineConfig(),
                  weight_bytes_per_param: float = 2, activation_peak_gib: float = ACTIVATION_PEAK_GIB,
                  non_torch_gib: float = NON_TORCH_GIB) -> dict | None:
    """vllm_capacity on one GPU model (config.cache.gpu_memory_utilization of gpu_memory_gib), weights
    estimated from the parameter count; None when no block fits."""
    from kvlab.core.models import weights_bytes_per_gpu

    weights_gib = weights_bytes_per_gpu(model, weight_bytes_per_param, config.parallel.tensor_parallel_size,
                                        config.parallel.pipeline_parallel_size) / GIB
    available = available_kv_cache_bytes(gpu_memory_gib, weights_gib, config.cache.gpu_memory_utilization,
                                         activation_peak_gib, non_torch_gib)
    if available < page_size_bytes(model, config) * model.num_layers:  # less than one block on every layer
        return None
    return vllm_capacity(model, available, max_model_len, config)


PARALLEL_SIZES = (1, 2, 4, 8, 16)
MAX_PIPELINE_SIZE = 16


def _layout_fits(model, budget: MemoryBudget, max_model_len: int, config: EngineConfig, weight_dtype, tp: int,
                 pp: int) -> bool:
    if pp > model.num_layers:
        return False
    try:
        kv_heads_per_gpu(model, tp)
        setting = config.replace(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    except ValueError:
        return False  # this TP does not divide the heads
    if weight_dtype is not None and model.num_params_b > 0:
        weights = estimated_weights_gib(model, weight_dtype, setting)
    else:
        weights = budget.weights_gib / (tp * pp)
    available = dataclasses.replace(budget, weights_gib=weights).available_kv_bytes
    if available < page_size_bytes(model, setting) * model.num_layers:
        return False
    try:
        return vllm_capacity(model, available, max_model_len, setting)["fits_one_request"]
    except ValueError:
        return False


def layouts_that_fit(model, budget: MemoryBudget, max_model_len: int, config: EngineConfig = EngineConfig(),
                     weight_dtype: str | None = "bf16") -> list[tuple[int, int]]:
    """The ways to hold one request of max_model_len on more GPUs, as (tensor_parallel_size, pipeline_parallel_size):
    the smallest tensor parallelism alone, the smallest pipeline parallelism alone, and, when neither alone
    does, the fewest GPUs of both. Empty when up to 16 x 16 GPUs do not.

    With weight_dtype the weights are re-estimated from the parameter count for each layout; with None
    budget.weights_gib is taken as the whole model's weights and divided by TP x PP.
    """
    def fits(tp, pp):
        return _layout_fits(model, budget, max_model_len, config, weight_dtype, tp, pp)

    found = [next(((tp, 1) for tp in PARALLEL_SIZES if fits(tp, 1)), None),
             next(((1, pp) for pp in range(1, MAX_PIPELINE_SIZE + 1) if fits(1, pp)), None)]
    found = [layout for layout in dict.fromkeys(found) if layout is not None]
    if not found:
        both = sorted(((tp, pp) for tp in PARALLEL_SIZES for pp in range(2, MAX_PIPELINE_SIZE + 1)),
                      key=lambda layout: (layout[0] * layout[1], -layout[0]))
        found = [next((layout for layout in both if fits(*layout)), None)]
    return [layout for layout in found if layout is not None]
