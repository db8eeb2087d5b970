"""`kvlab simulate`: serve a workload with section 2's static or continuous batching, or vLLM's scheduler.

Parsing and printing only: the flags' defaults are the config objects' (kvlab.core.config), what a config checks it
checks itself (its ValueError names the field, which becomes the flag), the KV pool is sized by kvlab.core.pool and
the per-request CSV written by kvlab.core.requests_csv; the engine refuses a workload it could never serve.
The parser needs the policies, the engine's allocations and the step costs, so kvlab.core.batching, cost and engine
(numpy, no more) are imported here at the top, beside the small numpy-free modules the run uses (models, capacity,
resources)."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from kvlab.cli.common import (
    add_quantization_flag,
    apply_quantization,
    exclusive,
    model_from_flags,
    print_json,
    requires,
)
from kvlab.cli.trace_flags import add_trace_flags, check_trace_flags, file_format, load_trace_arg, trace_note
from kvlab.core import article, batching, capacity, models, resources, validate
from kvlab.core import engine as vllm_engine
from kvlab.core.config import KV_CACHE_DTYPES, CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig
from kvlab.core.cost import HARDWARE_STEP_COSTS, STEP_COSTS, make_step_cost
from kvlab.core.models import ModelSpec
from kvlab.core.pool import ARTICLE_KV_TOKENS, size_kv_pool
from kvlab.core.requests_csv import REQUESTS_CSV_COLUMNS, write_requests_csv
from kvlab.core.service_time import TokenServiceTime
from kvlab.core.workload import Workload
from kvlab.workloads import synthetic, traces

SIMULATE_FLAGS = {
    "policy": "--policy",
    "max_num_seqs": "--slots",
    "ms_per_token": "--ms-per-token",
    "num_requests": "--num-requests",
    "arrival_rate": "--arrival-rate",
    "lengths": "--lengths",
    "constant_tokens": "--constant-tokens",
    "tokens": "--constant-tokens",
    "seed": "--seed",
    "trace_format": "--trace-format",
    "trace": "--trace",
    "arrival_rate_per_s": "--arrival-rate",
}


def add(commands) -> None:
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
    p.add_argument(
        "--policy",
        default="continuous",
        choices=list(batching.POLICIES) + ["vllm"],
        help="static or continuous (section 2's slots) or vllm (vLLM's scheduler; default continuous)",
    )
    engine = p.add_argument_group("slot model (--policy static or continuous)")
    engine.add_argument(
        "--slots",
        type=int,
        default=article.MAX_NUM_SEQS,
        help=f"requests served at once, vLLM's max_num_seqs (default {article.MAX_NUM_SEQS})",
    )
    engine.add_argument(
        "--ms-per-token",
        type=float,
        default=article.MS_PER_TOKEN,
        help=f"time per output token, ms (default {article.MS_PER_TOKEN:g})",
    )
    work = p.add_argument_group("synthetic workload")
    work.add_argument(
        "--num-requests",
        type=int,
        default=article.NUM_REQUESTS_S2,
        help=f"requests (default {article.NUM_REQUESTS_S2})",
    )
    work.add_argument(
        "--arrival-rate",
        type=float,
        default=None,
        help=f"Poisson arrival rate, requests/s (default {synthetic.S2_ARRIVAL_RATE_PER_S:g}, kvlab's "
        "choice: the article does not give one)",
    )
    work.add_argument(
        "--lengths",
        default="article",
        choices=list(synthetic.S2_LENGTHS),
        help="output lengths: article (the article's mix, default) or constant",
    )
    work.add_argument(
        "--constant-tokens",
        type=int,
        default=article.CONSTANT_TOKENS,
        help=f"output tokens of every request with --lengths constant (default {article.CONSTANT_TOKENS})",
    )
    work.add_argument("--seed", type=int, default=0, help="random seed of arrivals and lengths (default 0)")
    work.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="prompt tokens of every request, --policy vllm only (default 1: the article's workload "
        "has no prompts and vLLM needs one token)",
    )
    add_trace_flags(
        p,
        "arrivals are its timestamps relative to the first row and each request's output length "
        "(GeneratedTokens, output_length, num_decode_tokens) sets its service time (with --policy vllm "
        "its prompt tokens count too); a ShareGPT file has no timestamps, so it gets Poisson arrivals at "
        "--arrival-rate drawn with --seed (pass --arrival-rate only for sharegpt); a plain CSV with the "
        "header arrival_s,prompt_tokens,output_tokens is read too; --num-requests keeps its first "
        "requests; --lengths and --constant-tokens are not used",
    )
    add_vllm_engine_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run, flags=SIMULATE_FLAGS)


# The longest request without --max-model-len or a model's own context: the engine's default, tokens.
DEFAULT_MAX_MODEL_LEN = vllm_engine.DEFAULT_CONFIG.scheduler.max_model_len


def add_vllm_engine_flags(p) -> None:
    """The flags of `kvlab simulate --policy vllm`, in vLLM's names (each applies only with it)."""
    g = p.add_argument_group("vLLM's scheduler (--policy vllm; flags named as vLLM's)")
    g.add_argument(
        "--num-gpu-blocks",
        type=int,
        default=None,
        metavar="N",
        help="KV blocks of the pool, vLLM's null block included, as vLLM logs num_gpu_blocks (default: "
        f"the article's {article.MEMORY_GIB:g} GiB at {article.MIB_PER_TOKEN:g} MiB per token = "
        f"{ARTICLE_KV_TOKENS:,} tokens in blocks of --block-size, + 1), or computed from --model and --gpu",
    )
    g.add_argument(
        "--model",
        help="a model of data/models.csv: with --gpu, sizes the KV pool as vLLM does "
        "(weights from its parameter count) and names the model of --cost roofline; a model with sliding-window "
        "layers (e.g. google/gemma-3-27b-it) is served with vLLM's KV cache groups, over --num-gpu-blocks where "
        "given (vLLM's --num-gpu-blocks-override); with --enable-prefix-caching too, except Mamba hybrids",
    )
    g.add_argument(
        "--config",
        metavar="PATH",
        help="a Hugging Face config.json instead of --model (read locally, as kvlab capacity --config reads it)",
    )
    g.add_argument(
        "--num-params-b",
        type=float,
        help="parameters of the --config model, billions (default: counted from the config.json)",
    )
    add_quantization_flag(g)
    g.add_argument("--gpu", help="a GPU of data/gpus.csv (memory, bandwidth, bf16 TFLOPS)")
    cache, parallel, scheduler = CacheConfig, ParallelConfig, SchedulerConfig  # their fields' defaults: vLLM's
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=cache.gpu_memory_utilization,
        help=f"share of GPU memory vLLM may use, with --model and --gpu (default {cache.gpu_memory_utilization:g})",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default=cache.kv_cache_dtype,
        choices=KV_CACHE_DTYPES,
        help=f"KV cache dtype, with --model and --gpu (default {cache.kv_cache_dtype})",
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=parallel.tensor_parallel_size,
        help=f"GPUs per model replica, with --model and --gpu (default {parallel.tensor_parallel_size})",
    )
    g.add_argument(
        "--data-parallel-size",
        type=int,
        default=parallel.data_parallel_size,
        metavar="N",
        help="engine cores (ranks) of a mixture-of-experts model, with --model and --gpu or --num-gpu-blocks (one "
        "rank's pool): each its own scheduler and KV cache, stepping in lockstep, requests dealt by vLLM's "
        f"load-balancing rule (default {parallel.data_parallel_size})",
    )
    g.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="whole experts on each of the DP x TP GPUs (vLLM's flag): the measured step cost times each GPU's "
        "experts and their dispatch",
    )
    g.add_argument(
        "--block-size", type=int, default=cache.block_size, help=f"tokens per KV block (default {cache.block_size})"
    )
    g.add_argument(
        "--max-num-seqs",
        type=int,
        default=scheduler.max_num_seqs,
        help=f"requests running at once, at most (default {scheduler.max_num_seqs})",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=scheduler.max_num_batched_tokens,
        help=f"tokens per step, decodes and prefill chunks together (default {scheduler.max_num_batched_tokens})",
    )
    g.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest request, tokens: a prompt must be shorter, output stops there (default: --model's "
        f"context, else {DEFAULT_MAX_MODEL_LEN})",
    )
    g.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=scheduler.async_scheduling,
        help="schedule the next batch before this one's output is known, a batch queue of two (default "
        f"{'on' if scheduler.async_scheduling else 'off'}: vLLM 0.33's default on a GPU); "
        "--no-async-scheduling, vLLM's own flag, for the synchronous engine",
    )
    g.add_argument(
        "--no-chunked-prefill",
        action="store_true",
        help="admit a prompt only if it fits the step's budget left (vLLM: --no-enable-chunked-prefill)",
    )
    g.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="share full blocks of equal prompt prefixes in the pool (a Mooncake trace's hash ids say which)",
    )
    g.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=scheduler.long_prefill_token_threshold,
        help="tokens one request may compute per step when more than one request runs or waits (default "
        f"{scheduler.long_prefill_token_threshold}: no cap)",
    )
    g.add_argument(
        "--allocation",
        default="paged",
        choices=list(vllm_engine.ALLOCATIONS),
        help="paged (vLLM, default), or a reservation at admission from a token pool of the same memory "
        "that never preempts: max (max_model_len), pow2 (prompt + next power of two of the output), oracle "
        "(the final length)",
    )
    g.add_argument(
        "--cost",
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
    g.add_argument("--step-ms", type=float, default=None, help=f"ms per step (default {article.MS_PER_TOKEN:g})")
    g.add_argument(
        "--step-ms-per-token", type=float, default=None, help="ms per scheduled token, linear cost (default 0)"
    )
    g.add_argument("--calibration", metavar="FILE", help="a calibration CSV of kvlab calibrate, for --cost calibrated")
    g.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="a closed loop, vLLM bench's --max-concurrency: a request is sent once fewer than N are in flight (sent, "
        "last token not yet out), in the workload's order, never before its arrival; arrivals are all at t=0 "
        "(vLLM bench's default request rate, inf) or Poisson at --arrival-rate; a --trace gives its lengths only; "
        "TTFT and latency count from the send, the --requests-csv arrival_s column is it (default: open loop)",
    )
    g.add_argument(
        "--requests-csv",
        metavar="FILE",
        help=f"write one row per request: {', '.join(REQUESTS_CSV_COLUMNS)} (request_id: 0-based input "
        "order; scheduling: async or sync)",
    )


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
        workload = synthetic.article_s2_workload(
            num_requests, rate, args.lengths, np.random.default_rng(seed), constant_tokens=args.constant_tokens
        )
        if getattr(args, "max_concurrency", None) is not None and args.arrival_rate is None:
            workload = dataclasses.replace(workload, arrival_s=np.zeros(num_requests))  # vLLM bench's rate inf
        return workload, None
    closed = getattr(args, "max_concurrency", None) is not None
    rate = args.arrival_rate
    if closed:  # the file's lengths only: a ShareGPT file's arrivals are drawn at any rate, then replaced
        fmt = args.trace_format if args.trace_format != "auto" else file_format(args.trace)
        rate = (rate or 1.0) if fmt == "sharegpt" else None
    load = load_trace_arg(
        args,
        arrival_rate_per_s=rate,
        rng=np.random.default_rng(seed),
        max_requests=num_requests if "--num-requests" in given else None,
    )
    if closed:
        if "--seed" in given and args.arrival_rate is None:
            raise ValueError(
                "--seed applies with --trace and --max-concurrency only beside --arrival-rate: the closed loop sends "
                "the trace's requests from t=0, and --seed draws Poisson arrivals at --arrival-rate"
            )
        return closed_loop_arrivals(load.workload, args.arrival_rate, seed), load
    if "--seed" in given and not load.poisson_arrivals:
        raise ValueError(
            f"--seed and --trace cannot be used together: the {load.trace_format} trace has its own "
            "arrival times (--seed draws Poisson arrivals for a ShareGPT file only)"
        )
    return load.workload, load


