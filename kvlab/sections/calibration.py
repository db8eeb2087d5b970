"""Section 5 (notebook 05_calibration): the article's 8 ms and 0.5 MB per token against arithmetic, bounds
and measurements, and kvlab's clocks against real vLLM runs (check_run_table). Measuring and reading
calibration files is kvlab.core.calibration.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvlab.core import article, validate
from kvlab.core.calibration import (CALIBRATION_DIR, DTYPE_BYTES, ROOT, Calibration, DecoderShape,
                                    decode_bound_ms, decode_bytes_per_step)
from kvlab.core.capacity import plan_capacity
from kvlab.core.cost import CalibratedCost, MeasuredStepCost, RooflineStepCost
from kvlab.core.engine import simulate
from kvlab.core.models import get_gpu, get_model
from kvlab.core.units import GIB, KIB, MIB
from kvlab.core.workload import Workload
from kvlab.sections.batching import Experiment, compare_policies
from kvlab.workloads.vllm_runs import VllmRun, check_runs, load_vllm_run


def status_line(calibrations: list[Calibration], directory=None) -> str:
    """One sentence: which measurements exist, or that none does yet and how to make one."""
    where = CALIBRATION_DIR if directory in (None, "") else Path(directory)
    where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    if not calibrations:
        return (f"No GPU measurement is available yet: {where}/ holds no calibration file. Make one on a "
                "GPU machine with `bash scripts/gpu_calibration.sh` (or `kvlab calibrate --device cuda`), "
                "commit the CSV it writes to data/calibration/ and re-run this notebook.")
    names = ", ".join(f"{c.name} ({c.metadata.get('device', '?')}, {c.metadata.get('date', '?')})" for c in calibrations)
    return f"{len(calibrations)} calibration file(s): {names}."


def kv_table(shape: DecoderShape, calibrations: list[Calibration], article_mib_per_token: float = article.MIB_PER_TOKEN, *,
             free_gib: float = 64, context_tokens: int = 1000) -> pd.DataFrame:
    """KV bytes per token from the article, from shape's arithmetic and from each file, with the requests of
    context_tokens tokens that free_gib GiB of KV memory holds at each (section 3's memory budget)."""
    validate.positive_number("article_mib_per_token", article_mib_per_token)
    free_bytes = validate.positive_number("free_gib", free_gib) * GIB
    validate.positive_int("context_tokens", context_tokens)
    rows = [{"source": "article (assumed)", "kind": "assumption", "kv_bytes_per_token": article_mib_per_token * MIB},
            {"source": f"2 x {shape.num_layers} layers x {shape.num_heads} heads x {shape.head_dim} x "
                       f"{DTYPE_BYTES[shape.dtype]} B", "kind": "arithmetic", "kv_bytes_per_token": float(shape.kv_bytes_per_token)}]
    for c in calibrations:
        for value in (row["value"] for row in c.kind("kv_bytes_per_token")):
            rows.append({"source": f"{c.name} ({c.metadata.get('dtype', '?')})", "kind": "measured", "kv_bytes_per_token": value})
    table = pd.DataFrame(rows).set_index("source")
    table["kv_kib_per_token"] = table["kv_bytes_per_token"] / KIB
    table["max_num_requests"] = (free_bytes // (table["kv_bytes_per_token"] * context_tokens)).astype(int)
    return table


def bound_table(shape: DecoderShape, gpu_names, batch_sizes, context_tokens) -> pd.DataFrame:
    """Memory-bandwidth lower bound of the decode step (ms) per GPU of data/gpus.csv (rows) and (batch, context)
    (columns): weights plus cached K and V read once per step / datasheet bandwidth. A bound, not a measurement;
    NaN where the weights and the batch's cache do not fit in the GPU's memory."""
    gpus = [get_gpu(name) for name in validate.non_empty("gpu_names", gpu_names)]
    columns = pd.MultiIndex.from_tuples([(b, c) for b in batch_sizes for c in context_tokens],
                                        names=["batch_size", "context_tokens"])
    values = [[decode_bound_ms(shape, gpu.memory_bandwidth_gb_s, b, c)
               if decode_bytes_per_step(shape, b, c) <= gpu.memory_gib * GIB else math.nan  # does not fit
               for b, c in columns] for gpu in gpus]
    return pd.DataFrame(values, index=pd.Index([gpu.name for gpu in gpus], name="gpu"), columns=columns)


def bound_headline(bound: pd.DataFrame, batch_size: int, context_tokens: int) -> str:
    """One line: the decode-step bound (ms) on each GPU at batch_size and context_tokens, or at the table's first
    column when the table has no such column (other BATCH_SIZES or CONTEXTS)."""
    column = (batch_size, context_tokens) if (batch_size, context_tokens) in bound.columns else bound.columns[0]
    shown = [f"{bound.loc[gpu, column]:.2f} ms on {gpu}" for gpu in bound.index if pd.notna(bound.loc[gpu, column])]
    return f"{', '.join(shown) or 'no GPU holds it'} at batch {column[0]}, {column[1]:,} tokens"


def step_table(calibrations: list[Calibration]) -> pd.DataFrame:
    """Measured decode step times (ms): one row per file, batch size and context (empty with no file)."""
    frames = [pd.DataFrame(c.kind("decode_step_ms")).assign(device=c.name) for c in calibrations]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["device", "batch_size", "context_tokens", "decode_step_ms"])
    table = pd.concat(frames, ignore_index=True).rename(columns={"value": "decode_step_ms"})
    return table[["device", "batch_size", "context_tokens", "decode_step_ms"]]




def section2_table(calibrations: list[Calibration], experiment: Experiment = Experiment(), seed: int = 0) -> pd.DataFrame:
    """Section 2's run (the experiment's workload of one seed) with the experiment's cost (the article's 8 ms per
    token) and with each file's decode step at batch max_num_seqs (contexts clamped to the measured grid): one row
    per cost and policy."""
    workload = experiment.workload(seed)
    costs = {f"article: {experiment.cost.ms_per_token:g} ms per token": experiment.cost}
    for c in calibrations:
        costs[f"measured: {c.name}"] = CalibratedCost.from_csv(c.path, batch_size=experiment.max_num_seqs)
    frames = [compare_policies(workload, max_num_seqs=experiment.max_num_seqs, cost=cost).reset_index().assign(cost=name)
              for name, cost in costs.items()]
    table = pd.concat(frames, ignore_index=True).set_index(["cost", "policy"])
    return table[["mean_latency_s", "p95_latency_s", "makespan_s", "throughput_rps", "idle_pct"]]


# ---------------------------------------------------------------- the figures the notebook's prose states
def shape_figures(shape: DecoderShape) -> dict:
    """The decoder's shape in words: KV bytes per token (B, KiB, MiB), the bytes per value, the parameters
    (billions) and their weights (GiB), beside the article's assumed MiB per token."""
    return {"layers": shape.num_layers, "heads": shape.num_heads, "head_dim": shape.head_dim,
            "hidden": shape.hidden_size, "intermediate": shape.intermediate_size, "vocab": shape.vocab_size,
            "dtype_bytes": DTYPE_BYTES[shape.dtype], "kv_bytes": shape.kv_bytes_per_token,
            "kv_kib": shape.kv_bytes_per_token / KIB, "kv_mib": shape.kv_bytes_per_token / MIB,
            "article_mib": article.MIB_PER_TOKEN, "params_b": shape.num_params / 1e9, "weights_gib": shape.weights_bytes / GIB}


def bound_figures(shape: DecoderShape, gpu_names, batch_size: int, context_tokens: int,
                  ms_per_token: float = article.MS_PER_TOKEN) -> dict:
    """The decode-step lower bound (ms) for batch_size requests of context_tokens on each GPU (keys by GPU name);
    in words, the GPUs where the article's ms_per_token lies above it and those where it lies below, with their
    bounds; and the lowest and highest bound for one request of context_tokens over the GPUs."""
    gpus = [get_gpu(name) for name in validate.non_empty("gpu_names", gpu_names)]
    bounds = {gpu.name: decode_bound_ms(shape, gpu.memory_bandwidth_gb_s, batch_size, context_tokens) for gpu in gpus}
    one = [decode_bound_ms(shape, gpu.memory_bandwidth_gb_s, 1, context_tokens) for gpu in gpus]

    def listed(names):
        return "none" if not names else names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    return {"batch": batch_size, "context": context_tokens, "ms_per_token": ms_per_token, **bounds,
            "above": listed([f"the {n} ({b:.2f} ms)" for n, b in bounds.items() if ms_per_token >= b]),
            "below": listed([f"the {n} ({b:.2f} ms)" for n, b in bounds.items() if ms_per_token < b]),
            "one_low": min(one), "one_high": max(one)}


# ---------------------------------------------------------------- real vLLM runs as checks of the clock
# What the measured clock is checked against (issue 21): kvlab's figure within this share of vLLM's.
CHECK_TARGETS = {"mean_e2e_error": 0.05, "mean_tpot_error": 0.05, "median_request_e2e_error": 0.08,
                 "mean_ttft_error": 0.15}
CHECK_CLOCKS = ("roofline", "measured")


def check_clock(clock: str, model, gpu, config):
    """The step cost a check runs kvlab with: the roofline or the measured clock of model on gpu."""
    validate.one_of("clock", clock, CHECK_CLOCKS)
    if clock == "roofline":
        return RooflineStepCost.from_specs(model, gpu, config)
    return MeasuredStepCost.for_model(model, gpu, config)


def replay_vllm_run(run: VllmRun, clock: str = "measured") -> dict:
    """kvlab's synchronous engine over a real run's workload and settings, its KV pool as kvlab's capacity sizes it
    on the run's GPU (plan_capacity, as kvlab simulate --model --gpu does): per request first-token and finish
    times (s), with the cost's source and the pool. A run with data parallelism is served by that many engines,
    requests dealt to them in turn (vLLM balances its ranks by load; expert parallelism is not modelled)."""
    model, gpu = get_model(run.settings["model"]), get_gpu(run.settings["gpu"])
    config = run.engine_config(async_scheduling=False)
    planned = plan_capacity(model, gpu.memory_gib, config.scheduler.max_model_len, config)
    if planned is None:
        validate.fail("run", run.name, f"leaves no KV memory for {model.name} on {gpu.name}")
    cost = check_clock(clock, model, gpu, config)
    w, ranks = run.workload, run.settings["data_parallel_size"]
    first_token, finish = np.full(w.num_requests, np.nan), np.full(w.num_requests, np.nan)
    for rank in range(ranks):
        mine = np.arange(rank, w.num_requests, ranks)
        part = Workload(w.arrival_s[mine], w.prompt_tokens[mine], w.output_tokens[mine], name=w.name)
        result = simulate(part, config, num_gpu_blocks=planned["num_gpu_blocks"], cost=cost)
        first_token[mine], finish[mine] = result.first_token_s, result.finish_s
    return {"first_token_s": first_token, "finish_s": finish, "num_gpu_blocks": planned["num_gpu_blocks"],
            "cost_source": cost.cost_source if isinstance(cost, MeasuredStepCost) else describe_roofline(cost), "data_parallel_engines": ranks}


def describe_roofline(cost) -> str:
    """The roofline's figures in words."""
    return f"roofline at {cost.memory_bandwidth_gb_s:g} GB/s and {cost.bf16_dense_tflops:g} TFLOPS (datasheet)"


def check_notes(run: VllmRun) -> str:
    """What kvlab's replay of a run leaves out, in words."""
    s = run.settings
    notes = ["kvlab schedules synchronously" + (" (vLLM's default, async, assumed)" if "async_scheduling" in run.assumed
                                                 else "")]
    if s["data_parallel_size"] > 1:
        notes.append(f"data parallel {s['data_parallel_size']}"
                     + (" with expert parallelism" if s["enable_expert_parallel"] else "")
                     + f": {s['data_parallel_size']} kvlab engines, requests dealt in turn, each GPU reading every expert")
    if s["tensor_parallel_size"] > 1:
        notes.append("the all-reduce is a bandwidth bound, its latency left out")
    return "; ".join(notes)


def check_run_table(names=None, clocks=CHECK_CLOCKS) -> pd.DataFrame:
    """kvlab against each real vLLM run (data/checks/; all by default) with each clock: mean E2E latency, mean
    TPOT, the median per-request E2E error and mean TTFT, kvlab's and vLLM's, with kvlab's relative error and
    whether all four lie within CHECK_TARGETS. One row per (run, clock). Checks only: nothing is fitted."""
    rows = []
    for name in (check_runs() if names is None else validate.non_empty("names", names)):
        run = load_vllm_run(name)
        arrival, outputs = run.workload.arrival_s, run.workload.output_tokens
        vllm_e2e, vllm_tpot = run.e2e_s, run.tpot_s
        for clock in clocks:
            kv = replay_vllm_run(run, clock)
            e2e, ttft = kv["finish_s"] - arrival, kv["first_token_s"] - arrival
            with np.errstate(invalid="ignore", divide="ignore"):
                tpot = np.where(outputs > 1, (kv["finish_s"] - kv["first_token_s"]) / np.maximum(outputs - 1, 1), np.nan)
            row = {"run": name, "clock": clock, "cost_source": kv["cost_source"], "num_gpu_blocks": kv["num_gpu_blocks"],
                   "vllm_mean_e2e_s": vllm_e2e.mean(), "kvlab_mean_e2e_s": e2e.mean(),
                   "vllm_mean_tpot_ms": 1e3 * np.nanmean(vllm_tpot), "kvlab_mean_tpot_ms": 1e3 * np.nanmean(tpot),
                   "median_request_e2e_error": float(np.median(np.abs(e2e / vllm_e2e - 1))),
                   "vllm_mean_ttft_s": run.ttft_s.mean(), "kvlab_mean_ttft_s": ttft.mean()}
            row["mean_e2e_error"] = row["kvlab_mean_e2e_s"] / row["vllm_mean_e2e_s"] - 1
            row["mean_tpot_error"] = row["kvlab_mean_tpot_ms"] / row["vllm_mean_tpot_ms"] - 1
            row["mean_ttft_error"] = row["kvlab_mean_ttft_s"] / row["vllm_mean_ttft_s"] - 1
            row["within_targets"] = all(abs(row[k]) <= limit for k, limit in CHECK_TARGETS.items())
            row["notes"] = check_notes(run)
            rows.append(row)
    return pd.DataFrame(rows).set_index(["run", "clock"])
