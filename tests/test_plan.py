"""`kvlab plan` (kvlab.studies.plan): its prunes are proofs, its twins twins, its recommendations hold when served
again on their own, and bad objectives are refused in one line."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import cli
from kvlab.core.capacity import plan_capacity
from kvlab.core.config import EngineConfig
from kvlab.core.cost import Batch, MeasuredStepCost, RooflineStepCost, make_step_cost
from kvlab.core.engine import simulate
from kvlab.core.models import get_gpu, get_model
from kvlab.core.workload import Workload
from kvlab.studies import plan
from kvlab.workloads import synthetic

MODEL, GPU = "Qwen/Qwen3-32B", "RTX-PRO-6000-Server-96GB"
OBJECTIVES = plan.Objectives(ttft_p95_s=2.0, tpot_p95_ms=60.0, e2e_p95_s=25.0)


def workload(n=400, rate=12.0, prompt=1500, output=300, seed=1) -> Workload:
    rng = np.random.default_rng(seed)
    arrival = synthetic.poisson_arrivals(n, rate, rng)
    prompts = np.maximum(1, synthetic.sample_lengths("gamma", n, rng, mean_tokens=prompt, cv=1.0))
    outputs = np.maximum(1, synthetic.sample_lengths("gamma", n, rng, mean_tokens=output, cv=1.0))
    return Workload(arrival, prompts, outputs)


DEPLOYMENT = plan.Deployment(get_model(MODEL), get_gpu(GPU), 16384)
SPACE = plan.SearchSpace(
    tensor_parallel_size=(1, 2, 4),
    data_parallel_size=(1,),
    max_num_seqs=(16, 128),
    max_num_batched_tokens=(512, 4096),
    block_size=(16,),
    kv_cache_dtype=("bf16",),
    async_scheduling=(True,),
    num_replicas=(1, 2),
)


@pytest.fixture(scope="module")
def heavy_plan():
    return plan.search(workload(), DEPLOYMENT, OBJECTIVES, SPACE, scheduler="serial")


def test_a_heavy_rate_is_pruned_served_or_proven_to_miss_and_the_counts_add_up(heavy_plan):
    """Under WHOLE_MAX_REQUESTS nothing is dropped: every candidate left is served in full or proven to miss on the
    first PROOF_FRACTION (here MIN_RUNG_REQUESTS) of the workload."""
    counts = heavy_plan.counts()
    assert sum(counts.values()) == SPACE.size == 24
    kinds = {r.reason.split(":")[0] for r in heavy_plan.results if r.status == "pruned"}
    assert kinds == {"rate"}  # 512 tokens a step cannot keep up (TP 4, with no Qwen3-32B profile, is timed from tables)
    assert counts["misses"] > 0 and counts["dropped"] == 0 and counts["meets"] == 0
    misses = [r for r in heavy_plan.results if r.status == "misses"]
    proven = [r for r in misses if r.reason.startswith("proven on the first 200 requests: ")]
    assert proven and all(r.served_requests == 200 and not r.metrics for r in proven)
    assert all(r.served_requests == 400 and r.metrics for r in misses if r not in proven)
    size, num_candidates, num_runs, _ = heavy_plan.rungs[0]
    assert (size, num_candidates) == (200, counts["misses"])  # every candidate served, its twins counted
    assert 0 < num_runs <= num_candidates  # a twin takes its first's run


@pytest.fixture(scope="module")
def llama_plan():
    """Llama-3.1-8B on 600 requests within p95 TTFT 0.5 s and TPOT 25 ms: some candidates meet, some miss."""
    deployment = plan.Deployment(get_model("meta-llama/Llama-3.1-8B"), get_gpu(GPU), 16384)
    w = workload(n=600, rate=6.0, prompt=1000, output=200, seed=2)
    objectives = plan.Objectives(ttft_p95_s=0.5, tpot_p95_ms=25.0)
    space = plan.SearchSpace(
        tensor_parallel_size=(1, 2),
        max_num_seqs=(32, 256),
        max_num_batched_tokens=(1024, 8192),
        block_size=(16,),
        kv_cache_dtype=("bf16",),
        async_scheduling=(True, False),
        num_replicas=(1, 2),
    )
    return deployment, w, objectives, space, plan.search(w, deployment, objectives, space, scheduler="serial")


def test_the_halving_drops_on_its_prefixes_and_loses_the_whole_plans_best_only_by_dropping_it(llama_plan):
    deployment, w, objectives, space, whole = llama_plan
    halving = plan.search(w, deployment, objectives, space, scheduler="serial", rung_fractions=plan.RUNG_FRACTIONS)
    assert whole.counts()["dropped"] == 0 and halving.counts()["dropped"] > 0
    assert [rung[0] for rung in halving.rungs] == [200, 600] == [rung[0] for rung in whole.rungs]
    assert all(r.reason.startswith("on the first 200 requests") for r in halving.results if r.status == "dropped")
    best = whole.ranked()[0].candidate
    status = {r.candidate: r.status for r in halving.results}
    assert halving.ranked()[0].candidate == best or status[best] == "dropped"
    by_candidate = {r.candidate: r.metrics for r in whole.results}
    assert all(r.metrics == by_candidate[r.candidate] for r in halving.results if r.status in ("meets", "misses"))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(30, 160),
    st.floats(2.0, 40.0),
    st.integers(0, 10_000),
    st.sampled_from([1, 2, 3]),
    st.booleans(),
    st.sampled_from([16, 256]),
    st.sampled_from([512, 4096]),
    st.integers(10, 90),
)
def test_a_prefix_run_is_the_whole_run_until_the_next_arrival_and_its_proofs_hold(
    n, rate, seed, replicas, async_scheduling, max_num_seqs, max_num_batched_tokens, percent
):
    """The engine is causal: on a prefix of its requests, a replica's run gives every request whose first token (finish)
    comes before the replica's next arrival the same first token (finish) as the whole run; and what proven_misses
    proves on the prefix, the whole run misses."""
    w = workload(n=n, rate=rate, prompt=800, output=150, seed=seed)
    candidate = plan.Candidate(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        async_scheduling=async_scheduling,
        num_replicas=replicas,
    )
    config = candidate.config(DEPLOYMENT.max_model_len)
    blocks = plan_capacity(DEPLOYMENT.model, DEPLOYMENT.gpu.memory_gib, DEPLOYMENT.max_model_len, config)[
        "num_gpu_blocks"
    ]
    m = max(1, n * percent // 100)
    whole_metrics, whole_first, whole_finish, _ = plan.served(w, DEPLOYMENT, candidate, blocks)
    _, first, finish, _ = plan.served(plan.prefix(w, m), DEPLOYMENT, candidate, blocks)
    nxt = [m + (rank - m) % replicas for rank in range(replicas)]
    cutoff = np.array([w.arrival_s[i] if i < n else np.inf for i in nxt])[np.arange(m) % replicas]
    assert np.array_equal(first[first < cutoff], whole_first[:m][first < cutoff])
    assert np.array_equal(finish[finish < cutoff], whole_finish[:m][finish < cutoff])
    objectives = plan.Objectives(
        ttft_p95_s=0.05 * (1 + seed % 40), tpot_p95_ms=20.0 + seed % 30, e2e_p95_s=2.0 + seed % 20
    )
    multi = int(np.sum(np.minimum(w.prompt_tokens + w.output_tokens, DEPLOYMENT.max_model_len) - w.prompt_tokens > 1))
    proof = (objectives, n, multi, w.arrival_s[m : m + replicas])
    proven = plan.proven_misses(plan.prefix(w, m), candidate, first, finish, DEPLOYMENT.max_model_len, proof)
    missed = objectives.misses(whole_metrics)
    for words in proven:
        name = words.split(" > ")[0]
        assert any(miss.startswith(name + " ") for miss in missed), (words, missed)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(30, 120),
    st.sampled_from([0.0, 20.0]),
    st.integers(0, 10_000),
    st.integers(1, 40),
    st.booleans(),
    st.sampled_from([16, 256]),
    st.integers(10, 90),
)
def test_under_a_closed_loop_a_prefix_run_is_the_whole_run_until_the_next_send_and_its_proofs_hold(
    n, rate, seed, max_concurrency, async_scheduling, max_num_seqs, percent
):
    """A closed loop (made at t=0, or Poisson): a prefix's run gives every request whose first token (finish) comes
    before the next request's send (closed_send, from the prefix's own run) the whole run's, sends included; and what
    proven_misses proves on the prefix, counted from the sends, the whole run misses."""
    w = workload(n=n, rate=rate or 1.0, prompt=800, output=150, seed=seed)
    if not rate:
        w = Workload(np.zeros(n), w.prompt_tokens, w.output_tokens)
    candidate = plan.Candidate(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=2048, async_scheduling=async_scheduling
    )
    config = candidate.config(DEPLOYMENT.max_model_len)
    blocks = plan_capacity(DEPLOYMENT.model, DEPLOYMENT.gpu.memory_gib, DEPLOYMENT.max_model_len, config)[
        "num_gpu_blocks"
    ]
    m = max(1, n * percent // 100)
    whole_metrics, whole_first, whole_finish, whole_send = plan.served(
        w, DEPLOYMENT, candidate, blocks, max_concurrency=max_concurrency
    )
    _, first, finish, send = plan.served(
        plan.prefix(w, m), DEPLOYMENT, candidate, blocks, max_concurrency=max_concurrency
    )
    cutoff = plan.closed_send(w.arrival_s[m], send, finish, max_concurrency)
    assert cutoff == whole_send[m]  # the next send, bit for bit, from the prefix's run alone
    assert np.array_equal(send, whole_send[:m])
    assert np.array_equal(first[first < cutoff], whole_first[:m][first < cutoff])
    assert np.array_equal(finish[finish < cutoff], whole_finish[:m][finish < cutoff])
    objectives = plan.Objectives(
        ttft_p95_s=0.02 * (1 + seed % 40), tpot_p95_ms=20.0 + seed % 30, e2e_p95_s=1.0 + seed % 9
    )
    multi = int(np.sum(np.minimum(w.prompt_tokens + w.output_tokens, DEPLOYMENT.max_model_len) - w.prompt_tokens > 1))
    proof = (objectives, n, multi, w.arrival_s[m : m + 1])
    proven = plan.proven_misses(
        plan.prefix(w, m), candidate, first, finish, DEPLOYMENT.max_model_len, proof, send, max_concurrency
    )
    missed = objectives.misses(whole_metrics)
    for words in proven:
        name = words.split(" > ")[0]
        assert any(miss.startswith(name + " ") for miss in missed), (words, missed)


# Candidates that differ only in their pools (block size, memory share, KV dtype) and their scheduling mode
POOL_SPACE = plan.SearchSpace(
    tensor_parallel_size=(2,),
    max_num_seqs=(256,),
    max_num_batched_tokens=(8192,),
    block_size=(16, 32),
    gpu_memory_utilization=(0.5, 0.9),
    kv_cache_dtype=("bf16", "fp8"),
    async_scheduling=(True, False),
    num_replicas=(1,),
)


def test_under_a_closed_loop_pool_twins_give_what_serving_each_gives():
    """Pool twins under a closed loop (never_binds at N in flight, never_refused from the first run's sends) are served
    once; their figures are those each gives served alone, bit for bit."""
    w = workload(n=300, rate=3.0, prompt=1500, output=300, seed=4)
    w = Workload(np.zeros(300), w.prompt_tokens, w.output_tokens)
    space = POOL_SPACE
    for n_max in (8, 200):
        result = plan.search(
            w, DEPLOYMENT, plan.Objectives(e2e_p95_s=1000.0), space, scheduler="serial", max_concurrency=n_max
        )
        served = [r for r in result.results if r.status in ("meets", "misses")]
        binds = [plan.never_binds(w, r.candidate, r.num_gpu_blocks, 16384, n_max) for r in served]
        if n_max == 8:  # 8 in flight at most: no pool binds, two families (async on, off) of 8
            assert all(binds) and sum(r.twin_of is not None for r in served) == 14
        else:  # found on the run, from its sends (never_refused)
            assert not any(binds) and sum(r.twin_of is not None for r in served) >= 4
        for r in served:
            assert plan.served(w, DEPLOYMENT, r.candidate, r.num_gpu_blocks, max_concurrency=n_max)[0] == r.metrics


def test_pool_twins_found_on_the_run_give_what_serving_each_gives():
    """Candidates that differ only in their pools, where the run of the largest proves no pool of theirs refuses a
    block (never_refused), are served once; their figures are those each gives served alone, bit for bit."""
    w = workload(n=300, rate=3.0, prompt=1500, output=300, seed=4)
    space = POOL_SPACE
    result = plan.search(w, DEPLOYMENT, plan.Objectives(e2e_p95_s=1000.0), space, scheduler="serial")
    served = [r for r in result.results if r.status in ("meets", "misses")]
    assert len(served) == 16 and sum(r.twin_of is not None for r in served) >= 8
    assert not any(plan.never_binds(w, r.candidate, r.num_gpu_blocks, 16384) for r in served)  # found on the run
    for r in served:
        assert plan.serve(w, DEPLOYMENT, r.candidate, r.num_gpu_blocks) == r.metrics


def test_never_refused_counts_every_request_present_at_its_longest():
    """Two requests of 100 + 60 tokens (11 blocks of 16 with the in-flight token's slot) present together from
    t = 1 to 2: 22 blocks, the null block apart; one at a time (the first finishes as the second arrives: both
    present at that instant) the same."""
    w = Workload(np.array([0.0, 1.0]), np.full(2, 100), np.full(2, 60))
    c = plan.Candidate(block_size=16)
    assert plan.never_refused(w, c, np.array([2.0, 3.0]), 23, 16384)
    assert not plan.never_refused(w, c, np.array([2.0, 3.0]), 22, 16384)
    assert not plan.never_refused(w, c, np.array([1.0, 3.0]), 22, 16384)  # a tie: both present
    assert plan.never_refused(w, c, np.array([0.5, 3.0]), 12, 16384)  # never together
    assert plan.never_refused(w, plan.Candidate(block_size=16, num_replicas=2), np.array([2.0, 3.0]), 12, 16384)


def test_every_lower_bound_is_below_what_the_engine_serves():
    """The rate prune's bounds (p95 TTFT, TPOT, E2E) hold for every candidate served in full, pruned or not."""
    w = workload(n=300)
    for candidate in SPACE.candidates(DEPLOYMENT.model):
        if candidate.tensor_parallel_size == 4:
            continue
        config = candidate.config(DEPLOYMENT.max_model_len)
        cost = plan.step_cost(DEPLOYMENT, config)[0]
        blocks = plan_capacity(DEPLOYMENT.model, DEPLOYMENT.gpu.memory_gib, DEPLOYMENT.max_model_len, config)[
            "num_gpu_blocks"
        ]
        budget = candidate.max_num_batched_tokens
        bounds = plan.lower_bounds(w, candidate, *plan.rate_bounds(cost, budget), DEPLOYMENT.max_model_len)
        served = plan.serve(w, DEPLOYMENT, candidate, blocks)
        for name, bound in bounds.items():
            assert bound <= served[name] * (1 + 1e-12), (candidate, name, bound, served[name])


def test_a_pruned_candidate_truly_fails_when_served(heavy_plan):
    pruned = [r for r in heavy_plan.results if r.status == "pruned" and r.reason.startswith("rate")]
    assert pruned
    w = workload()
    for r in pruned:
        served = plan.serve(w, DEPLOYMENT, r.candidate, r.num_gpu_blocks)
        assert OBJECTIVES.misses(served), r.candidate


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.integers(1, 8192),
    decodes=st.integers(0, 256),
    history=st.integers(0, 20000),
    prefills=st.integers(0, 4),
    tp=st.sampled_from([1, 2]),
)
def test_min_step_s_is_below_every_step_of_that_many_tokens(tokens, decodes, history, prefills, tp):
    config = EngineConfig().replace(tensor_parallel_size=tp)
    cost = make_step_cost("measured", model=DEPLOYMENT.model, gpu=DEPLOYMENT.gpu, config=config)
    assert isinstance(cost, MeasuredStepCost)
    decodes = min(decodes, tokens)
    prefill = tokens - decodes
    prefills = min(prefills, prefill) if prefill else 0
    if prefill and not prefills:
        prefills = 1
    pairs = prefill * history + prefill * (prefill + 1) // 2
    step = cost.step_s(
        Batch(tokens, decodes * (history + 1) + prefill + history, decodes, decodes * (history + 1), prefills, pairs)
    )
    assert cost.min_step_s(tokens) <= step
    roofline = RooflineStepCost.from_specs(DEPLOYMENT.model, DEPLOYMENT.gpu, config)
    assert roofline.min_step_s(tokens) <= roofline.step_s(Batch(tokens, history))


def test_twins_make_the_same_decisions_when_served_apart():
    """Candidates whose pool can never bind, apart in block size, KV dtype and memory share, serve alike."""
    model = get_model("meta-llama/Llama-3.1-8B")
    deployment = plan.Deployment(model, get_gpu(GPU), 4096)
    w = workload(n=300, rate=4.0, prompt=600, output=150)
    w = Workload(w.arrival_s, np.minimum(w.prompt_tokens, 3000), np.minimum(w.output_tokens, 1000))
    space = plan.SearchSpace(
        tensor_parallel_size=(1,),
        max_num_seqs=(32,),
        max_num_batched_tokens=(4096,),
        block_size=(16, 32),
        gpu_memory_utilization=(0.85, 0.9),
        kv_cache_dtype=("bf16", "fp8"),
        async_scheduling=(False,),
        num_replicas=(1,),
    )
    results = [plan.CandidateResult(c) for c in space.candidates(deployment.model)]
    plan.prune(w, deployment, plan.Objectives(e2e_p95_s=1000.0), results)
    groups = plan.twins(w, deployment, results)
    assert len(groups) == 1 and len(groups[0]) == 8
    served = [plan.serve(w, deployment, r.candidate, r.num_gpu_blocks) for r in results]
    assert len({r.num_gpu_blocks for r in results}) > 1
    assert all(s == served[0] for s in served)


def test_never_binds_at_its_threshold_and_a_binding_pool_is_no_twin():
    w = Workload(np.arange(10.0), np.full(10, 100), np.full(10, 60))  # 160 tokens: 10 blocks of 16
    four = plan.Candidate(max_num_seqs=4, block_size=16)
    assert plan.never_binds(w, four, 41, 16384)  # 4 running x 10 blocks, vLLM's null block apart
    assert not plan.never_binds(w, four, 40, 16384)
    assert not plan.never_binds(w, plan.Candidate(max_num_seqs=4, block_size=16, num_replicas=2), 20, 16384)
    assert plan.never_binds(w, plan.Candidate(max_num_seqs=4, block_size=32), 21, 16384)  # 5 blocks of 32
    assert not plan.never_binds(w, plan.Candidate(max_num_seqs=4, enable_prefix_caching=True), 10_000, 16384)


def test_lower_bounds_by_hand():
    """The fleet: three requests over 10 s, works 1 + 3 - 1 = 3, 5 + 1 - 1 = 5 and 9 + 2 - 1 = 10 tokens; k = floor(0.95 x 2) + 1
    = 2, so p95 E2E >= (3 + 5) / (2 replicas x 0.5 tokens/s) - 10 s = -2 (0) and TTFT >= (1 + 5) / 1 - 10 (0); at a
    tenth of the rate 70 s and 50 s."""
    w = Workload(np.array([0.0, 4.0, 10.0]), np.array([1, 5, 9]), np.array([3, 1, 2]))
    two = plan.Candidate(num_replicas=2)
    assert plan.fleet_bounds(w, two, 0.5, 0.02, 100) == {"ttft_p95_s": 0.0, "e2e_p95_s": 0.0, "tpot_p95_ms": 20.0}
    assert plan.fleet_bounds(w, two, 0.05, 0.02, 100) == pytest.approx(
        {"ttft_p95_s": 50.0, "e2e_p95_s": 70.0, "tpot_p95_ms": 20.0}
    )
    caching = plan.Candidate(num_replicas=2, enable_prefix_caching=True)  # prompts may hit: one token each
    assert plan.fleet_bounds(w, caching, 0.05, 0.02, 100)["e2e_p95_s"] == pytest.approx((1 + 2) / 0.1 - 10)
    long = Workload(np.array([0.0, 4.0, 10.0]), np.array([2, 2, 2]), np.array([10, 10, 1]))
    assert plan.fleet_bounds(long, two, 0.05, 0.02, 100)["e2e_p95_s"] == pytest.approx((2 + 11) / 0.1 - 10)
    # max_model_len 6 ends the first two at 6 tokens: 2 + 4 - 1 = 5 scheduled each
    assert plan.fleet_bounds(long, two, 0.05, 0.02, 6)["e2e_p95_s"] == pytest.approx((2 + 5) / 0.1 - 10)
    # each request alone, at 0.5 tokens/s: prompts 2, 10, 18 s; all its tokens (3, 5, 10) 6, 10, 20 s; the second
    # smallest of three bounds the p95 (np.percentile interpolates between the second and the third)
    assert plan.request_bounds(w, two, 0.5, 0.02, 100) == pytest.approx({"ttft_p95_s": 10.0, "e2e_p95_s": 10.0})
    assert plan.lower_bounds(w, two, 0.5, 0.02, 100) == pytest.approx(
        {"ttft_p95_s": 10.0, "e2e_p95_s": 10.0, "tpot_p95_ms": 20.0}
    )
    # budget 2 tokens a step: prompts take 1, 3, 5 steps of 20 ms; E2E those plus a step a further token
    small = plan.Candidate(max_num_batched_tokens=2)
    assert plan.request_bounds(w, small, 1e9, 0.02, 100) == pytest.approx({"ttft_p95_s": 0.06, "e2e_p95_s": 0.06})


def test_the_ttft_bound_is_within_2x_of_a_prefill_burst():
    """Not vacuous: long prompts arriving at once keep every step full, so the bound is near what is served."""
    w = Workload(np.zeros(40), np.full(40, 8000), np.ones(40, np.int64))
    c = plan.Candidate(tensor_parallel_size=1, max_num_seqs=64, max_num_batched_tokens=8192, async_scheduling=False)
    config = c.config(DEPLOYMENT.max_model_len)
    cost = plan.step_cost(DEPLOYMENT, config)[0]
    bound = plan.lower_bounds(w, c, plan.rate_bounds(cost, 8192)[0], cost.min_step_s(1), 16384)["ttft_p95_s"]
    blocks = plan_capacity(DEPLOYMENT.model, DEPLOYMENT.gpu.memory_gib, DEPLOYMENT.max_model_len, config)[
        "num_gpu_blocks"
    ]
    served = plan.serve(w, DEPLOYMENT, c, blocks)["ttft_p95_s"]
    assert served / 2 < bound <= served


def test_what_the_plan_recommends_meets_every_objective_served_again_on_its_own(llama_plan):
    deployment, w, objectives, space, result = llama_plan
    model = deployment.model
    ranked = result.ranked()
    assert ranked and result.counts()["misses"] + result.counts()["dropped"] > 0
    assert [r.candidate.num_gpus for r in ranked] == sorted(r.candidate.num_gpus for r in ranked)
    for r in ranked:
        config = r.candidate.config(deployment.max_model_len)
        blocks = plan_capacity(model, deployment.gpu.memory_gib, deployment.max_model_len, config)["num_gpu_blocks"]
        again = plan.serve(w, deployment, r.candidate, blocks)
        assert again == r.metrics and not objectives.misses(again)
    out = plan.summary(result, top=3)
    assert out["best"]["vllm_serve"].startswith("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size")
    assert "--kv-cache-dtype bfloat16 " in out["best"]["vllm_serve"]
    assert len(out["ranked"]) == min(3, len(ranked))
    json.dumps(out)


def test_a_pool_that_cannot_hold_max_model_len_is_pruned_as_vllm_refuses_to_start():
    deployment = plan.Deployment(get_model(MODEL), get_gpu("RTX-4090-24GB"), 32768)
    results = [plan.CandidateResult(plan.Candidate())]
    plan.prune(workload(n=20), deployment, OBJECTIVES, results)
    assert results[0].status == "pruned" and results[0].reason.startswith("capacity: vLLM would not start")


def test_processes_and_dask_give_the_serial_plan():
    from distributed import LocalCluster

    w = workload(n=250)
    space = plan.SearchSpace(
        tensor_parallel_size=(2,),
        max_num_seqs=(16, 128),
        max_num_batched_tokens=(4096,),
        block_size=(16,),
        kv_cache_dtype=("bf16",),
        async_scheduling=(True, False),
        num_replicas=(1, 2),
    )
    rows = lambda p: [(r["status"], r["reason"], r.get("e2e_p95_s")) for r in p.rows()]  # noqa: E731
    serial = rows(plan.search(w, DEPLOYMENT, OBJECTIVES, space, scheduler="serial"))
    assert rows(plan.search(w, DEPLOYMENT, OBJECTIVES, space, scheduler="processes", max_workers=2)) == serial
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        assert rows(plan.search(w, DEPLOYMENT, OBJECTIVES, space, scheduler=cluster.scheduler_address)) == serial


# ---------------------------------------------------------------- the command line
BASE = [
    "plan",
    "--model",
    "meta-llama/Llama-3.1-8B",
    "--gpu",
    GPU,
    "--arrival-rate",
    "4",
    "--num-requests",
    "300",
    "--max-model-len",
    "16384",
    "--tensor-parallel-size",
    "1",
    "--max-num-seqs",
    "64,256",
    "--max-num-batched-tokens",
    "8192",
    "--block-size",
    "16",
    "--kv-cache-dtype",
    "bf16",
    "--replicas",
    "1",
    "--scheduler",
    "serial",
]


def test_the_command_prints_the_plan_and_its_json(capsys):
    assert cli.main([*BASE, "--slo-ttft-p95-s", "1", "--slo-tpot-p95-ms", "40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["search"]["num_candidates"] == 4 and out["objectives"] == {"ttft_p95_s": 1.0, "tpot_p95_ms": 40.0}
    assert out["step_cost"]["measured"] and "LLMServingSim" in out["step_cost"]["source"]
    assert out["step_cost"]["fidelity"][0]["label"] == "Llama-3.1-8B"
    assert cli.main([*BASE, "--slo-ttft-p95-s", "1", "--slo-tpot-p95-ms", "40"]) == 0
    text = capsys.readouterr().out
    assert "best                 1 x: vllm serve meta-llama/Llama-3.1-8B" in text
    assert "why the others failed" in text and "step cost checked   against a real vLLM run" in text


def test_one_in_flight_serves_each_request_alone_back_to_back_and_ranks_by_completed_requests():
    """A closed loop of N=1 over 4 requests made at t=0: each request is served alone, sent when the one before
    finishes, so its TTFT and E2E (from its send) are those of the request served alone in an empty engine, and the
    candidate completes 4 requests in the sum of their E2E; the 2-replica candidates are pruned (one replica's loop
    only); the two served rank by completed requests/s per GPU."""
    deployment = plan.Deployment(get_model("meta-llama/Llama-3.1-8B"), get_gpu(GPU), 16384)
    w = Workload(np.zeros(4), np.array([100, 300, 50, 200]), np.array([5, 3, 8, 2]))
    space = plan.SearchSpace(
        tensor_parallel_size=(1,),
        max_num_seqs=(64,),
        max_num_batched_tokens=(8192,),
        block_size=(16,),
        kv_cache_dtype=("bf16",),
        async_scheduling=(True, False),
        num_replicas=(1, 2),
    )
    result = plan.search(w, deployment, plan.Objectives(e2e_p95_s=100.0), space, scheduler="serial", max_concurrency=1)
    pruned = [r for r in result.results if r.status == "pruned"]
    assert [r.candidate.num_replicas for r in pruned] == [2, 2]
    assert all(r.reason.startswith("closed loop: 2 replicas share the client's 1 in flight") for r in pruned)
    ranked = result.ranked()
    assert len(ranked) == 2
    for r in ranked:
        config = r.candidate.config(deployment.max_model_len)
        cost = plan.step_cost(deployment, config)[0]
        alone = [
            simulate(
                Workload(np.zeros(1), w.prompt_tokens[i : i + 1], w.output_tokens[i : i + 1]),
                config,
                num_gpu_blocks=r.num_gpu_blocks,
                cost=cost,
            )  # fmt: skip
            for i in range(4)
        ]
        ttft = np.array([a.first_token_s[0] for a in alone])
        e2e = np.array([a.finish_s[0] for a in alone])
        assert r.metrics["ttft_p95_s"] == pytest.approx(np.percentile(ttft, 95), rel=1e-12)
        assert r.metrics["e2e_p95_s"] == pytest.approx(np.percentile(e2e, 95), rel=1e-12)
        assert r.metrics["mean_e2e_s"] == pytest.approx(e2e.mean(), rel=1e-12)
        assert r.metrics["requests_per_s"] == pytest.approx(4 / e2e.sum(), rel=1e-12)
        _, _, finish, send = plan.served(w, deployment, r.candidate, r.num_gpu_blocks, max_concurrency=1)
        assert send[0] == 0 and np.array_equal(send[1:], finish[:-1])
    assert ranked[0].metrics["requests_per_s"] >= ranked[1].metrics["requests_per_s"]
    rows = {row["async_scheduling"]: row for row in result.rows() if row["status"] == "meets"}
    for r in ranked:
        assert rows[r.candidate.async_scheduling]["requests_per_s_per_gpu"] == r.metrics["requests_per_s"]


CLOSED = [
    "plan",
    "--model",
    "meta-llama/Llama-3.1-8B",
    "--gpu",
    GPU,
    "--num-requests",
    "40",
    "--max-model-len",
    "16384",
    "--tensor-parallel-size",
    "1",
    "--max-num-seqs",
    "64",
    "--max-num-batched-tokens",
    "8192",
    "--block-size",
    "16",
    "--kv-cache-dtype",
    "bf16",
    "--scheduler",
    "serial",
    "--slo-e2e-p95-s",
    "60",
    "--max-concurrency",
    "4",
]


def test_the_command_plans_a_closed_loop_and_says_so(capsys):
    """--max-concurrency: requests made at t=0 (no --arrival-rate), the JSON's max_concurrency, no rate, the rows'
    requests/s per GPU the candidates' own; the default replicas beyond 1 pruned with the note; the text's workload
    line names vLLM bench's flag."""
    assert cli.main([*CLOSED, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_concurrency"] == 4 and out["workload"]["rate_per_s"] is None
    assert out["workload"]["name"].startswith("synthetic (all made at t=0, seed 0;")
    assert out["search"]["counts"]["meets"] == 2 and out["failed"]["by_kind"] == {"pruned: closed loop": 6}
    assert all(row["requests_per_s_per_gpu"] == row["requests_per_s"] > 0 for row in out["ranked"])  # 1 GPU each
    assert out["best"]["requests_per_s"] == out["ranked"][0]["requests_per_s"]
    assert [row["requests_per_s"] for row in out["ranked"]] == sorted(
        (row["requests_per_s"] for row in out["ranked"]), reverse=True
    )
    assert cli.main(CLOSED) == 0
    text = capsys.readouterr().out
    assert (
        "40 requests in a closed loop of at most 4 in flight, each sent in order as one finishes (vllm bench serve "
        "--max-concurrency 4; --request-rate inf: all made at t=0); latencies count from the send" in text
    )
    assert "ranked by completed requests/s per GPU" in text
    assert cli.main([*BASE, "--slo-e2e-p95-s", "60", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_concurrency"] is None  # the open loop's plan


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-concurrency", "0"], "--max-concurrency=0 is not allowed: must be a whole number of requests >= 1"),
        (
            ["--replicas", "2,3"],
            "--replicas 2,3 is not allowed with --max-concurrency: kvlab serves one replica's closed loop",
        ),
    ],
)
def test_a_bad_closed_loop_is_refused_in_one_line(capsys, flags, message):
    assert cli.main([*CLOSED, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "kvlab plan needs at least one objective: --slo-ttft-p95-s, --slo-tpot-p95-ms or --slo-e2e-p95-s"),
        (["--slo-ttft-p95-s", "0"], "--slo-ttft-p95-s 0 is not allowed: an objective must be a finite number > 0"),
        (["--slo-tpot-p95-ms", "-5"], "--slo-tpot-p95-ms -5 is not allowed: an objective must be a finite number > 0"),
        (["--slo-e2e-p95-s", "nan"], "--slo-e2e-p95-s nan is not allowed: an objective must be a finite number > 0"),
        (
            ["--slo-e2e-p95-s", "5", "--max-num-seqs", "64,x"],
            "--max-num-seqs '64,x' is not allowed: 'x' is not one of whole numbers",
        ),
        (
            ["--slo-e2e-p95-s", "5", "--async-scheduling", "yes"],
            "--async-scheduling 'yes' is not allowed: 'yes' is not one of on or off",
        ),
        (["--slo-e2e-p95-s", "5", "--replicas", "1,1"], "--replicas '1,1' is not allowed: a value is repeated"),
        (["--slo-e2e-p95-s", "5", "--replicas", "0"], "--replicas=0 is not allowed: must be an integer >= 1"),
        (["--slo-e2e-p95-s", "5", "--kv-cache-dtype", "fp9"], "--kv-cache-dtype='fp9' is not allowed: must be one of"),
        (
            ["--slo-e2e-p95-s", "5", "--model", "google/gemma-3-27b-it"],
            "kvlab plan cannot plan google/gemma-3-27b-it yet: its sliding-window layers make vLLM's hybrid KV cache",
        ),
        (
            ["--slo-e2e-p95-s", "5", "--model", "Qwen/Qwen3-Next-80B-A3B-Instruct"],
            "kvlab plan cannot plan Qwen/Qwen3-Next-80B-A3B-Instruct yet: its linear-attention (Mamba) layers make",
        ),
        (
            ["--slo-e2e-p95-s", "5", "--model", "meta-llama/Llama-4-Scout-17B-16E-Instruct"],
            "kvlab plan cannot plan meta-llama/Llama-4-Scout-17B-16E-Instruct yet: its chunked-attention layers make",
        ),
    ],
)
def test_bad_objectives_and_lists_are_one_line(capsys, flags, message):
    assert cli.main([*BASE, *flags]) == 2  # a flag given again overrides BASE's
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_prompt_longer_than_max_model_len_is_refused_with_the_fix(capsys):
    argv = [a if a != "16384" else "500" for a in BASE]
    assert cli.main([*argv, "--slo-e2e-p95-s", "5"]) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"--max-model-len=500 is not allowed: must exceed the workload's longest prompt, ([\d,]+) tokens "
        r"\(vLLM refuses a prompt of 500 tokens or more\); give --max-model-len ([\d,]+) or more",
        err,
    )


def test_a_model_no_profile_measures_is_refused_unless_the_roofline_is_allowed(capsys):
    argv = [
        "plan",
        "--model",
        MODEL,
        "--gpu",
        "A40-48GB",  # vidur's profiles time other models' linear layers there; no operator tables
        "--arrival-rate",
        "2",
        "--num-requests",
        "50",
        "--slo-e2e-p95-s",
        "30",
        "--tensor-parallel-size",
        "4",
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        "2048",
        "--block-size",
        "16",
        "--kv-cache-dtype",
        "bf16",
        "--replicas",
        "1",
        "--async-scheduling",
        "on",
        "--max-model-len",
        "16384",
        "--scheduler",
        "serial",
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "kvlab plan: error: --model='Qwen/Qwen3-32B' is not allowed: has no operator profile or operator "
            "table that times it on A40-48GB at tensor parallel size 4"
        )
        and "--allow-roofline" in err
    )
    assert cli.main([*argv, "--allow-roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert not out["step_cost"]["measured"] and out["step_cost"]["warning"].startswith("planned on the roofline")
    assert out["step_cost"]["fidelity"] == [] and "roofline" in out["step_cost"]["source"]


def test_a_config_json_is_planned_with_its_parameters_counted_or_given(capsys):
    config = str(Path(__file__).parent / "data" / "configs" / "llama-3.1-8b-instruct.json")
    argv = [a if a != "meta-llama/Llama-3.1-8B" else config for a in BASE]
    argv[argv.index("--model")] = "--config"
    assert cli.main([*argv, "--slo-e2e-p95-s", "30", "--allow-roofline", "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    # Llama-3.1-8B-Instruct has Llama-3.1-8B's layer shapes: that model's profile times it
    assert counted["step_cost"]["measured"] and counted["search"]["num_candidates"] == 4
    assert "layer shapes" in counted["step_cost"]["source"]
    assert cli.main([*argv, "--slo-e2e-p95-s", "30", "--allow-roofline", "--num-params-b", "8.03", "--json"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert given["search"]["num_candidates"] == 4
    assert cli.main([*argv, "--slo-e2e-p95-s", "30", "--allow-roofline", "--num-params-b", "-1"]) == 2
    assert "--num-params-b=-1.0 is not allowed" in capsys.readouterr().err


def test_an_objective_no_request_can_meet_alone_is_pruned_by_proof_without_serving(monkeypatch):
    served = []
    monkeypatch.setattr(plan, "serve", lambda *args, **kwargs: served.append(args) or {})
    light = workload(n=100, rate=0.2)  # the fleet's bound is 0 s: every proof is a request's own
    result = plan.search(light, DEPLOYMENT, plan.Objectives(ttft_p95_s=1e-9), SPACE, scheduler="serial")
    assert served == [] and result.counts()["pruned"] == SPACE.size
    rate = [r.reason for r in result.results if r.reason.startswith("rate")]
    assert rate and all("p95 TTFT is at least" in why and "(each request's own work)" in why for why in rate)


MOE = plan.Deployment(get_model("Qwen/Qwen3-30B-A3B-Instruct-2507"), get_gpu(GPU), 16384)


def test_a_moe_model_is_planned_on_data_parallel_ranks_too_and_their_bounds_hold():
    space = plan.SearchSpace(
        tensor_parallel_size=(1,),
        data_parallel_size=(1, 2),
        max_num_seqs=(64,),
        max_num_batched_tokens=(512, 2048),
        block_size=(16,),
        kv_cache_dtype=("bf16",),
        async_scheduling=(True, False),
        num_replicas=(1,),
    )
    w = workload(n=150, rate=20.0)
    ranks = [c for c in space.candidates(MOE.model) if c.data_parallel_size == 2]
    assert len(ranks) == 4 and len(space.candidates(DEPLOYMENT.model)) == 4  # the dense model: DP 1 only
    for candidate in ranks:
        assert candidate.num_gpus == 2 and "DP 2 + EP" in candidate.label()
        assert "--data-parallel-size 2 --enable-expert-parallel" in candidate.serve_command(MOE.model.name, 16384)
        config = candidate.config(MOE.max_model_len)
        assert config.parallel.enable_expert_parallel
        cost = plan.step_cost(MOE, config)[0]
        blocks = plan_capacity(MOE.model, MOE.gpu.memory_gib, MOE.max_model_len, config)["num_gpu_blocks"]
        tokens_per_s, shortest_s = plan.rate_bounds(cost, candidate.max_num_batched_tokens, 2)
        bounds = plan.lower_bounds(w, candidate, tokens_per_s, shortest_s, MOE.max_model_len)
        served = plan.serve(w, MOE, candidate, blocks)
        for name, bound in bounds.items():
            assert bound <= served[name] * (1 + 1e-12), (candidate, name, bound, served[name])


def test_data_parallel_ranks_for_a_dense_model_are_refused_in_one_line(capsys):
    flags = ["--arrival-rate", "5", "--num-requests", "50", "--slo-e2e-p95-s", "10", "--data-parallel-size", "1,2"]
    assert cli.main(["plan", "--model", MODEL, "--gpu", GPU, *flags]) == 2
    err = capsys.readouterr().err
    assert "--data-parallel-size 1,2 is not allowed for Qwen/Qwen3-32B: it is dense" in err and err.count("\n") == 1


def test_the_serve_command_names_online_fp8_and_not_a_checkpoints_own_quantization():
    candidate = plan.Candidate()
    assert candidate.serve_command("m", 4096, "fp8").startswith("vllm serve m --quantization fp8 ")
    assert "--quantization" not in candidate.serve_command("m", 4096, "mxfp4")
    assert "--quantization" not in candidate.serve_command("m", 4096)
