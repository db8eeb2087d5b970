"""What the commands print alike: one JSON object (--json), and a figure's line, its label in a column of 21."""

from __future__ import annotations

import json


def print_json(result: dict) -> None:
    """Print result as one indented JSON object (--json)."""
    print(json.dumps(result, indent=2, sort_keys=False))


def print_line(label: str, text: str) -> None:
    """Print one figure: its label, padded to 21 characters, then the figure in words."""
    print(f"{label:<20} {text}")


def print_trace(out: dict, arrivals: str = "") -> None:
    """Print the line of a trace's load (kvlab.studies.serving.trace_keys in out), with how its arrivals came."""
    print_line(
        "trace",
        f"{out['trace_format']} {out['trace']}: {out['num_rows']:,} rows read, {out['num_skipped_rows']:,} bad rows "
        f"skipped" + (f"; {arrivals}" if arrivals else ""),
    )
