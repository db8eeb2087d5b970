"""The engine's time loop, written once: vLLM's EngineCore (vllm/v1/engine/core.py) stepping its scheduler in simulated
time, synchronous (EngineCore.step: run_sync) or behind a batch queue of two (step_with_batch_queue: run_async).
Engine.run calls them (kvlab/core/engine/engine.py's docstring says how time moves), with itself as the engine and as
the loop's state, and the bindings below; the compiled loops (fast/loops/engine.py, v0.py) compile them from this
source, as they do the scheduler's."""

from __future__ import annotations

import math

from kvlab.core.cost import checked_s
from kvlab.core.engine.records import DONE, FULL, NO_PROGRESS, PAUSED, STEP

# The Python engine calls run_sync and run_async with itself as the engine and as the loop's state (loop: now_s,
# next_arrival, num_kv_tokens, num_decode_runs, gpu_free_s, num_empty) and with the bindings after them; the compiled
# loops compile them from this source (jit.compiled_from), the engine the named arrays (arrays.Arrays), the loop's state
# a record of the same names (arrays.LOOP_STATE) and the bindings bound to their own. A compiled loop also stops when
# its chunk of step records is full (FULL), to go on where it stopped.


def run_sync(engine, loop):
    """Engine.run's loop, synchronous: the requests that have arrived join the waiting queue (with nothing running or
    waiting the clock jumps to the next arrival); then a run of steps at once where nothing can change (run_at_once),
    or one step: schedule, its cost, update_from_output at its end, its record. Returns DONE (every request
    finished), FULL (a compiled loop's chunk of records is full), NO_PROGRESS (a step scheduled nothing) or PAUSED
    (the clock reached the engine's until_s before the requests arrived by then joined: a fleet's instance, whose
    router has yet to route them)."""
    engine = started(engine)
    while True:
        code = next_step(engine, loop)
        if code != STEP:
            return code
        if run_at_once(engine, loop):
            loop.num_decode_runs += 1
            continue
        start_s = loop.now_s
        out, num_reqs, num_tokens, num_preempted, num_hit_tokens = schedule_batch(engine, loop)
        if num_tokens == 0:
            if await_transfers(engine, loop):
                continue  # a KV connector's transfer ended: its request may run now
            return NO_PROGRESS
        end_s = start_s + batch_s(engine, out, num_tokens)
        loop.now_s = end_s  # the outputs below are processed at the step's end
        num_running, num_waiting = queue_lengths(engine, loop)
        if num_preempted:
            num_kv_tokens = running_kv_tokens(engine, loop)
        else:
            num_kv_tokens = loop.num_kv_tokens + num_tokens + num_hit_tokens
        loop.num_kv_tokens = num_kv_tokens - update_batch(engine, loop, out, num_reqs, end_s)
        record_step(engine, loop, start_s, end_s, num_tokens, num_running, num_waiting, num_preempted, num_hit_tokens)


def next_step(engine, loop):
    """run_sync up to its next step: the requests that have arrived join the waiting queue; with nothing running or
    waiting the clock jumps to the next arrival (idle_until). Returns STEP, DONE (every request finished), FULL or
    PAUSED."""
    while True:
        if paused(engine, loop):
            return PAUSED
        add_arrivals(engine, loop)
        num_running, num_waiting = queue_lengths(engine, loop)
        if num_running or num_waiting:
            return FULL if records_full(engine) else STEP
        if loop.next_arrival == num_requests(engine):
            return DONE
        loop.now_s = idle_until(engine, arrival_s_of(engine, loop.next_arrival))


