#!/usr/bin/env python3
"""Replay a workload through vLLM's real v1 scheduler, on the CPU, in simulated time.

This is the vLLM side of kvlab's ``make parity`` check: kvlab's serving engine must make
exactly the scheduling decisions that vLLM's own ``vllm.v1.core.sched.scheduler.Scheduler``
makes.  This script builds that scheduler (no GPU, no model weights, nothing downloaded),
feeds it a workload, fabricates the model's output for every step, and records what it
decided.  It imports vLLM only (no kvlab), so it runs in the separate vLLM environment::

    .venv-vllm/bin/python scripts/parity/vllm_scheduler.py IN.json OUT.json

IN.json::

    {"config": {"num_gpu_blocks": 2000,        # KV blocks, vLLM's null block included
                "block_size": 16,
                "max_num_seqs": 256,
                "max_num_batched_tokens": 8192,
                "max_model_len": 8192,
                "enable_chunked_prefill": true,
                "long_prefill_token_threshold": 0,
                "enable_prefix_caching": false,
                "async_scheduling": false},
     "cost": {"kind": "constant", "step_ms": 8.0}
          or {"kind": "linear", "step_ms": 5.0, "step_ms_per_token": 0.01},
     "requests": [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 20,
                   "prompt_token_ids": [...]},         # optional, see below
                  ...]}

Simulated time (kvlab's engine follows the same rules):

* The clock starts at the first arrival.  Before each ``schedule()`` call every request
  with ``arrival_s <= clock`` is added, in arrival order (ties in input order).
* When no request is running or waiting, the clock jumps to the next arrival.
* A step lasts ``step_ms`` (constant) or ``step_ms + step_ms_per_token * tokens`` (linear,
  ``tokens`` = all tokens scheduled in the step), computed in float64 as
  ``(step_ms + step_ms_per_token * tokens) / 1000.0`` seconds; ``end = start + duration``.
* A token sampled in a step is emitted at the step's end.
* Model output is fabricated: a scheduled request samples exactly one token when its
  scheduled chunk reaches the end of its known tokens (its prefill completes, or it is
  decoding) and none for a partial prefill chunk.  Requests use ``ignore_eos`` and
  ``max_tokens = output_tokens``, so they finish after ``output_tokens`` sampled tokens
  (or earlier if prompt + output reaches ``max_model_len``: vLLM's length cap).
* Token contents only matter with prefix caching.  ``prompt_token_ids`` (if given) are
  used as is; otherwise every request gets a prompt no other request shares.  Sampled
  tokens are always request-unique, so generated tokens never match across requests
  (but a preempted request can hit its own cached blocks when it resumes).

With ``async_scheduling: true`` vLLM's AsyncScheduler is driven the way
``EngineCore.step_with_batch_queue`` drives it (batch queue of two; scheduling and output
processing take no simulated time; the GPU runs batches back to back).  The clock is the
engine's CPU's: it moves only when the engine waits for a batch's output (to that batch's
end) or idles (to the next arrival).  Each engine step: every request with ``arrival_s <=
clock`` is added; if ``scheduler.has_requests()``, a batch is scheduled and queued (an empty
one too), and the step returns without waiting while fewer than two batches are queued and
(the batch has tokens or ``has_requests()``); otherwise the oldest batch's output is awaited
and processed (``update_from_output``).  A batch scheduled at clock t runs from max(t, the end
of the batch queued before it) for its cost, none without tokens; its tokens and finishes are
stamped at its end.  ``first_scheduled_s`` is the clock of the ``schedule()`` call that admitted
the request.  With requests unfinished and no batch of tokens queued, two ``schedule()`` calls in a
row that scheduled nothing mean nothing can change before the next arrival: the clock jumps to it.  The model's
output is fabricated by the same rule as below, decided when the batch is scheduled (vLLM's
``is_prefill_chunk`` then counts the placeholders in flight).  Only batches with tokens, or
that preempted a request (they take no time), are steps in OUT.json.

OUT.json:

* ``requests``: one record per request (``request_id`` = 0-based input position) with
  ``arrival_s``, ``first_scheduled_s`` (start of the first step that scheduled it),
  ``first_token_s``, ``finish_s``, ``num_output_tokens``, ``num_preemptions``,
  ``finish_reason``.
* ``steps``: ``start_s``, ``end_s``, ``num_scheduled_tokens``, ``num_running`` and
  ``num_waiting`` (read right after ``schedule()``), ``num_blocks_in_use`` (blocks held,
  null block excluded, read after ``update_from_output()``), ``scheduled`` (``[request_id,
  tokens]`` pairs in vLLM's batch order: running requests first, then admissions),
  ``preempted`` (request ids preempted by this ``schedule()``) and, with ``--block-ids``,
  ``block_ids`` (each scheduled request's block table right after ``schedule()``).
* ``wall_s_scheduler``: seconds spent inside ``schedule()`` and ``update_from_output()``
  only (no imports, setup or bookkeeping), and ``vllm_version``.

Exit status 2: the workload can make no progress (e.g. a request that can never be
admitted; vLLM would wait forever); the script says why instead of hanging.  Exit status
3: bad input, including configurations vLLM itself rejects.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# vLLM reads these at import time: keep it quiet and offline.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")

EXIT_NO_PROGRESS = 2
EXIT_BAD_INPUT = 3

# Config keys of IN.json and their defaults (the values kvlab's parity runs use).
DEFAULT_CONFIG: dict[str, Any] = {
    "num_gpu_blocks": 2000,
    "block_size": 16,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "max_model_len": 8192,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": False,
    "async_scheduling": False,
    # A hybrid model's KV cache groups, in order: [{"kind": "full_attention" | "sliding_attention" |
    # "chunked_local_attention" | "mamba", "attention_chunk_size" (chunked local attention only),
    # "block_size", "sliding_window"}] (a Mamba group's block_size: max_model_len in mamba_cache_mode "none", without
    # prefix caching; the attention block size in "align", with it; and optionally its "mamba_cache_mode",
    # "num_prefill_checkpoint_blocks" and "prefill_checkpoint_alignment", MambaSpec's);
    # None: one full-attention group of block_size tokens a block.
    "kv_cache_groups": None,
}

# Fabricated token ids.  Prompts that IN.json does not spell out start with a
# request-unique token (chained block hashes then make every block of the prompt unique);
# sampled tokens are request-unique too.  vLLM's scheduler never checks ids against a
# vocabulary, so any int works; these ranges just keep the three kinds apart.
PROMPT_FILLER_BASE = 100
UNIQUE_PROMPT_BASE = 10_000_000
SAMPLED_TOKEN_BASE = 20_000_000


class NoProgressError(RuntimeError):
    """The workload cannot finish: vLLM would wait forever."""


class BadInputError(ValueError):
    """IN.json is malformed or describes something vLLM itself would reject."""


# --------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    """Step duration model: ``step_ms + step_ms_per_token * scheduled tokens``."""

    kind: str
    step_ms: float
    step_ms_per_token: float = 0.0

    def duration_s(self, num_tokens: int) -> float:
        if self.kind == "constant":
            return self.step_ms / 1000.0
        return (self.step_ms + self.step_ms_per_token * num_tokens) / 1000.0


@dataclass
class RequestSpec:
    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prompt_token_ids: list[int] | None
    kv_role: int = 0  # a KV connector's: 0 none, 1 producer (do_remote_decode), 2 consumer (do_remote_prefill)
    kv_load_s: float = 0.0  # a consumer's KV arrives this long after the schedule() that allocated its blocks
    kv_hold_s: float = 0.0  # a producer's blocks are freed this long after it finishes


@dataclass
class Workload:
    config: dict[str, Any]
    cost: Cost
    requests: list[RequestSpec]

    @property
    def connector(self) -> bool:
        """Whether a request has a KV connector role (vllm_fake_nixl.py's connector then serves every request)."""
        return any(r.kv_role for r in self.requests)


def _as_int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise BadInputError(f"{what} must be an integer, got {value!r}")
    if int(value) < minimum:
        raise BadInputError(f"{what} must be >= {minimum}, got {value!r}")
    return int(value)


def parse_workload(doc: dict[str, Any]) -> Workload:
    """Validate IN.json and fill in defaults."""
    if not isinstance(doc, dict):
        raise BadInputError("IN.json must hold a JSON object")
    unknown = set(doc.get("config", {})) - set(DEFAULT_CONFIG)
    if unknown:
        raise BadInputError(f"unknown config keys: {sorted(unknown)}")
    config = {**DEFAULT_CONFIG, **doc.get("config", {})}
    for key in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        config[key] = _as_int(config[key], f"config.{key}", 1)
    if config["num_gpu_blocks"] < 2:
        raise BadInputError("config.num_gpu_blocks counts vLLM's null block; it must be >= 2")
    config["long_prefill_token_threshold"] = _as_int(
        config["long_prefill_token_threshold"] or 0, "config.long_prefill_token_threshold", 0
    )
    for key in ("enable_chunked_prefill", "enable_prefix_caching", "async_scheduling"):
        if not isinstance(config[key], bool):
            raise BadInputError(f"config.{key} must be true or false")
    if config["kv_cache_groups"] is not None:
        groups = config["kv_cache_groups"]
        if not isinstance(groups, list) or not groups:
            raise BadInputError("config.kv_cache_groups must be a non-empty list of groups")
        for i, g in enumerate(groups):
            if g.get("kind") not in ("full_attention", "sliding_attention", "chunked_local_attention", "mamba"):
                raise BadInputError(
                    f"config.kv_cache_groups[{i}].kind must be full_attention, sliding_attention, "
                    "chunked_local_attention or mamba"
                )
            g["block_size"] = _as_int(g.get("block_size"), f"config.kv_cache_groups[{i}].block_size", 1)
            if g["kind"] == "sliding_attention":
                g["sliding_window"] = _as_int(g.get("sliding_window"), f"config.kv_cache_groups[{i}].sliding_window", 1)
            if g["kind"] == "chunked_local_attention":
                g["attention_chunk_size"] = _as_int(
                    g.get("attention_chunk_size"), f"config.kv_cache_groups[{i}].attention_chunk_size", 1
                )

    raw_cost = doc.get("cost", {"kind": "constant", "step_ms": 8.0})
    kind = raw_cost.get("kind")
    if kind not in ("constant", "linear"):
        raise BadInputError(f"cost.kind must be 'constant' or 'linear', got {kind!r}")
    cost = Cost(kind, float(raw_cost["step_ms"]), float(raw_cost.get("step_ms_per_token", 0.0)))
    if not (cost.step_ms > 0 and cost.step_ms_per_token >= 0):
        raise BadInputError("cost.step_ms must be > 0 and cost.step_ms_per_token >= 0")

    requests = []
    for i, raw in enumerate(doc.get("requests", [])):
        arrival = float(raw["arrival_s"])
        if not math.isfinite(arrival):
            raise BadInputError(f"request {i}: arrival_s must be finite")
        ids = raw.get("prompt_token_ids")
        prompt = _as_int(raw.get("prompt_tokens", len(ids) if ids else 0), f"request {i}: prompt_tokens", 1)
        if ids is not None:
            if len(ids) != prompt or not all(isinstance(t, int) for t in ids):
                raise BadInputError(f"request {i}: prompt_token_ids must be {prompt} ints (prompt_tokens)")
            ids = list(ids)
        output = _as_int(raw["output_tokens"], f"request {i}: output_tokens", 1)
        if prompt >= config["max_model_len"]:
            # vLLM's input processor rejects these before they reach the scheduler.
            raise BadInputError(
                f"request {i}: prompt_tokens={prompt} >= max_model_len="
                f"{config['max_model_len']}; vLLM rejects such prompts at the API"
            )
        role = _as_int(raw.get("kv_role", 0), f"request {i}: kv_role", 0)
        load_s, hold_s = float(raw.get("kv_load_s", 0.0)), float(raw.get("kv_hold_s", 0.0))
        if role > 2 or not (math.isfinite(load_s) and math.isfinite(hold_s) and load_s >= 0 and hold_s >= 0):
            raise BadInputError(f"request {i}: kv_role must be 0, 1 or 2 and kv_load_s, kv_hold_s finite >= 0")
        requests.append(RequestSpec(i, arrival, prompt, output, ids, role, load_s, hold_s))
    if not requests:
        raise BadInputError("no requests")
    if any(r.kv_role for r in requests) and (config["async_scheduling"] or config["kv_cache_groups"] is not None):
        raise BadInputError("a KV connector (kv_role) is replayed with the synchronous scheduler of one group only")
    return Workload(config, cost, requests)


# --------------------------------------------------------------------------------------
# vLLM setup
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence the warnings torch and vLLM print while importing (no CUDA, no vllm._C).

    Redirects file descriptor 2, so C-level and pre-logging-setup messages go too.
    Exceptions still propagate and are printed after stderr is restored.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _import_vllm() -> SimpleNamespace:
    """Import the vLLM pieces the replay uses (takes a few seconds); returns them as
    attributes (``v.Request``...), so nothing else needs vLLM at module level."""
    logging.getLogger().setLevel(logging.ERROR)
    with _quiet_stderr():
        import torch
        import vllm
        from vllm import config as vllm_config
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec,
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager
    return SimpleNamespace(
        version=vllm.__version__,
        float32=torch.float32,
        SchedulerConfig=vllm_config.SchedulerConfig,
        ModelConfig=vllm_config.ModelConfig,
        CacheConfig=vllm_config.CacheConfig,
        DeviceConfig=vllm_config.DeviceConfig,
        VllmConfig=vllm_config.VllmConfig,
        SamplingParams=SamplingParams,
        get_hash_fn_by_name=get_hash_fn_by_name,
        get_request_block_hasher=kv_cache_utils.get_request_block_hasher,
        init_none_hash=kv_cache_utils.init_none_hash,
        resolve_kv_cache_block_sizes=kv_cache_utils.resolve_kv_cache_block_sizes,
        FullAttentionSpec=FullAttentionSpec,
        SlidingWindowSpec=SlidingWindowSpec,
        ChunkedLocalAttentionSpec=ChunkedLocalAttentionSpec,
        MambaSpec=MambaSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        ModelRunnerOutput=ModelRunnerOutput,
        Request=Request,
        StructuredOutputManager=StructuredOutputManager,
    )


def _write_tiny_model_dir(path: str, max_model_len: int) -> None:
    """A config-only Llama-like checkpoint: ModelConfig needs one, the scheduler does not
    care what it is (no weights and no tokenizer are ever loaded)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 32000,
        "max_position_embeddings": max_model_len,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


def build_scheduler(v: SimpleNamespace, config: dict[str, Any], model_dir: str, connector: bool = False):
    """Build vLLM's v1 scheduler the way EngineCore does, minus the model executor.

    Returns ``(scheduler, block_hasher)``; the hasher is None without prefix caching
    (EngineCore only hashes blocks when prefix caching or a KV connector is on).
    """
    block_size = config["block_size"]
    num_blocks = config["num_gpu_blocks"]
    try:
        # SchedulerConfig validates itself (e.g. max_num_batched_tokens >= max_num_seqs;
        # without chunked prefill, max_num_batched_tokens >= max_model_len).
        scheduler_config = v.SchedulerConfig(
            max_num_seqs=config["max_num_seqs"],
            max_num_batched_tokens=config["max_num_batched_tokens"],
            max_model_len=config["max_model_len"],
            is_encoder_decoder=False,
            long_prefill_token_threshold=config["long_prefill_token_threshold"],
            enable_chunked_prefill=config["enable_chunked_prefill"],
            async_scheduling=config["async_scheduling"],
            # a connector without HMA support (the fake NIXL one) over one group; else vLLM decides (unset)
            **({"disable_hybrid_kv_cache_manager": True} if connector else {}),
        )
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise BadInputError(f"vLLM rejects this scheduler config: {e}") from None
    with _quiet_stderr():
        model_config = v.ModelConfig(
            model=model_dir,
            tokenizer=model_dir,
            skip_tokenizer_init=True,
            max_model_len=config["max_model_len"],
            dtype="float32",
            seed=0,
        )
        cache_config = v.CacheConfig(
            block_size=block_size,
            gpu_memory_utilization=0.9,
            cache_dtype="auto",
            enable_prefix_caching=config["enable_prefix_caching"],
        )
        kv_transfer_config = None
        if connector:  # vllm_fake_nixl.FakeNixlConnector, both roles on one instance
            from vllm.config import KVTransferConfig
            from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

            if "KvlabFakeNixl" not in KVConnectorFactory._registry:
                KVConnectorFactory.register_connector("KvlabFakeNixl", "vllm_fake_nixl", "FakeNixlConnector")
            kv_transfer_config = KVTransferConfig(kv_connector="KvlabFakeNixl", kv_role="kv_both")
        vllm_config = v.VllmConfig(
            scheduler_config=scheduler_config,
            model_config=model_config,
            cache_config=cache_config,
            device_config=v.DeviceConfig(device="cpu"),
            kv_transfer_config=kv_transfer_config,
        )
    _check_effective_config(vllm_config, config)

    # One full-attention KV cache group (a plain decoder), or the groups IN.json gives (a hybrid model's: the
    # scheduler reads their kinds, block sizes and windows, never their page sizes).  EngineCore sets
    # cache_config.num_gpu_blocks to kv_cache_config.num_blocks, null block included.
    shape = {"num_kv_heads": 1, "head_size": 1, "dtype": v.float32}
    groups = config["kv_cache_groups"] or [{"kind": "full_attention", "block_size": block_size}]
    specs = []
    for g in groups:
        if g["kind"] == "sliding_attention":
            specs.append(v.SlidingWindowSpec(block_size=g["block_size"], sliding_window=g["sliding_window"], **shape))
        elif g["kind"] == "chunked_local_attention":
            chunk = g["attention_chunk_size"]
            specs.append(v.ChunkedLocalAttentionSpec(block_size=g["block_size"], attention_chunk_size=chunk, **shape))
        elif g["kind"] == "mamba":  # mamba_cache_mode "none" without prefix caching (a state a request), else "align"
            mode = "align" if config["enable_prefix_caching"] else "none"
            state = {"shapes": ((1,),), "dtypes": (v.float32,), "mamba_cache_mode": mode}
            if g.get("num_prefill_checkpoint_blocks"):  # a GDN kernel that exports prefill checkpoints (Hopper)
                state["num_prefill_checkpoint_blocks"] = g["num_prefill_checkpoint_blocks"]
                state["prefill_checkpoint_alignment"] = g.get("prefill_checkpoint_alignment")
            specs.append(v.MambaSpec(block_size=g["block_size"], **state))
            vllm_config.cache_config.mamba_cache_mode = mode  # what the scheduler reads
            vllm_config.cache_config.mamba_block_size = g["block_size"]
        else:
            specs.append(v.FullAttentionSpec(block_size=g["block_size"], **shape))
    kv_cache_config = v.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[v.KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)],
        # vLLM's planner copies it from the cache config (0 by default: a sliding window caches its blocks at the
        # prompt's end and the shared prefix only)
        prefix_cache_retention_interval=vllm_config.cache_config.prefix_cache_retention_interval,
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    scheduler_block_size, hash_block_size = v.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
    scheduler = scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=v.StructuredOutputManager(vllm_config),
        block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        log_stats=False,  # statistics only; no scheduling decision reads them
    )

    block_hasher = None
    if config["enable_prefix_caching"]:
        hash_fn = v.get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        v.init_none_hash(hash_fn)
        block_hasher = v.get_request_block_hasher(hash_block_size, hash_fn, vllm_config.num_hash_lookahead_tokens)
    return scheduler, block_hasher


def _check_effective_config(vllm_config: Any, config: dict[str, Any]) -> None:
    """VllmConfig may rewrite scheduler settings in __post_init__ (platform hooks, spec
    decode); make sure the scheduler runs with exactly what IN.json asked for."""
    sc = vllm_config.scheduler_config
    effective = {
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_model_len": vllm_config.model_config.max_model_len,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "enable_prefix_caching": bool(vllm_config.cache_config.enable_prefix_caching),
        "async_scheduling": bool(sc.async_scheduling),
        "block_size": vllm_config.cache_config.block_size,
    }
    changed = {k: (config[k], got) for k, got in effective.items() if config[k] != got}
    extra = {
        "max_num_scheduled_tokens": sc.max_num_scheduled_tokens,  # None: = batched tokens
        "max_num_active_seqs": sc.max_num_active_seqs,
        "watermark": sc.watermark,
        "prefill_schedule_interval": sc.prefill_schedule_interval,
        "scheduler_reserve_full_isl": sc.scheduler_reserve_full_isl,
        "policy": sc.policy,
        "speculative_config": vllm_config.speculative_config,
    }
    expected_extra = {
        "max_num_scheduled_tokens": None,
        "max_num_active_seqs": None,
        "watermark": 0.0,
        "prefill_schedule_interval": 1,
        "scheduler_reserve_full_isl": True,
        "policy": "fcfs",
        "speculative_config": None,
    }
    changed.update({k: (expected_extra[k], got) for k, got in extra.items() if got != expected_extra[k]})
    if changed:
        raise RuntimeError(f"vLLM changed the scheduler config (wanted, got): {changed}")


# --------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------


@dataclass
class RequestRecord:
    arrival_s: float
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None


@dataclass
class StepRecord:
    start_s: float
    end_s: float
    num_scheduled_tokens: int
    num_running: int
    num_waiting: int
    num_blocks_in_use: int = -1
    scheduled: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    block_ids: list[tuple[int, list[int]]] | None = None


class Replay:
    """Drive one vLLM scheduler through a workload in simulated time."""

    def __init__(
        self, v: SimpleNamespace, workload: Workload, scheduler: Any, block_hasher: Any, record_block_ids: bool = False
    ) -> None:
        self.v = v
        self.record_block_ids = record_block_ids
        self.workload = workload
        self.config = workload.config
        self.cost = workload.cost
        self.scheduler = scheduler
        self.block_pool = scheduler.kv_cache_manager.block_pool
        self.num_usable_blocks = self.block_pool.num_gpu_blocks - 1  # minus the null block
        self.wall_s = 0.0
        self.clock_s = 0.0  # the clock the fake connector reads (schedule()'s, or the step's end at its output)
        self.connector = scheduler.connector if workload.connector else None
        # vLLM Request objects by input index (kept after vLLM forgets finished ones).
        self.vllm_requests = [self._make_request(spec, block_hasher) for spec in workload.requests]
        self.records = [RequestRecord(spec.arrival_s) for spec in workload.requests]
        self.steps: list[StepRecord] = []
        # Arrival order, ties in input order (sorted() is stable).
        self.pending = deque(sorted(workload.requests, key=lambda r: r.arrival_s))
        self.num_finished = 0
        total_tokens = sum(r.prompt_tokens + r.output_tokens for r in workload.requests)
        # Every step schedules >= 1 token, and preemption only recomputes what it threw
        # away, so this is far above any real run: it only catches a livelock.
        self.max_steps = 50 * total_tokens + 10_000

    # -- requests ------------------------------------------------------------------

    def _make_request(self, spec: RequestSpec, block_hasher: Any) -> Any:
        if spec.prompt_token_ids is not None:
            prompt = spec.prompt_token_ids
        else:
            # Request-unique first token + filler: no block is shared with any request.
            prompt = [UNIQUE_PROMPT_BASE + spec.index] + [
                PROMPT_FILLER_BASE + (j % 1000) for j in range(1, spec.prompt_tokens)
            ]
        sampling_params = self.v.SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True, detokenize=False)
        return self.v.Request(
            request_id=str(spec.index),
            prompt_token_ids=prompt,
            sampling_params=sampling_params,
            pooling_params=None,
            arrival_time=spec.arrival_s,
            block_hasher=block_hasher,
        )

    def _add_arrivals(self, clock: float) -> None:
        while self.pending and self.pending[0].arrival_s <= clock:
            spec = self.pending.popleft()
            self.scheduler.add_request(self.vllm_requests[spec.index])

    def _unfinished(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    # -- one step --------------------------------------------------------------------

    def _schedule(self, clock: float) -> tuple[Any, StepRecord, Any]:
        """Call schedule(); return its output, a step record (times filled in by the
        caller) and the fabricated model output for the step."""
        self.clock_s = clock
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        self.wall_s += time.perf_counter() - t0
        # Decide what the "model" samples now, while is_prefill_chunk describes this
        # step (with async scheduling the request may be scheduled again before this
        # step's output is processed).
        model_output = self._model_output(out)
        num_running, num_waiting = self.scheduler.get_request_counts()
        step = StepRecord(
            start_s=clock,
            end_s=clock,
            num_scheduled_tokens=out.total_num_scheduled_tokens,
            num_running=num_running,
            num_waiting=num_waiting,
            # num_scheduled_tokens is filled in scheduling order: running requests in
            # running-queue order, then newly admitted / resumed ones in admission order.
            scheduled=[(int(rid), n) for rid, n in out.num_scheduled_tokens.items()],
            preempted=sorted(int(rid) for rid in out.preempted_req_ids),
        )
        if self.record_block_ids:
            # Block table of every scheduled request right after schedule().
            manager = self.scheduler.kv_cache_manager
            step.block_ids = [(rid, manager.get_block_ids(str(rid))[0]) for rid, _ in step.scheduled]
        return out, step, model_output

    def _model_output(self, out: Any) -> Any:
        """Fabricate the model runner's output: one sampled token for every scheduled
        request whose chunk reached the end of its known tokens, none for a partial
        prefill chunk.  schedule() has just set ``is_prefill_chunk`` to
        ``num_computed_tokens < num_tokens (+ in-flight placeholders)``, i.e. exactly
        "this chunk stops short of the end"."""
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            request = self.vllm_requests[int(rid)]
            sampled.append([] if request.is_prefill_chunk else [SAMPLED_TOKEN_BASE + int(rid)])
        return self.v.ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def _update(self, out: Any, step: StepRecord, model_output: Any) -> None:
        """Feed the fabricated output back and record emitted tokens and finishes."""
        counts_before = {rid: self.vllm_requests[rid].num_output_tokens for rid, _ in step.scheduled}
        self._transfers_done(model_output, step.end_s)
        t0 = time.perf_counter()
        self.scheduler.update_from_output(out, model_output)
        self.wall_s += time.perf_counter() - t0
        for rid, _ in step.scheduled:
            request = self.vllm_requests[rid]
            record = self.records[rid]
            if record.first_token_s is None and request.num_output_tokens > counts_before[rid]:
                record.first_token_s = step.end_s
            if record.finish_s is None and request.is_finished():
                record.finish_s = step.end_s
                self.num_finished += 1
        step.num_blocks_in_use = self.num_usable_blocks - self.block_pool.get_num_free_blocks()

    def _transfers_done(self, model_output: Any, end_s: float) -> None:
        """The worker's KV connector output of a step ending at end_s: the transfers that ended by then, in the order
        they ended (lists: vLLM iterates them as given); the clock the connector reads moves to end_s."""
        if self.connector is None:
            return
        from vllm.v1.outputs import KVConnectorOutput

        self.clock_s = end_s
        recving, sending = self.connector.finished_by(end_s)
        if recving or sending:
            model_output.kv_connector_output = KVConnectorOutput(finished_sending=sending, finished_recving=recving)

    def _await_transfers(self, out: Any, clock: float) -> float | None:
        """A schedule() that scheduled nothing while transfers are under way: an empty step to the first of the next
        transfer's end and the next arrival (vLLM's engine steps on, polling its connector; kvlab's choice: no
        time), whose output reports what ended. Returns the clock, or None where none is under way."""
        if self.connector is None:
            return None
        if self.connector.next_event_s() == math.inf:
            return None
        end_s = self.connector.next_event_s()
        if self.pending:
            end_s = min(end_s, self.pending[0].arrival_s)
        end_s = max(clock, end_s)
        output = self.v.ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
        self._transfers_done(output, end_s)
        self.scheduler.update_from_output(out, output)
        return end_s

    def _await_transfers_until(self, arrival_s: float) -> None:
        """Idle until arrival_s with blocks held: the transfers that end by then reported (an empty step)."""
        if self.connector.next_event_s() <= arrival_s:
            out = self.scheduler.schedule()
            output = self.v.ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
            self._transfers_done(output, arrival_s)
            self.scheduler.update_from_output(out, output)

    def _admitted_at(self, step: StepRecord, clock: float) -> None:
        """First-scheduled times of the requests a schedule() call at clock scheduled."""
        for rid, _ in step.scheduled:
            record = self.records[rid]
            if record.first_scheduled_s is None:
                record.first_scheduled_s = clock

    def _start_step(self, step: StepRecord, start_s: float) -> None:
        step.start_s = start_s
        step.end_s = (
            start_s + self.cost.duration_s(step.num_scheduled_tokens) if step.num_scheduled_tokens else start_s
        )  # a batch of no tokens takes no time
        self._admitted_at(step, start_s)
        self.steps.append(step)
        if len(self.steps) > self.max_steps:
            raise NoProgressError(f"more than {self.max_steps} steps: livelock?")

    def _no_progress(self, clock: float) -> NoProgressError:
        sched = self.scheduler
        head = sched.waiting.peek_request() if sched.waiting else None
        detail = ""
        if head is not None:
            need = math.ceil(head.num_tokens / self.config["block_size"])
            detail = (
                f"; head of the waiting queue is request {head.request_id} "
                f"({head.num_tokens} tokens = {need} blocks, "
                f"{self.block_pool.get_num_free_blocks()} of "
                f"{self.num_usable_blocks} usable blocks free)"
            )
        return NoProgressError(
            f"no progress possible at t={clock:.6f}s: schedule() scheduled nothing with "
            f"{len(sched.running)} running, {len(sched.waiting)} waiting and "
            f"{len(self.pending)} not yet arrived requests{detail}. vLLM would wait "
            f"forever: the waiting queue is FCFS, and a request whose current length "
            f"needs more blocks than the KV cache has can never be admitted."
        )

    # -- main loops ------------------------------------------------------------------

    def run(self) -> None:
        if self.config["async_scheduling"]:
            self._run_async()
        else:
            self._run_sync()

    def _run_sync(self) -> None:
        """EngineCore.step(): schedule, execute, update_from_output, one step at a time."""
        clock = self.pending[0].arrival_s
        while True:
            self._add_arrivals(clock)
            if self._unfinished() == 0:
                if not self.pending:
                    break
                if self.connector is not None:  # the engine steps on while blocks are held: sends end on the way
                    self.clock_s = clock
                    self._await_transfers_until(self.pending[0].arrival_s)
                clock = self.pending[0].arrival_s  # idle: jump to the next arrival
                continue
            out, step, model_output = self._schedule(clock)
            if out.total_num_scheduled_tokens == 0 and self.connector is not None and out.preempted_req_ids:
                # it preempted (its one request, while others hold blocks): a step of the records, in no time, and
                # the next follows at once
                self._start_step(step, clock)
                self._update(out, step, model_output)
                continue
            if out.total_num_scheduled_tokens == 0:
                waited = self._await_transfers(out, clock)
                if waited is not None:
                    clock = waited
                    continue
                # Nothing runs, and the waiting head cannot be admitted; later arrivals
                # queue behind it (FCFS), so nothing can ever change.
                raise self._no_progress(clock)
            self._start_step(step, clock)
            self._update(out, step, model_output)
            clock = step.end_s

    def _run_async(self) -> None:
        """EngineCore.step_with_batch_queue() with async scheduling (batch queue of 2), in
        simulated time by the rules of the module docstring."""
        clock = self.pending[0].arrival_s
        queue: deque[tuple[Any, StepRecord, Any]] = deque()
        gpu_free_at = clock  # when the device has run every batch queued so far
        num_empty = 0  # schedule() calls in a row that scheduled nothing
        while True:
            self._add_arrivals(clock)
            if self.scheduler.has_requests():
                out, step, model_output = self._schedule(clock)
                tokens = out.total_num_scheduled_tokens
                self._admitted_at(step, clock)
                if tokens > 0 or step.preempted:  # a step of OUT.json
                    self._start_step(step, max(clock, gpu_free_at))
                    gpu_free_at = step.end_s
                else:
                    step.start_s = step.end_s = max(clock, gpu_free_at)
                queue.append((out, step, model_output))
                num_empty = 0 if tokens > 0 else num_empty + 1
                if num_empty >= 2 and self._unfinished() and not any(o.total_num_scheduled_tokens for o, _, _ in queue):
                    if not self.pending:
                        raise self._no_progress(clock)
                    clock = self.pending[0].arrival_s  # nothing changes before it arrives
                    num_empty = 0
                if len(queue) < 2 and (tokens > 0 or self.scheduler.has_requests()):
                    continue  # the queue has room: schedule again right away
            elif not queue:
                if not self.pending:
                    break
                clock = self.pending[0].arrival_s  # idle: jump to the next arrival
                continue
            out, step, model_output = queue.popleft()
            clock = max(clock, step.end_s)  # block until the oldest batch finishes
            self._update(out, step, model_output)

    # -- output ----------------------------------------------------------------------

    def result(self) -> dict[str, Any]:
        requests = []
        for spec, record, request in zip(self.workload.requests, self.records, self.vllm_requests, strict=True):
            requests.append(
                {
                    "request_id": spec.index,
                    "arrival_s": record.arrival_s,
                    "prompt_tokens": spec.prompt_tokens,
                    "output_tokens": spec.output_tokens,
                    "first_scheduled_s": record.first_scheduled_s,
                    "first_token_s": record.first_token_s,
                    "finish_s": record.finish_s,
                    "num_output_tokens": request.num_output_tokens,
                    "num_preemptions": request.num_preemptions,
                    "finish_reason": str(request.get_finished_reason() or ""),
                }
            )
        steps = []
        for s in self.steps:
            step = {
                "start_s": s.start_s,
                "end_s": s.end_s,
                "num_scheduled_tokens": s.num_scheduled_tokens,
                "num_running": s.num_running,
                "num_waiting": s.num_waiting,
                "num_blocks_in_use": s.num_blocks_in_use,
                "scheduled": [list(pair) for pair in s.scheduled],
                "preempted": s.preempted,
            }
            if s.block_ids is not None:
                step["block_ids"] = [[rid, ids] for rid, ids in s.block_ids]
            steps.append(step)
        return {
            "vllm_version": self.v.version,
            "config": self.config,
            "cost": {
                "kind": self.cost.kind,
                "step_ms": self.cost.step_ms,
                "step_ms_per_token": self.cost.step_ms_per_token,
            },
            "num_requests": len(requests),
            "num_steps": len(steps),
            "wall_s_scheduler": self.wall_s,
            "requests": requests,
            "steps": steps,
        }


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def run_workload(doc: dict[str, Any], record_block_ids: bool = False) -> dict[str, Any]:
    """Replay an IN.json document and return the OUT.json document."""
    workload = parse_workload(doc)
    v = _import_vllm()
    with tempfile.TemporaryDirectory(prefix="vllm-parity-model-") as model_dir:
        _write_tiny_model_dir(model_dir, workload.config["max_model_len"])
        if workload.connector:  # the fake NIXL connector (vllm_fake_nixl.py): each request's role and times
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import vllm_fake_nixl

            vllm_fake_nixl.FakeNixlConnector.roles = {
                str(r.index): (r.kv_role, r.kv_load_s, r.kv_hold_s) for r in workload.requests
            }
        scheduler, block_hasher = build_scheduler(v, workload.config, model_dir, workload.connector)
    replay = Replay(v, workload, scheduler, block_hasher, record_block_ids)
    if workload.connector:
        scheduler.connector.clock = replay  # the connector reads the replay's clock_s
    replay.run()
    return replay.result()


def write_result(result: dict[str, Any], f: Any) -> None:
    """JSON with one request / one step per line: readable, diffable and fast to write
    even for hundreds of thousands of steps."""
    f.write("{\n")
    keys = list(result)
    for i, key in enumerate(keys):
        value = result[key]
        end = ",\n" if i < len(keys) - 1 else "\n"
        if isinstance(value, list):
            f.write(f"{json.dumps(key)}: [\n")
            f.write(",\n".join(json.dumps(item, separators=(",", ":")) for item in value))
            f.write(f"\n]{end}")
        else:
            f.write(f"{json.dumps(key)}: {json.dumps(value)}{end}")
    f.write("}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", help="IN.json: config, cost model and requests")
    parser.add_argument("output", help="OUT.json to write")
    parser.add_argument(
        "--block-ids", action="store_true", help="also record each scheduled request's KV block ids per step"
    )
    args = parser.parse_args(argv)
    with open(args.input) as f:
        doc = json.load(f)
    try:
        result = run_workload(doc, record_block_ids=args.block_ids)
    except BadInputError as e:
        print(f"vllm_scheduler.py: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except NoProgressError as e:
        print(f"vllm_scheduler.py: {e}", file=sys.stderr)
        return EXIT_NO_PROGRESS
    with open(args.output, "w") as f:
        write_result(result, f)
    print(
        f"vLLM {result['vllm_version']}: {result['num_requests']} requests, "
        f"{result['num_steps']} steps, scheduler wall {result['wall_s_scheduler']:.3f}s "
        f"-> {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
