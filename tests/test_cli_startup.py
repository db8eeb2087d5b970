"""The command line starts at once: building the parser and checking flags import numpy at most, and a bad report
parameter is refused before the report's build (papermill, nbconvert, WeasyPrint) is imported. Each check runs in
a fresh interpreter, where nothing was imported before."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

# What a command line that answers at once must not import (scipy: its special functions take ~0.5 s).
HEAVY = ["pandas", "matplotlib", "papermill", "nbconvert", "nbformat", "weasyprint", "scipy", "dask", "torch"]


def loaded_after(code: str) -> dict:
    """Run code in a fresh interpreter (this checkout's kvlab); the HEAVY modules it left imported, and what it
    printed last (a JSON object)."""
    probe = f"""
import json, sys
{code}
print(json.dumps({{"heavy": sorted(m for m in {HEAVY!r} if m in sys.modules), "numpy": "numpy" in sys.modules}}))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_kvlab_imports_nothing_heavy_not_even_numpy():
    found = loaded_after("import kvlab")
    assert found == {"heavy": [], "numpy": False}


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--num-requests", "1000", "--seed", "3"],
        ["capacity", "--model", "Qwen3-14B", "--gpu", "H100-SXM-80GB", "--max-model-len", "32768"],
        ["allocate", "--block-size", "64"],
        ["report", "--set", "03_capacity.GPU_MEMORY_GIB=141"],
        ["traces", "download", "--trace", "azure"],
        [
            "plan",
            "--model",
            "Qwen3-32B",
            "--gpu",
            "H100-SXM-80GB",
            "--arrival-rate",
            "3",
            "--slo-ttft-p95-s",
            "1",
            "--max-num-seqs",
            "64,128",
        ],
    ],
)
def test_the_parser_is_built_and_flags_checked_without_heavy_imports(argv):
    code = f"""
from kvlab.cli import build_parser
from kvlab.cli.common import typed_flags
parser, commands = build_parser()
args = parser.parse_args({argv!r})
assert args.command == {argv[0]!r}
given = typed_flags({argv!r})
"""
    assert loaded_after(code)["heavy"] == []


def test_help_and_a_refused_flag_import_nothing_heavy():
    code = """
from kvlab.cli import main
for argv in (["--help"], ["simulate", "--help"]):
    try:
        main(argv)
    except SystemExit as stop:
        assert stop.code == 0
assert main(["simulate", "--num-requests", "-3"]) == 2
assert main(["plan", "--model", "Qwen3-32B", "--gpu", "H100-SXM-80GB", "--arrival-rate", "3"]) == 2   # no objective
assert main(["plan", "--slo-e2e-p95-s", "9", "--max-num-seqs", "64,x"]) == 2
"""
    assert loaded_after(code)["heavy"] == []


@pytest.mark.parametrize(
    "value, message",
    [
        ("NO_SUCH_PARAM=3", "no notebook has a parameter 'NO_SUCH_PARAM'"),
        ("02_batching.NUM_REQUESTS=many", "must be an integer like 600"),
        ("03_capacity.GPU_MEMORY_GIB=0", "must be a number from 0.001 to 100,000 GiB"),
        ("03_capacity.PLAN_GPU=RTX-9999", "not a gpu of data/gpus.csv"),
        ("06_memory_budget.MODEL=no-such/model", "not a model of data/models.csv"),
        ("02_batching.NUM_REQUESTS=10000000000", "of memory and this machine has"),
        ("06_memory_budget.NUM_SEEDS=1000", "the report would take about"),
    ],
)
def test_a_bad_report_parameter_is_refused_before_the_build_is_imported(tmp_path, value, message):
    code = f"""
import contextlib, io
from kvlab.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        main(["report", "--no-pdf", "--out", {str(tmp_path / "report")!r}, "--set", {value!r}])
    except SystemExit as stop:
        assert stop.code == 1, stop.code
assert {message!r} in err.getvalue(), err.getvalue()
"""
    assert loaded_after(code)["heavy"] == []
    assert not (tmp_path / "report").exists()
