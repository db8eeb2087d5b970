"""vLLM 0.33's scheduler (kvlab/core/engine/scheduler.py and async_scheduler.py) over the named arrays: schedule,
account, preempt, the synchronous update_from_output, and Engine.run's step around them (arrivals, records, the
closed loop's sends)."""

import math

from kvlab.core.engine.fast.arrays import (
    DONE,
    F_CLOCK,
    F_LAST_END,
    FULL,
    S_FREE,
    S_KV_TOKENS,
    S_NEXT_ARRIVAL,
    S_NUM_RUNNING,
    S_NUM_WAITING,
    S_STEPS,
    S_WAITING_HEAD,
)
from kvlab.core.engine.fast.loops.groups import (
    admitted_to_groups,
    blocks_for_groups,
    release_groups,
    remove_skipped_blocks,
)
from kvlab.core.engine.fast.loops.jit import (
    FINISHED,
    RUNNING,
    STEP,
    allocation_is_noop,
    attention_pairs,
    inline,
    num_blocks_to_allocate,
    num_free,
    num_lookup_blocks,
    preempt_request,
    preemption_victim,
    running_num_new_tokens,
    send_s,
    step_token_cap,
    take_blocks,
    touch_blocks,
    update_after_schedule,
    update_request_with_output,
)
from kvlab.core.engine.fast.loops.pool import (
    admitted_tokens,
    cache_blocks,
    hash_id,
    release_table,
    take_slot,
)


