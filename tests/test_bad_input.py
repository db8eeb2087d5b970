"""Every class of bad input gets one clear line before any work: what the user typed, its value, what is
allowed and, where there is one, the fix. One test per class, not per example."""

import re
import subprocess
import sys

import pytest

import kvlab.report.params as report_params
from conftest import ROOT
from kvlab.cli import main
from kvlab.core import resources, validate

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, (code, out, err)
    return err.strip()


# ---------------------------------------------------------------- sizes this machine cannot hold
@pytest.mark.parametrize(
    "argv, flag",
    [
        (["allocate", "--num-requests", "2000000000"], "--num-requests=2000000000"),
        (["simulate", "--num-requests", "200000000"], "--num-requests=200000000"),
    ],
)
def test_a_run_too_big_for_memory_is_refused_before_any_work(capsys, monkeypatch, argv, flag):
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 4 * 2**30)
    err = one_line_error(capsys, *argv)
    assert re.search(
        rf"{flag} is not allowed: needs about [\d.,]+ GiB of memory and this machine has 4\.0 GiB "
        r"available; at most [\d,]+ requests fit",
        err,
    ), err
    largest = int(re.search(r"at most ([\d,]+) requests", err).group(1).replace(",", ""))
    assert 0 < largest < int(argv[-1])  # the largest size that fits is named, and it is smaller


def test_the_report_refuses_a_size_before_any_notebook_runs(monkeypatch):
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 4 * 2**30)
    with pytest.raises(
        report_params.ReportError,
        match=r"^01_allocation\.NUM_REQUESTS=1000000000 is not allowed: "
        r"needs about [\d.]+ GiB of memory and this machine has 4\.0 GiB available; at most",
    ):
        report_params.load_params(ROOT / "params.yaml", ["01_allocation.NUM_REQUESTS=1000000000"], NOTEBOOKS)


def test_the_report_refuses_hours_of_work_before_any_notebook_runs(tmp_path):
    from kvlab.report.build import build
    from kvlab.report.params import ReportError

    with pytest.raises(
        ReportError,
        match=r"the report would take about [\d,]+ min on this machine, over the limit of "
        r"0.05 min \(--max-minutes\); 08_fleet takes most: lower its NUM_REQUESTS, ROUTERS or RATE_SCALES",
    ):
        build(ROOT / "params.yaml", [], tmp_path / "report", max_minutes=0.05, log=lambda *a, **k: None)
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "BAD"], "--set 'BAD' is not allowed: must look like NOTEBOOK.NAME=VALUE or NAME=VALUE"),
        (
            ["--set", "01_allocation.NUM_REQUESTS=0"],
            "01_allocation.NUM_REQUESTS=0 is not allowed: must be an integer "
            "from 1 to 10,000,000,000 requests (from --set)",
        ),
        (
            ["--set", "SEED=[1"],
            "--set 'SEED=[1' is not allowed: its value '[1' is not valid YAML (expected ',' or ']', "
            "but got '<stream end>'); give a number",
        ),
        (["--max-minutes", "0"], "--max-minutes=0.0 is not allowed: must be a number from 0.001"),
    ],
)
def test_kvlab_report_refuses_a_bad_parameter_in_one_line_with_status_2(capsys, tmp_path, argv, message):
    err = one_line_error(capsys, "report", "--out", str(tmp_path / "report"), *argv)
    assert err.startswith("kvlab report: error: " + message), err
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "01_allocation:\n  NUM_REQUESTS: [1\n",
            "params.yaml:3:1: expected ',' or ']', but got '<stream end>' (while "
            "parsing a flow sequence from 2:17): not valid YAML; the file maps each notebook's name to its NAME: VALUE lines",
        ),
        (
            "01_allocation:\n\tNUM_REQUESTS: 5\n",
            "params.yaml:2:1: found character '\\t' that cannot start any token "
            "(while scanning for the next token): not valid YAML",
        ),
        ("01_allocation: 5\n", "params.yaml: 01_allocation=5 is not allowed: must map its parameter names to values"),
    ],
)
def test_a_malformed_params_file_is_one_line_naming_its_line_and_column(capsys, tmp_path, text, message):
    (tmp_path / "params.yaml").write_text(text)
    err = one_line_error(capsys, "report", "--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "out"))
    assert err.startswith("kvlab report: error: " + message), err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- names: close matches
@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["capacity", "--gpu", "H100"],
            "--gpu='H100' is not allowed: not a gpu of data/gpus.csv; did you mean H100-SXM-80GB",
        ),
        (
            ["capacity", "--model", "qwen3-14"],
            "--model='qwen3-14' is not allowed: not a model of data/models.csv; did you mean Qwen/Qwen3-14B",
        ),
        (
            ["allocate", "--lengths", "article"],
            "--lengths='article' is not allowed: must be one of article-s1, article-s2",
        ),
    ],
)
def test_unknown_names_suggest_close_matches(capsys, argv, message):
    assert message in one_line_error(capsys, *argv)


def test_close_matches_rank_the_likeliest_first():
    with pytest.raises(ValueError, match=r"did you mean mooncake\?$"):
        validate.one_of("trace", "moncake", ["azure", "mooncake", "sharegpt"])


