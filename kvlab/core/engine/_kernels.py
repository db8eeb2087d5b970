"""The compiled loops of kvlab.core.engine.compiled (imported only when one runs: it imports numba).

Each function mirrors the Python code named in its docstring, rule for rule, over arrays indexed by request id.
A request's state: num_tokens, computed (num_computed_tokens), num_blocks (the length of its block table),
status, num_preemptions and, asynchronous only, placeholders (num_output_placeholders), in_flight
(num_in_flight_tokens) and stale (num_stale_tokens). The waiting queue is a ring (waiting, its head, its length);
the running list an array and its length; the pool a count of free blocks.
"""
import math

import numba

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3
DONE, FULL, NO_PROGRESS = 0, 1, 2


def _jit(function):
    """numba.njit with its on-disk cache, or without where numba finds no writable place for it."""
    try:
        return numba.njit(cache=True, nogil=True)(function)
    except RuntimeError:
        return numba.njit(nogil=True)(function)


@_jit
def schedule(cfg, num_tokens, computed, num_blocks, status, num_preemptions, placeholders, in_flight, stale,
             max_tokens_total, first_scheduled_s, clock, running, nrun, waiting, head, nwait, free, out_r, out_n,
             out_sample, asynchronous):
    """Scheduler.schedule() and account() (kvlab/core/engine/scheduler.py) without prefix caching: the batch in
    out_r, out_n, out_sample; returns (its requests, preemptions, tokens, nrun, head, nwait, free)."""
    block_size, max_num_seqs, budget, max_model_len, chunked, threshold = cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], cfg[5]
    cap = waiting.shape[0]
    cap_tokens = threshold if nrun + nwait > 1 else 0
    ns = 0
    npre = 0
    i = 0
    while i < nrun and budget > 0:
        r = running[i]
        c = computed[r]
        p = placeholders[r]
        if p and c + 2 - p >= max_tokens_total[r]:
            i += 1                                      # async: the batch in flight samples its last token
            continue
        m = num_tokens[r] + p - c
        if 0 < cap_tokens < m:
            m = cap_tokens
        if m > budget:
            m = budget
        if p and m > max_model_len - c - 1:
            m = max_model_len - c - 1
            if m <= 0:                                  # async: its next position would pass max_model_len
                i += 1
                continue
        preempted_self = False
        while True:                                     # allocate_slots, preempting from the back
            new = (min(c + m, max_model_len) + block_size - 1) // block_size - num_blocks[r]
            if new <= 0:
                break
            if new <= free:
                free -= new
                num_blocks[r] += new
                break
            nrun -= 1
            v = running[nrun]                           # the most recently admitted running request (_preempt)
            free += num_blocks[v]
            num_blocks[v] = 0
            status[v] = PREEMPTED
            computed[v] = 0
            stale[v] = in_flight[v]
            placeholders[v] = 0
            num_preemptions[v] += 1
            head = (head - 1) % cap                     # to the front of the waiting queue
            waiting[head] = v
            nwait += 1
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
    if npre == 0:                                       # admissions, first come first served
        while budget > 0 and nwait > 0:
            if nrun >= max_num_seqs:
                break
            r = waiting[head]
            m = num_tokens[r]
            if 0 < cap_tokens < m:
                m = cap_tokens
            if chunked == 0 and m > budget:
                break
            if m > budget:
                m = budget
            if (min(num_tokens[r], max_model_len) + block_size - 1) // block_size > free:
                break                                   # blocks for its whole current length must be free
            new = (min(computed[r] + m, max_model_len) + block_size - 1) // block_size - num_blocks[r]
            if new > free:
                break
            if new > 0:
                free -= new
                num_blocks[r] += new
            head = (head + 1) % cap
            nwait -= 1
            running[nrun] = r
            nrun += 1
            status[r] = RUNNING
            computed[r] = 0
            if math.isnan(first_scheduled_s[r]):
                first_scheduled_s[r] = clock
            out_r[ns] = r
            out_n[ns] = m
            ns += 1
            budget -= m
    num_scheduled = 0                                   # account()
    for j in range(ns):
        r = out_r[j]
        m = out_n[j]
        c = computed[r] + m
        computed[r] = c
        num_scheduled += m
        sample = c >= num_tokens[r] + placeholders[r]
        out_sample[j] = sample
        if asynchronous:
            in_flight[r] += m
            if sample:
                placeholders[r] += 1
    return ns, npre, num_scheduled, nrun, head, nwait, free


@_jit
def add_arrivals(arrival, clock, nxt, waiting, head, nwait):
    """Engine.add_arrivals: every request that has arrived by the clock joins the back of the waiting queue, in
    arrival order; returns the next request to arrive and the queue's length."""
    n, cap = arrival.shape[0], waiting.shape[0]
    while nxt < n and arrival[nxt] <= clock:
        waiting[(head + nwait) % cap] = nxt
        nwait += 1
        nxt += 1
    return nxt, nwait


