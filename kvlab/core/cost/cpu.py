"""The CPU's scheduling beside a step's GPU work, as vLLM's engine loop runs them."""

from __future__ import annotations

import numpy as np


def combine_cpu(gpu_us, cpu_us: float, overlapped: bool):
    """A step of gpu_us of GPU work beside cpu_us of the CPU's scheduling: their sum (synchronous scheduling) or the
    longer (asynchronous: the CPU schedules while the GPU runs the batch before); floats or an array of gpu_us."""
    if not overlapped:
        return gpu_us + cpu_us
    return np.maximum(gpu_us, cpu_us) if isinstance(gpu_us, np.ndarray) else max(gpu_us, cpu_us)
