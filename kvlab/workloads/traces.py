"""Real request traces: Azure LLM inference 2023, Mooncake and ShareGPT lengths, loaded as Workloads.

`load_trace(path)` tells the format from the file's content (or takes trace_format), checks every row
and returns a TraceLoad: the Workload plus the rows it skipped. A bad row is a one-line ValueError
"<file>:<line>: ..." unless on_bad_row="skip" asks to skip and count it. `trace_dir()` finds the
folder holding the files that data/traces.toml lists; `kvlab traces download` fetches them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from kvlab.core import validate
from kvlab.core.units import cdiv
from kvlab.core.workload import Workload
from kvlab.workloads.synthetic import poisson_arrivals

TRACE_FORMATS = ("azure", "mooncake", "sharegpt")
# What load_trace reads: the traces, and a plain CSV with the header arrival_s,prompt_tokens,output_tokens
# (arrival times in seconds), e.g. kvlab simulate --requests-csv output or a workload written by hand.
FILE_FORMATS = TRACE_FORMATS + ("csv",)
REPO_DIR = Path(__file__).resolve().parents[2]
MANIFEST_PATH = REPO_DIR / "data" / "traces.toml"
# The Mooncake trace hashes prompts in blocks of 512 tokens: a property of the trace's data, not a KV block size.
MOONCAKE_HASH_BLOCK_TOKENS = 512
# The columns each CSV format needs: arrival time (None: the format has none), prompt and output tokens.
_CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "sharegpt": (None, "num_prefill_tokens", "num_decode_tokens"),
    "csv": ("arrival_s", "prompt_tokens", "output_tokens"),
}
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


class BadRow(NamedTuple):
    """A row the loader skipped: its 1-based line number in the file and why."""

    line: int
    reason: str


@dataclass(frozen=True, eq=False)
class TraceLoad:
    """A loaded trace: the workload, where it came from, and the bad rows skipped on the way."""

    workload: Workload
    path: str
    trace_format: str
    num_rows: int  # data rows read (header and blank lines not counted)
    bad_rows: tuple[BadRow, ...] = ()  # skipped rows, only with on_bad_row="skip"
    poisson_arrivals: bool = False  # True when the file has no timestamps and arrivals were drawn

    @property
    def num_skipped(self) -> int:
        """Rows skipped as bad."""
        return len(self.bad_rows)

    def summary(self) -> str:
        """One line: format, file name, requests kept, rows skipped and the first skipped line."""
        text = (
            f"{self.trace_format} trace {Path(self.path).name}: {self.workload.num_requests:,} requests "
            f"from {self.num_rows:,} rows, {self.num_skipped:,} bad rows skipped"
        )
        if self.bad_rows:
            text += f" (first: line {self.bad_rows[0].line}: {self.bad_rows[0].reason})"
        if self.poisson_arrivals:
            text += ", Poisson arrivals (the file has no timestamps)"
        return text


class _Bad(Exception):
    """A bad row; the loader adds the file and line."""


# ---------------------------------------------------------------------------------------------
# Where the files are


def trace_dir(path: str | os.PathLike | None = None) -> Path:
    """The trace folder: path if given, else $TRACE_DIR, else <repo>/../shared/traces if it exists, else <repo>/data/traces."""
    if path:
        return Path(path)
    if os.environ.get("TRACE_DIR"):
        return Path(os.environ["TRACE_DIR"])
    shared = REPO_DIR.parent / "shared" / "traces"
    return shared if shared.is_dir() else REPO_DIR / "data" / "traces"


def read_manifest(path: str | os.PathLike = MANIFEST_PATH) -> dict[str, dict]:
    """The manifest (data/traces.toml): trace name -> file, format, url, licence, sha256, ..."""
    with open(path, "rb") as f:
        return tomllib.load(f)


def trace_path(name: str, directory: str | os.PathLike | None = None) -> Path:
    """The file of the trace called name in the manifest (azure, mooncake, sharegpt) inside trace_dir(directory)."""
    manifest = read_manifest()
    validate.one_of("trace", name, manifest)
    return trace_dir(directory) / manifest[name]["file"]


def missing_traces(directory: str | os.PathLike | None = None) -> list[str]:
    """Names of the manifest's traces whose file is not in trace_dir(directory); [] when all are there."""
    return [name for name in read_manifest() if not trace_path(name, directory).is_file()]


# ---------------------------------------------------------------------------------------------
# Loading


