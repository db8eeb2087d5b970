"""simulate: serve a workload with kvlab's engine, one rank (Engine) or data-parallel ranks (DataParallelEngine)."""

from __future__ import annotations

from kvlab.core.config import EngineConfig
from kvlab.core.engine.data_parallel import DataParallelEngine
from kvlab.core.engine.engine import Engine
from kvlab.core.engine.records import EngineResult
from kvlab.core.workload import Workload


def simulate(workload: Workload, config: EngineConfig | None = None, **engine_options) -> EngineResult:
    """Serve workload with vLLM 0.33's scheduler: Engine(workload, config, **engine_options).run(), with
    num_gpu_blocks=... (the KV blocks, vLLM's null block included) among engine_options.

    config: block_size, enable_prefix_caching, max_num_seqs, max_num_batched_tokens, max_model_len (needed),
    chunked prefill, long_prefill_token_threshold and async_scheduling (vLLM's default on a GPU, True, schedules
    the next batch before the last one's output is known); default DEFAULT_CONFIG (synchronous, the reference the
    tests and section 6 use). scheduler_cls="v0-2023" serves it with vLLM 0.1.4's scheduler instead (the vLLM
    paper's: prompt-only steps, a watermark, recompute; see kvlab.core.engine.scheduler_v0).
    cost: a step cost of kvlab.core.cost (default ConstantStepCost(): 8 ms a step). allocation: paged (vLLM)
    or a reservation baseline (max, pow2, oracle). prompt_token_ids: one int array per request, for prefix
    caching to find shared prompts (else only Workload.prefix_hashes, or nothing, is shared). path: PATHS
    ("reference": the plain per-step loop). recorder: a Recorder, to keep each step's batch, each step's block
    tables (per-step loop only) and every freed block table, in order, in the result. check=False: the requests
    are not checked up front. kv_cache_groups: a hybrid model's KV cache groups (kvlab.core.capacity.kv_cache_groups:
    full attention, sliding windows, Mamba states) sharing the pool, as vLLM's hybrid KV cache manager serves them
    (kvlab.core.engine.kv_cache_manager.KVCacheManager over a manager per group; the per-step loop); None: one
    full-attention group. max_concurrency: a closed loop, vLLM bench's --max-concurrency N (kvlab.core.engine.closed_loop:
    each request sent once fewer than N are in flight, in workload order, never before its arrival; the result's
    arrival_s is when each was sent, and TTFT and latency count from it); the compiled loop serves it as the Python one.

    data_parallel_size > 1 in config serves a mixture-of-experts model's data-parallel ranks in lockstep, each over
    num_gpu_blocks (kvlab.core.engine.data_parallel.DataParallelEngine: paged, no recorder, the per-step loop).
    """
    if config is not None and config.parallel.data_parallel_size > 1:
        return DataParallelEngine(workload, config, **engine_options).run()
    return Engine(workload, config, **engine_options).run()
