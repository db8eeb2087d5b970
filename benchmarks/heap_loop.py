"""The bare reference of `kvlab simulate --policy continuous`: section 2's workload and its heap loop, nothing else.

    python benchmarks/heap_loop.py NUM_REQUESTS  ->  prints the mean latency (s)

Standalone on purpose (numpy and heapq only): bench_startup.py times it as a whole process beside the command,
and the two must print the same mean latency, so both served the same requests. The workload is drawn as
kvlab.workloads.synthetic.article_s2_workload draws it (seed 0, 11 requests/s, the article's output lengths),
served on 8 slots at 8 ms per output token."""

import heapq
import sys

import numpy as np


def main(num_requests: int) -> float:
    rng = np.random.default_rng(0)
    gaps = rng.exponential(1.0 / 11.0, size=num_requests)
    gaps[0] = 0.0
    arrival_s = np.cumsum(gaps)
    short = rng.integers(40, 201, size=num_requests, dtype=np.int64)
    long = rng.integers(400, 1001, size=num_requests, dtype=np.int64)
    output_tokens = np.where(rng.random(num_requests) < 0.15, long, short)
    service_s = np.asarray(output_tokens, dtype=np.float64) * (8.0 / 1000.0)
    arrival, service = arrival_s.tolist(), service_s.tolist()
    start = [0.0] * num_requests
    free = [(0.0, s) for s in range(8)]  # (time the slot frees, slot id): a heap
    replace = heapq.heapreplace
    for i in range(num_requests):
        free_s, s = free[0]
        a = arrival[i]
        t = a if a > free_s else free_s
        start[i] = t
        replace(free, (t + service[i], s))
    return float(((np.array(start) + service_s) - arrival_s).mean())


if __name__ == "__main__":
    print(repr(main(int(sys.argv[1]))))
