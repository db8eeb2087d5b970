"""One module per notebook: the section's tables, seed bands, sweeps and ledger rows, plus the ledger and plots.

allocation (01), batching (02), capacity (03), traces (04), calibration (05); ledger (the reproduction
ledger against data/article_figures.csv) and plots (the figures). DataFrames live here, at the edge.
"""
from kvlab.sections import allocation, batching, calibration, capacity, ledger, parameters, plots, present, sweep, traces

__all__ = ["allocation", "batching", "calibration", "capacity", "ledger", "parameters", "plots", "present", "sweep", "traces"]
