"""The vLLM configurations that serve a workload within its service-level objectives (`kvlab plan`).

A candidate is one setting of vLLM's knobs (tensor parallel size, data parallel size with expert parallelism for a
mixture-of-experts model, max_num_seqs, max_num_batched_tokens, block_size, gpu_memory_utilization, kv_cache_dtype,
chunked prefill, prefix caching, async scheduling) and a number of replicas; the workload's requests are dealt to the
replicas in turn (round robin: the vLLM project's router is not modelled), and within a replica of data-parallel
ranks by vLLM's own rule (kvlab.core.engine.DataParallelEngine). Each candidate is served by kvlab's engine (vLLM 0.33's scheduler) on the measured clock (operator-level
GPU profiles, section 5) with the KV pool vLLM would size (kvlab.core.pool.gpu_kv_pool: vLLM 0.33's sizing code).

The search is not a grid:
1. Pruning, before anything is served, of candidates that cannot work, each proven so:
   - capacity: vLLM would not start (its pool cannot hold one request of max_model_len) or refuses the
     scheduler's settings, or a request of the workload can never fit the pool;
   - step cost (missing data, not a proof, and said so): neither an operator profile nor the GPU's operator tables
     time the model at that tensor parallel size (unless the roofline fallback is allowed);
   - rate: a step of T tokens takes at least min_step_s(T), so a replica serves at most
     max over T <= max_num_batched_tokens of T / min_step_s(T) tokens a second (with data parallelism, each rank
     at most max over T of T / (the least min_step_s(T') over T' >= T), its steps padded to the largest rank's). For p95 E2E latency <= X, the
     k = floor(0.95 (N - 1)) + 1 requests within it finish by the last arrival + X, so the replicas must have
     scheduled at least the k smallest requests' tokens (prompt + output - 1 each; output alone with prefix
     caching) since the first arrival: X >= W_k / (replicas x that rate) - the arrivals' span. The same bound
     holds for p95 TTFT with prompts alone, and p95 TPOT is at least the shortest step. And each request alone:
     its prompt's tokens (one with prefix caching) take at least prompt / that rate and ceil(prompt /
     max_num_batched_tokens) steps, its output at least one step a token after the first, so the 95th percentile
     of those per-request bounds bounds p95 TTFT and E2E from below too (request_bounds). A candidate whose
     lower bound passes an objective is pruned, with the bound.
2. Serving, twins once (twins: the same decisions at the same times, so the same figures; families). Up to
   WHOLE_MAX_REQUESTS requests, every candidate left is served on the whole workload, after a first rung on its first
   PROOF_FRACTION: a candidate whose run there proves it misses an objective stops (proven_misses: the engine is
   causal, so a prefix's run is the whole run's until the replica's next arrival, and more requests over a limit
   by then than a p95 allows prove the p95 over it). Above WHOLE_MAX_REQUESTS, successive halving on prefixes:
   every candidate left is served on its first 1/64, the best quarter (RUNG_KEEP) of those not proven to miss on
   its first 1/16, and so on to all of it (RUNG_FRACTIONS). "Best" is within each number of GPUs (tensor parallel
   size x replicas): the smallest worst share, an objective's value over its limit. Ranking across GPU counts on a
   prefix would favour too few GPUs, since a prefix's queues are shorter than the whole workload's; so every GPU
   count keeps its best to the end, where the whole workload decides. Each rung runs through kvlab.studies.sweep
   (local processes or a Dask cluster), in chunks of candidates.

The ranking: the configurations served in full that meet every objective, by requests/s per GPU (the
workload's rate over the GPUs it uses: goodput, since every request is served), then by that worst share.

A closed loop (max_concurrency N, vLLM bench's --max-concurrency; kvlab.core.engine.closed_loop): the client keeps at
most N requests in flight over the whole fleet, each sent in order once one finishes, never before its open-loop
arrival, and TTFT and E2E count from the send. Each candidate is served so (the engine's closed loop; the metrics
from the sends), and each shortcut above holds for it as follows:
- replicas: N is one semaphore over every replica, whose finishes interleave in time; kvlab does not serve replicas
  together, so a candidate of more than one replica is pruned ("closed loop: ...") rather than planned wrongly (the
  data-parallel ranks of one replica step in lockstep and share the loop: DataParallelEngine serves them);
- rate: the fleet's bound counts from the first arrival over the arrivals' span, but a request's latency counts from
  its send, which the loop delays past its arrival: it does not hold and is switched off (its TTFT and E2E terms are
  0). Each request's own bound (request_bounds) still holds, counted from its send: its own work is done after it;
  so does TPOT's shortest step;
- prefixes (the proofs and the halving): the engine is causal, and the sends of the first m requests are made by
  their own finishes, so a prefix's run is the whole run's until request m is sent: at send_s(its open-loop
  arrival, the send of request m - 1, the (m - N + 1)-th finish of the prefix's run), a finish before that send and
  so the whole run's too (closed_send). proven_misses counts to that time, from the sends;
- twins: never_binds counts the requests present at once, never more than N (sent, not finished); never_refused
  counts each request present from its send in the first run, and a pool that run never refuses is the run of an
  unbounded pool, whose finishes, and so sends, are the same;
- the ranking's rate: the requests are sent as the candidate serves them, so each candidate's throughput is its own:
  completed requests per second from the first send to the last finish (vLLM bench's request throughput), over its
  GPUs.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from kvlab.core import validate
from kvlab.core.config import EngineConfig
from kvlab.core.cost import LinearProfileStepCost, MeasuredStepCost, make_step_cost
from kvlab.core.engine import NoProgressError, check_workload, simulate, warm
from kvlab.core.engine.closed_loop import check_max_concurrency, send_s
from kvlab.core.engine.fast import compiled
from kvlab.core.pool import gpu_kv_pool
from kvlab.core.workload import Workload
from kvlab.studies import sweep
from kvlab.studies.plan_space import (  # noqa: F401
    OBJECTIVE_UNITS,
    OBJECTIVE_WORDS,
    Candidate,
    Deployment,
    Objectives,
    SearchSpace,
    arrival_rate_per_s,
    figure,
)

PERCENTILE = 95
WHOLE_MAX_REQUESTS = 20_000  # up to this many requests, every candidate is served on the whole workload (no halving)
PROOF_FRACTION = 1 / 8  # ...after a first rung on this share of it, which proves the hopeless candidates miss
RUNG_FRACTIONS = (1 / 64, 1 / 16, 1 / 4, 1.0)  # above it, the workload's prefixes the halving's rungs serve
RUNG_KEEP = 0.25  # the share of a rung's candidates the next rung serves
MIN_RUNG_REQUESTS = 200  # a rung serves at least this many requests (or the whole workload)
MIN_KEEP = 2  # a rung keeps at least this many candidates of each GPU count
CHUNKS_PER_WORKER = 4  # a rung's candidates in about this many chunks per worker


# ---------------------------------------------------------------- one candidate's step cost, pool and serving
@functools.lru_cache(maxsize=64)
def step_cost(deployment: Deployment, config: EngineConfig):
    """The step cost a candidate is served on and whether it is measured: the operator-profile step cost of the
    model at the config's TP on the GPU, else (allow_roofline only) the roofline; (cost, measured?, source in
    words)."""
    hardware = {"model": deployment.model, "gpu": deployment.gpu, "config": config}
    try:
        cost = make_step_cost("measured", **hardware)
    except ValueError:  # a GPU no profile measures
        cost = make_step_cost("roofline", **hardware)
        return cost, False, "the roofline at the datasheet's bandwidth and FLOPS (no operator measurement of this GPU)"
    return cost, isinstance(cost, (MeasuredStepCost, LinearProfileStepCost)), cost.source


def rate_bounds(
    cost, max_num_batched_tokens: int, data_parallel_size: int = 1, min_steps_s: list | None = None
) -> tuple[float, float]:
    """The most tokens a second one replica can schedule, and the shortest step (s): max over T <=
    max_num_batched_tokens of T / cost.min_step_s(T) (every T, so no shape of the cost is assumed). Data-parallel
    ranks step in lockstep, each padded to the largest rank's tokens, so a rank of T tokens takes at least the least
    min_step_s(T') over T' >= T, and the replica's rate is that of its ranks together. min_steps_s: cost.min_step_s
    of 1, 2, ... tokens known so far, extended here (for another cost whose min_step_s is the same)."""
    steps = [] if min_steps_s is None else min_steps_s
    steps += [cost.min_step_s(t) for t in range(len(steps) + 1, max_num_batched_tokens + 1)]
    steps = steps[:max_num_batched_tokens]
    if data_parallel_size > 1:
        steps = list(itertools.accumulate(reversed(steps), min))[::-1]
    return data_parallel_size * max(t / step for t, step in enumerate(steps, 1)), min(steps)


def never_binds(
    workload: Workload,
    candidate: Candidate,
    num_gpu_blocks: int,
    max_model_len: int,
    max_concurrency: int | None = None,
) -> bool:
    """Whether the pool can never refuse a block: max_num_seqs requests at their longest fit it with the longest
    left free. Only running requests hold blocks (a preempted or waiting one holds none without prefix caching),
    so every allocation and every admission's whole-length check then passes, and the run's decisions are those
    of any larger pool, of any block size. With data-parallel ranks, at most half of it: a rank's KV usage above
    half weighs in vLLM's choice of rank (kvlab.core.engine.data_parallel). A closed loop of max_concurrency: never more
    requests than that present (sent, not finished), so never more running."""
    if candidate.enable_prefix_caching:
        return False  # hits depend on the blocks
    final = np.minimum(workload.prompt_tokens.astype(np.int64) + workload.output_tokens, max_model_len)
    longest_blocks = -(-int(final.max()) // candidate.block_size)
    running = min(candidate.max_num_seqs, -(-workload.num_requests // candidate.num_replicas))
    if max_concurrency is not None:
        running = min(running, max_concurrency)
    usable = num_gpu_blocks - 1
    return running * longest_blocks <= (usable // 2 if candidate.data_parallel_size > 1 else usable)


def lower_bounds(
    workload: Workload,
    candidate: Candidate,
    tokens_per_s: float,
    min_step_s: float,
    max_model_len: int,
    max_concurrency: int | None = None,
) -> dict:
    """Lower bounds on the candidate's p95 TTFT (s), TPOT (ms) and E2E latency (s) over the workload that hold
    for any scheduling (the module's docstring): the replicas schedule at most tokens_per_s each, a step lasts at
    least min_step_s, and a request ends at max_model_len tokens; the larger of the fleet's bound and each request's
    own (request_bounds). A closed loop (max_concurrency): the fleet's TTFT and E2E bounds do not hold (fleet_bounds)."""
    fleet = fleet_bounds(workload, candidate, tokens_per_s, min_step_s, max_model_len, max_concurrency)
    own = request_bounds(workload, candidate, tokens_per_s, min_step_s, max_model_len)
    return {name: max(value, own.get(name, 0.0)) for name, value in fleet.items()}


def _work(workload: Workload, candidate: Candidate, max_model_len: int) -> tuple:
    """Per request: tokens scheduled before its first token (its prompt; one with prefix caching, which may hit the
    rest), its output tokens (ended at max_model_len) and every token scheduled but the last sampled one."""
    prompt = workload.prompt_tokens.astype(np.int64)
    final = np.minimum(prompt + workload.output_tokens, max_model_len)
    first = np.ones(len(prompt), np.int64) if candidate.enable_prefix_caching else prompt
    return first, final - prompt, first + (final - prompt) - 1


def _p95_floor(values: np.ndarray) -> float:
    """The order statistic np.percentile's p95 interpolates from below: a lower bound on the p95 of values it bounds
    elementwise."""
    return float(np.partition(values, _k(len(values)) - 1)[_k(len(values)) - 1])


def _k(n: int) -> int:
    return math.floor(PERCENTILE / 100 * (n - 1)) + 1


def request_bounds(
    workload: Workload, candidate: Candidate, tokens_per_s: float, min_step_s: float, max_model_len: int
) -> dict:
    """Each request alone (the module's docstring): its TTFT at least its first tokens / tokens_per_s and
    ceil(first / max_num_batched_tokens) steps of min_step_s; its E2E at least all its tokens / tokens_per_s and
    those steps plus one a further output token. The p95 of those (s): bounds for any load, any replicas."""
    first, output, whole = _work(workload, candidate, max_model_len)
    steps = -(-first // candidate.max_num_batched_tokens)
    ttft = np.maximum(first / tokens_per_s, steps * min_step_s)
    e2e = np.maximum(whole / tokens_per_s, (steps + output - 1) * min_step_s)
    return {"ttft_p95_s": _p95_floor(ttft), "e2e_p95_s": _p95_floor(e2e)}


def fleet_bounds(
    workload: Workload,
    candidate: Candidate,
    tokens_per_s: float,
    min_step_s: float,
    max_model_len: int,
    max_concurrency: int | None = None,
) -> dict:
    """The fleet's rate bound (the module's docstring): the k requests within the p95 scheduled by the replicas at
    tokens_per_s each since the first arrival; p95 TPOT at least the shortest step. A closed loop (max_concurrency):
    latencies count from sends the loop delays past the arrivals (N = 1 of requests all made at t=0 serves each alone),
    so the TTFT and E2E bounds, which count from the arrivals, are 0: switched off."""
    n = workload.num_requests
    k = _k(n)
    first, output, whole = _work(workload, candidate, max_model_len)
    span = float(workload.arrival_s[-1] - workload.arrival_s[0])
    fleet = candidate.num_replicas * tokens_per_s
    smallest = lambda values: float(np.partition(values, k - 1)[:k].sum())  # noqa: E731
    closed = max_concurrency is not None
    return {
        "ttft_p95_s": 0.0 if closed else max(0.0, smallest(first) / fleet - span),
        "e2e_p95_s": 0.0 if closed else max(0.0, smallest(whole) / fleet - span),
        "tpot_p95_ms": 1e3 * min_step_s if (output > 1).any() else 0.0,
    }  # a step between two tokens


def percentile_metrics(
    arrival_s: np.ndarray, num_output_tokens: np.ndarray, first_token_s: np.ndarray, finish_s: np.ndarray
) -> dict:
    """p95 TTFT (s), TPOT (ms; over requests of more than one output token) and E2E latency (s), and their means."""
    ttft, e2e = first_token_s - arrival_s, finish_s - arrival_s
    many = num_output_tokens > 1
    tpot_ms = 1e3 * (finish_s[many] - first_token_s[many]) / (num_output_tokens[many] - 1)
    tpot_p95 = float(np.percentile(tpot_ms, PERCENTILE)) if len(tpot_ms) else 0.0
    return {
        "ttft_p95_s": float(np.percentile(ttft, PERCENTILE)),
        "tpot_p95_ms": tpot_p95,
        "e2e_p95_s": float(np.percentile(e2e, PERCENTILE)),
        "mean_ttft_s": float(ttft.mean()),
        "mean_tpot_ms": float(tpot_ms.mean()) if len(tpot_ms) else 0.0,
        "mean_e2e_s": float(e2e.mean()),
    }


def served(
    workload: Workload,
    deployment: Deployment,
    candidate: Candidate,
    num_gpu_blocks: int,
    path: str = "auto",
    max_concurrency: int | None = None,
) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """The candidate serving the workload: requests dealt to its replicas in turn, each replica kvlab's engine on
    the candidate's step cost and pool (path: the engine's, kvlab.core.engine.PATHS); percentile_metrics,
    preemptions and the steps served; and each request's first token, finish and send times (s; the send is its
    arrival in an open loop). A closed loop of max_concurrency (one replica: the module's docstring): the engine's,
    the metrics from the sends, with requests_per_s, the completed requests per second from the first send to the
    last finish (vLLM bench's request throughput)."""
    if max_concurrency is not None and candidate.num_replicas > 1:
        validate.fail("num_replicas", candidate.num_replicas, "must be 1 under a closed loop (max_concurrency)")
    config = candidate.config(deployment.max_model_len)
    cost = step_cost(deployment, config)[0]
    n, replicas = workload.num_requests, candidate.num_replicas
    first_token, finish, outputs, send = np.empty(n), np.empty(n), np.empty(n, np.int64), np.empty(n)
    preemptions = steps = 0
    for rank in range(replicas):
        mine = np.arange(rank, n, replicas)
        part = Workload(
            workload.arrival_s[mine],
            workload.prompt_tokens[mine],
            workload.output_tokens[mine],
            None if workload.prefix_hashes is None else tuple(workload.prefix_hashes[i] for i in mine),
            workload.prefix_block_tokens,
        )
        result = simulate(
            part, config, num_gpu_blocks=num_gpu_blocks, cost=cost, path=path, max_concurrency=max_concurrency
        )
        first_token[mine], finish[mine], outputs[mine] = result.first_token_s, result.finish_s, result.num_output_tokens
        send[mine] = result.arrival_s
        preemptions += int(np.sum(result.num_preemptions))
        steps += result.num_steps
    metrics = percentile_metrics(send, outputs, first_token, finish) | {
        "num_preemptions": preemptions,
        "num_steps": steps,
    }
    if max_concurrency is not None:
        metrics["requests_per_s"] = n / float(finish.max() - send.min())
    return metrics, first_token, finish, send


def serve(
    workload: Workload, deployment: Deployment, candidate: Candidate, num_gpu_blocks: int, path: str = "auto"
) -> dict:
    """The candidate's metrics serving the workload (served)."""
    return served(workload, deployment, candidate, num_gpu_blocks, path)[0]


def never_refused(
    workload: Workload,
    candidate: Candidate,
    finish_s: np.ndarray,
    num_gpu_blocks: int,
    max_model_len: int,
    send_s: np.ndarray | None = None,
) -> bool:
    """Whether a run that ended at finish_s (each request's finish, s) could never have been refused a block by a
    pool of num_gpu_blocks at the candidate's block_size, so that it is the run of any pool, of any block size, that
    passes this test (no prefix caching). Every block check the scheduler makes (an admission's whole-length check,
    a running request's allocation) asks for at most the blocks the requests present then (arrived, not finished:
    the one asking, and every holder; a finished request's blocks are freed by the next check) can hold, each at
    most its final length and one more token (the in-flight one of asynchronous scheduling). If that sum, at its
    peak over time, leaves the pool's usable blocks (the null block aside) enough in each replica, no check was
    refused: the run's decisions are those of an unbounded pool. send_s: when each request was sent in a closed loop
    (present from then; default its arrival): a run never refused is an unbounded pool's, whose finishes, and so
    sends, are the same, so the same sends present the same requests to the pool tested."""
    arrival = workload.arrival_s if send_s is None else send_s
    final = np.minimum(workload.prompt_tokens.astype(np.int64) + workload.output_tokens + 1, max_model_len)
    blocks = -(-final // candidate.block_size)
    n, replicas = workload.num_requests, candidate.num_replicas
    for rank in range(replicas):
        mine = slice(rank, n, replicas)
        times = np.concatenate((arrival[mine], finish_s[mine]))
        change = np.concatenate((blocks[mine], -blocks[mine]))
        order = np.lexsort((change < 0, times))  # in time; at a tie, arrivals before finishes (both present)
        if int(np.cumsum(change[order]).max()) > num_gpu_blocks - 1:
            return False
    return True


def closed_send(open_loop_s: float, send: np.ndarray, finish_s: np.ndarray, max_concurrency: int) -> float:
    """When a closed loop sends the request after a prefix of m requests (send, finish_s: the prefix run's, s) in the
    whole run: send_s of its open-loop arrival, request m - 1's send and the (m - N + 1)-th finish (the slot it takes;
    -inf while m < N). The prefix's run is the whole run's until then (the module's docstring), so that finish is the
    whole run's too."""
    m = len(send)
    slot = (
        float(np.partition(finish_s, m - max_concurrency)[m - max_concurrency]) if m >= max_concurrency else -math.inf
    )
    return send_s(float(open_loop_s), float(send[-1]), slot)


def proven_misses(
    workload: Workload,
    candidate: Candidate,
    first_token_s,
    finish_s,
    max_model_len: int,
    proof: tuple,
    send: np.ndarray | None = None,
    max_concurrency: int | None = None,
) -> list[str]:
    """The objectives a run on a prefix of the workload (each request's first token and finish, s) proves the whole
    workload misses, in words. proof: (objectives, the whole workload's requests and those of more than one output
    token, the arrivals (s) after the prefix). The engine is causal: a replica's run on its first requests is its run
    on all of them until its next request arrives (T), so a request of the prefix still without its first token (its
    last, for E2E; for TPOT, its last at TPOT's limit) at a time before T is so in the whole run too. When more
    requests than a 95th percentile allows (N - floor(0.95 (N - 1)) of N) are over a limit, its p95 is over it. A
    closed loop of max_concurrency (one replica; send: the prefix run's sends): T is the next request's send
    (closed_send), each latency counted from its send."""
    objectives, num_requests, num_multi_token, following = proof
    m, replicas = workload.num_requests, candidate.num_replicas
    if max_concurrency is not None:
        arrival = send
        cutoff = closed_send(following[0], send, finish_s, max_concurrency) if len(following) else np.inf
    else:
        nxt = [m + (rank - m) % replicas for rank in range(replicas)]  # each replica's next request
        arrival = workload.arrival_s
        cutoff = np.array([following[i - m] if i - m < len(following) else np.inf for i in nxt])
        cutoff = cutoff[np.arange(m) % replicas]
    output = _work(workload, candidate, max_model_len)[1]
    out = []
    for name, limit in objectives.given().items():
        margin = limit * (1 + 1e-9) + 1e-12  # past the limit by more than rounding
        if name == "tpot_p95_ms":
            start, end, among = first_token_s, finish_s, num_multi_token
            late = start + margin / 1e3 * np.maximum(output - 1, 0)
            over = (output > 1) & (end > late) & (late < cutoff)
        else:
            end = first_token_s if name == "ttft_p95_s" else finish_s
            late, among = arrival + margin, num_requests
            over = (end > late) & (late < cutoff)
        count, needed = int(over.sum()), among - _k(among) + 1
        if among and count >= needed:
            out.append(
                f"{OBJECTIVE_WORDS[name]} > {limit:g} {OBJECTIVE_UNITS[name]}: already {count:,} of its first {m:,} "
                f"requests are over {limit:g} {OBJECTIVE_UNITS[name]}, and {needed:,} of all {among:,} put the p95 over"
            )
    return out


def serve_chunk(point: tuple) -> list:
    """A sweep point: (workload arrays, deployment, families, proof, max_concurrency), each family a list of (candidate,
    num_gpu_blocks) that differ only in their pools (_pool_free_key, families), the largest first. Each served, one result each (the
    metrics, or the reason the engine stopped), but a family's candidate that a run of its first proves the same
    (never_refused, or never_binds, on both): its first's metrics, with "twin": the index of that first. proof (on a
    prefix; else None): proven_misses's, with "proven": the objectives it proves missed, if any. max_concurrency: a
    closed loop's (None: open)."""
    (arrival, prompt, output, hashes, hash_tokens), deployment, families, proof, max_concurrency = point
    workload = Workload(arrival, prompt, output, hashes, hash_tokens)
    if compiled.available():  # loaded, the compiled loop serves every candidate it can, whatever its size
        compiled.kernels()
    max_model_len = deployment.max_model_len

    def same(c: Candidate, num_gpu_blocks: int, finish_s: np.ndarray, send: np.ndarray) -> bool:
        return never_binds(workload, c, num_gpu_blocks, max_model_len, max_concurrency) or never_refused(
            workload, c, finish_s, num_gpu_blocks, max_model_len, send
        )

    out = []
    for family in families:
        first, unbounded, first_finish, first_send = len(out), False, None, None
        for i, (candidate, num_gpu_blocks) in enumerate(family):
            if unbounded and same(candidate, num_gpu_blocks, first_finish, first_send):
                out.append(out[first] | {"twin": first})
                continue
            try:
                metrics, first_token, finish, send = served(
                    workload, deployment, candidate, num_gpu_blocks, max_concurrency=max_concurrency
                )
            except NoProgressError as error:
                out.append({"error": str(error)})
                continue
            if proof is not None:
                metrics["proven"] = proven_misses(
                    workload, candidate, first_token, finish, max_model_len, proof, send, max_concurrency
                )
            out.append(metrics)
            if not i:
                first_finish, first_send = finish, send
                unbounded = same(candidate, num_gpu_blocks, finish, send)
    return out


# ---------------------------------------------------------------- the search
@dataclass
class CandidateResult:
    """What became of one candidate: pruned (why), dropped at a rung, or served in full (meets or misses)."""

    candidate: Candidate
    status: str = "pending"  # pruned, dropped, meets, misses
    reason: str = ""
    num_gpu_blocks: int = 0
    measured_cost: bool = True  # served on the measured step cost (an operator profile), not the roofline
    served_requests: int = 0  # the prefix it was last served on
    metrics: dict = field(default_factory=dict)
    shares: dict = field(default_factory=dict)
    twin_of: Candidate | None = None  # served as this candidate (twins: the same decisions at the same times)

    @property
    def proven_miss(self) -> bool:
        """Whether a prefix's run proved it misses (proven_misses), so it was not served in full."""
        return self.status == "misses" and self.reason.startswith("proven on the first ")

    @property
    def worst_share(self) -> float:
        return max(self.shares.values()) if self.shares else math.inf

    def row(self, rate_per_s: float | None) -> dict:
        """One flat row (the candidate's knobs, its outcome, its figures). rate_per_s: the workload's (None: a closed
        loop, each candidate's own requests_per_s)."""
        c = self.candidate
        if rate_per_s is None:
            rate_per_s = self.metrics.get("requests_per_s", 0.0)
        return {
            **asdict(c),
            "num_gpus": c.num_gpus,
            "status": self.status,
            "reason": self.reason,
            "num_gpu_blocks": self.num_gpu_blocks,
            "measured_step_cost": self.measured_cost,  # kvlab plan --json's key
            "served_requests": self.served_requests,
            "requests_per_s_per_gpu": rate_per_s / c.num_gpus if self.status == "meets" else 0.0,
            **self.metrics,
            "worst_share": self.worst_share if self.shares else None,
        }


@dataclass
class Plan:
    """A search's outcome: every candidate's result, the ranking and how the search went."""

    deployment: Deployment
    objectives: Objectives
    workload_name: str
    num_requests: int
    rate_per_s: float
    results: list
    rungs: list  # (requests served, candidates on it with their twins, engine runs made, seconds) per rung
    cost_source: str
    seconds: float
    halving: bool = False  # the halving served it (above WHOLE_MAX_REQUESTS, or rung_fractions given)
    max_concurrency: int | None = None  # a closed loop's N (None: the open loop of the arrivals)

    @property
    def row_rate_per_s(self) -> float | None:
        """The rate CandidateResult.row divides by the GPUs: the workload's, or None in a closed loop (each its own)."""
        return None if self.max_concurrency is not None else self.rate_per_s

    def ranked(self) -> list:
        """The configurations served in full that meet every objective, best first: by requests/s per GPU (in a closed
        loop, each candidate's completed requests/s), then by the worst share."""
        meets = [r for r in self.results if r.status == "meets"]
        if self.max_concurrency is not None:
            return sorted(meets, key=lambda r: (-r.metrics["requests_per_s"] / r.candidate.num_gpus, r.worst_share))
        return sorted(meets, key=lambda r: (r.candidate.num_gpus, r.worst_share))

    def counts(self) -> dict:
        """How many candidates ended in each status."""
        out = {s: 0 for s in ("meets", "misses", "dropped", "pruned")}
        for r in self.results:
            out[r.status] += 1
        return out

    def rows(self) -> list[dict]:
        return [r.row(self.row_rate_per_s) for r in self.results]


def _arrays(workload: Workload, n: int) -> tuple:
    hashes = None if workload.prefix_hashes is None else workload.prefix_hashes[:n]
    return (
        workload.arrival_s[:n],
        workload.prompt_tokens[:n],
        workload.output_tokens[:n],
        hashes,
        workload.prefix_block_tokens,
    )


def prefix(workload: Workload, n: int) -> Workload:
    """The workload's first n requests."""
    return Workload(*_arrays(workload, n))


def prune(
    workload: Workload,
    deployment: Deployment,
    objectives: Objectives,
    results: list,
    max_concurrency: int | None = None,
) -> None:
    """Mark the candidates that cannot work (the module's docstring), each with its proof in words; in a closed loop
    (max_concurrency), those of more than one replica too, which it does not serve."""
    rates: dict = {}
    min_steps: dict = {}
    for r in results:
        c = r.candidate
        if max_concurrency is not None and c.num_replicas > 1:
            r.status, r.reason = (
                "pruned",
                f"closed loop: {c.num_replicas} replicas share the client's {max_concurrency:,} in flight, whose "
                "finishes interleave across them; kvlab serves one replica's closed loop only (plan --replicas 1)",
            )
            continue
        config = c.config(deployment.max_model_len)
        pool = gpu_kv_pool(config, deployment.model, deployment.gpu)
        if pool.refusal is not None:
            r.status, r.reason = "pruned", f"capacity: vLLM would not start: {pool.refusal}"
            continue
        r.num_gpu_blocks = pool.num_gpu_blocks
        try:
            check_workload(workload, config, r.num_gpu_blocks)
        except ValueError as error:
            r.status, r.reason = "pruned", f"capacity: {error}"
            continue
        cost, measured, source = step_cost(deployment, config)
        r.measured_cost = measured
        if not measured and not deployment.allow_roofline:
            r.status, r.reason = (
                "pruned",
                f"step cost: unmeasured, not proven: nothing measured times it ({source}); --allow-roofline plans "
                "it on this fallback",
            )
            continue
        same_steps = (  # what min_step_s depends on: the same for every max_num_batched_tokens of the same graphs
            c.tensor_parallel_size,
            c.data_parallel_size,
            c.async_scheduling,  # the CPU's time overlaps the GPU's or adds to it
            cost.__class__,
            source,
            getattr(cost, "cudagraph_capture_sizes", ()),
        )
        key = (same_steps, c.max_num_batched_tokens)
        if key not in rates:
            steps = min_steps.setdefault(same_steps, [])
            rates[key] = rate_bounds(cost, c.max_num_batched_tokens, c.data_parallel_size, steps)
        tokens_per_s, shortest_s = rates[key]
        fleet = fleet_bounds(workload, c, tokens_per_s, shortest_s, deployment.max_model_len, max_concurrency)
        own = request_bounds(workload, c, tokens_per_s, shortest_s, deployment.max_model_len)
        over = [
            f"{OBJECTIVE_WORDS[name]} is at least {figure(bound)} {OBJECTIVE_UNITS[name]} > {limit:g}"
            + (" (each request's own work)" if own.get(name, 0.0) > fleet[name] else "")
            for name, limit in objectives.given().items()
            if (bound := max(fleet[name], own.get(name, 0.0))) > limit
        ]
        if over:
            r.status = "pruned"
            r.reason = (
                f"rate: {c.num_replicas} replica{'s' * (c.num_replicas > 1)} schedule at most "
                f"{c.num_replicas * tokens_per_s:,.0f} tokens/s and a step takes at least {1e3 * shortest_s:.3g} ms, "
                "so " + "; ".join(over)
            )


def _pool_free_key(r: CandidateResult) -> tuple:
    """A candidate's settings but its pool's (block_size, kv_cache_dtype, gpu_memory_utilization): those that leave
    the scheduler's decisions and the measured clock unchanged while the pool refuses nothing (a roofline's KV reads
    depend on the dtype, so it keeps the dtype)."""
    c = r.candidate
    return (
        c.tensor_parallel_size,
        c.data_parallel_size,
        c.max_num_seqs,
        c.max_num_batched_tokens,
        c.enable_chunked_prefill,
        c.async_scheduling,
        c.num_replicas,
        r.measured_cost or c.kv_cache_dtype,
    )


def twins(workload: Workload, deployment: Deployment, alive: list, max_concurrency: int | None = None) -> list[list]:
    """The candidates left in groups that make the same decisions at the same times: those whose pool never binds
    (never_binds) and that differ only in their pools (_pool_free_key); every other candidate alone. The first of a
    group is served for all."""
    groups: dict = {}
    for r in alive:
        bound = never_binds(workload, r.candidate, r.num_gpu_blocks, deployment.max_model_len, max_concurrency)
        groups.setdefault(_pool_free_key(r) if bound else r.candidate, []).append(r)
    return list(groups.values())


def families(alive: list) -> list[list]:
    """The candidates to serve in families that differ only in their pools (_pool_free_key; no prefix caching, one
    data-parallel rank: a data-parallel replica deals its requests by its ranks' KV usage), the largest pool (in
    token slots) first: serve_chunk serves the first, and each other only if that run does not prove it the same
    (never_refused)."""
    out: dict = {}
    for r in alive:
        c = r.candidate
        apart = c.enable_prefix_caching or c.data_parallel_size > 1
        out.setdefault(id(r) if apart else _pool_free_key(r), []).append(r)
    slots = lambda r: (r.num_gpu_blocks - 1) * r.candidate.block_size  # noqa: E731
    return [sorted(family, key=slots, reverse=True) for family in out.values()]


def search(
    workload: Workload,
    deployment: Deployment,
    objectives: Objectives,
    space: SearchSpace = SearchSpace(),
    *,
    scheduler: str | None = None,
    max_workers: int | None = None,
    progress: bool | None = None,
    rung_fractions: tuple | None = None,
    max_concurrency: int | None = None,
) -> Plan:
    """Prune, then serve the candidates left on growing prefixes of the workload (the module's docstring; twins
    served once): up to WHOLE_MAX_REQUESTS requests every candidate to the end but those its first PROOF_FRACTION
    proves miss (proven_misses); above, the halving, each rung keeping the best RUNG_KEEP of those it does not
    prove miss. rung_fractions: the halving's prefixes instead (its last 1.0). max_concurrency: a closed loop of at
    most that many requests in flight (the module's docstring; workload.arrival_s: when each is made). Every
    candidate's outcome and the ranking."""
    import os
    import time

    start = time.perf_counter()
    if max_concurrency is not None:
        max_concurrency = check_max_concurrency(max_concurrency)
    if workload.num_requests < 2:
        validate.fail(
            "num_requests", workload.num_requests, "must be at least 2 to plan on (a rate needs two arrivals)"
        )
    results = [CandidateResult(c) for c in space.candidates(deployment.model)]
    prune(workload, deployment, objectives, results, max_concurrency)
    if all(r.reason.startswith("step cost") for r in results):
        validate.fail(
            "model",
            deployment.model.name,
            f"has no operator profile or operator table that times it on {deployment.gpu.name} at tensor "
            f"parallel size {', '.join(map(str, space.tensor_parallel_size))} for the measured clock (see "
            "data/profiles/index.csv and data/operators/); allow the roofline to plan it (kvlab plan "
            "--allow-roofline), with its warning",
        )
    warm.load(
        warm.LOOPS[:2]
    )  # vLLM 0.33's loops, once here, not in every rung's workers (local ones fork from this process)
    groups = twins(workload, deployment, [r for r in results if r.status == "pending"], max_concurrency)
    alive = [g[0] for g in groups]
    group_size = {id(g[0]): len(g) for g in groups}  # a served candidate stands for its group's twins too
    n = workload.num_requests
    halving = rung_fractions is not None or n > WHOLE_MAX_REQUESTS
    fractions = (rung_fractions or RUNG_FRACTIONS) if halving else (PROOF_FRACTION, 1.0)
    sizes = sorted({min(n, max(MIN_RUNG_REQUESTS, math.ceil(f * n))) for f in fractions})
    num_multi_token = int(np.sum(_work(workload, Candidate(), deployment.max_model_len)[1] > 1))  # output tokens
    workers = max_workers or os.cpu_count() or 1
    rungs = []
    for size in sizes:
        if not alive:
            break
        rung_start = time.perf_counter()
        arrays = _arrays(workload, size)
        grouped = families(alive)
        num_chunks = min(len(grouped), CHUNKS_PER_WORKER * workers)
        chunks = [grouped[i::num_chunks] for i in range(num_chunks)]
        following = workload.arrival_s[size : size + max(r.candidate.num_replicas for r in alive)]
        proof = (objectives, n, num_multi_token, following) if size < n else None
        points = [
            (
                arrays,
                deployment,
                [[(r.candidate, r.num_gpu_blocks) for r in family] for family in chunk],
                proof,
                max_concurrency,
            )
            for chunk in chunks
        ]
        outcomes, _ = sweep.run(
            serve_chunk,
            points,
            scheduler=scheduler,
            max_workers=max_workers,
            progress=progress,
            name=f"plan: {sum(group_size[id(r)] for r in alive)} candidates on {size:,} requests",
        )
        num_runs = sum("twin" not in metrics for outcome in outcomes for metrics in outcome)  # engine runs made
        for chunk, outcome in zip(chunks, outcomes):
            flat = [r for family in chunk for r in family]
            for r, metrics in zip(flat, outcome):
                r.served_requests, r.twin_of = size, None
                if "error" in metrics:
                    r.status, r.reason, r.metrics, r.shares = (
                        "misses",
                        f"the engine stopped: {metrics['error']}",
                        {},
                        {},
                    )
                    continue
                metrics = dict(metrics)
                if "twin" in metrics:
                    r.twin_of = flat[metrics.pop("twin")].candidate
                proven = metrics.pop("proven", [])
                if proven:
                    r.status, r.reason, r.metrics, r.shares = (
                        "misses",
                        f"proven on the first {size:,} requests: " + "; ".join(proven),
                        {},
                        {},
                    )
                    continue
                r.metrics, r.shares = metrics, objectives.shares(metrics)
        num_candidates = sum(group_size[id(r)] for r in alive)
        rungs.append((size, num_candidates, num_runs, time.perf_counter() - rung_start))
        served_ok = [r for r in alive if r.status == "pending"]
        if size == n:
            for r in served_ok:
                missed = objectives.misses(r.metrics)
                r.status, r.reason = ("misses", "; ".join(missed)) if missed else ("meets", "")
            break
        if not halving:
            alive = served_ok
            continue
        strata: dict = {}
        for r in served_ok:
            strata.setdefault(r.candidate.num_gpus, []).append(r)
        num_served = collections.Counter(r.candidate.num_gpus for r in alive)  # those proven to miss included
        alive = []
        for gpus in sorted(strata):
            ranked = sorted(strata[gpus], key=lambda r: r.worst_share)
            keep = max(MIN_KEEP, math.ceil(RUNG_KEEP * num_served[gpus]))
            alive += ranked[:keep]
            last_kept = ranked[min(keep, len(ranked)) - 1].worst_share
            for r in ranked[keep:]:
                missed = objectives.misses(r.metrics)
                r.status = "dropped"
                r.reason = f"on the first {size:,} requests: " + (
                    "; ".join(missed)
                    if missed
                    else f"met every objective, but ranked below the {keep} kept of the {len(ranked)} candidates "
                    f"of {gpus} GPUs (its worst objective at {100 * r.worst_share:.0f}% of its limit, the "
                    f"last kept's at {100 * last_kept:.0f}%"
                    + ("; a tie, broken in the candidates' order)" if r.worst_share == last_kept else ")")
                )
    for group in groups:
        first = group[0]
        for r in group[1:]:
            r.status, r.served_requests, r.metrics, r.shares = (
                first.status,
                first.served_requests,
                first.metrics,
                first.shares,
            )
            r.reason = first.reason
            r.twin_of = first.candidate
    served = [r for r in results if r.status in ("meets", "misses")]
    timed = served or [r for r in results if r.reason.startswith("rate")]  # none served: those the rate pruned
    sources = sorted({step_cost(deployment, r.candidate.config(deployment.max_model_len))[2] for r in timed})
    clauses = list(dict.fromkeys(part for source in sources for part in source.split("; ")))  # each said once
    return Plan(
        deployment,
        objectives,
        workload.name,
        n,
        arrival_rate_per_s(workload.arrival_s),
        results,
        rungs,
        "; ".join(clauses),
        time.perf_counter() - start,
        halving,
        max_concurrency,
    )


# ---------------------------------------------------------------- what the plan says
def step_cost_fidelity(deployment: Deployment) -> list[dict]:
    """Section 5's checks of the measured step cost on this model and GPU: each real vLLM run of them (data/checks/)
    replayed, kvlab's errors on mean E2E latency, mean TPOT, the median per-request E2E error and mean TTFT (shares),
    and whether all four lie within section 5's targets. None such: an empty list."""
    from kvlab.studies import step_cost_checks
    from kvlab.workloads.vllm_runs import check_runs, load_vllm_run

    names = [
        name
        for name in check_runs()
        if (lambda s: s["model"] == deployment.model.name and s["gpu"] == deployment.gpu.name)(
            load_vllm_run(name).settings
        )
    ]
    if not names:
        return []
    table = step_cost_checks.check_run_table(names, cost_names=("measured",))
    return [
        {
            "run": run,
            "label": r["label"],
            **{k: round(float(r[k]), 4) for k in step_cost_checks.CHECK_TARGETS},
            "within_targets": bool(r["within_targets"]),
        }
        for (run, _), r in table.iterrows()
    ]


def summary(plan: Plan, top: int = 10) -> dict:
    """The plan as one JSON-ready object: the deployment, objectives, workload, step cost ("step_cost", with its
    fidelity), the search, the ranked configurations (top of them), the best one's `vllm serve` command, and why the
    rest failed."""
    d = plan.deployment
    ranked = plan.ranked()
    rows = {id(r): r.row(plan.row_rate_per_s) for r in plan.results}
    measured = all(r.measured_cost for r in plan.results if r.status in ("meets", "misses"))
    fidelity = step_cost_fidelity(d) if measured else []
    failed = [r for r in plan.results if r.status != "meets"]
    by_kind: dict = {}
    for r in failed:
        kind = r.status if r.status != "pruned" else "pruned: " + r.reason.split(":")[0]
        by_kind[kind] = by_kind.get(kind, 0) + 1
    closest = sorted((r for r in failed if r.shares), key=lambda r: r.worst_share)[:top]
    best = ranked[0] if ranked else None
    out = {
        "model": d.model.name,
        "gpu": d.gpu.name,
        "max_model_len": d.max_model_len,
        "objectives": plan.objectives.given(),
        "workload": {
            "name": plan.workload_name,
            "num_requests": plan.num_requests,
            # the rate requests are made at (a closed loop's all at t=0, vLLM bench's default: None)
            "rate_per_s": round(plan.rate_per_s, 4) if math.isfinite(plan.rate_per_s) else None,
        },
        "max_concurrency": plan.max_concurrency,  # a closed loop's N (vLLM bench's --max-concurrency); None: open
        "step_cost": {
            "measured": measured,
            "source": plan.cost_source,
            "fidelity": fidelity,
            "warning": ""
            if measured
            else "planned on the roofline (--allow-roofline): no operator profile "
            "measures some candidates; the roofline is a lower bound on a dense model's step times, not on a "
            "mixture-of-experts model's (it counts every expert's FLOPs for every token)",
        },
        "search": {
            "num_candidates": len(plan.results),
            "counts": plan.counts(),
            "num_proven_misses": sum(r.proven_miss for r in plan.results),  # of the misses, not served in full
            "halving": plan.halving,
            "rungs": [
                {"num_requests": n, "num_candidates": c, "num_runs": k, "seconds": round(s, 2)}
                for n, c, k, s in plan.rungs
            ],
            "seconds": round(plan.seconds, 2),
        },
        "ranked": [rows[id(r)] for r in ranked[:top]],
        "num_meeting": len(ranked),
        "best": None
        if best is None
        else {
            **rows[id(best)],
            "vllm_serve": best.candidate.serve_command(d.model.name, d.max_model_len, d.model.quantization),
            "num_replicas": best.candidate.num_replicas,
        },
        "failed": {
            "by_kind": by_kind,
            "closest": [rows[id(r)] for r in closest],
            "pruned_examples": {
                k: next(r.reason for r in failed if r.status == "pruned" and r.reason.startswith(k.split(": ")[1]))
                for k in by_kind
                if k.startswith("pruned: ")
            },
        },
    }
    for row in out["ranked"] + out["failed"]["closest"] + ([out["best"]] if best else []):
        for key, value in row.items():
            if isinstance(value, float):
                row[key] = round(value, 4)
    return out


def report_lines(plan: Plan, out: dict, top: int = 10) -> list[str]:
    """The plan in words, for the terminal."""
    w, s, cost = out["workload"], out["search"], out["step_cost"]
    objectives = ", ".join(f"{OBJECTIVE_WORDS[k]} <= {v:g} {OBJECTIVE_UNITS[k]}" for k, v in out["objectives"].items())
    c = s["counts"]
    closed = out["max_concurrency"]
    if closed is None:
        load = f"at {w['rate_per_s']:.3g} requests/s"
    else:
        made = (
            "--request-rate inf: all made at t=0"
            if w["rate_per_s"] is None
            else f"made at {w['rate_per_s']:.3g} requests/s"
        )
        load = (
            f"in a closed loop of at most {closed:,} in flight, each sent in order as one finishes (vllm bench serve "
            f"--max-concurrency {closed}; {made}); latencies count from the send"
        )
    lines = [
        f"deployment           {out['model']} on {out['gpu']}, max_model_len {out['max_model_len']:,}",
        f"workload             {w['name'] or 'trace'}: {w['num_requests']:,} requests {load}",
        f"objectives           {objectives}",
        f"step cost            {cost['source']}",
    ]
    if cost["warning"]:
        lines.append(f"warning              {cost['warning']}")
    for f in cost["fidelity"]:
        lines.append(
            f"step cost checked   against a real vLLM run ({f['label']}, section 5): mean E2E "
            f"{100 * f['mean_e2e_error']:+.1f}%, mean TPOT {100 * f['mean_tpot_error']:+.1f}%, median request "
            f"E2E error {100 * f['median_request_e2e_error']:.1f}%, mean TTFT {100 * f['mean_ttft_error']:+.1f}%"
            f" ({'within' if f['within_targets'] else 'outside'} section 5's targets)"
        )
    if not cost["fidelity"] and cost["measured"]:
        lines.append("step cost checked   no real vLLM run of this model on this GPU checks it (data/checks/)")
    rungs = (
        "; ".join(
            f"{r['num_candidates']:,} on {r['num_requests']:,} requests ({r['num_runs']:,} runs, {r['seconds']:.0f} s)"
            for r in s["rungs"]
        )
        or "none served"
    )
    how = (
        "the halving"
        if s["halving"]
        else f"every candidate to the end (under {WHOLE_MAX_REQUESTS:,} requests) but those a prefix proves miss"
    )
    lines.append(
        f"search               {s['num_candidates']:,} candidates: {c['pruned']:,} pruned, then {how}: {rungs}; "
        f"{s['seconds']:.0f} s"
    )
    proven = s["num_proven_misses"]
    lines.append(
        f"outcome              {c['meets']:,} meet every objective, {c['misses'] - proven:,} served in full miss, "
        f"{proven:,} proven to miss on a prefix, {c['dropped']:,} dropped on a prefix, {c['pruned']:,} pruned"
    )
    if out["ranked"]:
        lines.append("")
        if closed is not None:
            lines.append("ranked by completed requests/s per GPU (first send to last finish, vLLM bench's throughput)")
        lines.append(
            f"{'rank':>4}  {'GPUs':>4}  {'req/s/GPU':>9}  {'TTFT p95 s':>10}  {'TPOT p95 ms':>11}  "
            f"{'E2E p95 s':>9}  configuration"
        )
        for i, row in enumerate(out["ranked"], 1):
            cand = Candidate(**{f: row[f] for f in Candidate.__dataclass_fields__})
            lines.append(
                f"{i:>4}  {row['num_gpus']:>4}  {row['requests_per_s_per_gpu']:>9.3f}  "
                f"{row['ttft_p95_s']:>10.3f}  {row['tpot_p95_ms']:>11.1f}  {row['e2e_p95_s']:>9.2f}  "
                f"{cand.label()}"
            )
        if out["num_meeting"] > len(out["ranked"]):
            lines.append(f"      ... and {out['num_meeting'] - len(out['ranked']):,} more that meet (--top, --json)")
        best = out["best"]
        lines.append("")
        lines.append(f"best                 {best['num_replicas']} x: {best['vllm_serve']}")
    else:
        lines.append("")
        lines.append(
            "best                 none: no configuration meets every objective (see why below; more replicas, "
            "a larger --tensor-parallel-size or looser objectives)"
        )
    lines.append("")
    lines.append("why the others failed")
    for kind, count in out["failed"]["by_kind"].items():
        example = out["failed"]["pruned_examples"].get(kind)
        lines.append(f"  {kind}: {count:,}" + (f" (e.g. {example})" if example else ""))
    for row in out["failed"]["closest"][:5]:
        cand = Candidate(**{f: row[f] for f in Candidate.__dataclass_fields__})
        lines.append(f"  closest: {cand.label()}: {row['status']}, {row['reason']}")
    return lines
