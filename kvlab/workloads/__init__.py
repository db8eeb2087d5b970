"""Workloads: synthetic request sets (kvlab.workloads.synthetic), real traces (kvlab.workloads.traces) and the vLLM
paper's datasets as kvlab builds them (kvlab.workloads.paper_datasets)."""
from kvlab.core.workload import Workload
from kvlab.workloads import paper_datasets, synthetic, traces
from kvlab.workloads.synthetic import LENGTH_DISTRIBUTIONS, poisson_arrivals, sample_lengths

__all__ = ["Workload", "paper_datasets", "synthetic", "traces", "LENGTH_DISTRIBUTIONS", "poisson_arrivals", "sample_lengths"]
