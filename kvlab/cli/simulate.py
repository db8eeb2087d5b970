"""`kvlab simulate`: serve a workload with section 2's static or continuous batching, or vLLM's scheduler.

Parsing, calling and printing: the flags give a run's options (kvlab.studies.serving.ServingOptions, whose defaults
the flags show); kvlab.studies.serving sets the run up, owning every default and every refusal of a value (its
ValueError names the option, which becomes the flag); kvlab.core.batching serves section 2's slots and
kvlab.core.engine vLLM's scheduler. vLLM's flags are kvlab.cli.engine_flags'. Here are the checks of flags typed
together, before any work."""

from __future__ import annotations

from kvlab.cli.common import check_model_flags, flag_table, options_of, requires
from kvlab.cli.engine_flags import ENGINE_FLAGS, add_engine_flags, check_engine_flags
from kvlab.cli.printing import print_json, print_line, print_trace
from kvlab.cli.trace_flags import add_trace_flags, check_trace_flags
from kvlab.core import article, batching, validate
from kvlab.core.requests_csv import REQUESTS_CSV_COLUMNS, write_requests_csv  # noqa: F401 (its home: kvlab.core)
from kvlab.core.service_time import TokenServiceTime
from kvlab.studies import serving
from kvlab.workloads import synthetic

SIMULATE_FLAGS = flag_table(
    "policy",
    "num_requests",
    "arrival_rate",
    "lengths",
    "constant_tokens",
    "seed",
    "trace_format",
    "trace",
    max_num_seqs="--slots",
    ms_per_token="--ms-per-token",
    tokens="--constant-tokens",
    arrival_rate_per_s="--arrival-rate",
)
VLLM_SIMULATE_FLAGS = {k: v for k, v in SIMULATE_FLAGS.items() if k != "max_num_seqs"} | ENGINE_FLAGS


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
        default=None,
        help=f"requests (default {serving.DEFAULT_NUM_REQUESTS['article']})",
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
    work.add_argument("--seed", type=int, default=None, help="random seed of arrivals and lengths (default 0)")
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
    engine_flags = add_engine_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run, flags=SIMULATE_FLAGS, engine_flags=engine_flags)


def check_lengths_flags(args, given: set[str]) -> None:
    """--constant-tokens sets every output with --lengths constant, and only then."""
    requires(given, "--constant-tokens", "--lengths", "it sets every output with --lengths constant")
    if "--constant-tokens" in given and args.lengths != "constant":
        raise ValueError(f"--constant-tokens applies only with --lengths constant, not --lengths {args.lengths}")


def run(args, given: set[str]) -> dict:
    """Print the serving summary: latency (s), queueing (s), makespan (s), requests/s, busy slot-s, idle share."""
    check_trace_flags(given, ["--lengths", "--constant-tokens"], "a trace's requests have their own output lengths")
    if args.policy == "vllm":
        return run_vllm(args, given)
    for flag in args.engine_flags + ["--prompt-tokens"]:
        requires(given, flag, "--policy vllm", "it sets vLLM's scheduler, not section 2's slots")
    cost = TokenServiceTime(args.ms_per_token)
    slots = validate.in_range("max_num_seqs", args.slots, "max_num_seqs")
    check_lengths_flags(args, given)
    options = options_of(args)
    workload, load = serving.workload(options)
    summary = batching.simulate(workload, args.policy, max_num_seqs=slots, cost=cost).summary()
    if load is not None:
        summary |= serving.trace_keys(load) | {"poisson_arrivals": load.poisson_arrivals}
    if args.json:
        print_json(summary)
        return summary
    if load is not None:
        seed = 0 if options.seed is None else options.seed
        print_trace(
            summary,
            f"Poisson arrivals at {args.arrival_rate:g} requests/s, seed {seed}"
            if load.poisson_arrivals
            else "arrivals from its timestamps",
        )
    print_line("policy", f"{args.policy}, {args.slots} slots, {args.ms_per_token:g} ms per output token")
    print_line("requests", f"{summary['num_requests']:,}")
    print_line(
        "latency",
        f"mean {summary['mean_latency_s']:,.2f} s, p95 {summary['p95_latency_s']:,.2f} s, "
        f"max {summary['max_latency_s']:,.2f} s",
    )
    print_line("queueing delay", f"mean {summary['mean_queue_s']:,.2f} s")
    print_line("makespan", f"{summary['makespan_s']:,.1f} s ({summary['throughput_rps']:,.2f} requests/s)")
    print_line("slot time", f"{summary['busy_slot_s']:,.1f} s busy, {100 * summary['idle_share']:.1f}% idle")
    return summary


def run_vllm(args, given: set[str]) -> dict:
    """Serve the workload with vLLM's scheduler; print TTFT, TPOT, preemptions, steps, KV blocks and throughput."""
    args.flags = VLLM_SIMULATE_FLAGS
    options = options_of(args)
    check_engine_flags(given, options)
    check_model_flags(given)
    check_lengths_flags(args, given)
    if args.requests_csv and options.prefill_instances:
        raise ValueError(
            "--requests-csv and --prefill-instances cannot be used together: a disaggregated run's per-request table "
            "is not written yet (use --json for its figures)"
        )
    run = serving.setup(options)
    result = run.run()
    if args.requests_csv:
        write_requests_csv(args.requests_csv, result, run.config.scheduler.async_scheduling)
    out = run.summary(result)
    if args.json:
        print_json(out)
        return out
    print_vllm(out, run)
    return out


