"""Where a request's KV goes: vLLM's paged KV-cache manager (reservation.py holds the baselines' token pool).

KVCacheManager is vllm/v1/core/kv_cache_manager.py for one full-attention group with everything that is
inert here left out (no lookahead, no watermark, no connector, no sliding window): allocate_slots gives a
request blocks for the tokens it computes this step, nothing more, and on admission first checks that
blocks for its whole current length are free (scheduler_reserve_full_isl, on by default in 0.33).
HybridKVCacheManager is the same manager over several KV cache groups (a hybrid model's full-attention,
sliding-window and Mamba layers) sharing one pool, prefix caching off.
"""

from __future__ import annotations

from kvlab.core.block_pool import NULL_BLOCK_ID, BlockPool, free_table, take_blocks, touch_blocks
from kvlab.core.engine.block_hashes import block_hashes
from kvlab.core.engine.request import Request
from kvlab.core.engine.rules import (
    admission_blocks,
    admission_num_new_blocks,
    blocks_to_admit,
    num_blocks_to_allocate,
    num_lookup_blocks,
    num_skipped_tokens,
)


class PagedPool:
    """What the scheduler and the records read of a paged manager's BlockPool (self.pool)."""

    allocation = "paged"

    @property
    def num_free_blocks(self) -> int:
        """Free blocks of the pool (cached ones no request holds included)."""
        return self.pool.num_free_blocks

    @property
    def num_held(self) -> int:
        """What the requests hold, as the step records count it: blocks in use, every group's
        (BlockPool.num_used_blocks)."""
        return self.pool.num_used_blocks


class KVCacheManager(PagedPool):
    """vLLM's paged KV-cache manager over one BlockPool (prefix caching when the pool caches)."""

    noop_decodes = True  # a decode inside its last block changes nothing: the scheduler need not call allocate_slots

    def __init__(
        self, num_gpu_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = False, recorder=None
    ):
        self.pool = BlockPool(num_gpu_blocks, enable_caching)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.recorder = recorder if recorder is not None and recorder.freed_tables is not None else None

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

    def num_blocks_to_admit(self, num_tokens: int) -> int:
        """Free blocks admitting a request of num_tokens needs without a prefix hit (rules.blocks_to_admit)."""
        return blocks_to_admit(num_tokens, 0, 0, self.block_size, self.max_model_len)

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


def admission_caps(groups, max_model_len: int, max_in_flight_tokens: int) -> list[int]:
    """Each group's cap on the blocks admission needs (0: none): a sliding window's max_admission_blocks_per_request
    (capacity.KVCacheGroup.blocks_per_request)."""
    return [g.blocks_per_request(max_model_len, max_in_flight_tokens) if g.sliding_window else 0 for g in groups]


