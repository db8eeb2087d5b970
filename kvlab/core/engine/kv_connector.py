"""vLLM 0.33's scheduler with a KV connector (vllm/v1/core/sched/scheduler.py) and NIXL's pull connector's scheduler
side (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py): how an instance of a disaggregated
deployment (prefill on one instance, decode on another, "xPyD") schedules, synchronous.

A request is one of three kinds (KVTransfers.role):
- NONE: served as by any engine;
- PRODUCER (vLLM's kv_transfer_params do_remote_decode: the prefill instance's max_tokens=1 request): it runs as any
  request, but when it finishes the connector delays its blocks' free (request_finished returns delay_free_blocks)
  until the decode instance has read them (the worker's finished_sending: KVTransfers.hold_s after its finish, or
  read_end_s, a fleet's decode instance's read end, which it tells with read_ends once the read starts);
- CONSUMER (do_remote_prefill: the decode instance's request): on admission the connector matches its prompt's tokens
  past the local prefix hit (get_num_new_matched_tokens: the whole prompt, loaded asynchronously); the scheduler
  allocates blocks for them (blocks for its whole length must be free, those for the load within the free blocks less
  what the prefills in flight still need: _inflight_prefill_reserved_blocks), caches none yet, and parks it in
  WAITING_FOR_REMOTE_KVS, holding its blocks, off the running list; the load starts with the step that allocated it
  and ends KVTransfers.load_s later (the worker's finished_recving). The next schedule() promotes it
  (_update_waiting_for_remote_kv: its blocks cached, its computed tokens all but the last prompt token) and admits it
  for that one token, whose step samples its first output token.

The waiting requests are two queues, as vLLM's: those holding blocks (kv_holding_waiting: loading, or loaded) are
drained first, then the waiting queue; a request still loading is skipped (not a stop), and the requests skipped in a
pass go back to the front of their queue in order. The worker's output of a step reports the transfers that ended by
the step's end; with nothing to schedule while transfers are under way, the engine's empty steps (vLLM steps on,
polling its connector) are one wait to the next transfer's end or arrival (kvlab's choice: an empty step takes no
time). Left out, inert for a text-only decoder of one full-attention group without speculative decoding: sub-block
local hits, replay windows, load failures, deferred loads (HiSparse), the aux-output and encoder connectors; the
asynchronous scheduler's deferred frees (a consumer with two batches in flight) are not modelled yet, so a connector
runs the synchronous scheduler only (kvlab refuses the asynchronous one with it).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvlab.core.engine.request import FINISHED, PREEMPTED, RUNNING, WAITING
from kvlab.core.engine.rules import admission_num_new_tokens, step_token_cap
from kvlab.core.engine.scheduler import Scheduler, SchedulerOutput, account, schedule_running

NONE, PRODUCER, CONSUMER = 0, 1, 2  # a request's role (vLLM's kv_transfer_params)
WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"  # a consumer holding its blocks while its KV loads


@dataclass(frozen=True)
class KVTransfers:
    """Each request's part in a disaggregated deployment: role (NONE, PRODUCER or CONSUMER), a consumer's load_s (its
    prompt's KV arrives load_s after the step that allocated its blocks starts) and a producer's hold_s (its blocks
    are freed hold_s after it finishes, once the decode instance has read them), or read_end_s where given: when the
    decode instance's read of them ends (a fleet's: kvlab.core.fleet.disaggregated); where transfer is given, a
    consumer's load takes transfer.transfer_s(the tokens it loads: those past its local prefix hit) instead of load_s."""

    role: np.ndarray
    load_s: np.ndarray
    hold_s: np.ndarray
    read_end_s: np.ndarray | None = None
    transfer: object = None  # or: a consumer's load takes transfer.transfer_s(its external tokens) (kv_transfer)

    @classmethod
    def none(cls, num_requests: int) -> KVTransfers:
        zeros = np.zeros(num_requests)
        return cls(np.zeros(num_requests, dtype=np.int64), zeros, zeros)