@inline
def schedule(
    cfg,
    req,
    now_s,
    running,
    nrun,
    waiting,
    head,
    nwait,
    num_free_blocks,
    out_r,
    out_n,
    out_sample,
    asynchronous,
    pool,
    groups,
    acc,
    fields,
):
    """Scheduler.schedule() and account() (kvlab/core/engine/scheduler.py): the batch in out_r, out_n, out_sample,
    and, where fields (a clock that reads them, step_s), the rest of its Batch in acc; returns (its requests,
    preemptions, tokens, prompt tokens hit in the prefix cache, nrun, head, nwait, num_free_blocks). Without prefix caching
    (cfg.enable_caching == 0) the pool is the count free; with it, pool's blocks. A hybrid model's groups (groups,
    without prefix caching) take Requests.num_blocks's place, and every running request calls allocate_slots (a
    decode inside its last block may still free a block behind its window)."""
    (
        max_tokens_total,
        num_tokens,
        num_computed_tokens,
        num_blocks,
        num_cached_blocks,
        status,
        num_output_placeholders,
        num_in_flight_tokens,
        first_scheduled_s,
    ) = (
        req.max_tokens_total,
        req.num_tokens,
        req.num_computed_tokens,
        req.num_blocks,
        req.num_cached_blocks,
        req.status,
        req.num_output_placeholders,
        req.num_in_flight_tokens,
        req.first_scheduled_s,
    )  # locals: numba hoists them
    block_size, max_num_seqs, budget, max_model_len, threshold, caching = (
        cfg.block_size,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        cfg.max_model_len,
        cfg.long_prefill_token_threshold,
        cfg.enable_caching,
    )
    cap = waiting.shape[0]
    hybrid = groups.block_size.shape[0] > 0
    cap_tokens = step_token_cap(threshold, nrun, nwait)
    ns = 0
    npre = 0
    hit_tokens = 0
    i = 0
    while i < nrun and budget > 0:
        r = running[i]
        c = num_computed_tokens[r]
        m = running_num_new_tokens(
            num_tokens[r], num_output_placeholders[r], c, max_tokens_total[r], cap_tokens, budget, max_model_len
        )
        if m == 0:  # async: its last token in flight, or at max_model_len
            i += 1
            continue
        if hybrid:  # allocate_slots first frees the blocks behind each window (of the settled tokens)
            num_free_blocks += remove_skipped_blocks(
                groups, r, (c if c < max_model_len else max_model_len) - num_in_flight_tokens[r]
            )
        elif allocation_is_noop(m, c, num_tokens[r], block_size, caching != 0):
            out_r[ns] = r  # a decode inside its last block: allocate_slots not called
            out_n[ns] = 1
            ns += 1
            budget -= 1
            i += 1
            continue
        preempted_self = False
        while True:  # allocate_slots, preempting from the back
            if hybrid:
                new = blocks_for_groups(groups, r, c, m, max_model_len, False)
            else:
                new = num_blocks_to_allocate(c, m, num_blocks[r], block_size, max_model_len)
            if new <= num_free_blocks:
                if hybrid:
                    num_free_blocks -= blocks_for_groups(groups, r, c, m, max_model_len, True)
                elif new > 0:
                    if caching:
                        take_blocks(pool, new, pool.tables[pool.slot_of[r]], num_blocks[r])
                    num_free_blocks -= new
                    num_blocks[r] += new
                if caching:
                    cache_blocks(pool, r, num_cached_blocks, min(c + m, num_tokens[r]), block_size)
                break
            nrun = preemption_victim(nrun)
            v = running[nrun]  # the most recently admitted running request
            num_free_blocks, head, nwait = preempt(req, pool, groups, caching, v, num_free_blocks, waiting, head, nwait)
            npre += 1
            if v == r:
                preempted_self = True
                break
        if preempted_self:
            break
        out_r[ns] = r
        out_n[ns] = m
        ns += 1
        budget -= m
        i += 1
    if npre == 0:  # admissions, first come first served
        while budget > 0 and nwait > 0:
            if nrun >= max_num_seqs:
                break
            r = waiting[head]
            num_hits = 0
            evictable = 0
            if caching:  # get_computed_blocks: the longest cached run of blocks
                hits, ref, hash_ends = pool.hits, pool.ref, pool.hash_ends
                for j in range(num_lookup_blocks(num_tokens[r], block_size)):
                    b = hash_ends[2 * hash_id(pool, r, j)]
                    if b < 0:
                        break
                    hits[j] = b
                    num_hits += 1
                    if ref[b] == 0:
                        evictable += 1
            if hybrid:
                m, new = admitted_to_groups(cfg, groups, num_tokens, r, budget, num_free_blocks, cap_tokens)
            else:
                m, new = admitted_tokens(cfg, num_tokens, r, num_hits, evictable, budget, num_free_blocks, cap_tokens)
            if m == 0:
                break
            start_tokens = num_computed_tokens[r] + num_hits * block_size
            if caching:
                take_slot(pool, r)
                row = pool.tables[pool.slot_of[r]]
                touch_blocks(pool, pool.hits, num_hits)  # a hit no request held leaves the free queue
                row[:num_hits] = pool.hits[:num_hits]
                num_blocks[r] = num_hits
                num_cached_blocks[r] = num_hits
                if new > 0:
                    take_blocks(pool, new, row, num_hits)
                    num_blocks[r] += new
                cache_blocks(pool, r, num_cached_blocks, min(start_tokens + m, num_tokens[r]), block_size)
                num_free_blocks = num_free(pool)
            elif hybrid:
                num_free_blocks -= blocks_for_groups(groups, r, 0, m, max_model_len, True)
            elif new > 0:
                num_free_blocks -= new
                num_blocks[r] += new
            head = (head + 1) % cap
            nwait -= 1
            running[nrun] = r
            nrun += 1
            status[r] = RUNNING
            num_computed_tokens[r] = num_hits * block_size
            hit_tokens += num_hits * block_size
            if math.isnan(first_scheduled_s[r]):
                first_scheduled_s[r] = now_s
            out_r[ns] = r
            out_n[ns] = m
            ns += 1
            budget -= m
    num_scheduled = account(req, out_r, out_n, out_sample, ns, acc, fields, asynchronous)
    return ns, npre, num_scheduled, hit_tokens, nrun, head, nwait, num_free_blocks


