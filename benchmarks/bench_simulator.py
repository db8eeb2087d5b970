"""Section 2's simulator: a million requests per policy, peak memory, the seed band, and
the speed-up over the per-step reference loop at 10,000 requests."""

import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from kvlab.core import batching as simulator
from kvlab.sections import s02_batching as section
from kvlab.workloads import synthetic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import stepwise  # noqa: E402  the per-step reference loop the tests hold the simulator to

MILLION = 1_000_000


def _timed(call):
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start


def main() -> None:
    big = synthetic.article_s2_workload(MILLION, 11.0, "article", np.random.default_rng(0))
    for policy in ("static", "continuous"):
        result, seconds = _timed(lambda w=big, p=policy: simulator.simulate(w, p).summary())
        print(
            f"   {policy:<10} 1,000,000 requests: {seconds:.2f} s (target < 3 s); "
            f"mean latency {result['mean_latency_s']:,.0f} s"
        )
    del big
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    tracemalloc.start()
    for policy in ("static", "continuous"):
        workload = synthetic.article_s2_workload(MILLION, 11.0, "article", np.random.default_rng(0))
        simulator.simulate(workload, policy).summary()
        del workload
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"   peak memory, 1,000,000 requests with their workload: {peak / 2**20:,.0f} MiB allocated "
        f"(tracemalloc; target < 1,024 MiB); process peak RSS {rss_mib:,.0f} MiB (interpreter and libraries included)"
    )

    _, seconds = _timed(
        lambda: [section.seed_runs(section.Experiment(lengths=lengths), 200) for lengths in synthetic.S2_LENGTHS]
    )
    print(f"   seed band alone (200 seeds x 2 policies x 2 workloads of 600): {seconds:.1f} s")

    small = synthetic.article_s2_workload(10_000, 11.0, "article", np.random.default_rng(0))
    for policy in ("static", "continuous"):
        _, fast = _timed(lambda: simulator.simulate(small, policy))
        _, slow = _timed(lambda: stepwise.simulate_stepwise(small.arrival_s, small.output_tokens, policy, 8, 8.0))
        print(
            f"   {policy:<10} 10,000 requests: {fast * 1e3:.1f} ms event-driven vs {slow:.2f} s per-step "
            f"reference loop: {slow / fast:,.0f}x faster"
        )


if __name__ == "__main__":
    main()
