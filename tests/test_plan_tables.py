"""Section 7's tables: the workload planned for, what became of each candidate, the ranking, the halving's check and
the step cost's correction, on hand-made plans whose answers are known."""

import math

import numpy as np
import pandas as pd
import pytest

from kvlab.core import models
from kvlab.sections import s07_plan as plan_tables
from kvlab.sections.shared import parameters
from kvlab.studies.plan import CandidateResult, Plan
from kvlab.studies.plan_space import Candidate, Deployment, Objectives
from kvlab.workloads import synthetic

DEPLOYMENT = Deployment(models.get_model("Qwen/Qwen3-32B"), models.get_gpu("RTX-PRO-6000-Server-96GB"), 16384)
OBJECTIVES = Objectives(ttft_p95_s=1.0, tpot_p95_ms=40.0)


def served(candidate, status, ttft, tpot, reason="", **kw):
    metrics = {"ttft_p95_s": ttft, "tpot_p95_ms": tpot, "e2e_p95_s": 10.0, "num_preemptions": 0}
    return CandidateResult(
        candidate,
        status,
        reason,
        num_gpu_blocks=1000,
        served_requests=kw.pop("served", 1000),
        metrics=metrics,
        shares=OBJECTIVES.shares(metrics),
        **kw,
    )


def hand_plan() -> Plan:
    one, two, six = (
        Candidate(num_replicas=1),
        Candidate(tensor_parallel_size=2),
        Candidate(tensor_parallel_size=2, num_replicas=3),
    )
    results = [
        CandidateResult(Candidate(gpu_memory_utilization=0.7), "pruned", "capacity: vLLM would not start: too small"),
        CandidateResult(Candidate(tensor_parallel_size=4), "pruned", "step cost: no operator profile measures it"),
        CandidateResult(
            Candidate(max_num_batched_tokens=2048), "pruned", "rate: 1 replica schedule at most 6 tokens/s"
        ),
        served(Candidate(max_num_seqs=64), "dropped", 5.0, 90.0, "on the first 200 requests: slow", served=200),
        served(one, "misses", 3.0, 80.0, "p95 TTFT 3 s > 1"),
        served(six, "meets", 0.5, 39.0),
        served(two, "meets", 0.9, 30.0),
        served(Candidate(tensor_parallel_size=2, kv_cache_dtype="fp8"), "meets", 0.9, 30.0, twin_of=two),
    ]
    return Plan(
        DEPLOYMENT, OBJECTIVES, "hand", 1000, 6.0, results, [(200, 4, 4, 1.0), (1000, 3, 2, 2.0)], "measured", 3.0
    )


def test_the_served_table_ranks_fewer_gpus_first_then_the_misses_and_divides_the_rate_by_the_gpus():
    table = plan_tables.served_table(hand_plan())
    assert list(table["num_gpus"]) == [2, 2, 6, 1]  # meets by GPUs (twins alike), then the miss
    assert list(table["meets"]) == [True, True, True, False]
    assert list(table["best"]) == [True, False, False, False]
    assert list(table["requests_per_s_per_gpu"]) == [3.0, 3.0, 1.0, 6.0]  # 6 requests/s over 2, 2, 6 and 1 GPUs
    assert table.loc[1, "worst_share_pct"] == pytest.approx(90.0)  # TTFT 0.9 of 1 s, TPOT 30 of 40 ms
    assert len(plan_tables.ranked_table(table)) == 3


def test_the_outcome_table_counts_each_kind_once_in_order_with_its_reason():
    outcome = plan_tables.outcome_table(hand_plan())
    assert list(outcome.index) == [
        "pruned: capacity",
        "pruned: step cost",
        "pruned: rate",
        "dropped after the first 200 requests",
        "served in full: misses p95 TTFT and p95 TPOT",
        "served in full: meets every objective",
    ]
    assert list(outcome["num_candidates"]) == [1, 1, 1, 1, 1, 3]
    assert outcome.loc["served in full: meets every objective", "served_as_twin"] == 1
    assert outcome.loc["pruned: capacity", "example"].endswith(": vLLM would not start: too small")
    assert outcome["num_candidates"].sum() == len(hand_plan().results)


