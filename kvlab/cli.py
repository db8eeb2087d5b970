"""The `kvlab` command line: the library's computations for scripting and checking."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys

import numpy as np

from kvlab.core import allocator as alloc
from kvlab.core import article, batching, models, resources, validate
from kvlab.core import capacity as cap
from kvlab.core import engine as vllm_engine
from kvlab.core.config import ATTENTION_BACKENDS, EngineConfig
from kvlab.core.cost import (STEP_COSTS, CalibratedStepCost, ConstantStepCost, LinearStepCost, MeasuredStepCost,
                             RooflineStepCost, TokenCost)
from kvlab.core.models import ModelSpec
from kvlab.core.units import GIB, exact, unit_bytes
from kvlab.core.workload import Workload
from kvlab.workloads import synthetic, traces


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2; flags are never abbreviated."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --num would silently mean --num-requests otherwise
        super().__init__(*args, **kwargs)

    def error(self, message):
        """Print message on one line and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# Names that are a model's own figures when the model comes from --model or --config: in a message they become
# their flag only where the user typed that flag.
MODEL_FIGURES = ("num_layers", "num_kv_heads", "head_dim", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim")


def _flag_error(parser: argparse.ArgumentParser, error: ValueError, flags: dict[str, str],
                given: set[str] = frozenset()) -> int:
    """Report a library ValueError in the command's own flag names; exit status 2.

    The parameter the message starts with becomes its flag, and so does a setting named elsewhere in it
    (max_model_len: --max-model-len, the flag that changes it); a model's own figure (MODEL_FIGURES) does so
    only where the user typed its flag: a model's num_attention_heads stays the model's."""
    message = str(error)
    name = re.match(r"[\w\[\]]+", message).group(0) if re.match(r"\w", message) else ""
    if name in flags:
        message = flags[name] + message[len(name):]
    for library_name, flag in sorted(flags.items(), key=lambda item: -len(item[0])):
        if "_" in library_name and (flag in given or library_name not in MODEL_FIGURES):
            message = re.sub(rf"(?<![\w'-]){library_name}(?![\w'])", flag, message)  # not a quoted field name
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return 2


def typed_flags(argv: list[str]) -> set[str]:
    """The flags the user typed (--name), so that a default is never mistaken for a choice."""
    return {token.split("=", 1)[0] for token in argv if token.startswith("--")}


def exclusive(given: set[str], flag: str, others, why: str) -> None:
    """A one-line error when flag was typed beside any of others: naming both and why they conflict."""
    if flag not in given:
        return
    for other in others:
        if other in given:
            raise ValueError(f"{flag} and {other} cannot be used together: {why}")


def requires(given: set[str], flag: str, needed: str, why: str) -> None:
    """A one-line error when flag was typed without needed, which it only applies to."""
    if flag in given and needed not in given:
        raise ValueError(f"{flag} applies only with {needed}: {why}")


def _print_json(result: dict) -> None:
    print(json.dumps(result, indent=2, sort_keys=False))


# ---------------------------------------------------------------- kvlab capacity
CAPACITY_FLAGS = {
    "num_layers": "--num-layers", "num_kv_heads": "--num-kv-heads", "head_dim": "--head-dim",
    "dtype_bytes": "--dtype-bytes", "gpu_memory": "--gpu-memory-gib", "weights": "--weights-gib",
    "context_tokens": "--context", "unit": "--unit", "num_attention_heads": "--num-attention-heads",
    "attention": "--attention", "kv_lora_rank": "--kv-lora-rank", "qk_rope_head_dim": "--qk-rope-head-dim",
    "kv_cache_dtype": "--kv-cache-dtype", "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size", "block_size": "--block-size",
    "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
    "available_kv_gib": "--available-kv-gib", "gpu_memory_gib": "--gpu-memory-gib", "weights_gib": "--weights-gib",
    "gpu_memory_utilization": "--gpu-memory-utilization", "activation_peak_gib": "--activation-peak-gib",
    "non_torch_gib": "--non-torch-gib", "model": "--model", "gpu": "--gpu", "config": "--config",
    "weight_dtype": "--weight-dtype", "attention_backend": "--attention-backend",
}
# Flags that switch `kvlab capacity` from the article's arithmetic to vLLM's accounting.
VLLM_FLAGS = ["model", "config", "attention", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim",
              "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size", "block_size", "max_model_len",
              "max_num_batched_tokens", "disable_hybrid_kv_cache_manager", "async_scheduling", "no_async_scheduling",
              "attention_backend", "available_kv_gib", "gpu", "gpu_memory_utilization", "weight_dtype",
              "activation_peak_gib", "non_torch_gib"]


def add_capacity(commands) -> None:
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
    model.add_argument("--num-attention-heads", type=int,
                       help="query heads per layer (default: the fewest that --attention and TP allow)")
    model.add_argument("--head-dim", type=int, default=128, help="values per head (default 128)")
    model.add_argument("--attention", choices=["mha", "gqa", "mqa", "mla"],
                       help="attention kind (default gqa, or mha when heads = KV heads); mla caches one latent")
    model.add_argument("--kv-lora-rank", type=int, help="MLA latent rank, values (DeepSeek: 512)")
    model.add_argument("--qk-rope-head-dim", type=int, help="MLA rotary part cached beside the latent, values (DeepSeek: 64)")
    model.add_argument("--dtype-bytes", type=float, default=2,
                       help="bytes per cached value, article accounting only (default 2: fp16/bf16)")
    cache = p.add_argument_group("vLLM cache settings")
    cache.add_argument("--kv-cache-dtype", choices=["fp16", "bf16", "fp8", "int8", "int4"],
                       help="KV cache dtype (default bf16): fp8 1 B/value; int8 1 B + fp32 scale per token and head; "
                       "int4 0.5 B + fp8 scale per 16 values (vLLM's nvfp4)")
    cache.add_argument("--tensor-parallel-size", type=int, help="GPUs splitting each layer (default 1): KV heads per GPU = max(1, KV heads / TP)")
    cache.add_argument("--pipeline-parallel-size", type=int,
                       help="GPUs splitting the layers (default 1): vLLM groups the whole model's layers once, each stage's "
                       "block holds its largest share of a group, and the stage with the fewest blocks binds")
    cache.add_argument("--block-size", type=int, help="tokens per KV block (default 16)")
    cache.add_argument("--max-model-len", type=int,
                       help="tokens per request for the concurrency figure (default: the model's max_position_embeddings, else --context)")
    cache.add_argument("--max-num-batched-tokens", type=int,
                       help="tokens per step (default 8192): a sliding-window layer keeps window - 1 + the tokens in "
                       "flight, (PP + 1) x this with async scheduling, PP x this without")
    cache.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                       help="schedule the next step before this one's tokens are known (default on, vLLM 0.33's default "
                       "on a GPU; --no-async-scheduling for a vLLM run with that flag, or with its V1 model runner at "
                       "PP > 1, which turns it off)")
    cache.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                       help="sliding-window layers hold every token, as vLLM without its hybrid manager (vLLM's default "
                       "is on; a vLLM without CUDA, on an unknown platform, turns it off)")
    cache.add_argument("--attention-backend", choices=sorted(ATTENTION_BACKENDS),
                       help="vLLM's attention backend, whose kernel block sizes set sliding-window layers' block size "
                       "(default: vLLM's pick on an H100: FLASH_ATTN; TRITON_ATTN for int8, FLASHINFER for int4); "
                       "CPU_ATTN gives window layers 32-token blocks")
    budget = p.add_argument_group("memory budget (per GPU)")
    budget.add_argument("--available-kv-gib", type=float,
                        help="KV memory per GPU, GiB, as vLLM logs 'Available KV cache memory' (skips the budget below)")
    budget.add_argument("--gpu", help="a GPU of data/gpus.csv for its memory, e.g. H100-SXM-80GB")
    budget.add_argument("--gpu-memory-gib", type=float, help="GPU memory, in --unit (default 80)")
    budget.add_argument("--gpu-memory-utilization", type=float, help="fraction of GPU memory vLLM may use (default 0.9)")
    budget.add_argument("--weights-gib", type=float,
                        help="memory held by the weights per GPU, in --unit (default 16; with --model: parameters x "
                        "--weight-dtype / (TP x PP))")
    budget.add_argument("--weight-dtype", choices=sorted(cap.WEIGHT_DTYPE_BYTES), help="weight dtype for the weights estimate (default bf16)")
    budget.add_argument("--activation-peak-gib", type=float, help="activation peak per GPU, GiB (default 2.0)")
    budget.add_argument("--non-torch-gib", type=float, help="non-torch memory per GPU (NCCL, CUDA context), GiB (default 0.4)")
    budget.add_argument("--unit", default="GiB", choices=["GiB", "GB"],
                        help="unit of --gpu-memory-gib and --weights-gib: GiB = 2^30 bytes (default, as the article), GB = 10^9")
    p.add_argument("--context", type=int, default=1000, help="context length of one request, tokens (default 1000)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run_capacity, flags=CAPACITY_FLAGS)


SHAPE_FLAGS = ["--num-layers", "--num-kv-heads", "--head-dim", "--num-attention-heads", "--attention",
               "--kv-lora-rank", "--qk-rope-head-dim"]
BUDGET_FLAGS = ["--gpu", "--gpu-memory-gib", "--weights-gib", "--weight-dtype", "--gpu-memory-utilization",
                "--activation-peak-gib", "--non-torch-gib", "--unit"]


def check_capacity_flags(given: set[str], vllm: bool) -> None:
    """Flags that contradict each other or would be ignored: one line naming both."""
    for source in ("--model", "--config"):
        exclusive(given, source, ["--config"] if source == "--model" else [], "give the model one way")
        exclusive(given, source, SHAPE_FLAGS, f"{source} sets the model's shape; drop the shape flags or {source}")
    exclusive(given, "--available-kv-gib", BUDGET_FLAGS,
              "--available-kv-gib is the KV budget itself; the memory budget flags compute it instead")
    exclusive(given, "--gpu", ["--gpu-memory-gib"], "--gpu sets the GPU memory from data/gpus.csv")
    exclusive(given, "--weights-gib", ["--weight-dtype"], "--weight-dtype only estimates weights that --weights-gib gives")
    if "--unit" in given and not given & {"--gpu-memory-gib", "--weights-gib"}:
        raise ValueError("--unit applies only to --gpu-memory-gib and --weights-gib, and neither was given")
    if vllm:
        first = next(flag for flag in sorted(given) if flag in {f"--{n.replace('_', '-')}" for n in VLLM_FLAGS})
        exclusive(given, "--dtype-bytes", [first], "--dtype-bytes is the article's accounting; vLLM's takes "
                  "--kv-cache-dtype (fp16, bf16, fp8, int8, int4)")
        exclusive(given, "--context", ["--max-model-len"], "in vLLM's accounting --max-model-len is the context")


def run_capacity(args, given: set[str]) -> dict:
    """Print the article's capacity figures (bytes, requests), or vLLM's when any vLLM flag is given."""
    vllm = any(f"--{name.replace('_', '-')}" in given for name in VLLM_FLAGS)
    check_capacity_flags(given, vllm)
    if vllm:
        return run_vllm_capacity(args, given)
    gpu_memory = article.GPU_MEMORY_GIB if args.gpu_memory_gib is None else args.gpu_memory_gib
    weights = article.WEIGHTS_GIB if args.weights_gib is None else args.weights_gib
    shape = cap.KVShape(args.num_layers, args.num_kv_heads, args.head_dim, exact(args.dtype_bytes))
    result = {"context_tokens": args.context, "unit": args.unit,
              **cap.capacity(shape, gpu_memory, weights, args.context, args.unit)}
    if args.json:
        _print_json(result)
        return result
    scale = unit_bytes(args.unit)
    print(f"KV bytes per token   {result['kv_bytes_per_token']:,} B ({result['kv_bytes_per_token'] / 2**10:,.1f} KiB)")
    print(f"memory per request   {result['bytes_per_request'] / scale:,.3f} {args.unit} at {args.context:,} tokens "
          f"({result['bytes_per_request']:,} B)")
    print(f"free for KV cache    {result['free_bytes'] / scale:,.3f} {args.unit} "
          f"({gpu_memory:g} {args.unit} GPU - {weights:g} {args.unit} weights)")
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
    given = {"block_size": args.block_size, "kv_cache_dtype": args.kv_cache_dtype,
             "tensor_parallel_size": args.tensor_parallel_size, "pipeline_parallel_size": args.pipeline_parallel_size,
             "max_num_batched_tokens": args.max_num_batched_tokens, "async_scheduling": args.async_scheduling,
             "attention_backend": args.attention_backend}
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
        raise ValueError(f"--weight-dtype applies only to a model with a parameter count (data/models.csv); "
                         f"{model.name} has none: give --weights-gib")
    if args.weights_gib is not None:
        weights_gib = args.weights_gib * to_gib
    elif model.num_params_b > 0:
        weights_gib = cap.estimated_weights_gib(model, args.weight_dtype or "bf16", config)
    else:
        weights_gib = article.WEIGHTS_GIB * to_gib  # a config.json carries no parameter count
    defaults = cap.MemoryBudget(memory_gib, weights_gib)
    return cap.MemoryBudget(
        memory_gib, weights_gib,
        defaults.gpu_memory_utilization if args.gpu_memory_utilization is None else args.gpu_memory_utilization,
        defaults.activation_peak_gib if args.activation_peak_gib is None else args.activation_peak_gib,
        defaults.non_torch_gib if args.non_torch_gib is None else args.non_torch_gib)


def run_vllm_capacity(args, given: set[str]) -> dict:
    """Print the figures vLLM logs for the model and per-GPU budget (bytes, blocks, tokens, concurrency x)."""
    config = capacity_config(args)
    model = _capacity_model(args, config.parallel.tensor_parallel_size)
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
            _does_not_fit(args, given, model, memory, max_model_len, config,
                          f"leaves no KV memory: {memory.gpu_memory_gib:g} GiB x {memory.gpu_memory_utilization:g} is "
                          f"{memory.usable_gib:.2f} GiB and the weights, activation peak and non-torch memory take "
                          f"{memory.reserved_gib:.2f} GiB")
    result = cap.vllm_capacity(model, available, max_model_len, config)
    if result["num_gpu_blocks"] == 0:
        needed = result["blocks_per_request"] * result["bytes_per_block"]
        why = (f"fits no KV block of {result['bytes_per_block']:,} B ({result['layers_per_group']} layers x "
               f"{result['page_size_bytes']:,} B); one request of {max_model_len:,} tokens needs {needed / GIB:.2f} GiB, "
               f"{(needed - available) / GIB:.2f} GiB more")
        if memory is None:
            validate.fail("available_kv_gib", args.available_kv_gib, why)
        _does_not_fit(args, given, model, memory, max_model_len, config, why)
    layout = None
    if memory is not None and not result["starts"]:
        layout = cap.layouts_that_fit(model, _whole_model_budget(args, memory, config), max_model_len, config,
                                      None if args.weights_gib is not None else (args.weight_dtype or "bf16"))
    result = {"model": model.name, "attention": model.attention, "kv_cache_dtype": config.cache.kv_cache_dtype,
              "tensor_parallel_size": config.parallel.tensor_parallel_size,
              "pipeline_parallel_size": config.parallel.pipeline_parallel_size, "block_size": config.cache.block_size,
              **budget, **result, "available_kv_cache_gib": result["available_kv_cache_bytes"] / GIB}
    if args.json:
        _print_json(result)
        return result
    print(f"model                {model.name} ({model.attention}, {model.num_layers} layers, "
          f"{cap.kv_heads_per_gpu(model, config.parallel.tensor_parallel_size)} KV heads x {model.head_dim} per GPU)")
    print(f"cache                {config.cache.kv_cache_dtype}, block size {config.cache.block_size}, "
          f"TP {config.parallel.tensor_parallel_size}, PP {config.parallel.pipeline_parallel_size}")
    print(f"KV bytes per token   {result['kv_bytes_per_token']:,} B per GPU "
          f"({result['kv_bytes_per_token'] / 2**10:,.1f} KiB; article's model: 512.0 KiB)")
    if budget:
        weights_note = ""
        if args.weights_gib is None:
            weights_note = " (default)" if model.num_params_b <= 0 else f" ({model.num_params_b:g}B parameters)"
        print(f"budget per GPU       {budget['gpu_memory_gib']:g} GiB x {budget['gpu_memory_utilization']:g} - "
              f"{budget['weights_gib']:.2f} GiB weights{weights_note} - {budget['activation_peak_gib']:g} GiB activation peak - "
              f"{budget['non_torch_gib']:g} GiB non-torch")
    for line in cap.vllm_log_lines(result):
        print(line)
    print(f"# GPU blocks: {result['num_gpu_blocks']:,} ({result['blocks_per_request']:,} per request of "
          f"{max_model_len:,} tokens: {result['max_concurrency']:.2f}x)")
    if not result["starts"]:
        fix = f"use {_layout_flags(layout)}, " if layout else ""
        print(f"note: vLLM refuses to start: {result['refusal']} ({fix}lower --max-model-len or raise "
              f"--gpu-memory-utilization)")
    return result


def _layout_flags(layouts: list[tuple[int, int]]) -> str:
    """The flags of each layout that fits, joined with 'or'."""
    def flags(tp, pp):
        return " ".join(([f"--tensor-parallel-size {tp}"] if tp > 1 else [])
                        + ([f"--pipeline-parallel-size {pp}"] if pp > 1 else [])) or "one GPU"
    return " or ".join(flags(*layout) for layout in layouts)


def _whole_model_budget(args, memory: cap.MemoryBudget, config: EngineConfig) -> cap.MemoryBudget:
    """memory with the weights of the whole model (per GPU weights x TP x PP), for trying other layouts."""
    gpus = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    return dataclasses.replace(memory, weights_gib=memory.weights_gib * gpus)


def _does_not_fit(args, given: set[str], model: ModelSpec, memory: cap.MemoryBudget, max_model_len: int,
                  config: EngineConfig, why: str):
    """The one-line error for a model that does not fit, naming what the user typed and the fewest GPUs that fit."""
    if "--gpu" in given:
        flag, value = "--gpu", args.gpu
    elif "--gpu-memory-gib" in given:
        flag, value = "--gpu-memory-gib", args.gpu_memory_gib
    elif args.model or args.config:
        flag, value = ("--model", args.model) if args.model else ("--config", args.config)
    else:
        flag, value = "--weights-gib", args.weights_gib
    layout = cap.layouts_that_fit(model, _whole_model_budget(args, memory, config), max_model_len, config,
                                  None if args.weights_gib is not None else (args.weight_dtype or "bf16"))
    gpus = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    where = f"{gpus} GPUs of {memory.gpu_memory_gib:g} GiB" if gpus > 1 else f"one GPU of {memory.gpu_memory_gib:g} GiB"
    fix = (f"one request of {max_model_len:,} tokens fits with {_layout_flags(layout)}" if layout
           else f"no layout of up to 256 GPUs holds one request of {max_model_len:,} tokens: lower --max-model-len")
    raise ValueError(f"{flag}={value!r} is not allowed: {model.name} on {where} {why}; {fix}")


# ---------------------------------------------------------------- kvlab allocate
ALLOCATE_FLAGS = {
    "num_requests": "--num-requests", "max_len_tokens": "--max-len", "block_size": "--block-size",
    "lengths": "--lengths", "memory_gib": "--memory-gib", "mib_per_token": "--mb-per-token",
    "trace_format": "--trace-format", "trace": "--trace", "seed": "--seed",
}


def add_allocate(commands) -> None:
    """Register `kvlab allocate` (reserved, used and wasted tokens for one block size)."""
    families = "; ".join(f"{name}: {text}" for name, (_, text) in synthetic.LENGTH_DISTRIBUTIONS.items()).replace("%", "%%")
    p = commands.add_parser(
        "allocate",
        help="KV slots reserved, used and wasted when memory is reserved in blocks of a given size",
        description="Reserve KV-cache memory for --num-requests requests in blocks of --block-size tokens "
        "(each request reserves ceil(length / block size) blocks) and count reserved, used and wasted "
        "tokens, the waste share, and how many requests fit in --memory-gib at --mb-per-token "
        "(floor(memory / (mean reserved tokens per request x memory per token)); 1 GB = 1,024 MB, "
        "as the article counts). Lengths are drawn with --seed from the family --lengths.",
        epilog="example: kvlab allocate --num-requests 20000 --max-len 4096 --block-size 16 --seed 0 "
        "--lengths article-s1 --json",
    )
    p.add_argument("--num-requests", type=int, default=article.NUM_REQUESTS_S1,
                   help=f"requests (default {article.NUM_REQUESTS_S1})")
    p.add_argument("--max-len", type=int, default=article.MAX_LEN_TOKENS,
                   help="longest allowed request, tokens; lengths are drawn at or below it (default 4096)")
    p.add_argument("--block-size", type=int, default=16, help="reservation unit, tokens per block (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of numpy.random.default_rng for the lengths (default 0)")
    p.add_argument("--lengths", default="article-s1", metavar="NAME",
                   help=f"length family (default article-s1). {families}")
    trace = _add_trace_flags(p, "a request's length is its prompt + output tokens (ContextTokens + GeneratedTokens, "
                             "input_length + output_length, num_prefill_tokens + num_decode_tokens); --num-requests, "
                             "--seed and --lengths are not used")
    trace.add_argument("--drop-over-max-len", action="store_true",
                       help="leave out trace requests longer than --max-len and print how many (default: such "
                       "requests are an error naming how many and the largest)")
    budget = p.add_argument_group("memory budget")
    budget.add_argument("--memory-gib", type=float, default=article.MEMORY_GIB,
                        help=f"KV-cache memory, GB = 2^30 bytes (default {article.MEMORY_GIB})")
    budget.add_argument("--mb-per-token", type=float, default=article.MIB_PER_TOKEN,
                        help=f"KV memory per token, MB = 2^20 bytes (default {article.MIB_PER_TOKEN:g})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run_allocate, flags=ALLOCATE_FLAGS)


def _add_trace_flags(p, lengths_text: str):
    """--trace, --trace-format and --skip-bad-rows, in their own group; returns the group."""
    group = p.add_argument_group("real request trace (replaces the synthetic workload)")
    group.add_argument("--trace", metavar="PATH",
                       help=f"an Azure LLM inference CSV, a Mooncake JSONL or a ShareGPT length CSV; {lengths_text}")
    group.add_argument("--trace-format", default="auto", choices=("auto",) + traces.TRACE_FORMATS,
                       help="format of --trace (default auto: told from the header or first row)")
    group.add_argument("--skip-bad-rows", action="store_true",
                       help="skip malformed rows of --trace and print how many (default: the first is an error "
                       "naming file and line)")
    return group


def load_trace_arg(args, **kwargs) -> traces.TraceLoad:
    """The --trace file as a TraceLoad; an unreadable file is a one-line ValueError naming --trace."""
    try:
        return traces.load_trace(args.trace, args.trace_format, on_bad_row="skip" if args.skip_bad_rows else "raise",
                                 **kwargs)
    except OSError as err:
        validate.fail("trace", args.trace, f"cannot be read ({err.strerror or err})")


def _file_format(path: str) -> str:
    try:
        return traces.file_format(path)
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return "auto"  # load_trace_arg reports the problem in full


def _trace_note(load: traces.TraceLoad) -> dict:
    """The JSON keys a trace adds to a command's result."""
    return {"trace": load.path, "trace_format": load.trace_format, "num_rows": load.num_rows,
            "num_skipped_rows": load.num_skipped}


TRACE_ONLY_FLAGS = ["--trace-format", "--skip-bad-rows", "--drop-over-max-len"]


def check_trace_flags(given: set[str], synthetic_flags: list[str], why: str) -> None:
    """With --trace the synthetic workload's flags are an error (they would be ignored); without it, the trace's."""
    for flag in synthetic_flags:
        exclusive(given, "--trace", [flag], why)
    for flag in TRACE_ONLY_FLAGS:
        requires(given, flag, "--trace", "it describes the --trace file")


def allocate_lengths(args, given: set[str]) -> tuple[np.ndarray, traces.TraceLoad | None, int]:
    """The request lengths `kvlab allocate` accounts for: drawn from --lengths, or prompt + output of --trace
    (its first --num-requests requests when given); with the trace's load and how many of its requests were
    dropped as longer than --max-len."""
    max_requests = validate.in_range("num_requests", args.num_requests, "num_requests")
    if args.trace is None:
        seed = validate.in_range("seed", args.seed, "seed")
        validate.one_of("lengths", args.lengths, synthetic.LENGTH_DISTRIBUTIONS)
        resources.refuse_if_too_big("num_requests", max_requests, alloc.PEAK_BYTES_PER_REQUEST)
        lengths = synthetic.sample_lengths(args.lengths, max_requests, np.random.default_rng(seed),
                                           max_len_tokens=args.max_len)
        return lengths, None, 0
    # Lengths need no arrivals, but a ShareGPT file has no timestamps: give it placeholder Poisson arrivals.
    sharegpt = args.trace_format == "sharegpt" or (args.trace_format == "auto" and _file_format(args.trace) == "sharegpt")
    load = load_trace_arg(args, arrival_rate_per_s=1.0 if sharegpt else None,
                          rng=np.random.default_rng(0) if sharegpt else None,
                          max_requests=max_requests if "--num-requests" in given else None)
    lengths, dropped = traces.request_lengths(load.workload, args.max_len,
                                              over_max_len="drop" if args.drop_over_max_len else "error")
    return lengths, load, dropped


def run_allocate(args, given: set[str]) -> dict:
    """Print reserved, used and wasted tokens, waste % and requests that fit for --block-size tokens."""
    check_trace_flags(given, ["--lengths", "--seed"], "a trace's requests have their own lengths")
    validate.in_range("max_len_tokens", args.max_len, "tokens")
    validate.in_range("block_size", args.block_size, "block_size")
    validate.in_range("memory_gib", args.memory_gib, "memory_gib")
    validate.in_range("mib_per_token", args.mb_per_token, "mib_per_token")
    lengths, load, num_dropped = allocate_lengths(args, given)
    counts = alloc.allocation_counts(lengths, [args.block_size], max_len_tokens=args.max_len,
                                     memory_gib=exact(args.memory_gib), mib_per_token=exact(args.mb_per_token))
    row = {name: values[0] for name, values in counts.items()}
    result = {
        "lengths": args.lengths if args.trace is None else "trace", "num_requests": len(lengths),
        "block_size": args.block_size, "seed": args.seed,
        "reserved_tokens": int(row["reserved_tokens"]), "used_tokens": int(row["used_tokens"]),
        "wasted_tokens": int(row["wasted_tokens"]), "waste_pct": round(float(row["waste_pct"]), 6),
        "max_num_requests": int(row["max_num_requests"]),
        "block_table_entries_per_request": round(float(row["block_table_entries"]), 6),
    }
    if args.trace is not None:
        del result["seed"]
        result |= _trace_note(load) | {"num_dropped_over_max_len": num_dropped}
    if args.json:
        _print_json(result)
        return result
    if args.trace is None:
        print(f"requests             {result['num_requests']:,} ({args.lengths}, seed {args.seed}, at most {args.max_len:,} tokens)")
    else:
        print(f"requests             {result['num_requests']:,} from {result['trace_format']} trace {result['trace']} "
              f"(prompt + output tokens, at most {args.max_len:,})")
        print(f"trace rows           {result['num_rows']:,} read, {result['num_skipped_rows']:,} bad rows skipped, "
              f"{num_dropped:,} requests over --max-len dropped")
    print(f"reserved             {result['reserved_tokens']:,} tokens in blocks of {args.block_size:,}")
    print(f"used                 {result['used_tokens']:,} tokens ({result['used_tokens'] / result['num_requests']:,.1f} per request)")
    print(f"wasted               {result['wasted_tokens']:,} tokens ({result['waste_pct']:.1f}% of reserved)")
    print(f"requests that fit    {result['max_num_requests']:,} in {args.memory_gib:g} GB at {args.mb_per_token:g} MB per token")
    print(f"block-table entries  {result['block_table_entries_per_request']:,.2f} per request")
    return result


# ---------------------------------------------------------------- kvlab simulate
SIMULATE_FLAGS = {
    "policy": "--policy", "max_num_seqs": "--slots", "ms_per_token": "--ms-per-token",
    "num_requests": "--num-requests", "arrival_rate": "--arrival-rate", "lengths": "--lengths",
    "constant_tokens": "--constant-tokens", "tokens": "--constant-tokens", "seed": "--seed",
    "trace_format": "--trace-format", "trace": "--trace", "arrival_rate_per_s": "--arrival-rate",
}


def add_simulate(commands) -> None:
    """Register `kvlab simulate` (static vs continuous batching on a synthetic or trace workload)."""
    p = commands.add_parser(
        "simulate",
        help="serve a workload with static or continuous batching, or vLLM's scheduler, and print latency and throughput",
        description="Section 2's serving model: --slots requests run at once, each holding its slot for output "
        "tokens x --ms-per-token (prompts cost nothing), first come, first served. static: a batch starts "
        "together and holds its slots until its longest request is done; continuous: a freed slot is refilled "
        "at once. vllm: vLLM 0.33's v1 scheduler over one KV budget (kvlab's engine, proven step for step "
        "against vLLM by make parity): every step shares --max-num-batched-tokens between decodes and prefill "
        "chunks, takes blocks of --block-size tokens from a pool of --num-gpu-blocks as requests grow and "
        "preempts (recompute) when the pool is empty; a step lasts --step-ms (or a --cost model). The workload: "
        "--num-requests Poisson arrivals at --arrival-rate with the article's output lengths (--lengths article: "
        "85% uniform 40-200, 15% uniform 400-1,000 tokens) or all equal (--lengths constant). Latency = finish - "
        "arrival; TTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1).",
        epilog="examples: kvlab simulate --policy static --slots 8 --ms-per-token 8 --num-requests 600 "
        "--arrival-rate 11 --lengths article --seed 0 --json | kvlab simulate --policy vllm --trace "
        "AzureLLMInferenceTrace_conv.csv --num-requests 2000 --num-gpu-blocks 1100 --max-model-len 16384 "
        "--step-ms 8 --step-ms-per-token 0.01 --json | kvlab simulate --policy vllm --model facebook/opt-13b "
        "--gpu A100-40GB --cost roofline --prompt-tokens 500 --max-model-len 2048",
    )
    p.add_argument("--policy", default="continuous", choices=list(batching.POLICIES) + ["vllm"],
                   help="static or continuous (section 2's slots) or vllm (vLLM's scheduler; default continuous)")
    engine = p.add_argument_group("slot model (--policy static or continuous)")
    engine.add_argument("--slots", type=int, default=article.MAX_NUM_SEQS,
                        help=f"requests served at once, vLLM's max_num_seqs (default {article.MAX_NUM_SEQS})")
    engine.add_argument("--ms-per-token", type=float, default=article.MS_PER_TOKEN,
                        help=f"time per output token, ms (default {article.MS_PER_TOKEN:g})")
    work = p.add_argument_group("synthetic workload")
    work.add_argument("--num-requests", type=int, default=article.NUM_REQUESTS_S2,
                      help=f"requests (default {article.NUM_REQUESTS_S2})")
    work.add_argument("--arrival-rate", type=float, default=None,
                      help=f"Poisson arrival rate, requests/s (default {synthetic.S2_ARRIVAL_RATE_PER_S:g}, kvlab's "
                      "choice: the article does not give one)")
    work.add_argument("--lengths", default="article", choices=list(synthetic.S2_LENGTHS),
                      help="output lengths: article (the article's mix, default) or constant")
    work.add_argument("--constant-tokens", type=int, default=article.CONSTANT_TOKENS,
                      help=f"output tokens of every request with --lengths constant (default {article.CONSTANT_TOKENS})")
    work.add_argument("--seed", type=int, default=0, help="random seed of arrivals and lengths (default 0)")
    work.add_argument("--prompt-tokens", type=int, default=None,
                      help="prompt tokens of every request, --policy vllm only (default 1: the article's workload "
                      "has no prompts and vLLM needs one token)")
    _add_trace_flags(p, "arrivals are its timestamps relative to the first row and each request's output length "
                     "(GeneratedTokens, output_length, num_decode_tokens) sets its service time (with --policy vllm "
                     "its prompt tokens count too); a ShareGPT file has no timestamps, so it gets Poisson arrivals at "
                     "--arrival-rate drawn with --seed (pass --arrival-rate only for sharegpt); a plain CSV with the "
                     "header arrival_s,prompt_tokens,output_tokens is read too; --num-requests keeps its first "
                     "requests; --lengths and --constant-tokens are not used")
    add_vllm_engine_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run_simulate, flags=SIMULATE_FLAGS)


# The article's KV memory (60 GiB at 0.5 MiB per token) in blocks of 16 tokens, plus vLLM's null block.
ARTICLE_KV_TOKENS = int(article.MEMORY_GIB * 1024 / article.MIB_PER_TOKEN)
ENGINE_DEFAULTS = {"block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 8192,
                   "step_ms": article.MS_PER_TOKEN, "step_ms_per_token": 0.0, "gpu_memory_utilization": 0.9}


def add_vllm_engine_flags(p) -> None:
    """The flags of `kvlab simulate --policy vllm`, in vLLM's names (each applies only with it)."""
    g = p.add_argument_group("vLLM's scheduler (--policy vllm; flags named as vLLM's)")
    g.add_argument("--num-gpu-blocks", type=int, default=None, metavar="N",
                   help="KV blocks of the pool, vLLM's null block included, as vLLM logs num_gpu_blocks (default: "
                   f"the article's {article.MEMORY_GIB:g} GiB at {article.MIB_PER_TOKEN:g} MiB per token = "
                   f"{ARTICLE_KV_TOKENS:,} tokens in blocks of --block-size, + 1), or computed from --model and --gpu")
    g.add_argument("--model", help="a model of data/models.csv: with --gpu, sizes the KV pool as vLLM does "
                   "(weights from its parameter count) and names the model of --cost roofline")
    g.add_argument("--gpu", help="a GPU of data/gpus.csv (memory, bandwidth, bf16 TFLOPS)")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="share of GPU memory vLLM may use, with --model and --gpu (default 0.9)")
    g.add_argument("--kv-cache-dtype", default=None, choices=["fp16", "bf16", "fp8", "int8", "int4"],
                   help="KV cache dtype, with --model and --gpu (default bf16)")
    g.add_argument("--tensor-parallel-size", type=int, default=None,
                   help="GPUs per model replica, with --model and --gpu (default 1)")
    g.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default 16)")
    g.add_argument("--max-num-seqs", type=int, default=None, help="requests running at once, at most (default 256)")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per step, decodes and prefill chunks together (default 8192)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="longest request, tokens: a prompt must be shorter, output stops there (default: --model's "
                   "context, else 8192)")
    g.add_argument("--no-chunked-prefill", action="store_true",
                   help="admit a prompt only if it fits the step's budget left (vLLM: --no-enable-chunked-prefill)")
    g.add_argument("--enable-prefix-caching", action="store_true",
                   help="share full blocks of equal prompt prefixes in the pool (a Mooncake trace's hash ids say which)")
    g.add_argument("--long-prefill-token-threshold", type=int, default=None,
                   help="tokens one request may compute per step when more than one request runs or waits (default "
                   "0: no cap)")
    g.add_argument("--allocation", default="paged", choices=list(vllm_engine.ALLOCATIONS),
                   help="paged (vLLM, default), or a reservation at admission from a token pool of the same memory "
                   "that never preempts: max (max_model_len), pow2 (next power of two of the final length), oracle "
                   "(the final length)")
    g.add_argument("--cost", default=None, choices=STEP_COSTS,
                   help="step time: constant (--step-ms, default), linear (--step-ms + --step-ms-per-token x scheduled "
                   "tokens; the default when --step-ms-per-token is given), roofline (weights + KV read at --gpu's "
                   "bandwidth, or 2 FLOPs per parameter and token at its bf16 peak, whichever is slower), "
                   "calibrated (--calibration FILE) or measured (public operator-level GPU profiles of --model on "
                   "--gpu, data/profiles/; the roofline at the GPU's measured sustained rates for a model without one)")
    g.add_argument("--step-ms", type=float, default=None, help=f"ms per step (default {article.MS_PER_TOKEN:g})")
    g.add_argument("--step-ms-per-token", type=float, default=None, help="ms per scheduled token, linear cost (default 0)")
    g.add_argument("--calibration", metavar="FILE", help="a calibration CSV of kvlab calibrate, for --cost calibrated")
    g.add_argument("--requests-csv", metavar="FILE",
                   help="write one row per request: request_id (0-based input order), arrival_s, prompt_tokens, "
                   "output_tokens, first_scheduled_s, first_token_s, finish_s, num_preemptions")


