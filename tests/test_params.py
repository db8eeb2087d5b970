"""params.yaml and the notebooks agree: every value the report passes equals the notebook's own default."""

import ast

import nbformat
import pytest
import yaml

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def parameters_cell(path) -> dict:
    cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    values = {}
    for node in ast.parse(cell.source).body:
        assert isinstance(node, ast.Assign), f"{path.name}: the parameters cell holds only NAME = literal lines"
        values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def test_every_notebook_is_in_params_yaml_and_nothing_else():
    assert set(PARAMS) == {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_params_yaml_equals_the_notebook_defaults(path):
    defaults = parameters_cell(path)
    given = PARAMS[path.stem]
    assert set(given) <= set(defaults), (
        f"params.yaml names parameters {sorted(set(given) - set(defaults))} that {path.name} does not have"
    )
    missing = set(defaults) - set(given) - {"LEDGER_CSV"}  # LEDGER_CSV is set by the report itself
    assert not missing, f"params.yaml lacks {sorted(missing)} of {path.name}"
    for name, value in given.items():
        assert value == defaults[name], (
            f"{path.stem}.{name}: params.yaml has {value!r}, the notebook {defaults[name]!r}"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_are_upper_case_with_a_unit_comment(path):
    cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    lines = cell.source.splitlines()
    for node in ast.parse(cell.source).body:
        name = node.targets[0].id
        assert name.isupper(), f"{path.name}: {name} is not UPPER_CASE"
        span = lines[node.lineno - 1 : node.end_lineno]
        assert any("#" in line for line in span), f"{path.name}: {name} has no comment giving its unit"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_prose_says_what_a_parameter_means_not_its_name(path):
    names = set(parameters_cell(path))
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown":
            shown = [name for name in names if f"`{name}`" in cell.source]
            assert not shown, f"{path.name}: the prose shows {shown} as code; say in words what it means"
