"""The --trace flags of `kvlab allocate` and `kvlab simulate`: a real request trace instead of a synthetic workload."""

from __future__ import annotations

import os

from kvlab.cli.common import exclusive, requires
from kvlab.core import validate
from kvlab.workloads import traces


def trace_arg(text: str) -> str:
    """--trace's value: a file's path, or the name of a trace of data/traces.toml (azure, mooncake, sharegpt) that
    is no file here, for that trace's file in the trace folder (kvlab.workloads.traces.trace_dir: $TRACE_DIR, else
    ../shared/traces, else data/traces)."""
    if not os.path.exists(text) and text in traces.read_manifest():
        return str(traces.trace_path(text))
    return text


def add_trace_flags(p, lengths_text: str):
    """--trace, --trace-format and --skip-bad-rows, in their own group; returns the group."""
    group = p.add_argument_group("real request trace (replaces the synthetic workload)")
    group.add_argument(
        "--trace",
        metavar="PATH",
        type=trace_arg,
        help=f"an Azure LLM inference CSV, a Mooncake JSONL or a ShareGPT length CSV, or the name of one in the "
        f"trace folder ({', '.join(traces.read_manifest())}; $TRACE_DIR, `make traces`); {lengths_text}",
    )
    group.add_argument(
        "--trace-format",
        default="auto",
        choices=("auto",) + traces.TRACE_FORMATS,
        help="format of --trace (default auto: told from the header or first row)",
    )
    group.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip malformed rows of --trace and print how many (default: the first is an error naming file and line)",
    )
    return group


def load_trace_arg(args, **kwargs) -> traces.TraceLoad:
    """The --trace file as a TraceLoad; an unreadable file is a one-line ValueError naming --trace."""
    try:
        return traces.load_trace(
            args.trace, args.trace_format, on_bad_row="skip" if args.skip_bad_rows else "raise", **kwargs
        )
    except OSError as err:
        validate.fail("trace", args.trace, f"cannot be read ({err.strerror or err})")


def file_format(path: str) -> str:
    """The --trace file's format as told from its first lines, or auto when it cannot be read."""
    try:
        return traces.file_format(path)
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return "auto"  # load_trace_arg reports the problem in full


def trace_note(load: traces.TraceLoad) -> dict:
    """The JSON keys a trace adds to a command's result."""
    return {
        "trace": load.path,
        "trace_format": load.trace_format,
        "num_rows": load.num_rows,
        "num_skipped_rows": load.num_skipped,
    }


TRACE_ONLY_FLAGS = ["--trace-format", "--skip-bad-rows", "--drop-over-max-len"]


def check_trace_flags(given: set[str], synthetic_flags: list[str], why: str) -> None:
    """With --trace the synthetic workload's flags are an error (they would be ignored); without it, the trace's."""
    for flag in synthetic_flags:
        exclusive(given, "--trace", [flag], why)
    for flag in TRACE_ONLY_FLAGS:
        requires(given, flag, "--trace", "it describes the --trace file")
