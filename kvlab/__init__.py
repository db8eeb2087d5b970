"""kvlab: KV-cache memory in LLM serving, as a reproducible report."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvlab")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

from kvlab import capacity, ledger, plots, prefix_cache, traces, validate, workloads  # noqa: E402

__all__ = ["capacity", "ledger", "plots", "prefix_cache", "traces", "validate", "workloads", "__version__"]
