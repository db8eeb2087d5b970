"""Section 6: the paper's datasets as kvlab builds them, the setting, sustained rates, the grids and bad input."""

import math
import re

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from kvlab.core.config import EngineConfig
from kvlab.core.cost import ConstantStepCost
from kvlab.core.workload import Workload
from kvlab.report import params as report_params
from kvlab.sections.s06_memory_budget import runs as budget_runs
from kvlab.sections.s06_memory_budget import tables as budget_tables
from kvlab.sections.shared import parameters
from kvlab.studies import paper_setting, paper_workloads
from kvlab.workloads import paper_datasets, traces

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SHAREGPT_FILE = traces.read_manifest()["sharegpt"]["file"]


# ---------------------------------------------------------------- ShareGPT turn inputs
def _sharegpt_file(folder, rows):
    path = folder / SHAREGPT_FILE
    lines = ["num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"]
    lines += [f"{p},{d},{p + d},{p / d}" for p, d in rows]
    path.write_text("\n".join(lines) + "\n")
    return folder


# A hand-made file: two conversations of three turns, then a turn whose prefill equals the history (no new input:
# a new conversation), then a turn that continues it. (prefill, decode) per row, as the processed file counts them.
ROWS = [
    (10, 5),
    (20, 7),
    (40, 3),  # conversation 0: inputs 10, 20 - 15 = 5, 40 - 27 = 13
    (12, 4),
    (30, 6),
    (41, 2),  # conversation 1: 12 (12 < 43: new), 30 - 16 = 14, 41 - 36 = 5
    (43, 1),  # 43 == 41 + 2: no new input, so conversation 2 starts: 43
    (50, 9),
]  # 50 > 44: continues conversation 2 with 6


def test_turn_inputs_find_conversations_by_the_history_growing(tmp_path):
    prefill, decode = paper_workloads.sharegpt_counts(_sharegpt_file(tmp_path, ROWS))
    turns = paper_datasets.turn_inputs(prefill, decode)
    assert turns.input_tokens.tolist() == [10, 5, 13, 12, 14, 5, 43, 6]
    assert turns.output_tokens.tolist() == [5, 7, 3, 4, 6, 2, 1, 9]
    assert turns.conversation.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert turns.turn.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert turns.num_conversations == 3


def test_the_pool_drops_requests_longer_than_max_model_len_and_says_how_many(tmp_path):
    prefill, decode = paper_workloads.sharegpt_counts(_sharegpt_file(tmp_path, ROWS))
    turn = paper_datasets.sharegpt_pool(prefill, decode, "turn", max_len_tokens=16)
    assert turn.prompt_tokens.tolist() == [10, 5, 13, 12, 5, 6] and turn.num_dropped == 2  # 14 + 6, 43 + 1 too long
    processed = paper_datasets.sharegpt_pool(prefill, decode, "processed", max_len_tokens=40)
    assert processed.prompt_tokens.tolist() == [10, 20, 12, 30] and processed.num_dropped == 4
    with pytest.raises(ValueError, match="sharegpt_inputs='history' is not allowed"):
        paper_datasets.sharegpt_pool(prefill, decode, "history")
    with pytest.raises(ValueError, match="a pool needs at least one request"):
        paper_datasets.sharegpt_pool(prefill, decode, "turn", max_len_tokens=2)


@pytest.mark.skipif(bool(traces.missing_traces()), reason="needs the real ShareGPT file (set TRACE_DIR)")
def test_the_real_file_has_the_conversations_its_readme_says():
    found = paper_workloads.conversation_figures()
    assert found["rows"] == 30_731 and found["conversations"] == 5_678  # "about 5.7k conversations"
    assert 2_300 < found["prefill_mean"] < 2_400 and found["input_mean"] < 200


