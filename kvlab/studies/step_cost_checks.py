"""kvlab's step costs checked against real vLLM runs (data/checks/): each run's workload replayed by kvlab's engine
with the roofline or the measured step cost, kvlab's figures against vLLM's and the targets they must lie within.
Checks only: nothing is fitted. Section 5 shows them; `kvlab plan` gives them for the model and GPU it plans."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvlab.core import validate
from kvlab.core.capacity import plan_capacity
from kvlab.core.cost import make_step_cost
from kvlab.core.cost.all_reduce import kernel_ranges
from kvlab.core.cost.measured import composed_step_cost
from kvlab.core.engine import simulate, warm
from kvlab.core.engine.data_parallel import DP_RULES
from kvlab.core.models import get_gpu, get_model
from kvlab.workloads.vllm_runs import VllmRun, check_runs, load_vllm_run

# What the measured step cost is checked against (issue 21): kvlab's figure within this share of vLLM's.
CHECK_TARGETS = {
    "mean_e2e_error": 0.05,
    "mean_tpot_error": 0.05,
    "median_request_e2e_error": 0.08,
    "mean_ttft_error": 0.15,
}
# roofline and measured as kvlab simulate --step-cost names them; composed: the measured clock built from the GPU's
# operator tables alone (kvlab.core.cost.measured.composed_step_cost), as the GPUs without a whole-model profile get it
CHECK_STEP_COSTS = ("roofline", "measured", "composed")


def check_step_cost(cost_name: str, model, gpu, config):
    """The step cost a check runs kvlab with: the roofline, the measured step cost of model on gpu, or the measured
    step cost composed from gpu's operator tables even where a whole-model profile exists."""
    validate.one_of("cost_name", cost_name, CHECK_STEP_COSTS)
    if cost_name == "composed":
        cost, words = composed_step_cost(model, gpu.name, config)
        if cost is None:
            validate.fail(
                "cost_name", cost_name, f"needs operator tables that time {model.name} on {gpu.name}: {words}"
            )
        return cost
    return make_step_cost(cost_name, model=model, gpu=gpu, config=config)


def replay_vllm_run(run: VllmRun, cost_name: str = "measured", term_off: str = "") -> dict:
    """kvlab's engine over a real run's workload and settings, scheduling as the run did (asynchronously: vLLM's
    default, which the runs ran with), its KV pool as kvlab's capacity sizes it on the run's GPU (plan_capacity, as
    kvlab simulate --model --gpu does): per request first-token and finish times (s), with the cost's source and
    the pool. A run with data parallelism is served by kvlab's engine of that many ranks in lockstep
    (kvlab.core.engine.DataParallelEngine: vLLM 0.33's rank choice, dummy batches, every rank padded to the largest),
    each rank's pool sized as vLLM sizes a rank's. term_off: a term of the measured step cost switched off
    (MeasuredStepCost.without), to see what it adds."""
    model, gpu = get_model(run.settings["model"]), get_gpu(run.settings["gpu"])
    config = run.engine_config()
    planned = plan_capacity(model, gpu.memory_gib, config.scheduler.max_model_len, config)
    if planned is None:
        validate.fail("run", run.name, f"leaves no KV memory for {model.name} on {gpu.name}")
    cost = check_step_cost(cost_name, model, gpu, config)
    cost = cost.without(term_off) if term_off else cost
    ranks = run.settings["data_parallel_size"]
    options = {"vllm_version": data_parallel_rules(run)} if ranks > 1 else {}
    result = simulate(run.workload, config, num_gpu_blocks=planned["num_gpu_blocks"], cost=cost, **options)
    return {
        "first_scheduled_s": result.first_scheduled_s,
        "first_token_s": result.first_token_s,
        "finish_s": result.finish_s,
        "num_gpu_blocks": planned["num_gpu_blocks"],
        "cost_source": cost.source,
        "data_parallel_engines": ranks,
        "async_scheduling": config.scheduler.async_scheduling,
    }


def data_parallel_rules(run: VllmRun) -> str:
    """The vLLM version whose data-parallel rules (rank choice, group check) replay the run: its own where kvlab has
    them (kvlab.core.engine.data_parallel.DP_RULES), else vLLM 0.33's."""
    version = ".".join(run.settings["vllm_version"].split(".")[:2])
    return version if version in DP_RULES else "0.33"


def check_label(run: VllmRun) -> str:
    """A run in a few words: its model and its parallelism, e.g. "Qwen3-32B, TP 2"."""
    s = run.settings
    parts = [s["model"].split("/")[-1]]
    if s["tensor_parallel_size"] > 1:
        parts.append(f"TP {s['tensor_parallel_size']}")
    if s["data_parallel_size"] > 1:
        parts.append(f"DP {s['data_parallel_size']}" + (" + EP" if s["enable_expert_parallel"] else ""))
    return ", ".join(parts)


