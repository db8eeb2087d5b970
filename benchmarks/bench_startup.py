"""Start-up of the `kvlab` command line, each figure a whole process: median wall time of RUNS fresh processes.
Then the compiled engine's first run: `kvlab simulate` of 20,000 requests (the compiled loop), each scheduling mode,
in a fresh numba cache folder (numba compiles the loop, and says so) and again (the cache serves it).

--help, `simulate --help` and a refused flag beside `python -c "import numpy"` (the reference: the least a numpy
program costs); every kind of refused report parameter beside the 1 s target; `kvlab simulate` of 1,000,000
requests beside the bare heap loop of benchmarks/heap_loop.py over the same requests. The commands take turns, so
a busy machine slows all of them alike; bytecode caches are written and used, as after a first run."""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = 5  # timed runs per command (after one untimed run that writes the bytecode caches)
HELP_RATIO = 3.0  # --help, simulate --help and a refused flag: at most this many times the numpy import
REFUSAL_S = 1.0  # a refused report parameter, whole process, s
SIMULATE_RATIO = 1.5  # kvlab simulate of 1,000,000 requests: at most this many times the bare heap loop
NUM_REQUESTS = 1_000_000

KVLAB = [sys.executable, "-m", "kvlab"]
NUMPY = ("python -c 'import numpy' (reference)", [sys.executable, "-c", "import numpy"], 0, "")
QUICK = [  # (label, command, exit status, words its output must hold)
    ("kvlab --help", KVLAB + ["--help"], 0, "usage: kvlab"),
    ("kvlab simulate --help", KVLAB + ["simulate", "--help"], 0, "usage: kvlab simulate"),
    (
        "refused flag: kvlab simulate --num-requests -3",
        KVLAB + ["simulate", "--num-requests", "-3"],
        2,
        "--num-requests=-3 is not allowed",
    ),
]
REPORT_REFUSALS = [  # (kind, --set value, words the refusal must hold): kvlab.sections.shared.parameters' rules and guards
    ("unknown name", "NO_SUCH_PARAM=3", "no notebook has a parameter"),
    ("bad value", "02_batching.NUM_REQUESTS=many", "must be an integer like"),
    ("out of range", "03_capacity.GPU_MEMORY_GIB=0", "must be a number from"),
    ("unknown GPU", "03_capacity.PLAN_GPU=RTX-9999", "not a gpu of data/gpus.csv"),
    ("unknown model", "06_memory_budget.MODEL=no-such/model", "not a model of data/models.csv"),
    ("memory guard", "02_batching.NUM_REQUESTS=10000000000", "of memory and this machine has"),
    ("time guard", "06_memory_budget.NUM_SEEDS=1000", "the report would take about"),
]


def _env() -> dict:
    """The environment of every run: this checkout's kvlab first, bytecode caches allowed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(command: list[str], status: int, words: str) -> tuple[float, float, str]:
    """Wall and CPU time (s) of one process and its stdout; a wrong exit status or output is an error."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != status or words not in done.stdout + done.stderr:
        raise RuntimeError(
            f"{' '.join(command[1:])}: exit status {done.returncode} (expected {status}), "
            f"output {(done.stdout + done.stderr)[-300:]!r}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def _medians(commands: list[tuple]) -> list[tuple[float, float, str]]:
    """Median wall and CPU time (s) of each command, the commands taking turns; with each one's last stdout."""
    for _, command, status, words in commands:
        _run(command, status, words)  # writes the bytecode caches, not timed
    times = [[] for _ in commands]
    for _ in range(RUNS):
        for i, (_, command, status, words) in enumerate(commands):
            times[i].append(_run(command, status, words))
    return [(statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts), ts[-1][2]) for ts in times]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


FIRST_RUN = KVLAB + ["simulate", "--policy", "vllm", "--num-requests", "20000", "--num-gpu-blocks", "3000"]
FIRST_RUN += ["--max-model-len", "4096"]


def first_runs() -> None:
    """The compiled loop's first run in a fresh numba cache folder beside the next one, each scheduling mode."""
    for mode, flag in (("asynchronous", "--async-scheduling"), ("synchronous", "--no-async-scheduling")):
        with tempfile.TemporaryDirectory() as cache:
            times = []
            for attempt in ("first", "warm"):
                env = _env() | {"NUMBA_CACHE_DIR": cache}
                start = time.perf_counter()
                done = subprocess.run(FIRST_RUN + [flag], capture_output=True, text=True, env=env, cwd=ROOT)
                times.append(time.perf_counter() - start)
                said = "numba compiles the engine's" in done.stderr
                if done.returncode or said != (attempt == "first"):
                    raise RuntimeError(f"{mode} {attempt} run: exit {done.returncode}, stderr {done.stderr[-300:]!r}")
        print(
            f"   kvlab simulate of 20,000 requests, {mode}: {times[0]:.1f} s in a fresh numba cache folder (it says "
            f"it compiles), {times[1]:.1f} s after (make setup compiles both loops ahead)"
        )


def main() -> None:
    first_runs()
    results = _medians([NUMPY] + QUICK)
    numpy_s = results[0][0]
    print(f"   {NUMPY[0]:<52} {numpy_s:.3f} s wall, {results[0][1]:.3f} s CPU")
    for (label, *_), (wall, cpu, _) in zip(QUICK, results[1:]):
        ratio = wall / numpy_s
        print(
            f"   {label:<52} {wall:.3f} s wall, {cpu:.3f} s CPU: {ratio:.2f}x the numpy import "
            f"(target <= {HELP_RATIO:g}x) {_verdict(ratio <= HELP_RATIO)}"
        )

    with tempfile.TemporaryDirectory() as out:  # a refusal that failed to refuse builds nothing in report/
        refusals = [
            (kind, KVLAB + ["report", "--no-pdf", "--out", out, "--set", value], 2, words)
            for kind, value, words in REPORT_REFUSALS
        ]
        for (kind, *_), (wall, cpu, _) in zip(refusals, _medians(refusals)):
            print(
                f"   refused report parameter, {kind:<27} {wall:.3f} s wall, {cpu:.3f} s CPU "
                f"(target < {REFUSAL_S:g} s) {_verdict(wall < REFUSAL_S)}"
            )

    bare = ("bare heap loop", [sys.executable, str(ROOT / "benchmarks" / "heap_loop.py"), str(NUM_REQUESTS)], 0, "")
    served = (
        f"kvlab simulate --policy continuous --num-requests {NUM_REQUESTS}",
        KVLAB + ["simulate", "--policy", "continuous", "--num-requests", str(NUM_REQUESTS), "--json"],
        0,
        "",
    )
    (bare_s, bare_cpu, bare_out), (kvlab_s, kvlab_cpu, kvlab_out) = _medians([bare, served])
    same = float(bare_out) == json.loads(kvlab_out)["mean_latency_s"]
    ratio = kvlab_s / bare_s
    print(
        f"   {NUM_REQUESTS:,} requests, bare heap loop (benchmarks/heap_loop.py): {bare_s:.2f} s wall, "
        f"{bare_cpu:.2f} s CPU"
    )
    print(
        f"   {NUM_REQUESTS:,} requests, kvlab simulate --policy continuous:     {kvlab_s:.2f} s wall, "
        f"{kvlab_cpu:.2f} s CPU: {ratio:.2f}x the bare loop (target <= {SIMULATE_RATIO:g}x) "
        f"{_verdict(ratio <= SIMULATE_RATIO and same)}"
        + ("" if same else f"; MISMATCH: mean latency {kvlab_out!r} against the bare loop's {bare_out}")
    )


if __name__ == "__main__":
    main()
