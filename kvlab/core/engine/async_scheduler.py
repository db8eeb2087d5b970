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

from kvlab.core.engine.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    """Scheduler whose batches stay in flight while the next is scheduled: placeholders, in-flight tokens, stale
    output (request.update_after_schedule and update_request_with_output, with async_scheduling)."""

    async_scheduling = True
