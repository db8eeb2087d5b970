"""Where a request's KV goes: vLLM's paged KV-cache manager (reservation.py holds the baselines' token pool).

KVCacheManager is vllm/v1/core/kv_cache_manager.py for one full-attention group with everything that is
inert here left out (no lookahead, no watermark, no connector, no sliding window): allocate_slots gives a
request blocks for the tokens it computes this step, nothing more, and on admission first checks that
blocks for its whole current length are free (scheduler_reserve_full_isl, on by default in 0.33).
HybridKVCacheManager is the same manager over several KV cache groups (a hybrid model's full-attention,
sliding-window, chunked-local-attention and Mamba layers) sharing one pool, with vLLM's hybrid prefix cache.
"""

from __future__ import annotations

import math

from kvlab.core.block_pool import NULL_BLOCK_ID, BlockPool, free_table, take_blocks, touch_blocks, unlink
from kvlab.core.engine.block_hashes import block_hashes
from kvlab.core.engine.request import Request
from kvlab.core.engine.rules import (
    admission_blocks,
    admission_num_new_blocks,
    blocks_to_admit,
    hit_num_new_blocks,
    mamba_checkpoint_position,
    mamba_checkpoint_valid,
    num_blocks_to_allocate,
    num_lookup_blocks,
    num_skipped_tokens,
    prefill_end_tokens,
    window_hit_blocks,
)
from kvlab.core.units import cdiv


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

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """(hit blocks, num_hit_tokens): the longest run of the request's leading full blocks found in the prefix
        cache (vLLM's cache hit), at most rules.num_lookup_blocks of them."""
        if not self.enable_caching:
            return [], 0
        num_blocks = num_lookup_blocks(request.num_tokens, self.block_size)
        hits = []
        get = self.pool.get_cached_block
        for block_hash in block_hashes(request, num_blocks, self.block_size)[:num_blocks]:
            block = get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

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


def admission_caps(groups, max_model_len: int, max_in_flight_tokens: int, enable_caching: bool = False) -> list[int]:
    """Each group's cap on the blocks admission needs (0: none): a sliding window's or a chunked local attention's
    max_admission_blocks_per_request (capacity.KVCacheGroup.blocks_per_request); with prefix caching a Mamba
    group's one new state block and its prefill checkpoint blocks (MambaManager.get_num_blocks_to_allocate in
    mamba_cache_mode "align": at most one more, when the prefill's checkpoint is exported into a block of its own)."""
    return [
        g.blocks_per_request(max_model_len, max_in_flight_tokens)
        if g.sliding_window or g.attention_chunk_size
        else 1 + g.num_prefill_checkpoint_blocks
        if enable_caching and g.kind == "mamba"
        else 0
        for g in groups
    ]


