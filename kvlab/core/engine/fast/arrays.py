"""The named arrays the compiled loop works on (fast/_kernels.py): limits, the block pool, a request's state.

Named tuples, so that numba reads a field by name (pool.ref[b], limits.block_size) and Python builds them without
numba (fast/compiled.py).
"""

from __future__ import annotations

from collections import namedtuple

# Per request, indexed by request id: its arrival (s), prompt tokens, max_num_tokens (where it stops),
# max_tokens_total (prompt + max_tokens, for the async early stop), and its state as the loop moves it (Request's
# num_tokens, num_computed_tokens, block-table length, prefix-cached blocks, status, preemptions, and, asynchronous
# only, num_output_placeholders, num_in_flight_tokens, num_stale_tokens), then its recorded times (s; NaN until set).
Requests = namedtuple(
    "Requests",
    [
        "arrival",
        "prompt",
        "max_num_tokens",
        "max_tokens_total",
        "num_tokens",
        "computed",
        "num_blocks",
        "num_cached",
        "status",
        "num_preemptions",
        "placeholders",
        "in_flight",
        "stale",
        "first_scheduled_s",
        "first_token_s",
        "finish_s",
    ],
)

# The engine's settings, integers (a bool as 0 or 1).
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
        "constant_step_cost",
        "enable_caching",
        "decode_runs",
    ],
)

# BlockPool (kvlab/core/block_pool.py) with block identities, as the prefix cache needs them (only with prefix
# caching; otherwise the pool is a count of free blocks and these are placeholders). Per block: ref (reference
# count), hash_of (its hash id or -1), tail_next and tail_prev (the free queue's hashed tail part, a linked list in
# insertion order), hash_next and hash_prev (the blocks cached under one hash id, first inserted first). stack: the
# free queue's unhashed head part (its top is the queue's head). Per hash id: hash_first, hash_last. pstate: stack
# size, tail head, tail end, tail size, free slots (P_* below). Per running slot: tables (a block-table row); per
# request: slot_of (its slot, -1 none); free_slots (pstate[P_SLOTS] of them). hash_offset, hash_shared, num_shared,
# hash_base: a request's hash ids (_kernels.hash_id). hits, unhashed: scratch rows.
Pool = namedtuple(
    "Pool",
    [
        "ref",
        "hash_of",
        "stack",
        "tail_next",
        "tail_prev",
        "hash_first",
        "hash_last",
        "hash_next",
        "hash_prev",
        "pstate",
        "tables",
        "slot_of",
        "free_slots",
        "hash_offset",
        "hash_shared",
        "num_shared",
        "hash_base",
        "hits",
        "unhashed",
    ],
)
P_STACK, P_TAIL_HEAD, P_TAIL_END, P_TAIL_SIZE, P_SLOTS = 0, 1, 2, 3, 4

# The loop's integer state between chunks (state[S_*]) and its float state (fstate[F_*]).
(
    S_NEXT_ARRIVAL,
    S_FREE,
    S_NUM_RUNNING,
    S_WAITING_HEAD,
    S_NUM_WAITING,
    S_KV_TOKENS,
    S_STEPS,
    S_QUEUE_HEAD,
    S_QUEUE_LEN,
    S_NUM_EMPTY,
    S_HAS_FINISHED,
    S_RUNS,
) = range(12)
F_CLOCK, F_LAST_END, F_GPU_FREE = range(3)
# How a chunk of the loop ended: every request finished, the chunk's step records are full, or a step scheduled
# nothing (the Python engine then says why).
DONE, FULL, NO_PROGRESS = 0, 1, 2