def closed_loop_arrivals(workload: Workload, rate: float | None, seed: int) -> Workload:
    """A closed loop's open-loop arrivals, vLLM bench's --request-rate: all at t=0 (its default, inf), or Poisson at
    rate requests/s drawn with seed; the workload's lengths and prefixes kept."""
    n = workload.num_requests
    arrival = np.zeros(n) if rate is None else synthetic.poisson_arrivals(n, rate, np.random.default_rng(seed))
    return dataclasses.replace(workload, arrival_s=arrival)


def run(args, given: set[str]) -> dict:
    """Print the serving summary: latency (s), queueing (s), makespan (s), requests/s, busy slot-s, idle share."""
    check_trace_flags(given, ["--lengths", "--constant-tokens"], "a trace's requests have their own output lengths")
    if args.policy == "vllm":
        return run_vllm_simulate(args, given)
    for flag in VLLM_ENGINE_FLAGS + ["--prompt-tokens"]:
        requires_vllm(given, flag)
    cost = TokenServiceTime(args.ms_per_token)
    slots = validate.in_range("max_num_seqs", args.slots, "max_num_seqs")
    workload, load = simulate_workload(args, given, batching.PEAK_BYTES_PER_REQUEST)
    result = batching.simulate(workload, args.policy, max_num_seqs=slots, cost=cost)
    summary = result.summary()
    if load is not None:
        summary |= trace_note(load) | {"poisson_arrivals": load.poisson_arrivals}
    if args.json:
        print_json(summary)
        return summary
    if load is not None:
        arrivals = (
            f"Poisson arrivals at {args.arrival_rate:g} requests/s, seed {args.seed}"
            if load.poisson_arrivals
            else "arrivals from its timestamps"
        )
        print(
            f"trace                {summary['trace_format']} {summary['trace']}: {summary['num_rows']:,} rows read, "
            f"{summary['num_skipped_rows']:,} bad rows skipped; {arrivals}"
        )
    print(f"policy               {args.policy}, {args.slots} slots, {args.ms_per_token:g} ms per output token")
    print(f"requests             {summary['num_requests']:,}")
    print(
        f"latency              mean {summary['mean_latency_s']:,.2f} s, p95 {summary['p95_latency_s']:,.2f} s, "
        f"max {summary['max_latency_s']:,.2f} s"
    )
    print(f"queueing delay       mean {summary['mean_queue_s']:,.2f} s")
    print(f"makespan             {summary['makespan_s']:,.1f} s ({summary['throughput_rps']:,.2f} requests/s)")
    print(f"slot time            {summary['busy_slot_s']:,.1f} s busy, {100 * summary['idle_share']:.1f}% idle")
    return summary


