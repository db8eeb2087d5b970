"""Disaggregated prefill and decode (kvlab.core.fleet.disaggregated, kvlab simulate --prefill-instances): a
hand-checked request, TTFT's parts, the prefill side held by the decode side's reads, the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.cli import main
from kvlab.core.config import EngineConfig
from kvlab.core.cost import LinearStepCost
from kvlab.core.fleet.disaggregated import TTFT_PARTS, DisaggregatedFleet
from kvlab.core.kv_transfer import transfer_cost
from kvlab.core.models import get_model
from kvlab.core.workload import Workload

SYNC = EngineConfig().replace(async_scheduling=False, max_model_len=4096)
COST = LinearStepCost(8.0, 0.01)
RDMA = transfer_cost(get_model("meta-llama/Llama-3.1-8B-Instruct"), "H100-SXM-80GB", "rdma-400g")


def test_one_request_is_prefilled_read_and_decoded():
    """100 prompt tokens, 3 output tokens, 1 prefill + 1 decode instance, steps of 8 ms + 0.01 ms a token: the
    prefill step (9 ms) ends at 9 ms; the decode instance allocates at once and reads 7 blocks of 2 MiB at 50 GB/s
    (0.2936 ms), then computes the last prompt token (8.01 ms: first token) and decodes 2 more (8.01 ms each)."""
    w = Workload(np.array([0.0]), [100], [3])
    result = DisaggregatedFleet(w, SYNC, 1, 1, RDMA, num_gpu_blocks=100, cost=COST).run()
    read_s = 7 * 2_097_152 / 50e9
    assert result.first_token_s[0] == pytest.approx(0.009 + read_s + 0.00801, abs=1e-12)
    assert result.finish_s[0] == pytest.approx(0.009 + read_s + 3 * 0.00801, abs=1e-12)
    parts = {name: float(v[0]) for name, v in result.ttft_parts_s.items()}
    assert parts == pytest.approx(
        {"queue": 0.0, "prefill": 0.009, "decode_queue": 0.0, "transfer": read_s, "first_decode": 0.00801}, abs=1e-12
    )


def test_a_decode_instance_reads_only_the_blocks_its_prefix_cache_lacks():
    """With prefix caching two prompts of 80 tokens share their first 64 (4 blocks): the second, a second after the
    first, finds those 4 blocks in the decode instance's cache and reads 1 block (41.94 us at 50 GB/s), not 5."""
    ids = [np.concatenate([np.arange(64), np.arange(1000, 1016) + 100 * i]) for i in range(2)]
    w = Workload(np.array([0.0, 1.0]), [80, 80], [3, 3])
    fleet = DisaggregatedFleet(w, SYNC.replace(enable_prefix_caching=True), 1, 1, RDMA, num_gpu_blocks=100, cost=COST,
                               prompt_token_ids=ids)  # fmt: skip
    result = fleet.run()
    one_block = 2_097_152 / 50e9
    assert result.ttft_parts_s["transfer"].tolist() == pytest.approx([5 * one_block, one_block], abs=1e-12)


def test_the_prefill_side_waits_for_the_decode_side_to_read_its_blocks():
    """The prefill instance's pool holds one request's blocks: the second request (arriving with the first) is
    prefilled only once the decode instance has read the first one's blocks and the read was reported at a step's
    end, so its queue covers the first one's prefill and read."""
    w = Workload(np.array([0.0, 0.0]), [300, 300], [4, 4])
    result = DisaggregatedFleet(w, SYNC, 1, 1, RDMA, num_gpu_blocks=21, cost=COST).run()
    prefill = result.prefill_results[0]
    first_read_end = result.arrival_s[0] + sum(float(result.ttft_parts_s[p][0]) for p in TTFT_PARTS[:4])
    assert prefill.first_scheduled_s[1] >= first_read_end > prefill.finish_s[0]


