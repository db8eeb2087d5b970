"""The fleet's routers on hand-built states, each picking what its public code says it picks (kvlab.core.fleet.routers
cites each rule's file and function)."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core.fleet import routers
from kvlab.core.fleet.routers import DynamoKv, InstanceLoad, LeastLoaded, LlmD, PrefixAware, RoundRobin, Session


def load(running=0, waiting=0, tokens=0, usage=0.0, cached=(), num_gpu_blocks=1000):
    return InstanceLoad(running, waiting, tokens, usage, frozenset(cached), num_gpu_blocks)


def request(i=0, blocks=(), prompt_tokens=None, session=None, at_s=0.0, block_size=16):
    tokens = len(blocks) * block_size if prompt_tokens is None else prompt_tokens
    return routers.RoutedRequest(i, at_s, tokens, tuple(blocks), session)


IDLE = [load(), load(), load()]


def test_round_robin_deals_in_turn():
    router = RoundRobin(3)
    assert [router.route(request(i), IDLE) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize(
    "by, loads, expected",
    [
        ("requests", [load(3, 1), load(1, 1, tokens=900), load(2, 0)], 1),
        ("tokens", [load(3, 1, tokens=500), load(1, 1, tokens=900), load(2, 0, tokens=40)], 2),
        ("requests", [load(1, 1), load(2, 0), load(0, 2)], 0),  # a tie: the first
    ],
)
def test_least_loaded_takes_the_fewest_unfinished(by, loads, expected):
    assert LeastLoaded(3, by=by).route(request(), loads) == expected


def test_least_loaded_refuses_an_unknown_measure():
    with pytest.raises(ValueError, match="by='blocks' is not allowed"):
        LeastLoaded(2, by="blocks")


def ring_owner(session_id: str, names: list[str]) -> int:
    """uhashring's pick, by brute force: the endpoint owning the first of its 160 points per endpoint strictly after
    the session's MD5, the lowest point where none is after it."""
    md5 = lambda text: int(hashlib.md5(text.encode()).hexdigest(), 16)  # noqa: E731
    points = [(md5(f"{name}-{w}"), i) for i, name in enumerate(names) for w in range(160)]
    key = md5(session_id)
    after = [p for p in points if p[0] > key]
    return min(after)[1] if after else min(points)[1]


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=20))
def test_a_session_goes_where_the_hash_ring_puts_it_every_time(sessions):
    router = Session(5)
    for i, session in enumerate(sessions):
        picked = router.route(request(i, session=session, at_s=float(i)), [load()] * 5)
        assert picked == ring_owner(session, router.names)
        assert router.route(request(i, session=session, at_s=float(i)), [load()] * 5) == picked


def test_without_a_session_the_first_unused_endpoint_then_the_fewest_requests_in_the_window():
    router = Session(3, window_s=60.0)
    picks = [router.route(request(i, at_s=float(i)), IDLE) for i in range(3)]
    assert picks == [0, 1, 2]  # each endpoint had no request yet
    router.route(request(3, session="a", at_s=3.0), IDLE)  # counted too (production-stack's stats monitor)
    busy = router.sent_s.index(max(router.sent_s, key=len))
    assert router.route(request(4, at_s=4.0), IDLE) != busy  # the lowest QPS, the first of equals
    assert router.route(request(5, at_s=200.0), IDLE) == 0  # the window forgot them all: all at 0, the first


def test_an_endpoint_whose_requests_left_the_window_is_not_new():
    router = Session(3, window_s=60.0)
    assert router.route(request(0, at_s=0.0), IDLE) == 0  # new
    assert router.route(request(1, at_s=100.0), IDLE) == 1  # new (endpoint 0's request has left the window)
    # endpoint 0 has had a request (0 requests/s now), endpoint 2 none yet: the first new one wins
    assert router.route(request(2, at_s=101.0), IDLE) == 2


