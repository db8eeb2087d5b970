"""`kvlab report`: execute every notebook with the parameters file, render HTML and one PDF, write the ledger."""

from __future__ import annotations

import sys
from pathlib import Path

from kvlab.core import validate
from kvlab.report.paths import PARAMS_PATH, REPORT_DIR


def add(commands) -> None:
    """Register `kvlab report` (execute the notebooks, write report/: HTML, PDF, ledger.csv)."""
    p = commands.add_parser(
        "report",
        help="build report/: execute every notebook with the parameters file, render HTML and one PDF, write the ledger",
        description="Executes notebooks/NN_*.ipynb with papermill, using the parameters and seeds of --params "
        "(a notebook's own defaults for the rest), renders each as HTML without code, writes index.html, "
        "report.pdf and ledger.csv. Every parameter is checked before any notebook runs; the build happens in a "
        "temporary folder that replaces --out only when every notebook succeeded.",
        epilog="examples: kvlab report | kvlab report --set 03_capacity.GPU_MEMORY_GIB=141 | kvlab report --set SEED=3",
    )
    p.add_argument("--params", type=Path, default=PARAMS_PATH, help="parameters file (YAML; default params.yaml)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="[NOTEBOOK.]NAME=VALUE",
        dest="overrides",
        help="override one parameter (without NOTEBOOK: every notebook that has NAME); repeatable",
    )
    p.add_argument("--out", type=Path, default=REPORT_DIR, help="output folder (default report/)")
    p.add_argument("--no-pdf", action="store_true", help="skip report.pdf (faster)")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=120.0,
        help="refuse, before any notebook runs, a report estimated to take longer on this machine, "
        "minutes (default 120; the default parameters take about 1)",
    )
    p.set_defaults(run=run, flags={"max_minutes": "--max-minutes"})


def run(args, given: set[str]) -> dict:
    """Build the report. A bad parameter is refused as every command's bad input is (one line, status 2); a failed
    notebook is a `report: error:` line, what became of --out, and status 1.

    Every parameter is checked (kvlab.report.params) before the build's papermill, nbconvert and WeasyPrint are
    imported, so a bad one is refused at once."""
    from kvlab.report.params import ReportError, check_params

    max_minutes = validate.in_range("max_minutes", args.max_minutes, "seconds")
    checked = check_params(args.params, args.overrides, max_minutes=max_minutes)  # ParamsError: a ValueError
    from kvlab.report.build import build_checked

    try:
        build_checked(checked, args.out, pdf=not args.no_pdf)
    except ReportError as error:
        print(f"\nreport: error: {error}", file=sys.stderr)
        print(
            "report: nothing was written; "
            + ("the previous report is unchanged" if (args.out / "index.html").exists() else "no report exists yet"),
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    return {}