def test_the_figures_and_headline_name_the_best_and_the_counts():
    plan = hand_plan()
    table = plan_tables.served_table(plan)
    f = plan_tables.plan_figures(
        plan, {"best": {"vllm_serve": "vllm serve x", "num_replicas": 1}}, table, plan_tables.outcome_table(plan)
    )
    assert (f["meets"], f["misses"], f["dropped"], f["pruned"], f["num_twins"]) == (3, 1, 1, 3, 1)
    assert f["pruned_by"] == {"capacity": 1, "step cost": 1, "rate": 1}
    assert (f["best_gpus"], f["best_per_gpu"], f["fewest_gpus"]) == (2, 3.0, 2)
    assert f["objectives"] == "p95 TTFT <= 1 s and p95 TPOT <= 40 ms"


def test_the_step_cost_correction_divides_by_one_plus_the_mean_error_of_the_run_at_the_best_tp():
    table = plan_tables.served_table(hand_plan())
    fidelity = [
        {"label": "X, TP 1", "mean_ttft_error": 0.5, "mean_tpot_error": 0.5, "mean_e2e_error": 0.5},
        {"label": "X, TP 2", "mean_ttft_error": -0.1, "mean_tpot_error": -0.25, "mean_e2e_error": -0.2},
    ]
    fixed = plan_tables.step_cost_corrected(table, fidelity, OBJECTIVES)
    assert fixed["run"] == "X, TP 2"
    assert fixed["ttft_p95_s"] == pytest.approx(0.9 / 0.9) and fixed["tpot_p95_ms"] == pytest.approx(30 / 0.75)
    assert fixed["meets"] and fixed["missed"] == ""  # 1.0 s and 40 ms: on the limits, still met
    fidelity[1]["mean_tpot_error"] = -0.3
    assert plan_tables.step_cost_corrected(table, fidelity, OBJECTIVES)["missed"] == "p95 TPOT"
    assert plan_tables.step_cost_corrected(table, [], OBJECTIVES) == {}
    assert plan_tables.step_cost_error_words(fidelity, "mean_e2e_error") == "50% longer and 20% shorter"


def test_the_synthetic_workload_draws_arrivals_then_prompts_then_outputs_from_one_generator():
    w = synthetic.gamma_workload(500, 4.0, 1000, 200, np.random.default_rng(3))
    rng = np.random.default_rng(3)
    arrival = synthetic.poisson_arrivals(500, 4.0, rng)
    prompt = synthetic.sample_lengths("gamma", 500, rng, mean_tokens=1000, cv=1.0)
    output = synthetic.sample_lengths("gamma", 500, rng, mean_tokens=200, cv=1.0)
    assert np.array_equal(w.arrival_s, arrival) and np.array_equal(w.prompt_tokens, prompt)
    assert np.array_equal(w.output_tokens, output) and w.prompt_tokens.min() >= 1
    flat = synthetic.gamma_workload(3, 1.0, 7, 5, np.random.default_rng(0), cv=0.0)
    assert list(flat.prompt_tokens) == [7, 7, 7] and list(flat.output_tokens) == [5, 5, 5]


def test_without_a_trace_the_plan_serves_a_synthetic_workload_and_says_so(tmp_path):
    workload, note = plan_tables.plan_workload("azure", str(tmp_path), 300, 16384, 4.7, 1155, 211, 0)
    assert workload.num_requests == 300 and workload.name == "synthetic: 4.7 requests/s"
    assert note.startswith("The azure trace is not available") and "a synthetic workload instead, 300 requests" in note
    with pytest.raises(
        ValueError,
        match=r"^MAX_MODEL_LEN=100 is not allowed: must exceed the workload's longest "
        r"prompt, [\d,]+ tokens",
    ):
        plan_tables.plan_workload("", "", 300, 100, 4.7, 1155, 211, 0)


def test_the_rungs_give_each_prefix_its_share_and_span():
    w = synthetic.gamma_workload(1000, 2.0, 100, 10, np.random.default_rng(0))
    rungs = plan_tables.rung_table(hand_plan(), w)
    assert list(rungs["num_requests"]) == [200, 1000] and list(rungs["workload_pct"]) == [20.0, 100.0]
    assert rungs["span_s"].iloc[0] == pytest.approx(w.arrival_s[199]) and list(rungs["num_candidates"]) == [4, 3]
    assert list(rungs["num_runs"]) == [4, 2]


