"""The report's sections, one module or package per notebook and named after it, and the helpers they share.

s01_allocation, s02_batching, s03_capacity, s04_traces, s05_calibration, s06_memory_budget (a package: its grids,
tables, prose and ledger rows), s07_plan, s08_fleet: each holds its notebook's tables, seed bands, figures in words and ledger
rows. shared: the reproduction ledger, the figures, the one table formatter and what each notebook parameter may be.
What they compute on (the planner's search, sweeps, the vLLM paper's setting, fits) is kvlab.studies. DataFrames
live here, at the edge.
"""

from kvlab.core.lazy import submodules

__all__ = [
    "s01_allocation",
    "s02_batching",
    "s03_capacity",
    "s04_traces",
    "s05_calibration",
    "s06_memory_budget",
    "s07_plan",
    "s08_fleet",
    "shared",
]

__getattr__, __dir__ = submodules(
    __name__, __all__
)  # each loads on first use: the report's checks need no pandas or matplotlib
