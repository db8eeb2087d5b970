"""`kvlab allocate`: KV slots reserved, used and wasted when memory is reserved in blocks of a given size."""

from __future__ import annotations

import numpy as np

from kvlab.cli.printing import print_json
from kvlab.cli.trace_flags import add_trace_flags, check_trace_flags, load_trace_arg
from kvlab.core import article, validate
from kvlab.studies.serving import trace_file_format, trace_keys
from kvlab.workloads import synthetic, traces

ALLOCATE_FLAGS = {
    "num_requests": "--num-requests",
    "max_len_tokens": "--max-len",
    "block_size": "--block-size",
    "lengths": "--lengths",
    "memory_gib": "--memory-gib",
    "mib_per_token": "--mb-per-token",
    "trace_format": "--trace-format",
    "trace": "--trace",
    "seed": "--seed",
}


def add(commands) -> None:
    """Register `kvlab allocate` (reserved, used and wasted tokens for one block size)."""
    families = "; ".join(f"{name}: {text}" for name, (_, text) in synthetic.LENGTH_DISTRIBUTIONS.items()).replace(
        "%", "%%"
    )
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
    p.add_argument(
        "--num-requests",
        type=int,
        default=article.NUM_REQUESTS_S1,
        help=f"requests (default {article.NUM_REQUESTS_S1})",
    )
    p.add_argument(
        "--max-len",
        type=int,
        default=article.MAX_LEN_TOKENS,
        help="longest allowed request, tokens; lengths are drawn at or below it (default 4096)",
    )
    p.add_argument("--block-size", type=int, default=16, help="reservation unit, tokens per block (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of numpy.random.default_rng for the lengths (default 0)")
    p.add_argument(
        "--lengths", default="article-s1", metavar="NAME", help=f"length family (default article-s1). {families}"
    )
    trace = add_trace_flags(
        p,
        "a request's length is its prompt + output tokens (ContextTokens + GeneratedTokens, "
        "input_length + output_length, num_prefill_tokens + num_decode_tokens); --num-requests, "
        "--seed and --lengths are not used",
    )
    trace.add_argument(
        "--drop-over-max-len",
        action="store_true",
        help="leave out trace requests longer than --max-len and print how many (default: such "
        "requests are an error naming how many and the largest)",
    )
    budget = p.add_argument_group("memory budget")
    budget.add_argument(
        "--memory-gib",
        type=float,
        default=article.MEMORY_GIB,
        help=f"KV-cache memory, GB = 2^30 bytes (default {article.MEMORY_GIB})",
    )
    budget.add_argument(
        "--mb-per-token",
        type=float,
        default=article.MIB_PER_TOKEN,
        help=f"KV memory per token, MB = 2^20 bytes (default {article.MIB_PER_TOKEN:g})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run, flags=ALLOCATE_FLAGS)


def allocate_lengths(args, given: set[str]) -> tuple[np.ndarray, traces.TraceLoad | None, int]:
    """The request lengths `kvlab allocate` accounts for: drawn from --lengths, or prompt + output of --trace
    (its first --num-requests requests when given); with the trace's load and how many of its requests were
    dropped as longer than --max-len."""
    from kvlab.core import allocator as alloc
    from kvlab.core import resources

    max_requests = validate.in_range("num_requests", args.num_requests, "num_requests")
    if args.trace is None:
        seed = validate.in_range("seed", args.seed, "seed")
        validate.one_of("lengths", args.lengths, synthetic.LENGTH_DISTRIBUTIONS)
        resources.refuse_if_too_big("num_requests", max_requests, alloc.PEAK_BYTES_PER_REQUEST)
        lengths = synthetic.sample_lengths(
            args.lengths, max_requests, np.random.default_rng(seed), max_len_tokens=args.max_len
        )
        return lengths, None, 0
    # Lengths need no arrivals, but a ShareGPT file has no timestamps: give it placeholder Poisson arrivals.
    sharegpt = args.trace_format == "sharegpt" or (
        args.trace_format == "auto" and trace_file_format(args.trace) == "sharegpt"
    )
    load = load_trace_arg(
        args,
        arrival_rate_per_s=1.0 if sharegpt else None,
        rng=np.random.default_rng(0) if sharegpt else None,
        max_requests=max_requests if "--num-requests" in given else None,
    )
    lengths, dropped = traces.request_lengths(
        load.workload, args.max_len, over_max_len="drop" if args.drop_over_max_len else "error"
    )
    return lengths, load, dropped


def run(args, given: set[str]) -> dict:
    """Print reserved, used and wasted tokens, waste % and requests that fit for --block-size tokens."""
    from kvlab.core import allocator as alloc
    from kvlab.core.units import exact

    check_trace_flags(given, ["--lengths", "--seed"], "a trace's requests have their own lengths")
    validate.in_range("max_len_tokens", args.max_len, "tokens")
    validate.in_range("block_size", args.block_size, "block_size")
    validate.in_range("memory_gib", args.memory_gib, "memory_gib")
    validate.in_range("mib_per_token", args.mb_per_token, "mib_per_token")
    lengths, load, num_dropped = allocate_lengths(args, given)
    counts = alloc.allocation_counts(
        lengths,
        [args.block_size],
        max_len_tokens=args.max_len,
        memory_gib=exact(args.memory_gib),
        mib_per_token=exact(args.mb_per_token),
    )
    row = {name: values[0] for name, values in counts.items()}
    result = {
        "lengths": args.lengths if args.trace is None else "trace",
        "num_requests": len(lengths),
        "block_size": args.block_size,
        "seed": args.seed,
        "reserved_tokens": int(row["reserved_tokens"]),
        "used_tokens": int(row["used_tokens"]),
        "wasted_tokens": int(row["wasted_tokens"]),
        "waste_pct": round(float(row["waste_pct"]), 6),
        "max_num_requests": int(row["max_num_requests"]),
        "block_table_entries_per_request": round(float(row["block_table_entries"]), 6),
    }
    if args.trace is not None:
        del result["seed"]
        result |= trace_keys(load) | {"num_dropped_over_max_len": num_dropped}
    if args.json:
        print_json(result)
        return result
    if args.trace is None:
        print(
            f"requests             {result['num_requests']:,} ({args.lengths}, seed {args.seed}, at most {args.max_len:,} tokens)"
        )
    else:
        print(
            f"requests             {result['num_requests']:,} from {result['trace_format']} trace {result['trace']} "
            f"(prompt + output tokens, at most {args.max_len:,})"
        )
        print(
            f"trace rows           {result['num_rows']:,} read, {result['num_skipped_rows']:,} bad rows skipped, "
            f"{num_dropped:,} requests over --max-len dropped"
        )
    print(f"reserved             {result['reserved_tokens']:,} tokens in blocks of {args.block_size:,}")
    print(
        f"used                 {result['used_tokens']:,} tokens ({result['used_tokens'] / result['num_requests']:,.1f} per request)"
    )
    print(f"wasted               {result['wasted_tokens']:,} tokens ({result['waste_pct']:.1f}% of reserved)")
    print(
        f"requests that fit    {result['max_num_requests']:,} in {args.memory_gib:g} GB at {args.mb_per_token:g} MB per token"
    )
    print(f"block-table entries  {result['block_table_entries_per_request']:,.2f} per request")
    return result
