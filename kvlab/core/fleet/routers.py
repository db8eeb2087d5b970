"""Routers: which instance of a fleet serves an arriving request, each rule as the router's public code writes it.

A router is asked at a request's arrival (route: the request, each instance's load then) and returns the index of the
instance that serves it; routers that keep their own record of what they sent hear of a request's first token
(prefill_done) and its finish (finished). A prompt is its full blocks' chained content hashes at the fleet's block
size (kvlab.core.engine.block_hashes, vLLM's chain): where a router hashes the prompt's text in chunks of characters,
kvlab's blocks of tokens stand for them (kvlab's workloads carry tokens, not text), a difference each router says.
Ties a router breaks at random are broken by the router's own seeded generator.

- RoundRobin: vLLM production-stack's RoundRobinRouter (src/vllm_router/routers/routing_logic.py, route_request).
- LeastLoaded: kvlab's own baseline (fewest unfinished requests or tokens; no public router's code).
- Session, PrefixAware: production-stack's SessionRouter and PrefixAwareRouter (same file; its prefix trie in
  src/vllm_router/prefix/hashtrie.py), read at commit a6c01db (vllm-stack 0.1.12).
- LlmD: llm-d's inference scheduler with its built-in default profile (llm-d/llm-d-inference-scheduler at 520af47:
  pkg/epp/config/loader/defaults.go; queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3,
  max-score-picker), the scorers of pkg/epp/scheduling/.../scorer/ and the approximate prefix index of
  requestcontrol/dataproducer/approximateprefix/.
- DynamoKv: NVIDIA Dynamo's KV router, DefaultWorkerSelector.select_worker (lib/llm/src/kv_router/scheduler.rs at
  db19bd2; its load bookkeeping in sequence.rs, ActiveSequences), with overlap_score_weight 1 and temperature 0.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RoutedRequest:
    """What a router reads of an arriving request: its id, arrival, prompt tokens, its prompt's full-block hashes
    (chained, at the fleet's block size; a range of numbers no other block has where no prompt shares content) and its
    session (production-stack's session key; None: none)."""

    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    block_hashes: tuple | range
    session_id: str | None = None


@dataclass(frozen=True)
class InstanceLoad:
    """What a router reads of one instance at a request's arrival: its running and waiting requests (vLLM's
    num_requests_running / num_requests_waiting), the tokens its unfinished requests still have to run, its KV cache's
    usage (vLLM's kv_cache_usage_perc, 0 to 1), the hashes of the blocks in its prefix cache (what vLLM's KV events
    tell a router) and its num_gpu_blocks."""

    num_running: int
    num_waiting: int
    num_unfinished_tokens: int
    kv_cache_usage: float
    cached_block_hashes: frozenset
    num_gpu_blocks: int


class Router:
    """The base: a router of n instances, its random tie-breaks from seed. What it reads: the instances' loads
    (reads_instances; else route is given None for them), the prompts' block hashes (reads_prefixes; else they are
    ()), and the requests' first tokens and finishes (hears_requests)."""

    name = ""  # kvlab simulate's --router
    reads_instances = reads_prefixes = hears_requests = False

    def __init__(self, num_instances: int, seed: int = 0):
        self.num_instances = num_instances
        self.rng = np.random.default_rng(seed)

    def route(self, request: RoutedRequest, loads: list[InstanceLoad]) -> int:
        raise NotImplementedError

    def prefill_done(self, request_id: int) -> None:
        """The request's first token came back (Dynamo's mark_prefill_completed)."""

    def finished(self, request_id: int) -> None:
        """The request finished (Dynamo's free)."""

    def choice(self, candidates: list[int]) -> int:
        """One of candidates, uniformly (the routers' random.choice / shuffle)."""
        return candidates[int(self.rng.integers(len(candidates)))]


class RoundRobin(Router):
    """production-stack's RoundRobinRouter: a counter over the endpoints' URLs sorted (kvlab's instances in index
    order), the next one each request."""

    name = "round-robin"

    def __init__(self, num_instances: int, seed: int = 0):
        super().__init__(num_instances, seed)
        self.next_index = 0

    def route(self, request, loads):
        index = self.next_index % self.num_instances
        self.next_index += 1
        return index


class LeastLoaded(Router):
    """kvlab's baseline: the instance with the fewest unfinished requests (by="requests": running + waiting) or tokens
    (by="tokens"), the first of them on a tie."""

    name, reads_instances = "least-loaded", True

    def __init__(self, num_instances: int, seed: int = 0, by: str = "requests"):
        super().__init__(num_instances, seed)
        if by not in ("requests", "tokens"):
            raise ValueError(f"by={by!r} is not allowed: 'requests' or 'tokens'")
        self.by = by

    def route(self, request, loads):
        if self.by == "tokens":
            return int(np.argmin([load.num_unfinished_tokens for load in loads]))
        return int(np.argmin([load.num_running + load.num_waiting for load in loads]))


class QpsFallback(Router):
    """production-stack's RoutingInterface._qps_routing, the fallback of its session and prefix routers: the first
    endpoint that has had no request yet, else the one with the fewest requests in the last window_s (its
    --request-stats-window, 60 s), the first on a tie. The router records every request it sends (the stats monitor's
    on_new_request)."""

    def __init__(self, num_instances: int, seed: int = 0, window_s: float = 60.0):
        super().__init__(num_instances, seed)
        self.window_s = window_s
        self.sent_s = [deque() for _ in range(num_instances)]  # each endpoint's requests in the window
        self.used = [False] * num_instances  # whether it has had one (production-stack: in request_stats)

    def qps_routing(self, now_s: float) -> int:
        lowest, chosen = np.inf, 0
        for i, sent in enumerate(self.sent_s):
            if not self.used[i]:
                return i
            while sent and sent[0] < now_s - self.window_s:
                sent.popleft()
            qps = len(sent) / self.window_s
            if qps < lowest:
                lowest, chosen = qps, i
        return chosen

    def sent(self, index: int, now_s: float) -> int:
        self.sent_s[index].append(now_s)
        self.used[index] = True
        return index


def md5_int(text: str) -> int:
    """uhashring's key hash: the whole MD5 digest as an integer."""
    return int(hashlib.md5(text.encode("utf-8")).hexdigest(), 16)


class Session(QpsFallback):
    """production-stack's SessionRouter: a request with a session id goes where a consistent-hash ring puts it
    (uhashring 2.3's HashRing: 160 points per endpoint at md5(f"{url}-{w}"), the first point after md5(session id),
    wrapping round; kvlab's instances named instance-0, ... for the URLs); one without goes by the QPS fallback."""

    name, VNODES = "session", 160

    def __init__(self, num_instances: int, seed: int = 0, window_s: float = 60.0):
        super().__init__(num_instances, seed, window_s)
        self.names = [f"instance-{i}" for i in range(num_instances)]
        points = sorted((md5_int(f"{name}-{w}"), i) for i, name in enumerate(self.names) for w in range(self.VNODES))
        self.keys, self.owners = [k for k, _ in points], [i for _, i in points]

    def route(self, request, loads):
        if request.session_id is None:
            return self.sent(self.qps_routing(request.arrival_s), request.arrival_s)
        p = bisect.bisect_right(self.keys, md5_int(str(request.session_id)))
        return self.sent(self.owners[p if p < len(self.keys) else 0], request.arrival_s)


class PrefixAware(QpsFallback):
    """production-stack's PrefixAwareRouter: a trie of the prompts it has sent, each node the endpoints sent a prompt
    through it; a request follows its prompt's blocks down while some endpoint it reaches holds them all, and goes to
    one of the deepest at random (the QPS fallback where fewer than min_match_blocks matched; by default none: an
    unmatched request goes anywhere at random). Its prompt is then added for the endpoint chosen; nothing is ever
    evicted. production-stack hashes 128-character chunks of the prompt's text (the last one shorter); kvlab's
    prompt blocks stand for them (its full blocks only)."""

    name, reads_prefixes = "prefix-aware", True

    def __init__(self, num_instances: int, seed: int = 0, window_s: float = 60.0, min_match_blocks: int = 0):
        super().__init__(num_instances, seed, window_s)
        self.min_match_blocks = min_match_blocks
        self.trie: dict = {}  # block hash -> (endpoints, children)

    def route(self, request, loads):
        node, selected, matched = self.trie, set(range(self.num_instances)), 0
        for block_hash in request.block_hashes:
            if block_hash not in node or not (node[block_hash][0] & selected):
                break
            selected &= node[block_hash][0]
            node = node[block_hash][1]
            matched += 1
        if matched < self.min_match_blocks:
            index = self.qps_routing(request.arrival_s)
        else:
            index = self.choice(sorted(selected))
        node = self.trie
        for block_hash in request.block_hashes:
            endpoints, children = node.setdefault(block_hash, (set(), {}))
            endpoints.add(index)
            node = children
        return self.sent(index, request.arrival_s)


class LlmD(Router):
    """llm-d's inference scheduler, its default profile: each endpoint scored by queue-scorer ((most waiting - its
    waiting) / (most - fewest), 1 where all wait alike) x 2, kv-cache-utilization-scorer (1 - its usage) x 2 and
    prefix-cache-scorer (the prompt's blocks matched / its blocks, at most 256) x 3, summed; max-score-picker takes the
    highest, at random among equals. The prefix index is the router's own record (approximate prefix producer): each
    endpoint an LRU of the block hashes of the prompts sent to it, num_gpu_blocks long; a prompt's blocks are matched
    in order until one no endpoint holds, each endpoint counting every block it holds on the way. llm-d hashes the
    prompt's text in chunks of block size x 4 characters; kvlab's prompt blocks stand for them."""

    name, reads_instances, reads_prefixes = "llm-d", True, True
    WEIGHTS = {"queue": 2.0, "kv_cache_utilization": 2.0, "prefix_cache": 3.0}
    MAX_PREFIX_BLOCKS = 256

    def __init__(self, num_instances: int, seed: int = 0):
        super().__init__(num_instances, seed)
        self.index = [OrderedDict() for _ in range(num_instances)]

    def scores(self, request: RoutedRequest, loads: list[InstanceLoad]) -> np.ndarray:
        """Each endpoint's weighted score."""
        waiting = np.array([load.num_waiting for load in loads], dtype=float)
        queue = np.ones(len(loads)) if waiting.max() == waiting.min() else (waiting.max() - waiting) / np.ptp(waiting)
        usage = np.clip(1.0 - np.array([load.kv_cache_usage for load in loads]), 0.0, 1.0)
        hashes = request.block_hashes[: self.MAX_PREFIX_BLOCKS]
        matched = np.zeros(len(loads))
        for block_hash in hashes:
            holders = [i for i, lru in enumerate(self.index) if block_hash in lru]
            if not holders:
                break
            matched[holders] += 1
        prefix = matched / len(hashes) if hashes else np.zeros(len(loads))
        w = self.WEIGHTS
        return w["queue"] * queue + w["kv_cache_utilization"] * usage + w["prefix_cache"] * prefix

    def route(self, request, loads):
        scores = self.scores(request, loads)
        index = self.choice([i for i in range(len(loads)) if scores[i] == scores.max()])
        lru, capacity = self.index[index], loads[index].num_gpu_blocks
        for block_hash in request.block_hashes[: self.MAX_PREFIX_BLOCKS]:
            if block_hash in lru:
                lru.move_to_end(block_hash)
            else:
                lru[block_hash] = True
        for _ in range(len(lru) - capacity):  # (evicted at once: an LRU keeps the capacity last used either way)
            lru.popitem(last=False)
        return index


class DynamoKv(Router):
    """Dynamo's KV router (DefaultWorkerSelector, temperature 0): each worker's cost is overlap_score_weight x its
    prefill blocks (the request's prompt tokens its cache does not hold, its longest cached prefix of the prompt's
    blocks, plus the prompt tokens of requests sent to it whose first token has not come back, over block_size) plus
    its decode blocks (the distinct blocks of its unfinished requests, the request's own counted); the lowest cost
    wins, and among equals the worker whose cache holds the fewest blocks, at random where they hold as many."""

    name, reads_instances, reads_prefixes, hears_requests = "dynamo-kv", True, True, True

    def __init__(self, num_instances: int, block_size: int, seed: int = 0, overlap_score_weight: float = 1.0):
        super().__init__(num_instances, seed)
        self.block_size, self.overlap_score_weight = block_size, overlap_score_weight
        self.active_tokens = [0] * num_instances
        self.block_refs = [{} for _ in range(num_instances)]  # block hash -> unfinished requests holding it
        # blocks of unfinished requests whose prompts no other request shares (their hashes a range): each distinct
        self.own_blocks = [0] * num_instances
        self.sent: dict = {}  # request id -> (worker, prefill tokens, its blocks)

    def new_tokens(self, request: RoutedRequest, load: InstanceLoad) -> int:
        """The request's prompt tokens past the longest prefix of its blocks the worker's cache holds (the radix
        tree's overlap)."""
        cached = load.cached_block_hashes
        if hasattr(cached, "longest_prefix"):  # a fleet's view of a cache counts it at once
            overlap = cached.longest_prefix(request.block_hashes) if request.block_hashes else 0
        else:
            overlap = 0
            for block_hash in request.block_hashes:
                if block_hash not in cached:
                    break
                overlap += 1
        return max(request.num_prompt_tokens - overlap * self.block_size, 0)

    def costs(self, request: RoutedRequest, loads: list[InstanceLoad]) -> np.ndarray:
        """Each worker's cost (Dynamo's logit; lower is better)."""
        return np.array(self.costs_and_new_tokens(request, loads)[0])

    def costs_and_new_tokens(self, request: RoutedRequest, loads: list[InstanceLoad]) -> tuple[list, list]:
        """Each worker's cost, and the request's new tokens there (new_tokens). A prompt whose blocks no other request
        has (its hashes a range) is in no cache and shares no block: it is counted without looking them up."""
        hashes, weight, block_size = request.block_hashes, self.overlap_score_weight, self.block_size
        if isinstance(hashes, range):
            own = request.num_prompt_tokens
            new = [own] * len(loads)
            costs = [weight * ((own + active) / block_size) + (len(hashes) + len(refs) + held)
                     for active, refs, held in zip(self.active_tokens, self.block_refs, self.own_blocks)]  # fmt: skip
            return costs, new
        costs, new = [], []
        blocks = set(hashes)
        for i, load in enumerate(loads):
            new.append(self.new_tokens(request, load))
            prefill_blocks = (new[-1] + self.active_tokens[i]) / block_size
            refs = self.block_refs[i]
            shared = 0 if refs.keys().isdisjoint(blocks) else sum(1 for b in blocks if b in refs)
            decode_blocks = len(blocks) - shared + len(refs) + self.own_blocks[i]
            costs.append(weight * prefill_blocks + decode_blocks)
        return costs, new

    def route(self, request, loads):
        costs, new = self.costs_and_new_tokens(request, loads)
        lowest = min(costs)
        tied = [i for i, cost in enumerate(costs) if cost == lowest]
        sizes = [len(loads[i].cached_block_hashes) for i in tied] if len(tied) > 1 else [0]
        index = self.choice(tied) if len(set(sizes)) == 1 else tied[int(np.argmin(sizes))]
        prefill_tokens = new[index]
        self.active_tokens[index] += prefill_tokens
        blocks = request.block_hashes
        if isinstance(blocks, range):  # its own blocks: counted
            self.own_blocks[index] += len(blocks)
        else:
            refs, blocks = self.block_refs[index], set(blocks)
            for block_hash in blocks:
                refs[block_hash] = refs.get(block_hash, 0) + 1
        self.sent[request.request_id] = (index, prefill_tokens, blocks)
        return index

    def prefill_done(self, request_id):
        index, prefill_tokens, blocks = self.sent[request_id]
        self.active_tokens[index] -= prefill_tokens
        self.sent[request_id] = (index, 0, blocks)

    def finished(self, request_id):
        index, prefill_tokens, blocks = self.sent.pop(request_id)
        self.active_tokens[index] -= prefill_tokens
        if isinstance(blocks, range):
            self.own_blocks[index] -= len(blocks)
            return
        refs = self.block_refs[index]
        for block_hash in blocks:
            refs[block_hash] -= 1
            if refs[block_hash] == 0:
                del refs[block_hash]


ROUTERS = {router.name: router for router in (RoundRobin, LeastLoaded, Session, PrefixAware, LlmD, DynamoKv)}


def make_router(name: str, num_instances: int, block_size: int, seed: int = 0) -> Router:
    """The router named (ROUTERS: kvlab simulate's --router) for num_instances instances of block_size tokens a block,
    its random tie-breaks from seed."""
    if name not in ROUTERS:
        raise ValueError(f"router {name!r} is not one kvlab has: {', '.join(ROUTERS)}")
    if name == "dynamo-kv":
        return DynamoKv(num_instances, block_size, seed)
    return ROUTERS[name](num_instances, seed)