def load_trace(
    path: str | os.PathLike,
    trace_format: str = "auto",
    *,
    on_bad_row: str = "raise",
    arrival_rate_per_s: float | None = None,
    rng: np.random.Generator | None = None,
    max_requests: int | None = None,
    name: str | None = None,
) -> TraceLoad:
    """Load an Azure, Mooncake or ShareGPT trace file as a Workload (arrivals in s from the first request).

    trace_format: "auto" (tell by content) or one of FILE_FORMATS. on_bad_row: "raise" (ValueError
    naming file and line) or "skip" (skip and count in TraceLoad.bad_rows). A file without timestamps
    (ShareGPT) needs arrival_rate_per_s (requests/s) and rng for seeded Poisson arrivals.
    max_requests keeps only the first valid requests.
    """
    validate.one_of("trace_format", trace_format, ("auto",) + FILE_FORMATS)
    validate.one_of("on_bad_row", on_bad_row, ("raise", "skip"))
    if max_requests is not None:
        validate.positive_int("max_requests", max_requests)
    path = str(path)
    try:
        with open(path, encoding="utf-8", newline=None) as f:  # newline=None: CRLF and LF alike
            lines = f.read().split("\n")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
            "a trace is a CSV or JSONL text file"
        ) from None
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise ValueError(f"{path}:1: the file is empty: a trace needs a header or JSON rows")
    if trace_format == "auto":
        trace_format = _detect_format(path, first + 1, lines[first])
    if trace_format == "mooncake":
        parse, start = _mooncake_row, first
    else:
        parse, start = _csv_parser(path, first + 1, lines[first], trace_format), first + 1
    has_time = trace_format != "sharegpt"
    if has_time and arrival_rate_per_s is not None:
        validate.fail(
            "arrival_rate_per_s",
            arrival_rate_per_s,
            f"the {trace_format} trace has its own timestamps; leave the rate unset",
        )
    if not has_time:
        if arrival_rate_per_s is None:
            raise ValueError(
                f"arrival_rate_per_s is needed: the {trace_format} trace has no timestamps, so its "
                "requests arrive as a Poisson process at a rate you give (requests/s)"
            )
        validate.in_range("arrival_rate_per_s", arrival_rate_per_s, "arrival_rate")
        if not isinstance(rng, np.random.Generator):
            validate.fail("rng", rng, "a numpy.random.Generator is needed to draw Poisson arrivals")

    times, prompts, outputs, hashes, bad = [], [], [], [], []
    num_rows = 0
    for index in range(start, len(lines)):
        line = lines[index]
        if not line.strip():
            continue
        num_rows += 1
        try:
            t, prompt, output, ids = parse(line)
            if times and t < times[-1]:
                raise _Bad(f"timestamp {t} is not allowed: it goes backwards from the previous row's {times[-1]}")
        except _Bad as err:
            if on_bad_row == "raise":
                raise ValueError(f"{path}:{index + 1}: {err}") from None
            bad.append(BadRow(index + 1, str(err)))
            continue
        if has_time:
            times.append(t)
        prompts.append(prompt)
        outputs.append(output)
        if ids is not None:
            hashes.append(ids)
        if max_requests is not None and len(prompts) == max_requests:
            break
    if not prompts:
        what = f"all {num_rows} rows are bad (first: line {bad[0].line}: {bad[0].reason})" if bad else "no data rows"
        raise ValueError(f"{path}: no requests: {what}")

    if has_time:
        arrival_s = _seconds_from_first(times, trace_format)
    else:
        arrival_s = poisson_arrivals(len(prompts), arrival_rate_per_s, rng)
    workload = Workload(
        arrival_s=arrival_s,
        prompt_tokens=np.array(prompts, dtype=np.int64),
        output_tokens=np.array(outputs, dtype=np.int64),
        prefix_hashes=tuple(np.array(ids, dtype=np.int64) for ids in hashes) if hashes else None,
        prefix_block_tokens=MOONCAKE_HASH_BLOCK_TOKENS if hashes else None,
        name=name if name is not None else trace_format,
    )
    return TraceLoad(workload, path, trace_format, num_rows, tuple(bad), poisson_arrivals=not has_time)


