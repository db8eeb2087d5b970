"""KV-cache capacity: bytes per token, memory per request, and how many requests fit.

Two accountings: the article's (KV bytes per token x context against GPU memory less the weights)
and vLLM's (per-layer pages, whole blocks of a memory budget, layer groups of hybrid models), the
latter computing what vLLM logs at start-up.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from kvlab.core import validate
from kvlab.core.config import ATTENTION_BACKENDS, KV_CACHE_DTYPES, CacheConfig, EngineConfig
from kvlab.core.models import stage_layers, weights_bytes_per_gpu
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
# Everything below computes what vLLM 0.33 computes when it sizes its KV cache (vllm/v1/kv_cache_interface.py,
# vllm/v1/core/kv_cache_planning.py, vllm/v1/core/kv_cache_utils.py): bytes per block and layer
# (page_size_bytes), the layer groups, whole blocks out of the available memory, the check that one request
# fits, and the figures it logs, "GPU KV cache size: N tokens, Maximum concurrency for L tokens per request:
# X.XXx". scripts/parity/compare_capacity.py (make parity) checks it against vLLM's own code.

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
        validate.fail(
            "tensor_parallel_size", tp, f"must divide num_attention_heads ({model.num_attention_heads}) of {model.name}"
        )
    if model.attention == "mla":
        return 1  # the latent is not split by tensor parallelism: every GPU holds all of it
    kv = model.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        validate.fail(
            "tensor_parallel_size", tp, f"must divide num_kv_heads ({kv}) or be a multiple of it ({model.name})"
        )
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
    return int(
        config.cache.block_size
        * kv_bytes_per_token_per_layer(model, config.cache.kv_cache_dtype, config.parallel.tensor_parallel_size)
    )


def kv_bytes_per_token(model, config: EngineConfig = EngineConfig()) -> int | float:
    """KV bytes per token on one GPU of the stage with the most layers, every layer counted (bytes)."""
    layers = max(len(s) for s in stage_layers(model.num_layers, config.parallel.pipeline_parallel_size))
    return exact(
        layers * kv_bytes_per_token_per_layer(model, config.cache.kv_cache_dtype, config.parallel.tensor_parallel_size)
    )


def available_kv_cache_bytes(
    gpu_memory_gib: float,
    weights_gib: float,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    activation_peak_gib: float = ACTIVATION_PEAK_GIB,
    non_torch_gib: float = NON_TORCH_GIB,
) -> float:
    """vLLM's KV budget per GPU: memory x gpu_memory_utilization - weights - activation peak - non-torch (bytes)."""
    return MemoryBudget(
        gpu_memory_gib, weights_gib, gpu_memory_utilization, activation_peak_gib, non_torch_gib
    ).available_kv_bytes


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
    """Weights one GPU holds: parameters x bytes per parameter of weight_dtype / (TP x PP), the routed experts
    / (DP x TP x PP), or a quantized model's (model.quantization) as vLLM loads them (GiB;
    kvlab.core.models.weights_bytes_per_gpu)."""
    validate.one_of("weight_dtype", weight_dtype, WEIGHT_DTYPE_BYTES)
    if model.quantization and WEIGHT_DTYPE_BYTES[weight_dtype] != 2:
        validate.fail(
            "weight_dtype",
            weight_dtype,
            f"must be bf16 or fp16 for {model.name}: its {model.quantization} weights are sized as vLLM loads them",
        )
    return weights_bytes_per_gpu(model, WEIGHT_DTYPE_BYTES[weight_dtype], *_split(config)) / GIB


