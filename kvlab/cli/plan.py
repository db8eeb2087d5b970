"""`kvlab plan`: the vLLM configurations that serve a workload within its service-level objectives.

The parser needs nothing beyond the standard library and kvlab.cli's own modules; the search (kvlab.studies.plan,
with the engine, the capacity code and the step costs) is imported inside the run, so `kvlab plan --help` and a
refused flag answer at once."""

from __future__ import annotations

import dataclasses
import math

from kvlab.cli.common import add_quantization_flag, apply_quantization, model_from_flags, print_json
from kvlab.cli.trace_flags import add_trace_flags, check_trace_flags, load_trace_arg, trace_note
from kvlab.studies.plan_space import Objectives, SearchSpace, knob_value

PLAN_FLAGS = {
    "ttft_p95_s": "--slo-ttft-p95-s",
    "tpot_p95_ms": "--slo-tpot-p95-ms",
    "e2e_p95_s": "--slo-e2e-p95-s",
    "tensor_parallel_size": "--tensor-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "block_size": "--block-size",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "enable_chunked_prefill": "--chunked-prefill",
    "enable_prefix_caching": "--prefix-caching",
    "async_scheduling": "--async-scheduling",
    "num_replicas": "--replicas",
    "max_model_len": "--max-model-len",
    "num_requests": "--num-requests",
    "arrival_rate": "--arrival-rate",
    "prompt_tokens": "--prompt-tokens",
    "output_tokens": "--output-tokens",
    "seed": "--seed",
    "model": "--model",
    "gpu": "--gpu",
    "trace": "--trace",
    "num_params_b": "--num-params-b",
    "quantization": "--quantization",
    "top": "--top",
    "max_concurrency": "--max-concurrency",
    "SWEEP_SCHEDULER": "--scheduler",
}
# The searched knobs: (flag, SearchSpace field, kind of value, help).
SPACE_FLAGS = [
    ("--tensor-parallel-size", "tensor_parallel_size", int, "GPUs per replica"),
    (
        "--data-parallel-size",
        "data_parallel_size",
        int,
        "ranks per replica, with expert parallelism, for a mixture-of-experts model (a dense model's are the replicas)",
    ),
    ("--max-num-seqs", "max_num_seqs", int, "requests running at once, at most"),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "tokens a step schedules, at most"),
    ("--block-size", "block_size", int, "tokens per KV block"),
    ("--gpu-memory-utilization", "gpu_memory_utilization", float, "share of GPU memory vLLM may use"),
    ("--kv-cache-dtype", "kv_cache_dtype", str, "KV cache dtype (bf16, fp16, fp8, ...)"),
    ("--chunked-prefill", "enable_chunked_prefill", bool, "chunked prefill (on, off)"),
    (
        "--prefix-caching",
        "enable_prefix_caching",
        bool,
        "prefix caching (on, off; it shares blocks only where the "
        "trace says which prompts share a prefix: a Mooncake trace's hash ids)",
    ),
    ("--async-scheduling", "async_scheduling", bool, "asynchronous scheduling (on, off)"),
    ("--replicas", "num_replicas", int, "replicas of the deployment, requests dealt to them in turn"),
]
ON_OFF = {"on": True, "off": False}