# ---------------------------------------------------------------- kvlab simulate --policy vllm
VLLM_SIMULATE_FLAGS = {
    **{k: v for k, v in SIMULATE_FLAGS.items() if k != "max_num_seqs"},
    "num_gpu_blocks": "--num-gpu-blocks",
    "model": "--model",
    "config": "--config",
    "num_params_b": "--num-params-b",
    "quantization": "--quantization",
    "gpu": "--gpu",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "tensor_parallel_size": "--tensor-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "enable_expert_parallel": "--enable-expert-parallel",
    "block_size": "--block-size",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_model_len": "--max-model-len",
    "enable_chunked_prefill": "--no-chunked-prefill",
    "enable_prefix_caching": "--enable-prefix-caching",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "allocation": "--allocation",
    "cost": "--cost",
    "async_scheduling": "--async-scheduling",
    "step_ms": "--step-ms",
    "step_ms_per_token": "--step-ms-per-token",
    "calibration": "--calibration",
    "requests_csv": "--requests-csv",
    "max_concurrency": "--max-concurrency",
}
VLLM_ENGINE_FLAGS = [
    "--num-gpu-blocks",
    "--model",
    "--config",
    "--num-params-b",
    "--quantization",
    "--gpu",
    "--gpu-memory-utilization",
    "--kv-cache-dtype",
    "--tensor-parallel-size",
    "--data-parallel-size",
    "--enable-expert-parallel",
    "--block-size",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--max-model-len",
    "--no-chunked-prefill",
    "--enable-prefix-caching",
    "--long-prefill-token-threshold",
    "--allocation",
    "--cost",
    "--step-ms",
    "--step-ms-per-token",
    "--calibration",
    "--requests-csv",
    "--max-concurrency",
    "--async-scheduling",
    "--no-async-scheduling",
]
# Flags that only size the KV pool from a model and a GPU.
SIZING_FLAGS = ["--gpu-memory-utilization", "--kv-cache-dtype", "--quantization"]
VLLM_SUMMARY_KEYS = (
    "mean_ttft_s",
    "p95_ttft_s",
    "mean_tpot_s",
    "num_preemptions",
    "num_steps",
    "peak_kv_blocks",
    "mean_running",
    "output_tokens_per_s",
)


