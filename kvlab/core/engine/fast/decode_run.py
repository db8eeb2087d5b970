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

from kvlab.core.cost import Batch, checked_s
from kvlab.core.engine.request import FINISHED
from kvlab.core.engine.rules import admission_num_new_tokens, block_phase, blocks_crossed, steps_to_finish
from kvlab.core.engine.scheduler import SchedulerOutput


def advance(engine) -> bool:
    """Do the next decode run of at least 2 steps; False (nothing changed) if there is none."""
    scheduler = engine.scheduler
    v0 = scheduler.admits_before_decodes
    running = scheduler.running
    num_running = len(running)
    if head_admitted(engine):
        return False
    k = min([steps_to_finish(r.num_tokens, r.max_num_tokens, 0) for r in running])  # its last step: a first finish
    limits = run_limits(engine, k, v0=v0)
    if limits is None:
        return False
    k, phases, budget_left, may_admit = limits
    paged, bs = phases is not None, engine.block_size
    cost = engine.cost
    computed = [r.num_computed_tokens for r in running]
    first_batch = decode_batch(num_running, engine.num_kv_tokens + num_running, min(computed) + 1, max(computed) + 1)
    times = step_times(engine.now_s, checked_s(cost, cost.run_s(first_batch, k), num_running), k)
    arrival, first = engine.arrival_list, engine.next_arrival
    if may_admit and not scheduler.waiting and first < len(arrival):
        joins = bisect_left(times, arrival[first], 1, k)  # the first step it is there for
        if joins < k:
            taken = blocks_taken(phases, joins + (not v0), bs) if paged else 0  # gone by then
            if admissible(engine, engine.peek_arrival(), budget_left, taken):
                if joins < 2:
                    return False
                k = joins
                del times[k + 1 :]
    apply(engine, k, times, phases)
    return True


def decode_batch(num_decodes: int, context_tokens: int, min_context_tokens: int, max_context_tokens: int) -> Batch:
    """The Batch of a decode-only step: num_decodes decodes of context_tokens in all, between min_ and
    max_context_tokens each."""
    return Batch(num_decodes, context_tokens, num_decodes, context_tokens, 0, 0, min_context_tokens, max_context_tokens)


def head_admitted(engine) -> bool:
    """Whether the waiting queue's head is admitted in the next step even if every running request takes a block
    first: then there is no decode run, and the O(running) work of finding one is not done."""
    scheduler = engine.scheduler
    num_running = len(scheduler.running)
    budget_left = scheduler.max_num_batched_tokens - num_running
    if not scheduler.waiting or budget_left <= 0 or num_running >= scheduler.max_num_seqs:
        return False
    return admissible(engine, scheduler.waiting[0], budget_left, num_running if engine.allocation == "paged" else 0)


def run_limits(engine, k: int, min_steps: int = 2, v0: bool = False):
    """How long a decode run of at most k steps may last: (k, each request's block phase or None for
    reservations, the budget left by the decodes, whether a request may be admitted), or None (under 2 steps).

    The waiting queue's head must be refused in the first step (it then stays refused), and the pool must have
    a block for every block boundary the running requests cross; v0: vLLM 0.1.4's rules (the module's docstring).
    A run shorter than min_steps is None."""
    if k < min_steps:
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
    phases = [block_phase(r.num_computed_tokens, bs) for r in running] if paged else None
    if head is not None and admissible(engine, head, budget_left, phases.count(0) if paged and not v0 else 0):
        return None
    if paged:
        k = min(k, steps_with_blocks(phases, kv.num_free_blocks, bs, v0))
        if k < min_steps:
            return None
    return k, phases, budget_left, may_admit


