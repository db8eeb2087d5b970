"""A closed-loop load (vLLM bench's --max-concurrency N): hand-checked sends, the open loop it equals when N covers
every request, the invariants of the send rule against a simple reference, and the fast path against the per-step
loop."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import config, engine_runs

from conftest import assert_same
from kvlab.core.cost import ConstantStepCost
from kvlab.core.engine import Engine, Recorder, simulate
from kvlab.core.engine.closed_loop import send_s
from kvlab.core.engine.fast import compiled
from kvlab.core.workload import Workload

TIMES = ("first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens", "num_preemptions")


@pytest.mark.parametrize("path", ["reference", "auto", *(["compiled"] if compiled.available() else [])])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_one_in_flight_sends_each_request_when_the_one_before_finishes(path, async_scheduling):
    """10 ms steps, all four made at t=0: request 0 (2 output tokens) prefills in 0-10 ms and decodes in 10-20 ms;
    request 1 is sent at 20 ms, its first token at 30 ms, its last two at 40 and 50 ms; request 2 (one token) is sent
    at 50 ms and done at 60 ms; request 3 is sent at 60 ms, first token at 70 ms, three more by 100 ms."""
    w = Workload(np.zeros(4), np.array([3, 5, 2, 7]), np.array([2, 3, 1, 4]))
    r = simulate(
        w,
        config(async_scheduling=async_scheduling, max_model_len=64),
        num_gpu_blocks=100,
        cost=ConstantStepCost(10.0),
        max_concurrency=1,
        path=path,
    )
    assert r.arrival_s.tolist() == pytest.approx([0.0, 0.02, 0.05, 0.06])
    assert r.first_token_s.tolist() == pytest.approx([0.01, 0.03, 0.06, 0.07])
    assert r.finish_s.tolist() == pytest.approx([0.02, 0.05, 0.06, 0.10])
    assert np.array_equal(r.arrival_s[1:], r.finish_s[:-1])  # sent the moment the one before finished, bit for bit
    assert r.ttft_s.tolist() == pytest.approx([0.01] * 4)  # latency counts from the send, as vLLM bench's does


def test_a_later_open_loop_arrival_waits_for_itself_not_for_the_slot():
    """N=1, request 1 made at 1 s while request 0 is done at 20 ms: sent at 1 s (max of arrival and free slot)."""
    w = Workload(np.array([0.0, 1.0, 1.0]), np.array([1, 1, 1]), np.array([2, 2, 2]))
    r = simulate(w, config(max_model_len=64), num_gpu_blocks=100, cost=ConstantStepCost(10.0), max_concurrency=1)
    assert r.arrival_s.tolist() == pytest.approx([0.0, 1.0, 1.02])
    assert r.finish_s.tolist() == pytest.approx([0.02, 1.02, 1.04])


@given(engine_runs(), st.integers(0, 3))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_limit_at_or_above_the_requests_is_the_open_loop(args, extra):
    """N >= the number of requests: nothing ever waits for a slot, every record identical to the open loop's."""
    n = args["workload"].num_requests
    open_loop = Engine(**args, recorder=Recorder(scheduled=True, frees=True)).run()
    closed = Engine(**args, recorder=Recorder(scheduled=True, frees=True), max_concurrency=n + extra).run()
    assert_same(open_loop, closed)
    assert np.array_equal(open_loop.arrival_s, closed.arrival_s)


def reference_sends(arrival, finish, n_max) -> list[float]:
    """The send times by their definition, from the finishes: request i goes out at the earliest time, no earlier than
    its arrival nor the send before it, when fewer than N of requests 0..i-1 are unfinished."""
    sends: list[float] = []
    for i, a in enumerate(arrival):
        t = max(a, sends[-1] if sends else -math.inf)
        if i >= n_max:  # the (i - N + 1)-th finish among those before it leaves N - 1 in flight
            t = max(t, sorted(finish[:i])[i - n_max])
        sends.append(t)
    return sends


@given(engine_runs(), st.integers(1, 6))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_never_more_than_n_in_flight_sends_in_order_and_none_before_its_arrival(args, n_max):
    result = Engine(**args, max_concurrency=n_max).run()
    arrival, send, finish = args["workload"].arrival_s, result.arrival_s, result.finish_s
    assert np.isfinite(finish).all()
    assert (np.diff(send) >= 0).all() and (send >= arrival).all()
    assert (result.first_scheduled_s >= send).all() and (finish > send).all()
    for t in send:  # in flight peaks at a send: sent by then and not yet finished
        assert ((send <= t) & (finish > t)).sum() <= n_max
    assert send.tolist() == reference_sends(arrival.tolist(), finish.tolist(), n_max)
    assert send_s(1.0, 2.0, 3.0) == 3.0 and send_s(4.0, 2.0, -math.inf) == 4.0


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_a_bad_limit_is_refused_in_one_line_before_any_work(bad):
    w = Workload(np.zeros(2), np.array([1, 1]), np.array([1, 1]))
    with pytest.raises(ValueError, match=r"^max_concurrency=.* is not allowed: must be a whole number of requests"):
        Engine(w, config(max_model_len=64), num_gpu_blocks=10, max_concurrency=bad)


def test_path_auto_takes_the_compiled_loop_for_a_closed_loop_as_for_an_open_one(monkeypatch):
    w = Workload(np.zeros(2), np.array([1, 1]), np.array([1, 1]))
    for loaded in (False, True):
        monkeypatch.setattr(compiled, "loaded", lambda: loaded)  # noqa: B023
        for n_max in (None, 1):
            engine = Engine(w, config(max_model_len=64), num_gpu_blocks=10, max_concurrency=n_max)
            assert engine.compiled == (loaded and compiled.available())


@given(
    st.integers(2, 3),
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40)), min_size=1, max_size=24),
    st.integers(1, 6),
    st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_data_parallel_ranks_share_one_closed_loop(num_ranks, lengths, n_max, async_scheduling):
    """Ranks in lockstep finish in time order too: the sends are their definition's, and never more than N in flight
    across the ranks."""
    prompts, outputs = (np.array(x) for x in zip(*lengths))
    w = Workload(np.zeros(len(prompts)), prompts, outputs)
    settings_ = config(async_scheduling=async_scheduling, max_model_len=128).replace(data_parallel_size=num_ranks)
    result = simulate(w, settings_, num_gpu_blocks=40, cost=ConstantStepCost(8.0), max_concurrency=n_max)
    send, finish = result.arrival_s, result.finish_s
    assert send.tolist() == reference_sends(w.arrival_s.tolist(), finish.tolist(), n_max)
    for t in send:
        assert ((send <= t) & (finish > t)).sum() <= n_max