def file_format(path: str | os.PathLike) -> str:
    """The format of a trace file told from its first non-blank line ("auto" for an empty file)."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                return _detect_format(str(path), line_no, line)
    return "auto"


def _detect_format(path: str, line_no: int, header: str) -> str:
    if header.lstrip().startswith("{"):
        return "mooncake"
    columns = {c.strip() for c in header.split(",")}
    for fmt, needed in _CSV_COLUMNS.items():
        if {c for c in needed if c} <= columns:
            return fmt
    raise ValueError(
        f"{path}:{line_no}: cannot tell the trace format from {header.strip()[:80]!r}: "
        f"name it with trace_format, one of {', '.join(FILE_FORMATS)}"
    )


def _csv_parser(path: str, line_no: int, header: str, trace_format: str):
    """A row parser for a CSV format, with the column positions read from the header."""
    columns = [c.strip() for c in header.split(",")]
    needed = _CSV_COLUMNS[trace_format]
    missing = [c for c in needed if c and c not in columns]
    if missing:
        raise ValueError(
            f"{path}:{line_no}: the header lacks column(s) {', '.join(missing)} that a "
            f"{trace_format} trace needs (found: {', '.join(columns)[:80]})"
        )
    time_col, prompt_col, output_col = needed
    i_time = columns.index(time_col) if time_col else None
    i_prompt, i_output = columns.index(prompt_col), columns.index(output_col)
    width = len(columns)

    def parse(line: str):
        fields = line.split(",")
        if len(fields) < width:
            raise _Bad(f"{len(fields)} columns where the header has {width} ({', '.join(columns)})")
        t = (
            None
            if i_time is None
            else _seconds(fields[i_time])
            if trace_format == "csv"
            else _azure_time(fields[i_time])
        )
        prompt = _count(prompt_col, _int_or_none(fields[i_prompt]), 0, fields[i_prompt])
        return t, prompt, _count(output_col, _int_or_none(fields[i_output]), 1, fields[i_output]), None

    return parse


def _azure_time(text: str) -> dt.datetime:
    # Python takes at most 6 fractional digits; the Azure files have 7, so cut to 26 characters.
    try:
        t = dt.datetime.fromisoformat(text.strip()[:26])
    except ValueError:
        t = None
    if t is None or t.tzinfo is not None:  # a UTC offset cannot be compared with the file's plain times
        raise _Bad(f"TIMESTAMP={text.strip()!r} is not allowed: must be a time YYYY-MM-DD HH:MM:SS.ffffff")
    return t


def _seconds(text: str) -> float:
    """arrival_s of a plain CSV: a finite number of seconds >= 0."""
    try:
        t = float(text.strip())
    except ValueError:
        t = math.nan
    if not math.isfinite(t) or t < 0:
        raise _Bad(f"arrival_s={text.strip()!r} is not allowed: must be a number of seconds >= 0")
    return t


def _int_or_none(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _count(column: str, value, minimum: int, shown=None) -> int:
    """value if it is a whole number >= minimum (a token count); shown is the CSV text it came from."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        why = "a request generates at least one token" if minimum == 1 else "a token count"
        raise _Bad(
            f"{column}={value if shown is None else shown!r} is not allowed: must be a whole number "
            f">= {minimum} ({why})"
        )
    return value


def _mooncake_row(line: str):
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise _Bad(f"not a JSON object ({err.msg}, column {err.colno})") from None
    if not isinstance(row, dict):
        raise _Bad(f"not a JSON object: {line.strip()[:40]!r}")
    missing = [k for k in _MOONCAKE_KEYS if k not in row]
    if missing:
        raise _Bad(f"missing column(s) {', '.join(missing)}")
    t = row["timestamp"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise _Bad(f"timestamp={t!r} is not allowed: must be a number of ms")
    prompt = _count("input_length", row["input_length"], 0)
    output = _count("output_length", row["output_length"], 1)
    ids = row["hash_ids"]
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**63 for h in ids
    ):  # they are kept as int64
        raise _Bad(f"hash_ids={str(ids)[:40]} is not allowed: must be a list of whole numbers >= 0 and < 2^63")
    if len(ids) != cdiv(prompt, MOONCAKE_HASH_BLOCK_TOKENS):
        raise _Bad(
            f"hash_ids has {len(ids)} blocks but input_length={prompt} needs "
            f"{cdiv(prompt, MOONCAKE_HASH_BLOCK_TOKENS)} blocks of {MOONCAKE_HASH_BLOCK_TOKENS} tokens"
        )
    return t, prompt, output, ids


def _seconds_from_first(times: list, trace_format: str) -> np.ndarray:
    if trace_format == "mooncake":
        ms = np.array(times, dtype=np.float64)
        return (ms - ms[0]) / 1e3
    if trace_format == "csv":
        seconds = np.array(times, dtype=np.float64)
        return seconds - seconds[0]
    t0 = times[0]
    return np.array([(t - t0).total_seconds() for t in times], dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# A trace in place of the synthetic workload (kvlab allocate / simulate, notebooks 01 and 02)

OVER_MAX_LEN = ("error", "drop")


def request_lengths(
    workload: Workload, max_len_tokens: int | None = None, *, over_max_len: str = "error"
) -> tuple[np.ndarray, int]:
    """Each request's length for section 1 (prompt + output tokens) and how many were dropped as too long.

    over_max_len: "error" (a ValueError naming how many requests exceed max_len_tokens and the largest)
    or "drop" (leave them out, as vLLM refuses a request longer than max_model_len).
    """
    validate.one_of("over_max_len", over_max_len, OVER_MAX_LEN)
    lengths = workload.prompt_tokens + workload.output_tokens
    if max_len_tokens is None:
        return lengths, 0
    max_len_tokens = validate.positive_int("max_len_tokens", max_len_tokens)
    too_long = lengths > max_len_tokens
    num_over = int(too_long.sum())
    if num_over and over_max_len == "error":
        validate.fail(
            "max_len_tokens",
            max_len_tokens,
            f"{num_over:,} of the trace's {len(lengths):,} requests are longer (largest "
            f"{int(lengths.max()):,} tokens = prompt + output); raise it, or drop them "
            "(over_max_len=drop, kvlab allocate --drop-over-max-len)",
        )
    if num_over == len(lengths):
        validate.fail(
            "max_len_tokens",
            max_len_tokens,
            f"every request of the trace is longer (shortest {int(lengths.min()):,} tokens); nothing would be left",
        )
    return lengths[~too_long], num_over
