"""The compiled loops of kvlab.core.engine.fast.compiled (imported only when one runs: it imports numba).

Each loop is the Python engine's loop named in its docstring over the named arrays of fast/arrays.py (req: the
Requests, indexed by request id; cfg: the Limits; pool: the Pool); every decision is a rule of
kvlab.core.engine.rules, compiled here from the same functions the Python engine calls. The waiting queue is a ring
(waiting, its head, its length); the running list an array and its length; the pool a count of free blocks, or with
prefix caching a Pool. loop_sync and loop_async do decode runs (decode_run, decode_run_async) and prefill runs
(prefill_run, prefill_run_async), where prefix caching is off; with it they step one step at a time. Both take their
arrays unowned (unowned), so that numba counts no references. The step cost (arrays.Clock) is a constant, linear,
measured or 2023 one (step_s; measured_s and vllm_2023_s: their Python step_s's float operations).
"""

import builtins
import hashlib
import math
import os
import shutil
import sys
import types
from pathlib import Path

import numpy as np

from kvlab.core import block_pool
from kvlab.core.engine import closed_loop, rules
from kvlab.core.engine.fast import decode_run as python_decode_run
from kvlab.core.engine.fast.arrays import (
    ALL_REDUCE_SIZES,
    ALL_REDUCE_US,
    ATTENTION,
    AXIS0,
    AXIS1,
    AXIS2,
    AXIS3,
    COST_MS,
    CPU_SEQUENCES,
    CPU_US,
    DECODE_GRID,
    DENSE_TOKENS,
    DENSE_US,
    DISPATCH_SIZES,
    DISPATCH_US,
    DONE,
    F_CLOCK,
    F_GPU_FREE,
    F_LAST_END,
    FULL,
    MOE_EXPERTS,
    MOE_TOKENS,
    MOE_US,
    NO_PROGRESS,
    PER_SEQUENCE_US,
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
    SEQUENCES,
    SIZES,
    SKEW_ALPHA,
    SKEW_BINS0,
    SKEW_BINS1,
    SKEW_BINS2,
    SKEW_BINS3,
    SKEW_CHUNKS,
)

# numba imports coverage.py at its own import (about 0.3 s) only to extend a coverage measurement running in the
# process to compiled code; no such measurement covers these loops, so numba is imported without it (coverage
# stays importable afterwards).
_WITHOUT_COVERAGE = "coverage" not in sys.modules and "numba" not in sys.modules
# numba's cache: NUMBA_CACHE_DIR where set (the Makefile sets the checkout's .cache/numba), else, in a checkout,
# that same folder, so that `make setup`'s compilation serves a `kvlab` command run from any shell.
_CHECKOUT = Path(__file__).resolve().parents[4]
_CACHE_BASE = os.environ.get("NUMBA_CACHE_DIR") or (
    str(_CHECKOUT / ".cache" / "numba") if (_CHECKOUT / "pyproject.toml").is_file() else ""
)
# numba keys a cached function by its own file alone: a loop compiled with an older rules.py (or block_pool.py, ...)
# inlined would load as it was. So the cache lives in a folder named by the contents of every source the loops
# compile (SOURCE_FILES): an edit to any of them compiles the loops afresh.
SOURCE_FILES = [Path(m.__file__) for m in (rules, block_pool, closed_loop, python_decode_run)] + [
    Path(__file__).with_name(name) for name in ("_kernels.py", "_kernels_v0.py", "arrays.py")
]
_DIGEST = hashlib.sha256(b"".join(f.read_bytes() for f in SOURCE_FILES)).hexdigest()[:16]
CACHE_DIR = str(Path(_CACHE_BASE) / f"loops-{_DIGEST}") if _CACHE_BASE else ""
if CACHE_DIR and not Path(CACHE_DIR).is_dir():  # loops of older sources are never loaded again
    for _old in Path(_CACHE_BASE).glob("loops-*"):
        shutil.rmtree(_old, ignore_errors=True)
if _WITHOUT_COVERAGE:
    sys.modules["coverage"] = None
try:
    import numba
    from numba.core import cgutils
    from numba.extending import intrinsic
    from numba.np.arrayobj import make_array
finally:
    if _WITHOUT_COVERAGE:
        del sys.modules["coverage"]
if CACHE_DIR:
    numba.config.CACHE_DIR = CACHE_DIR  # read when each dispatcher below opens its cache

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3
STEP = -1  # next_step: a step to take (DONE, FULL and NO_PROGRESS end a chunk)
NEVER = 1 << 62  # free blocks no pool has


def _jit(function, inline="never"):
    """numba.njit with its on-disk cache, or without where numba finds no writable place for it."""
    try:
        return numba.njit(cache=True, nogil=True, inline=inline)(function)
    except RuntimeError:
        return numba.njit(nogil=True, inline=inline)(function)


def _inline(function):
    """_jit, the function inlined into its callers at numba's IR level."""
    return _jit(function, "always")


def _compiled_rules() -> dict:
    """Every function of kvlab.core.engine.rules, decode_run.steps_covered, closed_loop.send_s and the free queue of
    kvlab.core.block_pool (block_pool.QUEUE), compiled: the same functions the Python engine calls, each with its calls to the others
    resolved to their compiled selves (and block_pool's integer constants as its)."""
    namespace = {"__builtins__": builtins} | {k: v for k, v in vars(block_pool).items() if type(v) is int}
    functions = [
        f for f in vars(rules).values() if isinstance(f, types.FunctionType) and f.__module__ == rules.__name__
    ]
    functions += [python_decode_run.steps_covered, closed_loop.send_s]
    functions += [getattr(block_pool, name) for name in block_pool.QUEUE]
    for function in functions:
        copy = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__)
        namespace[function.__name__] = _inline(copy)
    return namespace


def _unowned_value(context, builder, ty, value):
    """value (of numba type ty) with every array in it a view that owns no reference: the same data, shape and
    strides, a null meminfo (so that numba's reference counting skips it)."""
    if isinstance(ty, numba.types.Array):
        src = make_array(ty)(context, builder, value=value)
        dst = make_array(ty)(context, builder)
        for name in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(dst, name, getattr(src, name))
        dst.meminfo = cgutils.get_null_value(dst.meminfo.type)
        dst.parent = cgutils.get_null_value(dst.parent.type)
        return dst._getvalue()
    if isinstance(ty, numba.types.BaseTuple):
        for i, member in enumerate(ty):
            value = builder.insert_value(
                value, _unowned_value(context, builder, member, builder.extract_value(value, i)), i
            )
    return value


@intrinsic
def unowned(typingctx, x):
    """x (an array, or a tuple holding arrays and scalars) with its arrays unowned views (_unowned_value). numba counts
    a reference to an array each time a variable takes it: at every call, inlined or not, for each array argument
    (a tuple's arrays included), and at every field a function unpacks. Those are atomic operations, about two-thirds
    of the compiled loop's time before (perf, 200,000 requests). A loop takes its arguments unowned once, at its start:
    the arrays live through the call (its caller holds them), and no view of them outlives it."""

    def codegen(context, builder, signature, args):
        return _unowned_value(context, builder, signature.args[0], args[0])

    return x(x), codegen


_RULES = _compiled_rules()
step_token_cap, running_num_new_tokens, allocation_is_noop, num_blocks_to_allocate = (
    _RULES[name]
    for name in ("step_token_cap", "running_num_new_tokens", "allocation_is_noop", "num_blocks_to_allocate")
)
num_lookup_blocks, admission_num_new_tokens, admission_num_new_blocks, preemption_victim = (
    _RULES[name]
    for name in ("num_lookup_blocks", "admission_num_new_tokens", "admission_num_new_blocks", "preemption_victim")
)
num_skipped_tokens, admission_blocks = _RULES["num_skipped_tokens"], _RULES["admission_blocks"]
samples, is_finished, settles_placeholder = (_RULES[name] for name in ("samples", "is_finished", "settles_placeholder"))
steps_covered, send_s = _RULES["steps_covered"], _RULES["send_s"]
num_free, take_blocks, free_table, touch_blocks, cache_full_blocks = (
    _RULES[name] for name in ("num_free", "take_blocks", "free_table", "touch_blocks", "cache_blocks")
)


# ---------------------------------------------------------------- the block pool with prefix caching
# BlockPool (kvlab/core/block_pool.py) over the named arrays of fast/arrays.py Pool.


@_inline
def hash_id(pool, r, j):
    """The hash id of request r's block j: shared by equal full prompt blocks (same parents), else its own."""
    if j < pool.num_shared[r]:
        return pool.hash_shared[pool.hash_offset[r] + j]
    return pool.hash_base[r] + j - pool.num_shared[r]


@_inline
def release_table(pool, r, n):
    """KVCacheManager.free with caching: the request's table freed (block_pool.free_table), its row given back."""
    slot = pool.slot_of[r]
    free_table(pool, pool.tables[slot], n)
    pool.free_slots[pool.num_free_slots[0]] = slot
    pool.num_free_slots[0] += 1
    pool.slot_of[r] = -1


@_inline
def cache_blocks(pool, r, num_cached, num_known_tokens, block_size):
    """KVCacheManager.cache_blocks: the request's full blocks not yet cached go into the cache; the new count."""
    start, end = num_cached[r], num_known_tokens // block_size
    if end > start:
        ids = pool.hash_ids
        for j in range(start, end):
            ids[j - start] = hash_id(pool, r, j)
        cache_full_blocks(pool, pool.tables[pool.slot_of[r]], start, end, ids)
        num_cached[r] = end


@_inline
def take_slot(pool, r):
    """A block-table row for a request being admitted."""
    pool.num_free_slots[0] -= 1
    pool.slot_of[r] = pool.free_slots[pool.num_free_slots[0]]


@_inline
def admitted_tokens(cfg, num_tokens, r, num_hits, evictable, budget, free, cap_tokens):
    """Whether schedule()'s waiting loop admits request r (num_hits blocks hit in the prefix cache, evictable of them
    in the free queue; budget tokens and free blocks left): (its tokens, its new blocks), or (0, 0) if refused."""
    block_size, max_model_len, chunked = cfg.block_size, cfg.max_model_len, cfg.enable_chunked_prefill
    m = admission_num_new_tokens(num_tokens[r], num_hits * block_size, cap_tokens, budget, chunked != 0)
    if m == 0:
        return 0, 0
    new = admission_num_new_blocks(num_tokens[r], num_hits, evictable, m, free, block_size, max_model_len)
    if new < 0:
        return 0, 0
    return m, new


# ---------------------------------------------------------------- a hybrid model's KV cache groups
# HybridKVCacheManager (kvlab/core/engine/kv_cache_manager.py) without prefix caching, over arrays.Groups: which
# block a request gets changes nothing then, so each group's table is its length and its leading nulls. Groups of one
# spec hold tables of the same lengths and nulls at every step: only the first of them (Groups.weight: how many) is
# kept, and counted that many times.


@_inline
def held_in_groups(groups, r):
    """The blocks request r holds in every group (its tables but their leading nulls)."""
    held = 0
    for g in range(groups.block_size.shape[0]):
        held += groups.weight[g] * (groups.blocks[r, g] - groups.nulls[r, g])
    return held


@_inline
def release_groups(groups, r):
    """HybridKVCacheManager.free: every group's blocks given back; how many."""
    held = held_in_groups(groups, r)
    groups.blocks[r, :] = 0
    groups.nulls[r, :] = 0
    return held


@_inline
def remove_skipped_blocks(groups, r, num_processed_tokens):
    """HybridKVCacheManager.remove_skipped_blocks: each window's and chunk's blocks before the next token's window or
    chunk become leading nulls; how many blocks they give back."""
    if num_processed_tokens <= 0:
        return 0
    freed = 0
    for g in range(groups.block_size.shape[0]):
        window, chunk = groups.window[g], groups.chunk[g]
        if window == 0 and chunk == 0 or groups.weight[g] == 0:
            continue
        end = num_skipped_tokens(num_processed_tokens, window, chunk) // groups.block_size[g]
        if end > groups.blocks[r, g]:
            end = groups.blocks[r, g]
        if groups.nulls[r, g] < end:
            freed += groups.weight[g] * (end - groups.nulls[r, g])
            groups.nulls[r, g] = end
    groups.freed[0] += freed
    return freed


