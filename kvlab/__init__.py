"""kvlab: KV-cache memory in LLM serving, as a reproducible report.

Layers, imports pointing down only:
    kvlab.core       mechanism: config objects, allocation, capacity, cost models, the schedulers (numpy only)
    kvlab.workloads  synthetic workloads and the real-trace loaders
    kvlab.studies    what is computed but is not report prose: the planner's search, sweeps, the vLLM paper's setting, fits
    kvlab.sections   one module or package per notebook (s01_allocation ... s08_fleet): its tables, bands and ledger
                     rows; what they share (sections.shared: the ledger, plots, present, parameters)
    kvlab.report     papermill -> nbconvert -> index + PDF
    kvlab.cli        the `kvlab` command line over all of it
"""

from kvlab.core.lazy import submodules

_LAYERS = ("core", "workloads", "studies", "sections", "report", "cli")
_layer, __dir__ = submodules(__name__, _LAYERS)


def __getattr__(name: str):
    # Every layer loads on first use (kvlab.core: numpy; kvlab.sections: pandas, matplotlib; kvlab.report: papermill),
    # and so does __version__ (importlib.metadata), so each `kvlab` command imports only what it uses.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("kvlab")
        except PackageNotFoundError:  # running from a source tree that was not installed
            return "0.0.0"
    return _layer(name)


__all__ = [*_LAYERS, "__version__"]
