"""A fleet of engines behind a router (kvlab.core.fleet): a fleet of one is the engine, routing first is routing on
one clock, what routers read and hear is what the instances were at each arrival, and kvlab simulate's flags."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.cli import main
from kvlab.core.block_pool import BlockPool
from kvlab.core.config import EngineConfig
from kvlab.core.cost import LinearStepCost
from kvlab.core.engine import Engine
from kvlab.core.fleet.fleet import CachedBlocks, Fleet
from kvlab.core.fleet.routers import ROUTERS, DynamoKv, InstanceLoad, RoutedRequest, Router, make_router
from kvlab.core.workload import Workload

COLUMNS = ("first_scheduled_s", "first_token_s", "finish_s", "num_preemptions", "num_output_tokens")


@st.composite
def runs(draw):
    """A small workload whose prompts share prefixes (Mooncake-like block ids of 8 tokens), engine settings tight
    enough to preempt, and the scheduling mode."""
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.004, 0.01, 0.05, 0.13]), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    outputs = draw(st.lists(st.sampled_from([1, 2, 5, 9, 20, 35]), min_size=n, max_size=n))  # decode runs at once
    roots = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    hashes = tuple(np.array([1000 * r + j for j in range(-(-p // 8))], dtype=np.int64) for r, p in zip(roots, prompts))
    w = Workload(np.cumsum(gaps), prompts, outputs, hashes, 8)
    cfg = EngineConfig().replace(
        async_scheduling=draw(st.booleans()),
        enable_prefix_caching=draw(st.booleans()),
        max_model_len=96,
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.sampled_from([16, 32, 96])),
        block_size=4,
    )
    num_gpu_blocks = 26 + draw(st.sampled_from([0, 4, 40]))
    return w, cfg, num_gpu_blocks


COST = LinearStepCost(0.004, 0.0001)


def same_requests(result, fleet) -> None:
    for name in COLUMNS:
        assert np.array_equal(getattr(result, name), getattr(fleet, name), equal_nan=True), name


def same_runs(a, b) -> None:
    """Two runs of the same requests: every request's times and preemptions and every step's records."""
    same_requests(a, b)
    for field in a.steps:
        assert np.array_equal(a.steps[field], b.steps[field]), field


def same_fleets(a, b) -> None:
    """Two fleets' runs: the same routes, and the same run on each instance."""
    assert np.array_equal(a.instance_of, b.instance_of)
    same_requests(a, b)
    for x, y in zip(a.instances, b.instances, strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            same_runs(x, y)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.sampled_from(sorted(ROUTERS)))
def test_a_fleet_of_one_makes_the_engines_decisions(run, name):
    """Every request's times and preemptions and every step's records, as the engine alone (compiled or not)."""
    w, cfg, num_gpu_blocks = run
    alone = Engine(w, cfg, num_gpu_blocks=num_gpu_blocks, cost=COST).run()
    for path in ("reference", "compiled"):
        fleet = Fleet(w, cfg, make_router(name, 1, cfg.cache.block_size), 1, num_gpu_blocks=num_gpu_blocks,
                      cost=COST, path=path)  # fmt: skip
        result = fleet.run()
        assert (result.instance_of == 0).all()
        same_runs(alone, result.instances[0])
        same_requests(alone, result)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.sampled_from(["round-robin", "session", "prefix-aware"]), st.integers(2, 4))
def test_routing_first_is_routing_at_each_arrival_for_a_router_that_reads_no_instance(run, name, num_instances):
    """The compiled engines of each instance's share, and the Python instances paused at every arrival: the same
    routes, times and steps."""
    w, cfg, num_gpu_blocks = run
    make = lambda: Fleet(w, cfg, make_router(name, num_instances, 4), num_instances,  # noqa: E731
                         num_gpu_blocks=num_gpu_blocks, cost=COST)  # fmt: skip
    apart, together = make().run(), make().run_together()
    same_fleets(apart, together)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(20, 80),
    st.floats(20, 400),
    st.booleans(),
    st.sampled_from([40, 200, 2000]),
    st.integers(0, 2**16),
)
def test_a_compiled_instance_pauses_inside_its_runs_of_decode_steps_as_the_engine_steps(
    n, rate_per_s, async_scheduling, num_gpu_blocks, seed
):
    """Long decodes that the compiled loop runs at once, cut by every arrival (a fleet of one pauses at each): the
    engine's decisions, both modes."""
    rng = np.random.default_rng(seed)
    w = Workload(np.cumsum(rng.exponential(1 / rate_per_s, n)), rng.integers(1, 100, n), rng.integers(20, 300, n))
    cfg = EngineConfig().replace(async_scheduling=async_scheduling, max_model_len=512)
    alone = Engine(w, cfg, num_gpu_blocks=num_gpu_blocks, cost=COST, path="compiled").run()
    fleet = Fleet(w, cfg, make_router("least-loaded", 1, 16), 1, num_gpu_blocks=num_gpu_blocks, cost=COST,
                  path="compiled")  # fmt: skip
    result = fleet.run()
    same_runs(alone, result.instances[0])
    same_requests(alone, result)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.sampled_from(["least-loaded", "llm-d", "dynamo-kv", "prefix-aware"]), st.integers(1, 4))