# ---------------------------------------------------------------- synthetic Alpaca
@pytest.mark.parametrize("family, tolerance", [("geometric", 0.01), ("gamma-cv0.5", 0.02)])
def test_alpaca_lengths_have_the_papers_means(family, tolerance):
    prompt, output = paper_datasets.alpaca_lengths(family).lengths(400_000, np.random.default_rng(1))
    assert prompt.min() >= 1 and output.min() >= 1
    assert prompt.mean() == pytest.approx(19.31, rel=tolerance)
    assert output.mean() == pytest.approx(58.45, rel=tolerance)
    cv = output.std() / output.mean()
    assert (0.9 < cv < 1.05) if family == "geometric" else (0.45 < cv < 0.55)


def test_a_seed_gives_the_same_requests_at_every_rate():
    alpaca = paper_datasets.alpaca_lengths()
    slow = paper_datasets.workload(alpaca, 500, 2.0, seed=7)
    fast = paper_datasets.workload(alpaca, 500, 20.0, seed=7)
    assert np.array_equal(slow.prompt_tokens, fast.prompt_tokens)
    assert np.array_equal(slow.output_tokens, fast.output_tokens)
    assert np.allclose(slow.arrival_s, 10 * fast.arrival_s) and slow.arrival_s[0] == 0
    again = paper_datasets.workload(alpaca, 500, 2.0, seed=7)
    assert np.array_equal(again.arrival_s, slow.arrival_s)
    assert not np.array_equal(paper_datasets.workload(alpaca, 500, 2.0, seed=8).output_tokens, slow.output_tokens)


# ---------------------------------------------------------------- the setting and one run
def test_the_papers_setting_gives_15_7k_slots_and_seven_max_length_requests():
    setting = paper_setting.PaperSetting()
    assert setting.kv_bytes_per_token == 800 * 1024
    assert setting.num_gpu_blocks() == 984 and setting.pool_tokens() == 15_728  # 983 blocks + the null block
    assert setting.pool_tokens() // setting.max_model_len == 7
    assert setting.num_gpu_blocks(256) == 62 and setting.num_gpu_blocks(1) == 15_729
    assert setting.is_papers and not setting.replace(kv_cache_gib=16.0).is_papers


def test_normalized_latency_is_the_mean_of_latency_over_output_tokens():
    # One request at a time under a constant 8 ms step: n output tokens take n steps (the prompt's step samples the
    # first), so latency / n is 8 ms for every request.
    workload = Workload(np.array([0.0, 10.0]), np.array([1, 1]), np.array([10, 40]))
    config = EngineConfig().replace(async_scheduling=False, max_model_len=2048)
    point = budget_runs._point(workload, config, 100, ConstantStepCost(8.0), "paged", name="x")
    row = budget_runs.serve(point)
    assert row["name"] == "x" and row["num_requests"] == 2
    assert row["normalized_latency_s"] == pytest.approx(0.008)
    assert row["mean_latency_s"] == pytest.approx((0.08 + 0.32) / 2)
    assert row["mean_batched_requests"] == pytest.approx(1.0) and row["num_preemptions"] == 0


def test_an_allocation_mode_that_does_not_exist_is_one_line():
    workload = Workload(np.array([0.0]), np.array([1]), np.array([2]))
    with pytest.raises(
        ValueError, match=r"^allocation='buddy' is not allowed: must be one of paged, max, pow2, oracle"
    ):
        budget_runs._point(workload, EngineConfig(), 10, ConstantStepCost(), "buddy")


# ---------------------------------------------------------------- sustained rates
@pytest.mark.parametrize(
    "latencies, expected, note",
    [
        ([0.1, 0.2, 0.4, 0.9, 2.0], 3.0, ""),  # crosses between 3 and 4 requests/s
        ([0.1, 0.2, 0.3, 0.4, 0.45], 5.0, "at least"),  # never over: a lower limit at the grid's top
        ([0.6, 0.7, 0.8, 0.9, 1.0], math.nan, "none"),  # over at every rate: said, not an error
        ([0.1, 0.6, 0.2, 0.3, 0.4], 1.0, ""),  # the first crossing counts, not a later dip
        ([0.1, 0.5, 0.9, 1.0, 2.0], 2.0, ""),  # at the bound is under it
    ],
)
def test_sustained_rate_is_the_last_rate_before_the_first_one_over_the_bound(latencies, expected, note):
    rate, found = budget_tables.sustained_rate([1.0, 2.0, 3.0, 4.0, 5.0], latencies, 0.5)
    assert found == note
    assert (math.isnan(rate) and math.isnan(expected)) or rate == expected