def check_expert_parallel(model, config: EngineConfig) -> None:
    """Refuse enable_expert_parallel for a model without routed experts (vLLM refuses it too) and on one GPU (where
    vLLM runs no expert parallelism)."""
    parallel = config.parallel
    if not parallel.enable_expert_parallel:
        return
    if model.expert_params_b <= 0:
        validate.fail(
            "enable_expert_parallel",
            True,
            f"only a mixture-of-experts model's experts are split, and {model.name} has none (vLLM refuses it: "
            "'Number of experts in the model must be greater than 0'): drop --enable-expert-parallel",
        )
    if parallel.data_parallel_size * parallel.tensor_parallel_size == 1:
        validate.fail(
            "enable_expert_parallel",
            True,
            "the experts are split over DP x TP GPUs, and there is one (vLLM runs no expert parallelism then): set "
            "--data-parallel-size or --tensor-parallel-size above 1, or drop it",
        )


def _split(config: EngineConfig) -> tuple[int, int, int, bool]:
    """(TP, PP, DP, expert parallelism) of config: how weights_bytes_per_gpu splits a model."""
    p = config.parallel
    return p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size, p.enable_expert_parallel


def format_gib(num_bytes: float) -> str:
    """Bytes as vLLM prints GiB in its logs and errors: str(round(bytes / 2^30, 2)), e.g. 6.51, 0.5, 12.0."""
    return f"{round(num_bytes / GIB, 2)}"