def steps_with_blocks(phases: list[int], num_free_blocks: int, block_size: int, v0: bool = False) -> int:
    """The most decode steps num_free_blocks cover: a block for every block boundary crossed, the running
    requests (in order) crossing one at the steps j with j % block_size == their phase; v0: and a free block
    before every decode (vLLM 0.1.4's can_append_slot)."""
    if not v0:
        per_phase = [0] * block_size
        for p in phases:
            per_phase[p] += 1
        return steps_covered(per_phase, len(phases), num_free_blocks, block_size)
    if num_free_blocks < 1:
        return 0  # the first decode finds no free block
    order = sorted(phases)
    full_periods, left = divmod(num_free_blocks - v0, len(phases))
    steps = full_periods * block_size + order[left]  # the blocks crossed in steps 0..steps-1 are at most free
    if v0 and phases[-1] == order[left] and order[left + 1 : left + 2] != [order[left]]:
        steps += 1  # one more: its last block is the last free one, taken by the last decode of the step
    return steps


def steps_covered(per_phase, num_running: int, num_free_blocks: int, block_size: int) -> int:
    """The most decode steps num_free_blocks cover: a block for every block boundary crossed, per_phase[p] of the
    num_running requests crossing one at the steps j with j % block_size == p (the compiled loop compiles this same
    function). The blocks crossed in steps 0..s-1 are num_running x (s // block_size) plus the requests of phase
    below s % block_size."""
    full_periods, left = divmod(num_free_blocks, num_running)
    seen = 0
    for p in range(block_size):
        seen += per_phase[p]
        if seen > left:
            return full_periods * block_size + p
    return full_periods * block_size + block_size  # not reached: left < num_running, the sum of per_phase


def blocks_taken(phases: list[int], num_steps: int, block_size: int) -> int:
    """Blocks the running requests take in a run's first num_steps steps (request i at the steps j with
    j % block_size == phases[i])."""
    return sum(blocks_crossed(p, num_steps, block_size) for p in phases)


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
    hits, num_hit_tokens = kv.get_computed_blocks(request)
    cap = scheduler.long_prefill_token_threshold  # active: a request runs and this one waits
    n = admission_num_new_tokens(request.num_tokens, num_hit_tokens, cap, budget_left, scheduler.enable_chunked_prefill)
    return n > 0 and kv.can_admit(request, n, hits, blocks_taken)


def take_blocks(engine, k: int, phases: list[int] | None) -> list[int]:
    """Give the running requests the blocks their k decode steps cross; what they hold after each step."""
    kv, running = engine.kv_cache_manager, engine.scheduler.running
    num_running = len(running)
    held_before = kv.num_held
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
        order = sorted(range(num_running), key=phases.__getitem__)  # stable: ties by position
        for rank, i in enumerate(order):
            running[i].block_ids.extend(blocks[rank::num_running])
    return held


def apply(engine, k: int, times: list[float], phases: list[int] | None) -> None:
    """Advance every running request k decode steps; record the k steps; finish the requests done at the end."""
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    running = scheduler.running
    num_running = len(running)
    held = take_blocks(engine, k, phases)
    split = split_before(engine) if engine.reserving else None
    finished = []
    for request in running:
        request.num_computed_tokens += k
        request.num_tokens += k
        if request.num_tokens >= request.max_num_tokens:
            finished.append(request)
    if kv.enable_caching:
        for request in running:
            kv.cache_blocks(request, request.num_computed_tokens)
    kv_tokens = list(
        range(engine.num_kv_tokens + num_running, engine.num_kv_tokens + (k + 1) * num_running, num_running)
    )
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
        held[-1] = kv.num_held
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
    if split is not None:
        waiting = [num_waiting] * k if isinstance(num_waiting, int) else num_waiting
        add_split(engine, split, waiting[: k - 1])
        engine.record_split(split[0] if waiting[-1] else None)  # the last step's, after the finishes
    if engine.recorder is not None:
        engine.recorder.decode_steps(running, k)
    engine.now_s = end


def split_before(engine) -> tuple:
    """A reservation pool's Fig. 2 counts before a decode run: (the waiting queue's head, else the next request to
    arrive, or None; final tokens; rounding; external fragmentation against that head)."""
    kv, waiting = engine.kv_cache_manager, engine.scheduler.waiting
    head = waiting[0] if waiting else engine.peek_arrival() if engine.next_arrival < len(engine.arrival_list) else None
    return head, kv.num_final_tokens, kv.buddy.num_rounding_slots, kv.external_fragmentation(head)


