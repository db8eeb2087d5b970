"""The flags of vLLM's accounting on `kvlab capacity` (kvlab.studies.sizing): the vLLM cache settings and the memory
budget, each named as vLLM names it (FLAGS, vLLM's names from kvlab.core.config.VLLM_FLAGS) and showing the options'
defaults (kvlab.studies.sizing.SizingOptions'), the table of the command's flags for one-line errors, and what flags
may not be typed together. kvlab.studies.sizing itself is imported by the run: its options cost their making."""

from __future__ import annotations

import argparse

from kvlab.cli.common import add_flag, add_quantization_flag, exclusive
from kvlab.core import article
from kvlab.core import capacity as cap
from kvlab.core.config import ATTENTION_BACKENDS, KV_CACHE_DTYPES
from kvlab.studies.serving import FLAGS, ServingOptions

CAPACITY_FLAGS = {
    name: FLAGS[name]
    for name in (
        "num_layers num_kv_heads head_dim unit num_attention_heads attention kv_lora_rank qk_rope_head_dim "
        "kv_cache_dtype tensor_parallel_size pipeline_parallel_size data_parallel_size enable_expert_parallel "
        "block_size max_model_len max_num_batched_tokens available_kv_gib gpu_memory_gib weights_gib "
        "gpu_memory_utilization activation_peak_gib non_torch_gib model gpu weight_dtype attention_backend quantization"
    ).split()
} | {
    "dtype_bytes": "--dtype-bytes",
    "gpu_memory": FLAGS["gpu_memory_gib"],
    "weights": FLAGS["weights_gib"],
    "context_tokens": "--context",
    "config": FLAGS["hf_config_path"],
}
# The article's accounting: any other flag switches `kvlab capacity` to vLLM's.
ARTICLE_FLAGS = {"--num-layers", "--num-kv-heads", "--head-dim", "--dtype-bytes", "--gpu-memory-gib", "--weights-gib"}
ARTICLE_FLAGS |= {"--unit", "--context", "--json"}


