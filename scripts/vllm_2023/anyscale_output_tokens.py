#!/usr/bin/env python3
"""Write data/vllm_2023/anyscale_output_tokens.csv: the output lengths of Anyscale's June 2023 benchmark.

    python scripts/vllm_2023/anyscale_output_tokens.py      (Python 3.8-3.11: Python 3.12 refuses randint(0, 1e6))

The benchmark (anyscale/llm-continuous-batching-benchmarks, benchmark_throughput.py at d34cb03, run by
benchmark_configs/vllm_variable_size) seeds Python's random with 0xCADE, draws 1,000 prompt lengths of
exactly 512 tokens and 512 random token ids per prompt from it, then seeds NumPy's legacy generator with
random.randint(0, 1e6) and draws each output length as round(exponential(scale=128)), redrawing any above
the cap (capped_exponential). vLLM was asked for max(length, 1) tokens with ignore_eos, so that is what is
written. The draw is re-done here step by step (no tokenizer is needed: it consumes no random numbers).
Check: the cap-32 column sums to 15,610, the response_token_count of the run logged in the benchmark's
issue #4.
"""

from __future__ import annotations

import csv
import os
import random
import warnings

import numpy as np

CAPS = (32, 128, 512, 1536)
NUM_REQUESTS, PROMPT_TOKENS, MEAN_OUTPUT_TOKENS = 1000, 512, 128
OUT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "data",
    "vllm_2023",
    "anyscale_output_tokens.csv",
)


def output_tokens(cap: int) -> list[int]:
    """The max_tokens vLLM was asked for, per request, at one cap."""
    random.seed(0xCADE)
    for _ in range(NUM_REQUESTS):  # prompt lengths: randint(512, 512) still draws
        random.randint(PROMPT_TOKENS, PROMPT_TOKENS)
    for _ in range(NUM_REQUESTS * PROMPT_TOKENS):  # the prompts' random token ids
        random.randint(10, 50000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        np.random.seed(random.randint(0, 1e6))
    lengths: list[int] = []
    while len(lengths) < NUM_REQUESTS:
        sample = round(np.random.exponential(scale=MEAN_OUTPUT_TOKENS))
        if sample <= cap:
            lengths.append(max(sample, 1))
    return lengths


def main() -> None:
    columns = [output_tokens(cap) for cap in CAPS]
    assert sum(columns[0]) == 15610, "the cap-32 draw must match the logged response_token_count"
    with open(OUT, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["request"] + [f"cap_{cap}" for cap in CAPS])
        for i, row in enumerate(zip(*columns)):
            writer.writerow([i, *row])
    print(f"wrote {OUT}: sums {[sum(c) for c in columns]}")


if __name__ == "__main__":
    main()