DEFAULTS = {
    "MODEL": "Qwen/Qwen3-32B",
    "GPU": "RTX-PRO-6000-Server-96GB",
    "MAX_MODEL_LEN": 16384,
    "SLO_TTFT_P95_S": 1.0,
    "SLO_TPOT_P95_MS": 50.0,
    "SLO_E2E_P95_S": None,
    "TRACE": "azure",
    "TRACE_DIR": "",
    "NUM_REQUESTS": 2000,
    "SYNTHETIC_RATE_PER_S": 4.7,
    "SYNTHETIC_PROMPT_TOKENS": 1155,
    "SYNTHETIC_OUTPUT_TOKENS": 211,
    "SEED": 0,
    "TENSOR_PARALLEL_SIZES": [1, 2, 4],
    "MAX_NUM_SEQS": [64, 256],
    "MAX_NUM_BATCHED_TOKENS": [2048, 8192],
    "BLOCK_SIZES": [16],
    "GPU_MEMORY_UTILIZATIONS": [0.7, 0.9],
    "KV_CACHE_DTYPES": ["bf16", "fp8"],
    "ASYNC_SCHEDULING": [True],
    "NUM_REPLICAS": [1, 2, 3],
    "HALVING_CHECKS": 2,
    "SWEEP_SCHEDULER": "",
}


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"SLO_TTFT_P95_S": None, "SLO_TPOT_P95_MS": None},
            "SLO_TTFT_P95_S=None is not allowed: an objective is needed",
        ),
        ({"SLO_TPOT_P95_MS": -1.0}, "SLO_TPOT_P95_MS=-1.0 is not allowed: must be a number from 0.001"),
        ({"KV_CACHE_DTYPES": ["fp8", "fp8"]}, "KV_CACHE_DTYPES=['fp8', 'fp8'] is not allowed: must not repeat a value"),
        ({"KV_CACHE_DTYPES": ["fp4"]}, "KV_CACHE_DTYPES[0]='fp4' is not allowed: must be one of"),
        ({"ASYNC_SCHEDULING": [1]}, "ASYNC_SCHEDULING[0]=1 is not allowed: must be True or False"),
        ({"NUM_REPLICAS": [2, 1]}, "NUM_REPLICAS=[2, 1] is not allowed: must be increasing"),
        (
            {"MAX_MODEL_LEN": 65536},
            "MAX_MODEL_LEN=65536 is not allowed: must be at most Qwen/Qwen3-32B's context, 40,960",
        ),
        ({"NUM_REQUESTS": 1}, "NUM_REQUESTS=1 is not allowed: must be at least 2"),
    ],
)
def test_bad_parameters_are_one_line_naming_the_parameter(change, message):
    with pytest.raises(ValueError) as error:
        parameters.check("07_plan", DEFAULTS | change)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_search_space_is_the_parameters_and_the_estimate_grows_with_it():
    space = plan_tables.search_space(DEFAULTS)
    assert space.size == 3 * 2 * 2 * 1 * 2 * 2 * 1 * 3 and space.enable_prefix_caching == (False,)
    small = parameters.estimate("07_plan", DEFAULTS).seconds
    large = parameters.estimate("07_plan", DEFAULTS | {"BLOCK_SIZES": [16, 32]}).seconds
    assert parameters.SECONDS_PER_NOTEBOOK < small < large < 2 * small
    assert math.isfinite(large)


def test_the_halving_figures_count_the_dropped_that_meet_on_fewer_gpus_than_the_best():
    import pandas as pd

    check = pd.DataFrame({"num_gpus": [2, 6, 6], "meets_in_full": [True, True, False]})
    assert plan_tables.halving_figures(check, 6) == {"checked": 3, "meet": 2, "better": 1}
    assert plan_tables.halving_figures(check, None) == {"checked": 3, "meet": 2, "better": 2}
    empty = pd.DataFrame(columns=["num_gpus", "meets_in_full"])
    assert plan_tables.halving_figures(empty, 6) == {"checked": 0, "meet": 0, "better": 0}


