"""Where a request's KV goes: vLLM's paged KV-cache manager, or a reservation from a token pool (the baselines).

KVCacheManager is vllm/v1/core/kv_cache_manager.py for one full-attention group with everything that is
inert here left out (no lookahead, no watermark, no connector, no sliding window): allocate_slots gives a
request blocks for the tokens it computes this step, nothing more, and on admission first checks that
blocks for its whole current length are free (scheduler_reserve_full_isl, on by default in 0.33).

ReservationManager is the vLLM paper's Orca baselines: a request reserves its slots once, on admission,
from a pool of (num_gpu_blocks - 1) x block_size token slots (the same KV memory as the paged pool's
usable blocks), and never needs more, so it is never preempted. max asks for max_model_len slots, pow2
its prompt plus the next power of two of its output (the paper's §6.1: an output of 25 tokens reserves 32;
at most max_model_len), oracle exactly its final length. The paper's Orca places reservations with the buddy
allocation algorithm, and so does kvlab (kvlab.core.buddy): the chunk is the next power of two of what is
asked, and a request whose chunk is not free waits even when enough slots are free in all (external
fragmentation).
"""
from __future__ import annotations

import numpy as np

from kvlab.core.block_pool import BlockPool
from kvlab.core.buddy import BuddyAllocator, chunk_order
from kvlab.core.engine.request import Request
from kvlab.core.engine.rules import admission_num_new_blocks, num_blocks_to_allocate, num_lookup_blocks
from kvlab.core.units import cdiv