def simulate_workload(args, given: set[str], peak_bytes_per_request: float) -> tuple[Workload, traces.TraceLoad | None]:
    """The workload `kvlab simulate` serves: a synthetic one from the flags, or the --trace file's requests
    (its first --num-requests when given; with the trace's load)."""
    seed = validate.in_range("seed", args.seed, "seed")
    num_requests = validate.in_range("num_requests", args.num_requests, "num_requests")
    if args.arrival_rate is not None:
        validate.in_range("arrival_rate", args.arrival_rate, "arrival_rate")
    if args.trace is None:
        requires(given, "--constant-tokens", "--lengths", "it sets every output with --lengths constant")
        if "--constant-tokens" in given and args.lengths != "constant":
            raise ValueError(f"--constant-tokens applies only with --lengths constant, not --lengths {args.lengths}")
        resources.refuse_if_too_big("num_requests", num_requests, peak_bytes_per_request)
        rate = synthetic.S2_ARRIVAL_RATE_PER_S if args.arrival_rate is None else args.arrival_rate
        workload = synthetic.article_s2_workload(num_requests, rate, args.lengths, np.random.default_rng(seed),
                                                 constant_tokens=args.constant_tokens)
        return workload, None
    load = load_trace_arg(args, arrival_rate_per_s=args.arrival_rate, rng=np.random.default_rng(seed),
                          max_requests=num_requests if "--num-requests" in given else None)
    if "--seed" in given and not load.poisson_arrivals:
        raise ValueError(f"--seed and --trace cannot be used together: the {load.trace_format} trace has its own "
                         "arrival times (--seed draws Poisson arrivals for a ShareGPT file only)")
    return load.workload, load


