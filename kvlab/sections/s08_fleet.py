"""Section 8 (notebook 08_fleet): a fleet of vLLM instances behind each router (kvlab.core.fleet) on the Mooncake
conversation trace: what the router changes in prefix-cache hits and tail latency.

Every run is kvlab simulate's (kvlab.studies.serving): the trace's first requests, each instance a vLLM engine with
prefix caching on (vLLM 0.33's default) and asynchronous scheduling, its pool sized as vLLM sizes it for the model on
the GPU, its steps on the clock named; the arrival rate is the trace's own, and a multiple of it (kvlab's choice, to
show how the answer moves with load).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from kvlab.core.workload import Workload
from kvlab.sections.shared import phrases, present
from kvlab.studies import serving

DECIMALS = {"prefix_hit_pct": 1, "p95_ttft_s": 2, "p95_tpot_ms": 1, "busiest_instance_pct": 1}
LABELS = {
    "rate_scale": "arrival rate (x the trace's)",
    "prefix_hit_pct": "prefix hit rate (%)",
    "p95_ttft_s": "p95 TTFT (s)",
    "p95_tpot_ms": "p95 TPOT (ms)",
    "busiest_instance_pct": "requests on the busiest instance (%)",
}


def fleet_options(model: str, gpu: str, step_cost: str, trace_path: str, num_requests: int) -> serving.ServingOptions:
    """The options of every run: the trace's first num_requests requests, the model on the GPU (its pool as vLLM
    sizes it), the clock step_cost, prefix caching on."""
    return serving.ServingOptions(
        model=model,
        gpu=gpu,
        cost=step_cost,
        enable_prefix_caching=True,
        trace=trace_path,
        trace_format="mooncake",
        num_requests=num_requests,
    )


def scaled(workload: Workload, rate_scale: float) -> Workload:
    """The workload with its arrival rate x rate_scale (its gaps divided by it), its requests and prefixes kept."""
    return dataclasses.replace(workload, arrival_s=workload.arrival_s / rate_scale)


def serve_fleets(options: serving.ServingOptions, num_instances: int, routers, rate_scales) -> pd.DataFrame:
    """One row per arrival rate scale and router: the share of prompt tokens found in the instances' prefix caches
    (%), p95 TTFT (s), p95 TPOT (ms) and the busiest instance's share of the requests (%)."""
    rows = []
    for rate_scale in rate_scales:
        for router in routers:
            run = serving.setup(dataclasses.replace(options, num_instances=num_instances, router=router))
            s = dataclasses.replace(run, workload=scaled(run.workload, rate_scale)).run().summary()
            rows.append(
                {
                    "rate_scale": rate_scale,
                    "router": router,
                    "prefix_hit_pct": 100 * s["prefix_hit_rate"],
                    "p95_ttft_s": s["p95_ttft_s"],
                    "p95_tpot_ms": 1e3 * s["p95_tpot_s"],
                    "busiest_instance_pct": 100 * max(i["num_requests"] for i in s["instances"]) / s["num_requests"],
                }
            )
    return pd.DataFrame(rows)


def first_block_share_pct(workload: Workload) -> float:
    """The share of requests (%) whose prompt starts with the block most prompts start with (Mooncake's hash ids)."""
    first = np.array([ids[0] if len(ids) else -1 for ids in workload.prefix_hashes])
    return 100 * float(np.bincount(np.unique(first, return_inverse=True)[1]).max()) / len(first)


def setting_text(num_instances: int, model: str, gpu: str, step_cost: str) -> str:
    """What every run is: the instances, their engine and clock, and the rates (the faster ones kvlab's choice)."""
    return (
        f"{num_instances} instances of {model}, one {gpu} each, every one vLLM 0.33's scheduler with prefix caching on "
        f"(vLLM's default) and asynchronous scheduling, its KV pool sized as vLLM sizes it, its steps on the {step_cost} "
        "clock; arrivals at the trace's own timestamps, and faster (kvlab's choice, to show the fleet filling)."
    )


