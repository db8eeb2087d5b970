"""Where the report's inputs and outputs live: the checkout, its notebooks, params.yaml and report/."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
PARAMS_PATH = ROOT / "params.yaml"
REPORT_DIR = ROOT / "report"
