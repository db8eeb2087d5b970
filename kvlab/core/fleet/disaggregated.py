"""Disaggregated prefill and decode ("xPyD"): x prefill instances and y decode instances of kvlab's engine joined by a
KV connector (vLLM's NIXL pull connector: kvlab.core.engine.kv_connector), behind vLLM's example proxy.

A request goes, as vLLM's proxies send it (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py,
examples/online_serving/disaggregated_serving/disagg_proxy_demo.py: each side's instances in turn), first to a prefill
instance as a request of max_tokens=1 (do_remote_decode): it is prefilled there and its blocks stay held after it
finishes. When that response comes back (no network time: kvlab's choice) the proxy sends the request whole to a
decode instance (do_remote_prefill): it gets blocks for its prompt, its KV is read from the prefill instance
(TransferCost.transfer_s: kvlab.core.kv_transfer, the link's datasheet bound), the prefill instance's blocks are freed
once that read ends (reported in its first step output after it), and the decode instance computes the last prompt
token, samples the first token (the one the client sees: the prefill's is dropped) and decodes the rest.

The two sides depend on each other: a decode instance's arrivals are the prefill instances' finishes, and a prefill
instance's blocks are held until the decode side's reads end. run() serves every instance on one clock: the instance
whose next decision (its next step, the end of a transfer it waits for, an arrival) comes first takes it; a prefill's
finish reaches the proxy at its time; a decode instance's allocation tells the prefill instance when its read ends. A
prefill instance may learn of a read's end after the step whose output would have reported it (the read started on
another instance while that step ran): it applies it at its next schedule(), before anything reads it, and only its
step record of blocks in use (read at that step's end) shows the blocks a step longer. run_alternating() is the
reference run() is tested against: each side served whole with the other's last run until the reads' ends repeat
exactly (a fixed point, the one run consistent with both sides, since every instance is causal; a congested decode
side takes many rounds: 2,000 requests, 124 rounds, 110 s against run()'s 1.1 s).

TTFT (arrival to the decode instance's first token) splits into five parts that sum to it: queue (arrival to the
prefill instance's first step with it), prefill (to its finish), decode_queue (to the decode instance's allocation of
its blocks, where the read starts), transfer (to the decode instance's step that computes its last prompt token: the
read and the promotion after it) and first_decode (that step).
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass

import numpy as np

from kvlab.core import validate
from kvlab.core.engine import Engine
from kvlab.core.engine.kv_connector import CONSUMER, PRODUCER, KVTransfers
from kvlab.core.engine.records import RequestLog
from kvlab.core.fleet.fleet import Instance
from kvlab.core.workload import Workload

TTFT_PARTS = ("queue", "prefill", "decode_queue", "transfer", "first_decode")
MAX_ROUNDS = 200  # runs of both sides before kvlab gives up on a fixed point (it says so)
LOG = logging.getLogger("kvlab")


@dataclass
class DisaggregatedResult:
    """A disaggregated run: per request (the workload's order) its prefill and decode instance, arrival, first token
    (the decode instance's), finish, TTFT's parts (TTFT_PARTS, seconds), each instance's EngineResult (None: it had
    no request) and the rounds the two sides took to settle."""

    prefill_of: np.ndarray
    decode_of: np.ndarray
    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    ttft_parts_s: dict
    prefill_results: list
    decode_results: list
    num_rounds: int

    def summary(self) -> dict:
        """The run's figures: requests, TTFT (mean, p95), E2E p95, TTFT's parts (means), TPOT on the decode side
        (mean, p95), each side's preemptions and steps, and each instance's requests, preemptions and steps."""
        ttft = self.first_token_s - self.arrival_s
        out = {
            "num_requests": len(ttft),
            "mean_ttft_s": float(ttft.mean()),
            "p95_ttft_s": float(np.percentile(ttft, 95)),
            "p95_e2e_s": float(np.percentile(self.finish_s - self.arrival_s, 95)),
        }
        out |= {f"mean_ttft_{part}_s": float(v.mean()) for part, v in self.ttft_parts_s.items()}
        decoded = [r for r in self.decode_results if r is not None]
        tpot = np.concatenate([r.tpot_s for r in decoded])  # (EngineResult.tpot_s: NaN for one output token)
        out["mean_tpot_s"] = float(np.nanmean(tpot)) if np.isfinite(tpot).any() else math.nan
        out["p95_tpot_s"] = float(np.nanpercentile(tpot, 95)) if np.isfinite(tpot).any() else math.nan
        for side, results in (("prefill", self.prefill_results), ("decode", self.decode_results)):
            used = [r for r in results if r is not None]
            out[f"{side}_preemptions"] = int(sum(r.num_preemptions.sum() for r in used))
            out[f"{side}_steps"] = int(sum(r.num_steps for r in used))
            out[f"{side}_instances"] = [
                {"num_requests": 0 if r is None else r.num_requests, "num_preemptions": 0 if r is None else
                 int(r.num_preemptions.sum()), "num_steps": 0 if r is None else r.num_steps}
                for r in results
            ]  # fmt: skip
        return out


def requests_of(workload: Workload, ids: np.ndarray, arrival_s: np.ndarray, output_tokens: np.ndarray) -> Workload:
    """The workload's requests ids (their prompts and prefix hashes) arriving at arrival_s for output_tokens each: a
    side's share (a prefill instance's: one output token; a decode instance's: arriving at their prefill's finish)."""
    hashes = None if workload.prefix_hashes is None else tuple(workload.prefix_hashes[i] for i in ids)
    return Workload(arrival_s, workload.prompt_tokens[ids], output_tokens, hashes, workload.prefix_block_tokens)


def next_decision_s(instance) -> float:
    """When a fleet's instance next decides: at its next arrival when idle; at its next transfer's end or arrival
    while it waits for transfers (its last schedule() scheduled nothing and no report came since); else at its clock;
    inf when nothing is known to come."""
    scheduler, now_s = instance.scheduler, instance.now_s
    arriving = (
        instance.arrival_list[instance.next_arrival] if instance.next_arrival < len(instance.routed) else math.inf
    )
    if not (scheduler.running or scheduler.num_waiting()):  # (as the engine's loop reads it: idle)
        return max(now_s, arriving)  # (a step may have ended past an arrival, which joins at the next decision)
    waiting = scheduler.num_scheduled_tokens == 0 and not scheduler.num_preempted
    if waiting and scheduler.reported_s <= scheduler.scheduled_s:
        return max(now_s, min(scheduler.connector.next_event_s(), arriving))
    return now_s


class DisaggregatedFleet:
    """num_prefill prefill and num_decode decode instances of the config (synchronous scheduling: what kvlab's
    connector models), each with num_gpu_blocks blocks and the step cost; transfer: a kv_transfer.TransferCost."""

    def __init__(self, workload: Workload, config, num_prefill: int, num_decode: int, transfer, **engine_options):
        for name, value in (("num_prefill", num_prefill), ("num_decode", num_decode)):
            if not isinstance(value, int) or value < 1:
                validate.fail(name, value, "must be a whole number of instances >= 1")
        self.workload, self.config, self.transfer = workload, config, transfer
        self.num_prefill, self.num_decode = num_prefill, num_decode
        self.engine_options = engine_options

    def run(self) -> DisaggregatedResult:
        """Serve the workload on one clock (the module's docstring): every instance takes its next step, or waits,
        in time order; a prefill's finish reaches the proxy, which sends it to a decode instance, at its time; a
        decode instance's allocation tells the prefill instance when its read ends."""
        w, n, x, y = self.workload, self.workload.num_requests, self.num_prefill, self.num_decode
        read_s = self.read_s()
        one_token = requests_of(w, np.arange(n), w.arrival_s, np.ones(n, dtype=np.int64))
        options = {**self.engine_options, "check": False}
        producers = KVTransfers(np.full(n, PRODUCER), np.zeros(n), read_s, np.full(n, np.nan))
        consumers = KVTransfers(np.full(n, CONSUMER), read_s, np.zeros(n), transfer=self.transfer)
        logs = RequestLog(n), RequestLog(n)
        prefill = [Instance(k, logs[0], one_token, self.config, kv_transfers=producers, **options) for k in range(x)]
        decode = [Instance(k, logs[1], w, self.config, kv_transfers=consumers, **options) for k in range(y)]
        for instance in prefill:
            instance.scheduler.deferred_reports = True  # reads other instances start
        builders = [Engine(work, self.config, path="reference", **options) for work in (one_token, w)]
        prefill_of = np.arange(n) % x  # the proxy's turn over the prefill instances, by arrival
        for j, arrival_s in enumerate(w.arrival_s.tolist()):
            prefill[prefill_of[j]].route(builders[0].request(j, arrival_s), False)
        decode_of = np.full(n, -1, dtype=np.int64)
        finishes: list = []  # (finish_s, request id) of prefills not yet sent on
        num_finishes, num_sent, reads_told = [0] * x, 0, [0] * y
        instances = prefill + decode
        while True:
            now_s, k = min((next_decision_s(instance), k) for k, instance in enumerate(instances))
            while finishes and finishes[0][0] <= now_s:  # the proxy sends each prefilled request on, in time order
                finish_s, j = heapq.heappop(finishes)
                decode_of[j] = num_sent % y
                decode[decode_of[j]].route(builders[1].request(j, finish_s), False)
                num_sent += 1
                now_s, k = min((next_decision_s(instance), k) for k, instance in enumerate(instances))
            if now_s == math.inf:
                break
            instance = instances[k]
            instance.run_until(math.nextafter(now_s, math.inf))  # its step (or wait) at now_s, no further
            if k < x:  # a prefill instance: its finishes go to the proxy
                for finish_s, j in instance.finishes[num_finishes[k] :]:
                    heapq.heappush(finishes, (finish_s, j))
                num_finishes[k] = len(instance.finishes)
            else:  # a decode instance: the reads it started end at the prefill instances
                ends = instance.scheduler.connector.load_end_s
                for j in list(ends)[reads_told[k - x] :]:
                    prefill[prefill_of[j]].scheduler.connector.read_ends(j, ends[j])
                reads_told[k - x] = len(ends)
        for instance in instances:
            instance.run_until(math.inf)
        load_start_s = np.empty(n)
        for instance in decode:
            for j, start_s in instance.scheduler.connector.load_start_s.items():
                load_start_s[j] = start_s
        prefill_results = [
            (np.flatnonzero(prefill_of == k), i.result() if i.routed else None) for k, i in enumerate(prefill)
        ]
        decode_results = [
            (np.array([r.request_id for r in i.routed], dtype=np.int64), i.result() if i.routed else None)
            for i in decode
        ]
        prefilled_s = np.asarray(logs[0].finish_s)
        return self.result(prefill_of, prefill_results, prefilled_s, decode_of, decode_results, load_start_s, 1)

    def run_alternating(self) -> DisaggregatedResult:
        """The reference: each side served whole with the other's last run, until the reads' ends repeat exactly
        (a fixed point: the one run consistent with both sides, as every instance is causal); run() must equal it."""
        n = self.workload.num_requests
        prefill_of = np.arange(n) % self.num_prefill  # the proxy's turn over the prefill instances, by arrival
        read_s = self.read_s()
        read_end_s = None  # first guess: each read starts at its prefill's finish
        rounds = 0
        while rounds < MAX_ROUNDS:
            rounds += 1
            prefill = [self.prefill_side(k, prefill_of, read_end_s, read_s) for k in range(self.num_prefill)]
            prefilled_s = np.empty(n)
            for ids, result in prefill:
                if result is not None:
                    prefilled_s[ids] = result.finish_s
            if read_end_s is None:
                read_end_s = prefilled_s + read_s
            decode_of, decode, load_start_s, new_read_end_s = self.decode_side(prefilled_s, read_s)
            if np.array_equal(new_read_end_s, read_end_s):
                break
            if rounds % 10 == 0:
                LOG.info(
                    "disaggregated: round %d, the decode side's reads of %d requests still move the prefill side",
                    rounds,
                    int(np.count_nonzero(new_read_end_s != read_end_s)),
                )
            read_end_s = new_read_end_s
        else:
            raise RuntimeError(
                f"the prefill and decode sides did not settle in {MAX_ROUNDS} rounds (their reads' ends still "
                "moved): kvlab cannot serve this deployment exactly; fewer requests or more decode instances"
            )
        return self.result(prefill_of, prefill, prefilled_s, decode_of, decode, load_start_s, rounds)

    def prefill_side(self, k: int, prefill_of: np.ndarray, read_end_s, read_s: np.ndarray):
        """Prefill instance k's requests (each of max_tokens=1, a producer) served with the reads' ends given (None:
        read_s after each finish). Returns (their ids, its EngineResult)."""
        w = self.workload
        ids = np.flatnonzero(prefill_of == k)
        if len(ids) == 0:
            return ids, None  # (more instances than requests)
        m = len(ids)
        part = requests_of(w, ids, w.arrival_s[ids], np.ones(m, dtype=np.int64))
        transfers = KVTransfers(
            np.full(m, PRODUCER), np.zeros(m), read_s[ids], None if read_end_s is None else read_end_s[ids]
        )
        return ids, Engine(part, self.config, kv_transfers=transfers, **self.options(ids)).run()

    def decode_side(self, prefilled_s: np.ndarray, read_s: np.ndarray):
        """Every request sent to a decode instance at its prefill's finish (in that order, the proxy's turn over the
        decode instances; ties by arrival). Returns (each request's decode instance, each instance's (ids, result),
        each request's load start and end)."""
        w, n = self.workload, self.workload.num_requests
        order = np.lexsort((np.arange(n), prefilled_s))
        decode_of = np.empty(n, dtype=np.int64)
        decode_of[order] = np.arange(n) % self.num_decode
        load_start_s, load_end_s = np.empty(n), np.empty(n)
        results = []
        for k in range(self.num_decode):
            ids = order[decode_of[order] == k]
            m = len(ids)
            if m == 0:
                results.append((ids, None))
                continue
            part = requests_of(w, ids, prefilled_s[ids], w.output_tokens[ids])
            transfers = KVTransfers(np.full(m, CONSUMER), read_s[ids], np.zeros(m), transfer=self.transfer)
            engine = Engine(part, self.config, kv_transfers=transfers, **self.options(ids))
            result = engine.run()
            connector = engine.scheduler.connector
            load_start_s[ids] = [connector.load_start_s[j] for j in range(m)]
            load_end_s[ids] = [connector.load_end_s[j] for j in range(m)]
            results.append((ids, result))
        return decode_of, results, load_start_s, load_end_s

    def read_s(self) -> np.ndarray:
        """Each request's whole prompt read at the link's bandwidth (the first guess at its read; a decode instance
        times the tokens it loads)."""
        return np.array([self.transfer.transfer_s(int(p)) for p in self.workload.prompt_tokens])

    def options(self, ids: np.ndarray) -> dict:
        """The engine options for the requests ids (their prompts' token ids where given)."""
        options = dict(self.engine_options)
        if options.get("prompt_token_ids") is not None:
            options["prompt_token_ids"] = [options["prompt_token_ids"][i] for i in ids]
        return {**options, "path": "reference"}

    def result(self, prefill_of, prefill, prefilled_s, decode_of, decode, load_start_s, rounds) -> DisaggregatedResult:
        w, n = self.workload, self.workload.num_requests
        prefill_scheduled_s = np.empty(n)
        first_token_s, finish_s, decode_scheduled_s = np.empty(n), np.empty(n), np.empty(n)
        for ids, r in prefill:
            if r is not None:
                prefill_scheduled_s[ids] = r.first_scheduled_s
        for ids, r in decode:
            if r is None:
                continue
            first_token_s[ids], finish_s[ids], decode_scheduled_s[ids] = (
                r.first_token_s,
                r.finish_s,
                r.first_scheduled_s,
            )
        parts = {
            "queue": prefill_scheduled_s - w.arrival_s,
            "prefill": prefilled_s - prefill_scheduled_s,
            "decode_queue": load_start_s - prefilled_s,
            "transfer": decode_scheduled_s - load_start_s,
            "first_decode": first_token_s - decode_scheduled_s,
        }
        return DisaggregatedResult(prefill_of, decode_of, w.arrival_s, first_token_s, finish_s, parts,
                                   [r for _, r in prefill], [r for _, r in decode], rounds)  # fmt: skip