def add_split(engine, split: tuple, waiting: list[int]) -> None:
    """Record split's counts for steps whose waiting counts (never falling in a run) are waiting: no external
    fragmentation while nothing waits."""
    _, final, rounding, external = split
    idle = bisect_left(waiting, 1)
    if idle:
        engine.steps.add_split(final, rounding, 0, idle)
    if len(waiting) > idle:
        engine.steps.add_split(final, rounding, external, len(waiting) - idle)


# ---------------------------------------------------------------- asynchronous scheduling
def advance_async(engine, queue, gpu_free_s: float) -> float | None:
    """The asynchronous engine's decode run: k loop iterations (schedule batch j, then process batch j - 1's
    output) at once, and the one after them when it finishes requests; the new gpu_free_s, or None (nothing
    changed) if there is no such run.

    It starts with one batch in flight (the loop's pure flag: tokens, no preemption, no prefix hit) that holds
    every running request (those it skipped by the early stop have finished since) and in which each sampled
    (decodes, and prefills it ended: their first token is in flight): each then has one output placeholder and
    computed = known tokens t. Iteration j schedules one token for every running request unless one of its own
    rules applies: vLLM's early stop skips a request whose placeholder brings it to max_num_tokens, so all are
    scheduled while k <= min(max_num_tokens - t - 1); blocks are taken at the same phases as the synchronous run
    (computed tokens run one ahead); admissions and arrivals as there, each schedule() at the clock of the
    output it waited for last. Batch j runs from the end of batch j - 1 (the GPU is never idle: the next batch
    is always queued). A run that reaches the first finish does its next iteration too (last_iteration): the
    requests whose last token is in flight are skipped and finish."""
    scheduler = engine.scheduler
    running = scheduler.running
    num_running = len(running)
    in_flight, start0, end0, running0, waiting0, pure = queue[0]
    if not pure or len(in_flight.scheduled) != num_running or head_admitted(engine):
        return None
    k = None
    num_kv_tokens = 0
    low = high = running[0].num_computed_tokens
    for r in running:
        if r.num_output_placeholders != 1 or r.num_computed_tokens != r.num_tokens:
            return None  # it did not sample in the batch in flight (a prefill chunk)
        left = steps_to_finish(r.num_tokens, r.max_num_tokens, 1)
        k = left if k is None or left < k else k
        computed = r.num_computed_tokens
        num_kv_tokens += computed
        if computed < low:
            low = computed
        elif computed > high:
            high = computed
    first_finish = k
    if k == 0:  # a request's last token is in flight: only the last iteration
        bs = engine.block_size
        phases = [block_phase(r.num_computed_tokens, bs) for r in running] if engine.allocation == "paged" else None
        finishing = last_iteration(engine, 0, engine.now_s, phases)
        return None if finishing is None else finish_async(engine, queue, finishing)
    limits = run_limits(engine, k, 1 if k == 1 else 2)  # one iteration only if the last one follows
    if limits is None:
        return None
    k, phases, budget_left, may_admit = limits
    paged, bs = phases is not None, engine.block_size
    # times[i]: the end of batch i (times[0]: the batch in flight); iteration j schedules at the clock times[j - 2].
    cost = engine.cost
    first_batch = decode_batch(num_running, num_kv_tokens + num_running, low + 1, high + 1)
    times = step_times(gpu_free_s, checked_s(cost, cost.run_s(first_batch, k), num_running), k)
    arrival, first = engine.arrival_list, engine.next_arrival
    if may_admit and not scheduler.waiting and first < len(arrival):
        joins = bisect_left(times, arrival[first], 0, k - 1) + 2  # the first iteration it is there for
        if joins <= k:
            taken = blocks_taken(phases, joins, bs) if paged else 0
            if admissible(engine, engine.peek_arrival(), budget_left, taken):
                if joins - 1 < 2:
                    return None
                k = joins - 1
                del times[k + 1 :]
    finishing = last_iteration(engine, k, times[k - 1], phases) if k == first_finish else None
    if finishing is None and k < 2:
        return None
    apply_async(engine, queue, k, times, phases, num_kv_tokens, SchedulerOutput())
    if finishing is None:
        return times[k]
    return finish_async(engine, queue, finishing)


