"""Cost models: how long serving takes. The slot model's per-request service time (section 2)."""
from __future__ import annotations

from bisect import bisect_left, bisect_right
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
# computed + new), num_decodes and decode_context_tokens (the same for requests computing one last token), and,
# for the costs that read them (measured), num_prefills (the other scheduled requests: prefill chunks) and
# prefill_attention_pairs (sum over those chunks of n x c + n(n+1)/2: the query-key pairs of n new tokens after
# c computed ones under the causal mask).
# run_s gives the k steps of a decode run at once: num_decodes requests decode every step and their
# context grows by num_decodes tokens per step; it returns one float when every step lasts the same, else
# an array, computed by the same float operations as step_s so that both paths give the same times.
STEP_COSTS = ("constant", "linear", "roofline", "calibrated", "measured")


def checked_s(cost, seconds, num_tokens: int):
    """seconds (step_s's float, or run_s's float or array) when every step lasts 0 s or more; else the one-line
    ValueError naming the step cost: a profile or fitted coefficients extrapolated below 0 s, or a NaN, would
    otherwise run the clock backwards unseen."""
    least = seconds if isinstance(seconds, float) else float(np.min(seconds))
    if not least >= 0.0:
        raise ValueError(f"the {cost.name} step cost gave a step of {num_tokens:,} tokens {least:.6g} s: a step "
                         "lasts 0 s or more, so its profile or coefficients are wrong there (fix them, or choose "
                         "another step cost)")
    return seconds


