"""Tensor parallelism's all-reduces: the kernel vLLM 0.33 picks (cuda_communicator.py, custom_all_reduce.py), how
many a step runs, and their time from the measured table of the kernel vLLM runs at each size, or the link's bound."""

import csv
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import models, profiles
from kvlab.core.config import EngineConfig, ParallelConfig
from kvlab.core.cost import Batch, MeasuredStepCost, RooflineStepCost, make_step_cost
from kvlab.core.cost.all_reduce import MIB, AllReduceCost, vllm_kernel
from kvlab.core.cost.interpolate import interp

PRO, RTX4090, A100, H100, H200, B200, L40S = (
    profiles.interconnect(g)
    for g in ("RTX-PRO-6000-Server-96GB", "RTX-4090-24GB", "A100-SXM-80GB", "H100-SXM-80GB", "H200-141GB", "B200-180GB",
              "L40S-48GB")
)  # fmt: skip


@pytest.mark.parametrize(
    "link, gpus, size, kernel",
    [
        (PRO, 2, 8 * MIB - 16, "vLLM's custom all-reduce (one-stage)"),  # two PCIe GPUs with P2P: below 8 MiB
        (PRO, 2, 8 * MIB, "NCCL"),  # the limit is strict
        (PRO, 4, 64 * 1024, "NCCL"),  # more than two GPUs without NVLink: no custom all-reduce
        (PRO, 2, 1000, "NCCL"),  # not a multiple of 16 bytes
        (RTX4090, 2, 64 * 1024, "NCCL"),  # no peer access on a GeForce driver
        (A100, 4, 500 * 1024, "vLLM's custom all-reduce (one-stage)"),
        (A100, 4, 512 * 1024, "vLLM's custom all-reduce (two-stage)"),
        (A100, 8, 255 * 1024, "vLLM's custom all-reduce (one-stage)"),
        (A100, 8, 256 * 1024, "vLLM's custom all-reduce (two-stage)"),
        (A100, 8, 8 * MIB, "NCCL"),
        (H100, 2, 64 * MIB, "FlashInfer all-reduce"),
        (H100, 4, 2 * MIB + 16, "vLLM's custom all-reduce (two-stage)"),  # past FlashInfer's 2 MiB at 4 GPUs
        (H100, 8, MIB, "torch symmetric-memory all-reduce"),  # custom stops at 256 KiB where symm-mem is on
        (H100, 8, 65 * MIB, "NCCL"),
    ],
)
def test_vllm_picks_its_all_reduce_by_size_gpus_and_link(link, gpus, size, kernel):
    assert vllm_kernel(link, gpus, size) == kernel


def test_a_step_runs_two_all_reduces_a_layer_and_the_embeddings():
    cost = AllReduceCost.for_step(A100, 2, 8192, 80)
    assert cost.num_per_step == 161 and cost.bytes_per_token == 16384
    assert "custom all-reduce (one-stage) at 1-511 tokens, NCCL from 512 tokens" in cost.describe()
    assert AllReduceCost.for_step(A100, 1, 8192, 80) is None and AllReduceCost.for_step(None, 2, 8192, 80) is None


def test_vidurs_nccl_table_is_read_for_every_size_where_a_link_points_at_it():
    with open(profiles.PROFILES_DIR / "vidur" / "network" / "a100_dgx" / "all_reduce.csv", newline="") as f:
        rows = [(int(r["size_bytes"]), float(r["time_us"])) for r in csv.DictReader(f) if r["num_gpus"] == "4"]
    link = dataclasses.replace(A100, all_reduce_profile="vidur/network/a100_dgx")
    cost = AllReduceCost.for_step(link, 4, 4096, 32)
    for size, us in rows[::97]:
        assert cost.step_us(size / 8192) == pytest.approx(65 * us, rel=1e-12)
    (s0, t0), (s1, t1) = rows[10], rows[11]
    between = cost.step_us((s0 + s1) / 2 / 8192) / 65
    assert min(t0, t1) - 1e-9 <= between <= max(t0, t1) + 1e-9
    assert "vidur's NCCL all-reduce" in cost.describe()


