"""Exploring: every notebook runs to its end with parameters other than its defaults (another GPU, other models,
other block sizes, fewer seeds), the way a reader changes them; nothing in it is tied to a default's names."""

import json
import os
import signal
import subprocess
import sys

import nbformat
import pytest

from conftest import ROOT
from kvlab.workloads import traces

RUNS = {
    "01_allocation": {"BLOCK_SIZES": [1024, 256, 16], "NUM_SEEDS": 5, "NUM_REQUESTS": 4000, "TRACE": ""},
    "02_batching": {
        "NUM_SEEDS": 5,
        "SWEEP_SEEDS": 2,
        "SWEEP_RATES": [9.0, 12.0],
        "SWEEP_CVS": [0.0, 1.0],
        "TRACE": "",
        "MAX_NUM_SEQS": 4,
    },
    "03_capacity": {
        "PLAN_GPU": "A100-40GB",
        "PLAN_MODELS": ["Qwen/Qwen3-14B"],
        "TABLE_MODELS": ["Qwen/Qwen3-14B"],
        "PLAN_TENSOR_PARALLEL_SIZES": [1, 2],
        "LOG_MAX_MODEL_LEN": 8192,
        "GPU_MEMORY_GIB": 141,
        "HYBRID_MODELS": ["google/gemma-2-27b-it"],
        "HYBRID_MAX_MODEL_LEN": 32768,
        "HYBRID_AT_ONCE": 4,
        "HYBRID_NUM_REQUESTS": 60,
    },
    "05_calibration": {"GPUS": ["A100-40GB"], "BATCH_SIZES": [4], "CONTEXTS": [2048], "MAX_NUM_SEQS": 4},
    "04_traces": {"SHAREGPT_RATE_PER_S": 4.0, "SEED": 1, "RATE_WINDOW_S": 30.0, "CACHE_SIZES_BLOCKS": [128, 8192]},
    "06_memory_budget": {
        "MODEL": "meta-llama/Llama-2-7b-hf",
        "KV_CACHE_GIB": 8.0,
        "BLOCK_SIZE": 32,
        "NUM_REQUESTS": 300,
        "SHAREGPT_RATES": [0.5, 2.0],
        "ALPACA_RATES": [5.0, 40.0],
        "LATENCY_BOUNDS_S": [0.5],
        "BLOCK_SIZES": [8, 32],
        "KV_CACHE_GIBS": [4.0, 8.0],
        "AZURE_RATE_SCALES": [1.0],
        "MOONCAKE_NUM_REQUESTS": 200,
        "MOONCAKE_RATE_SCALES": [1.0],
        "ARTICLE_MAX_NUM_SEQS": [8],
    },
    "07_plan": {
        "MODEL": "meta-llama/Llama-3.1-8B",
        "TRACE": "",
        "NUM_REQUESTS": 300,
        "SLO_TTFT_P95_S": None,
        "SLO_E2E_P95_S": 30.0,
        "TENSOR_PARALLEL_SIZES": [1, 2],
        "MAX_NUM_SEQS": [64],
        "MAX_NUM_BATCHED_TOKENS": [8192],
        "GPU_MEMORY_UTILIZATIONS": [0.9],
        "KV_CACHE_DTYPES": ["fp8"],
        "NUM_REPLICAS": [1, 2],
        "HALVING_CHECKS": 1,
        "SWEEP_SCHEDULER": "serial",
    },
    "08_fleet": {
        "GPU": "A100-SXM-80GB",
        "STEP_COST": "roofline",
        "NUM_INSTANCES": 3,
        "ROUTERS": ["dynamo-kv", "round-robin"],
        "NUM_REQUESTS": 300,
        "RATE_SCALES": [2.0],
    },
}
NEEDS_TRACES = {"04_traces", "06_memory_budget", "08_fleet"}  # the whole notebook is about the real traces


