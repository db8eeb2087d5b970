"""vLLM 0.33's scheduling rules, each written once, as functions of integers.

The reference scheduler (scheduler.py, async_scheduler.py), the KV-cache manager and the compiled loops (fast/,
their runs of steps at once included) all call these functions; numba compiles every function of this module for the compiled
loops (fast/loops/), so a rule has one home. Each docstring names the vLLM file and function it follows
(paths under vllm/v1/core/). Tokens and blocks are counts; block_size is tokens a block.
"""

from __future__ import annotations

NEVER_REACHED_TOKENS = 1 << 62  # a token count no request reaches
NEVER_ENOUGH_BLOCKS = 1 << 62  # a block count no pool has: what a request that cannot be admitted yet needs


def step_token_cap(long_prefill_token_threshold: int, num_running: int, num_waiting: int) -> int:
    """The step's cap on one request's new tokens (0: none): long_prefill_token_threshold when more than one
    request runs or waits (sched/scheduler.py, Scheduler.schedule; long_prefill_token_threshold_adaptive is off by
    default, and kvlab leaves it out)."""
    return long_prefill_token_threshold if num_running + num_waiting > 1 else 0


def running_num_new_tokens(
    num_tokens: int,
    num_output_placeholders: int,
    num_computed_tokens: int,
    max_tokens_total: int,
    token_cap: int,
    token_budget: int,
    max_model_len: int,
) -> int:
    """Tokens the running loop schedules for a running request, or 0 to pass over it (sched/scheduler.py,
    Scheduler.schedule, the running loop): its known tokens (placeholders included) not yet computed, at most
    token_cap and the budget left. Asynchronous only (placeholders > 0, added by AsyncScheduler): the early stop
    passes over a request whose batch in flight samples its last token (max_tokens_total = prompt + max_tokens),
    and a request's tokens stop one short of max_model_len."""
    p, c = num_output_placeholders, num_computed_tokens
    if p and c + 2 - p >= max_tokens_total:
        return 0
    n = num_tokens + p - c
    if 0 < token_cap < n:
        n = token_cap
    if n > token_budget:
        n = token_budget
    if p and n > max_model_len - c - 1:
        n = max_model_len - c - 1
        if n < 0:
            n = 0
    return n


def allocation_is_noop(
    num_new_tokens: int, num_computed_tokens: int, num_tokens: int, block_size: int, enable_caching: bool
) -> bool:
    """Whether allocate_slots would change nothing: one new token inside the last block that does not fill a
    block (with prefix caching, a token that completes a block caches it). kvlab's shortcut, not a vLLM rule."""
    return (
        num_new_tokens == 1
        and num_computed_tokens % block_size != 0
        and not (enable_caching and min(num_computed_tokens + 1, num_tokens) % block_size == 0)
    )


def num_blocks_to_allocate(
    num_computed_tokens: int, num_new_tokens: int, num_table_blocks: int, block_size: int, max_model_len: int
) -> int:
    """New blocks a request needs to hold its computed tokens plus num_new_tokens, at most max_model_len, beyond
    the num_table_blocks it holds (<= 0: none; single_type_kv_cache_manager.py, get_num_blocks_to_allocate)."""
    num_slots = num_computed_tokens + num_new_tokens
    if num_slots > max_model_len:
        num_slots = max_model_len
    return (num_slots + block_size - 1) // block_size - num_table_blocks


def num_skipped_tokens(num_tokens: int, sliding_window: int, attention_chunk_size: int = 0) -> int:
    """Leading tokens no later token attends to, whose blocks a group frees (0 for full attention, both sizes 0): all
    but the last sliding_window - 1 before token num_tokens (single_type_kv_cache_manager.py,
    SlidingWindowManager.get_num_skipped_tokens; no tokens retained for speculative decoding), or every token before
    the attention chunk of token num_tokens (ChunkedLocalAttentionManager.get_num_skipped_tokens)."""
    if attention_chunk_size:
        return num_tokens // attention_chunk_size * attention_chunk_size
    if sliding_window == 0:
        return 0
    n = num_tokens - sliding_window + 1
    return n if n > 0 else 0


