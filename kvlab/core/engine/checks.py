"""What the engine refuses, in one line and before any work: vLLM's SchedulerConfig checks, the engine's arguments,
requests vLLM would refuse or that could never fit the pool; and why a run that stalls cannot go on.
"""

from __future__ import annotations

import math

import numpy as np

from kvlab.core import validate
from kvlab.core.block_pool import check_num_gpu_blocks
from kvlab.core.capacity import KVCacheGroup
from kvlab.core.config import EngineConfig, SchedulerConfig
from kvlab.core.engine.reservation import ReservationManager
from kvlab.core.engine.scheduler_v0 import blocks_to_finish, watermark_blocks
from kvlab.core.engine.single_type_kv_cache_manager import admission_caps
from kvlab.core.units import cdiv
from kvlab.core.workload import Workload

# The KV cache groups' kinds the engine serves (capacity.KVCacheGroup.kind).
GROUP_KINDS = {
    "full_attention": "every token's KV, blocks as tokens are computed",
    "sliding_attention": "the last sliding_window tokens' KV; blocks behind the window freed",
    "chunked_local_attention": "the KV of the current attention_chunk_size chunk; blocks of past chunks freed",
    "mamba": "one state a request, in one block of max_model_len tokens (vLLM's mamba_cache_mode 'none')",
}
ALLOCATIONS = {
    "paged": "vLLM: blocks of block_size tokens allocated as tokens are computed; preempts when the pool is empty",
    "max": "reserve max_model_len token slots at admission (Orca Max); never preempts",
    "pow2": "reserve prompt + the next power of two of the output at admission (Orca Pow2); never preempts",
    "oracle": "reserve exactly the final length at admission (Orca Oracle); never preempts",
}
PATHS = {
    "auto": "the compiled loop where it applies and pays (COMPILED_FROM_REQUESTS), else the per-step loop in Python",
    "reference": "the per-step loop in Python, the reference the compiled loop is held to",
    "compiled": "the compiled loop (numba), with runs of steps at once; refused where it does not apply",
}


def check_scheduler_config(scheduler: SchedulerConfig) -> int:
    """The settings vLLM's SchedulerConfig refuses, refused in its words; returns max_model_len (tokens)."""
    max_model_len = scheduler.max_model_len
    if max_model_len is None:
        validate.fail(
            "max_model_len",
            None,
            "the engine needs the longest request in tokens (vLLM takes the model's max_position_embeddings; give it)",
        )
    budget = scheduler.max_num_batched_tokens
    if budget < max_model_len and not scheduler.enable_chunked_prefill:
        validate.fail(
            "max_num_batched_tokens",
            budget,
            f"is smaller than max_model_len ({max_model_len:,}) with "
            "chunked prefill off, which vLLM refuses: a longer prompt could never be scheduled; raise "
            "max_num_batched_tokens, lower max_model_len or turn chunked prefill on",
        )
    if budget < scheduler.max_num_seqs:
        validate.fail(
            "max_num_batched_tokens", budget, f"must be >= max_num_seqs ({scheduler.max_num_seqs:,}), as vLLM requires"
        )
    if scheduler.long_prefill_token_threshold > max_model_len:
        validate.fail(
            "long_prefill_token_threshold",
            scheduler.long_prefill_token_threshold,
            f"cannot be greater than max_model_len ({max_model_len:,}), as vLLM requires",
        )
    return max_model_len


class NoProgressError(RuntimeError):
    """The workload cannot finish: vLLM would wait forever (its message says why)."""


