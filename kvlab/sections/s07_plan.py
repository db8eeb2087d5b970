"""Section 7 (notebook 07_plan): one deployment planned end to end: the workload it is planned for, and the plan's
tables and figures (kvlab.studies.plan searches, kvlab.sections.shared.plots draws)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvlab.core.workload import Workload
from kvlab.sections.s04_traces import open_trace
from kvlab.sections.shared import phrases
from kvlab.sections.shared.parameters import search_space  # noqa: F401 (the notebook's search space, checked there)
from kvlab.studies.plan_space import (
    OBJECTIVE_UNITS,
    OBJECTIVE_WORDS,
    Objectives,
    SearchSpace,
    arrival_rate_per_s,
    check_max_model_len,
    knob_value,
)
from kvlab.workloads.synthetic import gamma_workload

METRICS = ("ttft_p95_s", "tpot_p95_ms", "e2e_p95_s")
# Each metric's error in section 5's check of the step cost (plan.step_cost_fidelity) that scales it.
STEP_COST_ERRORS = {"ttft_p95_s": "mean_ttft_error", "tpot_p95_ms": "mean_tpot_error", "e2e_p95_s": "mean_e2e_error"}
# The notebook's column headers.
LABELS = {
    "num_gpus": "GPUs",
    "num_replicas": "replicas",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "gpu_memory_utilization": "GPU memory share",
    "async_scheduling": "async",
    "requests_per_s_per_gpu": "requests/s per GPU",
    "ttft_p95_s": "p95 TTFT (s)",
    "tpot_p95_ms": "p95 TPOT (ms)",
    "e2e_p95_s": "p95 E2E (s)",
    "num_preemptions": "preemptions",
    "worst_share_pct": "worst objective (% of its limit)",
    "num_candidates": "candidates",
    "served_as_twin": "of them twins",
    "label": "configuration",
}
DECIMALS = {"requests_per_s_per_gpu": 2, "ttft_p95_s": 3, "tpot_p95_ms": 1, "e2e_p95_s": 1, "worst_share_pct": 0}


# ---------------------------------------------------------------- the question
def plan_workload(
    trace: str,
    trace_dir: str,
    num_requests: int,
    max_model_len: int,
    rate_per_s: float,
    prompt_tokens: float,
    output_tokens: float,
    seed: int,
) -> tuple[Workload, str]:
    """The workload planned for and a sentence saying which: the trace's first num_requests requests, or, with no
    trace chosen or its file missing, a synthetic one of as many requests (Poisson arrivals at rate_per_s
    requests/s, gamma prompt and output lengths of those means in tokens, CV 1, from default_rng(seed))."""
    opened = open_trace(trace, trace_dir, max_requests=num_requests, arrival_rate_per_s=rate_per_s, seed=seed)
    if opened.available:
        workload, note = opened.load.workload, opened.note
    else:
        workload = gamma_workload(num_requests, rate_per_s, prompt_tokens, output_tokens, np.random.default_rng(seed))
        why = opened.note.split(": the real-trace")[0]
        note = (
            f"{why}: the plan serves a synthetic workload instead, {num_requests:,} requests with Poisson "
            f"arrivals at {rate_per_s:g} requests/s and gamma lengths (CV 1) of {prompt_tokens:,.0f} prompt and "
            f"{output_tokens:,.0f} output tokens on average (seed {seed})."
        )
    check_max_model_len("MAX_MODEL_LEN", max_model_len, workload.prompt_tokens.max())
    return workload, note


def workload_table(workload: Workload) -> pd.DataFrame:
    """The workload in numbers: requests, span of arrivals (s), rate (requests/s), mean and p95 prompt and output."""
    span = float(workload.arrival_s[-1] - workload.arrival_s[0])
    row = {"num_requests": workload.num_requests, "span_s": span, "rate_per_s": arrival_rate_per_s(workload.arrival_s)}
    for name in ("prompt", "output"):
        tokens = getattr(workload, f"{name}_tokens")
        row[f"{name}_mean_tokens"] = float(tokens.mean())
        row[f"{name}_p95_tokens"] = float(np.percentile(tokens, 95))
        row[f"{name}_max_tokens"] = int(tokens.max())
    return pd.DataFrame([row], index=pd.Index([workload.name or "workload"], name="workload"))


# What each knob of the search sets, in a reader's words (vLLM's flag, or kvlab's where vLLM has none).
KNOB_WORDS = {
    "tensor_parallel_size": "GPUs one replica splits each layer over (vLLM's --tensor-parallel-size)",
    "data_parallel_size": "copies of the model one vLLM server runs, each on its own GPUs (--data-parallel-size)",
    "max_num_seqs": "requests a step may hold at most (--max-num-seqs)",
    "max_num_batched_tokens": "tokens a step may compute at most, prompts and decodes (--max-num-batched-tokens)",
    "block_size": "tokens a KV block holds (--block-size)",
    "gpu_memory_utilization": "share of a GPU's memory vLLM may use, KV cache included (--gpu-memory-utilization)",
    "kv_cache_dtype": "the KV cache's number format: fp8 holds twice the tokens (--kv-cache-dtype)",
    "enable_chunked_prefill": "long prompts split over steps beside the decodes (--enable-chunked-prefill)",
    "enable_prefix_caching": "reuse of blocks a prompt shares with an earlier one (--enable-prefix-caching)",
    "async_scheduling": "the next step scheduled while this one runs (--async-scheduling)",
    "num_replicas": "independent vLLM servers the requests are dealt to in turn (kvlab's, not a vLLM flag)",
}


def space_table(space: SearchSpace) -> pd.DataFrame:
    """The knobs searched, what each sets and their values, one row each (a knob of one value is fixed, not
    searched)."""
    rows = [
        {
            "knob": name,
            "what_it_sets": KNOB_WORDS.get(name, ""),
            "values": ", ".join(knob_value(v) for v in getattr(space, name)),
            "num_values": len(getattr(space, name)),
        }
        for name in space.__dataclass_fields__
    ]
    return pd.DataFrame(rows).set_index("knob")


# ---------------------------------------------------------------- the outcome
def _label(c) -> str:
    return (
        f"TP {c.tensor_parallel_size} x {c.num_replicas} replicas, {c.max_num_seqs} seqs, "
        f"{c.max_num_batched_tokens:,} batched tokens, {c.gpu_memory_utilization:g} of GPU memory, {c.kv_cache_dtype} "
        f"KV, {'async' if c.async_scheduling else 'sync'} scheduling"
    )


def served_table(plan) -> pd.DataFrame:
    """Every configuration served on the whole workload, ranked: those that meet every objective first (plan.ranked's
    order), then those that miss by their worst objective (not those proven to miss on a prefix); requests/s per GPU is the workload's rate over the GPUs
    (goodput where it meets)."""
    ranked = plan.ranked()
    misses = sorted(
        (r for r in plan.results if r.status == "misses" and not r.proven_miss),
        key=lambda r: (r.worst_share, r.candidate.num_gpus),
    )
    rows, d = [], plan.deployment
    for r in ranked + misses:
        c = r.candidate
        rows.append(
            {
                "label": _label(c),
                "num_gpus": c.num_gpus,
                "tensor_parallel_size": c.tensor_parallel_size,
                "num_replicas": c.num_replicas,
                "max_num_seqs": c.max_num_seqs,
                "max_num_batched_tokens": c.max_num_batched_tokens,
                "gpu_memory_utilization": c.gpu_memory_utilization,
                "kv_cache_dtype": c.kv_cache_dtype,
                "async_scheduling": c.async_scheduling,
                "num_gpu_blocks": r.num_gpu_blocks,
                "requests_per_s_per_gpu": plan.rate_per_s / c.num_gpus,
                **{m: r.metrics.get(m, math.nan) for m in METRICS},
                "num_preemptions": r.metrics.get("num_preemptions", 0),
                "worst_share_pct": 100 * r.worst_share if r.shares else math.nan,
                "meets": r.status == "meets",
                "best": bool(ranked) and r is ranked[0],
                "vllm_serve": c.serve_command(d.model.name, d.max_model_len, d.model.quantization),
            }
        )
    frame = pd.DataFrame(
        rows,
        columns=[
            "label",
            "num_gpus",
            "tensor_parallel_size",
            "num_replicas",
            "max_num_seqs",
            "max_num_batched_tokens",
            "gpu_memory_utilization",
            "kv_cache_dtype",
            "async_scheduling",
            "num_gpu_blocks",
            "requests_per_s_per_gpu",
            *METRICS,
            "num_preemptions",
            "worst_share_pct",
            "meets",
            "best",
            "vllm_serve",
        ],
    )
    frame.index = pd.RangeIndex(1, len(frame) + 1, name="rank")
    return frame


def ranked_table(served: pd.DataFrame) -> pd.DataFrame:
    """The configurations that meet every objective, best first, with the columns a reader compares."""
    keep = [
        "num_gpus",
        "tensor_parallel_size",
        "num_replicas",
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "kv_cache_dtype",
        "async_scheduling",
        "requests_per_s_per_gpu",
        *METRICS,
        "worst_share_pct",
    ]
    return served.loc[served["meets"], keep]


# Settings that change no decision where the pool never refuses a block (plan.twins): twins differ only in these.
TWIN_SETTINGS = ("gpu_memory_utilization", "kv_cache_dtype", "num_gpu_blocks")


def collapse_twins(table: pd.DataFrame) -> pd.DataFrame:
    """Rows with the same figures that differ only in TWIN_SETTINGS, as one row (the first's rank) listing each such
    setting's values ('0.70 / 0.90'; 'bf16 / fp8'), the pool's each with the settings that give it
    ('17,390 at 0.70, bf16 / 34,780 at 0.70, fp8')."""
    varying = [c for c in TWIN_SETTINGS if c in table.columns]
    others = [c for c in table.columns if c not in varying]
    settings = [c for c in varying if c != "num_gpu_blocks"]

    def shown(v) -> str:
        return f"{v:.2f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)

    rows = []
    for _, group in table.groupby(others, sort=False, dropna=False):
        row = group.iloc[0].copy()
        for column in varying:
            values = list(dict.fromkeys(group[column]))
            if len(values) > 1 and column == "num_gpu_blocks" and settings:
                pairs = dict.fromkeys(zip(group[column], *(group[c] for c in settings)))
                row[column] = " / ".join(f"{v:,} at {', '.join(map(shown, rest))}" for v, *rest in pairs)
            elif len(values) > 1:
                row[column] = " / ".join(shown(v) for v in values)
        rows.append(row)
    if not rows:
        return table
    collapsed = pd.DataFrame(rows).astype({c: object for c in varying})
    collapsed.index.name = table.index.name
    return collapsed


def outcome_table(plan) -> pd.DataFrame:
    """What became of the candidates, by kind (pruned by proof, dropped at a rung, served in full and missing or
    meeting), with how many and one reason of each kind in words."""
    kinds: dict = {}  # kind -> (its place in the table, its candidates)
    for r in plan.results:
        if r.status == "pruned":
            proof = r.reason.split(":")[0]  # in the order plan.prune tries them
            kind, place = "pruned: " + proof, (0, ("capacity", "step cost", "rate").index(proof))
        elif r.status == "dropped":
            kind, place = f"dropped after the first {r.served_requests:,} requests", (1, r.served_requests)
        elif r.proven_miss:
            kind, place = f"proven to miss on the first {r.served_requests:,} requests", (1, r.served_requests)
        elif r.status == "misses" and not r.shares:
            kind, place = "served: the engine stopped", (2, 0)
        elif r.status == "misses":
            kind, place = (
                "served in full: misses " + " and ".join(OBJECTIVE_WORDS[k] for k, s in r.shares.items() if s > 1),
                (2, 0),
            )
        else:
            kind, place = "served in full: meets every objective", (3, 0)
        kinds.setdefault(kind, (place, []))[1].append(r)
    rows = [
        {
            "outcome": k,
            "num_candidates": len(rs),
            "served_as_twin": sum(r.twin_of is not None for r in rs),
            "example": _example(rs[0]),
        }
        for k, (_, rs) in sorted(kinds.items(), key=lambda item: (item[1][0], item[0]))
    ]
    return pd.DataFrame(rows).set_index("outcome")


def _example(r) -> str:
    reason = r.reason.split(": ", 1)[1] if r.status == "pruned" else r.reason
    return f"{_label(r.candidate)}: {reason}" if reason else _label(r.candidate)


def rung_table(plan, workload: Workload) -> pd.DataFrame:
    """The successive halving's rungs: the prefix served (requests, share of the workload, its span of arrivals in s),
    the candidates on it (twins included, as the outcome table counts them) and the engine runs that served them (a
    twin takes its first's run)."""
    rows = [
        {
            "num_requests": n,
            "workload_pct": 100 * n / workload.num_requests,
            "span_s": float(workload.arrival_s[n - 1] - workload.arrival_s[0]),
            "num_candidates": c,
            "num_runs": k,
        }
        for n, c, k, _ in plan.rungs
    ]
    return pd.DataFrame(rows, columns=["num_requests", "workload_pct", "span_s", "num_candidates", "num_runs"])


def step_cost_table(fidelity: list[dict]) -> pd.DataFrame:
    """Section 5's check of the measured step cost on this model and GPU (plan.step_cost_fidelity, as plan.summary's
    "step_cost" gives it): kvlab's error on each real vLLM run, % (negative: kvlab is faster), and whether all lie within
    section 5's targets."""
    rows = [
        {
            "run": f["label"],
            "mean_e2e_error_pct": 100 * f["mean_e2e_error"],
            "mean_tpot_error_pct": 100 * f["mean_tpot_error"],
            "median_request_e2e_error_pct": 100 * f["median_request_e2e_error"],
            "mean_ttft_error_pct": 100 * f["mean_ttft_error"],
            "within_targets": f["within_targets"],
        }
        for f in fidelity
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "run",
            "mean_e2e_error_pct",
            "mean_tpot_error_pct",
            "median_request_e2e_error_pct",
            "mean_ttft_error_pct",
            "within_targets",
        ],
    )


# ---------------------------------------------------------------- the halving's risk, measured
def halving_check(halving, whole, num_checks: int) -> pd.DataFrame:
    """The num_checks candidates the halving dropped (twins once) that came closest to their objectives on their
    prefix, and what the whole plan (every candidate served to the end) found for them: their worst objective's share
    of its limit (%) on the prefix and in full (NaN: proven to miss on a prefix), and whether they meet every
    objective in full (a configuration the halving lost)."""
    dropped = sorted(
        (r for r in halving.results if r.status == "dropped" and r.twin_of is None),
        key=lambda r: (r.worst_share, r.candidate.num_gpus),
    )[:num_checks]
    full = {r.candidate: r for r in whole.results}
    rows = [
        {
            "label": _label(r.candidate),
            "num_gpus": r.candidate.num_gpus,
            "dropped_after_requests": r.served_requests,
            "prefix_worst_share_pct": 100 * r.worst_share,
            "full_worst_share_pct": 100 * full[r.candidate].worst_share if full[r.candidate].shares else math.nan,
            "meets_in_full": full[r.candidate].status == "meets",
        }
        for r in dropped
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "label",
            "num_gpus",
            "dropped_after_requests",
            "prefix_worst_share_pct",
            "full_worst_share_pct",
            "meets_in_full",
        ],
    )


