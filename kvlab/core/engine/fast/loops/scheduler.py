"""vLLM 0.33's scheduler over the named arrays: schedule, preempt and account compiled from the reference's own source
(kvlab/core/engine/scheduler.py) with the calls each side binds to its own (a request's record, the queues, the
KV-cache manager, the batch) bound to the functions here, with update_from_output; and what the time loop's calls
(loops/engine.py) share: arrivals, a step's record, the closed loop's sends."""

import math

from kvlab.core.engine import scheduler as python_scheduler
from kvlab.core.engine.fast.arrays import KVCache
from kvlab.core.engine.fast.loops.groups import (
    blocks_for_groups,
    group_admission_blocks,
    release_groups,
    remove_skipped_blocks,
)
from kvlab.core.engine.fast.loops.jit import (
    FINISHED,
    admission_num_new_blocks,
    compiled_from,
    inline,
    num_blocks_to_allocate,
    num_free,
    num_lookup_blocks,
    send_s,
    take_blocks,
    touch_blocks,
)
from kvlab.core.engine.fast.loops.pool import (
    cache_blocks as pool_cache_blocks,
)
from kvlab.core.engine.fast.loops.pool import (
    hash_id,
    release_table,
    take_slot,
)

# ---------------------------------------------------------------- schedule(), compiled from the reference's source
# kvlab.core.engine.scheduler's schedule, preempt and account, compiled (jit.compiled_from) with the calls each side
# binds to its own bound to the functions below: a request's handle is its id, its record requests.records[r]; the
# running list an array of num_running ids, the waiting queue a ring of num_waiting ids from head; the KV-cache
# manager arrays.KVCache (the pool's arrays with prefix caching, a hybrid model's groups, else a count of free blocks);
# the batch arrays.BatchOut.


@inline
def request_of(requests, r):
    """Request r's record (Request's fields)."""
    return requests.records[r]


@inline
def pop_running(running, index):
    """The running request at index (rules.preemption_victim: the last), off the list as its caller counts one
    fewer."""
    return running[index]


@inline
def append_running(running, num_running, r):
    """An admitted request at the running list's back."""
    running[num_running] = r


@inline
def waiting_front(waiting, head):
    """The waiting queue's first request."""
    return waiting[head]


@inline
def pop_waiting(waiting, head):
    """The waiting queue's head after its first request leaves."""
    return (head + 1) % waiting.shape[0]


@inline
def push_waiting_front(waiting, head, r):
    """A preempted request at the waiting queue's front; its new head."""
    head = (head - 1) % waiting.shape[0]
    waiting[head] = r
    return head


@inline
def allocate_slots(kv, requests, r, num_new_tokens):
    """KVCacheManager.allocate_slots for running request r: a hybrid model's groups first free the blocks behind each
    window (of its settled tokens); the new blocks for its computed tokens plus num_new_tokens, if free, are taken and,
    with prefix caching, the blocks its known tokens fill are cached. False (nothing changed) if too few are free."""
    pool, groups, max_model_len = kv.pool, kv.groups, kv.max_model_len
    c = requests.num_computed_tokens[r]
    hybrid = groups.block_size.shape[0] > 0
    if hybrid:
        settled = (c if c < max_model_len else max_model_len) - requests.num_in_flight_tokens[r]
        kv.num_free[0] += remove_skipped_blocks(groups, r, settled)
        new = blocks_for_groups(groups, r, c, num_new_tokens, max_model_len, False)
    else:
        new = num_blocks_to_allocate(c, num_new_tokens, requests.num_blocks[r], kv.block_size, max_model_len)
    if new > kv.num_free[0]:
        return False
    if hybrid:
        kv.num_free[0] -= blocks_for_groups(groups, r, c, num_new_tokens, max_model_len, True)
    elif new > 0:
        if kv.enable_caching:
            take_blocks(pool, new, pool.tables[pool.slot_of[r]], requests.num_blocks[r])
        kv.num_free[0] -= new
        requests.num_blocks[r] += new
    if kv.enable_caching:
        known = min(c + num_new_tokens, requests.num_tokens[r])
        pool_cache_blocks(pool, r, requests.num_cached_blocks, known, kv.block_size)
    return True


@inline
def get_computed_blocks(kv, requests, r):
    """KVCacheManager.get_computed_blocks: the longest cached run of request r's blocks, in pool.hits; ((its blocks,
    how many of them no request holds), its tokens). Without prefix caching ((0, 0), 0)."""
    if not kv.enable_caching:
        return (0, 0), 0
    pool = kv.pool
    hits, ref, hash_ends = pool.hits, pool.ref, pool.hash_ends
    num_hits = evictable = 0
    for j in range(num_lookup_blocks(requests.num_tokens[r], kv.block_size)):
        b = hash_ends[2 * hash_id(pool, r, j)]
        if b < 0:
            break
        hits[j] = b
        num_hits += 1
        if ref[b] == 0:
            evictable += 1
    return (num_hits, evictable), num_hits * kv.block_size


@inline
def hit_boundary(hits):
    """No Mamba groups compiled: 0."""
    return 0


