"""vLLM 0.33's v1 scheduler (vllm/v1/core/sched/scheduler.py, async_scheduler.py), FCFS, one KV-cache group.

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

Asynchronous scheduling (vLLM's AsyncScheduler, the default on a GPU): the next batch is scheduled before the
previous batch's output is processed, so a request may be scheduled while its last token is being sampled.
That token is an output placeholder (num_output_placeholders, 0 or 1 here: with a batch queue of two at most
one batch is in flight when schedule() runs): it counts toward the request's tokens, so a decoding request's
next token, and a new block at a block boundary, are scheduled one batch earlier (its computed tokens run
one ahead of its known tokens). The running loop skips a request whose placeholder already brings it to
max_tokens (vLLM's early stop: num_computed_tokens + 2 - placeholders >= prompt + max_tokens), and one whose
next position would pass max_model_len (its tokens to schedule come to 0). update_from_output then settles
each scheduled request's in-flight tokens, turns a placeholder into its sampled token and, for a running
request that had one, caches the blocks its settled tokens fill (prefix caching). A request preempted with
a batch in flight keeps that batch's token when its output arrives (vLLM's stale output: the token is
appended, which may finish the request in the waiting queue, but no counter of the reset request moves).

Left out because it is inert for a text-only decoder with one full-attention group and no speculative
decoding, LoRA, structured output, connectors or pipeline parallelism: pause states, encoder budgets,
deferred frees (only with a KV-connector consumer), the prefill cadence, drafts, Mamba alignment, the
watermark (0), drop-mode stale output (reset_prefix_cache and connectors only).
"""
from __future__ import annotations

from collections import deque

from kvlab.core import validate
from kvlab.core.config import SchedulerConfig
from kvlab.core.engine.request import FINISHED, PREEMPTED, RUNNING, Request


def check_scheduler_config(scheduler: SchedulerConfig) -> int:
    """The settings vLLM's SchedulerConfig refuses, refused in its words; returns max_model_len (tokens)."""
    max_model_len = scheduler.max_model_len
    if max_model_len is None:
        validate.fail("max_model_len", None, "the engine needs the longest request in tokens (vLLM takes the "
                      "model's max_position_embeddings; give it)")
    budget = scheduler.max_num_batched_tokens
    if budget < max_model_len and not scheduler.enable_chunked_prefill:
        validate.fail("max_num_batched_tokens", budget, f"is smaller than max_model_len ({max_model_len:,}) with "
                      "chunked prefill off, which vLLM refuses: a longer prompt could never be scheduled; raise "
                      "max_num_batched_tokens, lower max_model_len or turn chunked prefill on")
    if budget < scheduler.max_num_seqs:
        validate.fail("max_num_batched_tokens", budget, f"must be >= max_num_seqs ({scheduler.max_num_seqs:,}), "
                      "as vLLM requires")
    if scheduler.long_prefill_token_threshold > max_model_len:
        validate.fail("long_prefill_token_threshold", scheduler.long_prefill_token_threshold,
                      f"cannot be greater than max_model_len ({max_model_len:,}), as vLLM requires")
    return max_model_len


class SchedulerOutput:
    """One step's decisions: (request, tokens) in vLLM's batch order, preempted requests, and cost inputs."""

    __slots__ = ("scheduled", "samples", "preempted", "admitted", "num_scheduled_tokens", "context_tokens",
                 "num_decodes", "decode_context_tokens", "num_prefills", "prefill_attention_pairs", "num_hit_tokens")

    def __init__(self):
        self.scheduled: list = []          # [(Request, num_new_tokens)]: running first, then admitted
        self.samples: list = []            # per scheduled request: whether its chunk reaches its end (samples)
        self.preempted: list = []          # requests preempted in this step, in order
        self.admitted: list = []           # requests admitted (or resumed) in this step, in order
        self.num_scheduled_tokens = 0
        self.context_tokens = 0            # sum over scheduled requests of tokens attended (computed + new)
        self.num_decodes = 0               # scheduled requests computing exactly their last known token
        self.decode_context_tokens = 0     # context_tokens of those
        self.num_prefills = 0              # scheduled requests that are not decodes (prefill chunks)
        self.prefill_attention_pairs = 0   # sum over those of n x c + n (n + 1) / 2: causal query-key pairs
        self.num_hit_tokens = 0            # prompt tokens admitted requests found in the prefix cache