def admission_blocks(num_tokens: int, block_size: int, max_admission_blocks: int) -> int:
    """Blocks one group needs to admit a request of num_tokens (no prefix hit): its whole length, at most a sliding
    window's max_admission_blocks (0: no cap; single_type_kv_cache_manager.py, get_num_blocks_to_allocate with
    apply_admission_cap; kv_cache_interface.py, SlidingWindowSpec.max_admission_blocks_per_request)."""
    n = (num_tokens + block_size - 1) // block_size
    return n if max_admission_blocks == 0 or n < max_admission_blocks else max_admission_blocks


def hit_num_new_blocks(
    num_tokens: int, block_size: int, max_admission_blocks: int, num_skipped_blocks: int, num_hit_blocks: int
) -> int:
    """New blocks one group takes to admit a request of num_tokens whose prefix hit gave it num_hit_blocks table
    entries, the first num_skipped_blocks of them behind its window (single_type_kv_cache_manager.py,
    get_num_blocks_to_allocate for a request not yet running; max_admission_blocks 0: no cap)."""
    n = admission_blocks(num_tokens, block_size, max_admission_blocks)
    n -= num_skipped_blocks if num_skipped_blocks > num_hit_blocks else num_hit_blocks
    return n if n > 0 else 0


def window_hit_blocks(sliding_window: int, block_size: int) -> int:
    """Cached blocks a sliding window's prefix hit must find in a row before its end: those the next token attends
    to (single_type_kv_cache_manager.py, SlidingWindowManager._contiguous_blocks_for_hit)."""
    return (sliding_window - 1 + block_size - 1) // block_size


def num_lookup_blocks(num_tokens: int, block_size: int) -> int:
    """Leading full blocks looked up in the prefix cache: all but a fully cached request's last token, which it
    computes to sample (kv_cache_manager.py, KVCacheManager.get_computed_blocks: max_cache_hit_length)."""
    return (num_tokens - 1) // block_size


def admission_num_new_tokens(
    num_tokens: int, num_hit_tokens: int, token_cap: int, token_budget: int, enable_chunked_prefill: bool
) -> int:
    """Tokens the waiting loop schedules for the waiting queue's head, or 0: refused, the scan stops
    (sched/scheduler.py, Scheduler.schedule, the waiting loop): its tokens past the prefix-cache hit, at most
    token_cap; with chunked prefill off they must fit the budget left, else they are cut to it."""
    n = num_tokens - num_hit_tokens
    if 0 < token_cap < n:
        n = token_cap
    if n > token_budget:
        if not enable_chunked_prefill:
            return 0
        n = token_budget
    return n


def blocks_to_admit(
    num_tokens: int, num_hit_blocks: int, num_evictable_hits: int, block_size: int, max_model_len: int
) -> int:
    """Free blocks admission needs: blocks for the request's whole current length less its hit blocks, a hit block
    still in the free queue counting once more (taking it leaves one free block fewer; kv_cache_manager.py,
    allocate_slots with the scheduler's reserve-full-length check, on by default in 0.33)."""
    return num_blocks_to_allocate(0, num_tokens, num_hit_blocks, block_size, max_model_len) + num_evictable_hits


def watermark_admits(
    num_tokens: int, num_free_blocks: int, watermark_blocks: int, block_size: int, max_model_len: int
) -> bool:
    """vLLM 0.1.4's paged admission of a request of num_tokens (vllm-0.1.4 vllm/core/block_manager.py, can_allocate):
    blocks for all its tokens leave at least watermark_blocks free (and are free at all)."""
    need = (num_tokens + block_size - 1) // block_size
    return (
        num_free_blocks - need >= watermark_blocks
        and blocks_to_admit(num_tokens, 0, 0, block_size, max_model_len) <= num_free_blocks
    )


def admission_num_new_blocks(
    num_tokens: int,
    num_hit_blocks: int,
    num_evictable_hits: int,
    num_new_tokens: int,
    num_free_blocks: int,
    block_size: int,
    max_model_len: int,
) -> int:
    """New blocks allocate_slots takes to admit a request of num_tokens (num_hit_blocks found in the prefix cache,
    num_evictable_hits of them free) computing num_new_tokens, or -1: too few free blocks, refused
    (kv_cache_manager.py, KVCacheManager.allocate_slots)."""
    if blocks_to_admit(num_tokens, num_hit_blocks, num_evictable_hits, block_size, max_model_len) > num_free_blocks:
        return -1
    new = num_blocks_to_allocate(num_hit_blocks * block_size, num_new_tokens, num_hit_blocks, block_size, max_model_len)
    if new < 0:
        new = 0
    if new + num_evictable_hits > num_free_blocks:
        return -1
    return new


