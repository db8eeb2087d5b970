"""`kvlab traces download`: fetch the public request traces of data/traces.toml and check their sha256."""

from __future__ import annotations

from kvlab.cli.common import OneLineParser
from kvlab.workloads.traces import MANIFEST_PATH, REPO_DIR


def add(commands) -> None:
    """Register `kvlab traces download` (fetch the public request traces and check their sha256)."""
    p = commands.add_parser(
        "traces",
        help="the public request traces: download them and check their sha256",
        description="The real request traces kvlab reads (data/traces.toml lists them with "
        "their sources, licences and sha256).",
    )
    sub = p.add_subparsers(dest="traces_command", metavar="ACTION", parser_class=OneLineParser, required=True)
    down = sub.add_parser(
        "download",
        help="download the traces of data/traces.toml and check their sha256",
        description="Fetches each trace of the manifest into --dest and checks its sha256; a file "
        "already there with the right hash is kept, a mismatch leaves nothing behind.",
    )
    down.add_argument(
        "--dest", default=str(REPO_DIR / "data" / "traces"), help="folder to write the files to (default data/traces)"
    )
    down.add_argument("--manifest", default=str(MANIFEST_PATH), help="the manifest (TOML) listing the files")
    down.add_argument("--trace", action="append", dest="names", help="only this trace (repeatable)")
    down.set_defaults(run=run_download, flags={"trace": "--trace"})


def run_download(args, given: set[str]) -> dict:
    """Fetch and verify the traces; print one line per trace."""
    from kvlab.workloads.download import download

    try:
        lines = download(args.dest, args.manifest, args.names)
    except OSError as err:
        raise ValueError(f"dest={args.dest!r} is not allowed: {err.strerror or err}") from None
    for line in lines:
        print(line)
    return {"traces": lines}
