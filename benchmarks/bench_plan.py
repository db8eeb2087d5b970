"""`kvlab plan`'s search: at least 500 candidate configurations of a 10,000-request trace in at most 20 s on this
machine (local processes, one per core; the compiled loop on the measured clock), the candidates served in full giving
the same figures in the Python engine, and the same result on a Dask cluster (a local one here); and the same search
with every candidate served on the whole workload (what the plan would do by default under 20,000 requests were it as
fast)."""

import time

from kvlab.core.models import get_gpu, get_model
from kvlab.studies import plan
from kvlab.workloads import traces

TARGET = {"num_candidates": 500, "num_requests": 10_000, "seconds": 20}
WHOLE_TARGET = {
    "num_requests": 20_000,
    "seconds": 20,
}  # every candidate on the whole workload, as the default plan would
DEPLOYMENT = {"model": "Qwen/Qwen3-32B", "gpu": "RTX-PRO-6000-Server-96GB", "max_model_len": 16384}
OBJECTIVES = plan.Objectives(ttft_p95_s=2.0, tpot_p95_ms=60.0)


def outcome(result: plan.Plan) -> list:
    """What a plan decided, candidate by candidate (to compare two runs of it)."""
    return [(r["status"], r["reason"], r.get("ttft_p95_s"), r.get("tpot_p95_ms")) for r in result.rows()]


def main() -> None:
    if "azure" in traces.missing_traces():
        print(f"   skipped: the Azure conversation trace is not in {traces.trace_dir()} (set TRACE_DIR or make traces)")
        return
    workload = traces.load_trace(traces.trace_path("azure"), max_requests=TARGET["num_requests"]).workload
    deployment = plan.Deployment(
        get_model(DEPLOYMENT["model"]), get_gpu(DEPLOYMENT["gpu"]), DEPLOYMENT["max_model_len"]
    )
    space = plan.SearchSpace()
    num_candidates = len(space.candidates(deployment.model))  # a dense model: data_parallel_size 1 only
    start = time.perf_counter()
    local = plan.search(workload, deployment, OBJECTIVES, space, scheduler="processes")
    seconds = time.perf_counter() - start
    counts = local.counts()
    verdict = "PASS" if num_candidates >= TARGET["num_candidates"] and seconds <= TARGET["seconds"] else "FAIL"
    rungs = "; ".join(f"{c} on {n:,} requests in {s:.0f} s" for n, c, s in local.rungs)
    print(
        f"   plan, {DEPLOYMENT['model']} on {DEPLOYMENT['gpu']}, {workload.num_requests:,} Azure conversation requests, "
        f"{num_candidates} candidates on local processes: {seconds:.1f} s (target <= {TARGET['seconds']} s): {verdict}"
    )
    print(
        f"     {counts['pruned']} pruned, then {rungs}; {counts['meets']} meet, {counts['misses']} miss in full, "
        f"{counts['dropped']} dropped on a prefix"
    )
    best = local.ranked()[0] if local.ranked() else None
    print(f"     best: {best.candidate.label() if best else 'none'}")
    start = time.perf_counter()
    whole = plan.search(workload, deployment, OBJECTIVES, space, scheduler="processes", rung_fractions=(1.0,))
    seconds = time.perf_counter() - start
    whole_best = whole.ranked()[0] if whole.ranked() else None
    same = (whole_best and whole_best.candidate) == (best and best.candidate)
    print(
        f"   every candidate served on the whole workload (no halving): {seconds:.1f} s (to be the default under "
        f"{WHOLE_TARGET['num_requests']:,} requests: <= {WHOLE_TARGET['seconds']} s: "
        f"{'PASS' if seconds <= WHOLE_TARGET['seconds'] else 'FAIL'}); {whole.counts()['meets']} meet; the best "
        f"{'the same as the halving' if same else 'DIFFERENT: ' + (whole_best.candidate.label() if whole_best else 'none')}"
    )
    finals = [r for r in local.results if r.status in ("meets", "misses") and r.metrics]
    start = time.perf_counter()
    same = all(plan.serve(workload, deployment, r.candidate, r.num_gpu_blocks, "python") == r.metrics for r in finals)
    print(
        f"   the {len(finals)} candidates served in full, again in the Python engine ({time.perf_counter() - start:.0f} "
        f"s): {'the same figures, bit for bit' if same else 'DIFFERENT FIGURES'}: {'PASS' if same else 'FAIL'}"
    )
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        start = time.perf_counter()
        on_dask = plan.search(workload, deployment, OBJECTIVES, space, scheduler=cluster.scheduler_address)
        dask_s = time.perf_counter() - start
    same = outcome(on_dask) == outcome(local)
    print(
        f"   the same search on a local Dask cluster (2 workers): {dask_s:.0f} s, "
        f"{'the same outcome for every candidate' if same else 'A DIFFERENT OUTCOME'}: {'PASS' if same else 'FAIL'}"
    )