@_inline
def blocks_for_groups(groups, r, num_computed_tokens, num_new_tokens, max_model_len, take):
    """The new blocks every group's table needs to hold num_new_tokens more tokens (num_blocks_to_allocate); take:
    and the tables grow by them."""
    need = 0
    for g in range(groups.block_size.shape[0]):
        if groups.weight[g] == 0:
            continue
        new = num_blocks_to_allocate(
            num_computed_tokens, num_new_tokens, groups.blocks[r, g], groups.block_size[g], max_model_len
        )
        if new > 0:
            need += groups.weight[g] * new
            if take:
                groups.blocks[r, g] += new
    return need


@_inline
def admission_to_groups(cfg, groups, num_tokens, r, budget, cap_tokens):
    """What admitting request r to a hybrid model's groups takes (HybridKVCacheManager.can_admit, then allocate_slots):
    (its tokens, the free blocks it needs, its new blocks), or (0, 0, 0) if the budget refuses it. It needs every
    group's blocks for its whole length free (a window's or chunk's at most its admission cap, rules.admission_blocks),
    then those for the tokens it computes now."""
    max_model_len = cfg.max_model_len
    m = admission_num_new_tokens(num_tokens[r], 0, cap_tokens, budget, cfg.enable_chunked_prefill != 0)
    if m == 0:
        return 0, 0, 0
    n = num_tokens[r] if num_tokens[r] < max_model_len else max_model_len
    whole = 0
    for g in range(groups.block_size.shape[0]):
        whole += groups.weight[g] * admission_blocks(n, groups.block_size[g], groups.cap[g])
    new = blocks_for_groups(groups, r, 0, m, max_model_len, False)
    return m, whole if whole > new else new, new


@_inline
def admitted_to_groups(cfg, groups, num_tokens, r, budget, free, cap_tokens):
    """admitted_tokens for a hybrid model: (its tokens, its new blocks), or (0, 0) if refused (admission_to_groups)."""
    m, need, new = admission_to_groups(cfg, groups, num_tokens, r, budget, cap_tokens)
    if m == 0 or need > free:
        return 0, 0
    return m, new


@_inline
def skipped_blocks(groups, g, num_processed_tokens):
    """The blocks of group g before the window or chunk of the token after num_processed_tokens (a window's or
    chunk's leading nulls once remove_skipped_blocks ran)."""
    if num_processed_tokens <= 0:
        return 0
    return num_skipped_tokens(num_processed_tokens, groups.window[g], groups.chunk[g]) // groups.block_size[g]


@_inline
def group_phases(groups, running, nrun, computed, limit, max_model_len, lag):
    """A hybrid decode run's set-up (decode_run): in groups.hist, for each first group of a spec (groups.weight: the
    groups of that spec), the running requests by the phase at which they take a block (the steps j with
    (c + j) % block_size == 0, c their computed tokens) and, from the run's second step, give one back as the c + j -
    lag tokens settled by step j (lag: 1 under asynchronous scheduling, a token in flight) move on (a window's block
    leaves it at (c + j - lag - window + 1) % block_size == 0 once past its first block; a chunk's blocks at
    (c + j - lag) % chunk == 0, chunk / block_size of them); a window that starts to free within limit steps is an
    event (groups.events: its step, its phase's place, its weight). Returns (the events, the blocks step 0 frees)."""
    hist, events, weight, offset = groups.hist, groups.events, groups.weight, groups.offset
    num_events = 0
    freed = 0
    for i in range(nrun):
        r = running[i]
        c = computed[r]
        for g in range(groups.block_size.shape[0]):
            w = weight[g]
            if w == 0:
                continue
            window, chunk, bs = groups.window[g], groups.chunk[g], groups.block_size[g]
            if window or chunk:  # step 0 frees what the window of token c - lag + 1 left behind
                end = skipped_blocks(groups, g, c - lag)
                if end > groups.nulls[r, g]:
                    freed += w * (end - groups.nulls[r, g])
            at = offset[g]
            if bs < max_model_len:  # (a Mamba state's block of max_model_len tokens takes none)
                hist[at + (-c) % bs] += w
            if window:
                first = window - 1 - c + lag + bs  # the first step at which it frees one
                if first <= 0:
                    hist[at + bs + (window - 1 - c + lag) % bs] += w
                elif first < limit:
                    events[num_events, 0], events[num_events, 1] = first, at + bs + first % bs
                    events[num_events, 2] = w
                    num_events += 1
            elif chunk:
                hist[at + bs + (lag - c) % chunk] += w * (chunk // bs)
    if num_events > 1:
        order = np.argsort(events[:num_events, 0])
        events[:num_events] = events[order]
    return num_events, freed


@_inline
def group_blocks_at(groups, j, max_model_len):
    """(blocks taken, blocks given back) at step j >= 1 of a hybrid decode run (group_phases' histograms)."""
    hist, weight, offset = groups.hist, groups.weight, groups.offset
    taken = freed = 0
    for g in range(groups.block_size.shape[0]):
        if weight[g] == 0:
            continue
        at, bs = offset[g], groups.block_size[g]
        if bs < max_model_len:
            taken += hist[at + j % bs]
        if groups.window[g]:
            freed += hist[at + bs + j % bs]
        elif groups.chunk[g]:
            freed += hist[at + bs + j % groups.chunk[g]]
    return taken, freed


@_inline
def group_phases_cleared(groups, nrun, computed_before, max_model_len, lag):
    """groups.hist all zeros again after a run (group_phases' entries, from each request's computed tokens then)."""
    hist, offset = groups.hist, groups.offset
    for i in range(nrun):
        c = computed_before[i]
        for g in range(groups.block_size.shape[0]):
            if groups.weight[g] == 0:
                continue
            at, bs, window, chunk = offset[g], groups.block_size[g], groups.window[g], groups.chunk[g]
            if bs < max_model_len:
                hist[at + (-c) % bs] = 0
            if window:
                hist[at + bs + (window - 1 - c + lag) % bs] = 0
            elif chunk:
                hist[at + bs + (lag - c) % chunk] = 0


@_inline
def groups_advanced(groups, r, c, j, lag):
    """Request r's tables after j decode steps from c computed tokens: each group's blocks for c + j tokens, a window's
    or chunk's leading nulls those of the last step's c + j - 1 - lag settled tokens (their count added to
    groups.freed)."""
    for g in range(groups.block_size.shape[0]):
        if groups.weight[g] == 0:
            continue
        bs = groups.block_size[g]
        groups.blocks[r, g] += (c + j + bs - 1) // bs - (c + bs - 1) // bs
        if groups.window[g] or groups.chunk[g]:
            end = skipped_blocks(groups, g, c + j - 1 - lag)
            if end > groups.nulls[r, g]:
                groups.freed[0] += groups.weight[g] * (end - groups.nulls[r, g])
                groups.nulls[r, g] = end


@_inline
def schedule(
    cfg,
    req,
    clock,
    running,
    nrun,
    waiting,
    head,
    nwait,
    free,
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
    preemptions, tokens, prompt tokens hit in the prefix cache, nrun, head, nwait, free). Without prefix caching
    (cfg.enable_caching == 0) the pool is the count free; with it, pool's blocks. A hybrid model's groups (groups,
    without prefix caching) take Requests.num_blocks's place, and every running request calls allocate_slots (a
    decode inside its last block may still free a block behind its window)."""
    (
        max_tokens_total,
        num_tokens,
        computed,
        num_blocks,
        num_cached,
        status,
        placeholders,
        in_flight,
        first_scheduled_s,
    ) = (
        req.max_tokens_total,
        req.num_tokens,
        req.computed,
        req.num_blocks,
        req.num_cached,
        req.status,
        req.placeholders,
        req.in_flight,
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
        c = computed[r]
        m = running_num_new_tokens(
            num_tokens[r], placeholders[r], c, max_tokens_total[r], cap_tokens, budget, max_model_len
        )
        if m == 0:  # async: its last token in flight, or at max_model_len
            i += 1
            continue
        if hybrid:  # allocate_slots first frees the blocks behind each window (of the settled tokens)
            free += remove_skipped_blocks(groups, r, (c if c < max_model_len else max_model_len) - in_flight[r])
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
            if new <= free:
                if hybrid:
                    free -= blocks_for_groups(groups, r, c, m, max_model_len, True)
                elif new > 0:
                    if caching:
                        take_blocks(pool, new, pool.tables[pool.slot_of[r]], num_blocks[r])
                    free -= new
                    num_blocks[r] += new
                if caching:
                    cache_blocks(pool, r, num_cached, min(c + m, num_tokens[r]), block_size)
                break
            nrun = preemption_victim(nrun)
            v = running[nrun]  # the most recently admitted running request
            free, head, nwait = preempt(req, pool, groups, caching, v, free, waiting, head, nwait)
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
                m, new = admitted_to_groups(cfg, groups, num_tokens, r, budget, free, cap_tokens)
            else:
                m, new = admitted_tokens(cfg, num_tokens, r, num_hits, evictable, budget, free, cap_tokens)
            if m == 0:
                break
            start = computed[r] + num_hits * block_size
            if caching:
                take_slot(pool, r)
                row = pool.tables[pool.slot_of[r]]
                touch_blocks(pool, pool.hits, num_hits)  # a hit no request held leaves the free queue
                row[:num_hits] = pool.hits[:num_hits]
                num_blocks[r] = num_hits
                num_cached[r] = num_hits
                if new > 0:
                    take_blocks(pool, new, row, num_hits)
                    num_blocks[r] += new
                cache_blocks(pool, r, num_cached, min(start + m, num_tokens[r]), block_size)
                free = num_free(pool)
            elif hybrid:
                free -= blocks_for_groups(groups, r, 0, m, max_model_len, True)
            elif new > 0:
                free -= new
                num_blocks[r] += new
            head = (head + 1) % cap
            nwait -= 1
            running[nrun] = r
            nrun += 1
            status[r] = RUNNING
            computed[r] = num_hits * block_size
            hit_tokens += num_hits * block_size
            if math.isnan(first_scheduled_s[r]):
                first_scheduled_s[r] = clock
            out_r[ns] = r
            out_n[ns] = m
            ns += 1
            budget -= m
    num_scheduled = account(req, out_r, out_n, out_sample, ns, acc, fields, asynchronous)
    return ns, npre, num_scheduled, hit_tokens, nrun, head, nwait, free


@_inline
def account(req, out_r, out_n, out_sample, ns, acc, fields, asynchronous):
    """Scheduler.account() (kvlab/core/engine/scheduler.py) for the batch's ns requests in out_r and out_n: each
    one's computed tokens moved on and whether it samples (out_sample); where fields (a clock that reads them,
    step_s), the rest of the step's Batch in acc; asynchronous, its tokens in flight and placeholders. Returns the
    batch's tokens."""
    computed, num_tokens, placeholders, in_flight = req.computed, req.num_tokens, req.placeholders, req.in_flight
    num_scheduled = context = decodes = decode_context = prefills = pairs = low = high = 0
    for j in range(ns):
        r = out_r[j]
        m = out_n[j]
        before = computed[r]
        c = before + m
        computed[r] = c
        num_scheduled += m
        sample = samples(c, num_tokens[r], placeholders[r])
        out_sample[j] = sample
        if fields:  # the Batch's other fields, for a clock that reads them
            context += c
            if m == 1 and sample:
                decodes += 1
                decode_context += c
                low = c if low == 0 or c < low else low
                high = c if c > high else high
            else:
                prefills += 1
                pairs += m * before + m * (m + 1) // 2
        if asynchronous:
            in_flight[r] += m
            if sample:
                placeholders[r] += 1
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