class HybridKVCacheManager(PagedPool):
    """vLLM's KV-cache manager over several KV cache groups that share one BlockPool (kv_cache_coordinator.py,
    KVCacheCoordinatorNoPrefixCache and, with prefix caching, HybridKVCacheCoordinator; single_type_kv_cache_manager.py,
    FullAttentionManager, SlidingWindowManager, ChunkedLocalAttentionManager and MambaManager).

    A request holds one block table per group (groups: capacity.KVCacheGroup, in vLLM's group order), each of
    cdiv(tokens, the group's block_size) entries. Every allocate_slots first frees, in each sliding-window group, the
    blocks whose tokens no later token attends to (rules.num_skipped_tokens of the tokens computed and settled: a
    batch still in flight counts not), last first, leaving the null block in their place (remove_skipped_blocks;
    even if the allocation is then refused); then it takes each group's new blocks from the pool, group by group.
    Admission needs every group's blocks for the request's whole current length, a sliding window's at most its
    max_admission_blocks_per_request (capacity.KVCacheGroup.blocks_per_request, which the tokens in flight raise
    under asynchronous scheduling). free gives back every group's blocks, group by group, each table last block
    first, its nulls skipped. A Mamba group without prefix caching (MambaManager in mamba_cache_mode "none") has
    blocks of max_model_len tokens: a request holds one, its state, from admission to the end. A chunked local
    attention group (ChunkedLocalAttentionManager) frees every block before the chunk of the next token, and admits
    at most a chunk and the tokens in flight.

    With prefix caching, a block is cached under its content hash and its group. A hit is the longest prefix, a
    multiple of the groups' common block size, that every group finds (get_computed_blocks): full attention block by
    block from the start, looked up first; then, at the length found so far until it holds, a sliding window as the
    window's blocks before the hit (a run from block 0 counts too), chunked local attention as nulls before the
    hit's chunk and that chunk's cached blocks, a Mamba group as its last cached state. Full attention and chunked
    local attention cache every full block; a window only the blocks the window of two boundaries needs, and a
    Mamba group only the state at them (vLLM's default prefix_cache_retention_interval 0): the prompt's last (P - 1
    floored to the common block size) and the prefix full attention found beyond the hit (shared_prefix_boundary).
    Mamba states then follow mamba_cache_mode "align": a state a block of the common size, one new block a step
    (take_new_blocks), the previous state freed once settled (remove_states), prefills cut where a state is cached
    (rules.mamba_aligned_num_new_tokens, in the scheduler). A Mamba group with prefill checkpoint blocks
    (num_prefill_checkpoint_blocks > 0, a Hopper GPU's Gated DeltaNet kernel) lets the chunk that ends the prefill
    run through its last cacheable boundary when the kernel can export the state there (rules.mamba_checkpoint_valid):
    that step the group takes two blocks, the checkpoint's (the state at mamba_checkpoint_position of the chunk's
    end, in the block before last) and the running state's, both counted at admission; the checkpoint's block is
    cached under its position when it is the prompt's last boundary or the shared prefix, else any key it holds is
    dropped (MambaManager._needs_internal_checkpoint, allocate_new_blocks, _cache_partial_tail_block); it is freed
    like any state once the settled tokens pass it."""

    noop_decodes = False  # a decode inside its last block may still free a block behind its window
    NEVER = 1 << 62  # a processed-token count no request reaches

    def __init__(
        self,
        num_gpu_blocks: int,
        groups,
        block_size: int,
        max_model_len: int,
        max_in_flight_tokens: int,
        enable_caching: bool = False,
    ):
        self.pool = BlockPool(num_gpu_blocks, enable_caching)
        self.groups = tuple(groups)
        self.block_size = block_size  # the scheduler's (the groups' common multiple): a hit is a multiple of it
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.caps = admission_caps(groups, max_model_len, max_in_flight_tokens, enable_caching)
        self.tables: dict[int, list[list[int]]] = {}  # request_id -> its block table in each group
        self.leading: dict[int, list[int]] = {}  # request_id -> each table's leading nulls (blocks freed behind)
        # request_id -> (slots, processed, cacheable): while a request's tokens need at most slots, fewer than
        # processed are settled and fewer than cacheable are known and computed, allocate_slots neither frees, takes
        # nor caches a block (quiet_limits)
        self.quiet: dict[int, tuple[int, int, int]] = {}
        self.num_cached: dict[int, list[int]] = {}  # request_id -> each table's leading blocks past caching
        self.junction: dict[int, int] = {}  # request_id -> its shared_prefix_boundary (0: none)
        self.keys: dict[int, list[list[bytes]]] = {}  # request_id -> its blocks' keys in each group (keyed_hashes)
        self.num_window_freed = 0  # blocks windows and chunks gave back as their requests ran
        self.hash_block_size = math.gcd(*(g.block_size for g in self.groups))
        self.group_keys = [gid.to_bytes(4, "big") for gid in range(len(self.groups))]
        # vLLM's lookup order: groups of one spec looked up together, full attention's first
        specs: dict[tuple, list[int]] = {}
        for gid, g in enumerate(self.groups):
            specs.setdefault((g.kind, g.block_size, g.sliding_window, g.attention_chunk_size), []).append(gid)
        self.lookups = sorted(specs.items(), key=lambda item: item[0][0] != "full_attention")
        # Mamba states with prefix caching (mamba_cache_mode "align"): a state a block of the groups' common size,
        # prefill chunks cut at block boundaries (rules.mamba_aligned_num_new_tokens), one new block a step
        self.mamba = [g.kind == "mamba" for g in self.groups]
        self.mamba_block_size = self.block_size if enable_caching and any(self.mamba) else 0
        self.last_state: dict[int, list[int | None]] = {}  # request_id -> each Mamba table's previous state block
        # prefill checkpoint blocks (MambaManager.has_prefill_checkpoint_blocks): each group's alignment (0: none;
        # MambaSpec.prefill_checkpoint_alignment, the group's block size when the group gives none), and the
        # scheduler's: the first Mamba group's when every Mamba group has checkpoint blocks, else 0
        self.checkpoint_alignments = (
            [
                (g.prefill_checkpoint_alignment or g.block_size) if m and g.num_prefill_checkpoint_blocks > 0 else 0
                for g, m in zip(self.groups, self.mamba)
            ]
            if self.mamba_block_size
            else [0] * len(self.groups)
        )
        mamba_alignments = [a for a, m in zip(self.checkpoint_alignments, self.mamba) if m]
        self.checkpoint_alignment = mamba_alignments[0] if mamba_alignments and all(mamba_alignments) else 0
        # request_id -> each group's (checkpoint position, block index) of its last allocation, or None
        # (MambaManager._checkpoints)
        self.checkpoints: dict[int, list[tuple[int, int] | None]] = {}
        self.cached_this_step: set[int] = set()  # hash ids of Mamba blocks cached this step

    # ---------------------------------------------------------------- prefix cache
    def get_computed_blocks(self, request: Request) -> tuple[tuple | None, int]:
        """(hit, num_hit_tokens): each group's table of the longest prefix every group finds in the prefix cache, at
        most all but the request's last token, and the longer prefix full attention found ((tables,
        shared_prefix_boundary or 0, num_hit_tokens); None if neither; HybridKVCacheCoordinator.find_longest_cache_hit,
        KVCacheManager.get_computed_blocks)."""
        if not self.enable_caching or request.num_tokens <= 1:
            return None, 0
        max_length = request.num_tokens - 1
        tables: list[list[int] | None] = [None] * len(self.groups)
        lengths = [0] * len(self.groups)
        hit_length, longest = max_length, 0
        simple = len(self.lookups) == 2 and self.lookups[0][0][0] == "full_attention"
        while True:
            length = hit_length
            for (kind, bs, window, chunk), gids in self.lookups:
                if kind == "full_attention" and tables[gids[0]] is not None:  # looked up once: its hit only shrinks
                    length = min(length, lengths[gids[0]])
                    continue
                keyed = [self.keyed_hashes(request, gid, max_length // bs) for gid in gids]
                if window:
                    found = self.window_hit(keyed, length, bs, window)
                elif kind == "mamba":
                    found = self.state_hit(keyed, length, bs)
                elif chunk:
                    found = self.chunk_hit(keyed, length, bs, chunk)
                else:
                    found = self.leading_hit(keyed, length, bs)
                length = len(found[0]) * bs
                for gid, table in zip(gids, found):
                    tables[gid], lengths[gid] = table, length
                longest = max(longest, length)
            if length >= hit_length:
                break
            hit_length = length
            if simple:
                break
        junction = longest if longest > hit_length else 0
        if hit_length == 0 and junction == 0:
            return None, 0
        for gid, g in enumerate(self.groups):
            if g.kind == "full_attention":
                del tables[gid][cdiv(hit_length, g.block_size) :]
        return (tables, junction, hit_length), hit_length

    def keyed_hashes(self, request: Request, gid: int, num_blocks: int) -> list[bytes]:
        """The prefix cache's keys of the request's first num_blocks full blocks in group gid: content hash and group
        (vLLM's make_block_hash_with_group_id; a group of larger blocks takes the hash of each block's last
        hash_block_size tokens, BlockHashListWithBlockSize), kept until the request frees its blocks."""
        keyed = self.keys.setdefault(request.request_id, [[] for _ in self.groups])[gid]
        if len(keyed) < num_blocks:
            k = self.groups[gid].block_size // self.hash_block_size
            hashes = block_hashes(request, num_blocks * k, self.hash_block_size)
            key = self.group_keys[gid]
            keyed.extend([hashes[(i + 1) * k - 1] + key for i in range(len(keyed), num_blocks)])
        return keyed

    def cached_blocks(self, keyed: list[list[bytes]], i: int) -> list[int] | None:
        """Block i's first cached block in each group of a lookup (keyed: their keys), or None if one has none
        (BlockPool.get_cached_block)."""
        hash_ids, ends = self.pool.hash_ids, self.pool.hash_ends
        found = []
        for keys in keyed:
            h = hash_ids.get(keys[i])
            if h is None or ends[2 * h] < 0:
                return None
            found.append(ends[2 * h])
        return found

    def leading_hit(self, keyed: list[list[bytes]], max_length: int, bs: int) -> list[list[int]]:
        """Full attention's hit: cached blocks from the first on, at most max_length tokens, floored to the common
        block size (FullAttentionManager.find_longest_cache_hit)."""
        tables = [[] for _ in keyed]
        if len(keyed) == 1:  # one group: the same walk, inlined
            keys, table, hash_ids, ends = keyed[0], tables[0], self.pool.hash_ids, self.pool.hash_ends
            for i in range(max_length // bs):
                h = hash_ids.get(keys[i], -1)
                if h < 0 or ends[2 * h] < 0:
                    break
                table.append(ends[2 * h])
        else:
            for i in range(max_length // bs):
                found = self.cached_blocks(keyed, i)
                if found is None:
                    break
                for table, block in zip(tables, found):
                    table.append(block)
        keep = len(tables[0]) * bs // self.block_size * self.block_size // bs
        return [table[:keep] for table in tables]

    def window_hit(self, keyed: list[list[bytes]], max_length: int, bs: int, window: int) -> list[list[int]]:
        """A sliding window's hit: the last window_hit_blocks cached blocks in a row before a multiple of the common
        block size within max_length tokens, nulls before them, found right to left; else the cached blocks from the
        first on (SlidingWindowManager.find_longest_cache_hit)."""
        need, align = window_hit_blocks(window, bs), self.block_size
        n = max_length // bs
        tables = [[NULL_BLOCK_ID] * n for _ in keyed]
        run = 0
        for i in range(n - 1, -1, -1):
            found = self.cached_blocks(keyed, i)
            if found is None:
                run = 0
                continue
            if run == 0 and ((i + 1) * bs) % align:
                continue  # a hit ends on a multiple of the common block size
            for table, block in zip(tables, found):
                table[i] = block
            run += 1
            if run >= need:
                return [table[: i + run] for table in tables]
        while run * bs % align:
            run -= 1
        return [table[:run] for table in tables]

    def chunk_hit(self, keyed: list[list[bytes]], max_length: int, bs: int, chunk: int) -> list[list[int]]:
        """Chunked local attention's hit: nulls for the blocks before the chunk of token max_length (no lookup), then
        the cached blocks from the chunk's first on, at most max_length tokens
        (ChunkedLocalAttentionManager.find_longest_cache_hit)."""
        start = max_length // chunk * chunk // bs
        tables = [[NULL_BLOCK_ID] * start for _ in keyed]
        for i in range(start, max_length // bs):
            found = self.cached_blocks(keyed, i)
            if found is None:
                break
            for table, block in zip(tables, found):
                table.append(block)
        return tables

    def state_hit(self, keyed: list[list[bytes]], max_length: int, bs: int) -> list[list[int]]:
        """A Mamba group's hit: its last cached state within max_length tokens, found right to left, nulls before it
        (MambaManager.find_longest_cache_hit: a state is all a later token needs)."""
        for i in range(max_length // bs - 1, -1, -1):
            found = self.cached_blocks(keyed, i)
            if found is not None:
                return [[NULL_BLOCK_ID] * i + [block] for block in found]
        return [[] for _ in keyed]

    def new_step_starts(self) -> None:
        """A new schedule(): a Mamba state cached before it may be hit (MambaManager.new_step_starts)."""
        self.cached_this_step.clear()

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache each group's blocks that num_tokens known, computed tokens (floored to the common block size) fill
        and that are not yet past caching: every one of full attention's, a window's only those the window of the
        prompt's last boundary or of the shared prefix needs; a null block never (KVCacheCoordinator.cache_blocks,
        SlidingWindowManager.reachable_block_mask with prefix_cache_retention_interval 0)."""
        rid, align = request.request_id, self.block_size
        num_tokens = num_tokens // align * align
        num_cached, tables = self.num_cached[rid], self.tables[rid]
        for gid, g in enumerate(self.groups):
            bs, start = g.block_size, num_cached[gid]
            end = num_tokens // bs
            if start >= end:
                continue
            table = tables[gid]
            if g.sliding_window or self.mamba[gid]:  # a window's last blocks, or the state, before each boundary
                need = window_hit_blocks(g.sliding_window, bs) if g.sliding_window else 1
                marked = set()
                for boundary in (request.num_prompt_tokens - 1, self.junction[rid]):
                    if boundary > 0:
                        last = boundary // align * align // bs
                        marked.update(range(max(start, last - need), min(end, last)))
                ids = [j for j in sorted(marked) if table[j] != NULL_BLOCK_ID]
            else:
                ids = [j for j in range(start, end) if table[j] != NULL_BLOCK_ID]
            if ids:
                keyed = self.keyed_hashes(request, gid, end)
                self.pool.cache_full_blocks([table[j] for j in ids], [keyed[j] for j in ids])
                if self.mamba[gid]:
                    self.cached_this_step.update(self.pool.hash_of[table[j]] for j in ids)
            num_cached[gid] = end

    def checkpoint(self, gid: int, table, query_start: int, num_tokens: int, prefill_end: int):
        """(position, block index) of the prefill checkpoint Mamba group gid exports from inside the kernel into a
        block of its own as it computes tokens [query_start, num_tokens) of a prefill ending at prefill_end, with the
        table it holds now; None if not (MambaManager._needs_internal_checkpoint: the group has checkpoint blocks,
        the chunk reaches the prefill's end, the kernel can export the state at the last cacheable position before
        the chunk's end, rules.mamba_checkpoint_valid, and the block before the chunk's last is not yet held)."""
        align = self.checkpoint_alignments[gid]
        if not align or num_tokens < prefill_end:
            return None
        bs = self.groups[gid].block_size
        position = mamba_checkpoint_position(num_tokens, self.block_size)
        idx = cdiv(num_tokens, bs) - 2
        if idx < 0 or not mamba_checkpoint_valid(query_start, num_tokens, position, self.hash_block_size, bs, align):
            return None
        if idx < len(table) and table[idx] != NULL_BLOCK_ID:
            return None
        return position, idx

    def checkpoints_of(self, tables, query_start: int, num_tokens: int, prefill_end: int) -> list:
        """Each group's checkpoint (checkpoint) for a chunk of tokens [query_start, num_tokens); None for the groups
        without checkpoint blocks."""
        return [
            self.checkpoint(gid, table, query_start, num_tokens, prefill_end) if align else None
            for gid, (table, align) in enumerate(zip(tables, self.checkpoint_alignments))
        ]

    def cache_checkpoints(self, request: Request) -> None:
        """Key each checkpoint block the request's last allocation took at its position: when it is the prompt's
        last cacheable boundary or the shared prefix (vLLM's prefix_cache_retention_interval 0), unless the block
        already holds that key; else drop any key the block holds, the state being transient
        (MambaManager._cache_partial_tail_block with a checkpoint; BlockPool.cache_partial_block with
        replace_existing_hashes, _maybe_evict_cached_block)."""
        rid = request.request_id
        tables, pool = self.tables[rid], self.pool
        prompt = mamba_checkpoint_position(request.num_prompt_tokens, self.block_size)
        for gid, cp in enumerate(self.checkpoints[rid]):
            if cp is None:
                continue
            position, idx = cp
            block = tables[gid][idx]
            if position != prompt and position != self.junction[rid]:
                self.uncache(block)
                continue
            # every group's block is the scheduler's block (checks.check_kv_cache_groups), so the position ends
            # block idx and its key is that block's
            key = self.keyed_hashes(request, gid, idx + 1)[idx]
            h = pool.hash_ids.get(key, -1)
            if h >= 0 and pool.hash_of[block] == h:
                continue
            self.uncache(block)
            pool.cache_full_blocks([block], [key])
            self.cached_this_step.add(pool.hash_of[block])

    def uncache(self, block: int) -> None:
        """Take a held block out of the prefix cache (BlockPool._remove_cached_block_hashes)."""
        pool = self.pool
        h = pool.hash_of[block]
        if h >= 0:
            unlink(pool.hash_next, pool.hash_prev, pool.hash_ends, 2 * h, 2 * h + 1, block)
            pool.hash_of[block] = -1

    # ---------------------------------------------------------------- allocation
    def num_blocks_to_admit(self, num_tokens: int, prefill_end: int = 0) -> int:
        """Free blocks admitting a request of num_tokens needs without a prefix hit: every group's
        (rules.admission_blocks); a Mamba group's with checkpoint blocks one more when its prefill (ending at
        prefill_end > 0) exports a checkpoint (checkpoint), at most one more without prefill_end."""
        n = min(num_tokens, self.max_model_len)
        total = 0
        for gid, (g, cap) in enumerate(zip(self.groups, self.caps)):
            if prefill_end and self.checkpoint_alignments[gid]:
                cap = 2 if self.checkpoint(gid, (), 0, n, prefill_end) is not None else 1
            total += admission_blocks(n, g.block_size, cap)
        return total

    def hit_blocks_to_admit(self, hit, num_hit_tokens: int, num_tokens: int, capped: bool, prefill_end: int) -> int:
        """Free blocks admitting a request with this prefix hit needs to hold num_tokens: each group's new blocks
        (rules.hit_num_new_blocks, a window's capped; a Mamba group's one, two with a checkpoint) and its hit blocks
        no request holds (still in the free queue)."""
        ref, total = self.pool.ref, 0
        for gid, (g, cap, table, mamba) in enumerate(zip(self.groups, self.caps, hit[0], self.mamba)):
            bs = g.block_size
            if mamba:  # one new block at most (two with a checkpoint), its hit state taken back from the free queue
                if table and self.pool.hash_of[table[-1]] in self.cached_this_step:
                    return self.NEVER  # a state cached this step is not there yet: not before the next step
                new = cdiv(num_tokens, bs) - len(table)
                most = 1
                if self.checkpoint_alignments[gid] and self.checkpoint(
                    gid, (), num_hit_tokens, num_tokens, prefill_end
                ):
                    most = 2
                total += min(new, most) + sum(1 for b in table if b != NULL_BLOCK_ID and ref[b] == 0)
                continue
            skipped = num_skipped_tokens(num_hit_tokens, g.sliding_window, g.attention_chunk_size) // bs
            total += hit_num_new_blocks(num_tokens, bs, cap if capped else 0, skipped, len(table))
            total += sum(1 for b in table[skipped:] if b != NULL_BLOCK_ID and ref[b] == 0)
        return total

    def can_admit(self, request: Request, num_new_tokens: int, hit, num_blocks_taken: int = 0) -> bool:
        """Whether allocate_slots would admit the request (with this prefix hit) with num_blocks_taken blocks fewer
        free: blocks for its whole current length, then for the tokens it computes now."""
        free = self.pool.num_free_blocks - num_blocks_taken
        prefill_end = prefill_end_tokens(request.num_prompt_tokens, request.num_tokens)
        if hit is None:
            return self.num_blocks_to_admit(request.num_tokens, prefill_end) <= free
        n, max_len, hit_tokens = request.num_tokens, self.max_model_len, hit[2]
        if self.hit_blocks_to_admit(hit, hit_tokens, min(n, max_len), True, prefill_end) > free:
            return False
        num_slots = min(hit_tokens + num_new_tokens, max_len)
        return self.hit_blocks_to_admit(hit, hit_tokens, num_slots, False, prefill_end) <= free

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hit=None, full_sequence_must_fit: bool = False
    ) -> bool:
        """Blocks in every group for num_new_tokens more computed tokens, after those behind each window are freed
        (KVCacheManager.allocate_slots), then the blocks they fill cached; on admission a prefix hit's blocks are
        taken first (the tables get_computed_blocks found, the blocks behind each window left null). False, with
        nothing else changed, when the pool has too few free blocks. A call that would free, take and cache nothing
        returns at once (quiet_limits)."""
        pool, max_len, rid = self.pool, self.max_model_len, request.request_id
        if full_sequence_must_fit:
            if not self.can_admit(request, num_new_tokens, hit):
                return False
            if hit is not None:
                return self.admit_hit(request, num_new_tokens, hit)
        tables = self.tables.get(rid)
        computed = min(request.num_computed_tokens, max_len)
        num_slots = min(computed + num_new_tokens, max_len)
        to_cache = min(computed + num_new_tokens, request.num_tokens)
        if tables is not None:
            processed = computed - request.num_in_flight_tokens
            slots, settled, cacheable = self.quiet[rid]
            if num_slots <= slots and processed < settled and to_cache < cacheable:
                return True
            self.remove_skipped_blocks(rid, processed)
        need = 0
        held = tables or [()] * len(self.groups)
        prefill_end = prefill_end_tokens(request.num_prompt_tokens, request.num_tokens)
        checkpoints = self.checkpoints_of(held, computed, computed + num_new_tokens, prefill_end)
        for g, table, mamba, cp in zip(self.groups, held, self.mamba, checkpoints):
            new = max(num_blocks_to_allocate(0, num_slots, len(table), g.block_size, max_len), 0)
            need += min(new, 1 if cp is None else 2) if mamba and self.mamba_block_size else new
        if need > pool.num_free_blocks:
            if tables is not None:
                self.quiet[rid] = self.quiet_limits(rid)
            return False
        if tables is None:
            tables = self.tables[rid] = [[] for _ in self.groups]
            self.leading[rid] = [0] * len(self.groups)
            self.num_cached[rid] = [0] * len(self.groups)
            self.junction[rid] = 0
            self.last_state[rid] = [None] * len(self.groups)
        self.checkpoints[rid] = checkpoints
        self.take_new_blocks(rid, num_slots)
        if self.enable_caching:
            self.cache_blocks(request, to_cache)
            self.cache_checkpoints(request)
        self.quiet[rid] = self.quiet_limits(rid)
        return True

    def admit_hit(self, request: Request, num_new_tokens: int, hit) -> bool:
        """Admit a request with a prefix hit (the free blocks checked): every group's hit blocks touched first, behind
        its window left null, then its new blocks taken and cached (allocate_new_computed_blocks, allocate_new_blocks,
        cache_blocks)."""
        rid, (hit_tables, junction, hit_tokens) = request.request_id, hit
        tables, leading = [], []
        for g, table, mamba in zip(self.groups, hit_tables, self.mamba):
            if mamba:  # the hit state only (MambaManager.get_num_skipped_tokens: all tokens but the last)
                skipped = max(hit_tokens - 1, 0) // g.block_size
            else:
                skipped = num_skipped_tokens(hit_tokens, g.sliding_window, g.attention_chunk_size) // g.block_size
            held = [b for b in table[skipped:] if b != NULL_BLOCK_ID]
            touch_blocks(self.pool, held, len(held))
            tables.append([NULL_BLOCK_ID] * skipped + table[skipped:])
            leading.append(0 if mamba else skipped)
        self.tables[rid], self.leading[rid] = tables, leading
        self.num_cached[rid] = [len(t) for t in tables]
        self.junction[rid] = junction
        self.last_state[rid] = [None] * len(tables)
        prefill_end = prefill_end_tokens(request.num_prompt_tokens, request.num_tokens)
        self.checkpoints[rid] = self.checkpoints_of(
            [()] * len(tables), hit_tokens, hit_tokens + num_new_tokens, prefill_end
        )
        self.take_new_blocks(rid, min(hit_tokens + num_new_tokens, self.max_model_len))
        self.cache_blocks(request, min(hit_tokens + num_new_tokens, request.num_tokens))
        self.cache_checkpoints(request)
        self.quiet[rid] = self.quiet_limits(rid)
        return True

    def take_new_blocks(self, rid: int, num_slots: int) -> None:
        """Extend each group's table to cover num_slots tokens from the free queue, group by group; a Mamba group's
        with prefix caching by nulls then one block, the state after its last token (two with a checkpoint: the
        checkpoint's in the block before last), its previous state kept until the request's tokens are settled past
        it (MambaManager.allocate_new_blocks in mamba_cache_mode "align")."""
        pool, max_len, tables = self.pool, self.max_model_len, self.tables[rid]
        checkpoints = self.checkpoints.get(rid) or [None] * len(tables)
        for gid, (g, table) in enumerate(zip(self.groups, tables)):
            new = num_blocks_to_allocate(0, num_slots, len(table), g.block_size, max_len)
            if self.mamba_block_size and self.mamba[gid]:
                ck = int(checkpoints[gid] is not None)
                if new <= 0 and not ck:
                    continue
                if table:
                    self.last_state[rid][gid] = len(table) - 1
                required = len(table) + new
                if len(table) < required - 1 - ck:  # nulls up to the last block, or to the checkpoint's
                    table.extend([NULL_BLOCK_ID] * (required - 1 - ck - len(table)))
                new = required - len(table)
            if new > 0:
                at = len(table)
                table.extend([NULL_BLOCK_ID] * new)
                take_blocks(pool, new, table, at)

    def quiet_limits(self, rid: int) -> tuple[int, int, int]:
        """(slots, processed, cacheable): every group's table covers slots tokens, so no group takes a block for a
        request that needs at most those; no window frees a block before processed tokens are settled (its next
        block leaves the window of the token after (leading + 1) x block_size + window - 1 of them;
        rules.num_skipped_tokens); and no group caches a block before cacheable tokens are known and computed (its
        next block past caching fills, floored to the common block size)."""
        if self.mamba_block_size:
            return 0, 0, 0  # Mamba states with prefix caching: never quiet
        slots, settled, cacheable = self.max_model_len, self.NEVER, self.NEVER
        tables, leading = self.tables[rid], self.leading[rid]
        for g, table, nulls in zip(self.groups, tables, leading):
            slots = min(slots, len(table) * g.block_size)
            if g.sliding_window:
                settled = min(settled, (nulls + 1) * g.block_size + g.sliding_window - 1)
            elif g.attention_chunk_size:  # its next block is freed once the chunk past it starts
                settled = min(
                    settled, cdiv((nulls + 1) * g.block_size, g.attention_chunk_size) * g.attention_chunk_size
                )
        if self.enable_caching:
            align = self.block_size
            for g, n in zip(self.groups, self.num_cached[rid]):
                cacheable = min(cacheable, cdiv((n + 1) * g.block_size, align) * align)
        return slots, settled, cacheable

    def remove_skipped_blocks(self, rid: int, num_processed_tokens: int) -> None:
        """Free each sliding-window group's blocks wholly before the window of the next token, right to left until
        a block freed before (single_type_kv_cache_manager.py, remove_skipped_blocks, _remove_blocks_in_range): the
        blocks after the table's leading nulls up to the window's; a chunked group's before the next token's chunk;
        a Mamba group's (with prefix caching) every state before the last token's and the previous state once the
        settled tokens are past it."""
        tables, leading = self.tables[rid], self.leading[rid]
        for i, g in enumerate(self.groups):
            if self.mamba_block_size and self.mamba[i]:
                self.remove_states(rid, i, num_processed_tokens)
                continue
            if not (g.sliding_window or g.attention_chunk_size) or num_processed_tokens <= 0:
                continue
            table, start = tables[i], leading[i]
            skipped = num_skipped_tokens(num_processed_tokens, g.sliding_window, g.attention_chunk_size)
            end = min(skipped // g.block_size, len(table))
            if start < end:
                free_table(self.pool, table[start:end], end - start)  # table[end - 1] freed first
                self.num_window_freed += end - start
                table[start:end] = [NULL_BLOCK_ID] * (end - start)
                leading[i] = end

    def remove_states(self, rid: int, gid: int, num_processed_tokens: int) -> None:
        """MambaManager.remove_skipped_blocks in mamba_cache_mode "align" for group gid: the states before the last
        processed token's block freed, right to left, nulls skipped, from the first not yet retired (leading); then
        the previous state (last_state) once a whole block of settled tokens lies past it."""
        pool, table, retired = self.pool, self.tables[rid][gid], self.leading[rid]
        bs = self.groups[gid].block_size
        if num_processed_tokens - 1 > 0:
            end = min((num_processed_tokens - 1) // bs, len(table))
            start = retired[gid]
            if start < end:
                held = [j for j in range(start, end) if table[j] != NULL_BLOCK_ID]
                free_table(pool, [table[j] for j in held], len(held))  # the rightmost freed first
                for j in held:
                    table[j] = NULL_BLOCK_ID
                retired[gid] = end
        last = self.last_state[rid][gid]
        if last is not None and last < cdiv(num_processed_tokens, bs) - 1 and table[last] != NULL_BLOCK_ID:
            free_table(pool, [table[last]], 1)
            table[last] = NULL_BLOCK_ID

    def free(self, request: Request) -> int:
        """Give back every group's blocks, group by group, each table last block first (its nulls skipped); the
        number of blocks."""
        rid = request.request_id
        tables = self.tables.pop(rid, None)
        if tables is None:
            return 0
        num_freed = 0
        for table, start in zip(tables, self.leading.pop(rid)):
            held = [b for b in table[start:] if b != NULL_BLOCK_ID]
            free_table(self.pool, held, len(held))
            num_freed += len(held)
        del self.quiet[rid], self.num_cached[rid], self.junction[rid], self.last_state[rid]
        self.keys.pop(rid, None)
        self.checkpoints.pop(rid, None)
        return num_freed
