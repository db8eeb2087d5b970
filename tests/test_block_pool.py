"""vLLM 0.33's block pool: the null block, the free-queue order, reference counts and the prefix cache."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_pool import BlockPool, free_table, touch_blocks


class ListQueuePool:
    """The reference: vLLM's operations on one plain list (its doubly linked free list), written out naively."""

    def __init__(self, num_gpu_blocks, caching):
        self.free = list(range(1, num_gpu_blocks))
        self.ref = [0] * num_gpu_blocks
        self.hash_of, self.cached, self.caching = {}, {}, caching

    def get_new_blocks(self, n):
        taken, self.free = self.free[:n], self.free[n:]
        for b in taken:
            if b in self.hash_of:
                h = self.hash_of.pop(b)
                self.cached[h].remove(b)
                if not self.cached[h]:
                    del self.cached[h]
            self.ref[b] = 1
        return taken

    def free_blocks(self, ordered):
        first, last = [], []
        for b in ordered:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (last if self.caching and b in self.hash_of else first).append(b)
        self.free = first + self.free + last

    def touch(self, blocks):
        for b in blocks:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1

    def cache_full_blocks(self, blocks, hashes):
        for b, h in zip(blocks, hashes):
            self.hash_of[b] = h
            self.cached.setdefault(h, []).append(b)

    def get_cached_block(self, h):
        return self.cached[h][0] if self.cached.get(h) else None


def test_the_null_block_is_never_handed_out():
    pool = BlockPool(5)
    assert pool.num_free_blocks == 4 and pool.num_used_blocks == 0
    assert pool.get_new_blocks(4) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="cannot take 1 blocks: only 0 are free"):
        pool.get_new_blocks(1)
    with pytest.raises(ValueError, match="num_gpu_blocks=1 is not allowed: must be >= 2"):
        BlockPool(1)


def test_freed_blocks_without_a_hash_are_prepended_last_block_first():
    pool = BlockPool(10)
    a, b = pool.get_new_blocks(3), pool.get_new_blocks(2)  # [1, 2, 3], [4, 5]
    free_table(pool, a, len(a))
    assert pool.free_block_ids() == [3, 2, 1, 6, 7, 8, 9]  # spec: table [1,2,5] freed -> [5,2,1, ...]
    free_table(pool, b, len(b))
    assert pool.free_block_ids()[:2] == [5, 4]
    assert pool.num_used_blocks == 0


def test_cached_blocks_go_to_the_tail_and_are_evicted_from_the_head():
    pool = BlockPool(6, enable_caching=True)
    blocks = pool.get_new_blocks(3)  # [1, 2, 3]
    pool.cache_full_blocks(blocks[:2], [b"h1", b"h2"])  # block 3 is partial: no hash
    free_table(pool, blocks, len(blocks))
    assert pool.free_block_ids() == [3, 4, 5, 2, 1]  # unhashed to the head, hashed to the tail (reversed)
    assert pool.get_cached_block(b"h1") == 1
    touch_blocks(pool, [1], 1)  # a hit takes it out of the queue wherever it is
    assert pool.free_block_ids() == [3, 4, 5, 2] and pool.ref[1] == 1
    assert pool.get_new_blocks(4) == [3, 4, 5, 2]  # block 2 leaves the cache as it is taken
    assert pool.get_cached_block(b"h2") is None and pool.get_cached_block(b"h1") == 1
    pool.check_invariants()


def test_a_hash_held_by_two_blocks_hits_the_first_cached():
    pool = BlockPool(5, enable_caching=True)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(b, [b"h"])
    pool.cache_full_blocks(a, [b"h"])
    assert pool.get_cached_block(b"h") == b[0]


@given(
    st.lists(
        st.tuples(st.sampled_from(["new", "free", "cache", "touch"]), st.integers(0, 6), st.integers(0, 3)), max_size=60
    ),
    st.integers(2, 12),
    st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_the_two_part_queue_is_vllms_one_list(ops, num_gpu_blocks, caching):
    """Any sequence of vLLM's operations leaves kvlab's queue, counts and cache as on vLLM's single list."""
    pool, ref = BlockPool(num_gpu_blocks, caching), ListQueuePool(num_gpu_blocks, caching)
    held = []  # tables: lists of block ids held once each
    hashes = iter(range(10**6))
    for op, i, n in ops:
        if op == "new" and n <= pool.num_free_blocks:
            got = pool.get_new_blocks(n)
            assert got == ref.get_new_blocks(n)
            held.append(got)
        elif op == "free" and held:
            table = held.pop(i % len(held))
            free_table(pool, table, len(table))
            ref.free_blocks(reversed(table))
        elif op == "cache" and held and caching:
            table = held[i % len(held)]
            fresh = [b for b in table if b not in ref.hash_of]
            names = [str(next(hashes) % 3).encode() for _ in fresh]  # few names: duplicates happen
            pool.cache_full_blocks(fresh, names)
            ref.cache_full_blocks(fresh, names)
        elif op == "touch" and caching:
            name = str(n % 3).encode()
            block = ref.get_cached_block(name)
            assert pool.get_cached_block(name) == block
            if block is not None:
                touch_blocks(pool, [block], 1)
                ref.touch([block])
                held.append([block])
        assert pool.free_block_ids() == ref.free
        if caching:  # without prefix caching a block is held once or free: no count is kept
            assert all(pool.ref[b] == ref.ref[b] for b in range(1, num_gpu_blocks))
        pool.check_invariants()
