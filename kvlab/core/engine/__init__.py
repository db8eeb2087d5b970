"""The serving engine: vLLM 0.33's v1 scheduler over one KV budget, in simulated time (kvlab's section 6).

request (Request), kv_cache_manager (vLLM's paged KVCacheManager and the reservation baselines),
scheduler (vLLM's schedule() and update_from_output()), scheduler_v0 (vLLM 0.1.4's, the paper's), engine (the time loop, simulate), decode_run (the
closed-form fast path), records (EngineResult). The block pool is kvlab.core.block_pool.
"""
from kvlab.core.engine.engine import (DEFAULT_CONFIG, PEAK_BYTES_PER_REQUEST, Engine, NoProgressError,
                                      check_workload, simulate)
from kvlab.core.engine.kv_cache_manager import ALLOCATIONS, KVCacheManager, ReservationManager
from kvlab.core.engine.records import STEP_FIELDS, EngineResult
from kvlab.core.engine.request import Request
from kvlab.core.engine.scheduler import Scheduler, SchedulerOutput, check_scheduler_config
from kvlab.core.engine.scheduler_v0 import SchedulerV0

__all__ = ["ALLOCATIONS", "DEFAULT_CONFIG", "PEAK_BYTES_PER_REQUEST", "STEP_FIELDS", "Engine", "EngineResult",
           "KVCacheManager", "NoProgressError", "Request", "ReservationManager", "Scheduler", "SchedulerOutput", "SchedulerV0",
           "check_scheduler_config", "check_workload", "simulate"]
