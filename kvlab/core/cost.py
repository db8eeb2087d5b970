"""Cost models: how long serving takes. The slot model's per-request service time (section 2)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvlab.core import validate

# The article's defaults (kvlab.core.article), repeated here only because article imports nothing from cost.
from kvlab.core.article import MAX_NUM_SEQS, MS_PER_TOKEN


@dataclass(frozen=True)
class TokenCost:
    """The article's cost model: every output token takes ms_per_token; prompts take nothing."""

    ms_per_token: float = MS_PER_TOKEN

    def __post_init__(self):
        validate.in_range("ms_per_token", self.ms_per_token, "ms_per_token")

    def service_s(self, output_tokens: np.ndarray, prompt_tokens: np.ndarray | None = None) -> np.ndarray:
        """Seconds each request holds its slot: output_tokens x ms_per_token (prompt_tokens cost nothing)."""
        return np.asarray(output_tokens, dtype=np.float64) * (self.ms_per_token / 1000.0)


def _lerp(xp: np.ndarray, fp: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Piecewise-linear fp(x) along the first axis of fp, clamped to xp's ends; a grid point gives its own value
    (a missing neighbour, NaN, does not leak into it)."""
    x = np.clip(x, xp[0], xp[-1])
    if len(xp) == 1:
        return np.broadcast_to(fp[0], x.shape + fp.shape[1:]).copy()
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, len(xp) - 2)
    w = ((x - xp[j]) / (xp[j + 1] - xp[j])).reshape(x.shape + (1,) * (fp.ndim - 1))
    low, high = fp[j], fp[j + 1]
    return np.where(w == 0, low, np.where(w == 1, high, (1 - w) * low + w * high))


@dataclass(frozen=True, eq=False)
class CalibratedCost:
    """A measured cost model: every decode step takes step_ms(batch_size, context), read from a calibration file.

    A request of p prompt tokens and n output tokens holds its slot for the n decode steps at contexts
    p, p+1, ..., p+n-1 (tokens already cached), each at the step time of a batch of batch_size requests
    (a fixed operating point, e.g. all slots busy), plus its prefill when include_prefill is True.
    Interpolation: bilinear in (log2 batch size, log2 context) between measured points; prefill linear in
    log2 prompt tokens. Outside the measured grid: outside="clamp" uses the nearest edge (constant
    extrapolation), outside="raise" refuses. A grid cell with an unmeasured corner (a batch x context
    whose cache did not fit the GPU) always refuses.
    """

    batch_sizes: np.ndarray       # measured batch sizes, increasing
    context_tokens: np.ndarray    # measured contexts, tokens, increasing
    step_ms: np.ndarray           # [batch, context] decode step time, ms (NaN: not measured)
    batch_size: int = MAX_NUM_SEQS  # requests decoded together at every step
    outside: str = "clamp"
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # measured prompts, tokens (empty: none)
    prefill_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))     # prefill time of one prompt, ms
    include_prefill: bool = False
    source: str = ""

    def __post_init__(self):
        validate.positive_int("batch_size", self.batch_size)
        validate.one_of("outside", self.outside, ("clamp", "raise"))
        shape = (len(self.batch_sizes), len(self.context_tokens))
        if np.shape(self.step_ms) != shape or 0 in shape:
            validate.fail("step_ms", np.shape(self.step_ms), f"must have the shape {shape} of (batch_sizes, context_tokens)")
        for name in ("batch_sizes", "context_tokens", "prompt_tokens"):
            values = np.asarray(getattr(self, name))
            if np.any(values <= 0) or np.any(np.diff(values) <= 0):
                validate.fail(name, values.tolist(), "must be positive and increasing")
        if self.include_prefill and len(self.prompt_tokens) == 0:
            validate.fail("include_prefill", True, f"{self.source or 'the calibration'} has no prefill_ms rows")

    @classmethod
    def from_csv(cls, path, *, batch_size: int = 8, outside: str = "clamp", include_prefill: bool = False) -> "CalibratedCost":
        """The cost model of a calibration file (kvlab calibrate's CSV); no torch needed."""
        from kvlab.core.calibration import read_calibration

        calibration = read_calibration(path)
        decode = calibration.kind("decode_step_ms")
        if not decode:
            validate.fail("path", str(path), "has no decode_step_ms rows")
        batches = sorted({r["batch_size"] for r in decode})
        contexts = sorted({r["context_tokens"] for r in decode})
        grid = np.full((len(batches), len(contexts)), np.nan)  # a point not measured stays NaN
        for r in decode:
            grid[batches.index(r["batch_size"]), contexts.index(r["context_tokens"])] = r["value"]
        prefill = sorted(calibration.kind("prefill_ms"), key=lambda r: r["prompt_tokens"])
        return cls(np.array(batches, dtype=np.float64), np.array(contexts, dtype=np.float64), grid, batch_size,
                   outside, np.array([r["prompt_tokens"] for r in prefill], dtype=np.float64),
                   np.array([r["value"] for r in prefill], dtype=np.float64), include_prefill, str(path))

    def _inside(self, name: str, values: np.ndarray, grid: np.ndarray) -> None:
        if self.outside == "raise" and (values.min() < grid[0] or values.max() > grid[-1]):
            bad = values.min() if values.min() < grid[0] else values.max()
            validate.fail(name, int(bad), f"lies outside the measured {grid[0]:g}..{grid[-1]:g} of {self.source or 'the calibration'} "
                          "(outside='clamp' uses the nearest edge)")

    def step_time_ms(self, context_tokens, batch_size: int | None = None) -> np.ndarray:
        """Decode step time (ms) at each context (tokens) for batch_size (default: the model's) requests."""
        batch = float(self.batch_size if batch_size is None else validate.positive_int("batch_size", batch_size))
        context = np.atleast_1d(np.asarray(context_tokens, dtype=np.float64))
        self._inside("batch_size", np.array([batch]), self.batch_sizes)
        self._inside("context_tokens", context, self.context_tokens)
        row = _lerp(np.log2(self.batch_sizes), self.step_ms, np.log2(np.array([batch])))[0]
        ms = _lerp(np.log2(self.context_tokens), row, np.log2(np.maximum(context, 1.0)))
        if np.isnan(ms).any():
            at = int(context[np.isnan(ms)][0])
            validate.fail("context_tokens", at, f"at batch size {batch:g} falls in a cell of {self.source or 'the calibration'} "
                          "with an unmeasured corner (its cache did not fit the GPU)")
        return ms

    def prefill_time_ms(self, prompt_tokens) -> np.ndarray:
        """Prefill time (ms) of one prompt of each length (tokens): linear in log2 prompt tokens."""
        prompt = np.atleast_1d(np.asarray(prompt_tokens, dtype=np.float64))
        self._inside("prompt_tokens", prompt, self.prompt_tokens)
        return _lerp(np.log2(self.prompt_tokens), self.prefill_ms, np.log2(np.maximum(prompt, 1.0)))

    def service_s(self, output_tokens: np.ndarray, prompt_tokens: np.ndarray | None = None) -> np.ndarray:
        """Seconds each request holds its slot: the sum of its decode step times (+ its prefill)."""
        output = np.asarray(output_tokens, dtype=np.int64)
        prompt = np.zeros_like(output) if prompt_tokens is None else np.asarray(prompt_tokens, dtype=np.int64)
        if len(output) == 0:
            return np.zeros(0)
        low, high = int(prompt.min()), int((prompt + output).max())
        # cum[c - low] = total step time of the steps at contexts low .. c-1: a request's steps are one difference
        steps = self.step_time_ms(np.arange(low, max(high, low + 1)))
        cum = np.concatenate([[0.0], np.cumsum(steps)])
        service_ms = cum[prompt + output - low] - cum[prompt - low]
        if self.include_prefill:
            service_ms = service_ms + np.where(prompt > 0, self.prefill_time_ms(np.maximum(prompt, 1)), 0.0)
        return service_ms / 1000.0


# ---------------------------------------------------------------- step costs (the serving engine)
# The engine (kvlab.core.engine) asks a step cost how long one step takes, from what the step schedules:
# num_tokens (all scheduled tokens), context_tokens (sum over scheduled requests of the tokens they attend:
# computed + new), num_decodes and decode_context_tokens (the same for requests computing one last token).
# run_s gives the k steps of a decode run at once: num_decodes requests decode every step and their
# context grows by num_decodes tokens per step; it returns one float when every step lasts the same, else
# an array, computed by the same float operations as step_s so that both paths give the same times.
STEP_COSTS = ("constant", "linear", "roofline", "calibrated")


@dataclass(frozen=True)
class ConstantStepCost:
    """Every step takes step_ms, whatever it schedules (the article's 8 ms per output token)."""

    step_ms: float = MS_PER_TOKEN
    name = "constant"

    def __post_init__(self):
        validate.in_range("step_ms", self.step_ms, "ms_per_token")

    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0) -> float:
        """Seconds of one step: step_ms / 1000."""
        return self.step_ms / 1000.0

    def run_s(self, num_decodes: int, context_tokens: int, num_steps: int) -> float:
        """Seconds of each step of a decode run (all the same)."""
        return self.step_ms / 1000.0


@dataclass(frozen=True)
class LinearStepCost:
    """A step takes step_ms + step_ms_per_token x its scheduled tokens (prefill and decode tokens alike)."""

    step_ms: float = MS_PER_TOKEN
    step_ms_per_token: float = 0.0
    name = "linear"

    def __post_init__(self):
        validate.in_range("step_ms", self.step_ms, "step_ms")
        validate.in_range("step_ms_per_token", self.step_ms_per_token, "step_ms")
        if self.step_ms == 0 and self.step_ms_per_token == 0:
            validate.fail("step_ms", 0.0, "and step_ms_per_token cannot both be 0: a step must take time")

    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0) -> float:
        """Seconds of one step: (step_ms + step_ms_per_token x num_tokens) / 1000."""
        return (self.step_ms + self.step_ms_per_token * num_tokens) / 1000.0

    def run_s(self, num_decodes: int, context_tokens: int, num_steps: int) -> float:
        """Seconds of each step of a decode run (all the same: num_decodes tokens each)."""
        return (self.step_ms + self.step_ms_per_token * num_decodes) / 1000.0


