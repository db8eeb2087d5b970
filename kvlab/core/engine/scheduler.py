"""vLLM 0.33's v1 scheduler (vllm/v1/core/sched/scheduler.py, async_scheduler.py), FCFS.

Each step (schedule):
1. running requests, in admission order, each get min(tokens left, long_prefill_token_threshold when more
   than one request is running or waiting, budget left) of the step's max_num_batched_tokens; a request
   that cannot get its blocks preempts the most recently admitted running request (its blocks are freed,
   its progress reset, it goes to the front of the waiting queue) until the blocks are found or it has
   preempted itself, which ends the loop;
2. unless a request was preempted, waiting requests are admitted first come first served while the budget
   lasts and fewer than max_num_seqs run: a request's prefix-cache hit is taken, blocks for its whole
   current length must be free, and with chunked prefill off its (capped) tokens must fit the budget left;
   the first request that cannot be admitted stops the scan.
update_from_output: every scheduled request whose chunk reached the end of its known tokens when it was
scheduled samples one token (a partial prefill chunk samples none); a request that has sampled max_tokens
tokens, or reached max_model_len, finishes and frees its blocks at once, in the step's batch order.

Asynchronous scheduling (the default on a GPU) is the subclass AsyncScheduler, a flag: account and update_from_output
move each request by request.py's transitions (update_after_schedule, preempt_request, update_request_with_output),
which take both modes, and which the compiled loop compiles from the same source; every rule is a function of rules.py.

The KV-cache manager (KVCacheManager) holds one full-attention group or a hybrid model's groups of full attention,
sliding windows, chunked local attention and Mamba states in one pool, a manager per group under a coordinator (with
any group other than full attention the running loop calls allocate_slots for every request, since a decode inside
its last block may still free a block behind its window).

Left out because it is inert for a text-only decoder of full-attention and sliding-window layers and no speculative
decoding, LoRA, structured output, connectors or pipeline parallelism: pause states, encoder budgets,
deferred frees (only with a KV-connector consumer), the prefill cadence, drafts, the watermark (0), drop-mode
stale output (reset_prefix_cache and connectors only). A KV connector's path (a disaggregated deployment's
instances) is kv_connector.py's ConnectorScheduler, this class with its own waiting loop. With Mamba states and prefix caching (vLLM's mamba_cache_mode
"align") a prefill chunk is cut where a state is cached (rules.mamba_aligned_num_new_tokens), the prefill's last
chunk not when the Mamba groups export its checkpoint from inside the kernel (prefill checkpoint blocks).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvlab.core.config import SchedulerConfig
from kvlab.core.cost.batch import Batch
from kvlab.core.engine.request import (
    FINISHED,
    RUNNING,
    Request,
    preempt_request,
    update_after_schedule,
    update_request_with_output,
)
from kvlab.core.engine.rules import (
    admission_num_new_tokens,
    allocation_is_noop,
    attention_pairs,
    mamba_aligned_num_new_tokens,
    preemption_victim,
    running_num_new_tokens,
    step_token_cap,
)


@dataclass(slots=True, eq=False)
class SchedulerOutput:
    """One step's decisions: (request, tokens) in vLLM's batch order, preempted and admitted requests, its batch."""

    scheduled: list = field(default_factory=list)  # [(Request, num_new_tokens)]: running first, then admitted
    samples: list = field(default_factory=list)  # per scheduled request: whether its chunk reaches its end (samples)
    preempted: list = field(default_factory=list)  # requests preempted in this step, in order
    admitted: list = field(default_factory=list)  # requests admitted (or resumed) in this step, in order
    batch: Batch = Batch(0)  # the step's tokens and what its step cost reads (account)
    num_hit_tokens: int = 0  # prompt tokens admitted requests found in the prefix cache
    first_tokens: list = field(default_factory=list)  # update_from_output: requests that sampled their first token
    finished: list = field(default_factory=list)  # update_from_output: requests that finished, in batch order


class Scheduler:
    """vLLM's waiting queue, running list and the decisions of schedule() and update_from_output(), synchronous."""

    async_scheduling = False  # AsyncScheduler: the next batch is scheduled before this one's output
    connector = None  # a KV connector's scheduler side (kv_connector.ConnectorScheduler's)

    def __init__(self, scheduler: SchedulerConfig, kv_cache_manager, max_model_len: int):
        self.max_model_len = max_model_len  # checked by checks.check_scheduler_config
        self.max_request_tokens = self.max_model_len  # a request finishes when it reaches these many tokens
        self.max_num_seqs = scheduler.max_num_seqs
        self.max_num_batched_tokens = scheduler.max_num_batched_tokens
        self.enable_chunked_prefill = scheduler.enable_chunked_prefill
        self.long_prefill_token_threshold = scheduler.long_prefill_token_threshold
        self.kv_cache_manager = kv_cache_manager
        # Mamba states cached at block boundaries (mamba_cache_mode "align"): prefill chunks cut there; 0: no cut
        self.mamba_block_size = getattr(kv_cache_manager, "mamba_block_size", 0)
        # every Mamba group with prefill checkpoint blocks: the first one's alignment (a final chunk that exports its
        # checkpoint from inside the kernel is not cut); 0: none
        self.mamba_checkpoint_alignment = getattr(kv_cache_manager, "checkpoint_alignment", 0)
        threshold = self.long_prefill_token_threshold
        self.max_prefill_tokens = (
            min(self.max_num_batched_tokens, threshold) if threshold > 0 else self.max_num_batched_tokens
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.has_finished = False  # vLLM's finished_req_ids not yet sent: schedule() clears it

    def add_request(self, request: Request) -> None:
        """A request that has arrived joins the back of the waiting queue."""
        self.waiting.append(request)

    def has_requests(self) -> bool:
        """vLLM's has_requests(): a request runs or waits, or one finished since the last schedule()."""
        return bool(self.running or self.waiting or self.has_finished)

    def num_waiting(self) -> int:
        """vLLM's count of waiting requests (get_request_counts)."""
        return len(self.waiting)

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        """Decide this step: tokens per request, blocks, preemptions and admissions (vLLM's schedule(): the module's
        schedule, on this scheduler's Request objects, running list and waiting queue)."""
        out = SchedulerOutput()
        running, waiting = self.running, self.waiting
        out.num_hit_tokens = schedule(
            self, self.kv_cache_manager, None, running, len(running), waiting, 0, len(waiting), out, True
        )[3]  # fmt: skip
        self.has_finished = False
        return out

    def _preempt(self, request: Request) -> None:
        """Preempt a running request (the module's preempt; the caller has taken it off the running list)."""
        preempt(self.kv_cache_manager, None, self.waiting, 0, request)

    # ---------------------------------------------------------------- update_from_output
    def update_from_output(self, out: SchedulerOutput) -> tuple[list[Request], list[Request]]:
        """Process a batch's output (the module's update_from_output, on this scheduler's Request objects and
        queues). Returns the requests that sampled their first token and those that finished (both in batch order)."""
        running, waiting = self.running, self.waiting
        num_finished = update_from_output(
            self, self.kv_cache_manager, None, out, len(out.scheduled), running, len(running), waiting, 0, len(waiting),
        )[1]  # fmt: skip
        if num_finished:
            self.has_finished = True
        return out.first_tokens, out.finished


# ---------------------------------------------------------------- schedule() and update_from_output(), written once
# The functions below are vLLM's schedule(), its preemption, _update_after_schedule and update_from_output, written
# once. The reference scheduler calls them on Request objects, its running list and its waiting deque (a request's
# handle is the Request; head stays 0); the compiled loop (fast/loops/scheduler.py) compiles them from this source,
# with the handle a request id, requests the named arrays (a request's record: requests.records[r]), the queues arrays
# (the waiting queue a ring from head) and the KV-cache manager's calls on the block pool's arrays. What differs
# between the two is the small functions after them, which each side binds to its own: where a request is, the
# queues, the KV-cache manager's calls and where the batch and its output go.


def schedule(scheduler, kv, requests, running, num_running, waiting, head, num_waiting, out, fields):
    """vLLM's Scheduler.schedule() (the module's docstring): the running requests first, preempting from the back for
    blocks (schedule_running), then, unless one was preempted, admissions first come first served (admit_waiting);
    then account. scheduler: its limits (max_num_batched_tokens, max_num_seqs, ..., async_scheduling); kv: the KV-cache
    manager; fields: the Batch's fields beyond its tokens (a clock that reads them). Returns (requests scheduled,
    requests preempted, tokens scheduled, prompt tokens hit in the prefix cache, num_running, head, num_waiting)."""
    cap = step_token_cap(scheduler.long_prefill_token_threshold, num_running, num_waiting)
    if scheduler.mamba_block_size:  # Mamba states cached at block boundaries: prefill chunks cut there
        new_step_starts(kv)
    budget, num_reqs, num_preempted, num_running, head, num_waiting = schedule_running(
        scheduler, kv, requests, running, num_running, waiting, head, num_waiting, out, cap
    )
    num_hit_tokens = 0
    if num_preempted == 0:  # no admission in a step that preempted
        budget, num_reqs, num_hit_tokens, num_running, head, num_waiting = admit_waiting(
            scheduler, kv, requests, running, num_running, waiting, head, num_waiting, out, cap, budget, num_reqs
        )
    num_scheduled_tokens = account(requests, out, num_reqs, scheduler.async_scheduling, fields)
    return num_reqs, num_preempted, num_scheduled_tokens, num_hit_tokens, num_running, head, num_waiting


def schedule_running(scheduler, kv, requests, running, num_running, waiting, head, num_waiting, out, cap):
    """schedule()'s running requests, in admission order, each its tokens (cap: the step's cap on one request's),
    preempting from the back where its blocks are not free, until the budget is spent or a request preempted itself.
    Returns (the budget left, requests scheduled, requests preempted, num_running, head, num_waiting)."""
    budget, max_model_len = scheduler.max_num_batched_tokens, scheduler.max_model_len
    split = scheduler.mamba_block_size  # Mamba states cached at block boundaries: prefill chunks cut there
    block_size, enable_caching, noop_decodes = kv.block_size, kv.enable_caching, kv.noop_decodes
    num_reqs = num_preempted = 0
    i = 0
    while i < num_running and budget > 0:
        handle = running[i]
        request = request_of(requests, handle)
        computed = request.num_computed_tokens
        n = running_num_new_tokens(
            request.num_tokens,
            request.num_output_placeholders,
            computed,
            request.num_prompt_tokens + request.max_tokens,
            cap,
            budget,
            max_model_len,
        )
        if split and n:  # Mamba states: a prefill chunk ends where a state is cached
            n = mamba_aligned_num_new_tokens(
                computed,
                n,
                request.num_prompt_tokens,
                request.num_tokens,
                split,
                scheduler.max_prefill_tokens,
                request.shared_prefix_boundary,
                scheduler.mamba_checkpoint_alignment,
            )
        if n == 0:  # async: its last token is in flight, or it is at max_model_len (or a Mamba cut)
            i += 1
            continue
        # allocate_slots, preempting from the back (skipped for a decode inside its last block: a no-op, where no
        # sliding window frees blocks)
        preempted_self = False
        while not (
            noop_decodes and allocation_is_noop(n, computed, request.num_tokens, block_size, enable_caching)
        ) and not allocate_slots(kv, requests, handle, n):
            victim, num_running, head = preempt_latest(kv, requests, running, num_running, waiting, head, out)
            num_waiting += 1
            num_preempted += 1
            if victim == handle:
                preempted_self = True
                break
        if preempted_self:
            break  # it preempted itself: no more running requests this step
        add_scheduled(out, num_reqs, handle, n)
        num_reqs += 1
        budget -= n
        i += 1
    return budget, num_reqs, num_preempted, num_running, head, num_waiting


def admit_waiting(
    scheduler, kv, requests, running, num_running, waiting, head, num_waiting, out, cap, budget, num_reqs
):
    """schedule()'s admissions, first come first served while the budget lasts and fewer than max_num_seqs run: a
    request's prefix-cache hit is taken, blocks for its whole current length must be free, and with chunked prefill
    off its (capped) tokens must fit the budget left; the first request that cannot be admitted stops the scan.
    Returns (the budget left, requests scheduled, prompt tokens hit in the prefix cache, num_running, head,
    num_waiting)."""
    split = scheduler.mamba_block_size
    num_hit_tokens = 0
    while budget > 0 and num_waiting > 0:
        if num_running >= scheduler.max_num_seqs:
            break
        handle = waiting_front(waiting, head)
        request = request_of(requests, handle)
        hits, num_computed = get_computed_blocks(kv, requests, handle)
        n = admission_num_new_tokens(request.num_tokens, num_computed, cap, budget, scheduler.enable_chunked_prefill)
        if split and n:
            n = mamba_aligned_num_new_tokens(
                num_computed,
                n,
                request.num_prompt_tokens,
                request.num_tokens,
                split,
                scheduler.max_prefill_tokens,
                hit_boundary(hits),
                scheduler.mamba_checkpoint_alignment,
            )
        if n == 0 or not allocate_admitted(kv, requests, handle, n, hits):
            break  # the scan stops at the first request that does not fit
        head = pop_waiting(waiting, head)
        num_waiting -= 1
        append_running(running, num_running, handle)
        num_running += 1
        request.status = RUNNING
        request.num_computed_tokens = num_computed
        num_hit_tokens += num_computed
        add_admitted(out, requests, handle)
        add_scheduled(out, num_reqs, handle, n)
        num_reqs += 1
        budget -= n
    return budget, num_reqs, num_hit_tokens, num_running, head, num_waiting


def preempt_latest(kv, requests, running, num_running, waiting, head, out):
    """The most recently admitted running request (rules.preemption_victim) taken off the running list, preempted
    (preempt) and recorded in the step's output. Returns (it, num_running, the waiting queue's head)."""
    victim = pop_running(running, preemption_victim(num_running))
    head = preempt(kv, requests, waiting, head, victim)
    add_preempted(out, victim)
    return victim, num_running - 1, head


def preempt(kv, requests, waiting, head, handle):
    """Preempt a running request the caller took off the running list (Scheduler._preempt_request): its blocks freed,
    its state reset (request.preempt_request), it goes to the front of the waiting queue. Returns the queue's head."""
    free_blocks(kv, requests, handle)
    preempt_request(request_of(requests, handle))
    return push_waiting_front(waiting, head, handle)


def account(requests, out, num_reqs, async_scheduling, fields):
    """Move each of the batch's num_reqs scheduled requests on (request.update_after_schedule: computed tokens,
    whether it samples, asynchronously its tokens in flight and placeholders; Scheduler._update_after_schedule) and,
    where fields, fill in the step's Batch beyond its tokens. Returns the batch's tokens."""
    tokens = context = decodes = decode_context = prefills = pairs = low = high = 0
    for j in range(num_reqs):
        handle, n = scheduled(out, j)
        request = request_of(requests, handle)
        before = request.num_computed_tokens
        sample = update_after_schedule(request, n, async_scheduling)
        set_sample(out, j, sample)
        tokens += n
        if fields:  # the Batch's other fields, for a clock that reads them
            computed = before + n
            context += computed
            if n == 1 and sample:
                decodes += 1
                decode_context += computed
                low = computed if low == 0 or computed < low else low
                high = computed if computed > high else high
            else:
                prefills += 1
                pairs += attention_pairs(n, before)
    set_batch(out, tokens, context, decodes, decode_context, prefills, pairs, low, high)
    return tokens


def update_from_output(scheduler, kv, requests, out, num_reqs, running, num_running, waiting, head, num_waiting):
    """vLLM's Scheduler.update_from_output (sched/scheduler.py; AsyncScheduler inherits it) for a batch of num_reqs
    requests: each moves by request.update_request_with_output, in the batch's order; a request that sampled its first
    token or finished is handed on (add_first_token, add_finished: stamped at the batch's end); with prefix caching a
    running request whose placeholder settled caches the blocks its settled tokens fill (asynchronous only: the
    synchronous engine caches them at allocation; scheduler.async_scheduling); a finished request's blocks are freed at once, and the running
    list and, where one finished there, the waiting queue keep the others in order. A request preempted with a batch in
    flight keeps that batch's token (vLLM's stale output), which may finish it in the waiting queue. Returns (requests
    that sampled, requests that finished, the computed tokens those held, num_running, num_waiting)."""
    num_sampled = num_finished = num_finished_tokens = 0
    finished_waiting = False
    for j in range(num_reqs):
        handle, n = scheduled(out, j)
        request = request_of(requests, handle)
        was_running = request.status == RUNNING
        sampled, first_token, settled, done = update_request_with_output(
            request, n, out.samples[j], scheduler.async_scheduling
        )
        if not sampled:
            continue
        num_sampled += 1
        if first_token:
            add_first_token(out, requests, handle)
        if settled and was_running and kv.enable_caching:
            cache_blocks(kv, requests, handle, request.num_computed_tokens - request.num_in_flight_tokens)
        if done:
            num_finished_tokens += request.num_computed_tokens
            free_blocks(kv, requests, handle)  # preempted, it holds none: its stale token finished it waiting
            finished_waiting = finished_waiting or not was_running
            add_finished(out, requests, handle)
            num_finished += 1
    if num_finished:
        num_running, num_waiting = remove_finished(
            requests, running, num_running, waiting, head, num_waiting, finished_waiting
        )
    return num_sampled, num_finished, num_finished_tokens, num_running, num_waiting


# ---------------------------------------------------------------- the reference's side of them
def request_of(requests, request):
    """The request a handle names: the reference's handle is the Request."""
    return request


def pop_running(running: list, index: int):
    """The running request at index, taken off the running list."""
    return running.pop(index)


def append_running(running: list, num_running: int, request) -> None:
    """An admitted request joins the back of the running list."""
    running.append(request)


def waiting_front(waiting: deque, head: int):
    """The waiting queue's first request."""
    return waiting[0]


def pop_waiting(waiting: deque, head: int) -> int:
    """The waiting queue without its first request; its head (0)."""
    waiting.popleft()
    return head


def push_waiting_front(waiting: deque, head: int, request) -> int:
    """A preempted request goes to the front of the waiting queue; its head (0)."""
    waiting.appendleft(request)
    return head


def allocate_slots(kv, requests, request, num_new_tokens: int) -> bool:
    """KVCacheManager.allocate_slots for a running request: False where the pool has too few free blocks."""
    return kv.allocate_slots(request, num_new_tokens)


def get_computed_blocks(kv, requests, request) -> tuple:
    """KVCacheManager.get_computed_blocks: (the prefix hit, its tokens)."""
    return kv.get_computed_blocks(request)


def hit_boundary(hits) -> int:
    """A longer prefix than the hit one group found cached (Mamba's alignment; 0: none)."""
    return hits[1] if hits else 0


def allocate_admitted(kv, requests, request, num_new_tokens: int, hits) -> bool:
    """KVCacheManager.allocate_slots on admission: blocks for the request's whole length must be free, its hit's
    blocks taken first."""
    return kv.allocate_slots(request, num_new_tokens, hits, full_sequence_must_fit=True)


def free_blocks(kv, requests, request) -> None:
    """KVCacheManager.free."""
    kv.free(request)


def new_step_starts(kv) -> None:
    """The KV-cache manager's per-step state (Mamba's prefill checkpoints) starts afresh."""
    kv.new_step_starts()


def add_scheduled(out: SchedulerOutput, j: int, request, num_new_tokens: int) -> None:
    """The batch's j-th request and its tokens."""
    out.scheduled.append((request, num_new_tokens))


def add_preempted(out: SchedulerOutput, request) -> None:
    """A request preempted in this step."""
    out.preempted.append(request)


def add_admitted(out: SchedulerOutput, requests, request) -> None:
    """A request admitted (or resumed) in this step."""
    out.admitted.append(request)


def scheduled(out: SchedulerOutput, j: int) -> tuple:
    """The batch's j-th request and its tokens."""
    return out.scheduled[j]


def set_sample(out: SchedulerOutput, j: int, sample: bool) -> None:
    """Whether the batch's j-th request samples."""
    out.samples.append(sample)


def set_batch(out: SchedulerOutput, tokens, context, decodes, decode_context, prefills, pairs, low, high) -> None:
    """The step's Batch, what its step cost reads."""
    out.batch = Batch(tokens, context, decodes, decode_context, prefills, pairs, low, high)


def cache_blocks(kv, requests, request, num_tokens: int) -> None:
    """KVCacheManager.cache_blocks: the full blocks of the request's first num_tokens tokens go into the prefix
    cache."""
    kv.cache_blocks(request, num_tokens)


def add_first_token(out: SchedulerOutput, requests, request) -> None:
    """A request that sampled its first token (the engine stamps it at the batch's end)."""
    out.first_tokens.append(request)


def add_finished(out: SchedulerOutput, requests, request) -> None:
    """A request that finished (the engine stamps it at the batch's end)."""
    out.finished.append(request)


def remove_finished(requests, running: list, num_running: int, waiting: deque, head: int, num_waiting: int,
                    from_waiting: bool) -> tuple:  # fmt: skip
    """The running list (and, where from_waiting, the waiting queue) without its finished requests, in order; their
    lengths."""
    running[:] = [r for r in running if r.status != FINISHED]
    if from_waiting:
        kept = [r for r in waiting if r.status != FINISHED]
        waiting.clear()
        waiting.extend(kept)
    return len(running), len(waiting)
