"""A fleet: N instances of kvlab's engine behind a router, on one clock.

Each instance is an Engine with the fleet's EngineConfig, its own pool of num_gpu_blocks and its own step cost (a
fleet of equal instances, vLLM replicas). Requests arrive in the workload's order; at its arrival a request is routed
(kvlab.core.fleet.routers) and joins its instance as the engine's own arrivals join it, so an instance makes the
decisions an Engine makes on the requests it is sent (a fleet of one is the engine: a test holds them equal).

Time: an instance runs until its clock reaches the arrival of the next request still to be routed (Engine.until_s:
its loop pauses before the requests that have arrived by then join it, engine_core.paused). So when a request is
routed every instance has run each step that started before its arrival, and the router reads each instance as
those steps leave it: the step running at the arrival counted as done, with no delay in what the router sees
(kvlab's choice; vLLM publishes a step's counts at its end, and real routers read them later: production-stack
scrapes its engines every few seconds, llm-d every 50 ms). What a router hears of requests (a first token, a finish:
Router.prefill_done, finished) reaches it in time order, all up to an arrival before that request is routed.

A router that reads nothing of the instances (Router.reads_instances False: round robin, session, prefix-aware)
routes the whole workload first; each instance then serves its share alone, through the engine's compiled loop where
its path allows: the same decisions, since an instance's decisions depend on its own arrivals only (a test holds the
two ways equal). Otherwise an instance is the compiled loop paused at every arrival (CompiledInstance; with prefix
caching its pool keyed by hash ids of the fleet's whole workload) or, where the compiled loop does not serve the run,
the Python engine (Instance); tests hold them to the same decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlab.core import validate
from kvlab.core.engine.block_hashes import block_hashes
from kvlab.core.engine.checks import NoProgressError, no_progress_message
from kvlab.core.engine.engine import Engine
from kvlab.core.engine.engine_core import run_async, run_sync
from kvlab.core.engine.fast import compiled
from kvlab.core.engine.records import NO_PROGRESS, EngineResult, RequestLog, StepRecords, requests_table
from kvlab.core.fleet.routers import ROUTERS, PrefixAware, RoutedRequest, Router
from kvlab.core.workload import Workload

# Bytes a fleet's run holds per full prompt block beyond its engines' own records: the block hashes its instances keep
# for prefix caching (Python's content hashes, or the compiled instances' hash ids as they are made: about 120-150 B,
# measured on the Mooncake conversation trace), and with them each compiled instance's cache index by hash id (16 B);
# production-stack's prefix trie, which never forgets a prompt, about 330 B more.
BYTES_PER_PROMPT_BLOCK = 200
INSTANCE_BYTES_PER_PROMPT_BLOCK = 16
TRIE_BYTES_PER_PROMPT_BLOCK = 400


def bytes_per_request(workload: Workload, block_size: int, router: str, enable_prefix_caching: bool,
                      num_instances: int) -> float:  # fmt: skip
    """The bytes a fleet's run holds per request of workload beyond its engines' own (BYTES_PER_PROMPT_BLOCK,
    INSTANCE_BYTES_PER_PROMPT_BLOCK per instance with prefix caching, TRIE_BYTES_PER_PROMPT_BLOCK for the prefix-aware
    router): for `resources.refuse_if_too_big`."""
    per_block = BYTES_PER_PROMPT_BLOCK if enable_prefix_caching or ROUTERS[router].reads_prefixes else 0
    per_block += INSTANCE_BYTES_PER_PROMPT_BLOCK * num_instances if enable_prefix_caching else 0
    per_block += TRIE_BYTES_PER_PROMPT_BLOCK if router == PrefixAware.name else 0
    return per_block * float((workload.prompt_tokens // block_size).mean())


class CachedBlocks:
    """An instance's prefix cache as a router reads it (what vLLM's KV events tell it): `block_hash in cached`, and
    len(cached), the distinct block hashes cached."""

    __slots__ = ("pool",)

    def __init__(self, pool):
        self.pool = pool

    def __contains__(self, block_hash) -> bool:
        return self.pool.get_cached_block(block_hash) is not None

    def __len__(self) -> int:
        hash_prev = self.pool.hash_prev  # (the first block cached under each hash)
        return sum(1 for b, h in enumerate(self.pool.hash_of) if h >= 0 and hash_prev[b] < 0)


class CachedIds:
    """A compiled instance's prefix cache as a router reads it: `hash_id in cached` (the fleet's hash ids of full
    blocks, compiled.hash_ids), len(cached) (the hash ids cached: the first block cached under each) and
    longest_prefix(hash_ids) (how many of them, from the first, are cached), all from its pool (arrays.Pool)."""

    __slots__ = ("pool",)

    def __init__(self, pool):
        self.pool = pool

    def __contains__(self, hash_id) -> bool:
        return self.pool.hash_ends[2 * hash_id] >= 0

    def __len__(self) -> int:
        pool = self.pool
        return int(np.count_nonzero((pool.hash_of >= 0) & (pool.hash_prev < 0)))

    def longest_prefix(self, hash_ids) -> int:
        cached = self.pool.hash_ends[2 * np.asarray(hash_ids, dtype=np.int64)] >= 0
        return len(cached) if cached.all() else int(np.argmin(cached))


class Instance(Engine):
    """One engine of a fleet: the requests routed to it join in arrival order (their ids the workload's, their
    records in the fleet's RequestLog). Its arrival list ends with a placeholder at until_s, which never joins (the
    loop pauses first), so an idle instance waits there for its router."""

    def __init__(self, index: int, log: RequestLog, workload: Workload, config, **engine_options):
        super().__init__(workload, config, path="reference", **engine_options)
        self.index, self.requests = index, log
        self.routed: list = []  # the requests routed here, in arrival order
        self.arrival_list = [math.inf]  # their arrivals, then the placeholder at until_s
        self.finishes: list = []  # (finish_s, request id), in time order
        self.num_finishes_told = 0
        self.first_token_pending: list = []  # requests whose first token the router has yet to hear of
        self.cached_block_hashes = CachedBlocks(self.kv_cache_manager.pool)

    def arrival(self, i: int):
        return self.routed[i]

    def route(self, request, hears: bool) -> None:
        """A request routed here joins at its arrival (hears: the router hears of its first token and finish)."""
        self.routed.append(request)
        self.arrival_list.insert(len(self.routed) - 1, request.arrival_s)
        if hears:
            self.first_token_pending.append(request)

    def heard(self, now_s: float) -> list:
        """The first tokens and finishes up to now_s the router has not heard of: (time, 0 first token | 1 finish,
        request id)."""
        pending = self.first_token_pending
        events = [(r.first_token_s, 0, r.request_id) for r in pending if r.first_token_s is not None
                  and r.first_token_s <= now_s]  # fmt: skip
        if events:
            self.first_token_pending = [r for r in pending if r.first_token_s is None or r.first_token_s > now_s]
        finishes, k = self.finishes, self.num_finishes_told
        while k < len(finishes) and finishes[k][0] <= now_s:
            events.append((finishes[k][0], 1, finishes[k][1]))
            k += 1
        self.num_finishes_told = k
        return events

    def run_until(self, until_s: float) -> None:
        """Run until the clock reaches until_s (math.inf: every request routed here finished)."""
        if until_s == math.inf:
            self.arrival_list.pop()  # no request is still to be routed: no placeholder
        else:
            self.arrival_list[-1] = until_s
        self.until_s = until_s
        if (run_async if self.scheduler.async_scheduling else run_sync)(self, self) == NO_PROGRESS:
            raise NoProgressError(no_progress_message(self))

    def finished(self, request, end_s: float) -> None:
        super().finished(request, end_s)
        self.finishes.append((end_s, request.request_id))

    # ---------------------------------------------------------------- what a router reads (routers.InstanceLoad)
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Waiting requests, those routed here that have arrived and not yet joined included."""
        return len(self.scheduler.waiting) + len(self.routed) - self.next_arrival

    @property
    def num_unfinished_tokens(self) -> int:
        """Tokens the unfinished requests routed here still have to compute (prompt and output)."""
        scheduler = self.scheduler
        pending = self.routed[self.next_arrival :]
        return sum(r.max_num_tokens - r.num_computed_tokens for q in (scheduler.running, scheduler.waiting, pending)
                   for r in q)  # fmt: skip

    @property
    def kv_cache_usage(self) -> float:
        """vLLM's kv_cache_usage_perc (BlockPool.get_usage): 1 - free blocks / usable blocks."""
        return 1.0 - self.kv_cache_manager.num_free_blocks / (self.num_gpu_blocks - 1)

    def result(self) -> EngineResult:
        """The run of the requests routed here, in their arrival order."""
        ids = np.array([r.request_id for r in self.routed], dtype=np.int64)
        return share_result(self, ids, [c[ids] for c in self.requests.columns()], self.steps)


