"""Compile the engine's numba loops ahead (`make setup`), so that no run waits for them: see kvlab.core.engine.fast.compiled."""

from __future__ import annotations

import time

import numpy as np

from kvlab.core.config import EngineConfig
from kvlab.core.engine.engine import Engine
from kvlab.core.engine.fast import compiled
from kvlab.core.workload import Workload


def warm() -> list[str]:
    """Compile both loops into numba's cache (a few requests through each, synchronous and asynchronous); what was
    compiled, and in how many seconds, in words (make setup prints it). Nothing without numba."""
    if not compiled.available():
        return []
    done = []
    for mode in (False, True):
        loops = compiled.kernels()
        if compiled.cached(loops.loop_async if mode else loops.loop_sync):
            continue
        start = time.perf_counter()
        _serve(mode)
        done.append(f"{'asynchronous' if mode else 'synchronous'} loop in {time.perf_counter() - start:.0f} s")
    return done


def load() -> None:
    """Load both loops into this process (from numba's cache; compiling them where it has none), so that the
    workers it forks next find them loaded (kvlab plan's local processes: each would otherwise load them, about
    0.7 s, once per rung). Nothing without numba."""
    if compiled.available():
        for mode in (False, True):
            _serve(mode)


def _serve(asynchronous: bool) -> None:
    """A few requests through the compiled loop of one scheduling mode."""
    w = Workload(np.zeros(4), np.array([40, 3, 20, 9]), np.array([5, 9, 2, 4]))
    config = EngineConfig().replace(async_scheduling=asynchronous, max_model_len=64)
    Engine(w, config, num_gpu_blocks=64, path="compiled").run()