def check_notes(run: VllmRun) -> str:
    """What kvlab's replay of a run leaves out or assumes, in words."""
    s = run.settings
    mode = "asynchronously" if s["async_scheduling"] else "synchronously"
    notes = [
        f"kvlab schedules {mode} as vLLM ran"
        + (" (vLLM's default; the run records no setting, so assumed)" if "async_scheduling" in run.assumed else "")
        + f", making vLLM 0.33's decisions where the run is vLLM {s['vllm_version']}'s"
    ]
    if s["data_parallel_size"] > 1:
        notes.append(
            f"data parallel {s['data_parallel_size']}"
            + (" with expert parallelism" if s["enable_expert_parallel"] else "")
            + f": {s['data_parallel_size']} ranks in lockstep, requests dealt by vLLM {data_parallel_rules(run)}'s "
            "load-balancing rule, each rank's KV cache as vLLM sizes it"
        )
    return "; ".join(notes)


def _experts(model_name: str) -> tuple[int, int]:
    """(experts per layer, experts per token) of a model as data/profiles/index.csv gives them; (0, 0) if dense."""
    from kvlab.core import profiles

    entry = next((e for e in profiles.load_index() if e.model == model_name), None)
    return (entry.num_experts, entry.num_experts_per_tok) if entry is not None else (0, 0)


def check_reason(run: VllmRun, cost_name: str) -> str:
    """Why kvlab's replay of run with cost_name can miss the targets, in one sentence: what the step cost or the engine
    leaves out for this run's settings (from the settings alone, never from the figures)."""
    from kvlab.core import profiles

    validate.one_of("cost_name", cost_name, CHECK_STEP_COSTS)
    s = run.settings
    tp, dp = s["tensor_parallel_size"], s["data_parallel_size"]
    reasons = []
    if cost_name == "roofline":
        experts, per_token = _experts(s["model"])
        reasons.append(
            f"the roofline counts 2 FLOPs per parameter of all {experts} experts for every token, where a "
            f"token runs {per_token}"
            if experts
            else "the roofline is a lower bound (every kernel at the datasheet's bandwidth or FLOPS, no time "
            "outside them)"
        )
        if tp > 1:
            reasons.append("it has no all-reduce")
    if cost_name == "composed":
        reasons.append(
            "the composed clock has no term for decodes of unequal history (the measured clock's attention skew, "
            "fitted per whole-model profile)"
        )
    link = profiles.interconnect(s["gpu"])
    measured_link = link is not None and link.all_reduce_profile.startswith("../operators/")
    if dp > 1 and s["enable_expert_parallel"]:
        reasons.append(
            (
                "the expert dispatch and combine is NCCL's all-gather and reduce-scatter each timed alone (nccl-tests), "
                "not vLLM's all-gather of each rank's own share of tokens with their top-k ids and weights"
                if measured_link and cost_name != "roofline"
                else "the expert dispatch and combine is a bandwidth bound without latency (no measurement times them)"
            )
            + ", and the MoE block's table holds one GPU's experts at one rank's tokens"
        )
    elif dp > 1:
        reasons.append("vLLM slices every expert over all the GPUs, which kvlab does not model")
    if cost_name != "roofline" and tp > 1:
        if link is None:
            reasons.append("the all-reduce is left out (no link figure for the GPU)")
        else:
            kernels = kernel_ranges(link, tp, 2.0 * get_model(s["model"]).hidden_size, s["max_num_batched_tokens"])
            reasons.append(
                f"the all-reduce ({kernels}) is each kernel timed alone over {link.interconnect}; what the run's ranks "
                "add to it (waiting for each other, sending each step to the workers) is measured nowhere"
                if measured_link
                else f"the all-reduce ({kernels}) over {link.interconnect} is a bandwidth bound without latency: no "
                "public measurement times it"
            )
    if not reasons:
        reasons.append("no cause identified: the replay leaves out only what its notes list")
    text = "; ".join(reasons)
    return text[0].upper() + text[1:] + "."


def check_requests(names=None, cost_names=CHECK_STEP_COSTS) -> pd.DataFrame:
    """Each real vLLM run (data/checks/; all by default) replayed with each step cost of cost_names, one row per
    (run, step cost: the "step_cost" level, request): vLLM's and kvlab's TTFT, E2E latency (s) and TPOT (ms; NaN for
    one output token), with the replay's cost source, KV pool, label, notes and the reason a miss would have
    (check_reason)."""
    replays = [(cost_name, "") for cost_name in cost_names]
    return _replays(names, lambda run: replays)


def term_requests(names=None, cost_name: str = "measured") -> pd.DataFrame:
    """check_requests of the measured step cost (or the composed one), whole and with each of its terms switched off
    in turn (step_cost "measured without attention", ...): what each term adds to each real run's replay (a run
    whose model has no operator profile, replayed on the roofline, has none)."""
    validate.one_of("cost_name", cost_name, CHECK_STEP_COSTS[1:])

    def replays(run):
        model, gpu = get_model(run.settings["model"]), get_gpu(run.settings["gpu"])
        terms = getattr(check_step_cost(cost_name, model, gpu, run.engine_config()), "terms", ())
        return [(cost_name, "")] + [(cost_name, term) for term in terms]

    return _replays(names, replays)


