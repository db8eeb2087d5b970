"""What vLLM logs at start-up for a model on one GPU's memory (`kvlab capacity` in vLLM's accounting): the model, the
EngineConfig and max_model_len as kvlab.studies.serving makes them, a memory budget, kvlab.core.capacity's figures,
and where one request does not fit, the layouts of more GPUs that hold it. Every default and refusal of the options
is here or in kvlab.studies.serving."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvlab.core import article, capacity, models, validate
from kvlab.core.config import EngineConfig
from kvlab.core.models import ModelSpec
from kvlab.core.units import GIB, unit_bytes
from kvlab.studies import serving
from kvlab.studies.serving import FLAGS


@dataclass(frozen=True)
class SizingOptions(serving.ServingOptions):
    """ServingOptions with kvlab capacity's own: a model by its shape where none is named (the article's: layers,
    KV heads and head dim; the attention kind, query heads and MLA's latent), and one GPU's memory budget:
    available_kv_gib (vLLM's 'Available KV cache memory', the budget itself), else the GPU's memory (gpu, else
    gpu_memory_gib in unit, default the article's) x gpu_memory_utilization less the weights (weights_gib in unit,
    else the model's parameters at weight_dtype, default bf16), the activation peak and non-torch memory (GiB;
    kvlab.core.capacity.MemoryBudget's defaults). The longest request falls back to default_max_model_len, the
    context a request of the article's accounting holds."""

    num_layers: int = article.NUM_LAYERS
    num_kv_heads: int = article.NUM_KV_HEADS
    head_dim: int = article.HEAD_DIM
    num_attention_heads: int | None = None
    attention: str | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    available_kv_gib: float | None = None
    gpu_memory_gib: float | None = None
    weights_gib: float | None = None
    weight_dtype: str | None = None
    activation_peak_gib: float | None = None
    non_torch_gib: float | None = None
    unit: str = "GiB"


@dataclass(frozen=True)
class Sizing:
    """A sizing: the model and its EngineConfig, max_model_len, the memory budget (None: available_kv_gib gave the
    KV memory), vLLM's figures as kvlab capacity --json gives them, and the layouts (TP, PP) that hold one request
    where vLLM would not start."""

    model: ModelSpec
    config: EngineConfig
    max_model_len: int
    memory: capacity.MemoryBudget | None
    figures: dict
    layouts: list


def shape_model(options: SizingOptions, tensor_parallel_size: int) -> ModelSpec:
    """The model of the shape options give (no model named): query heads default to the fewest that the attention
    kind and tensor_parallel_size allow; MLA caches its latent and rotary part."""
    if options.attention == "mla":
        rank, rope = options.kv_lora_rank, options.qk_rope_head_dim
        if rank is None or rope is None:
            validate.fail("attention", "mla", f"needs {FLAGS['kv_lora_rank']} and {FLAGS['qk_rope_head_dim']}")
        heads = tensor_parallel_size if options.num_attention_heads is None else options.num_attention_heads
        return ModelSpec("custom", options.num_layers, heads, 1, rank + rope, "mla", rank, rope)
    kv, heads = options.num_kv_heads, options.num_attention_heads
    attention = options.attention or ("mha" if heads is None or heads == kv else "gqa")
    if heads is None:
        heads = kv if attention == "mha" else math.lcm(kv, tensor_parallel_size)
    return ModelSpec("custom", options.num_layers, heads, kv, options.head_dim, attention)


def memory_budget(options: SizingOptions, model: ModelSpec, config: EngineConfig) -> capacity.MemoryBudget:
    """One GPU's memory budget (SizingOptions), the weights from weights_gib or the model's parameters."""
    to_gib = unit_bytes(options.unit) / GIB
    if options.gpu:
        memory_gib = models.get_gpu(options.gpu).memory_gib
    else:
        memory_gib = (article.GPU_MEMORY_GIB if options.gpu_memory_gib is None else options.gpu_memory_gib) * to_gib
    if options.weight_dtype is not None and model.num_params_b <= 0:
        raise ValueError(
            f"{FLAGS['weight_dtype']} applies only to a model with a parameter count (data/models.csv); "
            f"{model.name} has none: give {FLAGS['weights_gib']}"
        )
    if options.weights_gib is not None:
        weights_gib = options.weights_gib * to_gib
    elif model.num_params_b > 0:
        weights_gib = capacity.estimated_weights_gib(model, options.weight_dtype or "bf16", config)
    else:
        weights_gib = article.WEIGHTS_GIB * to_gib  # a config.json whose parameters kvlab cannot count
    defaults = capacity.MemoryBudget(memory_gib, weights_gib)
    return capacity.MemoryBudget(
        memory_gib,
        weights_gib,
        defaults.gpu_memory_utilization if options.gpu_memory_utilization is None else options.gpu_memory_utilization,
        defaults.activation_peak_gib if options.activation_peak_gib is None else options.activation_peak_gib,
        defaults.non_torch_gib if options.non_torch_gib is None else options.non_torch_gib,
    )


def size(options: SizingOptions) -> Sizing:
    """vLLM's start-up figures for the options (kvlab.core.capacity.vllm_capacity), each refusal in one line: a
    model that leaves no KV memory or fits no block names what was given and the fewest GPUs that fit."""
    config = serving.engine_config(options, None)
    if options.model is None and options.hf_config_path is None:
        model = serving.quantized(shape_model(options, config.parallel.tensor_parallel_size), options.quantization)
    else:
        model = serving.load_model(options, params_needed=False)
    capacity.check_expert_parallel(model, config)
    max_model_len = serving.max_model_len_of(options, model)
    budget, memory = {}, None
    if options.available_kv_gib is not None:
        available = validate.in_range("available_kv_gib", options.available_kv_gib, "memory_gib") * GIB
    else:
        memory = memory_budget(options, model, config)
        budget = memory.as_dict()
        available = memory.available_kv_bytes
        if available <= 0:
            _does_not_fit(
                options,
                model,
                memory,
                max_model_len,
                config,
                f"leaves no KV memory: {memory.gpu_memory_gib:g} GiB x {memory.gpu_memory_utilization:g} is "
                f"{memory.usable_gib:.2f} GiB and the weights, activation peak and non-torch memory take "
                f"{memory.reserved_gib:.2f} GiB",
            )
    result = capacity.vllm_capacity(model, available, max_model_len, config)
    if result["num_gpu_blocks"] == 0:
        needed = result["blocks_per_request"] * result["bytes_per_block"]
        why = (
            f"fits no KV block of {result['bytes_per_block']:,} B ({result['layers_per_group']} layers x "
            f"{result['page_size_bytes']:,} B); one request of {max_model_len:,} tokens needs {needed / GIB:.2f} GiB, "
            f"{(needed - available) / GIB:.2f} GiB more"
        )
        if memory is None:
            validate.fail("available_kv_gib", options.available_kv_gib, why)
        _does_not_fit(options, model, memory, max_model_len, config, why)
    layouts = []
    if memory is not None and not result["starts"]:
        layouts = _layouts(options, model, memory, max_model_len, config)
    parallel = config.parallel
    figures = {
        "model": model.name,
        "attention": model.attention,
        "quantization": model.quantization or "none",
        "kv_cache_dtype": config.cache.kv_cache_dtype,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "pipeline_parallel_size": parallel.pipeline_parallel_size,
        "data_parallel_size": parallel.data_parallel_size,
        "enable_expert_parallel": parallel.enable_expert_parallel,
        "block_size": config.cache.block_size,
        **budget,
        **result,
        "available_kv_cache_gib": result["available_kv_cache_bytes"] / GIB,
    }
    return Sizing(model, config, max_model_len, memory, figures, layouts)


def layout_flags(layouts: list[tuple[int, int]]) -> str:
    """The flags of each layout (TP, PP) that fits, joined with 'or'."""

    def flags(tp, pp):
        return (
            " ".join(
                ([f"{FLAGS['tensor_parallel_size']} {tp}"] if tp > 1 else [])
                + ([f"{FLAGS['pipeline_parallel_size']} {pp}"] if pp > 1 else [])
            )
            or "one GPU"
        )

    return " or ".join(flags(*layout) for layout in layouts)


def _layouts(options: SizingOptions, model, memory, max_model_len: int, config: EngineConfig) -> list:
    """The layouts that hold one request of max_model_len (kvlab.core.capacity.layouts_that_fit), the weights of the
    whole model (per GPU x TP x PP) re-estimated for each unless weights_gib gave them."""
    gpus = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    whole_model = dataclasses.replace(memory, weights_gib=memory.weights_gib * gpus)
    weight_dtype = None if options.weights_gib is not None else (options.weight_dtype or "bf16")
    return capacity.layouts_that_fit(model, whole_model, max_model_len, config, weight_dtype)


def _does_not_fit(options: SizingOptions, model, memory, max_model_len: int, config: EngineConfig, why: str):
    """The one-line error for a model that does not fit, naming what was given and the fewest GPUs that fit."""
    if options.gpu is not None:
        name, value = "gpu", options.gpu
    elif options.gpu_memory_gib is not None:
        name, value = "gpu_memory_gib", options.gpu_memory_gib
    elif options.model or options.hf_config_path:
        name, value = ("model", options.model) if options.model else ("hf_config_path", options.hf_config_path)
    else:
        name, value = "weights_gib", options.weights_gib
    layouts = _layouts(options, model, memory, max_model_len, config)
    gpus = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    where = f"{gpus} GPUs of {memory.gpu_memory_gib:g} GiB" if gpus > 1 else f"one GPU of {memory.gpu_memory_gib:g} GiB"
    fix = (
        f"one request of {max_model_len:,} tokens fits with {layout_flags(layouts)}"
        if layouts
        else f"no layout of up to 256 GPUs holds one request of {max_model_len:,} tokens: lower "
        f"{FLAGS['max_model_len']}"
    )
    raise ValueError(f"{FLAGS[name]}={value!r} is not allowed: {model.name} on {where} {why}; {fix}")
