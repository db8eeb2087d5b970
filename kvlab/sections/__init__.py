"""One module per notebook: the section's tables, seed bands, sweeps and ledger rows, plus the ledger and plots.

allocation (01), batching (02), capacity (03), traces (04), calibration (05); section 06 in modules by job, each
importing only those before it: budget_runs (the grids), budget_tables, budget_prose (the figures its prose states)
and budget_ledger (its ledger rows); plan_tables (07); ledger (the reproduction ledger against
data/article_figures.csv and the vLLM paper's data/paper_figures.csv), plots (the figures), present (the one table
formatter) and parameters (what each notebook parameter may be). What they compute on (the planner's search,
sweeps, the vLLM paper's setting, fits) is kvlab.studies. DataFrames live here, at the edge.
"""
from kvlab.core.lazy import submodules

__all__ = ["allocation", "batching", "budget_ledger", "budget_prose", "budget_runs", "budget_tables", "calibration",
           "capacity", "ledger", "parameters", "plan_tables", "plots", "present", "traces"]

__getattr__, __dir__ = submodules(__name__, __all__)  # each loads on first use: the report's checks need no pandas or matplotlib
