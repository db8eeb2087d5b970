"""The engine's fast path: k decode steps in which nothing can change, done at once in closed form.

When every running request is decoding (it sampled in the last step), the next steps schedule one token
per running request (max_num_batched_tokens >= max_num_seqs, which vLLM requires) until one of:
- a request finishes: the run ends with the step that samples its last token;
- a request needs a block the pool has not got: a request whose computed tokens are c crosses into a new
  block at the steps j with (c + j) % block_size == 0, so the pool covers the first k steps while the
  blocks crossed in them, R x (k // block_size) + #{phase < k % block_size}, are at most the free blocks;
- a waiting request is admitted: the head of the waiting queue is refused in the first step and so in every
  later one, since free blocks only fall while nothing finishes (a refused head's prefix hits can only be
  evicted); if nothing waits, the first request to arrive during the run must be refused when it joins;
and the step cost stays the same or changes in closed form: every step cost gives a run's durations at once
(run_s: constant and linear ones one duration, roofline and calibrated ones one a step as the context grows).
Step times are the same float additions as the per-step loop, in the same order; blocks are taken from the
free queue in the per-step loop's order (step by step, in running order); and the per-step records are
filled in, so a run is indistinguishable from its steps (tests/test_engine.py checks it).

vLLM 0.1.4's scheduler (scheduler_v0, synchronous only) has the same runs under two rules of its own: a step
admits before it decodes (a step of prompts only), so a request is admitted at step j after the blocks of
steps 0..j-1 are gone; and every decode needs a free block before its own (can_append_slot), so the run's
blocks leave one free, or the last one goes to the last decode of the run's last step, the last running
request's. Its decode steps sort the running requests by arrival, which changes nothing: admission first come
first served and preemption from the back of the running list to the front of the waiting queue keep them in
arrival order. tests/test_scheduler_v0.py holds it to the per-step loop.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate, repeat

from kvlab.core.engine.request import FINISHED


def run(engine) -> bool:
    """Do the next decode run of at least 2 steps; False (nothing changed) if there is none."""
    scheduler = engine.scheduler
    v0 = scheduler.admits_before_decodes
    running = scheduler.running
    num_running = len(running)
    if head_admitted(engine):
        return False
    k = min([r.max_num_tokens - r.num_tokens for r in running])   # the run's last step: a first finish
    limits = run_limits(engine, k, v0)
    if limits is None:
        return False
    k, phases, budget_left, may_admit = limits
    paged, bs = phases is not None, engine.block_size
    times = step_times(engine.clock, engine.cost.run_s(num_running, engine.num_kv_tokens + num_running, k), k)
    arrival, first = engine.arrival_list, engine.next_arrival
    if may_admit and not scheduler.waiting and first < len(arrival):
        joins = bisect_left(times, arrival[first], 1, k)            # the first step it is there for
        if joins < k:
            periods, rest = divmod(joins + (not v0), bs)            # the steps whose blocks are gone by then
            taken = num_running * periods + sum(1 for p in phases if p < rest) if paged else 0
            if admissible(engine, engine.peek_arrival(), budget_left, taken):
                if joins < 2:
                    return False
                k = joins
                del times[k + 1:]
    apply(engine, k, times, phases)
    return True


def head_admitted(engine) -> bool:
    """Whether the waiting queue's head is admitted in the next step even if every running request takes a block
    first: then there is no decode run, and the O(running) work of finding one is not done."""
    scheduler = engine.scheduler
    num_running = len(scheduler.running)
    budget_left = scheduler.max_num_batched_tokens - num_running
    if not scheduler.waiting or budget_left <= 0 or num_running >= scheduler.max_num_seqs:
        return False
    return admissible(engine, scheduler.waiting[0], budget_left, num_running if engine.allocation == "paged" else 0)


def run_limits(engine, k: int, v0: bool = False):
    """How long a decode run of at most k steps may last: (k, each request's block phase or None for
    reservations, the budget left by the decodes, whether a request may be admitted), or None (under 2 steps).

    The waiting queue's head must be refused in the first step (it then stays refused), and the pool must have
    a block for every block boundary the running requests cross; v0: vLLM 0.1.4's rules (the module's docstring)."""
    if k < 2:
        return None
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    running = scheduler.running
    num_running = len(running)
    paged = engine.allocation == "paged"
    budget_left = scheduler.max_num_batched_tokens - num_running
    may_admit = budget_left > 0 and num_running < scheduler.max_num_seqs
    head = scheduler.waiting[0] if may_admit and scheduler.waiting else None
    bs = engine.block_size
    # Request i takes a block at the steps j with j % bs == phases[i] (its computed tokens fill a block).
    phases = [-r.num_computed_tokens % bs for r in running] if paged else None
    if head is not None and admissible(engine, head, budget_left, phases.count(0) if paged and not v0 else 0):
        return None
    if paged:
        k = min(k, steps_with_blocks(phases, kv.num_free_blocks, bs, v0))
        if k < 2:
            return None
    return k, phases, budget_left, may_admit


def steps_with_blocks(phases: list[int], num_free_blocks: int, block_size: int, v0: bool = False) -> int:
    """The most decode steps num_free_blocks cover: a block for every block boundary crossed, the running
    requests (in order) crossing one at the steps j with j % block_size == their phase; v0: and a free block
    before every decode (vLLM 0.1.4's can_append_slot)."""
    if v0 and num_free_blocks < 1:
        return 0                                        # the first decode finds no free block
    order = sorted(phases)
    full_periods, left = divmod(num_free_blocks - v0, len(phases))
    steps = full_periods * block_size + order[left]    # the blocks crossed in steps 0..steps-1 are at most free
    if v0 and phases[-1] == order[left] and order[left + 1:left + 2] != [order[left]]:
        steps += 1      # one more: its last block is the last free one, taken by the last decode of the step
    return steps


def step_times(clock: float, durations, k: int) -> list[float]:
    """The k + 1 step boundaries from clock: each the previous plus the step's duration (the same additions
    as the per-step loop, in order; durations is one float or k of them)."""
    steps = repeat(durations, k) if isinstance(durations, float) else durations.tolist()
    return list(accumulate(steps, initial=clock))


def admissible(engine, request, budget_left: int, blocks_taken: int) -> bool:
    """Whether the waiting loop could admit request in a step of the run (after blocks_taken blocks are gone).

    Side-effect free and never wrong in the unsafe direction: its prefix hits are looked up now, and blocks
    taken later can only evict some of them. vLLM 0.1.4's scheduler answers for itself (its whole budget)."""
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    if scheduler.admits_before_decodes:
        return scheduler.can_admit(request, 0, blocks_taken)
    hits = kv.get_computed_blocks(request)
    n = request.num_tokens - len(hits) * engine.block_size
    cap = scheduler.long_prefill_token_threshold        # active: a request runs and this one waits
    if 0 < cap < n:
        n = cap
    if not scheduler.enable_chunked_prefill and n > budget_left:
        return False
    if engine.allocation != "paged":
        return kv.reservation_tokens(request) <= kv.num_free_tokens
    return kv.blocks_to_admit(request, hits) <= kv.num_free_blocks - blocks_taken


def take_blocks(engine, k: int, phases: list[int] | None) -> list[int]:
    """Give the running requests the blocks their k decode steps cross; what they hold after each step."""
    kv, running = engine.kv_cache_manager, engine.scheduler.running
    num_running = len(running)
    held_before = kv.held()
    if phases is None:
        return [held_before] * k
    # Step j takes a block for each request of phase j % bs, in running order; every period of bs steps
    # repeats the same order (by phase, then position), so the request of rank t gets every
    # num_running-th block taken, from the t-th on.
    bs = engine.block_size
    per_phase = [0] * bs
    for p in phases:
        per_phase[p] += 1
    held = list(accumulate((per_phase * (k // bs + 1))[:k], initial=held_before))[1:]
    num_taken = held[-1] - held_before
    if num_taken:
        blocks = kv.pool.get_new_blocks(num_taken)
        order = sorted(range(num_running), key=phases.__getitem__)    # stable: ties by position
        for rank, i in enumerate(order):
            running[i].block_ids.extend(blocks[rank::num_running])
    return held


def apply(engine, k: int, times: list[float], phases: list[int] | None) -> None:
    """Advance every running request k decode steps; record the k steps; finish the requests done at the end."""
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    running = scheduler.running
    num_running = len(running)
    held = take_blocks(engine, k, phases)
    finished = []
    for request in running:
        request.num_computed_tokens += k
        request.num_tokens += k
        if request.num_tokens >= request.max_num_tokens:
            finished.append(request)
    if kv.enable_caching:
        for request in running:
            kv.cache_blocks(request, request.num_computed_tokens)
    kv_tokens = list(range(engine.num_kv_tokens + num_running, engine.num_kv_tokens + (k + 1) * num_running,
                           num_running))
    end = times[k]
    if finished:
        num_kv_tokens = kv_tokens[-1]
        for request in finished:
            request.status = FINISHED
            kv.free(request)
            num_kv_tokens -= request.num_computed_tokens
            engine.finished(request, end)
        scheduler.running = [r for r in running if r.status != FINISHED]
        kv_tokens[-1] = num_kv_tokens
        held[-1] = kv.held()
    engine.num_kv_tokens = kv_tokens[-1]
    # Requests arriving during the run join the waiting queue behind a refused head (the loop adds them next).
    arrival, i, num_arrivals = engine.arrival_list, engine.next_arrival, len(engine.arrival_list)
    waiting = len(scheduler.waiting)
    if i == num_arrivals or arrival[i] > times[k - 1]:
        num_waiting = waiting
    else:
        num_waiting = []
        for j in range(k):
            while i < num_arrivals and arrival[i] <= times[j]:
                i += 1
                waiting += 1
            num_waiting.append(waiting)
    engine.steps.extend(times, num_running, num_waiting, held, kv_tokens)
    if engine.record_scheduled:
        batch = [(r.request_id, 1) for r in running]
        engine.scheduled_log.extend((list(batch), []) for _ in range(k))
    engine.clock = end


# ---------------------------------------------------------------- asynchronous scheduling
def run_async(engine, queue, gpu_free_s: float) -> float | None:
    """The asynchronous engine's decode run: k loop iterations (schedule batch j, then process batch j - 1's
    output) at once; the new gpu_free_s, or None (nothing changed) if there is none of at least 2.

    It starts with one batch in flight of decodes only (the loop's pure flag) that holds every running request
    (those it skipped by the early stop have finished since): each then
    has one output placeholder and computed = known tokens t. Iteration j schedules one token for every running
    request unless one of its own rules applies: vLLM's early stop skips a request whose placeholder brings it
    to max_num_tokens, so all are scheduled while k <= min(max_num_tokens - t - 1) and nothing finishes in the
    run (a finish comes with the output of the run's last batch or later); blocks are taken at the same phases
    as the synchronous run (computed tokens run one ahead); admissions and arrivals as there, each schedule()
    at the clock of the output it waited for last. Batch j runs from the end of batch j - 1 (the GPU is never
    idle: the next batch is always queued)."""
    from kvlab.core.engine.scheduler import SchedulerOutput

    scheduler = engine.scheduler
    running = scheduler.running
    num_running = len(running)
    in_flight, start0, end0, running0, waiting0, pure = queue[0]
    if not pure or len(in_flight.scheduled) != num_running or head_admitted(engine):
        return None
    k = None
    num_kv_tokens = 0
    for r in running:
        if r.num_output_placeholders != 1 or r.num_computed_tokens != r.num_tokens or r.num_tokens == r.num_prompt_tokens:
            return None                 # not decoding in steady state (e.g. its first token is in flight)
        left = r.max_num_tokens - r.num_tokens - 1
        k = left if k is None or left < k else k
        num_kv_tokens += r.num_computed_tokens
    limits = run_limits(engine, k)
    if limits is None:
        return None
    k, phases, budget_left, may_admit = limits
    paged, bs = phases is not None, engine.block_size
    # times[i]: the end of batch i (times[0]: the batch in flight); iteration j schedules at the clock times[j - 2].
    times = step_times(gpu_free_s, engine.cost.run_s(num_running, num_kv_tokens + num_running, k), k)
    arrival, first = engine.arrival_list, engine.next_arrival
    if may_admit and not scheduler.waiting and first < len(arrival):
        joins = bisect_left(times, arrival[first], 0, k - 1) + 2     # the first iteration it is there for
        if joins <= k:
            periods, rest = divmod(joins, bs)
            taken = num_running * periods + sum(1 for p in phases if p < rest) if paged else 0
            if admissible(engine, engine.peek_arrival(), budget_left, taken):
                if joins - 1 < 2:
                    return None
                k = joins - 1
                del times[k + 1:]
    apply_async(engine, queue, k, times, phases, num_kv_tokens, SchedulerOutput())
    return times[k]


def apply_async(engine, queue, k: int, times: list[float], phases, num_kv_tokens: int, out) -> None:
    """Advance the asynchronous engine k iterations of a decode run; record batches 0..k-1; queue batch k."""
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    running = scheduler.running
    num_running = len(running)
    in_flight, start0, end0, running0, waiting0, _ = queue.popleft()
    held = take_blocks(engine, k, phases)
    for request in running:
        request.num_computed_tokens += k
        request.num_tokens += k
    if kv.enable_caching:
        for request in running:
            kv.cache_blocks(request, request.num_computed_tokens - 1)    # all but the token in flight settled
    kv_tokens = list(range(num_kv_tokens + num_running, num_kv_tokens + (k + 1) * num_running, num_running))
    # Arrivals join at iteration j's add_arrivals (clock times[j - 2], j >= 2) behind a refused head.
    arrival, i, num_arrivals = engine.arrival_list, engine.next_arrival, len(engine.arrival_list)
    waiting = len(scheduler.waiting)
    num_waiting = [waiting0]
    for j in range(1, k + 1):
        clock = engine.clock if j == 1 else times[j - 2]
        while i < num_arrivals and arrival[i] <= clock:
            i += 1
            waiting += 1
        num_waiting.append(waiting)
    engine.clock = times[k - 2] if k >= 2 else engine.clock
    engine.add_arrivals()                                               # those that joined, in arrival order
    engine.clock = times[k - 1]                                         # it waited for batch k - 1
    if running0 == num_running:
        engine.steps.extend([start0, *times[:k]], num_running, num_waiting[:k], held, kv_tokens)
    else:   # batch 0 was scheduled beside requests it skipped, which finished with the batch before it
        engine.steps.append(start0, times[0], num_running, running0, waiting0, held[0], kv_tokens[0])
        engine.steps.extend(times[:k], num_running, num_waiting[1:k], held[1:], kv_tokens[1:])
    if engine.record_scheduled:
        batch = [(r.request_id, 1) for r in running]
        engine.scheduled_log.extend((list(batch), []) for _ in range(k))
    scheduler.has_finished = False
    out.scheduled = [(r, 1) for r in running]
    out.samples = [True] * num_running
    out.num_scheduled_tokens = out.num_decodes = num_running
    out.context_tokens = out.decode_context_tokens = kv_tokens[-1]
    queue.append((out, times[k - 1], times[k], num_running, num_waiting[k], True))