@_inline
def next_step(arrival, clock, nxt, waiting, head, nwait, nrun, capacity, counts):
    """Engine.run's loop up to its next step: the requests that have arrived join the waiting queue; with nothing
    running or waiting the clock jumps to the next arrival. Returns (STEP, DONE when every request finished, or FULL
    when the chunk's capacity step records are full; nxt, nwait, clock)."""
    n = arrival.shape[0]
    while True:
        nxt, nwait = add_arrivals(arrival, clock, nxt, waiting, head, nwait)
        if nrun == 0 and nwait == 0:
            if nxt == n:
                return DONE, nxt, nwait, clock
            clock = arrival[nxt]  # idle: jump to the next arrival
            continue
        if counts[0] == capacity:
            return FULL, nxt, nwait, clock
        return STEP, nxt, nwait, clock


@_inline
def save_state(state, fstate, nxt, free, nrun, head, nwait, kv, steps, clock, last_end):
    """Keep the loop's state for its next chunk (state and fstate, read back at its start)."""
    state[S_NEXT_ARRIVAL], state[S_FREE], state[S_NUM_RUNNING] = nxt, free, nrun
    state[S_WAITING_HEAD], state[S_NUM_WAITING], state[S_KV_TOKENS] = head, nwait, kv
    state[S_STEPS] = steps
    fstate[F_CLOCK], fstate[F_LAST_END] = clock, last_end


@_inline
def add_arrivals(arrival, clock, nxt, waiting, head, nwait):
    """Engine.add_arrivals: every request that has arrived by the clock joins the back of the waiting queue, in
    arrival order; returns the next request to arrive and the queue's length."""
    n, cap = arrival.shape[0], waiting.shape[0]
    while nxt < n and arrival[nxt] <= clock:
        waiting[(head + nwait) % cap] = nxt
        nwait += 1
        nxt += 1
    return nxt, nwait


@_inline
def finished_at(req, end):
    """ClosedLoop.finished (kvlab/core/engine/closed_loop.py): a request finished at end, in time order; in a closed loop
    the next request waiting for a slot is sent (closed_loop.send_s, compiled), its send written into req.arrival. An
    open loop (req.closed_loop empty): nothing."""
    loop = req.closed_loop
    if loop.shape[0]:
        i = loop[0] + loop[1]
        loop[1] += 1
        if i < req.arrival.shape[0]:
            req.arrival[i] = send_s(req.open_loop[i], req.arrival[i - 1], end)


# ---------------------------------------------------------------- the step cost
# ConstantStepCost, LinearStepCost and MeasuredStepCost (kvlab/core/cost/) over the named arrays of arrays.Clock, each
# function the float operations of its Python namesake in the same order (kvlab.core.cost.interpolate's bracket, blend
# and interp; MeasuredStepCost's step_s and what it calls), so that a step lasts the same bits either way.


@_jit
def search(axis, x, right):
    """np.searchsorted(axis, x, side="right" if right else "left") of a sorted axis and a number (not NaN), by
    bisection: numba's searchsorted costs about 40 ns a call more."""
    low, high = 0, axis.shape[0]
    while low < high:
        middle = (low + high) >> 1
        if axis[middle] < x or (right and axis[middle] == x):
            low = middle + 1
        else:
            high = middle
    return low


@_inline
def bracket(axis, x):
    """interpolate.bracket: (j, w), x w of the way from axis[j] to axis[j + 1]."""
    j = search(axis, x, True) - 1
    last = axis.shape[0] - 2
    j = 0 if j < 0 else last if j > last else j
    w = (x - axis[j]) / (axis[j + 1] - axis[j])
    return j, (w if w > 0.0 else 0.0)


@_inline
def blend(low, high, w):
    return (1.0 - w) * low + w * high


@_inline
def interp(axis, values, x):
    """interpolate.interp: piecewise linear, past the last point along the secant of the last doubling."""
    last = axis.shape[0] - 1
    if x <= axis[last]:
        j, w = bracket(axis, x)
        return blend(values[j], values[j + 1], w)
    j = search(axis, axis[last] / 2, True) - 1
    j = 0 if j < 0 else j
    return values[last] + (values[last] - values[j]) * (x - axis[last]) / (axis[last] - axis[j])


@_jit
def part(clock, name):
    """The clock's table `name` (an arrays.TABLES index): a view of clock.table."""
    return clock.table[clock.at[name] : clock.at[name + 1]]


@_jit
def length(clock, name):
    """The number of values in the clock's table `name`."""
    return clock.at[name + 1] - clock.at[name]


@_inline
def padded_tokens(clock, num_tokens):
    sizes = part(clock, SIZES)
    if sizes.shape[0] == 0 or num_tokens > sizes[sizes.shape[0] - 1]:
        return num_tokens
    return int(sizes[search(sizes, num_tokens, False)])


@_jit
def moe_block_us(clock, num_tokens):
    """MeasuredStepCost.moe_block_us (with active_experts)."""
    e, k = clock.num_experts, clock.num_experts_per_tok
    ep, dp = clock.expert_parallel_size, clock.data_parallel_size
    if e == 0:
        return 0.0
    tokens = dp * num_tokens
    active = min(e / ep, k * tokens / ep, e / ep * (1.0 - (1.0 - k / e) ** float(tokens)))
    i, wi = bracket(part(clock, MOE_TOKENS), num_tokens)
    j, wj = bracket(part(clock, MOE_EXPERTS), active)
    grid = part(clock, MOE_US).reshape((length(clock, MOE_TOKENS), length(clock, MOE_EXPERTS)))
    return blend(blend(grid[i, j], grid[i, j + 1], wj), blend(grid[i + 1, j], grid[i + 1, j + 1], wj), wi)


@_jit
def fixed_us(clock, num_tokens, num_sequences):
    """MeasuredStepCost.fixed_us of one rank: dense, MoE, all-reduce and dispatch at the padded tokens."""
    padded = padded_tokens(clock, num_tokens)
    us = interp(part(clock, DENSE_TOKENS), part(clock, DENSE_US), padded)
    us += clock.layers * moe_block_us(clock, padded)
    if num_sequences:
        us += interp(part(clock, SEQUENCES), part(clock, PER_SEQUENCE_US), num_sequences)
    if clock.all_reduce_per_step:
        us += clock.all_reduce_per_step * interp(
            part(clock, ALL_REDUCE_SIZES), part(clock, ALL_REDUCE_US), padded * clock.all_reduce_bytes_per_token
        )
    if clock.dispatch_per_step:
        us += clock.dispatch_per_step * interp(
            part(clock, DISPATCH_SIZES),
            part(clock, DISPATCH_US),
            clock.data_parallel_size * padded * clock.dispatch_bytes_per_token,
        )
    return us + clock.overhead_us


@_jit
def decode_attention_us(clock, num_decodes, history):
    """MeasuredStepCost.decode_attention_us: the decode-only plane, along the decodes, then the history."""
    i, wi = bracket(part(clock, AXIS2), num_decodes)
    j, w = bracket(part(clock, AXIS3), history)
    grid = part(clock, DECODE_GRID).reshape((length(clock, AXIS2), length(clock, AXIS3)))
    return blend(blend(grid[i, j], grid[i + 1, j], wi), blend(grid[i, j + 1], grid[i + 1, j + 1], wi), w)


@_jit
def mixed_at(clock, a, wa, b, wb, c, wc, history):
    """MeasuredStepCost._mixed_at of the corners (a, b, c) and weights _mixed_corners found."""
    shape = (length(clock, AXIS0), length(clock, AXIS1), length(clock, AXIS2), length(clock, AXIS3))
    grid = part(clock, ATTENTION).reshape(shape)
    d, wd = bracket(part(clock, AXIS3), history)
    k0 = blend(grid[a, b, c, d], grid[a, b, c, d + 1], wd)
    k1 = blend(grid[a, b, c + 1, d], grid[a, b, c + 1, d + 1], wd)
    k2 = blend(grid[a, b + 1, c, d], grid[a, b + 1, c, d + 1], wd)
    k3 = blend(grid[a, b + 1, c + 1, d], grid[a, b + 1, c + 1, d + 1], wd)
    k4 = blend(grid[a + 1, b, c, d], grid[a + 1, b, c, d + 1], wd)
    k5 = blend(grid[a + 1, b, c + 1, d], grid[a + 1, b, c + 1, d + 1], wd)
    k6 = blend(grid[a + 1, b + 1, c, d], grid[a + 1, b + 1, c, d + 1], wd)
    k7 = blend(grid[a + 1, b + 1, c + 1, d], grid[a + 1, b + 1, c + 1, d + 1], wd)
    first = blend(blend(k0, k1, wc), blend(k2, k3, wc), wb)
    return blend(first, blend(blend(k4, k5, wc), blend(k6, k7, wc), wb), wa)


@_inline
def skew_bucket(bins, x):
    """SkewFit.bucket: i with bins[i] < x <= bins[i + 1], the last past the last edge."""
    i = search(bins[1:], x, False) + 1
    last = bins.shape[0] - 1
    return (i if i < last else last) - 1


@_jit
def skew_alpha(clock, prefill_tokens, prefill_history, num_decodes, dctx, low, high):
    """SkewFit.alpha_at for a batch of num_decodes decodes (more than one, of unequal context from low to high) beside
    a prefill chunk of prefill_tokens (0: none) after prefill_history."""
    chunks = part(clock, SKEW_CHUNKS)
    chunk = -1
    for i in range(chunks.shape[0]):
        if chunks[i] == prefill_tokens:
            chunk = i
            break
    if chunk < 0:
        return clock.skew_default
    rate = (dctx - num_decodes * low) / (num_decodes * (high - low))
    rate = 0.0 if rate < 0.0 else 1.0 if rate > 1.0 else rate
    bins = (length(clock, SKEW_BINS0), length(clock, SKEW_BINS1), length(clock, SKEW_BINS2), length(clock, SKEW_BINS3))
    shape = (chunks.shape[0], bins[0] - 1, bins[1] - 1, bins[2] - 1, bins[3] - 1)  # the bins between the edges
    return part(clock, SKEW_ALPHA).reshape(shape)[
        chunk,
        skew_bucket(part(clock, SKEW_BINS0), num_decodes),
        skew_bucket(part(clock, SKEW_BINS1), rate),
        skew_bucket(part(clock, SKEW_BINS2), high - 1),
        skew_bucket(part(clock, SKEW_BINS3), int(prefill_history)),
    ]


@_jit
def skewed_attention_us(clock, attention_us, prefill_tokens, prefill_history, num_decodes, dctx, low, high, corners):
    """MeasuredStepCost.skewed_attention_us (with SkewFit.alpha_at); corners: (a, wa, b, wb, c, wc) of a mixed
    batch (prefill_tokens > 0)."""
    if not clock.skew or num_decodes < 2 or high <= low:
        return attention_us
    alpha = skew_alpha(clock, prefill_tokens, prefill_history, num_decodes, dctx, low, high)
    if alpha == 0.0:
        return attention_us
    if prefill_tokens:
        a, wa, b, wb, c, wc = corners
        at_max = mixed_at(clock, a, wa, b, wb, c, wc, high - 1)
    else:
        at_max = decode_attention_us(clock, num_decodes, high - 1)
    if at_max <= attention_us:
        return attention_us
    skewed = attention_us + alpha * (at_max - attention_us)
    return skewed if skewed > 0.0 else 0.0


@_jit
def with_cpu_us(clock, gpu_us, num_sequences):
    """MeasuredStepCost.with_cpu_us: the CPU's scheduling added, or the longer of the two."""
    if length(clock, CPU_SEQUENCES) == 0:
        return gpu_us
    cpu = interp(part(clock, CPU_SEQUENCES), part(clock, CPU_US), num_sequences)
    if not clock.cpu_overlapped:
        return gpu_us + cpu
    return cpu if cpu > gpu_us else gpu_us


