"""`kvlab capacity`: KV bytes per token, memory per request and requests that fit (the article's or vLLM's accounting).

Its work, kvlab.core.capacity and the catalogs of kvlab.core.models, imports no numpy; the parser needs it for
--weight-dtype's choices, so it is imported here at the top."""

from __future__ import annotations

import argparse
import dataclasses
import math

from kvlab.cli.common import add_quantization_flag, apply_quantization, exclusive, print_json
from kvlab.core import article, models, validate
from kvlab.core import capacity as cap
from kvlab.core.config import ATTENTION_BACKENDS, EngineConfig
from kvlab.core.models import ModelSpec
from kvlab.core.units import GIB, exact, unit_bytes

CAPACITY_FLAGS = {
    "num_layers": "--num-layers",
    "num_kv_heads": "--num-kv-heads",
    "head_dim": "--head-dim",
    "dtype_bytes": "--dtype-bytes",
    "gpu_memory": "--gpu-memory-gib",
    "weights": "--weights-gib",
    "context_tokens": "--context",
    "unit": "--unit",
    "num_attention_heads": "--num-attention-heads",
    "attention": "--attention",
    "kv_lora_rank": "--kv-lora-rank",
    "qk_rope_head_dim": "--qk-rope-head-dim",
    "kv_cache_dtype": "--kv-cache-dtype",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "enable_expert_parallel": "--enable-expert-parallel",
    "block_size": "--block-size",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "available_kv_gib": "--available-kv-gib",
    "gpu_memory_gib": "--gpu-memory-gib",
    "weights_gib": "--weights-gib",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "activation_peak_gib": "--activation-peak-gib",
    "non_torch_gib": "--non-torch-gib",
    "model": "--model",
    "gpu": "--gpu",
    "config": "--config",
    "weight_dtype": "--weight-dtype",
    "attention_backend": "--attention-backend",
    "quantization": "--quantization",
}
# Flags that switch `kvlab capacity` from the article's arithmetic to vLLM's accounting.
VLLM_FLAGS = [
    "model",
    "config",
    "attention",
    "num_attention_heads",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "disable_hybrid_kv_cache_manager",
    "async_scheduling",
    "no_async_scheduling",
    "attention_backend",
    "available_kv_gib",
    "gpu",
    "gpu_memory_utilization",
    "weight_dtype",
    "quantization",
    "activation_peak_gib",
    "non_torch_gib",
]


