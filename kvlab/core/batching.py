"""The serving engine model of section 2: static vs continuous batching, event-driven.

The article's model: max_num_seqs slots; a request holds one slot for output_tokens x ms_per_token
(prompts cost nothing); requests are served first come, first served in arrival order (ties: the
order they were given).
- continuous ("fill a free slot"): a request starts at max(its arrival, the moment a slot frees).
- static ("start together, finish together"): when no batch runs and requests wait, the first
  min(max_num_seqs, waiting) that have arrived start together; with none waiting, the batch starts
  at the next arrival with those arrived by then. Every request of a batch is released when the
  batch's longest request is done, and the next batch starts then.

The simulator jumps from event to event (a heap of slot free times; one step per batch) and never
steps token by token; tests/stepwise.py is the per-step loop the tests hold it to.

Seams for what vLLM adds later: the service time (kvlab.core.service_time: ``TokenServiceTime``, here a
constant time per output token, so a request's service time is known on arrival; ``CalibratedServiceTime``:
measured decode step times of a calibration file at a fixed batch size) and the scheduler policy (an object with
``schedule(arrival_s, service_s, max_num_seqs) -> Schedule``). A KV-memory budget, prefill costs or a
batch-dependent step time replace these two objects, not ``simulate``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from kvlab.core import article, validate
from kvlab.core.service_time import TokenServiceTime
from kvlab.core.workload import Workload

# Bytes held at the peak per request served, its workload included (make bench measures about 144 B).
PEAK_BYTES_PER_REQUEST = 192
SUMMARY_KEYS = (
    "num_requests",
    "mean_latency_s",
    "p95_latency_s",
    "max_latency_s",
    "mean_queue_s",
    "makespan_s",
    "throughput_rps",
    "busy_slot_s",
    "idle_share",
)


@dataclass(frozen=True)
class Schedule:
    """What a policy decided per request: start (s), release (s) and slot (0..max_num_seqs-1)."""

    start_s: np.ndarray
    finish_s: np.ndarray
    slot: np.ndarray


@dataclass(frozen=True)
class ContinuousBatching:
    """Fill a free slot: each request starts at max(arrival, first slot free), FCFS."""

    name: str = "continuous"

    def schedule(self, arrival_s: np.ndarray, service_s: np.ndarray, max_num_seqs: int) -> Schedule:
        """Start, release and slot of every request (a heap of (free time, slot); O(n log slots))."""
        n = len(arrival_s)
        arrival, service = arrival_s.tolist(), service_s.tolist()
        start, slot = [0.0] * n, [0] * n
        free = [(0.0, s) for s in range(max_num_seqs)]  # (time the slot frees, slot id): a heap
        replace = heapq.heapreplace
        for i in range(n):
            free_s, s = free[0]
            a = arrival[i]
            t = a if a > free_s else free_s
            start[i], slot[i] = t, s
            replace(free, (t + service[i], s))
        start = np.array(start)
        return Schedule(start, start + service_s, np.array(slot, dtype=np.int32))


@dataclass(frozen=True)
class StaticBatching:
    """Start together, finish together: a batch holds its slots until its longest request is done."""

    name: str = "static"

    def schedule(self, arrival_s: np.ndarray, service_s: np.ndarray, max_num_seqs: int) -> Schedule:
        """Start, release and slot of every request (one Python step per batch)."""
        n = len(arrival_s)
        arrival, service = arrival_s.tolist(), service_s.tolist()
        first, begin, end = [], [], []  # per batch: first request, start time, release time
        i, free_s = 0, 0.0
        while i < n:
            a = arrival[i]
            t = a if a > free_s else free_s
            # the batch: request i and the next ones that have arrived by t, at most max_num_seqs
            j = bisect_right(arrival, t, i + 1, min(i + max_num_seqs, n))
            free_s = t + max(service[i:j])
            first.append(i)
            begin.append(t)
            end.append(free_s)
            i = j
        sizes = np.diff(np.append(np.array(first, dtype=np.int64), n))
        start = np.repeat(np.array(begin), sizes)
        finish = np.repeat(np.array(end), sizes)
        slot = (np.arange(n) - np.repeat(np.array(first, dtype=np.int64), sizes)).astype(np.int32)
        return Schedule(start, finish, slot)


POLICIES = {"static": StaticBatching(), "continuous": ContinuousBatching()}


def policy_named(name: str):
    """The scheduler policy called name (static or continuous)."""
    return POLICIES[validate.one_of("policy", name, POLICIES)]


@dataclass(frozen=True, eq=False)
class SimulationResult:
    """Per-request records of one run: arrival, start, done (own last token), release, slot (s)."""

    policy: str
    max_num_seqs: int
    arrival_s: np.ndarray
    output_tokens: np.ndarray
    start_s: np.ndarray
    done_s: np.ndarray
    finish_s: np.ndarray
    slot: np.ndarray

    @property
    def latency_s(self) -> np.ndarray:
        """The article's "wait": release - arrival (s)."""
        return self.finish_s - self.arrival_s

    @property
    def queue_s(self) -> np.ndarray:
        """Queueing delay: start - arrival (s)."""
        return self.start_s - self.arrival_s

    def summary(self) -> dict:
        """Mean / p95 / max latency, mean queueing, makespan, requests/s, slot-busy s, idle share."""
        latency = self.latency_s
        makespan = float(self.finish_s.max() - self.arrival_s[0])
        busy = float((self.done_s - self.start_s).sum())
        return {
            "num_requests": int(len(latency)),
            "mean_latency_s": float(latency.mean()),
            "p95_latency_s": float(np.percentile(latency, 95)),
            "max_latency_s": float(latency.max()),
            "mean_queue_s": float(self.queue_s.mean()),
            "makespan_s": makespan,
            "throughput_rps": len(latency) / makespan,
            "busy_slot_s": busy,
            "idle_share": 1.0 - busy / (self.max_num_seqs * makespan),
        }


def simulate(
    workload: Workload, policy="continuous", *, max_num_seqs: int = article.MAX_NUM_SEQS, cost=None
) -> SimulationResult:
    """Serve workload on max_num_seqs slots; policy: "static", "continuous" or a policy object.

    cost: the service time of each request (default TokenServiceTime(): the article's 8 ms per output token;
    CalibratedServiceTime.from_csv(path) for measured step times)."""
    if not isinstance(workload, Workload):
        validate.fail("workload", type(workload).__name__, "must be a kvlab.core.workload.Workload")
    scheduler = policy_named(policy) if isinstance(policy, str) else policy
    if not callable(getattr(scheduler, "schedule", None)):
        validate.fail("policy", policy, "must be static, continuous or an object with a schedule() method")
    max_num_seqs = validate.positive_int("max_num_seqs", max_num_seqs)
    cost = TokenServiceTime() if cost is None else cost
    if not callable(getattr(cost, "service_s", None)):
        validate.fail(
            "cost",
            type(cost).__name__,
            "must be TokenServiceTime, CalibratedServiceTime or an object with a service_s() method",
        )
    service = cost.service_s(workload.output_tokens, workload.prompt_tokens)
    plan = scheduler.schedule(workload.arrival_s, service, max_num_seqs)
    return SimulationResult(
        scheduler.name,
        max_num_seqs,
        workload.arrival_s,
        workload.output_tokens,
        plan.start_s,
        plan.start_s + service,
        plan.finish_s,
        plan.slot,
    )
