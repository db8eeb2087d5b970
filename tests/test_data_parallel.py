"""vLLM's data parallelism: the rank choice (kvlab.core.engine.data_parallel.RankChooser; make parity plays the same
events through vLLM's own DPLBAsyncMPClient, scripts/parity/compare_dp_rank.py), the ranks in lockstep
(DataParallelEngine) and the step of the group (kvlab.core.cost.group_step_s)."""

import csv as csvlib
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import cli
from kvlab.core import models
from kvlab.core.config import EngineConfig
from kvlab.core.cost import Batch, ConstantStepCost, LinearStepCost, group_step_s, make_step_cost
from kvlab.core.engine import DataParallelEngine, Engine, Recorder, simulate
from kvlab.core.engine.data_parallel import DP_SYNC_INTERVAL, RankChooser
from kvlab.core.workload import Workload


@given(st.integers(1, 8), st.lists(st.booleans(), max_size=60))
def test_without_a_snapshot_requests_go_round_the_ranks_whatever_finishes(num_ranks, finish_first):
    # every choice counts as waiting on its rank until the coordinator's next snapshot, so the load the client
    # sees is what it sent: round robin from rank 0, finishes or not
    chooser, sent, in_flight = RankChooser(num_ranks), [], []
    for finish in finish_first:
        if finish and in_flight:
            chooser.finished(in_flight.pop(0))
        sent.append(chooser.choose())
        in_flight.append(sent[-1])
    assert sent == [i % num_ranks for i in range(len(sent))]


def test_a_snapshot_sends_requests_to_the_least_loaded_rank_and_penalizes_a_full_cache():
    chooser = RankChooser(3)
    chooser.snapshot([[0, 9, 0.2], [0, 2, 0.2], [0, 5, 0.2]])
    assert [chooser.choose() for _ in range(3)] == [1, 1, 1]  # waiting + running: 2, 3, 4 < 5
    # equal loads, but rank 0's queue waits on a 90% full cache: 2 + 2 x 6 x 0.4 = 6.8 against 4
    chooser = RankChooser(2)
    chooser.snapshot([[2, 0, 0.9], [1, 3, 0.5]])
    assert chooser.choose() == 1


def test_clients_start_their_scans_apart_and_bad_input_is_refused():
    assert RankChooser(4, client_count=2, client_index=1).choose() == 2
    with pytest.raises(ValueError, match="client_index=2 is not allowed"):
        RankChooser(4, client_count=2, client_index=2)
    with pytest.raises(ValueError, match="must give each of the 3 ranks"):
        RankChooser(3).snapshot([[0, 0, 0.0]])


# ---------------------------------------------------------------- the engine of data-parallel ranks
QWEN_MOE, RTX_PRO = "Qwen/Qwen3-30B-A3B-Instruct-2507", "RTX-PRO-6000-Server-96GB"
SYNC = EngineConfig().replace(async_scheduling=False, max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=512)


