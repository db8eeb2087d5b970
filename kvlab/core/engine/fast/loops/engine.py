"""The compiled loops of vLLM 0.33's engine: Engine.run (kvlab/core/engine/engine.py) synchronous (loop_sync) and
asynchronous behind a batch queue of two (loop_async), stepping or running (step_runs.py) until the chunk of records is
full, every request finished, or nothing can progress."""

import math

from kvlab.core.engine.fast.arrays import (
    DONE,
    F_CLOCK,
    F_GPU_FREE,
    F_LAST_END,
    FULL,
    NO_PROGRESS,
    S_FREE,
    S_HAS_FINISHED,
    S_KV_TOKENS,
    S_NEXT_ARRIVAL,
    S_NUM_EMPTY,
    S_NUM_RUNNING,
    S_NUM_WAITING,
    S_PREFILL_RUNS,
    S_QUEUE_HEAD,
    S_QUEUE_LEN,
    S_RUNS,
    S_STEPS,
    S_WAITING_HEAD,
    BatchOut,
)
from kvlab.core.engine.fast.loops.clock import (
    step_s,
)
from kvlab.core.engine.fast.loops.jit import (
    STEP,
    njit,
    unowned,
)
from kvlab.core.engine.fast.loops.scheduler import (
    add_arrivals,
    kv_cache,
    next_step,
    record,
    save_state,
    schedule,
    shared_update_from_output,
    update_sync,
)
from kvlab.core.engine.fast.loops.step_runs import (
    decode_run,
    decode_run_async,
    prefill_run,
    prefill_run_async,
)


@njit
def loop_sync(
    req,
    cfg,
    cost,
    state,
    fstate,
    running,
    waiting,
    pool,
    groups,
    out_r,
    out_n,
    out_sample,
    logs,
    events,
    counts,
    scratch,
):
    """Engine.run's loop and Engine.step (synchronous), with decode runs and prefill runs at once without prefix
    caching (cfg.decode_runs: runs on): steps until every request finished (DONE), the chunk's steps are filled (FULL)
    or a step schedules nothing (NO_PROGRESS). Every array is taken unowned (unowned); scratch: the caller's scratch
    arrays (fast/compiled.py)."""
    req, cost, state, fstate, running, waiting, pool, groups = (
        unowned(req), unowned(cost), unowned(state), unowned(fstate), unowned(running), unowned(waiting), unowned(pool),
        unowned(groups),
    )  # fmt: skip
    out_r, out_n, out_sample, logs, events, counts = (
        unowned(out_r), unowned(out_n), unowned(out_sample), unowned(logs), unowned(events), unowned(counts)
    )  # fmt: skip
    acc, phases, per_phase = unowned(scratch)  # acc: the step's Batch beyond its tokens (schedule, step_s)
    arrival_s = req.arrival_s
    usable, caching = cfg.num_usable_blocks, cfg.enable_caching
    fields = cost.kind >= 2  # a clock that reads them
    nxt, num_free_blocks, nrun, head, nwait = (
        state[S_NEXT_ARRIVAL],
        state[S_FREE],
        state[S_NUM_RUNNING],
        state[S_WAITING_HEAD],
        state[S_NUM_WAITING],
    )
    kv, first = state[S_KV_TOKENS], state[S_STEPS]
    now_s, last_end_s = fstate[F_CLOCK], fstate[F_LAST_END]
    capacity = logs[0].shape[0]
    runs = cfg.decode_runs and not caching
    counts[:] = 0
    code = DONE
    chunked = True  # whether the last step scheduled a request more than one token (a prefill run may follow)
    while True:
        code, nxt, nwait, now_s = next_step(arrival_s, now_s, nxt, waiting, head, nwait, nrun, capacity, counts)
        if code != STEP:
            break
        if runs:  # a decode run, or after a step that scheduled a request more than one token a prefill run
            at = (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, kv, now_s, last_end_s, phases,
                  per_phase, logs, counts, groups)  # fmt: skip
            # (one tuple: numba inlines no call with *args)
            steps, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s = decode_run(at)
            if not steps and chunked:
                steps, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s = prefill_run(at)
                state[S_PREFILL_RUNS] += steps > 0
            if steps:
                state[S_RUNS] += 1
                continue
        ns, npre, num_scheduled, num_hit_tokens, nrun, head, nwait, num_free_blocks = schedule(
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
            pool,
            groups,
            acc,
            fields,
        )
        if num_scheduled == 0:
            code = NO_PROGRESS
            break
        batch_end_s = now_s + step_s(cost, num_scheduled, acc)
        chunked = num_scheduled > ns
        num_running_step = nrun
        num_free_blocks, kv, _, nrun, nwait = update_sync(
            cfg, req, pool, groups, running, nrun, waiting, head, nwait, npre,
            BatchOut(out_r, out_n, out_sample, acc, batch_end_s), ns, num_scheduled + num_hit_tokens, num_free_blocks, kv,
        )  # fmt: skip
        record(
            first,
            now_s,
            batch_end_s,
            last_end_s,
            npre,
            num_hit_tokens,
            num_scheduled,
            num_running_step,
            nwait,
            usable - num_free_blocks,
            kv,
            logs,
            events,
            counts,
        )
        last_end_s = batch_end_s
        now_s = batch_end_s
    save_state(state, fstate, nxt, num_free_blocks, nrun, head, nwait, kv, first + counts[0], now_s, last_end_s)
    return code