def halving_versus(halving, whole) -> dict:
    """The halving's plan against the whole plan's on the same workload: whether they name the same best
    configuration, the halving's best, how many of the whole plan's meeting configurations the halving dropped, and
    how many of those need fewer GPUs than the halving's best (better ones it lost)."""
    best, whole_best = (halving.ranked() or [None])[0], (whole.ranked() or [None])[0]
    status = {r.candidate: r.status for r in halving.results}
    lost = [r for r in whole.ranked() if status[r.candidate] == "dropped"]
    gpus = best.candidate.num_gpus if best else math.inf
    return {
        "same_best": (best and best.candidate) == (whole_best and whole_best.candidate),
        "halving_best_label": _label(best.candidate) if best else None,
        "lost": len(lost),
        "lost_better": sum(r.candidate.num_gpus < gpus for r in lost),
        "halving_rungs": len(halving.rungs),
    }


def step_cost_error_words(fidelity: list[dict], key: str) -> str:
    """The step cost's error of key on each checked run in words: '28% shorter' (kvlab faster) or '5% longer'."""
    words = [f"{abs(100 * r[key]):.0f}% {'shorter' if r[key] < 0 else 'longer'}" for r in fidelity]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _corrected(row, fidelity: list[dict]) -> tuple[dict, dict]:
    """A served configuration's p95 figures divided by (1 + the step cost's mean error) on the real vLLM run of its
    tensor parallel size (else the first run), and that run."""
    run = next((f for f in fidelity if f"TP {row['tensor_parallel_size']}" in f["label"]), fidelity[0])
    return {m: float(row[m]) / (1 + run[STEP_COST_ERRORS[m]]) for m in METRICS}, run


