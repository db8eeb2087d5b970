#!/usr/bin/env python3
"""Time vLLM 0.33's real v1 scheduler (schedule() and update_from_output(), separately)
per engine step, on the CPU, for decode-heavy batches of B running requests.

Reuses scripts/parity/vllm_scheduler.py unchanged (imported as a module): its
build_scheduler() builds the Scheduler / AsyncScheduler the way EngineCore does, and its
Replay drives it (sync: EngineCore.step; async: step_with_batch_queue, batch queue of 2).
Here the scheduler's two bound methods are wrapped with time.perf_counter_ns() so every
call is timed individually; each call is tagged with its batch (SchedulerOutput), so only
steady-state decode steps (exactly B requests x 1 token, nobody finishing) are counted.

    .venv-vllm/bin/python scripts/profiles/time_vllm_scheduler.py   (make parity builds .venv-vllm)

writes data/profiles/cpu/vllm_scheduler.csv: the medians (us) of schedule() and update_from_output() over about
1,000 decode steps of each batch size, with prefix caching off and on, synchronous and asynchronous, on this
machine's CPU (data/README.md names the one the committed file was timed on). Only the scheduler part of vLLM's
per-step CPU work is timed: not the model runner's input preparation, sampling, detokenization, or the API
server's output processing.
"""

from __future__ import annotations

import argparse
import csv
import gc
import importlib.util
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.path.join(ROOT, "scripts", "parity", "vllm_scheduler.py")
OUT = os.path.join(ROOT, "data", "profiles", "cpu", "vllm_scheduler.csv")

spec = importlib.util.spec_from_file_location("vllm_scheduler_harness", HARNESS)
H = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = H
spec.loader.exec_module(H)

BATCH_SIZES = [1, 8, 32, 64, 128, 256]
PROMPT = 512


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def make_doc(batch, decode_steps, prefix_caching, async_sched):
    out_tokens = decode_steps + 8  # a few extra steps around prefill / finish, excluded anyway
    max_model_len = 4096
    blocks_per_req = -(-(PROMPT + out_tokens) // 16) + 1
    return {
        "config": {
            "num_gpu_blocks": batch * blocks_per_req + 64,
            "block_size": 16,
            "max_num_seqs": 256,
            "max_num_batched_tokens": 8192,
            "max_model_len": max_model_len,
            "enable_chunked_prefill": True,
            "long_prefill_token_threshold": 0,
            "enable_prefix_caching": prefix_caching,
            "async_scheduling": async_sched,
        },
        "cost": {"kind": "linear", "step_ms": 8.0, "step_ms_per_token": 0.01},
        # All arrive at t=0, same prompt length and output length: after the prefill steps
        # every step is a pure decode batch of exactly `batch` requests until all finish.
        # Prompts are request-unique (no prefix hits), so prefix caching only adds its
        # bookkeeping (block hashing of full blocks, cached-block registration).
        "requests": [{"arrival_s": 0.0, "prompt_tokens": PROMPT, "output_tokens": out_tokens} for _ in range(batch)],
    }


def run_case(v, batch, decode_steps, prefix_caching, async_sched):
    doc = make_doc(batch, decode_steps, prefix_caching, async_sched)
    workload = H.parse_workload(doc)
    with tempfile.TemporaryDirectory(prefix="vllm-time-model-") as model_dir:
        H._write_tiny_model_dir(model_dir, workload.config["max_model_len"])
        scheduler, block_hasher = H.build_scheduler(v, workload.config, model_dir)
    replay = H.Replay(v, workload, scheduler, block_hasher)

    sched_ns = []  # (out, ns)
    upd_ns = []  # (out, ns, num_finished_after)
    orig_schedule = scheduler.schedule
    orig_update = scheduler.update_from_output
    pc = time.perf_counter_ns

    def timed_schedule():
        t0 = pc()
        out = orig_schedule()
        t1 = pc()
        sched_ns.append((out, t1 - t0))
        return out

    def timed_update(out, model_output):
        t0 = pc()
        r = orig_update(out, model_output)
        t1 = pc()
        upd_ns.append((out, t1 - t0))
        return r

    scheduler.schedule = timed_schedule
    scheduler.update_from_output = timed_update

    gc.collect()
    t_start = time.perf_counter()
    replay.run()
    wall = time.perf_counter() - t_start

    def is_decode(out):
        # a pure decode batch of all `batch` requests, no new / finished requests in it
        return (
            out.total_num_scheduled_tokens == batch
            and len(out.num_scheduled_tokens) == batch
            and not out.scheduled_new_reqs
            and not out.finished_req_ids
        )

    s = [ns for out, ns in sched_ns if is_decode(out)]
    # update_from_output of decode batches where no request finishes (the last step(s)
    # finish all requests, which frees blocks: excluded to keep the steady state).
    u = []
    for out, ns in upd_ns:
        if not is_decode(out):
            continue
        u.append(ns)
    # drop the last 2 update calls of decode batches (requests finish there)
    u = u[:-2] if len(u) > 2 else u
    s = s[:-2] if len(s) > 2 else s
    # drop the first 3 (warm-up) of each
    s, u = s[3:], u[3:]
    prefill_s = [ns for out, ns in sched_ns if out.total_num_scheduled_tokens > batch]
    prefill_u = [ns for out, ns in upd_ns if out.total_num_scheduled_tokens > batch]

    def us(xs):
        return [x / 1000.0 for x in xs]

    s, u = us(s), us(u)
    row = {
        "batch_size": batch,
        "prefix_caching": int(prefix_caching),
        "async_scheduling": int(async_sched),
        "schedule_median_us": round(statistics.median(s), 1),
        "schedule_p90_us": round(percentile(s, 0.9), 1),
        "update_median_us": round(statistics.median(u), 1),
        "update_p90_us": round(percentile(u, 0.9), 1),
        "steps": min(len(s), len(u)),
    }
    extra = {
        "schedule_mean_us": round(statistics.fmean(s), 1),
        "update_mean_us": round(statistics.fmean(u), 1),
        "schedule_max_us": round(max(s), 1),
        "update_max_us": round(max(u), 1),
        "prefill_steps": len(prefill_s),
        "prefill_schedule_median_us": round(statistics.median(us(prefill_s)), 1) if prefill_s else "",
        "prefill_update_median_us": round(statistics.median(us(prefill_u)), 1) if prefill_u else "",
        "schedule_calls": len(sched_ns),
        "update_calls": len(upd_ns),
        "harness_wall_s": round(replay.wall_s, 3),
        "run_wall_s": round(wall, 3),
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
    }
    return row, extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode-steps", type=int, default=1000)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--batches", default=",".join(map(str, BATCH_SIZES)))
    args = ap.parse_args()
    v = H._import_vllm()
    print(f"vLLM {v.version}, python {sys.version.split()[0]}", flush=True)
    rows = []
    for pc_on in (False, True):
        for async_on in (False, True):
            for b in map(int, args.batches.split(",")):
                row, _ = run_case(v, b, args.decode_steps, pc_on, async_on)
                print(row, flush=True)
                rows.append(
                    [int(pc_on), int(async_on), b, row["schedule_median_us"], row["update_median_us"], row["steps"]]
                )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(
            [
                "enable_prefix_caching",
                "async_scheduling",
                "num_running",
                "schedule_us",
                "update_from_output_us",
                "steps",
            ]
        )
        w.writerows(rows)


if __name__ == "__main__":
    main()
