"""Trace loading (targets: Azure 19,366 rows < 0.5 s, Mooncake 12,031 rows < 1 s) and the prefix-cache replay."""

import time

import numpy as np

from kvlab.core import prefix_cache
from kvlab.workloads import traces


def _best_of(fn, repeats: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    missing = traces.missing_traces()
    if missing:
        print(
            f"   skipped: real trace files {', '.join(missing)} not in {traces.trace_dir()} "
            "(set TRACE_DIR or run make traces)"
        )
        return
    targets = {"azure": 0.5, "mooncake": 1.0, "sharegpt": None}
    for name, target_s in targets.items():
        kwargs = {"arrival_rate_per_s": 10.0, "rng": np.random.default_rng(0)} if name == "sharegpt" else {}
        seconds, load = _best_of(lambda: traces.load_trace(traces.trace_path(name), **kwargs))
        verdict = f"target < {target_s} s: {'met' if seconds < target_s else 'MISSED'}" if target_s else "no target"
        print(
            f"   load {name:9s} {load.num_rows:7,} rows: {seconds:.3f} s "
            f"({seconds / load.num_rows * 1e6:.1f} us/row, parse + validate; {verdict})"
        )
    moon = traces.load_trace(traces.trace_path("mooncake")).workload
    for size in (None, 10_000):
        seconds, stats = _best_of(lambda: prefix_cache.replay(moon, size), repeats=1)
        print(
            f"   prefix-cache replay, {size or 'unbounded'} blocks: {seconds:.3f} s for "
            f"{stats.num_blocks:,} block lookups, hit rate {100 * stats.hit_rate:.1f} %"
        )
