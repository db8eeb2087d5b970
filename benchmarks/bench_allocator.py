"""Section 1 speed: vectorised reservation accounting and the paged block allocator."""

import time

import numpy as np

from kvlab import workloads
from kvlab.core import allocator


def main() -> None:
    lengths = workloads.sample_lengths("article-s1", 10_000_000, np.random.default_rng(0))
    start = time.perf_counter()
    allocator.allocation_counts(lengths, allocator.POWERS_OF_TWO, max_len_tokens=4096)
    s = time.perf_counter() - start
    print(
        f"   accounting: {s:.2f} s for 10,000,000 requests x {len(allocator.POWERS_OF_TWO)} block sizes (target < 2 s)"
    )

    num_requests, tokens_each, block_size = 2_000, 500, 16
    pool = allocator.BlockAllocator(num_requests * -(-tokens_each // block_size), block_size)
    for r in range(num_requests):
        pool.allocate(r, 1)
    append = pool.append_token
    start = time.perf_counter()
    for r in range(num_requests):
        for _ in range(tokens_each - 1):
            append(r)
    s = time.perf_counter() - start
    appended = num_requests * (tokens_each - 1)
    print(
        f"   block allocator: {appended / s / 1e6:.2f} million appended tokens per second "
        f"({appended:,} tokens, block size {block_size}; target >= 1)"
    )
    start = time.perf_counter()
    for r in range(num_requests):
        pool.free(r)
    s = time.perf_counter() - start
    print(
        f"   block allocator: {num_requests / s / 1e3:,.0f} thousand frees per second "
        f"({pool.num_free_blocks:,} blocks back in the pool)"
    )