def run_simulate(args, given: set[str]) -> dict:
    """Print the serving summary: latency (s), queueing (s), makespan (s), requests/s, busy slot-s, idle share."""
    check_trace_flags(given, ["--lengths", "--constant-tokens"], "a trace's requests have their own output lengths")
    if args.policy == "vllm":
        return run_vllm_simulate(args, given)
    for flag in VLLM_ENGINE_FLAGS + ["--prompt-tokens"]:
        requires_vllm(given, flag)
    cost = TokenCost(validate.in_range("ms_per_token", args.ms_per_token, "ms_per_token"))
    slots = validate.in_range("max_num_seqs", args.slots, "max_num_seqs")
    workload, load = simulate_workload(args, given, batching.PEAK_BYTES_PER_REQUEST)
    result = batching.simulate(workload, args.policy, max_num_seqs=slots, cost=cost)
    summary = result.summary()
    if load is not None:
        summary |= _trace_note(load) | {"poisson_arrivals": load.poisson_arrivals}
    if args.json:
        _print_json(summary)
        return summary
    if load is not None:
        arrivals = (f"Poisson arrivals at {args.arrival_rate:g} requests/s, seed {args.seed}"
                    if load.poisson_arrivals else "arrivals from its timestamps")
        print(f"trace                {summary['trace_format']} {summary['trace']}: {summary['num_rows']:,} rows read, "
              f"{summary['num_skipped_rows']:,} bad rows skipped; {arrivals}")
    print(f"policy               {args.policy}, {args.slots} slots, {args.ms_per_token:g} ms per output token")
    print(f"requests             {summary['num_requests']:,}")
    print(f"latency              mean {summary['mean_latency_s']:,.2f} s, p95 {summary['p95_latency_s']:,.2f} s, "
          f"max {summary['max_latency_s']:,.2f} s")
    print(f"queueing delay       mean {summary['mean_queue_s']:,.2f} s")
    print(f"makespan             {summary['makespan_s']:,.1f} s ({summary['throughput_rps']:,.2f} requests/s)")
    print(f"slot time            {summary['busy_slot_s']:,.1f} s busy, {100 * summary['idle_share']:.1f}% idle")
    return summary


