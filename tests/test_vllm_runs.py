"""The real vLLM runs kept as checks (data/checks/, kvlab.workloads.vllm_runs) and kvlab's replay of them
(kvlab.studies.step_cost_checks.check_run_table). The runs are checks: these tests hold the loading and the
arithmetic, not kvlab's agreement with vLLM."""

import numpy as np
import pytest

from kvlab.core.config import EngineConfig
from kvlab.core.models import get_gpu, get_model
from kvlab.sections import s05_calibration as calibration
from kvlab.sections.shared import plots
from kvlab.studies import step_cost_checks
from kvlab.workloads.vllm_runs import check_runs, load_vllm_run

RUNS = [
    "llmservingsim/RTXPRO6000/Llama-3.1-8B",
    "llmservingsim/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507",
    "llmservingsim/RTXPRO6000/Qwen3-32B",
]


def test_the_three_runs_are_committed():
    assert check_runs() == RUNS


@pytest.mark.parametrize(
    "name,model,tp,dp,max_model_len",
    [
        (RUNS[0], "meta-llama/Llama-3.1-8B", 1, 1, 131072),
        (RUNS[1], "Qwen/Qwen3-30B-A3B-Instruct-2507", 1, 2, 262144),
        (RUNS[2], "Qwen/Qwen3-32B", 2, 1, 40960),
    ],
)
def test_a_run_loads_as_a_workload_with_its_settings_and_latencies(name, model, tp, dp, max_model_len):
    run = load_vllm_run(name)
    w = run.workload
    assert w.num_requests == 300 and w.arrival_s[0] == 0 and np.all(np.diff(w.arrival_s) >= 0)
    s = run.settings
    assert (s["model"], s["gpu"], s["vllm_version"]) == (model, "RTX-PRO-6000-Server-96GB", "0.19.0")
    assert (s["tensor_parallel_size"], s["data_parallel_size"], s["max_num_seqs"], s["max_num_batched_tokens"]) == (
        tp,
        dp,
        128,
        2048,
    )
    assert s["max_model_len"] == max_model_len and "max_model_len" in run.assumed
    assert set(run.assumed) >= {"block_size", "gpu_memory_utilization", "enable_prefix_caching", "async_scheduling"}
    assert np.all(run.first_scheduled_s >= w.arrival_s) and np.all(run.first_token_s >= run.first_scheduled_s)
    assert np.all(run.e2e_s > run.ttft_s) and np.all(run.ttft_s > 0) and np.all(np.isfinite(run.tpot_s))
    config = run.engine_config(async_scheduling=False)
    assert isinstance(config, EngineConfig) and config.parallel.tensor_parallel_size == tp
    assert config.scheduler.max_num_seqs == 128 and config.cache.block_size == 16


def test_an_unknown_run_is_refused_naming_the_runs():
    with pytest.raises(
        ValueError,
        match=r"run='RTX4090/x' is not allowed: is not a run of .*; runs: "
        r"llmservingsim/RTXPRO6000/Llama-3.1-8B, ",
    ):
        load_vllm_run("RTX4090/x")


def test_the_check_table_compares_kvlab_with_vllm():
    table = step_cost_checks.check_run_table([RUNS[0]])
    assert table.index.tolist() == [(RUNS[0], "roofline"), (RUNS[0], "measured"), (RUNS[0], "composed")]
    run = load_vllm_run(RUNS[0])
    row = table.loc[(RUNS[0], "measured")]
    assert row["vllm_mean_e2e_s"] == pytest.approx(run.e2e_s.mean())
    assert row["mean_e2e_error"] == pytest.approx(row["kvlab_mean_e2e_s"] / row["vllm_mean_e2e_s"] - 1)
    assert row["cost_source"].startswith("LLMServingSim profile RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1; CPU: ")
    # the roofline is a lower bound on every step: kvlab's tokens come sooner with it
    assert table.loc[(RUNS[0], "roofline"), "kvlab_mean_tpot_ms"] < row["kvlab_mean_tpot_ms"]
    assert set(step_cost_checks.CHECK_TARGETS) <= set(table.columns)


def test_a_replay_schedules_as_the_run_ran():
    run = load_vllm_run(RUNS[0])
    assert run.settings["async_scheduling"] is True and "async_scheduling" in run.assumed
    replay = step_cost_checks.replay_vllm_run(run, "measured")
    assert replay["async_scheduling"] is True
    assert np.all(replay["first_token_s"] > run.workload.arrival_s) and np.all(
        replay["finish_s"] >= replay["first_token_s"]
    )
    assert step_cost_checks.check_notes(run).startswith(
        "kvlab schedules asynchronously as vLLM ran (vLLM's default; the run records no setting, so assumed)"
    )


