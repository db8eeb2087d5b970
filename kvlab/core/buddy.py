"""A binary buddy allocator over an arena of token slots: the allocator the vLLM paper's Orca baselines use (§6.1).

A request asks for size_tokens slots and gets the chunk of the smallest power of two >= size_tokens (its order),
the lowest-addressed free one of the smallest order that has one, split in halves (buddies) down to that order;
a freed chunk merges with its buddy while the buddy is free, up to the arena it lies in.

Layout: a pool of num_slots slots that is not a power of two is a run of maximal power-of-two arenas, largest
first, one per bit of num_slots (15,728 = 8,192 + 4,096 + 2,048 + 1,024 + 256 + 64 + 32 + 16). Every arena starts
at a multiple of its size, so a chunk's buddy is offset XOR size inside it; chunks never merge across arenas, so a
chunk is at most the largest arena (8,192 slots of 15,728: a request bigger than that can never be placed).

Each order keeps a set of its free offsets (membership, O(1)) and a heap of them for the lowest address (entries
no longer in the set are dropped lazily, and the heap is rebuilt when mostly stale); allocate and free are
O(log num_slots) amortized.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

from kvlab.core import validate


def chunk_order(size_tokens: int) -> int:
    """The order of the chunk that serves size_tokens slots: the smallest k with 2 ** k >= size_tokens."""
    return (size_tokens - 1).bit_length()


class BuddyAllocator:
    """Chunks of power-of-two token slots from a run of power-of-two arenas (see the module's docstring)."""

    def __init__(self, num_slots: int):
        self.num_slots = validate.positive_int("num_slots", num_slots)
        self.arenas: list[tuple[int, int]] = []  # (offset, order), largest first
        offset = 0
        for order in range(num_slots.bit_length() - 1, -1, -1):
            if num_slots >> order & 1:
                self.arenas.append((offset, order))
                offset += 1 << order
        self._arena_starts = [o for o, _ in self.arenas]
        self.max_order = self.arenas[0][1]
        self._free = [set() for _ in range(self.max_order + 1)]  # order -> free offsets
        self._heaps = [[] for _ in range(self.max_order + 1)]  # order -> offsets, lazily pruned
        for offset, order in self.arenas:
            self._push(offset, order)
        self._used: dict[int, tuple[int, int]] = {}  # offset -> (order, size asked)
        self.num_free_slots = num_slots
        self.num_rounding_slots = 0  # handed out beyond the sizes asked

    # ---------------------------------------------------------------- free lists
    def _push(self, offset: int, order: int) -> None:
        free, heap = self._free[order], self._heaps[order]
        free.add(offset)
        heapq.heappush(heap, offset)
        if len(heap) > 2 * len(free) + 16:  # mostly stale entries: rebuild (amortized O(1) a push)
            heap[:] = sorted(free)

    def _pop_lowest(self, order: int) -> int:
        heap, free = self._heaps[order], self._free[order]
        while True:
            offset = heapq.heappop(heap)
            if offset in free:
                free.remove(offset)
                return offset

    def _arena_order(self, offset: int) -> int:
        return self.arenas[bisect_right(self._arena_starts, offset) - 1][1]

    # ---------------------------------------------------------------- the allocator
    def allocate(self, size_tokens: int) -> int | None:
        """The offset of a chunk of the smallest power of two >= size_tokens slots, or None if no free chunk is
        that large (however many slots are free in all)."""
        if size_tokens < 1:
            validate.fail("size_tokens", size_tokens, "must be >= 1")
        order = chunk_order(size_tokens)
        found = next((j for j in range(order, self.max_order + 1) if self._free[j]), None)
        if found is None:
            return None
        offset = self._pop_lowest(found)
        while found > order:  # split: keep the lower half, free the upper one
            found -= 1
            self._push(offset + (1 << found), found)
        self._used[offset] = (order, size_tokens)
        self.num_free_slots -= 1 << order
        self.num_rounding_slots += (1 << order) - size_tokens
        return offset

    def free(self, offset: int) -> int:
        """Give back the chunk at offset, merging it with its free buddies; the slots it held."""
        if offset not in self._used:
            validate.fail("offset", offset, "must be the offset of an allocated chunk")
        order, size = self._used.pop(offset)
        held = 1 << order
        self.num_free_slots += held
        self.num_rounding_slots -= held - size
        top = self._arena_order(offset)
        while order < top:
            buddy = offset ^ (1 << order)
            if buddy not in self._free[order]:
                break
            self._free[order].remove(buddy)  # its heap entry is dropped when it comes up
            offset &= ~(1 << order)
            order += 1
        self._push(offset, order)
        return held

    # ---------------------------------------------------------------- what is free
    @property
    def num_used_slots(self) -> int:
        """Slots in allocated chunks (rounding included)."""
        return self.num_slots - self.num_free_slots

    @property
    def largest_free_chunk(self) -> int:
        """Slots of the largest free chunk (0 when none is free)."""
        for order in range(self.max_order, -1, -1):
            if self._free[order]:
                return 1 << order
        return 0

    def can_allocate(self, size_tokens: int) -> bool:
        """Whether allocate(size_tokens) would succeed now."""
        order = chunk_order(size_tokens)
        return any(self._free[j] for j in range(order, self.max_order + 1))

    def free_slots_below(self, size_tokens: int) -> int:
        """Free slots in chunks too small to serve size_tokens slots (chunks of a lower order than it needs)."""
        free = self._free
        return sum(len(free[j]) << j for j in range(min(chunk_order(size_tokens), self.max_order + 1)))

    def free_chunks(self) -> list[tuple[int, int]]:
        """Every free chunk as (offset, slots), by offset."""
        return sorted((o, 1 << j) for j, offsets in enumerate(self._free) for o in offsets)

    def used_chunks(self) -> list[tuple[int, int, int]]:
        """Every allocated chunk as (offset, slots, size asked), by offset."""
        return sorted((o, 1 << j, size) for o, (j, size) in self._used.items())

    def check_invariants(self) -> None:
        """Chunks tile the arenas without overlap, aligned to their size; free + used == num_slots; no two free
        buddies left unmerged; the counters agree with the chunks."""
        chunks = sorted([(o, s) for o, s in self.free_chunks()] + [(o, s) for o, s, _ in self.used_chunks()])
        end = 0
        for offset, size in chunks:
            assert offset == end, f"chunk at {offset} leaves a gap or overlaps at {end}"
            assert offset % size == 0, f"chunk at {offset} of {size} slots is not aligned"
            assert size <= 1 << self._arena_order(offset), f"chunk at {offset} crosses its arena"
            end = offset + size
        assert end == self.num_slots
        assert self.num_free_slots == sum(s for _, s in self.free_chunks())
        assert self.num_rounding_slots == sum(s - a for _, s, a in self.used_chunks())
        for j, offsets in enumerate(self._free):
            for o in offsets:
                if j < self._arena_order(o):
                    assert o ^ (1 << j) not in offsets, f"free buddies at {o} and {o ^ (1 << j)} not merged"
            assert offsets <= set(self._heaps[j])
