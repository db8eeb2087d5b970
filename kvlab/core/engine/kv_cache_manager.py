"""Where a request's KV goes: vLLM's paged KV-cache manager, or a reservation from a token pool (the baselines).

KVCacheManager is vllm/v1/core/kv_cache_manager.py for one full-attention group with everything that is
inert here left out (no lookahead, no watermark, no connector, no sliding window): allocate_slots gives a
request blocks for the tokens it computes this step, nothing more, and on admission first checks that
blocks for its whole current length are free (scheduler_reserve_full_isl, on by default in 0.33).

ReservationManager is the vLLM paper's Orca baselines: a request reserves its slots once, on admission,
from a pool of (num_gpu_blocks - 1) x block_size token slots (the same KV memory as the paged pool's
usable blocks), and never needs more, so it is never preempted. max reserves max_model_len slots, pow2
the next power of two of the request's final length (at most max_model_len), oracle exactly its final
length. A reservation is counted as if it fit wherever slots are free: the gaps between contiguous
reservations (external fragmentation) are not modelled, as in section 1.
"""
from __future__ import annotations

from kvlab.core.block_pool import BlockPool
from kvlab.core.engine.request import Request
from kvlab.core.units import cdiv

ALLOCATIONS = {
    "paged": "vLLM: blocks of block_size tokens allocated as tokens are computed; preempts when the pool is empty",
    "max": "reserve max_model_len token slots at admission (Orca Max); never preempts",
    "pow2": "reserve the next power of two of the final length at admission (Orca Pow2); never preempts",
    "oracle": "reserve exactly the final length at admission (Orca Oracle); never preempts",
}


class KVCacheManager:
    """vLLM's paged KV-cache manager over one BlockPool (prefix caching when the pool caches)."""

    allocation = "paged"

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = False):
        self.pool = BlockPool(num_gpu_blocks, enable_caching)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching

    @property
    def num_free_blocks(self) -> int:
        """Free blocks of the pool (cached ones no request holds included)."""
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks requests hold."""
        return self.pool.num_used_blocks

    def held(self) -> int:
        """What the requests hold, as the step records count it: blocks in use."""
        pool = self.pool
        return pool.num_gpu_blocks - 1 - len(pool._head) - len(pool._tail)

    def get_computed_blocks(self, request: Request) -> list[int]:
        """The longest run of the request's leading full blocks found in the prefix cache (vLLM's cache hit).

        At most (num_tokens - 1) // block_size blocks are looked up, so a fully cached request still
        computes its last block (and samples a token)."""
        if not self.enable_caching:
            return []
        num_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        get = self.pool.get_cached_block
        for block_hash in request.block_hashes(num_blocks, self.block_size)[:num_blocks]:
            block = get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def blocks_to_admit(self, request: Request, hit_blocks: list[int], evictable: int | None = None) -> int:
        """Free blocks admission needs: blocks for the whole current length, less the hits (a hit block in the
        free queue, evictable, still counts: taking it leaves one free block fewer)."""
        if evictable is None:
            evictable = sum(1 for b in hit_blocks if self.pool.ref_cnt(b) == 0)
        return cdiv(min(request.num_tokens, self.max_model_len), self.block_size) - len(hit_blocks) + evictable

    def allocate_slots(self, request: Request, num_new_tokens: int, hit_blocks: list[int] = (),
                       full_sequence_must_fit: bool = False) -> bool:
        """Blocks for num_new_tokens more computed tokens (after the hit blocks, on admission); False, with
        nothing changed, when the pool has too few free blocks (vLLM's allocate_slots returning None)."""
        pool, bs, table = self.pool, self.block_size, request.block_ids
        if not hit_blocks and not full_sequence_must_fit and not self.enable_caching:   # a running request
            num_slots = min(request.num_computed_tokens + num_new_tokens, self.max_model_len)
            new = -(-num_slots // bs) - len(table)
            if new > 0:
                if new > len(pool._head) + len(pool._tail):
                    return False
                table.extend(pool.get_new_blocks(new))
            return True
        num_free = len(pool._head) + len(pool._tail)
        evictable = 0
        if full_sequence_must_fit:                  # admission: the whole current length must fit
            if hit_blocks:
                evictable = sum(1 for b in hit_blocks if pool.ref_cnt(b) == 0)
            if self.blocks_to_admit(request, hit_blocks, evictable) > num_free:
                return False
        computed = request.num_computed_tokens + len(hit_blocks) * bs
        num_slots = computed + num_new_tokens
        if num_slots > self.max_model_len:
            num_slots = self.max_model_len
        new = -(-num_slots // bs) - len(table) - len(hit_blocks)
        if (new if new > 0 else 0) + evictable > num_free:
            return False
        if hit_blocks:
            pool.touch(hit_blocks)
            table.extend(hit_blocks)
            request.num_cached_blocks = len(table)
        if new > 0:
            table.extend(pool.get_new_blocks(new))
        if self.enable_caching:
            self.cache_blocks(request, min(computed + num_new_tokens, request.num_tokens))
        return True

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Put the request's blocks that num_tokens known tokens fill into the prefix cache (not yet cached ones)."""
        num_full = num_tokens // self.block_size
        start = request.num_cached_blocks
        if num_full > start:
            hashes = request.block_hashes(num_full, self.block_size)
            self.pool.cache_full_blocks(request.block_ids[start:num_full], hashes[start:num_full])
            request.num_cached_blocks = num_full

    def free(self, request: Request) -> int:
        """Give back the request's blocks, last block first (vLLM's order); the number of blocks it held."""
        table = request.block_ids
        self.pool.free_table(table)
        request.block_ids = []
        request.num_cached_blocks = 0
        return len(table)


class ReservationManager:
    """A token pool from which a request reserves its slots on admission (max, pow2 or oracle); never preempts."""

    enable_caching = False

    def __init__(self, allocation: str, num_gpu_blocks: int, block_size: int, max_model_len: int):
        self.allocation = allocation
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_tokens_total = (num_gpu_blocks - 1) * block_size
        self.num_free_tokens = self.num_tokens_total

    @property
    def num_used_blocks(self) -> int:
        """Reserved slots in blocks of block_size (rounded up), for the same measure as the paged pool."""
        return cdiv(self.num_tokens_total - self.num_free_tokens, self.block_size)

    def held(self) -> int:
        """What the requests hold, as the step records count it: reserved token slots."""
        return self.num_tokens_total - self.num_free_tokens

    def reservation_tokens(self, request: Request) -> int:
        """Slots the request reserves: max_model_len, next power of two of its final length, or its final length."""
        final = request.max_num_tokens
        if self.allocation == "max":
            return self.max_model_len
        if self.allocation == "pow2":
            return min(1 << (final - 1).bit_length(), self.max_model_len)
        return final

    def get_computed_blocks(self, request: Request) -> list[int]:
        """No prefix cache."""
        return []

    def allocate_slots(self, request: Request, num_new_tokens: int, hit_blocks=(),
                       full_sequence_must_fit: bool = False) -> bool:
        """Reserve the request's slots on admission (False if they are not free); later steps need nothing."""
        if request.reserved_tokens:
            return True
        need = self.reservation_tokens(request)
        if need > self.num_free_tokens:
            return False
        self.num_free_tokens -= need
        request.reserved_tokens = need
        return True

    def free(self, request: Request) -> int:
        """Give back the request's reservation; the slots it held."""
        held, request.reserved_tokens = request.reserved_tokens, 0
        self.num_free_tokens += held
        return held
