"""The compiled loops of vLLM 0.33's engine: Engine.run's loop, synchronous (loop_sync) and asynchronous behind a batch
queue of two (loop_async), compiled from the reference's own source (kvlab/core/engine/engine_core.py's run_sync, next_step
and run_async) with the calls each side binds to its own bound to the functions here: the engine is arrays.Arrays,
the loop's state a record (arrays.LOOP_STATE), a batch is scheduled into the batch queue's next slot (slot 0 when
synchronous) and the runs of steps at once are step_runs.py's. A loop stops when every request finished (DONE), its
chunk of step records is full (FULL) or nothing can progress (NO_PROGRESS)."""

import math

from kvlab.core.engine import engine_core
from kvlab.core.engine.fast.arrays import BatchOut
from kvlab.core.engine.fast.loops.clock import step_s
from kvlab.core.engine.fast.loops.jit import compiled_from, inline, unowned
from kvlab.core.engine.fast.loops.scheduler import (
    arrive,
    kv_cache,
    record,
    shared_schedule,
    shared_update_from_output,
)
from kvlab.core.engine.fast.loops.step_runs import decode_run
from kvlab.core.engine.records import DONE, FULL, NO_PROGRESS, PAUSED, STEP


# ---------------------------------------------------------------- the time loop's calls, over the arrays
@inline
def started(engine):
    """The engine's arrays taken unowned (jit.unowned: the caller holds them); the chunk's step records go on from
    engine.counts (the caller empties the chunk once it has kept its records: compiled.CompiledRun.keep_records)."""
    return unowned(engine)


@inline
def paused(engine, loop):
    """Whether the clock has reached loop.until_s (inf but for a fleet's instance)."""
    return loop.now_s >= loop.until_s


@inline
def add_arrivals(engine, loop):
    """Engine.add_arrivals (scheduler.arrive) into the waiting ring."""
    loop.next_arrival, loop.num_waiting = arrive(
        engine.req.arrival_s, loop.now_s, loop.next_arrival, engine.waiting, loop.waiting_head, loop.num_waiting
    )


@inline
def queue_lengths(engine, loop):
    """The running list's and the waiting ring's lengths."""
    return loop.num_running, loop.num_waiting


@inline
def has_requests(engine, loop):
    """The scheduler's has_requests(): a request runs or waits, or one finished since the last schedule()."""
    return loop.num_running > 0 or loop.num_waiting > 0 or loop.has_finished > 0


@inline
def records_full(engine):
    """Whether the chunk's step records are full."""
    return engine.counts[0] == engine.logs[0].shape[0]


@inline
def num_requests(engine):
    """The workload's requests."""
    return engine.req.arrival_s.shape[0]


@inline
def arrival_s_of(engine, i):
    """Request i's arrival (a closed loop: its send, inf until a finish frees its slot)."""
    return engine.req.arrival_s[i]


@inline
def idle_until(engine, arrival_s):
    """The next arrival."""
    return arrival_s


@inline
def runs_at_once(cfg):
    """Whether the loop does runs of steps at once: cfg.decode_runs, without prefix caching."""
    return cfg.decode_runs != 0 and cfg.enable_caching == 0


@inline
def run_at_once(engine, loop, lag=0):
    """A decode run (step_runs.decode_run; lag 1: asynchronous, from the one batch in flight), its steps recorded;
    False (nothing changed) if there is none."""
    slot = loop.queue_head
    if not runs_at_once(engine.cfg) or (lag and not (loop.queue_len == 1 and engine.queue_i[slot, 6])):
        return False
    at = (engine.cfg, engine.cost, engine.req, engine.running, loop.num_running, engine.waiting, loop.waiting_head,
          loop.num_waiting, loop.next_arrival, loop.num_free_blocks, loop.now_s, loop.last_end_s, engine.queue_r,
          engine.queue_n, engine.queue_sample, engine.queue_i, engine.queue_f, slot, engine.phases, engine.per_phase,
          loop.num_steps, engine.logs, engine.events, engine.counts, engine.groups, loop.until_s)  # fmt: skip
    # (one tuple: numba inlines no call with *args)
    steps, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s, gpu_free_s = decode_run(at, engine.times, lag)
    if not steps:
        return False
    loop.next_arrival, loop.num_waiting, loop.num_free_blocks, loop.num_running = nxt, nwait, num_free_blocks, nrun
    loop.num_kv_tokens, loop.now_s, loop.last_end_s = kv, now_s, last_end_s
    if lag:
        loop.gpu_free_s, loop.has_finished = gpu_free_s, 0
    return True


@inline
def run_at_once_async(engine, loop):
    """run_at_once, asynchronous."""
    return run_at_once(engine, loop, 1)


@inline
def batch_out(engine, slot, time_s):
    """The batch queue's slot as the shared functions read a batch (arrays.BatchOut), stamped at time_s."""
    return BatchOut(engine.queue_r[slot], engine.queue_n[slot], engine.queue_sample[slot], engine.acc, time_s)


