"""The flags of vLLM's engine on `kvlab simulate --policy vllm`, each named as vLLM names it (kvlab.studies.serving's
FLAGS, vLLM's names from kvlab.core.config.VLLM_FLAGS), and what they may not be typed beside; their defaults are the
options' (kvlab.studies.serving.ServingOptions: vLLM's, kvlab.core.config)."""

from __future__ import annotations

import argparse

from kvlab.cli.common import add_flag, add_quantization_flag, exclusive, flag_table
from kvlab.core import article
from kvlab.core.config import KV_CACHE_DTYPES
from kvlab.core.cost import HARDWARE_STEP_COSTS, STEP_COSTS
from kvlab.core.engine import ALLOCATIONS
from kvlab.core.fleet.routers import ROUTERS
from kvlab.core.pool import ARTICLE_KV_TOKENS
from kvlab.core.requests_csv import REQUESTS_CSV_COLUMNS
from kvlab.studies.serving import DEFAULT_MAX_MODEL_LEN, FLAGS, ServingOptions

# The options' flags for one-line errors (kvlab.cli.common.flag_error), kvlab simulate's own beside them.
ENGINE_FLAGS = flag_table(
    "num_gpu_blocks",
    "model",
    "num_params_b",
    "quantization",
    "gpu",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "enable_prefix_caching",
    "long_prefill_token_threshold",
    "allocation",
    "cost",
    "async_scheduling",
    "step_ms",
    "step_ms_per_token",
    "calibration",
    "max_concurrency",
    "num_instances",
    "router",
    "prefill_instances",
    "decode_instances",
    "kv_transfer_link",
    config="--config",
    enable_chunked_prefill="--no-chunked-prefill",
    requests_csv="--requests-csv",
)
# Flags that only size the KV pool from a model and a GPU.
SIZING_FLAGS = [FLAGS[name] for name in ("gpu_memory_utilization", "kv_cache_dtype", "quantization")]


