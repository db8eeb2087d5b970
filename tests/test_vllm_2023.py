"""The vLLM 2023 step cost (kvlab.core.cost.Vllm2023StepCost), its data (data/vllm_2023/, read by
kvlab.core.cost.vllm_2023) and its fit (kvlab.studies.vllm_2023_fit): the data parse with their provenance, a refit
gives the committed coefficients and residuals, the per-block term makes small blocks slower, the step grows with
tokens and context."""

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.cost import Batch, Vllm2023StepCost
from kvlab.core.cost import vllm_2023 as data
from kvlab.core.models import DATA_DIR
from kvlab.studies import vllm_2023_fit as section

COEFFICIENTS = section.load_coefficients()


def test_every_data_file_parses_and_says_where_it_comes_from():
    runs = data.anyscale_runs()
    assert [r.max_tokens_cap for r in runs] == [32, 128, 512, 1536]
    assert [r.throughput_tokens_s for r in runs] == [6121, 3592, 2029, 1898]
    assert [r.max_num_batched_tokens for r in runs] == [8700, 7500, 8100, 8100]
    assert all("llm-continuous-batching-benchmarks#4" in r.source for r in runs)
    for name in (
        "anyscale_throughput.csv",
        "anyscale_latency.csv",
        "anyscale_output_tokens.csv",
        "fig18a_kernel_latency.csv",
        "paged_kernel_block_size.csv",
        "coefficients.csv",
        "fit_residuals.csv",
    ):
        assert (data.VLLM_2023_DIR / name).is_file()
        assert f"`{name}`" in (DATA_DIR / "README.md").read_text(encoding="utf-8"), f"{name} is not documented"
    with open(data.VLLM_2023_DIR / "paged_kernel_block_size.csv", newline="", encoding="utf-8") as f:
        assert all(row["source"].startswith("ROCm/FlyDSL#1066") for row in csv.DictReader(f))
    kernel = data.fig18a()
    assert list(zip(kernel.batch_size, kernel.context_tokens)) == [
        (8, 64),
        (8, 128),
        (8, 256),
        (32, 64),
        (32, 128),
        (32, 256),
    ]
    assert kernel.read_precision_us == 0.02 and kernel.latency_us[-1] == 235.29
    # the paper's "20-26% higher than FasterTransformer" holds at batch 32, as read
    ratio = kernel.latency_us[3:] / data.fig18a("FasterTransformer").latency_us[3:]
    assert np.all((ratio > 1.18) & (ratio < 1.26))
    # block size 1 over 16: FlyDSL 0.1866/0.1635, AITER CK 0.2739/0.2392, their mean
    assert data.block_size_ratio() == pytest.approx((0.1866 / 0.1635 + 0.2739 / 0.2392) / 2, rel=1e-12)


def test_the_workload_is_the_benchmarks_own_draw():
    for run in data.anyscale_runs():
        w = data.anyscale_workload(run.max_tokens_cap)
        assert w.num_requests == 1000 and np.all(w.arrival_s == 0) and np.all(w.prompt_tokens == 512)
        assert int(w.output_tokens.sum()) == run.output_tokens_total
        assert 1 <= w.output_tokens.min() and w.output_tokens.max() <= run.max_tokens_cap
    # the rerun logged in the benchmark's issue #4: response_token_count 15610 at cap 32
    assert int(data.anyscale_workload(32).output_tokens.sum()) == 15610


