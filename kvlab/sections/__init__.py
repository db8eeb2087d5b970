"""One module per notebook: the section's tables, seed bands, sweeps and ledger rows, plus the ledger and plots.

allocation (01), batching (02), capacity (03), traces (04), calibration (05); section 06 in modules by job, each
importing only those before it: paper_setting and paper_workloads (the setting and its requests, no pandas),
budget_runs (the grids), budget_tables, budget_prose (the figures its prose states) and budget_ledger (its ledger
rows); plan and plan_space (`kvlab plan`'s search and what it searches); ledger (the reproduction ledger against data/article_figures.csv and the vLLM paper's data/paper_figures.csv),
sweep (grids on local processes or a Dask cluster) and plots (the figures); parameters (what each notebook parameter
may be). DataFrames live here, at the edge.
"""
from kvlab.core.lazy import submodules

__all__ = ["allocation", "batching", "budget_ledger", "budget_prose", "budget_runs", "budget_tables", "calibration",
           "capacity", "ledger", "paper_setting", "paper_workloads", "parameters", "plan", "plan_space", "plots", "present",
           "sweep", "traces"]

__getattr__, __dir__ = submodules(__name__, __all__)  # each loads on first use: the report's checks need no pandas or matplotlib
