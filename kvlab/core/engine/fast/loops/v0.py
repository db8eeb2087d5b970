"""The compiled loop of vLLM 0.1.4's scheduler (kvlab.core.engine.scheduler_v0) over paged blocks or the vLLM paper's
Orca reservations (kvlab.core.engine.reservation, placed by the buddy allocator of kvlab.core.buddy).

loop_v0 is Engine.run's per-step loop with SchedulerV0.schedule, account and update_from_output over the arrays of
fast/arrays.py (req: Requests; cfg: Limits; orca: Reservations), step by step (no decode runs: a step costs a few
nanoseconds a request here). Its schedule() is the reference's (kvlab.core.engine.scheduler_v0.schedule, with
scheduler.py's preempt and account), its update_from_output scheduler.py's, both compiled from their source with the
KV-cache manager's calls bound to the functions here; its records are scheduler.record's, and for a reservation pool each step's Fig. 2 counts besides. The buddy allocator here
keeps, per slot, the order of the free chunk starting there and, per order, how many are free: the same chunks as
kvlab.core.buddy's sets and heaps (the lowest-addressed free chunk of the smallest order that has one, split into
halves; a freed chunk merged with its free buddies inside its arena). tests/test_compiled.py holds the two engines to
the same results, bit for bit.
"""

from kvlab.core.engine import scheduler as python_scheduler
from kvlab.core.engine import scheduler_v0 as python_scheduler_v0
from kvlab.core.engine.fast.arrays import (
    DONE,
    F_CLOCK,
    F_LAST_END,
    NO_PROGRESS,
    S_FREE,
    S_KV_TOKENS,
    S_NEXT_ARRIVAL,
    S_NUM_RUNNING,
    S_NUM_WAITING,
    S_STEPS,
    S_WAITING_HEAD,
    BatchOut,
    V0Cache,
)
from kvlab.core.engine.fast.loops import scheduler as loops_scheduler
from kvlab.core.engine.fast.loops.clock import step_s
from kvlab.core.engine.fast.loops.jit import (
    FINISHED,
    RULES,
    STEP,
    admission_num_new_blocks,
    compiled_from,
    inline,
    njit,
    num_blocks_to_allocate,
    unowned,
)
from kvlab.core.engine.fast.loops.scheduler import (
    next_step,
    record,
    save_state,
    update_sync,
)

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
def prompt_fits(cfg, kv, request, num_blocks_taken):
    """Blocks for all of request's tokens leave watermark_blocks free (paged), or a buddy chunk for its reservation
    is free."""
    orca = kv.orca
    if not orca.paged:
        return can_allocate(orca, orca.reserve[request.request_id])
    num_free = kv.num_free[0] - num_blocks_taken
    return watermark_admits(request.num_tokens, num_free, orca.watermark_blocks, kv.block_size, cfg.max_model_len)


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
@njit
def loop_v0(req, cfg, cost, state, fstate, running, waiting, pool, groups, orca, out_r, out_n, out_sample, logs, events,
            counts, split, acc):  # fmt: skip
    """Engine.run's loop and Engine.step with SchedulerV0 (synchronous, step by step): steps until every request
    finished (DONE), the chunk's step records are filled (FULL) or a step schedules nothing (NO_PROGRESS). split: a
    reservation pool's Fig. 2 counts per step (final tokens, rounding, external fragmentation; StepLog.add_split). pool and
    groups: placeholders (no prefix cache, one full-attention group), for the v1 loop's preempt and release. Every
    array is taken unowned (jit.unowned), as the v1 loops take theirs."""
    req, cost, state, fstate, running, waiting, pool, groups, orca = (
        unowned(req), unowned(cost), unowned(state), unowned(fstate), unowned(running), unowned(waiting), unowned(pool),
        unowned(groups), unowned(orca),
    )  # fmt: skip
    out_r, out_n, out_sample, logs, events, counts, split, acc = (
        unowned(out_r), unowned(out_n), unowned(out_sample), unowned(logs), unowned(events), unowned(counts),
        unowned(split), unowned(acc),
    )  # fmt: skip
    arrival_s, max_num_tokens, status = req.arrival_s, req.max_num_tokens, req.status
    reserve, chunk_offset, counters = orca.reserve, orca.chunk_offset, orca.counters
    usable, paged = cfg.num_usable_blocks, orca.paged
    nxt, num_free_blocks, nrun, head, nwait = (
        state[S_NEXT_ARRIVAL], state[S_FREE], state[S_NUM_RUNNING], state[S_WAITING_HEAD], state[S_NUM_WAITING]
    )  # fmt: skip
    kv, first = state[S_KV_TOKENS], state[S_STEPS]
    now_s, last_end_s = fstate[F_CLOCK], fstate[F_LAST_END]
    capacity = logs[0].shape[0]
    counts[:] = 0
    code = DONE
    while True:
        code, nxt, nwait, now_s = next_step(arrival_s, now_s, nxt, waiting, head, nwait, nrun, capacity, counts)
        if code != STEP:
            break
        kvc = V0Cache(cfg.block_size, 0, cfg.max_model_len, pool, groups, pool.num_free_blocks, orca)
        kvc.num_free[0] = num_free_blocks
        ns, npre, num_scheduled, nrun, head, nwait = shared_schedule_v0(
            cfg, kvc, req, running, nrun, waiting, head, nwait, BatchOut(out_r, out_n, out_sample, acc, now_s)
        )
        num_free_blocks = kvc.num_free[0]
        if num_scheduled == 0:
            code = NO_PROGRESS
            break
        batch_end_s = now_s + step_s(cost, num_scheduled, acc)
        num_running_step = nrun
        num_free_blocks, kv, finished, nrun, nwait = update_sync(
            cfg, req, pool, groups, running, nrun, waiting, head, nwait, npre,
            BatchOut(out_r, out_n, out_sample, acc, batch_end_s), ns, num_scheduled, num_free_blocks, kv,
        )  # fmt: skip
        if finished and not paged:  # ReservationManager.free: each finished request's chunk, in batch order
            for j in range(ns):
                r = out_r[j]
                if status[r] == FINISHED:
                    free_chunk(orca, chunk_offset[r], reserve[r])
                    counters[FINAL_TOKENS] -= max_num_tokens[r]
        s = counts[0]
        held = usable - num_free_blocks if paged else orca.num_slots - counters[FREE_SLOTS]
        record(first, now_s, batch_end_s, last_end_s, npre, 0, num_scheduled, num_running_step, nwait, held, kv, logs, events,
               counts)  # fmt: skip
        if not paged:  # ReservationManager.record_split against the waiting queue's head
            split[0][s] = counters[FINAL_TOKENS]
            split[1][s] = counters[ROUNDING]
            split[2][s] = free_slots_below(orca, reserve[waiting[head]]) if nwait else 0
        last_end_s = batch_end_s
        now_s = batch_end_s
    save_state(state, fstate, nxt, num_free_blocks, nrun, head, nwait, kv, first + counts[0], now_s, last_end_s)
    return code
