"""What kvlab computes that is not report prose, below the per-section tables and above the workloads.

serving (one run of kvlab's engine set up from its options, every default and refusal once: `kvlab simulate` and
`kvlab plan` call it) and sizing (what vLLM logs at start-up for a model on one GPU, `kvlab capacity`'s); plan
(`kvlab plan`'s search) and plan_space (what it searches: candidates, deployment, objectives); sweep (grids on local
processes or a Dask cluster); the vLLM paper's setting (paper_setting) and the requests section 6 serves under it
(paper_workloads, built from kvlab.workloads.paper_datasets); vllm_2023_fit (the fit of the 2023 step cost's
coefficients, kvlab.core.cost.vllm_2023) and step_cost_checks (kvlab's step costs replaying real vLLM runs). The
command line imports these, never a section's tables.
"""

from kvlab.core.lazy import submodules

__all__ = [
    "paper_setting",
    "paper_workloads",
    "plan",
    "plan_space",
    "serving",
    "sizing",
    "step_cost_checks",
    "sweep",
    "vllm_2023_fit",
]

__getattr__, __dir__ = submodules(__name__, __all__)  # each loads on first use: the report's checks need no pandas