def requires_vllm(given: set[str], flag: str) -> None:
    """A one-line error for an engine flag typed without --policy vllm."""
    requires(given, flag, "--policy vllm", "it sets vLLM's scheduler, not section 2's slots")


def check_vllm_flags(args, given: set[str], cost: str) -> None:
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
    if "--num-gpu-blocks" in given and cost not in HARDWARE_STEP_COSTS:
        exclusive(
            given,
            "--num-gpu-blocks",
            ["--gpu", "--tensor-parallel-size"],
            "--num-gpu-blocks is "
            "the KV pool itself; --model and --gpu size it (or name the hardware of --cost roofline)",
        )
    model_flag = "--config" if "--config" in given else "--model"  # --config names the model from a config.json
    sizing = given & {model_flag, "--gpu", "--tensor-parallel-size", *SIZING_FLAGS}
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
    if cost == "calibrated" and not args.calibration:
        raise ValueError("--cost calibrated needs --calibration FILE (a CSV of kvlab calibrate)")
    if args.enable_prefix_caching and args.allocation != "paged":
        raise ValueError(
            f"--enable-prefix-caching and --allocation {args.allocation} cannot be used together: "
            "prefix caching shares the paged pool's blocks"
        )
    if args.prompt_tokens is not None:
        exclusive(given, "--prompt-tokens", ["--trace"], "a trace's requests have their own prompts")


