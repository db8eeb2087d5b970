"""Reservation accounting, reservation policies and the paged block allocator."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import allocator as alloc
from kvlab.core import article
from kvlab.core.allocator import BlockAllocator, NoFreeBlocksError
from kvlab.sections import s01_allocation as allocation

lengths_st = st.lists(st.integers(1, 300), min_size=1, max_size=40)
block_st = st.sampled_from([1, 2, 3, 7, 16, 64, 256])


def reference_accounting(lengths, block_size):
    """The plain-Python definition: reserve whole blocks, count the slots nobody uses."""
    reserved = sum(((n + block_size - 1) // block_size) * block_size for n in lengths)
    used = sum(lengths)
    return reserved, used, reserved - used


# ---------------------------------------------------------------- vectorised accounting
@given(lengths=lengths_st, block_size=block_st)
@settings(max_examples=60, deadline=None)
def test_allocation_table_equals_the_reference(lengths, block_size):
    row = allocation.allocation_table(lengths, [block_size]).iloc[0]
    assert (row["reserved_tokens"], row["used_tokens"], row["wasted_tokens"]) == reference_accounting(
        lengths, block_size
    )
    assert row["block_table_entries"] == pytest.approx(np.mean([-(-n // block_size) for n in lengths]))
    # waste per request is below one block
    assert row["wasted_tokens"] <= len(lengths) * (block_size - 1)


@pytest.mark.parametrize(
    "reserved_total, expected",
    [(81_920_000, 30), (26_132_480, 94), (13_992_448, 175), (11_958_528, 205), (11_486_464, 213)],
)
def test_requests_that_fit_reproduce_the_article_from_its_reserved_totals(reserved_total, expected):
    assert alloc.max_num_requests(reserved_total / 20_000, memory_gib=60, mib_per_token=0.5) == expected


def test_the_floor_is_exact_at_a_whole_number():
    assert alloc.max_num_requests(4096, 60, 0.5) == 30  # 61,440 MB / 2,048 MB is exactly 30


def test_article_table_columns_and_fit_ratio():
    lengths = np.array([1, 4096, 600, 17])
    table = allocation.allocation_table(lengths, article.BLOCK_SIZES, max_len_tokens=4096)
    assert list(table.index) == [4096, 1024, 256, 64, 16]
    assert table.loc[4096, "reserved_tokens"] == 4 * 4096
    assert table.loc[16, "reserved_tokens"] == 16 + 4096 + 608 + 32
    assert table.loc[16, "waste_pct"] == pytest.approx(100 * (4752 - 4714) / 4752)
    assert allocation.fit_ratio(table) == table.loc[16, "max_num_requests"] / table.loc[4096, "max_num_requests"]


def test_ten_million_requests_go_through_one_histogram():
    lengths = np.random.default_rng(0).integers(1, 4097, size=2_000_000)
    table = allocation.allocation_table(lengths, [64])
    assert table.loc[64, "reserved_tokens"] == int((-(-lengths // 64) * 64).sum())


def test_workload_table():
    table = allocation.workload_table([1, 2, 3])
    assert table.loc["all", "used_tokens"] == 6 and table.loc["all", "mean_tokens"] == 2.0


# ---------------------------------------------------------------- policies
@given(lengths=st.lists(st.integers(1, 4096), min_size=1, max_size=30), block_size=block_st)
@settings(max_examples=60, deadline=None)
def test_policy_parts_add_up_and_match_their_definitions(lengths, block_size):
    table = allocation.policy_breakdown(lengths, max_len_tokens=4096, block_size=block_size)
    n, held = len(lengths), sum(lengths)
    assert (table["held_tokens"] == held).all()
    parts = table[["held_tokens", "unused_in_last_block_tokens", "unused_beyond_last_block_tokens"]].sum(axis=1)
    assert (parts == table["reserved_tokens"]).all()
    assert table.loc["Orca (Max)", "reserved_tokens"] == 4096 * n
    assert table.loc["Orca (Oracle)", "reserved_tokens"] == held
    pow2 = sum(1 << (x - 1).bit_length() for x in lengths)
    assert table.loc["Orca (Pow2)", "reserved_tokens"] == pow2
    paged = table.loc[f"vLLM (blocks of {block_size})"]
    assert paged["reserved_tokens"] == reference_accounting(lengths, block_size)[0]
    assert paged["unused_beyond_last_block_tokens"] == 0 and paged["unused_in_last_block_tokens"] < n * block_size


def test_policy_errors():
    with pytest.raises(ValueError, match="policy='buddy' is not allowed"):
        allocation.policy_breakdown([5], ["buddy"], max_len_tokens=10)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: allocation.allocation_table([10], [0]),
            "block_size=0 is not allowed: must be an integer from 1 to 1,048,576 tokens",
        ),
        (lambda: allocation.allocation_table([10], [16.5]), "block_size=16.5 is not allowed"),
        (lambda: allocation.allocation_table([10], []), "block_sizes=[] is not allowed: must not be empty"),
        (lambda: allocation.allocation_table([], [16]), "lengths='0 values' is not allowed"),
        (lambda: allocation.allocation_table([5, -3], [16]), "lengths[1]=-3 is not allowed: must be >= 1 token"),
        (lambda: allocation.allocation_table([5, 0], [16]), "lengths[1]=0 is not allowed"),
        (lambda: allocation.allocation_table([5.5], [16]), "lengths=dtype('float64') is not allowed: must be whole"),
        (
            lambda: allocation.allocation_table([5, 5000], [16], max_len_tokens=4096),
            "lengths[1]=5000 is not allowed: must be <= max_len_tokens=4096",
        ),
        (lambda: alloc.max_num_requests(100, memory_gib=0), "memory_gib=0 is not allowed"),
        (lambda: BlockAllocator(0, 16), "num_blocks=0 is not allowed"),
        (lambda: BlockAllocator(4, 0), "block_size=0 is not allowed"),
        (lambda: BlockAllocator(4, 2.0), "block_size=2.0 is not allowed"),
    ],
)
def test_bad_input_is_a_one_line_error(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


# ---------------------------------------------------------------- the block allocator
def test_allocate_append_free():
    a = BlockAllocator(num_blocks=4, block_size=4)
    assert a.allocate("r1", 5) == (1, 2)  # ids from 1: block 0 is vLLM's null block
    assert a.num_free_blocks == 2 and a.num_tokens("r1") == 5
    assert [a.append_token("r1") for _ in range(4)] == [False, False, False, True]  # the 9th token opens block 3
    assert a.block_table("r1") == (1, 2, 3) and a.num_tokens("r1") == 9
    assert a.free("r1") == 3
    assert a.num_free_blocks == 4 and a.num_requests == 0
    a.check_invariants()


def test_zero_token_request_takes_a_block_on_its_first_token():
    a = BlockAllocator(2, 8)
    assert a.allocate(0, 0) == ()
    assert a.append_token(0) is True and a.block_table(0) == (1,)


def test_exhausted_pool_allocates_nothing():
    a = BlockAllocator(3, 4)
    a.allocate("a", 8)
    with pytest.raises(
        NoFreeBlocksError, match=r"request_id='b' needs 2 block\(s\) of 4 tokens but only 1 of 3 are free"
    ):
        a.allocate("b", 5)
    assert a.num_free_blocks == 1 and a.num_requests == 1  # all or nothing
    a.allocate("c", 3)
    assert a.append_token("c") is False  # the 4th token still fits c's block: no new block needed
    with pytest.raises(NoFreeBlocksError, match="request_id='a' needs 1 block"):
        a.append_token("a")  # a's two blocks are full and the pool is empty
    assert a.num_tokens("a") == 8 and len(a.block_table("a")) == 2  # a failed append changes nothing
    a.check_invariants()


def test_double_free_and_unknown_requests_are_clear_errors():
    a = BlockAllocator(2, 4)
    a.allocate(7, 3)
    a.free(7)
    for call in (lambda: a.free(7), lambda: a.append_token(7), lambda: a.block_table(7), lambda: a.num_tokens(8)):
        with pytest.raises(ValueError, match=r"request_id=\d is not allowed: is not allocated"):
            call()
    a.allocate(1, 1)
    with pytest.raises(ValueError, match="request_id=1 is not allowed: is already allocated"):
        a.allocate(1, 1)
    with pytest.raises(ValueError, match="num_tokens=-1 is not allowed"):
        a.allocate(2, -1)
    a.check_invariants()


ops_st = st.lists(
    st.tuples(st.sampled_from(["allocate", "append", "free"]), st.integers(0, 5), st.integers(0, 9)), max_size=80
)


@given(ops=ops_st, num_blocks=st.integers(1, 12), block_size=st.integers(1, 5))
@settings(max_examples=80, deadline=None)
def test_invariants_hold_under_any_sequence_of_operations(ops, num_blocks, block_size):
    a = BlockAllocator(num_blocks, block_size)
    tokens = {}  # the model: tokens per live request
    for op, rid, n in ops:
        # The model says which error, if any, each call must raise: an error is never just tolerated.
        free = a.num_free_blocks
        if op == "allocate":
            error = ValueError if rid in tokens else NoFreeBlocksError if -(-n // block_size) > free else None
        elif op == "append":
            error = (
                ValueError
                if rid not in tokens
                else NoFreeBlocksError
                if tokens[rid] % block_size == 0 and free == 0
                else None
            )
        else:
            error = None if rid in tokens else ValueError
        call = {
            "allocate": lambda: a.allocate(rid, n),
            "append": lambda: a.append_token(rid),
            "free": lambda: a.free(rid),
        }[op]
        if error is not None:
            with pytest.raises(error):
                call()
            assert a.num_free_blocks == free  # a failed call takes nothing
        else:
            result = call()
            if op == "allocate":
                tokens[rid] = n
                assert len(result) == -(-n // block_size)
            elif op == "append":
                assert result is (tokens[rid] % block_size == 0)  # a new block exactly when the last is full
                tokens[rid] += 1
            else:
                assert result == -(-tokens.pop(rid) // block_size)
        a.check_invariants()
        tables = [set(a.block_table(r)) for r in tokens]
        assert sum(map(len, tables)) == len(set().union(*tables)) if tables else True  # no block in two tables
        assert a.num_free_blocks + a.num_used_blocks == num_blocks
        assert {r: a.num_tokens(r) for r in tokens} == tokens
        for r, t in tokens.items():  # waste per request below one block
            assert len(a.block_table(r)) * block_size - t < block_size or t == 0
    for r in list(tokens):
        a.free(r)
    assert a.num_free_blocks == num_blocks and a.num_requests == 0


@given(lengths=lengths_st, block_size=block_st, prompt=st.integers(1, 50))
@settings(max_examples=40, deadline=None)
def test_the_allocator_gives_exactly_the_vectorised_accounting(lengths, block_size, prompt):
    got = alloc.run_through_allocator(lengths, block_size, prompt_tokens=prompt)
    row = allocation.allocation_table(lengths, [block_size]).iloc[0]
    assert (got["reserved_tokens"], got["used_tokens"], got["wasted_tokens"]) == (
        row["reserved_tokens"],
        row["used_tokens"],
        row["wasted_tokens"],
    )
    assert got["num_free_blocks"] == 0


# ---------------------------------------------------------------- seed band
def test_allocation_band_brackets_every_seed_median():
    runs, band = allocation.allocation_band("article-s1", 2000, range(20), [256, 16])
    assert len(runs) == 40 and list(band.index) == [256, 16]
    for b in (256, 16):
        values = runs.loc[runs.index == b, "waste_pct"]
        low, high = band.loc[b, "waste_pct"]
        assert values.min() <= low <= values.median() <= high <= values.max()


@pytest.mark.parametrize(
    "lengths, expected",
    [
        ([13_654, 13_653, 13_653], 9),  # 40,960 tokens / 3 requests: 61,440 MiB / (40,960 / 3 x 0.5 MiB) is exactly 9
        ([1_000] * 6 + [1_024], 122),  # 7,024 / 7 per request: 122.46 requests, floor 122
    ],
)
def test_requests_that_fit_are_exact_when_the_mean_is_not_a_binary_fraction(lengths, expected):
    # The mean reserved per request (40,960 / 3) has no exact float; the floor must still land on 9, not 8.
    assert allocation.allocation_table(lengths, [1]).loc[1, "max_num_requests"] == expected


def test_requests_that_fit_read_decimal_memory_figures_as_written():
    # 0.1 MiB per token and 409.6 tokens per request: 6 GiB / 40.96 MiB = 150 exactly (not 149.99...)
    assert alloc.max_num_requests(409.6, memory_gib=6, mib_per_token=0.1) == 150


def test_family_table_isolates_the_shape_of_the_distribution():
    table = allocation.family_table(num_requests=5_000, seed=3)
    assert list(table.index) == list(allocation.MEAN_567_FAMILIES)
    assert table["mean_tokens"].between(567 * 0.97, 567 * 1.03).all()
    # reserving the maximum wastes 1 - mean / max whatever the shape
    assert np.allclose(table["waste_at_4096_pct"], 100 * (1 - table["mean_tokens"] / 4096))
    # every request 567 tokens long wastes 16 - 567 % 16 = 9 tokens in 16-token blocks
    assert table.loc["constant", "waste_at_16_pct"] == pytest.approx(100 * 9 / 576)
    with pytest.raises(ValueError, match="lengths='zipf' is not allowed"):
        allocation.family_table({"zipf": {}})


# ---------------------------------------------------------------- the free-block queue's reuse order
def test_free_queue_hands_out_blocks_in_id_order_first():
    pool = BlockAllocator(num_blocks=6, block_size=4)
    assert pool.allocate("a", 9) == (1, 2, 3)  # a fresh pool hands out blocks 1, 2, 3, ... (0 is the null block)
    assert pool.allocate("b", 4) == (4,)


def test_freed_blocks_are_reused_first_last_block_first():
    """vLLM 0.33's order (block_pool.py free_blocks, kv_cache_utils.py prepend_n): a freed request's blocks go
    to the head of the free queue, its last block first, so the next request reuses the blocks freed last
    (LIFO, for GPU locality) before any never-used block."""
    pool = BlockAllocator(num_blocks=8, block_size=4)
    pool.allocate("a", 12)  # blocks 1, 2, 3
    pool.allocate("b", 8)  # blocks 4, 5
    pool.free("a")  # queue: 3, 2, 1, then 6, 7, 8
    assert pool.free_block_ids() == [3, 2, 1, 6, 7, 8]
    assert pool.allocate("c", 16) == (3, 2, 1, 6)
    pool.free("b")  # queue: 5, 4, then 7, 8
    assert pool.allocate("d", 16) == (5, 4, 7, 8)
    assert pool.num_free_blocks == 0
    pool.check_invariants()


def test_append_token_takes_the_head_of_the_free_queue():
    pool = BlockAllocator(num_blocks=4, block_size=2)
    pool.allocate("a", 2)  # block 1
    pool.allocate("b", 2)  # block 2
    pool.free("a")  # queue: 1, 3, 4
    assert pool.append_token("b") is True and pool.block_table("b") == (2, 1)
    assert [pool.append_token("b") for _ in range(3)] == [False, True, False]
    assert pool.block_table("b") == (2, 1, 3)


@given(st.integers(0, 3000), st.integers(1, 3000), st.integers(1, 8192))
def test_orca_pow2_is_the_papers_prompt_plus_the_next_power_of_two_of_the_output(prompt, output, max_len):
    from kvlab.core.allocator import pow2_reservation

    expected = min(prompt + (1 << (output - 1).bit_length()), max_len)  # the reference: integer arithmetic only
    assert pow2_reservation(prompt, prompt + output, max_len) == expected
    assert pow2_reservation(np.array([prompt]), np.array([prompt + output]), max_len).tolist() == [expected]


def test_orca_pow2_reserves_32_for_an_output_of_25_and_section_1_rounds_the_whole_length():
    from kvlab.core.allocator import policy_reservation, pow2_reservation

    assert pow2_reservation(100, 125, 2048) == 132  # the paper's §6.1 example, after a 100-token prompt
    reserved, unit = policy_reservation(np.array([25, 567, 4000]), "pow2", max_len_tokens=4096)
    assert reserved.tolist() == [32, 1024, 4096] and unit == 1
