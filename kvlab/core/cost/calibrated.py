"""The calibrated step cost: step times read from a calibration file of kvlab calibrate (kvlab.core.calibration)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.core import validate
from kvlab.core.cost.batch import Batch
from kvlab.core.service_time import CalibratedServiceTime, lerp_clamped


@dataclass(frozen=True, eq=False)
class CalibratedStepCost:
    """Measured step times from a calibration file (kvlab.core.calibration's CSV): a step takes the decode
    step time of its decoding requests (batch = their number, context = their mean context, interpolated
    as CalibratedServiceTime does) plus the prefill time of its other tokens as one prompt."""

    calibration: CalibratedServiceTime  # the file's decode and prefill grids
    name = "calibrated"

    def __post_init__(self):
        if not isinstance(self.calibration, CalibratedServiceTime):
            validate.fail(
                "calibration",
                type(self.calibration).__name__,
                "must be a kvlab.core.service_time.CalibratedServiceTime",
            )
        if len(self.calibration.prompt_tokens) == 0:
            validate.fail("calibration", self.calibration.source, "has no prefill_ms rows, which the engine needs")

    @classmethod
    def from_csv(cls, path, outside: str = "clamp") -> CalibratedStepCost:
        """The step cost of a calibration file."""
        return cls(CalibratedServiceTime.from_csv(path, outside=outside))

    def _ms(self, num_tokens, num_decodes: int, decode_context_tokens) -> np.ndarray:
        decode_context = np.atleast_1d(np.asarray(decode_context_tokens, dtype=np.float64))
        ms = np.zeros_like(decode_context)
        if num_decodes:
            ms = ms + self.calibration.step_time_ms(decode_context / num_decodes, num_decodes)
        if num_tokens > num_decodes:
            ms = ms + self.calibration.prefill_time_ms(num_tokens - num_decodes)
        return ms

    def step_s(self, batch: Batch) -> float:
        """Seconds of one step (see the class)."""
        num_tokens, _, num_decodes, decode_context_tokens = batch[:4]
        return float(self._ms(num_tokens, num_decodes, decode_context_tokens)[0] / 1000.0)

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s): over every split into decodes and one
        prompt, the decodes' least step time at any measured context plus the prompt's prefill."""
        grid = self.calibration
        best = np.inf
        for num_decodes in range(num_tokens + 1):
            ms = 0.0
            if num_tokens > num_decodes:
                prompt = np.log2(np.array([float(num_tokens - num_decodes)]))
                ms += float(lerp_clamped(np.log2(grid.prompt_tokens), grid.prefill_ms, prompt)[0])
            if num_decodes:  # piecewise linear along the contexts: its least value is at a measured one
                batch = np.log2(np.array([float(num_decodes)]))
                row = lerp_clamped(np.log2(grid.batch_sizes), grid.step_ms, batch)[0]
                if np.isnan(row).all():
                    continue
                ms += float(np.nanmin(row))
            best = min(best, ms)
        return best / 1000.0

    @property
    def source(self) -> str:
        """The calibration file (or that none was read)."""
        return self.calibration.source or "a calibration built in memory, no file"

    def describe(self) -> str:
        """The step cost in words: the calibration file it reads."""
        return self.source