@dataclass(frozen=True)
class RooflineStepCost:
    """A step is bound by memory or compute, whichever is slower, on one GPU of the model's replica:
    max((weights_bytes + kv_bytes_per_token x context_tokens) / memory bandwidth,
        2 x num_params x num_tokens / peak dense bf16 FLOP/s).

    Weights are read once per step and every scheduled request reads the KV of all the tokens it attends;
    each scheduled token costs 2 FLOPs per parameter (attention FLOPs left out). Figures per GPU: with
    tensor parallelism the weights, the KV and the FLOPs are split (from_specs)."""

    weights_bytes: float
    kv_bytes_per_token: float
    num_params: float
    memory_bandwidth_gb_s: float
    bf16_dense_tflops: float
    name = "roofline"

    def __post_init__(self):
        validate.positive_number("weights_bytes", self.weights_bytes)
        validate.positive_number("kv_bytes_per_token", self.kv_bytes_per_token)
        validate.positive_number("num_params", self.num_params)
        validate.positive_number("memory_bandwidth_gb_s", self.memory_bandwidth_gb_s)
        validate.positive_number("bf16_dense_tflops", self.bf16_dense_tflops)

    @classmethod
    def from_specs(cls, model, gpu, config=None, weight_bytes_per_param: float = 2.0) -> "RooflineStepCost":
        """The roofline of a ModelSpec (num_params_b > 0) on a GpuSpec, per GPU of config's parallelism."""
        from kvlab.core.capacity import kv_bytes_per_token
        from kvlab.core.config import EngineConfig
        from kvlab.core.models import weights_bytes_per_gpu

        config = EngineConfig() if config is None else config
        if model.num_params_b <= 0:
            validate.fail("model", model.name, "has no parameter count (num_params_b) for the roofline's weights")
        tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
        return cls(weights_bytes_per_gpu(model, weight_bytes_per_param, tp, pp), kv_bytes_per_token(model, config),
                   model.num_params_b * 1e9 / (tp * pp), gpu.memory_bandwidth_gb_s, gpu.bf16_dense_tflops)

    def _seconds(self, num_tokens, context_tokens):
        memory_s = (self.weights_bytes + self.kv_bytes_per_token * context_tokens) / (self.memory_bandwidth_gb_s * 1e9)
        compute_s = 2.0 * self.num_params * num_tokens / (self.bf16_dense_tflops * 1e12)
        return np.maximum(memory_s, compute_s)

    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0) -> float:
        """Seconds of one step (see the class)."""
        return float(self._seconds(np.float64(num_tokens), np.float64(context_tokens)))

    def run_s(self, num_decodes: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Seconds of each step of a decode run: the context grows by num_decodes tokens a step."""
        context = context_tokens + num_decodes * np.arange(num_steps, dtype=np.int64)
        return self._seconds(np.float64(num_decodes), context.astype(np.float64))


@dataclass(frozen=True, eq=False)
class CalibratedStepCost:
    """Measured step times from a calibration file (kvlab.core.calibration's CSV): a step takes the decode
    step time of its decoding requests (batch = their number, context = their mean context, interpolated
    as CalibratedCost does) plus the prefill time of its other tokens as one prompt."""

    calibration: CalibratedCost
    name = "calibrated"

    def __post_init__(self):
        if not isinstance(self.calibration, CalibratedCost):
            validate.fail("calibration", type(self.calibration).__name__, "must be a kvlab.core.cost.CalibratedCost")
        if len(self.calibration.prompt_tokens) == 0:
            validate.fail("calibration", self.calibration.source, "has no prefill_ms rows, which the engine needs")

    @classmethod
    def from_csv(cls, path, outside: str = "clamp") -> "CalibratedStepCost":
        """The step cost of a calibration file."""
        return cls(CalibratedCost.from_csv(path, outside=outside))

    def _ms(self, num_tokens, num_decodes: int, decode_context_tokens) -> np.ndarray:
        decode_context = np.atleast_1d(np.asarray(decode_context_tokens, dtype=np.float64))
        ms = np.zeros_like(decode_context)
        if num_decodes:
            ms = ms + self.calibration.step_time_ms(decode_context / num_decodes, num_decodes)
        if num_tokens > num_decodes:
            ms = ms + self.calibration.prefill_time_ms(num_tokens - num_decodes)
        return ms

    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0) -> float:
        """Seconds of one step (see the class)."""
        return float(self._ms(num_tokens, num_decodes, decode_context_tokens)[0] / 1000.0)

    def run_s(self, num_decodes: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Seconds of each step of a decode run (all its tokens are decodes)."""
        context = context_tokens + num_decodes * np.arange(num_steps, dtype=np.int64)
        return self._ms(num_decodes, num_decodes, context) / 1000.0
