"""kvlab's mechanism: config objects, allocation, capacity, cost models, the schedulers. numpy only, no pandas.

Modules import only each other (and numpy, scipy); nothing here knows of workload files, sections,
tables, the ledger or the report.
"""
from kvlab.core import (allocator, article, batching, calibration, capacity, config, cost, models, prefix_cache,
                        units, validate, workload)

__all__ = ["allocator", "article", "batching", "calibration", "capacity", "config", "cost", "models", "prefix_cache",
           "units", "validate", "workload"]