class CompiledInstance:
    """One engine of a fleet run by the compiled loop (kvlab.core.engine.fast.compiled.CompiledRun, room for every
    request of the fleet; with prefix caching its pool keyed by the hash ids of the fleet's workload, table): the
    requests routed to it added as they are, what a router reads of it read from the loop's state. The same decisions
    as Instance (tests hold them equal)."""

    def __init__(self, index: int, engine: Engine, table: tuple | None = None):
        from kvlab.core.engine.fast.loops.jit import FINISHED  # (numba: imported only where a loop runs)

        self.index, self.engine, self.finished_status = index, engine, FINISHED
        self.run = compiled.CompiledRun(engine, engine.workload.num_requests, table)
        self.ids: list = []  # the requests routed here (the workload's ids), in arrival order
        # their indices here whose first token, and whose finish, the router has yet to hear of
        self.pending = {"first_token_s": np.zeros(0, np.int64), "finish_s": np.zeros(0, np.int64)}
        self.num_gpu_blocks = engine.num_gpu_blocks
        # with prefix caching, its cache by the fleet's hash ids (table: compiled.hash_ids); else none
        self.cached_block_hashes = frozenset() if table is None else CachedIds(self.run.arrays.pool)
        self.oldest = 0  # every request routed here before it has finished
        self.steps_heard = 0  # the steps run when the router last heard of this instance
        self.next_event_s = math.inf  # the first of its events then known but not yet due

    def route(self, request, hears: bool) -> None:
        """A request routed here joins at its arrival (hears: the router hears of its first token and finish)."""
        k = self.run.add(request.arrival_s, request.num_prompt_tokens, request.max_tokens, request.request_id)
        self.ids.append(request.request_id)
        if hears:
            for name, slots in self.pending.items():
                self.pending[name] = np.append(slots, k)

    def run_until(self, until_s: float) -> None:
        """Run until the clock reaches until_s (math.inf: every request routed here finished)."""
        if self.run.advance(until_s) == NO_PROGRESS:
            raise NoProgressError(
                f"no progress possible on instance {self.index} at t={float(self.run.state['now_s'][0]):.6f} s: a "
                "step scheduled nothing; vLLM would wait forever (first come, first served)"
            )

    def heard(self, now_s: float) -> list:
        """As Instance.heard."""
        steps = int(self.run.state["num_steps"][0] + self.run.arrays.counts[0])
        if steps == self.steps_heard and now_s < self.next_event_s:
            return []  # no step since, and none of its events is due
        self.steps_heard, self.next_event_s = steps, math.inf
        req, ids, events = self.run.req, self.ids, []
        for kind, (name, slots) in enumerate(self.pending.items()):
            if not len(slots):
                continue
            at = getattr(req, name)[slots]
            told = at <= now_s  # (NaN: not yet)
            if told.any():
                events += [(t, kind, ids[k]) for k, t in zip(slots[told].tolist(), at[told].tolist())]
                self.pending[name] = slots[~told]
            later = at[at > now_s]  # known, due after now_s (the step running at the arrival)
            if len(later):
                self.next_event_s = min(self.next_event_s, float(later.min()))
        return events

    @property
    def num_running(self) -> int:
        return int(self.run.state["num_running"][0])

    @property
    def num_waiting(self) -> int:
        """Waiting requests, those routed here that have arrived and not yet joined included."""
        state = self.run.state
        return int(state["num_waiting"][0]) + self.run.num_added - int(state["next_arrival"][0])

    @property
    def num_unfinished_tokens(self) -> int:
        """Tokens the unfinished requests routed here still have to compute (prompt and output)."""
        req, n, finished = self.run.req, self.run.num_added, self.finished_status
        while self.oldest < n and req.status[self.oldest] == finished:
            self.oldest += 1
        window = slice(self.oldest, n)
        left = req.max_num_tokens[window] - req.num_computed_tokens[window]
        return int(left[req.status[window] != finished].sum())

    @property
    def kv_cache_usage(self) -> float:
        """vLLM's kv_cache_usage_perc: 1 - free blocks / usable blocks."""
        return 1.0 - float(self.run.state["num_free_blocks"][0]) / (self.num_gpu_blocks - 1)

    def result(self) -> EngineResult:
        """The run of the requests routed here, in their arrival order."""
        served = self.run.served()
        return share_result(self.engine, np.array(self.ids, dtype=np.int64), served.requests.columns(), served.steps)