def vllm_config(args, model: ModelSpec | None) -> EngineConfig:
    """The engine's settings from the flags (whose defaults are the config objects'); max_model_len from
    --max-model-len, else the model's context, else the engine's default. Each config checks its own values."""
    max_model_len = args.max_model_len
    if max_model_len is None:
        max_model_len = (
            model.max_position_embeddings
            if model is not None and model.max_position_embeddings
            else DEFAULT_MAX_MODEL_LEN
        )
    cache = CacheConfig(
        block_size=args.block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    scheduler = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=not args.no_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        async_scheduling=args.async_scheduling,
    )
    parallel = ParallelConfig(
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=args.data_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel,
    )
    return EngineConfig(cache, parallel, scheduler)


def check_data_parallel(model: ModelSpec | None, config: EngineConfig) -> None:
    """Data and expert parallelism need a mixture-of-experts model (one-line errors): vLLM runs a dense model's
    data-parallel ranks as independent engines, which kvlab serves as one rank on its share of the load."""
    parallel = config.parallel
    if parallel.data_parallel_size == 1 and not parallel.enable_expert_parallel:
        return
    if model is None:
        flag = "--data-parallel-size" if parallel.data_parallel_size > 1 else "--enable-expert-parallel"
        raise ValueError(f"{flag} needs --model (or --config): only a mixture-of-experts model's ranks step together")
    capacity.check_expert_parallel(model, config)
    if parallel.data_parallel_size > 1 and model.expert_params_b <= 0:
        validate.fail(
            "data_parallel_size",
            parallel.data_parallel_size,
            f"serves a mixture-of-experts model's ranks in lockstep, and {model.name} is dense (vLLM runs its ranks "
            "as independent engines): drop --data-parallel-size and serve one rank on its share of the requests",
        )


def vllm_pool(args, model: ModelSpec | None, config: EngineConfig) -> tuple[int, str]:
    """num_gpu_blocks (vLLM's null block included) and where it comes from: --num-gpu-blocks, else
    kvlab.core.pool."""
    if args.num_gpu_blocks is not None:
        return validate.in_range("num_gpu_blocks", args.num_gpu_blocks, "count"), "--num-gpu-blocks"
    return size_kv_pool(config, model, args.gpu)


def vllm_cost(args, given: set[str], cost: str, model: ModelSpec | None, config: EngineConfig):
    """The step cost the flags ask for (kvlab.core.cost.make_step_cost), each flag checked first."""
    if cost in ("constant", "linear"):  # the step cost checks its own figures (defaults: make_step_cost's)
        return make_step_cost(cost, step_ms=args.step_ms, step_ms_per_token=args.step_ms_per_token)
    if cost in HARDWARE_STEP_COSTS:
        if model is None:
            raise ValueError(f"--cost {cost} needs --model and --gpu ({HARDWARE_NEEDS[cost]})")
        return make_step_cost(cost, model=model, gpu=models.get_gpu(args.gpu), config=config)
    try:
        return make_step_cost(cost, calibration=args.calibration)
    except OSError as err:
        validate.fail("calibration", args.calibration, f"cannot be read ({err.strerror or err})")


