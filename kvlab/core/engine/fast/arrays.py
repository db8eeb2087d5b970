"""The named arrays the compiled loop works on (fast/loops/): limits, the block pool, a request's state.

Named tuples, so that numba reads a field by name (pool.ref[b], limits.block_size) and Python builds them without
numba (fast/compiled.py).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

# Per request, indexed by request id, under Request's names (kvlab/core/engine/request.py): its arrival_s,
# num_prompt_tokens, max_num_tokens (where it stops), max_tokens_total (prompt + max_tokens, for the async early stop),
# and its state as the loop moves it (num_tokens, num_computed_tokens, num_blocks: its block table's length,
# num_cached_blocks: those cached (SingleTypeKVCacheManager.num_cached_block), status, num_preemptions, and,
# asynchronous only, num_output_placeholders, num_in_flight_tokens, num_stale_tokens), then its recorded times (s; NaN
# until set).
# records: one record per request of Request's fields that its transitions move (request.update_after_schedule,
# preempt_request, update_request_with_output, which the loops call on records[r]); the columns of the same names are
# views of them (status: jit's WAITING, RUNNING, PREEMPTED, FINISHED).
# A closed loop (vLLM bench's --max-concurrency; kvlab.core.engine.closed_loop): arrival_s holds the send times, inf
# until a finish frees the slot (loops.scheduler.finished_at), open_loop the open-loop arrivals and closed_loop [N, finishes so
# far]; an open loop: both empty.
Requests = namedtuple(
    "Requests",
    [
        "arrival_s",
        "num_prompt_tokens",
        "max_num_tokens",
        "max_tokens_total",
        "num_tokens",
        "num_computed_tokens",
        "num_blocks",
        "num_cached_blocks",
        "status",
        "num_preemptions",
        "num_output_placeholders",
        "num_in_flight_tokens",
        "num_stale_tokens",
        "first_scheduled_s",
        "first_token_s",
        "finish_s",
        "open_loop",
        "closed_loop",
        "records",
    ],
)
REQUEST_RECORD = np.dtype(
    [
        (name, np.int64)
        for name in (
            "request_id",
            "num_prompt_tokens",
            "max_tokens",
            "max_num_tokens",
            "num_tokens",
            "num_computed_tokens",
            "status",
            "num_preemptions",
            "num_output_placeholders",
            "num_in_flight_tokens",
            "num_stale_tokens",
            "shared_prefix_boundary",
        )
    ]
)

# The engine's settings, integers (a bool as 0 or 1; async_scheduling a bool, as the shared functions pass it on),
# under the reference Scheduler's names where it has them (the shared schedule() and update_from_output() read them; no
# Mamba groups compiled: mamba_block_size and mamba_checkpoint_alignment 0).
Limits = namedtuple(
    "Limits",
    [
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "enable_chunked_prefill",
        "long_prefill_token_threshold",
        "num_usable_blocks",
        "enable_caching",
        "decode_runs",
        "mamba_block_size",
        "max_prefill_tokens",
        "mamba_checkpoint_alignment",
        "async_scheduling",
    ],
)

# The KV-cache manager as the shared schedule() reads it compiled (loops/scheduler.py binds its calls): its
# block_size, enable_caching, noop_decodes (one full-attention group: a decode inside its last block allocates
# nothing), max_model_len, the Pool (with prefix caching), the Groups (a hybrid model's) and num_free[0], the free blocks.
KVCache = namedtuple(
    "KVCache", ["block_size", "enable_caching", "noop_decodes", "max_model_len", "pool", "groups", "num_free"]
)

# The batch the shared schedule() fills compiled (SchedulerOutput's place): per scheduled request its id, tokens and
# whether it samples; acc, the Batch's fields beyond its tokens (context, decodes, decode_context, prefills, pairs,
# low, high); time_s, the clock its side stamps: schedule()'s (an admitted request's first_scheduled_s), then for
# update_from_output the batch's end (first-token and finish times).
BatchOut = namedtuple("BatchOut", ["req_ids", "num_new_tokens", "samples", "acc", "time_s"])

# BlockPool (kvlab/core/block_pool.py) with block identities, as the prefix cache needs them (only with prefix
# caching; otherwise the pool is a count of free blocks and these are placeholders). First the fields that
# block_pool's queue functions read, named and laid out as BlockPool's: enable_caching; stack and free_state (the
# free queue's head part and its counts), tail_next and tail_prev (its tail part); per block ref, hash_of, hash_next
# and hash_prev; per hash id hash_ends (first and last). Then the loop's own: per running slot tables (a block-table
# row); per request slot_of (its slot, -1 none); free_slots (num_free_slots[0] of them); hash_offset, hash_shared,
# num_shared, hash_base (a request's hash ids, loops.pool.hash_id); hits and hash_ids (scratch rows); num_free_blocks[0],
# the free blocks while the shared schedule() runs (arrays.KVCache.num_free), with or without prefix caching.
Pool = namedtuple(
    "Pool",
    [
        "enable_caching",
        "stack",
        "free_state",
        "tail_next",
        "tail_prev",
        "ref",
        "hash_of",
        "hash_next",
        "hash_prev",
        "hash_ends",
        "tables",
        "slot_of",
        "free_slots",
        "num_free_slots",
        "hash_offset",
        "hash_shared",
        "num_shared",
        "hash_base",
        "hits",
        "hash_ids",
        "num_free_blocks",
    ],
)

# vLLM 0.1.4's scheduler in the compiled loop (fast/loops/v0.py): paged (1: its watermark_blocks; the pool is a count of
# free blocks) or a reservation pool of num_slots token slots in buddy arenas (0; kvlab.core.buddy): each arena's
# offset and order (largest first), per slot the order of the free chunk that starts there (-1: none), per order the
# free chunks, per request the slots it asks for (ReservationManager.reservation_tokens) and its chunk's offset, and
# counters [free slots, the buddy's rounding slots, final tokens of the chunks' holders].
Reservations = namedtuple(
    "Reservations",
    [
        "paged",
        "watermark_blocks",
        "num_slots",
        "arena_start",
        "arena_order",
        "free_at",
        "num_free_chunks",
        "reserve",
        "chunk_offset",
        "counters",
    ],
)

# The KV-cache manager as vLLM 0.1.4's shared schedule() reads it compiled (loops/v0.py binds its calls): KVCache's
# fields that the v1 bindings it shares read, and the Reservations.
V0Cache = namedtuple("V0Cache", ["block_size", "enable_caching", "max_model_len", "pool", "groups", "num_free", "orca"])

# A hybrid model's KV cache groups without prefix caching (capacity.KVCacheGroup; KVCacheManager over a manager per group), as the
# compiled loop reads them: per group its block_size, sliding window, attention chunk and admission cap (0: none; a
# Mamba group's block of max_model_len tokens is a full group's), and per request and group its table's length
# (blocks) and leading nulls (the blocks a window or chunk gave back), kept for the first group of each spec only (the
# others' are the same); freed[0]: the blocks windows and chunks gave back in all. No groups (every array empty): one
# full-attention group, Requests.num_blocks. Per group its weight (the groups of its spec if it is the first of them,
# else 0) and, for decode runs (loops.groups.group_phases), its place in hist (per phase, the requests that take a block, then those that give one back), all zeros between runs;
# events, a run's windows that start to give blocks back (step, place in hist, weight); free_at, an asynchronous
# run's free blocks after each batch.
Groups = namedtuple(
    "Groups",
    [
        "block_size",
        "window",
        "chunk",
        "cap",
        "blocks",
        "nulls",
        "freed",
        "weight",
        "offset",
        "hist",
        "events",
        "free_at",
    ],
)

# The loop's state (engine_core.run_sync's and run_async's loop, the Python Engine's attributes of the same names where it
# has them), one record kept between chunks: the clock (now_s), the next request to arrive, the free blocks, the running
# list's length, the waiting ring's head and length, the running requests' computed tokens, the steps recorded before
# the chunk, the decode runs done at once, the end of the last step recorded; asynchronous:
# the batch queue's head and length, schedule() calls in a row that scheduled nothing, whether a request finished since
# the last schedule() (vLLM's has_requests) and when the GPU has run every batch queued; until_s: the loop pauses
# once the clock reaches it (inf; a fleet's instance: the next request still to be routed, kvlab.core.fleet).
LOOP_STATE = np.dtype(
    [
        (name, np.float64 if name.endswith("_s") else np.int64)
        for name in (
            "now_s",
            "next_arrival",
            "num_free_blocks",
            "num_running",
            "waiting_head",
            "num_waiting",
            "num_kv_tokens",
            "num_steps",
            "num_decode_runs",
            "last_end_s",
            "queue_head",
            "queue_len",
            "num_empty",
            "has_finished",
            "gpu_free_s",
            "until_s",
        )
    ]
)

# The compiled engine, as the shared loops (engine_core.run_sync, run_async) and their bindings read it: the requests, limits,
# step cost, pool and groups; the running list and the waiting ring; the batch queue (two batches: per scheduled
# request its id, tokens and whether it samples; queue_i[slot]: requests, tokens, running, waiting, preemptions, prompt
# tokens hit, whether a decode run may start from it; queue_f[slot]: its start and end, s; the synchronous loops use
# slot 0), acc (a batch's fields beyond its tokens), a decode run's scratch (phases, per_phase, times); the chunk's
# step records (logs, events, counts: scheduler.record), a reservation pool's Fig. 2 counts (split) and vLLM 0.1.4's
# pool (orca: Reservations).
Arrays = namedtuple(
    "Arrays",
    [
        "req",
        "cfg",
        "cost",
        "pool",
        "groups",
        "running",
        "waiting",
        "queue_r",
        "queue_n",
        "queue_sample",
        "queue_i",
        "queue_f",
        "acc",
        "phases",
        "per_phase",
        "times",
        "logs",
        "events",
        "counts",
        "split",
        "orca",
    ],
)