class HybridKVCacheManager(PagedPool):
    """vLLM's KV-cache manager over several KV cache groups that share one BlockPool, prefix caching off
    (kv_cache_coordinator.py, KVCacheCoordinatorNoPrefixCache; single_type_kv_cache_manager.py, FullAttentionManager,
    SlidingWindowManager and MambaManager).

    A request holds one block table per group (groups: capacity.KVCacheGroup, in vLLM's group order), each of
    cdiv(tokens, the group's block_size) entries. Every allocate_slots first frees, in each sliding-window group, the
    blocks whose tokens no later token attends to (rules.num_skipped_tokens of the tokens computed and settled: a
    batch still in flight counts not), last first, leaving the null block in their place (remove_skipped_blocks;
    even if the allocation is then refused); then it takes each group's new blocks from the pool, group by group.
    Admission needs every group's blocks for the request's whole current length, a sliding window's at most its
    max_admission_blocks_per_request (capacity.KVCacheGroup.blocks_per_request, which the tokens in flight raise
    under asynchronous scheduling). free gives back every group's blocks, group by group, each table last block
    first, its nulls skipped. A Mamba group (MambaManager in mamba_cache_mode "none", vLLM's without prefix
    caching) has blocks of max_model_len tokens: a request holds one, its state, from admission to the end."""

    enable_caching = False
    noop_decodes = False  # a decode inside its last block may still free a block behind its window
    NEVER = 1 << 62  # a processed-token count no request reaches

    def __init__(self, num_gpu_blocks: int, groups, block_size: int, max_model_len: int, max_in_flight_tokens: int):
        self.pool = BlockPool(num_gpu_blocks, False)
        self.groups = tuple(groups)
        self.block_size = block_size  # the scheduler's (the groups' common multiple)
        self.max_model_len = max_model_len
        self.caps = admission_caps(groups, max_model_len, max_in_flight_tokens)
        self.tables: dict[int, list[list[int]]] = {}  # request_id -> its block table in each group
        self.leading: dict[int, list[int]] = {}  # request_id -> each table's leading nulls (blocks freed behind)
        # request_id -> (slots, processed): while a request's tokens need at most slots and fewer than processed are
        # settled, allocate_slots neither frees nor takes a block (quiet_limits)
        self.quiet: dict[int, tuple[int, int]] = {}

    def get_computed_blocks(self, request: Request) -> list[int]:
        """No prefix cache: no hit."""
        return []

    def num_blocks_to_admit(self, num_tokens: int) -> int:
        """Free blocks admitting a request of num_tokens needs: every group's (rules.admission_blocks)."""
        n = min(num_tokens, self.max_model_len)
        return sum(admission_blocks(n, g.block_size, cap) for g, cap in zip(self.groups, self.caps))

    def can_admit(self, request: Request, num_new_tokens: int, hit_blocks, num_blocks_taken: int = 0) -> bool:
        """Whether allocate_slots would admit the request with num_blocks_taken blocks fewer free."""
        return self.num_blocks_to_admit(request.num_tokens) <= self.pool.num_free_blocks - num_blocks_taken

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hit_blocks: list[int] = (), full_sequence_must_fit: bool = False
    ) -> bool:
        """Blocks in every group for num_new_tokens more computed tokens, after those behind each window are freed
        (KVCacheManager.allocate_slots); False, with nothing else changed, when the pool has too few free blocks.
        A call that would free nothing and take nothing returns at once (quiet_limits)."""
        pool, max_len, rid = self.pool, self.max_model_len, request.request_id
        if full_sequence_must_fit and not self.can_admit(request, num_new_tokens, hit_blocks):
            return False
        tables = self.tables.get(rid)
        computed = min(request.num_computed_tokens, max_len)
        num_slots = min(computed + num_new_tokens, max_len)
        if tables is not None:
            processed = computed - request.num_in_flight_tokens
            slots, settled = self.quiet[rid]
            if num_slots <= slots and processed < settled:
                return True
            self.remove_skipped_blocks(tables, self.leading[rid], processed)
        need = 0
        for g, table in zip(self.groups, tables or [()] * len(self.groups)):
            need += max(num_blocks_to_allocate(0, num_slots, len(table), g.block_size, max_len), 0)
        if need > pool.num_free_blocks:
            if tables is not None:
                self.quiet[rid] = self.quiet_limits(tables, self.leading[rid])
            return False
        if tables is None:
            tables = self.tables[rid] = [[] for _ in self.groups]
            self.leading[rid] = [0] * len(self.groups)
        for g, table in zip(self.groups, tables):
            new = num_blocks_to_allocate(0, num_slots, len(table), g.block_size, max_len)
            if new > 0:
                at = len(table)
                table.extend([NULL_BLOCK_ID] * new)
                take_blocks(pool, new, table, at)
        self.quiet[rid] = self.quiet_limits(tables, self.leading[rid])
        return True

    def quiet_limits(self, tables: list[list[int]], leading: list[int]) -> tuple[int, int]:
        """(slots, processed): every group's table covers slots tokens, so no group takes a block for a request that
        needs at most those; and no window frees a block before processed tokens are settled (its next block leaves
        the window of the token after (leading + 1) x block_size + window - 1 of them; rules.num_skipped_tokens)."""
        slots, settled = self.max_model_len, self.NEVER
        for g, table, nulls in zip(self.groups, tables, leading):
            slots = min(slots, len(table) * g.block_size)
            if g.sliding_window:
                settled = min(settled, (nulls + 1) * g.block_size + g.sliding_window - 1)
        return slots, settled

    def remove_skipped_blocks(self, tables: list[list[int]], leading: list[int], num_processed_tokens: int) -> None:
        """Free each sliding-window group's blocks wholly before the window of the next token, right to left until
        a block freed before (single_type_kv_cache_manager.py, remove_skipped_blocks, _remove_blocks_in_range): the
        blocks after the table's leading nulls up to the window's."""
        if num_processed_tokens <= 0:
            return
        for i, g in enumerate(self.groups):
            if not g.sliding_window:
                continue
            table, start = tables[i], leading[i]
            end = min(num_skipped_tokens(num_processed_tokens, g.sliding_window) // g.block_size, len(table))
            if start < end:
                free_table(self.pool, table[start:end], end - start)  # table[end - 1] freed first
                table[start:end] = [NULL_BLOCK_ID] * (end - start)
                leading[i] = end

    def free(self, request: Request) -> int:
        """Give back every group's blocks, group by group, each table last block first; the number of blocks."""
        rid = request.request_id
        tables = self.tables.pop(rid, None)
        if tables is None:
            return 0
        num_freed = 0
        for table, start in zip(tables, self.leading.pop(rid)):
            free_table(self.pool, table[start:], len(table) - start)
            num_freed += len(table) - start
        del self.quiet[rid]
        return num_freed