# ---------------------------------------------------------------- kvlab simulate --policy vllm
VLLM_SIMULATE_FLAGS = {
    **{k: v for k, v in SIMULATE_FLAGS.items() if k != "max_num_seqs"},
    "num_gpu_blocks": "--num-gpu-blocks", "model": "--model", "gpu": "--gpu",
    "gpu_memory_utilization": "--gpu-memory-utilization", "kv_cache_dtype": "--kv-cache-dtype",
    "tensor_parallel_size": "--tensor-parallel-size", "block_size": "--block-size", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_model_len": "--max-model-len",
    "enable_chunked_prefill": "--no-chunked-prefill", "enable_prefix_caching": "--enable-prefix-caching",
    "long_prefill_token_threshold": "--long-prefill-token-threshold", "allocation": "--allocation", "cost": "--cost",
    "step_ms": "--step-ms", "step_ms_per_token": "--step-ms-per-token", "calibration": "--calibration",
    "requests_csv": "--requests-csv",
}
VLLM_ENGINE_FLAGS = ["--num-gpu-blocks", "--model", "--gpu", "--gpu-memory-utilization", "--kv-cache-dtype",
                     "--tensor-parallel-size", "--block-size", "--max-num-seqs", "--max-num-batched-tokens",
                     "--max-model-len", "--no-chunked-prefill", "--enable-prefix-caching",
                     "--long-prefill-token-threshold", "--allocation", "--cost", "--step-ms", "--step-ms-per-token",
                     "--calibration", "--requests-csv"]
