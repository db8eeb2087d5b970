"""Config objects in vLLM's vocabulary, passed whole: the KV cache, parallelism and the scheduler.

Each is a frozen dataclass validated on construction (a ValueError naming the field, the value and
what is allowed). Defaults are vLLM 0.33's where vLLM has one; the article's settings are built
from kvlab.core.article where a section reproduces the article.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvlab.core import validate

KV_CACHE_DTYPES = ("fp16", "bf16", "fp8", "int8", "int4")
# The kernel block sizes vLLM's attention backends declare on a Hopper GPU (get_supported_kernel_block_sizes):
# an int n is "any multiple of n tokens" (MultipleOf(n)), a tuple the sizes offered. Only sliding-window
# layers read them (kvlab.core.capacity.sliding_window_block_size).
# The scheduler policies the engine runs (SchedulerConfig.scheduler_cls).
SCHEDULER_CLASSES = {
    "v1": "vLLM 0.33's v1 scheduler: prefill chunks and decodes share one token budget per step",
    "v0-2023": "vLLM 0.1.4's scheduler (mid-2023, the vLLM paper's): prompt-only steps, a watermark, recompute",
}
ATTENTION_BACKENDS = {
    "FLASH_ATTN": 16,
    "TRITON_ATTN": 16,
    "FLEX_ATTENTION": 16,
    "FLASHINFER": (16, 32, 64),
    "CPU_ATTN": 32,
}
# vLLM 0.33's command-line flag of each setting kvlab names as vLLM does (vllm/engine/arg_utils.py EngineArgs; the
# closed loop's is vLLM bench's): the one place a flag's vLLM name is written. kvlab's parsers, the flag names in its
# one-line errors and the `vllm serve` lines it prints (serve_flag) are made from it.
VLLM_FLAGS = {
    "model": "--model",
    "quantization": "--quantization",
    "block_size": "--block-size",
    "kv_cache_dtype": "--kv-cache-dtype",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "enable_prefix_caching": "--enable-prefix-caching",
    "disable_hybrid_kv_cache_manager": "--disable-hybrid-kv-cache-manager",
    "attention_backend": "--attention-backend",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "enable_expert_parallel": "--enable-expert-parallel",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "async_scheduling": "--async-scheduling",
    "max_concurrency": "--max-concurrency",
}
# kvlab's KV cache dtypes in vLLM 0.33's --kv-cache-dtype names (vllm/config/cache.py CacheDType).
VLLM_KV_CACHE_DTYPES = {
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8": "fp8",
    "int8": "int8_per_token_head",
    "int4": "nvfp4",
}


def serve_flag(name: str, value) -> str:
    """A setting as `vllm serve` takes it (VLLM_FLAGS): --flag value, a boolean as --flag or --no-flag (vLLM's
    BooleanOptionalAction), a share as 0.9, the KV cache dtype in vLLM's name."""
    flag = VLLM_FLAGS[name]
    if isinstance(value, bool):
        return flag if value else "--no-" + flag.removeprefix("--")
    if name == "kv_cache_dtype":
        value = VLLM_KV_CACHE_DTYPES[value]
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


