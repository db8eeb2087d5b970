"""`kvlab plan`'s search: at least 500 candidate configurations of a 10,000-request trace in at most 20 s on this
machine (local processes, one per core; the compiled loop on the measured clock), every candidate served on the whole
workload (under WHOLE_MAX_REQUESTS requests the default) but those its first eighth proves miss; the candidates served
in full giving the same figures in the Python engine (the best and the closest misses); the same result on a Dask
cluster (a local one here); and the halving (the default above WHOLE_MAX_REQUESTS) on the same workload, timed, with
its best."""

import time

from kvlab.core.models import get_gpu, get_model
from kvlab.studies import plan
from kvlab.workloads import traces

TARGET = {"num_candidates": 500, "num_requests": 10_000, "seconds": 20}
DEPLOYMENT = {"model": "Qwen/Qwen3-32B", "gpu": "RTX-PRO-6000-Server-96GB", "max_model_len": 16384}
OBJECTIVES = plan.Objectives(ttft_p95_s=2.0, tpot_p95_ms=60.0)
NUM_PYTHON_CHECKS = 5  # the best meeting and the closest missing candidates served again in the Python engine


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
    proven = sum(r.proven_miss for r in local.results)
    twins = sum(r.twin_of is not None for r in local.results)
    whole = not local.halving and workload.num_requests <= plan.WHOLE_MAX_REQUESTS
    verdict = (
        "PASS" if num_candidates >= TARGET["num_candidates"] and seconds <= TARGET["seconds"] and whole else "FAIL"
    )
    rungs = "; ".join(f"{c} ({k} runs) on {n:,} requests in {s:.1f} s" for n, c, k, s in local.rungs)
    print(
        f"   plan, {DEPLOYMENT['model']} on {DEPLOYMENT['gpu']}, {workload.num_requests:,} Azure conversation requests, "
        f"{num_candidates} candidates on local processes, every one to the end but those a prefix proves miss: "
        f"{seconds:.1f} s (target <= {TARGET['seconds']} s): {verdict}"
    )
    print(
        f"     {counts['pruned']} pruned, then {rungs}; {counts['meets']} meet, {counts['misses'] - proven} miss in "
        f"full, {proven} proven to miss on the first rung, {counts['dropped']} dropped; {twins} served as twins"
    )
    best = local.ranked()[0] if local.ranked() else None
    print(f"     best: {best.candidate.label() if best else 'none'}")
    start = time.perf_counter()
    halving = plan.search(
        workload, deployment, OBJECTIVES, space, scheduler="processes", rung_fractions=plan.RUNG_FRACTIONS
    )
    seconds = time.perf_counter() - start
    halving_best = halving.ranked()[0] if halving.ranked() else None
    same = (halving_best and halving_best.candidate) == (best and best.candidate)
    print(
        f"   the halving on the same workload (the default above {plan.WHOLE_MAX_REQUESTS:,} requests): {seconds:.1f} s; "
        f"{halving.counts()['meets']} meet in full; its best "
        f"{'the same' if same else 'DIFFERENT: ' + (halving_best.candidate.label() if halving_best else 'none')}"
    )
    meets = local.ranked()[:NUM_PYTHON_CHECKS]
    misses = sorted((r for r in local.results if r.status == "misses" and r.metrics), key=lambda r: r.worst_share)
    finals = meets + misses[:NUM_PYTHON_CHECKS]
    start = time.perf_counter()
    same = all(
        plan.serve(workload, deployment, r.candidate, r.num_gpu_blocks, "reference") == r.metrics for r in finals
    )
    print(
        f"   the {len(finals)} best meeting and closest missing candidates served in full, again in the Python engine "
        f"({time.perf_counter() - start:.0f} s): {'the same figures, bit for bit' if same else 'DIFFERENT FIGURES'}: "
        f"{'PASS' if same else 'FAIL'}"
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
