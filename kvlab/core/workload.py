"""A workload: which requests arrive when, with how many prompt and output tokens (the engines' input)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.core import validate


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests in arrival order: arrival time (s, first at 0 or later), prompt and output tokens.

    prefix_hashes, when known (e.g. the Mooncake trace), holds one array of prefix-block hash ids
    per request, each block covering prefix_block_tokens prompt tokens.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_hashes: tuple[np.ndarray, ...] | None = None
    prefix_block_tokens: int | None = None
    name: str = ""

    def __post_init__(self):
        arrival = np.ascontiguousarray(self.arrival_s, dtype=np.float64)
        prompt = _token_counts("prompt_tokens", self.prompt_tokens)
        output = _token_counts("output_tokens", self.output_tokens)
        n = len(arrival)
        if n == 0:
            validate.fail("num_requests", 0, "a workload needs at least one request")
        if len(prompt) != n or len(output) != n:
            validate.fail(
                "prompt_tokens",
                f"{len(prompt)} values",
                f"must match the {n} arrival times (output_tokens has {len(output)})",
            )
        if not np.all(np.isfinite(arrival)) or arrival.min() < 0:
            validate.fail("arrival_s", float(arrival.min()), "arrival times must be finite and >= 0")
        if n > 1 and np.any(np.diff(arrival) < 0):
            i = int(np.argmax(np.diff(arrival) < 0)) + 1
            validate.fail(
                f"arrival_s[{i}]",
                float(arrival[i]),
                f"must not be before arrival_s[{i - 1}]={float(arrival[i - 1])} (requests come in arrival order)",
            )
        if prompt.min() < 0:
            i = int(np.argmin(prompt))
            validate.fail(f"prompt_tokens[{i}]", int(prompt[i]), "must be >= 0")
        if output.min() < 1:
            i = int(np.argmin(output))
            validate.fail(f"output_tokens[{i}]", int(output[i]), "must be >= 1")
        if self.prefix_hashes is not None:
            if len(self.prefix_hashes) != n:
                validate.fail("prefix_hashes", f"{len(self.prefix_hashes)} entries", f"must have one per request ({n})")
            size = validate.positive_int("prefix_block_tokens", self.prefix_block_tokens)
            for i, (ids, num_prompt_tokens) in enumerate(zip(self.prefix_hashes, prompt.tolist())):
                if len(ids) < -(-num_prompt_tokens // size):
                    validate.fail(
                        f"prefix_hashes[{i}]",
                        f"{len(ids)} ids",
                        f"request {i}'s {num_prompt_tokens:,} prompt tokens need {-(-num_prompt_tokens // size):,} "
                        f"ids (one for every {size:,} prompt tokens)",
                    )
        for name, value in (("arrival_s", arrival), ("prompt_tokens", prompt), ("output_tokens", output)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return len(self.arrival_s)

    def __len__(self) -> int:
        return self.num_requests

    @property
    def total_tokens(self) -> np.ndarray:
        """Each request's length, prompt + output tokens (what section 1 reserves memory for)."""
        return self.prompt_tokens + self.output_tokens


def _token_counts(name: str, values) -> np.ndarray:
    """values as contiguous int64 token counts; a fractional or non-finite count is a ValueError, never truncated."""
    array = np.asarray(values)
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.round(array))
        if bad.any():
            i = int(np.argmax(bad))
            validate.fail(f"{name}[{i}]", float(array[i]), "must be a whole number of tokens")
    return np.ascontiguousarray(array, dtype=np.int64)