def dp_config(num_ranks: int, **changes) -> EngineConfig:
    return SYNC.replace(data_parallel_size=num_ranks, **changes)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 3),
    st.lists(st.tuples(st.integers(1, 600), st.integers(1, 40)), min_size=1, max_size=24),
    st.integers(42, 400),
)
def test_at_a_constant_step_cost_requests_arriving_at_once_are_served_as_by_an_engine_a_rank(
    num_ranks, lengths, num_gpu_blocks
):
    # dealt in turn before any snapshot and never idle until done: lockstep at a constant step cost changes nothing
    prompts, outputs = (np.array(x) for x in zip(*lengths))
    w = Workload(np.zeros(len(prompts)), prompts, outputs)
    result = DataParallelEngine(w, dp_config(num_ranks), num_gpu_blocks=num_gpu_blocks).run()
    assert result.data_parallel_rank.tolist() == [i % num_ranks for i in range(len(prompts))]
    for rank in range(min(num_ranks, len(prompts))):
        mine = np.arange(rank, len(prompts), num_ranks)
        alone = Engine(Workload(w.arrival_s[mine], prompts[mine], outputs[mine]), SYNC, num_gpu_blocks=num_gpu_blocks)
        expected = alone.run()
        for column in ("first_scheduled_s", "first_token_s", "finish_s", "num_preemptions"):
            assert getattr(result, column)[mine].tolist() == getattr(expected, column).tolist(), column
    assert result.num_gpu_blocks == num_ranks * num_gpu_blocks


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_snapshot_of_the_ranks_load_steers_new_requests_to_the_idle_rank(async_scheduling):
    # request 0 decodes for 16 s on rank 0; request 1 (rank 1) is done at once; from the snapshots the client sees
    # rank 0 busy and rank 1 idle, so the later requests all go to rank 1 (without a snapshot they would alternate)
    arrival = [0.0, 0.0, 1.0, 1.2, 1.4, 1.6]
    w = Workload(np.array(arrival), np.full(6, 16), np.array([2000, 1, 1, 1, 1, 1]))
    config = dp_config(2, async_scheduling=async_scheduling)
    result = simulate(w, config, num_gpu_blocks=400)
    assert result.data_parallel_rank.tolist() == [0, 1, 1, 1, 1, 1]


def test_ranks_idle_together_run_dummy_steps_until_vllms_next_check_and_an_arrival_waits_for_one():
    step_s = ConstantStepCost().step_ms / 1e3
    first = Workload(np.array([0.0]), np.array([1]), np.array([4]))
    engine = DataParallelEngine(first, dp_config(2), num_gpu_blocks=40)
    done = engine.run()
    wave = done.num_steps
    tail = -wave % DP_SYNC_INTERVAL
    assert wave > 1 and engine.ranks.tail_steps() == tail > 3
    end = float(done.finish_s[0])
    tail_end = end + tail * step_s
    # a request arriving in the third dummy step starts at its end; one arriving after the tail, at its arrival
    late = [end + 2.5 * step_s, tail_end + 0.001]
    for arrival_s, start_s, dummy_steps in zip(late, [end + 3 * step_s, tail_end + 0.001], [3, tail]):
        w = Workload(np.array([0.0, arrival_s]), np.array([1, 1]), np.array([4, 2]))
        engine = DataParallelEngine(w, dp_config(2), num_gpu_blocks=40)
        result = engine.run()
        assert result.first_scheduled_s[1] == pytest.approx(start_s, abs=1e-12)
        assert engine.num_tail_steps == dummy_steps


MOE_COST = make_step_cost(
    "measured",
    model=models.get_model(QWEN_MOE),
    gpu=models.get_gpu(RTX_PRO),
    config=EngineConfig().replace(data_parallel_size=2, enable_expert_parallel=True, async_scheduling=False),
)


def batches(num_tokens: int):
    """Batches of num_tokens tokens: decodes only, or one prefill chunk beside some decodes."""
    decode = st.builds(
        lambda history: Batch(num_tokens, num_tokens * (history + 1), num_tokens, num_tokens * (history + 1)),
        st.integers(0, 8000),
    )
    mixed = st.builds(
        lambda decodes, history: Batch(
            num_tokens,
            num_tokens + decodes * history,
            decodes,
            decodes * (history + 1),
            1,
            (num_tokens - decodes) * (num_tokens - decodes + 1) // 2,
        ),
        st.integers(0, num_tokens - 1),
        st.integers(0, 8000),
    )
    return st.one_of(decode, mixed)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 1500).flatmap(lambda n: st.tuples(batches(n), batches(n))))