@inline
def allocate_admitted(kv, requests, r, num_new_tokens, hits):
    """KVCacheManager.allocate_slots on admission (can_admit first): blocks for request r's whole length must be free
    (a hybrid model's: every group's, a window's or chunk's at most its cap), its hit's blocks taken first (they leave
    the free queue), then its new blocks, and the blocks its known tokens fill cached. False if refused."""
    pool, groups, block_size, max_model_len = kv.pool, kv.groups, kv.block_size, kv.max_model_len
    num_hits, evictable = hits
    if groups.block_size.shape[0] > 0:
        if group_admission_blocks(groups, requests.num_tokens[r], r, num_new_tokens, max_model_len) > kv.num_free[0]:
            return False
        kv.num_free[0] -= blocks_for_groups(groups, r, 0, num_new_tokens, max_model_len, True)
        return True
    num_tokens = requests.num_tokens[r]
    new = admission_num_new_blocks(
        num_tokens, num_hits, evictable, num_new_tokens, kv.num_free[0], block_size, max_model_len
    )
    if new < 0:
        return False
    if kv.enable_caching:
        take_slot(pool, r)
        row = pool.tables[pool.slot_of[r]]
        touch_blocks(pool, pool.hits, num_hits)  # a hit no request held leaves the free queue
        row[:num_hits] = pool.hits[:num_hits]
        requests.num_blocks[r] = num_hits
        requests.num_cached_blocks[r] = num_hits
        if new > 0:
            take_blocks(pool, new, row, num_hits)
            requests.num_blocks[r] += new
        known = min(num_hits * block_size + num_new_tokens, num_tokens)
        pool_cache_blocks(pool, r, requests.num_cached_blocks, known, block_size)
        kv.num_free[0] = num_free(pool)
    elif new > 0:
        kv.num_free[0] -= new
        requests.num_blocks[r] += new
    return True


@inline
def free_blocks(kv, requests, r):
    """KVCacheManager.free (release)."""
    kv.num_free[0] = release(
        kv.pool, kv.groups, kv.enable_caching, r, requests.num_blocks, requests.num_cached_blocks, kv.num_free[0]
    )


@inline
def new_step_starts(kv):
    """No Mamba groups compiled: nothing."""
    return


@inline
def add_scheduled(out, j, r, num_new_tokens):
    """The batch's j-th request and its tokens."""
    out.req_ids[j] = r
    out.num_new_tokens[j] = num_new_tokens


@inline
def add_preempted(out, r):
    """(Counted by schedule.)"""
    return


@inline
def add_admitted(out, requests, r):
    """An admitted request's first_scheduled_s, the first time."""
    if math.isnan(requests.first_scheduled_s[r]):
        requests.first_scheduled_s[r] = out.time_s


@inline
def scheduled(out, j):
    """The batch's j-th request and its tokens."""
    return out.req_ids[j], out.num_new_tokens[j]


@inline
def set_sample(out, j, sample):
    """Whether the batch's j-th request samples."""
    out.samples[j] = sample


@inline
def set_batch(out, tokens, context, decodes, decode_context, prefills, pairs, low, high):
    """The step's Batch beyond its tokens (acc)."""
    acc = out.acc
    acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6] = (
        context,
        decodes,
        decode_context,
        prefills,
        pairs,
        low,
        high,
    )


@inline
def cache_blocks(kv, requests, r, num_tokens):
    """KVCacheManager.cache_blocks on the pool's arrays (loops.pool)."""
    pool_cache_blocks(kv.pool, r, requests.num_cached_blocks, num_tokens, kv.block_size)


@inline
def add_first_token(out, requests, r):
    """Request r's first token, at the batch's end."""
    requests.first_token_s[r] = out.time_s


@inline
def add_finished(out, requests, r):
    """Request r finished at the batch's end (in a closed loop the next request is sent then: finished_at)."""
    requests.finish_s[r] = out.time_s
    finished_at(requests, out.time_s)


@inline
def remove_finished(requests, running, num_running, waiting, head, num_waiting, from_waiting):
    """The running list (and, where from_waiting, the waiting ring from head) without finished requests, in order;
    their lengths."""
    status = requests.status
    k = 0
    for j in range(num_running):
        r = running[j]
        if status[r] != FINISHED:
            running[k] = r
            k += 1
    if from_waiting:
        cap = waiting.shape[0]
        w = 0
        for j in range(num_waiting):
            r = waiting[(head + j) % cap]
            if status[r] != FINISHED:
                waiting[(head + w) % cap] = r
                w += 1
        num_waiting = w
    return k, num_waiting


@inline
def kv_cache(cfg, pool, groups, num_free_blocks):
    """The KV-cache manager the shared functions call (arrays.KVCache) over the pool's arrays or the groups, with
    num_free_blocks free."""
    hybrid = groups.block_size.shape[0] > 0
    kv = KVCache(cfg.block_size, cfg.enable_caching, not hybrid, cfg.max_model_len, pool, groups, pool.num_free_blocks)
    kv.num_free[0] = num_free_blocks
    return kv


@inline
def arrive(arrival_s, now_s, nxt, waiting, head, nwait):
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


SHARED = compiled_from(
    (python_scheduler.schedule, python_scheduler.schedule_running, python_scheduler.admit_waiting,
     python_scheduler.preempt_latest, python_scheduler.preempt, python_scheduler.account,
     python_scheduler.update_from_output),
    {
        name: globals()[name]
        for name in (
            "request_of", "pop_running", "append_running", "waiting_front", "pop_waiting", "push_waiting_front",
            "allocate_slots", "get_computed_blocks", "hit_boundary", "allocate_admitted", "free_blocks",
            "new_step_starts", "add_scheduled", "add_preempted", "add_admitted", "scheduled", "set_sample",
            "set_batch", "cache_blocks", "add_first_token", "add_finished", "remove_finished",
        )
    },
)  # fmt: skip
shared_schedule, shared_preempt, shared_account, shared_update_from_output = (
    SHARED[name] for name in ("schedule", "preempt", "account", "update_from_output")
)