@inline
def schedule_batch(engine, loop):
    """Scheduler.schedule() (kvlab/core/engine/scheduler.py's schedule, compiled: SHARED) into the batch queue's next
    slot, the rest of its Batch in engine.acc where the clock reads it. Returns (the batch, its requests, tokens,
    preemptions, prompt tokens hit in the prefix cache)."""
    cfg = engine.cfg
    out = batch_out(engine, (loop.queue_head + loop.queue_len) % 2, loop.now_s)
    kv = kv_cache(cfg, engine.pool, engine.groups, loop.num_free_blocks)
    num_reqs, num_preempted, num_tokens, num_hit_tokens, nrun, head, nwait = shared_schedule(
        cfg, kv, engine.req, engine.running, loop.num_running, engine.waiting, loop.waiting_head, loop.num_waiting,
        out, engine.cost.kind >= 2,
    )  # fmt: skip
    loop.num_running, loop.waiting_head, loop.num_waiting, loop.num_free_blocks = nrun, head, nwait, kv.num_free[0]
    loop.has_finished = 0
    return out, num_reqs, num_tokens, num_preempted, num_hit_tokens


@inline
def batch_s(engine, out, num_tokens):
    """The batch's seconds (clock.step_s)."""
    return step_s(engine.cost, num_tokens, out.acc)


@inline
def running_kv_tokens(engine, loop):
    """The running requests' computed tokens."""
    num_computed_tokens, running = engine.req.num_computed_tokens, engine.running
    total = 0
    for j in range(loop.num_running):
        total += num_computed_tokens[running[j]]
    return total


@inline
def update_batch(engine, loop, out, num_reqs, end_s):
    """Scheduler.update_from_output (kvlab/core/engine/scheduler.py's, compiled: SHARED) for the batch, its first tokens
    and finishes stamped at end_s. Returns the computed tokens of the requests that finished."""
    cfg = engine.cfg
    kv = kv_cache(cfg, engine.pool, engine.groups, loop.num_free_blocks)
    out = BatchOut(out.req_ids, out.num_new_tokens, out.samples, out.acc, end_s)
    _, num_finished, num_finished_tokens, nrun, nwait = shared_update_from_output(
        cfg, kv, engine.req, out, num_reqs, engine.running, loop.num_running, engine.waiting, loop.waiting_head,
        loop.num_waiting,
    )  # fmt: skip
    loop.num_free_blocks, loop.num_running, loop.num_waiting = kv.num_free[0], nrun, nwait
    if num_finished:
        loop.has_finished = 1
    return num_finished_tokens


@inline
def record_step(engine, loop, start_s, end_s, num_tokens, num_running, num_waiting, num_preempted, num_hit_tokens):
    """StepLog.append for the step (scheduler.record)."""
    record(loop.num_steps, start_s, end_s, loop.last_end_s, num_preempted, num_hit_tokens, num_tokens, num_running,
           num_waiting, engine.cfg.num_usable_blocks - loop.num_free_blocks, loop.num_kv_tokens, engine.logs,
           engine.events, engine.counts)  # fmt: skip
    loop.last_end_s = end_s


@inline
def queue_batch(engine, loop, out, num_reqs, num_tokens, num_preempted, num_hit_tokens, start_s, end_s):
    """The batch scheduled into the queue's next slot is queued, with its counts, the running and waiting requests
    after its schedule() and its start and end."""
    slot = (loop.queue_head + loop.queue_len) % 2
    queue_i, queue_f = engine.queue_i, engine.queue_f
    queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2] = num_reqs, num_tokens, loop.num_running
    queue_i[slot, 3], queue_i[slot, 4], queue_i[slot, 5] = loop.num_waiting, num_preempted, num_hit_tokens
    queue_i[slot, 6] = num_tokens and not num_preempted and not num_hit_tokens  # a decode run may start from it
    queue_f[slot, 0], queue_f[slot, 1] = start_s, end_s
    loop.queue_len += 1


@inline
def num_queued(engine, loop):
    """The batches queued."""
    return loop.queue_len


@inline
def queued_tokens(engine, loop):
    """The tokens of the batches queued."""
    total = 0
    for j in range(loop.queue_len):
        total += engine.queue_i[(loop.queue_head + j) % 2, 1]
    return total


@inline
def pop_batch(engine, loop):
    """The oldest queued batch: (the batch, its requests, tokens, preemptions, prompt tokens hit, start_s, end_s, and
    the running and waiting requests after its schedule())."""
    slot = loop.queue_head
    loop.queue_head = (slot + 1) % 2
    loop.queue_len -= 1
    queue_i, queue_f = engine.queue_i, engine.queue_f
    return (batch_out(engine, slot, queue_f[slot, 1]), queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 4],
            queue_i[slot, 5], queue_f[slot, 0], queue_f[slot, 1], queue_i[slot, 2], queue_i[slot, 3])  # fmt: skip


@inline
def await_transfers(engine, loop):
    """No KV connector in the compiled loops (the Python engine serves one): a step that scheduled nothing is no
    progress."""
    return False


BINDINGS = {
    name: globals()[name]
    for name in (
        "started", "paused", "add_arrivals", "queue_lengths", "has_requests", "records_full", "num_requests",
        "arrival_s_of", "idle_until", "run_at_once", "run_at_once_async", "schedule_batch", "batch_s",
        "running_kv_tokens", "update_batch", "record_step", "queue_batch", "num_queued", "queued_tokens", "pop_batch",
        "await_transfers",
    )
} | {"math": math, "STEP": STEP, "DONE": DONE, "FULL": FULL, "NO_PROGRESS": NO_PROGRESS, "PAUSED": PAUSED}  # fmt: skip
LOOPS = compiled_from((engine_core.next_step,), BINDINGS, (engine_core.run_sync, engine_core.run_async), "_v1")
# The loops fast/compiled.py calls, each with the arrays and the loop's state (a LOOP_STATE record) from where it stopped.
loop_sync, loop_async = LOOPS["run_sync"], LOOPS["run_async"]