@dataclass(frozen=True)
class CacheConfig:
    """vLLM's settings that shape the KV cache: block size, cache dtype, the hybrid manager, prefix caching, and
    the attention backend (None: the one vLLM picks on an H100 for the cache dtype: FLASHINFER for int4, vLLM's
    nvfp4; TRITON_ATTN for int8, vLLM's int8_per_token_head; FLASH_ATTN otherwise)."""

    block_size: int = 16
    kv_cache_dtype: str = "bf16"
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory vLLM may use
    hybrid_kv_cache: bool = True  # vLLM's hybrid KV-cache manager (off: --disable-hybrid-kv-cache-manager)
    enable_prefix_caching: bool = False
    attention_backend: str | None = None  # vLLM's --attention-backend

    @property
    def backend(self) -> str:
        """The attention backend in use: attention_backend, else vLLM's pick on an H100 for kv_cache_dtype."""
        return self.attention_backend or {"int4": "FLASHINFER", "int8": "TRITON_ATTN"}.get(
            self.kv_cache_dtype, "FLASH_ATTN"
        )

    def __post_init__(self):
        validate.in_range("block_size", self.block_size, "block_size")
        validate.one_of("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        validate.fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        validate.one_of("hybrid_kv_cache", self.hybrid_kv_cache, [True, False])
        validate.one_of("enable_prefix_caching", self.enable_prefix_caching, [True, False])
        validate.one_of("attention_backend", self.attention_backend, [None, *ATTENTION_BACKENDS])


@dataclass(frozen=True)
class ParallelConfig:
    """GPUs per model replica: tensor parallelism splits each layer, pipeline parallelism splits the layers; data
    parallelism runs data_parallel_size engine cores (ranks, each with its own scheduler and KV cache, attention
    replicated) over whose GPUs vLLM splits a mixture-of-experts model's experts, as slices of every expert, or
    whole experts with enable_expert_parallel (vLLM's --data-parallel-size, --enable-expert-parallel)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False

    def __post_init__(self):
        validate.positive_int("tensor_parallel_size", self.tensor_parallel_size)
        validate.positive_int("pipeline_parallel_size", self.pipeline_parallel_size)
        validate.positive_int("data_parallel_size", self.data_parallel_size)
        validate.one_of("enable_expert_parallel", self.enable_expert_parallel, [True, False])

    @property
    def world_size(self) -> int:
        """GPUs in all: DP x TP x PP."""
        return self.data_parallel_size * self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class SchedulerConfig:
    """vLLM's scheduler settings: requests running at once, tokens per step, the longest request, chunked
    prefill and its per-request cap, whether the next step is scheduled before this one's tokens are known, and
    which scheduler decides (scheduler_cls, SCHEDULER_CLASSES)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: the model's own (max_position_embeddings)
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: no cap on one request's prefill chunk
    async_scheduling: bool = True  # vLLM 0.33's default on a GPU
    scheduler_cls: str = (
        "v1"  # "v1" (vLLM 0.33) or "v0-2023" (vLLM 0.1.4, mid-2023: section 6's model of the paper's system)
    )

    def __post_init__(self):
        validate.in_range("max_num_seqs", self.max_num_seqs, "max_num_seqs")
        validate.in_range("max_num_batched_tokens", self.max_num_batched_tokens, "tokens")
        if self.max_model_len is not None:
            validate.in_range("max_model_len", self.max_model_len, "tokens")
        validate.one_of("enable_chunked_prefill", self.enable_chunked_prefill, [True, False])
        validate.non_negative_int("long_prefill_token_threshold", self.long_prefill_token_threshold)
        validate.one_of("async_scheduling", self.async_scheduling, [True, False])
        validate.one_of("scheduler_cls", self.scheduler_cls, SCHEDULER_CLASSES)
        if self.scheduler_cls == "v0-2023":
            for name, value, fix in (
                ("async_scheduling", self.async_scheduling, "async_scheduling=False"),
                ("enable_chunked_prefill", self.enable_chunked_prefill, "enable_chunked_prefill=False"),
                ("long_prefill_token_threshold", self.long_prefill_token_threshold, "long_prefill_token_threshold=0"),
            ):
                if value:
                    validate.fail(name, value, f"scheduler_cls='v0-2023' (vLLM 0.1.4) had no such mode: set {fix}")


@dataclass(frozen=True)
class EngineConfig:
    """The settings vLLM sizes its KV cache and schedules by, whole (the parts of vLLM's VllmConfig kvlab models)."""

    cache: CacheConfig = CacheConfig()
    parallel: ParallelConfig = ParallelConfig()
    scheduler: SchedulerConfig = SchedulerConfig()

    def __post_init__(self):
        for name, kind in (("cache", CacheConfig), ("parallel", ParallelConfig), ("scheduler", SchedulerConfig)):
            if not isinstance(getattr(self, name), kind):
                validate.fail(name, getattr(self, name), f"must be a kvlab.core.config.{kind.__name__}")
        if self.scheduler.scheduler_cls == "v0-2023" and self.cache.enable_prefix_caching:
            validate.fail(
                "enable_prefix_caching",
                True,
                "scheduler_cls='v0-2023' (vLLM 0.1.4) had no prefix cache: set enable_prefix_caching=False",
            )

    @property
    def max_concurrent_batches(self) -> int:
        """Batches in flight at once (vLLM's VllmConfig.max_concurrent_batches with its V2 model runner, the
        default): one per pipeline stage, and one more when the next step is scheduled asynchronously."""
        return self.parallel.pipeline_parallel_size + self.scheduler.async_scheduling

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled: max_num_batched_tokens per batch in flight (vLLM's name)."""
        return self.max_concurrent_batches * self.scheduler.max_num_batched_tokens

    def replace(self, **changes) -> EngineConfig:
        """A copy with settings changed by their vLLM names, whichever part holds them
        (e.g. replace(kv_cache_dtype="fp8", tensor_parallel_size=2))."""
        parts = {name: getattr(self, name) for name in ("cache", "parallel", "scheduler")}
        updates: dict[str, dict] = {name: {} for name in parts}
        for key, value in changes.items():
            owner = next(
                (name for name, part in parts.items() if key in {f.name for f in dataclasses.fields(part)}), None
            )
            if owner is None:
                known = sorted(f.name for part in parts.values() for f in dataclasses.fields(part))
                validate.fail(key, value, "is not a setting of the engine; settings: " + ", ".join(known))
            updates[owner][key] = value
        return EngineConfig(
            **{
                name: dataclasses.replace(part, **updates[name]) if updates[name] else part
                for name, part in parts.items()
            }
        )