class Scheduler:
    """vLLM's waiting queue, running list and the decisions of schedule() and update_from_output()."""

    admits_before_decodes = False       # vLLM 0.1.4 (SchedulerV0): prompt steps first, a free block per decode

    def __init__(self, scheduler: SchedulerConfig, kv_cache_manager):
        self.max_model_len = check_scheduler_config(scheduler)
        self.max_request_tokens = self.max_model_len   # a request finishes when it reaches these many tokens
        self.max_num_seqs = scheduler.max_num_seqs
        self.max_num_batched_tokens = scheduler.max_num_batched_tokens
        self.enable_chunked_prefill = scheduler.enable_chunked_prefill
        self.long_prefill_token_threshold = scheduler.long_prefill_token_threshold
        self.async_scheduling = scheduler.async_scheduling
        self.kv_cache_manager = kv_cache_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.has_finished = False          # vLLM's finished_req_ids not yet sent: schedule() clears it

    def add_request(self, request: Request) -> None:
        """A request that has arrived joins the back of the waiting queue."""
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        """Whether any request runs or waits."""
        return bool(self.running or self.waiting)

    def has_requests(self) -> bool:
        """vLLM's has_requests(): a request runs or waits, or one finished since the last schedule()."""
        return bool(self.running or self.waiting or self.has_finished)

    def threshold(self) -> int:
        """This step's cap on one request's tokens: long_prefill_token_threshold when more than one request
        runs or waits, else 0 (no cap)."""
        return self.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        """Decide this step: tokens per request, blocks, preemptions and admissions (vLLM's schedule())."""
        out = SchedulerOutput()
        scheduled, preempted = out.scheduled, out.preempted
        kv = self.kv_cache_manager
        running, waiting = self.running, self.waiting
        budget = self.max_num_batched_tokens
        cap = self.threshold()

        i = 0
        allocate, bs, caching = kv.allocate_slots, kv.block_size, kv.enable_caching
        max_model_len = self.max_model_len
        while i < len(running) and budget > 0:
            request = running[i]
            computed = request.num_computed_tokens
            placeholders = request.num_output_placeholders
            if placeholders and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens:
                i += 1                          # async: the batch in flight samples its last token
                continue
            n = request.num_tokens + placeholders - computed
            if 0 < cap < n:
                n = cap
            if n > budget:
                n = budget
            if placeholders and n > max_model_len - computed - 1:
                n = max_model_len - computed - 1
                if n <= 0:                      # async: its next position would pass max_model_len
                    i += 1
                    continue
            # A decode inside its last block that does not fill it needs no block and caches none:
            # allocate_slots would change nothing, so it is not called.
            if n == 1 and computed % bs and not (caching and min(computed + 1, request.num_tokens) % bs == 0):
                scheduled.append((request, 1))
                budget -= 1
                i += 1
                continue
            while not allocate(request, n):
                victim = running.pop()          # the most recently admitted running request
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status == PREEMPTED:
                break                           # it preempted itself: no more running requests this step
            scheduled.append((request, n))
            budget -= n
            i += 1

        if not preempted:                       # no admission in a step that preempted
            while budget > 0 and waiting:
                if len(running) >= self.max_num_seqs:
                    break
                request = waiting[0]
                hits = kv.get_computed_blocks(request)
                num_hit_tokens = len(hits) * kv.block_size
                n = request.num_tokens - num_hit_tokens
                if 0 < cap < n:
                    n = cap
                if not self.enable_chunked_prefill and n > budget:
                    break
                if n > budget:
                    n = budget
                if not kv.allocate_slots(request, n, hits, full_sequence_must_fit=True):
                    break                       # the scan stops at the first request that does not fit
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
        """Move each scheduled request's computed tokens on, mark which sample, and fill in the step's cost inputs."""
        tokens = context = decodes = decode_context = prefills = pairs = 0
        samples = out.samples
        placeholder = self.async_scheduling
        for request, n in out.scheduled:
            before = request.num_computed_tokens
            computed = before + n
            request.num_computed_tokens = computed
            tokens += n
            context += computed
            end = request.num_tokens + request.num_output_placeholders
            sample = computed >= end
            samples.append(sample)
            if placeholder:
                request.num_in_flight_tokens += n
                if sample:
                    request.num_output_placeholders += 1
            if n == 1 and sample:
                decodes += 1
                decode_context += computed
            else:
                prefills += 1
                pairs += n * before + n * (n + 1) // 2
        out.num_scheduled_tokens, out.context_tokens = tokens, context
        out.num_decodes, out.decode_context_tokens = decodes, decode_context
        out.num_prefills, out.prefill_attention_pairs = prefills, pairs
        self.has_finished = False

    def _preempt(self, request: Request) -> None:
        """Free the request's blocks, reset its progress and put it at the front of the waiting queue; a batch
        still in flight for it becomes stale (its token still arrives, see update_from_output)."""
        self.kv_cache_manager.free(request)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        request.num_stale_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    # ---------------------------------------------------------------- update_from_output
    def update_from_output(self, out: SchedulerOutput) -> tuple[int, list[Request], list[Request]]:
        """Sample one token for each request whose chunk reached its end; finish and free the done ones.

        Returns how many requests sampled, those that sampled their first token and those that finished
        (both in batch order)."""
        if self.async_scheduling:
            return self._update_async(out)
        num_sampled, first, finished = 0, [], []
        free = self.kv_cache_manager.free
        for (request, _), sample in zip(out.scheduled, out.samples):
            if sample:
                request.num_tokens += 1
                num_sampled += 1
                if request.num_tokens == request.num_prompt_tokens + 1:
                    first.append(request)
                if request.num_tokens >= request.max_num_tokens:
                    request.status = FINISHED
                    free(request)
                    finished.append(request)
        if finished:
            self.running = [r for r in self.running if r.status != FINISHED]
            self.has_finished = True
        return num_sampled, first, finished

    def _update_async(self, out: SchedulerOutput) -> tuple[int, list[Request], list[Request]]:
        """update_from_output of a batch scheduled asynchronously: settle its in-flight tokens and placeholders."""
        num_sampled, first, finished = 0, [], []
        kv = self.kv_cache_manager
        caching = kv.enable_caching
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
            if not stale and request.num_output_placeholders:
                request.num_output_placeholders -= 1
                if running and caching:
                    kv.cache_blocks(request, request.num_computed_tokens - request.num_in_flight_tokens)
            if request.num_tokens >= request.max_num_tokens:
                request.status = FINISHED
                kv.free(request)                # preempted, it holds none: its stale token finished it waiting
                finished_waiting |= not running
                finished.append(request)
        if finished:
            self.running = [r for r in self.running if r.status != FINISHED]
            if finished_waiting:
                self.waiting = deque(r for r in self.waiting if r.status != FINISHED)
            self.has_finished = True
        return num_sampled, first, finished