def add_engine_flags(p) -> list[str]:
    """Add the flags of `kvlab simulate --policy vllm`, in vLLM's names (each applies only with it); returns them
    (each option string, in order)."""
    g = p.add_argument_group("vLLM's scheduler (--policy vllm; flags named as vLLM's)")
    add_flag(
        g,
        "num_gpu_blocks",
        type=int,
        default=None,
        metavar="N",
        help="KV blocks of the pool, vLLM's null block included, as vLLM logs num_gpu_blocks (default: "
        f"the article's {article.MEMORY_GIB:g} GiB at {article.MIB_PER_TOKEN:g} MiB per token = "
        f"{ARTICLE_KV_TOKENS:,} tokens in blocks of --block-size, + 1), or computed from --model and --gpu",
    )
    add_flag(
        g,
        "model",
        help="a model of data/models.csv: with --gpu, sizes the KV pool as vLLM does "
        "(weights from its parameter count) and names the model of --cost roofline; a model with sliding-window "
        "layers (e.g. google/gemma-3-27b-it) is served with vLLM's KV cache groups, over --num-gpu-blocks where "
        "given (vLLM's --num-gpu-blocks-override); with --enable-prefix-caching too, except Mamba hybrids",
    )
    add_flag(
        g,
        "hf_config_path",
        metavar="PATH",
        help="a Hugging Face config.json instead of --model (read locally, as kvlab capacity --config reads it)",
    )
    add_flag(
        g,
        "num_params_b",
        type=float,
        help="parameters of the --config model, billions (default: counted from the config.json)",
    )
    add_quantization_flag(g)
    add_flag(g, "gpu", help="a GPU of data/gpus.csv (memory, bandwidth, bf16 TFLOPS)")
    defaults = ServingOptions  # the options' defaults: vLLM's (kvlab.core.config)
    add_flag(
        g,
        "gpu_memory_utilization",
        type=float,
        default=defaults.gpu_memory_utilization,
        help=f"share of GPU memory vLLM may use, with --model and --gpu (default {defaults.gpu_memory_utilization:g})",
    )
    add_flag(
        g,
        "kv_cache_dtype",
        default=defaults.kv_cache_dtype,
        choices=KV_CACHE_DTYPES,
        help=f"KV cache dtype, with --model and --gpu (default {defaults.kv_cache_dtype})",
    )
    add_flag(
        g,
        "tensor_parallel_size",
        type=int,
        default=defaults.tensor_parallel_size,
        help=f"GPUs per model replica, with --model and --gpu (default {defaults.tensor_parallel_size})",
    )
    add_flag(
        g,
        "data_parallel_size",
        type=int,
        default=defaults.data_parallel_size,
        metavar="N",
        help="engine cores (ranks) of a mixture-of-experts model, with --model and --gpu or --num-gpu-blocks (one "
        "rank's pool): each its own scheduler and KV cache, stepping in lockstep, requests dealt by vLLM's "
        f"load-balancing rule (default {defaults.data_parallel_size})",
    )
    add_flag(
        g,
        "enable_expert_parallel",
        action="store_true",
        help="whole experts on each of the DP x TP GPUs (vLLM's flag): the measured step cost times each GPU's "
        "experts and their dispatch",
    )
    for name, words in (
        ("block_size", "tokens per KV block"),
        ("max_num_seqs", "requests running at once, at most"),
        ("max_num_batched_tokens", "tokens per step, decodes and prefill chunks together"),
    ):
        default = getattr(defaults, name)
        add_flag(g, name, type=int, default=default, help=f"{words} (default {default})")
    add_flag(
        g,
        "max_model_len",
        type=int,
        default=None,
        help="longest request, tokens: a prompt must be shorter, output stops there (default: --model's "
        f"context, else {DEFAULT_MAX_MODEL_LEN})",
    )
    add_flag(
        g,
        "async_scheduling",
        action=argparse.BooleanOptionalAction,
        default=defaults.async_scheduling,
        help="schedule the next batch before this one's output is known, a batch queue of two (default "
        f"{'on' if defaults.async_scheduling else 'off'}: vLLM 0.33's default on a GPU); "
        "--no-async-scheduling, vLLM's own flag, for the synchronous engine",
    )
    g.add_argument(
        "--no-chunked-prefill",
        dest="enable_chunked_prefill",
        action="store_false",
        help="admit a prompt only if it fits the step's budget left (vLLM: --no-enable-chunked-prefill)",
    )
    add_flag(
        g,
        "enable_prefix_caching",
        action="store_true",
        help="share full blocks of equal prompt prefixes in the pool (a Mooncake trace's hash ids say which)",
    )
    add_flag(
        g,
        "long_prefill_token_threshold",
        type=int,
        default=defaults.long_prefill_token_threshold,
        help="tokens one request may compute per step when more than one request runs or waits (default "
        f"{defaults.long_prefill_token_threshold}: no cap)",
    )
    add_flag(
        g,
        "allocation",
        default="paged",
        choices=list(ALLOCATIONS),
        help="paged (vLLM, default), or a reservation at admission from a token pool of the same memory "
        "that never preempts: max (max_model_len), pow2 (prompt + next power of two of the output), oracle "
        "(the final length)",
    )
    add_flag(
        g,
        "cost",
        default=None,
        choices=STEP_COSTS,
        help="step time: constant (--step-ms, default), linear (--step-ms + --step-ms-per-token x scheduled "
        "tokens; the default when --step-ms-per-token is given), roofline (weights + KV read at --gpu's "
        "bandwidth, or 2 FLOPs per parameter and token at its bf16 peak, whichever is slower), "
        "calibrated (--calibration FILE), measured (public operator-level GPU profiles of --model, or of a "
        "model of its layer shapes, on --gpu, data/profiles/; where a profile measures only the linear layers, those "
        "and the rest at the GPU's measured sustained rates; the roofline at those rates for a model without one; "
        "with tensor parallelism's all-reduces, the attention's cost of decodes of unequal length where the profile "
        "fits it, and vLLM's scheduler's CPU time) "
        "or vllm-2023 (the vLLM of mid-2023 that section 6 runs, its coefficients fitted to measurements of "
        "it, data/vllm_2023/)",
    )
    add_flag(g, "step_ms", type=float, default=None, help=f"ms per step (default {article.MS_PER_TOKEN:g})")
    add_flag(g, "step_ms_per_token", type=float, default=None, help="ms per scheduled token, linear cost (default 0)")
    add_flag(g, "calibration", metavar="FILE", help="a calibration CSV of kvlab calibrate, for --cost calibrated")
    add_flag(
        g,
        "max_concurrency",
        type=int,
        default=None,
        metavar="N",
        help="a closed loop, vLLM bench's --max-concurrency: a request is sent once fewer than N are in flight (sent, "
        "last token not yet out), in the workload's order, never before its arrival; arrivals are all at t=0 "
        "(vLLM bench's default request rate, inf) or Poisson at --arrival-rate; a --trace gives its lengths only; "
        "TTFT and latency count from the send, the --requests-csv arrival_s column is it (default: open loop)",
    )
    add_flag(
        g,
        "num_instances",
        type=int,
        default=None,
        metavar="N",
        help="a fleet: N engines (vLLM instances), each with the pool and step cost above, behind --router, on one "
        "clock (default 1: one engine)",
    )
    add_flag(
        g,
        "router",
        choices=list(ROUTERS),
        help="which instance of the fleet serves each request, at its arrival: round-robin (default with "
        "--instances), least-loaded (fewest running + waiting), session and prefix-aware (vLLM production-stack's; "
        "kvlab's workloads carry no session ids, so session routes by its load fallback), llm-d (its default "
        "scorers: queue, KV-cache usage, prefix cache), dynamo-kv (NVIDIA Dynamo's KV router: prefill blocks after "
        "its cache overlap + decode blocks); each as its public code writes it (kvlab.core.fleet.routers), its random "
        "tie-breaks from --seed (default 0)",
    )
    add_flag(
        g,
        "prefill_instances",
        type=int,
        default=None,
        metavar="X",
        help="disaggregated prefill and decode (with --decode-instances): X instances prefill each request (vLLM's "
        "max_tokens=1 request) and hold its blocks until a decode instance has read them over --kv-transfer-link (NIXL's "
        "connector, vLLM's synchronous scheduler: add --no-async-scheduling); each side's instances take requests in "
        "turn; --json adds TTFT's parts (queue, prefill, decode_queue, transfer, first_decode) and each side's counts",
    )
    add_flag(
        g, "decode_instances", type=int, default=None, metavar="Y", help="the decode instances of --prefill-instances"
    )
    add_flag(
        g,
        "kv_transfer_link",
        choices=["same-node", "rdma-400g"],
        default=None,
        help="the link a request's KV crosses from its prefill to its decode instance, at its datasheet bandwidth (a "
        "lower bound): same-node (the GPUs' NVLink or PCIe, data/profiles/interconnects.csv) or rdma-400g (one 400 Gb/s "
        "NIC a GPU; default)",
    )
    g.add_argument(
        "--requests-csv",
        metavar="FILE",
        help=f"write one row per request: {', '.join(REQUESTS_CSV_COLUMNS)} (request_id: 0-based input "
        "order; scheduling: async or sync; a fleet's: instance before scheduling)",
    )
    return [option for action in g._group_actions for option in action.option_strings]


