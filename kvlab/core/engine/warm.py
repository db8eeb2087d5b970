"""Compile the engine's numba loops ahead (`make setup`), so that no run waits for them: see kvlab.core.engine.fast.compiled."""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from kvlab.core.config import EngineConfig
from kvlab.core.engine.engine import Engine
from kvlab.core.engine.fast import compiled
from kvlab.core.workload import Workload

LOOPS = ("synchronous", "asynchronous", "vLLM 0.1.4")  # the compiled loops: vLLM 0.33's two modes, vLLM 0.1.4's


def warm() -> list[str]:
    """Compile every loop into numba's cache (a few requests through each of LOOPS), each in its own process where the
    machine has more than one core (numba compiles on one: on two cores the three loops share them and end together,
    sooner than in two processes, the longest beside the other two: 83-95 s against 97 s when measured, 53-55 s now
    that numba's inliner copies less, jit._InlinerCopy); what was compiled, and in how many seconds, in words (make
    setup prints it). Nothing without numba."""
    if not compiled.available():
        return []
    modes = [mode for mode in LOOPS if not compiled.cached(_loop(mode))]
    workers = len(modes) if (os.cpu_count() or 1) > 1 else 1
    if workers <= 1:
        return [_timed(mode) for mode in modes]
    # forked: numba is imported (compiled.cached imported the loops' modules) but has compiled nothing yet; each process
    # compiles its loop into the same cache
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_timed, modes))


def _timed(mode: str) -> str:
    """Compile one of LOOPS (_serve); how long it took, in words."""
    start = time.perf_counter()
    _serve(mode)
    return f"{mode} loop in {time.perf_counter() - start:.0f} s"


def load(modes=LOOPS) -> None:
    """Load the loops of modes into this process (from numba's cache; compiling them where it has none), so that
    the workers it forks next find them loaded (kvlab plan's and section 6's local processes: each would otherwise
    load them, about 0.7 s a loop, once per sweep). Nothing without numba."""
    if compiled.available():
        for mode in modes:
            if _loop(mode) not in compiled.ran():
                _serve(mode)


def _loop(mode: str):
    """The compiled loop of one of LOOPS."""
    if mode == LOOPS[2]:
        return compiled.kernels_v0().loop_v0
    loops = compiled.kernels()
    return loops.loop_async if mode == LOOPS[1] else loops.loop_sync


def _serve(mode: str) -> None:
    """A few requests through the compiled loop of one of LOOPS (vLLM 0.1.4's reserving, which compiles its paged
    half too)."""
    w = Workload(np.zeros(4), np.array([40, 3, 20, 9]), np.array([5, 9, 2, 4]))
    v0 = mode == LOOPS[2]
    config = EngineConfig().replace(async_scheduling=mode == LOOPS[1], max_model_len=64)
    if v0:
        config = config.replace(
            scheduler_cls="v0-2023", enable_chunked_prefill=False, max_num_batched_tokens=64, max_num_seqs=8
        )
    Engine(w, config, num_gpu_blocks=64, allocation="pow2" if v0 else "paged", path="compiled").run()