def run_async(engine, loop):
    """Engine.run's loop, asynchronous (kvlab/core/engine/engine.py's docstring): each engine step, the requests that have arrived join
    the waiting queue; then a run of iterations at once where nothing can change (run_at_once_async), or, if the
    scheduler has requests, a batch scheduled and queued (it runs from the clock or the end of the batch before it,
    for its cost), returning at once while fewer than two are queued; otherwise the oldest batch's output is awaited
    and processed (update_from_output at its end, its record if it ran tokens or preempted). With requests unfinished
    and no tokens queued, two schedule() calls in a row that scheduled nothing mean nothing can change before the next
    arrival: the clock jumps to it. Returns as run_sync does."""
    engine = started(engine)
    n = num_requests(engine)
    while True:
        if paused(engine, loop):
            return PAUSED
        add_arrivals(engine, loop)
        if records_full(engine):
            return FULL
        if run_at_once_async(engine, loop):
            loop.num_decode_runs += 1
            continue
        if has_requests(engine, loop):
            out, num_reqs, num_tokens, num_preempted, num_hit_tokens = schedule_batch(engine, loop)
            start_s = loop.now_s if loop.now_s > loop.gpu_free_s else loop.gpu_free_s
            end_s = start_s + batch_s(engine, out, num_tokens) if num_tokens else start_s
            loop.gpu_free_s = end_s
            queue_batch(engine, loop, out, num_reqs, num_tokens, num_preempted, num_hit_tokens, start_s, end_s)
            loop.num_empty = 0 if num_tokens else loop.num_empty + 1
            num_running, num_waiting = queue_lengths(engine, loop)
            if loop.num_empty >= 2 and (num_running or num_waiting) and queued_tokens(engine, loop) == 0:
                if loop.next_arrival == n or arrival_s_of(engine, loop.next_arrival) == math.inf:
                    return NO_PROGRESS  # (a closed loop's next send waits for a finish)
                loop.now_s = arrival_s_of(engine, loop.next_arrival)  # nothing changes before it arrives
                loop.num_empty = 0
            if num_queued(engine, loop) < 2 and (num_tokens or has_requests(engine, loop)):
                continue
        elif num_queued(engine, loop) == 0:
            if loop.next_arrival == n:
                return DONE
            loop.now_s = idle_until(engine, arrival_s_of(engine, loop.next_arrival))  # idle: the next arrival
            continue
        out, num_reqs, num_tokens, num_preempted, num_hit_tokens, start_s, end_s, num_running, num_waiting = pop_batch(
            engine, loop
        )
        if end_s > loop.now_s:
            loop.now_s = end_s  # wait for the oldest batch's output
        update_batch(engine, loop, out, num_reqs, end_s)
        if num_tokens or num_preempted:  # a step of the records: it ran tokens or preempted
            loop.num_kv_tokens = running_kv_tokens(engine, loop)
            record_step(engine, loop, start_s, end_s, num_tokens, num_running, num_waiting, num_preempted,
                        num_hit_tokens)  # fmt: skip


# ---------------------------------------------------------------- the Python engine's side of them
def started(engine):
    """The engine the loop runs on: this one (a compiled loop's: its arrays as views that own no reference, its chunk of
    step records empty)."""
    return engine


def paused(engine, loop) -> bool:
    """Whether the clock has reached the engine's until_s (inf but for a fleet's instance: kvlab.core.fleet)."""
    return loop.now_s >= engine.until_s


def add_arrivals(engine, loop) -> None:
    """Engine.add_arrivals, where a request has arrived."""
    arrival_s = engine.arrival_list
    if loop.next_arrival < len(arrival_s) and arrival_s[loop.next_arrival] <= loop.now_s:
        engine.add_arrivals()


def queue_lengths(engine, loop) -> tuple:
    """The running list's and the waiting queue's lengths (with a KV connector, both its queues)."""
    scheduler = engine.scheduler
    return len(scheduler.running), scheduler.num_waiting()


def await_transfers(engine, loop) -> bool:
    """A step that scheduled nothing with a KV connector (kv_connector.py). One that preempted (its only request, while
    others held blocks) is a step of the records, in no time, its output processed at once, and the next follows;
    else, while transfers are under way, the clock goes to the first of the next transfer's end and the next arrival,
    where the worker reports what ended; a fleet's instance with none under way waits for its fleet (until_s: another
    instance may start a read of its blocks). False otherwise: no progress (no connector: never)."""
    scheduler = engine.scheduler
    connector = scheduler.connector
    if connector is None:
        return False
    if scheduler.num_preempted:
        scheduler.transfers_done(loop.now_s)
        num_running, num_waiting = queue_lengths(engine, loop)
        loop.num_kv_tokens = running_kv_tokens(engine, loop)
        record_step(engine, loop, loop.now_s, loop.now_s, 0, num_running, num_waiting, scheduler.num_preempted, 0)
        return True
    if connector.next_event_s() == math.inf:
        if engine.until_s == math.inf:
            return False
        loop.now_s = max(loop.now_s, engine.until_s)  # a fleet's instance: others may yet start its reads
        return True
    end_s = min(connector.next_event_s(), engine.until_s)  # (a fleet's instance: no further than its fleet allows)
    if loop.next_arrival < num_requests(engine):
        end_s = min(end_s, arrival_s_of(engine, loop.next_arrival))
    loop.now_s = max(loop.now_s, end_s)
    scheduler.transfers_done(loop.now_s)
    return True


