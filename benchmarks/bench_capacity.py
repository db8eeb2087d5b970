"""Capacity tables: the article's two section 3 tables, timed."""
import time

from kvlab import capacity


def main() -> None:
    contexts = [1000, 4000, 8000, 32000, 128000]
    start = time.perf_counter()
    for _ in range(100):
        capacity.memory_table(capacity.ARTICLE_SHAPE, contexts, [8, 32])
        capacity.fit_table(capacity.ARTICLE_SHAPE, 80, 16, contexts)
    ms = (time.perf_counter() - start) / 100 * 1e3
    print(f"   section 3 tables: {ms:.2f} ms per build (both tables, 5 contexts)")