def step_cost_corrected(served: pd.DataFrame, fidelity: list[dict], objectives: Objectives) -> dict:
    """The best configuration's p95 figures corrected by the step cost's mean error (_corrected): what they would be
    if that error held at the 95th percentile too (a rough reading, not a measurement); with the run's label and the
    objectives that would be missed. {} when nothing meets or no run checks the step cost."""
    if not fidelity or not served["best"].any():
        return {}
    corrected, run = _corrected(served[served["best"]].iloc[0], fidelity)
    missed = [OBJECTIVE_WORDS[m] for m, limit in objectives.given().items() if corrected[m] > limit]
    return {"run": run["label"], **corrected, "meets": not missed, "missed": " and ".join(missed)}


def corrected_meeting(served: pd.DataFrame, fidelity: list[dict], objectives: Objectives) -> int | None:
    """How many configurations served in full would meet every objective once corrected (_corrected); None when no
    real run checks the step cost."""
    if not fidelity:
        return None
    return sum(max(_corrected_shares(row, fidelity, objectives)[0].values()) <= 1 for _, row in served.iterrows())


def _corrected_shares(row, fidelity: list[dict], objectives: Objectives) -> tuple[dict, dict]:
    """Each objective's corrected p95 (_corrected) over its limit for one served configuration, and the run used."""
    corrected, run = _corrected(row, fidelity)
    return {m: corrected[m] / limit for m, limit in objectives.given().items()}, run


