"""The engine's KV pool, num_gpu_blocks (vLLM's null block included), when it is not given: a model on a GPU as
vLLM sizes it (kvlab.core.capacity.plan_capacity), else the article's KV memory."""

from __future__ import annotations

from kvlab.core import article, capacity, models, validate
from kvlab.core.config import EngineConfig
from kvlab.core.models import ModelSpec

# The article's KV memory, 60 GiB at 0.5 MiB per token, in tokens.
ARTICLE_KV_TOKENS = int(article.MEMORY_GIB * 1024 / article.MIB_PER_TOKEN)


def size_kv_pool(config: EngineConfig, model: ModelSpec | None = None, gpu: str | None = None) -> tuple[int, str]:
    """num_gpu_blocks, vLLM's null block included, and where it comes from in words: model on the GPU named gpu
    (data/gpus.csv) at config's max_model_len, in blocks of its KV cache groups' page (a hybrid model's
    kvlab.core.capacity.kv_cache_groups share them), else the article's KV memory in blocks of config's block_size."""
    if model is None:
        return (
            ARTICLE_KV_TOKENS // config.cache.block_size + 1,
            f"the article's {article.MEMORY_GIB:g} GiB at {article.MIB_PER_TOKEN:g} MiB per token "
            f"({ARTICLE_KV_TOKENS:,} tokens)",
        )
    spec = models.get_gpu(gpu)
    planned = capacity.plan_capacity(model, spec.memory_gib, config.scheduler.max_model_len, config)
    if planned is None:
        validate.fail(
            "gpu",
            gpu,
            f"leaves no KV memory for {model.name} at gpu_memory_utilization="
            f"{config.cache.gpu_memory_utilization:g} (see kvlab capacity --model {model.name} --gpu {gpu})",
        )
    return planned["num_gpu_blocks"], f"{model.name} on {spec.name} as vLLM sizes it"
