"""A drifted number fails the notebook test: when nbval runs the notebook itself, and when its cells are compared
with the report build's execution of it (conftest.py: each notebook is executed once in make test)."""

import json
import re
import shutil
import subprocess
import sys

from conftest import ROOT

SOURCE = ROOT / "notebooks" / "03_capacity.ipynb"


def _drift(nb: dict) -> int:
    """Change the first 131 a cell shows to 132 (text and HTML alike); the number of that code cell."""
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    for number, cell in enumerate(code):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "131" in "".join(data.get("text/plain", [])):
                for mime, old, new in (("text/plain", "131", "132"), ("text/html", ">131<", ">132<")):
                    if mime in data:
                        data[mime] = ["".join(data[mime]).replace(old, new, 1)]
                return number
    raise AssertionError(f"no output of {SOURCE.name} shows 131")


def _pytest(folder, *args):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env", *args],
        capture_output=True,
        text=True,
        cwd=folder,
    )


def _cells(path) -> int:
    return sum(cell["cell_type"] == "code" for cell in json.loads(path.read_text())["cells"])


def test_nbval_fails_on_a_drifted_number(tmp_path):
    drifted = tmp_path / SOURCE.name
    nb = json.loads(SOURCE.read_text())
    number = _drift(nb)
    drifted.write_text(json.dumps(nb))

    result = _pytest(tmp_path, str(drifted))
    assert result.returncode == 1
    assert f"1 failed, {_cells(SOURCE) - 1} passed" in result.stdout, result.stdout[-2000:]  # only the drifted cell
    assert f"{SOURCE.name}::Cell {number}" in result.stdout and "132" in result.stdout and "131" in result.stdout


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
    shutil.copy(SOURCE, notebooks)
    nb = json.loads(SOURCE.read_text())
    number = _drift(nb)
    (executed / SOURCE.name).write_text(json.dumps(_as_papermill_wrote_it(nb, defaults)))
    other = notebooks / "03_other_gpu.ipynb"  # run with a value other than the notebook's default
    shutil.copy(SOURCE, other)
    (executed / other.name).write_text(
        json.dumps(_as_papermill_wrote_it(json.loads(SOURCE.read_text()), defaults | {"GPU_MEMORY_GIB": 141}))
    )

    result = _pytest(tmp_path, "--nbval-executed", str(executed), str(notebooks))
    cells = _cells(SOURCE)
    assert result.returncode == 1
    assert re.search(rf"\b1 failed, {cells - 1} passed, {cells} errors\b", result.stdout), result.stdout[-2000:]
    failure = result.stdout[result.stdout.index(f"{SOURCE.name}::Cell {number} ") :]
    assert "Cell outputs differ" in failure and "132" in failure and "131" in failure  # nbval's message, the cell
    assert (
        "03_other_gpu.ipynb ran with other values than 03_other_gpu.ipynb's defaults: {'GPU_MEMORY_GIB': 141}"
        in result.stdout
    )
