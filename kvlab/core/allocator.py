"""KV-cache allocation: how many token slots a request reserves, and a paged block allocator like vLLM's.

Vocabulary (vLLM's): a *block* holds the K and V of block_size consecutive tokens of one request; the
pool has num_blocks blocks; each request's *block table* lists its block ids in token order.

Where reserved memory goes, in the terms of the vLLM paper (Kwon et al., SOSP 2023, Fig. 2), for a
request that ends holding L tokens, counted at its end (when it holds the most):
- token states: L slots hold a token's K and V;
- internal fragmentation: slots reserved that no token ever fills, which kvlab splits by where they lie:
  - inside the last block: its unused tail, ceil(L / B) * B - L slots (< B), B the policy's block size
    (a contiguous reservation is one block of its own size: B = 1, so 0);
  - beyond the last block: slots for tokens the request never produced: reserving the maximum length
    gives max_len - L, Orca (Pow2) the next power of two pow2(L) - L (the paper's prompt + pow2(output) with no
    prompt: the article's lengths have none), paged blocks and the oracle 0;
- reservation (slots held now for tokens still to come) is zero at a request's end, so it does not
  appear here; the serving engine measures it while requests run;
- external fragmentation (gaps between contiguous reservations in the allocator) is not modelled: every
  reservation here is counted as if it fit exactly.
Waste = reserved - held = internal fragmentation. Block-table entries (bookkeeping) per request = ceil(L / B).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from kvlab.core import article, validate
from kvlab.core.block_pool import BlockPool, free_table
from kvlab.core.capacity import max_num_requests as _requests_that_fit
from kvlab.core.units import GIB, MIB, as_written, cdiv

POWERS_OF_TWO = tuple(2**k for k in range(13))  # 1 .. 4,096 tokens
# Bytes held at the peak per request drawn and counted (lengths and their draws; make bench measures 8-25 B).
PEAK_BYTES_PER_REQUEST = 32


# ---------------------------------------------------------------- input checks
def check_lengths(lengths, max_len_tokens: int | None = None) -> np.ndarray:
    """lengths as a read-only int64 array, each >= 1 and <= max_len_tokens; a ValueError otherwise."""
    array = np.asarray(lengths)
    if array.ndim != 1 or array.size == 0:
        validate.fail("lengths", f"{array.size} values", "must be a non-empty 1-D list of token counts")
    if not np.issubdtype(array.dtype, np.integer):
        if (
            not np.issubdtype(array.dtype, np.floating)
            or not np.all(np.isfinite(array))
            or not np.all(array == np.floor(array))
        ):
            validate.fail("lengths", array.dtype, "must be whole token counts")
    array = array.astype(np.int64, copy=False)
    if array.min() < 1:
        i = int(np.argmin(array))
        validate.fail(f"lengths[{i}]", int(array[i]), "must be >= 1 token")
    if max_len_tokens is not None:
        max_len_tokens = validate.in_range("max_len_tokens", max_len_tokens, "tokens")
        if array.max() > max_len_tokens:
            i = int(np.argmax(array))
            validate.fail(f"lengths[{i}]", int(array[i]), f"must be <= max_len_tokens={max_len_tokens}")
    return array


def check_block_sizes(block_sizes) -> list[int]:
    """block_sizes as a non-empty list of positive ints (tokens)."""
    sizes = validate.non_empty("block_sizes", np.atleast_1d(np.asarray(block_sizes, dtype=object)).tolist())
    return [validate.in_range("block_size", b, "block_size") for b in sizes]


# ---------------------------------------------------------------- vectorised accounting
def reserved_per_request(lengths, block_size: int) -> np.ndarray:
    """Tokens each request reserves in blocks of block_size: ceil(L / B) * B (tokens)."""
    block_size = validate.positive_int("block_size", block_size)
    lengths = check_lengths(lengths)
    return cdiv(lengths, block_size) * block_size


def max_num_requests(
    mean_reserved_tokens, memory_gib: float = article.MEMORY_GIB, mib_per_token: float = article.MIB_PER_TOKEN
) -> int:
    """Requests that fit: floor(memory (GiB) / (mean reserved tokens per request x memory per token (MiB))).

    Exact rational arithmetic (kvlab.core.capacity.max_num_requests); pass the mean as a Fraction
    (reserved, num_requests) when it is not a whole number, as allocation_counts does.
    """
    validate.in_range("memory_gib", memory_gib, "memory_gib")
    validate.in_range("mib_per_token", mib_per_token, "mib_per_token")
    validate.positive_number("mean_reserved_tokens", mean_reserved_tokens)
    return _requests_that_fit(
        as_written(memory_gib) * GIB, as_written(mean_reserved_tokens) * as_written(mib_per_token) * MIB
    )


ALLOCATION_COLUMNS = (
    "reserved_tokens",
    "used_tokens",
    "wasted_tokens",
    "waste_pct",
    "max_num_requests",
    "block_table_entries",
)


def allocation_counts(
    lengths,
    block_sizes=article.BLOCK_SIZES,
    *,
    max_len_tokens: int | None = None,
    memory_gib: float = article.MEMORY_GIB,
    mib_per_token: float = article.MIB_PER_TOKEN,
) -> dict:
    """Reserved, used and wasted tokens, waste %, requests that fit and block-table entries, per block size.

    Returns block_size and each of ALLOCATION_COLUMNS as an array with one entry per block size:
    reserved_tokens = sum ceil(L / B) * B, used_tokens = sum L, wasted_tokens = reserved - used,
    waste_pct = 100 x wasted / reserved, max_num_requests that fit in memory_gib (GiB, 1 GiB = 1,024 MiB)
    at mib_per_token (MiB), block_table_entries = mean ceil(L / B) per request. Vectorised over a
    histogram of the lengths, so 10 million requests cost one bincount.
    """
    sizes = check_block_sizes(block_sizes)
    lengths = check_lengths(lengths, max_len_tokens)
    counts = np.bincount(lengths)  # counts[l] = requests of length l
    values = np.arange(len(counts), dtype=np.int64)
    used = int(counts @ values)
    n = len(lengths)
    rows = {name: [] for name in ALLOCATION_COLUMNS}
    for b in sizes:
        blocks = int(counts @ cdiv(values, b))
        reserved = blocks * b
        rows["reserved_tokens"].append(reserved)
        rows["used_tokens"].append(used)
        rows["wasted_tokens"].append(reserved - used)
        rows["waste_pct"].append(100.0 * (reserved - used) / reserved)
        rows["max_num_requests"].append(max_num_requests(Fraction(reserved, n), memory_gib, mib_per_token))
        rows["block_table_entries"].append(blocks / n)
    return {"block_size": np.array(sizes, dtype=np.int64), **{k: np.array(v) for k, v in rows.items()}}


# ---------------------------------------------------------------- reservation policies
POLICIES = {
    "max": "reserve the maximum length up front (Orca Max)",
    "pow2": "reserve the prompt plus the next power of two of the output (Orca Pow2; here no prompt: the length)",
    "oracle": "reserve exactly the final length (Orca Oracle)",
    "paged": "blocks of block_size allocated as tokens arrive (vLLM)",
}


# How the report names each policy: the vLLM paper's names for its baselines, and vLLM's paged blocks.
POLICY_NAMES = {"max": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)", "paged": "vLLM"}


def next_power_of_two(lengths) -> np.ndarray:
    """The smallest power of two >= each length (tokens), exactly."""
    lengths = np.asarray(lengths, dtype=np.int64)
    pow2 = np.left_shift(1, np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64))
    # log2 of an exact power of two is exact; guard against float rounding just below one.
    return np.where(pow2 < lengths, pow2 * 2, pow2)


def pow2_reservation(prompt_tokens, final_tokens, max_len_tokens: int):
    """Orca (Pow2)'s reservation, the vLLM paper's (§6.1: "if the true output length is 25, it reserves 32
    positions for outputs"): the prompt plus the next power of two of the output, at most max_len_tokens (slots;
    arrays or ints, as given). kvlab's one definition, for section 1's lengths (no prompt) and the engine's pool."""
    if isinstance(prompt_tokens, int) and isinstance(final_tokens, int):  # the engine's one request: no arrays
        output = max(final_tokens - prompt_tokens, 1)
        return min(prompt_tokens + (1 << (output - 1).bit_length()), max_len_tokens)
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    slots = np.minimum(prompt + next_power_of_two(np.asarray(final_tokens, dtype=np.int64) - prompt), max_len_tokens)
    return int(slots) if slots.ndim == 0 else slots