class NixlConnector:
    """NIXL's pull connector, its scheduler side: which prompt tokens a consumer loads, whether a producer's blocks
    outlive it, and the transfers under way (their ends, from KVTransfers)."""

    def __init__(self, transfers: KVTransfers):
        self.transfers = transfers
        self.processed: set[int] = set()  # consumers whose transfer was set up (vLLM: do_remote_prefill set False)
        self.load_start_s: dict[int, float] = {}  # consumer -> when its load started (its blocks allocated)
        self.load_end_s: dict[int, float] = {}  # consumer -> when it ends
        self.awaiting_read: dict[int, object] = {}  # finished producers whose read has not started (read_end_s NaN)
        self.events: list = []  # heap of (end_s, sequence, kind, request): transfers under way
        self.sequence = 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        """A consumer not yet set up loads every prompt token past its local hit, asynchronously; else none
        (NixlConnectorScheduler.get_num_new_matched_tokens, remote prefill)."""
        rid = request.request_id
        if self.transfers.role[rid] == CONSUMER and rid not in self.processed:
            count = request.num_prompt_tokens - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request, num_external_tokens: int, now_s: float) -> None:
        """The consumer's blocks are allocated: its load starts now (only one transfer a request)."""
        rid = request.request_id
        if self.transfers.role[rid] == CONSUMER and rid not in self.processed:
            self.processed.add(rid)
            if num_external_tokens > 0:
                transfer = self.transfers.transfer
                load_s = self.transfers.load_s[rid] if transfer is None else transfer.transfer_s(num_external_tokens)
                self.load_start_s[rid], self.load_end_s[rid] = now_s, now_s + float(load_s)
                self.add_event(self.load_end_s[rid], "recv", request)

    def request_finished(self, request, now_s: float) -> bool:
        """Whether a finished request's blocks stay held: a producer's, until the decode instance has read them
        (NixlConnectorScheduler.request_finished: delay_free_blocks where it holds blocks)."""
        rid = request.request_id
        if self.transfers.role[rid] != PRODUCER or not request.block_ids:
            return False
        read_end_s = self.transfers.read_end_s
        if read_end_s is None:
            self.add_event(now_s + float(self.transfers.hold_s[rid]), "send", request)
        elif math.isnan(read_end_s[rid]):  # the decode instance has yet to read them (read_ends tells when it ends)
            self.awaiting_read[rid] = request
        else:
            self.add_event(float(read_end_s[rid]), "send", request)
        return True

    def read_ends(self, request_id: int, end_s: float) -> None:
        """A fleet's decode instance started reading a finished producer's blocks: the read ends at end_s."""
        self.add_event(end_s, "send", self.awaiting_read.pop(request_id))

    def add_event(self, end_s: float, kind: str, request) -> None:
        heapq.heappush(self.events, (end_s, self.sequence, kind, request))
        self.sequence += 1

    def next_event_s(self) -> float:
        """When the next transfer under way ends (inf: none)."""
        return self.events[0][0] if self.events else math.inf

    def finished_by(self, now_s: float) -> tuple[list, list]:
        """The worker's output at now_s: the loads (finished_recving) and reads of held blocks (finished_sending) that
        ended by then, each in the order they ended."""
        recving, sending = [], []
        while self.events and self.events[0][0] <= now_s:
            _, _, kind, request = heapq.heappop(self.events)
            (recving if kind == "recv" else sending).append(request)
        return recving, sending


class DelayedFree:
    """The KV-cache manager as the connector's scheduler calls it: a finished request's free goes through the connector
    (Scheduler._free_request), which may hold its blocks; everything else is the manager's."""

    def __init__(self, kv, scheduler):
        self.kv, self.scheduler = kv, scheduler

    def __getattr__(self, name):
        return getattr(self.kv, name)

    def free(self, request) -> int:
        if request.status == FINISHED and self.scheduler.connector.request_finished(request, self.scheduler.now_s):
            return 0  # held until the decode instance has read them
        return self.kv.free(request)