def add(commands) -> None:
    """Register `kvlab capacity` (KV bytes per token, memory per request, requests that fit)."""
    p = commands.add_parser(
        "capacity",
        help="KV bytes per token, memory per request, and requests that fit in GPU memory (article or vLLM accounting)",
        description="KV-cache capacity of one GPU. With the article's flags only: KV bytes per token = 2 (K and V) x "
        "layers x KV heads x head dim x bytes per value; memory per request = that x context tokens; requests that "
        "fit = floor((GPU memory - weights) / memory per request); defaults are the article's model (32 layers, 32 "
        "heads, head dim 128, 16-bit values) on an 80 GiB GPU with 16 GiB of weights. With any vLLM flag (--model, "
        "--config, --kv-cache-dtype, --tensor-parallel-size, --available-kv-gib, --gpu, ...): the figures vLLM logs, "
        "computed as vLLM 0.33 computes them (checked against vLLM's own code by make parity): the budget (memory x "
        "--gpu-memory-utilization - weights - activation peak - non-torch memory), whole blocks of --block-size tokens "
        "shared by vLLM's layer groups, the blocks one request of --max-model-len needs (R), 'Maximum concurrency' = "
        "blocks / R, 'GPU KV cache size' = int(blocks / R x --max-model-len) tokens, and whether vLLM starts (it "
        "keeps one block back, so exactly one request's memory is refused). Where vLLM's answer depends on a "
        "setting, kvlab takes vLLM's default on an H100: async scheduling on (--no-async-scheduling), the hybrid "
        "KV-cache manager on (--disable-hybrid-kv-cache-manager), the attention backend vLLM picks "
        "(--attention-backend).",
        epilog="examples: kvlab capacity --context 1000 --json | kvlab capacity --model Llama-3.1-8B-Instruct "
        "--available-kv-gib 3.81 --max-model-len 20000 | kvlab capacity --model Qwen3-14B --gpu H100-SXM-80GB "
        "--kv-cache-dtype fp8 --tensor-parallel-size 2 --max-model-len 32768 --json",
    )
    model = p.add_argument_group("model (the article's model by default)")
    model.add_argument("--model", help="a model of data/models.csv, e.g. Qwen3-14B (close matches listed on a miss)")
    model.add_argument("--config", help="path of a Hugging Face config.json to read the model from (no hub access)")
    model.add_argument("--num-layers", type=int, default=32, help="decoder layers (default 32)")
    model.add_argument("--num-kv-heads", type=int, default=32, help="K/V heads per layer (default 32)")
    model.add_argument(
        "--num-attention-heads",
        type=int,
        help="query heads per layer (default: the fewest that --attention and TP allow)",
    )
    model.add_argument("--head-dim", type=int, default=128, help="values per head (default 128)")
    model.add_argument(
        "--attention",
        choices=["mha", "gqa", "mqa", "mla"],
        help="attention kind (default gqa, or mha when heads = KV heads); mla caches one latent",
    )
    model.add_argument("--kv-lora-rank", type=int, help="MLA latent rank, values (DeepSeek: 512)")
    model.add_argument(
        "--qk-rope-head-dim", type=int, help="MLA rotary part cached beside the latent, values (DeepSeek: 64)"
    )
    model.add_argument(
        "--dtype-bytes",
        type=float,
        default=2,
        help="bytes per cached value, article accounting only (default 2: fp16/bf16)",
    )
    cache = p.add_argument_group("vLLM cache settings")
    cache.add_argument(
        "--kv-cache-dtype",
        choices=["fp16", "bf16", "fp8", "int8", "int4"],
        help="KV cache dtype (default bf16): fp8 1 B/value; int8 1 B + fp32 scale per token and head; "
        "int4 0.5 B + fp8 scale per 16 values (vLLM's nvfp4)",
    )
    cache.add_argument(
        "--tensor-parallel-size",
        type=int,
        help="GPUs splitting each layer (default 1): KV heads per GPU = max(1, KV heads / TP)",
    )
    cache.add_argument(
        "--pipeline-parallel-size",
        type=int,
        help="GPUs splitting the layers (default 1): vLLM groups the whole model's layers once, each stage's "
        "block holds its largest share of a group, and the stage with the fewest blocks binds",
    )
    cache.add_argument(
        "--data-parallel-size",
        type=int,
        help="engine cores (ranks, default 1), each of TP x PP GPUs with its own KV cache: the figures are one "
        "rank's, as each rank logs them; a mixture-of-experts model's routed experts are split over all DP x TP "
        "GPUs, so each holds fewer weights",
    )
    cache.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="hold whole experts on each of the DP x TP GPUs instead of a slice of every expert (the same bytes "
        "per GPU; mixture-of-experts models only)",
    )
    cache.add_argument("--block-size", type=int, help="tokens per KV block (default 16)")
    cache.add_argument(
        "--max-model-len",
        type=int,
        help="tokens per request for the concurrency figure (default: the model's max_position_embeddings, else --context)",
    )
    cache.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens per step (default 8192): a sliding-window layer keeps window - 1 + the tokens in "
        "flight, (PP + 1) x this with async scheduling, PP x this without",
    )
    cache.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        help="schedule the next step before this one's tokens are known (default on, vLLM 0.33's default "
        "on a GPU; --no-async-scheduling for a vLLM run with that flag, or with its V1 model runner at "
        "PP > 1, which turns it off)",
    )
    cache.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        help="sliding-window layers hold every token, as vLLM without its hybrid manager (vLLM's default "
        "is on; a vLLM without CUDA, on an unknown platform, turns it off)",
    )
    cache.add_argument(
        "--attention-backend",
        choices=sorted(ATTENTION_BACKENDS),
        help="vLLM's attention backend, whose kernel block sizes set sliding-window layers' block size "
        "(default: vLLM's pick on an H100: FLASH_ATTN; TRITON_ATTN for int8, FLASHINFER for int4); "
        "CPU_ATTN gives window layers 32-token blocks",
    )
    budget = p.add_argument_group("memory budget (per GPU)")
    budget.add_argument(
        "--available-kv-gib",
        type=float,
        help="KV memory per GPU, GiB, as vLLM logs 'Available KV cache memory' (skips the budget below)",
    )
    budget.add_argument("--gpu", help="a GPU of data/gpus.csv for its memory, e.g. H100-SXM-80GB")
    budget.add_argument("--gpu-memory-gib", type=float, help="GPU memory, in --unit (default 80)")
    budget.add_argument(
        "--gpu-memory-utilization", type=float, help="fraction of GPU memory vLLM may use (default 0.9)"
    )
    budget.add_argument(
        "--weights-gib",
        type=float,
        help="memory held by the weights per GPU, in --unit (default 16; with --model: parameters x "
        "--weight-dtype / (TP x PP))",
    )
    budget.add_argument(
        "--weight-dtype",
        choices=sorted(cap.WEIGHT_DTYPE_BYTES),
        help="weight dtype for the weights estimate (default bf16)",
    )
    add_quantization_flag(budget)
    budget.add_argument("--activation-peak-gib", type=float, help="activation peak per GPU, GiB (default 2.0)")
    budget.add_argument(
        "--non-torch-gib", type=float, help="non-torch memory per GPU (NCCL, CUDA context), GiB (default 0.4)"
    )
    budget.add_argument(
        "--unit",
        default="GiB",
        choices=["GiB", "GB"],
        help="unit of --gpu-memory-gib and --weights-gib: GiB = 2^30 bytes (default, as the article), GB = 10^9",
    )
    p.add_argument("--context", type=int, default=1000, help="context length of one request, tokens (default 1000)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run, flags=CAPACITY_FLAGS)


SHAPE_FLAGS = [
    "--num-layers",
    "--num-kv-heads",
    "--head-dim",
    "--num-attention-heads",
    "--attention",
    "--kv-lora-rank",
    "--qk-rope-head-dim",
]
BUDGET_FLAGS = [
    "--gpu",
    "--gpu-memory-gib",
    "--weights-gib",
    "--weight-dtype",
    "--gpu-memory-utilization",
    "--activation-peak-gib",
    "--non-torch-gib",
    "--unit",
]


def check_capacity_flags(given: set[str], vllm: bool) -> None:
    """Flags that contradict each other or would be ignored: one line naming both."""
    for source in ("--model", "--config"):
        exclusive(given, source, ["--config"] if source == "--model" else [], "give the model one way")
        exclusive(given, source, SHAPE_FLAGS, f"{source} sets the model's shape; drop the shape flags or {source}")
    exclusive(
        given,
        "--available-kv-gib",
        BUDGET_FLAGS,
        "--available-kv-gib is the KV budget itself; the memory budget flags compute it instead",
    )
    exclusive(given, "--gpu", ["--gpu-memory-gib"], "--gpu sets the GPU memory from data/gpus.csv")
    exclusive(
        given, "--weights-gib", ["--weight-dtype"], "--weight-dtype only estimates weights that --weights-gib gives"
    )
    exclusive(
        given,
        "--quantization",
        ["--weights-gib", "--available-kv-gib", "--weight-dtype"],
        "--quantization sets how the estimated weights are held",
    )
    if "--unit" in given and not given & {"--gpu-memory-gib", "--weights-gib"}:
        raise ValueError("--unit applies only to --gpu-memory-gib and --weights-gib, and neither was given")
    if vllm:
        first = next(flag for flag in sorted(given) if flag in {f"--{n.replace('_', '-')}" for n in VLLM_FLAGS})
        exclusive(
            given,
            "--dtype-bytes",
            [first],
            "--dtype-bytes is the article's accounting; vLLM's takes --kv-cache-dtype (fp16, bf16, fp8, int8, int4)",
        )
        exclusive(given, "--context", ["--max-model-len"], "in vLLM's accounting --max-model-len is the context")


def run(args, given: set[str]) -> dict:
    """Print the article's capacity figures (bytes, requests), or vLLM's when any vLLM flag is given."""
    vllm = any(f"--{name.replace('_', '-')}" in given for name in VLLM_FLAGS)
    check_capacity_flags(given, vllm)
    if vllm:
        return run_vllm_capacity(args, given)
    gpu_memory = article.GPU_MEMORY_GIB if args.gpu_memory_gib is None else args.gpu_memory_gib
    weights = article.WEIGHTS_GIB if args.weights_gib is None else args.weights_gib
    shape = cap.KVShape(args.num_layers, args.num_kv_heads, args.head_dim, exact(args.dtype_bytes))
    result = {
        "context_tokens": args.context,
        "unit": args.unit,
        **cap.capacity(shape, gpu_memory, weights, args.context, args.unit),
    }
    if args.json:
        print_json(result)
        return result
    scale = unit_bytes(args.unit)
    print(f"KV bytes per token   {result['kv_bytes_per_token']:,} B ({result['kv_bytes_per_token'] / 2**10:,.1f} KiB)")
    print(
        f"memory per request   {result['bytes_per_request'] / scale:,.3f} {args.unit} at {args.context:,} tokens "
        f"({result['bytes_per_request']:,} B)"
    )
    print(
        f"free for KV cache    {result['free_bytes'] / scale:,.3f} {args.unit} "
        f"({gpu_memory:g} {args.unit} GPU - {weights:g} {args.unit} weights)"
    )
    print(f"requests that fit    {result['max_num_requests']:,}")
    return result


def _capacity_model(args, tp: int) -> ModelSpec:
    """The model of a vLLM-accounting run: --model, --config or the architecture flags (tp: GPUs per layer)."""
    if args.model and args.config:
        validate.fail("model", args.model, "give --model or --config, not both")
    if args.model:
        return models.get_model(args.model)
    if args.config:
        return models.from_config(args.config)
    if args.attention == "mla":
        rank, rope = args.kv_lora_rank, args.qk_rope_head_dim
        if rank is None or rope is None:
            validate.fail("attention", "mla", "needs --kv-lora-rank and --qk-rope-head-dim")
        heads = tp if args.num_attention_heads is None else args.num_attention_heads
        return ModelSpec("custom", args.num_layers, heads, 1, rank + rope, "mla", rank, rope)
    kv = args.num_kv_heads
    heads = args.num_attention_heads
    attention = args.attention or ("mha" if heads is None or heads == kv else "gqa")
    if heads is None:
        heads = kv if attention == "mha" else math.lcm(kv, tp)
    return ModelSpec("custom", args.num_layers, heads, kv, args.head_dim, attention)


def capacity_config(args) -> EngineConfig:
    """The EngineConfig of a vLLM-accounting run: the flags given, vLLM's defaults for the rest."""
    given = {
        "block_size": args.block_size,
        "kv_cache_dtype": args.kv_cache_dtype,
        "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "data_parallel_size": args.data_parallel_size,
        "enable_expert_parallel": args.enable_expert_parallel or None,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "async_scheduling": args.async_scheduling,
        "attention_backend": args.attention_backend,
    }
    config = EngineConfig().replace(**{name: value for name, value in given.items() if value is not None})
    return config.replace(hybrid_kv_cache=not args.disable_hybrid_kv_cache_manager)


def capacity_budget(args, model: ModelSpec, config: EngineConfig) -> cap.MemoryBudget:
    """The per-GPU memory budget from --gpu or --gpu-memory-gib, --weights-gib or the model's parameters."""
    to_gib = unit_bytes(args.unit) / GIB
    if args.gpu:
        memory_gib = models.get_gpu(args.gpu).memory_gib
    else:
        memory_gib = (article.GPU_MEMORY_GIB if args.gpu_memory_gib is None else args.gpu_memory_gib) * to_gib
    if args.weight_dtype is not None and model.num_params_b <= 0:
        raise ValueError(
            f"--weight-dtype applies only to a model with a parameter count (data/models.csv); "
            f"{model.name} has none: give --weights-gib"
        )
    if args.weights_gib is not None:
        weights_gib = args.weights_gib * to_gib
    elif model.num_params_b > 0:
        weights_gib = cap.estimated_weights_gib(model, args.weight_dtype or "bf16", config)
    else:
        weights_gib = article.WEIGHTS_GIB * to_gib  # a config.json whose parameters kvlab cannot count
    defaults = cap.MemoryBudget(memory_gib, weights_gib)
    return cap.MemoryBudget(
        memory_gib,
        weights_gib,
        defaults.gpu_memory_utilization if args.gpu_memory_utilization is None else args.gpu_memory_utilization,
        defaults.activation_peak_gib if args.activation_peak_gib is None else args.activation_peak_gib,
        defaults.non_torch_gib if args.non_torch_gib is None else args.non_torch_gib,
    )


def run_vllm_capacity(args, given: set[str]) -> dict:
    """Print the figures vLLM logs for the model and per-GPU budget (bytes, blocks, tokens, concurrency x)."""
    config = capacity_config(args)
    model = apply_quantization(_capacity_model(args, config.parallel.tensor_parallel_size), args.quantization)
    cap.check_expert_parallel(model, config)
    if args.max_model_len is not None:
        max_model_len = args.max_model_len
    else:
        max_model_len = model.max_position_embeddings or args.context
    budget, memory = {}, None
    if args.available_kv_gib is not None:
        available = validate.in_range("available_kv_gib", args.available_kv_gib, "memory_gib") * GIB
    else:
        memory = capacity_budget(args, model, config)
        budget = memory.as_dict()
        available = memory.available_kv_bytes
        if available <= 0:
            _does_not_fit(
                args,
                given,
                model,
                memory,
                max_model_len,
                config,
                f"leaves no KV memory: {memory.gpu_memory_gib:g} GiB x {memory.gpu_memory_utilization:g} is "
                f"{memory.usable_gib:.2f} GiB and the weights, activation peak and non-torch memory take "
                f"{memory.reserved_gib:.2f} GiB",
            )
    result = cap.vllm_capacity(model, available, max_model_len, config)
    if result["num_gpu_blocks"] == 0:
        needed = result["blocks_per_request"] * result["bytes_per_block"]
        why = (
            f"fits no KV block of {result['bytes_per_block']:,} B ({result['layers_per_group']} layers x "
            f"{result['page_size_bytes']:,} B); one request of {max_model_len:,} tokens needs {needed / GIB:.2f} GiB, "
            f"{(needed - available) / GIB:.2f} GiB more"
        )
        if memory is None:
            validate.fail("available_kv_gib", args.available_kv_gib, why)
        _does_not_fit(args, given, model, memory, max_model_len, config, why)
    layout = None
    if memory is not None and not result["starts"]:
        layout = cap.layouts_that_fit(
            model,
            _whole_model_budget(args, memory, config),
            max_model_len,
            config,
            None if args.weights_gib is not None else (args.weight_dtype or "bf16"),
        )
    result = {
        "model": model.name,
        "attention": model.attention,
        "quantization": model.quantization or "none",
        "kv_cache_dtype": config.cache.kv_cache_dtype,
        "tensor_parallel_size": config.parallel.tensor_parallel_size,
        "pipeline_parallel_size": config.parallel.pipeline_parallel_size,
        "data_parallel_size": config.parallel.data_parallel_size,
        "enable_expert_parallel": config.parallel.enable_expert_parallel,
        "block_size": config.cache.block_size,
        **budget,
        **result,
        "available_kv_cache_gib": result["available_kv_cache_bytes"] / GIB,
    }
    if args.json:
        print_json(result)
        return result
    print(
        f"model                {model.name} ({model.attention}, {model.num_layers} layers, "
        f"{cap.kv_heads_per_gpu(model, config.parallel.tensor_parallel_size)} KV heads x {model.head_dim} per GPU)"
    )
    parallel = config.parallel
    print(
        f"cache                {config.cache.kv_cache_dtype}, block size {config.cache.block_size}, "
        f"TP {parallel.tensor_parallel_size}, PP {parallel.pipeline_parallel_size}"
        + (f", DP {parallel.data_parallel_size}" if parallel.data_parallel_size > 1 else "")
        + (" + EP" if parallel.enable_expert_parallel else "")
    )
    print(
        f"KV bytes per token   {result['kv_bytes_per_token']:,} B per GPU "
        f"({result['kv_bytes_per_token'] / 2**10:,.1f} KiB; article's model: 512.0 KiB)"
    )
    if budget:
        weights_note = ""
        if args.weights_gib is None:
            weights_note = (
                (
                    f" ({model.num_params_b:g}B parameters"
                    + (f", {model.quantization} as vLLM loads them" if model.quantization else "")
                    + (
                        f", {model.expert_params_b:.2f}B of them routed experts split over {parallel.world_size} GPUs"
                        if model.expert_params_b and parallel.data_parallel_size > 1
                        else ""
                    )
                    + ")"
                )
                if model.num_params_b > 0
                else " (the article's default: kvlab cannot count this config.json's parameters; give --weights-gib)"
                if args.config
                else " (default)"
            )
        print(
            f"budget per GPU       {budget['gpu_memory_gib']:g} GiB x {budget['gpu_memory_utilization']:g} - "
            f"{budget['weights_gib']:.2f} GiB weights{weights_note} - {budget['activation_peak_gib']:g} GiB activation peak - "
            f"{budget['non_torch_gib']:g} GiB non-torch"
        )
    for line in cap.vllm_log_lines(result):
        print(line)
    print(
        f"# GPU blocks: {result['num_gpu_blocks']:,} ({result['blocks_per_request']:,} per request of "
        f"{max_model_len:,} tokens: {result['max_concurrency']:.2f}x)"
    )
    if parallel.data_parallel_size > 1:
        ranks = parallel.data_parallel_size
        print(
            f"# {ranks} data-parallel ranks on {parallel.world_size} GPUs, each as above (its own pool and "
            f"scheduler): {ranks * result['num_gpu_blocks']:,} blocks, {ranks * result['max_concurrency']:.2f}x in all"
        )
    if not result["starts"]:
        fix = f"use {_layout_flags(layout)}, " if layout else ""
        print(
            f"note: vLLM refuses to start: {result['refusal']} ({fix}lower --max-model-len or raise "
            f"--gpu-memory-utilization)"
        )
    return result


def _layout_flags(layouts: list[tuple[int, int]]) -> str:
    """The flags of each layout that fits, joined with 'or'."""

    def flags(tp, pp):
        return (
            " ".join(
                ([f"--tensor-parallel-size {tp}"] if tp > 1 else [])
                + ([f"--pipeline-parallel-size {pp}"] if pp > 1 else [])
            )
            or "one GPU"
        )

    return " or ".join(flags(*layout) for layout in layouts)


def _whole_model_budget(args, memory: cap.MemoryBudget, config: EngineConfig) -> cap.MemoryBudget:
    """memory with the weights of the whole model (per GPU weights x TP x PP), for trying other layouts."""
    gpus = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    return dataclasses.replace(memory, weights_gib=memory.weights_gib * gpus)


def _does_not_fit(
    args,
    given: set[str],
    model: ModelSpec,
    memory: cap.MemoryBudget,
    max_model_len: int,
    config: EngineConfig,
    why: str,
):
    """The one-line error for a model that does not fit, naming what the user typed and the fewest GPUs that fit."""
    if "--gpu" in given:
        flag, value = "--gpu", args.gpu
    elif "--gpu-memory-gib" in given:
        flag, value = "--gpu-memory-gib", args.gpu_memory_gib
    elif args.model or args.config:
        flag, value = ("--model", args.model) if args.model else ("--config", args.config)
    else:
        flag, value = "--weights-gib", args.weights_gib
    layout = cap.layouts_that_fit(
        model,
        _whole_model_budget(args, memory, config),
        max_model_len,
        config,
        None if args.weights_gib is not None else (args.weight_dtype or "bf16"),
    )
    gpus = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    where = f"{gpus} GPUs of {memory.gpu_memory_gib:g} GiB" if gpus > 1 else f"one GPU of {memory.gpu_memory_gib:g} GiB"
    fix = (
        f"one request of {max_model_len:,} tokens fits with {_layout_flags(layout)}"
        if layout
        else f"no layout of up to 256 GPUs holds one request of {max_model_len:,} tokens: lower --max-model-len"
    )
    raise ValueError(f"{flag}={value!r} is not allowed: {model.name} on {where} {why}; {fix}")
