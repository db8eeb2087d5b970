"""The `kvlab` command line: the library's computations for scripting and checking.

One module per command (capacity, allocate, simulate, plan, calibrate, report, traces), each with add(commands), which
registers its parser, and the run function that add names. A command module imports at its top what its parser and
flag checks need, numpy at most (with the small numpy-free modules of its run); what only a run needs and costs
more (kvlab.core.allocator, calibration and PyTorch, the report's build, the downloader) is imported inside the run,
so `kvlab --help` and a refused flag answer at once. kvlab.cli.common holds what the commands share (the one-line
parser and errors, the options a command's flags give), kvlab.cli.printing what they print alike, trace_flags,
engine_flags and sizing_flags the flag groups of a real trace, of vLLM's engine and of vLLM's accounting. A command
parses, calls kvlab.studies (serving sets up a run, owning every default and every refusal of a value) and prints."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from kvlab.cli import allocate, calibrate, capacity, plan, report, simulate, traces
from kvlab.cli.common import OneLineParser, VersionAction, flag_error, typed_flags

COMMANDS = [capacity.add, allocate.add, simulate.add, plan.add, calibrate.add, report.add, traces.add]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `kvlab` parser with every command of COMMANDS, and each command's own parser by name."""
    parser = OneLineParser(
        prog="kvlab",
        description="kvlab: KV-cache memory in LLM serving. Each command prints its figures with units; "
        "--json gives one machine-readable object.",
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for add in COMMANDS:
        add(commands)
    return parser, dict(commands.choices)


def show_notices() -> None:
    """Print the library's notices (the "kvlab" logger, e.g. numba compiling a loop the first time) on stderr."""
    log = logging.getLogger("kvlab")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kvlab: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def main(argv: list[str] | None = None) -> int:
    """Run one kvlab command; 0 on success, 2 with a one-line error on bad input."""
    parser, command_parsers = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    given = typed_flags(argv if argv is not None else sys.argv[1:])
    show_notices()
    try:
        args.run(args, given)
        sys.stdout.flush()
    except ValueError as error:
        return flag_error(command_parsers.get(args.command, parser), error, args.flags, given)
    except BrokenPipeError:  # e.g. `kvlab ... --json | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
