"""vLLM 0.33's KV block pool (vllm/v1/core/block_pool.py): num_gpu_blocks blocks, one free-block queue, reference
counts and the prefix cache. Block 0 is vLLM's null block, never handed out: num_gpu_blocks - 1 blocks are usable.

The free-block queue is vLLM's (FreeKVCacheBlockQueue, vllm/v1/core/kv_cache_utils.py): blocks are taken from
its head; a freed block without a content hash (every block when prefix caching is off) goes back to the head, a
hashed one to the tail; a request's blocks are freed last block first. So without prefix caching the next block
handed out is the last block of the request freed last; with it, a cached block waits at the tail until it is
taken from the head (its hash is then evicted) or hit (it leaves the queue from wherever it is). The cache is
vLLM's BlockHashToBlockMap: per hash id, its blocks in insertion order (a hit takes the first).

vLLM keeps the queue as one doubly linked list; kvlab keeps the same order in two parts, since every unhashed free
block is ahead of every hashed one (a block gets its hash only while held): a stack (n unhashed blocks taken or
returned in one slice), then a linked list. Reference counts are kept with prefix caching only. The operations
(QUEUE) are written once over a record of integer sequences: BlockPool's lists here, fast/arrays.py Pool's arrays
(the same field names) in the compiled loop, which numba compiles from these same functions.
"""

from __future__ import annotations

from kvlab.core import validate

NULL_BLOCK_ID = 0
STACK_SIZE, TAIL_HEAD, TAIL_END, TAIL_SIZE = range(4)  # the cells of free_state
QUEUE = ("num_free", "unlink", "link_last", "take_blocks", "free_table", "touch_blocks", "cache_full_blocks")


def num_free(q) -> int:
    """Blocks in the free queue, both parts (BlockPool.get_num_free_blocks)."""
    return q.free_state[STACK_SIZE] + q.free_state[TAIL_SIZE]


def unlink(nxt, prv, ends, first: int, last: int, b: int) -> None:
    """Take b out of a doubly linked list (nxt, prv) whose first and last items are ends[first], ends[last]."""
    before, after = prv[b], nxt[b]
    if before >= 0:
        nxt[before] = after
    else:
        ends[first] = after
    if after >= 0:
        prv[after] = before
    else:
        ends[last] = before


def link_last(nxt, prv, ends, first: int, last: int, b: int) -> None:
    """Put b at the end of such a list (-1 in ends: empty)."""
    end = ends[last]
    prv[b], nxt[b] = end, -1
    if end >= 0:
        nxt[end] = b
    else:
        ends[first] = b
    ends[last] = b


def take_blocks(q, k: int, row, at: int) -> None:
    """k blocks from the head of the free queue into row[at:at + k]: the stack's top, then the tail part's front,
    each leaving the cache (BlockPool._maybe_evict_cached_block); with caching their reference count 1
    (block_pool.py, BlockPool.get_new_blocks)."""
    state, stack = q.free_state, q.stack
    top = state[STACK_SIZE]
    n = min(k, top)
    row[at : at + n] = stack[top - n : top][::-1]
    state[STACK_SIZE] = top - n
    if n < k:  # the tail part: cached blocks, evicted as they are taken
        tail_next, tail_prev, hash_of = q.tail_next, q.tail_prev, q.hash_of
        hash_next, hash_prev, hash_ends = q.hash_next, q.hash_prev, q.hash_ends
        for i in range(at + n, at + k):
            b = state[TAIL_HEAD]
            unlink(tail_next, tail_prev, state, TAIL_HEAD, TAIL_END, b)
            state[TAIL_SIZE] -= 1
            h = hash_of[b]
            unlink(hash_next, hash_prev, hash_ends, 2 * h, 2 * h + 1, b)
            hash_of[b] = -1
            row[i] = b
    if q.enable_caching:
        ref = q.ref
        for i in range(at, at + k):
            ref[row[i]] = 1


def free_table(q, row, n: int) -> None:
    """Free a block table row[:n] as vLLM frees it, last block first (block_pool.py, BlockPool.free_blocks of it
    reversed): a block no request holds any more goes to the head (no hash; the first freed ends on top) or to the
    tail part's end (hashed, in the order freed)."""
    state, stack = q.free_state, q.stack
    top = state[STACK_SIZE]
    if not q.enable_caching:  # every block was held once and has no hash
        stack[top : top + n] = row[:n]
        state[STACK_SIZE] = top + n
        return
    ref, hash_of, tail_next, tail_prev = q.ref, q.hash_of, q.tail_next, q.tail_prev
    for j in range(n - 1, -1, -1):
        b = row[j]
        ref[b] -= 1
        if ref[b] == 0 and hash_of[b] >= 0:
            link_last(tail_next, tail_prev, state, TAIL_HEAD, TAIL_END, b)
            state[TAIL_SIZE] += 1
    for j in range(n):  # table order: the first freed ends on top
        b = row[j]
        if ref[b] == 0 and hash_of[b] < 0:
            stack[top] = b
            top += 1
    state[STACK_SIZE] = top


