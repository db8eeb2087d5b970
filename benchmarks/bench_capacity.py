"""Capacity tables: the article's two section 3 tables and the real-model planner of part 2, timed."""

import time

from kvlab.core import capacity, models
from kvlab.core.config import EngineConfig
from kvlab.sections import s03_capacity as section


def main() -> None:
    contexts = [1000, 4000, 8000, 32000, 128000]
    start = time.perf_counter()
    for _ in range(100):
        section.memory_table(section.ARTICLE_SHAPE, contexts, [8, 32])
        section.fit_table(section.ARTICLE_SHAPE, 80, 16, contexts)
    ms = (time.perf_counter() - start) / 100 * 1e3
    print(f"   section 3 tables: {ms:.2f} ms per build (both tables, 5 contexts)")

    spec = models.get_model("google/gemma-3-27b-it")
    config = EngineConfig().replace(tensor_parallel_size=2)
    start = time.perf_counter()
    for _ in range(1000):
        capacity.vllm_capacity(spec, 30 * 2**30, 32768, config)
    us = (time.perf_counter() - start) / 1000 * 1e6
    print(f"   vllm_capacity (Gemma 3 27B, hybrid groups, TP=2): {us:.1f} us per call")

    names = [
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.1-70B-Instruct",
        "google/gemma-3-27b-it",
        "deepseek-ai/DeepSeek-V2-Lite",
    ]
    start = time.perf_counter()
    table = section.concurrency_table(names, 80, [1024 * 2**i for i in range(8)], ["bf16", "fp8"], [1, 2, 4, 8])
    ms = (time.perf_counter() - start) * 1e3
    print(f"   planner table (notebook 03 part 2): {ms:.1f} ms for {len(table)} configurations")


if __name__ == "__main__":
    main()
