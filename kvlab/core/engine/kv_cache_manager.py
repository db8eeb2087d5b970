"""Where a request's KV goes: vLLM's paged KV-cache manager (reservation.py holds the baselines' token pool).

KVCacheManager is vllm/v1/core/kv_cache_manager.py for one full-attention group with everything that is
inert here left out (no lookahead, no watermark, no connector, no sliding window): allocate_slots gives a
request blocks for the tokens it computes this step, nothing more, and on admission first checks that
blocks for its whole current length are free (scheduler_reserve_full_isl, on by default in 0.33).
"""

from __future__ import annotations

from kvlab.core.block_pool import BlockPool, free_table, take_blocks, touch_blocks
from kvlab.core.engine.block_hashes import block_hashes
from kvlab.core.engine.request import Request
from kvlab.core.engine.rules import admission_num_new_blocks, num_blocks_to_allocate, num_lookup_blocks


class KVCacheManager:
    """vLLM's paged KV-cache manager over one BlockPool (prefix caching when the pool caches)."""

    allocation = "paged"

    def __init__(
        self, num_gpu_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = False, recorder=None
    ):
        self.pool = BlockPool(num_gpu_blocks, enable_caching)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.recorder = recorder if recorder is not None and recorder.freed_tables is not None else None

    @property
    def num_free_blocks(self) -> int:
        """Free blocks of the pool (cached ones no request holds included)."""
        return self.pool.num_free_blocks

    @property
    def num_held(self) -> int:
        """What the requests hold, as the step records count it: blocks in use (BlockPool.num_used_blocks)."""
        return self.pool.num_used_blocks

    def get_computed_blocks(self, request: Request) -> list[int]:
        """The longest run of the request's leading full blocks found in the prefix cache (vLLM's cache hit),
        at most rules.num_lookup_blocks of them."""
        if not self.enable_caching:
            return []
        num_blocks = num_lookup_blocks(request.num_tokens, self.block_size)
        hits = []
        get = self.pool.get_cached_block
        for block_hash in block_hashes(request, num_blocks, self.block_size)[:num_blocks]:
            block = get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def admission_num_new_blocks(self, request: Request, num_new_tokens: int, hit_blocks, num_blocks_taken=0) -> int:
        """rules.admission_num_new_blocks for the request with num_blocks_taken blocks fewer free than now: its new
        blocks, or -1 if refused (a hit block no request holds is still in the free queue)."""
        num_evictable = sum(1 for b in hit_blocks if self.pool.ref[b] == 0) if hit_blocks else 0
        free = self.pool.num_free_blocks - num_blocks_taken
        n, bs, max_len = request.num_tokens, self.block_size, self.max_model_len
        return admission_num_new_blocks(n, len(hit_blocks), num_evictable, num_new_tokens, free, bs, max_len)

    def can_admit(self, request: Request, num_new_tokens: int, hit_blocks, num_blocks_taken: int = 0) -> bool:
        """Whether allocate_slots would admit the request with num_blocks_taken blocks fewer free (side-effect free)."""
        return self.admission_num_new_blocks(request, num_new_tokens, hit_blocks, num_blocks_taken) >= 0

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hit_blocks: list[int] = (), full_sequence_must_fit: bool = False
    ) -> bool:
        """Blocks for num_new_tokens more computed tokens (after the hit blocks, on admission:
        full_sequence_must_fit); False, with nothing changed, when the pool has too few free blocks (vLLM's
        allocate_slots returning None)."""
        pool, bs, table = self.pool, self.block_size, request.block_ids
        if full_sequence_must_fit:  # admission: a waiting request holds no block
            new = self.admission_num_new_blocks(request, num_new_tokens, hit_blocks)
            if new < 0:
                return False
            if hit_blocks:
                touch_blocks(pool, hit_blocks, len(hit_blocks))
                table.extend(hit_blocks)
                request.num_cached_blocks = len(table)
            computed = len(hit_blocks) * bs
        else:  # a running request
            computed = request.num_computed_tokens
            new = num_blocks_to_allocate(computed, num_new_tokens, len(table), bs, self.max_model_len)
            if new > pool.num_free_blocks:
                return False
        if new > 0:
            at = len(table)
            table.extend([0] * new)
            take_blocks(pool, new, table, at)
        if self.enable_caching:
            self.cache_blocks(request, min(computed + num_new_tokens, request.num_tokens))
        return True

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Put the request's blocks that num_tokens known tokens fill into the prefix cache (not yet cached ones)."""
        num_full = num_tokens // self.block_size
        start = request.num_cached_blocks
        if num_full > start:
            hashes = block_hashes(request, num_full, self.block_size)
            self.pool.cache_full_blocks(request.block_ids[start:num_full], hashes[start:num_full])
            request.num_cached_blocks = num_full

    def free(self, request: Request) -> int:
        """Give back the request's blocks, last block first (vLLM's order); the number of blocks it held."""
        table = request.block_ids
        if self.recorder is not None:
            self.recorder.freed(request)
        free_table(self.pool, table, len(table))
        request.block_ids = []
        request.num_cached_blocks = 0
        return len(table)