def test_the_halving_is_set_beside_the_whole_plan_from_the_whole_plans_figures():
    """The whole plan served every candidate; the halving dropped some. What it lost, and whether its best is the
    whole plan's, come from the two plans; flipping which candidate the halving kept flips them."""
    two, four, six = (
        Candidate(tensor_parallel_size=2),
        Candidate(num_replicas=4),
        Candidate(tensor_parallel_size=2, num_replicas=3),
    )
    whole = Plan(
        DEPLOYMENT,
        OBJECTIVES,
        "hand",
        1000,
        6.0,
        [
            served(two, "meets", 0.9, 30.0),
            served(four, "meets", 0.5, 30.0),
            served(six, "misses", 3.0, 30.0, "p95 TTFT 3 s > 1"),
        ],
        [(1000, 3, 1.0)],
        "measured",
        1.0,
    )
    dropped = lambda c, ttft: served(c, "dropped", ttft, 30.0, "on the first 200 requests: slow", served=200)  # noqa: E731
    halving = Plan(
        DEPLOYMENT,
        OBJECTIVES,
        "hand",
        1000,
        6.0,
        [served(two, "meets", 0.9, 30.0), dropped(four, 0.8), dropped(six, 0.95)],
        [(200, 3, 1.0), (1000, 1, 1.0)],
        "measured",
        1.0,
        True,
    )
    v = plan_tables.halving_versus(halving, whole)
    assert (v["same_best"], v["lost"], v["lost_better"]) == (True, 1, 0)  # four: 4 GPUs, the best's 2
    check = plan_tables.halving_check(halving, whole, 2)
    assert list(check["num_gpus"]) == [4, 6] and list(check["meets_in_full"]) == [True, False]
    assert list(check["full_worst_share_pct"]) == [pytest.approx(75.0), pytest.approx(300.0)]
    halving.results[:2] = [dropped(two, 0.8), served(four, "meets", 0.5, 30.0)]
    v = plan_tables.halving_versus(halving, whole)
    assert (v["same_best"], v["lost"], v["lost_better"]) == (False, 1, 1)  # it kept four, lost two on fewer GPUs


def test_the_served_candidates_are_counted_by_how_many_objectives_each_misses():
    plan = hand_plan()
    assert plan_tables.served_words(plan) == "3 meet every objective and 1 miss two"  # TTFT 3 s and TPOT 80 ms
    plan.results[4] = served(Candidate(num_replicas=1), "misses", 3.0, 40.0, "p95 TTFT 3 s > 1")
    plan.results.append(served(Candidate(max_num_seqs=512), "misses", 0.5, 80.0, "p95 TPOT 80 ms > 50"))
    assert plan_tables.served_words(plan) == "3 meet every objective and 2 miss one"


def test_the_finding_leads_with_the_corrected_answer_only_where_the_correction_changes_it():
    f = {
        "best_label": "TP 2 x 3",
        "best_per_gpu": 0.79,
        "best_gpus": 6,
        "rate_per_s": 4.71,
        "objectives": "p95 TPOT <= 50 ms",
        "pruned": 60,
        "num_candidates": 144,
        "num_served": 10,
    }
    missing = {"run": "Qwen3-32B, TP 2", "meets": False, "missed": "p95 TPOT"}
    text = plan_tables.finding_text("Qwen/Qwen3-32B", "RTX", 2000, f, missing, 0)
    assert text.startswith("Corrected for the measured clock's error") and "none of the 10 configurations" in text
    assert "would miss its p95 TPOT objective. No configuration searched is safe once corrected" in text
    assert "As planned, on kvlab's engine" in text
    assert "2 of the 10 configurations served in full would still meet" in plan_tables.finding_text(
        "Qwen/Qwen3-32B", "RTX", 2000, f, missing, 2
    )
    meets = plan_tables.finding_text("Qwen/Qwen3-32B", "RTX", 2000, f, {"meets": True}, 10)
    assert meets.startswith("Planned on kvlab's engine") and meets.endswith("would still meet them.")
    assert "60 of 144 candidates were pruned by proof before any was served." in meets
    # candidates no measurement times are missing data, not proven: said apart, and the answer bounded by them
    gaps = plan_tables.finding_text(
        "Qwen/Qwen3-32B", "RTX", 2000, {**f, "pruned_by": {"capacity": 12, "step cost": 48}}, {"meets": True}, 10
    )
    assert "12 of 144 candidates were pruned by proof before any was served, and 48 were not planned" in gaps
    assert "missing data, not a proof" in gaps


