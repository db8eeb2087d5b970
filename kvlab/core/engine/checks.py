"""What the engine refuses, in one line and before any work: vLLM's SchedulerConfig checks, the engine's arguments,
requests vLLM would refuse or that could never fit the pool; and why a run that stalls cannot go on.
"""

from __future__ import annotations

import numpy as np

from kvlab.core import validate
from kvlab.core.block_pool import check_num_gpu_blocks
from kvlab.core.config import EngineConfig, SchedulerConfig
from kvlab.core.engine.reservation import ReservationManager
from kvlab.core.engine.scheduler_v0 import blocks_to_finish, watermark_blocks
from kvlab.core.units import cdiv
from kvlab.core.workload import Workload

ALLOCATIONS = {
    "paged": "vLLM: blocks of block_size tokens allocated as tokens are computed; preempts when the pool is empty",
    "max": "reserve max_model_len token slots at admission (Orca Max); never preempts",
    "pow2": "reserve prompt + the next power of two of the output at admission (Orca Pow2); never preempts",
    "oracle": "reserve exactly the final length at admission (Orca Oracle); never preempts",
}
PATHS = {
    "auto": "decode runs at once, and the compiled loop where it applies and pays (COMPILED_FROM_REQUESTS)",
    "reference": "the plain per-step loop, the reference every fast path is held to",
    "python": "decode runs at once, never the compiled loop",
    "compiled": "the compiled loop (numba); refused where it does not apply",
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


def check_engine(
    workload: Workload,
    config: EngineConfig,
    num_gpu_blocks: int,
    allocation: str,
    path: str,
    prompt_token_ids,
    check: bool,
) -> tuple[int, int]:
    """The Engine's arguments, each checked once (the requests too where check); (num_gpu_blocks, max_model_len)."""
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
        check_requests(workload, config, num_gpu_blocks, allocation, max_model_len)
    return num_gpu_blocks, max_model_len


def check_workload(workload: Workload, config: EngineConfig, num_gpu_blocks: int, allocation: str = "paged") -> None:
    """Refuse, in one line and before any work, settings vLLM would refuse, a pool without a usable block, and a
    request vLLM would refuse or that can never fit the pool."""
    check_requests(
        workload, config, check_num_gpu_blocks(num_gpu_blocks), allocation, check_scheduler_config(config.scheduler)
    )


def check_requests(
    workload: Workload, config: EngineConfig, num_gpu_blocks: int, allocation: str, max_model_len: int
) -> None:
    """check_workload's requests, of settings already checked (the engine checks each thing once)."""
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
                f"{cdiv(head.num_tokens, engine.block_size):,} blocks and {kv.num_free_blocks:,} of "
                f"{engine.num_gpu_blocks - 1:,} usable blocks are free"
            )
        else:
            detail = (
                f"; the head of the waiting queue, request {head.request_id}, reserves "
                f"{kv.reservation_tokens(head):,} token slots and {kv.num_free_tokens:,} are free, in chunks "
                f"of at most {kv.buddy.largest_free_chunk:,}"
            )
    return (
        f"no progress possible at t={engine.clock:.6f} s: a step scheduled nothing with {len(scheduler.running)} "
        f"running, {len(scheduler.waiting)} waiting and {len(engine.arrival_s) - engine.next_arrival} not yet "
        f"arrived requests{detail}; vLLM would wait forever (first come, first served)"
    )