def _replays(names, replays) -> pd.DataFrame:
    """The per-request frame of check_requests for each run of names and each (step cost, term off) of replays(run).
    The engine's compiled loops are loaded first: dozens of replays of a few hundred requests each, which would
    not load them one by one."""
    warm.load(warm.LOOPS[:2])
    frames = []
    for name in check_runs() if names is None else validate.non_empty("names", names):
        run = load_vllm_run(name)
        arrival, outputs = run.workload.arrival_s, run.workload.output_tokens
        for cost_name, term_off in replays(run):
            kv = replay_vllm_run(run, cost_name, term_off)
            with np.errstate(invalid="ignore", divide="ignore"):
                tpot = np.where(
                    outputs > 1, (kv["finish_s"] - kv["first_token_s"]) / np.maximum(outputs - 1, 1), np.nan
                )
            frames.append(
                pd.DataFrame(
                    {
                        "run": name,
                        "step_cost": f"{cost_name} without {term_off}" if term_off else cost_name,
                        "request": np.arange(run.workload.num_requests),
                        "output_tokens": outputs,
                        "vllm_ttft_s": run.ttft_s,
                        "kvlab_ttft_s": kv["first_token_s"] - arrival,
                        "vllm_wait_s": run.first_scheduled_s - arrival,  # before the request's first step
                        "kvlab_wait_s": kv["first_scheduled_s"] - arrival,
                        "vllm_e2e_s": run.e2e_s,
                        "kvlab_e2e_s": kv["finish_s"] - arrival,
                        "vllm_tpot_ms": 1e3 * run.tpot_s,
                        "kvlab_tpot_ms": 1e3 * tpot,
                        "cost_source": kv["cost_source"],
                        "num_gpu_blocks": kv["num_gpu_blocks"],
                        "label": check_label(run),
                        "notes": check_notes(run),
                        "reason": check_reason(run, cost_name),
                    }
                )
            )
    return pd.concat(frames, ignore_index=True).set_index(["run", "step_cost", "request"])


def check_run_table(names=None, cost_names=CHECK_STEP_COSTS, *, requests: pd.DataFrame | None = None) -> pd.DataFrame:
    """kvlab against each real vLLM run (data/checks/; all by default) with each step cost: mean E2E latency, mean
    TPOT, the median per-request E2E error and mean TTFT, kvlab's and vLLM's, with kvlab's relative error and
    whether all four lie within CHECK_TARGETS, and for a miss its reason (why). One row per (run, step cost); requests:
    check_requests' replays (made here when not given). Checks only: nothing is fitted."""
    requests = check_requests(names, cost_names) if requests is None else requests
    rows = []
    for (name, cost_name), r in requests.groupby(level=["run", "step_cost"], sort=False):
        first = r.iloc[0]
        row = {
            "run": name,
            "step_cost": cost_name,
            "label": first["label"],
            "cost_source": first["cost_source"],
            "num_gpu_blocks": int(first["num_gpu_blocks"]),
            "vllm_mean_e2e_s": r["vllm_e2e_s"].mean(),
            "kvlab_mean_e2e_s": r["kvlab_e2e_s"].mean(),
            "vllm_mean_tpot_ms": np.nanmean(r["vllm_tpot_ms"]),
            "kvlab_mean_tpot_ms": np.nanmean(r["kvlab_tpot_ms"]),
            "median_request_e2e_error": float(np.median(np.abs(r["kvlab_e2e_s"] / r["vllm_e2e_s"] - 1))),
            "vllm_mean_ttft_s": r["vllm_ttft_s"].mean(),
            "kvlab_mean_ttft_s": r["kvlab_ttft_s"].mean(),
            "vllm_median_ttft_s": r["vllm_ttft_s"].median(),
            "kvlab_median_ttft_s": r["kvlab_ttft_s"].median(),
            "vllm_mean_wait_s": r["vllm_wait_s"].mean(),
            "kvlab_mean_wait_s": r["kvlab_wait_s"].mean(),
        }
        row["mean_e2e_error"] = row["kvlab_mean_e2e_s"] / row["vllm_mean_e2e_s"] - 1
        row["mean_tpot_error"] = row["kvlab_mean_tpot_ms"] / row["vllm_mean_tpot_ms"] - 1
        row["mean_ttft_error"] = row["kvlab_mean_ttft_s"] / row["vllm_mean_ttft_s"] - 1
        row["within_targets"] = all(abs(row[k]) <= limit for k, limit in CHECK_TARGETS.items())
        row["why"] = "" if row["within_targets"] else first["reason"]
        row["notes"] = first["notes"]
        rows.append(row)
    return pd.DataFrame(rows).set_index(["run", "step_cost"])