def check_kv_cache_groups(groups, config: EngineConfig, allocation: str, path: str, recorder) -> tuple | None:
    """The engine's KV cache groups (capacity.KVCacheGroup, in vLLM's order), or None for one full-attention group of
    block_size tokens (KVCacheManager): refused in one line where the engine does not serve them yet."""
    if groups is None:
        return None
    groups = tuple(groups)
    if not groups or not all(isinstance(g, KVCacheGroup) for g in groups):
        validate.fail("kv_cache_groups", groups, "must be a non-empty sequence of kvlab.core.capacity.KVCacheGroup")
    max_model_len = config.scheduler.max_model_len
    for i, g in enumerate(groups):
        validate.one_of(f"kv_cache_groups[{i}].kind", g.kind, GROUP_KINDS)
        validate.in_range(f"kv_cache_groups[{i}].block_size", g.block_size, "count")
        if (g.kind == "sliding_attention") != (g.sliding_window > 0):
            validate.fail(f"kv_cache_groups[{i}].sliding_window", g.sliding_window, f"must be > 0 exactly for {g.kind}")
        if (g.kind == "chunked_local_attention") != (g.attention_chunk_size > 0):
            validate.fail(
                f"kv_cache_groups[{i}].attention_chunk_size",
                g.attention_chunk_size,
                f"must be > 0 exactly for {g.kind}",
            )
        if g.num_prefill_checkpoint_blocks not in (0, 1) or (g.num_prefill_checkpoint_blocks and g.kind != "mamba"):
            validate.fail(
                f"kv_cache_groups[{i}].num_prefill_checkpoint_blocks",
                g.num_prefill_checkpoint_blocks,
                "must be 0, or 1 for Mamba layers (vLLM's in-kernel prefill checkpoint: one block a request)",
            )
        if g.prefill_checkpoint_alignment < 0 or (
            g.prefill_checkpoint_alignment and not g.num_prefill_checkpoint_blocks
        ):
            validate.fail(
                f"kv_cache_groups[{i}].prefill_checkpoint_alignment",
                g.prefill_checkpoint_alignment,
                "must be 0, or > 0 for Mamba layers with prefill checkpoint blocks",
            )
        if g.kind == "mamba" and not config.cache.enable_prefix_caching and g.block_size != max_model_len:
            validate.fail(
                f"kv_cache_groups[{i}].block_size",
                g.block_size,
                f"must be max_model_len={max_model_len} for Mamba layers without prefix caching (vLLM's "
                "mamba_cache_mode 'none': one block a request)",
            )
        if (
            g.kind == "mamba"
            and config.cache.enable_prefix_caching
            and {h.block_size for h in groups} != {g.block_size}
        ):
            validate.fail(
                f"kv_cache_groups[{i}].block_size",
                g.block_size,
                "must be every group's block size for Mamba layers with prefix caching (vLLM's mamba_cache_mode "
                "'align' sets mamba_block_size to the attention block size)",
            )
    common = math.lcm(*(g.block_size for g in groups))
    for i, g in enumerate(groups):
        if g.kind == "chunked_local_attention" and g.block_size != common:
            validate.fail(
                f"kv_cache_groups[{i}].block_size",
                g.block_size,
                f"must be {common}, every group's common block size, for chunked local attention (vLLM's rule)",
            )
    if len(groups) == 1 and groups[0].kind == "full_attention":
        if groups[0].block_size != config.cache.block_size:
            validate.fail(
                "kv_cache_groups",
                f"one full-attention group of {groups[0].block_size} tokens a block",
                f"must have block_size={config.cache.block_size}, the config's",
            )
        return None
    refusals = (
        (allocation != "paged", "allocation", allocation, "paged"),
        (config.scheduler.scheduler_cls != "v1", "scheduler_cls", config.scheduler.scheduler_cls, "v1"),
        (
            path == "compiled" and config.cache.enable_prefix_caching,
            "path",
            path,
            "'auto' or 'reference' with prefix caching (the compiled loop serves them without)",
        ),
        (recorder is not None and recorder.block_ids is not None, "Recorder(block_ids=True)", True, "False"),
        (recorder is not None and recorder.freed_tables is not None, "Recorder(frees=True)", True, "False"),
    )
    for refused, name, value, allowed in refusals:
        if refused:
            validate.fail(name, value, f"must be {allowed} with a hybrid model's KV cache groups")
    return groups