@pytest.mark.parametrize(
    "name,cost_name,words",
    [
        (RUNS[0], "roofline", "The roofline is a lower bound"),
        (
            RUNS[1],
            "roofline",
            "all 128 experts for every token, where a token runs 8; the expert dispatch and combine is a bandwidth bound",
        ),
        (
            RUNS[1],
            "measured",
            "The expert dispatch and combine is NCCL's all-gather and reduce-scatter each timed alone",
        ),
        (RUNS[2], "roofline", "it has no all-reduce."),
        (
            RUNS[2],
            "measured",
            "The all-reduce (vLLM's custom all-reduce (one-stage) at 1-819 tokens, NCCL at 820-2,048 tokens) is each "
            "kernel timed alone over PCIe 5.0 x16;",
        ),
        (RUNS[0], "measured", "No cause identified"),
        (RUNS[0], "composed", "The composed clock has no term for decodes of unequal history"),
    ],
)
def test_a_miss_keeps_its_reason_from_the_runs_settings(name, cost_name, words):
    reason = step_cost_checks.check_reason(load_vllm_run(name), cost_name)
    assert words in reason and reason.endswith(".") and reason.count(". ") == 0  # one sentence


def test_the_check_view_puts_the_step_costs_beside_each_other():
    requests = step_cost_checks.check_requests([RUNS[0]])
    assert requests.index.names == ["run", "step_cost", "request"] and len(requests) == 3 * 300
    table = step_cost_checks.check_run_table(requests=requests)
    view = calibration.check_view(table)
    assert view.index.get_level_values("run").tolist() == ["Llama-3.1-8B"] * 4
    assert list(view.columns) == [
        "vllm",
        "kvlab_roofline",
        "roofline_error_pct",
        "roofline_within_target",
        "kvlab_measured",
        "measured_error_pct",
        "measured_within_target",
        "kvlab_composed",
        "composed_error_pct",
        "composed_within_target",
    ]
    e2e = view.iloc[0]
    assert e2e.name[1] == "mean E2E latency (s), target ±5%"
    assert e2e["measured_error_pct"] == pytest.approx(100 * table.loc[(RUNS[0], "measured"), "mean_e2e_error"])
    assert e2e["vllm"] == f"{table.loc[(RUNS[0], 'measured'), 'vllm_mean_e2e_s']:.2f}"
    median = view.iloc[2]
    assert median["vllm"] == "" and median["kvlab_measured"] == ""
    for cost_name in step_cost_checks.CHECK_STEP_COSTS:  # a row within all four targets has no reason; a miss has one
        row = table.loc[(RUNS[0], cost_name)]
        assert (row["why"] == "") == bool(row["within_targets"]) == bool(view[f"{cost_name}_within_target"].all())
    words = calibration.check_figures(table)
    assert words["targets"] == (
        "mean E2E latency and mean TPOT within 5% of vLLM's, the median per-request E2E "
        "error under 8% and mean TTFT within 15%"
    )
    assert words["scheduling"] == "asynchronously, as vLLM does by default"
    # runs, clocks and replays counted apart: one run with each clock is len(CHECK_STEP_COSTS) replays, not runs
    assert (words["num_runs"], words["num_clocks"]) == (1, len(step_cost_checks.CHECK_STEP_COSTS))
    assert words["num_replays"] == words["num_runs"] * words["num_clocks"]
    figure = plots.check_scatter(requests)  # one panel per run, axes with units
    assert [ax.get_xlabel() for ax in figure.axes] == ["vLLM's E2E latency (s)"]
    assert figure.axes[0].get_ylabel() == "kvlab's E2E latency (s)" and figure.png().startswith(b"\x89PNG")


def test_the_composed_clock_is_checked_from_the_operator_tables_where_a_profile_also_exists():
    run = load_vllm_run(RUNS[0])
    model, gpu = get_model(run.settings["model"]), get_gpu(run.settings["gpu"])
    composed = step_cost_checks.check_step_cost("composed", model, gpu, run.engine_config())
    measured = step_cost_checks.check_step_cost("measured", model, gpu, run.engine_config())
    assert composed.source.startswith("composed from the RTX-PRO-6000-Server-96GB's operator tables")
    assert measured.source.startswith("LLMServingSim profile") and "attention skew" not in composed.terms
    with pytest.raises(ValueError, match="needs operator tables that time"):
        step_cost_checks.check_step_cost("composed", get_model("Qwen/Qwen2.5-72B-Instruct"), gpu, run.engine_config())