def test_a_rate_grid_that_is_empty_or_not_increasing_is_refused():
    with pytest.raises(ValueError, match="rates=.* is not allowed: must be one or more increasing rates"):
        budget_tables.sustained_rate([], [], 0.5)
    with pytest.raises(ValueError, match="rates=.* is not allowed"):
        budget_tables.sustained_rate([2.0, 1.0], [0.1, 0.2], 0.5)


def test_the_sustained_table_says_when_no_point_meets_the_bound():
    rates = [1.0, 2.0, 4.0]
    curves = pd.DataFrame(
        {
            "Orca (Max)": [0.6, 0.7, 0.9],
            "Orca (Pow2)": [0.1, 0.6, 0.9],
            "Orca (Oracle)": [0.1, 0.2, 0.6],
            "vLLM": [0.1, 0.2, 0.3],
        },
        index=pd.MultiIndex.from_product([["ShareGPT"], rates], names=["dataset", "rate"]),
    )
    table = budget_tables.sustained_table(curves, [1.0], 0.5)
    assert list(table.index) == [("ShareGPT", 0.5), ("ShareGPT", 1.0)]
    row = table.loc[("ShareGPT", 0.5)]
    assert math.isnan(row["Orca (Max)"]) and row["Orca (Pow2)"] == 1.0 and row["vLLM"] == 4.0
    assert row["vllm_over_oracle_x"] == 2.0 and math.isnan(row["vllm_over_max_x"])
    assert row["note"] == (
        "vLLM stays under the bound at every rate of the grid, up to 4/s (a lower limit); "
        "Orca (Max) is over the bound at every rate of the grid"
    )


def test_the_best_block_size_is_the_smallest_within_one_percent_of_the_lowest_latency():
    table = pd.DataFrame(
        {"normalized_latency_s": [0.1015, 0.1009, 0.1000, 0.1005, 0.1200]},
        index=pd.Index([8, 16, 32, 64, 128], name="block_size"),
    )
    assert budget_tables.best_block_size(table) == (16, [16, 32, 64])


# ---------------------------------------------------------------- sweeps: the same numbers wherever they run
def _small_grid():
    setting = paper_setting.PaperSetting()
    sets = {"Alpaca": paper_datasets.alpaca_lengths()}
    return budget_runs.paper_points(setting, sets, {"Alpaca": [20.0, 80.0]}, [0, 1], 150)


def test_a_section_6_grid_gives_identical_results_serially_and_on_processes():
    points = _small_grid()
    serial = budget_runs.run_grid("s6 test", points, "serial")
    parallel = budget_runs.run_grid("s6 test", points, "processes")
    assert len(serial) == 16 and list(serial["mode"][:4]) == list(budget_runs.MODES)
    pd.testing.assert_frame_equal(serial, parallel, check_exact=True)


def test_a_section_6_grid_gives_identical_results_on_a_dask_cluster():
    from distributed import LocalCluster

    points = _small_grid()[:8]
    serial = budget_runs.run_grid("s6 test", points, "serial")
    # Threads in this process, not worker processes: the same Dask scheduler, client and executor path, without
    # worker processes that a loaded machine can lose (a lost worker leaves the sweep waiting for it).
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        on_dask = budget_runs.run_grid("s6 test", points, cluster.scheduler_address)
    pd.testing.assert_frame_equal(serial, on_dask, check_exact=True)