def add(commands) -> None:
    """Register `kvlab plan`."""
    p = commands.add_parser(
        "plan",
        help="find the vLLM configurations that serve a workload within latency objectives, best first",
        description="Search vLLM's settings for a model on a GPU and a workload: every combination of the values "
        "given (comma-separated) is a candidate. Candidates that cannot work are pruned first, each with its proof "
        "(vLLM would not start: the KV pool vLLM sizes cannot hold max_model_len; or even the fastest steps the "
        "batch budget allows cannot serve the rate within an objective), and those nothing measured times are set "
        "aside, said as missing data (neither an operator profile nor the GPU's operator tables time the model at "
        "that tensor parallel size; --allow-roofline plans them on the named fallback). The rest are served by kvlab's engine (vLLM 0.33's scheduler, its KV pool as "
        "vLLM sizes it) on the measured clock. Up to 20,000 requests, every candidate is served on the whole "
        "workload but those its first eighth proves miss (more requests over a limit already than a p95 allows); "
        "above, on growing prefixes of it (1/64, 1/16, 1/4, all), the best quarter going on each time. Candidates "
        "that make the same decisions (their pools never refuse a block) are served once. Output: the configurations that meet every objective at the 95th "
        "percentile, ranked by requests/s per GPU, the best as its `vllm serve` command, and why the others "
        "failed. Replicas get the requests in turn (a round-robin router). TTFT = first token - arrival, TPOT = "
        "(finish - first token) / (output tokens - 1), E2E = finish - arrival.",
        epilog="examples: kvlab plan --model meta-llama/Llama-3.1-8B --gpu RTX-PRO-6000-Server-96GB --trace "
        "AzureLLMInferenceTrace_conv.csv --num-requests 10000 --max-model-len 16384 --slo-ttft-p95-s 1 "
        "--slo-tpot-p95-ms 40 | kvlab plan --model Qwen/Qwen3-32B --gpu RTX-PRO-6000-Server-96GB --arrival-rate 4 "
        "--prompt-tokens 1000 --output-tokens 250 --max-model-len 8192 --slo-e2e-p95-s 20 --replicas 1,2,3 --json",
    )
    what = p.add_argument_group("the deployment")
    what.add_argument("--model", help="a model of data/models.csv (e.g. meta-llama/Llama-3.1-8B)")
    what.add_argument(
        "--config",
        metavar="PATH",
        help="a Hugging Face config.json instead of --model (its parameters counted from it, or --num-params-b; "
        "timed from the GPU's operator tables by its layer shapes where it gives them all)",
    )
    what.add_argument(
        "--num-params-b",
        type=float,
        help="parameters of the --config model, billions (its weights; default: counted from the config.json)",
    )
    add_quantization_flag(what)
    what.add_argument("--gpu", required=False, help="a GPU of data/gpus.csv (e.g. RTX-PRO-6000-Server-96GB)")
    what.add_argument("--max-model-len", type=int, help="longest request, tokens (default: the model's context)")
    what.add_argument(
        "--allow-roofline",
        action="store_true",
        help="plan candidates that neither an operator profile nor the GPU's operator tables time (that model, "
        "GPU and tensor parallel size) on the roofline fallback, which says how far it was off where both are "
        "known, with a warning (default: they are set aside as unmeasured)",
    )
    slo = p.add_argument_group("service-level objectives (95th percentile over requests; at least one)")
    slo.add_argument("--slo-ttft-p95-s", type=float, help="p95 time to first token, s")
    slo.add_argument("--slo-tpot-p95-ms", type=float, help="p95 time per output token after the first, ms")
    slo.add_argument("--slo-e2e-p95-s", type=float, help="p95 end-to-end latency, s")
    work = p.add_argument_group("synthetic workload (without --trace)")
    work.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests (default 10,000; with --trace its first N, default all)",
    )
    work.add_argument("--arrival-rate", type=float, help="Poisson arrival rate, requests/s (needed without --trace)")
    work.add_argument(
        "--prompt-tokens",
        type=int,
        default=1000,
        help="mean prompt tokens (default 1,000; gamma lengths of CV 1, kvlab's choice)",
    )
    work.add_argument(
        "--output-tokens",
        type=int,
        default=250,
        help="mean output tokens (default 250; gamma lengths of CV 1, kvlab's choice)",
    )
    work.add_argument("--seed", type=int, default=0, help="random seed of arrivals and lengths (default 0)")
    work.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="a closed loop, vLLM bench's --max-concurrency: the client keeps at most N requests in flight over the "
        "deployment, each sent in order once one finishes, never before it is made; requests are made at t=0 (vLLM "
        "bench's default request rate, inf) or Poisson at --arrival-rate (a --trace gives its lengths only); TTFT "
        "and E2E count from the send, and configurations rank by completed requests/s per GPU; one replica only "
        "(default: the open loop of the arrivals)",
    )
    add_trace_flags(p, "arrivals from its timestamps, prompt and output tokens from its rows")
    space = p.add_argument_group("the search space (comma-separated values; every combination is a candidate)")
    defaults = {f.name: f.default for f in dataclasses.fields(SearchSpace)}
    for flag, name, _kind, words in SPACE_FLAGS:
        default = ",".join(knob_value(v) for v in defaults[name])
        space.add_argument(flag, default=None, metavar="LIST", help=f"{words} (default {default})")
    run_group = p.add_argument_group("running the search")
    run_group.add_argument(
        "--scheduler",
        default=None,
        help="where candidates are served: serial, processes (default: one per core) or a Dask "
        "scheduler address (tcp://host:8786); default $SWEEP_SCHEDULER, else processes",
    )
    run_group.add_argument("--top", type=int, default=10, help="configurations shown of those that meet (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run, flags=PLAN_FLAGS)


def parse_list(flag: str, text: str, kind) -> tuple:
    """A comma-separated flag value as a tuple of kind; a one-line error naming the flag and the bad item."""
    items = [t.strip() for t in text.split(",")]
    out = []
    for item in items:
        try:
            if kind is bool:
                if item not in ON_OFF:
                    raise ValueError
                out.append(ON_OFF[item])
            else:
                out.append(kind(item))
        except ValueError:
            allowed = "on or off" if kind is bool else {int: "whole numbers", float: "numbers"}.get(kind, "names")
            raise ValueError(
                f"{flag} {text!r} is not allowed: {item!r} is not one of {allowed}, comma-separated "
                f"(e.g. {flag} {'on,off' if kind is bool else '1,2' if kind is int else '0.85,0.9'})"
            ) from None
    if len(set(out)) != len(out):
        raise ValueError(f"{flag} {text!r} is not allowed: a value is repeated")
    return tuple(out)


def search_space(args):
    """The SearchSpace of the flags (the defaults for the rest)."""
    values = {}
    for flag, name, kind, _ in SPACE_FLAGS:
        text = getattr(args, name_of(flag))
        if text is not None:
            values[name] = parse_list(flag, text, kind)
    return SearchSpace(**values)


def name_of(flag: str) -> str:
    return flag[2:].replace("-", "_")


def objectives_of(args):
    """The Objectives of the --slo flags: at least one, each a finite number > 0."""
    given = {"ttft_p95_s": args.slo_ttft_p95_s, "tpot_p95_ms": args.slo_tpot_p95_ms, "e2e_p95_s": args.slo_e2e_p95_s}
    if all(v is None for v in given.values()):
        raise ValueError(
            "kvlab plan needs at least one objective: --slo-ttft-p95-s, --slo-tpot-p95-ms or "
            "--slo-e2e-p95-s (e.g. --slo-ttft-p95-s 1 --slo-tpot-p95-ms 50)"
        )
    for name, value in given.items():
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ValueError(f"{PLAN_FLAGS[name]} {value:g} is not allowed: an objective must be a finite number > 0")
    return Objectives(**given)


def workload_of(args, given: set[str]):
    """The workload: the --trace file's (its first --num-requests) or a synthetic one; (workload, trace load). Under
    --max-concurrency the arrivals are when requests are made: all at t=0, or Poisson at --arrival-rate (a trace's
    lengths kept, as kvlab simulate's closed loop makes them)."""
    import numpy as np

    from kvlab.core import resources, validate
    from kvlab.core.engine import PEAK_BYTES_PER_REQUEST
    from kvlab.core.workload import Workload
    from kvlab.workloads import synthetic

    if args.num_requests is not None:
        validate.in_range("num_requests", args.num_requests, "num_requests")
    closed = args.max_concurrency is not None
    if args.trace is not None:
        rate = None
        if closed:
            from kvlab.cli.simulate import closed_loop_arrivals, file_format

            fmt = args.trace_format if args.trace_format != "auto" else file_format(args.trace)
            rate = (args.arrival_rate or 1.0) if fmt == "sharegpt" else None  # (its arrivals replaced below)
        load = load_trace_arg(args, max_requests=args.num_requests, arrival_rate_per_s=rate)
        resources.refuse_if_too_big("num_requests", load.workload.num_requests, PEAK_BYTES_PER_REQUEST)
        if closed:
            return closed_loop_arrivals(load.workload, args.arrival_rate, args.seed), load
        return load.workload, load
    if closed and args.arrival_rate is None:  # vLLM bench's default rate, inf: every request made at t=0
        n = 10_000 if args.num_requests is None else args.num_requests
        resources.refuse_if_too_big("num_requests", n, PEAK_BYTES_PER_REQUEST)
        for name in ("prompt_tokens", "output_tokens"):
            validate.in_range(name, getattr(args, name), "tokens")
        rng = np.random.default_rng(validate.in_range("seed", args.seed, "seed"))
        w = synthetic.gamma_workload(n, 1.0, args.prompt_tokens, args.output_tokens, rng)
        name = (
            f"synthetic (all made at t=0, seed {args.seed}; gamma lengths of CV 1, means {args.prompt_tokens:,} "
            f"prompt and {args.output_tokens:,} output tokens)"
        )
        return Workload(np.zeros(n), w.prompt_tokens, w.output_tokens, name=name), None
    if args.arrival_rate is None:
        raise ValueError(
            "kvlab plan needs a workload: --trace FILE, or --arrival-rate R for a synthetic one "
            "(with --num-requests, --prompt-tokens and --output-tokens)"
        )
    rate = validate.in_range("arrival_rate", args.arrival_rate, "arrival_rate")
    n = 10_000 if args.num_requests is None else args.num_requests
    resources.refuse_if_too_big("num_requests", n, PEAK_BYTES_PER_REQUEST)
    for name in ("prompt_tokens", "output_tokens"):
        validate.in_range(name, getattr(args, name), "tokens")
    rng = np.random.default_rng(validate.in_range("seed", args.seed, "seed"))
    w = synthetic.gamma_workload(n, rate, args.prompt_tokens, args.output_tokens, rng)
    name = (
        f"synthetic (Poisson arrivals at {rate:g} requests/s, seed {args.seed}; gamma lengths of CV 1, means "
        f"{args.prompt_tokens:,} prompt and {args.output_tokens:,} output tokens)"
    )
    return Workload(w.arrival_s, w.prompt_tokens, w.output_tokens, name=name), None


def deployment_of(args, given: set[str], workload):
    """The Deployment of --model (or --config) and --gpu, max_model_len checked against the workload."""
    from kvlab.core import models, validate
    from kvlab.studies.plan_space import Deployment, check_max_model_len

    model = apply_quantization(model_from_flags(args, given), args.quantization)
    if args.gpu is None:
        raise ValueError("kvlab plan needs --gpu, a GPU of data/gpus.csv (e.g. --gpu RTX-PRO-6000-Server-96GB)")
    if model is None:
        raise ValueError("kvlab plan needs --model (a model of data/models.csv) or --config PATH (a config.json)")
    local = sorted({model.layer_type(i) for i in range(model.num_layers)} - {"full_attention"})
    if local:  # (the planner's proofs that a pool never binds count one full-attention group's blocks)
        kinds = {"sliding_attention": "sliding-window", "chunked_attention": "chunked-attention",
                 "linear_attention": "linear-attention (Mamba)"}  # fmt: skip
        raise ValueError(
            f"kvlab plan cannot plan {model.name} yet: its {' and '.join(kinds[k] for k in local)} layers make vLLM's "
            "hybrid KV cache groups, whose blocks the planner's shortcuts do not count yet (kvlab simulate --model "
            "serves them)"
        )
    gpu = models.get_gpu(args.gpu)
    if args.max_model_len is not None:
        max_model_len = validate.in_range("max_model_len", args.max_model_len, "tokens")
    elif model.max_position_embeddings:
        max_model_len = model.max_position_embeddings
    else:
        raise ValueError(f"--max-model-len is needed: {model.name} gives no context length")
    check_max_model_len("--max-model-len", max_model_len, workload.prompt_tokens.max())
    if args.data_parallel_size is not None and model.expert_params_b <= 0:
        ranks = parse_list("--data-parallel-size", args.data_parallel_size, int)
        if max(ranks) > 1:
            raise ValueError(
                f"--data-parallel-size {args.data_parallel_size} is not allowed for {model.name}: it is dense, and "
                "vLLM runs a dense model's data-parallel ranks as independent engines (plan them with --replicas)"
            )
    return Deployment(model, gpu, max_model_len, allow_roofline=args.allow_roofline)


def run(args, given: set[str]) -> dict:
    """Search, then print the ranking, the best configuration's `vllm serve` command and why the others failed."""
    closed = args.max_concurrency is not None
    check_trace_flags(
        given,
        ["--prompt-tokens", "--output-tokens"] + ([] if closed else ["--arrival-rate", "--seed"]),
        "a trace's requests have their own arrivals and lengths"
        + (" (under --max-concurrency its lengths only: --arrival-rate and --seed may make them)" if closed else ""),
    )
    from kvlab.core import validate

    if closed:
        from kvlab.core.engine.closed_loop import check_max_concurrency

        check_max_concurrency(args.max_concurrency)
        if args.trace is not None and "--seed" in given and args.arrival_rate is None:
            raise ValueError(
                "--seed applies with --trace and --max-concurrency only beside --arrival-rate: the closed loop makes "
                "the trace's requests at t=0, and --seed draws Poisson arrivals at --arrival-rate"
            )
    objectives = objectives_of(args)
    space = search_space(args)
    if closed and min(space.num_replicas) > 1:
        raise ValueError(
            f"--replicas {args.replicas} is not allowed with --max-concurrency: kvlab serves one replica's closed loop "
            "(the client's N in flight over several replicas interleave their finishes); plan --replicas 1"
        )

    top = validate.in_range("top", args.top, "count")
    if args.scheduler is not None:
        from kvlab.studies import sweep

        sweep.scheduler_of(args.scheduler)
    workload, load = workload_of(args, given)
    deployment = deployment_of(args, given, workload)
    from kvlab.studies import plan as planning

    result = planning.search(
        workload, deployment, objectives, space, scheduler=args.scheduler, max_concurrency=args.max_concurrency
    )
    out = planning.summary(result, top=top)
    out["quantization"] = deployment.model.quantization or "none"
    if load is not None:
        out["workload"] |= trace_note(load)
    if args.json:
        print_json(out)
        return out
    for line in planning.report_lines(result, out, top=top):
        print(line)
    return out