def test_prefix_aware_follows_the_longest_prefix_an_endpoint_holds():
    router = PrefixAware(3, seed=1)
    first = router.route(request(0, blocks=("a", "b")), IDLE)
    assert router.route(request(1, blocks=("a", "b", "c")), IDLE) == first  # its prompt's prefix went there
    # another endpoint holds only "a": a prompt a, b still goes where both are
    router.trie["a"][0].add((first + 1) % 3)
    assert router.route(request(2, blocks=("a", "b", "x")), IDLE) == first


def test_prefix_aware_sends_an_unmatched_prompt_anywhere_at_random():
    router = PrefixAware(3, seed=0)
    picks = {router.route(request(i, blocks=(f"p{i}",)), IDLE) for i in range(30)}
    assert picks == {0, 1, 2}


def test_prefix_aware_below_its_minimum_match_takes_the_qps_fallback():
    router = PrefixAware(3, min_match_blocks=2)
    assert [router.route(request(i, blocks=(f"p{i}",), at_s=float(i)), IDLE) for i in range(3)] == [0, 1, 2]


def test_llm_d_sums_its_default_scorers_with_their_weights():
    router = LlmD(2)
    router.index[1]["a"] = router.index[1]["b"] = True  # endpoint 1 was sent a prompt a, b
    loads = [load(waiting=0, usage=0.5), load(waiting=10, usage=0.1)]
    # endpoint 0: queue 2 x 1 + kv 2 x 0.5 + prefix 0 = 3; endpoint 1: 2 x 0 + 2 x 0.9 + 3 x (2 of 2) = 4.8
    assert router.scores(request(blocks=("a", "b")), loads) == pytest.approx([3.0, 4.8])
    assert router.route(request(blocks=("a", "b")), loads) == 1
    # equal queues score 1 each; no prefix: the emptier cache wins
    assert router.route(request(blocks=("z",)), [load(waiting=4, usage=0.3), load(waiting=4, usage=0.2)]) == 1


def test_llm_d_counts_every_block_an_endpoint_holds_until_one_no_endpoint_holds():
    router = LlmD(2)
    router.index[0]["a"] = True
    router.index[1]["b"] = True
    scores = router.scores(request(blocks=("a", "b", "c", "d")), [load(), load()])
    assert scores - scores.min() == pytest.approx([0.0, 0.0])  # each holds 1 of 4 (no check that they are in a row)


def test_llm_d_remembers_what_it_sent_up_to_num_gpu_blocks():
    router = LlmD(1)
    router.route(request(blocks=("a", "b", "c")), [load(num_gpu_blocks=2)])
    assert list(router.index[0]) == ["b", "c"]


def test_dynamo_costs_prefill_blocks_and_decode_blocks_and_takes_the_lowest():
    router = DynamoKv(2, block_size=16)
    cached = load(cached=("a", "b", "c", "d"))
    # worker 0 holds the prompt's 4 blocks but decodes 10 blocks already; worker 1 holds nothing and is idle
    router.block_refs[0] = {f"x{i}": 1 for i in range(10)}
    costs = router.costs(request(blocks=("a", "b", "c", "d")), [cached, load()])
    assert costs == pytest.approx([0 / 16 + (4 + 10), 64 / 16 + 4])
    assert router.route(request(7, blocks=("a", "b", "c", "d")), [cached, load()]) == 1
    assert router.active_tokens[1] == 64 and router.block_refs[1] == {"a": 1, "b": 1, "c": 1, "d": 1}
    router.prefill_done(7)
    assert router.active_tokens[1] == 0 and len(router.block_refs[1]) == 4
    router.finished(7)
    assert router.block_refs[1] == {}


def test_dynamo_breaks_a_tie_by_the_smaller_cache():
    router = DynamoKv(2, block_size=16)
    loads = [load(cached=("q", "r")), load(cached=("s",))]  # neither holds the prompt: equal costs
    assert router.route(request(blocks=("a",)), loads) == 1
