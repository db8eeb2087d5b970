"""Workloads: synthetic request sets (kvlab.workloads.synthetic), real traces (kvlab.workloads.traces), the vLLM
paper's datasets as kvlab builds them (kvlab.workloads.paper_datasets) and real vLLM runs kept as checks of the
step costs (kvlab.workloads.vllm_runs)."""

from kvlab.core.lazy import submodules

__all__ = [
    "Workload",
    "paper_datasets",
    "synthetic",
    "traces",
    "vllm_runs",
    "LENGTH_DISTRIBUTIONS",
    "poisson_arrivals",
    "sample_lengths",
]
__getattr__, __dir__ = submodules(
    __name__,
    ["download", "paper_datasets", "synthetic", "traces", "vllm_runs"],
    {
        "Workload": "kvlab.core.workload",
        "LENGTH_DISTRIBUTIONS": "kvlab.workloads.synthetic",
        "poisson_arrivals": "kvlab.workloads.synthetic",
        "sample_lengths": "kvlab.workloads.synthetic",
    },
)
