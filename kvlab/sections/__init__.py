"""One module per notebook: the section's tables, seed bands, sweeps and ledger rows, plus the ledger and plots.

allocation (01), batching (02), capacity (03), traces (04), calibration (05), memory_budget (06); ledger (the
reproduction ledger against data/article_figures.csv and the vLLM paper's data/paper_figures.csv), sweep (grids
on local processes or a Dask cluster) and plots (the figures). DataFrames live here, at the edge.
"""
from kvlab.sections import (allocation, batching, calibration, capacity, ledger, memory_budget, parameters, plots, present,
                            sweep, traces)

__all__ = ["allocation", "batching", "calibration", "capacity", "ledger", "memory_budget", "parameters", "plots",
           "present", "sweep", "traces"]
