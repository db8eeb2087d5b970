"""Step costs in closed form with no hardware: a constant step, and a step linear in its scheduled tokens."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core import validate
from kvlab.core.article import MS_PER_TOKEN
from kvlab.core.cost.batch import Batch


@dataclass(frozen=True)
class ConstantStepCost:
    """Every step takes step_ms, whatever it schedules (the article's 8 ms per output token)."""

    step_ms: float = MS_PER_TOKEN
    name = "constant"
    source = "a figure given, not a measurement"

    def __post_init__(self):
        validate.in_range("step_ms", self.step_ms, "ms_per_token")

    def step_s(self, batch: Batch) -> float:
        """Seconds of one step: step_ms / 1000."""
        return self.step_ms / 1000.0

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s): every step's step_ms / 1000."""
        return self.step_ms / 1000.0

    def describe(self) -> str:
        """The step cost in words, with units."""
        return f"{self.step_ms:g} ms a step"


@dataclass(frozen=True)
class LinearStepCost:
    """A step takes step_ms + step_ms_per_token x its scheduled tokens (prefill and decode tokens alike)."""

    step_ms: float = MS_PER_TOKEN
    step_ms_per_token: float = 0.0
    name = "linear"
    source = "figures given, not measurements"

    def __post_init__(self):
        validate.in_range("step_ms", self.step_ms, "step_ms")
        validate.in_range("step_ms_per_token", self.step_ms_per_token, "step_ms")
        if self.step_ms == 0 and self.step_ms_per_token == 0:
            validate.fail("step_ms", 0.0, "and step_ms_per_token cannot both be 0: a step must take time")

    def step_s(self, batch: Batch) -> float:
        """Seconds of one step: (step_ms + step_ms_per_token x num_tokens) / 1000."""
        num_tokens = batch[0]
        return (self.step_ms + self.step_ms_per_token * num_tokens) / 1000.0

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s): such a step's own time."""
        return self.step_s(Batch(num_tokens))

    def describe(self) -> str:
        """The step cost in words, with units."""
        return f"{self.step_ms:g} ms + {self.step_ms_per_token:g} ms per scheduled token"
