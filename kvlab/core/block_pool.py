"""vLLM 0.33's KV block pool: a fixed number of blocks, one free-block queue, reference counts, prefix caching.

The pool has num_gpu_blocks blocks with ids 0 .. num_gpu_blocks-1. Block 0 is vLLM's null block: it is
taken out at start-up and never handed out, so num_gpu_blocks - 1 blocks are usable (vLLM's
num_gpu_blocks, as it logs it, counts the null block; vllm/v1/core/block_pool.py).

The free-block queue is vLLM's (FreeKVCacheBlockQueue in vllm/v1/core/kv_cache_utils.py): blocks are
taken from its head; a freed block that has no content hash (every block when prefix caching is off)
is put back at the head, a hashed one at the tail; a request's blocks are freed last block first. So
without prefix caching the next block handed out is the last block of the request freed last, and
with it, a cached block waits at the tail, least recently freed first, until it is taken from the head
(its hash is then evicted) or hit by a new request (it leaves the queue from wherever it is).

vLLM keeps the queue as one doubly linked list. kvlab keeps the same order as two parts, because every
unhashed free block is ahead of every hashed one (unhashed blocks only ever enter at the head, hashed
ones at the tail, and a block gets its hash only while a request holds it): the head part is a Python
list used as a stack (the queue's head is the list's end, so taking or returning n blocks is one slice),
the tail part an insertion-ordered dict (O(1) removal of a hit block). free_block_ids() gives the whole
queue in vLLM's order.
"""

from __future__ import annotations

from itertools import islice

from kvlab.core import validate

NULL_BLOCK_ID = 0


def check_num_gpu_blocks(num_gpu_blocks: int) -> int:
    """num_gpu_blocks if the pool holds at least one block besides vLLM's null block."""
    num_gpu_blocks = validate.positive_int("num_gpu_blocks", num_gpu_blocks)
    if num_gpu_blocks < 2:
        validate.fail(
            "num_gpu_blocks",
            num_gpu_blocks,
            "must be >= 2: it counts vLLM's null block, so the pool would hold no block for a token",
        )
    return num_gpu_blocks