def _can_run(stem: str) -> bool:
    return stem not in NEEDS_TRACES or not traces.missing_traces()


AT_ONCE = 2  # runs going at once: one a core (kernels started all together can die before they answer)


class Runs:
    """The runs of RUNS that can run here, in the tests' order, AT_ONCE at a time (papermill's command line, a process
    and a kernel each): the next starts while a test waits for the one before it."""

    def __init__(self, folder):
        self.folder, self.started = folder, {}
        self.queue = [stem for stem in sorted(RUNS) if _can_run(stem)]

    def _start(self, stem: str) -> None:
        out = self.folder / f"{stem}.ipynb"
        notebook = str(ROOT / "notebooks" / f"{stem}.ipynb")
        options = ["-y", json.dumps(RUNS[stem]), "-k", "python3", "--cwd", str(ROOT / "notebooks"), "--no-progress-bar"]
        process = subprocess.Popen(  # papermill and its kernel: one process group
            [sys.executable, "-m", "papermill", notebook, str(out), *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.started[stem] = out, process

    def result(self, stem: str) -> tuple:
        """stem's run, once done: (executed copy, process, its output); the runs after it keep AT_ONCE going."""
        for other in [stem] + self.queue:
            going = sum(process.poll() is None for _, process in self.started.values())
            if other not in self.started and (other == stem or going < AT_ONCE):
                self._start(other)
        out, process = self.started[stem]
        return out, process, process.communicate()[0]

    def close(self) -> None:
        for _, process in self.started.values():
            if process.poll() is None:  # the session ended first (an interrupt, -x): stop it and its kernel
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs (see the class), closed at the end of the module."""
    started = Runs(tmp_path_factory.mktemp("exploring"))
    yield started
    started.close()


@pytest.mark.parametrize("stem", sorted(RUNS))
def test_a_notebook_runs_with_other_parameters(stem, runs):
    if not _can_run(stem):
        pytest.skip(f"{stem} needs the real traces, not in {traces.trace_dir()} (set TRACE_DIR or run make traces)")
    out, process, output = runs.result(stem)
    assert process.returncode == 0, f"{stem} failed with {RUNS[stem]}:\n" + "\n".join(output.splitlines()[-15:])
    last = [c for c in nbformat.read(out, as_version=4).cells if c.cell_type == "code"][-1]
    assert any(o.get("name") == "stdout" and o["text"].strip() for o in last.outputs)  # the headline printed


def test_the_capacity_headline_names_what_the_table_holds_not_a_default_model():
    import pandas as pd

    from kvlab.sections.s03_capacity import log_headline

    table = pd.DataFrame(
        {
            "max_model_len": [4096, 32768, 32768, 32768],
            "tensor_parallel_size": [1, 1, 4, 8],
            "max_concurrency": [28.5, 1.77, 14.7, float("nan")],
        },
        index=["a/small", "b/tight", "c/wide", "d/huge"],
    )
    assert log_headline(table) == (
        "most requests at once small 28.50x (TP 1, its 4,096-token limit); "
        "fewest tight 1.77x (TP 1); needing the most GPUs to fit, wide 14.70x (TP 4); "
        "fit on no tensor parallel size: huge"
    )
    assert log_headline(table.iloc[[3]]) == "fit on no tensor parallel size: huge"


def test_the_step_headline_uses_the_asked_column_or_the_first_one_there_is():
    import pandas as pd

    from kvlab.sections.s05_calibration import step_headline

    bound = pd.DataFrame(
        [[1.0, 2.0], [0.5, float("nan")]], index=["G1", "G2"], columns=pd.MultiIndex.from_tuples([(1, 1024), (8, 1024)])
    )
    assert step_headline(bound, 8, 1024) == "2.00 ms on G1 at batch 8, 1,024 tokens"
    assert step_headline(bound, 4, 2048) == "1.00 ms on G1, 0.50 ms on G2 at batch 1, 1,024 tokens"
