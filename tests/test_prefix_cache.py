"""Prefix caching: the LRU replay against a brute-force reference, its invariants, and the Mooncake figures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import prefix_cache
from kvlab.sections import s04_traces as section
from kvlab.workloads import Workload, traces


def workload(hash_lists, prompts=None, block_tokens=512) -> Workload:
    prompts = prompts if prompts is not None else [len(h) * block_tokens for h in hash_lists]
    n = len(hash_lists)
    return Workload(
        arrival_s=np.arange(n, dtype=float),
        prompt_tokens=prompts,
        output_tokens=[1] * n,
        prefix_hashes=tuple(np.array(h, dtype=np.int64) for h in hash_lists),
        prefix_block_tokens=block_tokens,
    )


def reference(hash_lists, prompts, block_tokens, capacity):
    """Brute force: a last-use clock per block; evict the smallest clock until the cache fits."""
    last_use, clock, hits_total, saved = {}, 0, 0, 0
    for ids, prompt in zip(hash_lists, prompts):
        hits = 0
        while hits < len(ids) and ids[hits] in last_use:
            hits += 1
        hits_total += hits
        saved += min(hits * block_tokens, prompt)
        for h in reversed(ids):
            clock += 1
            last_use[h] = clock
        while capacity is not None and len(last_use) > capacity:
            del last_use[min(last_use, key=last_use.get)]
    return hits_total, saved


# Requests built like chat turns: a shared head, then a conversation's own chain of blocks.
chains = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6)), min_size=1, max_size=30)


def chat_requests(draws):
    """Request i: block 0, then conversation c's blocks 1..k (ids unique to c)."""
    return [[0] + [100 * c + j for j in range(1, k + 1)] for c, k in draws]


@settings(max_examples=80, deadline=None)
@given(draws=chains, capacity=st.one_of(st.none(), st.integers(1, 12)), block_tokens=st.sampled_from([16, 512]))
def test_replay_equals_brute_force_reference(draws, capacity, block_tokens):
    hash_lists = chat_requests(draws)
    prompts = [max(0, len(h) * block_tokens - (i % 3) * 7) for i, h in enumerate(hash_lists)]
    stats = prefix_cache.replay(workload(hash_lists, prompts, block_tokens), capacity)
    assert (stats.num_hit_blocks, stats.prefill_tokens_saved) == reference(hash_lists, prompts, block_tokens, capacity)
    assert stats.num_blocks == sum(map(len, hash_lists)) and stats.prompt_tokens == sum(prompts)
    assert 0 <= stats.hit_rate <= 1 and 0 <= stats.saved_fraction <= 1


@settings(max_examples=40, deadline=None)
@given(draws=chains)
def test_hits_grow_with_cache_size_up_to_the_unbounded_limit(draws):
    w = workload(chat_requests(draws))
    hits = [prefix_cache.replay(w, c).num_hit_blocks for c in range(1, prefix_cache.distinct_blocks(w) + 1)]
    unbounded = prefix_cache.replay(w, None).num_hit_blocks
    assert hits == sorted(hits)  # LRU is a stack algorithm: a bigger cache holds a superset
    assert hits[-1] == unbounded  # a cache holding every distinct block never evicts


def test_hand_worked_example():
    # r0 misses all; r1 hits block 0 only; r2 repeats r0 (2 blocks, last one partial: 600 tokens).
    w = workload([[0, 1], [0, 2], [0, 1]], prompts=[600, 1024, 600])
    unbounded = prefix_cache.replay(w, None)
    assert (unbounded.num_blocks, unbounded.num_hit_blocks, unbounded.prefill_tokens_saved) == (6, 3, 512 + 600)
    assert unbounded.hit_rate == 0.5 and unbounded.saved_fraction == 1112 / 2224
    # Two blocks: after r1 the cache holds {0, 2}; block 1 (r0's tail) was evicted first.
    two = prefix_cache.replay(w, 2)
    assert (two.num_hit_blocks, two.prefill_tokens_saved) == (2, 1024)
    # One block: only the head block 0 survives each request, as vLLM evicts tails first.
    one = prefix_cache.replay(w, 1)
    assert (one.num_hit_blocks, one.prefill_tokens_saved) == (2, 1024)


def test_hit_rate_curve_table():
    w = workload([[0, 1], [0, 2], [0, 1]], prompts=[600, 1024, 600])
    curve = section.hit_rate_curve(w, [2, 1, 2])
    assert curve.index.tolist() == [1, 2, "unbounded"]
    assert curve["cache_tokens"].tolist() == [512, 1024, 3 * 512]
    assert curve["hit_rate_pct"].tolist() == [33.33, 33.33, 50.0]
    assert curve["prefill_tokens_saved"].tolist() == [1024, 1024, 1112]
    assert curve.loc["unbounded", "prefill_saved_pct"] == 50.0
    with_gib = section.hit_rate_curve(w, [1, 2], kv_bytes_per_token=2**20)  # 1 MiB per token
    assert with_gib["cache_gib"].tolist() == [0.5, 1.0, 1.5]
    assert with_gib.columns.tolist() == [
        "cache_tokens",
        "cache_gib",
        "hit_rate_pct",
        "prefill_tokens_saved",
        "prefill_saved_pct",
    ]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda w: prefix_cache.replay(w, 0), "num_cache_blocks=0 is not allowed: must be an integer >= 1"),
        (lambda w: section.hit_rate_curve(w, []), "cache_sizes_blocks=[] is not allowed: must not be empty"),
        (lambda w: section.hit_rate_curve(w, [4, -1]), "cache_sizes_blocks=-1 is not allowed: must be an integer >= 1"),
        (
            lambda w: section.hit_rate_curve(w, [4], 0.5),
            "kv_bytes_per_token=0.5 is not allowed: must be an integer >= 1",
        ),
    ],
)
def test_bad_parameters(call, message):
    with pytest.raises(ValueError) as err:
        call(workload([[0]]))
    assert str(err.value) == message


def test_workload_without_prefix_hashes():
    w = Workload(arrival_s=[0.0], prompt_tokens=[5], output_tokens=[1])
    with pytest.raises(ValueError) as err:
        prefix_cache.replay(w, None)
    assert str(err.value) == (
        "workload.prefix_hashes=None is not allowed: prefix caching needs a trace with "
        "prefix-block hashes (e.g. the Mooncake trace)"
    )


MISSING = traces.missing_traces()


@pytest.mark.skipif(
    "mooncake" in MISSING,
    reason=f"the Mooncake trace is not in {traces.trace_dir()} (set TRACE_DIR or run make traces)",
)
def test_mooncake_unbounded_limit():
    w = traces.load_trace(traces.trace_path("mooncake")).workload
    stats = prefix_cache.replay(w, None)
    assert stats.num_blocks == 288_500 and stats.num_hit_blocks == 105_710
    assert stats.prefill_tokens_saved == 54_098_411 and stats.prompt_tokens == 144_793_823
    assert prefix_cache.distinct_blocks(w) == 288_500 - 105_710  # every block not hit was new
