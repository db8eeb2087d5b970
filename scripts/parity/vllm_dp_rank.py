#!/usr/bin/env python
"""vLLM's own data-parallel rank choice, on the CPU, for kvlab's parity check (`make parity`).

    .venv-vllm/bin/python scripts/parity/vllm_dp_rank.py IN.json OUT.json

IN.json is {"sequences": [{"num_ranks": N, "client_count": C, "client_index": I, "events": [...]}, ...]}; an
event is ["choose", request_id], ["finish", request_id] or ["snapshot", [[waiting, running, kv_cache_usage], ...]].
For each sequence the script builds vLLM's DPLBAsyncMPClient without its processes (its __init__ starts engine
cores; the state its rank choice reads is set as __init__ sets it) and plays the events through vLLM's own code:
get_core_engine_for_request for a choice, process_engine_outputs with the request finished for a finish, and
lb_engines set to the counts for a snapshot (as its stats task does on the coordinator's message). OUT.json gets
the rank of every choice, in order. Only vLLM is imported.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from types import SimpleNamespace

import vllm
from vllm.v1.engine.core_client import DPLBAsyncMPClient


def client(num_ranks: int, client_count: int, client_index: int) -> DPLBAsyncMPClient:
    c = object.__new__(DPLBAsyncMPClient)
    c.core_engines = [rank.to_bytes(2, "little") for rank in range(num_ranks)]  # vLLM's EngineIdentity
    c.lb_engines = [[0, 0, 0.0] for _ in c.core_engines]
    c.client_count, c.client_index = client_count, client_index
    c.eng_start_index = (len(c.core_engines) * client_index) // client_count
    c.engine_inflight = Counter()
    c.reqs_in_flight = {}
    c.streaming_reqs = set()
    return c


def play(sequence: dict) -> list[int]:
    c = client(sequence["num_ranks"], sequence["client_count"], sequence["client_index"])
    chosen = []
    for kind, arg in sequence["events"]:
        if kind == "choose":
            request = SimpleNamespace(request_id=arg, resumable=False, data_parallel_rank=None, pooling_params=None)
            chosen.append(c.core_engines.index(c.get_core_engine_for_request(request)))
        elif kind == "finish":
            asyncio.run(DPLBAsyncMPClient.process_engine_outputs(c, SimpleNamespace(finished_requests=[arg])))
        else:
            c.lb_engines = [list(x) for x in arg]
    return chosen


def main() -> int:
    src, dst = sys.argv[1:3]
    with open(src, encoding="utf-8") as f:
        sequences = json.load(f)["sequences"]
    out = {"vllm_version": vllm.__version__, "chosen": [play(s) for s in sequences]}
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