def add_sizing_flags(p) -> None:
    """Add the vLLM cache settings and the memory budget per GPU, each a group."""
    o = ServingOptions  # the options' defaults: vLLM's settings
    cache = p.add_argument_group("vLLM cache settings")
    add_flag(
        cache,
        "kv_cache_dtype",
        choices=KV_CACHE_DTYPES,
        help=f"KV cache dtype (default {o.kv_cache_dtype}): fp8 1 B/value; int8 1 B + fp32 scale per token and head; "
        "int4 0.5 B + fp8 scale per 16 values (vLLM's nvfp4)",
    )
    add_flag(
        cache,
        "tensor_parallel_size",
        type=int,
        help=f"GPUs splitting each layer (default {o.tensor_parallel_size}): KV heads per GPU = max(1, KV heads / TP)",
    )
    add_flag(
        cache,
        "pipeline_parallel_size",
        type=int,
        help=f"GPUs splitting the layers (default {o.pipeline_parallel_size}): vLLM groups the whole model's "
        "layers once, each stage's "
        "block holds its largest share of a group, and the stage with the fewest blocks binds",
    )
    add_flag(
        cache,
        "data_parallel_size",
        type=int,
        help=f"engine cores (ranks, default {o.data_parallel_size}), each of TP x PP GPUs with its own KV "
        "cache: the figures are one "
        "rank's, as each rank logs them; a mixture-of-experts model's routed experts are split over all DP x TP "
        "GPUs, so each holds fewer weights",
    )
    add_flag(
        cache,
        "enable_expert_parallel",
        action="store_true",
        help="hold whole experts on each of the DP x TP GPUs instead of a slice of every expert (the same bytes "
        "per GPU; mixture-of-experts models only)",
    )
    add_flag(cache, "block_size", type=int, help=f"tokens per KV block (default {o.block_size})")
    add_flag(
        cache,
        "max_model_len",
        type=int,
        help="tokens per request for the concurrency figure (default: the model's max_position_embeddings, else --context)",
    )
    add_flag(
        cache,
        "max_num_batched_tokens",
        type=int,
        help=f"tokens per step (default {o.max_num_batched_tokens}): a sliding-window layer keeps window - 1 "
        "+ the tokens in "
        "flight, (PP + 1) x this with async scheduling, PP x this without",
    )
    add_flag(
        cache,
        "async_scheduling",
        action=argparse.BooleanOptionalAction,
        help="schedule the next step before this one's tokens are known (default on, vLLM 0.33's default "
        "on a GPU; --no-async-scheduling for a vLLM run with that flag, or with its V1 model runner at "
        "PP > 1, which turns it off)",
    )
    add_flag(
        cache,
        "disable_hybrid_kv_cache_manager",
        action="store_true",
        help="sliding-window layers hold every token, as vLLM without its hybrid manager (vLLM's default "
        "is on; a vLLM without CUDA, on an unknown platform, turns it off)",
    )
    add_flag(
        cache,
        "attention_backend",
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
    add_flag(budget, "gpu", help="a GPU of data/gpus.csv for its memory, e.g. H100-SXM-80GB")
    budget.add_argument(
        "--gpu-memory-gib", type=float, help=f"GPU memory, in --unit (default {article.GPU_MEMORY_GIB})"
    )
    add_flag(
        budget,
        "gpu_memory_utilization",
        type=float,
        help=f"fraction of GPU memory vLLM may use (default {o.gpu_memory_utilization:g})",
    )
    budget.add_argument(
        "--weights-gib",
        type=float,
        help=f"memory held by the weights per GPU, in --unit (default {article.WEIGHTS_GIB}; with --model: "
        "parameters x "
        "--weight-dtype / (TP x PP))",
    )
    budget.add_argument(
        "--weight-dtype",
        choices=sorted(cap.WEIGHT_DTYPE_BYTES),
        help="weight dtype for the weights estimate (default bf16)",
    )
    add_quantization_flag(budget)
    budget.add_argument(
        "--activation-peak-gib", type=float, help=f"activation peak per GPU, GiB (default {cap.ACTIVATION_PEAK_GIB})"
    )
    budget.add_argument(
        "--non-torch-gib",
        type=float,
        help=f"non-torch memory per GPU (NCCL, CUDA context), GiB (default {cap.NON_TORCH_GIB})",
    )
    budget.add_argument(
        "--unit",
        default="GiB",
        choices=["GiB", "GB"],
        help="unit of --gpu-memory-gib and --weights-gib: GiB = 2^30 bytes (default, as the article), GB = 10^9",
    )


SHAPE_FLAGS = [FLAGS[name] for name in ("num_layers", "num_kv_heads", "head_dim", "num_attention_heads", "attention")]
SHAPE_FLAGS += [FLAGS["kv_lora_rank"], FLAGS["qk_rope_head_dim"]]
BUDGET_FLAGS = [
    FLAGS[name] for name in ("gpu", "gpu_memory_gib", "weights_gib", "weight_dtype", "gpu_memory_utilization")
]
BUDGET_FLAGS += [FLAGS["activation_peak_gib"], FLAGS["non_torch_gib"], FLAGS["unit"]]


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
        FLAGS["quantization"],
        ["--weights-gib", "--available-kv-gib", "--weight-dtype"],
        "--quantization sets how the estimated weights are held",
    )
    if "--unit" in given and not given & {"--gpu-memory-gib", "--weights-gib"}:
        raise ValueError("--unit applies only to --gpu-memory-gib and --weights-gib, and neither was given")
    if vllm:
        first = sorted(given - ARTICLE_FLAGS)[0]
        exclusive(
            given,
            "--dtype-bytes",
            [first],
            "--dtype-bytes is the article's accounting; vLLM's takes --kv-cache-dtype (fp16, bf16, fp8, int8, int4)",
        )
        exclusive(given, "--context", [FLAGS["max_model_len"]], "in vLLM's accounting --max-model-len is the context")
