"""KV-cache allocation: how many token slots a request reserves, and a paged block allocator like vLLM's.

Vocabulary (vLLM's): a *block* holds the K and V of block_size consecutive tokens of one request; the
pool has num_blocks blocks; each request's *block table* lists its block ids in token order.

Where reserved memory goes, for a request that ends holding L tokens (the split of the vLLM paper,
Kwon et al., SOSP 2023, Fig. 2, taken at the request's end, when it holds the most):
- tokens held: L slots hold a token's K and V;
- internal fragmentation: the unused tail of the last block, ceil(L / B) * B - L slots (< B), where B is
  the policy's block size (a contiguous reservation is one block of its own size: B = 1 for the
  oracle, so 0);
- over-reservation: slots reserved beyond the last block that holds a token, for tokens the request
  never produced: reserving the maximum length gives max_len - L, reserving the next power of two
  gives pow2(L) - L, paged blocks and the oracle give 0.
Waste = reserved - held = internal fragmentation + over-reservation. The paper's external
fragmentation (gaps between contiguous reservations) is not modelled: every reservation here is
counted as if it fit exactly. Block-table entries (bookkeeping) per request = ceil(L / B).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from kvlab import validate

POWERS_OF_TWO = tuple(2**k for k in range(13))          # 1 .. 4,096 tokens
ARTICLE_BLOCK_SIZES = (4096, 1024, 256, 64, 16)         # the article's reservation units, tokens
ARTICLE_MEMORY_GIB = 60                                  # "60 GB" = 61,440 MB in the article
ARTICLE_MIB_PER_TOKEN = 0.5                              # "0.5 MB per token" (MB = 2^20 bytes)


# ---------------------------------------------------------------- input checks
def check_lengths(lengths, max_len_tokens: int | None = None) -> np.ndarray:
    """lengths as a read-only int64 array, each >= 1 and <= max_len_tokens; a ValueError otherwise."""
    array = np.asarray(lengths)
    if array.ndim != 1 or array.size == 0:
        validate.fail("lengths", f"{array.size} values", "must be a non-empty 1-D list of token counts")
    if not np.issubdtype(array.dtype, np.integer):
        if not np.issubdtype(array.dtype, np.floating) or not np.all(np.isfinite(array)) \
                or not np.all(array == np.floor(array)):
            validate.fail("lengths", array.dtype, "must be whole token counts")
    array = array.astype(np.int64, copy=False)
    if array.min() < 1:
        i = int(np.argmin(array))
        validate.fail(f"lengths[{i}]", int(array[i]), "must be >= 1 token")
    if max_len_tokens is not None:
        max_len_tokens = validate.positive_int("max_len_tokens", max_len_tokens)
        if array.max() > max_len_tokens:
            i = int(np.argmax(array))
            validate.fail(f"lengths[{i}]", int(array[i]), f"must be <= max_len_tokens={max_len_tokens}")
    return array


def _check_block_sizes(block_sizes) -> list[int]:
    sizes = validate.non_empty("block_sizes", np.atleast_1d(np.asarray(block_sizes, dtype=object)).tolist())
    return [validate.positive_int("block_size", b) for b in sizes]


# ---------------------------------------------------------------- vectorised accounting
def reserved_per_request(lengths, block_size: int) -> np.ndarray:
    """Tokens each request reserves in blocks of block_size: ceil(L / B) * B (tokens)."""
    block_size = validate.positive_int("block_size", block_size)
    lengths = check_lengths(lengths)
    return -(-lengths // block_size) * block_size


def _as_written(x) -> Fraction:
    """x as an exact fraction; a float is read as its shortest decimal (0.1 is 1/10, as a user writes it)."""
    return Fraction(repr(float(x))) if isinstance(x, float) else Fraction(x)


def max_num_requests(mean_reserved_tokens, memory_gib: float = ARTICLE_MEMORY_GIB,
                     mib_per_token: float = ARTICLE_MIB_PER_TOKEN) -> int:
    """Requests that fit: floor(memory (GiB) / (mean reserved tokens per request x memory per token (MiB))).

    Exact rational arithmetic, so 61,440 / 2,048 is 30 and not 29.999...; pass the mean as a Fraction
    (reserved, num_requests) when it is not a whole number, as allocation_table does.
    """
    validate.positive_number("memory_gib", memory_gib)
    validate.positive_number("mib_per_token", mib_per_token)
    validate.positive_number("mean_reserved_tokens", mean_reserved_tokens)
    return math.floor(_as_written(memory_gib) * 1024
                      / (_as_written(mean_reserved_tokens) * _as_written(mib_per_token)))


def allocation_table(lengths, block_sizes=ARTICLE_BLOCK_SIZES, *, max_len_tokens: int | None = None,
                     memory_gib: float = ARTICLE_MEMORY_GIB,
                     mib_per_token: float = ARTICLE_MIB_PER_TOKEN) -> pd.DataFrame:
    """Reserved, used and wasted tokens, waste %, requests that fit and block-table entries, per block size.

    One row per block size (tokens): reserved_tokens = sum ceil(L / B) * B, used_tokens = sum L,
    wasted_tokens = reserved - used, waste_pct = 100 x wasted / reserved, max_num_requests that fit in
    memory_gib (GiB, 1 GiB = 1,024 MiB) at mib_per_token (MiB), block_table_entries = mean ceil(L / B)
    per request. Vectorised over a histogram of the lengths, so 10 million requests cost one bincount.
    """
    sizes = _check_block_sizes(block_sizes)
    lengths = check_lengths(lengths, max_len_tokens)
    counts = np.bincount(lengths)                       # counts[l] = requests of length l
    values = np.arange(len(counts), dtype=np.int64)
    used = int(counts @ values)
    n = len(lengths)
    rows = []
    for b in sizes:
        blocks = int(counts @ (-(-values // b)))
        reserved = blocks * b
        rows.append({
            "reserved_tokens": reserved, "used_tokens": used, "wasted_tokens": reserved - used,
            "waste_pct": 100.0 * (reserved - used) / reserved,
            "max_num_requests": max_num_requests(Fraction(reserved, n), memory_gib, mib_per_token),
            "block_table_entries": blocks / n,
        })
    return pd.DataFrame(rows, index=pd.Index(sizes, name="block_size"))


def workload_table(lengths) -> pd.DataFrame:
    """Used tokens in total and per request (mean), as the article's one-row workload summary."""
    lengths = check_lengths(lengths)
    return pd.DataFrame({"used_tokens": [int(lengths.sum())], "mean_tokens": [float(lengths.mean())]},
                        index=pd.Index(["all"], name="workload"))


