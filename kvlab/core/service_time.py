"""The slot model's service times (section 2): how long a request holds its slot, known when it arrives.

Not a step cost (kvlab.core.cost: the serving engine's time of one step of a batch): the slot model gives a
request its whole time at once, from its output tokens (TokenServiceTime, the article's) or from a calibration
file's decode step times at a fixed batch size (CalibratedServiceTime).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvlab.core import validate

# The article's defaults (kvlab.core.article).
from kvlab.core.article import MAX_NUM_SEQS, MS_PER_TOKEN


@dataclass(frozen=True)
class TokenServiceTime:
    """The article's service time: every output token takes ms_per_token; prompts take nothing."""

    ms_per_token: float = MS_PER_TOKEN

    def __post_init__(self):
        validate.in_range("ms_per_token", self.ms_per_token, "ms_per_token")

    def service_s(self, output_tokens: np.ndarray, prompt_tokens: np.ndarray | None = None) -> np.ndarray:
        """Seconds each request holds its slot: output_tokens x ms_per_token (prompt_tokens cost nothing)."""
        return np.asarray(output_tokens, dtype=np.float64) * (self.ms_per_token / 1000.0)


def lerp_clamped(xp: np.ndarray, fp: np.ndarray, x: np.ndarray) -> np.ndarray:
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
class CalibratedServiceTime:
    """A measured service time: every decode step takes step_ms(batch_size, context), read from a calibration file.

    A request of p prompt tokens and n output tokens holds its slot for the n decode steps at contexts
    p, p+1, ..., p+n-1 (tokens already cached), each at the step time of a batch of batch_size requests
    (a fixed operating point, e.g. all slots busy), plus its prefill when include_prefill is True.
    Interpolation: bilinear in (log2 batch size, log2 context) between measured points; prefill linear in
    log2 prompt tokens. Outside the measured grid: outside="clamp" uses the nearest edge (constant
    extrapolation), outside="raise" refuses. A grid cell with an unmeasured corner (a batch x context
    whose cache did not fit the GPU) always refuses.
    """

    batch_sizes: np.ndarray  # measured batch sizes, increasing
    context_tokens: np.ndarray  # measured contexts, tokens, increasing
    step_ms: np.ndarray  # [batch, context] decode step time, ms (NaN: not measured)
    batch_size: int = MAX_NUM_SEQS  # requests decoded together at every step
    outside: str = "clamp"
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # measured prompts, tokens (empty: none)
    prefill_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))  # prefill time of one prompt, ms
    include_prefill: bool = False
    source: str = ""

    def __post_init__(self):
        validate.positive_int("batch_size", self.batch_size)
        validate.one_of("outside", self.outside, ("clamp", "raise"))
        shape = (len(self.batch_sizes), len(self.context_tokens))
        if np.shape(self.step_ms) != shape or 0 in shape:
            validate.fail(
                "step_ms", np.shape(self.step_ms), f"must have the shape {shape} of (batch_sizes, context_tokens)"
            )
        for name in ("batch_sizes", "context_tokens", "prompt_tokens"):
            values = np.asarray(getattr(self, name))
            if np.any(values <= 0) or np.any(np.diff(values) <= 0):
                validate.fail(name, values.tolist(), "must be positive and increasing")
        if self.include_prefill and len(self.prompt_tokens) == 0:
            validate.fail("include_prefill", True, f"{self.source or 'the calibration'} has no prefill_ms rows")

    @classmethod
    def from_csv(
        cls, path, *, batch_size: int = 8, outside: str = "clamp", include_prefill: bool = False
    ) -> CalibratedServiceTime:
        """The service time of a calibration file (kvlab calibrate's CSV); no torch needed."""
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
        return cls(
            np.array(batches, dtype=np.float64),
            np.array(contexts, dtype=np.float64),
            grid,
            batch_size,
            outside,
            np.array([r["prompt_tokens"] for r in prefill], dtype=np.float64),
            np.array([r["value"] for r in prefill], dtype=np.float64),
            include_prefill,
            str(path),
        )

    def _inside(self, name: str, values: np.ndarray, grid: np.ndarray) -> None:
        if self.outside == "raise" and (values.min() < grid[0] or values.max() > grid[-1]):
            bad = values.min() if values.min() < grid[0] else values.max()
            validate.fail(
                name,
                int(bad),
                f"lies outside the measured {grid[0]:g}..{grid[-1]:g} of {self.source or 'the calibration'} "
                "(outside='clamp' uses the nearest edge)",
            )

    def step_time_ms(self, context_tokens, batch_size: int | None = None) -> np.ndarray:
        """Decode step time (ms) at each context (tokens) for batch_size (default: the model's) requests."""
        batch = float(self.batch_size if batch_size is None else validate.positive_int("batch_size", batch_size))
        context = np.atleast_1d(np.asarray(context_tokens, dtype=np.float64))
        self._inside("batch_size", np.array([batch]), self.batch_sizes)
        self._inside("context_tokens", context, self.context_tokens)
        row = lerp_clamped(np.log2(self.batch_sizes), self.step_ms, np.log2(np.array([batch])))[0]
        ms = lerp_clamped(np.log2(self.context_tokens), row, np.log2(np.maximum(context, 1.0)))
        if np.isnan(ms).any():
            at = int(context[np.isnan(ms)][0])
            validate.fail(
                "context_tokens",
                at,
                f"at batch size {batch:g} falls in a cell of {self.source or 'the calibration'} "
                "with an unmeasured corner (its cache did not fit the GPU)",
            )
        return ms

    def prefill_time_ms(self, prompt_tokens) -> np.ndarray:
        """Prefill time (ms) of one prompt of each length (tokens): linear in log2 prompt tokens."""
        prompt = np.atleast_1d(np.asarray(prompt_tokens, dtype=np.float64))
        self._inside("prompt_tokens", prompt, self.prompt_tokens)
        return lerp_clamped(np.log2(self.prompt_tokens), self.prefill_ms, np.log2(np.maximum(prompt, 1.0)))

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