def touch_blocks(q, row, n: int) -> None:
    """One more reference to each cached block of row[:n] (prefix hits); one no request held leaves the free queue
    from the tail part, where every hashed free block is (block_pool.py, BlockPool.touch)."""
    state, ref, tail_next, tail_prev = q.free_state, q.ref, q.tail_next, q.tail_prev
    for j in range(n):
        b = row[j]
        if ref[b] == 0:
            unlink(tail_next, tail_prev, state, TAIL_HEAD, TAIL_END, b)
            state[TAIL_SIZE] -= 1
        ref[b] += 1


def cache_full_blocks(q, row, start: int, end: int, hash_ids) -> None:
    """Cache blocks row[start:end], block j under hash id hash_ids[j - start], each after the blocks already cached
    under its id (block_pool.py, BlockPool.cache_full_blocks; BlockHashToBlockMap.insert)."""
    hash_of, hash_next, hash_prev, hash_ends = q.hash_of, q.hash_next, q.hash_prev, q.hash_ends
    for j in range(start, end):
        b, h = row[j], hash_ids[j - start]
        hash_of[b] = h
        link_last(hash_next, hash_prev, hash_ends, 2 * h, 2 * h + 1, b)


def check_num_gpu_blocks(num_gpu_blocks: int) -> int:
    """num_gpu_blocks if the pool holds at least one block besides vLLM's null block."""
    num_gpu_blocks = validate.positive_int("num_gpu_blocks", num_gpu_blocks)
    if num_gpu_blocks < 2:
        why = "must be >= 2: it counts vLLM's null block, so the pool would hold no block for a token"
        validate.fail("num_gpu_blocks", num_gpu_blocks, why)
    return num_gpu_blocks


class BlockPool:
    """num_gpu_blocks KV blocks (null block included), vLLM's free-block queue, reference counts and,
    with enable_caching, the prefix cache: content hash -> cached blocks, in the same pool."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = False):
        self.num_gpu_blocks = n = check_num_gpu_blocks(num_gpu_blocks)
        self.enable_caching = bool(enable_caching)
        self.stack = list(range(n - 1, -1, -1))  # stack[:n - 1]: blocks n-1 .. 1, block 1 on top (the null block out)
        self.free_state = [n - 1, -1, -1, 0]  # stack size; the tail part's first and last block (-1: none), size
        self.tail_next, self.tail_prev = [-1] * n, [-1] * n
        self.ref = [0] * n  # with caching only
        self.hash_of, self.hash_next, self.hash_prev = [-1] * n, [-1] * n, [-1] * n
        self.hash_ends: list[int] = []  # per hash id h: its first and last cached block at 2h and 2h + 1, or -1
        self.hash_ids: dict[bytes, int] = {}  # content hash -> hash id

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue (cached blocks no request holds included), as vLLM's get_num_free_blocks."""
        return num_free(self)

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds: usable - free."""
        return self.num_gpu_blocks - 1 - num_free(self)

    def free_block_ids(self) -> list[int]:
        """The free queue from head (handed out next) to tail, in vLLM's order."""
        ids = self.stack[: self.free_state[STACK_SIZE]][::-1]
        b = self.free_state[TAIL_HEAD]
        while b >= 0:
            ids.append(b)
            b = self.tail_next[b]
        return ids

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take num_blocks blocks from the head of the free queue (take_blocks)."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot take {num_blocks} blocks: only {self.num_free_blocks} are free")
        row = [0] * max(num_blocks, 0)
        take_blocks(self, len(row), row, 0)
        return row

    def get_cached_block(self, block_hash: bytes) -> int | None:
        """The first cached block still holding block_hash, or None."""
        h = self.hash_ids.get(block_hash)
        return None if h is None or self.hash_ends[2 * h] < 0 else self.hash_ends[2 * h]

    def cache_full_blocks(self, block_ids, block_hashes) -> None:
        """Record each held, full block under its content hash (vLLM caches a block when it is allocated)."""
        ids = self.hash_ids
        hash_ids = [ids.setdefault(block_hash, len(ids)) for block_hash in block_hashes]
        self.hash_ends += [-1] * (2 * len(ids) - len(self.hash_ends))
        block_ids = list(block_ids)
        cache_full_blocks(self, block_ids, 0, len(block_ids), hash_ids)

    def check_invariants(self) -> None:
        """Raise AssertionError unless the free queue, reference counts and cache agree."""
        free, num_stack = self.free_block_ids(), self.free_state[STACK_SIZE]
        assert len(free) == len(set(free)) == self.num_free_blocks, "the free queue and its counts disagree"
        assert NULL_BLOCK_ID not in free, "the null block is in the free queue"
        assert all((self.hash_of[b] >= 0) == (i >= num_stack) for i, b in enumerate(free)), "a block in the wrong part"
        if self.enable_caching:
            assert all(self.ref[b] == 0 for b in free), "a free block is referenced"
            held = [b for b in range(1, self.num_gpu_blocks) if self.ref[b] > 0]
            assert len(held) + len(free) == self.num_gpu_blocks - 1, "a block is neither free nor held"
        for h, b in enumerate(self.hash_ends[::2]):
            while b >= 0:
                assert self.hash_of[b] == h, "the cache map is out of sync"
                b = self.hash_next[b]
