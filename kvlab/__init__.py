"""kvlab: KV-cache memory in LLM serving, as a reproducible report."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvlab")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

from kvlab import allocator, calibrate, capacity, ledger, plots, prefix_cache, simulator, validate, workloads  # noqa: E402


def __getattr__(name: str):
    # kvlab.traces is imported on first use, so that `python -m kvlab.traces` (make traces) runs it only once.
    if name == "traces":
        import importlib

        return importlib.import_module("kvlab.traces")
    raise AttributeError(f"module 'kvlab' has no attribute {name!r}")


__all__ = ["allocator", "calibrate", "capacity", "ledger", "plots", "prefix_cache", "simulator", "traces", "validate",
           "workloads", "__version__"]
