"""Sweeps give the same numbers serially, on local processes and on a Dask cluster; a bad address is one line."""

import time

import pytest

from kvlab.sections import s02_batching as batching
from kvlab.studies import sweep

POINTS = [{"arrival_rate": rate, "seed": seed} for rate in (8.0, 11.0, 14.0) for seed in range(3)]


def mean_latency(point: dict) -> float:
    """One section 2 run: a module-level function, so that it pickles for other processes and machines."""
    experiment = batching.Experiment(num_requests=200, arrival_rate=point["arrival_rate"])
    table = batching.compare_policies(experiment.workload(point["seed"]), cost=experiment.cost)
    return float(table.loc["static", "mean_latency_s"]), float(table.loc["continuous", "mean_latency_s"])


def test_serial_and_local_processes_give_identical_results_in_order():
    serial, record = sweep.run(mean_latency, POINTS, scheduler="serial", name="s2")
    assert record.where == "this process" and record.num_points == len(POINTS)
    parallel, record = sweep.run(mean_latency, POINTS, scheduler="processes", max_workers=2, name="s2")
    assert parallel == serial and record.where == "2 local processes"


def test_a_dask_local_cluster_gives_identical_results():
    from distributed import LocalCluster

    serial, _ = sweep.run(mean_latency, POINTS, scheduler="serial")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        on_dask, record = sweep.run(mean_latency, POINTS, scheduler=cluster.scheduler_address)
    assert on_dask == serial
    assert record.where.startswith(f"the Dask cluster at {cluster.scheduler_address} (2 workers)")


def test_a_dask_address_that_does_not_answer_is_one_line_within_ten_seconds():
    start = time.monotonic()
    with pytest.raises(
        ValueError,
        match=r"^SWEEP_SCHEDULER='tcp://127.0.0.1:9' is not allowed: no Dask scheduler "
        r"answered there within 10 s",
    ):
        sweep.run(mean_latency, POINTS, scheduler="tcp://127.0.0.1:9")
    assert time.monotonic() - start < 15


def test_a_scheduler_that_is_no_scheduler_is_refused(monkeypatch):
    monkeypatch.setenv("SWEEP_SCHEDULER", "threads")
    with pytest.raises(
        ValueError, match="SWEEP_SCHEDULER='threads' is not allowed: must be serial, processes or a Dask"
    ):
        sweep.run(mean_latency, POINTS)


def test_every_sweep_is_logged_for_the_report(tmp_path, monkeypatch):
    log = tmp_path / "sweeps.jsonl"
    monkeypatch.setenv("KVLAB_SWEEP_LOG", str(log))
    sweep.run(mean_latency, POINTS[:2], scheduler="serial", name="first")
    sweep.run(mean_latency, POINTS[:3], scheduler="serial", name="second")
    runs = sweep.read_log(log)
    assert [(r.name, r.num_points, r.where) for r in runs] == [
        ("first", 2, "this process"),
        ("second", 3, "this process"),
    ]
    assert "points on this process in" in str(runs[0])


def test_the_report_refuses_an_unreachable_dask_address_before_any_notebook_runs():
    import kvlab.report.params as report_params
    from conftest import ROOT

    start = time.monotonic()
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    with pytest.raises(
        report_params.ReportError,
        match=r"SWEEP_SCHEDULER='tcp://127.0.0.1:9' is not allowed: no Dask "
        r"scheduler answered there within 10 s",
    ):
        report_params.load_params(ROOT / "params.yaml", ["SWEEP_SCHEDULER=tcp://127.0.0.1:9"], notebooks)
    assert time.monotonic() - start < 15