def prefill_end_tokens(num_prompt_tokens: int, num_tokens: int) -> int:
    """Where a request's prefill ends: its prompt, or all its known tokens but the last after a preemption (the
    tokens it computes again before it samples; sched/scheduler.py's max(num_prompt_tokens, num_tokens - 1))."""
    return max(num_prompt_tokens, num_tokens - 1)


def mamba_checkpoint_position(num_tokens: int, block_size: int) -> int:
    """The last position before token num_tokens whose Mamba state can be cached: all but the last token, floored to
    block_size (kv_cache_interface.py, get_mamba_prefill_checkpoint_position; no EAGLE, no hash lookahead)."""
    position = (num_tokens - 1) // block_size * block_size
    return position if position > 0 else 0


def mamba_checkpoint_valid(
    query_start: int,
    query_end: int,
    checkpoint_position: int,
    hash_block_size: int,
    mamba_block_size: int,
    checkpoint_alignment: int,
) -> bool:
    """Whether a chunk of tokens [query_start, query_end) can export the Mamba state at checkpoint_position from
    inside the kernel into a block of its own (kv_cache_interface.py, is_mamba_prefill_checkpoint_valid;
    checkpoint_alignment 0: the backend exports none): the chunk starts on a hash block, its block before last lies
    past the block of its initial state, the checkpoint lies inside it at least a hash block past its start, on the
    alignment."""
    if checkpoint_alignment <= 0:
        return False
    initial_state_col = (query_start - 1) // mamba_block_size
    checkpoint_col = (query_end + mamba_block_size - 1) // mamba_block_size - 2
    return (
        query_start % hash_block_size == 0
        and checkpoint_col > initial_state_col
        and query_start + hash_block_size <= checkpoint_position
        and query_start < checkpoint_position < query_end
        and (checkpoint_position - query_start) % checkpoint_alignment == 0
    )


