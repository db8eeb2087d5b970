"""Decode runs: steps in which nothing can change, done at once in closed form, synchronous and asynchronous; the
compiled loops' only speed-up over a compiled step (the Python engine steps one at a time). Runs of a long prompt's
chunks beside the same decodes were done so too, in 370 lines, until measured against the loops without them: without,
make parity's compiled runs take 0.63-1.00x the time and make bench's binding workloads 0.83-0.95x (the loops compile
smaller), and kvlab plan's default search the same time.

When every running request is decoding (it sampled in the last step), the next steps schedule one token per running
request (max_num_batched_tokens >= max_num_seqs, which vLLM requires) until one of:
- a request finishes: the run ends with the step that samples its last token;
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
    njit,
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
def decodes_advanced(req, running, nrun, j, phases, block_size, usable, num_free_blocks, kv, now_s, waiting, head, nwait,
                     logs, s, groups):  # fmt: skip
    """The running requests after a decode run's j steps at once (decode_run; s: the run's first record): their block crossings (phases), computed tokens and tokens; and the
    first finish, sampled in the last step, released, with that step's record of held blocks and KV tokens after it.
    Returns (num_free_blocks, kv, nrun, nwait)."""
    max_num_tokens, num_tokens, num_computed_tokens, num_blocks, status, finish_s = (
        req.max_num_tokens,
        req.num_tokens,
        req.num_computed_tokens,
        req.num_blocks,
        req.status,
        req.finish_s,
    )
    finished = False
    hybrid = groups.block_size.shape[0] > 0
    for i in range(nrun):
        r = running[i]
        if hybrid:
            groups_advanced(groups, r, num_computed_tokens[r], j, 0)
        else:
            num_blocks[r] += blocks_crossed(phases[i], j, block_size)  # its crossings in steps 0..j-1
        num_computed_tokens[r] += j
        num_tokens[r] += j
        if is_finished(num_tokens[r], max_num_tokens[r]):  # j == k: the step sampling the first finish
            status[r] = FINISHED
            num_free_blocks += release_groups(groups, r) if hybrid else num_blocks[r]  # release without prefix caching
            num_blocks[r] = 0
            kv -= num_computed_tokens[r]
            finish_s[r] = now_s
            finished_at(req, now_s)
            finished = True
    if finished:  # that step's record: after its finishes
        logs[2][s + j - 1] = usable - num_free_blocks  # held
        logs[3][s + j - 1] = kv  # kv_tokens
        nrun, nwait = remove_finished(req, running, nrun, waiting, head, nwait, False)
    return num_free_blocks, kv, nrun, nwait


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
def decode_run(at):
    """at: the synchronous loop's state (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, kv, now_s, last_end_s,
    phases, per_phase, logs, counts, groups). Without prefix
    caching: while every running request decodes (it sampled in the last step), their steps at once, O(1) a step,
    recorded as the synchronous loop records them. A run stops before a step that would cross more block boundaries than there
    are free blocks (it preempts) or admit the first request to arrive during it, and after the step that samples
    the first finish or fills the chunk; the waiting queue's head, refused in the first step, stays refused (free
    blocks only fall). A hybrid model's groups (groups): O(groups) a step (group_phases), the head checked at every
    step, since windows give blocks back. Returns (steps, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s); 0 steps: no
    run, nothing changed."""
    (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, kv, now_s, last_end_s, phases, per_phase, logs,
     counts, groups) = at  # fmt: skip
    arrival_s, num_tokens, num_computed_tokens = req.arrival_s, req.num_tokens, req.num_computed_tokens
    block_size, max_num_seqs, budget, usable, threshold, max_model_len = limits_of(cfg)
    no = (0, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s)
    if nrun == 0:  # and nrun <= budget: a step admits only once every running request has a token
        return no
    hybrid = groups.block_size.shape[0] > 0
    k, _, low, high = decodes_found(req, running, nrun, phases, per_phase, block_size, hybrid, 0)
    limit = min(k, logs[0].shape[0] - counts[0])  # the run's last step samples the first finish
    if limit < 2:
        return no
    budget_left = budget - nrun
    may_admit = budget_left > 0 and nrun < max_num_seqs
    refused = nwait > 0  # the head, refused now, stays refused: free blocks only fall
    if (
        not hybrid
        and refused
        and may_admit
        and admitted_tokens(
            cfg, num_tokens, waiting[head], 0, 0, budget_left, num_free_blocks - per_phase[0], threshold
        )[0]
    ):
        return no
    # A hybrid model's groups give blocks back as they take them (a window's, a chunk's), so free blocks may rise: the
    # waiting queue's head is admitted at the first step that leaves num_blocks_needed free (NEVER_ENOUGH_BLOCKS: none,
    # or the budget refuses it), and a step runs only if it can take its blocks before any are given back (else it
    # may preempt).
    num_blocks_needed = NEVER_ENOUGH_BLOCKS
    num_events = freed_first = e = 0
    if hybrid:
        if refused and may_admit:
            m, head_blocks_needed, _ = admission_to_groups(
                cfg, groups, num_tokens, waiting[head], budget_left, threshold
            )
            num_blocks_needed = head_blocks_needed if m else NEVER_ENOUGH_BLOCKS
        num_events, freed_first = group_phases(groups, running, nrun, num_computed_tokens, limit, max_model_len, 0)
    end_s, _, held, kv_tokens, tokens, num_running_log, num_waiting_log = logs
    s = counts[0]  # record()'s columns; no event: last_end_s == now_s (a step just ended), no pre/hit
    growing = cost.kind >= 2  # its steps grow with the context (each timed as step_s times it)
    duration = 0.0 if growing else step_s(cost, nrun, per_phase)  # (per_phase: an acc they do not read)
    context = kv + nrun  # the first step's decodes' context, each one's computed tokens + 1
    run = decode_run_clock(cost, nrun, context, low + 1, high + 1)  # (read on the measured clock only)
    # the steps whose block boundaries the pool covers
    covered = limit if hybrid else steps_covered(per_phase, nrun, num_free_blocks, block_size)
    n = arrival_s.shape[0]
    j = 0
    phase = 0  # j % block_size
    while j < limit:
        if j and nxt < n and arrival_s[nxt] <= now_s:
            nxt, nwait = arrive(arrival_s, now_s, nxt, waiting, head, nwait)
            if not refused:  # the first to arrive: admitted at this step ends the run
                if hybrid:
                    if may_admit:
                        m, head_blocks_needed, _ = admission_to_groups(cfg, groups, num_tokens, waiting[head], budget_left,
                                                              threshold)  # fmt: skip
                        num_blocks_needed = head_blocks_needed if m else NEVER_ENOUGH_BLOCKS
                elif (
                    may_admit
                    and admitted_tokens(
                        cfg, num_tokens, waiting[head], 0, 0, budget_left, num_free_blocks - per_phase[phase], threshold
                    )[0]
                ):
                    break
                refused = True
        if j == covered:
            break  # a block boundary the pool cannot cover: it preempts
        if hybrid:
            while e < num_events and groups.events[e, 0] == j:  # a window starts to give blocks back
                groups.hist[groups.events[e, 1]] += groups.events[e, 2]
                e += 1
            taken, freed = group_blocks_at(groups, j, max_model_len)
            if j == 0:
                freed = freed_first
            if taken > num_free_blocks or num_free_blocks - taken + freed >= num_blocks_needed:
                break  # it may preempt, or it admits the head
            num_free_blocks += freed - taken
        else:
            num_free_blocks -= per_phase[phase]
        if cost.kind == 2:
            duration = decode_step_s(cost, run, j)
        elif growing:
            duration = cost_s(cost, nrun, context + nrun * j, nrun, context + nrun * j, 0, 0, low + 1 + j, high + 1 + j)
        now_s += duration
        kv += nrun
        end_s[s + j] = now_s
        held[s + j] = usable - num_free_blocks
        kv_tokens[s + j] = kv
        num_waiting_log[s + j] = nwait
        j += 1
        phase = 0 if phase == block_size - 1 else phase + 1
    if hybrid:
        group_phases_cleared(groups, nrun, phases, max_model_len, 0)
        if j == 0:
            return no
    tokens[s : s + j] = nrun
    num_running_log[s : s + j] = nrun
    counts[0] = s + j
    if j:
        last_end_s = now_s
    num_free_blocks, kv, nrun, nwait = decodes_advanced(req, running, nrun, j, phases, block_size, usable, num_free_blocks, kv, now_s,
                                             waiting, head, nwait, logs, s, groups)  # fmt: skip
    return j, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s


@inline
def blocks_taken(per_phase, num_running, num_steps, block_size):
    """The blocks the running requests take in a run's first num_steps steps."""
    taken = num_running * (num_steps // block_size)
    for p in range(num_steps % block_size):
        taken += per_phase[p]
    return taken


@inline
def hybrid_batches(cfg, groups, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, k, joins, may_admit, budget_left,
                   computed_before):  # fmt: skip
    """How many of batches 1..k a hybrid model's asynchronous decode run schedules (decode_run_async): batch j takes
    and gives back the blocks of group_phases' step j - 1 (lag 1: a token in flight), and the run stops before a batch
    that cannot take its blocks before any come back (it may preempt) or that leaves the waiting queue's head (the first
    to arrive from iteration joins on, if none waits) enough free blocks to be admitted. groups.free_at[j]: the free
    blocks after batch j."""
    max_model_len, threshold = cfg.max_model_len, cfg.long_prefill_token_threshold
    num_events, freed_first = group_phases(groups, running, nrun, req.num_computed_tokens, k, max_model_len, 1)
    num_blocks_needed = NEVER_ENOUGH_BLOCKS
    if nwait and may_admit:
        m, head_blocks_needed, _ = admission_to_groups(
            cfg, groups, req.num_tokens, waiting[head], budget_left, threshold
        )
        num_blocks_needed = head_blocks_needed if m else NEVER_ENOUGH_BLOCKS
    e = 0
    j = 1
    while j <= k:
        if j == joins and not nwait and may_admit:
            m, head_blocks_needed, _ = admission_to_groups(cfg, groups, req.num_tokens, nxt, budget_left, threshold)
            num_blocks_needed = head_blocks_needed if m else NEVER_ENOUGH_BLOCKS
        while e < num_events and groups.events[e, 0] == j - 1:  # a window starts to give blocks back
            groups.hist[groups.events[e, 1]] += groups.events[e, 2]
            e += 1
        taken, freed = group_blocks_at(groups, j - 1, max_model_len)
        if j == 1:
            freed = freed_first
        if taken > num_free_blocks or num_free_blocks - taken + freed >= num_blocks_needed:
            break
        num_free_blocks += freed - taken
        groups.free_at[j] = num_free_blocks
        j += 1
    group_phases_cleared(groups, nrun, computed_before, max_model_len, 1)
    return j - 1


@njit
def decode_run_async(at, times):
    """at: the asynchronous loop's state (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, now_s, last_end_s,
    queue_r, queue_n, queue_sample, queue_i, queue_f, slot, phases, per_phase, first, logs, events, counts, groups;
    slot: the batch in flight's); times: scratch for the batches' ends. A hybrid model's groups: hybrid_batches.
    Without prefix caching, k loop iterations at once (schedule batch j, then process batch j - 1's output), recorded
    as the asynchronous loop records them; batch k is left queued in the batch in flight's slot.

    It starts with one batch in flight (no preemption, no prefix hit) that holds every running request, each of
    which sampled in it (decodes, and prefills it ended): each then has one output placeholder and computed = known
    tokens t. Iteration j schedules one token for every running request unless one of its own rules applies: vLLM's
    early stop skips a request whose placeholder brings it to max_num_tokens, so all are scheduled while
    k <= min(max_num_tokens - t - 1); blocks are taken at the same phases as the synchronous run (computed tokens run
    one ahead); admissions and arrivals as there, each schedule() at the clock of the output it waited for last.
    Batch j runs from the end of batch j - 1 (the GPU is never idle: the next batch is always queued). A run ends at
    the latest with the batch that schedules the first finish's last token: the loop's next iteration skips the
    requests whose last token is in flight and finishes them. Returns (ran, nxt, nwait, num_free_blocks, nrun, kv,
    now_s, last_end_s, gpu_free_s); ran False: no run, nothing changed."""
    (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, now_s, last_end_s, queue_r, queue_n,
     queue_sample, queue_i, queue_f, slot, phases, per_phase, first, logs, events, counts, groups) = at  # fmt: skip
    arrival_s, num_prompt_tokens, num_tokens = req.arrival_s, req.num_prompt_tokens, req.num_tokens
    num_computed_tokens, num_blocks, num_in_flight_tokens = (
        req.num_computed_tokens,
        req.num_blocks,
        req.num_in_flight_tokens,
    )
    first_token_s = req.first_token_s
    block_size, max_num_seqs, budget, usable, threshold, max_model_len = limits_of(cfg)
    no = (False, nxt, nwait, num_free_blocks, nrun, 0, now_s, last_end_s, 0.0)
    if nrun == 0 or queue_i[slot, 0] != nrun:
        return no
    hybrid = groups.block_size.shape[0] > 0
    k, kv, low, high = decodes_found(req, running, nrun, phases, per_phase, block_size, hybrid, 1)
    room = logs[0].shape[0] - counts[0]  # records left in the chunk
    if k > room:
        k = room
    budget_left = budget - nrun
    may_admit = budget_left > 0 and nrun < max_num_seqs
    if k < 2:
        return no
    if not hybrid:  # run_limits (a hybrid model's groups: their blocks after the times, hybrid_batches)
        if (
            nwait
            and may_admit
            and admitted_tokens(
                cfg, num_tokens, waiting[head], 0, 0, budget_left, num_free_blocks - per_phase[0], threshold
            )[0]
        ):
            return no
        covered = steps_covered(per_phase, nrun, num_free_blocks, block_size)
        k = covered if covered < k else k
        if k < 2:
            return no
    # times[j]: the end of batch j (times[0]: the batch in flight), each the last plus its step.
    gpu_free_s = queue_f[slot, 1]
    times[0] = gpu_free_s
    context = kv + nrun  # the first step's decodes' context
    run = decode_run_clock(cost, nrun, context, low + 1, high + 1)  # (read on the measured clock only)
    n = arrival_s.shape[0]
    watch = may_admit and nwait == 0 and nxt < n  # the first to arrive may be admitted where it joins
    growing = cost.kind >= 2  # its steps grow with the context (each timed as step_s times it)
    duration = 0.0 if growing else step_s(cost, nrun, per_phase)  # (per_phase: an acc they do not read)
    m = 0  # times known up to times[m]
    joins = k + 1  # the iteration the first request to arrive joins at (k + 1: none)
    while m < k:
        if cost.kind == 2:
            duration = decode_step_s(cost, run, m)
        elif growing:
            duration = cost_s(cost, nrun, context + nrun * m, nrun, context + nrun * m, 0, 0, low + 1 + m, high + 1 + m)
        times[m + 1] = times[m] + duration
        m += 1
        if watch and m - 1 < k - 1 and times[m - 1] >= arrival_s[nxt]:
            watch = False  # bisect_left(times, arrival, 0, k - 1) is m - 1: it joins at iteration m + 1
            joins = m + 1
            if joins <= k and not hybrid:
                taken = blocks_taken(per_phase, nrun, joins, block_size)
                if admitted_tokens(cfg, num_tokens, nxt, 0, 0, budget_left, num_free_blocks - taken, threshold)[0]:
                    if joins - 1 < 2:
                        return no
                    k = joins - 1
    if hybrid:
        k = hybrid_batches(cfg, groups, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, k, joins, may_admit,
                           budget_left, phases)  # fmt: skip
        if k < 2:
            return no
    start0, tokens0, running0, waiting0 = queue_f[slot, 0], queue_i[slot, 1], queue_i[slot, 2], queue_i[slot, 3]
    # apply_async: batches 0..k-1 recorded, batch k queued (in the slot of the batch in flight)
    end0 = times[0]
    for i in range(nrun):
        r = running[i]
        if num_tokens[r] == num_prompt_tokens[r]:
            first_token_s[r] = end0  # its prefill's last chunk was in batch 0
    # Batch j (j >= 1) is scheduled at the clock of batch j - 2's output (the loop's clock for j = 1): arrivals
    # by then join the waiting queue (behind a refused head) and count in its record.
    num_free_blocks = groups.free_at[1] if hybrid else num_free_blocks - per_phase[0]
    record(first, start0, times[0], last_end_s, 0, 0, tokens0, running0, waiting0, usable - num_free_blocks, kv + nrun, logs,
           events, counts)  # fmt: skip
    nxt, nwait = arrive(arrival_s, now_s, nxt, waiting, head, nwait)
    # Batches 1..k-1: record()'s columns, written here (each starts where the last ended, so no event), with the
    # columns unpacked once: record() unpacks them at each call, and numba counts a reference to each column there.
    end_s, _, held, kv_tokens, tokens, num_running_log, num_waiting_log = logs
    s = counts[0]
    for j in range(1, k):
        num_free_blocks = groups.free_at[j + 1] if hybrid else num_free_blocks - per_phase[j % block_size]
        end_s[s], held[s], kv_tokens[s] = times[j], usable - num_free_blocks, kv + nrun * (j + 1)
        tokens[s], num_running_log[s], num_waiting_log[s] = nrun, nrun, nwait
        s += 1
        nxt, nwait = arrive(arrival_s, times[j - 1], nxt, waiting, head, nwait)
    counts[0] = s
    last_end_s = times[k - 1]
    for i in range(nrun):
        r = running[i]
        if hybrid:
            groups_advanced(groups, r, num_computed_tokens[r], k, 1)
        else:
            num_blocks[r] += blocks_crossed(phases[i], k, block_size)
        num_computed_tokens[r] += k
        num_tokens[r] += k
        num_in_flight_tokens[r] = 1  # batch k's token
    kv += nrun * k
    now_s = times[k - 1]  # it waited for batch k - 1's output
    queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2], queue_i[slot, 3] = nrun, nrun, nrun, nwait
    queue_i[slot, 4], queue_i[slot, 5], queue_i[slot, 6] = 0, 0, 1
    queue_f[slot, 0], queue_f[slot, 1] = times[k - 1], times[k]
    for i in range(nrun):
        queue_r[slot, i], queue_n[slot, i], queue_sample[slot, i] = running[i], 1, True
    return True, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s, times[k]
