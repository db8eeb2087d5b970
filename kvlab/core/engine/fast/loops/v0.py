"""The compiled loop of vLLM 0.1.4's scheduler (kvlab.core.engine.scheduler_v0) over paged blocks or the vLLM paper's
Orca reservations (kvlab.core.engine.reservation, placed by the buddy allocator of kvlab.core.buddy).

loop_v0 is Engine.run's loop (kvlab/core/engine/engine_core.py's run_sync, compiled with loops/engine.py's bindings and the
few of its own below) with SchedulerV0.schedule, account and update_from_output over the arrays of fast/arrays.py (req:
Requests; cfg: Limits; orca: Reservations), step by step (no decode runs: a step costs a few nanoseconds a request
here). Its schedule() is the reference's (kvlab.core.engine.scheduler_v0.schedule, with
scheduler.py's preempt and account), its update_from_output scheduler.py's, both compiled from their source with the
KV-cache manager's calls bound to the functions here; its records are scheduler.record's, and for a reservation pool each step's Fig. 2 counts besides. The buddy allocator here
keeps, per slot, the order of the free chunk starting there and, per order, how many are free: the same chunks as
kvlab.core.buddy's sets and heaps (the lowest-addressed free chunk of the smallest order that has one, split into
halves; a freed chunk merged with its free buddies inside its arena). tests/test_compiled.py holds the two engines to
the same results, bit for bit.
"""

from kvlab.core.engine import engine_core
from kvlab.core.engine import scheduler as python_scheduler
from kvlab.core.engine import scheduler_v0 as python_scheduler_v0
from kvlab.core.engine.fast.arrays import V0Cache
from kvlab.core.engine.fast.loops import engine as loops_engine
from kvlab.core.engine.fast.loops import scheduler as loops_scheduler
from kvlab.core.engine.fast.loops.jit import (
    FINISHED,
    RULES,
    admission_num_new_blocks,
    compiled_from,
    inline,
    num_blocks_to_allocate,
)
from kvlab.core.engine.fast.loops.scheduler import record

watermark_admits = RULES["watermark_admits"]
FREE_SLOTS, ROUNDING, FINAL_TOKENS = range(3)  # Reservations.counters


# ---------------------------------------------------------------- the buddy allocator (kvlab.core.buddy)
@inline
def chunk_order(size_tokens):
    """buddy.chunk_order: the smallest k with 2 ** k >= size_tokens."""
    k = 0
    while (1 << k) < size_tokens:
        k += 1
    return k


@inline
def can_allocate(orca, size_tokens):
    """BuddyAllocator.can_allocate: a free chunk of the order size_tokens needs or larger."""
    chunks = orca.num_free_chunks
    for j in range(chunk_order(size_tokens), chunks.shape[0]):
        if chunks[j]:
            return True
    return False


@inline
def free_slots_below(orca, size_tokens):
    """BuddyAllocator.free_slots_below: free slots in chunks of a lower order than size_tokens needs."""
    chunks = orca.num_free_chunks
    top = chunk_order(size_tokens)
    top = top if top < chunks.shape[0] else chunks.shape[0]
    total = 0
    for j in range(top):
        total += chunks[j] << j
    return total


@inline
def allocate_chunk(orca, size_tokens):
    """BuddyAllocator.allocate: the offset of the lowest-addressed free chunk of the smallest order that has one,
    split down to size_tokens' order (the upper halves freed), or -1 when none is large enough."""
    chunks, free_at, counters = orca.num_free_chunks, orca.free_at, orca.counters
    order = chunk_order(size_tokens)
    found = order
    while found < chunks.shape[0] and chunks[found] == 0:
        found += 1
    if found >= chunks.shape[0]:  # none large enough (an order above the largest arena's too)
        return -1
    offset = 0
    size = 1 << found
    while free_at[offset] != found:  # chunks of an order lie at multiples of their size
        offset += size
    free_at[offset] = -1
    chunks[found] -= 1
    while found > order:
        found -= 1
        free_at[offset + (1 << found)] = found
        chunks[found] += 1
    counters[FREE_SLOTS] -= 1 << order
    counters[ROUNDING] += (1 << order) - size_tokens
    return offset