def last_iteration(engine, k: int, clock: float, phases) -> list[bool] | None:
    """Whether a run of k iterations that ends with the last token of some requests in flight (batch k) may do
    iteration k + 1 as well: schedule batch k + 1 for the others (the early stop skips those), then process batch k,
    which finishes them. Which running requests finish (in running order), or None: every running request
    finishes, a block boundary crossed at k + 1 finds no block, or the waiting queue's head (or a request joining
    it at the clock of iteration k + 1) is admitted by the larger budget of the smaller batch. Checked before the
    run."""
    scheduler = engine.scheduler
    running = scheduler.running
    num_running = len(running)
    finishing = [steps_to_finish(r.num_tokens, r.max_num_tokens, 1) == k for r in running]
    num_left = num_running - sum(finishing)
    if num_left == 0:
        return None
    taken = 0
    if phases is not None:
        phase = k % engine.block_size
        taken = blocks_taken(phases, k, engine.block_size)
        taken += sum(1 for p, done in zip(phases, finishing) if p == phase and not done)
        if taken > engine.kv_cache_manager.num_free_blocks:
            return None
    budget_left = scheduler.max_num_batched_tokens - num_left
    if budget_left > 0 and num_running < scheduler.max_num_seqs:
        head = None
        if scheduler.waiting:
            head = scheduler.waiting[0]
        elif engine.next_arrival < len(engine.arrival_list) and engine.arrival_list[engine.next_arrival] <= clock:
            head = engine.peek_arrival()
        if head is not None and admissible(engine, head, budget_left, taken):
            return None
    return finishing


def finish_async(engine, queue, finishing: list[bool]) -> float:
    """Iteration k + 1 of a decode run (last_iteration said it may be done; batch k is the one queued): at the
    clock of batch k - 1's output arrivals join, batch k + 1 schedules one token for each request not finishing
    (taking blocks in running order), then batch k's output finishes the others (freed in running order) at its
    end; batch k + 1 is queued. Its end."""
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    running = scheduler.running
    num_running = len(running)
    batch_k, start_k, end_k, running_k, waiting_k, _ = queue.popleft()
    engine.add_arrivals()  # the clock: batch k - 1's output (k = 0: the loop's)
    out = SchedulerOutput()
    left = [r for r, done in zip(running, finishing) if not done]
    bs, paged = engine.block_size, engine.allocation == "paged"
    context = high = 0
    low = None
    for request in left:
        computed = request.num_computed_tokens
        if low is None or computed < low:
            low = computed
        if computed > high:
            high = computed
        if paged and computed % bs == 0:
            request.block_ids.extend(kv.pool.get_new_blocks(1))
        if request.num_tokens == request.num_prompt_tokens:
            request.first_token_s = end_k  # k = 0: batch 0 ended its prefill
        request.num_computed_tokens = computed + 1
        request.num_tokens += 1  # batch k's token
        request.num_in_flight_tokens = 1  # batch k + 1's
        context += computed + 1
    num_left = len(left)
    out.scheduled = [(r, 1) for r in left]
    out.samples = [True] * num_left
    out.batch = decode_batch(num_left, context, low + 1, high + 1)
    if engine.recorder is not None:
        engine.recorder.decode_steps(left, 1)
    num_waiting = len(scheduler.waiting)
    end = end_k + checked_s(engine.cost, engine.cost.step_s(out.batch), num_left)
    caching = kv.enable_caching
    for request, done in zip(running, finishing):
        if caching:
            kv.cache_blocks(request, request.num_computed_tokens - (not done))
        if done:
            if request.num_tokens == request.num_prompt_tokens:
                request.first_token_s = end_k
            request.num_tokens += 1  # its last token
            request.num_in_flight_tokens = request.num_output_placeholders = 0
            request.status = FINISHED
            kv.free(request)
            engine.finished(request, end_k)
    scheduler.running = left
    scheduler.has_finished = True
    engine.now_s = end_k  # it waited for batch k's output
    engine.steps.append(start_k, end_k, batch_k.batch.num_scheduled_tokens, running_k, waiting_k, kv.num_held, context)
    if engine.reserving:
        engine.record_split(scheduler.waiting[0] if scheduler.waiting else None)
    queue.append((out, end_k, end, num_running, num_waiting, True))
    return end


