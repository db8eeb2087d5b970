"""The architecture: each folder of kvlab is one layer, imports point down only, and there is no cycle."""

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "kvlab"
# Layer of each top-level part of kvlab, lowest first; a module may import its own layer or one below.
LAYERS = {"core": 0, "workloads": 1, "studies": 2, "sections": 3, "report": 4, "cli": 5, "__main__": 6, "__init__": 6}
# What the mechanism may import from outside the standard library.
CORE_THIRD_PARTY = {"numpy", "scipy"}
# And numba, in the one module of compiled loops (imported only when a compiled loop runs).
COMPILED_LOOPS = {"kvlab.core.engine.fast.loops.jit": {"numba"}}


def modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """Every module path named by an import statement in the file (functions' bodies included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return LAYERS[part]


def kvlab_imports(path: Path, known: set[str]) -> set[str]:
    return {name for name in imports(path) if name in known}


def test_every_module_belongs_to_a_layer():
    for name in modules():
        layer(name)


@pytest.mark.parametrize("name", sorted(modules()))
def test_imports_point_down_only(name):
    known = set(modules())
    for target in kvlab_imports(modules()[name], known):
        assert layer(target) <= layer(name), f"{name} (layer {layer(name)}) imports {target} (layer {layer(target)})"


@pytest.mark.parametrize("name", sorted(n for n in modules() if n.startswith("kvlab.core")))
def test_the_mechanism_uses_numpy_not_pandas(name):
    outside = {i.split(".")[0] for i in imports(modules()[name])} - {"kvlab", "__future__"}
    import sys

    third_party = {m for m in outside if m not in sys.stdlib_module_names}
    allowed = CORE_THIRD_PARTY | {"torch"} | COMPILED_LOOPS.get(name, set())
    assert third_party <= allowed, f"{name} imports {sorted(third_party - allowed)}"


def test_no_import_cycles():
    known = set(modules())
    graph = {name: kvlab_imports(path, known) - {name} for name, path in modules().items()}
    # package __init__ files re-export their modules: the edge package -> module is not a cycle
    graph = {
        n: {t for t in targets if not n.endswith(".__init__") and not t.startswith(n + ".")}
        for n, targets in graph.items()
    }
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])


def test_kvlab_plan_imports_no_report_tables():
    """`kvlab plan` searches with kvlab.studies: its command imports nothing of kvlab.sections."""
    found = kvlab_imports(modules()["kvlab.cli.plan"], set(modules()))
    assert not {name for name in found if name.startswith("kvlab.sections")}, sorted(found)


def test_one_command_line():
    """Only kvlab.cli parses command lines: no other module builds an ArgumentParser or has a main()."""
    for name, path in modules().items():
        if name.startswith("kvlab.cli.") or name == "kvlab.__main__":  # kvlab.cli is a package
            continue
        text = path.read_text()
        assert "ArgumentParser(" not in text and "def main(" not in text, name


# A name a module shares with one in a lower layer, allowed where it is the same concept one level up: each command
# of the command line over the module it runs.
SAME_CONCEPT_ONE_LEVEL_UP = {
    "kvlab.cli.capacity": "kvlab.core.capacity",
    "kvlab.cli.plan": "kvlab.studies.plan",
    "kvlab.cli.traces": "kvlab.workloads.traces",
    "kvlab.cli.report": "kvlab.report",
}


def test_no_module_name_repeats_a_lower_layers():
    """A module (or package) is not named like one of a lower layer, unless it is the same concept one level up."""

    def short(name):
        return name.removesuffix(".__init__").rsplit(".", 1)[-1]

    names = [n for n in modules() if n.count(".") > 1 or not n.endswith("__init__")]
    for name in names:
        lower = sorted(n.removesuffix(".__init__") for n in names if short(n) == short(name) and layer(n) < layer(name))
        if name in SAME_CONCEPT_ONE_LEVEL_UP:
            assert lower == [SAME_CONCEPT_ONE_LEVEL_UP[name]], (name, lower)
        else:
            assert not lower, f"{name} repeats the name of {', '.join(lower)} in a lower layer"