def fit_ratio(table: pd.DataFrame, fine: int = 16, coarse: int = 4096) -> float:
    """How many times more requests fit with block size fine than with coarse (the article's 7.1x)."""
    return table.loc[fine, "max_num_requests"] / table.loc[coarse, "max_num_requests"]


# ---------------------------------------------------------------- reservation policies
POLICIES = {
    "max": "reserve the maximum length up front (Orca Max)",
    "pow2": "reserve the next power of two of the final length (Orca Pow2)",
    "oracle": "reserve exactly the final length (Orca Oracle)",
    "paged": "blocks of block_size allocated as tokens arrive (vLLM)",
}


def policy_reservation(lengths, policy: str, *, max_len_tokens: int, block_size: int = 16) -> tuple:
    """(reserved slots, block size) per request for one policy; see the module docstring."""
    validate.one_of("policy", policy, POLICIES)
    max_len_tokens = validate.positive_int("max_len_tokens", max_len_tokens)
    lengths = check_lengths(lengths, max_len_tokens)
    if policy == "max":
        return np.full_like(lengths, max_len_tokens), 1
    if policy == "pow2":
        pow2 = np.left_shift(1, np.ceil(np.log2(lengths)).astype(np.int64))
        # log2 of an exact power of two is exact; guard against float rounding just below one.
        pow2 = np.where(pow2 < lengths, pow2 * 2, pow2)
        return np.minimum(pow2, max_len_tokens), 1  # never above the maximum
    if policy == "oracle":
        return lengths.copy(), 1
    return reserved_per_request(lengths, block_size), validate.positive_int("block_size", block_size)


