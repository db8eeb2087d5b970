"""Step costs: how long one step of the serving engine (kvlab.core.engine) takes, from the batch it schedules.

Every family is a frozen dataclass with the StepCost protocol, in a module of its own: constant and linear
(simple), roofline, calibrated (a calibration file), measured (operator-level GPU profiles) and vllm_2023 (the vLLM
of mid-2023, fitted to measurements of it). make_step_cost is the one factory: the command line, the sections and
the planner build their step costs with it. The slot model's service times (section 2) are not step costs:
kvlab.core.service_time.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from kvlab.core import validate
from kvlab.core.article import MS_PER_TOKEN
from kvlab.core.config import EngineConfig
from kvlab.core.cost.batch import Batch
from kvlab.core.cost.calibrated import CalibratedStepCost
from kvlab.core.cost.linear_profile import LinearProfileStepCost
from kvlab.core.cost.measured import MeasuredStepCost, cudagraph_capture_sizes, measured_step_cost
from kvlab.core.cost.roofline import RooflineStepCost
from kvlab.core.cost.simple import ConstantStepCost, LinearStepCost
from kvlab.core.cost.vllm_2023 import Vllm2023StepCost, committed_step_cost, load_coefficients, paged_attention_us

# Every family, by its name (StepCost.name); HARDWARE_STEP_COSTS need a model and a GPU.
STEP_COSTS = ("constant", "linear", "roofline", "calibrated", "measured", "vllm-2023")
HARDWARE_STEP_COSTS = ("roofline", "measured", "vllm-2023")


@runtime_checkable
class StepCost(Protocol):
    """What the engine asks of a step cost.

    step_s: seconds of one step, from what it schedules: a Batch (kvlab.core.cost.batch says what each field counts).
    min_step_s: a lower bound (s) on any step of num_tokens scheduled tokens, whatever the batch (the planner's).
    name: the family (one of STEP_COSTS); source: where its numbers come from, in words; describe(): the step
    cost in words, with units.
    """

    name: str

    @property
    def source(self) -> str: ...

    def describe(self) -> str: ...

    def step_s(self, batch: Batch) -> float: ...

    def min_step_s(self, num_tokens: int) -> float: ...


def make_step_cost(
    name: str,
    *,
    model=None,
    gpu=None,
    config=None,
    step_ms: float | None = None,
    step_ms_per_token: float | None = None,
    calibration=None,
    fractions_gpu: str | None = None,
):
    """The step cost of a family (STEP_COSTS): constant (step_ms, default 8 ms) or linear (step_ms + step_ms_per_token
    x scheduled tokens); roofline, measured (its operator profile, else the roofline at the GPU's sustained
    figures: kvlab.core.cost.measured.measured_step_cost) or vllm-2023 (the committed fit, its PagedAttention at
    config's block_size) of a ModelSpec on a GpuSpec under an EngineConfig; calibrated: a calibration file's path."""
    validate.one_of("cost", name, STEP_COSTS)
    step_ms = MS_PER_TOKEN if step_ms is None else step_ms
    if name == "constant":
        return ConstantStepCost(step_ms)
    if name == "linear":
        return LinearStepCost(step_ms, 0.0 if step_ms_per_token is None else step_ms_per_token)
    if name == "calibrated":
        if calibration is None:
            validate.fail("calibration", None, "must be a calibration file's path for the calibrated step cost")
        return CalibratedStepCost.from_csv(calibration)
    if model is None or gpu is None:
        validate.fail(
            "model" if model is None else "gpu", None, f"must be given: the {name} step cost needs a model and a GPU"
        )
    if name == "roofline":
        return RooflineStepCost.from_specs(model, gpu, config)
    if name == "measured":
        return measured_step_cost(model, gpu, config, fractions_gpu=fractions_gpu)
    block_size = EngineConfig().cache.block_size if config is None else config.cache.block_size
    return Vllm2023StepCost.from_coefficients(model, gpu, load_coefficients(), block_size)


def group_step_s(cost, batches) -> float:
    """Seconds of one step of data-parallel ranks in lockstep (vLLM's mixture-of-experts data parallelism), one Batch
    a rank (None, or no tokens: the rank runs vLLM's dummy batch): the step cost's own rule where it has one
    (MeasuredStepCost.group_step_s: every rank padded to the largest, the experts fed by every rank), else the
    slowest rank's step; with no rank scheduled, a dummy step of one token (the cost's least of one token)."""
    rule = getattr(cost, "group_step_s", None)
    if rule is not None:
        return rule(batches)
    steps = [cost.step_s(b) for b in batches if b is not None and b[0]]
    return max(steps) if steps else cost.min_step_s(1)


def checked_s(cost, seconds: float, num_tokens: int) -> float:
    """seconds (step_s's) when the step lasts 0 s or more; else the one-line ValueError naming the step cost: a
    profile or fitted coefficients extrapolated below 0 s, or a NaN, would otherwise run the clock backwards unseen."""
    if not seconds >= 0.0:
        raise ValueError(
            f"the {cost.name} step cost gave a step of {num_tokens:,} tokens {seconds:.6g} s: a step "
            "lasts 0 s or more, so its profile or coefficients are wrong there (fix them, or choose "
            "another step cost)"
        )
    return seconds


__all__ = [
    "HARDWARE_STEP_COSTS",
    "Batch",
    "STEP_COSTS",
    "CalibratedStepCost",
    "ConstantStepCost",
    "LinearProfileStepCost",
    "LinearStepCost",
    "MeasuredStepCost",
    "RooflineStepCost",
    "StepCost",
    "Vllm2023StepCost",
    "checked_s",
    "group_step_s",
    "committed_step_cost",
    "cudagraph_capture_sizes",
    "make_step_cost",
    "measured_step_cost",
    "paged_attention_us",
]