def policy_reservation(lengths, policy: str, *, max_len_tokens: int, block_size: int = 16) -> tuple:
    """(reserved slots, block size) per request for one policy; see the module docstring."""
    validate.one_of("policy", policy, POLICIES)
    max_len_tokens = validate.positive_int("max_len_tokens", max_len_tokens)
    lengths = check_lengths(lengths, max_len_tokens)
    if policy == "max":
        return np.full_like(lengths, max_len_tokens), 1
    if policy == "pow2":
        return pow2_reservation(0, lengths, max_len_tokens), 1  # the article's lengths: no prompt
    if policy == "oracle":
        return lengths.copy(), 1
    return reserved_per_request(lengths, block_size), validate.positive_int("block_size", block_size)


def policy_split(lengths, policy: str, *, max_len_tokens: int, block_size: int = 16) -> dict:
    """Token states and internal fragmentation inside and beyond the last block (token totals) of one policy,
    the total reserved (tokens) and the waste (%)."""
    lengths = check_lengths(lengths, max_len_tokens)
    reserved, unit = policy_reservation(lengths, policy, max_len_tokens=max_len_tokens, block_size=block_size)
    last_block_end = cdiv(lengths, unit) * unit
    held = int(lengths.sum())
    internal = int((last_block_end - lengths).sum())
    over = int((reserved - last_block_end).sum())
    total = held + internal + over
    assert total == int(reserved.sum()), "the three parts must add up to what is reserved"
    return {
        "held_tokens": held,
        "unused_in_last_block_tokens": internal,
        "unused_beyond_last_block_tokens": over,
        "reserved_tokens": total,
        "waste_pct": 100.0 * (internal + over) / total,
    }


