"""The vLLM paper's two datasets as kvlab can build them offline: ShareGPT turns and synthetic Alpaca lengths.

The paper (Kwon et al., SOSP 2023, arXiv 2309.06180, §6.1 and Fig. 11) tokenizes ShareGPT and Alpaca, uses
their input and output lengths as requests and draws Poisson arrivals. kvlab has neither dataset as the
paper used it:

- ShareGPT: Microsoft's processed file (sharegpt_8k_filtered_stats_llama2_tokenizer.csv, Llama-2
  tokenizer, totals up to about 8k tokens, outputs capped at 1,024) counts the whole conversation so far
  as each turn's prefill. turn_inputs() recovers each turn's new input (inputs="turn", kvlab's default);
  inputs="processed" takes the file's prefill as it is.
- Alpaca: no copy is offline. kvlab draws synthetic lengths whose means are the paper's (Fig. 11b: input
  19.31, output 58.45 tokens), from a geometric family (the discrete exponential, CV about 1) or, as a
  sensitivity, a narrower gamma family (CV 0.5).

A Dataset gives request lengths from a numpy Generator; workload() adds Poisson arrivals: lengths are drawn
first, then unit-rate gaps, so one seed gives the same requests at every rate (the gaps divided by the rate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.core import validate
from kvlab.core.workload import Workload
from kvlab.workloads import synthetic

# The paper's Fig. 11: mean input and output tokens of the requests it served (OPT tokenizer).
SHAREGPT_MEAN_TOKENS = {"input": 161.31, "output": 337.99}
ALPACA_MEAN_TOKENS = {"input": 19.31, "output": 58.45}
SHAREGPT_INPUTS = {
    "turn": "each turn's new input: its prefill less the previous turn's prefill and output (conversations found "
    "by the history growing)",
    "processed": "the file's prefill as it is: the whole conversation so far",
}
ALPACA_FAMILIES = {
    "geometric": "geometric (the discrete exponential) with the paper's means: CV about 1",
    "gamma-cv0.5": "gamma with the paper's means and a coefficient of variation of 0.5, rounded, at least 1 token",
}


@dataclass(frozen=True, eq=False)
class Turns:
    """A ShareGPT file's turns as kvlab reads them: each turn's new input and output (tokens), its conversation
    (0-based, in file order) and its turn within the conversation (0 = first)."""

    input_tokens: np.ndarray
    output_tokens: np.ndarray
    conversation: np.ndarray
    turn: np.ndarray

    @property
    def num_conversations(self) -> int:
        """Conversations the heuristic found."""
        return int(self.conversation[-1]) + 1 if len(self.conversation) else 0


def turn_inputs(prefill_tokens, decode_tokens) -> Turns:
    """Each turn's new input, from per-turn prefill counts that include the conversation so far (file order).

    A row continues the previous row's conversation when its prefill exceeds the previous row's prefill plus
    output: the history grew by the previous turn, and the rest is the new input (the chat template's tokens
    between turns included). Any other row starts a conversation, and its whole prefill is its input."""
    prefill = np.asarray(prefill_tokens, dtype=np.int64)
    decode = np.asarray(decode_tokens, dtype=np.int64)
    if prefill.shape != decode.shape or prefill.ndim != 1 or len(prefill) == 0:
        validate.fail(
            "prefill_tokens",
            f"{prefill.shape} values",
            f"must be one or more, as many as decode_tokens ({decode.shape})",
        )
    if prefill.min() < 1 or decode.min() < 1:
        validate.fail(
            "prefill_tokens",
            int(min(prefill.min(), decode.min())),
            "every turn needs at least one prefill and one decode token",
        )
    history = np.concatenate([[0], (prefill + decode)[:-1]])
    continues = np.concatenate([[False], prefill[1:] > history[1:]])
    inputs = np.where(continues, prefill - history, prefill)
    conversation = np.cumsum(~continues) - 1
    starts = np.flatnonzero(~continues)
    turn = np.arange(len(prefill)) - starts[conversation]
    return Turns(inputs, decode.copy(), conversation, turn)


@dataclass(frozen=True, eq=False)
class LengthPool:
    """Requests to draw from: prompt and output tokens of a dataset's requests, and how many were dropped as longer
    than max_len_tokens (prompt + output)."""

    name: str
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    num_dropped: int = 0
    max_len_tokens: int | None = None

    def __post_init__(self):
        if len(self.prompt_tokens) == 0:
            validate.fail(self.name, "no requests", "a pool needs at least one request of max_len_tokens or fewer")

    @property
    def num_requests(self) -> int:
        """Requests in the pool."""
        return len(self.prompt_tokens)

    def lengths(self, num_requests: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """num_requests requests drawn uniformly, without replacement while the pool lasts."""
        n = self.num_requests
        index = rng.permutation(n)[:num_requests] if num_requests <= n else rng.integers(0, n, num_requests)
        return self.prompt_tokens[index], self.output_tokens[index]

    def mean_tokens(self) -> dict:
        """Mean prompt and output tokens of the pool (what a large draw averages to)."""
        return {"input": float(self.prompt_tokens.mean()), "output": float(self.output_tokens.mean())}


def sharegpt_pool(prefill_tokens, decode_tokens, inputs: str = "turn", max_len_tokens: int | None = None) -> LengthPool:
    """ShareGPT requests from a processed file's prefill and decode counts: each turn's new input (inputs="turn") or
    the file's prefill (inputs="processed"); requests longer than max_len_tokens (prompt + output) are dropped."""
    validate.one_of("sharegpt_inputs", inputs, SHAREGPT_INPUTS)
    if inputs == "turn":
        turns = turn_inputs(prefill_tokens, decode_tokens)
        prompt, output = turns.input_tokens, turns.output_tokens
    else:
        prompt = np.asarray(prefill_tokens, dtype=np.int64)
        output = np.asarray(decode_tokens, dtype=np.int64)
    keep = np.ones(len(prompt), dtype=bool)
    if max_len_tokens is not None:
        keep = prompt + output <= validate.positive_int("max_len_tokens", max_len_tokens)
    return LengthPool(f"ShareGPT ({inputs})", prompt[keep], output[keep], int((~keep).sum()), max_len_tokens)


