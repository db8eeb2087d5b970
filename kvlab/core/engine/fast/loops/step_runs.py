"""Decode runs: steps in which nothing can change, done at once in closed form, synchronous and asynchronous (one
function, decode_run, the asynchronous loop's lag of one batch its parameter); the compiled loops' only speed-up over a
compiled step (the Python engine steps one at a time). Runs of a long prompt's
chunks beside the same decodes were done so too, in 370 lines, until measured against the loops without them: without,
make parity's compiled runs take 0.63-1.00x the time and make bench's binding workloads 0.83-0.95x (the loops compile
smaller), and kvlab plan's default search the same time.

When every running request is decoding (it sampled in the last step), the next steps schedule one token per running
request (max_num_batched_tokens >= max_num_seqs, which vLLM requires) until one of:
- a request finishes: the run ends with the step that schedules its last token;
- a request needs a block the pool has not got: a request whose computed tokens are c crosses into a new block at the
  steps j with (c + j) % block_size == 0 (rules.block_phase), so the pool covers the first k steps while the blocks
  crossed in them are at most the free blocks (rules.steps_covered);
- a waiting request is admitted: the head of the waiting queue is refused in the first step and so in every later
  one, since free blocks only fall while nothing finishes; if nothing waits, the first request to arrive during the
  run must be refused when it joins;
and each step's cost follows in closed form (loops.clock: decode_run_clock, decode_step_s; the same float additions as
the per-step loop, in the same order). A run's per-step records are filled in, so a run is indistinguishable from its
steps: tests/test_compiled.py holds the loops with runs to the Python engine's per-step loop, bit for bit."""

from kvlab.core.engine.fast.loops.clock import (
    cost_s,
    decode_run_clock,
    decode_step_s,
    step_s,
)
from kvlab.core.engine.fast.loops.groups import (
    admission_to_groups,
    group_blocks_at,
    group_phases,
    group_phases_cleared,
    groups_advanced,
    release_groups,
)
from kvlab.core.engine.fast.loops.jit import (
    FINISHED,
    block_phase,
    blocks_crossed,
    inline,
    is_finished,
    steps_covered,
    steps_to_finish,
)
from kvlab.core.engine.fast.loops.pool import (
    admitted_tokens,
)
from kvlab.core.engine.fast.loops.scheduler import (
    arrive,
    finished_at,
    record,
    remove_finished,
)
from kvlab.core.engine.rules import NEVER_ENOUGH_BLOCKS


@inline
def limits_of(cfg):
    """The Limits the runs read: block_size, max_num_seqs, max_num_batched_tokens, num_usable_blocks,
    long_prefill_token_threshold, max_model_len."""
    return (
        cfg.block_size,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        cfg.num_usable_blocks,
        cfg.long_prefill_token_threshold,
        cfg.max_model_len,
    )


@inline
def decodes_found(req, running, nrun, phases, per_phase, block_size, hybrid, lag):
    """The running requests as a decode run finds them, each decoding: synchronous (lag 0), each sampled in the last
    step (its computed tokens one short of its tokens); asynchronous (lag 1), each samples in the batch in flight
    (one output placeholder, every token computed; a hybrid model's, one token in flight, since its window moves
    with its settled tokens). Their block phases in phases and per_phase (a hybrid model's: their computed tokens).
    Returns (the steps to the first finish, their computed tokens in all, the least and the most); -1 steps: one
    does not decode (a prefill chunk, or its first token next)."""
    num_tokens, num_computed_tokens, max_num_tokens = req.num_tokens, req.num_computed_tokens, req.max_num_tokens
    per_phase[:] = 0  # per_phase[p]: requests of phase p
    k = max_num_tokens[running[0]]
    kv = 0
    low = high = num_computed_tokens[running[0]]
    for i in range(nrun):
        r = running[i]
        c = num_computed_tokens[r]
        if (
            req.num_output_placeholders[r] != lag
            or c != num_tokens[r] - 1 + lag
            or num_tokens[r] + lag <= req.num_prompt_tokens[r]
        ):
            return -1, 0, 0, 0
        if hybrid and lag and req.num_in_flight_tokens[r] != 1:
            return -1, 0, 0, 0
        steps_left = steps_to_finish(num_tokens[r], max_num_tokens[r], lag)
        k = steps_left if steps_left < k else k
        kv += c
        low = c if c < low else low
        high = c if c > high else high
        if hybrid:
            phases[i] = c  # (its computed tokens: group_phases_cleared)
        else:
            phases[i] = block_phase(c, block_size)  # it crosses into a new block at steps j % bs == phases[i]
            per_phase[phases[i]] += 1
    return k, kv, low, high


@inline
def clock_at(times, x, now_s):
    """times[x], the run's clock; now_s before it (x < 0)."""
    return times[x] if x >= 0 else now_s


