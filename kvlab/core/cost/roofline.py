"""The roofline step cost: a bound for dense models, the slower of reading the weights and KV and the FLOPs."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core import validate
from kvlab.core.cost import step_time
from kvlab.core.cost.all_reduce import AllReduceCost
from kvlab.core.cost.batch import Batch
from kvlab.core.units import GIB


@dataclass(frozen=True)
class RooflineStepCost:
    """A step is bound by memory or compute, whichever is slower, on one GPU of the model's replica:
    max((weights_bytes + kv_bytes_per_token x context_tokens) / memory bandwidth,
        2 x num_params x num_tokens / peak dense bf16 FLOP/s).

    Weights are read once per step and every scheduled request reads the KV of all the tokens it attends;
    each scheduled token costs 2 FLOPs per parameter (attention FLOPs left out): a lower bound on a dense model's
    step, not on a mixture-of-experts model's, whose every expert it counts for every token. Figures per GPU: with
    tensor parallelism the weights, the KV and the FLOPs are split (from_specs). provenance says where the
    bandwidth and FLOP/s come from when they are not the GPU's datasheet figures (e.g. scaled by sustained
    fractions: kvlab.core.cost.measured.measured_step_cost), whose fallback adds all_reduce's time."""

    weights_bytes: float
    kv_bytes_per_token: float
    num_params: float
    memory_bandwidth_gb_s: float
    bf16_dense_tflops: float
    provenance: str = ""  # empty: the GPU's datasheet (data/gpus.csv)
    all_reduce: AllReduceCost | None = None  # tensor parallelism's all-reduces, added to the step (the fallback's)
    name = "roofline"

    def __post_init__(self):
        validate.positive_number("weights_bytes", self.weights_bytes)
        validate.positive_number("kv_bytes_per_token", self.kv_bytes_per_token)
        validate.positive_number("num_params", self.num_params)
        validate.positive_number("memory_bandwidth_gb_s", self.memory_bandwidth_gb_s)
        validate.positive_number("bf16_dense_tflops", self.bf16_dense_tflops)
        figures = [float(getattr(self, name)) for name in step_time.ROOFLINE]
        object.__setattr__(self, "clock", step_time.clock(4, {"cost_ms": figures}))

    @classmethod
    def from_specs(cls, model, gpu, config=None, weight_bytes_per_param: float = 2.0) -> RooflineStepCost:
        """The roofline of a ModelSpec (num_params_b > 0) on a GpuSpec, per GPU of config's parallelism."""
        from kvlab.core.capacity import kv_bytes_per_token
        from kvlab.core.config import EngineConfig
        from kvlab.core.models import weights_bytes_per_gpu

        config = EngineConfig() if config is None else config
        if model.num_params_b <= 0:
            validate.fail("model", model.name, "has no parameter count (num_params_b) for the roofline's weights")
        tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
        return cls(
            weights_bytes_per_gpu(model, weight_bytes_per_param, tp, pp),
            kv_bytes_per_token(model, config),
            model.num_params_b * 1e9 / (tp * pp),
            gpu.memory_bandwidth_gb_s,
            gpu.bf16_dense_tflops,
        )

    def step_s(self, batch: Batch) -> float:
        """Seconds of one step (see the class; kvlab.core.cost.step_time.roofline_s), with the all-reduce's if any."""
        num_tokens, context_tokens = batch[:2]
        seconds = step_time.roofline_s(self.clock, num_tokens, context_tokens)
        return seconds if self.all_reduce is None else seconds + self.all_reduce.step_us(float(num_tokens)) / 1e6

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s) of a dense model: the weights read once or
        their FLOPs, no KV read (for a mixture-of-experts model the FLOPs of every expert: not a bound)."""
        return self.step_s(Batch(num_tokens, 0))

    @property
    def source(self) -> str:
        """Where the figures come from, in words."""
        return self.provenance or (
            f"roofline at {self.memory_bandwidth_gb_s:g} GB/s and {self.bf16_dense_tflops:g} TFLOPS (datasheet)"
        )

    def describe(self) -> str:
        """The step cost in words, with units and where its figures come from."""
        return self.provenance or (
            f"{self.weights_bytes / GIB:.1f} GiB of weights and {self.kv_bytes_per_token:,.0f} B of KV per token at "
            f"{self.memory_bandwidth_gb_s:g} GB/s, {self.bf16_dense_tflops:g} TFLOPS (the GPU's peak figures, "
            "data/gpus.csv)"
        )