def check_engine(
    workload: Workload,
    config: EngineConfig,
    num_gpu_blocks: int,
    allocation: str,
    path: str,
    prompt_token_ids,
    check: bool,
    groups=None,
) -> tuple[int, int]:
    """The Engine's arguments, each checked once (the requests too where check; groups already checked:
    check_kv_cache_groups); (num_gpu_blocks, max_model_len)."""
    if not isinstance(workload, Workload):
        validate.fail("workload", type(workload).__name__, "must be a kvlab.core.workload.Workload")
    validate.one_of("allocation", allocation, ALLOCATIONS)
    validate.one_of("path", path, PATHS)
    num_gpu_blocks = check_num_gpu_blocks(num_gpu_blocks)
    if config.cache.enable_prefix_caching and allocation != "paged":
        validate.fail("enable_prefix_caching", True, f"applies only to paged allocation, not allocation={allocation}")
    if prompt_token_ids is not None and len(prompt_token_ids) != workload.num_requests:
        validate.fail(
            "prompt_token_ids",
            f"{len(prompt_token_ids)} entries",
            f"must have one per request ({workload.num_requests})",
        )
    max_model_len = check_scheduler_config(config.scheduler)
    if check:
        check_requests(workload, config, num_gpu_blocks, allocation, max_model_len, groups)
    return num_gpu_blocks, max_model_len


def check_kv_transfers(kv_transfers, workload: Workload, config: EngineConfig, allocation: str, groups):
    """The engine's kv_transfers (kv_connector.KVTransfers), or None: one entry per request, roles NONE, PRODUCER or
    CONSUMER, finite times >= 0; a connector runs vLLM's synchronous v1 scheduler over paged blocks of one
    full-attention group (what kvlab models of it)."""
    if kv_transfers is None:
        return None
    from kvlab.core.engine.kv_connector import CONSUMER, KVTransfers

    if not isinstance(kv_transfers, KVTransfers):
        validate.fail(
            "kv_transfers", type(kv_transfers).__name__, "must be a kvlab.core.engine.kv_connector.KVTransfers"
        )
    n = workload.num_requests
    names = ("role", "load_s", "hold_s") + (() if kv_transfers.read_end_s is None else ("read_end_s",))
    for name in names:
        values = np.asarray(getattr(kv_transfers, name))
        if values.shape != (n,):
            validate.fail(f"kv_transfers.{name}", f"{values.size} entries", f"must have one per request ({n})")
        if name == "role" and not np.isin(values, (0, 1, CONSUMER)).all():
            validate.fail("kv_transfers.role", values[~np.isin(values, (0, 1, CONSUMER))][0], "must be 0, 1 or 2")
        known = ~np.isnan(values) if name == "read_end_s" else np.ones(n, dtype=bool)  # (NaN: a fleet's, unknown)
        if name != "role" and not (np.isfinite(values[known]).all() and (values[known] >= 0).all()):
            bad = values[known][~(np.isfinite(values[known]) & (values[known] >= 0))][0]
            validate.fail(f"kv_transfers.{name}", float(bad), "must be finite seconds >= 0")
    if config.scheduler.async_scheduling:
        validate.fail("async_scheduling", True, "is not modelled with a KV connector yet: set async_scheduling=False")
    if config.scheduler.scheduler_cls != "v1" or allocation != "paged" or groups is not None:
        validate.fail(
            "kv_transfers",
            "given",
            "applies to the v1 scheduler over paged blocks of one full-attention group (kvlab's model of vLLM's KV "
            "connector)",
        )
    return kv_transfers


def check_workload(workload: Workload, config: EngineConfig, num_gpu_blocks: int, allocation: str = "paged") -> None:
    """Refuse, in one line and before any work, settings vLLM would refuse, a pool without a usable block, and a
    request vLLM would refuse or that can never fit the pool."""
    check_requests(
        workload, config, check_num_gpu_blocks(num_gpu_blocks), allocation, check_scheduler_config(config.scheduler)
    )


