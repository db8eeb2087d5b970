"""`kvlab simulate`: the command line over kvlab.core.batching."""
import json
import subprocess
import sys

import numpy as np
import pytest

from kvlab import cli
from kvlab.core import batching as simulator
from kvlab.workloads import synthetic

KEYS = ["num_requests", "mean_latency_s", "p95_latency_s", "max_latency_s", "mean_queue_s", "makespan_s",
        "throughput_rps", "busy_slot_s", "idle_share"]


def run_json(capsys, *flags):
    assert cli.main(["simulate", *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_json_has_the_issue_keys_and_the_librarys_numbers(capsys, policy):
    out = run_json(capsys, "--policy", policy, "--slots", "8", "--ms-per-token", "8", "--num-requests", "600",
                   "--arrival-rate", "11", "--lengths", "article", "--seed", "0")
    assert list(out) == KEYS
    workload = synthetic.article_s2_workload(600, 11.0, "article", np.random.default_rng(0))
    assert out == pytest.approx(simulator.simulate(workload, policy).summary())


def test_constant_lengths_and_flags_reach_the_model(capsys):
    out = run_json(capsys, "--policy", "static", "--slots", "4", "--ms-per-token", "10", "--num-requests", "50",
                   "--lengths", "constant", "--constant-tokens", "100")
    assert out["num_requests"] == 50
    assert out["busy_slot_s"] == pytest.approx(50 * 100 * 0.010)
    assert out["max_latency_s"] >= 1.0  # every request holds its slot 1 s


def test_text_output_names_units(capsys):
    assert cli.main(["simulate", "--policy", "static", "--num-requests", "100"]) == 0
    out = capsys.readouterr().out
    assert "static, 8 slots, 8 ms per output token" in out
    summary = simulator.simulate(synthetic.article_s2_workload(100, 11.0, "article", np.random.default_rng(0)),
                                 "static").summary()
    assert f"mean {summary['mean_latency_s']:,.2f} s" in out
    assert f"{100 * summary['idle_share']:.1f}% idle" in out


@pytest.mark.parametrize("flags, message", [
    (["--slots", "0"], "--slots=0 is not allowed: must be an integer from 1 to 1,000,000 requests"),
    (["--slots", "-2"], "--slots=-2 is not allowed"),
    (["--ms-per-token", "0"], "--ms-per-token=0.0 is not allowed: must be a number from 0.001 to 100,000 ms"),
    (["--ms-per-token", "-8"], "--ms-per-token=-8.0 is not allowed"),
    (["--arrival-rate", "0"], "--arrival-rate=0.0 is not allowed: must be a number from 0.001 to 1,000,000 requests/s"),
    (["--num-requests", "0"], "--num-requests=0 is not allowed: must be an integer from 1 to 10,000,000,000 requests"),
    (["--lengths", "constant", "--constant-tokens", "0"], "--constant-tokens=0 is not allowed"),
    (["--seed", "-1"], "--seed=-1 is not allowed: must be an integer from 0 to 9,223,372,036,854,775,807"),
    (["--ms-per-token", "nan"], "--ms-per-token=nan is not allowed: must be a number from 0.001 to 100,000 ms"),
    (["--arrival-rate", "inf"], "--arrival-rate=inf is not allowed: must be a number from 0.001 to 1,000,000 requests/s"),
])
def test_bad_values_give_one_line_naming_the_flag_and_status_2(capsys, flags, message):
    assert cli.main(["simulate", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab simulate: error: " + message)
    assert err.count("\n") == 1


@pytest.mark.parametrize("flags, message", [
    (["--policy", "greedy"], "argument --policy: invalid choice: 'greedy'"),
    (["--lengths", "zipf"], "argument --lengths: invalid choice: 'zipf'"),
    (["--slots", "eight"], "argument --slots: invalid int value: 'eight'"),
])
def test_unparsable_flags_give_one_line_and_status_2(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["simulate", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab simulate: error: ") and message in err
    assert err.count("\n") == 1


def test_console_script_runs():
    done = subprocess.run([sys.executable, "-m", "kvlab", "simulate", "--num-requests", "20", "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["num_requests"] == 20
