"""Sweeps that scale out: one function over a grid of points, on local processes or a Dask cluster.

`run(function, points)` applies a picklable, deterministic function to every point and returns the results
in the order of the points, whatever executor ran them: so a sweep gives the same numbers serially, on
local processes (the default) and on a Dask cluster (`SWEEP_SCHEDULER=tcp://host:8786`, or the scheduler
argument). Long sweeps show a progress bar on a terminal. Every run is recorded (where it ran, how many
points, how long) for the report's footer: when $KVLAB_SWEEP_LOG names a file, one JSON line per sweep.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from kvlab.core import validate

SCHEDULER_ENV = "SWEEP_SCHEDULER"
LOG_ENV = "KVLAB_SWEEP_LOG"
CONNECT_TIMEOUT_S = 10
SCHEDULERS = ("serial", "processes")


@dataclass(frozen=True)
class SweepRun:
    """Where a sweep ran and how long it took."""

    name: str
    where: str
    num_points: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.name}: {self.num_points:,} points on {self.where} in {self.seconds:,.1f} s"


def scheduler_of(scheduler: str | None) -> str:
    """The scheduler to use: the argument, else $SWEEP_SCHEDULER, else local processes; checked."""
    chosen = scheduler or os.environ.get(SCHEDULER_ENV) or "processes"
    if chosen not in SCHEDULERS and not chosen.startswith(("tcp://", "tls://", "inproc://")):
        validate.fail(
            "SWEEP_SCHEDULER", chosen, "must be serial, processes or a Dask scheduler address such as tcp://host:8786"
        )
    return chosen


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A one-line ValueError, within timeout_s, when nothing listens at a Dask scheduler's tcp address."""
    import socket
    import urllib.parse

    parsed = urllib.parse.urlsplit(address)
    if parsed.scheme != "tcp" or not parsed.hostname:
        return  # tls:// and inproc:// are checked when the sweep connects
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 8786), timeout=timeout_s):
            pass
    except OSError as error:
        raise ValueError(
            f"SWEEP_SCHEDULER={address!r} is not allowed: no Dask scheduler answered there within "
            f"{timeout_s:g} s ({type(error).__name__}); start one (dask scheduler) or unset it to "
            "use local processes"
        ) from None


def _dask_executor(address: str):
    """A concurrent.futures executor on the Dask cluster at address; one line at once where nothing listens there
    (check_reachable), within 10 s when none answers."""
    check_reachable(address)
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - distributed is pinned in requirements.lock
        raise ValueError("SWEEP_SCHEDULER names a Dask cluster, but dask.distributed is not installed") from None
    try:
        client = Client(address, timeout=f"{CONNECT_TIMEOUT_S}s", set_as_default=False)
    except (OSError, TimeoutError) as error:
        raise ValueError(
            f"SWEEP_SCHEDULER={address!r} is not allowed: no Dask scheduler answered there within "
            f"{CONNECT_TIMEOUT_S} s ({type(error).__name__}); start one (dask scheduler) or unset it "
            "to use local processes"
        ) from None
    workers = len(client.scheduler_info().get("workers", {}))
    return client, client.get_executor(), f"the Dask cluster at {address} ({workers} workers)"


def run(
    function: Callable,
    points: Sequence,
    *,
    scheduler: str | None = None,
    max_workers: int | None = None,
    name: str = "sweep",
    progress: bool | None = None,
) -> tuple[list, SweepRun]:
    """function(point) for every point, in the points' order, and where and how fast it ran.

    scheduler: "serial" (this process), "processes" (local processes, max_workers of them, default one per
    core), or a Dask scheduler address; default $SWEEP_SCHEDULER, else processes. function and points must
    pickle (a module-level function and plain values do). progress: a bar on stderr (default: on a terminal).
    """
    points = list(points)
    chosen = scheduler_of(scheduler)
    progress = sys.stderr.isatty() if progress is None else progress
    start = time.perf_counter()
    if chosen == "serial" or len(points) <= 1:
        where = "this process"
        results = [function(p) for p in _bar(points, progress, name)]
    else:
        client = None
        if chosen == "processes":
            workers = max_workers or os.cpu_count() or 1
            executor = concurrent.futures.ProcessPoolExecutor(max_workers=workers)
            where = f"{workers} local processes"
        else:
            client, executor, where = _dask_executor(chosen)
        try:
            futures = [executor.submit(function, p) for p in points]
            for _ in _bar(concurrent.futures.as_completed(futures), progress, name, total=len(futures)):
                pass
            results = [f.result() for f in futures]
        finally:
            executor.shutdown(wait=True)
            if client is not None:
                client.close()
    record = SweepRun(name, where, len(points), time.perf_counter() - start)
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(record)) + "\n")
    return results, record


def _bar(iterable, progress: bool, name: str, total: int | None = None):
    if not progress:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=name, unit="point", file=sys.stderr, leave=False)


def read_log(path) -> list[SweepRun]:
    """The sweeps recorded in a $KVLAB_SWEEP_LOG file (none when it does not exist)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [SweepRun(**json.loads(line)) for line in f if line.strip()]
    except FileNotFoundError:
        return []
