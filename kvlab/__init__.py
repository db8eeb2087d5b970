"""kvlab: KV-cache memory in LLM serving, as a reproducible report.

Layers, imports pointing down only:
    kvlab.core       mechanism: config objects, allocation, capacity, cost models, the schedulers (numpy only)
    kvlab.workloads  synthetic workloads and the real-trace loaders
    kvlab.sections   one module per notebook: its tables, bands, sweeps and ledger rows; the ledger; plots
    kvlab.report     papermill -> nbconvert -> index + PDF
    kvlab.cli        the `kvlab` command line over all of it
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvlab")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

from kvlab import core, workloads  # noqa: E402


def __getattr__(name: str):
    # The upper layers (pandas, matplotlib, papermill) load on first use, so `kvlab capacity` starts fast.
    if name in ("sections", "report", "cli"):
        import importlib

        return importlib.import_module(f"kvlab.{name}")
    raise AttributeError(f"module 'kvlab' has no attribute {name!r}")


__all__ = ["core", "workloads", "sections", "report", "cli", "__version__"]