def test_ranks_of_equal_tokens_step_as_their_slowest_and_a_dummy_rank_runs_the_padded_tokens(pair):
    a, b = pair
    assert MOE_COST.group_step_s([a]) == MOE_COST.step_s(a)
    assert MOE_COST.group_step_s([a, b]) == max(MOE_COST.step_s(a), MOE_COST.step_s(b))
    if a.num_scheduled_tokens <= MOE_COST.cudagraph_capture_sizes[-1]:  # both padded: a dummy of a's tokens
        dummy_s = MOE_COST.fixed_us(a.num_scheduled_tokens, 0) / 1e6  # no attention, no sampling, no scheduling
        assert MOE_COST.group_step_s([a, None]) == max(MOE_COST.step_s(a), dummy_s)
    else:  # eager: each rank at its own tokens (the dummy rank's one), the experts at the ranks' mean
        n = a.num_scheduled_tokens
        mine = MOE_COST.with_cpu_us(*MOE_COST._gpu_us(a, n, (n + 1) / 2, False)) / 1e6
        dummy_s = MOE_COST.fixed_us(1, 0, (n + 1) / 2, False) / 1e6
        assert MOE_COST.group_step_s([a, None]) == max(mine, dummy_s)


def test_a_small_rank_beside_a_large_one_is_padded_to_it_only_where_every_rank_runs_a_cuda_graph():
    small = Batch(4, 4 * 1001, 4, 4 * 1001)  # four decodes
    last = MOE_COST.cudagraph_capture_sizes[-1]
    graphed = Batch(last, last * (last + 1) // 2, 0, 0, 1, last * (last + 1) // 2)  # a prompt of the last size
    padded = MOE_COST.with_cpu_us(MOE_COST._gpu_us(small, last)[0], 4) / 1e6
    assert padded > 2 * MOE_COST.step_s(small)  # the experts and the dispatch of 2 x the last size's tokens
    assert MOE_COST.group_step_s([small, graphed]) == max(padded, MOE_COST.step_s(graphed))
    # one token more and the large rank runs eagerly: no rank is padded, the experts get the ranks' mean tokens
    eager = Batch(last + 1, (last + 1) * (last + 2) // 2, 0, 0, 1, (last + 1) * (last + 2) // 2)
    mean = (4 + last + 1) / 2
    own = [MOE_COST.with_cpu_us(*MOE_COST._gpu_us(b, b[0], mean, False)) / 1e6 for b in (small, eager)]
    assert MOE_COST.group_step_s([small, eager]) == max(own) < MOE_COST.step_s(eager)
    assert own[0] < padded  # four decodes' dense layers, not the padded ones
    # a step cost without a rule of its own: the slowest rank's step; no rank at all: one token's least
    assert group_step_s(LinearStepCost(5.0, 0.01), [small, None, eager]) == LinearStepCost(5.0, 0.01).step_s(eager)
    assert group_step_s(ConstantStepCost(), [None, None]) == ConstantStepCost().min_step_s(1)


def test_what_the_data_parallel_engine_cannot_do_is_refused_in_one_line():
    w = Workload(np.zeros(2), np.array([4, 4]), np.array([2, 2]))
    with pytest.raises(ValueError, match="recorder=.* must be None with data_parallel_size > 1"):
        simulate(w, dp_config(2), num_gpu_blocks=40, recorder=Recorder(scheduled=True))
    with pytest.raises(ValueError, match="allocation='max' is not allowed: must be 'paged'"):
        simulate(w, dp_config(2), num_gpu_blocks=40, allocation="max")
    with pytest.raises(ValueError, match="path='compiled' is not allowed: must be 'auto' or 'reference'"):
        simulate(w, dp_config(2), num_gpu_blocks=40, path="compiled")
    assert simulate(w, dp_config(2), num_gpu_blocks=40, path="reference").finish_s.tolist() == (
        simulate(w, dp_config(2), num_gpu_blocks=40).finish_s.tolist()
    )


def test_kvlab_simulate_serves_a_moe_models_ranks_and_refuses_a_dense_ones(capsys, tmp_path):
    flags = ["simulate", "--policy", "vllm", "--gpu", RTX_PRO, "--num-requests", "40", "--arrival-rate", "20"]
    csv_path = tmp_path / "requests.csv"
    moe = ["--model", QWEN_MOE, "--data-parallel-size", "2", "--enable-expert-parallel", "--cost", "measured"]
    assert cli.main([*flags, *moe, "--requests-csv", str(csv_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["data_parallel_size"] == 2 and sum(out["requests_per_rank"]) == 40
    rows = list(csvlib.DictReader(csv_path.open()))
    assert [int(r["data_parallel_rank"]) for r in rows].count(1) == out["requests_per_rank"][1]
    assert cli.main([*flags, "--model", "meta-llama/Llama-3.1-8B", "--data-parallel-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "--data-parallel-size=2 is not allowed" in err and "is dense" in err and err.count("\n") == 1


def test_vllm_019_scores_waiting_four_times_over_running_from_a_start_that_never_moves():
    # 0.19: rank 0 scores 0 x 4 + 3 = 3 against 1 x 4 + 0 = 4; 0.33 scores max(0, 3) = 3 against max(0, 1) = 1
    snapshot = [[0, 3, 0.0], [1, 0, 0.0]]
    old, new = RankChooser(2, vllm_version="0.19"), RankChooser(2)
    old.snapshot(snapshot)
    new.snapshot(snapshot)
    assert (old.choose(), new.choose()) == (0, 1)
    # equal scores: 0.19 takes the start every time (its waiting bump then tips the balance), 0.33 moves on
    old = RankChooser(3, vllm_version="0.19")
    old.snapshot([[0, 4, 0.0], [0, 4, 0.0], [0, 4, 0.0]])
    assert [old.choose() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="vllm_version='0.20' is not allowed"):
        RankChooser(2, vllm_version="0.20")


def test_section_3s_ranks_differ_from_section_5s_replay_of_the_same_run_only_by_whose_rank_choice_they_make():
    """Section 3 serves the real DP 2 + EP run's requests with vLLM 0.33's rank choice; with the run's own vLLM 0.19
    rule its row is section 5's replay exactly (what its prose says), and the real run's row is vLLM's own times."""
    from kvlab.sections import s03_capacity
    from kvlab.studies.plan import percentile_metrics
    from kvlab.studies.step_cost_checks import replay_vllm_run
    from kvlab.workloads.vllm_runs import load_vllm_run

    run = load_vllm_run(s03_capacity.DATA_PARALLEL_RUN)
    replay = replay_vllm_run(run)
    five = percentile_metrics(
        run.workload.arrival_s, run.workload.output_tokens, replay["first_token_s"], replay["finish_s"]
    )
    three = s03_capacity.data_parallel_serving_table(load_factors=(1,), rank_rules="0.19").loc[("1x", "DP 2 + EP")]
    measures = ("mean_ttft_s", "mean_tpot_ms", "mean_e2e_s")
    assert [three[m] for m in measures] == pytest.approx([five[m] for m in measures], rel=1e-12)
    assert s03_capacity.data_parallel_serving_table(load_factors=(1,)).loc[("1x", "DP 2 + EP"), "mean_ttft_s"] != (
        pytest.approx(five["mean_ttft_s"], rel=1e-6)
    )
    real = s03_capacity.data_parallel_serving_figures(s03_capacity.data_parallel_serving_table(load_factors=(1,)))
    assert real["1x"][s03_capacity.REAL_RUN]["mean_ttft_s"] == pytest.approx(float(np.mean(run.ttft_s)))


def test_the_clocks_weakest_measure_on_the_real_run_is_read_from_its_errors():
    from kvlab.sections import s03_capacity

    rows = {"mean_ttft_s": 1.0, "mean_tpot_ms": 40.0, "mean_e2e_s": 30.0}
    table = pd.DataFrame(
        [{"load": "1x", "deployment": d} | rows for d in s03_capacity.DEPLOYMENTS]
        + [
            {
                "load": "1x",
                "deployment": s03_capacity.REAL_RUN,
                "mean_ttft_s": 1.1,
                "mean_tpot_ms": 40.4,
                "mean_e2e_s": 36.0,
            }
        ]
    ).set_index(["load", "deployment"])
    assert s03_capacity.data_parallel_serving_figures(table)["weakest_measure"] == "mean E2E latency"
    table.loc[("1x", s03_capacity.REAL_RUN), "mean_ttft_s"] = 2.0
    assert s03_capacity.data_parallel_serving_figures(table)["weakest_measure"] == "mean TTFT"