def check_engine_flags(given: set[str], options: ServingOptions) -> None:
    """Flags that contradict each other or would be ignored with --policy vllm: one line naming both."""
    for flag in ("--slots", "--ms-per-token"):
        if flag in given:
            raise ValueError(
                f"{flag} and --policy vllm cannot be used together: {flag} is section 2's slot model; "
                "vLLM's scheduler takes --max-num-seqs and --step-ms"
            )
    exclusive(
        given,
        "--num-gpu-blocks",
        SIZING_FLAGS,
        "--num-gpu-blocks is the KV pool itself; the sizing flags compute it from --model and --gpu",
    )
    cost = options.cost_name
    if "--num-gpu-blocks" in given and cost not in HARDWARE_STEP_COSTS:
        exclusive(
            given,
            "--num-gpu-blocks",
            [FLAGS["gpu"], FLAGS["tensor_parallel_size"]],
            "--num-gpu-blocks is "
            "the KV pool itself; --model and --gpu size it (or name the hardware of --cost roofline)",
        )
    model_flag = "--config" if "--config" in given else "--model"  # --config names the model from a config.json
    sizing = given & {model_flag, FLAGS["gpu"], FLAGS["tensor_parallel_size"], *SIZING_FLAGS}
    if "--num-gpu-blocks" in given:  # --model alone: its KV cache groups over exactly those blocks
        sizing -= {model_flag}
    if sizing and not {model_flag, "--gpu"} <= given:
        missing = "--gpu" if model_flag in given else "--model"
        raise ValueError(
            f"{sorted(sizing)[0]} needs {missing} too: the KV pool (and --cost roofline) is computed from "
            "a model on a GPU"
        )
    for flag, costs in (
        ("--step-ms", ("constant", "linear")),
        ("--step-ms-per-token", ("linear",)),
        ("--calibration", ("calibrated",)),
    ):
        if flag in given and cost not in costs:
            raise ValueError(
                f"{flag} and --cost {cost} cannot be used together: {flag} applies to --cost {' or '.join(costs)}"
            )
    exclusive(given, "--prompt-tokens", ["--trace"], "a trace's requests have their own prompts")
