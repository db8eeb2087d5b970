"""Real request traces: Azure LLM inference 2023, Mooncake and ShareGPT lengths, loaded as Workloads.

`load_trace(path)` tells the format from the file's content (or takes trace_format), checks every row
and returns a TraceLoad: the Workload plus the rows it skipped. A bad row is a one-line ValueError
"<file>:<line>: ..." unless on_bad_row="skip" asks to skip and count it. `trace_dir()` finds the
folder holding the files that data/traces.toml lists; `python -m kvlab.traces download` fetches them.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import sys
import tempfile
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from kvlab import validate
from kvlab.allocator import allocation_table
from kvlab.simulator import compare_policies
from kvlab.workloads import Workload, poisson_arrivals

TRACE_FORMATS = ("azure", "mooncake", "sharegpt")
REPO_DIR = Path(__file__).resolve().parents[1]
MANIFEST_PATH = REPO_DIR / "data" / "traces.toml"
MOONCAKE_BLOCK_TOKENS = 512
# The columns each CSV format needs: arrival time (None: the format has none), prompt and output tokens.
_CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "sharegpt": (None, "num_prefill_tokens", "num_decode_tokens"),
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
    num_rows: int                       # data rows read (header and blank lines not counted)
    bad_rows: tuple[BadRow, ...] = ()   # skipped rows, only with on_bad_row="skip"
    poisson_arrivals: bool = False      # True when the file has no timestamps and arrivals were drawn

    @property
    def num_skipped(self) -> int:
        """Rows skipped as bad."""
        return len(self.bad_rows)

    def summary(self) -> str:
        """One line: format, file name, requests kept, rows skipped and the first skipped line."""
        text = (f"{self.trace_format} trace {Path(self.path).name}: {self.workload.num_requests:,} requests "
                f"from {self.num_rows:,} rows, {self.num_skipped:,} bad rows skipped")
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


def load_trace(path: str | os.PathLike, trace_format: str = "auto", *, on_bad_row: str = "raise",
               arrival_rate_per_s: float | None = None, rng: np.random.Generator | None = None,
               max_requests: int | None = None, name: str | None = None) -> TraceLoad:
    """Load an Azure, Mooncake or ShareGPT trace file as a Workload (arrivals in s from the first request).

    trace_format: "auto" (tell by content) or one of TRACE_FORMATS. on_bad_row: "raise" (ValueError
    naming file and line) or "skip" (skip and count in TraceLoad.bad_rows). A file without timestamps
    (ShareGPT) needs arrival_rate_per_s (requests/s) and rng for seeded Poisson arrivals.
    max_requests keeps only the first valid requests.
    """
    validate.one_of("trace_format", trace_format, ("auto",) + TRACE_FORMATS)
    validate.one_of("on_bad_row", on_bad_row, ("raise", "skip"))
    if max_requests is not None:
        validate.positive_int("max_requests", max_requests)
    path = str(path)
    try:
        with open(path, encoding="utf-8", newline=None) as f:  # newline=None: CRLF and LF alike
            lines = f.read().split("\n")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
                         "a trace is a CSV or JSONL text file") from None
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
        validate.fail("arrival_rate_per_s", arrival_rate_per_s,
                      f"a {trace_format} trace has its own timestamps; leave the rate unset")
    if not has_time:
        if arrival_rate_per_s is None:
            validate.fail("arrival_rate_per_s", None, f"a {trace_format} trace has no timestamps: give a rate "
                          "(requests/s) for Poisson arrivals")
        validate.positive_number("arrival_rate_per_s", arrival_rate_per_s)
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
        arrival_s=arrival_s, prompt_tokens=np.array(prompts, dtype=np.int64),
        output_tokens=np.array(outputs, dtype=np.int64),
        prefix_hashes=tuple(np.array(ids, dtype=np.int64) for ids in hashes) if hashes else None,
        prefix_block_tokens=MOONCAKE_BLOCK_TOKENS if hashes else None,
        name=name if name is not None else trace_format)
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
    raise ValueError(f"{path}:{line_no}: cannot tell the trace format from {header.strip()[:80]!r}: "
                     f"pass trace_format, one of {', '.join(TRACE_FORMATS)}")


def _csv_parser(path: str, line_no: int, header: str, trace_format: str):
    """A row parser for a CSV format, with the column positions read from the header."""
    columns = [c.strip() for c in header.split(",")]
    needed = _CSV_COLUMNS[trace_format]
    missing = [c for c in needed if c and c not in columns]
    if missing:
        raise ValueError(f"{path}:{line_no}: the header lacks column(s) {', '.join(missing)} that a "
                         f"{trace_format} trace needs (found: {', '.join(columns)[:80]})")
    time_col, prompt_col, output_col = needed
    i_time = columns.index(time_col) if time_col else None
    i_prompt, i_output = columns.index(prompt_col), columns.index(output_col)
    width = len(columns)

    def parse(line: str):
        fields = line.split(",")
        if len(fields) < width:
            raise _Bad(f"{len(fields)} columns where the header has {width} ({', '.join(columns)})")
        t = _azure_time(fields[i_time]) if i_time is not None else None
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


def _int_or_none(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _count(column: str, value, minimum: int, shown=None) -> int:
    """value if it is a whole number >= minimum (a token count); shown is the CSV text it came from."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        why = "a request generates at least one token" if minimum == 1 else "a token count"
        raise _Bad(f"{column}={value if shown is None else shown!r} is not allowed: must be a whole number "
                   f">= {minimum} ({why})")
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
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**63
                                            for h in ids):  # they are kept as int64
        raise _Bad(f"hash_ids={str(ids)[:40]} is not allowed: must be a list of whole numbers >= 0 and < 2^63")
    if len(ids) != -(-prompt // MOONCAKE_BLOCK_TOKENS):
        raise _Bad(f"hash_ids has {len(ids)} blocks but input_length={prompt} needs "
                   f"{-(-prompt // MOONCAKE_BLOCK_TOKENS)} blocks of {MOONCAKE_BLOCK_TOKENS} tokens")
    return t, prompt, output, ids


def _seconds_from_first(times: list, trace_format: str) -> np.ndarray:
    if trace_format == "mooncake":
        ms = np.array(times, dtype=np.float64)
        return (ms - ms[0]) / 1e3
    t0 = times[0]
    return np.array([(t - t0).total_seconds() for t in times], dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Tables for the notebook

ARTICLE_MEAN_TOKENS = 567          # section 1: mean tokens used per request
ARTICLE_MAX_TOKENS = 4096          # section 1: maximum length
ARTICLE_RATE_PER_S = 10.0          # section 2: arrivals on the order of 10 requests/s


def summary_table(workloads: dict[str, Workload]) -> pd.DataFrame:
    """Per trace: requests, duration (s), rate (requests/s), prompt and output token percentiles, inter-arrival CV."""
    rows = {}
    for name, w in workloads.items():
        gaps = np.diff(w.arrival_s)
        duration = float(w.arrival_s[-1] - w.arrival_s[0])
        rows[name] = {
            "requests": w.num_requests,
            "duration_s": round(duration, 1),
            "rate_per_s": round(w.num_requests / duration, 2) if duration > 0 else float("nan"),
            "prompt_mean_tokens": round(float(w.prompt_tokens.mean()), 1),
            "prompt_p50_tokens": int(np.percentile(w.prompt_tokens, 50, method="lower")),
            "prompt_p99_tokens": int(np.percentile(w.prompt_tokens, 99, method="lower")),
            "prompt_max_tokens": int(w.prompt_tokens.max()),
            "output_mean_tokens": round(float(w.output_tokens.mean()), 1),
            "output_p50_tokens": int(np.percentile(w.output_tokens, 50, method="lower")),
            "output_p99_tokens": int(np.percentile(w.output_tokens, 99, method="lower")),
            "output_max_tokens": int(w.output_tokens.max()),
            "interarrival_cv": round(float(gaps.std() / gaps.mean()), 2) if len(gaps) and gaps.mean() > 0 else float("nan"),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "trace"
    return table


def article_comparison(workloads: dict[str, Workload]) -> pd.DataFrame:
    """The article's assumed figures against each trace's: mean length, share over 4,096 tokens, output mix, rate."""
    def row(w: Workload) -> dict:
        total = w.prompt_tokens + w.output_tokens
        out = w.output_tokens
        duration = float(w.arrival_s[-1] - w.arrival_s[0])
        return {
            "mean_tokens_per_request": round(float(total.mean()), 1),
            "over_4096_tokens_pct": round(100 * float((total > ARTICLE_MAX_TOKENS).mean()), 1),
            "output_40_200_pct": round(100 * float(((out >= 40) & (out <= 200)).mean()), 1),
            "output_400_1000_pct": round(100 * float(((out >= 400) & (out <= 1000)).mean()), 1),
            "output_mean_tokens": round(float(out.mean()), 1),
            "rate_per_s": round(w.num_requests / duration, 2) if duration > 0 else float("nan"),
        }

    article = {"mean_tokens_per_request": float(ARTICLE_MEAN_TOKENS), "over_4096_tokens_pct": 0.0,
               "output_40_200_pct": 85.0, "output_400_1000_pct": 15.0, "output_mean_tokens": 207.0,
               "rate_per_s": ARTICLE_RATE_PER_S}
    table = pd.DataFrame.from_dict({"article (assumed)": article} | {n: row(w) for n, w in workloads.items()},
                                   orient="index")
    table.index.name = "source"
    return table


def arrival_rate(workload: Workload, window_s: float = 60.0) -> pd.Series:
    """Arrival rate (requests/s) in consecutive windows of window_s seconds, indexed by window start (min).

    The last window is dropped when the trace ends inside it (its rate would be too low), unless it is the only one.
    """
    window_s = validate.positive_number("window_s", window_s)
    window = (workload.arrival_s // window_s).astype(np.int64)
    num_windows = max(1, int(workload.arrival_s[-1] // window_s))
    counts = np.bincount(window, minlength=num_windows)[:num_windows]
    index = pd.Index(np.arange(num_windows) * window_s / 60.0, name="window_start_min")
    return pd.Series(counts / window_s, index=index, name=f"{workload.name or 'trace'} requests/s")


# ---------------------------------------------------------------------------------------------
# A trace in place of the synthetic workload (kvlab allocate / simulate, notebooks 01 and 02)

OVER_MAX_LEN = ("error", "drop")


def request_lengths(workload: Workload, max_len_tokens: int | None = None, *,
                    over_max_len: str = "error") -> tuple[np.ndarray, int]:
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
        validate.fail("max_len_tokens", max_len_tokens,
                      f"{num_over:,} of the trace's {len(lengths):,} requests are longer (largest "
                      f"{int(lengths.max()):,} tokens = prompt + output); raise it, or drop them "
                      "(over_max_len=drop, kvlab allocate --drop-over-max-len)")
    if num_over == len(lengths):
        validate.fail("max_len_tokens", max_len_tokens, f"every request of the trace is longer (shortest "
                      f"{int(lengths.min()):,} tokens); nothing would be left")
    return lengths[~too_long], num_over


@dataclass(frozen=True, eq=False)
class NotebookTrace:
    """The trace a notebook asked for: loaded, or None with a plain sentence saying why not."""

    name: str                   # azure, mooncake, sharegpt, or "" for none
    load: TraceLoad | None      # None when no trace was asked for or its file is missing
    note: str                   # one sentence for the reader, without absolute paths

    @property
    def available(self) -> bool:
        """True when the trace was loaded."""
        return self.load is not None

    def with_others(self, others: dict) -> dict:
        """others (name -> workload or lengths) plus this trace's workload when it was loaded."""
        return dict(others) | ({self.name: self.load.workload} if self.load is not None else {})


def open_trace(name: str, directory: str | os.PathLike | None = None, *, max_requests: int | None = None,
               arrival_rate_per_s: float = 10.0, seed: int = 0) -> NotebookTrace:
    """The trace name ("" for none) from trace_dir(directory), its first max_requests requests.

    A missing file is not an error: the result says so in .note and holds no load. ShareGPT (no
    timestamps) gets Poisson arrivals at arrival_rate_per_s (requests/s) from default_rng(seed).
    """
    if not name:
        return NotebookTrace("", None, "No real trace chosen (TRACE is empty): the real-trace tables "
                                       "below are empty and the figures show the article's assumptions only.")
    path = trace_path(name, directory or None)
    if not path.is_file():
        return NotebookTrace(name, None, f"The {name} trace is not available ({path.name} is not in the trace "
                                         "folder; set TRACE_DIR or run make traces): the real-trace tables below "
                                         "are empty and the figures show the article's assumptions only.")
    timed = name != "sharegpt"
    load = load_trace(path, name, max_requests=max_requests, name=name,
                      arrival_rate_per_s=None if timed else arrival_rate_per_s,
                      rng=None if timed else np.random.default_rng(seed))
    w = load.workload
    arrivals = (f"over {w.arrival_s[-1]:,.1f} s of its own timestamps" if timed else
                f"with Poisson arrivals at {arrival_rate_per_s:g} requests/s (seed {seed}; the file has no timestamps)")
    first = f"the first {w.num_requests:,}" if max_requests is not None else f"all {w.num_requests:,}"
    return NotebookTrace(name, load, f"The {name} trace: {first} requests, {arrivals}.")


def trace_allocation_table(trace: NotebookTrace, block_sizes, *, max_len_tokens: int,
                           memory_gib: float, mib_per_token: float) -> pd.DataFrame:
    """Section 1's waste table on the trace's lengths (prompt + output, those over max_len_tokens dropped).

    Empty (same columns) when the trace is not available. Columns as allocator.allocation_table plus
    num_requests and dropped_over_max_len.
    """
    columns = ["num_requests", "dropped_over_max_len", "reserved_tokens", "used_tokens", "wasted_tokens",
               "waste_pct", "max_num_requests", "block_table_entries"]
    if trace.load is None:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="block_size"))
    lengths, dropped = request_lengths(trace.load.workload, max_len_tokens, over_max_len="drop")
    table = allocation_table(lengths, block_sizes, max_len_tokens=max_len_tokens,
                             memory_gib=memory_gib, mib_per_token=mib_per_token)
    table.insert(0, "dropped_over_max_len", dropped)
    table.insert(0, "num_requests", len(lengths))
    return table


def trace_policy_comparison(trace: NotebookTrace, *, max_num_seqs: int, ms_per_token: float) -> pd.DataFrame:
    """Section 2's static-vs-continuous table on the trace's arrivals and output lengths; empty when not available."""
    if trace.load is None:
        return pd.DataFrame(columns=["num_requests", "mean_latency_s", "p95_latency_s", "max_latency_s",
                                     "mean_queue_s", "makespan_s", "throughput_rps", "busy_slot_s", "idle_pct"],
                            index=pd.Index([], name="policy"))
    return compare_policies(trace.load.workload, max_num_seqs=max_num_seqs, ms_per_token=ms_per_token)


def availability_note(directory: str | os.PathLike | None = None) -> str:
    """One sentence for the report: whether the real trace files were in trace_dir(directory), and which."""
    missing = missing_traces(directory)
    names = list(read_manifest())
    if not missing:
        return f"Real request traces were available ({', '.join(names)}): the real-trace cells ran on them."
    have = [n for n in names if n not in missing]
    text = (f"Real request traces were not available ({', '.join(missing)} missing from the trace folder; "
            "set TRACE_DIR or run make traces)")
    if have:
        text += f"; present: {', '.join(have)}"
    return text + ": the cells that need a missing trace show that it is absent instead of its figures."


# ---------------------------------------------------------------------------------------------
# Download (make traces)


def sha256_of(path: str | os.PathLike) -> str:
    """The sha256 (hex) of a whole file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)


def download(dest: str | os.PathLike, manifest: str | os.PathLike = MANIFEST_PATH,
             names: list[str] | None = None, fetch=_fetch) -> list[str]:
    """Fetch the manifest's traces into dest and check their sha256; a file already there with the right hash is kept.

    Returns one status line per trace. A hash mismatch leaves no file behind and raises a one-line ValueError.
    """
    entries = read_manifest(manifest)
    for name in names or []:
        validate.one_of("trace", name, entries)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    report = []
    for name, entry in entries.items():
        if names and name not in names:
            continue
        target = dest / entry["file"]
        if target.is_file() and sha256_of(target) == entry["sha256"]:
            report.append(f"{name}: {target} already present, sha256 ok")
            continue
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{entry['file']}.")
        os.close(fd)
        try:
            fetch(entry["url"], Path(tmp))
            got = sha256_of(tmp)
            if got != entry["sha256"]:
                raise ValueError(f"{entry['url']}: sha256 {got} is not the manifest's {entry['sha256']} "
                                 f"for {name}; nothing was written")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        report.append(f"{name}: downloaded {target} ({target.stat().st_size:,} bytes), sha256 ok")
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m kvlab.traces download --dest DIR`: fetch and verify the traces (make traces)."""
    from kvlab.cli import OneLineParser

    parser = OneLineParser(prog="python -m kvlab.traces", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    down = sub.add_parser("download", help="download the traces in data/traces.toml and check their sha256")
    down.add_argument("--dest", default=str(REPO_DIR / "data" / "traces"), help="folder to write the files to")
    down.add_argument("--manifest", default=str(MANIFEST_PATH), help="the manifest (TOML) listing the files")
    down.add_argument("--trace", action="append", dest="names", help="only this trace (repeatable)")
    args = parser.parse_args(argv)
    try:
        for line in download(args.dest, args.manifest, args.names):
            print(line)
    except (ValueError, OSError) as err:
        print(f"error: {err}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