def reference_us(link, gpus, size):
    """One all-reduce of size bytes as the table of the kernel vLLM runs there gives it, read directly: NCCL's
    (nccl.csv) where vLLM runs NCCL, the custom all-reduce's (all_reduce.csv) elsewhere."""
    nccl = vllm_kernel(link, gpus, size) == "NCCL"
    sizes, times = (profiles.nccl_us(link.all_reduce_profile, "all_reduce", gpus) if nccl else
                    profiles.all_reduce_us(link.all_reduce_profile, gpus))  # fmt: skip
    return interp(sizes.tolist(), times.tolist(), size)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([PRO, A100, H100, H200, B200, L40S]),
    st.sampled_from([2, 4, 8]),
    st.integers(64, 2048).map(lambda h: 8 * h),
    st.integers(1, 20_000),
)
def test_each_size_reads_the_table_of_the_kernel_vllm_runs_there(link, gpus, hidden, tokens):
    cost = AllReduceCost.for_step(link, gpus, hidden, 10)
    size = tokens * 2 * hidden
    assert cost.step_us(tokens) == pytest.approx(21 * reference_us(link, gpus, size), rel=1e-9, abs=1e-9)


def test_two_pcie_gpus_switch_from_the_custom_all_reduce_to_nccl_at_8_mib():
    cost = AllReduceCost.for_step(PRO, 2, 5120, 64)
    custom = profiles.all_reduce_us(PRO.all_reduce_profile, 2)
    nccl = profiles.nccl_us(PRO.all_reduce_profile, "all_reduce", 2)
    assert cost.step_us(819) == pytest.approx(129 * np.interp(819 * 10240, *custom), rel=1e-12)
    assert cost.step_us(820) == pytest.approx(129 * np.interp(820 * 10240, *nccl), rel=1e-12)
    assert "NCCL's all-reduce by nccl-tests (eager, half) where vLLM runs NCCL" in cost.describe()
    # measured, not the ring's bound: more than 2 (n - 1) / n x size over 64 GB/s, by its latency at least
    assert cost.step_us(64) > 129 * 64 * 10240 / 64e3


def test_without_a_measurement_the_ring_bound_over_the_link():
    cost = AllReduceCost.for_step(RTX4090, 2, 5120, 64)
    # 129 all-reduces of 64 x 5120 x 2 bytes, 2 (n - 1) / n of it over 32 GB/s each way
    assert cost.step_us(64) == pytest.approx(129 * 64 * 10240 / 32e3, rel=1e-12)
    assert "no measurement of an all-reduce among 2 of these GPUs" in cost.describe()


def test_the_fallback_adds_the_all_reduce_and_says_how_it_is_timed():
    config = EngineConfig(parallel=ParallelConfig(tensor_parallel_size=2))
    # no profile of it, and MLA, which the operator tables do not compose
    model, gpu = models.get_model("deepseek-ai/DeepSeek-V2-Lite"), models.get_gpu("A100-SXM-80GB")
    cost = make_step_cost("measured", model=model, gpu=gpu, config=config)
    assert isinstance(cost, RooflineStepCost)
    assert "vLLM's custom all-reduce in a CUDA graph measured among 2 GPUs" in cost.provenance
    batch = Batch(64, 64 * 1000, 64, 64 * 1000)
    alone = RooflineStepCost(*[getattr(cost, f) for f in ("weights_bytes", "kv_bytes_per_token", "num_params")],
                             cost.memory_bandwidth_gb_s, cost.bf16_dense_tflops)  # fmt: skip
    assert cost.step_s(batch) == pytest.approx(alone.step_s(batch) + cost.all_reduce.step_us(64) / 1e6, rel=1e-12)
    one_gpu = make_step_cost("measured", model=model, gpu=gpu, config=EngineConfig())
    assert one_gpu.all_reduce is None and "all-reduce" not in one_gpu.provenance


def test_a_profiled_tp2_step_names_the_kernel_and_switches_it_off():
    config = EngineConfig(parallel=ParallelConfig(tensor_parallel_size=2))
    cost = make_step_cost(
        "measured",
        model=models.get_model("Qwen/Qwen3-32B"),
        gpu=models.get_gpu("RTX-PRO-6000-Server-96GB"),
        config=config,
    )
    assert isinstance(cost, MeasuredStepCost) and "vLLM's custom all-reduce (one-stage) at 1-819 tokens" in cost.source
    batch = Batch(8, 8000, 8, 8000)
    off = cost.without("all-reduce")
    assert cost.step_s(batch) - off.step_s(batch) == pytest.approx(cost.all_reduce.step_us(8) / 1e6, rel=1e-9)
