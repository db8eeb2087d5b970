"""One KV cache group's block tables, a manager per kind of layer (vllm/v1/core/single_type_kv_cache_manager.py).

A manager keeps each request's block table in one KV cache group (req_to_blocks; capacity.KVCacheGroup gives the
group's kind and block_size) over the BlockPool that every group shares, and how many leading entries of it are in
the prefix cache (num_cached_block). The base class does what every kind does alike: a prefix hit's blocks taken
(add_local_computed_blocks), new blocks from the free queue as a request grows (allocate_new_blocks), full blocks
cached (cache_blocks), every block given back, table last block first (free). A kind differs in the blocks a request
needs (get_num_blocks_to_allocate), the leading tokens no later token attends to, whose blocks it frees for the null
block (get_num_skipped_tokens, remove_skipped_blocks), how it finds a prefix hit (find_longest_cache_hit) and which
blocks it caches (reachable_blocks); MambaManager adds its state blocks and its prefill checkpoint blocks. Tokens and
blocks are counts; scheduler_block_size is the scheduler's block (every group's block size divides it), a prefix
hit a multiple of it; hash_block_size the tokens a content hash covers (every group's block size a multiple of it).
"""

from __future__ import annotations

from kvlab.core.block_pool import NULL_BLOCK_ID, free_table, take_blocks, touch_blocks, unlink
from kvlab.core.engine.block_hashes import block_hashes
from kvlab.core.engine.rules import (
    NEVER_ENOUGH_BLOCKS,
    NEVER_REACHED_TOKENS,
    admission_num_new_blocks,
    hit_num_new_blocks,
    mamba_checkpoint_position,
    mamba_checkpoint_valid,
    num_blocks_to_allocate,
    num_skipped_tokens,
    window_hit_blocks,
)
from kvlab.core.units import cdiv


def get_cached_blocks(block_pool, keys_by_group: list[list[bytes]], i: int) -> list[int] | None:
    """Block i's first cached block in each group of one spec (keys_by_group: each group's keys), or None if a group
    has none (block_pool.py, BlockPool.get_cached_block over kv_cache_group_ids)."""
    hash_ids, ends = block_pool.hash_ids, block_pool.hash_ends
    found = []
    for keys in keys_by_group:
        h = hash_ids.get(keys[i])
        if h is None or ends[2 * h] < 0:
            return None
        found.append(ends[2 * h])
    return found