# Flags that only size the KV pool from a model and a GPU.
SIZING_FLAGS = ["--gpu-memory-utilization", "--kv-cache-dtype"]
REQUESTS_CSV_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_scheduled_s",
                        "first_token_s", "finish_s", "num_preemptions")
VLLM_SUMMARY_KEYS = ("mean_ttft_s", "p95_ttft_s", "mean_tpot_s", "num_preemptions", "num_steps", "peak_kv_blocks",
                     "mean_running", "output_tokens_per_s")


def requires_vllm(given: set[str], flag: str) -> None:
    """A one-line error for an engine flag typed without --policy vllm."""
    requires(given, flag, "--policy vllm", "it sets vLLM's scheduler, not section 2's slots")


def check_vllm_flags(args, given: set[str], cost: str) -> None:
    """Flags that contradict each other or would be ignored with --policy vllm: one line naming both."""
    for flag in ("--slots", "--ms-per-token"):
        if flag in given:
            raise ValueError(f"{flag} and --policy vllm cannot be used together: {flag} is section 2's slot model; "
                             "vLLM's scheduler takes --max-num-seqs and --step-ms")
    exclusive(given, "--num-gpu-blocks", SIZING_FLAGS, "--num-gpu-blocks is the KV pool itself; the sizing flags "
              "compute it from --model and --gpu")
    if "--num-gpu-blocks" in given and cost not in ("roofline", "measured"):
        exclusive(given, "--num-gpu-blocks", ["--model", "--gpu", "--tensor-parallel-size"], "--num-gpu-blocks is "
                  "the KV pool itself; --model and --gpu size it (or name the hardware of --cost roofline)")
    sizing = given & {"--model", "--gpu", "--tensor-parallel-size", *SIZING_FLAGS}
    if sizing and not {"--model", "--gpu"} <= given:
        missing = "--gpu" if "--model" in given else "--model"
        raise ValueError(f"{sorted(sizing)[0]} needs {missing} too: the KV pool (and --cost roofline) is computed from "
                         "a model on a GPU")
    for flag, costs in (("--step-ms", ("constant", "linear")), ("--step-ms-per-token", ("linear",)),
                        ("--calibration", ("calibrated",))):
        if flag in given and cost not in costs:
            raise ValueError(f"{flag} and --cost {cost} cannot be used together: {flag} applies to --cost "
                             f"{' or '.join(costs)}")
    if cost == "calibrated" and not args.calibration:
        raise ValueError("--cost calibrated needs --calibration FILE (a CSV of kvlab calibrate)")
    if args.enable_prefix_caching and args.allocation != "paged":
        raise ValueError(f"--enable-prefix-caching and --allocation {args.allocation} cannot be used together: "
                         "prefix caching shares the paged pool's blocks")
    if args.prompt_tokens is not None:
        exclusive(given, "--prompt-tokens", ["--trace"], "a trace's requests have their own prompts")


