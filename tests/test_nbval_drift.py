"""nbval catches drift: a changed number in a committed output fails the notebook test."""
import json
import shutil
import subprocess
import sys

from conftest import ROOT


def _run_nbval(path):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
                           "--nbval-current-env", str(path)], capture_output=True, text=True, cwd=path.parent)


def test_nbval_fails_on_a_drifted_number(tmp_path):
    source = ROOT / "notebooks" / "03_capacity.ipynb"
    clean = tmp_path / "clean" / source.name
    drifted = tmp_path / "drifted" / source.name
    for target in (clean, drifted):
        target.parent.mkdir()
        shutil.copy(source, target)
    nb = json.loads(drifted.read_text())
    changed = 0
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "131" in "".join(data.get("text/plain", [])):
                for mime in ("text/plain", "text/html"):
                    if mime in data:
                        data[mime] = ["".join(data[mime]).replace(">131<" if mime == "text/html" else "131",
                                                                  ">132<" if mime == "text/html" else "132", 1)]
                changed += 1
                break
        if changed:
            break
    assert changed == 1
    drifted.write_text(json.dumps(nb))

    assert _run_nbval(clean).returncode == 0
    result = _run_nbval(drifted)
    assert result.returncode == 1
    assert "132" in result.stdout and "131" in result.stdout
