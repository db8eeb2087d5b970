"""kvlab's mechanism: config objects, allocation and the block pool, capacity, cost models and the operator
profiles they read, the schedulers (the article's slot model in batching, vLLM's in engine). numpy only, no
pandas.

Modules import only each other (and numpy, scipy); nothing here knows of workload files, sections,
tables, the ledger or the report.
"""

from kvlab.core.lazy import submodules

__all__ = [
    "allocator",
    "article",
    "batching",
    "block_pool",
    "calibration",
    "capacity",
    "config",
    "cost",
    "engine",
    "models",
    "prefix_cache",
    "profiles",
    "units",
    "validate",
    "workload",
]
__getattr__, __dir__ = submodules(__name__, __all__)  # each module loads on first use: `kvlab --help` needs few of them