@njit
def loop_async(
    req,
    cfg,
    cost,
    state,
    fstate,
    running,
    waiting,
    pool,
    groups,
    queue_r,
    queue_n,
    queue_sample,
    queue_i,
    queue_f,
    logs,
    events,
    counts,
    scratch,
):
    """Engine.run_async's loop (asynchronous scheduling, a batch queue of two), with decode runs and prefill runs at once
    without prefix caching (cfg.decode_runs: runs on; decode_run_async, prefill_run_async), and Scheduler.update_from_output (asynchronous). queue_i[slot]:
    requests, tokens, running, waiting, preemptions, prompt tokens hit, whether a decode run may start from it;
    queue_f[slot]: its start and end (s). Stops as loop_sync does."""
    req, cost, state, fstate, running, waiting, pool, groups = (
        unowned(req), unowned(cost), unowned(state), unowned(fstate), unowned(running), unowned(waiting), unowned(pool),
        unowned(groups),
    )  # fmt: skip
    queue_r, queue_n, queue_sample, queue_i, queue_f = (
        unowned(queue_r), unowned(queue_n), unowned(queue_sample), unowned(queue_i), unowned(queue_f)
    )  # fmt: skip
    logs, events, counts = unowned(logs), unowned(events), unowned(counts)
    acc, phases, per_phase, times = unowned(scratch)  # acc: as loop_sync's; times: a decode run's batch ends
    arrival_s, num_computed_tokens = req.arrival_s, req.num_computed_tokens
    n = arrival_s.shape[0]
    fields = cost.kind >= 2  # a clock that reads them
    usable, caching = cfg.num_usable_blocks, cfg.enable_caching
    nxt, num_free_blocks, nrun, head, nwait = (
        state[S_NEXT_ARRIVAL],
        state[S_FREE],
        state[S_NUM_RUNNING],
        state[S_WAITING_HEAD],
        state[S_NUM_WAITING],
    )
    kv, first = state[S_KV_TOKENS], state[S_STEPS]
    queue_head, queue_len = state[S_QUEUE_HEAD], state[S_QUEUE_LEN]
    num_empty, has_finished = state[S_NUM_EMPTY], state[S_HAS_FINISHED]
    now_s, last_end_s, gpu_free_s = fstate[F_CLOCK], fstate[F_LAST_END], fstate[F_GPU_FREE]
    capacity = logs[0].shape[0]
    runs = cfg.decode_runs and not caching
    counts[:] = 0
    code = DONE
    while True:
        nxt, nwait = add_arrivals(arrival_s, now_s, nxt, waiting, head, nwait)
        if counts[0] == capacity:
            code = FULL
            break
        if runs and queue_len == 1 and queue_i[queue_head, 6]:  # Engine.run_async's decode run, or a prefill run
            at = (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, num_free_blocks, now_s, last_end_s, queue_r,
                  queue_n, queue_sample, queue_i, queue_f, queue_head, phases, per_phase, first, logs, events,
                  counts, groups)  # fmt: skip
            ran, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s, batch_end_s, finished = decode_run_async(
                at, times
            )
            prefill = not ran and queue_i[queue_head, 1] > queue_i[queue_head, 0]  # batch 0 holds a prefill chunk
            if prefill:
                ran, nxt, nwait, num_free_blocks, nrun, kv, now_s, last_end_s, batch_end_s, finished = (
                    prefill_run_async(at)
                )
            if ran:
                gpu_free_s = batch_end_s
                has_finished = 1 if finished else 0
                state[S_RUNS] += 1
                state[S_PREFILL_RUNS] += prefill
                continue
        if nrun or nwait or has_finished:  # has_requests(): schedule a batch and queue it
            slot = (queue_head + queue_len) % 2
            ns, npre, num_scheduled, num_hit_tokens, nrun, head, nwait, num_free_blocks = schedule(
                cfg,
                req,
                now_s,
                running,
                nrun,
                waiting,
                head,
                nwait,
                num_free_blocks,
                queue_r[slot],
                queue_n[slot],
                queue_sample[slot],
                pool,
                groups,
                acc,
                fields,
            )
            has_finished = 0
            batch_start_s = now_s if now_s > gpu_free_s else gpu_free_s
            batch_end_s = batch_start_s + step_s(cost, num_scheduled, acc) if num_scheduled else batch_start_s
            gpu_free_s = batch_end_s
            queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2] = ns, num_scheduled, nrun
            queue_i[slot, 3], queue_i[slot, 4], queue_i[slot, 5] = nwait, npre, num_hit_tokens
            queue_i[slot, 6] = num_scheduled and not npre and not num_hit_tokens  # a decode run may start from it
            queue_f[slot, 0], queue_f[slot, 1] = batch_start_s, batch_end_s
            queue_len += 1
            num_empty = 0 if num_scheduled else num_empty + 1
            if num_empty >= 2 and (nrun or nwait):
                queued_tokens = queue_i[slot, 1]
                if queue_len == 2:
                    queued_tokens += queue_i[queue_head, 1]
                if queued_tokens == 0:
                    if nxt == n or arrival_s[nxt] == math.inf:  # (a closed loop's next send waits for a finish)
                        code = NO_PROGRESS
                        break
                    now_s = arrival_s[nxt]  # nothing changes before it arrives
                    num_empty = 0
            if queue_len < 2 and (num_scheduled or nrun or nwait):
                continue
        elif queue_len == 0:
            if nxt == n:
                code = DONE
                break
            now_s = arrival_s[nxt]  # idle: jump to the next arrival
            continue
        slot = queue_head  # wait for the oldest batch's output, process it
        queue_head = (queue_head + 1) % 2
        queue_len -= 1
        batch_end_s = queue_f[slot, 1]
        if batch_end_s > now_s:
            now_s = batch_end_s
        kvc = kv_cache(cfg, pool, groups, num_free_blocks)
        _, num_finished, _, nrun, nwait = shared_update_from_output(
            cfg, kvc, req, BatchOut(queue_r[slot], queue_n[slot], queue_sample[slot], acc, batch_end_s),
            queue_i[slot, 0], running, nrun, waiting, head, nwait,
        )  # fmt: skip
        num_free_blocks = kvc.num_free[0]
        if num_finished:
            has_finished = 1
        num_scheduled, npre = queue_i[slot, 1], queue_i[slot, 4]
        if num_scheduled or npre:  # a step of the records: it ran tokens or preempted
            kv = 0
            for j in range(nrun):
                kv += num_computed_tokens[running[j]]
            record(
                first,
                queue_f[slot, 0],
                batch_end_s,
                last_end_s,
                npre,
                queue_i[slot, 5],
                num_scheduled,
                queue_i[slot, 2],
                queue_i[slot, 3],
                usable - num_free_blocks,
                kv,
                logs,
                events,
                counts,
            )
            last_end_s = batch_end_s
    save_state(state, fstate, nxt, num_free_blocks, nrun, head, nwait, kv, first + counts[0], now_s, last_end_s)
    state[S_QUEUE_HEAD], state[S_QUEUE_LEN], state[S_NUM_EMPTY], state[S_HAS_FINISHED] = (
        queue_head,
        queue_len,
        num_empty,
        has_finished,
    )
    fstate[F_GPU_FREE] = gpu_free_s
    return code