# ---------------------------------------------------------------- the paged block allocator
class NoFreeBlocksError(RuntimeError):
    """The pool has fewer free blocks than a request needs (nothing was allocated)."""


@dataclass(frozen=True)
class PoolSpec:
    """A fixed KV-cache pool: num_blocks blocks of block_size token slots each."""

    num_blocks: int
    block_size: int

    def __post_init__(self):
        validate.positive_int("num_blocks", self.num_blocks)
        validate.positive_int("block_size", self.block_size)


class BlockAllocator:
    """A paged KV-cache block allocator over vLLM 0.33's block pool (kvlab.core.block_pool): num_blocks usable
    blocks (the pool adds vLLM's null block 0, so ids run 1..num_blocks), one block table per request.

    Blocks come from the head of vLLM's free queue; a freed request's blocks go back to its head, last
    block first, so the next block handed out is the last block freed (vLLM's LIFO reuse). allocate,
    append_token and free are O(1) per block. Invariants: every block id is either free or in exactly one
    block table; a request's table has ceil(num_tokens / block_size) blocks; free + used = num_blocks.
    """

    def __init__(self, num_blocks: int, block_size: int):
        spec = PoolSpec(num_blocks, block_size)
        self.num_blocks, self.block_size = spec.num_blocks, spec.block_size
        self._pool = BlockPool(spec.num_blocks + 1)  # + vLLM's null block
        self._tables: dict = {}  # request_id -> list of block ids
        self._num_tokens: dict = {}  # request_id -> tokens held

    # -- the pool
    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue."""
        return self._pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests."""
        return self._pool.num_used_blocks

    @property
    def num_requests(self) -> int:
        """Requests holding blocks."""
        return len(self._tables)

    def block_table(self, request_id) -> tuple[int, ...]:
        """The block ids of request_id, in token order."""
        return tuple(self._known(request_id))

    def num_tokens(self, request_id) -> int:
        """Tokens request_id holds."""
        self._known(request_id)
        return self._num_tokens[request_id]

    def _known(self, request_id) -> list:
        table = self._tables.get(request_id)
        if table is None:
            validate.fail("request_id", request_id, "is not allocated (never allocated, or already freed)")
        return table

    def _take(self, request_id, count: int) -> list:
        free = self._pool.num_free_blocks
        if count > free:
            raise NoFreeBlocksError(
                f"request_id={request_id!r} needs {count} block(s) of {self.block_size} "
                f"tokens but only {free} of {self.num_blocks} are free"
            )
        return self._pool.get_new_blocks(count)

    # -- requests
    def allocate(self, request_id, num_tokens: int) -> tuple[int, ...]:
        """Give a new request blocks for num_tokens tokens (>= 0); all or nothing. Returns its block table."""
        if request_id in self._tables:
            validate.fail("request_id", request_id, "is already allocated (free it first)")
        num_tokens = validate.non_negative_int("num_tokens", num_tokens)
        table = self._take(request_id, cdiv(num_tokens, self.block_size))
        self._tables[request_id] = table
        self._num_tokens[request_id] = num_tokens
        return tuple(table)

    def append_token(self, request_id) -> bool:
        """One more token for request_id; a new block only when its last block is full. True if it took one."""
        held = self._num_tokens.get(request_id)
        if held is None:
            self._known(request_id)
        if held % self.block_size:
            self._num_tokens[request_id] = held + 1
            return False
        self._tables[request_id].extend(self._take(request_id, 1))
        self._num_tokens[request_id] = held + 1
        return True

    def free(self, request_id) -> int:
        """Return all of request_id's blocks to the free queue (vLLM's order: to its head, last block first);
        the number of blocks freed."""
        table = self._known(request_id)
        free_table(self._pool, table, len(table))
        del self._tables[request_id], self._num_tokens[request_id]
        return len(table)

    def free_block_ids(self) -> list[int]:
        """The free queue, the block handed out next first."""
        return self._pool.free_block_ids()

    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is free or in exactly one table and tables fit their tokens."""
        self._pool.check_invariants()
        held = [b for table in self._tables.values() for b in table]
        free = self._pool.free_block_ids()
        assert len(held) + len(free) == self.num_blocks, "free + used must equal the pool"
        assert set(held) | set(free) == set(range(1, self.num_blocks + 1)), "a block is in two places or lost"
        for rid, table in self._tables.items():
            assert len(table) == cdiv(self._num_tokens[rid], self.block_size), f"table of {rid!r} has the wrong size"


def run_through_allocator(lengths, block_size: int, *, prompt_tokens: int = 1) -> dict:
    """Grow every request to its length in a BlockAllocator (prompt, then one token at a time) and count.

    All requests are held at once, so the pool has exactly the blocks they need; returns reserved,
    used and wasted tokens as allocation_table counts them (the test that the two paths agree).
    """
    lengths = check_lengths(lengths)
    block_size = validate.positive_int("block_size", block_size)
    prompt_tokens = validate.positive_int("prompt_tokens", prompt_tokens)
    allocator = BlockAllocator(int(cdiv(lengths, block_size).sum()), block_size)
    for request_id, length in enumerate(lengths.tolist()):
        first = min(prompt_tokens, length)
        allocator.allocate(request_id, first)
        for _ in range(length - first):
            allocator.append_token(request_id)
    reserved = allocator.num_used_blocks * block_size
    used = sum(allocator.num_tokens(r) for r in range(len(lengths)))
    return {
        "reserved_tokens": reserved,
        "used_tokens": used,
        "wasted_tokens": reserved - used,
        "num_free_blocks": allocator.num_free_blocks,
    }
