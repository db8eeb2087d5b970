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
stale output (reset_prefix_cache and connectors only). With Mamba states and prefix caching (vLLM's mamba_cache_mode
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
    PREEMPTED,
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


class Scheduler:
    """vLLM's waiting queue, running list and the decisions of schedule() and update_from_output(), synchronous."""

    admits_before_decodes = False  # vLLM 0.1.4 (SchedulerV0): prompt steps first, a free block per decode
    async_scheduling = False  # AsyncScheduler: the next batch is scheduled before this one's output

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

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        """Decide this step: tokens per request, blocks, preemptions and admissions (vLLM's schedule())."""
        out = SchedulerOutput()
        scheduled, preempted = out.scheduled, out.preempted
        kv = self.kv_cache_manager
        running, waiting = self.running, self.waiting
        budget = self.max_num_batched_tokens
        cap = step_token_cap(self.long_prefill_token_threshold, len(running), len(waiting))
        split = self.mamba_block_size
        if split:
            kv.new_step_starts()

        i = 0
        allocate, bs, caching, shortcut = kv.allocate_slots, kv.block_size, kv.enable_caching, kv.noop_decodes
        new_tokens, noop = running_num_new_tokens, allocation_is_noop
        while i < len(running) and budget > 0:
            request = running[i]
            computed = request.num_computed_tokens
            n = new_tokens(
                request.num_tokens,
                request.num_output_placeholders,
                computed,
                request.num_prompt_tokens + request.max_tokens,
                cap,
                budget,
                self.max_model_len,
            )
            if split and n:  # Mamba states: a prefill chunk ends where a state is cached
                n = mamba_aligned_num_new_tokens(
                    computed,
                    n,
                    request.num_prompt_tokens,
                    request.num_tokens,
                    split,
                    self.max_prefill_tokens,
                    request.shared_prefix_boundary,
                    self.mamba_checkpoint_alignment,
                )
            if n == 0:  # async: its last token is in flight, or it is at max_model_len (or a Mamba cut)
                i += 1
                continue
            # allocate_slots, preempting from the back (skipped for a decode inside its last block: a no-op, where
            # no sliding window frees blocks)
            while not (shortcut and noop(n, computed, request.num_tokens, bs, caching)) and not allocate(request, n):
                victim = running.pop(preemption_victim(len(running)))
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status == PREEMPTED:
                break  # it preempted itself: no more running requests this step
            scheduled.append((request, n))
            budget -= n
            i += 1

        if not preempted:  # no admission in a step that preempted
            chunked = self.enable_chunked_prefill
            while budget > 0 and waiting:
                if len(running) >= self.max_num_seqs:
                    break
                request = waiting[0]
                hits, num_hit_tokens = kv.get_computed_blocks(request)
                n = admission_num_new_tokens(request.num_tokens, num_hit_tokens, cap, budget, chunked)
                if split and n:
                    n = mamba_aligned_num_new_tokens(
                        num_hit_tokens,
                        n,
                        request.num_prompt_tokens,
                        request.num_tokens,
                        split,
                        self.max_prefill_tokens,
                        hits[1] if hits else 0,
                        self.mamba_checkpoint_alignment,
                    )
                if n == 0 or not kv.allocate_slots(request, n, hits, full_sequence_must_fit=True):
                    break  # the scan stops at the first request that does not fit
                waiting.popleft()
                running.append(request)
                request.status = RUNNING
                request.num_computed_tokens = num_hit_tokens
                out.num_hit_tokens += num_hit_tokens
                out.admitted.append(request)
                scheduled.append((request, n))
                budget -= n
        self.account(out)
        return out

    def account(self, out: SchedulerOutput) -> None:
        """Move each scheduled request on (request.update_after_schedule: its computed tokens, whether it samples and,
        asynchronously, its tokens in flight and placeholders), and fill in the step's cost inputs."""
        tokens = context = decodes = decode_context = prefills = pairs = high = 0
        low = None
        marks, moved_on, async_scheduling = out.samples, update_after_schedule, self.async_scheduling
        for request, n in out.scheduled:
            before = request.num_computed_tokens
            sample = moved_on(request, n, async_scheduling)
            marks.append(sample)
            computed = before + n
            tokens += n
            context += computed
            if n == 1 and sample:
                decodes += 1
                decode_context += computed
                if low is None or computed < low:
                    low = computed
                if computed > high:
                    high = computed
            else:
                prefills += 1
                pairs += attention_pairs(n, before)
        out.batch = Batch(tokens, context, decodes, decode_context, prefills, pairs, low or 0, high)
        self.has_finished = False

    def _preempt(self, request: Request) -> None:
        """Free the request's blocks, reset it (request.preempt_request) and put it at the front of the waiting
        queue."""
        self.kv_cache_manager.free(request)
        preempt_request(request)
        self.waiting.appendleft(request)

    # ---------------------------------------------------------------- update_from_output
    def update_from_output(self, out: SchedulerOutput) -> tuple[int, list[Request], list[Request]]:
        """Process a batch's output (request.update_request_with_output for each scheduled request): tokens sampled,
        placeholders settled, finished requests' blocks freed at once, in the batch's order; with prefix caching a
        running request whose placeholder settled caches the blocks its settled tokens fill (asynchronous only: the
        synchronous engine caches them at allocation). A request preempted with a batch in flight keeps that batch's
        token (vLLM's stale output), which may finish it in the waiting queue.

        Returns how many requests sampled, those that sampled their first token and those that finished (both in
        batch order)."""
        num_sampled, first, finished = 0, [], []
        kv, updated, async_scheduling = self.kv_cache_manager, update_request_with_output, self.async_scheduling
        cache_blocks = kv.cache_blocks if kv.enable_caching else None  # (a reservation pool caches nothing)
        finished_waiting = False
        for (request, n), sample in zip(out.scheduled, out.samples):
            running = request.status == RUNNING
            sampled, first_token, settled, done = updated(request, n, sample, async_scheduling)
            if not sampled:
                continue
            num_sampled += 1
            if first_token:
                first.append(request)
            if settled and running and cache_blocks:
                cache_blocks(request, request.num_computed_tokens - request.num_in_flight_tokens)
            if done:
                kv.free(request)  # preempted, it holds none: its stale token finished it waiting
                finished_waiting |= not running
                finished.append(request)
        if finished:
            self.running = [r for r in self.running if r.status != FINISHED]
            if finished_waiting:
                self.waiting = deque(r for r in self.waiting if r.status != FINISHED)
            self.has_finished = True
        return num_sampled, first, finished
