"""The `kvlab` command line: the library's computations for scripting and checking."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from kvlab import allocator as alloc
from kvlab import capacity as cap
from kvlab import validate
from kvlab import workloads


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


COMMANDS = [add_capacity, add_allocate]


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
