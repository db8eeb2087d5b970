"""The engine's KV pool, num_gpu_blocks (vLLM's null block included), when it is not given: a model on a GPU as
vLLM sizes it (kvlab.core.capacity.plan_capacity), else the article's KV memory."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core import article, capacity, models, validate
from kvlab.core.config import EngineConfig
from kvlab.core.models import GpuSpec, ModelSpec

# The article's KV memory, 60 GiB at 0.5 MiB per token, in tokens.
ARTICLE_KV_TOKENS = int(article.MEMORY_GIB * 1024 / article.MIB_PER_TOKEN)


@dataclass(frozen=True)
class GpuKVPool:
    """The pool vLLM sizes for a model on a GPU: num_gpu_blocks (vLLM's null block included; 0: no block fits),
    where it comes from in words, and why vLLM would not start with it (vLLM's reason in kvlab's words; None: it
    starts)."""

    num_gpu_blocks: int
    source: str
    refusal: str | None


def gpu_kv_pool(config: EngineConfig, model: ModelSpec, gpu: GpuSpec, groups=None) -> GpuKVPool:
    """The pool of model on gpu at config's max_model_len, in blocks of its KV cache groups' page (groups: the
    model's kvlab.core.capacity.kv_cache_groups at config, where the caller has them already)."""
    planned = capacity.plan_capacity(model, gpu.memory_gib, config.scheduler.max_model_len, config, groups=groups)
    source = f"{model.name} on {gpu.name} as vLLM sizes it"
    if planned is None:
        return GpuKVPool(0, source, "no KV-cache memory is left after the weights")
    return GpuKVPool(planned["num_gpu_blocks"], source, planned["refusal"])


def size_kv_pool(
    config: EngineConfig, model: ModelSpec | None = None, gpu: str | None = None, groups=None
) -> tuple[int, str]:
    """num_gpu_blocks, vLLM's null block included, and where it comes from in words: model on the GPU named gpu
    (data/gpus.csv) at config's max_model_len, in blocks of its KV cache groups' page (a hybrid model's
    kvlab.core.capacity.kv_cache_groups share them; groups: those, where the caller has them), else the article's KV
    memory in blocks of config's block_size."""
    if model is None:
        return (
            ARTICLE_KV_TOKENS // config.cache.block_size + 1,
            f"the article's {article.MEMORY_GIB:g} GiB at {article.MIB_PER_TOKEN:g} MiB per token "
            f"({ARTICLE_KV_TOKENS:,} tokens)",
        )
    pool = gpu_kv_pool(config, model, models.get_gpu(gpu), groups)
    if not pool.num_gpu_blocks:
        validate.fail(
            "gpu",
            gpu,
            f"leaves no KV memory for {model.name} at gpu_memory_utilization="
            f"{config.cache.gpu_memory_utilization:g} (see kvlab capacity --model {model.name} --gpu {gpu})",
        )
    return pool.num_gpu_blocks, pool.source
