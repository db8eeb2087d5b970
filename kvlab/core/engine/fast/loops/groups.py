"""A hybrid model's KV cache groups (KVCacheManager over a manager per group, kvlab/core/engine/) without prefix
caching, over arrays.Groups, and the block phases a decode run of them crosses."""

import numpy as np

from kvlab.core.engine.fast.loops.jit import (
    admission_blocks,
    admission_num_new_tokens,
    block_phase,
    inline,
    num_blocks_to_allocate,
    num_skipped_tokens,
    window_release_step,
)

# ---------------------------------------------------------------- a hybrid model's KV cache groups
# KVCacheManager over the groups' managers (kvlab/core/engine/single_type_kv_cache_manager.py) without prefix caching, over arrays.Groups: which
# block a request gets changes nothing then, so each group's table is its length and its leading nulls. Groups of one
# spec hold tables of the same lengths and nulls at every step: only the first of them (Groups.weight: how many) is
# kept, and counted that many times.


@inline
def held_in_groups(groups, r):
    """The blocks request r holds in every group (its tables but their leading nulls)."""
    held = 0
    for g in range(groups.block_size.shape[0]):
        held += groups.weight[g] * (groups.blocks[r, g] - groups.nulls[r, g])
    return held


@inline
def release_groups(groups, r):
    """KVCacheManager.free (each group's manager's free): every group's blocks given back; how many."""
    held = held_in_groups(groups, r)
    groups.blocks[r, :] = 0
    groups.nulls[r, :] = 0
    return held


@inline
def remove_skipped_blocks(groups, r, num_processed_tokens):
    """SingleTypeKVCacheManager.remove_skipped_blocks of each group: each window's and chunk's blocks before the next token's window or
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


@inline
def blocks_for_groups(groups, r, num_computed_tokens, num_new_tokens, max_model_len, take):
    """The new blocks every group's table needs to hold num_new_tokens more tokens (num_blocks_to_allocate); take:
    and the tables grow by them."""
    num_blocks_needed = 0
    for g in range(groups.block_size.shape[0]):
        if groups.weight[g] == 0:
            continue
        new = num_blocks_to_allocate(
            num_computed_tokens, num_new_tokens, groups.blocks[r, g], groups.block_size[g], max_model_len
        )
        if new > 0:
            num_blocks_needed += groups.weight[g] * new
            if take:
                groups.blocks[r, g] += new
    return num_blocks_needed


@inline
def group_admission_blocks(groups, num_tokens, r, num_new_tokens, max_model_len):
    """The free blocks admitting request r of num_tokens tokens with num_new_tokens computed now takes in a hybrid
    model's groups (KVCacheManager.can_admit, then allocate_slots): every group's blocks for its whole length (a
    window's or chunk's at most its admission cap, rules.admission_blocks), or those for the tokens it computes now if
    more."""
    n = num_tokens if num_tokens < max_model_len else max_model_len
    whole = 0
    for g in range(groups.block_size.shape[0]):
        whole += groups.weight[g] * admission_blocks(n, groups.block_size[g], groups.cap[g])
    new = blocks_for_groups(groups, r, 0, num_new_tokens, max_model_len, False)
    return whole if whole > new else new


@inline
def admission_to_groups(cfg, groups, num_tokens, r, budget, cap_tokens):
    """What admitting request r to a hybrid model's groups takes: (its tokens, the free blocks it needs
    (group_admission_blocks), its new blocks), or (0, 0, 0) if the budget refuses it."""
    max_model_len = cfg.max_model_len
    m = admission_num_new_tokens(num_tokens[r], 0, cap_tokens, budget, cfg.enable_chunked_prefill != 0)
    if m == 0:
        return 0, 0, 0
    return (
        m,
        group_admission_blocks(groups, num_tokens[r], r, m, max_model_len),
        blocks_for_groups(groups, r, 0, m, max_model_len, False),
    )


@inline
def skipped_blocks(groups, g, num_processed_tokens):
    """The blocks of group g before the window or chunk of the token after num_processed_tokens (a window's or
    chunk's leading nulls once remove_skipped_blocks ran)."""
    if num_processed_tokens <= 0:
        return 0
    return num_skipped_tokens(num_processed_tokens, groups.window[g], groups.chunk[g]) // groups.block_size[g]


@inline
def group_phases(groups, running, nrun, num_computed_tokens, limit, max_model_len, lag):
    """A hybrid decode run's set-up (decode_run): in groups.hist, for each first group of a spec (groups.weight: the
    groups of that spec), the running requests by the phase at which they take a block (rules.block_phase, c their
    computed tokens) and, from the run's second step, give one back as the c + j - lag tokens settled by step j (lag:
    1 under asynchronous scheduling, a token in flight) move on (rules.window_release_step: a window's block once past
    its first block, a chunk's chunk / block_size blocks); a window that starts to free within limit steps is an
    event (groups.events: its step, its phase's place, its weight). Returns (the events, the blocks step 0 frees)."""
    hist, events, weight, offset = groups.hist, groups.events, groups.weight, groups.offset
    num_events = 0
    freed = 0
    for i in range(nrun):
        r = running[i]
        c = num_computed_tokens[r]
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
                hist[at + block_phase(c, bs)] += w
            first = window_release_step(c, window, chunk, bs, lag)
            if chunk:
                hist[at + bs + first] += w * (chunk // bs)
            elif window and first <= 0:
                hist[at + bs + first % bs] += w
            elif window and first < limit:
                events[num_events, 0], events[num_events, 1], events[num_events, 2] = first, at + bs + first % bs, w
                num_events += 1
    if num_events > 1:
        order = np.argsort(events[:num_events, 0])
        events[:num_events] = events[order]
    return num_events, freed


@inline
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


@inline
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
                hist[at + block_phase(c, bs)] = 0
            first = window_release_step(c, window, chunk, bs, lag)
            if chunk:
                hist[at + bs + first] = 0
            elif window:
                hist[at + bs + first % bs] = 0


@inline
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