@inline
def free_chunk(orca, offset, size_tokens):
    """BuddyAllocator.free: give back the chunk at offset (asked for size_tokens), merged with its free buddies up to
    its arena's order."""
    chunks, free_at, counters = orca.num_free_chunks, orca.free_at, orca.counters
    order = chunk_order(size_tokens)
    counters[FREE_SLOTS] += 1 << order
    counters[ROUNDING] -= (1 << order) - size_tokens
    a = 0
    while a + 1 < orca.arena_start.shape[0] and orca.arena_start[a + 1] <= offset:
        a += 1
    top = orca.arena_order[a]
    while order < top:
        buddy = offset ^ (1 << order)
        if free_at[buddy] != order:
            break
        free_at[buddy] = -1
        chunks[order] -= 1
        offset &= ~(1 << order)
        order += 1
    free_at[offset] = order
    chunks[order] += 1


# ---------------------------------------------------------------- schedule(), compiled from the reference's source
# kvlab.core.engine.scheduler_v0's schedule and can_admit (with scheduler.py's preempt and account), compiled
# (jit.compiled_from) with the calls each side binds to its own bound to loops.scheduler's (a request's record, the
# queues, the batch) and to the functions below over arrays.V0Cache: a count of free blocks (paged) or the
# reservations' buddy arenas.


@inline
def prompt_fits(cfg, kv, request):
    """Blocks for all of request's tokens leave watermark_blocks free (paged), or a buddy chunk for its reservation
    is free."""
    orca = kv.orca
    if not orca.paged:
        return can_allocate(orca, orca.reserve[request.request_id])
    return watermark_admits(request.num_tokens, kv.num_free[0], orca.watermark_blocks, kv.block_size, cfg.max_model_len)


@inline
def needs_free_block(kv):
    """A decode needs a free block and none is (paged; a reservation holds every slot its decodes write)."""
    return kv.orca.paged and kv.num_free[0] < 1


@inline
def allocate_admitted(kv, requests, r, num_new_tokens, hits):
    """Request r's blocks for all its tokens (paged), or its reservation's chunk (the buddy's lowest-addressed of the
    smallest order that fits); can_admit checked that they are free."""
    orca = kv.orca
    if orca.paged:
        new = admission_num_new_blocks(num_new_tokens, 0, 0, num_new_tokens, kv.num_free[0], kv.block_size,
                                       kv.max_model_len)  # fmt: skip
        kv.num_free[0] -= new
        requests.num_blocks[r] += new
    else:
        orca.chunk_offset[r] = allocate_chunk(orca, orca.reserve[r])
        orca.counters[FINAL_TOKENS] += requests.max_num_tokens[r]
    return True


@inline
def allocate_slots(kv, requests, r, num_new_tokens):
    """A decode's block, where its token opens one (paged); a reservation's slots are held."""
    if kv.orca.paged:
        new = num_blocks_to_allocate(requests.num_computed_tokens[r], num_new_tokens, requests.num_blocks[r],
                                     kv.block_size, kv.max_model_len)  # fmt: skip
        if new > 0:
            kv.num_free[0] -= new
            requests.num_blocks[r] += new
    return True


SHARED_V0 = compiled_from(
    (python_scheduler_v0.schedule, python_scheduler_v0.can_admit, python_scheduler.preempt_latest, python_scheduler.preempt,
     python_scheduler.account),
    {
        **{name: getattr(loops_scheduler, name) for name in (
            "request_of", "pop_running", "append_running", "waiting_front", "pop_waiting", "push_waiting_front",
            "free_blocks", "add_scheduled", "add_preempted", "add_admitted", "scheduled", "set_sample", "set_batch",
        )},
        "prompt_fits": prompt_fits, "needs_free_block": needs_free_block, "allocate_admitted": allocate_admitted,
        "allocate_slots": allocate_slots,
    },
)  # fmt: skip
shared_schedule_v0 = SHARED_V0["schedule"]