def corrected_choice(served: pd.DataFrame, fidelity: list[dict], objectives: Objectives) -> dict:
    """The configuration to run once the clock's measured error is allowed for: of those served in full that would
    still meet every objective corrected (_corrected), the most requests/s per GPU, then the widest margin (the least
    worst objective's share of its limit); its label, GPUs, rate a GPU, worst share (%) and that objective. {} where
    none would, or no real run checks the step cost."""
    if not fidelity:
        return {}
    best = None
    for _, row in served.iterrows():
        shares, run = _corrected_shares(row, fidelity, objectives)
        if max(shares.values()) > 1:
            continue
        key = (-round(float(row["requests_per_s_per_gpu"]), 6), max(shares.values()))
        if best is None or key < best[0]:
            worst = max(shares, key=shares.get)
            best = (key, row, worst, shares[worst], run)
    if best is None:
        return {}
    _, row, worst, share, run = best
    return {
        "run": run["label"],
        "same_tp": f"TP {row['tensor_parallel_size']}" in run["label"],
        "label": row["label"],
        "num_gpus": int(row["num_gpus"]),
        "per_gpu": round(float(row["requests_per_s_per_gpu"]), 2),
        "worst": OBJECTIVE_WORDS[worst],
        "worst_pct": round(100 * share),
        "num_replicas": int(row["num_replicas"]),
        "vllm_serve": row["vllm_serve"],
    }