@inline
def decode_run(at, times, lag):
    """at: the loop's state (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, now_s,
    last_end_s, queue_r, queue_n, queue_sample, queue_i, queue_f, slot, phases, per_phase, first, logs, events, counts,
    groups, until_s; slot: the batch in flight's); times: scratch for the steps' ends; lag: 0 synchronous, 1 asynchronous.
    Without prefix caching, while every running request decodes (decodes_found), k steps at once, each one token for
    every one, recorded as the loop records them: O(1) a step (a hybrid model's groups: O(groups), group_phases).

    Synchronous, step i is scheduled at the end of step i - 1 (the loop's clock for step 0) and its output processed
    at its end; asynchronous, the run starts with one batch in flight that holds every running request, each sampling
    in it, step i (batch i + 1) is scheduled at the end of batch i - 1 (the clock of the output the loop waited for
    last; the loop's clock for steps 0 and 1) and runs from the end of batch i, and step k is left queued in the batch
    in flight's slot. Either way times[i]: the end of the batch before step i's (synchronous: times[0], the clock),
    each the last plus its step. A run stops before a step that would cross more block boundaries than there are free
    blocks (it preempts) or admit the first request to arrive during it, and at the step that schedules the first
    finish's last token (synchronous: its output finishes it; asynchronous: the loop's next iteration does) or fills
    the chunk, and before a step the loop would schedule at until_s or later (it pauses there: engine_core.paused); the waiting queue's head, refused in the first step, stays refused (free blocks only fall; a hybrid
    model's windows give blocks back: it is checked at every step). Returns (steps, nxt, nwait,
    num_free_blocks, nrun, kv, now_s, last_end_s, gpu_free_s); 0 steps: no run, nothing changed."""
    (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, now_s, last_end_s, queue_r, queue_n,
     queue_sample, queue_i, queue_f, slot, phases, per_phase, first, logs, events, counts, groups, until_s) = at  # fmt: skip
    arrival_s, num_prompt_tokens, num_tokens, max_num_tokens = (
        req.arrival_s,
        req.num_prompt_tokens,
        req.num_tokens,
        req.max_num_tokens,
    )
    num_computed_tokens, num_blocks = req.num_computed_tokens, req.num_blocks
    block_size, max_num_seqs, budget, usable, threshold, max_model_len = limits_of(cfg)
    no = (0, nxt, nwait, num_free_blocks, nrun, 0, now_s, last_end_s, 0.0)
    if nrun == 0 or (lag and queue_i[slot, 0] != nrun):  # (and nrun <= budget: a step admits only once all decode)
        return no
    hybrid = groups.block_size.shape[0] > 0
    k, kv, low, high = decodes_found(req, running, nrun, phases, per_phase, block_size, hybrid, lag)
    k = min(k, logs[0].shape[0] - counts[0])  # a record a step
    budget_left = budget - nrun
    may_admit = budget_left > 0 and nrun < max_num_seqs
    if not hybrid and k >= 2:
        if (
            nwait
            and may_admit
            and admitted_tokens(
                cfg, num_tokens, waiting[head], 0, 0, budget_left, num_free_blocks - per_phase[0], threshold
            )[0]
        ):
            return no
        covered = steps_covered(per_phase, nrun, num_free_blocks, block_size)  # the steps the pool covers
        k = covered if covered < k else k
    if k < 2:
        return no
    # A hybrid model's groups give blocks back as they take them (a window's, a chunk's), so free blocks may rise: the
    # waiting queue's head is admitted at the first step that leaves num_blocks_needed free (NEVER_ENOUGH_BLOCKS: none,
    # or the budget refuses it), and a step runs only if it can take its blocks before any are given back (else it
    # may preempt). groups.free_at[i + 1]: the free blocks after step i.
    num_blocks_needed = NEVER_ENOUGH_BLOCKS
    num_events = freed_first = e = 0
    free = num_free_blocks
    if hybrid:
        if nwait and may_admit:
            m, head_blocks_needed, _ = admission_to_groups(
                cfg, groups, num_tokens, waiting[head], budget_left, threshold
            )
            num_blocks_needed = head_blocks_needed if m else NEVER_ENOUGH_BLOCKS
        num_events, freed_first = group_phases(groups, running, nrun, num_computed_tokens, k, max_model_len, lag)
    times[0] = queue_f[slot, 1] if lag else now_s
    context = kv + nrun  # the first step's decodes' context
    run = decode_run_clock(cost, nrun, context, low + 1, high + 1)  # (read on the measured clock only)
    n = arrival_s.shape[0]
    watch = may_admit and nwait == 0 and nxt < n  # the first to arrive may be admitted at the step it joins
    growing = cost.kind >= 2  # its steps grow with the context (each timed as step_s times it)
    duration = 0.0 if growing else step_s(cost, nrun, per_phase)  # (per_phase: an acc they do not read)
    i = 0
    while i < k:
        if times[i] >= until_s:
            break  # the loop pauses before it schedules step i + lag, at times[i] (engine_core.paused)
        if watch and i and times[i - lag] >= arrival_s[nxt]:  # the first to arrive joins step i (scheduled then)
            watch = False
            if hybrid:
                m, head_blocks_needed, _ = admission_to_groups(cfg, groups, num_tokens, nxt, budget_left, threshold)
                num_blocks_needed = head_blocks_needed if m else NEVER_ENOUGH_BLOCKS
            else:
                taken = nrun * ((i + 1) // block_size)  # the blocks of steps 0..i
                for p in range((i + 1) % block_size):
                    taken += per_phase[p]
                if admitted_tokens(cfg, num_tokens, nxt, 0, 0, budget_left, num_free_blocks - taken, threshold)[0]:
                    break  # it is admitted at step i: the run ends before it
        if hybrid:
            while e < num_events and groups.events[e, 0] == i:  # a window starts to give blocks back
                groups.hist[groups.events[e, 1]] += groups.events[e, 2]
                e += 1
            taken, freed = group_blocks_at(groups, i, max_model_len)
            if i == 0:
                freed = freed_first
            if taken > free or free - taken + freed >= num_blocks_needed:
                break  # it may preempt, or it admits the head
            free += freed - taken
            groups.free_at[i + 1] = free
        if cost.kind == 2:
            duration = decode_step_s(cost, run, i)
        elif growing:
            duration = cost_s(cost, nrun, context + nrun * i, nrun, context + nrun * i, 0, 0, low + 1 + i, high + 1 + i)
        times[i + 1] = times[i] + duration
        i += 1
    k = i
    if hybrid:
        group_phases_cleared(groups, nrun, phases, max_model_len, lag)
    if k < 2:
        return no
    if lag:
        for i in range(nrun):
            if num_tokens[running[i]] == num_prompt_tokens[running[i]]:
                req.first_token_s[running[i]] = times[0]  # its prefill's last chunk was in the batch in flight
    # The records, each after its step is scheduled: record i is step i's (asynchronous: batch i's, the batch in
    # flight's first, by record(): it may have started after the last one ended), its waiting requests those that
    # had arrived when it was scheduled; the rest written here, each starting where the last ended (no event).
    end_s, _, held, kv_tokens, tokens, num_running_log, num_waiting_log = logs
    for i in range(k + 1):
        clock = clock_at(times, i - 2 * lag, now_s)
        if i == k and clock >= until_s:
            break  # the loop pauses before the arrivals join (engine_core.paused)
        nxt, nwait = arrive(arrival_s, clock, nxt, waiting, head, nwait)
        if i == k:
            break
        num_free_blocks = groups.free_at[i + 1] if hybrid else num_free_blocks - per_phase[i % block_size]
        if i == 0 and lag:
            record(first, queue_f[slot, 0], times[0], last_end_s, 0, 0, queue_i[slot, 1], queue_i[slot, 2],
                   queue_i[slot, 3], usable - num_free_blocks, kv + nrun, logs, events, counts)  # fmt: skip
            continue
        s = counts[0]
        end_s[s], held[s], kv_tokens[s] = times[i + 1 - lag], usable - num_free_blocks, kv + nrun * (i + 1)
        tokens[s], num_running_log[s], num_waiting_log[s] = nrun, nrun, nwait
        counts[0] = s + 1
    now_s = last_end_s = times[k - lag]  # synchronous: step k - 1's end; asynchronous: the output waited for
    kv += nrun * k
    finished = False
    for i in range(nrun):
        r = running[i]
        if hybrid:
            groups_advanced(groups, r, num_computed_tokens[r], k, lag)
        else:
            num_blocks[r] += blocks_crossed(phases[i], k, block_size)  # its crossings in steps 0..k-1
        num_computed_tokens[r] += k
        num_tokens[r] += k
        if lag:
            req.num_in_flight_tokens[r] = 1  # step k's token
            queue_r[slot, i], queue_n[slot, i], queue_sample[slot, i] = r, 1, True
        elif is_finished(num_tokens[r], max_num_tokens[r]):  # synchronous: step k - 1 sampled its last token
            req.status[r] = FINISHED
            num_free_blocks += release_groups(groups, r) if hybrid else num_blocks[r]  # release without prefix caching
            num_blocks[r] = 0
            kv -= num_computed_tokens[r]
            req.finish_s[r] = now_s
            finished_at(req, now_s)
            finished = True
    if finished:  # step k - 1's record: after its finishes
        held[counts[0] - 1], kv_tokens[counts[0] - 1] = usable - num_free_blocks, kv
        nrun, nwait = remove_finished(req, running, nrun, waiting, head, nwait, False)
    if lag:  # step k queued (in the slot of the batch in flight)
        queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2], queue_i[slot, 3] = nrun, nrun, nrun, nwait
        queue_i[slot, 4], queue_i[slot, 5], queue_i[slot, 6] = 0, 0, 1
        queue_f[slot, 0], queue_f[slot, 1] = times[k - 1], times[k]
    return k, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s, times[k]