def vllm_config(args, model: ModelSpec | None) -> EngineConfig:
    """The engine's settings: the flags given, vLLM's defaults for the rest (synchronous scheduling)."""
    values = {"block_size": args.block_size, "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens,
              "long_prefill_token_threshold": args.long_prefill_token_threshold,
              "kv_cache_dtype": args.kv_cache_dtype, "tensor_parallel_size": args.tensor_parallel_size,
              "gpu_memory_utilization": args.gpu_memory_utilization}
    ranges = {"block_size": "block_size", "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "tokens",
              "tensor_parallel_size": "count"}
    for name, quantity in ranges.items():
        if values[name] is not None:
            validate.in_range(name, values[name], quantity)
    if values["long_prefill_token_threshold"] is not None:
        validate.non_negative_int("long_prefill_token_threshold", values["long_prefill_token_threshold"])
    if args.max_model_len is not None:
        max_model_len = validate.in_range("max_model_len", args.max_model_len, "tokens")
    elif model is not None and model.max_position_embeddings:
        max_model_len = model.max_position_embeddings
    else:
        max_model_len = ENGINE_DEFAULTS["max_model_len"]
    settings = {name: value for name, value in values.items() if value is not None}
    for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
        settings.setdefault(name, ENGINE_DEFAULTS[name])
    return EngineConfig().replace(**settings, max_model_len=max_model_len, async_scheduling=False,
                                  enable_chunked_prefill=not args.no_chunked_prefill,
                                  enable_prefix_caching=args.enable_prefix_caching)


def vllm_pool(args, given: set[str], model: ModelSpec | None, config: EngineConfig) -> tuple[int, str]:
    """num_gpu_blocks (vLLM's null block included) and where it comes from."""
    bs = config.cache.block_size
    if args.num_gpu_blocks is not None:
        return validate.in_range("num_gpu_blocks", args.num_gpu_blocks, "count"), "--num-gpu-blocks"
    if model is None:
        blocks = ARTICLE_KV_TOKENS // bs + 1
        return blocks, (f"the article's {article.MEMORY_GIB:g} GiB at {article.MIB_PER_TOKEN:g} MiB per token "
                        f"({ARTICLE_KV_TOKENS:,} tokens)")
    if model.sliding_window:
        validate.fail("model", model.name, "has sliding-window layers: the engine models one full-attention KV "
                      "cache group (give --num-gpu-blocks for a plain decoder)")
    gpu = models.get_gpu(args.gpu)
    planned = cap.plan_capacity(model, gpu.memory_gib, config.scheduler.max_model_len, config)
    if planned is None:
        validate.fail("gpu", args.gpu, f"leaves no KV memory for {model.name} at gpu_memory_utilization="
                      f"{config.cache.gpu_memory_utilization:g} (see kvlab capacity --model {model.name} --gpu {args.gpu})")
    return planned["num_gpu_blocks"], f"{model.name} on {gpu.name} as vLLM sizes it"


def vllm_cost(args, given: set[str], cost: str, model: ModelSpec | None, config: EngineConfig):
    """The step cost the flags ask for."""
    step_ms = ENGINE_DEFAULTS["step_ms"] if args.step_ms is None else args.step_ms
    if cost == "constant":
        return ConstantStepCost(validate.in_range("step_ms", step_ms, "ms_per_token"))
    if cost == "linear":
        per_token = ENGINE_DEFAULTS["step_ms_per_token"] if args.step_ms_per_token is None else args.step_ms_per_token
        return LinearStepCost(validate.in_range("step_ms", step_ms, "step_ms"),
                              validate.in_range("step_ms_per_token", per_token, "step_ms"))
    if cost == "roofline":
        if model is None:
            raise ValueError("--cost roofline needs --model and --gpu (weights, KV bytes, bandwidth and FLOPS)")
        return RooflineStepCost.from_specs(model, models.get_gpu(args.gpu), config)
    if cost == "measured":
        if model is None:
            raise ValueError("--cost measured needs --model and --gpu (the operator profile of the model on the GPU)")
        return MeasuredStepCost.for_model(model, models.get_gpu(args.gpu), config)
    try:
        return CalibratedStepCost.from_csv(args.calibration)
    except OSError as err:
        validate.fail("calibration", args.calibration, f"cannot be read ({err.strerror or err})")


def vllm_workload(args, given: set[str]) -> tuple[Workload, traces.TraceLoad | None]:
    """The workload of --policy vllm: the synthetic one (prompts of --prompt-tokens) or the --trace file's."""
    if args.trace is None:
        prompt = 1 if args.prompt_tokens is None else validate.in_range("prompt_tokens", args.prompt_tokens, "tokens")
        workload, load = simulate_workload(args, given, vllm_engine.PEAK_BYTES_PER_REQUEST)
        return Workload(workload.arrival_s, np.full(workload.num_requests, prompt), workload.output_tokens,
                        name=workload.name), None
    workload, load = simulate_workload(args, given, vllm_engine.PEAK_BYTES_PER_REQUEST)
    resources.refuse_if_too_big("num_requests", workload.num_requests, vllm_engine.PEAK_BYTES_PER_REQUEST)
    return workload, load