@inline
def account(req, out_r, out_n, out_sample, ns, acc, fields, asynchronous):
    """Scheduler.account() (kvlab/core/engine/scheduler.py) for the batch's ns requests in out_r and out_n: each
    one moved on (request.update_after_schedule, on its record) and whether it samples (out_sample); where fields (a
    clock that reads them, step_s), the rest of the step's Batch in acc. Returns the batch's tokens."""
    records, num_computed_tokens = req.records, req.num_computed_tokens
    num_scheduled = context = decodes = decode_context = prefills = pairs = low = high = 0
    for j in range(ns):
        r = out_r[j]
        m = out_n[j]
        before = num_computed_tokens[r]
        sample = update_after_schedule(records[r], m, asynchronous)
        out_sample[j] = sample
        num_scheduled += m
        if fields:  # the Batch's other fields, for a clock that reads them
            c = before + m
            context += c
            if m == 1 and sample:
                decodes += 1
                decode_context += c
                low = c if low == 0 or c < low else low
                high = c if c > high else high
            else:
                prefills += 1
                pairs += attention_pairs(m, before)
    acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6] = (
        context,
        decodes,
        decode_context,
        prefills,
        pairs,
        low,
        high,
    )
    return num_scheduled


@inline
def next_step(arrival_s, now_s, nxt, waiting, head, nwait, nrun, capacity, counts):
    """Engine.run's loop up to its next step: the requests that have arrived join the waiting queue; with nothing
    running or waiting the clock jumps to the next arrival. Returns (STEP, DONE when every request finished, or FULL
    when the chunk's capacity step records are full; nxt, nwait, now_s)."""
    n = arrival_s.shape[0]
    while True:
        nxt, nwait = add_arrivals(arrival_s, now_s, nxt, waiting, head, nwait)
        if nrun == 0 and nwait == 0:
            if nxt == n:
                return DONE, nxt, nwait, now_s
            now_s = arrival_s[nxt]  # idle: jump to the next arrival
            continue
        if counts[0] == capacity:
            return FULL, nxt, nwait, now_s
        return STEP, nxt, nwait, now_s


@inline
def save_state(state, fstate, nxt, num_free_blocks, nrun, head, nwait, kv, steps, now_s, last_end_s):
    """Keep the loop's state for its next chunk (state and fstate, read back at its start)."""
    state[S_NEXT_ARRIVAL], state[S_FREE], state[S_NUM_RUNNING] = nxt, num_free_blocks, nrun
    state[S_WAITING_HEAD], state[S_NUM_WAITING], state[S_KV_TOKENS] = head, nwait, kv
    state[S_STEPS] = steps
    fstate[F_CLOCK], fstate[F_LAST_END] = now_s, last_end_s


@inline
def add_arrivals(arrival_s, now_s, nxt, waiting, head, nwait):
    """Engine.add_arrivals: every request that has arrived by the clock joins the back of the waiting queue, in
    arrival order; returns the next request to arrive and the queue's length."""
    n, cap = arrival_s.shape[0], waiting.shape[0]
    while nxt < n and arrival_s[nxt] <= now_s:
        waiting[(head + nwait) % cap] = nxt
        nwait += 1
        nxt += 1
    return nxt, nwait


@inline
def finished_at(req, batch_end_s):
    """ClosedLoop.finished (kvlab/core/engine/closed_loop.py): a request finished at end, in time order; in a closed loop
    the next request waiting for a slot is sent (closed_loop.send_s, compiled), its send written into req.arrival_s. An
    open loop (req.closed_loop empty): nothing."""
    loop = req.closed_loop
    if loop.shape[0]:
        i = loop[0] + loop[1]
        loop[1] += 1
        if i < req.arrival_s.shape[0]:
            req.arrival_s[i] = send_s(req.open_loop[i], req.arrival_s[i - 1], batch_end_s)


@inline
def drop_finished(status, running, nrun, waiting, head, nwait, from_waiting):
    """The running list (and, if some finished there, the waiting queue) without finished requests, in order."""
    k = 0
    for j in range(nrun):
        r = running[j]
        if status[r] != FINISHED:
            running[k] = r
            k += 1
    if from_waiting:
        cap = waiting.shape[0]
        w = 0
        for j in range(nwait):
            r = waiting[(head + j) % cap]
            if status[r] != FINISHED:
                waiting[(head + w) % cap] = r
                w += 1
        nwait = w
    return k, nwait


