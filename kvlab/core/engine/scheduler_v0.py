"""vLLM 0.1.4's scheduler (August 2023, the mid-2023 vLLM the paper measured), FCFS, synchronous, one sequence a request.

Source: vllm-0.1.4 (PyPI sdist = tag v0.1.4), vllm/core/scheduler.py (Scheduler._schedule, _preempt,
_preempt_by_recompute), vllm/core/block_manager.py (BlockSpaceManager), vllm/core/policy.py (FCFS),
vllm/engine/llm_engine.py (LLMEngine.step, _stop_sequences), vllm/engine/arg_utils.py (defaults). Each step
(schedule) is one of two kinds:
1. a prompt step (scheduler.py:_schedule, lines 114-175), tried first, since nothing is ever swapped (line 115):
   waiting requests are admitted first come first served (line 122, the head only; the queue is never sorted)
   while (a) blocks for all of the request's tokens leave at least watermark_blocks free (block_manager.py:
   can_allocate, lines 81-89: num_free - ceil(len / block_size) >= watermark_blocks, watermark_blocks =
   int(0.01 x num_gpu_blocks), line 73), (b) the prompts admitted so far plus this one have at most
   max_num_batched_tokens tokens (lines 143-146; default 2,560, arg_utils.py:28), and (c) fewer than
   max_num_seqs requests run (lines 148-157; default 256); the first that fails stops the scan. A request
   admitted gets blocks for all its tokens (block_manager.py:allocate, lines 91-106) and computes them all in
   this step, which schedules the admitted requests only (lines 165-175): the running ones wait a step.
2. otherwise a decode step (lines 177-245): the running requests, sorted by arrival (policy.py:FCFS, the
   earliest first; Python's stable sort), each get one token. Before each, can_append_slot
   (block_manager.py:108-113) needs at least one free block, whether or not the token opens a new block;
   while there is none the last request of the sorted list is preempted (lines 188-199: the latest
   arrival), or the request itself when it is the last. append_slot (lines 115-125) takes a block only when
   the token opens one. A request preempted is recomputed (scheduler.py:_preempt, lines 351-358: RECOMPUTE
   for a group of one sequence): its blocks are freed and it goes to the front of the waiting queue
   (_preempt_by_recompute, lines 364-375), to be admitted again with all its tokens (prompt + output so far).
update_from_output (llm_engine.py:step and _stop_sequences, lines 438-447): every scheduled request samples one
token; it finishes when its output has max_tokens tokens or its length passes max_model_len (get_len() >
max_model_len: one token more than vLLM 0.33 allows, max_request_tokens) and frees its blocks.

The pool: the same usable blocks as the v1 engine's (num_gpu_blocks - 1: vLLM 0.1.4 has no null block, and the
same KV memory gives it num_gpu_blocks - 1 blocks), so watermark_blocks = int(0.01 x (num_gpu_blocks - 1)).
The reservation baselines (Orca) reserve on admission with no watermark (a reservation never grows, so
nothing can be evicted) and never preempt; their decode steps need no free block.

Left out, and why it is inert here (greedy, one sequence per request, no stop strings, no EOS: lengths given):
swapping (scheduler.py:_preempt_by_swap and the swapped queue, lines 206-230: only groups of several sequences,
beam search or parallel sampling, are swapped, so the queue stays empty and prompt steps are always tried),
copy-on-write and fork (beam search only), a prompt longer than min(max_model_len, max_num_batched_tokens)
ignored (lines 125-137: kvlab refuses such prompts and a max_num_batched_tokens below max_model_len up front,
so no waiting request, preempted ones included, is ever that long), CPU blocks, the free-block stack's order
(block ids differ from vLLM 0.1.4's LIFO stack; with no sharing, only their number matters), stop strings
and EOS. Its compiled loop (fast/loops/v0.py) steps one at a time; tests/test_compiled.py holds it to this one.
"""

from __future__ import annotations

import numpy as np

from kvlab.core.config import SchedulerConfig
from kvlab.core.engine.request import RUNNING
from kvlab.core.engine.rules import watermark_admits
from kvlab.core.engine.scheduler import (
    Scheduler,
    SchedulerOutput,
    account,
    add_admitted,
    add_scheduled,
    allocate_admitted,
    allocate_slots,
    append_running,
    pop_waiting,
    preempt_latest,
    request_of,
    waiting_front,
)
from kvlab.core.units import cdiv

WATERMARK = 0.01  # vllm/core/block_manager.py: BlockSpaceManager(watermark=0.01)


def watermark_blocks(num_gpu_blocks: int) -> int:
    """Free blocks an admission must leave: int(0.01 x the usable blocks), as vLLM 0.1.4 counts them."""
    return int(WATERMARK * (num_gpu_blocks - 1))


