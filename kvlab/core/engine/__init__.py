"""The serving engine: vLLM 0.33's v1 scheduler over one KV budget, in simulated time (kvlab's section 6).

The reference path, in the order a reader meets it: request (Request), rules (each vLLM rule, once), block pool
(kvlab.core.block_pool), single_type_kv_cache_manager (a manager per kind of KV cache group), kv_cache_coordinator
(the groups together), kv_cache_manager (vLLM's paged KVCacheManager over them), scheduler (vLLM's schedule() and
update_from_output(), written once for the compiled loop too), async_scheduler (AsyncScheduler), engine_core (the time
loop, vLLM's EngineCore, written once for the compiled loop too), engine (Engine, which runs it), closed_loop (vLLM bench's
--max-concurrency: when each request is sent), data_parallel (vLLM's data-parallel
ranks in lockstep), serve (simulate, the entry point). Beside it:
block_hashes (a full block's content hash, for prefix caching), checks (what the engine refuses), reservation (the vLLM paper's Orca baselines, a KV-cache manager of their own), scheduler_v0 (vLLM 0.1.4's, the
paper's), records (Recorder, EngineResult), replay (make parity's documents) and fast/ (the compiled loops, calling
the same rules and compiling the same schedule(), update_from_output() and time loop, with runs of steps at once).
"""

from kvlab.core.engine.async_scheduler import AsyncScheduler
from kvlab.core.engine.checks import ALLOCATIONS, PATHS, NoProgressError, check_scheduler_config, check_workload
from kvlab.core.engine.closed_loop import check_max_concurrency
from kvlab.core.engine.data_parallel import DataParallelEngine, RankChooser
from kvlab.core.engine.engine import DEFAULT_CONFIG, PEAK_BYTES_PER_REQUEST, Engine
from kvlab.core.engine.kv_cache_manager import KVCacheManager
from kvlab.core.engine.records import STEP_FIELDS, EngineResult, Recorder
from kvlab.core.engine.request import Request
from kvlab.core.engine.reservation import ReservationManager
from kvlab.core.engine.scheduler import Scheduler, SchedulerOutput
from kvlab.core.engine.scheduler_v0 import SchedulerV0
from kvlab.core.engine.serve import simulate

__all__ = [
    "ALLOCATIONS",
    "DEFAULT_CONFIG",
    "PATHS",
    "PEAK_BYTES_PER_REQUEST",
    "STEP_FIELDS",
    "AsyncScheduler",
    "DataParallelEngine",
    "Engine",
    "EngineResult",
    "KVCacheManager",
    "NoProgressError",
    "RankChooser",
    "Recorder",
    "Request",
    "ReservationManager",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerV0",
    "check_max_concurrency",
    "check_scheduler_config",
    "check_workload",
    "simulate",
]