def _best(rows: pd.DataFrame, column: str, highest: bool) -> pd.Series:
    """The row with the best value of column as the table prints it (ties: the first router listed)."""
    values = rows[column].map(lambda v: phrases.shown(v, DECIMALS[column]))
    return rows.loc[values.idxmax() if highest else values.idxmin()]


def finding_text(table: pd.DataFrame, num_instances: int, model: str, gpu: str, num_requests: int) -> str:
    """The section's finding: at the first rate scale (the trace's own at the defaults), which router finds the most
    prompt tokens in the prefix caches and which has the lowest p95 TTFT, each against round robin where it was
    served."""
    rows = table[table["rate_scale"] == table["rate_scale"].iloc[0]].reset_index(drop=True)
    scale = rows["rate_scale"].iloc[0]
    hits, tail = _best(rows, "prefix_hit_pct", True), _best(rows, "p95_ttft_s", False)
    rate = "at the trace's own arrival rate" if scale == 1 else f"at {scale:g}x the trace's arrival rate"
    rr = rows[rows["router"] == "round-robin"]
    against = ""
    if len(rr):
        rr = rr.iloc[0]
        hit, p95 = present.cell(rr["prefix_hit_pct"], 1), present.cell(rr["p95_ttft_s"], 2)
        against = f", against round robin's {hit}% and {p95} s"
    return (
        f"On {num_instances} instances of {model} on {gpu} serving the Mooncake trace's first {num_requests:,} "
        f"requests {rate}, {hits['router']} finds the most prompt tokens in their prefix caches "
        f"({present.cell(hits['prefix_hit_pct'], 1)}%) and {tail['router']} has the lowest p95 TTFT "
        f"({present.cell(tail['p95_ttft_s'], 2)} s){against}."
    )


def hot_spot_text(table: pd.DataFrame, first_block_pct: float) -> str:
    """What happens to a router that sends most requests to one instance (the busiest's share over half), with the
    share of prompts that start alike; '' where none does."""
    rows = table[table["rate_scale"] == table["rate_scale"].iloc[0]]
    hot = rows[rows["busiest_instance_pct"] > 50]
    if not len(hot):
        return ""
    r = hot.iloc[0]
    return (
        f"The {r['router']} router sent {present.cell(r['busiest_instance_pct'], 1)}% of the requests to one "
        f"instance, and its p95 time to first token is {present.cell(r['p95_ttft_s'], 2)} s. "
        f"{present.cell(first_block_pct, 1)}% of the trace's prompts start with the same block of tokens (the same "
        "first hash id)."
    )


def rate_text(table: pd.DataFrame) -> str:
    """How the best routers move with the arrival rate: at each scale, which has the most prefix hits and the lowest
    p95 TTFT."""
    parts = []
    for scale, rows in table.groupby("rate_scale", sort=False):
        rows = rows.reset_index(drop=True)
        hits, tail = _best(rows, "prefix_hit_pct", True), _best(rows, "p95_ttft_s", False)
        parts.append(
            f"at {scale:g}x the trace's arrival rate {hits['router']} finds the most prompt tokens in the prefix "
            f"caches ({present.cell(hits['prefix_hit_pct'], 1)}%) and {tail['router']} has the lowest p95 TTFT "
            f"({present.cell(tail['p95_ttft_s'], 2)} s)"
        )
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def headline(table: pd.DataFrame) -> list[str]:
    """The numbers the report's index shows: at each rate scale, the most prefix hits and the lowest p95 TTFT, and
    round robin's."""
    lines = []
    for scale, rows in table.groupby("rate_scale", sort=False):
        rows = rows.reset_index(drop=True)
        hits, tail = _best(rows, "prefix_hit_pct", True), _best(rows, "p95_ttft_s", False)
        rr = rows[rows["router"] == "round-robin"]
        against = (
            f" (round robin {rr['prefix_hit_pct'].iloc[0]:.1f}%, {rr['p95_ttft_s'].iloc[0]:.2f} s)" if len(rr) else ""
        )
        lines.append(
            f"{scale:g}x the trace's rate: most prefix hits {hits['router']} {hits['prefix_hit_pct']:.1f}%, lowest p95 "
            f"TTFT {tail['router']} {tail['p95_ttft_s']:.2f} s{against}"
        )
    return lines
