"""vLLM's data parallelism: which engine core (rank) of --data-parallel-size N a request is sent to, and N ranks of a
mixture-of-experts model stepping in lockstep.

vLLM 0.33 serves N ranks behind one API server (DPLBAsyncMPClient, vllm/v1/engine/core_client.py). For each new
request its get_core_engine_for_request scans the ranks from a start index that moves on by one after every choice
(so that equal scores do not always favour the same rank) and takes the first rank of least score:

    score = max(client_count x in_flight, waiting + running) + waiting x 6 x max(0, kv_cache_usage - 0.5)

in_flight counts the requests this client sent to the rank and has not seen finish (exact, kept by the client);
waiting, running and kv_cache_usage are the rank's figures in the coordinator's last snapshot (sent every 100 ms
while they change, vllm/v1/engine/coordinator.py), whose waiting count the client raises by client_count for each
request it sends meanwhile. vLLM 0.19 (the same file of its release) scores waiting x 4 + running from a start index
that never moves. RankChooser keeps the same state and makes the same choices (make parity runs vLLM 0.33's own
method on the same statistics); DataParallelEngine feeds it the snapshots and the finishes.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np

from kvlab.core import validate
from kvlab.core.cost import group_step_s
from kvlab.core.engine.engine import Engine
from kvlab.core.engine.records import EngineResult

# vLLM's DPCoordinator publishes the ranks' load at most this often while it changes (min_stats_update_interval_ms),
# and every 5 s otherwise (vllm/v1/engine/coordinator.py).
STATS_UPDATE_INTERVAL_S = 0.1
IDLE_UPDATE_INTERVAL_S = 5.0
# The lockstep steps between two checks of whether any rank has a request: vLLM 0.33's ParallelConfig.dp_sync_interval
# (and the first step of a wave); vLLM 0.19's DPEngineCoreProc._has_global_unfinished_reqs, every 32nd step.
DP_SYNC_INTERVAL = 16
# The versions whose data-parallel rules kvlab has: (sync interval, whether a wave's first step is checked too).
DP_RULES = {"0.33": (DP_SYNC_INTERVAL, True), "0.19": (32, False)}


class RankChooser:
    """vLLM's DPLBAsyncMPClient rank choice for num_ranks ranks, as client client_index of client_count API servers,
    by the rule of vllm_version (DP_RULES: 0.33, kvlab's default, or 0.19)."""

    def __init__(self, num_ranks: int, client_count: int = 1, client_index: int = 0, vllm_version: str = "0.33"):
        validate.positive_int("data_parallel_size", num_ranks)
        validate.positive_int("client_count", client_count)
        validate.one_of("vllm_version", vllm_version, DP_RULES)
        if not 0 <= client_index < client_count:
            validate.fail("client_index", client_index, f"must be 0 to {client_count - 1}")
        self.num_ranks, self.client_count, self.vllm_version = num_ranks, client_count, vllm_version
        self.counts: list[list] = [[0, 0, 0.0] for _ in range(num_ranks)]  # per rank: waiting, running, KV usage
        self.in_flight = [0] * num_ranks
        self.start = num_ranks * client_index // client_count

    def choose(self) -> int:
        """The rank of a new request (and the client's bookkeeping of sending it there)."""
        if self.vllm_version == "0.19":
            return self._choose_019()
        best, rank, n = sys.maxsize, 0, self.num_ranks
        for i in range(n):
            idx = (self.start + i) % n
            waiting, running, usage = self.counts[idx]
            score = max(self.client_count * self.in_flight[idx], waiting + running)
            if waiting:
                score += waiting * 6.0 * max(0.0, usage - 0.5)
            if score < best:
                best, rank = score, idx
        self.counts[rank][0] += self.client_count
        self.start = (self.start + 1) % n
        self.in_flight[rank] += 1
        return rank

    def _choose_019(self) -> int:
        """vLLM 0.19's choice: the first rank of least waiting x 4 + running from a fixed start."""
        best, rank, n = sys.maxsize, 0, self.num_ranks
        for i in range(n):
            idx = (self.start + i) % n
            waiting, running, _ = self.counts[idx]
            score = waiting * 4 + running
            if score < best:
                best, rank = score, idx
        self.counts[rank][0] += self.client_count
        return rank

    def finished(self, rank: int) -> None:
        """A request sent to rank finished (the client saw it in that rank's outputs)."""
        self.in_flight[rank] -= 1

    def snapshot(self, counts) -> None:
        """The coordinator's latest load of every rank: (waiting, running, kv_cache_usage) each."""
        if len(counts) != self.num_ranks:
            validate.fail("counts", len(counts), f"must give each of the {self.num_ranks} ranks")
        self.counts = [[int(w), int(r), float(u)] for w, r, u in counts]


class _Joined:
    """Several ranks' queues (running lists or waiting queues) read as one: their length, truth and requests."""

    __slots__ = ("queues",)

    def __init__(self, queues):
        self.queues = queues

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues)

    def __bool__(self) -> bool:
        return any(self.queues)

    def __iter__(self):
        for q in self.queues:
            yield from q

    def __getitem__(self, index: int):
        if index != 0 or not self:
            raise IndexError(index)
        return next(iter(self))


