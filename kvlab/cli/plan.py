"""`kvlab plan`: the vLLM configurations that serve a workload within its service-level objectives.

Parsing, calling and printing: the flags give the deployment's and the workload's options
(kvlab.studies.serving.ServingOptions, which owns their defaults and refusals), the search space and the objectives
(kvlab.studies.plan_space); kvlab.studies.plan searches and says what it found. The search's modules (the engine's
loops, the sweep on processes or Dask) are imported inside the run, so `kvlab plan --help` and a refused flag answer
at once."""

from __future__ import annotations

import dataclasses
import math

from kvlab.cli.common import add_flag, add_quantization_flag, check_model_flags, flag_table
from kvlab.cli.printing import print_json
from kvlab.cli.trace_flags import add_trace_flags, check_trace_flags
from kvlab.studies import serving
from kvlab.studies.plan_space import Objectives, SearchSpace, deployment, knob_value
from kvlab.studies.serving import DEFAULT_NUM_REQUESTS, GAMMA_MEAN_TOKENS, ServingOptions

# The searched knobs: (SearchSpace field, kind of value, help), each by vLLM's flag (FLAGS) unless kvlab plan's own.
SPACE_FLAGS = [
    ("tensor_parallel_size", int, "GPUs per replica"),
    (
        "data_parallel_size",
        int,
        "ranks per replica, with expert parallelism, for a mixture-of-experts model (a dense model's are the replicas)",
    ),
    ("max_num_seqs", int, "requests running at once, at most"),
    ("max_num_batched_tokens", int, "tokens a step schedules, at most"),
    ("block_size", int, "tokens per KV block"),
    ("gpu_memory_utilization", float, "share of GPU memory vLLM may use"),
    ("kv_cache_dtype", str, "KV cache dtype (bf16, fp16, fp8, ...)"),
    ("enable_chunked_prefill", bool, "chunked prefill (on, off)"),
    (
        "enable_prefix_caching",
        bool,
        "prefix caching (on, off; it shares blocks only where the "
        "trace says which prompts share a prefix: a Mooncake trace's hash ids)",
    ),
    ("async_scheduling", bool, "asynchronous scheduling (on, off)"),
    ("num_replicas", int, "replicas of the deployment, requests dealt to them in turn"),
]
OWN_FLAGS = {
    "enable_chunked_prefill": "--chunked-prefill",
    "enable_prefix_caching": "--prefix-caching",
    "num_replicas": "--replicas",
}
PLAN_FLAGS = flag_table(
    *(name for name, _, _ in SPACE_FLAGS if name not in OWN_FLAGS),
    "max_model_len",
    "num_requests",
    "arrival_rate",
    "prompt_tokens",
    "output_tokens",
    "seed",
    "model",
    "gpu",
    "trace",
    "num_params_b",
    "quantization",
    "max_concurrency",
    **OWN_FLAGS,
    ttft_p95_s="--slo-ttft-p95-s",
    tpot_p95_ms="--slo-tpot-p95-ms",
    e2e_p95_s="--slo-e2e-p95-s",
    top="--top",
    SWEEP_SCHEDULER="--scheduler",
)
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
    add_flag(what, "model", help="a model of data/models.csv (e.g. meta-llama/Llama-3.1-8B)")
    add_flag(
        what,
        "hf_config_path",
        metavar="PATH",
        help="a Hugging Face config.json instead of --model (its parameters counted from it, or --num-params-b; "
        "timed from the GPU's operator tables by its layer shapes where it gives them all)",
    )
    add_flag(
        what,
        "num_params_b",
        type=float,
        help="parameters of the --config model, billions (its weights; default: counted from the config.json)",
    )
    add_quantization_flag(what)
    add_flag(what, "gpu", required=False, help="a GPU of data/gpus.csv (e.g. RTX-PRO-6000-Server-96GB)")
    add_flag(what, "max_model_len", type=int, help="longest request, tokens (default: the model's context)")
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
    add_flag(
        work,
        "num_requests",
        type=int,
        default=None,
        help=f"requests (default {DEFAULT_NUM_REQUESTS['gamma']:,}; with --trace its first N, default all)",
    )
    add_flag(work, "arrival_rate", type=float, help="Poisson arrival rate, requests/s (needed without --trace)")
    for name in GAMMA_MEAN_TOKENS:
        add_flag(
            work,
            name,
            type=int,
            default=None,
            help=f"mean {name.split('_')[0]} tokens (default {GAMMA_MEAN_TOKENS[name]:,}; gamma lengths of CV 1, "
            "kvlab's choice)",
        )
    add_flag(work, "seed", type=int, default=None, help="random seed of arrivals and lengths (default 0)")
    add_flag(
        work,
        "max_concurrency",
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
    for name, _kind, words in SPACE_FLAGS:
        default = ",".join(knob_value(v) for v in defaults[name])
        space.add_argument(PLAN_FLAGS[name], default=None, metavar="LIST", help=f"{words} (default {default})")
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
    for name, kind, _ in SPACE_FLAGS:
        flag = PLAN_FLAGS[name]
        text = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if text is not None:
            values[name] = parse_list(flag, text, kind)
    return SearchSpace(**values)


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


def run(args, given: set[str]) -> dict:
    """Search, then print the ranking, the best configuration's `vllm serve` command and why the others failed."""
    closed = args.max_concurrency is not None
    check_trace_flags(
        given,
        ["--prompt-tokens", "--output-tokens"] + ([] if closed else ["--arrival-rate", "--seed"]),
        "a trace's requests have their own arrivals and lengths"
        + (" (under --max-concurrency its lengths only: --arrival-rate and --seed may make them)" if closed else ""),
    )
    check_model_flags(given)
    from kvlab.core import validate

    if closed:
        from kvlab.core.engine.closed_loop import check_max_concurrency

        check_max_concurrency(args.max_concurrency)
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
    options = ServingOptions(
        **{name: getattr(args, name) for name in WORKLOAD_OPTIONS},
        hf_config_path=args.config,
        default_max_model_len=None,  # the planner takes no default it cannot name: the model's context, or refused
        lengths="gamma",
    )
    workload, load = serving.workload(options)
    plan = deployment(options, workload.prompt_tokens.max(), allow_roofline=args.allow_roofline)
    if args.data_parallel_size is not None:
        serving.check_data_parallel(
            plan.model, max(space.data_parallel_size), f" {args.data_parallel_size}", "plan them with --replicas"
        )
    from kvlab.studies import plan as planning

    result = planning.search(
        workload, plan, objectives, space, scheduler=args.scheduler, max_concurrency=args.max_concurrency
    )
    out = planning.summary(result, top=top)
    out["quantization"] = plan.model.quantization or "none"
    if load is not None:
        out["workload"] |= serving.trace_keys(load)
    if args.json:
        print_json(out)
        return out
    for line in planning.report_lines(result, out, top=top):
        print(line)
    return out


# The options a run of kvlab plan takes from its flags, by their names (ServingOptions).
WORKLOAD_OPTIONS = [
    "model", "num_params_b", "quantization", "gpu", "max_model_len", "trace", "trace_format", "skip_bad_rows",
    "num_requests", "arrival_rate", "prompt_tokens", "output_tokens", "seed", "max_concurrency",
]  # fmt: skip