def test_compiled_instances_make_the_python_instances_decisions(run, name, num_instances):
    """Instances run by the compiled loop, paused at every arrival (with prefix caching, keyed by the fleet's hash
    ids, which the routers read), against the Python instances (keyed by content hashes): the same routes, times,
    steps and prefix hits."""
    w, cfg, num_gpu_blocks = run
    runs = [Fleet(w, cfg, make_router(name, num_instances, 4), num_instances, num_gpu_blocks=num_gpu_blocks,
                  cost=COST, path=path) for path in ("compiled", "reference")]  # fmt: skip
    same_fleets(runs[0].run_together(), runs[1].run_together())


class Spy(Router):
    """Routes to instance (request id mod n); records what it reads and hears, and when."""

    name, reads_instances, reads_prefixes, hears_requests = "spy", True, True, True

    def __init__(self, num_instances):
        super().__init__(num_instances)
        self.heard, self.seen = [], []

    def route(self, request, loads):
        self.seen.append((request.arrival_s, [(x.num_running, x.num_waiting) for x in loads]))
        self.heard.append(("route", request.arrival_s, request.request_id))
        return request.request_id % self.num_instances

    def prefill_done(self, request_id):
        self.heard.append(("first token", request_id))

    def finished(self, request_id):
        self.heard.append(("finish", request_id))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.integers(1, 3), st.sampled_from(["compiled", "reference"]))
def test_a_router_hears_each_first_token_and_finish_in_time_order_before_later_arrivals(run, num_instances, path):
    w, cfg, num_gpu_blocks = run
    if path == "compiled":
        cfg = cfg.replace(enable_prefix_caching=False)
    spy = Spy(num_instances)
    result = Fleet(w, cfg, spy, num_instances, num_gpu_blocks=num_gpu_blocks, cost=COST, path=path).run()
    times = {("first token", i): t for i, t in enumerate(result.first_token_s)}
    times |= {("finish", i): t for i, t in enumerate(result.finish_s)}
    heard, routed = set(), set()
    for event in spy.heard:
        if event[0] == "route":  # by then, every event up to its arrival, and none after it, was heard
            assert heard == {e for e, t in times.items() if e[1] in routed and t <= event[1]}, event
            routed.add(event[2])
            continue
        assert event[1] in routed and event not in heard
        heard.add(event)
    told = [times[e] for e in spy.heard if e[0] != "route"]
    assert told == sorted(told)
    # everything that happened by the last arrival was heard, nothing after it
    last = w.arrival_s[-1]
    assert heard == {e for e, t in times.items() if t <= last}


@pytest.mark.parametrize("path", ["compiled", "reference"])
def test_a_router_hears_of_a_finish_in_the_step_running_at_an_arrival_before_the_next_arrival(path):
    """8 ms steps, requests of 3 output tokens dealt by id mod 2: request 0 (0 s) finishes at 0.024 s, in the step
    running when request 1 arrives (0.02 s); instance 0 then idles until request 2 (1 s), before which the router hears
    of the finish."""
    w = Workload(np.array([0.0, 0.02, 1.0]), [10, 10, 10], [3, 3, 3])
    cfg = EngineConfig().replace(async_scheduling=False, max_model_len=64)
    spy = Spy(2)
    Fleet(w, cfg, spy, 2, num_gpu_blocks=100, path=path).run()
    assert spy.heard == [("route", 0.0, 0), ("first token", 0), ("route", 0.02, 1), ("finish", 0), ("first token", 1),
                         ("finish", 1), ("route", 1.0, 2)]  # fmt: skip