def apply_async(engine, queue, k: int, times: list[float], phases, num_kv_tokens: int, out) -> None:
    """Advance the asynchronous engine k iterations of a decode run; record batches 0..k-1; queue batch k."""
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    running = scheduler.running
    num_running = len(running)
    in_flight, start0, end0, running0, waiting0, _ = queue.popleft()
    held = take_blocks(engine, k, phases)
    split = split_before(engine) if engine.reserving else None
    low = high = running[0].num_computed_tokens + k
    for request in running:
        if request.num_tokens == request.num_prompt_tokens:
            request.first_token_s = end0  # its prefill's last chunk was in batch 0
        computed = request.num_computed_tokens = request.num_computed_tokens + k
        request.num_tokens += k
        request.num_in_flight_tokens = 1  # batch k's token
        if computed < low:
            low = computed
        elif computed > high:
            high = computed
    if kv.enable_caching:
        for request in running:
            kv.cache_blocks(request, request.num_computed_tokens - 1)  # all but the token in flight settled
    kv_tokens = list(range(num_kv_tokens + num_running, num_kv_tokens + (k + 1) * num_running, num_running))
    # Arrivals join at iteration j's add_arrivals (clock times[j - 2], j >= 2) behind a refused head.
    arrival, i, num_arrivals = engine.arrival_list, engine.next_arrival, len(engine.arrival_list)
    waiting = len(scheduler.waiting)
    last_clock = times[k - 2] if k >= 2 else engine.now_s
    if i == num_arrivals or arrival[i] > last_clock:  # nobody joins: batches 1..k count the same
        later = waiting
    else:
        later = [waiting0]  # batch j's count, j = 0..k
        for j in range(1, k + 1):
            clock = engine.now_s if j == 1 else times[j - 2]
            while i < num_arrivals and arrival[i] <= clock:
                i += 1
                waiting += 1
            later.append(waiting)
    engine.now_s = last_clock
    engine.add_arrivals()  # those that joined, in arrival order
    engine.now_s = times[k - 1]  # it waited for batch k - 1
    if running0 == num_running and in_flight.batch.num_scheduled_tokens == num_running:
        if isinstance(later, int):
            engine.steps.extend(
                [start0, *times[:k]],
                num_running,
                later if later == waiting0 else [waiting0] + [later] * (k - 1),
                held,
                kv_tokens,
            )
        else:
            engine.steps.extend([start0, *times[:k]], num_running, later[:k], held, kv_tokens)
    else:  # batch 0 admitted or ended prefills, or skipped requests that finished with the batch before it
        engine.steps.append(
            start0, times[0], in_flight.batch.num_scheduled_tokens, running0, waiting0, held[0], kv_tokens[0]
        )
        if k > 1:
            engine.steps.extend(
                times[:k], num_running, later if isinstance(later, int) else later[1:k], held[1:], kv_tokens[1:]
            )
    num_waiting_k = later if isinstance(later, int) else later[k]
    if split is not None:  # batch j's record is read at its output, when the waiting count is batch j + 1's
        add_split(engine, split, [later] * k if isinstance(later, int) else later[1 : k + 1])
    if engine.recorder is not None:
        engine.recorder.decode_steps(running, k)
    scheduler.has_finished = False
    out.scheduled = [(r, 1) for r in running]
    out.samples = [True] * num_running
    out.batch = decode_batch(num_running, kv_tokens[-1], low, high)  # batch k: context = computed
    queue.append((out, times[k - 1], times[k], num_running, num_waiting_k, True))
