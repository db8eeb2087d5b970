"""The compiled loop of vLLM 0.1.4's scheduler (kvlab.core.engine.scheduler_v0) over paged blocks or the vLLM paper's
Orca reservations (kvlab.core.engine.reservation, placed by the buddy allocator of kvlab.core.buddy).

loop_v0 is Engine.run's per-step loop with SchedulerV0.schedule, account and update_from_output over the arrays of
fast/arrays.py (req: Requests; cfg: Limits; orca: Reservations), step by step (no decode runs: a step costs a few
nanoseconds a request here). Its decisions are the rules the Python scheduler calls (rules.watermark_admits,
admission_num_new_blocks, num_blocks_to_allocate, preemption_victim, samples, is_finished), compiled by jit.RULES; its
records are scheduler.record's, and for a reservation pool each step's Fig. 2 counts besides. The buddy allocator here
keeps, per slot, the order of the free chunk starting there and, per order, how many are free: the same chunks as
kvlab.core.buddy's sets and heaps (the lowest-addressed free chunk of the smallest order that has one, split into
halves; a freed chunk merged with its free buddies inside its arena). tests/test_compiled.py holds the two engines to
the same results, bit for bit.
"""

import math

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
)
from kvlab.core.engine.fast.loops.clock import step_s
from kvlab.core.engine.fast.loops.jit import (
    FINISHED,
    RULES,
    RUNNING,
    STEP,
    admission_num_new_blocks,
    inline,
    njit,
    num_blocks_to_allocate,
    preemption_victim,
)
from kvlab.core.engine.fast.loops.scheduler import (
    next_step,
    preempt,
    record,
    save_state,
    shared_account,
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


# ---------------------------------------------------------------- the loop
@njit
def loop_v0(req, cfg, cost, state, fstate, running, waiting, pool, groups, orca, out_r, out_n, out_sample, logs, events,
            counts, split, acc):  # fmt: skip
    """Engine.run's loop and Engine.step with SchedulerV0 (synchronous, step by step): steps until every request
    finished (DONE), the chunk's step records are filled (FULL) or a step schedules nothing (NO_PROGRESS). split: a
    reservation pool's Fig. 2 counts per step (final tokens, rounding, external fragmentation; StepLog.add_split). pool and
    groups: placeholders (no prefix cache, one full-attention group), for the v1 loop's preempt and release."""
    arrival_s, max_num_tokens, num_tokens, num_computed_tokens, num_blocks = (
        req.arrival_s, req.max_num_tokens, req.num_tokens, req.num_computed_tokens, req.num_blocks
    )  # fmt: skip
    status, first_scheduled_s = req.status, req.first_scheduled_s
    reserve, chunk_offset, counters = orca.reserve, orca.chunk_offset, orca.counters
    cap = waiting.shape[0]
    block_size, max_num_seqs, max_num_batched_tokens, max_model_len = (
        cfg.block_size, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len
    )  # fmt: skip
    usable, paged, watermark = cfg.num_usable_blocks, orca.paged, orca.watermark_blocks
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
        # SchedulerV0.schedule: a prompt step if the waiting queue's head is admitted
        ns = 0
        npre = 0
        num_batched = 0
        while nwait > 0:
            r = waiting[head]
            m = num_tokens[r]
            if num_batched + m > max_num_batched_tokens or nrun >= max_num_seqs:
                break
            if paged:
                if not watermark_admits(m, num_free_blocks, watermark, block_size, max_model_len):
                    break
                new = admission_num_new_blocks(m, 0, 0, m, num_free_blocks, block_size, max_model_len)
                num_free_blocks -= new
                num_blocks[r] += new
            else:
                offset = allocate_chunk(orca, reserve[r])
                if offset < 0:
                    break
                chunk_offset[r] = offset
                counters[FINAL_TOKENS] += max_num_tokens[r]
            head = (head + 1) % cap
            nwait -= 1
            running[nrun] = r
            nrun += 1
            status[r] = RUNNING
            if math.isnan(first_scheduled_s[r]):
                first_scheduled_s[r] = now_s
            out_r[ns] = r
            out_n[ns] = m
            ns += 1
            num_batched += m
        if ns == 0:  # else a decode step: a token each, a free block before each (paged), the latest preempted
            i = 0
            while i < nrun:
                r = running[i]
                preempted_self = False
                while paged and num_free_blocks < 1:
                    nrun = preemption_victim(nrun)
                    v = running[nrun]  # the latest arrival (FCFS keeps the running list in arrival order)
                    num_free_blocks, head, nwait = preempt(
                        req, pool, groups, 0, v, num_free_blocks, waiting, head, nwait
                    )
                    npre += 1
                    if v == r:
                        preempted_self = True
                        break
                if preempted_self:
                    break
                if paged:
                    new = num_blocks_to_allocate(num_computed_tokens[r], 1, num_blocks[r], block_size, max_model_len)
                    if new > 0:
                        num_free_blocks -= new
                        num_blocks[r] += new
                out_r[ns] = r
                out_n[ns] = 1
                ns += 1
                i += 1
        num_scheduled = shared_account(
            req, BatchOut(out_r, out_n, out_sample, acc, now_s), ns, cfg.async_scheduling, True
        )
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
