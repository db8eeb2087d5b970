"""The engine's per-step loop compiled with numba: the same decisions, times and records, faster.

It is Engine.run's loop (kvlab/core/engine/engine_core.py's run_sync and run_async: schedule, step cost, update_from_output,
the step's record), synchronous or asynchronous (a batch queue of two), compiled by numba from that source over the
named arrays of arrays.py (kvlab.core.engine.fast.loops):
vLLM 0.33's v1 scheduler over paged blocks and a constant, linear, measured, 2023 or one GPU's roofline step cost
(clock_of: the step cost's Clock packed into one array, evaluated by loops.clock, which compiles
kvlab.core.cost.step_time, the source their step_s runs; a decode run's steps each timed as it grows, each as its
step_s times it). Without prefix
caching both loops also do runs of decode steps at once, in closed form (loops.step_runs; DECODE_RUNS;
engine.num_decode_runs counts them).
Without prefix caching the pool is a count of free blocks (which block a request gets changes nothing then); with
it, the blocks themselves, vLLM's free-queue order and a cache keyed by hash ids computed here up front (hash_ids:
full prompt blocks of equal token ids, or of equal prompt block ids (Workload.prefix_hashes, Mooncake's form), under
equal parents share one, every other block has its own, as block_hashes.block_content tells blocks apart). A hybrid model's KV cache groups (sliding windows, chunked local
attention, Mamba states in mamba_cache_mode "none"; KVCacheManager over the groups' managers) are served here without prefix caching, each
group's table as its length and leading nulls (arrays.Groups), from COMPILED_FROM_REQUESTS_HYBRID requests. vLLM 0.1.4's
scheduler (scheduler_cls "v0-2023"), over paged blocks or the vLLM paper's Orca reservations, runs the same run_sync
compiled with its own schedule(), step by step (loops.v0.loop_v0; reservations builds its buddy arenas). Everything else (vLLM 0.33's scheduler over a reservation, other step costs, block-table and batch records) runs in Python. A closed loop
(max_concurrency, kvlab.core.engine.closed_loop) is served here too: each finish sends the request that waited for its
slot (loops.scheduler.finished_at, the compiled closed_loop.send_s), the arrival array holding the sends. tests/test_compiled.py
holds the two to the same results, bit for bit, on hand cases and on hypothesis workloads.

numba is a pinned wheel (requirements.lock). Without it the engine runs in Python; and, unless the loops are
already loaded in this process, below COMPILED_FROM_REQUESTS requests too, where numba's import and the loading
of its cache (0.6-0.9 s) cost more than they save. numba compiles each loop once per machine (about 40-60 s each, the step costs with the first)
into its cache (NUMBA_CACHE_DIR, by default the checkout's .cache/numba): `make setup` does it (kvlab.core.engine.warm), and a run
that must compile first says so on the "kvlab" logger, which the command line prints. The loop runs
in chunks of CHUNK_STEPS steps, each compacted into the StepLog's form before the next, so memory per step stays
the StepLog's.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import sys
import time
from collections import namedtuple

import numpy as np

from kvlab.core import validate
from kvlab.core.block_pool import BlockPool
from kvlab.core.cost import (
    ConstantStepCost,
    LinearStepCost,
    MeasuredStepCost,
    RooflineStepCost,
    Vllm2023StepCost,
    step_time,
)
from kvlab.core.engine.fast.arrays import (
    LOOP_STATE,
    REQUEST_RECORD,
    Arrays,
    Groups,
    Limits,
    Pool,
    Requests,
    Reservations,
)
from kvlab.core.engine.records import FULL, NO_PROGRESS, PAUSED, RequestLog, Runs, StepLog

# What a compiled run recorded: the step log, the decode runs done at once, the clock at the end, its RequestLog, the
# blocks windows gave back and, in a closed loop, the send times (else None).
Served = namedtuple("Served", ["steps", "num_decode_runs", "now_s", "requests", "num_window_freed", "send_s"])
LOG = logging.getLogger("kvlab")
# Where a fresh process's compiled run (numba's import and cache load, 0.6-0.9 s here, included) overtakes the Python
# per-step loop, measured on make bench's binding Azure-like workload: 2,000 requests take 0.7-1.0 s in Python and
# 0.7-0.9 s compiled, 3,000 requests 1.35 s and 0.75 s.
COMPILED_FROM_REQUESTS = 2_000
# A hybrid model's groups, about 1.6 ms a request in Python: the compiled loop pays from fewer requests.
COMPILED_FROM_REQUESTS_HYBRID = 1_000
_RAN: set = set()  # the loops run in this process (numba's cache need not be asked again: ~0.2 ms a run)
CHUNK_STEPS = 1 << 18
FLEET_CHUNK_STEPS = 1 << 14  # a fleet's instance's (1.5 MiB of records each)
DECODE_RUNS = True  # the loops do decode runs at once (False: step by step)


def available() -> bool:
    """Whether numba is installed (the compiled path exists); found without importing it."""
    return importlib.util.find_spec("numba") is not None


def worth_it(num_requests: int, hybrid: bool = False) -> bool:
    """Whether the compiled loop pays for itself: a run of COMPILED_FROM_REQUESTS requests or more (a hybrid model's:
    COMPILED_FROM_REQUESTS_HYBRID), or any run once the loops are loaded in this process (a sweep of many small runs)."""
    return num_requests >= (COMPILED_FROM_REQUESTS_HYBRID if hybrid else COMPILED_FROM_REQUESTS) or loaded()


def ran() -> set:
    """The compiled loops run in this process so far."""
    return _RAN


def loaded() -> bool:
    """Whether the compiled loops (kvlab.core.engine.fast.loops, and so numba) are imported in this process."""
    return "kvlab.core.engine.fast.loops.jit" in sys.modules


@functools.lru_cache(maxsize=64)
def clock_of(cost) -> step_time.Clock | None:
    """The step cost as the compiled loop reads it (kvlab.core.cost.step_time.Clock, its tables packed one after another
    into one array), or None for one it does not evaluate: constant, linear, measured, 2023 and roofline (without
    all-reduces) ones it does. Kept for the step costs last asked about (a plan serves hundreds of runs on a few)."""
    kind = {ConstantStepCost: 0, LinearStepCost: 1, MeasuredStepCost: 2, Vllm2023StepCost: 3, RooflineStepCost: 4}.get(
        type(cost)
    )
    if kind is None or (kind == 4 and cost.all_reduce is not None):
        return None
    if kind >= 2:
        clock = cost.clock
    else:  # ms a step and ms a token (a constant one has none)
        cost_ms = [float(cost.step_ms), float(getattr(cost, "step_ms_per_token", 0.0))]
        clock = step_time.clock(kind, {"cost_ms": cost_ms})
    arrays = [np.asarray(t, dtype=np.float64).ravel() for t in clock.table]
    at = np.concatenate(([0], np.cumsum([len(a) for a in arrays]))).astype(np.int64)
    return clock._replace(table=np.concatenate(arrays), at=at)


def eligible(engine) -> bool:
    """Whether the engine's run is one the compiled loop does (see the module's docstring)."""
    config = engine.config
    caching = config.cache.enable_prefix_caching
    v0 = config.scheduler.scheduler_cls == "v0-2023"  # vLLM 0.1.4's: paged or reserving, no prefix cache (config)
    return (
        clock_of(engine.cost) is not None
        and (v0 or engine.allocation == "paged")
        and (
            not caching
            or engine.prompt_token_ids is None  # token ids that are the prompt, no more, no less
            or all(len(ids) == p for ids, p in zip(engine.prompt_token_ids, engine.workload.prompt_tokens))
        )
        and engine.recorder is None
        and (engine.kv_cache_groups is None or not caching)
        and engine.kv_transfers is None  # a KV connector: the Python engine (kv_connector.py)
    )


def hash_ids(engine, max_num_tokens: np.ndarray) -> tuple:
    """Request r's block j's hash id (loops.pool.hash_id): full prompt blocks of equal contents (_full_prompt_blocks)
    under equal parents share one (block_hashes.block_content tells blocks apart by the same contents); every other
    block, holding generated tokens or a prompt no other request shares, has its own. (offset, shared ids, number
    shared, base, ids in all)."""
    w, bs = engine.workload, engine.block_size
    n = w.num_requests
    offset, num_shared = np.zeros(n, np.int64), np.zeros(n, np.int64)
    shared: list[int] = []
    table: dict = {}
    for r, rows in enumerate(_full_prompt_blocks(engine)):
        offset[r], num_shared[r] = len(shared), len(rows)
        parent = -1
        for row in rows:
            parent = table.setdefault((parent, row), len(table))
            shared.append(parent)
    total = len(table)
    widths = max_num_tokens // bs + 1 - num_shared  # blocks j < max_num_tokens // bs + 1 are looked up
    base = total + np.concatenate(([0], np.cumsum(widths)[:-1]))
    return offset, np.array(shared, dtype=np.int64), num_shared, base, int(total + widths.sum())


def workload_hash_ids(engine) -> tuple:
    """hash_ids of the engine's whole workload, each request's blocks looked up as far as it may grow (a fleet's
    compiled instances share them: CompiledRun's table)."""
    w = engine.workload
    max_tokens_total = np.asarray(w.prompt_tokens, dtype=np.int64) + np.asarray(w.output_tokens, dtype=np.int64)
    return hash_ids(engine, np.minimum(max_tokens_total, engine.scheduler.max_request_tokens))


def _full_prompt_blocks(engine):
    """Each request's full prompt blocks as what tells them apart (block_hashes.block_content, under equal parents):
    its token ids, or the prompt block ids (Workload.prefix_hashes) that cover it; nothing where the prompts share
    nothing (no token ids, no prefix hashes or no prefix caching)."""
    w, bs = engine.workload, engine.block_size
    if engine.prompt_token_ids is not None:
        for ids in engine.prompt_token_ids:
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            yield ids[: len(ids) // bs * bs].view(np.dtype((np.void, 8 * bs))).tolist()
    elif w.prefix_hashes is not None and engine.config.cache.enable_prefix_caching:
        size = w.prefix_block_tokens
        for ids, num_prompt_tokens in zip(w.prefix_hashes, w.prompt_tokens.tolist()):
            ids = np.asarray(ids).tolist()
            starts = range(0, num_prompt_tokens // bs * bs, bs)  # block j's tokens lie in prompt blocks first..last
            yield [tuple(ids[start // size : (start + bs - 1) // size + 1]) for start in starts]
    else:
        yield from ([] for _ in range(w.num_requests))


def block_pool(engine, max_num_tokens: np.ndarray, capacity: int | None = None, table: tuple | None = None) -> tuple:
    """The compiled loop's Pool (fast/arrays.py): every usable block free, the null block 0 never handed out. A
    fleet's instance (room for capacity requests, added as they are routed: CompiledRun.add): the hash ids of the
    fleet's whole workload (table: hash_ids'), each request's written where it is added."""
    caching = engine.config.cache.enable_prefix_caching
    if not caching:  # the loops read the pool only with prefix caching: placeholders
        one, table = np.zeros(1, np.int64), np.zeros((1, 1), np.int64)
        return Pool(False, *(one,) * 9, table, *(one,) * 9, np.zeros(1, np.int64))
    bs, sched = engine.block_size, engine.config.scheduler
    if capacity is None:
        offset, shared, num_shared, base, num_ids = hash_ids(engine, max_num_tokens)
    else:
        (_, shared, _, _, num_ids), offset, num_shared, base = table, *(np.zeros(capacity, np.int64) for _ in range(3))
    width = -(-engine.max_model_len // bs) + 1
    n = engine.workload.num_requests if capacity is None else capacity
    slots = min(sched.max_num_seqs, n)
    start = BlockPool(engine.num_gpu_blocks, enable_caching=True)  # every usable block free, in vLLM's order
    lists = ("stack", "free_state", "tail_next", "tail_prev", "ref", "hash_of", "hash_next", "hash_prev")
    return Pool(
        True,
        *(np.array(getattr(start, name), np.int64) for name in lists),
        hash_ends=np.full(2 * num_ids, -1, np.int64),
        tables=np.zeros((slots, width), np.int64),
        slot_of=np.full(n, -1, np.int64),
        free_slots=np.arange(slots, dtype=np.int64)[::-1].copy(),
        num_free_slots=np.array([slots], np.int64),
        hash_offset=offset,
        hash_shared=shared,
        num_shared=num_shared,
        hash_base=base,
        hits=np.zeros(width, np.int64),
        hash_ids=np.zeros(width, np.int64),
        num_free_blocks=np.zeros(1, np.int64),
    )


def reservations(engine, num_prompt_tokens: np.ndarray, max_num_tokens: np.ndarray) -> Reservations:
    """vLLM 0.1.4's pool as loops.v0 reads it (arrays.Reservations): paged, its watermark; else the reservation
    pool's buddy arenas, every one free, and each request's reservation (ReservationManager.reservation_tokens_of)."""
    kv = engine.kv_cache_manager
    one = np.zeros(1, np.int64)
    if engine.allocation == "paged":  # (vLLM 0.33's loops: a placeholder)
        watermark = getattr(engine.scheduler, "watermark_blocks", 0)
        return Reservations(1, watermark, 0, one, one, one, one, one, one, np.zeros(3, np.int64))
    buddy = kv.buddy
    free_at = np.full(buddy.num_slots, -1, np.int64)
    num_free_chunks = np.zeros(buddy.max_order + 1, np.int64)
    for offset, order in buddy.arenas:
        free_at[offset] = order
        num_free_chunks[order] += 1
    starts, orders = (np.array(column, np.int64) for column in zip(*buddy.arenas))
    return Reservations(
        0,
        0,
        buddy.num_slots,
        starts,
        orders,
        free_at,
        num_free_chunks,
        kv.reservation_tokens_of(num_prompt_tokens, max_num_tokens),
        np.zeros(len(num_prompt_tokens), np.int64),
        np.array([buddy.num_slots, 0, 0], np.int64),
    )


def kv_cache_groups(engine) -> Groups:
    """A hybrid model's KV cache groups as the loops read them (arrays.Groups; every array empty for one
    full-attention group): each group's sizes and admission cap (KVCacheManager.caps), every table empty, and
    the decode runs' weights and histograms (a group's: its block phases unless its block is a Mamba state's of
    max_model_len tokens, then a window's block phases or a chunk's phases)."""
    groups = engine.kv_cache_groups or ()
    n, num_groups = engine.workload.num_requests if groups else 1, len(groups)
    caps = engine.kv_cache_manager.caps if groups else []
    specs = [(g.block_size, g.sliding_window, g.attention_chunk_size) for g in groups]
    weight = [specs.count(spec) if specs.index(spec) == i else 0 for i, spec in enumerate(specs)]
    sizes = [
        w and (bs if bs < engine.max_model_len else 0) + (bs if window else chunk)
        for w, (bs, window, chunk) in zip(weight, specs)
    ]
    offset = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    columns = [*zip(*specs)] if groups else [(), (), ()]
    return Groups(
        *(np.array(column, dtype=np.int64) for column in (*columns, caps)),
        blocks=np.zeros((n, num_groups), np.int64),
        nulls=np.zeros((n, num_groups), np.int64),
        freed=np.zeros(1, np.int64),
        weight=np.array(weight, dtype=np.int64),
        offset=offset[:-1].copy(),
        hist=np.zeros(int(offset[-1]), np.int64),
        events=np.zeros((min(engine.config.scheduler.max_num_seqs, n) * num_groups, 3), np.int64),
        free_at=np.zeros(min(CHUNK_STEPS, 64 + 64 * n) + 2 if groups else 1, np.int64),
    )


def chosen(engine, path: str) -> bool:
    """Whether run() takes the compiled loop (kvlab.core.engine.fast.compiled): "auto" decides by itself
    (eligible, numba installed, and worth it: COMPILED_FROM_REQUESTS requests, or the loops already loaded);
    "compiled" insists; "reference" never. A closed loop (max_concurrency) as an open one: the loops
    send each request as the finish that frees its slot comes (loops.scheduler.finished_at, closed_loop.send_s compiled)."""
    if path == "auto":
        hybrid = engine.kv_cache_groups is not None
        return worth_it(engine.workload.num_requests, hybrid) and eligible(engine) and available()
    if path == "compiled":
        if not eligible(engine):
            validate.fail(
                "path",
                "compiled",
                "applies only to the v1 scheduler over paged blocks (prefix caching by token ids that are the "
                "prompts, or by Workload.prefix_hashes) or the v0-2023 one over paged blocks or a reservation, "
                "a constant, linear, measured, 2023 or roofline (one GPU) step cost, no recorder and no KV "
                "connector (kv_transfers),",
            )
        if not available():
            validate.fail("path", "compiled", "needs numba, which is not installed (make setup installs it)")
    return path == "compiled"


def kernels():
    """The compiled loops of vLLM 0.33 (kvlab.core.engine.fast.loops.engine; numba compiles them on first use and its
    cache keeps them)."""
    from kvlab.core.engine.fast.loops import engine

    return engine


def kernels_v0():
    """The compiled loop of vLLM 0.1.4's scheduler (kvlab.core.engine.fast.loops.v0)."""
    from kvlab.core.engine.fast.loops import v0

    return v0


def cached(loop) -> bool:
    """Whether numba's cache holds a compiled loop (a kernels() dispatcher) for this source: if not, its first call
    compiles it. True where the cache cannot be read (nothing is said then)."""
    try:
        return bool(loop.signatures) or bool(loop._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - numba's cache internals: say nothing rather than fail a run
        return True


def _add_runs(runs: Runs, column: np.ndarray) -> None:
    """Append a chunk's column to runs of equal values (Runs.add for each value, at once)."""
    if not len(column):
        return
    edges = np.flatnonzero(column[1:] != column[:-1]) + 1
    starts = np.concatenate(([0], edges))
    values = column[starts]
    counts = np.diff(np.append(starts, len(column)))
    if runs.values and runs.values[-1] == values[0]:
        runs.counts[-1] += int(counts[0])
        values, counts = values[1:], counts[1:]
    runs.values.frombytes(values.astype(np.int64).tobytes())
    runs.counts.frombytes(counts.astype(np.int64).tobytes())


def serve(engine) -> Served | None:
    """Serve the engine's whole workload with the compiled loop: what it recorded (the engine adopts it), or None if
    the run cannot progress (the caller runs the Python loop, which says why)."""
    run = CompiledRun(engine)
    return None if run.advance() == NO_PROGRESS else run.served()


def entry_point(dispatcher, *args):
    """The compiled function a numba dispatcher calls for args (its CompileResult's entry_point), or None where
    numba's internals do not give it (the dispatcher is called then)."""
    try:
        return dispatcher.overloads[tuple(dispatcher.typeof_pyval(a) for a in args)].entry_point
    except (AttributeError, KeyError):  # pragma: no cover - numba's internals moved
        return None


class CompiledRun:
    """A compiled run of an engine: its arrays (arrays.Arrays), the loop's state (arrays.LOOP_STATE) and the step
    records so far. serve() runs one to the end; a fleet's instance (kvlab.core.fleet) runs one until each arrival
    (advance's until_s), the requests routed to it added as they are (add), into room for capacity requests."""

    def __init__(self, engine, capacity: int | None = None, table: tuple | None = None):
        w, sched = engine.workload, engine.config.scheduler
        self.table = table  # a fleet's instance with prefix caching: hash_ids of the fleet's workload
        self.engine, self.fleet = engine, capacity is not None
        n = w.num_requests if capacity is None else capacity
        self.num_added = n if capacity is None else 0
        v0 = sched.scheduler_cls == "v0-2023"
        # a writable copy always: a workload's own arrays are read-only, a converted one's not, and numba compiles the
        # loops once for each (the first run after make setup took 150 s to compile the other)
        num_prompt_tokens = np.array(w.prompt_tokens if capacity is None else np.zeros(n), dtype=np.int64)
        output_tokens = np.asarray(w.output_tokens if capacity is None else np.zeros(n), dtype=np.int64)
        max_tokens_total = num_prompt_tokens + output_tokens
        max_num_tokens = np.minimum(max_tokens_total, engine.scheduler.max_request_tokens)
        self.num_prompt_tokens = num_prompt_tokens
        cfg = Limits(
            engine.block_size,
            sched.max_num_seqs,
            sched.max_num_batched_tokens,
            engine.max_model_len,
            int(sched.enable_chunked_prefill),
            sched.long_prefill_token_threshold,
            engine.num_gpu_blocks - 1,
            int(engine.config.cache.enable_prefix_caching),
            int(DECODE_RUNS and all(g.attention_chunk_size % g.block_size == 0 for g in engine.kv_cache_groups or ())),
            0,  # no Mamba groups compiled
            engine.scheduler.max_prefill_tokens,
            0,
            bool(sched.async_scheduling),
        )
        cost = clock_of(engine.cost)
        self.state = np.zeros(1, LOOP_STATE)  # the loop's state, kept between chunks (arrays.LOOP_STATE)
        start = self.state[0]
        start["num_free_blocks"] = engine.num_gpu_blocks - 1  # every usable block is free
        start["now_s"] = start["gpu_free_s"] = float(w.arrival_s[0])
        start["last_end_s"] = math.nan
        start["until_s"] = math.inf
        zeros, nans = (lambda: np.zeros(n, np.int64)), (lambda: np.full(n, np.nan))  # noqa: E731
        # a closed loop: the sends so far (inf until a finish frees a slot), N and 0 finishes
        sends = engine.closed_loop
        if capacity is not None:  # a fleet's instance: each arrival unknown (inf) until its request is routed here,
            # and after the requests added a placeholder at until_s, which never joins (the loop pauses first); once
            # every request is added the loop ends at the first unknown one: PAUSED with the clock at inf
            arrival_s = np.full(n + 1, math.inf)
            open_loop, closed = np.empty(0), np.empty(0, np.int64)
        elif sends is None:
            arrival_s = np.array(w.arrival_s, dtype=np.float64)  # writable (finished_at's closed loop writes its sends)
            open_loop, closed = np.empty(0), np.empty(0, np.int64)
        else:
            arrival_s = np.array(sends.send, dtype=np.float64)
            open_loop = np.array(sends.open_loop, dtype=np.float64)
            closed = np.array([sends.max_concurrency, sends.num_finished], np.int64)
        self.sends, self.arrival_s = sends, arrival_s
        # the requests' records, and a spare one after them: every column is then a strided view, which numba types
        # alike for any n (one request's column alone would be contiguous, a type of its own and the loops compiled
        # again)
        records = np.zeros(n + 1, REQUEST_RECORD)  # status 0: WAITING
        records["num_prompt_tokens"][:n], records["max_num_tokens"][:n] = num_prompt_tokens, max_num_tokens
        records["max_tokens"][:n] = max_tokens_total - num_prompt_tokens
        records["num_tokens"][:n] = num_prompt_tokens
        records["request_id"][:n] = np.arange(n)
        view = {name: records[name] for name in REQUEST_RECORD.names if name in Requests._fields}
        self.req = req = Requests(
            arrival_s=arrival_s,
            max_tokens_total=max_tokens_total,
            num_blocks=zeros(),
            num_cached_blocks=zeros(),
            first_scheduled_s=nans(),
            first_token_s=nans(),
            finish_s=nans(),
            open_loop=open_loop,
            closed_loop=closed,
            records=records,
            **view,
        )
        chunk = min(CHUNK_STEPS if capacity is None else FLEET_CHUNK_STEPS, 64 + 64 * n)
        self.logs = logs = (np.empty(chunk), np.empty(chunk)) + tuple(np.empty(chunk, np.int64) for _ in range(5))
        self.events = events = tuple(np.empty(chunk, np.int64) for _ in range(5))
        self.groups = groups = kv_cache_groups(engine)
        size = min(n, sched.max_num_seqs)  # a batch schedules at most max_num_seqs requests
        # The loops' arrays (arrays.Arrays), here so that they outlive the loop's unowned views of them
        # (loops.jit.unowned): the queues, the batch queue, a decode run's block phases (per running request), counts
        # (per phase) and batch ends.
        self.split = split = tuple(np.zeros(chunk if engine.reserving else 1, np.int64) for _ in range(3))  # Fig. 2
        self.arrays = Arrays(
            req=req,
            cfg=cfg,
            cost=cost,
            pool=block_pool(engine, max_num_tokens, capacity, table),
            groups=groups,
            running=zeros(),
            waiting=zeros(),
            queue_r=np.zeros((2, size), np.int64),
            queue_n=np.zeros((2, size), np.int64),
            queue_sample=np.zeros((2, size), np.bool_),
            queue_i=np.zeros((2, 7), np.int64),
            queue_f=np.zeros((2, 2)),
            acc=np.zeros(7, np.int64),
            phases=np.zeros(size, np.int64),
            per_phase=np.zeros(engine.block_size, np.int64),
            times=np.zeros(chunk + 2),
            logs=logs,
            events=events,
            counts=np.zeros(4, np.int64),
            split=split,
            orca=reservations(engine, num_prompt_tokens, max_num_tokens),
        )
        loops = kernels_v0() if v0 else kernels()
        self.loop = loops.loop_v0 if v0 else loops.loop_async if sched.async_scheduling else loops.loop_sync
        self.mode = "vLLM 0.1.4" if v0 else "asynchronous" if sched.async_scheduling else "synchronous"
        self.log = StepLog(engine.block_size, not engine.reserving)
        self.entry = None  # a fleet's instance: the loop's compiled entry point (call)

    def add(self, arrival_s: float, num_prompt_tokens: int, output_tokens: int, request_id: int) -> int:
        """A fleet's instance: the next request routed to it (request_id: the fleet's workload's), arriving at
        arrival_s (after every one added before). Returns its index here."""
        k, records = self.num_added, self.req.records
        if self.table is not None:  # its blocks' hash ids
            offset, _, num_shared, base, _ = self.table
            pool = self.arrays.pool
            pool.hash_offset[k], pool.num_shared[k] = offset[request_id], num_shared[request_id]
            pool.hash_base[k] = base[request_id]
        total = num_prompt_tokens + output_tokens
        records[k]["num_prompt_tokens"] = records[k]["num_tokens"] = self.num_prompt_tokens[k] = num_prompt_tokens
        records[k]["max_tokens"] = output_tokens
        records[k]["max_num_tokens"] = min(total, self.engine.scheduler.max_request_tokens)
        self.req.max_tokens_total[k] = total
        self.arrival_s[k] = arrival_s
        self.num_added = k + 1
        return k

    def advance(self, until_s: float = math.inf) -> int:
        """Run the loop until every request added has finished (DONE), nothing can progress (NO_PROGRESS) or, where
        requests may still be added, its clock reaches until_s (PAUSED: engine_core.paused; a fleet's instance ends
        PAUSED at the clock inf once every request added has finished)."""
        state = self.state
        if self.fleet:
            self.arrival_s[self.num_added] = until_s  # the placeholder
            if state["now_s"][0] >= until_s:
                return PAUSED  # (the loop would pause at once)
        state["until_s"] = until_s
        compiling = self.loop not in _RAN and not cached(self.loop)
        if compiling:
            LOG.info(
                "numba compiles the engine's %s loop, once for this machine (about a minute; `make setup` does it "
                "ahead; cached in %s)",
                self.mode,
                self.loop._cache._cache_path,
            )
            started = time.perf_counter()
        while True:
            code = self.call()
            if code == NO_PROGRESS:
                return code
            _RAN.add(self.loop)
            if compiling:
                LOG.info("compiled, with the first steps run, in %.1f s", time.perf_counter() - started)
                compiling = False
            if self.fleet and code != FULL:
                return code  # (its records stay in the chunk until it is full or the run is read: served)
            self.keep_records()
            if code != FULL:
                return code

    def call(self) -> int:
        """One call of the loop; a fleet's instance, called between every two arrivals, calls its compiled entry
        point directly after the first (numba's dispatch, which checks the arguments' types, costs 3x the call)."""
        if self.entry is not None:
            return self.entry(self.arrays, self.state[0])
        code = self.loop(self.arrays, self.state[0])
        if self.fleet:
            self.entry = entry_point(self.loop, self.arrays, self.state[0])
        return code

    def keep_records(self) -> None:
        """Add the chunk's step records (the loop's logs and events) to the run's StepLog."""
        arrays, log = self.arrays, self.log
        s, num_starts, num_pre, num_hits = (int(c) for c in arrays.counts)
        first_step = int(self.state["num_steps"][0])
        self.state["num_steps"] += s
        if not (s or num_starts or num_pre or num_hits):
            return
        arrays.counts[:] = 0  # the chunk emptied
        end_s, start_s, held, kv_tokens, tokens, num_running, num_waiting = self.logs
        start_step, preempt_step, preempt_count, hit_step, hit_count = self.events
        log.end_s.frombytes(end_s[:s].tobytes())
        log.held.frombytes(held[:s].tobytes())
        log.num_kv_tokens.frombytes(kv_tokens[:s].tobytes())
        _add_runs(log.num_scheduled_tokens, tokens[:s])
        _add_runs(log.num_running, num_running[:s])
        _add_runs(log.num_waiting, num_waiting[:s])
        log.starts.extend(zip((start_step[:num_starts] + first_step).tolist(), start_s[:num_starts].tolist()))
        log.preemptions.extend(zip((preempt_step[:num_pre] + first_step).tolist(), preempt_count[:num_pre].tolist()))
        log.hits.extend(zip((hit_step[:num_hits] + first_step).tolist(), hit_count[:num_hits].tolist()))
        if self.engine.reserving:
            for runs, column in zip(
                (log.num_final_tokens, log.num_rounding_tokens, log.num_external_frag_tokens), self.split
            ):
                _add_runs(runs, column[:s])

    def served(self) -> Served:
        """What the run recorded, for the requests added."""
        self.keep_records()
        req, n, state = self.req, self.num_added, self.state
        return Served(
            self.log,
            int(state["num_decode_runs"][0]),
            float(state["now_s"][0]),
            RequestLog.of(
                req.first_scheduled_s[:n],
                req.first_token_s[:n],
                req.finish_s[:n],
                req.num_preemptions[:n],
                req.num_tokens[:n] - self.num_prompt_tokens[:n],
            ),
            int(self.groups.freed[0]),
            None if self.sends is None else self.arrival_s,
        )
