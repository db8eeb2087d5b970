"""kvlab.core.batching: the event-driven batching model against the per-step loop and by hand."""

import numpy as np
import pandas as pd
import pytest
import stepwise
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import workloads
from kvlab.core import batching as simulator
from kvlab.core import service_time
from kvlab.sections import s02_batching as section
from kvlab.workloads import Workload, synthetic


def workload(arrival_s, output_tokens):
    return Workload(np.asarray(arrival_s, float), np.zeros(len(output_tokens), int), np.asarray(output_tokens))


# ---------------------------------------------------------------- by hand
def test_continuous_by_hand():
    # 2 slots, 1 s per token: r2 takes the slot r1 frees at 1 s; r3 waits for a slot until 3 s
    result = simulator.simulate(
        workload([0, 0, 0, 1], [3, 1, 2, 1]), "continuous", max_num_seqs=2, cost=service_time.TokenServiceTime(1000)
    )
    assert result.start_s.tolist() == [0, 0, 1, 3]
    assert result.finish_s.tolist() == [3, 1, 3, 4]
    assert result.latency_s.tolist() == [3, 1, 3, 3]


def test_static_by_hand():
    # the first batch takes the first 2 of 3 arrived; r1 (1 token) holds its slot until r0's 3 tokens are done
    result = simulator.simulate(
        workload([0, 0, 0, 1], [3, 1, 2, 1]), "static", max_num_seqs=2, cost=service_time.TokenServiceTime(1000)
    )
    assert result.start_s.tolist() == [0, 0, 3, 3]
    assert result.done_s.tolist() == [3, 1, 5, 4]
    assert result.finish_s.tolist() == [3, 3, 5, 5]
    assert result.slot.tolist() == [0, 1, 0, 1]
    summary = result.summary()
    assert summary["makespan_s"] == 5 and summary["busy_slot_s"] == 7
    assert summary["idle_share"] == pytest.approx(1 - 7 / 10)
    assert summary["mean_latency_s"] == pytest.approx((3 + 3 + 5 + 4) / 4)
    assert summary["mean_queue_s"] == pytest.approx((0 + 0 + 3 + 2) / 4)
    assert summary["throughput_rps"] == pytest.approx(4 / 5)


@pytest.mark.parametrize("policy, finish", [("continuous", [3, 1, 3, 4]), ("static", [3, 3, 5, 5])])
def test_the_per_step_loop_by_hand(policy, finish):
    # the oracle itself, on the hand-worked example above
    slow = stepwise.simulate_stepwise([0, 0, 0, 1], [3, 1, 2, 1], policy, 2, 1000)
    assert slow["finish_s"].tolist() == finish


def test_a_policy_object_plugs_in():
    class EveryoneAtOnce:  # unlimited slots: a request never waits
        name = "unbounded"

        def schedule(self, arrival_s, service_s, max_num_seqs):
            return simulator.Schedule(arrival_s, arrival_s + service_s, np.arange(len(arrival_s)))

    result = simulator.simulate(
        workload([0, 0, 1], [2, 1, 1]), EveryoneAtOnce(), cost=service_time.TokenServiceTime(1000)
    )
    assert result.policy == "unbounded" and result.latency_s.tolist() == [2, 1, 1]
    with pytest.raises(ValueError, match="^policy=3 is not allowed"):
        simulator.simulate(workload([0], [1]), 3)


def test_static_batch_waits_for_next_arrival_when_none_is_waiting():
    # idle gap: nothing waits at 2 s, so the next batch starts at 10 s with the two that arrived by then
    result = simulator.simulate(
        workload([0, 10, 10, 11], [2, 1, 1, 1]), "static", max_num_seqs=4, cost=service_time.TokenServiceTime(1000)
    )
    assert result.start_s.tolist() == [0, 10, 10, 11]
    assert result.finish_s.tolist() == [2, 11, 11, 12]


def test_summary_p95_is_numpys_linear_percentile_and_makespan_starts_at_first_arrival():
    result = simulator.simulate(
        workload([5, 5, 6], [1, 2, 4]), "continuous", max_num_seqs=3, cost=service_time.TokenServiceTime(500)
    )
    summary = result.summary()
    assert summary["p95_latency_s"] == pytest.approx(np.percentile([0.5, 1.0, 2.0], 95))
    assert summary["makespan_s"] == pytest.approx(8.0 - 5.0)
    assert set(summary) == set(simulator.SUMMARY_KEYS)


def test_equal_lengths_arriving_together_make_the_policies_identical():
    w = workload(np.zeros(40), np.full(40, 150))
    static, continuous = (simulator.simulate(w, p).summary() for p in ("static", "continuous"))
    assert static == continuous
    assert static["makespan_s"] == pytest.approx(40 / 8 * 150 * 0.008)


