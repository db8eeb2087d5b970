"""`kvlab allocate`: figures, JSON keys, and one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvlab import workloads
from kvlab.cli import main
from kvlab.sections import s01_allocation as allocator

JSON_KEYS = {"reserved_tokens", "used_tokens", "wasted_tokens", "waste_pct", "max_num_requests"}


def run_json(capsys, *flags):
    assert main(["allocate", *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_issue_keys_and_the_library_numbers(capsys):
    out = run_json(capsys, "--num-requests", "20000", "--max-len", "4096", "--block-size", "16", "--seed", "0")
    assert JSON_KEYS <= set(out)
    lengths = workloads.sample_lengths("article-s1", 20000, np.random.default_rng(0))
    row = allocator.allocation_table(lengths, [16]).iloc[0]
    assert out["reserved_tokens"] == row["reserved_tokens"] and out["used_tokens"] == int(lengths.sum())
    assert out["wasted_tokens"] == out["reserved_tokens"] - out["used_tokens"]
    assert out["waste_pct"] == pytest.approx(100 * out["wasted_tokens"] / out["reserved_tokens"], abs=1e-6)
    assert out["max_num_requests"] == row["max_num_requests"]


def test_default_lengths_come_close_to_the_article_at_every_unit(capsys):
    article = {4096: (86.2, 30), 1024: (56.6, 94), 256: (19.0, 175), 64: (5.2, 205), 16: (1.3, 213)}
    for block, (waste_pct, fit) in article.items():
        out = run_json(capsys, "--block-size", str(block))
        assert abs(out["waste_pct"] - waste_pct) <= 1.0 and abs(out["max_num_requests"] - fit) <= 0.03 * fit
        assert out["used_tokens"] == pytest.approx(11_336_014, rel=0.02)


def test_memory_budget_flags(capsys):
    out = run_json(capsys, "--lengths", "constant", "--block-size", "1024", "--memory-gib", "80", "--mb-per-token", "1")
    assert out["reserved_tokens"] == 20000 * 1024 and out["max_num_requests"] == 80  # 81,920 MB / 1,024 MB


def test_text_output_has_units(capsys):
    assert main(["allocate", "--block-size", "256", "--num-requests", "1000"]) == 0
    text = capsys.readouterr().out
    for words in (
        "reserved",
        "tokens in blocks of 256",
        "% of reserved",
        "requests that fit",
        "in 60 GB at 0.5 MB per token",
    ):
        assert words in text


def test_help_lists_every_length_family(capsys):
    with pytest.raises(SystemExit):
        main(["allocate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in workloads.LENGTH_DISTRIBUTIONS:
        assert f"{name}:" in text
    assert "example: kvlab allocate" in text


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--block-size", "0"],
            "kvlab allocate: error: --block-size=0 is not allowed: must be an integer from 1 to 1,048,576 tokens",
        ),
        (["--block-size", "1.5"], "kvlab allocate: error: argument --block-size: invalid int value: '1.5'"),
        (["--num-requests", "0"], "kvlab allocate: error: --num-requests=0 is not allowed"),
        (["--max-len", "-4"], "kvlab allocate: error: --max-len=-4 is not allowed"),
        (["--lengths", "zipf"], "kvlab allocate: error: --lengths='zipf' is not allowed: must be one of article-s1"),
        (["--lengths", "article-s2", "--max-len", "500"], "kvlab allocate: error: lengths["),
        (["--memory-gib", "0"], "kvlab allocate: error: --memory-gib=0.0 is not allowed"),
        (["--mb-per-token", "-1"], "kvlab allocate: error: --mb-per-token=-1.0 is not allowed"),
        (
            ["--seed", "-1"],
            "kvlab allocate: error: --seed=-1 is not allowed: must be an integer from 0 to 9,223,372,036,854,775,807",
        ),
    ],
)
def test_bad_flags_are_one_line_errors_with_status_2(capsys, flags, message):
    try:
        code = main(["allocate", *flags])
    except SystemExit as exit_:  # argparse's own type errors exit from inside parse_args
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_console_script_runs():
    script = Path(sys.executable).parent / "kvlab"
    done = subprocess.run(
        [str(script), "allocate", "--num-requests", "1000", "--block-size", "64", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert JSON_KEYS <= set(json.loads(done.stdout))
