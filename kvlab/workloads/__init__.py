"""Workloads: synthetic request sets (kvlab.workloads.synthetic), real traces (kvlab.workloads.traces), the vLLM
paper's datasets as kvlab builds them (kvlab.workloads.paper_datasets) and real vLLM runs kept as checks of the
clock (kvlab.workloads.vllm_runs)."""
from kvlab.core.workload import Workload
from kvlab.workloads import paper_datasets, synthetic, traces, vllm_runs
from kvlab.workloads.synthetic import LENGTH_DISTRIBUTIONS, poisson_arrivals, sample_lengths

__all__ = ["Workload", "paper_datasets", "synthetic", "traces", "vllm_runs", "LENGTH_DISTRIBUTIONS", "poisson_arrivals", "sample_lengths"]