@dataclass(frozen=True, eq=False)
class FleetResult:
    """A fleet's run: the instance that served each request (instance_of, index = the workload's order), each
    instance's run over its requests (EngineResult in their arrival order; None: none was routed to it) and the
    requests' records in the workload's order (EngineResult's per-request arrays; its steps: none)."""

    router: str
    instance_of: np.ndarray
    instances: list
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray  # asked for
    num_output_tokens: np.ndarray  # produced
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    num_preemptions: np.ndarray

    @property
    def num_instances(self) -> int:
        return len(self.instances)

    @property
    def ttft_s(self) -> np.ndarray:
        """Time to first token (s): queue (first scheduled - arrival) + prefill (first token - first scheduled)."""
        return self.first_token_s - self.arrival_s

    def summary(self) -> dict:
        """The fleet's figures: its requests' TTFT (mean, p95, and its two parts), TPOT, preemptions, output tokens/s,
        the share of prompt tokens found in the instances' prefix caches, and each instance's counts."""
        extra = self.num_output_tokens - 1
        tpot = (self.finish_s - self.first_token_s)[extra > 0] / extra[extra > 0]
        makespan = float(self.finish_s.max() - self.arrival_s.min())
        output = int(self.num_output_tokens.sum())
        per_instance = [instance_summary(r) for r in self.instances]
        num_hit = sum(p["num_hit_tokens"] for p in per_instance)
        num_steps = sum(p["num_steps"] for p in per_instance)
        return {
            "num_instances": self.num_instances,
            "router": self.router,
            "num_requests": len(self.arrival_s),
            "mean_ttft_s": float(self.ttft_s.mean()),
            "p95_ttft_s": float(np.percentile(self.ttft_s, 95)),
            "mean_ttft_queue_s": float((self.first_scheduled_s - self.arrival_s).mean()),
            "mean_ttft_prefill_s": float((self.first_token_s - self.first_scheduled_s).mean()),
            "mean_tpot_s": float(tpot.mean()) if len(tpot) else float("nan"),
            "p95_tpot_s": float(np.percentile(tpot, 95)) if len(tpot) else float("nan"),
            "num_preemptions": int(self.num_preemptions.sum()),
            "num_steps": num_steps,
            "peak_kv_blocks": max(p["peak_kv_blocks"] for p in per_instance),
            "mean_running": sum(p["mean_running"] * p["num_steps"] for p in per_instance) / max(num_steps, 1),
            "prefix_hit_rate": num_hit / max(int(self.prompt_tokens.sum()), 1),
            "num_output_tokens": output,
            "num_capped_by_max_model_len": int((self.num_output_tokens < self.output_tokens).sum()),
            "makespan_s": makespan,
            "output_tokens_per_s": output / makespan if makespan > 0 else float("nan"),
            "instances": per_instance,
        }

    def requests_table(self) -> dict[str, np.ndarray]:
        """One row per request: the columns of kvlab simulate --requests-csv (EngineResult.requests_table's), and the
        instance that served it."""
        return requests_table(self) | {"instance": self.instance_of}