class _Waiting(_Joined):
    """The ranks' waiting queues; a request appended joins the rank vLLM's client dealt it to."""

    __slots__ = ("ranks",)

    def __init__(self, ranks: Ranks):
        super().__init__([s.waiting for s in ranks.schedulers])
        self.ranks = ranks

    def append(self, request) -> None:
        self.ranks.join(request)


class GroupBatch(tuple):
    """One lockstep step's batches, one a rank (None: nothing scheduled there, a dummy batch)."""

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(b.num_scheduled_tokens for b in self if b is not None)


class GroupOutput:
    """One lockstep step's SchedulerOutputs, one a rank (None: nothing scheduled), read as one."""

    __slots__ = ("outs", "batch", "scheduled", "admitted", "preempted", "num_hit_tokens")

    def __init__(self, outs):
        self.outs = outs
        mine = [o for o in outs if o is not None]
        self.batch = GroupBatch(None if o is None else o.batch for o in outs)
        self.scheduled = [s for o in mine for s in o.scheduled]
        self.admitted = [r for o in mine for r in o.admitted]
        self.preempted = [r for o in mine for r in o.preempted]
        self.num_hit_tokens = sum(o.num_hit_tokens for o in mine)


class LockstepCost:
    """A step cost over a GroupBatch: kvlab.core.cost.group_step_s of the ranks' batches."""

    def __init__(self, cost):
        self.cost, self.name = cost, cost.name

    def step_s(self, batches: GroupBatch) -> float:
        return group_step_s(self.cost, batches)