def test_a_router_reads_each_instance_as_its_steps_started_before_the_arrival_leave_it():
    """Two instances, 8 ms steps: four requests at 0, 0, 0.005 and 0.02 s, of 3 output tokens each, dealt by id mod 2.
    A request routed but not yet joined counts as waiting; at 0.005 s each instance has started its first step
    (which admitted its request); at 0.02 s each has started its third (0.016 to 0.024 s), read as done: instance 1's
    request finished in it, instance 0's request 2 (joined at 0.008 s) still runs."""
    w = Workload(np.array([0.0, 0.0, 0.005, 0.02]), [10, 10, 10, 10], [3, 3, 3, 3])
    cfg = EngineConfig().replace(async_scheduling=False, max_model_len=64)
    spy = Spy(2)
    Fleet(w, cfg, spy, 2, num_gpu_blocks=100).run()
    assert spy.seen == [
        (0.0, [(0, 0), (0, 0)]),
        (0.0, [(0, 1), (0, 0)]),  # request 0 routed to instance 0, not yet joined: waiting
        (0.005, [(1, 0), (1, 0)]),
        (0.02, [(1, 0), (0, 0)]),
    ]


def test_least_loaded_alternates_requests_that_arrive_together():
    w = Workload(np.zeros(6), [10] * 6, [5] * 6)
    cfg = EngineConfig().replace(async_scheduling=False, max_model_len=64)
    result = Fleet(w, cfg, make_router("least-loaded", 3, 16), 3, num_gpu_blocks=100).run()
    assert result.instance_of.tolist() == [0, 1, 2, 0, 1, 2]


def test_dynamo_kv_sends_a_conversation_where_its_prefix_is_cached():
    """Request 0 and 2 share a 64-token prefix; request 1 another. Request 2 arrives once request 0 finished (its
    blocks cached at instance 0): the cost of instance 0 is 4 prefill blocks fewer, so it goes there."""
    hashes = tuple(np.array(h, dtype=np.int64) for h in ([1, 2, 3, 4], [9, 8, 7, 6], [1, 2, 3, 4, 5]))
    w = Workload(np.array([0.0, 0.0, 1.0]), [64, 64, 80], [2, 2, 2], hashes, 16)
    cfg = EngineConfig().replace(async_scheduling=False, max_model_len=256, enable_prefix_caching=True)
    fleet = Fleet(w, cfg, make_router("dynamo-kv", 2, 16), 2, num_gpu_blocks=100)
    result = fleet.run()
    assert result.instance_of.tolist()[2] == result.instance_of.tolist()[0]
    assert result.instances[result.instance_of[0]].steps["num_hit_tokens"].sum() == 64


def test_a_cache_view_counts_each_hash_cached_once_and_finds_what_is_cached():
    pool = BlockPool(10, enable_caching=True)
    pool.cache_full_blocks(pool.get_new_blocks(4), [b"a", b"b", b"a", b"c"])  # two blocks hold a
    view = CachedBlocks(pool)
    assert len(view) == 3 and b"a" in view and b"c" in view and b"d" not in view


def test_a_summary_counts_each_instance_and_splits_ttft_into_queue_and_prefill():
    w = Workload(np.linspace(0, 1, 40), [100] * 40, [20] * 40)
    cfg = EngineConfig().replace(async_scheduling=False, max_model_len=512)
    result = Fleet(w, cfg, make_router("round-robin", 4, 16), 4, num_gpu_blocks=60).run()
    s = result.summary()
    assert [i["num_requests"] for i in s["instances"]] == [10, 10, 10, 10]
    assert math.isclose(s["mean_ttft_queue_s"] + s["mean_ttft_prefill_s"], s["mean_ttft_s"])
    assert s["num_steps"] == sum(r.num_steps for r in result.instances)
    assert s["num_preemptions"] == sum(int(r.num_preemptions.sum()) for r in result.instances)


def test_an_instance_the_router_never_chooses_has_no_run():
    w = Workload(np.zeros(2), [10, 10], [2, 2])
    cfg = EngineConfig().replace(async_scheduling=False, max_model_len=64)
    result = Fleet(w, cfg, make_router("round-robin", 3, 16), 3, num_gpu_blocks=100).run()
    assert result.instances[2] is None
    assert result.summary()["instances"][2]["num_requests"] == 0


