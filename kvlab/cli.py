"""The `kvlab` command line: the library's computations for scripting and checking."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from kvlab import allocator as alloc
from kvlab import capacity as cap
from kvlab import simulator, validate, workloads
from kvlab.workloads import Workload


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _flag_error(parser: argparse.ArgumentParser, error: ValueError, flags: dict[str, str]) -> int:
    """Report a library ValueError in the command's own flag names; exit status 2."""
    message = str(error)
    name = message.split("=", 1)[0]
    if name in flags:
        message = flags[name] + message[len(name):]
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return 2


def _print_json(result: dict) -> None:
    print(json.dumps(result, indent=2, sort_keys=False))


# ---------------------------------------------------------------- kvlab capacity
CAPACITY_FLAGS = {
    "num_layers": "--num-layers", "num_kv_heads": "--num-kv-heads", "head_dim": "--head-dim",
    "dtype_bytes": "--dtype-bytes", "gpu_memory": "--gpu-memory-gib", "weights": "--weights-gib",
    "context_tokens": "--context", "unit": "--unit",
}


def add_capacity(commands) -> None:
    p = commands.add_parser(
        "capacity",
        help="KV bytes per token, memory per request, and requests that fit in GPU memory",
        description="KV-cache capacity of one GPU. KV bytes per token = 2 (K and V) x layers x KV heads x "
        "head dim x bytes per value; memory per request = that x context tokens; requests that fit = "
        "floor((GPU memory - weights) / memory per request). Defaults are the article's model "
        "(32 layers, 32 heads, head dim 128, 16-bit values) on an 80 GiB GPU with 16 GiB of weights.",
        epilog="example: kvlab capacity --num-layers 32 --num-kv-heads 32 --head-dim 128 --dtype-bytes 2 "
        "--gpu-memory-gib 80 --weights-gib 16 --context 1000 --json",
    )
    model = p.add_argument_group("model")
    model.add_argument("--num-layers", type=int, default=32, help="decoder layers (default 32)")
    model.add_argument("--num-kv-heads", type=int, default=32, help="K/V heads per layer (default 32)")
    model.add_argument("--head-dim", type=int, default=128, help="values per head (default 128)")
    model.add_argument("--dtype-bytes", type=float, default=2, help="bytes per cached value (default 2: fp16/bf16)")
    budget = p.add_argument_group("memory budget")
    budget.add_argument("--gpu-memory-gib", type=float, default=80, help="GPU memory, in --unit (default 80)")
    budget.add_argument("--weights-gib", type=float, default=16, help="memory held by the weights, in --unit (default 16)")
    budget.add_argument("--unit", default="GiB", choices=["GiB", "GB"],
                        help="unit of the two memory flags: GiB = 2^30 bytes (default, as the article), GB = 10^9")
    p.add_argument("--context", type=int, default=1000, help="context length of one request, tokens (default 1000)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run_capacity, flags=CAPACITY_FLAGS)


def run_capacity(args) -> dict:
    shape = cap.KVShape(args.num_layers, args.num_kv_heads, args.head_dim, _int_if_whole(args.dtype_bytes))
    result = {"context_tokens": args.context, "unit": args.unit,
              **cap.capacity(shape, args.gpu_memory_gib, args.weights_gib, args.context, args.unit)}
    if args.json:
        _print_json(result)
        return result
    scale = cap.unit_bytes(args.unit)
    print(f"KV bytes per token   {result['kv_bytes_per_token']:,} B ({result['kv_bytes_per_token'] / 2**10:,.1f} KiB)")
    print(f"memory per request   {result['bytes_per_request'] / scale:,.3f} {args.unit} at {args.context:,} tokens "
          f"({result['bytes_per_request']:,} B)")
    print(f"free for KV cache    {result['free_bytes'] / scale:,.3f} {args.unit} "
          f"({args.gpu_memory_gib:g} {args.unit} GPU - {args.weights_gib:g} {args.unit} weights)")
    print(f"requests that fit    {result['max_num_requests']:,}")
    return result


# ---------------------------------------------------------------- kvlab allocate
ALLOCATE_FLAGS = {
    "num_requests": "--num-requests", "max_len_tokens": "--max-len", "block_size": "--block-size",
    "lengths": "--lengths", "memory_gib": "--memory-gib", "mib_per_token": "--mb-per-token",
}


def add_allocate(commands) -> None:
    families = "; ".join(f"{name}: {text}" for name, (_, text) in workloads.LENGTH_DISTRIBUTIONS.items()).replace("%", "%%")
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
    p.add_argument("--num-requests", type=int, default=20000, help="requests (default 20000)")
    p.add_argument("--max-len", type=int, default=4096,
                   help="longest allowed request, tokens; lengths are drawn at or below it (default 4096)")
    p.add_argument("--block-size", type=int, default=16, help="reservation unit, tokens per block (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of numpy.random.default_rng for the lengths (default 0)")
    p.add_argument("--lengths", default="article-s1", metavar="NAME",
                   help=f"length family (default article-s1). {families}")
    budget = p.add_argument_group("memory budget")
    budget.add_argument("--memory-gib", type=float, default=60, help="KV-cache memory, GB = 2^30 bytes (default 60)")
    budget.add_argument("--mb-per-token", type=float, default=0.5, help="KV memory per token, MB = 2^20 bytes (default 0.5)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run_allocate, flags=ALLOCATE_FLAGS)


def allocate_lengths(args):
    """The request lengths `kvlab allocate` accounts for (one place to add other sources, e.g. a trace)."""
    return workloads.sample_lengths(args.lengths, args.num_requests, np.random.default_rng(args.seed),
                                    max_len_tokens=args.max_len)


def run_allocate(args) -> dict:
    validate.positive_int("max_len_tokens", args.max_len)
    validate.positive_int("block_size", args.block_size)
    lengths = allocate_lengths(args)
    row = alloc.allocation_table(lengths, [args.block_size], max_len_tokens=args.max_len,
                                 memory_gib=_int_if_whole(args.memory_gib),
                                 mib_per_token=_int_if_whole(args.mb_per_token)).iloc[0]
    result = {
        "lengths": args.lengths, "num_requests": len(lengths), "block_size": args.block_size, "seed": args.seed,
        "reserved_tokens": int(row["reserved_tokens"]), "used_tokens": int(row["used_tokens"]),
        "wasted_tokens": int(row["wasted_tokens"]), "waste_pct": round(float(row["waste_pct"]), 6),
        "max_num_requests": int(row["max_num_requests"]),
        "block_table_entries_per_request": round(float(row["block_table_entries"]), 6),
    }
    if args.json:
        _print_json(result)
        return result
    print(f"requests             {result['num_requests']:,} ({args.lengths}, seed {args.seed}, at most {args.max_len:,} tokens)")
    print(f"reserved             {result['reserved_tokens']:,} tokens in blocks of {args.block_size:,}")
    print(f"used                 {result['used_tokens']:,} tokens ({result['used_tokens'] / result['num_requests']:,.1f} per request)")
    print(f"wasted               {result['wasted_tokens']:,} tokens ({result['waste_pct']:.1f}% of reserved)")
    print(f"requests that fit    {result['max_num_requests']:,} in {args.memory_gib:g} GB at {args.mb_per_token:g} MB per token")
    print(f"block-table entries  {result['block_table_entries_per_request']:,.2f} per request")
    return result


def _int_if_whole(x: float):
    return int(x) if float(x).is_integer() else x



# ---------------------------------------------------------------- kvlab simulate
SIMULATE_FLAGS = {
    "policy": "--policy", "max_num_seqs": "--slots", "ms_per_token": "--ms-per-token",
    "num_requests": "--num-requests", "arrival_rate": "--arrival-rate", "lengths": "--lengths",
    "constant_tokens": "--constant-tokens", "tokens": "--constant-tokens", "seed": "--seed",
}


def add_simulate(commands) -> None:
    p = commands.add_parser(
        "simulate",
        help="serve a workload with static or continuous batching and print latency, throughput and idle slots",
        description="Section 2's serving model: --slots requests run at once, each holding its slot for output "
        "tokens x --ms-per-token (prompts cost nothing), first come, first served. static: a batch starts "
        "together and holds its slots until its longest request is done; continuous: a freed slot is refilled "
        "at once. The workload: --num-requests Poisson arrivals at --arrival-rate with the article's output "
        "lengths (--lengths article: 85% uniform 40-200, 15% uniform 400-1,000 tokens) or all equal "
        "(--lengths constant). Latency = finish - arrival.",
        epilog="example: kvlab simulate --policy static --slots 8 --ms-per-token 8 --num-requests 600 "
        "--arrival-rate 11 --lengths article --seed 0 --json",
    )
    p.add_argument("--policy", default="continuous", choices=list(simulator.POLICIES),
                   help="batching policy (default continuous)")
    engine = p.add_argument_group("engine")
    engine.add_argument("--slots", type=int, default=8, help="requests served at once, vLLM's max_num_seqs (default 8)")
    engine.add_argument("--ms-per-token", type=float, default=8.0, help="time per output token, ms (default 8)")
    work = p.add_argument_group("synthetic workload")
    work.add_argument("--num-requests", type=int, default=600, help="requests (default 600)")
    work.add_argument("--arrival-rate", type=float, default=11.0,
                      help="Poisson arrival rate, requests/s (default 11; the article does not give one)")
    work.add_argument("--lengths", default="article", choices=list(simulator.LENGTHS),
                      help="output lengths: article (the article's mix, default) or constant")
    work.add_argument("--constant-tokens", type=int, default=150,
                      help="output tokens of every request with --lengths constant (default 150)")
    work.add_argument("--seed", type=int, default=0, help="random seed of arrivals and lengths (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run_simulate, flags=SIMULATE_FLAGS)


def simulate_workload(args) -> Workload:
    """The workload `kvlab simulate` serves (a synthetic one from the flags)."""
    seed = validate.non_negative_int("seed", args.seed)
    return simulator.synthetic_workload(args.num_requests, args.arrival_rate, args.lengths,
                                        np.random.default_rng(seed), constant_tokens=args.constant_tokens)


def run_simulate(args) -> dict:
    workload = simulate_workload(args)
    result = simulator.simulate(workload, args.policy, max_num_seqs=args.slots, ms_per_token=args.ms_per_token)
    summary = result.summary()
    if args.json:
        _print_json(summary)
        return summary
    print(f"policy               {args.policy}, {args.slots} slots, {args.ms_per_token:g} ms per output token")
    print(f"requests             {summary['num_requests']:,}")
    print(f"latency              mean {summary['mean_latency_s']:,.2f} s, p95 {summary['p95_latency_s']:,.2f} s, "
          f"max {summary['max_latency_s']:,.2f} s")
    print(f"queueing delay       mean {summary['mean_queue_s']:,.2f} s")
    print(f"makespan             {summary['makespan_s']:,.1f} s ({summary['throughput_rps']:,.2f} requests/s)")
    print(f"slot time            {summary['busy_slot_s']:,.1f} s busy, {100 * summary['idle_share']:.1f}% idle")
    return summary


COMMANDS = [add_capacity, add_allocate, add_simulate]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kvlab",
        description="kvlab: KV-cache memory in LLM serving. Each command prints its figures with units; "
        "--json gives one machine-readable object.",
    )
    parser.add_argument("--version", action="version", version=f"kvlab {__import__('kvlab').__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for add in COMMANDS:
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        args.run(args)
    except ValueError as error:
        return _flag_error(commands_parser(parser, args.command), error, args.flags)
    return 0


def commands_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The sub-parser of one command (for its prog name in error messages)."""
    for action in parser._subparsers._group_actions:
        if name in action.choices:
            return action.choices[name]
    return parser
