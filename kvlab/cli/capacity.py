"""`kvlab capacity`: KV bytes per token, memory per request and requests that fit (the article's or vLLM's accounting).

Parsing, calling and printing: the article's accounting is kvlab.core.capacity's; vLLM's is kvlab.studies.sizing's
(the model, the EngineConfig and max_model_len as kvlab.studies.serving makes them for kvlab simulate too), whose
ValueErrors name the option, which becomes its flag. vLLM's flags, and the checks of flags typed together, are
kvlab.cli.sizing_flags'."""

from __future__ import annotations

from kvlab.cli.common import add_flag, options_of
from kvlab.cli.printing import print_json, print_line
from kvlab.cli.sizing_flags import ARTICLE_FLAGS, CAPACITY_FLAGS, add_sizing_flags, check_capacity_flags
from kvlab.core import article
from kvlab.core import capacity as cap
from kvlab.core.units import exact, unit_bytes


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
    add_flag(model, "model", help="a model of data/models.csv, e.g. Qwen3-14B (close matches listed on a miss)")
    add_flag(model, "hf_config_path", help="path of a Hugging Face config.json to read the model from (no hub access)")
    model.add_argument(
        "--num-layers", type=int, default=article.NUM_LAYERS, help=f"decoder layers (default {article.NUM_LAYERS})"
    )
    model.add_argument(
        "--num-kv-heads",
        type=int,
        default=article.NUM_KV_HEADS,
        help=f"K/V heads per layer (default {article.NUM_KV_HEADS})",
    )
    model.add_argument(
        "--num-attention-heads",
        type=int,
        help="query heads per layer (default: the fewest that --attention and TP allow)",
    )
    model.add_argument(
        "--head-dim", type=int, default=article.HEAD_DIM, help=f"values per head (default {article.HEAD_DIM})"
    )
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
    add_sizing_flags(p)
    p.add_argument("--context", type=int, default=1000, help="context length of one request, tokens (default 1000)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run, flags=CAPACITY_FLAGS)


def run(args, given: set[str]) -> dict:
    """Print the article's capacity figures (bytes, requests), or vLLM's when any vLLM flag is given."""
    vllm = bool(given - ARTICLE_FLAGS)
    check_capacity_flags(given, vllm)
    if vllm:
        return run_vllm_capacity(args)
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
    print_line(
        "KV bytes per token", f"{result['kv_bytes_per_token']:,} B ({result['kv_bytes_per_token'] / 2**10:,.1f} KiB)"
    )
    print_line(
        "memory per request",
        f"{result['bytes_per_request'] / scale:,.3f} {args.unit} at {args.context:,} tokens "
        f"({result['bytes_per_request']:,} B)",
    )
    print_line(
        "free for KV cache",
        f"{result['free_bytes'] / scale:,.3f} {args.unit} ({gpu_memory:g} {args.unit} GPU - {weights:g} {args.unit} "
        "weights)",
    )
    print_line("requests that fit", f"{result['max_num_requests']:,}")
    return result


def run_vllm_capacity(args) -> dict:
    """Print the figures vLLM logs for the model and per-GPU budget (bytes, blocks, tokens, concurrency x)."""
    from kvlab.studies.sizing import SizingOptions, layout_flags, size

    sizing = size(options_of(args, SizingOptions, default_max_model_len=args.context))
    result, model, parallel = sizing.figures, sizing.model, sizing.config.parallel
    if args.json:
        print_json(result)
        return result
    print_line(
        "model",
        f"{model.name} ({model.attention}, {model.num_layers} layers, "
        f"{cap.kv_heads_per_gpu(model, parallel.tensor_parallel_size)} KV heads x {model.head_dim} per GPU)",
    )
    print_line(
        "cache",
        f"{result['kv_cache_dtype']}, block size {result['block_size']}, TP {parallel.tensor_parallel_size}, "
        f"PP {parallel.pipeline_parallel_size}"
        + (f", DP {parallel.data_parallel_size}" if parallel.data_parallel_size > 1 else "")
        + (" + EP" if parallel.enable_expert_parallel else ""),
    )
    print_line(
        "KV bytes per token",
        f"{result['kv_bytes_per_token']:,} B per GPU ({result['kv_bytes_per_token'] / 2**10:,.1f} KiB; article's "
        "model: 512.0 KiB)",
    )
    if sizing.memory is not None:
        print_line(
            "budget per GPU",
            f"{result['gpu_memory_gib']:g} GiB x {result['gpu_memory_utilization']:g} - {result['weights_gib']:.2f} "
            f"GiB weights{weights_note(args, sizing)} - {result['activation_peak_gib']:g} GiB activation peak - "
            f"{result['non_torch_gib']:g} GiB non-torch",
        )
    for line in cap.vllm_log_lines(result):
        print(line)
    print(
        f"# GPU blocks: {result['num_gpu_blocks']:,} ({result['blocks_per_request']:,} per request of "
        f"{sizing.max_model_len:,} tokens: {result['max_concurrency']:.2f}x)"
    )
    if parallel.data_parallel_size > 1:
        ranks = parallel.data_parallel_size
        print(
            f"# {ranks} data-parallel ranks on {parallel.world_size} GPUs, each as above (its own pool and "
            f"scheduler): {ranks * result['num_gpu_blocks']:,} blocks, {ranks * result['max_concurrency']:.2f}x in all"
        )
    if not result["starts"]:
        fix = f"use {layout_flags(sizing.layouts)}, " if sizing.layouts else ""
        print(
            f"note: vLLM refuses to start: {result['refusal']} ({fix}lower --max-model-len or raise "
            f"--gpu-memory-utilization)"
        )
    return result


def weights_note(args, sizing) -> str:
    """Where the budget's weights come from, in words (none where --weights-gib gave them)."""
    model, parallel = sizing.model, sizing.config.parallel
    if args.weights_gib is not None:
        return ""
    if model.num_params_b <= 0:
        if args.config:
            return " (the article's default: kvlab cannot count this config.json's parameters; give --weights-gib)"
        return " (default)"
    experts = model.expert_params_b and parallel.data_parallel_size > 1
    return (
        f" ({model.num_params_b:g}B parameters"
        + (f", {model.quantization} as vLLM loads them" if model.quantization else "")
        + (
            f", {model.expert_params_b:.2f}B of them routed experts split over {parallel.world_size} GPUs"
            if experts
            else ""
        )
        + ")"
    )