class Ranks:
    """vLLM's data-parallel ranks of a mixture-of-experts model as the engine's loop sees one scheduler and one KV
    cache: each rank its own scheduler and pool; every step each rank with requests schedules its batch and the
    others run vLLM's dummy batch; the outputs are processed rank by rank. Requests are dealt by vLLM's client
    (RankChooser) at their arrival, from the coordinator's snapshot of every rank's (waiting, running, KV usage),
    published every STATS_UPDATE_INTERVAL_S from the first arrival while the counts change (vLLM's coordinator
    times it by the wall clock; kvlab on the simulated one, from the first arrival: its choice), else every
    IDLE_UPDATE_INTERVAL_S; a request counts as waiting at its rank from its arrival."""

    def __init__(self, engine, num_ranks: int, vllm_version: str = "0.33"):
        self.engine = engine
        self.sync_interval, self.sync_first_step = DP_RULES[vllm_version]
        self.schedulers = [engine.make_scheduler() for _ in range(num_ranks)]
        self.async_scheduling = self.schedulers[0].async_scheduling
        self.max_request_tokens = self.schedulers[0].max_request_tokens
        self.kv_cache_managers = [s.kv_cache_manager for s in self.schedulers]
        self.chooser = RankChooser(num_ranks, vllm_version=vllm_version)
        self.rank_of = np.full(engine.workload.num_requests, -1, dtype=np.int64)
        self.pending = [0] * num_ranks  # dealt, not yet in the rank's waiting queue
        self.next_deal = 0  # the next request to deal, in arrival order
        self.sent: list | None = None  # each rank's (waiting, running) as its engine core last sent them
        self.changed = True  # sent since the coordinator's last snapshot
        self.published_s = self.next_tick_s = engine.now_s
        self.num_wave_steps = 0  # lockstep steps since the ranks last went idle (vLLM's step_counter)
        self.num_dummy_batches = 0  # rank-steps that ran a dummy batch

    # ---------------------------------------------------------------- the scheduler's face
    @property
    def running(self) -> _Joined:
        return _Joined([s.running for s in self.schedulers])

    @property
    def waiting(self) -> _Waiting:
        return _Waiting(self)

    @property
    def num_free_blocks(self) -> int:
        return sum(kv.num_free_blocks for kv in self.kv_cache_managers)

    @property
    def num_held(self) -> int:
        return sum(kv.num_held for kv in self.kv_cache_managers)

    connector = None  # (no KV connector with data-parallel ranks)

    def has_requests(self) -> bool:
        return any(s.has_requests() for s in self.schedulers)

    def num_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self) -> GroupOutput:
        """Every rank with requests schedules its batch (after the snapshots and deals due by the clock)."""
        self.catch_up(self.engine.now_s)
        out = GroupOutput([s.schedule() if s.has_requests() else None for s in self.schedulers])
        self.note()
        if out.batch.num_scheduled_tokens:
            self.num_dummy_batches += sum(1 for b in out.batch if b is None or not b.num_scheduled_tokens)
        return out

    def update_from_output(self, out: GroupOutput):
        """Every rank's update from its batch's output; the first tokens and finishes of all."""
        self.catch_up(self.engine.now_s)
        first_tokens, finished = [], []
        for rank, (scheduler, mine) in enumerate(zip(self.schedulers, out.outs)):
            if mine is None:
                continue
            firsts, done = scheduler.update_from_output(mine)
            first_tokens += firsts
            finished += done
            for _ in done:
                self.chooser.finished(rank)
        self.note()
        if out.batch.num_scheduled_tokens:
            self.num_wave_steps += 1
        return first_tokens, finished

    # ---------------------------------------------------------------- dealing
    def counts(self) -> list[tuple[int, int, float]]:
        """Each rank's (waiting, running, KV cache usage) as vLLM's engine core publishes them (usage: vLLM's
        BlockPool.get_usage, the null block left out)."""
        total = self.engine.num_gpu_blocks_per_rank - 1
        return [
            (len(s.waiting) + pending, len(s.running), 1.0 - s.kv_cache_manager.num_free_blocks / total)
            for s, pending in zip(self.schedulers, self.pending)
        ]

    def publish_until(self, time_s: float) -> None:
        """The coordinator's snapshot at the last tick by time_s, of the counts of now (nothing has changed since
        the last event): published if a rank's (waiting, running) changed since the last one (vLLM's engine cores
        send their counts when those change, and the coordinator publishes what it has on its next tick) or
        IDLE_UPDATE_INTERVAL_S have passed."""
        if self.next_tick_s > time_s:
            return
        interval = STATS_UPDATE_INTERVAL_S
        last_tick = self.next_tick_s + interval * int((time_s - self.next_tick_s) / interval)
        if self.changed or last_tick - self.published_s >= IDLE_UPDATE_INTERVAL_S:
            self.chooser.snapshot(self.counts())
            self.changed, self.published_s = False, last_tick
        self.next_tick_s = last_tick + interval

    def note(self) -> None:
        """After an event: whether a rank's (waiting, running) changed, which its engine core would send."""
        sent = [counts[:2] for counts in self.counts()]
        if sent != self.sent:
            self.sent, self.changed = sent, True

    def catch_up(self, time_s: float) -> None:
        """Deal every request that has arrived by time_s, each after the snapshots due by its arrival; then the
        snapshots due by time_s."""
        arrival = self.engine.arrival_list
        while self.next_deal < len(arrival) and arrival[self.next_deal] <= time_s:
            self.publish_until(arrival[self.next_deal])
            rank = self.chooser.choose()
            self.rank_of[self.next_deal] = rank
            self.pending[rank] += 1
            self.next_deal += 1
            self.note()
        self.publish_until(time_s)

    def join(self, request) -> None:
        """An arrived request joins the waiting queue of the rank it was dealt to."""
        self.catch_up(request.arrival_s)
        rank = int(self.rank_of[request.request_id])
        self.pending[rank] -= 1
        self.schedulers[rank].waiting.append(request)

    # ---------------------------------------------------------------- waves
    def tail_steps(self) -> int:
        """Dummy steps the ranks still run once none has a request: vLLM's DPEngineCoreProc checks every rank for
        unfinished requests every sync_interval steps (vLLM 0.33: and after a wave's first), stepping until then."""
        n = self.num_wave_steps
        return 0 if n == 1 and self.sync_first_step else -n % self.sync_interval


