"""The serving engine in simulated time: vLLM's scheduler over one KV budget, step by step.

Time, synchronous (the rules of scripts/parity/vllm_scheduler.py, vLLM's side of make parity): the clock
starts at the first arrival; before each step every request that has arrived by the clock joins the
waiting queue (arrival order, ties in input order); when nothing runs or waits the clock jumps to the next
arrival; a step lasts its cost (end = start + duration, in float64); a token sampled in a step is emitted
at the step's end (first-token and finish times).

Time, asynchronous (vLLM's EngineCore.step_with_batch_queue with a batch queue of two; scheduling and output
processing take no simulated time and the GPU runs batches back to back): the clock is the engine's CPU's,
and moves only when the engine waits for a batch's output (to that batch's end) or idles (to the next
arrival). Each engine step: the requests that have arrived by the clock join the waiting queue; if the
scheduler has requests it schedules a batch and queues it, and returns at once while fewer than two batches
are queued and (the batch has tokens or requests remain); otherwise the oldest batch's output is awaited
and processed. A batch scheduled at clock t runs from max(t, the end of the batch before it) for its cost
(no time with no tokens); its tokens and finishes are stamped at its end; a request's first-scheduled time
is the clock of the schedule() that admitted it; a batch is a step of the records if it has tokens or
preempted a request (it takes no time then). With requests unfinished and no batch of tokens queued, two
schedule() calls in a row that scheduled nothing mean nothing can change before the next arrival: the clock
jumps to it.

A closed loop (max_concurrency N, vLLM bench's --max-concurrency; closed_loop.py): the arrival times are the send
times, each unknown (inf) until the finish that frees its slot; a request that finishes at a step's end sends the
next one then, and it joins the waiting queue with the next add_arrivals, as a request arriving then would.

Speed: this engine steps one at a time. The loop (engine_core.run_sync, run_async) is written once, and the compiled
loops (fast/compiled.py) compile it from its source, with runs of steps in which nothing can change done at once in
closed form (fast/loops/step_runs.py); path="auto" takes them where they apply and pay, path="reference" never: the
reference the tests hold them to (checks.PATHS). The scheduler is SchedulerConfig.scheduler_cls's (SCHEDULERS).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from kvlab.core import validate
from kvlab.core.capacity import KVCacheGroup
from kvlab.core.config import EngineConfig
from kvlab.core.cost import ConstantStepCost
from kvlab.core.engine.async_scheduler import AsyncScheduler
from kvlab.core.engine.checks import (
    NoProgressError,
    check_engine,
    check_kv_cache_groups,
    check_kv_transfers,
    no_progress_message,
)
from kvlab.core.engine.closed_loop import ClosedLoop
from kvlab.core.engine.engine_core import run_async, run_sync
from kvlab.core.engine.fast import compiled as compiled_loop
from kvlab.core.engine.kv_cache_manager import KVCacheManager
from kvlab.core.engine.kv_connector import ConnectorScheduler, KVTransfers, NixlConnector
from kvlab.core.engine.records import NO_PROGRESS, EngineResult, Recorder, RequestLog, StepLog, StepRecords
from kvlab.core.engine.request import Request
from kvlab.core.engine.reservation import ReservationManager
from kvlab.core.engine.scheduler import Scheduler
from kvlab.core.engine.scheduler_v0 import SchedulerV0
from kvlab.core.workload import Workload

# Bytes held at the peak per request served, its workload and per-step records included: make bench measures
# about 1,000 B on Azure-like requests at about 21 steps each (a run with fewer requests at once has more steps).
PEAK_BYTES_PER_REQUEST = 1_200
DEFAULT_CONFIG = EngineConfig().replace(async_scheduling=False, max_model_len=8192)
# (SchedulerConfig.scheduler_cls, async_scheduling) -> the scheduler's class
SCHEDULERS = {("v1", False): Scheduler, ("v1", True): AsyncScheduler, ("v0-2023", False): SchedulerV0}


def _config(config: EngineConfig | None) -> EngineConfig:
    if config is None:
        return DEFAULT_CONFIG
    if not isinstance(config, EngineConfig):
        validate.fail("config", type(config).__name__, "must be a kvlab.core.config.EngineConfig")
    return config


class Engine:
    """vLLM's scheduler, a KV-cache manager and a step cost, driven through a workload in simulated time."""

    def __init__(
        self,
        workload: Workload,
        config: EngineConfig | None = None,
        *,
        num_gpu_blocks: int,
        cost=None,
        allocation: str = "paged",
        prompt_token_ids=None,
        path: str = "auto",
        recorder: Recorder | None = None,
        check: bool = True,
        kv_cache_groups=None,
        max_concurrency: int | None = None,
        kv_transfers: KVTransfers | None = None,
    ):
        if not isinstance(workload, Workload):
            validate.fail("workload", type(workload).__name__, "must be a kvlab.core.workload.Workload")
        config = _config(config)
        groups = check_kv_cache_groups(kv_cache_groups, config, allocation, path, recorder)
        num_gpu_blocks, max_model_len = check_engine(
            workload, config, num_gpu_blocks, allocation, path, prompt_token_ids, check, groups
        )
        # the KV cache groups of a hybrid model (None: one full-attention group); block_size: the attention groups'
        # smallest, as vLLM's engine core sets it (the scheduler's, their least common multiple, is the manager's)
        self.kv_cache_groups = groups
        bs = (
            config.cache.block_size
            if groups is None
            else min((g.block_size for g in groups if g.kind != "mamba"), default=groups[0].block_size)
        )
        self.workload, self.config, self.allocation = workload, config, allocation
        self.num_gpu_blocks, self.block_size, self.max_model_len = num_gpu_blocks, bs, max_model_len
        # each request's part in a disaggregated deployment (kv_connector.py: vLLM's scheduler with NIXL's connector)
        self.kv_transfers = check_kv_transfers(kv_transfers, workload, config, allocation, groups)
        self.now_s = float(workload.arrival_s[0])  # the clock (the connector's scheduler reads it)
        self.scheduler = self.make_scheduler(recorder)
        self.kv_cache_manager = self.scheduler.kv_cache_manager
        self.cost = ConstantStepCost() if cost is None else cost
        self.prompt_token_ids = prompt_token_ids
        self.recorder = recorder
        self.requests = RequestLog(workload.num_requests)
        self.steps = StepLog(bs, allocation == "paged")
        self.reserving = allocation != "paged"
        # a closed loop (vLLM bench's --max-concurrency): arrival_list is its send times, each inf until a slot frees
        self.closed_loop = None if max_concurrency is None else ClosedLoop(workload.arrival_s, max_concurrency)
        self.arrival_s = workload.arrival_s
        self.arrival_list = workload.arrival_s.tolist() if self.closed_loop is None else self.closed_loop.send
        # The loop's state (run_sync, run_async; the compiled loops keep the same fields in arrays.LOOP_STATE):
        self.now_s = float(self.arrival_s[0])  # the clock
        self.next_arrival = 0  # index of the next request to arrive
        self.num_kv_tokens = 0  # computed tokens of the running requests
        self.num_decode_runs = 0  # the compiled loop's decode runs (steps done at once)
        self.gpu_free_s = self.now_s  # asynchronous: when the GPU has run every batch queued so far
        self.num_empty = 0  # asynchronous: schedule() calls in a row that scheduled nothing
        self.until_s = math.inf  # the loop pauses once the clock reaches it (a fleet's instance: kvlab.core.fleet)
        # asynchronous: batches scheduled, not yet processed: (out, start_s, end_s, num_running, num_waiting)
        self.batch_queue: deque = deque()
        self.compiled = compiled_loop.chosen(self, path)

    def make_scheduler(self, recorder: Recorder | None = None):
        """A scheduler of the config's class over a KV-cache manager of its own: num_gpu_blocks blocks, paged (vLLM's)
        or a reservation baseline's."""
        config, bs = self.config, self.block_size
        if self.allocation == "paged":  # a hybrid model's groups, or one full-attention group
            groups = self.kv_cache_groups or (KVCacheGroup("full_attention", bs, ()),)
            kv = KVCacheManager(
                self.num_gpu_blocks,
                groups,
                math.lcm(*(g.block_size for g in groups)),
                self.max_model_len,
                config.max_in_flight_tokens,
                config.cache.enable_prefix_caching,
                recorder,
            )
        else:
            kv = ReservationManager(self.allocation, self.num_gpu_blocks, bs, self.max_model_len, recorder)
        sched = config.scheduler
        if self.kv_transfers is not None:
            return ConnectorScheduler(sched, kv, self.max_model_len, NixlConnector(self.kv_transfers), self)
        return SCHEDULERS[sched.scheduler_cls, sched.async_scheduling](sched, kv, self.max_model_len)

    def idle_until(self, arrival_s: float) -> float:
        """Where the clock goes when nothing runs or waits: the next arrival (DataParallelEngine: later, where the
        ranks' dummy batches still run); a KV connector's transfers that end by then are reported on the way (vLLM's
        engine steps on while a connector holds blocks)."""
        if self.scheduler.connector is not None:
            self.scheduler.transfers_done(arrival_s)
        return arrival_s

    # ---------------------------------------------------------------- requests
    def arrival(self, i: int) -> Request:
        """Request i of the workload, as it arrives."""
        return self.request(i, self.arrival_list[i])

    def request(self, i: int, arrival_s: float) -> Request:
        """Request i of the workload, arriving at arrival_s."""
        w = self.workload
        ids = blocks = None
        if self.prompt_token_ids is not None:
            ids = np.asarray(self.prompt_token_ids[i], dtype=np.int64)
        elif w.prefix_hashes is not None and self.config.cache.enable_prefix_caching:
            blocks = w.prefix_hashes[i]
        return Request(
            i,
            arrival_s,
            int(w.prompt_tokens[i]),
            int(w.output_tokens[i]),
            self.scheduler.max_request_tokens,
            ids,
            blocks,
            w.prefix_block_tokens or 0,
        )

    def add_arrivals(self) -> None:
        """Every request that has arrived by the clock joins the waiting queue, in arrival order."""
        arrival, n, add = self.arrival_list, len(self.arrival_list), self.scheduler.waiting.append
        while self.next_arrival < n and arrival[self.next_arrival] <= self.now_s:
            add(self.arrival(self.next_arrival))
            self.next_arrival += 1

    # ---------------------------------------------------------------- the loop
    def run(self) -> EngineResult:
        """Serve the whole workload; the result of every request and step. The loop is run_sync's or run_async's
        (below), with this engine as the engine and as the loop's state."""
        if self.compiled:
            served = compiled_loop.serve(self)
            if served is not None:
                return self.adopt(served)  # else a step scheduled nothing: the Python loop below says why
        if (run_async if self.scheduler.async_scheduling else run_sync)(self, self) == NO_PROGRESS:
            raise NoProgressError(no_progress_message(self))
        return self.result()

    def finished(self, request: Request, end_s: float) -> None:
        """Record a request that finished at end_s (finishes come in time order); in a closed loop its slot sends the
        next request."""
        self.requests.finished(request, end_s)
        if self.closed_loop is not None:
            self.closed_loop.finished(end_s)

    def adopt(self, served) -> EngineResult:
        """Take a compiled run's records (compiled.Served) as this engine's; the result."""
        self.steps, self.num_decode_runs, self.now_s = served.steps, served.num_decode_runs, served.now_s
        self.next_arrival = len(self.arrival_list)
        self.requests = served.requests
        if served.send_s is not None:  # a closed loop: the sends the compiled loop made
            self.closed_loop.send = self.arrival_list = served.send_s.tolist()
            self.closed_loop.num_finished = self.workload.num_requests
        if self.kv_cache_groups is not None:
            self.kv_cache_manager.num_window_freed = served.num_window_freed
        return self.result()

    def record_split(self, head: Request | None) -> None:
        """Add the reservation pool's Fig. 2 counts for the last step (ReservationManager.record_split)."""
        self.kv_cache_manager.record_split(self.steps, head)

    def result(self) -> EngineResult:
        """The run's records as an EngineResult."""
        w, rec = self.workload, self.recorder
        return EngineResult(
            self.allocation,
            self.num_gpu_blocks,
            self.block_size,
            w.arrival_s if self.closed_loop is None else np.array(self.closed_loop.send),
            w.prompt_tokens,
            w.output_tokens,
            *self.requests.columns(),
            StepRecords(self.steps),
            *((rec.scheduled, rec.block_ids, rec.freed_tables) if rec else ()),
        )
