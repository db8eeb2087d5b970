"""A fleet's speed (kvlab.core.fleet): 8 instances serving 100,000 Azure-like requests, each instance on the engine
benchmark's binding budget (1,100 blocks of 16 tokens) at 8 x its rate.

Target (issue 53): 8 instances x 100,000 requests in seconds, compiled (< 10 s here). A router that reads nothing of
the instances (round robin, session, prefix-aware) routes first and each instance runs compiled; one that reads
them (least-loaded, llm-d, dynamo-kv) runs every instance in Python, paused at each arrival: timed on 10,000
requests, and its 100,000-request time is printed where KVLAB_FLEET_FULL=1 asks for it (minutes).
"""

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "parity"))
import scheduler_workloads  # noqa: E402  the parity runs' Azure-like lengths

from kvlab.core.config import EngineConfig  # noqa: E402
from kvlab.core.cost import LinearStepCost  # noqa: E402
from kvlab.core.fleet.fleet import Fleet  # noqa: E402
from kvlab.core.fleet.routers import make_router  # noqa: E402
from kvlab.core.workload import Workload  # noqa: E402

NUM_INSTANCES, NUM_GPU_BLOCKS, RATE_PER_INSTANCE_S = 8, 1100, 5.5
TARGET_S = 10.0


def workload(num_requests: int) -> Workload:
    arrival, prompt, output = scheduler_workloads._azure_like(
        np.random.default_rng(0), num_requests, RATE_PER_INSTANCE_S * NUM_INSTANCES
    )
    return Workload(arrival, prompt, output)


def timed(router: str, num_requests: int) -> tuple:
    config = EngineConfig().replace(max_model_len=16384, async_scheduling=False)
    fleet = Fleet(workload(num_requests), config, make_router(router, NUM_INSTANCES, 16), NUM_INSTANCES,
                  num_gpu_blocks=NUM_GPU_BLOCKS, cost=LinearStepCost(8.0, 0.01))  # fmt: skip
    start = time.perf_counter()
    result = fleet.run()
    return time.perf_counter() - start, result.summary()


def main() -> None:
    timed("round-robin", 3_000)  # the compiled loop loaded (numba's import and cache)
    for router in ("round-robin", "session"):
        seconds, s = timed(router, 100_000)
        print(
            f"   {NUM_INSTANCES} instances x 100,000 requests, {router}, compiled: {seconds:.2f} s "
            f"({s['num_steps']:,} steps, {s['num_preemptions']:,} preemptions, p95 TTFT {s['p95_ttft_s']:.2f} s; "
            f"target < {TARGET_S:g} s): {'PASS' if seconds < TARGET_S else 'FAIL'}",
            flush=True,
        )
    full = os.environ.get("KVLAB_FLEET_FULL") == "1"
    for router in ("least-loaded", "llm-d", "dynamo-kv"):
        n = 100_000 if full else 10_000
        seconds, s = timed(router, n)
        print(
            f"   {NUM_INSTANCES} instances x {n:,} requests, {router}, in Python (paused at each arrival): "
            f"{seconds:.1f} s ({s['num_steps']:,} steps, p95 TTFT {s['p95_ttft_s']:.2f} s"
            + (f"; target < {TARGET_S:g} s: {'PASS' if seconds < TARGET_S else 'FAIL'})" if full else ")"),
            flush=True,
        )