def test_section_7_decides_the_configuration_to_run_once_the_clocks_error_is_allowed_for():
    table = plan_tables.served_table(hand_plan())
    # TP 2's clock 15% fast on TTFT: the best as planned (TTFT 0.9 s) would miss 1 s, the 6-GPU one (0.5 s) would not
    fidelity = [{"label": "X, TP 2", "mean_ttft_error": -0.15, "mean_tpot_error": 0.0, "mean_e2e_error": 0.0}]
    choice = plan_tables.corrected_choice(table, fidelity, OBJECTIVES)
    six = table[table["num_gpus"] == 6].iloc[0]
    assert choice == {
        "run": "X, TP 2",
        "same_tp": True,
        "label": six["label"],
        "num_gpus": 6,
        "per_gpu": 1.0,
        "worst": "p95 TPOT",
        "worst_pct": 98,
        "num_replicas": int(six["num_replicas"]),
        "vllm_serve": six["vllm_serve"],  # its command, one server a replica
    }
    assert (
        choice["vllm_serve"].startswith("vllm serve ")
        and f"--tensor-parallel-size {six['tensor_parallel_size']}" in (choice["vllm_serve"])
    )
    fixed = plan_tables.step_cost_corrected(table, fidelity, OBJECTIVES)
    f = plan_tables.plan_figures(
        hand_plan(), {"best": {"vllm_serve": "x", "num_replicas": 1}}, table, plan_tables.outcome_table(hand_plan())
    )
    text = plan_tables.finding_text("M", "G", 1000, f, fixed, 1, choice)
    assert f"would miss its p95 TTFT objective. Run {six['label']} (1.0 requests/s per GPU on 6 GPUs)" in text
    assert "corrected by the X, TP 2 run's error, its p95 TPOT would be 98% of its limit" in text
    # every configuration missing once corrected: no decision to make but to measure
    worse = [{**fidelity[0], "mean_tpot_error": -0.5}]
    assert plan_tables.corrected_choice(table, worse, OBJECTIVES) == {}
    text = plan_tables.finding_text("M", "G", 1000, f, plan_tables.step_cost_corrected(table, worse, OBJECTIVES), 0, {})
    assert "No configuration searched is safe once corrected: measure" in text
    assert plan_tables.corrected_choice(table, [], OBJECTIVES) == {}
    # a choice at a tensor parallel size no real run checks says whose error corrected it
    other = [{**fidelity[0], "label": "X, TP 8"}]
    choice = plan_tables.corrected_choice(table, other, OBJECTIVES)
    assert not choice["same_tp"]
    text = plan_tables.finding_text(
        "M", "G", 1000, f, plan_tables.step_cost_corrected(table, other, OBJECTIVES), 1, choice
    )
    assert "corrected by the X, TP 8 run's error (no real run checks the clock at its tensor parallel size)" in text


def test_every_panel_of_the_goodput_plot_has_labelled_ticks_even_within_one_decade():
    from kvlab.sections.shared import plots

    table = plan_tables.served_table(hand_plan())  # TPOT 30-80 ms, TTFT 0.5-3 s: less than a decade each
    fig = plots.plan_pareto(table, OBJECTIVES.given(), plan_tables.OBJECTIVE_WORDS, plan_tables.OBJECTIVE_UNITS)
    fig.canvas.draw()
    for ax in fig.axes:
        low, high = ax.get_xlim()
        shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0] <= high]
        assert len(shown) >= 2, (ax.get_xlabel(), shown)


def test_twin_configurations_collapse_to_one_row_listing_what_differs():
    table = plan_tables.ranked_table(plan_tables.served_table(hand_plan()))
    assert len(table) == 3  # the TP 2 pair differs only in the KV cache's dtype
    collapsed = plan_tables.collapse_twins(table)
    assert list(collapsed.index) == [1, 3] and collapsed.index.name == table.index.name
    assert collapsed.loc[1, "kv_cache_dtype"] == "bf16 / fp8" and collapsed.loc[3, "kv_cache_dtype"] == "bf16"
    # figures that differ keep their rows apart
    apart = table.copy()
    apart.loc[2, "tpot_p95_ms"] = 31.0
    assert len(plan_tables.collapse_twins(apart)) == 3


def test_collapsed_twins_say_which_settings_give_each_pool():
    """Twins that differ in the GPU memory share and the KV dtype hold different pools: each pool's size is listed
    with the settings that give it, not as bare numbers in an order the reader must guess."""
    table = pd.DataFrame(
        {
            "gpu_memory_utilization": [0.7, 0.7, 0.9],
            "kv_cache_dtype": ["bf16", "fp8", "bf16"],
            "num_gpu_blocks": [17_390, 34_780, 27_178],
            "tpot_p95_ms": [68.7, 68.7, 68.7],
        },
        index=pd.RangeIndex(1, 4, name="rank"),
    )
    row = plan_tables.collapse_twins(table).iloc[0]
    assert row["num_gpu_blocks"] == "17,390 at 0.70, bf16 / 34,780 at 0.70, fp8 / 27,178 at 0.90, bf16"
    assert row["gpu_memory_utilization"] == "0.70 / 0.90" and row["kv_cache_dtype"] == "bf16 / fp8"


def test_every_knob_of_the_search_says_what_it_sets():
    from kvlab.studies.plan import SearchSpace

    table = plan_tables.space_table(SearchSpace())
    assert (table["what_it_sets"] != "").all() and list(table.index) == list(SearchSpace.__dataclass_fields__)
    assert "not a vLLM flag" in table.loc["num_replicas", "what_it_sets"]
