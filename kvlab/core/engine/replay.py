"""The engine on the documents of make parity: IN.json of scripts/parity/vllm_scheduler.py in, its OUT.json out.

from_document reads a workload, the scheduler and cache settings, the block count and the step cost the
way vLLM's side of the parity run does; to_document writes the engine's result with the same keys, so the
two can be compared request by request and step by step (scripts/parity/compare_scheduler.py, the tests of
the hand-checked cases).
"""

from __future__ import annotations

import numpy as np

from kvlab.core.capacity import KVCacheGroup
from kvlab.core.config import EngineConfig
from kvlab.core.cost import ConstantStepCost, LinearStepCost
from kvlab.core.engine.engine import Engine
from kvlab.core.engine.kv_connector import KVTransfers
from kvlab.core.engine.records import EngineResult
from kvlab.core.workload import Workload

# vLLM's side's defaults (scripts/parity/vllm_scheduler.py DEFAULT_CONFIG).
DOCUMENT_DEFAULTS = {
    "num_gpu_blocks": 2000,
    "block_size": 16,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "max_model_len": 8192,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": False,
    "async_scheduling": False,
}


def from_document(doc: dict) -> dict:
    """Engine arguments of an IN.json document: workload, config, num_gpu_blocks, cost, prompt_token_ids and
    kv_cache_groups (config's, a hybrid model's; None: one full-attention group)."""
    settings = {**DOCUMENT_DEFAULTS, **doc.get("config", {})}
    requests = doc["requests"]
    order = sorted(range(len(requests)), key=lambda i: requests[i]["arrival_s"])
    if order != list(range(len(requests))):
        raise ValueError("requests must be given in arrival order (the engine's request_id is the input position)")
    workload = Workload(
        np.array([r["arrival_s"] for r in requests], dtype=np.float64),
        np.array([r.get("prompt_tokens", len(r.get("prompt_token_ids") or ())) for r in requests]),
        np.array([r["output_tokens"] for r in requests]),
        name="parity",
    )
    ids = None
    if any("prompt_token_ids" in r for r in requests):
        ids = [np.asarray(r["prompt_token_ids"], dtype=np.int64) if "prompt_token_ids" in r else None for r in requests]
        if any(x is None for x in ids):
            raise ValueError("give prompt_token_ids for every request or for none")
    config = EngineConfig().replace(
        block_size=settings["block_size"],
        enable_prefix_caching=settings["enable_prefix_caching"],
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        max_model_len=settings["max_model_len"],
        enable_chunked_prefill=settings["enable_chunked_prefill"],
        long_prefill_token_threshold=settings["long_prefill_token_threshold"],
        async_scheduling=settings["async_scheduling"],
    )
    cost_doc = doc.get("cost", {"kind": "constant", "step_ms": 8.0})
    if cost_doc["kind"] == "constant":
        cost = ConstantStepCost(float(cost_doc["step_ms"]))
    else:
        cost = LinearStepCost(float(cost_doc["step_ms"]), float(cost_doc.get("step_ms_per_token", 0.0)))
    groups = settings.get("kv_cache_groups")  # [{"kind", "block_size", "sliding_window", "attention_chunk_size"}]
    if groups is not None:
        groups = tuple(
            KVCacheGroup(
                g["kind"],
                g["block_size"],
                (),
                g.get("sliding_window", 0),
                g.get("attention_chunk_size", 0),
                g.get("mamba_cache_mode", "none"),
                g.get("num_prefill_checkpoint_blocks", 0),
                g.get("prefill_checkpoint_alignment") or 0,
            )
            for g in groups
        )
    transfers = None  # a KV connector's roles and times (kv_role, kv_load_s, kv_hold_s), where a request has one
    if any(r.get("kv_role", 0) for r in requests):
        transfers = KVTransfers(
            *(np.array([r.get(k, 0) for r in requests]) for k in ("kv_role", "kv_load_s", "kv_hold_s"))
        )
    return {
        "workload": workload,
        "config": config,
        "num_gpu_blocks": settings["num_gpu_blocks"],
        "cost": cost,
        "prompt_token_ids": ids,
        "kv_cache_groups": groups,
        "kv_transfers": transfers,
    }


def run_document(doc: dict, **engine_options) -> EngineResult:
    """Serve an IN.json document with the engine (options: path, recorder, check)."""
    return Engine(**from_document(doc), **engine_options).run()


def _time(x: float) -> float | None:
    return None if x != x else float(x)


def to_document(result: EngineResult) -> dict:
    """The result as OUT.json's requests and steps (steps carry scheduled / preempted with Recorder(scheduled=True))."""
    requests = [
        {
            "request_id": i,
            "arrival_s": float(result.arrival_s[i]),
            "prompt_tokens": int(result.prompt_tokens[i]),
            "output_tokens": int(result.output_tokens[i]),
            "first_scheduled_s": _time(result.first_scheduled_s[i]),
            "first_token_s": _time(result.first_token_s[i]),
            "finish_s": _time(result.finish_s[i]),
            "num_output_tokens": int(result.num_output_tokens[i]),
            "num_preemptions": int(result.num_preemptions[i]),
        }
        for i in range(result.num_requests)
    ]
    s = result.steps
    steps = []
    for j in range(result.num_steps):
        step = {
            "start_s": float(s["start_s"][j]),
            "end_s": float(s["end_s"][j]),
            "num_scheduled_tokens": int(s["num_scheduled_tokens"][j]),
            "num_running": int(s["num_running"][j]),
            "num_waiting": int(s["num_waiting"][j]),
            "num_blocks_in_use": int(s["num_blocks_in_use"][j]),
        }
        if result.scheduled is not None:
            batch, preempted = result.scheduled[j]
            step["scheduled"] = [list(pair) for pair in batch]
            step["preempted"] = list(preempted)
        if result.block_ids is not None:
            step["block_ids"] = [[rid, list(ids)] for rid, ids in result.block_ids[j]]
        steps.append(step)
    return {"num_requests": len(requests), "num_steps": len(steps), "requests": requests, "steps": steps}