class DataParallelEngine(Engine):
    """vLLM's data parallelism for a mixture-of-experts model (--data-parallel-size N): N ranks, each vLLM's
    scheduler over its own num_gpu_blocks, stepping in lockstep as vLLM's DPEngineCoreProc keeps them (every forward
    pass of the group is one step of every rank: a rank with nothing to run runs a dummy batch; the step lasts its
    slowest rank's: kvlab.core.cost.group_step_s), requests dealt at arrival by vLLM's client (Ranks). Once no rank
    has a request the ranks run dummy steps of one token until vLLM's next check of the group (Ranks.tail_steps);
    a request arriving meanwhile waits for the dummy step in flight. Each rank is served by the engine's per-step
    loop (in Python: no runs of steps at once, which would end at another rank's arrival) and its steps are the group's (records
    sum the ranks: tokens, requests, blocks; num_gpu_blocks of the result is all the ranks').

    kvlab's lockstep is at the level of steps: in vLLM each rank's busy loop schedules, and its forward pass waits
    in the collectives for every other rank's; kvlab schedules every rank at the same clock. A dense model's ranks
    are independent engines in vLLM (no lockstep): not served here (kvlab plan counts them as replicas).
    vllm_version: whose rank choice and group check (DP_RULES; the scheduler is vLLM 0.33's either way)."""

    def __init__(
        self,
        workload,
        config=None,
        *,
        num_gpu_blocks: int,
        cost=None,
        allocation: str = "paged",
        prompt_token_ids=None,
        path: str = "auto",
        recorder=None,
        check: bool = True,
        vllm_version: str = "0.33",
        kv_cache_groups=None,
        max_concurrency: int | None = None,
    ):
        validate.one_of("vllm_version", vllm_version, DP_RULES)
        for name, value, allowed in (
            ("allocation", allocation, ("paged",)),
            ("path", path, ("auto", "reference")),  # each the per-step loop here
            ("recorder", recorder, (None,)),
        ):
            if value not in allowed:
                validate.fail(
                    name,
                    value,
                    f"must be {' or '.join(map(repr, allowed))} with data_parallel_size > 1 (kvlab serves "
                    "data-parallel ranks on vLLM's paged pool, by the per-step loop, without a recorder)",
                )
        super().__init__(
            workload,
            config,
            num_gpu_blocks=num_gpu_blocks,
            cost=cost,
            prompt_token_ids=prompt_token_ids,
            path="reference",
            check=check,
            kv_cache_groups=kv_cache_groups,
            max_concurrency=max_concurrency,
        )
        self.num_ranks = self.config.parallel.data_parallel_size
        self.num_gpu_blocks_per_rank = self.num_gpu_blocks
        self.ranks = Ranks(self, self.num_ranks, vllm_version)
        self.scheduler = self.kv_cache_manager = self.ranks
        self.rank_cost, self.cost = self.cost, LockstepCost(self.cost)
        self.num_gpu_blocks = self.num_ranks * self.num_gpu_blocks_per_rank
        self.num_tail_steps = 0  # dummy steps run after the ranks went idle

    def idle_until(self, arrival_s: float) -> float:
        """The next arrival, or, while the ranks still run dummy steps, the end of the dummy step it arrives in."""
        tail = self.ranks.tail_steps()
        if tail:
            dummy_s = self.cost.step_s(GroupBatch([None] * self.num_ranks))
            if arrival_s < self.now_s + tail * dummy_s:
                steps = max(1, math.ceil((arrival_s - self.now_s) / dummy_s))
                self.num_tail_steps += steps
                self.ranks.num_wave_steps += steps
                return self.now_s + steps * dummy_s
            self.num_tail_steps += tail
        self.ranks.num_wave_steps = 0
        return arrival_s

    def result(self) -> EngineResult:
        return dataclasses.replace(super().result(), data_parallel_rank=self.ranks.rank_of.copy())
