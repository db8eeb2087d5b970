"""`kvlab capacity`: the article's figures, JSON keys, one-line errors with exit status 2."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from kvlab.cli import main

ARTICLE = ["--num-layers", "32", "--num-kv-heads", "32", "--head-dim", "128", "--dtype-bytes", "2",
           "--gpu-memory-gib", "80", "--weights-gib", "16"]


@pytest.mark.parametrize("context, fit", [(1000, 131), (4000, 32), (8000, 16), (32000, 4), (128000, 1)])
def test_json_gives_the_article_figures(capsys, context, fit):
    assert main(["capacity", *ARTICLE, "--context", str(context), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 524288
    assert out["bytes_per_request"] == 524288 * context
    assert out["max_num_requests"] == fit


def test_text_output_has_units(capsys):
    assert main(["capacity"]) == 0
    text = capsys.readouterr().out
    assert "524,288 B" in text and "0.488 GiB at 1,000 tokens" in text and "requests that fit    131" in text


@pytest.mark.parametrize("args, message", [
    (["--num-layers", "-1"], "kvlab capacity: error: --num-layers=-1 is not allowed: must be an integer >= 1"),
    (["--gpu-memory-gib", "0"], "kvlab capacity: error: --gpu-memory-gib=0.0 is not allowed: must be a finite number > 0"),
    (["--context", "0"], "kvlab capacity: error: --context=0 is not allowed: must be an integer >= 1"),
    (["--weights-gib", "80"], "kvlab capacity: error: --weights-gib=80.0 is not allowed: must be below the GPU memory (80 GiB)"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    assert main(["capacity", *args]) == 2
    err = capsys.readouterr().err
    assert err.strip() == message


def test_argparse_errors_are_one_line_too(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["capacity", "--num-layers", "many"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--num-layers: invalid int value: 'many'" in err


@pytest.mark.parametrize("command", [["kvlab"], [sys.executable, "-m", "kvlab"]])
def test_console_script_and_module(command):
    exe = [str(ROOT / ".venv" / "bin" / "kvlab")] if command == ["kvlab"] else command
    done = subprocess.run([*exe, "capacity", "--context", "128000", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["max_num_requests"] == 1
    bad = subprocess.run([*exe, "capacity", "--num-layers", "-3"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_help_explains(capsys):
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "KV bytes per token = 2 (K and V)" in text and "GiB = 2^30 bytes" in text