@inline
def release(pool, groups, caching, r, num_blocks, num_cached_blocks, num_free_blocks):
    """A finished request gives its blocks back (KVCacheManager.free); the free count after."""
    if caching:
        if pool.slot_of[r] >= 0:  # a request finished in the waiting queue holds none
            release_table(pool, r, num_blocks[r])
        num_cached_blocks[r] = 0
        num_free_blocks = num_free(pool)
    elif groups.block_size.shape[0]:
        num_free_blocks += release_groups(groups, r)
    else:
        num_free_blocks += num_blocks[r]
    num_blocks[r] = 0
    return num_free_blocks


@inline
def update_sync(
    req,
    pool,
    groups,
    caching,
    running,
    nrun,
    npre,
    out_r,
    out_n,
    out_sample,
    ns,
    num_new_kv_tokens,
    batch_end_s,
    num_free_blocks,
    kv,
):
    """Engine.step's update (synchronous): the running requests' computed tokens kv after the step (recounted after a
    preemption, else kv plus the step's tokens and prefix hits, num_new_kv_tokens), then update_from_output
    (request.update_request_with_output, on each record): each request that samples gets its token, and those done
    finish at end and give their blocks back, in batch order (a reservation pool's caller frees their chunks after).
    Returns (num_free_blocks, kv, whether any finished)."""
    records, num_computed_tokens = req.records, req.num_computed_tokens
    if npre:
        kv = 0
        for j in range(nrun):
            kv += num_computed_tokens[running[j]]
    else:
        kv += num_new_kv_tokens
    any_finished = False
    for j in range(ns):
        r = out_r[j]
        sampled, first_token, settled, finished = update_request_with_output(records[r], out_n[j], out_sample[j], False)
        if first_token:
            req.first_token_s[r] = batch_end_s
        if finished:
            num_free_blocks = release(pool, groups, caching, r, req.num_blocks, req.num_cached_blocks, num_free_blocks)
            kv -= num_computed_tokens[r]
            req.finish_s[r] = batch_end_s
            finished_at(req, batch_end_s)
            any_finished = True
    return num_free_blocks, kv, any_finished


@inline
def preempt(req, pool, groups, caching, r, num_free_blocks, waiting, head, nwait):
    """Scheduler._preempt (kvlab/core/engine/scheduler.py): request r gives its blocks back, is reset
    (request.preempt_request, on its record) and goes to the front of the waiting queue; returns (num_free_blocks,
    head, nwait)."""
    num_free_blocks = release(pool, groups, caching, r, req.num_blocks, req.num_cached_blocks, num_free_blocks)
    preempt_request(req.records[r])
    head = (head - 1) % waiting.shape[0]
    waiting[head] = r
    return num_free_blocks, head, nwait + 1


@inline
def record(
    first,
    step_start_s,
    step_end_s,
    last_end_s,
    npre,
    num_hit_tokens,
    num_scheduled,
    nrun,
    nwait,
    held_blocks,
    kv,
    logs,
    events,
    counts,
):
    """StepLog.append for the chunk's next step (first: steps before the chunk). logs: end_s, start_s, then held,
    kv_tokens, tokens, num_running, num_waiting; events: start_step, preempt_step, preempt_count, hit_step,
    hit_count; counts: steps, starts, preemption events and hit events in the chunk so far."""
    end_s, start_s, held, kv_tokens, tokens, num_running_log, num_waiting_log = logs
    start_step, preempt_step, preempt_count, hit_step, hit_count = events
    s = counts[0]
    if s + first == 0 or last_end_s != step_start_s:
        start_step[counts[1]] = s
        start_s[counts[1]] = step_start_s
        counts[1] += 1
    if npre:
        preempt_step[counts[2]] = s
        preempt_count[counts[2]] = npre
        counts[2] += 1
    if num_hit_tokens:
        hit_step[counts[3]] = s
        hit_count[counts[3]] = num_hit_tokens
        counts[3] += 1
    end_s[s] = step_end_s
    held[s] = held_blocks
    kv_tokens[s] = kv
    tokens[s] = num_scheduled
    num_running_log[s] = nrun
    num_waiting_log[s] = nwait
    counts[0] = s + 1
