"""Where a request's KV goes: vLLM's paged KV-cache manager (reservation.py holds the baselines' token pool).

KVCacheManager is vllm/v1/core/kv_cache_manager.py over a coordinator (kv_cache_coordinator.py) of the model's KV
cache groups, a manager per group (single_type_kv_cache_manager.py) sharing one BlockPool: one full-attention group
for most models, several for a hybrid model (full attention beside sliding windows, chunked local attention or Mamba
states). Everything inert here is left out (no lookahead, no connector, no speculative decoding): allocate_slots gives
a request blocks for the tokens it computes this step, nothing more, and on admission first checks that blocks for its
whole current length are free (scheduler_reserve_full_isl, on by default in 0.33), a window's or chunk's at most its
admission cap. With prefix caching a waiting request first takes the longest prefix every group finds cached.
"""

from __future__ import annotations

from kvlab.core.engine.kv_cache_coordinator import get_kv_cache_coordinator
from kvlab.core.engine.request import Request
from kvlab.core.engine.rules import prefill_end_tokens
from kvlab.core.engine.single_type_kv_cache_manager import FullAttentionManager, MambaManager


class KVCacheManager:
    """vLLM's paged KV-cache manager (KVCacheManager) over its KV cache groups (capacity.KVCacheGroup, in vLLM's group
    order); block_size is the scheduler's, the groups' least common multiple."""

    allocation = "paged"

    def __init__(
        self,
        num_gpu_blocks: int,
        kv_cache_groups,
        block_size: int,
        max_model_len: int,
        max_in_flight_tokens: int = 0,
        enable_caching: bool = False,
        recorder=None,
    ):
        self.coordinator = coordinator = get_kv_cache_coordinator(
            tuple(kv_cache_groups),
            enable_caching,
            num_gpu_blocks=num_gpu_blocks,
            scheduler_block_size=block_size,
            max_model_len=max_model_len,
            max_in_flight_tokens=max_in_flight_tokens,
        )
        self.pool = coordinator.block_pool
        self.block_size = block_size  # a prefix hit is a multiple of it
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.recorder = recorder if recorder is not None and recorder.freed_tables is not None else None
        managers = coordinator.single_type_managers
        self.caps = [m.max_admission_blocks_per_request for m in managers]  # each group's (0: none)
        # a decode inside its last block changes nothing where every group is full attention of the scheduler's block:
        # the scheduler need not call allocate_slots; else a decode may still free a block behind a window, and a call
        # that frees, takes and caches nothing returns at once (quiet: request_id -> quiet_limits)
        self.noop_decodes = all(type(m) is FullAttentionManager and m.block_size == block_size for m in managers)
        self.quiet: dict[int, tuple[int, int, int]] | None = None if self.noop_decodes else {}
        # cache_blocks(request, num_tokens): the blocks num_tokens known, computed tokens fill, every group's, into the
        # prefix cache (the asynchronous scheduler asks at every settled token): the coordinator's, or with quiet limits
        # nothing until a group's next block is filled (cache_filled_blocks)
        self.cache_blocks = coordinator.cache_blocks if self.quiet is None else self.cache_filled_blocks
        # one full-attention group (most models): its manager, whose admission in one rule (the compiled loop's) and
        # running step in one call the one-group engine takes (through the coordinator's calls its Python engine ran
        # 4-6% more instructions); None: several groups
        self.full_attention = managers[0] if len(managers) == 1 and self.noop_decodes else None
        self.num_window_freed = 0  # blocks windows and chunks gave back as their requests ran
        # Mamba states with prefix caching (mamba_cache_mode "align"): prefill chunks cut at the scheduler's block
        # boundaries (rules.mamba_aligned_num_new_tokens; 0: no cut), a final chunk that exports its checkpoint from
        # inside the kernel not, where every Mamba group has prefill checkpoint blocks (the first one's alignment)
        mamba = [m for m in managers if isinstance(m, MambaManager) and m.mamba_cache_mode == "align"]
        self.mamba_block_size = block_size if mamba else 0
        alignments = [m.prefill_checkpoint_alignment for m in mamba]
        self.checkpoint_alignment = alignments[0] if alignments and all(alignments) else 0

    @property
    def num_free_blocks(self) -> int:
        """Free blocks of the pool (cached ones no request holds included)."""
        return self.pool.num_free_blocks

    @property
    def num_held(self) -> int:
        """What the requests hold, as the step records count it: blocks in use, every group's
        (BlockPool.num_used_blocks)."""
        return self.pool.num_used_blocks

    # ---------------------------------------------------------------- prefix cache
    def get_computed_blocks(self, request: Request) -> tuple[tuple | None, int]:
        """(hit, num_hit_tokens): each group's table of the longest prefix every group finds in the prefix cache, at
        most all but the request's last token, with the shared prefix boundary ((tables, boundary or 0,
        num_hit_tokens); None if neither; KVCacheManager.get_computed_blocks)."""
        if not self.enable_caching or request.num_tokens <= 1:
            return None, 0
        hit = self.coordinator.find_longest_cache_hit(request, request.num_tokens - 1)
        return hit, 0 if hit is None else hit[2]

    def cache_filled_blocks(self, request: Request, num_tokens: int) -> None:
        """KVCacheCoordinator.cache_blocks once some group's next block is filled (quiet), then the limits renewed."""
        rid = request.request_id
        if num_tokens >= self.quiet[rid][2]:
            self.coordinator.cache_blocks(request, num_tokens)
            self.quiet[rid] = self.coordinator.quiet_limits(rid)

    def new_step_starts(self) -> None:
        """A new schedule(): a Mamba state cached before it may be hit (MambaManager.new_step_starts)."""
        self.coordinator.new_step_starts()

    # ---------------------------------------------------------------- allocation
    def num_blocks_to_admit(self, num_tokens: int, prefill_end: int = 0) -> int:
        """Free blocks admitting a request of num_tokens needs without a prefix hit: every group's, a window's or
        chunk's at most its admission cap (a Mamba group's with checkpoint blocks one more when its prefill, ending at
        prefill_end > 0, exports a checkpoint; without prefill_end at most one more)."""
        n = min(num_tokens, self.max_model_len)
        return self.coordinator.get_num_blocks_to_allocate(None, n, None, 0, prefill_end, apply_admission_cap=True)

    def hit_blocks_to_admit(self, hit, num_hit_tokens: int, num_tokens: int, capped: bool, prefill_end: int) -> int:
        """Free blocks admitting a request with this prefix hit needs to hold num_tokens: each group's new blocks
        (capped: a window's at most its admission cap) and its hit blocks no request holds."""
        return self.coordinator.get_num_blocks_to_allocate(
            None, num_tokens, hit[0], num_hit_tokens, prefill_end, capped
        )

    def can_admit(self, request: Request, num_new_tokens: int, hit) -> bool:
        """Whether allocate_slots would admit the request (with this prefix hit): every group's blocks for its whole current length (a window's or chunk's at most its admission cap),
        then those for the tokens it computes now (KVCacheManager.allocate_slots with full_sequence_must_fit; a Mamba
        group notes its prefill checkpoint, as vLLM's get_num_blocks_to_allocate does)."""
        free = self.pool.num_free_blocks
        hit_blocks, num_hit_tokens = (None, 0) if hit is None else (hit[0], hit[2])
        if self.full_attention is not None:
            new = self.full_attention.admission_num_new_blocks(request.num_tokens, hit_blocks, num_new_tokens, free)
            return new >= 0
        prefill_end = prefill_end_tokens(request.num_prompt_tokens, request.num_tokens) if self.mamba_block_size else 0
        get, rid, max_len = self.coordinator.get_num_blocks_to_allocate, request.request_id, self.max_model_len
        if get(rid, min(request.num_tokens, max_len), hit_blocks, num_hit_tokens, prefill_end, True) > free:
            return False
        num_slots = min(num_hit_tokens + num_new_tokens, max_len)
        return get(rid, num_slots, hit_blocks, num_hit_tokens, prefill_end) <= free

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hit=None, full_sequence_must_fit: bool = False
    ) -> bool:
        """Blocks in every group for num_new_tokens more computed tokens, after those behind each window are freed
        (KVCacheManager.allocate_slots), then the blocks they fill cached; on admission (full_sequence_must_fit: a
        waiting request, holding no block) blocks for its whole current length must be free (can_admit), and a prefix
        hit's blocks are taken first (the tables get_computed_blocks found, the blocks behind each window left null).
        False, with nothing else changed, when the pool has too few free blocks (vLLM's allocate_slots returning
        None). A call that would free, take and cache nothing returns at once (quiet)."""
        if self.full_attention is not None and not full_sequence_must_fit:  # one full-attention group: one call
            return self.full_attention.allocate_step(request, num_new_tokens)
        coordinator, max_len, rid, quiet = self.coordinator, self.max_model_len, request.request_id, self.quiet
        if full_sequence_must_fit:
            if not self.can_admit(request, num_new_tokens, hit):
                return False
            hit_blocks, request.shared_prefix_boundary, num_computed = (None, 0, 0) if hit is None else hit
            coordinator.allocate_new_computed_blocks(rid, hit_blocks, num_computed)
            request.block_ids = coordinator.single_type_managers[0].req_to_blocks[rid]  # the first group's table
            num_slots = min(num_computed + num_new_tokens, max_len)
        else:  # a running request
            num_computed = min(request.num_computed_tokens, max_len)
            num_slots = min(num_computed + num_new_tokens, max_len)
            if quiet is not None:
                processed = num_computed - request.num_in_flight_tokens
                slots, settled, cacheable = quiet[rid]
                num_known = min(num_computed + num_new_tokens, request.num_tokens)
                if num_slots <= slots and processed < settled and num_known < cacheable:
                    return True
                self.num_window_freed += coordinator.remove_skipped_blocks(rid, processed)
            prefill_end = (
                prefill_end_tokens(request.num_prompt_tokens, request.num_tokens) if self.mamba_block_size else 0
            )
            num_blocks = coordinator.get_num_blocks_to_allocate(rid, num_slots, None, num_computed, prefill_end)
            if num_blocks > self.pool.num_free_blocks:
                if quiet is not None:
                    quiet[rid] = coordinator.quiet_limits(rid)
                return False
        coordinator.allocate_new_blocks(rid, num_slots)
        if self.enable_caching:
            coordinator.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
            if coordinator.checkpoint_managers:
                coordinator.cache_checkpoints(request)
        if quiet is not None:
            quiet[rid] = coordinator.quiet_limits(rid)
        return True

    def free(self, request: Request) -> int:
        """Give back every group's blocks, group by group, each table last block first (its nulls skipped); the number
        of blocks it held."""
        if self.recorder is not None:
            self.recorder.freed(request)
        num_freed = self.coordinator.free(request.request_id)
        request.block_ids = []
        if self.quiet is not None:
            self.quiet.pop(request.request_id, None)
        return num_freed

    # ---------------------------------------------------------------- each request's state in every group
    def each_group(self, name: str) -> dict[int, list]:
        """request_id -> each group's entry for it in its manager's mapping name (None where it has none), for every
        request holding blocks."""
        managers = self.coordinator.single_type_managers
        return {rid: [getattr(m, name, {}).get(rid) for m in managers] for rid in managers[0].req_to_blocks}

    @property
    def tables(self) -> dict[int, list[list[int]]]:
        """request_id -> its block table in every group (KVCacheCoordinator.get_blocks)."""
        return self.each_group("req_to_blocks")

    @property
    def checkpoints(self) -> dict[int, list]:
        """request_id -> each group's prefill checkpoint of its last allocation, (position, table index) or None."""
        return self.each_group("checkpoints")

    @property
    def last_state(self) -> dict[int, list]:
        """request_id -> each Mamba group's previous state's table index (None: none, or not a Mamba group)."""
        return self.each_group("last_state_block_idx")