def write_requests_csv(path: str, result) -> None:
    """One row per request, REQUESTS_CSV_COLUMNS, times in full float precision."""
    table = result.requests_table()
    columns = [table[name] for name in REQUESTS_CSV_COLUMNS]
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(",".join(REQUESTS_CSV_COLUMNS) + "\n")
            for row in zip(*(c.tolist() for c in columns)):
                f.write(",".join(repr(v) for v in row) + "\n")
    except OSError as err:
        validate.fail("requests_csv", path, f"cannot be written ({err.strerror or err})")


def run_vllm_simulate(args, given: set[str]) -> dict:
    """Serve the workload with vLLM's scheduler; print TTFT, TPOT, preemptions, steps, KV blocks and throughput."""
    args.flags = VLLM_SIMULATE_FLAGS
    cost_name = args.cost or ("linear" if "--step-ms-per-token" in given else "constant")
    check_vllm_flags(args, given, cost_name)
    model = models.get_model(args.model) if args.model else None
    config = vllm_config(args, model)
    vllm_engine.check_scheduler_config(config.scheduler)
    num_gpu_blocks, pool_source = vllm_pool(args, given, model, config)
    cost = vllm_cost(args, given, cost_name, model, config)
    workload, load = vllm_workload(args, given)
    vllm_engine.check_workload(workload, config, num_gpu_blocks, args.allocation)
    try:
        result = vllm_engine.simulate(workload, config, num_gpu_blocks=num_gpu_blocks, cost=cost,
                                      allocation=args.allocation)
    except vllm_engine.NoProgressError as err:   # a run that cannot go on stops with why, in one line
        raise ValueError(str(err)) from None
    if args.requests_csv:
        write_requests_csv(args.requests_csv, result)
    summary = result.summary()
    scheduler = config.scheduler
    capped = int((result.num_output_tokens < workload.output_tokens).sum())
    out = {"policy": "vllm", "allocation": args.allocation, "num_gpu_blocks": num_gpu_blocks,
           "block_size": config.cache.block_size, "max_num_seqs": scheduler.max_num_seqs,
           "max_num_batched_tokens": scheduler.max_num_batched_tokens, "max_model_len": scheduler.max_model_len,
           "enable_chunked_prefill": scheduler.enable_chunked_prefill,
           "enable_prefix_caching": config.cache.enable_prefix_caching, "cost": cost.name,
           "num_requests": summary["num_requests"], **{k: summary[k] for k in VLLM_SUMMARY_KEYS},
           "num_output_tokens": summary["num_output_tokens"], "num_capped_by_max_model_len": capped,
           "makespan_s": summary["makespan_s"], "mean_kv_token_share": summary["mean_kv_token_share"]}
    if load is not None:
        out |= _trace_note(load) | {"poisson_arrivals": load.poisson_arrivals}
    if args.json:
        _print_json(out)
        return out
    usable = num_gpu_blocks - 1
    if load is not None:
        print(f"trace                {out['trace_format']} {out['trace']}: {out['num_rows']:,} rows read, "
              f"{out['num_skipped_rows']:,} bad rows skipped")
    print(f"engine               vLLM 0.33's scheduler (synchronous), {args.allocation} allocation, "
          f"{num_gpu_blocks:,} GPU blocks of {config.cache.block_size} tokens ({usable:,} usable + vLLM's null block; "
          f"{pool_source})")
    print(f"limits               max_num_seqs {scheduler.max_num_seqs:,}, max_num_batched_tokens "
          f"{scheduler.max_num_batched_tokens:,}, max_model_len {scheduler.max_model_len:,}, chunked prefill "
          f"{'on' if scheduler.enable_chunked_prefill else 'off'}, prefix caching "
          f"{'on' if config.cache.enable_prefix_caching else 'off'}")
    print(f"step cost            {describe_cost(cost)}")
    print(f"requests             {out['num_requests']:,}, {out['num_output_tokens']:,} output tokens"
          + (f" ({capped:,} stopped at max_model_len)" if capped else ""))
    print(f"TTFT                 mean {out['mean_ttft_s']:,.3f} s, p95 {out['p95_ttft_s']:,.3f} s")
    print(f"TPOT                 mean {1e3 * out['mean_tpot_s']:,.2f} ms")
    print(f"preemptions          {out['num_preemptions']:,}")
    print(f"steps                {out['num_steps']:,}; peak KV blocks {out['peak_kv_blocks']:,} of {usable:,}; "
          f"mean running {out['mean_running']:,.1f} requests")
    print(f"throughput           {out['output_tokens_per_s']:,.1f} output tokens/s over {out['makespan_s']:,.1f} s")
    return out


def describe_cost(cost) -> str:
    """The step cost in words, with units."""
    if isinstance(cost, ConstantStepCost):
        return f"constant, {cost.step_ms:g} ms a step"
    if isinstance(cost, LinearStepCost):
        return f"linear, {cost.step_ms:g} ms + {cost.step_ms_per_token:g} ms per scheduled token"
    if isinstance(cost, RooflineStepCost):
        return (f"roofline, {cost.weights_bytes / GIB:.1f} GiB of weights and {cost.kv_bytes_per_token:,.0f} B of KV per "
                f"token at {cost.memory_bandwidth_gb_s:g} GB/s, {cost.bf16_dense_tflops:g} TFLOPS")
    if isinstance(cost, MeasuredStepCost):
        return f"measured, {cost.cost_source}"
    return f"calibrated, {cost.calibration.source}"


# ---------------------------------------------------------------- kvlab calibrate
CALIBRATE_FLAGS = {
    "num_layers": "--num-layers", "num_heads": "--num-heads", "head_dim": "--head-dim", "hidden_size": "--hidden-size",
    "intermediate_size": "--intermediate-size", "vocab_size": "--vocab-size", "dtype": "--dtype", "device": "--device",
    "batch_sizes": "--batch-sizes", "context_tokens": "--contexts", "prompt_tokens": "--prompts",
    "kv_tokens": "--kv-tokens", "warmup": "--warmup", "repeats": "--repeats", "time_limit_s": "--time-limit-s",
    "memory_fraction": "--memory-fraction",
}


def add_calibrate(commands) -> None:
    """Register `kvlab calibrate` (measured KV bytes per token, decode and prefill times in ms)."""
    p = commands.add_parser(
        "calibrate",
        help="measure KV bytes per token, decode step time and prefill time of a random-weight decoder (needs PyTorch)",
        description="Builds a Llama-like decoder with random weights (nothing is downloaded; the article's shape by "
        "default: 32 layers, 32 heads, head dim 128, hidden 4096, bf16) and measures on --device: KV bytes per token "
        "(torch.cuda.memory_allocated before and after caching --kv-tokens tokens; on the CPU the cache tensors' "
        "bytes), the decode step time for every --batch-sizes x --contexts (median of --repeats after --warmup, CUDA "
        "events on a GPU) and the prefill time of each --prompts. Writes one CSV (default "
        "data/calibration/<device>.csv) that kvlab.core.cost.CalibratedCost.from_csv loads. Needs PyTorch: "
        "pip install 'kvlab[calibrate]'.",
        epilog="examples: kvlab calibrate --device cuda | kvlab calibrate --device cpu --quick --out /tmp/cpu.csv",
    )
    model = p.add_argument_group("decoder (the article's model by default)")
    model.add_argument("--num-layers", type=int, help="decoder layers (default 32)")
    model.add_argument("--num-heads", type=int, help="attention heads per layer, as many K/V heads (default 32)")
    model.add_argument("--head-dim", type=int, help="values per head (default 128)")
    model.add_argument("--hidden-size", type=int, help="model width, values (default: heads x head dim, 4096)")
    model.add_argument("--intermediate-size", type=int, help="MLP width, values (default: 2.6875 x hidden, 11008 at 4096)")
    model.add_argument("--vocab-size", type=int, help="vocabulary, tokens (default 32000)")
    model.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                       help="weights and KV dtype (default bfloat16; float32 with --quick on the CPU)")
    grid = p.add_argument_group("measurement grid")
    grid.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where to measure (default cuda)")
    grid.add_argument("--quick", action="store_true",
                      help="a tiny grid (batch 1-4, contexts 16-64, prompts 16-64 tokens; on the CPU also a tiny "
                      "decoder: 2 layers, 4 heads, head dim 16) for a check in seconds")
    grid.add_argument("--batch-sizes", type=int, nargs="+", help="requests per decode step (default 1 2 4 ... 256)")
    grid.add_argument("--contexts", type=int, nargs="+",
                      help="tokens cached per request before a decode step (default 1024 2048 ... 32768)")
    grid.add_argument("--prompts", type=int, nargs="+", help="prompt lengths for the prefill time, tokens (default 128 ... 32768)")
    grid.add_argument("--kv-tokens", type=int, help="tokens cached to measure KV bytes per token (default 4096; --quick 32)")
    grid.add_argument("--warmup", type=int, default=3, help="untimed runs before each point (default 3)")
    grid.add_argument("--repeats", type=int, default=10, help="timed runs per point; the median is kept (default 10)")
    grid.add_argument("--memory-fraction", type=float, default=0.85,
                      help="skip a point whose cache needs more than this fraction of free GPU memory (default 0.85)")
    grid.add_argument("--time-limit-s", type=float, default=300.0,
                      help="seconds after which the remaining points are skipped and listed in the file (default 300)")
    p.add_argument("--out", help="CSV to write (default data/calibration/<device name>.csv)")
    p.add_argument("--json", action="store_true", help="print one JSON object (path, metadata, rows) instead of text")
    p.set_defaults(run=run_calibrate, flags=CALIBRATE_FLAGS)


