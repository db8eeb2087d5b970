"""Packages whose modules load on first use: the module __getattr__ and __dir__ of a package's __init__ (PEP 562)."""

from __future__ import annotations

import sys


def submodules(package: str, names, attributes: dict[str, str] | None = None):
    """The module __getattr__ and __dir__ of package: each of names (its modules) and each of attributes (name ->
    the module that holds it) is imported on first use, so importing the package costs nothing; dir() (and a
    notebook's completion) lists them all the same."""
    attributes = attributes or {}

    def load(module: str):
        __import__(module)  # the import statement's path, so `python -X importtime` lists the module
        return sys.modules[module]

    def __getattr__(name: str):
        if name in names:
            return load(f"{package}.{name}")
        if name in attributes:
            return getattr(load(attributes[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names, *attributes})

    return __getattr__, __dir__