@_jit
def decode_run_clock(clock, num_decodes, dctx, low, high):
    """What stays the same through the steps of a decode run on the measured clock, from its first step's Batch
    fields (num_decodes decodes of dctx context tokens in all, from low to high each): every term but attention, the
    decode plane's row along the decodes, the skew fit's alpha but for the largest history's bucket, and the CPU's
    time. decode_step_s reads it."""
    if clock.kind != 2:  # none to read
        return num_decodes, dctx, high, 0.0, 0, 0.0, False, -1, -1, -1, -1, 0.0
    fixed = fixed_us(clock, num_decodes, num_decodes)
    i, wi = bracket(part(clock, AXIS2), num_decodes)
    skewed = clock.skew != 0 and num_decodes >= 2 and high > low  # the history spread, the same every step
    chunk = b0 = b1 = b3 = -1
    if skewed:
        chunks = part(clock, SKEW_CHUNKS)
        for k in range(chunks.shape[0]):
            if chunks[k] == 0:
                chunk = k
                break
        if chunk >= 0:
            rate = (dctx - num_decodes * low) / (num_decodes * (high - low))  # each history grows by one: the same
            rate = 0.0 if rate < 0.0 else 1.0 if rate > 1.0 else rate
            b0 = skew_bucket(part(clock, SKEW_BINS0), num_decodes)
            b1 = skew_bucket(part(clock, SKEW_BINS1), rate)
            b3 = skew_bucket(part(clock, SKEW_BINS3), 0)
    cpu = interp(part(clock, CPU_SEQUENCES), part(clock, CPU_US), num_decodes) if length(clock, CPU_SEQUENCES) else 0.0
    return num_decodes, dctx, high, fixed, i, wi, skewed, chunk, b0, b1, b3, cpu


@_jit
def decode_step_s(clock, run, j):
    """measured_s of step j of the decode run decode_run_clock described (its decodes' context j tokens longer
    each): the same float operations, the run's constant terms read from it."""
    num_decodes, dctx, high, fixed, i, wi, skewed, chunk, b0, b1, b3, cpu = run
    dctx, high = dctx + num_decodes * j, high + j
    grid = part(clock, DECODE_GRID).reshape((length(clock, AXIS2), length(clock, AXIS3)))
    axis = part(clock, AXIS3)
    k, w = bracket(axis, (dctx - num_decodes) / num_decodes)
    attention = blend(blend(grid[i, k], grid[i + 1, k], wi), blend(grid[i, k + 1], grid[i + 1, k + 1], wi), w)
    if skewed:
        if chunk < 0:
            alpha = clock.skew_default
        else:
            bins = (length(clock, SKEW_BINS0), length(clock, SKEW_BINS1), length(clock, SKEW_BINS2))
            shape = (length(clock, SKEW_CHUNKS), bins[0] - 1, bins[1] - 1, bins[2] - 1, length(clock, SKEW_BINS3) - 1)
            b2 = skew_bucket(part(clock, SKEW_BINS2), high - 1)
            alpha = part(clock, SKEW_ALPHA).reshape(shape)[chunk, b0, b1, b2, b3]
        if alpha != 0.0:
            k, w = bracket(axis, high - 1)
            at_max = blend(blend(grid[i, k], grid[i + 1, k], wi), blend(grid[i, k + 1], grid[i + 1, k + 1], wi), w)
            if at_max > attention:
                attention = attention + alpha * (at_max - attention)
                attention = attention if attention > 0.0 else 0.0
    us = fixed
    us += clock.layers * attention
    if length(clock, CPU_SEQUENCES) == 0:
        return us / 1e6
    if not clock.cpu_overlapped:
        return (us + cpu) / 1e6
    return (cpu if cpu > us else us) / 1e6


@_jit
def prefill_run_clock(clock, num_decodes, chunk):
    """What stays the same through the steps of a prefill run (prefill_run: num_decodes decodes beside a chunk of
    chunk tokens) on the measured clock: every term but attention (the same tokens and sequences), the attention
    grid's corners along the chunk and the decodes, and the CPU's time. prefill_step_s reads it."""
    if clock.kind != 2:  # none to read
        return 0.0, 0, 0.0, 0, 0.0, 0.0
    fixed = fixed_us(clock, num_decodes + chunk, num_decodes + 1)
    a, wa = bracket(part(clock, AXIS0), chunk)
    c, wc = bracket(part(clock, AXIS2), num_decodes)
    cpu = (
        interp(part(clock, CPU_SEQUENCES), part(clock, CPU_US), num_decodes + 1)
        if length(clock, CPU_SEQUENCES)
        else 0.0
    )
    return fixed, a, wa, c, wc, cpu


@_jit
def prefill_step_s(clock, run, num_decodes, chunk, before, dctx, low, high):
    """measured_s of a step of the prefill run prefill_run_clock described: its chunk after before tokens of the
    prompt, its decodes of dctx context tokens in all, from low to high each; the same float operations, the run's
    constant terms read from it."""
    fixed, a, wa, c, wc, cpu = run
    decode_history = (dctx - num_decodes) / num_decodes if num_decodes else 0.0
    pairs = chunk * before + chunk * (chunk + 1) // 2
    history = (pairs - chunk * (chunk + 1) / 2) / chunk
    history = history if history > 0.0 else 0.0
    b, wb = bracket(part(clock, AXIS1), history)
    attention = mixed_at(clock, a, wa, b, wb, c, wc, decode_history)
    corners = (a, wa, b, wb, c, wc)
    us = fixed
    us += clock.layers * skewed_attention_us(clock, attention, chunk, history, num_decodes, dctx, low, high, corners)
    if length(clock, CPU_SEQUENCES) == 0:
        return us / 1e6
    if not clock.cpu_overlapped:
        return (us + cpu) / 1e6
    return (cpu if cpu > us else us) / 1e6


@_jit
def measured_s(clock, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high):
    """MeasuredStepCost.step_s of the Batch of these fields."""
    prefill_tokens = tokens - num_decodes
    decode_history = (dctx - num_decodes) / num_decodes if num_decodes else 0.0
    if not prefill_tokens:
        us = fixed_us(clock, tokens, num_decodes)
        attention = decode_attention_us(clock, num_decodes, decode_history)
        corners = (0, 0.0, 0, 0.0, 0, 0.0)
        us += clock.layers * skewed_attention_us(clock, attention, 0, 0.0, num_decodes, dctx, low, high, corners)
        return with_cpu_us(clock, us, num_decodes) / 1e6
    if num_prefills:
        history = (pairs - prefill_tokens * (prefill_tokens + 1) / 2) / prefill_tokens
    else:
        history = float(context - dctx - prefill_tokens)
    history = history if history > 0.0 else 0.0
    num_sequences = num_decodes + (num_prefills if num_prefills > 1 else 1)
    us = fixed_us(clock, tokens, num_sequences)
    a, wa = bracket(part(clock, AXIS0), prefill_tokens)
    b, wb = bracket(part(clock, AXIS1), history)
    c, wc = bracket(part(clock, AXIS2), num_decodes)
    attention = mixed_at(clock, a, wa, b, wb, c, wc, decode_history)
    corners = (a, wa, b, wb, c, wc)
    us += clock.layers * skewed_attention_us(
        clock, attention, prefill_tokens, history, num_decodes, dctx, low, high, corners
    )
    return with_cpu_us(clock, us, num_sequences) / 1e6


@_jit
def vllm_2023_s(clock, tokens, context, num_decodes, dctx, num_prefills, pairs):
    """Vllm2023StepCost.step_s of the Batch of these fields (its figures in the clock's COST_MS, arrays.VLLM_2023)."""
    c = part(clock, COST_MS)
    weights, bandwidth, params, tflops, hidden = c[0], c[1], c[2], c[3], c[4]
    launch, per_sequence, per_token, per_block, block_size, overhead_ms = c[5], c[6], c[7], c[8], c[9], c[10]
    prefill_tokens = tokens - num_decodes
    pairs_f = float(pairs)
    if prefill_tokens and not num_prefills:  # one chunk
        history = context - dctx - prefill_tokens
        history = history if history > 0 else 0
        pairs_f = prefill_tokens * history + prefill_tokens * (prefill_tokens + 1) / 2
    memory_us = weights / (bandwidth * 1e3)
    compute_us = 2.0 * params * float(tokens) / (tflops * 1e6)
    dense = memory_us if memory_us >= compute_us else compute_us
    decode_context = float(dctx)
    attention = 0.0 * decode_context
    if num_decodes:
        blocks = decode_context / block_size + num_decodes * (1.0 - 1.0 / block_size) / 2.0
        attention = launch + per_sequence * num_decodes + per_token * decode_context + per_block * blocks
    prefill = 4.0 * hidden * pairs_f / (tflops * 1e6)
    us = overhead_ms * 1000.0 + dense + clock.layers * (attention + prefill)
    return us / 1e6


@_jit
def roofline_s(clock, tokens, context):
    """RooflineStepCost.step_s of a Batch of tokens and context tokens (no all-reduce; its figures in the clock's
    COST_MS, arrays.ROOFLINE): the same float operations."""
    c = part(clock, COST_MS)
    weights, kv_per_token, params, bandwidth, tflops = c[0], c[1], c[2], c[3], c[4]
    memory_s = (weights + kv_per_token * float(context)) / (bandwidth * 1e9)
    compute_s = 2.0 * params * float(tokens) / (tflops * 1e12)
    return memory_s if memory_s >= compute_s else compute_s


@_jit
def cost_s(clock, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high):
    """The measured, 2023 or roofline step cost's seconds for a step of these Batch fields."""
    if clock.kind == 3:
        return vllm_2023_s(clock, tokens, context, num_decodes, dctx, num_prefills, pairs)
    if clock.kind == 4:
        return roofline_s(clock, tokens, context)
    return measured_s(clock, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high)


@_inline
def step_s(clock, num_scheduled, acc):
    """The step cost's seconds for a step of num_scheduled tokens whose other Batch fields account() left in acc
    (context, decodes, their context, prefills, their pairs, the least and most decode context)."""
    if clock.kind == 0:
        return clock.table[0] / 1000.0  # the COST_MS table is the first
    if clock.kind == 1:
        return (clock.table[0] + clock.table[1] * num_scheduled) / 1000.0
    return cost_s(clock, num_scheduled, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6])


@_inline
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


@_inline
def release(pool, groups, caching, r, num_blocks, num_cached, free):
    """A finished request gives its blocks back (KVCacheManager.free); the free count after."""
    if caching:
        if pool.slot_of[r] >= 0:  # a request finished in the waiting queue holds none
            release_table(pool, r, num_blocks[r])
        num_cached[r] = 0
        free = num_free(pool)
    elif groups.block_size.shape[0]:
        free += release_groups(groups, r)
    else:
        free += num_blocks[r]
    num_blocks[r] = 0
    return free


@_inline
def update_sync(
    req, pool, groups, caching, running, nrun, npre, out_r, out_sample, ns, num_new_kv_tokens, end, free, kv
):
    """Engine.step's update (synchronous): the running requests' computed tokens kv after the step (recounted after a
    preemption, else kv plus the step's tokens and prefix hits, num_new_kv_tokens), then update_from_output: each
    request that samples gets its token, and those done finish at end and give their blocks back, in batch order
    (a reservation pool's caller frees their chunks after). Returns (free, kv, whether any finished)."""
    computed, num_tokens, status = req.computed, req.num_tokens, req.status
    if npre:
        kv = 0
        for j in range(nrun):
            kv += computed[running[j]]
    else:
        kv += num_new_kv_tokens
    finished = False
    for j in range(ns):
        if out_sample[j]:
            r = out_r[j]
            num_tokens[r] += 1
            if num_tokens[r] == req.prompt[r] + 1:
                req.first_token_s[r] = end
            if is_finished(num_tokens[r], req.max_num_tokens[r]):
                status[r] = FINISHED
                free = release(pool, groups, caching, r, req.num_blocks, req.num_cached, free)
                kv -= computed[r]
                req.finish_s[r] = end
                finished_at(req, end)
                finished = True
    return free, kv, finished