def policy_breakdown(lengths, policies=("max", "pow2", "oracle", "paged"), *, max_len_tokens: int,
                     block_size: int = 16) -> pd.DataFrame:
    """Tokens held, internal fragmentation and over-reservation (tokens, totals) per policy, and shares of reserved."""
    lengths = check_lengths(lengths, max_len_tokens)
    rows, labels = [], []
    for policy in validate.non_empty("policies", policies):
        reserved, unit = policy_reservation(lengths, policy, max_len_tokens=max_len_tokens, block_size=block_size)
        last_block_end = -(-lengths // unit) * unit
        held = int(lengths.sum())
        internal = int((last_block_end - lengths).sum())
        over = int((reserved - last_block_end).sum())
        total = held + internal + over
        assert total == int(reserved.sum()), "the three parts must add up to what is reserved"
        rows.append({"tokens_held": held, "internal_fragmentation": internal, "over_reservation": over,
                     "reserved_tokens": total, "waste_pct": 100.0 * (internal + over) / total})
        labels.append(f"paged (block {block_size})" if policy == "paged" else policy)
    return pd.DataFrame(rows, index=pd.Index(labels, name="policy"))


# ---------------------------------------------------------------- seed robustness
def allocation_band(name: str, num_requests: int, seeds, block_sizes=ARTICLE_BLOCK_SIZES, *,
                    low_pct: float = 5, high_pct: float = 95, **table_kwargs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """allocation_table over many seeds of a length family: (all seeds long, band of (low, high) per cell).

    The band holds the low_pct and high_pct percentiles over seeds (numpy's linear interpolation).
    """
    from kvlab import workloads

    seeds = validate.non_empty("seeds", seeds)
    frames = []
    for seed in seeds:
        lengths = workloads.sample_lengths(name, num_requests, np.random.default_rng(seed))
        frames.append(allocation_table(lengths, block_sizes, **table_kwargs).assign(seed=seed))
    runs = pd.concat(frames)
    grouped = runs.drop(columns="seed").groupby(level="block_size", sort=False)
    low, high = grouped.quantile(low_pct / 100), grouped.quantile(high_pct / 100)
    band = pd.DataFrame({c: list(zip(low[c], high[c])) for c in low.columns}, index=low.index)
    return runs, band


# ---------------------------------------------------------------- sensitivity to the length family
# Families one parameter away from the fitted default, each with the article's mean of 567 tokens
# (uniform on 1..1,133 tokens has mean 567), so that only the shape of the distribution differs.
MEAN_567_FAMILIES = {
    "article-s1": {},
    "exponential": {"mean_tokens": 567},
    "uniform": {"low_tokens": 1, "high_tokens": 1133},
    "constant": {"tokens": 567},
}


def family_table(families: dict = MEAN_567_FAMILIES, num_requests: int = 20_000, seed: int = 0,
                 block_sizes=ARTICLE_BLOCK_SIZES, *, max_len_tokens: int = 4096, **table_kwargs) -> pd.DataFrame:
    """Waste % and requests that fit per block size (tokens) for several length families, same seed.

    families maps a kvlab.workloads length family to its parameters. One row per family: the mean
    length (tokens), waste_pct_B and max_num_requests_B for every block size B.
    """
    from kvlab import workloads

    rows = {}
    for name, params in validate.non_empty("families", families.items()):
        lengths = workloads.sample_lengths(name, num_requests, np.random.default_rng(seed),
                                           max_len_tokens=max_len_tokens, **params)
        table = allocation_table(lengths, block_sizes, max_len_tokens=max_len_tokens, **table_kwargs)
        row = {"mean_tokens": float(lengths.mean())}
        row.update({f"waste_pct_{b}": table.loc[b, "waste_pct"] for b in table.index})
        row.update({f"max_num_requests_{b}": int(table.loc[b, "max_num_requests"]) for b in table.index})
        rows[name] = row
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "lengths"
    return frame


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
    """A paged KV-cache block allocator: a fixed pool, a FIFO free-block queue, one block table per request.

    allocate, append_token and free are O(1) per block (a deque of free block ids, a dict of
    requests). Invariants: every block id is either free or in exactly one block table; a request's
    table has ceil(num_tokens / block_size) blocks; free + used = num_blocks.
    """

    def __init__(self, num_blocks: int, block_size: int):
        spec = PoolSpec(num_blocks, block_size)
        self.num_blocks, self.block_size = spec.num_blocks, spec.block_size
        self._free = deque(range(spec.num_blocks))
        self._tables: dict = {}          # request_id -> list of block ids
        self._num_tokens: dict = {}      # request_id -> tokens held

    # -- the pool
    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests."""
        return self.num_blocks - len(self._free)

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
        if count > len(self._free):
            raise NoFreeBlocksError(f"request_id={request_id!r} needs {count} block(s) of {self.block_size} "
                                    f"tokens but only {len(self._free)} of {self.num_blocks} are free")
        return [self._free.popleft() for _ in range(count)]

    # -- requests
    def allocate(self, request_id, num_tokens: int) -> tuple[int, ...]:
        """Give a new request blocks for num_tokens tokens (>= 0); all or nothing. Returns its block table."""
        if request_id in self._tables:
            validate.fail("request_id", request_id, "is already allocated (free it first)")
        num_tokens = validate.non_negative_int("num_tokens", num_tokens)
        table = self._take(request_id, -(-num_tokens // self.block_size))
        self._tables[request_id] = table
        self._num_tokens[request_id] = num_tokens
        return tuple(table)

    def append_token(self, request_id) -> bool:
        """One more token for request_id; a new block only when its last block is full. True if it took one."""
        held = self._num_tokens.get(request_id)
        if held is None:
            self._known(request_id)
        self._num_tokens[request_id] = held + 1
        if held % self.block_size:
            return False
        if not self._free:
            self._num_tokens[request_id] = held
            self._take(request_id, 1)
        self._tables[request_id].append(self._free.popleft())
        return True

    def free(self, request_id) -> int:
        """Return all of request_id's blocks to the free queue; the number of blocks freed."""
        table = self._known(request_id)
        # Freed blocks go to the back in reverse order, as vLLM does: the tail block is reused first and the
        # head blocks (the likeliest shared prefix) last.
        self._free.extend(reversed(table))
        del self._tables[request_id], self._num_tokens[request_id]
        return len(table)

    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is free or in exactly one table and tables fit their tokens."""
        held = [b for table in self._tables.values() for b in table]
        assert len(held) + len(self._free) == self.num_blocks, "free + used must equal the pool"
        assert len(set(held) | set(self._free)) == self.num_blocks, "a block is in two places"
        for rid, table in self._tables.items():
            assert len(table) == -(-self._num_tokens[rid] // self.block_size), f"table of {rid!r} has the wrong size"


def run_through_allocator(lengths, block_size: int, *, prompt_tokens: int = 1) -> dict:
    """Grow every request to its length in a BlockAllocator (prompt, then one token at a time) and count.

    All requests are held at once, so the pool has exactly the blocks they need; returns reserved,
    used and wasted tokens as allocation_table counts them (the test that the two paths agree).
    """
    lengths = check_lengths(lengths)
    block_size = validate.positive_int("block_size", block_size)
    prompt_tokens = validate.positive_int("prompt_tokens", prompt_tokens)
    allocator = BlockAllocator(int((-(-lengths // block_size)).sum()), block_size)
    for request_id, length in enumerate(lengths.tolist()):
        first = min(prompt_tokens, length)
        allocator.allocate(request_id, first)
        for _ in range(length - first):
            allocator.append_token(request_id)
    reserved = allocator.num_used_blocks * block_size
    used = sum(allocator.num_tokens(r) for r in range(len(lengths)))
    return {"reserved_tokens": reserved, "used_tokens": used, "wasted_tokens": reserved - used,
            "num_free_blocks": allocator.num_free_blocks}


# ---------------------------------------------------------------- the article's figures, for comparison
ARTICLE_COLUMNS = ["reserved_tokens", "wasted_tokens", "waste_pct", "max_num_requests"]


def article_table() -> pd.DataFrame:
    """The article's section 1 table (data/article_figures.csv), one row per reservation unit (tokens)."""
    from kvlab import ledger

    figures = ledger.article_figures(1).query("table == 'allocation'")
    table = figures.pivot(index="row", columns="column", values="value")[ARTICLE_COLUMNS]
    table.index = table.index.astype(int).rename("block_size")
    return table.sort_index(ascending=False)


def claims_table(table: pd.DataFrame) -> pd.DataFrame:
    """The article's headline claim from an allocation table: requests that fit with 16 over 4,096 tokens."""
    return pd.DataFrame({"fit_ratio": [fit_ratio(table)]}, index=pd.Index(["16 vs 4096"], name="claim"))


def band_check(band: pd.DataFrame, article: pd.DataFrame) -> pd.DataFrame:
    """Per block size and figure: the article's value, the seed band (low, high), and whether it lies inside."""
    rows = []
    for block_size in article.index:
        for column in article.columns:
            low, high = band.loc[block_size, column]
            value = article.loc[block_size, column]
            rows.append({"block_size": block_size, "figure": column, "article": value,
                         "band_low": low, "band_high": high, "inside": bool(low <= value <= high)})
    return pd.DataFrame(rows).set_index(["block_size", "figure"])