def finding_text(
    model: str, gpu: str, num_requests: int, f: dict, fixed: dict, num_corrected: int | None, choice: dict | None = None
) -> str:
    """The section's finding (its sentence on the front page): the answer corrected for the step cost's measured
    error first where the correction changes it, then the plan as served (f: plan_figures; fixed:
    step_cost_corrected; num_corrected: corrected_meeting)."""
    served = (
        f"with {f['best_label']} ({f['best_per_gpu']} requests/s per GPU on {f['best_gpus']} GPUs)"
        if f["best_label"]
        else "with none of the configurations searched"
    )
    unmeasured = f.get("pruned_by", {}).get("step cost", 0)  # missing data, not a proof
    plan = (
        f"on kvlab's engine and measured clock, {model} on {gpu} serves {num_requests:,} requests at "
        f"{f['rate_per_s']:.2f} requests/s within {f['objectives']} {served}; {f['pruned'] - unmeasured:,} of "
        f"{f['num_candidates']:,} candidates were pruned by proof before any was served"
        + (
            f", and {unmeasured:,} were not planned: no measurement times the model at their tensor parallel size "
            "on this GPU (missing data, not a proof: the answer is the best of the candidates measured)."
            if unmeasured
            else "."
        )
    )
    if not fixed or fixed["meets"]:
        still = " Corrected for the clock's measured error it would still meet them." if fixed else ""
        return f"Planned {plan}{still}"
    meeting = (
        f"none of the {f['num_served']:,} configurations served in full would meet {f['objectives']}"
        if not num_corrected
        else f"{num_corrected:,} of the {f['num_served']:,} configurations served in full would still meet {f['objectives']}"
    )
    run = (
        f" Run {choice['label']} ({choice['per_gpu']} requests/s per GPU on {choice['num_gpus']} GPUs): corrected by "
        f"the {choice['run']} run's error"
        + ("" if choice["same_tp"] else " (no real run checks the clock at its tensor parallel size)")
        + f", its {choice['worst']} would be {choice['worst_pct']}% of its limit, the most a GPU serves among those "
        "that meet after the correction (a reading from the check's means, not a measured 95th percentile)."
        if choice
        else " No configuration searched is safe once corrected: measure the best as planned on the GPU before "
        "deploying it."
    )
    return (
        f"Corrected for the measured clock's error on this model and GPU (section 5's check, {fixed['run']}), "
        f"{meeting}: the best as planned, {f['best_label']}, would miss its {fixed['missed']} objective.{run} "
        f"As planned, {plan}"
    )


