"""What every section uses: ledger (the reproduction ledger against data/article_figures.csv and the vLLM paper's
data/paper_figures.csv), plots (the figures), present (the one table formatter) and parameters (what each notebook
parameter may be, checked before anything runs)."""

from kvlab.core.lazy import submodules

__all__ = ["ledger", "parameters", "plots", "present"]

__getattr__, __dir__ = submodules(
    __name__, __all__
)  # each loads on first use: the report's checks need no pandas or matplotlib