@_jit
def step_end_s(cost_ms, constant, start, num_scheduled):
    """ConstantStepCost.step_s / LinearStepCost.step_s added to start, as the Python engine adds them."""
    if constant:
        return start + cost_ms[0] / 1000.0
    return start + (cost_ms[0] + cost_ms[1] * num_scheduled) / 1000.0


@_jit
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


@_jit
def record(s, first, clock_start, end, last_end, npre, num_scheduled, nrun, nwait, held_blocks, kv, end_s, held,
           kv_tokens, tokens, num_running_log, num_waiting_log, start_step, start_s, preempt_step, preempt_count,
           num_starts, num_pre):
    """StepLog.append for step s of the chunk (first: the chunk's first step overall); the new (num_starts, num_pre)."""
    if s + first == 0 or last_end != clock_start:
        start_step[num_starts] = s
        start_s[num_starts] = clock_start
        num_starts += 1
    if npre:
        preempt_step[num_pre] = s
        preempt_count[num_pre] = npre
        num_pre += 1
    end_s[s] = end
    held[s] = held_blocks
    kv_tokens[s] = kv
    tokens[s] = num_scheduled
    num_running_log[s] = nrun
    num_waiting_log[s] = nwait
    return num_starts, num_pre


@_jit
def loop_sync(arrival, prompt, max_num_tokens, max_tokens_total, cfg, cost_ms, state, fstate, num_tokens, computed,
              num_blocks, status, num_preemptions, placeholders, in_flight, stale, first_scheduled_s, first_token_s,
              finish_s, running, waiting, out_r, out_n, out_sample, end_s, held, kv_tokens, tokens, num_running_log,
              num_waiting_log, start_step, start_s, preempt_step, preempt_count, counts):
    """Engine.run's per-step loop and Engine.step (synchronous): steps until every request finished (DONE), the
    chunk's steps are filled (FULL) or a step schedules nothing (NO_PROGRESS)."""
    n = arrival.shape[0]
    usable, constant = cfg[6], cfg[7]
    nxt, free, nrun, head, nwait, kv, first = state[0], state[1], state[2], state[3], state[4], state[5], state[6]
    clock, last_end = fstate[0], fstate[1]
    s = 0
    num_starts = num_pre = 0
    code = DONE
    while True:
        nxt, nwait = add_arrivals(arrival, clock, nxt, waiting, head, nwait)
        if nrun == 0 and nwait == 0:
            if nxt == n:
                code = DONE
                break
            clock = arrival[nxt]                            # idle: jump to the next arrival
            continue
        if s == end_s.shape[0]:
            code = FULL
            break
        ns, npre, num_scheduled, nrun, head, nwait, free = schedule(
            cfg, num_tokens, computed, num_blocks, status, num_preemptions, placeholders, in_flight, stale,
            max_tokens_total, first_scheduled_s, clock, running, nrun, waiting, head, nwait, free, out_r, out_n,
            out_sample, False)
        if num_scheduled == 0:
            code = NO_PROGRESS
            break
        end = step_end_s(cost_ms, constant, clock, num_scheduled)
        if npre:
            kv = 0
            for j in range(nrun):
                kv += computed[running[j]]
        else:
            kv += num_scheduled
        finished = False                                # update_from_output (synchronous)
        for j in range(ns):
            if out_sample[j]:
                r = out_r[j]
                num_tokens[r] += 1
                if num_tokens[r] == prompt[r] + 1:
                    first_token_s[r] = end
                if num_tokens[r] >= max_num_tokens[r]:
                    status[r] = FINISHED
                    free += num_blocks[r]
                    num_blocks[r] = 0
                    kv -= computed[r]
                    finish_s[r] = end
                    finished = True
        num_running_step = nrun
        if finished:
            nrun, nwait = drop_finished(status, running, nrun, waiting, head, nwait, False)
        num_starts, num_pre = record(s, first, clock, end, last_end, npre, num_scheduled, num_running_step, nwait,
                                     usable - free, kv, end_s, held, kv_tokens, tokens, num_running_log,
                                     num_waiting_log, start_step, start_s, preempt_step, preempt_count, num_starts,
                                     num_pre)
        s += 1
        last_end = end
        clock = end
    state[0], state[1], state[2], state[3], state[4], state[5], state[6] = nxt, free, nrun, head, nwait, kv, first + s
    fstate[0], fstate[1] = clock, last_end
    counts[0], counts[1], counts[2] = s, num_starts, num_pre
    return code


