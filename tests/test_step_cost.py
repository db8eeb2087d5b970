"""Step costs of the serving engine (kvlab.core.cost): their formulas, one protocol and one factory for every family,
and a decode run's times equal to its steps'."""

import numpy as np
import pytest

from kvlab.core import models
from kvlab.core.config import EngineConfig
from kvlab.core.cost import (
    HARDWARE_STEP_COSTS,
    STEP_COSTS,
    Batch,
    CalibratedStepCost,
    ConstantStepCost,
    LinearStepCost,
    MeasuredStepCost,
    RooflineStepCost,
    StepCost,
    Vllm2023StepCost,
    make_step_cost,
)
from kvlab.core.engine import Engine
from kvlab.core.service_time import CalibratedServiceTime
from kvlab.core.workload import Workload


def calibrated() -> CalibratedStepCost:
    grid = np.array([[5.0, 6.0, 9.0], [6.0, 8.0, 13.0], [9.0, 12.0, 21.0]])  # batch 1, 4, 16 x context 256, 1024, 4096
    return CalibratedStepCost(
        CalibratedServiceTime(
            np.array([1.0, 4.0, 16.0]),
            np.array([256.0, 1024.0, 4096.0]),
            grid,
            prompt_tokens=np.array([128.0, 1024.0, 8192.0]),
            prefill_ms=np.array([10.0, 40.0, 300.0]),
        )
    )


def test_constant_and_linear_steps_are_the_parity_scripts_formulas():
    assert ConstantStepCost().step_s(Batch(500)) == 8.0 / 1000.0
    cost = LinearStepCost(5.0, 0.1)
    assert cost.step_s(Batch(50)) == (5.0 + 0.1 * 50) / 1000.0  # bit for bit what vllm_scheduler.py computes
    with pytest.raises(ValueError, match="step_ms=0.0 is not allowed: and step_ms_per_token cannot both be 0"):
        LinearStepCost(0.0, 0.0)


def test_roofline_of_opt_13b_on_an_a100_40gb():
    cost = RooflineStepCost.from_specs(models.get_model("facebook/opt-13b"), models.get_gpu("A100-40GB"))
    assert cost.kv_bytes_per_token == 2 * 40 * 40 * 128 * 2  # K and V, 40 layers x 40 heads x 128, 16-bit
    assert cost.weights_bytes == pytest.approx(12.85e9 * 2)
    # one decode at 1,000 tokens of context: memory-bound, weights + KV read at 1,555 GB/s
    assert cost.step_s(Batch(1, 1001)) == pytest.approx((25.7e9 + 819_200 * 1001) / 1555e9)
    # a 2,000-token prefill: compute-bound, 2 FLOPs per parameter and token at 312 TFLOPS
    assert cost.step_s(Batch(2000, 2000)) == pytest.approx(2 * 12.85e9 * 2000 / 312e12)
    half = RooflineStepCost.from_specs(
        models.get_model("facebook/opt-13b"),
        models.get_gpu("A100-40GB"),
        EngineConfig().replace(tensor_parallel_size=2),
    )
    assert (
        half.weights_bytes == pytest.approx(cost.weights_bytes / 2)
        and half.kv_bytes_per_token == cost.kv_bytes_per_token / 2
    )


def test_calibrated_steps_add_decode_and_prefill_times():
    cost = calibrated()
    assert cost.step_s(Batch(4, 4 * 1024, 4, 4 * 1024)) == pytest.approx(8.0 / 1000)  # 4 decodes at 1,024 tokens
    assert cost.step_s(Batch(1024 + 1, 2048, 1, 1024)) == pytest.approx((6.0 + 40.0) / 1000)  # + a 1,024-token prefill


def test_the_compiled_loops_decode_runs_under_a_growing_step_cost_equal_its_steps():
    """The roofline's steps grow with the context: the compiled loop's decode runs time each step as step_s does."""
    pytest.importorskip("numba", reason="numba is not installed (fix: make setup installs it from requirements.lock)")
    cost = RooflineStepCost.from_specs(models.get_model("facebook/opt-13b"), models.get_gpu("A100-40GB"))
    rng = np.random.default_rng(0)
    w = Workload(np.cumsum(rng.exponential(0.2, 200)), rng.integers(10, 600, 200), rng.integers(1, 400, 200))
    config = EngineConfig().replace(max_model_len=2048, async_scheduling=False)
    slow = Engine(w, config, num_gpu_blocks=300, cost=cost, path="reference").run()
    engine = Engine(w, config, num_gpu_blocks=300, cost=cost, path="compiled")
    fast = engine.run()
    assert np.array_equal(slow.finish_s, fast.finish_s) and np.array_equal(slow.first_token_s, fast.first_token_s)
    assert np.array_equal(slow.steps["end_s"], fast.steps["end_s"])
    assert slow.num_preemptions.sum() > 0 and engine.num_decode_runs > 0


OPT, A100 = models.get_model("facebook/opt-13b"), models.get_gpu("A100-40GB")


def family(name: str) -> StepCost:
    """One step cost of each family, built by the factory."""
    if name == "calibrated":
        return calibrated()
    hardware = {"model": OPT, "gpu": A100} if name in HARDWARE_STEP_COSTS else {}
    return make_step_cost(name, **hardware, fractions_gpu="A100-SXM-80GB" if name == "measured" else None)


@pytest.mark.parametrize("name", STEP_COSTS)
def test_every_family_has_the_protocol_and_a_lower_bound_on_its_steps(name):
    cost = family(name)
    assert isinstance(cost, StepCost) and cost.source and cost.describe()
    assert cost.name == ("roofline" if name == "measured" else name)  # OPT-13B has no profile: the roofline itself
    for tokens, decodes in [(1, 1), (8, 8), (300, 4), (1025, 1), (2048, 0)]:
        context = decodes * 700 + (tokens - decodes) * 2
        assert cost.min_step_s(tokens) <= cost.step_s(Batch(tokens, context, decodes, decodes * 700))


def test_the_factory_builds_each_family_as_its_class_does():
    assert make_step_cost("constant") == ConstantStepCost() and make_step_cost("linear", step_ms=5.0) == LinearStepCost(
        5.0
    )
    assert make_step_cost("roofline", model=OPT, gpu=A100) == RooflineStepCost.from_specs(OPT, A100)
    rtx = models.get_gpu("RTX-PRO-6000-Server-96GB")
    assert isinstance(
        make_step_cost("measured", model=models.get_model("meta-llama/Llama-3.1-8B"), gpu=rtx), MeasuredStepCost
    )
    vllm_2023 = make_step_cost("vllm-2023", model=OPT, gpu=A100, config=EngineConfig().replace(block_size=32))
    assert isinstance(vllm_2023, Vllm2023StepCost) and vllm_2023.block_size == 32
    with pytest.raises(ValueError, match="cost='clock' is not allowed"):
        make_step_cost("clock")
    with pytest.raises(ValueError, match="model=None is not allowed: must be given: the roofline step cost needs"):
        make_step_cost("roofline")