# ---------------------------------------------------------------- the loop
# engine_core.run_sync, compiled with loops.engine's bindings but these: no runs at once (a step costs a few nanoseconds a
# request here), SchedulerV0's schedule(), a reservation's chunk freed when its request finishes, and its records.


@inline
def run_at_once(engine, loop):
    """None here: step by step."""
    return False


@inline
def schedule_batch(engine, loop):
    """SchedulerV0.schedule() (scheduler_v0.schedule, compiled: SHARED_V0) into slot 0. Returns (the batch, its
    requests, tokens, preemptions, 0 prompt tokens hit)."""
    cfg, pool = engine.cfg, engine.pool
    kv = V0Cache(cfg.block_size, 0, cfg.max_model_len, pool, engine.groups, pool.num_free_blocks, engine.orca)
    kv.num_free[0] = loop.num_free_blocks
    out = loops_engine.batch_out(engine, 0, loop.now_s)
    num_reqs, num_preempted, num_tokens, nrun, head, nwait = shared_schedule_v0(
        cfg, kv, engine.req, engine.running, loop.num_running, engine.waiting, loop.waiting_head, loop.num_waiting, out
    )
    loop.num_running, loop.waiting_head, loop.num_waiting, loop.num_free_blocks = nrun, head, nwait, kv.num_free[0]
    return out, num_reqs, num_tokens, num_preempted, 0


@inline
def update_batch(engine, loop, out, num_reqs, end_s):
    """loops.engine.update_batch; then ReservationManager.free: each finished request's chunk, in batch order."""
    num_finished_tokens = loops_engine.update_batch(engine, loop, out, num_reqs, end_s)
    orca, req = engine.orca, engine.req
    if not orca.paged:
        for j in range(num_reqs):
            r = out.req_ids[j]
            if req.status[r] == FINISHED:
                free_chunk(orca, orca.chunk_offset[r], orca.reserve[r])
                orca.counters[FINAL_TOKENS] -= req.max_num_tokens[r]
    return num_finished_tokens


@inline
def record_step(engine, loop, start_s, end_s, num_tokens, num_running, num_waiting, num_preempted, num_hit_tokens):
    """StepLog.append for the step (scheduler.record): blocks held (paged) or token slots reserved; a reservation
    pool's Fig. 2 counts besides (ReservationManager.record_split against the waiting queue's head)."""
    orca, counts, split = engine.orca, engine.counts, engine.split
    s = counts[0]
    held = (
        engine.cfg.num_usable_blocks - loop.num_free_blocks
        if orca.paged
        else orca.num_slots - orca.counters[FREE_SLOTS]
    )
    record(loop.num_steps, start_s, end_s, loop.last_end_s, num_preempted, num_hit_tokens, num_tokens, num_running,
           num_waiting, held, loop.num_kv_tokens, engine.logs, engine.events, counts)  # fmt: skip
    loop.last_end_s = end_s
    if not orca.paged:
        split[0][s] = orca.counters[FINAL_TOKENS]
        split[1][s] = orca.counters[ROUNDING]
        split[2][s] = free_slots_below(orca, orca.reserve[engine.waiting[loop.waiting_head]]) if loop.num_waiting else 0


LOOP_V0 = compiled_from(
    (engine_core.next_step,),
    loops_engine.BINDINGS
    | {"run_at_once": run_at_once, "schedule_batch": schedule_batch, "update_batch": update_batch,
       "record_step": record_step},
    (engine_core.run_sync,),
    "_v0",
)  # fmt: skip
loop_v0 = LOOP_V0["run_sync"]  # as loops.engine.loop_sync (engine.pool and engine.groups: placeholders)
