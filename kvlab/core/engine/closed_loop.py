"""A closed-loop load: vLLM bench's --max-concurrency N, the rule that sends a workload's requests (send_s) and
the engine's record of it (ClosedLoop).

vLLM bench (`vllm bench serve`, vllm/benchmarks/serve.py) makes each request when its --request-rate says (all at
once at its default rate, inf) and sends it only once it holds an asyncio.Semaphore(N), released when a request's
last output token has come back; the semaphore's waiters go in the order they came, so requests go out in the
workload's order, and TTFT and E2E latency count from the send. kvlab's engine serves the same: a request is sent
as soon as fewer than N are in flight (sent, not finished: a request finishes at the end of the step that emits its
last token), in workload order, never before its open-loop arrival.
"""

from __future__ import annotations

import math
import numbers

from kvlab.core import validate


def send_s(open_loop_s: float, previous_send_s: float, slot_free_s: float) -> float:
    """When a request is sent under vLLM bench's --max-concurrency (vllm/benchmarks/serve.py: the request is made at
    its --request-rate arrival, then waits for the semaphore of N; the semaphore serves its waiters in order): the
    latest of its open-loop arrival, the send of the request before it in the workload (requests go out in order) and
    the time a slot frees (the finish that leaves fewer than N in flight; -inf for the first N requests)."""
    return max(open_loop_s, previous_send_s, slot_free_s)


class ClosedLoop:
    """The send times of a workload's requests under at most max_concurrency in flight, found as the engine runs.

    send: one time a request (s), inf until known; the engine reads it as its arrival times. The first
    max_concurrency requests are sent at their open-loop arrivals; the k-th finish (k = 1, 2, ..., in time order,
    which is the engine's order of finishes) frees the slot of request max_concurrency - 1 + k, which is sent then
    (send_s)."""

    __slots__ = ("max_concurrency", "open_loop", "send", "num_finished")

    def __init__(self, open_loop_s, max_concurrency: int):
        self.max_concurrency = check_max_concurrency(max_concurrency)
        self.open_loop = [float(t) for t in open_loop_s]
        self.send = [math.inf] * len(self.open_loop)
        previous = -math.inf
        for i in range(min(self.max_concurrency, len(self.open_loop))):
            previous = self.send[i] = send_s(self.open_loop[i], previous, -math.inf)
        self.num_finished = 0

    def finished(self, end_s: float) -> None:
        """A request finished at end_s (in time order): the next request waiting for a slot is sent."""
        i = self.max_concurrency + self.num_finished
        self.num_finished += 1
        if i < len(self.send):
            self.send[i] = send_s(self.open_loop[i], self.send[i - 1], end_s)


def check_max_concurrency(max_concurrency) -> int:
    """max_concurrency as an int if it is a whole number of requests >= 1 (a one-line ValueError otherwise)."""
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, numbers.Integral) or max_concurrency < 1:
        validate.fail("max_concurrency", max_concurrency, "must be a whole number of requests >= 1")
    return int(max_concurrency)