def has_requests(engine, loop) -> bool:
    """The scheduler's has_requests()."""
    return engine.scheduler.has_requests()


def records_full(engine) -> bool:
    """The Python engine's records never fill."""
    return False


def num_requests(engine) -> int:
    """The workload's requests."""
    return len(engine.arrival_list)


def arrival_s_of(engine, i: int) -> float:
    """Request i's arrival (a closed loop: its send, inf until a finish frees its slot)."""
    return engine.arrival_list[i]


def idle_until(engine, arrival_s: float) -> float:
    """Engine.idle_until."""
    return engine.idle_until(arrival_s)


def run_at_once(engine, loop) -> bool:
    """None: the Python engine steps one at a time (the compiled loops bind their decode runs here)."""
    return False


def run_at_once_async(engine, loop) -> bool:
    """None: as run_at_once."""
    return False


def schedule_batch(engine, loop) -> tuple:
    """The scheduler's schedule(), its admitted requests' first_scheduled_s stamped with the clock and its batch
    recorded where a recorder asks. Returns (the SchedulerOutput, its requests, tokens, preemptions, prompt tokens
    hit in the prefix cache)."""
    out = engine.scheduler.schedule()
    for request in out.admitted:
        if request.first_scheduled_s is None:
            request.first_scheduled_s = loop.now_s
    num_tokens = out.batch.num_scheduled_tokens
    if engine.recorder is not None and (num_tokens or out.preempted):
        engine.recorder.step(out)
    return out, len(out.scheduled), num_tokens, len(out.preempted), out.num_hit_tokens


def batch_s(engine, out, num_tokens: int) -> float:
    """Seconds the step cost gives the batch of a SchedulerOutput (refused below 0 s: cost.checked_s)."""
    cost = engine.cost
    return checked_s(cost, cost.step_s(out.batch), num_tokens)


def running_kv_tokens(engine, loop) -> int:
    """The running requests' computed tokens."""
    return sum(r.num_computed_tokens for r in engine.scheduler.running)


def update_batch(engine, loop, out, num_reqs: int, end_s: float) -> int:
    """The scheduler's update_from_output for the batch, its first tokens and finishes stamped at its end. Returns the
    computed tokens of the requests that finished."""
    first_tokens, finished = engine.scheduler.update_from_output(out)
    for request in first_tokens:
        request.first_token_s = end_s
    num_finished_tokens = 0
    for request in finished:
        num_finished_tokens += request.num_computed_tokens
        engine.finished(request, end_s)
    return num_finished_tokens


def record_step(engine, loop, start_s, end_s, num_tokens, num_running, num_waiting, num_preempted, num_hit_tokens):
    """StepLog.append for the step; a reservation pool's Fig. 2 counts besides (record_split)."""
    engine.steps.append(start_s, end_s, num_tokens, num_running, num_waiting, engine.kv_cache_manager.num_held,
                        loop.num_kv_tokens, num_preempted, num_hit_tokens)  # fmt: skip
    if engine.reserving:
        waiting = engine.scheduler.waiting
        engine.record_split(waiting[0] if waiting else None)


def queue_batch(engine, loop, out, num_reqs, num_tokens, num_preempted, num_hit_tokens, start_s, end_s) -> None:
    """A scheduled batch joins the batch queue, with the running and waiting requests after its schedule()."""
    scheduler = engine.scheduler
    engine.batch_queue.append((out, start_s, end_s, len(scheduler.running), len(scheduler.waiting)))


def num_queued(engine, loop) -> int:
    """The batches queued."""
    return len(engine.batch_queue)


def queued_tokens(engine, loop) -> int:
    """The tokens of the batches queued."""
    return sum(batch[0].batch.num_scheduled_tokens for batch in engine.batch_queue)


def pop_batch(engine, loop) -> tuple:
    """The oldest queued batch: (its SchedulerOutput, requests, tokens, preemptions, prompt tokens hit, start_s, end_s,
    and the running and waiting requests after its schedule())."""
    out, start_s, end_s, num_running, num_waiting = engine.batch_queue.popleft()
    batch = out.batch
    return (out, len(out.scheduled), batch.num_scheduled_tokens, len(out.preempted), out.num_hit_tokens, start_s,
            end_s, num_running, num_waiting)  # fmt: skip
