"""The buddy allocator of the Orca baselines: hand-checked splits, merges and fragmentation, invariants under random
sequences, and equality with a plain reference (a list of free intervals with the same buddy rules)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.buddy import BuddyAllocator, chunk_order


class ReferenceBuddy:
    """The same buddy rules over a plain list of free (offset, size) intervals, searched in full every time."""

    def __init__(self, num_slots: int):
        self.arenas, offset = [], 0
        for order in range(num_slots.bit_length() - 1, -1, -1):
            if num_slots >> order & 1:
                self.arenas.append((offset, 1 << order))
                offset += 1 << order
        self.free, self.used = list(self.arenas), {}

    def arena_size(self, offset):
        return next(size for start, size in self.arenas if start <= offset < start + size)

    def allocate(self, size):
        need = 1
        while need < size:
            need *= 2
        fits = [(s, o) for o, s in self.free if s >= need]
        if not fits:
            return None
        s, o = min(fits)  # the smallest chunk that fits, lowest address among those
        self.free.remove((o, s))
        while s > need:
            s //= 2
            self.free.append((o + s, s))
        self.used[o] = (s, size)
        return o

    def release(self, offset):
        s, _ = self.used.pop(offset)
        while s < self.arena_size(offset) and (offset ^ s, s) in self.free:
            self.free.remove((offset ^ s, s))
            offset, s = min(offset, offset ^ s), 2 * s
        self.free.append((offset, s))


def test_the_pool_is_a_run_of_maximal_power_of_two_arenas():
    buddy = BuddyAllocator(15_728)  # OPT-13B's pool on an A100-40GB in section 6
    assert buddy.arenas == [
        (0, 13),
        (8192, 12),
        (12288, 11),
        (14336, 10),
        (15360, 8),
        (15616, 6),
        (15680, 5),
        (15712, 4),
    ]
    assert buddy.largest_free_chunk == 8192 and buddy.num_free_slots == 15_728
    # the smallest chunk that fits comes first: the arena of 2,048, then the 4,096 split, then the 8,192 split
    assert [buddy.allocate(2048) for _ in range(8)] == [12288, 8192, 10240, 0, 2048, 4096, 6144, None]
    assert buddy.num_free_slots == 15_728 - 7 * 2048 and buddy.largest_free_chunk == 1024
    buddy.check_invariants()


def test_allocate_splits_the_lowest_smallest_chunk_and_free_merges_buddies():
    buddy = BuddyAllocator(64)
    assert buddy.allocate(5) == 0  # 64 -> 32 + 32 -> 16 + 16 -> 8 + 8: a chunk of 8 at 0
    assert buddy.free_chunks() == [(8, 8), (16, 16), (32, 32)]
    assert buddy.num_rounding_slots == 3
    assert buddy.allocate(16) == 16  # the free 16 at 16, no split
    assert buddy.allocate(8) == 8
    assert buddy.allocate(3) == 32  # splits the 32: 4 at 32, free 4 at 36, 8 at 40, 16 at 48
    assert buddy.free_chunks() == [(36, 4), (40, 8), (48, 16)]
    assert buddy.free(8) == 8
    assert buddy.free_chunks() == [(8, 8), (36, 4), (40, 8), (48, 16)]  # 8's buddy (0) is used: no merge
    buddy.free(0)
    assert buddy.free_chunks() == [(0, 16), (36, 4), (40, 8), (48, 16)]  # 0 + 8 merge; 16 at 16 is used
    buddy.free(16)
    buddy.free(32)  # 32 + 36, then + 40, then + 48, then + 0
    assert buddy.free_chunks() == [(0, 64)] and buddy.num_free_slots == 64 and buddy.num_rounding_slots == 0
    buddy.check_invariants()


def test_fragmentation_refuses_a_chunk_with_enough_free_slots_in_all():
    buddy = BuddyAllocator(64)
    a, b, c, d = (buddy.allocate(16) for _ in range(4))
    buddy.free(b)
    buddy.free(d)  # 32 slots free, in two chunks of 16 that are not buddies
    assert buddy.num_free_slots == 32 and buddy.largest_free_chunk == 16
    assert not buddy.can_allocate(17) and buddy.allocate(17) is None and buddy.can_allocate(16)
    assert buddy.free_slots_below(17) == 32 and buddy.free_slots_below(16) == 0 and buddy.free_slots_below(9) == 0
    buddy.free(c)  # c + d merge to 32 at 32
    assert buddy.free_chunks() == [(16, 16), (32, 32)] and buddy.free_slots_below(17) == 16
    assert buddy.allocate(20) == 32


def test_arenas_never_merge_with_each_other():
    buddy = BuddyAllocator(48)  # arenas of 32 and 16
    assert buddy.allocate(17) is not None and buddy.allocate(16) == 32
    assert buddy.allocate(1) is None
    buddy.free(0)
    buddy.free(32)
    assert buddy.free_chunks() == [(0, 32), (32, 16)] and buddy.allocate(33) is None


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match=r"^num_slots=0 is not allowed"):
        BuddyAllocator(0)
    buddy = BuddyAllocator(8)
    with pytest.raises(ValueError, match=r"^size_tokens=0 is not allowed: must be >= 1"):
        buddy.allocate(0)
    with pytest.raises(ValueError, match=r"^offset=3 is not allowed: must be the offset of an allocated chunk"):
        buddy.free(3)


def test_chunk_order():
    assert [chunk_order(n) for n in (1, 2, 3, 4, 5, 25, 32, 33, 2048)] == [0, 1, 2, 2, 3, 5, 5, 6, 11]


@st.composite
def sequences(draw):
    """A pool size and a sequence of allocations (a size) and frees (the index of a live chunk)."""
    num_slots = draw(st.integers(1, 600))
    ops = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("allocate"), st.integers(1, max(1, num_slots // 2))),
                st.tuples(st.just("free"), st.integers(0, 1000)),
            ),
            max_size=120,
        )
    )
    return num_slots, ops


@given(sequences())
@settings(max_examples=300, deadline=None)
def test_random_sequences_keep_the_invariants_and_equal_the_reference(case):
    """No two chunks overlap, free + used == the pool, every answer equals the reference's, and freeing every
    chunk merges back the whole run of arenas."""
    num_slots, ops = case
    buddy, reference, live = BuddyAllocator(num_slots), ReferenceBuddy(num_slots), []
    for op, value in ops:
        if op == "allocate":
            can = buddy.can_allocate(value)
            offset = buddy.allocate(value)
            assert offset == reference.allocate(value) and can == (offset is not None)
            if offset is not None:
                live.append(offset)
        elif live:
            offset = live.pop(value % len(live))
            buddy.free(offset)
            reference.release(offset)
        buddy.check_invariants()
        assert buddy.free_chunks() == sorted(reference.free)
        assert buddy.num_free_slots + buddy.num_used_slots == num_slots
        assert buddy.largest_free_chunk == max((s for _, s in reference.free), default=0)
        size = value if op == "allocate" else 1 + value % num_slots
        assert buddy.free_slots_below(size) == sum(s for _, s in reference.free if s < size)
    for offset in live:
        buddy.free(offset)
    assert buddy.free_chunks() == [(o, 1 << k) for o, k in buddy.arenas] and buddy.num_rounding_slots == 0