@_inline
def preempt(req, pool, groups, caching, r, free, waiting, head, nwait):
    """Scheduler._preempt (kvlab/core/engine/scheduler.py): request r gives its blocks back, loses its progress (a
    batch in flight for it becomes stale) and goes to the front of the waiting queue; returns (free, head, nwait)."""
    free = release(pool, groups, caching, r, req.num_blocks, req.num_cached, free)
    req.status[r] = PREEMPTED
    req.computed[r] = 0
    req.stale[r] = req.in_flight[r]
    req.placeholders[r] = 0
    req.num_preemptions[r] += 1
    head = (head - 1) % waiting.shape[0]
    waiting[head] = r
    return free, head, nwait + 1


@_inline
def record(
    first,
    clock_start,
    end,
    last_end,
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
    if s + first == 0 or last_end != clock_start:
        start_step[counts[1]] = s
        start_s[counts[1]] = clock_start
        counts[1] += 1
    if npre:
        preempt_step[counts[2]] = s
        preempt_count[counts[2]] = npre
        counts[2] += 1
    if num_hit_tokens:
        hit_step[counts[3]] = s
        hit_count[counts[3]] = num_hit_tokens
        counts[3] += 1
    end_s[s] = end
    held[s] = held_blocks
    kv_tokens[s] = kv
    tokens[s] = num_scheduled
    num_running_log[s] = nrun
    num_waiting_log[s] = nwait
    counts[0] = s + 1


@_inline
def decodes_advanced(req, running, nrun, skip, j, phases, block_size, usable, free, kv, clock, waiting, head, nwait,
                     logs, s, groups):  # fmt: skip
    """The running requests but running[skip] (-1: none) after a run's j decode steps at once (decode_run,
    prefill_run; s: the run's first record): their block crossings (phases), computed tokens and tokens; and the
    first finish, sampled in the last step, released, with that step's record of held blocks and KV tokens after it.
    Returns (free, kv, nrun, nwait)."""
    max_num_tokens, num_tokens, computed, num_blocks, status, finish_s = (
        req.max_num_tokens,
        req.num_tokens,
        req.computed,
        req.num_blocks,
        req.status,
        req.finish_s,
    )
    finished = False
    hybrid = groups.block_size.shape[0] > 0
    periods, rest = j // block_size, j % block_size
    for i in range(nrun):
        if i == skip:
            continue
        r = running[i]
        if hybrid:
            groups_advanced(groups, r, computed[r], j, 0)
        else:
            num_blocks[r] += periods + (1 if phases[i] < rest else 0)  # its crossings in steps 0..j-1
        computed[r] += j
        num_tokens[r] += j
        if is_finished(num_tokens[r], max_num_tokens[r]):  # j == k: the step sampling the first finish
            status[r] = FINISHED
            free += release_groups(groups, r) if hybrid else num_blocks[r]  # release without prefix caching
            num_blocks[r] = 0
            kv -= computed[r]
            finish_s[r] = clock
            finished_at(req, clock)
            finished = True
    if finished:  # that step's record: after its finishes
        logs[2][s + j - 1] = usable - free  # held
        logs[3][s + j - 1] = kv  # kv_tokens
        nrun, nwait = drop_finished(status, running, nrun, waiting, head, nwait, False)
    return free, kv, nrun, nwait


@_inline
def prefill_run_step_s(clock_cost, run, num_decodes, chunk, before, decode_context, low, high, j):
    """The time of a prefill run's step on a measured (prefill_step_s) or 2023 clock (cost_s of the step's Batch, as
    schedule's account builds it): its decodes j tokens further than the run found them (decode_context tokens in
    all, from low to high each), its prompt's chunk after before tokens."""
    low, high = (low + j, high + j) if num_decodes else (0, 0)
    step_context = decode_context + num_decodes * j
    if clock_cost.kind == 2:
        return prefill_step_s(clock_cost, run, num_decodes, chunk, before, step_context, low, high)
    pairs = chunk * before + chunk * (chunk + 1) // 2
    return cost_s(clock_cost, num_decodes + chunk, step_context + before + chunk, num_decodes, step_context, 1, pairs,
                  low, high)  # fmt: skip


@_inline
def prefill_run_chunk(budget, threshold, at, nrun, nwait, num_left):
    """A prefill run's chunk (the budget the at decodes before P leave, at most the step's cap) and its steps whose
    chunk leaves P more of its num_left tokens; (0, 0) where P or a decode after it would go unscheduled."""
    chunk = budget - at
    cap_tokens = step_token_cap(threshold, nrun, nwait)
    if 0 < cap_tokens < chunk:
        chunk = cap_tokens
    if chunk <= 0 or budget - at - chunk < nrun - at - 1:
        return 0, 0
    return chunk, (num_left - 1) // chunk


@_inline
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


@_inline
def decode_run(at):
    """at: loop_sync's state (cfg, clock_cost, req, running, nrun, waiting, head, nwait, nxt, free, kv, clock, last_end,
    phases, per_phase, logs, counts, groups). decode_run.advance (kvlab/core/engine/fast/decode_run.py) without prefix
    caching: while every running request decodes (it sampled in the last step), their steps at once, O(1) a step,
    recorded as loop_sync records them. A run stops before a step that would cross more block boundaries than there
    are free blocks (it preempts) or admit the first request to arrive during it, and after the step that samples
    the first finish or fills the chunk; the waiting queue's head, refused in the first step, stays refused (free
    blocks only fall). A hybrid model's groups (groups): O(groups) a step (group_phases), the head checked at every
    step, since windows give blocks back. Returns (steps, nxt, nwait, free, nrun, kv, clock, last_end); 0 steps: no
    run, nothing changed."""
    (cfg, clock_cost, req, running, nrun, waiting, head, nwait, nxt, free, kv, clock, last_end, phases, per_phase, logs,
     counts, groups) = at  # fmt: skip
    arrival, prompt, max_num_tokens, num_tokens = req.arrival, req.prompt, req.max_num_tokens, req.num_tokens
    computed = req.computed
    block_size, max_num_seqs, budget, usable, threshold, max_model_len = limits_of(cfg)
    if nrun == 0:  # and nrun <= budget: a step admits only once every running request has a token
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    hybrid = groups.block_size.shape[0] > 0
    per_phase[:] = 0  # per_phase[p]: requests of phase p
    k = max_num_tokens[running[0]]
    low = high = computed[running[0]]
    for i in range(nrun):
        r = running[i]
        c = computed[r]
        if c != num_tokens[r] - 1 or num_tokens[r] <= prompt[r]:
            return 0, nxt, nwait, free, nrun, kv, clock, last_end  # a prefill chunk or its first token next
        if max_num_tokens[r] - num_tokens[r] < k:
            k = max_num_tokens[r] - num_tokens[r]
        low = c if c < low else low
        high = c if c > high else high
        if hybrid:
            phases[i] = c  # (its computed tokens: group_phases_cleared)
        else:
            phases[i] = -c % block_size  # it crosses into a new block at steps j % bs == phases[i]
            per_phase[phases[i]] += 1
    limit = min(k, logs[0].shape[0] - counts[0])  # the run's last step samples the first finish
    if limit < 2:
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    budget_left = budget - nrun
    may_admit = budget_left > 0 and nrun < max_num_seqs
    refused = nwait > 0  # the head, refused now, stays refused: free only falls
    if (
        not hybrid
        and refused
        and may_admit
        and admitted_tokens(cfg, num_tokens, waiting[head], 0, 0, budget_left, free - per_phase[0], threshold)[0]
    ):
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    # A hybrid model's groups give blocks back as they take them (a window's, a chunk's), so free blocks may rise: the
    # waiting queue's head is admitted at the first step that leaves need free (NEVER: none, or the budget refuses it),
    # and a step runs only if it can take its blocks before any are given back (else it may preempt).
    need = NEVER
    num_events = freed_first = e = 0
    if hybrid:
        if refused and may_admit:
            m, need_head, _ = admission_to_groups(cfg, groups, num_tokens, waiting[head], budget_left, threshold)
            need = need_head if m else NEVER
        num_events, freed_first = group_phases(groups, running, nrun, computed, limit, max_model_len, 0)
    end_s, _, held, kv_tokens, tokens, num_running_log, num_waiting_log = logs
    s = counts[0]  # record()'s columns; no event: last_end == clock (a step just ended), no pre/hit
    growing = clock_cost.kind >= 2  # its steps grow with the context (decode_run.advance: cost.run_s)
    duration = 0.0 if growing else step_s(clock_cost, nrun, per_phase)  # (per_phase: an acc they do not read)
    context = kv + nrun  # the first step's decodes' context, each one's computed tokens + 1
    run = decode_run_clock(clock_cost, nrun, context, low + 1, high + 1)  # (read on the measured clock only)
    # the steps whose block boundaries the pool covers
    covered = limit if hybrid else steps_covered(per_phase, nrun, free, block_size)
    n = arrival.shape[0]
    j = 0
    phase = 0  # j % block_size
    while j < limit:
        if j and nxt < n and arrival[nxt] <= clock:
            nxt, nwait = add_arrivals(arrival, clock, nxt, waiting, head, nwait)
            if not refused:  # the first to arrive: admitted at this step ends the run
                if hybrid:
                    if may_admit:
                        m, need_head, _ = admission_to_groups(cfg, groups, num_tokens, waiting[head], budget_left,
                                                              threshold)  # fmt: skip
                        need = need_head if m else NEVER
                elif (
                    may_admit
                    and admitted_tokens(
                        cfg, num_tokens, waiting[head], 0, 0, budget_left, free - per_phase[phase], threshold
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
            if taken > free or free - taken + freed >= need:
                break  # it may preempt, or it admits the head
            free += freed - taken
        else:
            free -= per_phase[phase]
        if clock_cost.kind == 2:
            duration = decode_step_s(clock_cost, run, j)
        elif growing:
            duration = cost_s(
                clock_cost, nrun, context + nrun * j, nrun, context + nrun * j, 0, 0, low + 1 + j, high + 1 + j
            )
        clock += duration
        kv += nrun
        end_s[s + j] = clock
        held[s + j] = usable - free
        kv_tokens[s + j] = kv
        num_waiting_log[s + j] = nwait
        j += 1
        phase = 0 if phase == block_size - 1 else phase + 1
    if hybrid:
        group_phases_cleared(groups, nrun, phases, max_model_len, 0)
        if j == 0:
            return 0, nxt, nwait, free, nrun, kv, clock, last_end
    tokens[s : s + j] = nrun
    num_running_log[s : s + j] = nrun
    counts[0] = s + j
    if j:
        last_end = clock
    free, kv, nrun, nwait = decodes_advanced(req, running, nrun, -1, j, phases, block_size, usable, free, kv, clock,
                                             waiting, head, nwait, logs, s, groups)  # fmt: skip
    return j, nxt, nwait, free, nrun, kv, clock, last_end


@_inline
def prefill_run(at):
    """at: decode_run's. A run of one prompt's chunks beside the same decodes (synchronous, without prefix caching), its
    steps at once, recorded as loop_sync records them. Every running request but one (the prompt's, P) decodes; each
    step gives each decode its token and P the same chunk: the budget the decodes before it leave, at most the
    step's cap (step_token_cap: fixed when more than one request runs or waits, or no threshold), with the decodes
    after it each scheduled too, and P's tokens left more than the chunk (so it samples none). A run stops before a
    step whose blocks (the decodes' crossings and P's, num_blocks_to_allocate) are more than the free ones (it
    preempts), or that would admit the first request to arrive during it (or change the cap), and after the step
    that samples the first finish or fills the chunk; a refused waiting head stays refused (free blocks only fall).
    Each step costs the step cost of its Batch (the decodes' context grows by one a step, P's by the chunk; on the
    measured clock, prefill_step_s). loop_sync tries one after a step that scheduled a request more than one token.
    Returns (steps, nxt, nwait, free, nrun, kv, clock, last_end); 0 steps: no run, nothing changed."""
    (cfg, clock_cost, req, running, nrun, waiting, head, nwait, nxt, free, kv, clock, last_end, phases, per_phase, logs,
     counts, groups) = at  # fmt: skip
    arrival, prompt, max_num_tokens, num_tokens = req.arrival, req.prompt, req.max_num_tokens, req.num_tokens
    computed, num_blocks = req.computed, req.num_blocks
    block_size, max_num_seqs, budget, usable, threshold, max_model_len = limits_of(cfg)
    if nrun == 0 or last_end != clock or groups.block_size.shape[0]:  # (not for a hybrid model's groups)
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    at = -1  # P's place in the running list
    k = logs[0].shape[0] - counts[0]  # the steps left in the chunk's records
    low = high = decode_context = 0
    per_phase[:] = 0
    for i in range(nrun):
        r = running[i]
        c = computed[r]
        if c == num_tokens[r] - 1 and num_tokens[r] > prompt[r]:  # a decode
            left = max_num_tokens[r] - num_tokens[r]
            k = left if left < k else k  # its last token at step left - 1
            low = c if low == 0 or c < low else low
            high = c if c > high else high
            decode_context += c
            phases[i] = -c % block_size
            per_phase[phases[i]] += 1
        elif at < 0 and num_tokens[r] - c > 1:
            at = i
        else:
            return 0, nxt, nwait, free, nrun, kv, clock, last_end  # two prompts, or a prompt's last token
    if at < 0:
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    p = running[at]
    num_decodes = nrun - 1
    before = computed[p]
    chunk, chunks = prefill_run_chunk(budget, threshold, at, nrun, nwait, num_tokens[p] - before)
    if chunk == 0:
        return 0, nxt, nwait, free, nrun, kv, clock, last_end  # P or a decode after it not scheduled
    k = chunks if chunks < k else k
    if k < 2:
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    budget_left = budget - num_decodes - chunk
    may_admit = budget_left > 0 and nrun < max_num_seqs
    fixed_cap = threshold == 0 or nrun + nwait > 1  # an arrival does not change the cap
    p_blocks = num_blocks[p]
    need = per_phase[0] + max(num_blocks_to_allocate(before, chunk, p_blocks, block_size, max_model_len), 0)
    if need > free:
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    refused = nwait > 0  # the head, refused now, stays refused: free only falls
    if (
        refused
        and may_admit
        and admitted_tokens(cfg, num_tokens, waiting[head], 0, 0, budget_left, free - need, threshold)[0]
    ):
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    end_s, _, held, kv_tokens, tokens, num_running_log, num_waiting_log = logs
    s = counts[0]  # record()'s columns; no event: last_end == clock (a step just ended), no pre/hit
    num_scheduled = num_decodes + chunk
    duration = 0.0 if clock_cost.kind >= 2 else step_s(clock_cost, num_scheduled, per_phase)  # (an acc unread)
    run = prefill_run_clock(clock_cost, num_decodes, chunk)  # (read on the measured clock only)
    n = arrival.shape[0]
    j = 0
    phase = 0  # j % block_size
    while j < k:
        p_new = max(num_blocks_to_allocate(before, chunk, p_blocks, block_size, max_model_len), 0)
        need = per_phase[phase] + p_new
        if j and nxt < n and arrival[nxt] <= clock:
            if not fixed_cap:
                break
            nxt, nwait = add_arrivals(arrival, clock, nxt, waiting, head, nwait)
            if not refused:  # the first to arrive: admitted at this step ends the run
                if (
                    may_admit
                    and admitted_tokens(cfg, num_tokens, waiting[head], 0, 0, budget_left, free - need, threshold)[0]
                ):
                    break
                refused = True
        if need > free:
            break  # a block the pool has not got: it preempts
        free -= need
        p_blocks += p_new
        if clock_cost.kind >= 2:
            duration = prefill_run_step_s(clock_cost, run, num_decodes, chunk, before, decode_context, low, high, j + 1)
        clock += duration
        kv += num_scheduled
        before += chunk
        end_s[s + j] = clock
        held[s + j] = usable - free
        kv_tokens[s + j] = kv
        tokens[s + j] = num_scheduled
        num_running_log[s + j] = nrun
        num_waiting_log[s + j] = nwait
        j += 1
        phase = 0 if phase == block_size - 1 else phase + 1
    if j == 0:
        return 0, nxt, nwait, free, nrun, kv, clock, last_end
    counts[0] = s + j
    last_end = clock
    computed[p] = before
    num_blocks[p] = p_blocks
    free, kv, nrun, nwait = decodes_advanced(req, running, nrun, at, j, phases, block_size, usable, free, kv, clock,
                                             waiting, head, nwait, logs, s, groups)  # fmt: skip
    return j, nxt, nwait, free, nrun, kv, clock, last_end


@_inline
def blocks_taken(per_phase, num_running, num_steps, block_size):
    """decode_run.blocks_taken: the blocks the running requests take in a run's first num_steps steps."""
    taken = num_running * (num_steps // block_size)
    for p in range(num_steps % block_size):
        taken += per_phase[p]
    return taken


@_inline
def hybrid_batches(cfg, groups, req, running, nrun, waiting, head, nwait, nxt, free, k, joins, may_admit, budget_left,
                   computed_before):  # fmt: skip
    """How many of batches 1..k a hybrid model's asynchronous decode run schedules (decode_run_async): batch j takes
    and gives back the blocks of group_phases' step j - 1 (lag 1: a token in flight), and the run stops before a batch
    that cannot take its blocks before any come back (it may preempt) or that leaves the waiting queue's head (the first
    to arrive from iteration joins on, if none waits) enough free blocks to be admitted. groups.free_at[j]: the free
    blocks after batch j."""
    max_model_len, threshold = cfg.max_model_len, cfg.long_prefill_token_threshold
    num_events, freed_first = group_phases(groups, running, nrun, req.computed, k, max_model_len, 1)
    need = NEVER
    if nwait and may_admit:
        m, need_head, _ = admission_to_groups(cfg, groups, req.num_tokens, waiting[head], budget_left, threshold)
        need = need_head if m else NEVER
    e = 0
    j = 1
    while j <= k:
        if j == joins and not nwait and may_admit:
            m, need_head, _ = admission_to_groups(cfg, groups, req.num_tokens, nxt, budget_left, threshold)
            need = need_head if m else NEVER
        while e < num_events and groups.events[e, 0] == j - 1:  # a window starts to give blocks back
            groups.hist[groups.events[e, 1]] += groups.events[e, 2]
            e += 1
        taken, freed = group_blocks_at(groups, j - 1, max_model_len)
        if j == 1:
            freed = freed_first
        if taken > free or free - taken + freed >= need:
            break
        free += freed - taken
        groups.free_at[j] = free
        j += 1
    group_phases_cleared(groups, nrun, computed_before, max_model_len, 1)
    return j - 1


@_jit
def decode_run_async(at, times):
    """at: loop_async's state (cfg, clock_cost, req, running, nrun, waiting, head, nwait, nxt, free, clock, last_end,
    queue_r, queue_n, queue_sample, queue_i, queue_f, slot, phases, per_phase, first, logs, events, counts, groups;
    slot: the batch in flight's); times: scratch for the batches' ends. A hybrid model's groups: hybrid_batches. decode_run.advance_async
    (kvlab/core/engine/fast/decode_run.py) without prefix caching: with one batch in flight that holds every running
    request, each of which sampled in it, k loop iterations at once (schedule batch j, process batch j - 1), and the
    one after them where the run ends at a first finish (last_iteration, finish_async), recorded as loop_async
    records them; batch k (or k + 1) is left queued in the batch in flight's slot. Returns (ran, nxt, nwait, free,
    nrun, kv, clock, last_end, gpu_free_s, has_finished); ran False: no run, nothing changed."""
    (cfg, clock_cost, req, running, nrun, waiting, head, nwait, nxt, free, clock, last_end, queue_r, queue_n,
     queue_sample, queue_i, queue_f, slot, phases, per_phase, first, logs, events, counts, groups) = at  # fmt: skip
    arrival, prompt, max_num_tokens, num_tokens = req.arrival, req.prompt, req.max_num_tokens, req.num_tokens
    computed = req.computed
    num_blocks, status, placeholders, in_flight = req.num_blocks, req.status, req.placeholders, req.in_flight
    first_token_s, finish_s = req.first_token_s, req.finish_s
    block_size, max_num_seqs, budget, usable, threshold, max_model_len = limits_of(cfg)
    no = (False, nxt, nwait, free, nrun, 0, clock, last_end, 0.0, False)
    if nrun == 0 or queue_i[slot, 0] != nrun:
        return no
    hybrid = groups.block_size.shape[0] > 0
    k = max_num_tokens[running[0]]
    kv = 0
    low = high = computed[running[0]]
    per_phase[:] = 0
    for i in range(nrun):
        r = running[i]
        c = computed[r]
        if placeholders[r] != 1 or c != num_tokens[r]:
            return no  # it did not sample in the batch in flight (a prefill chunk)
        if hybrid and in_flight[r] != 1:
            return no  # its window moves with its settled tokens: a prompt's last chunk in flight is more than one
        left = max_num_tokens[r] - num_tokens[r] - 1
        k = left if left < k else k
        kv += c
        low = c if c < low else low
        high = c if c > high else high
        if hybrid:
            phases[i] = c  # (its computed tokens: group_phases_cleared)
        else:
            phases[i] = -c % block_size
            per_phase[phases[i]] += 1
    first_finish = k
    room = logs[0].shape[0] - counts[0] - 1  # records left in the chunk, the last one's included
    if k > room:
        k = room
    budget_left = budget - nrun
    may_admit = budget_left > 0 and nrun < max_num_seqs
    if hybrid:  # its batches' blocks after the times (hybrid_batches), the run's last iteration step by step
        if k < 2:
            return no
    elif k > 0:  # run_limits
        if k < (1 if first_finish == 1 else 2):
            return no
        if (
            nwait
            and may_admit
            and admitted_tokens(cfg, num_tokens, waiting[head], 0, 0, budget_left, free - per_phase[0], threshold)[0]
        ):
            return no
        covered = steps_covered(per_phase, nrun, free, block_size)
        k = covered if covered < k else k
        if k < (1 if first_finish == 1 else 2):
            return no
    # times[j]: the end of batch j (times[0]: the batch in flight), each the last plus its step (run_s).
    gpu_free_s = queue_f[slot, 1]
    times[0] = gpu_free_s
    context = kv + nrun  # the first step's decodes' context
    run = decode_run_clock(clock_cost, nrun, context, low + 1, high + 1)  # (read on the measured clock only)
    n = arrival.shape[0]
    watch = may_admit and nwait == 0 and nxt < n  # the first to arrive may be admitted where it joins
    growing = clock_cost.kind >= 2  # its steps grow with the context (decode_run.advance_async: cost.run_s)
    duration = 0.0 if growing else step_s(clock_cost, nrun, per_phase)  # (per_phase: an acc they do not read)
    m = 0  # times known up to times[m]
    joins = k + 1  # the iteration the first request to arrive joins at (k + 1: none)
    while m < k:
        if clock_cost.kind == 2:
            duration = decode_step_s(clock_cost, run, m)
        elif growing:
            duration = cost_s(
                clock_cost, nrun, context + nrun * m, nrun, context + nrun * m, 0, 0, low + 1 + m, high + 1 + m
            )
        times[m + 1] = times[m] + duration
        m += 1
        if watch and m - 1 < k - 1 and times[m - 1] >= arrival[nxt]:
            watch = False  # bisect_left(times, arrival, 0, k - 1) is m - 1: it joins at iteration m + 1
            joins = m + 1
            if joins <= k and not hybrid:
                taken = blocks_taken(per_phase, nrun, joins, block_size)
                if admitted_tokens(cfg, num_tokens, nxt, 0, 0, budget_left, free - taken, threshold)[0]:
                    if joins - 1 < 2:
                        return no
                    k = joins - 1
    if hybrid:
        k = hybrid_batches(cfg, groups, req, running, nrun, waiting, head, nwait, nxt, free, k, joins, may_admit,
                           budget_left, phases)  # fmt: skip
        if k < 2:
            return no
    # last_iteration: where the run reaches the first finish, iteration k + 1 as well, unless it changes more (a
    # hybrid model's: step by step).
    finishing = False
    if k == first_finish and not hybrid:
        num_left = 0
        for i in range(nrun):
            num_left += max_num_tokens[running[i]] - num_tokens[running[i]] - 1 != k
        if num_left:
            rest = k % block_size
            taken = blocks_taken(per_phase, nrun, k, block_size)
            for i in range(nrun):
                r = running[i]
                if phases[i] == rest and max_num_tokens[r] - num_tokens[r] - 1 != k:
                    taken += 1
            finishing = taken <= free
            left_budget = budget - num_left
            if finishing and left_budget > 0 and nrun < max_num_seqs:
                at = times[k - 1] if k else clock
                r = waiting[head] if nwait else nxt if nxt < n and arrival[nxt] <= at else -1
                if r >= 0 and admitted_tokens(cfg, num_tokens, r, 0, 0, left_budget, free - taken, threshold)[0]:
                    finishing = False
    if not finishing and k < 2:
        return no
    start0, tokens0, running0, waiting0 = queue_f[slot, 0], queue_i[slot, 1], queue_i[slot, 2], queue_i[slot, 3]
    if k:  # apply_async: batches 0..k-1 recorded, batch k queued
        end0 = times[0]
        for i in range(nrun):
            r = running[i]
            if num_tokens[r] == prompt[r]:
                first_token_s[r] = end0  # its prefill's last chunk was in batch 0
        # Batch j (j >= 1) is scheduled at the clock of batch j - 2's output (the loop's clock for j = 1): arrivals
        # by then join the waiting queue (behind a refused head) and count in its record.
        free = groups.free_at[1] if hybrid else free - per_phase[0]
        record(first, start0, times[0], last_end, 0, 0, tokens0, running0, waiting0, usable - free, kv + nrun, logs,
               events, counts)  # fmt: skip
        nxt, nwait = add_arrivals(arrival, clock, nxt, waiting, head, nwait)
        # Batches 1..k-1: record()'s columns, written here (each starts where the last ended, so no event), with the
        # columns unpacked once: record() unpacks them at each call, and numba counts a reference to each column there.
        end_s, _, held, kv_tokens, tokens, num_running_log, num_waiting_log = logs
        s = counts[0]
        for j in range(1, k):
            free = groups.free_at[j + 1] if hybrid else free - per_phase[j % block_size]
            end_s[s], held[s], kv_tokens[s] = times[j], usable - free, kv + nrun * (j + 1)
            tokens[s], num_running_log[s], num_waiting_log[s] = nrun, nrun, nwait
            s += 1
            nxt, nwait = add_arrivals(arrival, times[j - 1], nxt, waiting, head, nwait)
        counts[0] = s
        last_end = times[k - 1]
        periods, rest = k // block_size, k % block_size
        for i in range(nrun):
            r = running[i]
            if hybrid:
                groups_advanced(groups, r, computed[r], k, 1)
            else:
                num_blocks[r] += periods + (1 if phases[i] < rest else 0)
            computed[r] += k
            num_tokens[r] += k
            in_flight[r] = 1  # batch k's token
        kv += nrun * k
        clock = times[k - 1]  # it waited for batch k - 1's output
        start_k, end_k, tokens_k, running_k, waiting_k = times[k - 1], times[k], nrun, nrun, nwait
    else:
        start_k, end_k, tokens_k, running_k, waiting_k = start0, times[0], tokens0, running0, waiting0
    if not finishing:  # batch k queued (in the slot of the batch in flight)
        queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2], queue_i[slot, 3] = nrun, nrun, nrun, nwait
        queue_i[slot, 4], queue_i[slot, 5], queue_i[slot, 6] = 0, 0, 1
        queue_f[slot, 0], queue_f[slot, 1] = times[k - 1], times[k]
        for i in range(nrun):
            queue_r[slot, i], queue_n[slot, i], queue_sample[slot, i] = running[i], 1, True
        return True, nxt, nwait, free, nrun, kv, clock, last_end, times[k], False
    # finish_async: at batch k - 1's output, batch k + 1 schedules a token for each request not finishing, then
    # batch k's output finishes the others.
    nxt, nwait = add_arrivals(arrival, clock, nxt, waiting, head, nwait)
    for i in range(nrun):  # phases[i]: now whether running[i] finishes (its last token is batch k's)
        phases[i] = num_tokens[running[i]] == max_num_tokens[running[i]] - 1
    context = 0
    low, high = -1, 0
    num_left = 0
    for i in range(nrun):
        r = running[i]
        if phases[i]:
            continue
        c = computed[r]
        low = c if low < 0 or c < low else low
        high = c if c > high else high
        if c % block_size == 0:
            num_blocks[r] += 1
            free -= 1
        if num_tokens[r] == prompt[r]:
            first_token_s[r] = end_k  # k = 0: batch 0 ended its prefill
        computed[r] = c + 1
        num_tokens[r] += 1  # batch k's token
        in_flight[r] = 1  # batch k + 1's
        context += c + 1
        queue_r[slot, num_left], queue_n[slot, num_left], queue_sample[slot, num_left] = r, 1, True
        num_left += 1
    if clock_cost.kind >= 2:
        end = end_k + cost_s(clock_cost, num_left, context, num_left, context, 0, 0, low + 1, high + 1)
    else:
        end = end_k + step_s(clock_cost, num_left, per_phase)
    for i in range(nrun):
        r = running[i]
        if not phases[i]:
            continue
        if num_tokens[r] == prompt[r]:
            first_token_s[r] = end_k
        num_tokens[r] += 1  # its last token
        in_flight[r] = 0
        placeholders[r] = 0
        status[r] = FINISHED
        free += num_blocks[r]  # release without prefix caching
        num_blocks[r] = 0
        finish_s[r] = end_k
        finished_at(req, end_k)
    nrun_before = nrun
    nrun, nwait = drop_finished(status, running, nrun, waiting, head, nwait, False)
    clock = end_k  # it waited for batch k's output
    record(first, start_k, end_k, last_end, 0, 0, tokens_k, running_k, waiting_k, usable - free, context, logs, events,
           counts)  # fmt: skip
    queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2], queue_i[slot, 3] = num_left, num_left, nrun_before, nwait
    queue_i[slot, 4], queue_i[slot, 5], queue_i[slot, 6] = 0, 0, 1
    queue_f[slot, 0], queue_f[slot, 1] = end_k, end
    return True, nxt, nwait, free, nrun, context, clock, end_k, end, True


@_jit
def prefill_run_async(at):
    """at: decode_run_async's. prefill_run's asynchronous twin (without prefix caching): with one batch in flight (batch 0)
    that holds every running request in order, each sampling in it but one prompt P, mid-prefill, k loop iterations
    at once: schedule batch j (j = 1..k; each decode one token, P the same chunk, as prefill_run's steps), process
    batch j - 1, recorded as loop_async records them; batch k is left queued in batch 0's slot. Batch j is scheduled
    at the loop's clock (j = 1), else at batch j - 2's end (arrivals by then join the waiting queue), and runs from
    batch j - 1's end. The run stops before a batch whose blocks are more than the free ones (it preempts), that
    would admit the first request to arrive (or change the cap), or whose processing would leave a record the chunk
    has no room for; and at the latest at the batch that schedules a decode's last token or P's last chunk but one
    (no request samples its last token, nor P its first, in a batch the run processes). Returns decode_run_async's
    (ran, nxt, nwait, free, nrun, kv, clock, last_end, gpu_free_s, has_finished); ran False: no run, nothing
    changed."""
    (cfg, clock_cost, req, running, nrun, waiting, head, nwait, nxt, free, clock, last_end, queue_r, queue_n,
     queue_sample, queue_i, queue_f, slot, phases, per_phase, first, logs, events, counts, groups) = at  # fmt: skip
    arrival, prompt, max_num_tokens, num_tokens = req.arrival, req.prompt, req.max_num_tokens, req.num_tokens
    computed, num_blocks = req.computed, req.num_blocks
    placeholders, in_flight, stale, first_token_s = req.placeholders, req.in_flight, req.stale, req.first_token_s
    block_size, max_num_seqs, budget, usable, threshold, max_model_len = limits_of(cfg)
    no = (False, nxt, nwait, free, nrun, 0, clock, last_end, 0.0, False)
    if nrun == 0 or queue_i[slot, 0] != nrun or groups.block_size.shape[0]:  # (not for a hybrid model's groups)
        return no
    at = -1  # P's place in the running list
    k = logs[0].shape[0] - counts[0]  # batches 0..k-1 recorded
    low = high = decode_context = 0
    per_phase[:] = 0
    for i in range(nrun):
        r = running[i]
        c = computed[r]
        if queue_r[slot, i] != r or stale[r]:
            return no
        if placeholders[r] == 1 and c == num_tokens[r]:  # a decode: it samples in batch 0
            left = max_num_tokens[r] - num_tokens[r] - 1  # batch left schedules its last token
            k = left if left < k else k
            low = c if low == 0 or c < low else low
            high = c if c > high else high
            decode_context += c
            phases[i] = -c % block_size  # it crosses into a new block in batch j when (j - 1) % bs == phases[i]
            per_phase[phases[i]] += 1
        elif at < 0 and placeholders[r] == 0 and c < num_tokens[r]:
            at = i
        else:
            return no  # two prompts
    if at < 0:
        return no
    p = running[at]
    num_decodes = nrun - 1
    before = computed[p]
    chunk, chunks = prefill_run_chunk(budget, threshold, at, nrun, nwait, num_tokens[p] - before)
    if chunk == 0:
        return no  # P or a decode after it not scheduled
    k = chunks if chunks < k else k
    if k < 2:
        return no
    budget_left = budget - num_decodes - chunk
    may_admit = budget_left > 0 and nrun < max_num_seqs
    fixed_cap = threshold == 0 or nrun + nwait > 1  # an arrival does not change the cap
    p_blocks = num_blocks[p]
    num_scheduled = num_decodes + chunk
    duration = 0.0 if clock_cost.kind >= 2 else step_s(clock_cost, num_scheduled, per_phase)  # (an acc unread)
    run = prefill_run_clock(clock_cost, num_decodes, chunk)  # (read on the measured clock only)
    end_s, _, held, kv_tokens, tokens, num_running_log, num_waiting_log = logs
    start0, tokens0, running0, waiting0 = queue_f[slot, 0], queue_i[slot, 1], queue_i[slot, 2], queue_i[slot, 3]
    n = arrival.shape[0]
    refused = False  # the waiting head refused: it stays refused (free blocks only fall)
    at_clock = clock  # batch j's scheduling clock
    end_before = queue_f[slot, 1]  # batch j - 1's end
    start = end = 0.0
    waiting_j = waiting0  # batch j - 1's waiting requests
    kv = 0
    s = counts[0]
    j = 1
    while j <= k:
        if nxt < n and arrival[nxt] <= at_clock:
            if not fixed_cap:
                break
            nxt, nwait = add_arrivals(arrival, at_clock, nxt, waiting, head, nwait)
        p_new = max(num_blocks_to_allocate(before, chunk, p_blocks, block_size, max_model_len), 0)
        need = per_phase[(j - 1) % block_size] + p_new
        if need > free:
            break  # a block the pool has not got: it preempts
        if nwait and not refused:
            if (
                may_admit
                and admitted_tokens(cfg, num_tokens, waiting[head], 0, 0, budget_left, free - need, threshold)[0]
            ):
                break
            refused = True
        free -= need  # batch j scheduled
        p_blocks += p_new
        if clock_cost.kind >= 2:
            duration = prefill_run_step_s(clock_cost, run, num_decodes, chunk, before, decode_context, low, high, j)
        before += chunk
        start = at_clock if at_clock > end_before else end_before
        end = start + duration
        kv = decode_context + num_decodes * j + before  # the running requests' computed tokens, batch j's included
        if j == 1:  # batch 0's record, after batch 1 is scheduled
            record(first, start0, end_before, last_end, 0, 0, tokens0, running0, waiting0, usable - free, kv, logs,
                   events, counts)  # fmt: skip
            s = counts[0]
        else:  # batch j - 1's: record()'s columns (it starts where batch j - 2 ended: no event)
            end_s[s], held[s], kv_tokens[s] = end_before, usable - free, kv
            tokens[s], num_running_log[s], num_waiting_log[s] = num_scheduled, nrun, waiting_j
            s += 1
        waiting_j = nwait
        at_clock = end_before
        end_before = end
        j += 1
    k = j - 1  # batches scheduled (and 0..k-1 processed)
    if k == 0:
        return no
    counts[0] = s
    clock = last_end = at_clock  # batch k - 1's end: the loop waited for its output
    periods, rest = k // block_size, k % block_size
    for i in range(nrun):
        r = running[i]
        if i == at:
            continue
        if num_tokens[r] == prompt[r]:
            first_token_s[r] = queue_f[slot, 1]  # its prefill's last chunk was in batch 0
        num_blocks[r] += periods + (1 if phases[i] < rest else 0)  # its crossings in batches 1..k
        computed[r] += k
        num_tokens[r] += k  # batches 0..k-1's tokens
        in_flight[r] = 1  # batch k's
        queue_r[slot, i], queue_n[slot, i], queue_sample[slot, i] = r, 1, True
    computed[p] = before
    num_blocks[p] = p_blocks
    in_flight[p] = chunk
    queue_r[slot, at], queue_n[slot, at], queue_sample[slot, at] = p, chunk, False
    queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2], queue_i[slot, 3] = nrun, num_scheduled, nrun, waiting_j
    queue_i[slot, 4], queue_i[slot, 5], queue_i[slot, 6] = 0, 0, 1
    queue_f[slot, 0], queue_f[slot, 1] = start, end
    return True, nxt, nwait, free, nrun, kv, clock, last_end, end, False


@_jit
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
    arrival, status = req.arrival, req.status
    usable, caching = cfg.num_usable_blocks, cfg.enable_caching
    fields = cost.kind >= 2  # a clock that reads them
    nxt, free, nrun, head, nwait = (
        state[S_NEXT_ARRIVAL],
        state[S_FREE],
        state[S_NUM_RUNNING],
        state[S_WAITING_HEAD],
        state[S_NUM_WAITING],
    )
    kv, first = state[S_KV_TOKENS], state[S_STEPS]
    clock, last_end = fstate[F_CLOCK], fstate[F_LAST_END]
    capacity = logs[0].shape[0]
    runs = cfg.decode_runs and not caching
    counts[:] = 0
    code = DONE
    chunked = True  # whether the last step scheduled a request more than one token (a prefill run may follow)
    while True:
        code, nxt, nwait, clock = next_step(arrival, clock, nxt, waiting, head, nwait, nrun, capacity, counts)
        if code != STEP:
            break
        if runs:  # a decode run, or after a step that scheduled a request more than one token a prefill run
            at = (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, free, kv, clock, last_end, phases,
                  per_phase, logs, counts, groups)  # fmt: skip
            # (one tuple: numba inlines no call with *args)
            steps, nxt, nwait, free, nrun, kv, clock, last_end = decode_run(at)
            if not steps and chunked:
                steps, nxt, nwait, free, nrun, kv, clock, last_end = prefill_run(at)
                state[S_PREFILL_RUNS] += steps > 0
            if steps:
                state[S_RUNS] += 1
                continue
        ns, npre, num_scheduled, num_hit_tokens, nrun, head, nwait, free = schedule(
            cfg,
            req,
            clock,
            running,
            nrun,
            waiting,
            head,
            nwait,
            free,
            out_r,
            out_n,
            out_sample,
            False,
            pool,
            groups,
            acc,
            fields,
        )
        if num_scheduled == 0:
            code = NO_PROGRESS
            break
        end = clock + step_s(cost, num_scheduled, acc)
        chunked = num_scheduled > ns
        free, kv, finished = update_sync(
            req, pool, groups, caching, running, nrun, npre, out_r, out_sample, ns, num_scheduled + num_hit_tokens,
            end, free, kv,
        )  # fmt: skip
        num_running_step = nrun
        if finished:
            nrun, nwait = drop_finished(status, running, nrun, waiting, head, nwait, False)
        record(
            first,
            clock,
            end,
            last_end,
            npre,
            num_hit_tokens,
            num_scheduled,
            num_running_step,
            nwait,
            usable - free,
            kv,
            logs,
            events,
            counts,
        )
        last_end = end
        clock = end
    save_state(state, fstate, nxt, free, nrun, head, nwait, kv, first + counts[0], clock, last_end)
    return code


@_jit
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
    without prefix caching (cfg.decode_runs: runs on; decode_run_async, prefill_run_async), and AsyncScheduler.update_from_output. queue_i[slot]:
    requests, tokens, running, waiting, preemptions, prompt tokens hit, whether a decode run may start from it;
    queue_f[slot]: start, end. Stops as loop_sync does."""
    req, cost, state, fstate, running, waiting, pool, groups = (
        unowned(req), unowned(cost), unowned(state), unowned(fstate), unowned(running), unowned(waiting), unowned(pool),
        unowned(groups),
    )  # fmt: skip
    queue_r, queue_n, queue_sample, queue_i, queue_f = (
        unowned(queue_r), unowned(queue_n), unowned(queue_sample), unowned(queue_i), unowned(queue_f)
    )  # fmt: skip
    logs, events, counts = unowned(logs), unowned(events), unowned(counts)
    acc, phases, per_phase, times = unowned(scratch)  # acc: as loop_sync's; times: a decode run's batch ends
    (
        arrival,
        prompt,
        max_num_tokens,
        num_tokens,
        computed,
        num_blocks,
        num_cached,
        status,
        placeholders,
        in_flight,
        stale,
        first_token_s,
        finish_s,
    ) = (
        req.arrival,
        req.prompt,
        req.max_num_tokens,
        req.num_tokens,
        req.computed,
        req.num_blocks,
        req.num_cached,
        req.status,
        req.placeholders,
        req.in_flight,
        req.stale,
        req.first_token_s,
        req.finish_s,
    )  # locals: numba hoists them
    n = arrival.shape[0]
    fields = cost.kind >= 2  # a clock that reads them
    usable, caching, block_size = (
        cfg.num_usable_blocks,
        cfg.enable_caching,
        cfg.block_size,
    )
    nxt, free, nrun, head, nwait = (
        state[S_NEXT_ARRIVAL],
        state[S_FREE],
        state[S_NUM_RUNNING],
        state[S_WAITING_HEAD],
        state[S_NUM_WAITING],
    )
    kv, first = state[S_KV_TOKENS], state[S_STEPS]
    queue_head, queue_len = state[S_QUEUE_HEAD], state[S_QUEUE_LEN]
    num_empty, has_finished = state[S_NUM_EMPTY], state[S_HAS_FINISHED]
    clock, last_end, gpu_free_s = fstate[F_CLOCK], fstate[F_LAST_END], fstate[F_GPU_FREE]
    capacity = logs[0].shape[0]
    runs = cfg.decode_runs and not caching
    counts[:] = 0
    code = DONE
    while True:
        nxt, nwait = add_arrivals(arrival, clock, nxt, waiting, head, nwait)
        if counts[0] == capacity:
            code = FULL
            break
        if runs and queue_len == 1 and queue_i[queue_head, 6]:  # Engine.run_async's decode run, or a prefill run
            at = (cfg, cost, req, running, nrun, waiting, head, nwait, nxt, free, clock, last_end, queue_r,
                  queue_n, queue_sample, queue_i, queue_f, queue_head, phases, per_phase, first, logs, events,
                  counts, groups)  # fmt: skip
            ran, nxt, nwait, free, nrun, kv, clock, last_end, end, finished = decode_run_async(at, times)
            prefill = not ran and queue_i[queue_head, 1] > queue_i[queue_head, 0]  # batch 0 holds a prefill chunk
            if prefill:
                ran, nxt, nwait, free, nrun, kv, clock, last_end, end, finished = prefill_run_async(at)
            if ran:
                gpu_free_s = end
                has_finished = 1 if finished else 0
                state[S_RUNS] += 1
                state[S_PREFILL_RUNS] += prefill
                continue
        if nrun or nwait or has_finished:  # has_requests(): schedule a batch and queue it
            slot = (queue_head + queue_len) % 2
            ns, npre, num_scheduled, num_hit_tokens, nrun, head, nwait, free = schedule(
                cfg,
                req,
                clock,
                running,
                nrun,
                waiting,
                head,
                nwait,
                free,
                queue_r[slot],
                queue_n[slot],
                queue_sample[slot],
                True,
                pool,
                groups,
                acc,
                fields,
            )
            has_finished = 0
            start = clock if clock > gpu_free_s else gpu_free_s
            end = start + step_s(cost, num_scheduled, acc) if num_scheduled else start
            gpu_free_s = end
            queue_i[slot, 0], queue_i[slot, 1], queue_i[slot, 2] = ns, num_scheduled, nrun
            queue_i[slot, 3], queue_i[slot, 4], queue_i[slot, 5] = nwait, npre, num_hit_tokens
            queue_i[slot, 6] = num_scheduled and not npre and not num_hit_tokens  # a decode run may start from it
            queue_f[slot, 0], queue_f[slot, 1] = start, end
            queue_len += 1
            num_empty = 0 if num_scheduled else num_empty + 1
            if num_empty >= 2 and (nrun or nwait):
                queued_tokens = queue_i[slot, 1]
                if queue_len == 2:
                    queued_tokens += queue_i[queue_head, 1]
                if queued_tokens == 0:
                    if nxt == n or arrival[nxt] == math.inf:  # (a closed loop's next send waits for a finish)
                        code = NO_PROGRESS
                        break
                    clock = arrival[nxt]  # nothing changes before it arrives
                    num_empty = 0
            if queue_len < 2 and (num_scheduled or nrun or nwait):
                continue
        elif queue_len == 0:
            if nxt == n:
                code = DONE
                break
            clock = arrival[nxt]  # idle: jump to the next arrival
            continue
        slot = queue_head  # wait for the oldest batch's output, process it
        queue_head = (queue_head + 1) % 2
        queue_len -= 1
        end = queue_f[slot, 1]
        if end > clock:
            clock = end
        finished = False
        finished_waiting = False
        for j in range(queue_i[slot, 0]):  # AsyncScheduler.update_from_output
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
            if settles_placeholder(was_stale, placeholders[r]):
                placeholders[r] -= 1
                if was_running and caching:
                    cache_blocks(pool, r, num_cached, computed[r] - in_flight[r], block_size)
            if is_finished(num_tokens[r], max_num_tokens[r]):
                status[r] = FINISHED
                free = release(pool, groups, caching, r, num_blocks, num_cached, free)
                finish_s[r] = end
                finished_at(req, end)
                finished = True
                if not was_running:
                    finished_waiting = True
        if finished:
            nrun, nwait = drop_finished(status, running, nrun, waiting, head, nwait, finished_waiting)
            has_finished = 1
        num_scheduled, npre = queue_i[slot, 1], queue_i[slot, 4]
        if num_scheduled or npre:  # a step of the records: it ran tokens or preempted
            kv = 0
            for j in range(nrun):
                kv += computed[running[j]]
            record(
                first,
                queue_f[slot, 0],
                end,
                last_end,
                npre,
                queue_i[slot, 5],
                num_scheduled,
                queue_i[slot, 2],
                queue_i[slot, 3],
                usable - free,
                kv,
                logs,
                events,
                counts,
            )
            last_end = end
    save_state(state, fstate, nxt, free, nrun, head, nwait, kv, first + counts[0], clock, last_end)
    state[S_QUEUE_HEAD], state[S_QUEUE_LEN], state[S_NUM_EMPTY], state[S_HAS_FINISHED] = (
        queue_head,
        queue_len,
        num_empty,
        has_finished,
    )
    fstate[F_GPU_FREE] = gpu_free_s
    return code
