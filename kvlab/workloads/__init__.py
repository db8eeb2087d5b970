"""Workloads: synthetic request sets (kvlab.workloads.synthetic), real traces (kvlab.workloads.traces) and the vLLM
paper's datasets as kvlab builds them (kvlab.workloads.paper_datasets)."""
from kvlab.core.lazy import submodules

__all__ = ["Workload", "paper_datasets", "synthetic", "traces", "LENGTH_DISTRIBUTIONS", "poisson_arrivals", "sample_lengths"]
__getattr__, __dir__ = submodules(__name__, ["download", "paper_datasets", "synthetic", "traces"], {
    "Workload": "kvlab.core.workload", "LENGTH_DISTRIBUTIONS": "kvlab.workloads.synthetic",
    "poisson_arrivals": "kvlab.workloads.synthetic", "sample_lengths": "kvlab.workloads.synthetic"})