def sliding_window_block_size(block_size: int, attention_backend: str) -> int:
    """Tokens per block of a sliding-window layer: the largest kernel block the backend offers within block_size
    tokens, else its smallest (vLLM's _largest_kernel_block_within); full-attention layers keep block_size."""
    sizes = ATTENTION_BACKENDS[attention_backend]
    offered = list(sizes) if isinstance(sizes, tuple) else [max(sizes, block_size // sizes * sizes)]
    within = [b for b in offered if b <= block_size]
    return max(within) if within else min(offered)


# Mamba (linear attention) layers: a request's state, not its tokens, sized as vLLM sizes it (MambaSpec).
MAMBA_STATE_DTYPE_BYTES = 2  # vLLM's mamba_cache_dtype "auto": the model's dtype, bf16 for every catalog model
# On a Hopper GPU vLLM's Gated DeltaNet prefill runs FlashInfer's kernel (qwen_gdn_linear_attn.py,
# _resolve_gdn_prefill_backend), which exports a prefill checkpoint every 64 tokens in mamba_cache_mode "align"
# (FLASHINFER_GDN_CHECKPOINT_ALIGNMENT): the attention block size becomes a multiple of it, and each Mamba group
# holds one more block a request (MambaSpec.num_prefill_checkpoint_blocks).
GDN_CHECKPOINT_ALIGNMENT_TOKENS = 64


def mamba_cache_mode(config: EngineConfig = EngineConfig()) -> str:
    """vLLM's mamba_cache_mode (MambaModelConfig.verify_and_update_config): "align" with prefix caching (a state a
    block of the attention block size), "none" without (one state a request, in a block of max_model_len tokens)."""
    return "align" if config.cache.enable_prefix_caching else "none"


def mamba_state_shapes(model, tensor_parallel_size: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A Gated DeltaNet layer's state on one GPU, (conv state, temporal state) (vLLM's MambaStateShapeCalculator.
    gated_delta_net_state_shape): (conv_dim / TP, kernel - 1) with conv_dim = 2 x key heads x key dim + value heads
    x value dim, and (value heads / TP, value dim, key dim)."""
    tp = validate.positive_int("tensor_parallel_size", tensor_parallel_size)
    conv_dim = 2 * model.linear_num_key_heads * model.linear_key_head_dim
    conv_dim += model.linear_num_value_heads * model.linear_value_head_dim
    if conv_dim % tp or model.linear_num_value_heads % tp:
        validate.fail(
            "tensor_parallel_size",
            tp,
            f"must divide {model.name}'s linear-attention conv dim ({conv_dim}) and value heads "
            f"({model.linear_num_value_heads})",
        )
    return (conv_dim // tp, model.linear_conv_kernel_dim - 1), (
        model.linear_num_value_heads // tp,
        model.linear_value_head_dim,
        model.linear_key_head_dim,
    )


def mamba_page_size_bytes(model, config: EngineConfig = EngineConfig()) -> int:
    """Bytes of one Mamba layer's state on one GPU before padding (vLLM's MambaSpec.page_size_bytes); 0 for a model
    without linear-attention layers."""
    if not model.linear_num_key_heads:
        return 0
    shapes = mamba_state_shapes(model, config.parallel.tensor_parallel_size)
    return sum(math.prod(shape) for shape in shapes) * MAMBA_STATE_DTYPE_BYTES


def attention_block_size(model, config: EngineConfig = EngineConfig()) -> int:
    """Tokens per block of the attention layers: block_size, raised for a model with Mamba layers until one
    attention page holds a Mamba state (vLLM's Platform._align_hybrid_block_size): the smallest multiple of the
    backend's kernel block (at least block_size; and of the prefill checkpoint grid in mamba_cache_mode "align")
    whose page covers the state."""
    bs = config.cache.block_size
    state = mamba_page_size_bytes(model, config)
    if not state:
        return bs
    sizes = ATTENTION_BACKENDS[config.cache.backend]
    kernel = min(sizes) if isinstance(sizes, tuple) else sizes
    alignment = max(kernel, bs)
    if mamba_cache_mode(config) == "align":
        alignment = math.lcm(alignment, GDN_CHECKPOINT_ALIGNMENT_TOKENS)
    per_token = int(
        kv_bytes_per_token_per_layer(model, config.cache.kv_cache_dtype, config.parallel.tensor_parallel_size)
    )
    raised = alignment * cdiv(state, alignment * per_token)
    return max(bs, kernel * cdiv(raised, kernel))


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table (vLLM's KVCacheGroupSpec): their kind, tokens per block, layer indices."""

    kind: str  # "full_attention" (MLA included), "sliding_attention", "chunked_local_attention" or "mamba"
    block_size: int  # tokens a block (a Mamba group's: max_model_len in mamba_cache_mode "none")
    layers: tuple[int, ...]
    sliding_window: int = 0  # tokens a sliding-window layer attends to (its own included); 0 for the other kinds
    attention_chunk_size: int = 0  # tokens of a chunked-local-attention layer's chunks; 0 for the other kinds
    mamba_cache_mode: str = "none"  # a Mamba group's: "align" with prefix caching, "none" without
    num_prefill_checkpoint_blocks: int = 0  # a Mamba group's blocks for a prefill checkpoint (align mode, Hopper)
    # the tokens a prefill checkpoint's offset is a multiple of (MambaSpec.prefill_checkpoint_alignment, vLLM's
    # get_mamba_prefill_checkpoint_grid: the Mamba block size); 0: the group's block size
    prefill_checkpoint_alignment: int = 0

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request of max_model_len tokens holds (cdiv of vLLM's max_memory_usage_bytes by the page):
        every token for full attention; the window less one, the tokens in flight and a partly used first
        block for a sliding window (vLLM's SlidingWindowSpec.max_admission_blocks_per_request); a chunk and the
        tokens in flight for chunked local attention (ChunkedLocalAttentionSpec's); for Mamba layers (MambaSpec)
        one state in mamba_cache_mode "none", two and the prefill checkpoints' in "align"."""
        if self.kind == "full_attention":
            return cdiv(max_model_len, self.block_size)
        if self.kind == "mamba":
            return 1 if self.mamba_cache_mode == "none" else 2 + self.num_prefill_checkpoint_blocks
        if self.kind == "chunked_local_attention":
            return cdiv(min(self.attention_chunk_size + max_in_flight_tokens, max_model_len), self.block_size)
        return cdiv(min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len), self.block_size) + 1


# A layer type of config.json (ModelSpec.layer_type) -> the kind of its KV cache group.
GROUP_KINDS = {
    "full_attention": "full_attention",
    "sliding_attention": "sliding_attention",
    "chunked_attention": "chunked_local_attention",
    "linear_attention": "mamba",
}


def kv_cache_groups(model, config: EngineConfig = EngineConfig()) -> list[KVCacheGroup]:
    """The whole model's layers grouped once, as vLLM's get_kv_cache_groups groups every worker's layers.

    Without the hybrid manager a model with full attention beside windows or chunks holds every token on every
    layer (one group; vLLM refuses it for Mamba layers). Otherwise layers of one kind form a bucket (in the order
    of their first layer); the group size is the smallest bucket's, or the largest's when that is under 1.5 times
    the smallest; a bucket of n layers makes cdiv(n, size) groups, group i taking every cdiv(n, size)-th layer from
    layer i, so that pipeline stages share groups evenly. Pages of the attention kinds are made equal by raising
    the smaller page's block size; a Mamba state is padded to the attention page (attention_block_size)."""
    kinds = [GROUP_KINDS[model.layer_type(i)] for i in range(model.num_layers)]
    if not config.cache.hybrid_kv_cache and "mamba" in kinds:
        validate.fail(
            "hybrid_kv_cache",
            False,
            f"{model.name}'s Mamba layers need vLLM's hybrid KV-cache manager (vLLM refuses: 'Failed to promote "
            "local KV cache specs to one unified type'): drop --disable-hybrid-kv-cache-manager",
        )
    if not config.cache.hybrid_kv_cache and "full_attention" in kinds:  # unify_hybrid_kv_cache_specs
        kinds = ["full_attention"] * model.num_layers
    buckets: dict[str, list[int]] = {}
    for i, kind in enumerate(kinds):
        buckets.setdefault(kind, []).append(i)
    bs = attention_block_size(model, config)
    mode = mamba_cache_mode(config)
    max_model_len = config.scheduler.max_model_len or model.max_position_embeddings
    blocks = {
        "full_attention": bs,
        "chunked_local_attention": bs,
        "sliding_attention": sliding_window_block_size(bs, config.cache.backend),
    }
    attention = {kind: blocks[kind] for kind in buckets if kind != "mamba"}
    if len(attention) > 1:  # unify_kv_cache_spec_page_size: a page that divides the largest grows its block
        largest = max(attention.values())
        blocks = {kind: largest if largest % b == 0 else b for kind, b in blocks.items()}  # else it is padded
    blocks["mamba"] = bs if mode == "align" else max_model_len
    sizes = [len(layers) for layers in buckets.values()]
    size = max(sizes) if max(sizes) < 1.5 * min(sizes) else min(sizes)
    local = {
        "sliding_attention": {"sliding_window": model.sliding_window},
        "chunked_local_attention": {"attention_chunk_size": model.attention_chunk_size},
        "mamba": {
            "mamba_cache_mode": mode,
            "num_prefill_checkpoint_blocks": int(mode == "align"),
            "prefill_checkpoint_alignment": blocks["mamba"] if mode == "align" else 0,
        },
    }
    return [
        KVCacheGroup(kind, blocks[kind], tuple(layers[i::n]), **local.get(kind, {}))
        for kind, layers in buckets.items()
        for n in [cdiv(len(layers), size)]
        for i in range(n)
    ]


def engine_kv_cache_groups(model, config: EngineConfig = EngineConfig()) -> list[KVCacheGroup] | None:
    """The KV cache groups kvlab's engine serves the model over (kv_cache_groups), or None where that is one
    full-attention group, which the engine serves as a plain decoder."""
    groups = kv_cache_groups(model, config)
    return None if len(groups) == 1 and groups[0].kind == "full_attention" else groups


def _estimated_max_model_len(groups, model, config: EngineConfig, max_model_len: int, blocks: int) -> int:
    """The longest max_model_len whose request needs at most blocks blocks, 0 if none (vLLM's binary search)."""

    def needed(length: int) -> int:
        return sum(g.blocks_per_request(length, config.max_in_flight_tokens) for g in groups)

    return bisect.bisect_right(range(1, max_model_len + 1), blocks, key=needed)


def vllm_capacity(
    model,
    available_kv_bytes: float | Iterable[float],
    max_model_len: int,
    config: EngineConfig = EngineConfig(),
    groups: list[KVCacheGroup] | None = None,
) -> dict:
    """What vLLM 0.33 computes at start-up for this model and per-GPU KV budget (vllm/v1/core/kv_cache_planning.py
    get_kv_cache_configs, kv_cache_utils.py get_kv_cache_capacity), in the order vllm/v1/engine/core.py calls it.

    The layers are grouped once for the whole model (kv_cache_groups). Each pipeline stage's block holds, per
    layer, one page of block_size tokens x KV bytes per token and layer, times the largest number of one
    group's layers on that stage; num_gpu_blocks = min over stages of floor(available / bytes per block).
    One request of max_model_len needs R = the sum over groups of their blocks_per_request, where a
    sliding-window group keeps window - 1 + max_in_flight_tokens tokens, (PP + 1) x max_num_batched_tokens
    with async scheduling (vLLM's default), PP x without. vLLM starts only if every stage holds R blocks after
    keeping one block back for its null block, so exactly one request's memory is refused; the refusal gives
    vLLM's reason in kvlab's words. max_concurrency = num_gpu_blocks / R and "GPU KV cache size" =
    int(max_concurrency x max_model_len) tokens, which is num_gpu_blocks x block_size only for one
    full-attention group with max_model_len a multiple of block_size. available_kv_bytes is one budget for
    every GPU or one per pipeline stage (bytes, floored to whole bytes as vLLM's are). groups: the model's
    kv_cache_groups at config and max_model_len where the caller has them already (default: grouped here).
    """
    pp = config.parallel.pipeline_parallel_size
    budgets = list(available_kv_bytes) if isinstance(available_kv_bytes, Iterable) else [available_kv_bytes] * pp
    if len(budgets) != pp:
        validate.fail("available_kv_bytes", budgets, f"must be one number or one per pipeline stage ({pp})")
    budgets = [math.floor(validate.non_negative_number("available_kv_bytes", b)) for b in budgets]
    max_model_len = validate.in_range("max_model_len", max_model_len, "tokens")
    if groups is None:
        groups = kv_cache_groups(model, config.replace(max_model_len=max_model_len))
    page = max(g.block_size for g in groups if g.kind != "mamba") * int(
        kv_bytes_per_token_per_layer(model, config.cache.kv_cache_dtype, config.parallel.tensor_parallel_size)
    )
    per_request = sum(g.blocks_per_request(max_model_len, config.max_in_flight_tokens) for g in groups)
    stages, refusal, estimate = [], None, None
    for s, layers in enumerate(stage_layers(model.num_layers, pp)):
        available = budgets[s]
        bytes_per_block = page * max(sum(i in layers for i in g.layers) for g in groups)
        stages.append((available // bytes_per_block, bytes_per_block, available))
        check = available - bytes_per_block  # vLLM keeps one block back: the block pool's null block
        where = f" on pipeline stage {s}" if pp > 1 else ""
        if refusal is None and check <= 0:
            refusal = (
                f"no KV-cache memory is left{where} once vLLM keeps one block of {bytes_per_block:,} B back "
                f"({available:,} B available)"
            )
        elif refusal is None and per_request * bytes_per_block > check:
            estimate = _estimated_max_model_len(groups, model, config, max_model_len, check // bytes_per_block)
            refusal = (
                f"one request of {max_model_len:,} tokens needs {format_gib(per_request * bytes_per_block)} GiB"
                f" of KV cache ({per_request:,} blocks of {bytes_per_block:,} B), more than the "
                f"{format_gib(check)} GiB{where} left once vLLM keeps one block back"
                + (f"; the longest max_model_len that fits is {estimate:,} tokens" if estimate else "")
            )
    num_blocks, bytes_per_block, available = min(stages)
    return {
        "kv_bytes_per_token": kv_bytes_per_token(model, config),
        "page_size_bytes": page,
        "available_kv_cache_bytes": available,
        "num_kv_cache_groups": len(groups),
        "layers_per_group": bytes_per_block // page,
        "bytes_per_block": bytes_per_block,
        "max_in_flight_tokens": config.max_in_flight_tokens,
        "num_gpu_blocks": num_blocks,
        "gpu_kv_cache_tokens": int(num_blocks / per_request * max_model_len),
        "blocks_per_request": per_request,
        "max_model_len": max_model_len,
        "max_concurrency": num_blocks / per_request,
        "starts": refusal is None,
        "refusal": refusal,
        "estimated_max_model_len": estimate,
    }


def vllm_log_lines(result: dict) -> list[str]:
    """The lines vLLM 0.33 prints for a capacity result (its wording and rounding); none of the second when
    it refuses to start."""
    lines = [f"Available KV cache memory: {format_gib(result['available_kv_cache_bytes'])} GiB"]
    if result["starts"]:
        lines.append(
            f"GPU KV cache size: {result['gpu_kv_cache_tokens']:,} tokens, Maximum concurrency for "
            f"{result['max_model_len']:,} tokens per request: {result['max_concurrency']:.2f}x"
        )
    return lines


def plan_capacity(
    model,
    gpu_memory_gib: float,
    max_model_len: int,
    config: EngineConfig = EngineConfig(),
    weight_bytes_per_param: float = 2,
    activation_peak_gib: float = ACTIVATION_PEAK_GIB,
    non_torch_gib: float = NON_TORCH_GIB,
    groups: list[KVCacheGroup] | None = None,
) -> dict | None:
    """vllm_capacity on one GPU model (config.cache.gpu_memory_utilization of gpu_memory_gib), weights
    estimated from the parameter count; None when no block fits. groups: as vllm_capacity takes them."""
    weights_gib = weights_bytes_per_gpu(model, weight_bytes_per_param, *_split(config)) / GIB
    available = available_kv_cache_bytes(
        gpu_memory_gib, weights_gib, config.cache.gpu_memory_utilization, activation_peak_gib, non_torch_gib
    )
    result = vllm_capacity(model, max(available, 0), max_model_len, config, groups)
    return result if result["num_gpu_blocks"] else None


PARALLEL_SIZES = (1, 2, 4, 8, 16)
MAX_PIPELINE_SIZE = 16


def _layout_fits(
    model, budget: MemoryBudget, max_model_len: int, config: EngineConfig, weight_dtype, tp: int, pp: int
) -> bool:
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
    return available > 0 and vllm_capacity(model, available, max_model_len, setting)["starts"]


def layouts_that_fit(
    model,
    budget: MemoryBudget,
    max_model_len: int,
    config: EngineConfig = EngineConfig(),
    weight_dtype: str | None = "bf16",
) -> list[tuple[int, int]]:
    """The ways to hold one request of max_model_len on more GPUs, as (tensor_parallel_size, pipeline_parallel_size):
    the smallest tensor parallelism alone, the smallest pipeline parallelism alone, and, when neither alone
    does, the fewest GPUs of both. Empty when up to 16 x 16 GPUs do not.

    With weight_dtype the weights are re-estimated from the parameter count for each layout; with None
    budget.weights_gib is taken as the whole model's weights and divided by TP x PP.
    """

    def fits(tp, pp):
        return _layout_fits(model, budget, max_model_len, config, weight_dtype, tp, pp)

    found = [
        next(((tp, 1) for tp in PARALLEL_SIZES if fits(tp, 1)), None),
        next(((1, pp) for pp in range(1, MAX_PIPELINE_SIZE + 1) if fits(1, pp)), None),
    ]
    found = [layout for layout in dict.fromkeys(found) if layout is not None]
    if not found:
        both = sorted(
            ((tp, pp) for tp in PARALLEL_SIZES for pp in range(2, MAX_PIPELINE_SIZE + 1)),
            key=lambda layout: (layout[0] * layout[1], -layout[0]),
        )
        found = [next((layout for layout in both if fits(*layout)), None)]
    return [layout for layout in found if layout is not None]
