"""A drifted number fails the notebook test: when nbval runs the notebook itself, and when its cells are compared
with the report build's execution of it (conftest.py: each notebook is executed once in make test)."""

import json
import re
import shutil
import subprocess
import sys

from conftest import ROOT

SOURCE = ROOT / "notebooks" / "01_allocation.ipynb"  # the quickest notebook (a few seconds)
NUMBER, DRIFTED = "565.5", "565.6"  # the first number one of its outputs shows, and what it drifts to
TRACE_CELL_TAG = "needs-trace"  # cells on a real trace (the repository's conftest.py skips them without its file)


def _source() -> dict:
    """SOURCE without its cells on a real trace (TRACE_CELL_TAG), which a machine without
    the trace files skips: the same cells run with and without them."""
    nb = json.loads(SOURCE.read_text())
    nb["cells"] = [c for c in nb["cells"] if TRACE_CELL_TAG not in c["metadata"].get("tags", [])]
    return nb


def _drift(nb: dict) -> int:
    """Change the first NUMBER a cell shows to DRIFTED (text and HTML alike); the number of that code cell."""
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    for number, cell in enumerate(code):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if NUMBER in "".join(data.get("text/plain", [])):
                for mime, old, new in (("text/plain", NUMBER, DRIFTED), ("text/html", NUMBER, DRIFTED)):
                    if mime in data:
                        data[mime] = ["".join(data[mime]).replace(old, new, 1)]
                return number
    raise AssertionError(f"no output of {SOURCE.name} shows {NUMBER}")


def _pytest(folder, *args):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env", *args],
        capture_output=True,
        text=True,
        cwd=folder,
    )


def _cells(nb: dict) -> int:
    return sum(cell["cell_type"] == "code" for cell in nb["cells"])


def test_nbval_fails_on_a_drifted_number(tmp_path):
    drifted = tmp_path / SOURCE.name
    nb = _source()
    number = _drift(nb)
    drifted.write_text(json.dumps(nb))

    result = _pytest(tmp_path, str(drifted))
    assert result.returncode == 1
    assert f"1 failed, {_cells(nb) - 1} passed" in result.stdout, result.stdout[-2000:]  # only the drifted cell
    assert f"{SOURCE.name}::Cell {number}" in result.stdout and DRIFTED in result.stdout and NUMBER in result.stdout


def _as_papermill_wrote_it(nb: dict, parameters: dict) -> dict:
    """nb as papermill writes its execution: its parameters in the metadata, a cell assigning them after the
    notebook's parameters cell."""
    at = next(i for i, c in enumerate(nb["cells"]) if "parameters" in c["metadata"].get("tags", [])) + 1
    source = "".join(f"{name} = {value!r}\n" for name, value in parameters.items())
    nb["cells"].insert(
        at,
        {
            "cell_type": "code",
            "execution_count": at + 1,
            "id": "injected",
            "outputs": [],
            "metadata": {"tags": ["injected-parameters"]},
            "source": source,
        },
    )
    nb["metadata"]["papermill"] = {"parameters": parameters}
    return nb


def test_the_builds_execution_is_compared_cell_by_cell_and_a_drifted_number_fails(tmp_path):
    from kvlab.report.params import notebook_parameters

    notebooks, executed = tmp_path / "notebooks", tmp_path / "executed"
    notebooks.mkdir()
    executed.mkdir()
    shutil.copy(ROOT / "conftest.py", tmp_path)  # the repository's hooks, as make test loads them
    defaults = notebook_parameters(SOURCE) | {"LEDGER_CSV": str(tmp_path / "ledger.csv")}
    (notebooks / SOURCE.name).write_text(json.dumps(_source()))
    nb = _source()
    number = _drift(nb)
    (executed / SOURCE.name).write_text(json.dumps(_as_papermill_wrote_it(nb, defaults)))
    other = notebooks / "01_other_seed.ipynb"  # run with a value other than the notebook's default
    other.write_text(json.dumps(_source()))
    (executed / other.name).write_text(json.dumps(_as_papermill_wrote_it(_source(), defaults | {"SEED": 1})))

    result = _pytest(tmp_path, "--nbval-executed", str(executed), str(notebooks))
    cells = _cells(_source())
    assert result.returncode == 1
    assert re.search(rf"\b1 failed, {cells - 1} passed, {cells} errors\b", result.stdout), result.stdout[-2000:]
    failure = result.stdout[result.stdout.index(f"{SOURCE.name}::Cell {number} ") :]
    assert "Cell outputs differ" in failure and DRIFTED in failure and NUMBER in failure  # nbval's message, the cell
    assert "01_other_seed.ipynb ran with other values than 01_other_seed.ipynb's defaults: {'SEED': 1}" in result.stdout
