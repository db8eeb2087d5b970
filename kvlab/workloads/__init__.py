"""Workloads: synthetic request sets (kvlab.workloads.synthetic) and real traces (kvlab.workloads.traces)."""
from kvlab.core.workload import Workload
from kvlab.workloads import synthetic, traces
from kvlab.workloads.synthetic import LENGTH_DISTRIBUTIONS, poisson_arrivals, sample_lengths

__all__ = ["Workload", "synthetic", "traces", "LENGTH_DISTRIBUTIONS", "poisson_arrivals", "sample_lengths"]
