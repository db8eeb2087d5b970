"""Workloads: what requests arrive when, and how long their prompts and outputs are."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab import validate


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
        prompt = np.ascontiguousarray(self.prompt_tokens, dtype=np.int64)
        output = np.ascontiguousarray(self.output_tokens, dtype=np.int64)
        n = len(arrival)
        if n == 0:
            validate.fail("num_requests", 0, "a workload needs at least one request")
        if len(prompt) != n or len(output) != n:
            validate.fail("prompt_tokens", f"{len(prompt)} values", f"must match the {n} arrival times "
                          f"(output_tokens has {len(output)})")
        if not np.all(np.isfinite(arrival)) or arrival.min() < 0:
            validate.fail("arrival_s", float(arrival.min()), "arrival times must be finite and >= 0")
        if n > 1 and np.any(np.diff(arrival) < 0):
            i = int(np.argmax(np.diff(arrival) < 0)) + 1
            validate.fail(f"arrival_s[{i}]", float(arrival[i]), f"must not be before arrival_s[{i - 1}]="
                          f"{float(arrival[i - 1])} (requests come in arrival order)")
        if prompt.min() < 0:
            i = int(np.argmin(prompt))
            validate.fail(f"prompt_tokens[{i}]", int(prompt[i]), "must be >= 0")
        if output.min() < 1:
            i = int(np.argmin(output))
            validate.fail(f"output_tokens[{i}]", int(output[i]), "must be >= 1")
        if self.prefix_hashes is not None:
            if len(self.prefix_hashes) != n:
                validate.fail("prefix_hashes", f"{len(self.prefix_hashes)} entries", f"must have one per request ({n})")
            validate.positive_int("prefix_block_tokens", self.prefix_block_tokens)
        for name, value in (("arrival_s", arrival), ("prompt_tokens", prompt), ("output_tokens", output)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return len(self.arrival_s)

    def __len__(self) -> int:
        return self.num_requests


def poisson_arrivals(num_requests: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a Poisson process at rate_per_s, the first request at 0."""
    num_requests = validate.positive_int("num_requests", num_requests)
    rate_per_s = validate.positive_number("arrival_rate", rate_per_s)
    gaps = rng.exponential(1.0 / rate_per_s, size=num_requests)
    gaps[0] = 0.0
    return np.cumsum(gaps)


# ---------------------------------------------------------------- output lengths of section 2
# (to merge with section 1's length registry: the article's section 2 mixture is "article-s2" there)
def article_mixture_lengths(num_requests: int, rng: np.random.Generator) -> np.ndarray:
    """Section 2's output lengths (tokens): 85% uniform 40-200, 15% uniform 400-1,000, integers, both ends inclusive."""
    num_requests = validate.positive_int("num_requests", num_requests)
    long = rng.random(num_requests) < 0.15
    short_tokens = rng.integers(40, 200, size=num_requests, endpoint=True)
    long_tokens = rng.integers(400, 1000, size=num_requests, endpoint=True)
    return np.where(long, long_tokens, short_tokens).astype(np.int64)


def constant_lengths(num_requests: int, tokens: int = 150) -> np.ndarray:
    """Every request tokens long (section 2's "all outputs 150 tokens")."""
    num_requests = validate.positive_int("num_requests", num_requests)
    return np.full(num_requests, validate.positive_int("constant_tokens", tokens), dtype=np.int64)


def gamma_lengths(num_requests: int, mean_tokens: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Gamma-distributed output lengths (tokens, rounded, at least 1) of mean mean_tokens and coefficient of variation cv (0: all equal)."""
    num_requests = validate.positive_int("num_requests", num_requests)
    mean_tokens = validate.positive_number("mean_tokens", mean_tokens)
    cv = validate.non_negative_number("cv", cv)
    if cv == 0:
        return np.full(num_requests, max(1, round(mean_tokens)), dtype=np.int64)
    draws = rng.gamma(1.0 / cv**2, mean_tokens * cv**2, size=num_requests)
    return np.maximum(1, np.rint(draws)).astype(np.int64)
