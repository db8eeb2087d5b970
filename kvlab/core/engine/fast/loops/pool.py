"""vLLM's block pool with prefix caching (kvlab/core/block_pool.py) and the KV-cache manager's calls on it
(KVCacheManager in kvlab/core/engine/kv_cache_manager.py), over the named arrays of arrays.Pool."""

from kvlab.core.engine.fast.loops.jit import (
    admission_num_new_blocks,
    admission_num_new_tokens,
    cache_full_blocks,
    free_table,
    inline,
)

# ---------------------------------------------------------------- the block pool with prefix caching
# BlockPool (kvlab/core/block_pool.py) over the named arrays of fast/arrays.py Pool.


@inline
def hash_id(pool, r, j):
    """The hash id of request r's block j: shared by equal full prompt blocks (same parents), else its own."""
    if j < pool.num_shared[r]:
        return pool.hash_shared[pool.hash_offset[r] + j]
    return pool.hash_base[r] + j - pool.num_shared[r]


@inline
def release_table(pool, r, n):
    """KVCacheManager.free with caching: the request's table freed (block_pool.free_table), its row given back."""
    slot = pool.slot_of[r]
    free_table(pool, pool.tables[slot], n)
    pool.free_slots[pool.num_free_slots[0]] = slot
    pool.num_free_slots[0] += 1
    pool.slot_of[r] = -1


@inline
def cache_blocks(pool, r, num_cached_blocks, num_known_tokens, block_size):
    """KVCacheManager.cache_blocks: the request's full blocks not yet cached go into the cache; the new count."""
    start, end = num_cached_blocks[r], num_known_tokens // block_size
    if end > start:
        ids = pool.hash_ids
        for j in range(start, end):
            ids[j - start] = hash_id(pool, r, j)
        cache_full_blocks(pool, pool.tables[pool.slot_of[r]], start, end, ids)
        num_cached_blocks[r] = end


@inline
def take_slot(pool, r):
    """A block-table row for a request being admitted."""
    pool.num_free_slots[0] -= 1
    pool.slot_of[r] = pool.free_slots[pool.num_free_slots[0]]


@inline
def admitted_tokens(cfg, num_tokens, r, num_hits, evictable, budget, num_free_blocks, cap_tokens):
    """Whether schedule()'s waiting loop admits request r (num_hits blocks hit in the prefix cache, evictable of them
    in the free queue; budget tokens and free blocks left): (its tokens, its new blocks), or (0, 0) if refused."""
    block_size, max_model_len, chunked = cfg.block_size, cfg.max_model_len, cfg.enable_chunked_prefill
    m = admission_num_new_tokens(num_tokens[r], num_hits * block_size, cap_tokens, budget, chunked != 0)
    if m == 0:
        return 0, 0
    new = admission_num_new_blocks(num_tokens[r], num_hits, evictable, m, num_free_blocks, block_size, max_model_len)
    if new < 0:
        return 0, 0
    return m, new