# ---------------------------------------------------------------- bad input: one line naming the parameter
@pytest.mark.parametrize(
    "override, message",
    [
        (
            "06_memory_budget.MODEL=opt-13",
            "06_memory_budget.MODEL='opt-13' is not allowed: not a model of data/models.csv; "
            "did you mean facebook/opt-13b",
        ),
        (
            "06_memory_budget.GPU=A100",
            "06_memory_budget.GPU='A100' is not allowed: not a gpu of data/gpus.csv; did you mean",
        ),
        ("06_memory_budget.SHAREGPT_RATES=[]", "06_memory_budget.SHAREGPT_RATES=[] is not allowed: must not be empty"),
        (
            "06_memory_budget.ALPACA_RATES=[30, 20]",
            "06_memory_budget.ALPACA_RATES=[30, 20] is not allowed: must be increasing",
        ),
        (
            "06_memory_budget.SHAREGPT_INPUTS=history",
            "06_memory_budget.SHAREGPT_INPUTS='history' is not allowed: must be one of turn, processed",
        ),
        (
            "06_memory_budget.KV_CACHE_GIB=1.0",
            "06_memory_budget.KV_CACHE_GIB=1.0 is not allowed: holds 1,296 token slots, "
            "fewer than one request of max_model_len=2,048 tokens needs",
        ),
        (
            "06_memory_budget.KV_CACHE_GIBS=[1.0, 2.0]",
            "06_memory_budget.KV_CACHE_GIBS[0]=1.0 is not allowed: holds 1,296",
        ),
        (
            "06_memory_budget.MAX_MODEL_LEN=4096",
            "06_memory_budget.MAX_MODEL_LEN=4096 is not allowed: must be at most "
            "facebook/opt-13b's max_position_embeddings (2,048)",
        ),
        (
            "06_memory_budget.PREFIX_GPU=L4-24GB",
            "06_memory_budget.PREFIX_GPU='L4-24GB' is not allowed: cannot hold one request of 131,072 tokens",
        ),
        (
            "06_memory_budget.SWEEP_SCHEDULER=threads",
            "06_memory_budget.SWEEP_SCHEDULER='threads' is not allowed: must be "
            "serial, processes or a Dask scheduler address",
        ),
    ],
)
def test_bad_section_6_parameters_are_one_line_naming_the_parameter(override, message):
    with pytest.raises(report_params.ReportError, match=re.escape(message)):
        report_params.load_params(ROOT / "params.yaml", [override], NOTEBOOKS)


def test_a_section_6_run_with_another_setting_than_the_papers_is_not_compared():
    changed = parameters.departures("06_memory_budget", {"GPU": "H100-SXM-80GB", "LATENCY_BOUND_S": 1.0})
    assert changed == "GPU='H100-SXM-80GB' (the vLLM paper's 'A100-40GB')"  # the bound is kvlab's own choice


def test_the_estimate_of_the_default_run_fits_the_reports_budget():
    defaults = report_params.notebook_parameters(ROOT / "notebooks" / "06_memory_budget.ipynb")
    estimate = parameters.estimate("06_memory_budget", defaults)
    assert 20 < estimate.seconds < 120 and estimate.peak_bytes < 2**30
    bigger = parameters.estimate("06_memory_budget", defaults | {"NUM_SEEDS": 5})
    assert bigger.seconds > 2 * estimate.seconds  # the grids grow with the seeds, the traces do not


def test_a_kv_cache_must_hold_a_buddy_chunk_of_max_model_len():
    """1,500 tokens take a buddy chunk of 2,048: 1.5 GiB of OPT-13B (1,952 slots) holds 1,500 slots but no such chunk."""
    from kvlab.studies.paper_setting import PaperSetting

    setting = PaperSetting(max_model_len=1500)
    assert setting.pool_tokens(kv_cache_gib=1.5) == 1_952
    with pytest.raises(
        ValueError,
        match=r"^KV_CACHE_GIB=1.5 is not allowed: holds 1,952 token slots, fewer than one "
        r"request of max_model_len=1,500 tokens needs \(a buddy chunk of 2,048; at "
        r"least 1\.57 GiB\)$",
    ):
        setting.check_fits("KV_CACHE_GIB", 1.5)
    setting.check_fits("KV_CACHE_GIB", 1.6)