class ConnectorScheduler(Scheduler):
    """vLLM's synchronous scheduler with a KV connector (the module's docstring)."""

    def __init__(self, scheduler, kv_cache_manager, max_model_len: int, connector: NixlConnector, clock):
        super().__init__(scheduler, kv_cache_manager, max_model_len)
        self.connector, self.clock = connector, clock
        self.manager = kv_cache_manager
        self.kv_cache_manager = DelayedFree(kv_cache_manager, self)
        self.kv_holding: deque = deque()  # waiting requests that hold blocks (vLLM's kv_holding_waiting)
        self.inflight_prefills: set = set()  # requests whose prefill is under way or loading (_inflight_prefills)
        self.finished_recving: set = set()  # consumers whose KV has arrived, to promote
        self.num_preempted = 0  # requests the last schedule() preempted
        self.num_scheduled_tokens = -1  # tokens the last schedule() scheduled (-1: none yet)
        self.scheduled_s = -math.inf  # the clock of the last schedule()
        self.reported_s = -math.inf  # the clock of the last report that ended a transfer
        # a fleet's prefill instance (kvlab.core.fleet.disaggregated): a read another instance starts while this one's
        # step runs, and ends before that step does, is reported in that step's output, which kvlab's fleet may have
        # processed already: such reports are applied at the next schedule(), before anything reads them
        self.deferred_reports = False

    @property
    def now_s(self) -> float:
        """The engine's clock: a step's start in schedule(), its end in update_from_output()."""
        return self.clock.now_s

    def num_waiting(self) -> int:
        """vLLM's waiting count: both queues (get_request_counts)."""
        return len(self.waiting) + len(self.kv_holding)

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting or self.kv_holding or self.has_finished)

    def schedule(self) -> SchedulerOutput:
        if self.deferred_reports:
            self.transfers_done(self.now_s)
        self.scheduled_s = self.now_s
        out = SchedulerOutput()
        running, waiting, kv = self.running, self.waiting, self.kv_cache_manager
        cap = step_token_cap(self.long_prefill_token_threshold, len(running), self.num_waiting())
        budget, num_reqs, num_preempted, _, _, _ = schedule_running(
            self, kv, None, running, len(running), waiting, 0, len(waiting), out, cap
        )
        self.num_preempted = num_preempted  # (a step that only preempted is not the end: engine_core.await_transfers)
        for request in out.preempted:
            self.inflight_prefills.discard(request)
        if num_preempted == 0:
            num_reqs, out.num_hit_tokens = self.admit(out, cap, budget, num_reqs)
        account(None, out, num_reqs, False, True)
        for request, _ in out.scheduled:  # no longer prefilling: out of the set (_update_after_schedule)
            if request.num_computed_tokens >= request.num_tokens:
                self.inflight_prefills.discard(request)
        self.has_finished = False
        self.num_scheduled_tokens = out.batch.num_scheduled_tokens
        return out

    def admit(self, out: SchedulerOutput, cap: int, budget: int, num_reqs: int) -> tuple[int, int]:
        """schedule()'s waiting loop with a connector (the module's docstring). Returns (requests scheduled, prompt
        tokens hit in the prefix cache)."""
        kv, connector, running = self.manager, self.connector, self.running
        skipped_holding, skipped_waiting = deque(), deque()
        num_hit_tokens = 0
        while budget > 0:
            queue = self.kv_holding or self.waiting
            if not queue or len(running) >= self.max_num_seqs:
                break
            request = queue[0]
            if request.status == WAITING_FOR_REMOTE_KVS:
                if request not in self.finished_recving:  # still loading: skipped
                    self.skip(queue, skipped_holding, skipped_waiting)
                    continue
                self.promote(request)
            num_external, load_async, hit, num_local = 0, False, None, 0
            if request.num_computed_tokens == 0:
                hit, num_local = kv.get_computed_blocks(request)
                num_external, load_async = connector.get_num_new_matched_tokens(request, num_local)
                num_computed = num_local + num_external
            else:  # loaded: its computed tokens are its own
                num_computed = request.num_computed_tokens
            if load_async:
                n = 0
            else:
                n = admission_num_new_tokens(request.num_tokens, num_computed, cap, budget, self.enable_chunked_prefill)
                if n == 0:
                    break
            reserved = sum(self.remaining_blocks(r) for r in self.inflight_prefills) if load_async else 0
            if not self.allocate(request, n, hit, num_local, num_external, load_async, reserved):
                break
            connector.update_state_after_alloc(request, num_external, self.now_s)
            if load_async:
                request.status = WAITING_FOR_REMOTE_KVS
                request.num_computed_tokens = num_computed
                self.inflight_prefills.add(request)
                self.skip(queue, skipped_holding, skipped_waiting)
                continue
            queue.popleft()
            running.append(request)
            request.status = RUNNING
            request.num_computed_tokens = num_computed
            num_hit_tokens += num_local
            out.admitted.append(request)
            out.scheduled.append((request, n))
            num_reqs += 1
            budget -= n
            if num_computed + n < request.num_tokens:
                self.inflight_prefills.add(request)
        self.kv_holding.extendleft(reversed(skipped_holding))
        self.waiting.extendleft(reversed(skipped_waiting))
        return num_reqs, num_hit_tokens

    def skip(self, queue: deque, skipped_holding: deque, skipped_waiting: deque) -> None:
        """The queue's first request skipped this pass: back to the front of the queue of requests holding blocks
        or of the waiting queue after it (skip_request, _holds_kv_blocks)."""
        request = queue.popleft()
        holds = request.num_computed_tokens > 0 or request.status == WAITING_FOR_REMOTE_KVS
        (skipped_holding if holds else skipped_waiting).append(request)

    def promote(self, request) -> None:
        """A consumer whose KV arrived (_update_waiting_for_remote_kv): its blocks cached, all but its last prompt
        token computed where the load held them all, back to waiting (or preempted)."""
        if self.manager.enable_caching:
            self.manager.coordinator.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving.discard(request)
        request.status = PREEMPTED if request.num_preemptions else WAITING

    def remaining_blocks(self, request) -> int:
        """Blocks the request still needs to hold its whole current length (_request_remaining_blocks)."""
        num_tokens = min(request.num_tokens, self.max_model_len)
        coordinator = self.manager.coordinator
        return coordinator.get_num_blocks_to_allocate(
            request.request_id, num_tokens, None, request.num_computed_tokens, 0, True
        )

    def allocate(
        self, request, n: int, hit, num_local: int, num_external: int, load_async: bool, reserved: int
    ) -> bool:
        """KVCacheManager.allocate_slots on admission with a connector: blocks for the request's whole current length
        must be free, and those for its computed (local, loaded) and new tokens within the free blocks less reserved;
        the hit's blocks taken first; nothing cached while its KV loads (delay_cache_blocks)."""
        kv, rid = self.manager, request.request_id
        coordinator, pool, max_len = kv.coordinator, kv.pool, self.max_model_len
        hit_blocks = None if hit is None else hit[0]
        num_local_computed = request.num_computed_tokens + num_local
        total = min(num_local_computed + num_external, max_len)
        full = min(request.num_tokens, max_len)
        if (
            coordinator.get_num_blocks_to_allocate(rid, full, hit_blocks, num_local_computed, 0, True)
            > pool.num_free_blocks
        ):
            return False
        num_slots = min(total + n, max_len)
        if coordinator.get_num_blocks_to_allocate(rid, num_slots, hit_blocks, num_local_computed, 0) > (
            pool.num_free_blocks - reserved
        ):
            return False
        if rid not in coordinator.single_type_managers[0].req_to_blocks:  # (a loaded request holds its table)
            coordinator.allocate_new_computed_blocks(rid, hit_blocks, num_local_computed)
        coordinator.allocate_new_blocks(rid, num_slots)
        request.block_ids = coordinator.single_type_managers[0].req_to_blocks[rid]
        if kv.enable_caching and not load_async:
            coordinator.cache_blocks(request, min(total + n, request.num_tokens))
        return True

    def update_from_output(self, out: SchedulerOutput):
        """The batch's output (the module's update_from_output, a finished producer's free through the connector),
        then the transfers the worker reported ended by the step's end (_update_from_kv_xfer_finished: its report
        made before this output's finishes, whose reads it cannot hold yet): loads marked to promote, held blocks
        freed."""
        report = self.connector.finished_by(self.now_s)
        first_tokens, finished = super().update_from_output(out)
        for request in finished:
            self.inflight_prefills.discard(request)
        self.transfers_done(self.now_s, report)
        return first_tokens, finished

    def transfers_done(self, now_s: float, report: tuple | None = None) -> None:
        """The worker's report at now_s (or the one given): consumers whose KV arrived wait to be promoted; producers'
        held blocks are freed."""
        recving, sending = self.connector.finished_by(now_s) if report is None else report
        if recving or sending:
            self.reported_s = now_s
        self.finished_recving.update(recving)
        for request in sending:
            self.manager.free(request)
