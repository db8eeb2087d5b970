"""vLLM 0.33's asynchronous scheduling (vllm/v1/core/sched/async_scheduler.py), the default on a GPU.

The next batch is scheduled before the previous batch's output is processed, so a request may be scheduled while
its last token is being sampled. That token is an output placeholder (num_output_placeholders, 0 or 1 here: with a
batch queue of two at most one batch is in flight when schedule() runs): it counts toward the request's tokens, so
a decoding request's next token, and a new block at a block boundary, are scheduled one batch earlier (its computed
tokens run one ahead of its known tokens). The running loop passes over a request whose placeholder already brings
it to max_tokens (vLLM's early stop) and one whose next position would pass max_model_len
(rules.running_num_new_tokens). update_from_output then settles each scheduled request's in-flight tokens, turns a
placeholder into its sampled token and, for a running request that had one, caches the blocks its settled tokens
fill (prefix caching). A request preempted with a batch in flight keeps that batch's token when its output arrives
(vLLM's stale output: the token is appended, which may finish the request in the waiting queue, but no counter of
the reset request moves).
"""

from __future__ import annotations

from collections import deque

from kvlab.core.engine.request import FINISHED, RUNNING, Request
from kvlab.core.engine.rules import is_finished, settles_placeholder
from kvlab.core.engine.scheduler import Scheduler, SchedulerOutput


class AsyncScheduler(Scheduler):
    """Scheduler whose batches stay in flight while the next is scheduled: placeholders, in-flight tokens, stale
    output."""

    async_scheduling = True

    def account(self, out: SchedulerOutput) -> None:
        """Scheduler.account; then a scheduled batch's tokens are in flight until its output is processed, and a
        token it samples is an output placeholder meanwhile (AsyncScheduler._update_after_schedule)."""
        super().account(out)
        for (request, n), sample in zip(out.scheduled, out.samples):
            request.num_in_flight_tokens += n
            if sample:
                request.num_output_placeholders += 1

    def update_from_output(self, out: SchedulerOutput) -> tuple[int, list[Request], list[Request]]:
        """Settle a batch's in-flight tokens and placeholders, sample, finish and free (Scheduler.update_from_output
        and _update_request_with_output, which vLLM's AsyncScheduler inherits)."""
        num_sampled, first, finished = 0, [], []
        kv = self.kv_cache_manager
        caching = kv.enable_caching
        cache_blocks = kv.cache_blocks if caching else None  # (a reservation pool caches nothing)
        finished_waiting = False
        for (request, n), sample in zip(out.scheduled, out.samples):
            request.num_in_flight_tokens -= n
            stale = request.num_stale_tokens > 0
            if stale:
                request.num_stale_tokens -= n
            if request.status == FINISHED or not sample:
                continue
            running = request.status == RUNNING
            request.num_tokens += 1
            num_sampled += 1
            if request.num_tokens == request.num_prompt_tokens + 1:
                first.append(request)
            if settles_placeholder(stale, request.num_output_placeholders):
                request.num_output_placeholders -= 1
                if running and caching:
                    cache_blocks(request, request.num_computed_tokens - request.num_in_flight_tokens)
            if is_finished(request.num_tokens, request.max_num_tokens):
                request.status = FINISHED
                kv.free(request)  # preempted, it holds none: its stale token finished it waiting
                finished_waiting |= not running
                finished.append(request)
        if finished:
            self.running = [r for r in self.running if r.status != FINISHED]
            if finished_waiting:
                self.waiting = deque(r for r in self.waiting if r.status != FINISHED)
            self.has_finished = True
        return num_sampled, first, finished