def halving_figures(check: pd.DataFrame, best_gpus: int | None) -> dict:
    """The halving check in numbers: candidates served in full, how many meet, and how many of those on fewer GPUs
    than the best configuration found (a better one the halving lost; any, where none was found)."""
    meets = check["meets_in_full"].astype(bool)
    fewer = check["num_gpus"] < (best_gpus if best_gpus is not None else math.inf)
    return {"checked": len(check), "meet": int(meets.sum()), "better": int((meets & fewer).sum())}


# ---------------------------------------------------------------- numbers for the prose and the headline
def objectives_words(objectives: Objectives) -> str:
    """The objectives in words: 'p95 TTFT <= 1 s and p95 TPOT <= 40 ms'."""
    words = [f"{OBJECTIVE_WORDS[k]} <= {v:g} {OBJECTIVE_UNITS[k]}" for k, v in objectives.given().items()]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def plan_figures(plan, summary: dict, served: pd.DataFrame, outcome: pd.DataFrame) -> dict:
    """The numbers the notebook's prose quotes, rounded to what they mean."""
    counts = plan.counts()
    best = served[served["best"]].iloc[0] if served["best"].any() else None
    fewest = int(served.loc[served["meets"], "num_gpus"].min()) if served["meets"].any() else None
    pruned = {k.split(": ")[1]: int(v) for k, v in outcome["num_candidates"].items() if k.startswith("pruned: ")}
    proven = sum(r.proven_miss for r in plan.results)
    return {
        "num_candidates": len(plan.results),
        **counts,
        "misses": counts["misses"] - proven,  # served in full
        "proven": proven,
        "pruned_by": pruned,
        "num_served": int(len(served)),
        "num_twins": sum(r.twin_of is not None for r in plan.results),
        "rate_per_s": round(plan.rate_per_s, 2),
        "best_label": None if best is None else best["label"],
        "best_gpus": None if best is None else int(best["num_gpus"]),
        "best_per_gpu": None if best is None else round(float(best["requests_per_s_per_gpu"]), 2),
        "fewest_gpus": fewest,
        "best_command": summary["best"]["vllm_serve"] if summary["best"] else None,
        "best_replicas": summary["best"]["num_replicas"] if summary["best"] else None,
        "objectives": objectives_words(plan.objectives),
        "served_words": served_words(plan),
    }