def print_disaggregated(out: dict, run: serving.Serving) -> None:
    """The text of a disaggregated run (out: its summary)."""
    if run.trace is not None:
        print_trace(out)
    scheduler = run.config.scheduler
    print_line(
        "deployment",
        f"{out['num_prefill_instances']} prefill + {out['num_decode_instances']} decode instances of vLLM 0.33 "
        f"(synchronous scheduler, NIXL's KV connector), each {run.num_gpu_blocks:,} GPU blocks of "
        f"{run.config.cache.block_size} tokens ({run.pool_source}); max_num_seqs {scheduler.max_num_seqs:,}, "
        f"max_num_batched_tokens {scheduler.max_num_batched_tokens:,}; each side's instances in turn",
    )
    print_line(
        "KV transfer", f"{out['kv_transfer_bytes_per_block']:,} bytes a block a GPU, {out['kv_transfer_source']}"
    )
    print_line("step cost", out["cost_source"])
    print_line("requests", f"{out['num_requests']:,}")
    print_line(
        "TTFT", f"mean {out['mean_ttft_s']:,.3f} s, p95 {out['p95_ttft_s']:,.3f} s; p95 E2E {out['p95_e2e_s']:,.3f} s"
    )
    print_line("TPOT", f"mean {1e3 * out['mean_tpot_s']:,.2f} ms, p95 {1e3 * out['p95_tpot_s']:,.2f} ms (decode side)")
    print_line(
        "TTFT's parts",
        f"mean {out['mean_ttft_queue_s']:,.4f} s queued + {out['mean_ttft_prefill_s']:,.4f} s prefill + "
        f"{out['mean_ttft_decode_queue_s']:,.4f} s until a decode instance takes it + {out['mean_ttft_transfer_s']:,.4f} s "
        f"transfer + {out['mean_ttft_first_decode_s']:,.4f} s first decode step",
    )
    print_line(
        "steps",
        f"prefill {out['prefill_steps']:,} ({out['prefill_preemptions']:,} preemptions), decode "
        f"{out['decode_steps']:,} ({out['decode_preemptions']:,} preemptions)",
    )


def print_vllm(out: dict, run: serving.Serving) -> None:
    """The text of a run of vLLM's scheduler (out: its summary)."""
    if run.disaggregated:
        print_disaggregated(out, run)
        return
    scheduler, parallel, options = run.config.scheduler, run.config.parallel, run.options
    usable, ranks = run.num_gpu_blocks - 1, parallel.data_parallel_size
    if run.trace is not None:
        print_trace(out)
    mode = (
        "asynchronous: the next batch is scheduled before this one's output, vLLM's default"
        if scheduler.async_scheduling
        else "synchronous: --no-async-scheduling"
    )
    print_line(
        "engine",
        f"vLLM 0.33's scheduler ({mode}), {options.allocation} allocation, {run.num_gpu_blocks:,} GPU blocks of "
        f"{run.config.cache.block_size} tokens ({usable:,} usable + vLLM's null block; {run.pool_source})",
    )
    if run.kv_cache_groups is not None:
        print_line("KV cache groups", out["kv_cache_groups"])
    print_line(
        "limits",
        f"max_num_seqs {scheduler.max_num_seqs:,}, max_num_batched_tokens {scheduler.max_num_batched_tokens:,}, "
        f"max_model_len {scheduler.max_model_len:,}, chunked prefill "
        f"{'on' if scheduler.enable_chunked_prefill else 'off'}, prefix caching "
        f"{'on' if run.config.cache.enable_prefix_caching else 'off'}",
    )
    if ranks > 1:
        print_line(
            "data parallel",
            f"{ranks} ranks in lockstep (vLLM's mixture-of-experts data parallelism"
            + (", expert parallel" if parallel.enable_expert_parallel else "")
            + f"), each with the pool above; requests per rank {', '.join(f'{n:,}' for n in out['requests_per_rank'])}"
            " (vLLM's load-balancing rule)",
        )
    if options.max_concurrency is not None:
        print_line(
            "closed loop",
            f"at most {options.max_concurrency:,} requests in flight (vLLM bench's --max-concurrency), each sent in "
            "order as one finishes; TTFT counts from the send",
        )
    capped = out["num_capped_by_max_model_len"]
    print_line("step cost", out["cost_source"])
    print_line(
        "requests",
        f"{out['num_requests']:,}, {out['num_output_tokens']:,} output tokens"
        + (f" ({capped:,} stopped at max_model_len)" if capped else ""),
    )
    if run.fleet:
        per_instance = ", ".join(f"{i['num_requests']:,}" for i in out["instances"])
        print_line(
            "fleet",
            f"{out['num_instances']:,} instances behind the {out['router']} router, each with the pool and step cost "
            f"above; requests per instance {per_instance}",
        )
    print_line("TTFT", f"mean {out['mean_ttft_s']:,.3f} s, p95 {out['p95_ttft_s']:,.3f} s")
    if run.fleet:
        print_line(
            "TTFT's parts",
            f"mean {out['mean_ttft_queue_s']:,.3f} s waiting to be scheduled + {out['mean_ttft_prefill_s']:,.3f} s "
            f"from the first step to the first token; {100 * out['prefix_hit_rate']:.1f}% of prompt tokens found in "
            "the instances' prefix caches",
        )
    print_line("TPOT", f"mean {1e3 * out['mean_tpot_s']:,.2f} ms")
    print_line("preemptions", f"{out['num_preemptions']:,}")
    print_line(
        "steps",
        f"{out['num_steps']:,}; peak KV blocks {out['peak_kv_blocks']:,} of {ranks * usable:,}"
        + (" (all ranks)" if ranks > 1 else " (the fullest instance)" if run.fleet else "")
        + f"; mean running {out['mean_running']:,.1f} requests",
    )
    print_line("throughput", f"{out['output_tokens_per_s']:,.1f} output tokens/s over {out['makespan_s']:,.1f} s")
