"""Section 6 (notebook 06_memory_budget): serving under one memory budget, the vLLM paper's experiment on kvlab's
engine. Modules by job, each importing only those before it: runs (the grids and the one run they are made of),
tables (each grid reduced to the table the notebook shows), prose (the figures its sentences state) and ledger_rows
(its rows of the reproduction ledger). The setting and its requests are kvlab.studies.paper_setting and
paper_workloads."""

from kvlab.core.lazy import submodules

__all__ = ["ledger_rows", "prose", "runs", "tables"]

__getattr__, __dir__ = submodules(__name__, __all__)  # each loads on first use
