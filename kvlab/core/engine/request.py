"""A request as vLLM's v1 scheduler sees it: its tokens, how many are computed, its status and its blocks.

Token contents matter only for prefix caching, where a full block is known by a chain of content hashes
(block_hashes.py, kvlab's token contents for vLLM's hash_request_tokens).

A request's state moves in three transitions, each written once here: update_after_schedule (its batch scheduled),
preempt_request and update_request_with_output (its batch's output processed). The reference scheduler calls them on a
Request; the compiled loop (fast/loops/) compiles them from this source (fast/loops/jit.py) and calls them on a
request's record (fast/arrays.py, Requests.records), whose fields carry the same names.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import numpy as np

from kvlab.core.engine.rules import is_finished, samples, settles_placeholder

WAITING, RUNNING, PREEMPTED, FINISHED = "waiting", "running", "preempted", "finished"


@dataclass(slots=True, eq=False)
class Request:
    """One request: prompt, output so far, computed tokens, status, preemptions and its block table."""

    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int  # output tokens it asks for
    max_request_tokens: InitVar[int]  # check_stop's max_model_len (+ 1 for vLLM 0.1.4, which stops once past it)
    prompt_token_ids: np.ndarray | None = None  # content for prefix caching, or None
    prompt_block_ids: np.ndarray | None = None  # or: ids of prompt blocks (e.g. Mooncake's hash ids)
    prompt_block_tokens: int = 0  # tokens per prompt_block_ids entry
    max_num_tokens: int = field(init=False)  # min(prompt + max_tokens, max_request_tokens)
    num_tokens: int = field(init=False)  # prompt + tokens sampled so far
    num_computed_tokens: int = 0  # tokens whose KV is computed or scheduled
    status: str = WAITING
    num_preemptions: int = 0
    block_ids: list[int] = field(default_factory=list)  # its block table in the first KV cache group (paged)
    shared_prefix_boundary: int = 0  # a longer prefix than its hit one group found cached on admission (0: none)
    reserved_tokens: int = 0  # token slots reserved (reservation allocation)
    first_scheduled_s: float | None = None  # start of the first step that scheduled it
    first_token_s: float | None = None  # end of the step that sampled its first token
    block_hash_cache: list[bytes] = field(default_factory=list)  # block_hashes.block_hashes' chain so far
    # Asynchronous scheduling only (vLLM's AsyncScheduler); always 0 in the synchronous engine.
    num_output_placeholders: int = 0  # tokens being sampled in a batch still in flight
    num_in_flight_tokens: int = 0  # tokens scheduled in batches still in flight
    num_stale_tokens: int = 0  # of those, scheduled before its last preemption

    def __post_init__(self, max_request_tokens: int) -> None:
        self.max_num_tokens = min(self.num_prompt_tokens + self.max_tokens, max_request_tokens)
        self.num_tokens = self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        """Tokens sampled so far (kept across preemptions)."""
        return self.num_tokens - self.num_prompt_tokens


def update_after_schedule(request, num_new_tokens: int, async_scheduling: bool) -> bool:
    """A request in the batch just scheduled (sched/scheduler.py, Scheduler._update_after_schedule; async_scheduler.py,
    AsyncScheduler._update_after_schedule): its computed tokens move on by num_new_tokens; returns whether its chunk
    reaches the end of its known tokens (it samples a token; rules.samples). Asynchronously the tokens are in flight
    until the batch's output is processed, and the token it samples is an output placeholder meanwhile."""
    request.num_computed_tokens += num_new_tokens
    sample = samples(request.num_computed_tokens, request.num_tokens, request.num_output_placeholders)
    if async_scheduling:
        request.num_in_flight_tokens += num_new_tokens
        if sample:
            request.num_output_placeholders += 1
    return sample


def preempt_request(request) -> None:
    """A running request preempted, once its blocks are freed (sched/scheduler.py, Scheduler._preempt_request): its
    progress is reset and a batch still in flight for it becomes stale (its token still arrives; num_stale_tokens)."""
    request.status = PREEMPTED
    request.num_computed_tokens = 0
    request.num_stale_tokens = request.num_in_flight_tokens
    request.num_output_placeholders = 0
    request.num_preemptions += 1


def update_request_with_output(request, num_new_tokens: int, sample: bool, async_scheduling: bool) -> tuple:
    """A request of a batch whose output is processed (sched/scheduler.py, update_from_output and
    _update_request_with_output, which AsyncScheduler inherits): asynchronously its num_new_tokens are no longer in
    flight (nor stale, if they were); a request that samples (sample, and not finished meanwhile) appends its token,
    which settles an output placeholder unless the batch is stale, and finishes at max_num_tokens (rules.is_finished).
    Returns (it sampled, the token is its first, a placeholder settled, it finished); the caller frees a finished
    request's blocks and, with prefix caching, caches the blocks a running request's settled tokens fill."""
    stale = False
    if async_scheduling:
        request.num_in_flight_tokens -= num_new_tokens
        stale = request.num_stale_tokens > 0
        if stale:
            request.num_stale_tokens -= num_new_tokens
    if request.status == FINISHED or not sample:
        return False, False, False, False
    request.num_tokens += 1
    settled = async_scheduling and settles_placeholder(stale, request.num_output_placeholders)
    if settled:
        request.num_output_placeholders -= 1
    finished = is_finished(request.num_tokens, request.max_num_tokens)
    if finished:
        request.status = FINISHED
    return True, request.num_tokens == request.num_prompt_tokens + 1, settled, finished
