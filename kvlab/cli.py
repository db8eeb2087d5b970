"""The `kvlab` command line: the library's computations for scripting and checking."""
from __future__ import annotations

import argparse
import json
import sys

from kvlab import capacity as cap


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


COMMANDS = [add_capacity]


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