class SingleTypeKVCacheManager:
    """One KV cache group's block tables (SingleTypeKVCacheManager): what every kind of layer does alike."""

    frees_skipped_blocks = False  # whether remove_skipped_blocks may free a block (windows, chunks, Mamba states)

    def __init__(
        self,
        kv_cache_group,
        block_pool,
        kv_cache_group_id: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_model_len: int,
        max_admission_blocks_per_request: int = 0,
        group_key: bytes | None = None,
    ):
        self.kv_cache_group = kv_cache_group
        self.block_size = kv_cache_group.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.max_model_len = max_model_len
        self.max_admission_blocks_per_request = max_admission_blocks_per_request  # 0: no cap
        self.group_key = group_key  # appended to a content hash in the prefix cache; None: the hash alone (one group)
        self.req_to_blocks: dict[int, list[int]] = {}  # request_id -> its block table (NULL_BLOCK_ID: none held)
        self.num_cached_block: dict[int, int] = {}  # request_id -> its table's leading entries past caching
        self.num_skipped_blocks: dict[int, int] = {}  # request_id -> its table's leading entries freed behind
        self.req_to_block_hashes: dict[int, list[bytes]] = {}  # request_id -> its blocks' keys (keyed_hashes)

    @classmethod
    def max_admission_blocks(cls, kv_cache_group, max_model_len: int, max_in_flight_tokens: int, enable_caching: bool):
        """The most blocks admission asks of this group for one request (0: blocks for its whole length)."""
        return 0

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens no token after num_computed_tokens attends to (none here)."""
        return 0

    def next_skipped_tokens(self, request_id: int) -> int:
        """Processed tokens from which remove_skipped_blocks frees the request's next block (NEVER_REACHED_TOKENS: none)."""
        return NEVER_REACHED_TOKENS

    # ---------------------------------------------------------------- allocation
    def num_evictable_blocks(self, blocks) -> int:
        """Hit blocks no request holds: still in the free queue, so taking them leaves one free block fewer each
        (SingleTypeKVCacheManager._get_num_evictable_blocks)."""
        ref = self.block_pool.ref
        return sum(1 for b in blocks if b != NULL_BLOCK_ID and ref[b] == 0)

    def get_num_blocks_to_allocate(
        self, request_id, num_tokens, new_computed_blocks, num_computed_tokens, prefill_end, apply_admission_cap=False
    ) -> int:
        """Free blocks the request needs to hold num_tokens in this group (get_num_blocks_to_allocate): a running
        request's new blocks (rules.num_blocks_to_allocate); one not yet running, whose prefix hit gives
        num_computed_tokens (new_computed_blocks: every group's hit table, this group's at its kv_cache_group_id; or
        None), its new blocks past those behind its window (apply_admission_cap: at most
        max_admission_blocks_per_request) and its hit blocks no request holds (rules.hit_num_new_blocks)."""
        table = self.req_to_blocks.get(request_id)
        if table is not None:  # a running request has no new hit
            num_new = num_blocks_to_allocate(0, num_tokens, len(table), self.block_size, self.max_model_len)
            return num_new if num_new > 0 else 0
        hit = new_computed_blocks[self.kv_cache_group_id] if new_computed_blocks else ()
        skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        cap = self.max_admission_blocks_per_request if apply_admission_cap else 0
        num_new = hit_num_new_blocks(num_tokens, self.block_size, cap, skipped, len(hit))
        return num_new + self.num_evictable_blocks(hit[skipped:]) if hit else num_new

    def add_local_computed_blocks(self, request_id: int, new_computed_blocks, num_computed_tokens: int) -> None:
        """Start a request's table from its prefix hit (new_computed_blocks: every group's hit table, or None: none):
        the blocks behind its window null, the others touched (one more reference each; one no request held leaves
        the free queue), every entry already cached (add_local_computed_blocks)."""
        assert request_id not in self.req_to_blocks, "a running request has no new hit"
        hit = new_computed_blocks[self.kv_cache_group_id] if new_computed_blocks else ()
        skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        held = [b for b in hit[skipped:] if b != NULL_BLOCK_ID]
        if held:
            touch_blocks(self.block_pool, held, len(held))
        table = self.req_to_blocks[request_id] = [NULL_BLOCK_ID] * skipped + list(hit[skipped:])
        self.num_cached_block[request_id] = len(table)
        self.num_skipped_blocks[request_id] = skipped

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> None:
        """Extend the request's table to hold num_tokens (at most max_model_len) from the free queue's head."""
        table = self.req_to_blocks[request_id]
        num_new = num_blocks_to_allocate(0, num_tokens, len(table), self.block_size, self.max_model_len)
        if num_new > 0:
            self.append_new_blocks(table, num_new)

    def append_new_blocks(self, table: list[int], num_blocks: int) -> None:
        """num_blocks blocks (none if <= 0) from the free queue's head onto the table (BlockPool.get_new_blocks)."""
        if num_blocks > 0:
            at = len(table)
            table.extend([NULL_BLOCK_ID] * num_blocks)
            take_blocks(self.block_pool, num_blocks, table, at)

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> int:
        """Free the blocks wholly before the window (or chunk) of the token after num_computed_tokens settled ones,
        right to left until a block freed before, each left null (remove_skipped_blocks, _remove_blocks_in_range);
        how many."""
        if num_computed_tokens <= 0:
            return 0
        table, start = self.req_to_blocks[request_id], self.num_skipped_blocks[request_id]
        end = min(self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(table))
        if start >= end:
            return 0
        free_table(self.block_pool, table[start:end], end - start)  # table[end - 1] freed first
        table[start:end] = [NULL_BLOCK_ID] * (end - start)
        self.num_skipped_blocks[request_id] = end
        return end - start

    def free(self, request_id: int) -> int:
        """Give back the request's blocks, last block first, its nulls skipped (free); how many."""
        table = self.req_to_blocks.pop(request_id, None)
        start = self.num_skipped_blocks.pop(request_id, 0)
        self.num_cached_block.pop(request_id, None)
        self.req_to_block_hashes.pop(request_id, None)
        if table is None:
            return 0
        held = [b for b in table[start:] if b != NULL_BLOCK_ID]
        free_table(self.block_pool, held, len(held))
        return len(held)

    # ---------------------------------------------------------------- prefix cache
    def keyed_hashes(self, request, num_blocks: int) -> list[bytes]:
        """The prefix cache's keys of the request's first num_blocks full blocks in this group: the content hash and
        the group (vLLM's make_block_hash_with_group_id; a block of several hash blocks takes the hash of its last,
        BlockHashListWithBlockSize), kept until the request frees its blocks; one group's: the content hash alone."""
        if self.group_key is None:
            return block_hashes(request, num_blocks, self.block_size)
        keys = self.req_to_block_hashes.setdefault(request.request_id, [])
        if len(keys) < num_blocks:
            k = self.block_size // self.hash_block_size
            hashes = block_hashes(request, num_blocks * k, self.hash_block_size)
            key = self.group_key
            keys.extend([hashes[(i + 1) * k - 1] + key for i in range(len(keys), num_blocks)])
        return keys

    def reachable_blocks(self, request, start: int, end: int):
        """The table entries in [start, end) that a later prefix hit can use, so worth caching (vLLM's
        reachable_block_mask, None: every one)."""
        return range(start, end)

    def boundary_blocks(self, request, start: int, end: int, num_hit_blocks: int) -> list[int]:
        """The num_hit_blocks entries before each boundary a later hit may end on, in [start, end): the prompt's last
        one (all but its last token, floored to the scheduler's block) and its shared prefix (vLLM's
        prefix_cache_retention_interval 0: reachable_boundaries)."""
        align, bs = self.scheduler_block_size, self.block_size
        marked = set()
        for boundary in (request.num_prompt_tokens - 1, request.shared_prefix_boundary):
            if boundary > 0:
                last = boundary // align * align // bs
                marked.update(range(max(start, last - num_hit_blocks), min(end, last)))
        return sorted(marked)

    def cache_blocks(self, request, num_tokens: int):
        """Cache the request's table entries that num_tokens known, computed tokens fill and that are not yet past
        caching, those a later hit can use (reachable_blocks), nulls never (cache_blocks); the blocks cached."""
        rid = request.request_id
        start, end = self.num_cached_block[rid], num_tokens // self.block_size
        if start >= end:
            return ()
        table = self.req_to_blocks[rid]
        ids = [j for j in self.reachable_blocks(request, start, end) if table[j] != NULL_BLOCK_ID]
        blocks = [table[j] for j in ids]
        if ids:
            keys = self.keyed_hashes(request, end)
            self.block_pool.cache_full_blocks(blocks, [keys[j] for j in ids])
        self.num_cached_block[rid] = end
        return blocks

    def new_step_starts(self) -> None:
        """A new schedule() (MambaManager's: a state cached before it may be hit)."""


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention (FullAttentionManager): every block held to the end, every full block cached, a hit the cached
    blocks from the first on; one group of it is the one-group engine."""

    def admission_num_new_blocks(
        self, num_tokens: int, new_computed_blocks, num_new_tokens: int, num_free_blocks: int
    ) -> int:
        """The group alone (the one-group engine): the new blocks admitting a request of num_tokens with this prefix
        hit to compute num_new_tokens takes, or -1 if num_free_blocks are too few (both checks of
        KVCacheManager.allocate_slots in one rule, rules.admission_num_new_blocks, the compiled loop's)."""
        hit = new_computed_blocks[self.kv_cache_group_id] if new_computed_blocks else ()
        num_evictable = self.num_evictable_blocks(hit) if hit else 0
        bs, max_len = self.block_size, self.max_model_len
        return admission_num_new_blocks(
            num_tokens, len(hit), num_evictable, num_new_tokens, num_free_blocks, bs, max_len
        )

    def allocate_step(self, request, num_new_tokens: int) -> bool:
        """The group alone (the one-group engine): a running request's blocks for num_new_tokens more computed tokens
        if the pool has them (get_num_blocks_to_allocate, allocate_new_blocks in one call), then the blocks its known,
        computed tokens fill cached; False, with nothing changed, if not (KVCacheManager.allocate_slots)."""
        table, computed = self.req_to_blocks[request.request_id], request.num_computed_tokens
        num_new = num_blocks_to_allocate(computed, num_new_tokens, len(table), self.block_size, self.max_model_len)
        if num_new > self.block_pool.num_free_blocks:
            return False
        if num_new > 0:
            at = len(table)
            table.extend([NULL_BLOCK_ID] * num_new)
            take_blocks(self.block_pool, num_new, table, at)
        if self.block_pool.enable_caching:
            self.cache_blocks(request, min(computed + num_new_tokens, request.num_tokens))
        return True

    def add_local_computed_blocks(self, request_id: int, new_computed_blocks, num_computed_tokens: int) -> None:
        """SingleTypeKVCacheManager.add_local_computed_blocks, where no block is skipped: every hit block touched."""
        assert request_id not in self.req_to_blocks, "a running request has no new hit"
        if new_computed_blocks:
            hit = new_computed_blocks[self.kv_cache_group_id]
            touch_blocks(self.block_pool, hit, len(hit))
            self.req_to_blocks[request_id] = list(hit)
            self.num_cached_block[request_id] = len(hit)
        else:
            self.req_to_blocks[request_id] = []
            self.num_cached_block[request_id] = 0

    def find_longest_cache_hit(self, keys_by_group: list[list[bytes]], max_length: int) -> tuple[list, int]:
        """Each group's cached blocks from the first on, at most max_length tokens, floored to the scheduler's block;
        and their tokens (FullAttentionManager.find_longest_cache_hit)."""
        bs = self.block_size
        tables = [[] for _ in keys_by_group]
        if len(keys_by_group) == 1:  # one group: the same walk, inlined
            keys, table = keys_by_group[0], tables[0]
            hash_ids, ends = self.block_pool.hash_ids, self.block_pool.hash_ends
            for i in range(max_length // bs):
                h = hash_ids.get(keys[i], -1)
                if h < 0 or ends[2 * h] < 0:
                    break
                table.append(ends[2 * h])
        else:
            for i in range(max_length // bs):
                found = get_cached_blocks(self.block_pool, keys_by_group, i)
                if found is None:
                    break
                for table, block in zip(tables, found):
                    table.append(block)
        align = self.scheduler_block_size
        num_blocks = len(tables[0]) * bs // align * align // bs
        if num_blocks < len(tables[0]):
            for table in tables:
                del table[num_blocks:]
        return tables, num_blocks * bs

    def cache_blocks(self, request, num_tokens: int):
        """SingleTypeKVCacheManager.cache_blocks: every full block (a full-attention table holds no null)."""
        end = num_tokens // self.block_size
        if end <= self.num_cached_block[request.request_id]:  # (the asynchronous scheduler asks at every token)
            return ()
        rid = request.request_id
        start = self.num_cached_block[rid]
        blocks = self.req_to_blocks[rid][start:end]
        self.block_pool.cache_full_blocks(blocks, self.keyed_hashes(request, end)[start:end])
        self.num_cached_block[rid] = end
        return blocks

    def free(self, request_id: int) -> int:
        """SingleTypeKVCacheManager.free of a table without nulls."""
        table = self.req_to_blocks.pop(request_id, None)
        if table is None:  # (a request preempted with a batch in flight, finished by its stale token)
            return 0
        del self.num_cached_block[request_id]
        self.req_to_block_hashes.pop(request_id, None)
        free_table(self.block_pool, table, len(table))
        return len(table)


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A sliding window (SlidingWindowManager): the blocks wholly behind the window of the next settled token freed, a
    hit the window's blocks before its end, and only those blocks cached at the boundaries a later hit may end on."""

    frees_skipped_blocks = True

    def __init__(self, kv_cache_group, block_pool, *args, **kwargs):
        super().__init__(kv_cache_group, block_pool, *args, **kwargs)
        self.sliding_window = kv_cache_group.sliding_window
        self.contiguous_blocks_for_hit = window_hit_blocks(self.sliding_window, self.block_size)

    @classmethod
    def max_admission_blocks(cls, kv_cache_group, max_model_len: int, max_in_flight_tokens: int, enable_caching: bool):
        """SlidingWindowSpec.max_admission_blocks_per_request (capacity.KVCacheGroup.blocks_per_request): the window
        less one, the tokens in flight and a partly used first block."""
        return kv_cache_group.blocks_per_request(max_model_len, max_in_flight_tokens)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """All but the last sliding_window - 1 tokens (rules.num_skipped_tokens)."""
        return num_skipped_tokens(num_computed_tokens, self.sliding_window)

    def next_skipped_tokens(self, request_id: int) -> int:
        """Its next block leaves the window of the token after (skipped + 1) x block_size + sliding_window - 1."""
        return (self.num_skipped_blocks[request_id] + 1) * self.block_size + self.sliding_window - 1

    def find_longest_cache_hit(self, keys_by_group: list[list[bytes]], max_length: int) -> tuple[list, int]:
        """The last contiguous_blocks_for_hit cached blocks in a row before a multiple of the scheduler's block within
        max_length tokens, nulls before them, found right to left; else the cached blocks from the first on
        (SlidingWindowManager.find_longest_cache_hit); and their tokens."""
        need, align, bs = self.contiguous_blocks_for_hit, self.scheduler_block_size, self.block_size
        n = max_length // bs
        tables = [[NULL_BLOCK_ID] * n for _ in keys_by_group]
        run = 0
        for i in range(n - 1, -1, -1):
            found = get_cached_blocks(self.block_pool, keys_by_group, i)
            if found is None:
                run = 0
                continue
            if run == 0 and ((i + 1) * bs) % align:
                continue  # a hit ends on a multiple of the scheduler's block
            for table, block in zip(tables, found):
                table[i] = block
            run += 1
            if run >= need:
                return [table[: i + run] for table in tables], (i + run) * bs
        while run * bs % align:
            run -= 1
        return [table[:run] for table in tables], run * bs

    def reachable_blocks(self, request, start: int, end: int):
        """The window's blocks before each boundary a later hit may end on (SlidingWindowManager.reachable_block_mask
        with prefix_cache_retention_interval 0)."""
        return self.boundary_blocks(request, start, end, self.contiguous_blocks_for_hit)


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention (ChunkedLocalAttentionManager): every block before the chunk of the next settled token
    freed, a hit nulls before its chunk and that chunk's cached blocks, every full block cached."""

    frees_skipped_blocks = True

    def __init__(self, kv_cache_group, block_pool, *args, **kwargs):
        super().__init__(kv_cache_group, block_pool, *args, **kwargs)
        self.attention_chunk_size = kv_cache_group.attention_chunk_size

    @classmethod
    def max_admission_blocks(cls, kv_cache_group, max_model_len: int, max_in_flight_tokens: int, enable_caching: bool):
        """ChunkedLocalAttentionSpec's max_admission_blocks_per_request (capacity.KVCacheGroup.blocks_per_request): a
        chunk and the tokens in flight."""
        return kv_cache_group.blocks_per_request(max_model_len, max_in_flight_tokens)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Every token before the chunk of the next one (rules.num_skipped_tokens)."""
        return num_skipped_tokens(num_computed_tokens, 0, self.attention_chunk_size)

    def next_skipped_tokens(self, request_id: int) -> int:
        """Its next block is freed once the chunk past it starts."""
        chunk = self.attention_chunk_size
        return cdiv((self.num_skipped_blocks[request_id] + 1) * self.block_size, chunk) * chunk

    def find_longest_cache_hit(self, keys_by_group: list[list[bytes]], max_length: int) -> tuple[list, int]:
        """Nulls for the blocks before the chunk of token max_length (no lookup), then the cached blocks from the
        chunk's first on, at most max_length tokens (ChunkedLocalAttentionManager.find_longest_cache_hit); and their
        tokens."""
        bs = self.block_size
        start = max_length // self.attention_chunk_size * self.attention_chunk_size // bs
        tables = [[NULL_BLOCK_ID] * start for _ in keys_by_group]
        for i in range(start, max_length // bs):
            found = get_cached_blocks(self.block_pool, keys_by_group, i)
            if found is None:
                break
            for table, block in zip(tables, found):
                table.append(block)
        return tables, len(tables[0]) * bs


class MambaManager(SingleTypeKVCacheManager):
    """Mamba states (MambaManager). Without prefix caching (mamba_cache_mode "none") a block of max_model_len tokens
    holds a request's one state from admission to the end, as a full-attention block would. With it ("align") a state
    is a block of the scheduler's size: one new block a step, the state after its last token, the blocks before it
    null; the previous state freed once the settled tokens pass it; a hit the last cached state; only the states at
    the boundaries a later hit may end on cached. With prefill checkpoint blocks (a Hopper GPU's Gated DeltaNet
    kernel) the chunk that ends a prefill may run through its last cacheable boundary when the kernel can export the
    state there: that step takes two blocks, the checkpoint's (the block before last) and the running state's, the
    checkpoint's keyed at its position when a later hit can use it (cache_checkpoint)."""

    def __init__(self, kv_cache_group, block_pool, *args, enable_caching: bool = False, **kwargs):
        super().__init__(kv_cache_group, block_pool, *args, **kwargs)
        self.mamba_cache_mode = "align" if enable_caching else "none"
        self.frees_skipped_blocks = enable_caching
        # the tokens a checkpoint's offset is a multiple of (MambaSpec.prefill_checkpoint_alignment, the group's block
        # size when it gives none); 0: no prefill checkpoint blocks (has_prefill_checkpoint_blocks)
        g = kv_cache_group
        self.prefill_checkpoint_alignment = (
            (g.prefill_checkpoint_alignment or g.block_size)
            if enable_caching and g.num_prefill_checkpoint_blocks
            else 0
        )
        self.last_state_block_idx: dict[int, int] = {}  # request_id -> its previous state's table index
        self.checkpoints: dict[int, tuple[int, int]] = {}  # request_id -> (position, table index) of its last step's
        self.cached_blocks_this_step: set[int] = set()  # hash ids of the states cached this step

    @classmethod
    def max_admission_blocks(cls, kv_cache_group, max_model_len: int, max_in_flight_tokens: int, enable_caching: bool):
        """With prefix caching one new state block, and its prefill checkpoint blocks (get_num_blocks_to_allocate in
        mamba_cache_mode "align": at most one more, when a prefill exports a checkpoint into a block of its own)."""
        return 1 + kv_cache_group.num_prefill_checkpoint_blocks if enable_caching else 0

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Every token but the last: a state is all a later token needs (MambaManager.get_num_skipped_tokens)."""
        return max(num_computed_tokens - 1, 0)

    def checkpoint(self, blocks, query_start: int, num_tokens: int, prefill_end: int) -> tuple[int, int] | None:
        """(position, table index) of the prefill checkpoint this group exports from inside the kernel into a block of
        its own as it computes tokens [query_start, num_tokens) of a prefill ending at prefill_end, holding blocks;
        None if not (MambaManager._needs_internal_checkpoint: the group has checkpoint blocks, the chunk reaches the
        prefill's end, the kernel can export the state at the last cacheable position before the chunk's end,
        rules.mamba_checkpoint_valid, and the block before the chunk's last is not yet held)."""
        align = self.prefill_checkpoint_alignment
        if not align or num_tokens < prefill_end:
            return None
        bs = self.block_size
        position = mamba_checkpoint_position(num_tokens, self.scheduler_block_size)
        idx = cdiv(num_tokens, bs) - 2
        if idx < 0 or not mamba_checkpoint_valid(query_start, num_tokens, position, self.hash_block_size, bs, align):
            return None
        if idx < len(blocks) and blocks[idx] != NULL_BLOCK_ID:
            return None
        return position, idx

    def get_num_blocks_to_allocate(
        self, request_id, num_tokens, new_computed_blocks, num_computed_tokens, prefill_end, apply_admission_cap=False
    ) -> int:
        """SingleTypeKVCacheManager.get_num_blocks_to_allocate; in mamba_cache_mode "align" one new block at most, two
        with a checkpoint (noted for allocate_new_blocks unless apply_admission_cap), and a hit state no request holds;
        NEVER_ENOUGH_BLOCKS for a hit on a state cached this step, not there yet (MambaManager.get_num_blocks_to_allocate)."""
        if self.mamba_cache_mode == "none":
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks, num_computed_tokens, prefill_end, apply_admission_cap
            )
        table = self.req_to_blocks.get(request_id)
        if table is not None:  # a running request
            num_new = max(num_blocks_to_allocate(0, num_tokens, len(table), self.block_size, self.max_model_len), 0)
            checkpoint = self.checkpoint(table, num_computed_tokens, num_tokens, prefill_end)
            num_evictable = 0
        else:
            hit = new_computed_blocks[self.kv_cache_group_id] if new_computed_blocks else ()
            if hit and self.block_pool.hash_of[hit[-1]] in self.cached_blocks_this_step:
                return NEVER_ENOUGH_BLOCKS  # not before the next step
            num_new = cdiv(num_tokens, self.block_size) - len(hit)
            checkpoint = self.checkpoint((), num_computed_tokens, num_tokens, prefill_end)
            num_evictable = self.num_evictable_blocks(hit)
        if not prefill_end:  # (no prefill named: at most its admission cap)
            most = self.max_admission_blocks_per_request
        else:
            most = 1 if checkpoint is None else 2
        if not apply_admission_cap and request_id is not None:
            if checkpoint is None:
                self.checkpoints.pop(request_id, None)
            else:
                self.checkpoints[request_id] = checkpoint
        return min(num_new, most) + num_evictable

    def add_local_computed_blocks(self, request_id: int, new_computed_blocks, num_computed_tokens: int) -> None:
        """SingleTypeKVCacheManager.add_local_computed_blocks: the hit state only, no state retired yet."""
        super().add_local_computed_blocks(request_id, new_computed_blocks, num_computed_tokens)
        self.num_skipped_blocks[request_id] = 0

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> None:
        """SingleTypeKVCacheManager.allocate_new_blocks; in mamba_cache_mode "align" nulls up to the last block (or
        to the checkpoint's, the block before last), then one block, the state after the last token, the previous
        state kept until the request's tokens are settled past it (MambaManager.allocate_new_blocks)."""
        if self.mamba_cache_mode == "none":
            return super().allocate_new_blocks(request_id, num_tokens)
        table = self.req_to_blocks[request_id]
        num_new = num_blocks_to_allocate(0, num_tokens, len(table), self.block_size, self.max_model_len)
        checkpoint_block = int(request_id in self.checkpoints)
        if num_new <= 0 and not checkpoint_block:
            return
        if table:
            self.last_state_block_idx[request_id] = len(table) - 1
        num_required = len(table) + num_new
        if len(table) < num_required - 1 - checkpoint_block:
            table.extend([NULL_BLOCK_ID] * (num_required - 1 - checkpoint_block - len(table)))
        num_new = num_required - len(table)
        assert num_new <= 1 + checkpoint_block, "one state block a step, and a checkpoint's"
        self.append_new_blocks(table, num_new)

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> int:
        """The states before the last settled token's block freed, right to left, nulls skipped, from the first not
        yet freed; then the previous state once a whole block of settled tokens lies past it
        (MambaManager.remove_skipped_blocks in mamba_cache_mode "align"). A freed state counts not as a window's
        block: 0."""
        pool, table, bs = self.block_pool, self.req_to_blocks[request_id], self.block_size
        if num_computed_tokens - 1 > 0:
            end = min((num_computed_tokens - 1) // bs, len(table))
            start = self.num_skipped_blocks[request_id]
            if start < end:
                held = [j for j in range(start, end) if table[j] != NULL_BLOCK_ID]
                free_table(pool, [table[j] for j in held], len(held))  # the rightmost freed first
                for j in held:
                    table[j] = NULL_BLOCK_ID
                self.num_skipped_blocks[request_id] = end
        last = self.last_state_block_idx.get(request_id)
        if last is not None and last < cdiv(num_computed_tokens, bs) - 1 and table[last] != NULL_BLOCK_ID:
            free_table(pool, [table[last]], 1)
            table[last] = NULL_BLOCK_ID
        return 0

    def free(self, request_id: int) -> int:
        """SingleTypeKVCacheManager.free, and the request's states and checkpoint forgotten."""
        self.last_state_block_idx.pop(request_id, None)
        self.checkpoints.pop(request_id, None)
        return super().free(request_id)

    def find_longest_cache_hit(self, keys_by_group: list[list[bytes]], max_length: int) -> tuple[list, int]:
        """The last cached state within max_length tokens, found right to left, nulls before it
        (MambaManager.find_longest_cache_hit); and its tokens."""
        for i in range(max_length // self.block_size - 1, -1, -1):
            found = get_cached_blocks(self.block_pool, keys_by_group, i)
            if found is not None:
                return [[NULL_BLOCK_ID] * i + [block] for block in found], (i + 1) * self.block_size
        return [[] for _ in keys_by_group], 0

    def reachable_blocks(self, request, start: int, end: int):
        """The state at each boundary a later hit may end on (MambaManager.reachable_block_mask with
        prefix_cache_retention_interval 0)."""
        return self.boundary_blocks(request, start, end, 1)

    def cache_blocks(self, request, num_tokens: int):
        """SingleTypeKVCacheManager.cache_blocks; the states it caches are not hit before the next step."""
        blocks = super().cache_blocks(request, num_tokens)
        hash_of = self.block_pool.hash_of
        self.cached_blocks_this_step.update(hash_of[b] for b in blocks)
        return blocks

    def cache_checkpoint(self, request) -> None:
        """Key the checkpoint block the request's last allocation took at its position when that is the prompt's last
        cacheable boundary or the shared prefix (vLLM's prefix_cache_retention_interval 0), unless the block already
        holds that key; else drop any key the block holds, the state being transient
        (MambaManager._cache_partial_tail_block with a checkpoint; BlockPool.cache_partial_block with
        replace_existing_hashes, _maybe_evict_cached_block)."""
        rid, pool = request.request_id, self.block_pool
        checkpoint = self.checkpoints.get(rid)
        if checkpoint is None:
            return
        position, idx = checkpoint
        block = self.req_to_blocks[rid][idx]
        prompt = mamba_checkpoint_position(request.num_prompt_tokens, self.scheduler_block_size)
        if position != prompt and position != request.shared_prefix_boundary:
            self.uncache(block)
            return
        # the group's block is the scheduler's (checks.check_kv_cache_groups), so the position ends block idx and
        # its key is that block's
        key = self.keyed_hashes(request, idx + 1)[idx]
        h = pool.hash_ids.get(key, -1)
        if h >= 0 and pool.hash_of[block] == h:
            return
        self.uncache(block)
        pool.cache_full_blocks([block], [key])
        self.cached_blocks_this_step.add(pool.hash_of[block])

    def uncache(self, block: int) -> None:
        """Take a held block out of the prefix cache (BlockPool._remove_cached_block_hashes)."""
        pool = self.block_pool
        h = pool.hash_of[block]
        if h >= 0:
            unlink(pool.hash_next, pool.hash_prev, pool.hash_ends, 2 * h, 2 * h + 1, block)
            pool.hash_of[block] = -1

    def new_step_starts(self) -> None:
        """A new schedule(): a state cached before it may be hit (MambaManager.new_step_starts)."""
        self.cached_blocks_this_step.clear()


# capacity.KVCacheGroup.kind -> its manager (vLLM's spec_manager_map)
MANAGERS = {
    "full_attention": FullAttentionManager,
    "sliding_attention": SlidingWindowManager,
    "chunked_local_attention": ChunkedLocalAttentionManager,
    "mamba": MambaManager,
}


def admission_caps(kv_cache_groups, max_model_len: int, max_in_flight_tokens: int, enable_caching: bool = False):
    """Each group's max_admission_blocks_per_request (0: none), as its manager sets it (max_admission_blocks)."""
    return [
        MANAGERS[g.kind].max_admission_blocks(g, max_model_len, max_in_flight_tokens, enable_caching)
        for g in kv_cache_groups
    ]