@st.composite
def deployments(draw):
    """Up to 24 requests on one or two instances a side, pools from the least that holds the longest request up."""
    n = draw(st.integers(1, 24))
    prompts = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.002, 0.01]), min_size=n, max_size=n))
    workload = Workload(np.cumsum(gaps) - gaps[0], np.array(prompts), np.array(outputs))
    config = SYNC.replace(max_num_seqs=draw(st.integers(1, 4)), max_num_batched_tokens=draw(st.sampled_from([64, 512])))
    least = max(-(-(p + o) // 16) for p, o in zip(prompts, outputs)) + 1
    options = {"num_gpu_blocks": least + draw(st.sampled_from([0, 2, 10])), "cost": COST}
    if draw(st.booleans()):  # prefix caching over prompts from two shared stems
        config = config.replace(enable_prefix_caching=True)
        stems = [np.arange(500) + 1000 * s for s in range(2)]
        options["prompt_token_ids"] = [np.concatenate([stems[draw(st.integers(0, 1))][: p - 1], [7]]) for p in prompts]
    return workload, config, draw(st.integers(1, 2)), draw(st.integers(1, 2)), options


@given(deployments())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_ttfts_parts_sum_to_it_and_each_is_what_it_says(deployment):
    workload, config, num_prefill, num_decode, options = deployment
    result = DisaggregatedFleet(workload, config, num_prefill, num_decode, RDMA, **options).run()
    parts = result.ttft_parts_s
    total = sum(parts[p] for p in TTFT_PARTS)
    assert np.allclose(total, result.first_token_s - result.arrival_s, rtol=0, atol=1e-9)
    assert all((parts[p] >= -1e-12).all() for p in TTFT_PARTS)
    least_read_s = RDMA.transfer_s(1)  # a read of one block at least (a prefix hit may cover the rest)
    assert (parts["transfer"] >= least_read_s - 1e-12).all()  # the last prompt token waits for the read
    assert (result.finish_s >= result.first_token_s).all()
    # each side's instances take requests in turn
    assert result.prefill_of.tolist() == [i % num_prefill for i in range(workload.num_requests)]
    assert sorted(np.bincount(result.decode_of, minlength=num_decode).tolist()) in (
        sorted(np.bincount(np.arange(workload.num_requests) % num_decode, minlength=num_decode).tolist()),
    )


@given(deployments())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_one_clock_equals_the_sides_served_alternately_to_a_fixed_point(deployment):
    """run() (every instance on one clock) against run_alternating() (each side whole with the other's last run,
    until the reads' ends repeat): the same instances, times and TTFT parts for every request."""
    workload, config, num_prefill, num_decode, options = deployment
    fleet = DisaggregatedFleet(workload, config, num_prefill, num_decode, RDMA, **options)
    mine, theirs = fleet.run(), fleet.run_alternating()
    for name in ("prefill_of", "decode_of", "first_token_s", "finish_s"):
        assert getattr(mine, name).tolist() == getattr(theirs, name).tolist(), name
    for part in TTFT_PARTS:
        assert mine.ttft_parts_s[part].tolist() == theirs.ttft_parts_s[part].tolist(), part


def test_the_command_line_serves_a_disaggregated_deployment(capsys):
    args = ["simulate", "--policy", "vllm", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-SXM-80GB",
            "--prefill-instances", "2", "--decode-instances", "1", "--no-async-scheduling", "--num-requests", "40",
            "--seed", "1"]  # fmt: skip
    main(args + ["--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["num_prefill_instances"] == 2 and out["num_decode_instances"] == 1 and out["num_requests"] == 40
    parts = sum(out[f"mean_ttft_{p}_s"] for p in TTFT_PARTS)
    assert parts == pytest.approx(out["mean_ttft_s"], rel=1e-9)
    assert "datasheet bound" in out["kv_transfer_source"] and out["kv_transfer_link"] == "rdma-400g"
    assert [i["num_requests"] for i in out["prefill_instances"]] == [20, 20]  # in turn
    assert sum(i["num_requests"] for i in out["decode_instances"]) == 40
    assert 0 < out["mean_tpot_s"] <= out["p95_tpot_s"] * 2
    main(args)
    text = capsys.readouterr().out
    assert "2 prefill + 1 decode instances" in text and "TTFT's parts" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--decode-instances", "0"], "--decode-instances 0 is not allowed: a disaggregated deployment needs"),
        ([], "--prefill-instances 1 --decode-instances 1 runs vLLM's synchronous scheduler"),
        (["--no-async-scheduling", "--instances", "2"], "and --instances 2 cannot be used together"),
        (["--no-async-scheduling", "--requests-csv", "x.csv"], "--requests-csv and --prefill-instances cannot be used"),
    ],
)
def test_what_kvlab_does_not_serve_disaggregated_is_refused_in_one_line(extra, message, capsys):
    args = ["simulate", "--policy", "vllm", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-SXM-80GB",
            "--prefill-instances", "1", "--num-requests", "5"]  # fmt: skip
    if "--decode-instances" not in extra:
        args += ["--decode-instances", "1"]
    try:
        code = main(args + extra)
    except SystemExit as exit_info:  # argparse's own refusals
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