# What a step cost of a model on a GPU reads from them, for the line that asks for --model and --gpu.
HARDWARE_NEEDS = {
    "roofline": "weights, KV bytes, bandwidth and FLOPS",
    "measured": "the operator profile of the model on the GPU",
    "vllm-2023": "its weights and layers, the GPU's bandwidth and FLOPS",
}


def vllm_workload(args, given: set[str]) -> tuple[Workload, traces.TraceLoad | None]:
    """The workload of --policy vllm: the synthetic one (prompts of --prompt-tokens) or the --trace file's."""
    if args.trace is None:
        prompt = 1 if args.prompt_tokens is None else validate.in_range("prompt_tokens", args.prompt_tokens, "tokens")
        workload, load = simulate_workload(args, given, vllm_engine.PEAK_BYTES_PER_REQUEST)
        return Workload(
            workload.arrival_s, np.full(workload.num_requests, prompt), workload.output_tokens, name=workload.name
        ), None
    workload, load = simulate_workload(args, given, vllm_engine.PEAK_BYTES_PER_REQUEST)
    resources.refuse_if_too_big("num_requests", workload.num_requests, vllm_engine.PEAK_BYTES_PER_REQUEST)
    return workload, load


def run_vllm_simulate(args, given: set[str]) -> dict:
    """Serve the workload with vLLM's scheduler; print TTFT, TPOT, preemptions, steps, KV blocks and throughput."""
    args.flags = VLLM_SIMULATE_FLAGS
    cost_name = args.cost or ("linear" if "--step-ms-per-token" in given else "constant")
    check_vllm_flags(args, given, cost_name)
    if args.max_concurrency is not None:
        vllm_engine.check_max_concurrency(args.max_concurrency)
    model = apply_quantization(model_from_flags(args, given), args.quantization)
    config = vllm_config(args, model)
    check_data_parallel(model, config)
    num_gpu_blocks, pool_source = vllm_pool(args, model, config)
    cost = vllm_cost(args, given, cost_name, model, config)
    workload, load = vllm_workload(args, given)
    groups = None if model is None else capacity.engine_kv_cache_groups(model, config)
    try:  # the engine refuses its config, pool and workload in one line before any step
        result = vllm_engine.simulate(
            workload, config, num_gpu_blocks=num_gpu_blocks, cost=cost, allocation=args.allocation,
            kv_cache_groups=groups, max_concurrency=args.max_concurrency,
        )  # fmt: skip
    except vllm_engine.NoProgressError as err:  # a run that cannot go on stops with why, in one line
        raise ValueError(str(err)) from None
    if args.requests_csv:
        write_requests_csv(args.requests_csv, result, config.scheduler.async_scheduling)
    summary = result.summary()
    scheduler = config.scheduler
    capped = int((result.num_output_tokens < workload.output_tokens).sum())
    out = {
        "policy": "vllm",
        "async_scheduling": scheduler.async_scheduling,
        "allocation": args.allocation,
        "num_gpu_blocks": num_gpu_blocks,
        "block_size": config.cache.block_size,
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_model_len": scheduler.max_model_len,
        "enable_chunked_prefill": scheduler.enable_chunked_prefill,
        "enable_prefix_caching": config.cache.enable_prefix_caching,
        "cost": cost_name,
        "cost_source": describe_cost(cost, cost_name),
        "num_requests": summary["num_requests"],
        **{k: summary[k] for k in VLLM_SUMMARY_KEYS},
        "num_output_tokens": summary["num_output_tokens"],
        "num_capped_by_max_model_len": capped,
        "makespan_s": summary["makespan_s"],
        "mean_kv_token_share": summary["mean_kv_token_share"],
    }
    if args.max_concurrency is not None:
        out["max_concurrency"] = args.max_concurrency
    if model is not None:
        out["quantization"] = model.quantization or "none"
    if groups is not None:
        out["kv_cache_groups"] = describe_groups(groups)
    ranks = config.parallel.data_parallel_size
    if ranks > 1:
        out |= {
            "data_parallel_size": ranks,
            "enable_expert_parallel": config.parallel.enable_expert_parallel,
            "requests_per_rank": np.bincount(result.data_parallel_rank, minlength=ranks).tolist(),
        }
    if load is not None:  # a closed loop draws its own arrivals: Poisson only at --arrival-rate
        poisson = load.poisson_arrivals if args.max_concurrency is None else args.arrival_rate is not None
        out |= trace_note(load) | {"poisson_arrivals": poisson}
    if args.json:
        print_json(out)
        return out
    usable = num_gpu_blocks - 1
    if load is not None:
        print(
            f"trace                {out['trace_format']} {out['trace']}: {out['num_rows']:,} rows read, "
            f"{out['num_skipped_rows']:,} bad rows skipped"
        )
    mode = (
        "asynchronous: the next batch is scheduled before this one's output, vLLM's default"
        if scheduler.async_scheduling
        else "synchronous: --no-async-scheduling"
    )
    print(
        f"engine               vLLM 0.33's scheduler ({mode}), {args.allocation} allocation, "
        f"{num_gpu_blocks:,} GPU blocks of {config.cache.block_size} tokens ({usable:,} usable + vLLM's null block; "
        f"{pool_source})"
    )
    if groups is not None:
        print(f"KV cache groups      {out['kv_cache_groups']}")
    print(
        f"limits               max_num_seqs {scheduler.max_num_seqs:,}, max_num_batched_tokens "
        f"{scheduler.max_num_batched_tokens:,}, max_model_len {scheduler.max_model_len:,}, chunked prefill "
        f"{'on' if scheduler.enable_chunked_prefill else 'off'}, prefix caching "
        f"{'on' if config.cache.enable_prefix_caching else 'off'}"
    )
    if ranks > 1:
        print(
            f"data parallel        {ranks} ranks in lockstep (vLLM's mixture-of-experts data parallelism"
            + (", expert parallel" if config.parallel.enable_expert_parallel else "")
            + f"), each with the pool above; requests per rank {', '.join(f'{n:,}' for n in out['requests_per_rank'])}"
            " (vLLM's load-balancing rule)"
        )
    if args.max_concurrency is not None:
        print(
            f"closed loop          at most {args.max_concurrency:,} requests in flight (vLLM bench's "
            "--max-concurrency), each sent in order as one finishes; TTFT counts from the send"
        )
    print(f"step cost            {out['cost_source']}")
    print(
        f"requests             {out['num_requests']:,}, {out['num_output_tokens']:,} output tokens"
        + (f" ({capped:,} stopped at max_model_len)" if capped else "")
    )
    print(f"TTFT                 mean {out['mean_ttft_s']:,.3f} s, p95 {out['p95_ttft_s']:,.3f} s")
    print(f"TPOT                 mean {1e3 * out['mean_tpot_s']:,.2f} ms")
    print(f"preemptions          {out['num_preemptions']:,}")
    print(
        f"steps                {out['num_steps']:,}; peak KV blocks {out['peak_kv_blocks']:,} of {ranks * usable:,}"
        + (" (all ranks)" if ranks > 1 else "")
        + "; "
        f"mean running {out['mean_running']:,.1f} requests"
    )
    print(f"throughput           {out['output_tokens_per_s']:,.1f} output tokens/s over {out['makespan_s']:,.1f} s")
    return out


KINDS_OF_WINDOW = {"sliding_attention": "sliding window", "chunked_local_attention": "attention chunk"}


def describe_groups(groups) -> str:
    """A hybrid model's KV cache groups in words: how many of each kind, their windows and block sizes."""
    kinds: dict[tuple, int] = {}
    for g in groups:
        key = (g.kind, g.sliding_window or g.attention_chunk_size, g.block_size)
        kinds[key] = kinds.get(key, 0) + 1
    what = {"full_attention": "full attention", "mamba": "Mamba states"}
    parts = [
        f"{n} of {what.get(kind) or f'a {window:,}-token {KINDS_OF_WINDOW[kind]}'} ({bs:,} tokens a block)"
        for (kind, window, bs), n in kinds.items()
    ]
    return f"{len(groups)} sharing the pool: " + ", ".join(parts) + " (vLLM's hybrid KV cache manager)"


def describe_cost(cost, name: str) -> str:
    """The step cost of the family name asked for (--cost) in words, with units and where its numbers come from
    (the JSON's cost_source)."""
    return f"{name}, {cost.describe()}"
