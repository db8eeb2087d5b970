"""A step cost for a (model, GPU, TP) whose operator profile times its linear layers only (vidur's): those layers
measured, the rest of the step at the roofline's sustained rates."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from kvlab.core import validate
from kvlab.core.cost.batch import Batch
from kvlab.core.cost.cpu import combine_cpu
from kvlab.core.cost.interpolate import interp
from kvlab.core.cost.roofline import RooflineStepCost


@dataclass(frozen=True, eq=False)
class LinearProfileStepCost:
    """A step of a model whose linear layers an operator profile measures and nothing else (vidur's A100, A40 and H100
    profiles), as section 5 builds a decode step of Llama 2 7B:

    - linear: num_layers x one decoder layer's qkv_proj + o_proj + gate_up_proj + down_proj as the profile measures
      them at the step's tokens (padded to the next CUDA-graph capture size as MeasuredStepCost pads; piecewise
      linear between measured token counts, along the last doubling's secant past the last);
    - rest: the roofline (at the GPU's sustained bandwidth and FLOP/s) of everything else: the weights outside those
      layers (embeddings, lm_head, norms) and their FLOPs, the KV every request reads, and tensor parallelism's
      all-reduces (rest.all_reduce);
    - the CPU's scheduling as MeasuredStepCost has it: added to a synchronous step, overlapped with an asynchronous
      one (cpu_sequences, cpu_us; none when empty).

    Attention is the KV read at the sustained bandwidth, not a measurement: the profile has none."""

    num_layers: int
    tokens: np.ndarray  # token counts measured, increasing
    linear_us: np.ndarray  # one decoder layer's four linear layers at each (us)
    rest: RooflineStepCost
    cudagraph_capture_sizes: tuple = ()
    cpu_sequences: tuple = ()
    cpu_us: tuple = ()
    cpu_overlapped: bool = False
    source: str = ""
    name = "measured"

    def __post_init__(self):
        validate.positive_int("num_layers", self.num_layers)
        tokens, times = np.asarray(self.tokens, dtype=np.float64), np.asarray(self.linear_us, dtype=np.float64)
        if tokens.ndim != 1 or len(tokens) < 2 or tokens[0] < 1 or np.any(np.diff(tokens) <= 0):
            validate.fail("tokens", tokens.tolist()[:4], "must be at least 2 increasing token counts from 1")
        if times.shape != tokens.shape or not np.all(np.isfinite(times)) or times.min() < 0:
            validate.fail("linear_us", times.tolist()[:4], "must be one finite time >= 0 us per token count")
        if len(self.cpu_sequences) != len(self.cpu_us):
            validate.fail(
                "cpu_us", len(self.cpu_us), f"must hold one time per sequence count ({len(self.cpu_sequences)})"
            )
        object.__setattr__(self, "_table", (tokens.tolist(), (times * self.num_layers).tolist()))
        object.__setattr__(self, "_sizes", list(self.cudagraph_capture_sizes))
        object.__setattr__(self, "_cpu", (list(self.cpu_sequences), list(self.cpu_us)))

    def linear_step_us(self, num_tokens: int) -> float:
        """Every decoder layer's linear layers at num_tokens (us), padded as vLLM's CUDA graphs pad the step."""
        sizes = self._sizes
        if sizes and num_tokens <= sizes[-1]:
            num_tokens = sizes[bisect_left(sizes, num_tokens)]
        return interp(*self._table, num_tokens)

    def _with_cpu(self, gpu_us, num_sequences: int):
        sequences, cpu_us = self._cpu
        if not sequences:
            return gpu_us
        return combine_cpu(gpu_us, interp(sequences, cpu_us, num_sequences), self.cpu_overlapped)

    def step_s(self, batch: Batch) -> float:
        """Seconds of one step (see the class)."""
        us = self.linear_step_us(batch[0]) + self.rest.step_s(batch) * 1e6
        return self._with_cpu(us, batch[2] + max(batch[4], 1 if batch[0] > batch[2] else 0)) / 1e6

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s): the linear layers, the rest with no KV read
        and the CPU's least time."""
        us = self.linear_step_us(num_tokens) + self.rest.min_step_s(num_tokens) * 1e6
        return combine_cpu(us, min(self._cpu[1], default=0.0), self.cpu_overlapped) / 1e6

    def describe(self) -> str:
        """The step cost in words: where each part comes from."""
        return self.source