# ---------------------------------------------------------------- nothing is silently ignored
@pytest.mark.parametrize(
    "argv, both",
    [
        (["capacity", "--model", "Qwen3-14B", "--num-layers", "40"], ("--model", "--num-layers")),
        (["capacity", "--model", "Qwen3-14B", "--dtype-bytes", "1"], ("--dtype-bytes", "--model")),
        (["capacity", "--available-kv-gib", "3", "--gpu-memory-gib", "80"], ("--available-kv-gib", "--gpu-memory-gib")),
        (["capacity", "--gpu", "H100-SXM-80GB", "--gpu-memory-gib", "80"], ("--gpu", "--gpu-memory-gib")),
        (
            ["capacity", "--model", "Qwen3-14B", "--weights-gib", "28", "--weight-dtype", "fp8"],
            ("--weights-gib", "--weight-dtype"),
        ),
        (["allocate", "--trace", "x.csv", "--seed", "3"], ("--trace", "--seed")),
        (["simulate", "--trace", "x.csv", "--lengths", "constant"], ("--trace", "--lengths")),
    ],
)
def test_conflicting_flags_name_both(capsys, argv, both):
    err = one_line_error(capsys, *argv)
    assert f"{both[0]} and {both[1]} cannot be used together" in err, err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["capacity", "--unit", "GB"], "--unit"),
        (["allocate", "--skip-bad-rows"], "--skip-bad-rows"),
        (["simulate", "--constant-tokens", "80"], "--constant-tokens"),
    ],
)
def test_a_flag_that_would_do_nothing_is_an_error(capsys, argv, flag):
    assert f"{flag} applies only" in one_line_error(capsys, *argv)


def test_num_requests_with_a_trace_serves_its_first_requests(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{10 + i:02d}.000000,{100 + i},{5 + i}\n" for i in range(20))
    )
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--num-requests", "7", "--json")
    assert code == 0 and '"num_requests": 7' in out
    code, out, _ = run(capsys, "allocate", "--trace", str(trace), "--num-requests", "5", "--json")
    assert code == 0 and '"num_requests": 5' in out and '"used_tokens": 545' in out  # 100..104 + 5..9


# ---------------------------------------------------------------- messages in the user's own words, with a fix
def test_a_model_that_does_not_fit_names_the_gpu_typed_and_the_parallelism_that_fits(capsys):
    err = one_line_error(capsys, "capacity", "--model", "Llama-3.1-70B-Instruct", "--gpu", "H100-SXM-80GB")
    assert err.startswith("kvlab capacity: error: --gpu='H100-SXM-80GB' is not allowed: ")
    assert "fits with --tensor-parallel-size 4 or --pipeline-parallel-size 3" in err
    assert "gpu_memory" not in err


@pytest.mark.parametrize(
    "argv, forbidden",
    [
        (
            ["simulate", "--trace", str(ROOT / "tests" / "data" / "configs"), "--trace-format", "sharegpt"],
            "trace_format",
        ),
    ],
)
def test_messages_name_flags_not_library_arguments(capsys, argv, forbidden):
    err = run(capsys, *argv)[2]
    assert forbidden not in err


# ---------------------------------------------------------------- sane ranges
@pytest.mark.parametrize(
    "argv, flag, allowed",
    [
        (["simulate", "--arrival-rate", "1e-300"], "--arrival-rate=1e-300", "from 0.001 to 1,000,000 requests/s"),
        (["simulate", "--ms-per-token", "1e9"], "--ms-per-token=1000000000.0", "from 0.001 to 100,000 ms"),
        (["capacity", "--gpu-memory-gib", "1e7"], "--gpu-memory-gib=10000000.0", "from 0.001 to 100,000 GiB"),
        (["capacity", "--context", "1000000000"], "--context=1000000000", "from 1 to 100,000,000 tokens"),
        (["allocate", "--block-size", "4194304"], "--block-size=4194304", "from 1 to 1,048,576 tokens"),
    ],
)
def test_every_numeric_input_has_a_sane_range(capsys, argv, flag, allowed):
    assert f"{flag} is not allowed: must be " in (err := one_line_error(capsys, *argv)) and allowed in err


def test_every_range_is_documented():
    readme = (ROOT / "README.md").read_text()
    for quantity in validate.RANGES:
        assert quantity in readme, f"README does not document the range of {quantity}"


# ---------------------------------------------------------------- notebooks check their parameters
def test_a_notebook_run_by_hand_stops_at_its_first_cell_naming_the_parameter(tmp_path):
    done = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "papermill"),
            str(ROOT / "notebooks" / "03_capacity.ipynb"),
            str(tmp_path / "out.ipynb"),
            "-p",
            "BLOCK_SIZE",
            "0",
            "--no-progress-bar",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT / "notebooks",
        timeout=120,
    )
    assert done.returncode != 0
    assert "BLOCK_SIZE=0 is not allowed: must be an integer from 1 to 1,048,576 tokens" in done.stderr


def test_make_test_prints_the_reason_of_every_skip():
    test_target = (ROOT / "Makefile").read_text().split("\ntest:")[1].split("\n\n")[0]
    assert " -rs " in test_target


def test_cli_module_entry_point_gives_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", "simulate", "--num-requests", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