@dataclass(frozen=True)
class SyntheticLengths:
    """Synthetic requests whose input and output lengths come from one family with given means (tokens)."""

    name: str
    family: str
    mean_input_tokens: float
    mean_output_tokens: float

    def __post_init__(self):
        validate.one_of("alpaca_lengths", self.family, ALPACA_FAMILIES)
        validate.positive_number("mean_input_tokens", self.mean_input_tokens)
        validate.positive_number("mean_output_tokens", self.mean_output_tokens)

    num_dropped = 0

    def lengths(self, num_requests: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """num_requests (input, output) lengths: inputs drawn first, then outputs."""
        return (
            self._draw(self.mean_input_tokens, num_requests, rng),
            self._draw(self.mean_output_tokens, num_requests, rng),
        )

    def _draw(self, mean: float, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.family == "geometric":
            return rng.geometric(1.0 / mean, size=n).astype(np.int64)  # support 1, 2, ...; mean exactly `mean`
        return synthetic.sample_lengths("gamma", n, rng, mean_tokens=mean, cv=0.5)

    def mean_tokens(self) -> dict:
        """The family's means (tokens)."""
        return {"input": self.mean_input_tokens, "output": self.mean_output_tokens}


def alpaca_lengths(family: str = "geometric") -> SyntheticLengths:
    """Synthetic Alpaca: lengths of the family with the paper's means (input 19.31, output 58.45 tokens)."""
    return SyntheticLengths(f"Alpaca ({family})", family, ALPACA_MEAN_TOKENS["input"], ALPACA_MEAN_TOKENS["output"])


def workload(dataset, num_requests: int, rate_per_s: float, seed: int) -> Workload:
    """num_requests requests of dataset (a LengthPool or SyntheticLengths) with Poisson arrivals at rate_per_s,
    the first at 0, from default_rng(seed): lengths first, then unit-rate gaps divided by the rate, so a seed
    gives the same requests, in the same order, at every rate."""
    num_requests = validate.in_range("num_requests", num_requests, "num_requests")
    rate_per_s = validate.in_range("arrival_rate", rate_per_s, "arrival_rate")
    rng = np.random.default_rng(seed)
    prompt, output = dataset.lengths(num_requests, rng)
    gaps = rng.exponential(1.0, size=num_requests)
    gaps[0] = 0.0
    return Workload(np.cumsum(gaps) / rate_per_s, prompt, output, name=dataset.name)
