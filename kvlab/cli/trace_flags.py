"""The --trace flags (`kvlab allocate`, `simulate`, `plan`): a real request trace instead of a synthetic workload."""

from __future__ import annotations

import os

from kvlab.cli.common import exclusive, requires
from kvlab.studies.serving import read_trace
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
    """The --trace file as a TraceLoad (kvlab.studies.serving.read_trace: an unreadable file is a one-line error)."""
    return read_trace(args.trace, args.trace_format, args.skip_bad_rows, **kwargs)


TRACE_ONLY_FLAGS = ["--trace-format", "--skip-bad-rows", "--drop-over-max-len"]


def check_trace_flags(given: set[str], synthetic_flags: list[str], why: str) -> None:
    """With --trace the synthetic workload's flags are an error (they would be ignored); without it, the trace's."""
    for flag in synthetic_flags:
        exclusive(given, "--trace", [flag], why)
    for flag in TRACE_ONLY_FLAGS:
        requires(given, flag, "--trace", "it describes the --trace file")