@_jit
def loop_async(arrival, prompt, max_num_tokens, max_tokens_total, cfg, cost_ms, state, fstate, num_tokens, computed,
               num_blocks, status, num_preemptions, placeholders, in_flight, stale, first_scheduled_s, first_token_s,
               finish_s, running, waiting, queue_r, queue_n, queue_sample, queue_i, queue_f, end_s, held, kv_tokens,
               tokens, num_running_log, num_waiting_log, start_step, start_s, preempt_step, preempt_count, counts):
    """Engine.run_async's loop without decode runs (asynchronous scheduling, a batch queue of two) and
    Scheduler._update_async. queue_i[slot]: requests, tokens, running, waiting, preemptions; queue_f[slot]: start,
    end. Stops as loop_sync does."""
    n = arrival.shape[0]
    usable, constant = cfg[6], cfg[7]
    nxt, free, nrun, head, nwait, kv, first = state[0], state[1], state[2], state[3], state[4], state[5], state[6]
    queue_head, queue_len, num_empty, has_finished = state[7], state[8], state[9], state[10]
    clock, last_end, gpu_free_s = fstate[0], fstate[1], fstate[2]
    s = 0
    num_starts = num_pre = 0
    code = DONE
    while True:
        nxt, nwait = add_arrivals(arrival, clock, nxt, waiting, head, nwait)
        if s == end_s.shape[0]:
            code = FULL
            break
        if nrun or nwait or has_finished:                  # has_requests(): schedule a batch and queue it
            slot = (queue_head + queue_len) % 2
            ns, npre, num_scheduled, nrun, head, nwait, free = schedule(
                cfg, num_tokens, computed, num_blocks, status, num_preemptions, placeholders, in_flight, stale,
                max_tokens_total, first_scheduled_s, clock, running, nrun, waiting, head, nwait, free, queue_r[slot],
                queue_n[slot], queue_sample[slot], True)
            has_finished = 0
            start = clock if clock > gpu_free_s else gpu_free_s
            end = step_end_s(cost_ms, constant, start, num_scheduled) if num_scheduled else start
            gpu_free_s = end
            queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2] = ns, num_scheduled, nrun
            queue_i[slot, 3], queue_i[slot, 4] = nwait, npre
            queue_f[slot, 0], queue_f[slot, 1] = start, end
            queue_len += 1
            num_empty = 0 if num_scheduled else num_empty + 1
            if num_empty >= 2 and (nrun or nwait):
                queued_tokens = queue_i[slot, 1]
                if queue_len == 2:
                    queued_tokens += queue_i[queue_head, 1]
                if queued_tokens == 0:
                    if nxt == n:
                        code = NO_PROGRESS
                        break
                    clock = arrival[nxt]                    # nothing changes before it arrives
                    num_empty = 0
            if queue_len < 2 and (num_scheduled or nrun or nwait):
                continue
        elif queue_len == 0:
            if nxt == n:
                code = DONE
                break
            clock = arrival[nxt]                            # idle: jump to the next arrival
            continue
        slot = queue_head                                   # wait for the oldest batch's output, process it
        queue_head = (queue_head + 1) % 2
        queue_len -= 1
        end = queue_f[slot, 1]
        if end > clock:
            clock = end
        finished = False
        finished_waiting = False
        for j in range(queue_i[slot, 0]):                  # Scheduler._update_async
            r = queue_r[slot, j]
            m = queue_n[slot, j]
            in_flight[r] -= m
            was_stale = stale[r] > 0
            if was_stale:
                stale[r] -= m
            if status[r] == FINISHED or not queue_sample[slot, j]:
                continue
            was_running = status[r] == RUNNING
            num_tokens[r] += 1
            if num_tokens[r] == prompt[r] + 1:
                first_token_s[r] = end
            if not was_stale and placeholders[r]:
                placeholders[r] -= 1
            if num_tokens[r] >= max_num_tokens[r]:
                status[r] = FINISHED
                free += num_blocks[r]
                num_blocks[r] = 0
                finish_s[r] = end
                finished = True
                if not was_running:
                    finished_waiting = True
        if finished:
            nrun, nwait = drop_finished(status, running, nrun, waiting, head, nwait, finished_waiting)
            has_finished = 1
        num_scheduled, npre = queue_i[slot, 1], queue_i[slot, 4]
        if num_scheduled or npre:                           # a step of the records: it ran tokens or preempted
            kv = 0
            for j in range(nrun):
                kv += computed[running[j]]
            num_starts, num_pre = record(s, first, queue_f[slot, 0], end, last_end, npre, num_scheduled,
                                         queue_i[slot, 2], queue_i[slot, 3], usable - free, kv, end_s, held,
                                         kv_tokens, tokens, num_running_log, num_waiting_log, start_step, start_s,
                                         preempt_step, preempt_count, num_starts, num_pre)
            s += 1
            last_end = end
    state[0], state[1], state[2], state[3], state[4], state[5], state[6] = nxt, free, nrun, head, nwait, kv, first + s
    state[7], state[8], state[9], state[10] = queue_head, queue_len, num_empty, has_finished
    fstate[0], fstate[1], fstate[2] = clock, last_end, gpu_free_s
    counts[0], counts[1], counts[2] = s, num_starts, num_pre
    return code