# ---------------------------------------------------------------- kvlab simulate --instances --router
def simulate(capsys, *flags) -> dict:
    assert main(["simulate", "--policy", "vllm", "--num-requests", "300", "--arrival-rate", "50", "--prompt-tokens",
                 "200", "--num-gpu-blocks", "400", "--json", *flags]) == 0  # fmt: skip
    return json.loads(capsys.readouterr().out)


def test_simulate_serves_a_fleet_and_a_fleet_of_one_as_the_engine(capsys):
    one = simulate(capsys)
    fleet_of_one = simulate(capsys, "--instances", "1", "--router", "llm-d")
    for key in ("mean_ttft_s", "p95_ttft_s", "mean_tpot_s", "num_steps", "num_preemptions", "makespan_s"):
        assert fleet_of_one[key] == one[key], key
    four = simulate(capsys, "--instances", "4", "--router", "least-loaded")
    assert four["num_instances"] == 4 and four["router"] == "least-loaded"
    assert sum(i["num_requests"] for i in four["instances"]) == 300
    assert four["mean_ttft_s"] < one["mean_ttft_s"]  # four pools of 400 blocks beside one


def test_simulate_writes_each_requests_instance(capsys, tmp_path):
    path = tmp_path / "requests.csv"
    out = simulate(capsys, "--instances", "3", "--requests-csv", str(path))
    lines = path.read_text().splitlines()
    assert lines[0].split(",")[-2:] == ["instance", "scheduling"]
    instances = [int(line.split(",")[-2]) for line in lines[1:]]
    assert instances[:6] == [0, 1, 2, 0, 1, 2]  # round robin, the default router
    assert [instances.count(k) for k in range(3)] == [i["num_requests"] for i in out["instances"]]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--instances", "0"], "--instances=0 is not allowed: must be an integer >= 1"),
        (["--instances", "2", "--max-concurrency", "4"], "--instances 2 and --max-concurrency 4 cannot be used"),
        (["--router", "llm-d", "--allocation", "max"], "--router llm-d and --allocation max cannot be used"),
        (["--router", "nearest"], "argument --router: invalid choice: 'nearest'"),
        (["--instances", "100000000"], "--instances=100000000 is not allowed: needs about"),
        (["--model", "google/gemma-3-27b-it", "--router", "dynamo-kv"], "google/gemma-3-27b-it has 7 KV cache groups"),
    ],
)
def test_simulate_refuses_a_fleet_it_cannot_serve_in_one_line(capsys, flags, message):
    try:
        code = main(["simulate", "--policy", "vllm", "--num-gpu-blocks", "100000", *flags])
    except SystemExit as exit_info:  # argparse's own refusals
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.sampled_from(["route", "first token", "finish"])), min_size=1,
                max_size=60), st.integers(1, 5))  # fmt: skip
def test_dynamo_kv_counts_a_prompt_no_other_shares_as_it_counts_any_prompt(events, num_instances):
    """Prompts whose blocks no other request has (a range of hashes, counted without lookups) route as the same
    blocks given as hashes (looked up in the worker's blocks and caches)."""
    fast, slow = (DynamoKv(num_instances, 16, seed=3) for _ in range(2))
    load = InstanceLoad(0, 0, 0, 0.0, frozenset(), 100)
    start, live, first_pending = 0, [], []
    for j, (num_prompt_tokens, event) in enumerate(events):
        if event == "route" or not live:
            blocks = range(start, start + num_prompt_tokens // 16)
            start = blocks.stop
            routed = [RoutedRequest(j, 0.0, num_prompt_tokens, hashes) for hashes in (blocks, tuple(blocks))]
            assert fast.route(routed[0], [load] * num_instances) == slow.route(routed[1], [load] * num_instances)
            live.append(j)
            first_pending.append(j)
        elif event == "first token" and first_pending:
            request_id = first_pending.pop(num_prompt_tokens % len(first_pending))
            fast.prefill_done(request_id), slow.prefill_done(request_id)
        else:
            request_id = live.pop(num_prompt_tokens % len(live))
            if request_id in first_pending:
                first_pending.remove(request_id)
            fast.finished(request_id), slow.finished(request_id)
        probe = range(start, start + 3)  # a request not yet routed
        probes = [RoutedRequest(-1, 0.0, 50, hashes) for hashes in (probe, tuple(probe))]
        assert fast.costs(probes[0], [load] * num_instances).tolist() == slow.costs(
            probes[1], [load] * num_instances).tolist()  # fmt: skip