def run_calibrate(args, given: set[str]) -> dict:
    """Measure the decoder on --device and write the calibration CSV; print where and how many points."""
    from kvlab.core import calibration as calibrate

    calibrate.import_torch()  # the one-line install hint before any work
    base = calibrate.TINY_SHAPE if args.quick and args.device == "cpu" else calibrate.DecoderShape()
    given = {name: getattr(args, name) for name in ("num_layers", "num_heads", "head_dim", "hidden_size",
                                                    "intermediate_size", "vocab_size", "dtype")}
    given = {name: value for name, value in given.items() if value is not None}
    if "hidden_size" not in given and ("num_heads" in given or "head_dim" in given):
        given["hidden_size"] = given.get("num_heads", base.num_heads) * given.get("head_dim", base.head_dim)
    if "intermediate_size" not in given and given.get("hidden_size", base.hidden_size) != base.hidden_size:
        given["intermediate_size"] = round(2.6875 * given["hidden_size"])
    shape = dataclasses.replace(base, **given)
    grid = calibrate.QUICK_GRID if args.quick else calibrate.FULL_GRID
    metadata, rows = calibrate.measure(
        shape, device=args.device, batch_sizes=args.batch_sizes or grid["batch_sizes"],
        context_tokens=args.contexts or grid["context_tokens"], prompt_tokens=args.prompts or grid["prompt_tokens"],
        kv_tokens=args.kv_tokens or (32 if args.quick else 4096), warmup=args.warmup, repeats=args.repeats,
        memory_fraction=args.memory_fraction, time_limit_s=args.time_limit_s,
        log=(lambda message: None) if args.json else None)
    path = calibrate.write_csv(args.out or calibrate.default_path(metadata), metadata, rows)
    result = {"path": str(path), "metadata": metadata, "rows": rows}
    if args.json:
        _print_json(result)
    else:
        print(f"wrote {path} ({len(rows)} measurements on {metadata['gpu_name']}, {metadata['seconds']} s; "
              f"skipped: {metadata['skipped']})")
    return result


# ---------------------------------------------------------------- kvlab report, kvlab traces
def add_report(commands) -> None:
    """Register `kvlab report` (execute the notebooks, write report/: HTML, PDF, ledger.csv)."""
    from pathlib import Path

    from kvlab.report.build import REPORT_DIR, ROOT

    p = commands.add_parser(
        "report",
        help="build report/: execute every notebook with the parameters file, render HTML and one PDF, write the ledger",
        description="Executes notebooks/NN_*.ipynb with papermill, using the parameters and seeds of --params "
        "(a notebook's own defaults for the rest), renders each as HTML without code, writes index.html, "
        "report.pdf and ledger.csv. Every parameter is checked before any notebook runs; the build happens in a "
        "temporary folder that replaces --out only when every notebook succeeded.",
        epilog="examples: kvlab report | kvlab report --set 03_capacity.GPU_MEMORY_GIB=141 | kvlab report --set SEED=3",
    )
    p.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="parameters file (YAML; default params.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="[NOTEBOOK.]NAME=VALUE", dest="overrides",
                   help="override one parameter (without NOTEBOOK: every notebook that has NAME); repeatable")
    p.add_argument("--out", type=Path, default=REPORT_DIR, help="output folder (default report/)")
    p.add_argument("--no-pdf", action="store_true", help="skip report.pdf (faster)")
    p.add_argument("--max-minutes", type=float, default=120.0,
                   help="refuse, before any notebook runs, a report estimated to take longer on this machine, "
                   "minutes (default 120; the default parameters take about 1)")
    p.set_defaults(run=run_report, flags={"max_minutes": "--max-minutes"})


def run_report(args, given: set[str]) -> dict:
    """Build the report; a bad parameter or a failed notebook is one `report: error:` line and status 1."""
    from kvlab.report.build import build
    from kvlab.report.params import ReportError

    try:
        build(args.params, args.overrides, args.out, pdf=not args.no_pdf,
              max_minutes=validate.in_range("max_minutes", args.max_minutes, "seconds"))
    except ReportError as error:
        print(f"\nreport: error: {error}", file=sys.stderr)
        print("report: nothing was written; " + ("the previous report is unchanged"
                                                 if (args.out / "index.html").exists() else "no report exists yet"),
              file=sys.stderr)
        raise SystemExit(1) from None
    return {}


def add_traces(commands) -> None:
    """Register `kvlab traces download` (fetch the public request traces and check their sha256)."""
    from kvlab.workloads.traces import MANIFEST_PATH, REPO_DIR

    p = commands.add_parser("traces", help="the public request traces: download them and check their sha256",
                            description="The real request traces kvlab reads (data/traces.toml lists them with "
                            "their sources, licences and sha256).")
    sub = p.add_subparsers(dest="traces_command", metavar="ACTION", parser_class=OneLineParser, required=True)
    down = sub.add_parser("download", help="download the traces of data/traces.toml and check their sha256",
                          description="Fetches each trace of the manifest into --dest and checks its sha256; a file "
                          "already there with the right hash is kept, a mismatch leaves nothing behind.")
    down.add_argument("--dest", default=str(REPO_DIR / "data" / "traces"), help="folder to write the files to (default data/traces)")
    down.add_argument("--manifest", default=str(MANIFEST_PATH), help="the manifest (TOML) listing the files")
    down.add_argument("--trace", action="append", dest="names", help="only this trace (repeatable)")
    down.set_defaults(run=run_traces_download, flags={"trace": "--trace"})


def run_traces_download(args, given: set[str]) -> dict:
    """Fetch and verify the traces; print one line per trace."""
    from kvlab.workloads.download import download

    try:
        lines = download(args.dest, args.manifest, args.names)
    except OSError as err:
        raise ValueError(f"dest={args.dest!r} is not allowed: {err.strerror or err}") from None
    for line in lines:
        print(line)
    return {"traces": lines}


COMMANDS = [add_capacity, add_allocate, add_simulate, add_calibrate, add_report, add_traces]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `kvlab` parser with every command of COMMANDS, and each command's own parser by name."""
    parser = OneLineParser(
        prog="kvlab",
        description="kvlab: KV-cache memory in LLM serving. Each command prints its figures with units; "
        "--json gives one machine-readable object.",
    )
    parser.add_argument("--version", action="version", version=f"kvlab {__import__('kvlab').__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for add in COMMANDS:
        add(commands)
    return parser, dict(commands.choices)


def main(argv: list[str] | None = None) -> int:
    """Run one kvlab command; 0 on success, 2 with a one-line error on bad input."""
    parser, command_parsers = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    given = typed_flags(argv if argv is not None else sys.argv[1:])
    try:
        args.run(args, given)
        sys.stdout.flush()
    except ValueError as error:
        return _flag_error(command_parsers.get(args.command, parser), error, args.flags, given)
    except BrokenPipeError:  # e.g. `kvlab ... --json | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