# ---------------------------------------------------------------- against the per-step reference loop
@st.composite
def small_workloads(draw):
    """Arrivals on a 1/8 s grid (exact in binary, so ties are exact), with ties (gap 0) and idle gaps."""
    n = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.sampled_from([0, 0, 0, 1, 2, 3, 8, 40, 200]), min_size=n, max_size=n))
    first = draw(st.integers(0, 16))
    arrival = (first + np.cumsum([0] + gaps[1:])) / 8
    tokens = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    return workload(arrival, tokens)


@settings(max_examples=300, deadline=None)
@given(
    w=small_workloads(),
    policy=st.sampled_from(["static", "continuous"]),
    slots=st.integers(1, 4),
    ms_per_token=st.sampled_from([125, 250, 500, 1000, 2000]),
)
def test_event_driven_equals_the_per_step_loop(w, policy, slots, ms_per_token):
    fast = simulator.simulate(w, policy, max_num_seqs=slots, cost=service_time.TokenServiceTime(ms_per_token))
    slow = stepwise.simulate_stepwise(w.arrival_s, w.output_tokens, policy, slots, ms_per_token)
    np.testing.assert_array_equal(fast.start_s, slow["start_s"])
    np.testing.assert_array_equal(fast.finish_s, slow["finish_s"])


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_event_driven_matches_the_per_step_loop_on_the_article_workload(policy):
    # non-dyadic times (8 ms tokens, Poisson arrivals): equal up to the rounding of repeated additions
    w = synthetic.article_s2_workload(300, 11.0, "article", np.random.default_rng(3))
    fast = simulator.simulate(w, policy)
    slow = stepwise.simulate_stepwise(w.arrival_s, w.output_tokens, policy, 8, 8.0)
    np.testing.assert_allclose(fast.start_s, slow["start_s"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(fast.finish_s, slow["finish_s"], rtol=0, atol=1e-6)


@settings(max_examples=150, deadline=None)
@given(w=small_workloads(), policy=st.sampled_from(["static", "continuous"]), slots=st.integers(1, 5))
def test_schedule_invariants(w, policy, slots):
    r = simulator.simulate(w, policy, max_num_seqs=slots, cost=service_time.TokenServiceTime(250))
    service = w.output_tokens * 0.25
    assert np.all(r.start_s >= r.arrival_s)
    assert np.all(np.diff(r.start_s) >= 0)  # first come, first served
    assert np.all(r.done_s == r.start_s + service)
    assert np.all(r.finish_s >= r.done_s)
    assert np.all((r.slot >= 0) & (r.slot < slots))
    for s in range(slots):  # a slot holds one request at a time
        mine = np.flatnonzero(r.slot == s)
        assert np.all(r.start_s[mine][1:] >= r.finish_s[mine][:-1])
    if policy == "continuous":
        assert np.array_equal(r.finish_s, r.done_s)
    summary = r.summary()
    assert summary["busy_slot_s"] == pytest.approx(service.sum())
    assert 0 <= summary["idle_share"] < 1


@settings(max_examples=100, deadline=None)
@given(w=small_workloads(), slots=st.integers(1, 5))
def test_continuous_never_waits_longer_than_static(w, slots):
    static = simulator.simulate(w, "static", max_num_seqs=slots, cost=service_time.TokenServiceTime(250))
    continuous = simulator.simulate(w, "continuous", max_num_seqs=slots, cost=service_time.TokenServiceTime(250))
    assert np.all(continuous.start_s <= static.start_s)


# ---------------------------------------------------------------- the article's experiment
def test_lengths_of_the_article_mixture():
    tokens = workloads.sample_lengths("article-s2", 100_000, np.random.default_rng(0))
    short, long = tokens[tokens <= 200], tokens[tokens >= 400]
    assert len(short) + len(long) == len(tokens)
    assert (short.min(), short.max(), long.min(), long.max()) == (40, 200, 400, 1000)
    assert len(long) / len(tokens) == pytest.approx(0.15, abs=0.005)
    assert tokens.mean() == pytest.approx(0.85 * 120 + 0.15 * 700, rel=0.01)


def test_gamma_lengths_have_the_asked_mean_and_spread():
    tokens = workloads.sample_lengths("gamma", 200_000, np.random.default_rng(0), mean_tokens=207, cv=1.0)
    assert tokens.mean() == pytest.approx(207, rel=0.01)
    assert tokens.std() / tokens.mean() == pytest.approx(1.0, rel=0.02)
    assert np.all(workloads.sample_lengths("gamma", 5, np.random.default_rng(0), mean_tokens=207, cv=0) == 207)


def test_same_seed_same_figures():
    a = section.seed_runs(section.Experiment(), 3, first_seed=5)
    b = section.seed_runs(section.Experiment(), 3, first_seed=5)
    assert a.equals(b)


def test_band_table_band_percentile_and_ledger_rows():
    runs = section.seed_runs(section.Experiment(num_requests=100), 20)
    bands = section.band_table(runs, "mixed")
    static = runs.loc[runs["policy"] == "static", "mean_latency_s"].to_numpy()
    row = bands.loc[("static", "mean_latency_s")]
    assert (row["band_low"], row["band_high"]) == tuple(np.percentile(static, [5, 95]))
    assert row["article"] == 151.36 and row["median"] == np.median(static)
    assert row["article_percentile"] == 100 * np.count_nonzero(static <= 151.36) / len(static)
    assert row["inside"] == (row["band_low"] <= 151.36 <= row["band_high"])
    rows = section.ledger_rows(bands, "mixed")
    assert len(rows) == 10 and set(rows["row"]) == {"static", "continuous"}
    first = rows.set_index(["row", "column"]).loc[("static", "mean_latency_s")]
    assert (first["band_low"], first["band_high"], first["reproduced"]) == (
        row["band_low"],
        row["band_high"],
        row["median"],
    )


def test_a_percentile_on_a_half_reads_as_the_table_rounds_it():
    """57 of 200 seeds at or below the article's value: the table's 28.5 and the ledger's 29th, not the 28th that
    100 x mean() (28.499999999999996) would give."""
    row = pd.Series({"article_percentile": 100.0 * 57 / 200, "num_seeds": 200})
    assert row["article_percentile"] == 28.5
    assert section.band_note(row) == "The article's value lies at the 29th percentile of kvlab's 200 seeds."


def test_ratio_runs_are_static_over_continuous_per_seed():
    runs = section.seed_runs(section.Experiment(num_requests=50), 3)
    ratio = section.ratio_runs(runs)
    static = runs[runs["policy"] == "static"].set_index("seed")["mean_latency_s"]
    continuous = runs[runs["policy"] == "continuous"].set_index("seed")["mean_latency_s"]
    np.testing.assert_allclose(ratio.set_index("seed")["mean_latency_ratio"], static / continuous)
    assert set(ratio["policy"]) == {"static vs continuous"}


def test_article_tables_are_the_ledgers():
    assert section.article_table("equal150").loc["static", "makespan_s"] == 91.0
    assert list(section.article_table("slots").columns) == ["busy_slot_s", "idle_pct"]
    with pytest.raises(ValueError, match="^table='nope' is not allowed"):
        section.article_table("nope")
    with pytest.raises(ValueError, match="^low_pct=95.0 is not allowed"):
        section.band_table(section.seed_runs(section.Experiment(num_requests=10), 2), "mixed", low_pct=95, high_pct=5)


def test_variance_sweep_opens_the_gap():
    sweep = section.variance_sweep(section.Experiment(num_requests=200), [0.0, 1.5], 2)
    assert sweep.loc["gamma cv=0", "ratio"] < 1.2
    assert sweep.loc["gamma cv=1.5", "ratio"] > 2
    assert list(sweep.index) == ["gamma cv=0", "gamma cv=1.5", "article mix"]


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_num_seqs": 0}, "max_num_seqs=0 is not allowed: must be an integer >= 1"),
        ({"max_num_seqs": -3}, "max_num_seqs=-3 is not allowed"),
        ({"policy": "greedy"}, "policy='greedy' is not allowed: must be one of static, continuous"),
    ],
)
def test_bad_parameters_name_themselves(kwargs, message):  # a bad ms_per_token: TokenServiceTime's own check
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        simulator.simulate(workload([0], [1]), **kwargs)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: synthetic.article_s2_workload(10, 0, "article", np.random.default_rng(0)), "arrival_rate=0"),
        (lambda: synthetic.article_s2_workload(10, 11, "zipf", np.random.default_rng(0)), "lengths='zipf'"),
        (lambda: synthetic.article_s2_workload(0, 11, "article", np.random.default_rng(0)), "num_requests=0"),
        (lambda: workloads.sample_lengths("constant", 3, np.random.default_rng(0), tokens=0), "tokens=0"),
        (lambda: workload([0, 1], [5, 0]), r"output_tokens\[1\]=0"),
        (lambda: workload([], []), "num_requests=0"),
    ],
)
def test_bad_workloads_name_the_parameter(call, message):
    with pytest.raises(ValueError, match="^" + message):
        call()


def test_the_cost_model_sets_the_service_time():
    w = workload([0, 1], [5, 3])
    by_cost = simulator.simulate(w, "static", cost=service_time.TokenServiceTime(4)).summary()
    assert by_cost["busy_slot_s"] == pytest.approx(8 * 0.004)
    assert (
        simulator.simulate(w, "static").summary()
        == simulator.simulate(w, "static", cost=service_time.TokenServiceTime(8.0)).summary()
    )