def test_a_step_by_hand():
    c = data.committed_step_cost()
    k = COEFFICIENTS
    weights_us = 12.85e9 * 2 / (1555 * k["memory_bandwidth_fraction"] * 1e3)
    blocks = 500 / 16 + (1 - 1 / 16) / 2
    attention_us = (
        k["attention_launch_us"]
        + k["attention_us_per_sequence"]
        + k["attention_us_per_token"] * 500
        + k["attention_us_per_block"] * blocks
    )
    expected_s = (k["step_overhead_ms"] * 1000 + weights_us + 40 * attention_us) / 1e6
    assert c.step_s(Batch(1, 500, 1, 500)) == pytest.approx(expected_s, rel=1e-12)
    # a prefill of 512 tokens: compute-bound, plus its causal attention pairs
    flops_us = 2 * 12.85e9 * 512 / (312 * k["flop_fraction"] * 1e6)
    pairs_us = 4 * 5120 * (512 * 513 / 2) / (312 * k["flop_fraction"] * 1e6)
    assert c.step_s(Batch(512, 512, 0, 0, 1, 512 * 513 // 2)) == pytest.approx(
        (k["step_overhead_ms"] * 1000 + flops_us + 40 * pairs_us) / 1e6, rel=1e-12
    )
    assert c.step_s(Batch(512, 512)) == c.step_s(
        Batch(512, 512, 0, 0, 1, 512 * 513 // 2)
    )  # one chunk without aggregates


def test_small_blocks_cost_more_at_equal_context():
    by_block = {
        bs: data.committed_step_cost(bs).step_s(Batch(32, 32 * 500, 32, 32 * 500)) for bs in (1, 2, 4, 8, 16, 32)
    }
    assert by_block[1] > by_block[2] > by_block[4] > by_block[8] > by_block[16] > by_block[32]
    # the kernel alone: block size 1 costs R x block size 16 over a long context, R the measured ratio
    one, sixteen = (section.kernel_us(COEFFICIENTS, 1, 100_000, bs)[0] for bs in (1, 16))
    assert one / sixteen == pytest.approx(data.block_size_ratio(), rel=1e-3)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 255), st.integers(1, 2000), st.integers(0, 4096))
def test_the_step_grows_with_tokens_and_context(num_decodes, context, prefill_tokens):
    c = data.committed_step_cost()
    decode_context = num_decodes * context
    base = c.step_s(Batch(num_decodes + prefill_tokens, decode_context + prefill_tokens, num_decodes, decode_context))
    assert (
        c.step_s(
            Batch(num_decodes + prefill_tokens + 1, decode_context + prefill_tokens + 1, num_decodes, decode_context)
        )
        >= base
    )
    assert (
        c.step_s(
            Batch(num_decodes + prefill_tokens, decode_context + prefill_tokens + 1, num_decodes, decode_context + 1)
        )
        > base
    )
    assert (
        c.step_s(
            Batch(
                num_decodes + 1 + prefill_tokens,
                decode_context + context + prefill_tokens,
                num_decodes + 1,
                decode_context + context,
            )
        )
        > base
    )


def test_a_refit_gives_the_committed_coefficients_and_residuals():
    result = section.fit()
    for name, value in COEFFICIENTS.items():
        assert result.coefficients[name] == pytest.approx(value, rel=1e-6), name
    committed = section.load_residuals()
    throughput = committed[committed.measurement == "anyscale_throughput"]
    kernel = committed[committed.measurement == "fig18a_vllm"]
    np.testing.assert_allclose(result.throughput_residual_pct, throughput.residual_pct, atol=1e-3)
    np.testing.assert_allclose(result.kernel_residual_pct, kernel.residual_pct, atol=1e-3)
    assert np.all(np.abs(result.throughput_residual_pct) < 1.0)


def test_the_tables():
    fit = section.fit_table()
    committed = section.load_residuals()
    np.testing.assert_allclose(fit.residual_pct, committed.residual_pct[:4], atol=0.01)
    kernel = section.kernel_table()
    np.testing.assert_allclose(kernel.residual_pct, committed.residual_pct[4:], atol=0.01)
    steps = section.step_times()
    assert steps.batch_size.tolist() == [1, 8, 32, 128]
    assert np.all(np.diff(steps.clock_2023_ms) > 0) and np.all(steps.clock_over_roofline_x > 1.5)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: Vllm2023StepCost.from_coefficients(*section.spec(), {"flop_fraction": 0.5}),
            "coefficients='memory_bandwidth_fraction, attention_launch_us",
        ),
        (lambda: section.step_cost({**COEFFICIENTS, "flop_fraction": 1.5}), "flop_fraction=1.5"),
        (lambda: section.step_cost(COEFFICIENTS, block_size=0), "block_size=0"),
        (lambda: data.anyscale_run(64), "max_tokens_cap=64"),
        (lambda: data.fig18a("Orca"), "system='Orca'"),
        (lambda: section.per_block_share(20.0), "block_size_ratio=20.0"),
        (lambda: section.serve_benchmark(data.committed_step_cost(), config="v0"), "config='str'"),
        (lambda: section.step_times((0,)), "batch_size=0"),
    ],
)
def test_bad_input_is_one_line(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)