def served_words(plan) -> str:
    """The candidates served on the whole workload in words, by how many objectives each misses: '2 meet every
    objective, 4 miss one and 4 miss two'."""
    missed = [sum(share > 1 for share in r.shares.values()) for r in plan.results if r.status == "misses" and r.shares]
    names = {1: "one", 2: "two", 3: "three"}
    counts = {"meet every objective": plan.counts()["meets"]}
    counts |= {f"miss {names.get(k, k)}": missed.count(k) for k in sorted(set(missed))}
    stopped = sum(1 for r in plan.results if r.status == "misses" and not r.shares and not r.proven_miss)
    return phrases.counted(counts | {"stopped before the end": stopped})


def headline(plan, summary: dict, served: pd.DataFrame) -> list[str]:
    """The plan's headline numbers, one line each, at fixed precision."""
    f = plan_figures(plan, summary, served, outcome_table(plan))
    lines = [
        f"deployment      {plan.deployment.model.name} on {plan.deployment.gpu.name}, {f['objectives']}",
        f"workload        {plan.num_requests:,} requests at {f['rate_per_s']:.2f} requests/s",
        f"candidates      {f['num_candidates']:,}: {f['pruned']:,} pruned, {f['proven']:,} proven to miss on a prefix, "
        f"{f['dropped']:,} dropped on a prefix, {f['misses']:,} served in full miss, {f['meets']:,} meet",
    ]
    if f["best_label"] is None:
        lines.append("best            none meets every objective")
    else:
        row = served[served["best"]].iloc[0]
        lines.append(
            f"best            {f['best_label']}: {f['best_per_gpu']:.2f} requests/s per GPU on {f['best_gpus']} "
            f"GPUs, " + ", ".join(f"{OBJECTIVE_WORDS[m]} {row[m]:.3g} {OBJECTIVE_UNITS[m]}" for m in METRICS)
        )
    for fid in summary["step_cost"]["fidelity"]:
        lines.append(
            f"step cost checked   {fid['label']}: mean E2E {100 * fid['mean_e2e_error']:+.0f}%, mean TPOT "
            f"{100 * fid['mean_tpot_error']:+.0f}% against real vLLM"
        )
    return lines
