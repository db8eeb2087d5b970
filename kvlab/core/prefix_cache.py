"""Prefix caching measured on a trace: an LRU cache of KV blocks keyed by prefix-block hash, like vLLM's.

Requests are replayed in arrival order. Each request looks up its prefix blocks from the first one;
the leading run of blocks found in the cache is a hit (vLLM's longest cache hit: it stops at the first
miss) and those prompt tokens need no prefill. Then all the request's blocks become the most recently
used ones, the first block last, as vLLM frees a finished request's blocks tail first so that its tail
is evicted before its shared head. The cache then evicts least recently used blocks down to its size.
Not modelled: blocks pinned by running requests, and vLLM recomputing the last prompt token on a full hit.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from kvlab.core import validate
from kvlab.core.workload import Workload


@dataclass(frozen=True)
class PrefixCacheStats:
    """Prefix-cache hits over a replayed trace; num_cache_blocks None means an unbounded cache."""

    num_cache_blocks: int | None
    num_blocks: int  # prefix blocks looked up, all requests
    num_hit_blocks: int  # blocks found (leading run of each request)
    prompt_tokens: int  # prefill tokens without a cache
    prefill_tokens_saved: int  # prompt tokens served from the cache

    @property
    def hit_rate(self) -> float:
        """Hit blocks / looked-up blocks."""
        return self.num_hit_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def saved_fraction(self) -> float:
        """Prefill tokens saved / prompt tokens."""
        return self.prefill_tokens_saved / self.prompt_tokens if self.prompt_tokens else 0.0


def _hashes(workload: Workload) -> tuple[np.ndarray, ...]:
    if workload.prefix_hashes is None:
        validate.fail(
            "workload.prefix_hashes",
            None,
            "prefix caching needs a trace with prefix-block hashes (e.g. the Mooncake trace)",
        )
    return workload.prefix_hashes


def replay(workload: Workload, num_cache_blocks: int | None) -> PrefixCacheStats:
    """Replay the workload through an LRU prefix cache of num_cache_blocks blocks (None: unbounded)."""
    if num_cache_blocks is not None:
        num_cache_blocks = validate.positive_int("num_cache_blocks", num_cache_blocks)
    block_tokens = workload.prefix_block_tokens
    cache: OrderedDict[int, None] = OrderedDict()  # oldest first
    num_blocks = num_hit = saved = 0
    for ids, prompt in zip(_hashes(workload), workload.prompt_tokens.tolist()):
        ids = ids.tolist()
        hits = 0
        for h in ids:
            if h not in cache:
                break
            hits += 1
        num_blocks += len(ids)
        num_hit += hits
        saved += min(hits * block_tokens, prompt)
        for h in reversed(ids):  # the first block ends most recently used
            cache[h] = None
            cache.move_to_end(h)
        if num_cache_blocks is not None:
            while len(cache) > num_cache_blocks:
                cache.popitem(last=False)
    return PrefixCacheStats(num_cache_blocks, num_blocks, num_hit, int(workload.prompt_tokens.sum()), saved)


def distinct_blocks(workload: Workload) -> int:
    """Distinct prefix blocks in the workload: an LRU cache this large never evicts."""
    return len(set().union(*(ids.tolist() for ids in _hashes(workload))))