def instance_summary(result: EngineResult | None) -> dict:
    """One instance's counts: requests, preemptions, steps, peak KV blocks, mean running requests (over its steps),
    prompt tokens hit in its prefix cache and their share of its prompt tokens."""
    if result is None:
        return {"num_requests": 0, "num_preemptions": 0, "num_steps": 0, "peak_kv_blocks": 0, "mean_running": 0.0,
                "num_hit_tokens": 0, "prefix_hit_rate": 0.0}  # fmt: skip
    steps = result.steps
    num_hit = steps["num_hit_tokens"].sum() if result.num_steps else 0
    return {
        "num_requests": result.num_requests,
        "num_preemptions": int(result.num_preemptions.sum()),
        "num_steps": result.num_steps,
        "peak_kv_blocks": int(steps["num_blocks_in_use"].max()) if result.num_steps else 0,
        "mean_running": steps.column_sum("num_running") / result.num_steps if result.num_steps else 0.0,
        "num_hit_tokens": int(num_hit),
        "prefix_hit_rate": int(num_hit) / max(int(result.prompt_tokens.sum()), 1),
    }


class Fleet:
    """num_instances engines (each Engine(workload's share, config, **engine_options): num_gpu_blocks, cost,
    kv_cache_groups, prompt_token_ids, path) behind router (a routers.Router for num_instances)."""

    def __init__(self, workload: Workload, config, router: Router, num_instances: int, **engine_options):
        self.num_instances = validate.positive_int("num_instances", num_instances)
        if router.num_instances != num_instances:
            validate.fail("router", f"{router.num_instances} instances", f"must route to the fleet's {num_instances}")
        for option in ("recorder", "max_concurrency", "allocation"):
            if engine_options.get(option) not in (None, "paged"):
                validate.fail(option, engine_options[option], "is not served by a fleet (one engine only)")
        self.workload, self.config, self.router, self.engine_options = workload, config, router, engine_options
        self.path = engine_options.pop("path", "auto")
        self.first_block = None  # each request's first full prompt block's number (routed)
        self.table = None  # compiled instances with prefix caching: the workload's hash ids (instance)

    def run(self) -> FleetResult:
        """Serve the workload: route each request at its arrival and run every instance to the end."""
        if self.router.reads_instances or self.router.hears_requests:
            return self.run_together()
        return self.run_apart()

    # ---------------------------------------------------------------- routing at each arrival, one clock
    def run_together(self) -> FleetResult:
        """Every instance run up to each arrival, the request routed on what the router reads of them then; each
        instance compiled where the compiled loop serves it (instance), else in Python."""
        w, router = self.workload, self.router
        log = RequestLog(w.num_requests)
        builder = Engine(w, self.config, path="reference", **self.engine_options)  # the requests as they arrive
        instances = [self.instance(k, builder, log) for k in range(self.num_instances)]
        instance_of = np.empty(w.num_requests, dtype=np.int64)
        hears = router.hears_requests
        for j, arrival_s in enumerate(w.arrival_s.tolist()):
            for instance in instances:
                instance.run_until(arrival_s)
            if hears:
                for _, kind, request_id in sorted(e for instance in instances for e in instance.heard(arrival_s)):
                    (router.prefill_done if kind == 0 else router.finished)(request_id)
            request = builder.request(j, arrival_s)
            k = router.route(self.routed(request, builder), instances)
            instances[k].route(request, hears)
            instance_of[j] = k
        for instance in instances:
            instance.run_until(math.inf)
        return self.result(instance_of, [instance.result() if (instance_of == k).any() else None
                                         for k, instance in enumerate(instances)])  # fmt: skip

    def instance(self, k: int, builder: Engine, log: RequestLog):
        """Instance k: compiled (CompiledInstance) where the path allows ("auto": worth it, as for one engine of the
        whole workload) and the compiled loop serves it, else an Instance in Python. With prefix caching the compiled
        instances share the hash ids of the fleet's workload (compiled.hash_ids, made once: self.table)."""
        if self.compiles(builder):
            if self.config.cache.enable_prefix_caching and self.table is None:
                self.table = compiled.workload_hash_ids(builder)
            options = {**self.engine_options, "check": False}
            engine = Engine(self.workload, self.config, path="reference", **options)
            return CompiledInstance(k, engine, self.table)
        return Instance(k, log, self.workload, self.config, check=False, **self.engine_options)

    def compiles(self, builder: Engine) -> bool:
        """Whether the instances run compiled: path "compiled", or "auto" where the whole workload is worth compiling
        (as for one engine of it: the loops, once loaded, serve every instance), where the compiled loop serves it."""
        if self.path == "reference" or not compiled.available() or not compiled.eligible(builder):
            return False
        return self.path == "compiled" or compiled.worth_it(
            self.workload.num_requests, builder.kv_cache_groups is not None
        )

    def routed(self, request, engine: Engine) -> RoutedRequest:
        """What the router reads of a request: its prompt's full blocks' hashes where it reads prefixes: the engine's
        own (block_hashes) where prompts may share content (token ids, or prefix hashes), else numbers no other
        block has (a prompt no other request shares: block_hashes.block_content), the same for every router; with
        compiled instances that cache prefixes, the hash ids their caches are keyed by (self.table)."""
        hashes = ()
        if self.router.reads_prefixes:
            num_blocks = request.num_prompt_tokens // engine.block_size
            if engine.prompt_token_ids is None and self.workload.prefix_hashes is None:
                if self.first_block is None:
                    blocks = self.workload.prompt_tokens // engine.block_size
                    self.first_block = np.concatenate(([0], np.cumsum(blocks)[:-1]))
                start = int(self.first_block[request.request_id])
                hashes = range(start, start + num_blocks)
            elif self.table is not None:  # compiled instances' caches: their hash ids
                offset, shared, num_shared, _, _ = self.table
                start = int(offset[request.request_id])
                hashes = tuple(shared[start : start + int(num_shared[request.request_id])].tolist())
            else:
                hashes = tuple(block_hashes(request, num_blocks, engine.block_size))
        return RoutedRequest(request.request_id, request.arrival_s, request.num_prompt_tokens, hashes)

    # ---------------------------------------------------------------- routing first, each instance apart
    def run_apart(self) -> FleetResult:
        """Route the whole workload first (the router reads nothing of the instances), then serve each instance's
        share with an Engine of its own (compiled where its path allows; "auto": where the whole workload is worth
        compiling, since the loops, once loaded, serve every share)."""
        w = self.workload
        builder = Engine(w, self.config, path="reference", **self.engine_options)  # the requests as they arrive
        path = "compiled" if self.compiles(builder) else self.path
        instance_of = np.empty(w.num_requests, dtype=np.int64)
        for j, arrival_s in enumerate(w.arrival_s.tolist()):
            instance_of[j] = self.router.route(self.routed(builder.request(j, arrival_s), builder), None)
        results = []
        for k in range(self.num_instances):
            ids = np.flatnonzero(instance_of == k)
            if len(ids) == 0:
                results.append(None)
                continue
            options = dict(self.engine_options)
            if options.get("prompt_token_ids") is not None:
                options["prompt_token_ids"] = [options["prompt_token_ids"][i] for i in ids]
            results.append(Engine(share(w, ids), self.config, path=path, **options).run())
        return self.result(instance_of, results)

    def result(self, instance_of, results) -> FleetResult:
        """The fleet's result: each request's record from the run of the instance that served it."""
        w = self.workload
        columns = {name: np.full(w.num_requests, np.nan) for name in ("first_scheduled_s", "first_token_s", "finish_s")}
        columns |= {name: np.zeros(w.num_requests, np.int64) for name in ("num_output_tokens", "num_preemptions")}
        for k, result in enumerate(results):
            if result is not None:
                ids = np.flatnonzero(instance_of == k)
                for name, values in columns.items():
                    values[ids] = getattr(result, name)
        return FleetResult(type(self.router).name, instance_of, results, w.arrival_s, w.prompt_tokens,
                           w.output_tokens, **columns)  # fmt: skip


def share_result(engine: Engine, ids: np.ndarray, columns, steps) -> EngineResult:
    """An instance's run: its requests ids of the engine's workload (in arrival order), their records (RequestLog's
    columns, in that order) and its StepLog."""
    w = engine.workload
    return EngineResult(engine.allocation, engine.num_gpu_blocks, engine.block_size, w.arrival_s[ids],
                        w.prompt_tokens[ids], w.output_tokens[ids], *columns, StepRecords(steps))  # fmt: skip


def share(workload: Workload, ids: np.ndarray) -> Workload:
    """The workload's requests ids (in arrival order), as a workload of their own."""
    hashes = None if workload.prefix_hashes is None else tuple(workload.prefix_hashes[i] for i in ids)
    return Workload(workload.arrival_s[ids], workload.prompt_tokens[ids], workload.output_tokens[ids], hashes,
                    workload.prefix_block_tokens, workload.name)  # fmt: skip
