"""The `kvlab` command line: the library's computations for scripting and checking."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from kvlab import capacity as cap
from kvlab import simulator, validate
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


def _int_if_whole(x: float):
    return int(x) if float(x).is_integer() else x


# ---------------------------------------------------------------- kvlab simulate
SIMULATE_FLAGS = {
    "policy": "--policy", "max_num_seqs": "--slots", "ms_per_token": "--ms-per-token",
    "num_requests": "--num-requests", "arrival_rate": "--arrival-rate", "lengths": "--lengths",
    "constant_tokens": "--constant-tokens", "seed": "--seed",
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


COMMANDS = [add_capacity, add_simulate]


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