ALLOCATIONS = {
    "paged": "vLLM: blocks of block_size tokens allocated as tokens are computed; preempts when the pool is empty",
    "max": "reserve max_model_len token slots at admission (Orca Max); never preempts",
    "pow2": "reserve prompt + the next power of two of the output at admission (Orca Pow2); never preempts",
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
        """The longest run of the request's leading full blocks found in the prefix cache (vLLM's cache hit),
        at most rules.num_lookup_blocks of them."""
        if not self.enable_caching:
            return []
        num_blocks = num_lookup_blocks(request.num_tokens, self.block_size)
        hits = []
        get = self.pool.get_cached_block
        for block_hash in request.block_hashes(num_blocks, self.block_size)[:num_blocks]:
            block = get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_evictable(self, hit_blocks: list[int]) -> int:
        """Hit blocks no request holds (still in the free queue)."""
        return sum(1 for b in hit_blocks if self.pool.ref_cnt(b) == 0) if hit_blocks else 0

    def can_admit(self, request: Request, num_new_tokens: int, hit_blocks: list[int], num_blocks_taken: int = 0) -> bool:
        """Whether allocate_slots would admit the request with num_blocks_taken blocks fewer free than now (side-effect
        free: rules.admission_num_new_blocks)."""
        return admission_num_new_blocks(request.num_tokens, len(hit_blocks), self.num_evictable(hit_blocks),
                                        num_new_tokens, self.pool.num_free_blocks - num_blocks_taken, self.block_size,
                                        self.max_model_len) >= 0

    def allocate_slots(self, request: Request, num_new_tokens: int, hit_blocks: list[int] = (),
                       full_sequence_must_fit: bool = False) -> bool:
        """Blocks for num_new_tokens more computed tokens (after the hit blocks, on admission:
        full_sequence_must_fit); False, with nothing changed, when the pool has too few free blocks (vLLM's
        allocate_slots returning None)."""
        pool, bs, table = self.pool, self.block_size, request.block_ids
        num_free = len(pool._head) + len(pool._tail)
        if full_sequence_must_fit:                  # admission: a waiting request holds no block
            new = admission_num_new_blocks(request.num_tokens, len(hit_blocks), self.num_evictable(hit_blocks),
                                           num_new_tokens, num_free, bs, self.max_model_len)
            if new < 0:
                return False
            if hit_blocks:
                pool.touch(hit_blocks)
                table.extend(hit_blocks)
                request.num_cached_blocks = len(table)
            computed = len(hit_blocks) * bs
        else:                                       # a running request
            computed = request.num_computed_tokens
            new = num_blocks_to_allocate(computed, num_new_tokens, len(table), bs, self.max_model_len)
            if new > num_free:
                return False
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
    """A token pool from which a request reserves a buddy chunk on admission (max, pow2 or oracle); never preempts."""

    enable_caching = False

    def __init__(self, allocation: str, num_gpu_blocks: int, block_size: int, max_model_len: int):
        self.allocation = allocation
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_tokens_total = (num_gpu_blocks - 1) * block_size
        self.buddy = BuddyAllocator(self.num_tokens_total)
        self.offsets: dict[int, int] = {}       # request_id -> offset of its chunk
        self.num_final_tokens = 0               # final lengths of the requests holding a chunk

    @property
    def num_free_tokens(self) -> int:
        """Free token slots, in chunks of any size."""
        return self.buddy.num_free_slots

    @property
    def num_used_blocks(self) -> int:
        """Reserved slots in blocks of block_size (rounded up), for the same measure as the paged pool."""
        return cdiv(self.buddy.num_used_slots, self.block_size)

    def held(self) -> int:
        """What the requests hold, as the step records count it: token slots in their chunks."""
        return self.num_tokens_total - self.buddy.num_free_slots

    def reservation_tokens(self, request: Request) -> int:
        """Slots the request asks for: max_model_len (max), its prompt + the next power of two of its output
        (pow2, §6.1 of the vLLM paper; at most max_model_len), or its final length (oracle). The buddy allocator
        rounds the chunk up to a power of two."""
        if self.allocation == "max":
            return self.max_model_len
        final = request.max_num_tokens
        if self.allocation == "pow2":
            output = final - request.num_prompt_tokens
            return min(request.num_prompt_tokens + (1 << (output - 1).bit_length()), self.max_model_len)
        return final

    def reservation_tokens_of(self, prompt_tokens: np.ndarray, final_tokens: np.ndarray) -> np.ndarray:
        """reservation_tokens for arrays of prompts and final lengths (tokens), one a request."""
        if self.allocation == "max":
            return np.full(len(final_tokens), self.max_model_len, dtype=np.int64)
        if self.allocation == "pow2":
            bits = np.frexp(np.asarray(final_tokens - prompt_tokens, dtype=np.int64) - 1)[1]   # (output - 1).bit_length()
            return np.minimum(prompt_tokens + np.left_shift(1, bits.astype(np.int64)), self.max_model_len)
        return np.asarray(final_tokens, dtype=np.int64)

    def can_reserve(self, request: Request) -> bool:
        """Whether a chunk for the request's reservation is free now."""
        return self.buddy.can_allocate(self.reservation_tokens(request))

    def can_admit(self, request: Request, num_new_tokens: int, hit_blocks=(), num_blocks_taken: int = 0) -> bool:
        """Whether allocate_slots would admit the request: a chunk for its reservation is free (a running request's
        decodes take nothing from a reservation pool)."""
        return self.can_reserve(request)

    def external_fragmentation(self, head: Request | None) -> int:
        """Free slots in chunks too small for the waiting queue's head's reservation (0 when nothing waits)."""
        return self.buddy.free_slots_below(self.reservation_tokens(head)) if head is not None else 0

    def get_computed_blocks(self, request: Request) -> list[int]:
        """No prefix cache."""
        return []

    def allocate_slots(self, request: Request, num_new_tokens: int, hit_blocks=(),
                       full_sequence_must_fit: bool = False) -> bool:
        """Reserve the request's chunk on admission (False if no free chunk is large enough, however many slots
        are free in all: external fragmentation); later steps need nothing."""
        if request.reserved_tokens:
            return True
        need = self.reservation_tokens(request)
        offset = self.buddy.allocate(need)
        if offset is None:
            return False
        self.offsets[request.request_id] = offset
        request.reserved_tokens = 1 << chunk_order(need)
        self.num_final_tokens += request.max_num_tokens
        return True

    def free(self, request: Request) -> int:
        """Give back the request's chunk (none held: nothing); the slots it held."""
        if not request.reserved_tokens:
            return 0
        request.reserved_tokens = 0
        self.num_final_tokens -= request.max_num_tokens
        return self.buddy.free(self.offsets.pop(request.request_id))