class BlockPool:
    """num_gpu_blocks KV blocks (null block included), vLLM's free-block queue, reference counts and,
    with enable_caching, the prefix cache: content hash -> cached blocks, in the same pool."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = False):
        self.num_gpu_blocks = num_gpu_blocks = check_num_gpu_blocks(num_gpu_blocks)
        self.enable_caching = bool(enable_caching)
        # The free queue: _head[::-1] + list(_tail). At start [1, 2, ..., N-1]: block 0 is the null block.
        self._head: list[int] = list(range(num_gpu_blocks - 1, 0, -1))
        self._tail: dict[int, None] = {}
        # Reference counts are kept only with prefix caching: without it no block is shared, so a block's
        # count is 1 while a request holds it and 0 while it is free (ref_cnt() answers either way).
        self._ref_cnt = [0] * num_gpu_blocks if self.enable_caching else None
        self._hash_of: dict[int, bytes] = {}  # cached block id -> its content hash
        self._cached: dict[bytes, dict[int, None]] = {}  # content hash -> cached block ids, first inserted first

    # ---------------------------------------------------------------- counts
    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can hold tokens: num_gpu_blocks - 1 (the null block never does)."""
        return self.num_gpu_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue (cached blocks no request holds included), as vLLM's get_num_free_blocks."""
        return len(self._head) + len(self._tail)

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds: usable - free."""
        return self.num_gpu_blocks - 1 - len(self._head) - len(self._tail)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a content hash (held or free)."""
        return len(self._hash_of)

    def ref_cnt(self, block_id: int) -> int:
        """How many requests hold block_id."""
        if self._ref_cnt is not None:
            return self._ref_cnt[block_id]
        return 0 if block_id in self._free_set() or block_id == NULL_BLOCK_ID else 1

    def _free_set(self) -> set[int]:
        return set(self._head) | set(self._tail)

    def free_block_ids(self) -> list[int]:
        """The free queue from head (handed out next) to tail, in vLLM's order."""
        return self._head[::-1] + list(self._tail)

    # ---------------------------------------------------------------- the free queue
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take num_blocks blocks from the head of the free queue (evicting cached ones); their count becomes 1."""
        if num_blocks > len(self._head) + len(self._tail):
            raise ValueError(f"cannot take {num_blocks} blocks: only {self.num_free_blocks} are free")
        if num_blocks <= 0:
            return []
        head = self._head
        if num_blocks <= len(head):
            taken = head[-num_blocks:]
            del head[-num_blocks:]
            taken.reverse()
        else:
            taken = head[::-1]
            head.clear()
            # The tail's first blocks, read in one pass: next(iter(tail)) per block would rescan the slots that
            # earlier deletions from the dict's front left empty (quadratic on a long run of evictions).
            tail = self._tail
            for block in list(islice(tail, num_blocks - len(taken))):
                del tail[block]
                self._evict(block)
                taken.append(block)
        if self._ref_cnt is not None:
            ref = self._ref_cnt
            for block in taken:
                ref[block] = 1
        return taken

    def free_table(self, block_ids: list[int]) -> None:
        """Free a request's block table as vLLM does, last block first (free_blocks of it reversed)."""
        if self._ref_cnt is None:
            self._head.extend(block_ids)  # reversed, then prepended: the table's own order at the head
        else:
            self.free_blocks(reversed(block_ids))

    def free_blocks(self, ordered_block_ids) -> None:
        """Drop one reference to each block, given in eviction order (vLLM frees a request's table reversed):
        blocks no request holds any more go to the head (no hash) or the tail (cached) of the free queue."""
        if self._ref_cnt is None:
            # Every block is unhashed: prepend them all, the first given ending at the head.
            blocks = list(ordered_block_ids)
            blocks.reverse()
            self._head.extend(blocks)
            return
        ref, first, last = self._ref_cnt, [], []
        for block in ordered_block_ids:
            ref[block] -= 1
            if ref[block] == 0:
                (last if block in self._hash_of else first).append(block)
        first.reverse()
        self._head.extend(first)
        for block in last:
            self._tail[block] = None

    def touch(self, block_ids) -> None:
        """One more reference to each (cached) block; a block no request held leaves the free queue."""
        ref = self._ref_cnt
        for block in block_ids:
            if ref[block] == 0:
                del self._tail[block]  # a cached free block is always in the tail part
            ref[block] += 1

    # ---------------------------------------------------------------- the prefix cache
    def get_cached_block(self, block_hash: bytes) -> int | None:
        """The first cached block still holding block_hash, or None."""
        blocks = self._cached.get(block_hash)
        return next(iter(blocks)) if blocks else None

    def cache_full_blocks(self, block_ids, block_hashes) -> None:
        """Record each held, full block under its content hash (vLLM caches a block when it is allocated)."""
        for block, block_hash in zip(block_ids, block_hashes):
            self._hash_of[block] = block_hash
            self._cached.setdefault(block_hash, {})[block] = None

    def _evict(self, block: int) -> None:
        block_hash = self._hash_of.pop(block, None)
        if block_hash is not None:
            blocks = self._cached[block_hash]
            del blocks[block]
            if not blocks:
                del self._cached[block_hash]

    def check_invariants(self) -> None:
        """Raise AssertionError unless the free queue, reference counts and cache agree."""
        head, tail = self._head, list(self._tail)
        free = head + tail
        assert len(set(free)) == len(free), "a block is twice in the free queue"
        assert NULL_BLOCK_ID not in free, "the null block is in the free queue"
        assert all(b not in self._hash_of for b in head), "a hashed block is in the head part"
        assert all(b in self._hash_of for b in tail), "an unhashed block is in the tail part"
        if self._ref_cnt is not None:
            assert all(self._ref_cnt[b] == 0 for b in free), "a free block is referenced"
            held = [b for b in range(1, self.num_gpu_blocks) if self._ref_cnt[b] > 0]
            assert len(held) + len(free) == self.num_gpu_blocks - 1, "a block is neither free nor held"
        for block_hash, blocks in self._cached.items():
            assert blocks and all(self._hash_of[b] == block_hash for b in blocks), "the cache map is out of sync"