def blocks_to_finish(
    prompt_tokens: np.ndarray, final_tokens: np.ndarray, block_size: int, num_watermark_blocks: int
) -> np.ndarray:
    """Usable blocks each request alone in the pool needs to finish: its longest readmission (all but its last
    token, plus the watermark) and, if it decodes, its last decode (its blocks and one free)."""
    admit = cdiv(final_tokens - 1, block_size) + num_watermark_blocks
    last_decode = np.where(final_tokens - prompt_tokens >= 2, cdiv(final_tokens - 2, block_size) + 1, 0)
    return np.maximum(admit, last_decode)


class SchedulerV0(Scheduler):
    """vLLM 0.1.4's decisions over the same queues, requests and KV-cache managers as the v1 scheduler."""

    def __init__(self, scheduler: SchedulerConfig, kv_cache_manager, max_model_len: int):
        super().__init__(scheduler, kv_cache_manager, max_model_len)
        self.max_request_tokens = self.max_model_len + 1  # finished once get_len() > max_model_len
        self.paged = kv_cache_manager.allocation == "paged"
        self.watermark_blocks = watermark_blocks(kv_cache_manager.pool.num_gpu_blocks) if self.paged else 0

    def schedule(self) -> SchedulerOutput:
        """A prompt step if any waiting request is admitted, else a decode step of every running request (the
        module's schedule, on this scheduler's Request objects and queues)."""
        out = SchedulerOutput()
        running, waiting = self.running, self.waiting
        schedule(self, self.kv_cache_manager, None, running, len(running), waiting, 0, len(waiting), out)
        self.has_finished = False
        return out


# ---------------------------------------------------------------- schedule(), written once
# vLLM 0.1.4's schedule over a request's handle, the queues and the KV-cache manager's calls, as
# kvlab.core.engine.scheduler's for vLLM 0.33: the reference calls it on Request objects; the compiled loop
# (fast/loops/v0.py) compiles it from this source with the calls each side binds to its own bound to the loop's arrays.


def schedule(scheduler, kv, requests, running, num_running, waiting, head, num_waiting, out):
    """SchedulerV0.schedule (the module's docstring): a prompt step of the waiting requests admitted first come first
    served, else a decode step of every running request, earliest arrival first (the running list stays in arrival
    order: FCFS admission, preemption from the back; vLLM 0.1.4 sorts it, a no-op tests/test_scheduler_v0.py checks),
    the latest preempted while no block is free; then account. Returns (requests scheduled, requests preempted, tokens
    scheduled, num_running, head, num_waiting)."""
    num_reqs = num_preempted = num_batched_tokens = 0
    while num_waiting > 0:
        handle = waiting_front(waiting, head)
        request = request_of(requests, handle)
        if not can_admit(scheduler, kv, request, num_batched_tokens, num_running):
            break
        n = request.num_tokens
        allocate_admitted(kv, requests, handle, n, None)  # can_admit checked its blocks or its reservation
        head = pop_waiting(waiting, head)
        num_waiting -= 1
        append_running(running, num_running, handle)
        num_running += 1
        request.status = RUNNING
        add_admitted(out, requests, handle)
        add_scheduled(out, num_reqs, handle, n)
        num_reqs += 1
        num_batched_tokens += n
    if num_reqs == 0:  # a decode step: a token each, a free block before each (paged), the latest preempted
        i = 0
        while i < num_running:
            handle = running[i]
            preempted_self = False
            while needs_free_block(kv):
                victim, num_running, head = preempt_latest(kv, requests, running, num_running, waiting, head, out)
                num_waiting += 1
                num_preempted += 1
                if victim == handle:
                    preempted_self = True
                    break
            if preempted_self:
                break
            allocate_slots(kv, requests, handle, 1)  # a block is free: it cannot fail
            add_scheduled(out, num_reqs, handle, 1)
            num_reqs += 1
            i += 1
    num_scheduled_tokens = account(requests, out, num_reqs, scheduler.async_scheduling, True)
    return num_reqs, num_preempted, num_scheduled_tokens, num_running, head, num_waiting


def can_admit(scheduler, kv, request, num_batched_tokens, num_running):
    """Whether the prompt step admits request after num_batched_tokens prompt tokens (side-effect free): the token budget, max_num_seqs, then the watermark (blocks for all its
    tokens leave watermark_blocks free) or its reservation (prompt_fits)."""
    n = request.num_tokens
    if num_batched_tokens + n > scheduler.max_num_batched_tokens or num_running >= scheduler.max_num_seqs:
        return False
    return prompt_fits(scheduler, kv, request)


# ---------------------------------------------------------------- the reference's side of them
def prompt_fits(scheduler, kv, request) -> bool:
    """Blocks for all of request's tokens leave watermark_blocks free (paged), or a buddy chunk for its reservation is
    free."""
    if not scheduler.paged:
        return kv.can_reserve(request)
    return watermark_admits(
        request.num_tokens, kv.num_free_blocks, scheduler.watermark_blocks, kv.block_size, scheduler.max_model_len
    )


def needs_free_block(kv) -> bool:
    """A decode needs a free block and none is (paged; a reservation holds every slot its decodes write)."""
    return kv.allocation == "paged" and kv.num_free_blocks < 1