def check_requests(
    workload: Workload, config: EngineConfig, num_gpu_blocks: int, allocation: str, max_model_len: int, groups=None
) -> None:
    """check_workload's requests, of settings already checked (the engine checks each thing once; groups: the KV
    cache groups of check_kv_cache_groups)."""
    v0 = config.scheduler.scheduler_cls == "v0-2023"
    bs = config.cache.block_size
    prompt, output = workload.prompt_tokens, workload.output_tokens
    if prompt.min() < 1:
        i = int(np.argmin(prompt))
        validate.fail(f"prompt_tokens[{i}]", int(prompt[i]), "must be >= 1: vLLM needs a prompt of at least one token")
    if prompt.max() >= max_model_len:
        i = int(np.argmax(prompt))
        validate.fail(
            f"prompt_tokens[{i}]",
            int(prompt[i]),
            f"must be shorter than max_model_len={max_model_len:,} "
            "tokens (vLLM rejects a prompt of max_model_len tokens or more)",
        )
    final = np.minimum(prompt + output, max_model_len + v0)  # vLLM 0.1.4 stops one token later
    if allocation == "paged":
        usable = num_gpu_blocks - 1
        if v0:
            need = blocks_to_finish(prompt, final, bs, watermark_blocks(num_gpu_blocks))
            why = (
                f" with scheduler_cls='v0-2023' (one block free to decode, {watermark_blocks(num_gpu_blocks)} "
                "watermark blocks to be admitted again)"
            )
        elif groups is not None:  # admitted again at its longest: every group's blocks, a window's capped
            need, why = 0, f" in its {len(groups)} KV cache groups (windows and chunks capped)"
            caps = admission_caps(
                groups, max_model_len, config.max_in_flight_tokens, config.cache.enable_prefix_caching
            )
            for g, cap in zip(groups, caps):
                blocks = cdiv(final - 1, g.block_size)
                need = need + (np.minimum(blocks, cap) if cap else blocks)
            bs = min(g.block_size for g in groups)
        else:
            need, why = cdiv(final - 1, bs), ""  # a request computes every token but its last sampled one
        if need.max() > usable:
            i = int(np.argmax(need))
            validate.fail(
                f"request {i}",
                f"{int(prompt[i]):,} prompt + {int(output[i]):,} output tokens",
                f"needs {int(need[i]):,} blocks of {bs} tokens at its longest ({int(final[i]) - 1:,} tokens)"
                f"{why} but the pool has {usable:,} usable blocks (num_gpu_blocks={num_gpu_blocks:,} counts "
                "vLLM's null block): it could never finish",
            )
    else:
        manager = ReservationManager(allocation, num_gpu_blocks, bs, max_model_len)
        largest = manager.buddy.largest_free_chunk
        where = (
            f"the pool holds {manager.num_tokens_total:,} ((num_gpu_blocks - 1) x block_size) in buddy arenas of "
            f"at most {largest:,}"
        )
        if allocation == "max" and max_model_len > largest:
            validate.fail(
                "allocation",
                "max",
                f"reserves max_model_len={max_model_len:,} token slots a request but {where}: no request could start",
            )
        reservations = manager.reservation_tokens_of(prompt, final)
        i = int(np.argmax(reservations))
        if reservations[i] > largest:
            validate.fail(
                f"request {i}",
                f"{int(prompt[i]):,} prompt + {int(output[i]):,} output tokens",
                f"reserves {int(reservations[i]):,} token slots with allocation={allocation} but {where}: "
                "it could never start",
            )


def no_progress_message(engine) -> str:
    """Why nothing can be scheduled: the waiting queue's head can never be admitted (vLLM would wait forever)."""
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    head = scheduler.waiting[0] if scheduler.waiting else None
    detail = ""
    if head is not None:
        if engine.allocation == "paged":
            detail = (
                f"; the head of the waiting queue, request {head.request_id}, has {head.num_tokens:,} tokens = "
                f"{kv.num_blocks_to_admit(head.num_tokens):,} blocks and {kv.num_free_blocks:,} of "
                f"{engine.num_gpu_blocks - 1:,} usable blocks are free"
            )
        else:
            detail = (
                f"; the head of the waiting queue, request {head.request_id}, reserves "
                f"{kv.reservation_tokens(head):,} token slots and {kv.num_free_tokens:,} are free, in chunks "
                f"of at most {kv.buddy.largest_free_chunk:,}"
            )
    return (
        f"no progress possible at t={engine.now_s:.6f} s: a step scheduled nothing with {len(scheduler.running)} "
        f"running, {len(scheduler.waiting)} waiting and {len(engine.arrival_s) - engine.next_arrival} not yet "
        f"arrived requests{detail}; vLLM would wait forever (first come, first served)"
    )
