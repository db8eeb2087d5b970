"""A request's blocks across KV cache groups: the coordinator (vllm/v1/core/kv_cache_coordinator.py).

The coordinator keeps one manager per group (single_type_kv_cache_manager.py), in vLLM's group order, over one
BlockPool, and does what crosses groups: a request's blocks summed over groups (get_num_blocks_to_allocate), a prefix
hit's blocks taken and new blocks allocated group by group, blocks cached and freed group by group, each table last
block first, and the prefix hit itself. vLLM picks the coordinator by the cache (get_kv_cache_coordinator): without
prefix caching KVCacheCoordinatorNoPrefixCache (no hit), with it UnitaryKVCacheCoordinator for one group (its
manager's hit) and HybridKVCacheCoordinator for several (the longest hit every group finds: a fixed point).
"""

from __future__ import annotations

import math

from kvlab.core.block_pool import BlockPool
from kvlab.core.engine.rules import NEVER_REACHED_TOKENS, num_lookup_blocks
from kvlab.core.engine.single_type_kv_cache_manager import MANAGERS, FullAttentionManager, MambaManager
from kvlab.core.units import cdiv


class KVCacheCoordinator:
    """Every KV cache group's manager over one BlockPool (KVCacheCoordinator)."""

    def __init__(
        self,
        kv_cache_groups,
        num_gpu_blocks: int,
        scheduler_block_size: int,
        max_model_len: int,
        max_in_flight_tokens: int,
        enable_caching: bool,
    ):
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.scheduler_block_size = scheduler_block_size  # every group's block size divides it
        self.hash_block_size = math.gcd(*(g.block_size for g in kv_cache_groups))  # a content hash's tokens
        assert all(scheduler_block_size % g.block_size == 0 for g in kv_cache_groups)
        self.single_type_managers = tuple(
            self.manager(g, gid, max_model_len, max_in_flight_tokens) for gid, g in enumerate(kv_cache_groups)
        )
        managers = self.single_type_managers
        # the managers that may free blocks behind, and those with prefill checkpoint blocks (each in group order)
        self.skipping_managers = tuple(m for m in managers if m.frees_skipped_blocks)
        self.checkpoint_managers = tuple(m for m in managers if getattr(m, "prefill_checkpoint_alignment", 0))
        self.mamba_managers = tuple(m for m in managers if isinstance(m, MambaManager))
        if len(managers) == 1:  # one group (the one-group engine): its manager's calls are the coordinator's
            manager = managers[0]
            self.get_num_blocks_to_allocate = manager.get_num_blocks_to_allocate
            self.allocate_new_computed_blocks = manager.add_local_computed_blocks
            self.allocate_new_blocks = manager.allocate_new_blocks
            self.cache_blocks = manager.cache_blocks
            self.free = manager.free

    def manager(self, kv_cache_group, gid: int, max_model_len: int, max_in_flight_tokens: int):
        """Group gid's manager, of its kind (single_type_kv_cache_manager.get_manager_for_kv_cache_spec)."""
        kind, caching = MANAGERS[kv_cache_group.kind], self.enable_caching
        cap = kind.max_admission_blocks(kv_cache_group, max_model_len, max_in_flight_tokens, caching)
        args = (self.scheduler_block_size, self.hash_block_size, max_model_len, cap, self.group_key(gid))
        if kind is MambaManager:
            return kind(kv_cache_group, self.block_pool, gid, *args, enable_caching=caching)
        return kind(kv_cache_group, self.block_pool, gid, *args)

    def group_key(self, gid: int) -> bytes | None:
        """What group gid appends to a content hash in the prefix cache (None: nothing; HybridKVCacheCoordinator's:
        the group, vLLM's BlockHashWithGroupId)."""
        return None

    def get_num_blocks_to_allocate(
        self, request_id, num_tokens, new_computed_blocks, num_computed_tokens, prefill_end, apply_admission_cap=False
    ) -> int:
        """Free blocks the request needs to hold num_tokens, every group's (new_computed_blocks: each group's prefix
        hit table, or None), each group's capped with apply_admission_cap (get_num_blocks_to_allocate)."""
        num_blocks = 0
        for manager in self.single_type_managers:
            num_blocks += manager.get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks, num_computed_tokens, prefill_end, apply_admission_cap
            )
        return num_blocks

    def allocate_new_computed_blocks(self, request_id: int, new_computed_blocks, num_computed_tokens: int) -> None:
        """Start the request's table in every group from its prefix hit (each group's table, or None: empty tables),
        group by group (allocate_new_computed_blocks)."""
        for manager in self.single_type_managers:
            manager.add_local_computed_blocks(request_id, new_computed_blocks, num_computed_tokens)

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> None:
        """Extend the request's table in every group to hold num_tokens, group by group."""
        for manager in self.single_type_managers:
            manager.allocate_new_blocks(request_id, num_tokens)

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> int:
        """Free, group by group, the blocks no token after num_computed_tokens settled ones attends to; how many
        windows and chunks gave back."""
        num_freed = 0
        for manager in self.skipping_managers:
            num_freed += manager.remove_skipped_blocks(request_id, num_computed_tokens)
        return num_freed

    def cache_blocks(self, request, num_tokens: int) -> None:
        """Cache every group's blocks that num_tokens known, computed tokens fill."""
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_tokens)

    def cache_checkpoints(self, request) -> None:
        """Key or drop each prefill checkpoint block the request's last allocation took (MambaManager.cache_checkpoint)."""
        for manager in self.checkpoint_managers:
            manager.cache_checkpoint(request)

    def free(self, request_id: int) -> int:
        """Give back every group's blocks, group by group, each table last block first; how many."""
        num_freed = 0
        for manager in self.single_type_managers:
            num_freed += manager.free(request_id)
        return num_freed

    def new_step_starts(self) -> None:
        """A new schedule(): each Mamba group's states cached before it may be hit."""
        for manager in self.mamba_managers:
            manager.new_step_starts()

    def quiet_limits(self, request_id: int) -> tuple[int, int, int]:
        """(slots, processed, cacheable): every group's table holds slots tokens, so no group takes a block for a
        request that needs at most those; no group frees a block before processed tokens are settled
        (next_skipped_tokens); and none caches one before cacheable tokens are known and computed (its next block
        past caching filled, to the scheduler's block). kvlab's, so that allocate_slots returns at once when nothing
        would change; never with Mamba states and prefix caching."""
        if self.enable_caching and self.mamba_managers:
            return 0, 0, 0
        slots, processed, cacheable = self.max_model_len, NEVER_REACHED_TOKENS, NEVER_REACHED_TOKENS
        for manager in self.single_type_managers:
            slots = min(slots, len(manager.req_to_blocks[request_id]) * manager.block_size)
            processed = min(processed, manager.next_skipped_tokens(request_id))
        if self.enable_caching:
            align = self.scheduler_block_size
            for manager in self.single_type_managers:
                cacheable = min(
                    cacheable, cdiv((manager.num_cached_block[request_id] + 1) * manager.block_size, align) * align
                )
        return slots, processed, cacheable

    def find_longest_cache_hit(self, request, max_cache_hit_length: int):
        """(each group's hit table, the shared prefix boundary or 0, the hit's tokens), or None: no hit."""
        raise NotImplementedError


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """The coordinator without prefix caching (KVCacheCoordinatorNoPrefixCache): no hit."""

    def find_longest_cache_hit(self, request, max_cache_hit_length: int):
        """No hit."""
        return None


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One KV cache group with prefix caching (UnitaryKVCacheCoordinator): its manager's hit."""

    def __init__(self, kv_cache_groups, *args, **kwargs):
        assert len(kv_cache_groups) == 1, "UnitaryKVCacheCoordinator assumes one KV cache group"
        super().__init__(kv_cache_groups, *args, **kwargs)

    def find_longest_cache_hit(self, request, max_cache_hit_length: int):
        """The group's hit (its find_longest_cache_hit), at most max_cache_hit_length tokens."""
        manager = self.single_type_managers[0]
        keys = manager.keyed_hashes(request, num_lookup_blocks(request.num_tokens, manager.block_size))
        tables, hit_length = manager.find_longest_cache_hit([keys], max_cache_hit_length)
        return (tables, 0, hit_length) if hit_length else None


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several KV cache groups with prefix caching (HybridKVCacheCoordinator): a block cached under its content hash
    and its group, a hit the longest prefix, a multiple of the scheduler's block, that every group finds."""

    def __init__(self, kv_cache_groups, *args, **kwargs):
        super().__init__(kv_cache_groups, *args, **kwargs)
        assert all(g.block_size % self.hash_block_size == 0 for g in kv_cache_groups)
        # vLLM's lookup order (verify_and_split_kv_cache_groups): groups of one spec looked up together, full
        # attention's first; each spec as (its first group's manager, its group ids)
        specs: dict[tuple, list[int]] = {}
        for gid, g in enumerate(kv_cache_groups):
            specs.setdefault((g.kind, g.block_size, g.sliding_window, g.attention_chunk_size), []).append(gid)
        managers = self.single_type_managers
        self.attention_groups = sorted(
            ((managers[gids[0]], gids) for gids in specs.values()),
            key=lambda group: not isinstance(group[0], FullAttentionManager),
        )
        first = self.attention_groups[0][0]
        self.is_simple_hybrid = len(self.attention_groups) == 2 and isinstance(first, FullAttentionManager)

    def group_key(self, gid: int) -> bytes:
        """The group's id, appended to a content hash (make_block_hash_with_group_id)."""
        return gid.to_bytes(4, "big")

    def cache_blocks(self, request, num_tokens: int) -> None:
        """KVCacheCoordinator.cache_blocks of num_tokens floored to the scheduler's block, where a hit may end
        (HybridKVCacheCoordinator._align_cacheable)."""
        num_tokens = num_tokens // self.scheduler_block_size * self.scheduler_block_size
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_tokens)

    def find_longest_cache_hit(self, request, max_cache_hit_length: int):
        """The longest prefix every group finds in the prefix cache, at most max_cache_hit_length tokens: each spec
        looked up in turn at the length found so far, full attention once (its hit only shrinks), until no spec
        shortens it (one round where full attention and one other spec are all); and the longer prefix a group found
        on the way, the shared prefix boundary, that the sparser groups have not cached yet
        (HybridKVCacheCoordinator.find_longest_cache_hit: num_uncached_common_prefix_tokens)."""
        managers = self.single_type_managers
        tables: list[list[int] | None] = [None] * len(managers)
        lengths = [0] * len(managers)
        hit_length, longest = max_cache_hit_length, 0
        while True:
            length = hit_length
            for manager, gids in self.attention_groups:
                if tables[gids[0]] is not None and isinstance(manager, FullAttentionManager):
                    length = min(length, lengths[gids[0]])  # looked up once: its hit only shrinks
                    continue
                num_blocks = num_lookup_blocks(request.num_tokens, manager.block_size)
                keys = [managers[gid].keyed_hashes(request, num_blocks) for gid in gids]
                found, length = manager.find_longest_cache_hit(keys, length)
                for gid, table in zip(gids, found):
                    tables[gid], lengths[gid] = table, length
                longest = max(longest, length)
            if length >= hit_length:
                break
            hit_length = length
            if self.is_simple_hybrid:
                break
        shared_prefix_boundary = longest if longest > hit_length else 0
        if hit_length == 0 and shared_prefix_boundary == 0:
            return None
        for manager, table in zip(managers, tables):
            if isinstance(manager, FullAttentionManager):
                del table[cdiv(hit_length, manager.block_size) :]
        return tables, shared_prefix_boundary, hit_length


def get_kv_cache_coordinator(kv_cache_groups, enable_caching: bool, **kwargs) -> KVCacheCoordinator:
    """vLLM's coordinator for these groups and cache (get_kv_cache_coordinator); kwargs: KVCacheCoordinator's others."""
    if not enable_caching:
        kind = KVCacheCoordinatorNoPrefixCache
    elif len(kv_cache_groups) == 1:
        kind = UnitaryKVCacheCoordinator
    else:
        kind = HybridKVCacheCoordinator
    return kind(kv_cache_groups, enable_caching=enable_caching, **kwargs)
