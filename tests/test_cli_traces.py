"""`kvlab allocate --trace` and `kvlab simulate --trace`: real-trace workloads, bad rows and one-line errors."""

import json

import numpy as np
import pytest

from kvlab.cli import main
from kvlab.core import batching as simulator
from kvlab.core.service_time import TokenServiceTime
from kvlab.sections import s01_allocation as allocator
from kvlab.workloads import Workload, traces

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "2023-11-16 18:15:47.1805900,30,300\r\n"
    "2023-11-16 18:15:49.6805900,1000,20"
)
MOONCAKE = (
    '{"timestamp": 1000, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]}\n'
    '{"timestamp": 1000, "input_length": 100, "output_length": 90, "hash_ids": [0]}\n'
    '{"timestamp": 4000, "input_length": 1030, "output_length": 5, "hash_ids": [0, 2, 3]}\n'
)
SHAREGPT = (
    "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
    "10,100,110,0.1\n50,7,57,7.1\n300,20,320,15.0\n20,400,420,0.05\n"
)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode())
    return str(path)


def run(capsys, *argv):
    """(exit status, stdout, stderr) of one kvlab command."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys, *argv):
    status, out, err = run(capsys, *argv, "--json")
    assert status == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------- kvlab allocate


@pytest.mark.parametrize(
    "name, text, lengths",
    [
        ("az.csv", AZURE, [418, 330, 1020]),
        ("moon.jsonl", MOONCAKE, [610, 190, 1035]),
        ("share.csv", SHAREGPT, [110, 57, 320, 420]),
    ],
)
def test_allocate_counts_prompt_plus_output_of_every_format(tmp_path, capsys, name, text, lengths):
    out = run_json(capsys, "allocate", "--trace", write(tmp_path, name, text), "--block-size", "64")
    row = allocator.allocation_table(np.array(lengths), [64]).iloc[0]
    assert out["used_tokens"] == sum(lengths) and out["num_requests"] == len(lengths)
    assert out["reserved_tokens"] == row["reserved_tokens"] and out["max_num_requests"] == row["max_num_requests"]
    assert out["lengths"] == "trace" and out["num_skipped_rows"] == 0 and out["num_dropped_over_max_len"] == 0


def test_allocate_over_max_len_is_an_error_unless_dropped(tmp_path, capsys):
    path = write(tmp_path, "az.csv", AZURE)
    status, out, err = run(capsys, "allocate", "--trace", path, "--max-len", "400")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--max-len=400 is not allowed: 2 of the trace's 3 requests are longer (largest 1,020 tokens" in err
    out = run_json(capsys, "allocate", "--trace", path, "--max-len", "400", "--drop-over-max-len")
    assert out["num_dropped_over_max_len"] == 2 and out["used_tokens"] == 330 and out["num_requests"] == 1
    status, _, err = run(capsys, "allocate", "--trace", path, "--max-len", "300", "--drop-over-max-len")
    assert status == 2 and "every request of the trace is longer (shortest 330 tokens)" in err


def test_allocate_text_names_the_trace_and_the_skipped_rows(tmp_path, capsys):
    path = write(tmp_path, "az.csv", AZURE + "\r\n2023-11-16 18:15:50.0,-5,3")
    status, out, _ = run(capsys, "allocate", "--trace", path, "--skip-bad-rows", "--block-size", "16")
    assert status == 0
    assert "3 from azure trace" in out and "4 read, 1 bad rows skipped, 0 requests over --max-len dropped" in out


# ------------------------------------------------------------------------------- kvlab simulate


def test_simulate_serves_the_trace_arrivals_and_output_lengths(tmp_path, capsys):
    out = run_json(
        capsys,
        "simulate",
        "--trace",
        write(tmp_path, "az.csv", AZURE),
        "--policy",
        "static",
        "--slots",
        "2",
        "--ms-per-token",
        "10",
    )
    expected = simulator.simulate(
        Workload(np.array([0.0, 0.5, 3.0]), np.array([374, 30, 1000]), np.array([44, 300, 20])),
        "static",
        max_num_seqs=2,
        cost=TokenServiceTime(10),
    )
    assert out["num_requests"] == 3 and out["poisson_arrivals"] is False
    # static, 2 slots: the first two start at 0.5 s together and hold until 0.5 + 3 s; the third then runs 0.2 s
    assert out["makespan_s"] == pytest.approx(3.7) == pytest.approx(expected.summary()["makespan_s"])
    assert out["mean_latency_s"] == pytest.approx(expected.summary()["mean_latency_s"])


def test_simulate_mooncake_timestamps_are_ms_from_the_first_row(tmp_path, capsys):
    out = run_json(
        capsys, "simulate", "--trace", write(tmp_path, "m.jsonl", MOONCAKE), "--slots", "1", "--ms-per-token", "1"
    )
    # one slot: 10 + 90 tokens from 0 s (done 0.1 s), the third arrives at 3 s and takes 0.005 s
    assert out["makespan_s"] == pytest.approx(3.005) and out["trace_format"] == "mooncake"


def test_simulate_sharegpt_needs_a_rate_and_draws_seeded_poisson_arrivals(tmp_path, capsys):
    path = write(tmp_path, "s.csv", SHAREGPT)
    status, out, err = run(capsys, "simulate", "--trace", path)
    assert status == 2 and out == ""
    assert err.strip() == (
        "kvlab simulate: error: --arrival-rate is needed: the sharegpt trace has no timestamps, "
        "so its requests arrive as a Poisson process at a rate you give (requests/s)"
    )
    first = run_json(capsys, "simulate", "--trace", path, "--arrival-rate", "2", "--seed", "3")
    again = run_json(capsys, "simulate", "--trace", path, "--arrival-rate", "2", "--seed", "3")
    other = run_json(capsys, "simulate", "--trace", path, "--arrival-rate", "2", "--seed", "4")
    assert first == again and first["makespan_s"] != other["makespan_s"] and first["poisson_arrivals"] is True
    load = traces.load_trace(path, arrival_rate_per_s=2.0, rng=np.random.default_rng(3))
    assert first["makespan_s"] == pytest.approx(simulator.simulate(load.workload).summary()["makespan_s"])


def test_a_trace_is_named_as_the_notebooks_name_it_and_read_from_the_trace_folder(tmp_path, capsys, monkeypatch):
    """--trace azure: the azure trace's file in $TRACE_DIR (data/traces.toml's name); a name whose file is missing is
    refused in one line naming the file looked for."""
    monkeypatch.setenv("TRACE_DIR", str(tmp_path))
    write(tmp_path, traces.read_manifest()["azure"]["file"], AZURE)
    argv = ["simulate", "--policy", "static", "--slots", "2", "--ms-per-token", "10"]
    assert run_json(capsys, *argv, "--trace", "azure")["num_requests"] == 3
    status, _, err = run(capsys, *argv, "--trace", "mooncake")
    missing = str(tmp_path / traces.read_manifest()["mooncake"]["file"])
    assert status == 2 and f"--trace={missing!r} is not allowed: cannot be read" in err and len(err.splitlines()) == 1


def test_simulate_refuses_a_rate_for_a_timed_trace(tmp_path, capsys):
    status, _, err = run(capsys, "simulate", "--trace", write(tmp_path, "az.csv", AZURE), "--arrival-rate", "3")
    assert status == 2 and "--arrival-rate=3.0 is not allowed: the azure trace has its own timestamps" in err


# ------------------------------------------------------------------------------- bad rows and files

BAD_ROWS = [
    ("az.csv", AZURE + "\r\n2023-11-16 18:15:50.0,12", "az.csv:5: 2 columns where the header has 3"),
    ("az.csv", AZURE + "\r\n2023-11-16 18:15:50.0,twelve,3", "az.csv:5: ContextTokens='twelve' is not allowed"),
    ("az.csv", AZURE + "\r\n2023-11-16 18:15:50.0,12,-3", "az.csv:5: GeneratedTokens='-3' is not allowed"),
    (
        "az.csv",
        AZURE + "\r\n2023-11-16 18:15:40.0,12,3",
        "az.csv:5: timestamp 2023-11-16 18:15:40 is not allowed: it goes backwards",
    ),
    (
        "m.jsonl",
        MOONCAKE + '{"timestamp": 5000, "input_length": 5, "hash_ids": [0]}\n',
        "m.jsonl:4: missing column(s) output_length",
    ),
    (
        "m.jsonl",
        MOONCAKE + '{"timestamp": 2000, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n',
        "m.jsonl:4: timestamp 2000 is not allowed: it goes backwards",
    ),
    ("s.csv", SHAREGPT + "7,-1,6,0.0\n", "s.csv:6: num_decode_tokens='-1' is not allowed"),
]


@pytest.mark.parametrize("command", [["allocate"], ["simulate", "--arrival-rate", "5"]])
@pytest.mark.parametrize("name, text, message", BAD_ROWS)
def test_a_bad_row_is_one_line_with_status_2_or_skipped_and_counted(tmp_path, capsys, command, name, text, message):
    path = write(tmp_path, name, text)
    extra = command[1:] if name == "s.csv" else []
    status, out, err = run(capsys, command[0], "--trace", path, *extra)
    assert status == 2 and out == "" and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith(f"kvlab {command[0]}: error: {tmp_path}/{message}")
    result = run_json(capsys, command[0], "--trace", path, *extra, "--skip-bad-rows")
    assert result["num_skipped_rows"] == 1 and result["num_rows"] == (5 if name == "s.csv" else 4)
    status, out, _ = run(capsys, command[0], "--trace", path, *extra, "--skip-bad-rows")
    assert status == 0 and "1 bad rows skipped" in out


@pytest.mark.parametrize("command", ["allocate", "simulate"])
@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty.csv:1: the file is empty"),
        (
            "TIMESTAMP,ContextTokens\n2023-11-16 18:15:50.0,12\n",
            "empty.csv:1: the header lacks column(s) GeneratedTokens",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "empty.csv: no requests: no data rows"),
    ],
)
def test_empty_or_headless_files_are_one_line_errors(tmp_path, capsys, command, text, message):
    path = write(tmp_path, "empty.csv", text)
    status, out, err = run(capsys, command, "--trace", path, "--trace-format", "azure", "--skip-bad-rows")
    assert status == 2 and out == "" and len(err.splitlines()) == 1 and message in err


def test_missing_file_and_wrong_format_flag(tmp_path, capsys):
    status, _, err = run(capsys, "simulate", "--trace", str(tmp_path / "nope.csv"))
    assert status == 2 and err.strip().endswith("cannot be read (No such file or directory)")
    assert err.startswith("kvlab simulate: error: --trace=")
    status, _, err = run(capsys, "allocate", "--trace", write(tmp_path, "m.jsonl", MOONCAKE), "--trace-format", "azure")
    assert status == 2 and "the header lacks column(s) TIMESTAMP, ContextTokens, GeneratedTokens" in err
    with pytest.raises(SystemExit) as exit_:
        main(["allocate", "--trace", "x.csv", "--trace-format", "parquet"])
    assert exit_.value.code == 2


def test_help_says_what_a_trace_length_is(capsys):
    with pytest.raises(SystemExit):
        main(["allocate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "prompt + output tokens" in text and "--drop-over-max-len" in text and "--skip-bad-rows" in text
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "relative to the first row" in text and "Poisson arrivals at --arrival-rate" in text


@pytest.mark.parametrize("command", ["allocate", "simulate"])
def test_a_binary_trace_is_one_line_naming_the_file(tmp_path, capsys, command):
    path = tmp_path / "bin.csv"
    path.write_bytes(b"x\x00\xff\xfe\n")
    status, out, err = run(capsys, command, "--trace", str(path))
    assert status == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"kvlab {command}: error: {path}: is not UTF-8 text")
