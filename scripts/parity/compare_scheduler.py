#!/usr/bin/env python3
"""make parity, the scheduler: the same workloads through vLLM 0.33's own v1 scheduler and kvlab's engine.

For every run of scheduler_workloads.RUNS: vLLM's side (scripts/parity/vllm_scheduler.py, in the vLLM
environment given by --vllm-python) and kvlab's (kvlab.core.engine) replay the same IN.json in the same
simulated time; every request's first-scheduled, first-token and finish times, output tokens and
preemptions, and every step's start and end, scheduled tokens, blocks in use, running and waiting
requests, batch (request and tokens, in vLLM's order) and preempted requests are compared for exact
equality (kvlab adds step times in the same order, so the floats are the same bits). The speed ratio is
kvlab's requests per second (its whole engine run in Python, step by step, median of 3, without the comparison's records)
over vLLM's (the seconds spent inside schedule() and update_from_output() only, vLLM's import excluded).
Where the compiled loop applies (kvlab.core.engine.fast.compiled: every run here), it is compared too, on the
same fields but the batch lists it does not keep, and timed the same way (numba's import excluded, as vLLM's).

Writes data/parity/scheduler.csv (one row per run; the runs of a KV connector, scheduler_workloads.CONNECTOR_RUNS, in
data/parity/kv_connector.csv) and exits 1 unless every run is 100% identical.

    .venv/bin/python scripts/parity/compare_scheduler.py --vllm-python .venv-vllm/bin/python [--runs NAME ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import scheduler_workloads  # noqa: E402  (beside this script)

from kvlab.core.engine import Engine, Recorder, replay  # noqa: E402
from kvlab.core.engine.fast import compiled  # noqa: E402

VLLM_SCRIPT = HERE / "vllm_scheduler.py"
SUMMARY_CSV = ROOT / "data" / "parity" / "scheduler.csv"
CONNECTOR_CSV = ROOT / "data" / "parity" / "kv_connector.csv"  # the runs of a KV connector (disaggregated instances)
REQUEST_FIELDS = ("first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens", "num_preemptions")
STEP_FIELDS = (
    "start_s",
    "end_s",
    "num_scheduled_tokens",
    "num_blocks_in_use",
    "num_running",
    "num_waiting",
    "scheduled",
    "preempted",
)
COLUMNS = (
    "run",
    "requests",
    "steps",
    "preemptions",
    "identical_requests_pct",
    "identical_steps_pct",
    "kvlab_req_per_s",
    "vllm_req_per_s",
    "speed_ratio",
    "first_difference",
    "compiled_identical_pct",
    "compiled_req_per_s",
    "compiled_speed_ratio",
    "description",
)
# The compiled loop keeps no batch lists (kvlab.core.engine.fast.compiled): its steps are compared on the other fields.
COMPILED_STEP_FIELDS = tuple(f for f in STEP_FIELDS if f not in ("scheduled", "preempted"))


def run_vllm(python: str, doc: dict, folder: Path, name: str) -> dict:
    """vLLM's OUT document for doc (raises with vLLM's message if its replay fails)."""
    path_in, path_out = folder / f"{name}.in.json", folder / f"{name}.out.json"
    path_in.write_text(json.dumps(doc))
    done = subprocess.run([python, str(VLLM_SCRIPT), str(path_in), str(path_out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: vLLM's replay exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads(path_out.read_text())


def time_kvlab(doc: dict, repeats: int = 3, **engine_options) -> float:
    """Seconds of kvlab's engine on doc, as a user runs it (no comparison records): the median of repeats."""
    args = replay.from_document(doc)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        Engine(**args, **engine_options).run()
        seconds.append(time.perf_counter() - start)
    return sorted(seconds)[len(seconds) // 2]


def compiled_row(doc: dict, theirs: dict) -> dict:
    """The compiled loop against vLLM on doc, where it applies (kvlab.core.engine.fast.compiled): its identical share
    (requests and steps, batch lists aside) and speed; blanks where it does not apply."""
    args = replay.from_document(doc)
    if not (compiled.available() and compiled.eligible(Engine(**args))):
        return {"compiled_identical_pct": "", "compiled_req_per_s": "", "compiled_speed_ratio": ""}
    mine = replay.to_document(Engine(**args, path="compiled").run())
    same_requests, first = _same(mine["requests"], theirs["requests"], REQUEST_FIELDS, "request")
    same_steps, first_step = _same(mine["steps"], theirs["steps"], COMPILED_STEP_FIELDS, "step")
    n, steps = len(theirs["requests"]), len(theirs["steps"])
    identical = not (first or first_step) and same_requests == n and same_steps == steps
    seconds = time_kvlab(doc, path="compiled")
    return {
        "compiled_identical_pct": 100.0 if identical else round(100 * min(same_requests / n, same_steps / steps), 3),
        "compiled_req_per_s": round(n / seconds),
        "compiled_speed_ratio": round(theirs["wall_s_scheduler"] / seconds, 1),
    }


def _same(mine: list, theirs: list, fields: tuple, label: str) -> tuple[int, str]:
    """How many records are equal in every field, and the first that is not (or a count mismatch), in words."""
    same, first = 0, ""
    for i, (a, b) in enumerate(zip(mine, theirs)):
        wrong = [f for f in fields if a[f] != b[f]]
        same += not wrong
        if wrong and not first:
            first = f"{label} {i}: " + ", ".join(f"{f} kvlab {str(a[f])[:80]} vLLM {str(b[f])[:80]}" for f in wrong)
    if len(mine) != len(theirs) and not first:
        first = f"{len(mine)} {label}s in kvlab, {len(theirs)} in vLLM"
    return same, first


def compare(mine: dict, theirs: dict) -> tuple[int, int, str]:
    """(identical requests, identical steps, the first difference or "")."""
    same_requests, first_request = _same(mine["requests"], theirs["requests"], REQUEST_FIELDS, "request")
    same_steps, first_step = _same(mine["steps"], theirs["steps"], STEP_FIELDS, "step")
    return same_requests, same_steps, first_request or first_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", required=True, help="python of the environment with vllm==0.33.0")
    parser.add_argument("--runs", nargs="*", choices=list(scheduler_workloads.RUNS), help="runs to do (default all)")
    parser.add_argument(
        "--out", default=str(SUMMARY_CSV), help=f"summary CSV (default {SUMMARY_CSV.relative_to(ROOT)})"
    )
    parser.add_argument("--keep", metavar="DIR", help="keep every IN/OUT document in DIR")
    args = parser.parse_args(argv)
    names = args.runs or list(scheduler_workloads.RUNS)
    rows, all_identical = [], True
    with tempfile.TemporaryDirectory(prefix="kvlab-parity-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print(
            f"{'run':<24}{'requests':>9}{'steps':>9}{'same req':>10}{'same step':>10}{'kvlab req/s':>13}"
            f"{'vLLM req/s':>12}{'ratio':>8}",
            flush=True,
        )
        for name in names:
            description, build = scheduler_workloads.RUNS[name]
            doc = build()
            theirs = run_vllm(args.vllm_python, doc, folder, name)
            mine = replay.to_document(replay.run_document(doc, recorder=Recorder(scheduled=True)))
            if args.keep:
                (folder / f"{name}.kvlab.json").write_text(json.dumps(mine))
            same_requests, same_steps, first = compare(mine, theirs)
            n, steps = len(theirs["requests"]), len(theirs["steps"])
            identical = not first and same_requests == n and same_steps == steps
            all_identical &= identical
            kvlab_s = time_kvlab(doc, path="reference")
            fast = compiled_row(doc, theirs)
            all_identical &= fast["compiled_identical_pct"] in ("", 100.0)
            row = {
                "run": name,
                "requests": n,
                "steps": steps,
                "preemptions": sum(r["num_preemptions"] for r in theirs["requests"]),
                "identical_requests_pct": round(100 * same_requests / n, 3),
                "identical_steps_pct": round(100 * same_steps / max(steps, 1), 3),
                "kvlab_req_per_s": round(n / kvlab_s),
                "vllm_req_per_s": round(n / theirs["wall_s_scheduler"]),
                "speed_ratio": round(theirs["wall_s_scheduler"] / kvlab_s, 1),
                "first_difference": first,
                **fast,
                "description": description,
            }
            rows.append(row)
            print(
                f"{name:<24}{n:>9,}{steps:>9,}{row['identical_requests_pct']:>9.3f}%{row['identical_steps_pct']:>9.3f}%"
                f"{row['kvlab_req_per_s']:>13,}{row['vllm_req_per_s']:>12,}{row['speed_ratio']:>7.1f}x"
                + (
                    f"  compiled: {fast['compiled_identical_pct']:.3f}% identical, {fast['compiled_req_per_s']:,} "
                    f"req/s, {fast['compiled_speed_ratio']:.1f}x"
                    if fast["compiled_req_per_s"] != ""
                    else ""
                ),
                flush=True,
            )
            if first:
                print(f"  first difference: {first}", flush=True)
    out = Path(args.out)
    connector = [row for row in rows if row["run"] in scheduler_workloads.CONNECTOR_RUNS]
    for path, kept in (
        (out, [row for row in rows if row not in connector]),
        (out.with_name(CONNECTOR_CSV.name), connector),
    ):
        if kept:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
                writer.writeheader()
                writer.writerows(kept)
    print(f"{'all runs identical to vLLM 0.33' if all_identical else 'NOT IDENTICAL'}; summary in {out}")
    return 0 if all_identical else 1


if __name__ == "__main__":
    sys.exit(main())