@dataclass(frozen=True)
class ConstantStepCost:
    """Every step takes step_ms, whatever it schedules (the article's 8 ms per output token)."""

    step_ms: float = MS_PER_TOKEN
    name = "constant"

    def __post_init__(self):
        validate.in_range("step_ms", self.step_ms, "ms_per_token")

    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0,
               num_prefills: int = 0, prefill_attention_pairs: int = 0) -> float:
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

    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0,
               num_prefills: int = 0, prefill_attention_pairs: int = 0) -> float:
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

    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0,
               num_prefills: int = 0, prefill_attention_pairs: int = 0) -> float:
        """Seconds of one step (see the class)."""
        return float(self._seconds(np.float64(num_tokens), np.float64(context_tokens)))

    def run_s(self, num_decodes: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Seconds of each step of a decode run: the context grows by num_decodes tokens a step."""
        context = context_tokens + num_decodes * np.arange(num_steps, dtype=np.int64)
        return self._seconds(np.float64(num_decodes), context.astype(np.float64))

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s): the weights read once or their FLOPs, no
        KV read."""
        return self.step_s(num_tokens, 0)


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

    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0,
               num_prefills: int = 0, prefill_attention_pairs: int = 0) -> float:
        """Seconds of one step (see the class)."""
        return float(self._ms(num_tokens, num_decodes, decode_context_tokens)[0] / 1000.0)

    def run_s(self, num_decodes: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Seconds of each step of a decode run (all its tokens are decodes)."""
        context = context_tokens + num_decodes * np.arange(num_steps, dtype=np.int64)
        return self._ms(num_decodes, num_decodes, context) / 1000.0


# ---------------------------------------------------------------- the measured clock
def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                            max_capture_size: int = 512) -> tuple[int, ...]:
    """vLLM 0.33's default CUDA-graph capture sizes (tokens), as VllmConfig._set_cudagraph_sizes builds them
    (vllm/config/vllm.py; the pattern documented at CompilationConfig.max_cudagraph_capture_size in
    vllm/config/compilation.py) for one token per decode: [1, 2, 4] + range(8, 256, 8) + range(256, M + 1, 16)
    with M = min(2 x max_num_seqs, max_capture_size, max_num_batched_tokens), plus max_num_batched_tokens and
    max_num_seqs where they fit. max_capture_size: 512, or 1024 on data-center Blackwell (B200) GPUs."""
    validate.positive_int("max_num_seqs", max_num_seqs)
    validate.positive_int("max_num_batched_tokens", max_num_batched_tokens)
    ceiling = min(2 * max_num_seqs, validate.positive_int("max_capture_size", max_capture_size))
    uniform_decode = [max_num_seqs] if max_num_seqs <= ceiling else []
    ceiling = min(max_num_batched_tokens, ceiling)
    sizes = [s for s in (1, 2, 4) if s <= ceiling]
    if ceiling >= 8:
        sizes += range(8, min(ceiling + 1, 256), 8)
    if ceiling >= 256:
        sizes += range(256, ceiling + 1, 16)
    if max_num_batched_tokens <= ceiling:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in uniform_decode if s <= max_num_batched_tokens]
    return tuple(sorted(set(sizes)))


def _bracket(axis: list, x: float) -> tuple[int, float]:
    """(j, w): x lies w of the way from axis[j] to axis[j + 1]; below axis[0] w = 0 (its value), above the last
    point w > 1 (linear extrapolation from the last two)."""
    j = min(max(bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return j, max((x - axis[j]) / (axis[j + 1] - axis[j]), 0.0)


def _bracket_array(axis: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_bracket of every x (the same float operations)."""
    j = np.minimum(np.maximum(np.searchsorted(axis, x, side="right") - 1, 0), len(axis) - 2)
    return j, np.maximum((x - axis[j]) / (axis[j + 1] - axis[j]), 0.0)


def _blend(low, high, w):
    """(1 - w) x low + w x high: low at w = 0 and high at w = 1 exactly (floats or arrays alike)."""
    return (1.0 - w) * low + w * high


def _interp(axis: list, values: list, x: float) -> float:
    """Piecewise linear in axis's measured points; past the last, linear along the secant of the last doubling
    (from the last point at or below half the last abscissa), not of the last two points: on a densely measured
    axis (tokens every 16 up to 2,048) those two lie within the measurements' noise of each other, and their slope
    can even fall (Qwen3-32B's dense operators measure 350.8 ms at 2,032 tokens, 348.1 ms at 2,048)."""
    if x <= axis[-1]:
        j, w = _bracket(axis, x)
        return _blend(values[j], values[j + 1], w)
    j = max(bisect_right(axis, axis[-1] / 2) - 1, 0)
    return values[-1] + (values[-1] - values[j]) * (x - axis[-1]) / (axis[-1] - axis[j])


@dataclass(frozen=True, eq=False)
class MeasuredStepCost:
    """A step's duration from public operator-level GPU measurements of vLLM's layers, for the batch the
    scheduler built: the sum of these terms (microseconds of GPU kernels; numbers from kvlab.core.profiles):

    - dense: the operators that scale with the step's batched tokens, num_layers x one decoder layer's
      (qkv_proj, o_proj, gate_up_proj, down_proj, act_fn, rotary_emb, input and post-attention RMSNorm, Qwen3's
      q_norm and k_norm) plus the embedding and final norm once, by tokens: LLMServingSim's dense.csv, measured
      through vLLM 0.19's layers, one layer, eager, at 1..2,048 tokens;
    - attention, num_layers x one layer's, by (prefill chunk tokens, their history, decodes, the decodes' mean
      history): LLMServingSim's attention.csv, a 4-D grid measured with at most one prefill chunk beside
      n_decode decodes of equal history (FlashAttention's varlen kernel: a mixed batch is slower than its parts
      apart, so the grid is read whole). The step's prefill chunks are looked up as one chunk of their summed
      tokens n whose history gives their query-key pairs (prefill_attention_pairs = n x c + n(n+1)/2, so
      c = (pairs - n(n+1)/2) / n, at least 0); a caller that gives no pairs (num_prefills=0) has its prefill
      tokens taken as one chunk of history context_tokens - decode_context_tokens - n. Decodes of unequal
      history are looked up at their mean (the skew penalty LLMServingSim fits is left out: the scheduler gives
      no spread);
    - per sequence: lm_head (LogitsProcessor) and the sampler once a step, by scheduled sequences
      (num_decodes + num_prefills): LLMServingSim's per_sequence.csv;
    - MoE, num_layers x one layer's block, by (tokens, experts active): LLMServingSim's moe.csv (TP 1 only).
      Experts active are their expectation under uniform top-k routing, E x (1 - (1 - k/E)^tokens); a profile
      without moe.csv is a dense model's (an MoE model without it has no profile);
    - all-reduce when TP > 1: 2 x num_layers + 1 a step (after o_proj and the MLP, and the embedding's), each
      summing tokens x hidden_size x 2 bytes, at the ring's 2 (TP - 1) / TP x bytes over the GPU's link
      bandwidth each way (data/profiles/interconnects.csv, datasheets): a bound, not a measurement (no public
      operator profile of these GPUs measures it), its latency left out;
    - CUDA graphs: a step of at most max_cudagraph_capture_size tokens runs padded to the next of
      cudagraph_capture_sizes (vLLM 0.33's CudagraphDispatcher, vllm/v1/cudagraph_dispatcher.py: a decode-only
      batch in a full graph, a mixed one in piecewise graphs, both padded), which the dense, MoE and all-reduce
      terms are read at; attention and per-sequence work run on the real requests;
    - step_overhead_ms once a step: 0 by default, since the profiles time GPU kernels only (vLLM's CPU
      scheduling, input preparation and kernel-launch gaps are in no operator profile).

    Interpolation is piecewise linear between measured points (multilinear on the attention grid, bilinear on
    the MoE grid), a measured point giving its own time; below an axis's first point its value is kept, above
    its last it is extrapolated linearly (tokens past 2,048, contexts past 16,384, decodes past 256: linear in
    those where the kernels are bandwidth- or compute-bound, an underestimate for a prefill chunk's causal
    attention, which grows as its square): on the grids from their last two points (powers of two, a doubling
    apart), on the densely measured dense and per-sequence axes along the secant of their last doubling (_interp). Points the profiles could not measure are
    filled as kvlab.core.profiles.attention_grid and moe_grid say.

    Where (model, GPU, TP) has no profile, for_model gives the roofline (RooflineStepCost.from_specs) at the
    GPU's sustained bandwidth and FLOP/s instead (roofline set, every step delegated to it), cost_source saying
    so. The coefficients are only ever read from operator-level measurements; end-to-end vLLM runs are checks."""

    num_layers: int = 1
    dense_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))      # tokens measured, increasing
    dense_us: np.ndarray = field(default_factory=lambda: np.zeros(0))          # the step's dense operators (us)
    sequences: np.ndarray = field(default_factory=lambda: np.zeros(0))         # sequences measured, increasing
    per_sequence_us: np.ndarray = field(default_factory=lambda: np.zeros(0))   # lm_head + sampler (us)
    attention_axes: tuple = ()            # (prefill chunk tokens, their history, decodes, decode history), from 0
    attention_us: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0, 0)))   # one layer's (us)
    cudagraph_capture_sizes: tuple = ()   # tokens; () = no CUDA graphs
    moe_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))        # MoE grid: tokens, experts active
    moe_experts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    moe_us: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))       # one layer's MoE block (us)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    all_reduce_bytes_per_token: float = 0.0   # bytes one all-reduce sums per token (0: no all-reduce)
    all_reduce_gb_s: float = 0.0              # the link's bandwidth each way, GB/s
    tensor_parallel_size: int = 1
    step_overhead_ms: float = 0.0
    roofline: RooflineStepCost | None = None  # set: every step is this (scaled) roofline's
    cost_source: str = ""
    name = "measured"

    def __post_init__(self):
        validate.positive_int("num_layers", self.num_layers)
        validate.positive_int("tensor_parallel_size", self.tensor_parallel_size)
        validate.in_range("step_overhead_ms", self.step_overhead_ms, "step_ms")
        if self.roofline is not None:
            if not isinstance(self.roofline, RooflineStepCost):
                validate.fail("roofline", type(self.roofline).__name__, "must be a kvlab.core.cost.RooflineStepCost")
            return
        self._check_axis("dense_tokens", self.dense_tokens, 1)
        self._check_axis("sequences", self.sequences, 1)
        self._check_values("dense_us", self.dense_us, (len(self.dense_tokens),))
        self._check_values("per_sequence_us", self.per_sequence_us, (len(self.sequences),))
        if len(self.attention_axes) != 4:
            validate.fail("attention_axes", len(self.attention_axes), "must be the 4 axes (prefill chunk tokens, "
                          "their history, decodes, decode history)")
        for name, axis in zip(("prefill_chunk", "kv_prefill", "n_decode", "kv_decode"), self.attention_axes):
            self._check_axis(f"attention_axes[{name}]", axis, 0)
        self._check_values("attention_us", self.attention_us, tuple(len(a) for a in self.attention_axes))
        if self.num_experts:
            validate.positive_int("num_experts_per_tok", self.num_experts_per_tok)
            self._check_axis("moe_tokens", self.moe_tokens, 1)
            self._check_axis("moe_experts", self.moe_experts, 1)
            self._check_values("moe_us", self.moe_us, (len(self.moe_tokens), len(self.moe_experts)))
        sizes = list(self.cudagraph_capture_sizes)
        if sizes and (sizes != sorted(set(sizes)) or sizes[0] < 1):
            validate.fail("cudagraph_capture_sizes", tuple(sizes), "must be increasing token counts >= 1")
        validate.non_negative_number("all_reduce_bytes_per_token", self.all_reduce_bytes_per_token)
        if self.all_reduce_bytes_per_token:
            validate.positive_number("all_reduce_gb_s", self.all_reduce_gb_s)
        # Python copies of the tables: a step is a few bisections and blends, no numpy call.
        decode = np.asarray(self.attention_us)[0, 0]
        ring = 2.0 * (self.tensor_parallel_size - 1) / self.tensor_parallel_size
        num_all_reduces = 2 * self.num_layers + 1
        per_token_us = (num_all_reduces * ring * self.all_reduce_bytes_per_token / (self.all_reduce_gb_s * 1e3)
                        if self.all_reduce_bytes_per_token else 0.0)
        fast = {"_tokens": self.dense_tokens.tolist(), "_dense": self.dense_us.tolist(),
                "_sequences": self.sequences.tolist(), "_per_sequence": self.per_sequence_us.tolist(),
                "_axes": [np.asarray(a, dtype=np.float64).tolist() for a in self.attention_axes],
                "_attention": np.asarray(self.attention_us).tolist(),
                "_decode_grid": decode, "_decode_rows": {}, "_kv_axis": np.asarray(self.attention_axes[3], dtype=np.float64),
                "_layers": float(self.num_layers), "_sizes": sizes,
                "_all_reduce_us_per_token": per_token_us, "_overhead_us": self.step_overhead_ms * 1000.0,
                "_moe": (self.moe_tokens.tolist(), self.moe_experts.tolist(), self.moe_us.tolist())}
        for key, value in fast.items():
            object.__setattr__(self, key, value)

    @staticmethod
    def _check_axis(name: str, axis, first: int) -> None:
        values = np.asarray(axis, dtype=np.float64)
        if values.ndim != 1 or len(values) < 2 or values[0] < first or np.any(np.diff(values) <= 0):
            validate.fail(name, values.tolist()[:6], f"must be at least 2 increasing points from {first}")

    @staticmethod
    def _check_values(name: str, values, shape: tuple) -> None:
        values = np.asarray(values, dtype=np.float64)
        if values.shape != shape:
            validate.fail(name, values.shape, f"must have the shape {shape} of its axes")
        if not np.all(np.isfinite(values)) or values.min() < 0:
            validate.fail(name, float(values[~np.isfinite(values) | (values < 0)].flat[0]), "must be finite times >= 0 us")

    # ---------------------------------------------------------------- construction
    @classmethod
    def for_model(cls, model, gpu, config=None, step_overhead_ms: float = 0.0,
                  fractions_gpu: str | None = None) -> "MeasuredStepCost":
        """The measured clock of a ModelSpec on a GpuSpec at config's parallelism: its operator profile where
        data/profiles has one (same model, GPU and tensor_parallel_size, no pipeline parallelism), else the
        roofline at the GPU's sustained bandwidth and FLOP/s (kvlab.core.profiles.sustained_fractions); a GPU
        no profile measures is refused, unless fractions_gpu names a measured GPU of the same chip whose sustained
        fractions it takes (e.g. the A100-40GB from the A100-SXM-80GB)."""
        from kvlab.core import profiles
        from kvlab.core.config import EngineConfig

        config = EngineConfig() if config is None else config
        if fractions_gpu is not None:
            validate.one_of("fractions_gpu", fractions_gpu, profiles.measured_gpus())
        elif gpu.name not in profiles.measured_gpus():
            validate.fail("gpu", gpu.name, f"has no operator-level measurement for the measured clock; GPUs with "
                          f"measurements: {', '.join(profiles.measured_gpus())} (or use the roofline clock: "
                          "--cost roofline)")
        tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
        profile = profiles.find_profile(gpu.name, model.name, tp) if pp == 1 else None
        if profile is not None:
            return cls.from_profile(profile, model, config, step_overhead_ms)
        fractions = profiles.sustained_fractions(fractions_gpu or gpu.name)
        roofline = RooflineStepCost.from_specs(model, gpu, config)
        scaled = RooflineStepCost(roofline.weights_bytes, roofline.kv_bytes_per_token, roofline.num_params,
                                  roofline.memory_bandwidth_gb_s * fractions.memory_bandwidth_fraction,
                                  roofline.bf16_dense_tflops * fractions.flop_fraction)
        why = "pipeline parallelism is not profiled" if pp > 1 else f"no profile of {model.name} at TP {tp}"
        return cls(roofline=scaled, tensor_parallel_size=tp, step_overhead_ms=step_overhead_ms,
                   cost_source=f"roofline scaled by sustained fractions measured on {fractions_gpu or gpu.name} ({why}): "
                               f"{fractions.describe()}")

    @classmethod
    def from_profile(cls, profile, model, config=None, step_overhead_ms: float = 0.0) -> "MeasuredStepCost":
        """The measured clock of a complete kvlab.core.profiles.OperatorProfile for model (its layers) under
        config's scheduler (CUDA-graph sizes) and tensor parallelism (the all-reduce)."""
        from kvlab.core import profiles
        from kvlab.core.config import EngineConfig

        config = EngineConfig() if config is None else config
        entry = profile.entry
        if model.name != entry.model or not profile.complete:
            validate.fail("profile", entry.label, f"must be a complete profile of {model.name}")
        tp = config.parallel.tensor_parallel_size
        if tp != entry.tensor_parallel_size:
            validate.fail("tensor_parallel_size", tp, f"must be the profile's ({entry.tensor_parallel_size})")
        tokens, dense = profile.dense
        unknown = sorted(set(dense) - set(profiles.LAYER_CALLS) - set(profiles.STEP_CALLS))
        if unknown:
            validate.fail("profile", entry.label, f"has operators kvlab does not place in a step: {', '.join(unknown)}")
        layer_us = sum(calls * dense[op] for op, calls in profiles.LAYER_CALLS.items() if op in dense)
        step_us = sum(calls * dense[op] for op, calls in profiles.STEP_CALLS.items() if op in dense)
        sequences, per_sequence = profile.per_sequence
        axes, attention = profile.attention
        source, link = entry.label, None
        if tp > 1:
            link = profiles.interconnect_gb_s(entry.gpu)
            source += (f"; all-reduce: ring bound at {link[1]} {link[0]:g} GB/s" if link else
                       "; all-reduce left out (no interconnect figure for the GPU)")
        moe = profile.moe if entry.num_experts else (np.zeros(0), np.zeros(0), np.zeros((0, 0)))
        scheduler = config.scheduler
        return cls(model.num_layers, tokens, model.num_layers * layer_us + step_us, sequences,
                   sum(per_sequence.values()), axes, attention,
                   cudagraph_capture_sizes(scheduler.max_num_seqs, scheduler.max_num_batched_tokens),
                   *moe, entry.num_experts, entry.num_experts_per_tok,
                   float(entry.hidden_size * 2) if link else 0.0, link[0] if link else 0.0, tp, step_overhead_ms,
                   cost_source=source)

    # ---------------------------------------------------------------- terms (us)
    def padded_tokens(self, num_tokens: int) -> int:
        """The tokens a step of num_tokens runs with: the next CUDA-graph capture size, or itself past the last."""
        sizes = self._sizes
        if not sizes or num_tokens > sizes[-1]:
            return num_tokens
        return sizes[bisect_left(sizes, num_tokens)]

    def active_experts(self, num_tokens: int) -> float:
        """Experts a layer runs for num_tokens tokens under uniform top-k routing: E x (1 - (1 - k/E)^tokens)."""
        e, k = self.num_experts, self.num_experts_per_tok
        return min(float(e), float(k * num_tokens), e * (1.0 - (1.0 - k / e) ** num_tokens))

    def moe_block_us(self, num_tokens: int) -> float:
        """One layer's MoE block at num_tokens (us; 0 for a dense model)."""
        if not self.num_experts:
            return 0.0
        tokens, experts, grid = self._moe
        i, wi = _bracket(tokens, num_tokens)
        j, wj = _bracket(experts, self.active_experts(num_tokens))
        return _blend(_blend(grid[i][j], grid[i][j + 1], wj), _blend(grid[i + 1][j], grid[i + 1][j + 1], wj), wi)

    def fixed_us(self, num_tokens: int, num_sequences: int) -> float:
        """Every term but attention (us): dense, MoE and all-reduce at the padded tokens, per-sequence, overhead."""
        padded = self.padded_tokens(num_tokens)
        us = _interp(self._tokens, self._dense, padded)
        us += self._layers * self.moe_block_us(padded)
        us += _interp(self._sequences, self._per_sequence, num_sequences)
        us += self._all_reduce_us_per_token * padded
        return us + self._overhead_us

    def _decode_row(self, num_decodes: int) -> tuple[list, np.ndarray]:
        """One layer's decode attention (us) for num_decodes at each measured history: the decode grid blended
        along the decodes first (kept, as a list and an array of the same floats)."""
        row = self._decode_rows.get(num_decodes)
        if row is None:
            i, wi = _bracket(self._axes[2], num_decodes)
            grid = self._decode_grid
            values = _blend(grid[i], grid[i + 1], wi)
            row = self._decode_rows[num_decodes] = (values.tolist(), values)
        return row

    def decode_attention_us(self, num_decodes: int, history_tokens):
        """One layer's attention for num_decodes decodes of history_tokens computed tokens each (us; a float, or
        an array for an array of histories: the same float operations)."""
        values, array = self._decode_row(num_decodes)
        if isinstance(history_tokens, np.ndarray):
            j, w = _bracket_array(self._kv_axis, history_tokens)
            return _blend(array[j], array[j + 1], w)
        j, w = _bracket(self._axes[3], history_tokens)
        return _blend(values[j], values[j + 1], w)

    def mixed_attention_us(self, prefill_tokens: int, prefill_history_tokens: float, num_decodes: int,
                     decode_history_tokens: float) -> float:
        """One layer's attention for a prefill chunk of prefill_tokens after prefill_history_tokens beside
        num_decodes decodes of decode_history_tokens each (us): multilinear on the measured grid."""
        if not prefill_tokens:
            return self.decode_attention_us(num_decodes, decode_history_tokens)
        brackets = [_bracket(axis, x) for axis, x in
                    zip(self._axes, (prefill_tokens, prefill_history_tokens, num_decodes, decode_history_tokens))]
        (a, wa), (b, wb), (c, wc), (d, wd) = brackets
        grid = self._attention

        def along_kv(p, q, r):
            row = grid[p][q][r]
            return _blend(row[d], row[d + 1], wd)

        def along_decodes(p, q):
            return _blend(along_kv(p, q, c), along_kv(p, q, c + 1), wc)

        def along_history(p):
            return _blend(along_decodes(p, b), along_decodes(p, b + 1), wb)

        return _blend(along_history(a), along_history(a + 1), wa)

    # ---------------------------------------------------------------- the engine's interface
    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0,
               num_prefills: int = 0, prefill_attention_pairs: int = 0) -> float:
        """Seconds of one step (see the class)."""
        if self.roofline is not None:
            return self.roofline.step_s(num_tokens, context_tokens, num_decodes, decode_context_tokens)
        prefill_tokens = num_tokens - num_decodes
        decode_history = (decode_context_tokens - num_decodes) / num_decodes if num_decodes else 0.0
        if not prefill_tokens:
            us = self.fixed_us(num_tokens, num_decodes)
            return (us + self._layers * self.decode_attention_us(num_decodes, decode_history)) / 1e6
        if num_prefills:
            history = max(0.0, (prefill_attention_pairs - prefill_tokens * (prefill_tokens + 1) / 2) / prefill_tokens)
        else:   # a caller without the prefill aggregates: one chunk
            history = max(0.0, float(context_tokens - decode_context_tokens - prefill_tokens))
        us = self.fixed_us(num_tokens, num_decodes + max(num_prefills, 1))
        return (us + self._layers * self.mixed_attention_us(prefill_tokens, history, num_decodes, decode_history)) / 1e6

    def run_s(self, num_decodes: int, context_tokens: int, num_steps: int):
        """Seconds of each step of a decode run (an array; the context grows by num_decodes tokens a step)."""
        if self.roofline is not None:
            return self.roofline.run_s(num_decodes, context_tokens, num_steps)
        context = context_tokens + num_decodes * np.arange(num_steps, dtype=np.int64)
        history = (context - num_decodes) / num_decodes
        us = self.fixed_us(num_decodes, num_decodes)
        return (us + self._layers * self.decode_attention_us(num_decodes, history)) / 1e6

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s), whatever the batch: every term but
        attention (at least 0) at those tokens, the per-sequence term at its least measured value."""
        if self.roofline is not None:
            return self.roofline.min_step_s(num_tokens)
        one = _interp(self._sequences, self._per_sequence, 1)
        return (self.fixed_us(num_tokens, 1) - one + min(self._per_sequence)) / 1e6


# ---------------------------------------------------------------- the clock of vLLM 2023
def paged_attention_us(launch_us, us_per_sequence, us_per_token, us_per_block, block_size: int, num_decodes,
                       decode_context_tokens):
    """One layer's PagedAttention kernel (us): launch + per sequence x decodes + per token x context tokens + per block
    x blocks, blocks = context tokens / block_size + decodes x (1 - 1/block_size) / 2; 0 without decodes. Floats or
    arrays alike."""
    blocks = decode_context_tokens / block_size + num_decodes * (1.0 - 1.0 / block_size) / 2.0
    us = launch_us + us_per_sequence * num_decodes + us_per_token * decode_context_tokens + us_per_block * blocks
    if np.ndim(num_decodes) == 0:
        return us if num_decodes else 0.0 * decode_context_tokens
    return np.where(np.asarray(num_decodes) > 0, us, 0.0)


@dataclass(frozen=True)
class Clock2023StepCost:
    """vLLM of mid-2023 (v0.1: eager PyTorch, no CUDA graphs, its first PagedAttention kernel) serving one model on
    one GPU: MeasuredStepCost's terms, each in closed form with a few coefficients (kvlab.sections.clock_2023
    fits them to Anyscale's June 2023 benchmark and to the vLLM paper's Fig. 18a). A step is the sum of

    - step_overhead_ms once (the CPU's scheduling, input preparation and the server's loop);
    - dense: max(weights_bytes / memory_bandwidth_gb_s, 2 x num_params x num_tokens / dense_tflops), the sustained
      (not datasheet) figures: the linear layers read their weights once and do 2 FLOPs a parameter a token;
    - decode attention, num_layers x (attention_launch_us + attention_us_per_sequence x decodes
      + attention_us_per_token x their context tokens + attention_us_per_block x the blocks they touch), the
      PagedAttention kernel; blocks = context tokens / block_size + decodes x (1 - 1/block_size) / 2 (a
      sequence's last block is half full on average: the engine gives only the decodes' summed context);
    - prefill attention, num_layers x 4 x hidden_size FLOPs a query-key pair at dense_tflops (QK^T and PV).
    """

    num_layers: int
    hidden_size: int
    weights_bytes: float
    num_params: float
    memory_bandwidth_gb_s: float      # sustained
    dense_tflops: float               # sustained
    attention_launch_us: float
    attention_us_per_sequence: float
    attention_us_per_token: float
    attention_us_per_block: float
    block_size: int = 16
    step_overhead_ms: float = 0.0
    source: str = ""
    name = "clock-2023"

    def __post_init__(self):
        validate.positive_int("num_layers", self.num_layers)
        validate.positive_int("hidden_size", self.hidden_size)
        for name in ("weights_bytes", "num_params", "memory_bandwidth_gb_s", "dense_tflops"):
            validate.positive_number(name, getattr(self, name))
        for name in ("attention_launch_us", "attention_us_per_sequence", "attention_us_per_token",
                     "attention_us_per_block"):
            validate.non_negative_number(name, getattr(self, name))
        validate.in_range("block_size", self.block_size, "block_size")
        validate.in_range("step_overhead_ms", self.step_overhead_ms, "step_ms")

    @classmethod
    def from_coefficients(cls, model, gpu, coefficients: dict, block_size: int = 16) -> "Clock2023StepCost":
        """The clock of a ModelSpec (num_params_b > 0) on a GpuSpec from named coefficients: memory_bandwidth_fraction
        and flop_fraction (of the GPU's datasheet bandwidth and dense bf16 FLOP/s), attention_launch_us,
        attention_us_per_sequence, attention_us_per_token, attention_us_per_block, step_overhead_ms."""
        from kvlab.core.models import weights_bytes_per_gpu

        need = ("memory_bandwidth_fraction", "flop_fraction", "attention_launch_us", "attention_us_per_sequence",
                "attention_us_per_token", "attention_us_per_block", "step_overhead_ms")
        missing = [name for name in need if name not in coefficients]
        if missing:
            validate.fail("coefficients", ", ".join(missing), f"are missing; a clock needs {', '.join(need)}")
        if model.num_params_b <= 0:
            validate.fail("model", model.name, "has no parameter count (num_params_b) for the dense term")
        c = {name: float(coefficients[name]) for name in need}
        validate.fraction("memory_bandwidth_fraction", c["memory_bandwidth_fraction"])
        validate.fraction("flop_fraction", c["flop_fraction"])
        return cls(model.num_layers, model.num_attention_heads * model.head_dim, weights_bytes_per_gpu(model, 2.0, 1, 1),
                   model.num_params_b * 1e9, gpu.memory_bandwidth_gb_s * c["memory_bandwidth_fraction"],
                   gpu.bf16_dense_tflops * c["flop_fraction"], c["attention_launch_us"],
                   c["attention_us_per_sequence"], c["attention_us_per_token"], c["attention_us_per_block"],
                   block_size, c["step_overhead_ms"], f"vLLM 2023 clock of {model.name} on {gpu.name}")

    # ---------------------------------------------------------------- terms (us)
    def dense_us(self, num_tokens):
        """The linear layers of a step of num_tokens tokens (us): memory- or compute-bound, whichever is slower."""
        memory_us = self.weights_bytes / (self.memory_bandwidth_gb_s * 1e3)
        compute_us = 2.0 * self.num_params * num_tokens / (self.dense_tflops * 1e6)
        return np.maximum(memory_us, compute_us)

    def decode_attention_us(self, num_decodes: int, decode_context_tokens):
        """One layer's PagedAttention kernel for num_decodes decodes attending decode_context_tokens tokens in all
        (us; 0 without decodes; a float, or an array for an array of contexts)."""
        return paged_attention_us(self.attention_launch_us, self.attention_us_per_sequence, self.attention_us_per_token,
                                  self.attention_us_per_block, self.block_size, num_decodes, decode_context_tokens)

    def prefill_attention_us(self, prefill_attention_pairs: float) -> float:
        """One layer's prefill attention over that many query-key pairs (us): 4 x hidden_size FLOPs a pair."""
        return 4.0 * self.hidden_size * prefill_attention_pairs / (self.dense_tflops * 1e6)

    # ---------------------------------------------------------------- the engine's interface
    def step_s(self, num_tokens: int, context_tokens: int = 0, num_decodes: int = 0, decode_context_tokens: int = 0,
               num_prefills: int = 0, prefill_attention_pairs: int = 0) -> float:
        """Seconds of one step (see the class)."""
        prefill_tokens = num_tokens - num_decodes
        if prefill_tokens and not num_prefills:    # a caller without the prefill aggregates: one chunk
            history = max(0, context_tokens - decode_context_tokens - prefill_tokens)
            prefill_attention_pairs = prefill_tokens * history + prefill_tokens * (prefill_tokens + 1) / 2
        us = (self.step_overhead_ms * 1000.0 + float(self.dense_us(np.float64(num_tokens)))
              + self.num_layers * (self.decode_attention_us(num_decodes, np.float64(decode_context_tokens))
                                   + self.prefill_attention_us(float(prefill_attention_pairs))))
        return float(us) / 1e6

    def run_s(self, num_decodes: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Seconds of each step of a decode run: the context grows by num_decodes tokens a step."""
        context = (context_tokens + num_decodes * np.arange(num_steps, dtype=np.int64)).astype(np.float64)
        us = (self.step_overhead_ms * 1000.0 + self.dense_us(np.float64(num_decodes))
              + self.num_layers * (self.decode_attention_us(num_decodes, context) + self.prefill_attention_us(0.0)))
        return us / 1e6