def mamba_aligned_num_new_tokens(
    num_computed_tokens: int,
    num_new_tokens: int,
    num_prompt_tokens: int,
    num_tokens: int,
    block_size: int,
    max_prefill_tokens: int,
    shared_prefix_boundary: int,
    checkpoint_alignment: int = 0,
) -> int:
    """A prefill chunk cut where a Mamba state must be cached (sched/scheduler.py, _mamba_block_aligned_split, in
    mamba_cache_mode "align"; every group's block block_size, no partial-block hits): a chunk before the prefill's
    end ends on a block boundary (or runs on when no boundary is within reach and a block is wider than
    max_prefill_tokens), and no chunk runs past the next block boundary when it starts mid-block, past the last block
    boundary before the request's last token, or past the shared prefix (floored to blocks); 0: nothing this step.
    With prefill checkpoint blocks in every Mamba group (checkpoint_alignment > 0, the first group's
    prefill_checkpoint_alignment), a final chunk that can export the prefill's checkpoint from inside the kernel
    (mamba_checkpoint_valid) runs on past the last block boundary and past the next one."""
    start = num_computed_tokens
    prefill_end = prefill_end_tokens(num_prompt_tokens, num_tokens)
    if start >= prefill_end:
        return num_new_tokens
    end = start + num_new_tokens
    last_cached = mamba_checkpoint_position(num_tokens, block_size)
    internal = (
        checkpoint_alignment > 0
        and end >= prefill_end
        and mamba_checkpoint_valid(
            start,
            end,
            mamba_checkpoint_position(prefill_end, block_size),
            block_size,
            block_size,
            checkpoint_alignment,
        )
    )
    if internal:
        last_cached = 0
    if end < prefill_end:
        aligned = end // block_size * block_size
        if aligned > start or block_size <= max_prefill_tokens:
            end = aligned
    next_boundary = (start // block_size + 1) * block_size
    junction = shared_prefix_boundary
    stops = (
        next_boundary if start % block_size and not internal else 0,
        last_cached,
        start + (junction - start) // block_size * block_size if start < junction < end else 0,
    )
    cut = end  # the first stop inside the chunk, if any
    for stop in stops:
        if start < stop < cut:
            cut = stop
    return max(cut - start, 0)


def preemption_victim(num_running: int) -> int:
    """The running request preempted when blocks run out: the last of the running list, the most recently
    admitted (sched/scheduler.py, Scheduler.schedule under FCFS: self.running.pop())."""
    return num_running - 1


def samples(num_computed_tokens: int, num_tokens: int, num_output_placeholders: int) -> bool:
    """Whether a scheduled request samples a token: its computed tokens reach its known ones, placeholders included
    (a partial prefill chunk samples none; sched/scheduler.py, update_from_output)."""
    return num_computed_tokens >= num_tokens + num_output_placeholders


def is_finished(num_tokens: int, max_num_tokens: int) -> bool:
    """Whether a request stops: it reached max_num_tokens = min(prompt + max_tokens, max_model_len)
    (sched/utils.py, check_stop; kvlab's workloads have no stop strings or EOS)."""
    return num_tokens >= max_num_tokens


def settles_placeholder(was_stale: bool, num_output_placeholders: int) -> bool:
    """Whether an asynchronous batch's sampled token replaces one of the request's output placeholders: not when
    the batch was scheduled before the request's last preemption (stale output, kept but counted nowhere;
    sched/scheduler.py, Scheduler._update_request_with_output)."""
    return not was_stale and num_output_placeholders > 0


# ---------------------------------------------------------------- what a run of steps follows from the rules above
# Not vLLM's code but kvlab's closed forms of it: what the compiled loops' decode runs
# (fast/loops/step_runs.py) and the step cost's inputs (Scheduler.account) compute, each once.


def steps_to_finish(num_tokens: int, max_num_tokens: int, num_output_placeholders: int) -> int:
    """The decode steps a decoding request is scheduled for until the one that samples its last token (that one
    included): its tokens left, less the one a batch in flight is sampling (an asynchronous placeholder)."""
    return max_num_tokens - num_tokens - num_output_placeholders


def block_phase(num_computed_tokens: int, block_size: int) -> int:
    """When a decoding request crosses into a new block: at every step j of a run of one-token steps with
    j % block_size == block_phase (its computed tokens then fill whole blocks)."""
    return -num_computed_tokens % block_size


def blocks_crossed(phase: int, num_steps: int, block_size: int) -> int:
    """The new blocks a decoding request of block_phase phase takes in num_steps one-token steps."""
    return num_steps // block_size + (1 if phase < num_steps % block_size else 0)


def steps_covered(per_phase, num_running: int, num_free_blocks: int, block_size: int) -> int:
    """The most one-token steps num_free_blocks cover: a block for every block boundary crossed, per_phase[p] of the
    num_running requests crossing one at the steps j with j % block_size == p. The blocks crossed in steps 0..s-1 are
    num_running x (s // block_size) plus the requests of phase below s % block_size."""
    full_periods, left = divmod(num_free_blocks, num_running)
    seen = 0
    for p in range(block_size):
        seen += per_phase[p]
        if seen > left:
            return full_periods * block_size + p
    return full_periods * block_size + block_size  # not reached: left < num_running, the sum of per_phase


def window_release_step(
    num_computed_tokens: int, sliding_window: int, attention_chunk_size: int, block_size: int, lag: int
) -> int:
    """The first step of a decoding request's one-token steps at which its sliding window or attention chunk gives
    blocks back (the blocks of num_skipped_tokens of its settled tokens, num_computed_tokens + j - lag at step j, grow):
    a window one block every block_size steps from it on (0 or less: it already does, at the same phase), a chunk
    attention_chunk_size / block_size blocks every attention_chunk_size steps (its phase, 0 <= it < the chunk)."""
    if attention_chunk_size:
        return (lag - num_computed_tokens) % attention_chunk_size
    return sliding_window - 1 - num_computed_tokens + lag + block_size


def attention_pairs(num_new_tokens: int, num_computed_tokens: int) -> int:
    """The (query, key) pairs a chunk's causal attention computes: each of its num_new_tokens tokens with the
    num_computed_tokens before the chunk and with the chunk's tokens up to itself (the step cost's Batch.pairs)."""
    return num_new_tokens * num_computed_tokens + num_new_tokens * (num_new_tokens + 1) // 2