def test_the_knee_refines_each_sustained_rate_to_its_finer_grid():
    """knee_points spans each mode's sustained rate to the coarse grid's next one in geometric steps, every seed at
    every rate; knee_sustained takes the highest knee rate whose mean latency over seeds is under the bound."""
    coarse = pd.DataFrame(
        [
            {
                "dataset": "ShareGPT",
                "bound_s": 0.5,
                "Orca (Max)": 1.0,
                "Orca (Pow2)": 2.0,
                "Orca (Oracle)": 2.0,
                "vLLM": 4.0,
                "vllm_over_oracle_x": 2.0,
                "vllm_over_max_x": 4.0,
                "note": "",
            }
        ]
    ).set_index(["dataset", "bound_s"])
    setting = paper_setting.PaperSetting()
    dataset = paper_datasets.alpaca_lengths()
    points = budget_runs.knee_points(setting, "ShareGPT", dataset, [1.0, 2.0, 4.0], coarse, 0.5, 2, [0, 1], 50)
    rates = {m: sorted({p["labels"]["rate"] for p in points if p["labels"]["mode"] == m}) for m in budget_runs.MODES}
    assert rates["max"] == pytest.approx([1.0, 2**0.5, 2.0])
    assert rates["oracle"] == pytest.approx([2.0, 8**0.5, 4.0])
    assert rates["paged"] == []  # 4/s is the grid's top: no knee inside it
    assert len(points) == 3 * 3 * 2
    rows = [
        {"mode": m, "rate": r, "seed": s, "normalized_latency_s": lat}
        for m, curve in (
            ("max", [(1.0, 0.1, 0.2), (1.5, 0.4, 0.5), (2.0, 0.6, 0.9)]),
            ("oracle", [(2.0, 0.6, 0.7), (2.8, 0.9, 0.9), (4.0, 1.0, 1.0)]),
        )
        for r, a, b in curve
        for s, lat in ((0, a), (1, b))
    ]
    knee = budget_tables.knee_sustained(coarse, pd.DataFrame(rows), 0.5)
    row = knee.loc[("ShareGPT", 0.5)]
    assert row["Orca (Max)"] == 1.5  # mean 0.45 at 1.5, 0.75 at 2.0
    assert row["Orca (Oracle)"] == 2.0  # over the bound at every knee rate: the coarse rate kept
    assert row["vLLM"] == 4.0 and row["vllm_over_max_x"] == pytest.approx(4.0 / 1.5)
    assert row["step_x"] == pytest.approx(1.5) and row["seeds"] == 2


def test_the_papers_fig12a_regime_is_read_where_its_curve_covers_the_rate():
    import pandas as pd

    from kvlab.sections.s06_memory_budget import prose, tables

    assert tables.paper_vllm_latency(2.0) == pytest.approx(1.124524291)
    assert tables.paper_vllm_latency(1.0) == pytest.approx(0.037142935)
    assert tables.paper_vllm_latency(1.95) == pytest.approx((0.239662196 + 1.124524291) / 2)
    assert tables.paper_vllm_latency(2.5) is None and tables.paper_vllm_latency(0.5) is None
    regime = pd.DataFrame({"ShareGPT: normalized latency (s/token)": [1.11]}, index=["vLLM"])
    text = prose.paper_regime_text(regime, {"ShareGPT": 2.0}, 0.5)
    assert "takes 1.12 s per output token (Fig. 12a" in text and "against kvlab's 1.11: the same regime" in text
    sustained = pd.DataFrame({"ShareGPT: normalized latency (s/token)": [0.3]}, index=["vLLM"])
    assert "the other regime" in prose.paper_regime_text(sustained, {"ShareGPT": 2.0}, 0.5)
    assert "unverified for every row" in prose.paper_regime_text(regime, {"ShareGPT": 3.0}, 0.5)
