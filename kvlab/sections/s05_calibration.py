"""Section 5 (notebook 05_calibration): the article's 8 ms and 0.5 MB per token against arithmetic, bounds
and measurements, and kvlab's step costs against real vLLM runs (replayed by kvlab.studies.step_cost_checks, shown
here). Measuring and reading calibration files is kvlab.core.calibration.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvlab.core import article, capacity, profiles, validate
from kvlab.core.calibration import (
    CALIBRATION_DIR,
    DTYPE_BYTES,
    ROOT,
    Calibration,
    DecoderShape,
    decode_bound_ms,
    decode_bytes_per_step,
)
from kvlab.core.models import DATA_DIR, get_gpu, get_model, weights_bytes_per_gpu
from kvlab.core.service_time import CalibratedServiceTime
from kvlab.core.units import GIB, KIB, MIB
from kvlab.sections.s02_batching import Experiment, compare_policies
from kvlab.sections.shared import phrases
from kvlab.sections.shared.present import cell
from kvlab.studies.step_cost_checks import (  # noqa: F401 (notebook 05 calls them here)
    CHECK_TARGETS,
    check_label,
    check_notes,
    check_requests,
    check_run_table,
    term_requests,
)
from kvlab.workloads.vllm_runs import load_vllm_run


def status_line(calibrations: list[Calibration], directory=None) -> str:
    """One sentence: which measurements exist, or that none does yet and how to make one."""
    where = CALIBRATION_DIR if directory in (None, "") else Path(directory)
    where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    if not calibrations:
        return (
            f"No GPU measurement is available yet: {where}/ holds no calibration file. Make one on a "
            "GPU machine with `bash scripts/gpu_calibration.sh` (or `kvlab calibrate --device cuda`), "
            "commit the CSV it writes to data/calibration/ and re-run this notebook."
        )
    names = ", ".join(
        f"{c.name} ({c.metadata.get('device', '?')}, {c.metadata.get('date', '?')})" for c in calibrations
    )
    return f"{len(calibrations)} calibration file(s): {names}."


def kv_table(
    shape: DecoderShape,
    calibrations: list[Calibration],
    article_mib_per_token: float = article.MIB_PER_TOKEN,
    *,
    free_gib: float = 64,
    context_tokens: int = 1000,
) -> pd.DataFrame:
    """KV bytes per token from the article, from shape's arithmetic and from each file, with the requests of
    context_tokens tokens that free_gib GiB of KV memory holds at each (section 3's memory budget)."""
    validate.positive_number("article_mib_per_token", article_mib_per_token)
    free_bytes = validate.positive_number("free_gib", free_gib) * GIB
    validate.positive_int("context_tokens", context_tokens)
    rows = [
        {"source": "article (assumed)", "kind": "assumption", "kv_bytes_per_token": article_mib_per_token * MIB},
        {
            "source": f"2 x {shape.num_layers} layers x {shape.num_heads} heads x {shape.head_dim} x "
            f"{DTYPE_BYTES[shape.dtype]} B",
            "kind": "arithmetic",
            "kv_bytes_per_token": float(shape.kv_bytes_per_token),
        },
    ]
    for c in calibrations:
        for value in (row["value"] for row in c.kind("kv_bytes_per_token")):
            rows.append(
                {
                    "source": f"{c.name} ({c.metadata.get('dtype', '?')})",
                    "kind": "measured",
                    "kv_bytes_per_token": value,
                }
            )
    table = pd.DataFrame(rows).set_index("source")
    table["kv_kib_per_token"] = table["kv_bytes_per_token"] / KIB
    table["max_num_requests"] = (free_bytes // (table["kv_bytes_per_token"] * context_tokens)).astype(int)
    return table


def bound_table(shape: DecoderShape, gpu_names, batch_sizes, context_tokens) -> pd.DataFrame:
    """Memory-bandwidth lower bound of the decode step (ms) per GPU of data/gpus.csv (rows) and (batch, context)
    (columns): weights plus cached K and V read once per step / datasheet bandwidth. A bound, not a measurement;
    NaN where the weights and the batch's cache do not fit in the GPU's memory."""
    gpus = [get_gpu(name) for name in validate.non_empty("gpu_names", gpu_names)]
    columns = pd.MultiIndex.from_tuples(
        [(b, c) for b in batch_sizes for c in context_tokens], names=["batch_size", "context_tokens"]
    )
    values = [
        [
            decode_bound_ms(shape, gpu.memory_bandwidth_gb_s, b, c)
            if decode_bytes_per_step(shape, b, c) <= gpu.memory_gib * GIB
            else math.nan  # does not fit
            for b, c in columns
        ]
        for gpu in gpus
    ]
    return pd.DataFrame(values, index=pd.Index([gpu.name for gpu in gpus], name="gpu"), columns=columns)


def step_headline(bound: pd.DataFrame, batch_size: int, context_tokens: int) -> str:
    """One line: the decode step (ms) of a table with a row per GPU and a (batch, context) column (bound_table, or
    profile_decode_table's steps unstacked) on each GPU at batch_size and context_tokens, or at the table's first
    column when the table has no such column (other BATCH_SIZES or CONTEXTS)."""
    if bound.columns.empty:
        return f"no GPU measured at batch {batch_size}, {context_tokens:,} tokens"
    column = (batch_size, context_tokens) if (batch_size, context_tokens) in bound.columns else bound.columns[0]
    shown = [f"{bound.loc[gpu, column]:.2f} ms on {gpu}" for gpu in bound.index if pd.notna(bound.loc[gpu, column])]
    return f"{', '.join(shown) or 'no GPU holds it'} at batch {column[0]}, {column[1]:,} tokens"


PROFILED_MODEL = "meta-llama/Llama-2-7b-hf"  # the article's shape, with operator profiles on the A100 and H100


def profile_decode_table(gpu_names, batch_sizes, context_tokens, model: str = PROFILED_MODEL) -> pd.DataFrame:
    """A decode step of model from its operator profiles at TP 1 (data/profiles), one row per GPU of gpu_names
    that has one, batch size and context: the linear layers measured at batch_size tokens (ms), the rest
    estimated (the batch's cached K and V, context_tokens + 1 tokens each, and the lm_head's weights, read at the
    bandwidth those linear layers sustain on that GPU: kvlab.core.profiles.profile_fractions; ms), and their sum.
    Rows whose weights and cache do not fit in the GPU's memory, or whose batch passes the profile's token counts,
    are left out."""
    spec, names = get_model(model), validate.non_empty("gpu_names", gpu_names)
    entries = [e for e in profiles.load_index() if e.model == spec.name and e.tensor_parallel_size == 1]
    kv_bytes, weights_bytes = capacity.kv_bytes_per_token(spec), weights_bytes_per_gpu(spec, 2)  # 16-bit
    rows = []
    for entry in (e for name in names for e in entries if e.gpu == name):
        gpu, profile = get_gpu(entry.gpu), profiles.load_profile(entry)
        bandwidth = gpu.memory_bandwidth_gb_s * 1e9 * profiles.profile_fractions(profile)[0]
        lm_head_bytes = entry.vocab_size * entry.hidden_size * profiles.WEIGHT_BYTES[entry.dtype]
        for b in (b for b in batch_sizes if b <= profile.dense[0][-1]):  # batches past the profile: left out
            linear_ms = float(profiles.linear_layers_ms(profile, b))
            for c in context_tokens:
                cache_bytes = b * (c + 1) * kv_bytes
                if weights_bytes + cache_bytes <= gpu.memory_gib * GIB:
                    rest_ms = (cache_bytes + lm_head_bytes) / bandwidth * 1000.0
                    rows.append((gpu.name, b, c, linear_ms, rest_ms, linear_ms + rest_ms))
    columns = ["gpu", "batch_size", "context_tokens", "linear_measured_ms", "rest_estimated_ms", "step_ms"]
    return pd.DataFrame(rows, columns=columns).set_index(["gpu", "batch_size", "context_tokens"])


def profile_decode_figures(
    table: pd.DataFrame, batch_size: int, context_tokens: int, ms_per_token: float = article.MS_PER_TOKEN
) -> dict:
    """profile_decode_table's steps at batch_size and context_tokens (or its first batch and context when the table
    has no such row) in words: per GPU the measured linear layers, the step, and whether the article's ms_per_token
    lies above or below that step, at the table's 2 decimals."""
    keys = list(table.index)
    if not keys:
        return {"any": False}
    batch, context = (
        (batch_size, context_tokens) if any(k[1:] == (batch_size, context_tokens) for k in keys) else keys[0][1:]
    )
    parts = []
    for gpu in dict.fromkeys(k[0] for k in keys):
        if (gpu, batch, context) not in table.index:
            continue
        row = table.loc[(gpu, batch, context)]
        way = phrases.direction(row["step_ms"], ms_per_token, 2, ("above", "below", "equal to"))
        parts.append(
            f"on the {gpu} the linear layers measure {cell(row['linear_measured_ms'], 2)} ms and the step comes to "
            f"{cell(row['step_ms'], 2)} ms, so the article's {ms_per_token:g} ms lies {way} it"
        )
    spread = []
    for gpu, linear in table["linear_measured_ms"].groupby(level="gpu", sort=False):
        by_batch = linear.groupby(level="batch_size").first()
        low, high = by_batch.min(), by_batch.max()
        ratio = phrases.shown(high, 2) / phrases.shown(low, 2)  # as printed
        apart = f"the most {100 * (ratio - 1):.0f}% above the least" if ratio < 2 else f"{ratio:.1f}x apart"
        spread.append(
            f"{cell(low, 2)} to {cell(high, 2)} ms on the {gpu} at {by_batch.index[0]:,} to "
            f"{by_batch.index[-1]:,} requests, {apart}"
        )
    return {
        "any": bool(parts),
        "batch": batch,
        "context": context,
        "steps": "; ".join(parts),
        "linear": "; ".join(spread),
    }


def step_table(calibrations: list[Calibration]) -> pd.DataFrame:
    """Measured decode step times (ms): one row per file, batch size and context (empty with no file)."""
    frames = [pd.DataFrame(c.kind("decode_step_ms")).assign(device=c.name) for c in calibrations]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["device", "batch_size", "context_tokens", "decode_step_ms"])
    table = pd.concat(frames, ignore_index=True).rename(columns={"value": "decode_step_ms"})
    return table[["device", "batch_size", "context_tokens", "decode_step_ms"]]


def section2_table(
    calibrations: list[Calibration], experiment: Experiment = Experiment(), seed: int = 0
) -> pd.DataFrame:
    """Section 2's run (the experiment's workload of one seed, kvlab's run, not the article's figures) with the
    experiment's cost (the article's 8 ms per token) and with each file's decode step at batch max_num_seqs (contexts clamped to the measured grid): one row
    per cost and policy."""
    workload = experiment.workload(seed)
    costs = {f"kvlab, seed {seed}, at the article's {experiment.cost.ms_per_token:g} ms per token": experiment.cost}
    for c in calibrations:
        costs[f"measured: {c.name}"] = CalibratedServiceTime.from_csv(c.path, batch_size=experiment.max_num_seqs)
    frames = [
        compare_policies(workload, max_num_seqs=experiment.max_num_seqs, cost=cost).reset_index().assign(cost=name)
        for name, cost in costs.items()
    ]
    table = pd.concat(frames, ignore_index=True).set_index(["cost", "policy"])
    return table[["mean_latency_s", "p95_latency_s", "makespan_s", "throughput_rps", "idle_pct"]]


# ---------------------------------------------------------------- the figures the notebook's prose states
def shape_figures(shape: DecoderShape) -> dict:
    """The decoder's shape in words: KV bytes per token (B, KiB, MiB), the bytes per value, the parameters
    (billions) and their weights (GiB), beside the article's assumed MiB per token."""
    return {
        "layers": shape.num_layers,
        "heads": shape.num_heads,
        "head_dim": shape.head_dim,
        "hidden": shape.hidden_size,
        "intermediate": shape.intermediate_size,
        "vocab": shape.vocab_size,
        "dtype_bytes": DTYPE_BYTES[shape.dtype],
        "kv_bytes": shape.kv_bytes_per_token,
        "kv_kib": shape.kv_bytes_per_token / KIB,
        "kv_mib": shape.kv_bytes_per_token / MIB,
        "article_mib": article.MIB_PER_TOKEN,
        "params_b": shape.num_params / 1e9,
        "weights_gib": shape.weights_bytes / GIB,
    }


def bound_figures(
    shape: DecoderShape, gpu_names, batch_size: int, context_tokens: int, ms_per_token: float = article.MS_PER_TOKEN
) -> dict:
    """The decode-step lower bound (ms) for batch_size requests of context_tokens on each GPU (keys by GPU name);
    in words, the GPUs where the article's ms_per_token lies above it and those where it lies below, with their
    bounds; and the lowest and highest bound for one request of context_tokens over the GPUs."""
    gpus = [get_gpu(name) for name in validate.non_empty("gpu_names", gpu_names)]
    bounds = {gpu.name: decode_bound_ms(shape, gpu.memory_bandwidth_gb_s, batch_size, context_tokens) for gpu in gpus}
    one = [decode_bound_ms(shape, gpu.memory_bandwidth_gb_s, 1, context_tokens) for gpu in gpus]

    def listed(names):
        return "none" if not names else names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    return {
        "batch": batch_size,
        "context": context_tokens,
        "ms_per_token": ms_per_token,
        **bounds,
        "above": listed([f"the {n} ({b:.2f} ms)" for n, b in bounds.items() if ms_per_token >= b]),
        "below": listed([f"the {n} ({b:.2f} ms)" for n, b in bounds.items() if ms_per_token < b]),
        "one_low": min(one),
        "one_high": max(one),
    }


# ---------------------------------------------------------------- real vLLM runs as checks of the step costs
# The four figures of a check, in check_view's order: words (unit), vLLM's and kvlab's columns of check_run_table
# (none for the median per-request error, itself an error) and the decimals they are shown with.
CHECK_FIGURES = {
    "mean_e2e_error": ("mean E2E latency (s)", "mean_e2e_s", 2),
    "mean_tpot_error": ("mean TPOT (ms)", "mean_tpot_ms", 1),
    "median_request_e2e_error": ("median per-request E2E error", None, 1),
    "mean_ttft_error": ("mean TTFT (s)", "mean_ttft_s", 2),
}


def check_view(table: pd.DataFrame) -> pd.DataFrame:
    """check_run_table as the report shows it: one row per run (its label) and figure (its target in the name),
    vLLM's value, then per step cost kvlab's value, its error (%) and whether it lies within the target. Values are
    text at their figure's decimals (the rows mix units); the median per-request error has no value, only its error."""
    from kvlab.sections.shared.present import cell

    cost_names = list(dict.fromkeys(table.index.get_level_values("step_cost")))
    rows = []
    for name in dict.fromkeys(table.index.get_level_values("run")):
        for key, (words, column, decimals) in CHECK_FIGURES.items():
            limit = 100 * CHECK_TARGETS[key]
            target = f"under {limit:g}%" if key == "median_request_e2e_error" else f"±{limit:g}%"
            first = table.loc[(name, cost_names[0])]
            row = {
                "run": first["label"],
                "figure": f"{words}, target {target}",
                "vllm": cell(first[f"vllm_{column}"], decimals) if column else "",
            }
            for cost_name in cost_names:
                r = table.loc[(name, cost_name)]
                row[f"kvlab_{cost_name}"] = cell(r[f"kvlab_{column}"], decimals) if column else ""
                row[f"{cost_name}_error_pct"] = 100 * r[key]
                row[f"{cost_name}_within_target"] = bool(abs(r[key]) <= CHECK_TARGETS[key])
            rows.append(row)
    return pd.DataFrame(rows).set_index(["run", "figure"])


def check_figures(table: pd.DataFrame) -> dict:
    """check_run_table's figures in words for the notebook's prose: the runs (vLLM version, GPU, requests, how they
    were scheduled), the step costs and their sources, the targets, the (run, step cost) pairs within all four, each
    miss with its reason and each run's notes (Markdown lists)."""
    runs = [load_vllm_run(name) for name in dict.fromkeys(table.index.get_level_values("run"))]
    modes = {r.settings["async_scheduling"] for r in runs}
    versions = sorted({r.settings["vllm_version"] for r in runs})
    gpus = sorted({r.settings["gpu"] for r in runs})
    counts = sorted({r.workload.num_requests for r in runs})
    t = {k: f"{100 * v:g}%" for k, v in CHECK_TARGETS.items()}
    within = [
        f"{r['label']} with the {cost_name} clock" for (_, cost_name), r in table.iterrows() if r["within_targets"]
    ]
    misses = [
        f"- {r['label']}, {cost_name} clock: {r['why']}"
        for (_, cost_name), r in table.iterrows()
        if not r["within_targets"]
    ]
    return {
        "num_runs": len(runs),
        "vllm_versions": " and ".join(versions),
        "gpus": " and ".join(gpus),
        "num_requests": " to ".join(f"{n:,}" for n in counts),
        "num_replays": len(table),
        "num_clocks": len(set(table.index.get_level_values("step_cost"))),
        "step_costs": " and ".join(dict.fromkeys(table.index.get_level_values("step_cost"))),
        "targets": (
            f"mean E2E latency and mean TPOT within {t['mean_e2e_error']} of vLLM's"
            if t["mean_e2e_error"] == t["mean_tpot_error"]
            else f"mean E2E latency within {t['mean_e2e_error']} of vLLM's, mean TPOT within {t['mean_tpot_error']}"
        )
        + f", the median per-request E2E error under {t['median_request_e2e_error']} and mean TTFT "
        f"within {t['mean_ttft_error']}",
        "sources": "\n".join(
            f"- {cost_name}: {source}"
            for cost_name, r in table.groupby(level="step_cost", sort=False)
            for source in dict.fromkeys(r["cost_source"])
        ),
        "num_within": len(within),
        "within": " and ".join(within) or "none",
        "misses": "\n".join(misses) or "- none",
        "notes": "\n".join(f"- {check_label(r)}: {check_notes(r)}." for r in runs),
        "scheduling": {
            frozenset({True}): "asynchronously, as vLLM does by default",
            frozenset({False}): "synchronously",
        }.get(frozenset(modes), "each in the mode it ran"),
    }


# ---------------------------------------------------------------- what each term of the measured clock adds
WHOLE = "measured"  # the step_cost of check_run_table's row with every term on


def term_view(table: pd.DataFrame, whole_cost: str = WHOLE) -> pd.DataFrame:
    """check_run_table of term_requests as the report shows it: one row per run (its label) and term switched off
    ("none" for the whole clock, step_cost whole_cost), kvlab's mean TPOT (ms) and TTFT (s), and what the term adds
    to each: the whole clock's figure less the figure without the term."""
    rows = []
    for name, r in table.groupby(level="run", sort=False):
        whole = r.loc[(name, whole_cost)]
        for (_, step_cost), row in r.iterrows():
            rows.append(
                {
                    "run": row["label"],
                    "term_off": step_cost.removeprefix(f"{whole_cost} without ") if step_cost != whole_cost else "none",
                    "kvlab_mean_tpot_ms": row["kvlab_mean_tpot_ms"],
                    "adds_tpot_ms": whole["kvlab_mean_tpot_ms"] - row["kvlab_mean_tpot_ms"],
                    "kvlab_mean_ttft_s": row["kvlab_mean_ttft_s"],
                    "adds_ttft_s": whole["kvlab_mean_ttft_s"] - row["kvlab_mean_ttft_s"],
                }
            )
    return pd.DataFrame(rows).set_index(["run", "term_off"])


def tpot_gaps(table: pd.DataFrame, whole_cost: str = WHOLE) -> dict[str, float]:
    """Each run's gap between kvlab's whole clock and vLLM in mean TPOT (ms, kvlab less vLLM; label -> gap): what the
    terms' shares (term_view) are set against."""
    wholes = table.xs(whole_cost, level=1)
    return dict(zip(wholes["label"], wholes["kvlab_mean_tpot_ms"] - wholes["vllm_mean_tpot_ms"]))


def term_text(table: pd.DataFrame, whole_cost: str = WHOLE) -> str:
    """For each run the whole measured clock misses, a Markdown item built from term_view's figures (ms at 1
    decimal, as the check table shows TPOT): kvlab's mean TPOT against vLLM's, the gap, and the gap as a multiple of
    what each term adds (largest share first): a term whose share the gap far exceeds cannot close it alone by being
    mis-sized; '' when the clock meets every target on every run."""
    view, items = term_view(table, whole_cost), []
    for name, r in table.groupby(level="run", sort=False):
        whole = r.loc[(name, whole_cost)]
        if whole["within_targets"]:
            continue
        kv, vllm = phrases.shown(whole["kvlab_mean_tpot_ms"], 1), phrases.shown(whole["vllm_mean_tpot_ms"], 1)
        gap = abs(kv - vllm)
        way = phrases.direction(vllm, kv, 1, ("over", "short of", "equal to"))
        adds = view.loc[whole["label"]].drop("none")["adds_tpot_ms"].sort_values(ascending=False)
        shares = ", ".join(
            f"{gap / phrases.shown(a, 1):.1f}x the share of the {term} ({cell(a, 1)} ms)"
            if phrases.shown(a, 1) > 0
            else f"more than the share of the {term} (under 0.05 ms)"
            for term, a in adds.items()
        )
        items.append(
            f"- {whole['label']}: kvlab's mean TPOT is {cell(kv, 1)} ms, {cell(gap, 1)} ms a token {way} vLLM's "
            f"{cell(vllm, 1)} ms; that gap is {shares}." + ttft_words(whole)
        )
    return "\n".join(items)


def term_pair_view(measured: pd.DataFrame, composed: pd.DataFrame) -> pd.DataFrame:
    """What each term adds to each run's mean TPOT (ms) under the measured clock (a whole-model profile) and under the
    same clock composed from the GPU's operator tables (term_view of check_run_table(term_requests(...)) of each),
    and the composed less the measured: where the composition departs from the profile, term by term. A term one
    clock lacks adds 0 there."""
    a = term_view(measured, "measured")["adds_tpot_ms"].drop("none", level="term_off")
    b = term_view(composed, "composed")["adds_tpot_ms"].drop("none", level="term_off")
    view = pd.concat({"measured_adds_tpot_ms": a, "composed_adds_tpot_ms": b}, axis=1).fillna(0.0)
    view["difference_ms"] = view["composed_adds_tpot_ms"] - view["measured_adds_tpot_ms"]
    order = {run: i for i, run in enumerate(dict.fromkeys(a.index.get_level_values("run")))}
    return view.sort_index(level="run", key=lambda runs: runs.map(order), sort_remaining=False)


def term_pair_text(measured: pd.DataFrame, composed: pd.DataFrame) -> str:
    """For each run, a Markdown item from term_pair_view's and the check tables' figures (ms at 1 decimal): the
    composed clock's mean TPOT against the measured clock's, and the terms whose shares differ most between them
    (those of at least 0.1 ms, largest first)."""
    view, items = term_pair_view(measured, composed), []
    for name, r in composed.groupby(level="run", sort=False):
        whole = r.loc[(name, "composed")]
        other = measured.loc[(name, "measured")]
        kc, km = phrases.shown(whole["kvlab_mean_tpot_ms"], 1), phrases.shown(other["kvlab_mean_tpot_ms"], 1)
        way = phrases.direction(km, kc, 1, ("above", "below", "equal to"))
        diff = view.loc[whole["label"], "difference_ms"]
        diff = diff[diff.abs().round(1) >= 0.1].reindex(diff.abs().sort_values(ascending=False).index).dropna()
        terms = ", ".join(f"the {term} {d:+.1f} ms" for term, d in diff.items()) or "no term by 0.1 ms or more"
        items.append(
            f"- {whole['label']}: the composed clock's mean TPOT is {cell(kc, 1)} ms, {cell(abs(kc - km), 1)} ms "
            f"{way} the measured clock's {cell(km, 1)} ms (vLLM's: {cell(whole['vllm_mean_tpot_ms'], 1)} ms); "
            f"composed less measured, by term: {terms}."
        )
    return "\n".join(items)


def ttft_words(row) -> str:
    """Where a run's mean TTFT misses its target, a sentence on where the gap lies (s at 2 decimals, as the check
    table shows TTFT): the median TTFT, then the mean wait before a request's first step, kvlab's against vLLM's; ''
    within the target."""
    if abs(row["mean_ttft_error"]) <= CHECK_TARGETS["mean_ttft_error"]:
        return ""
    km, vm = row["kvlab_median_ttft_s"], row["vllm_median_ttft_s"]
    median = f"its median TTFT is {cell(km, 2)} s against vLLM's {cell(vm, 2)} s" + (
        f" (alike, within {100 * phrases.ALIKE_SHARE:g}%)"
        if phrases.alike(km, vm, 2, phrases.ALIKE_SHARE)
        else f" ({phrases.shift(vm, km, 2)})"
    )
    kv, vllm = row["kvlab_mean_wait_s"], row["vllm_mean_wait_s"]
    way = phrases.direction(vllm, kv, 2, ("longer than", "shorter than", "as long as"))
    return (
        f" Its mean TTFT misses by {100 * row['mean_ttft_error']:+.1f}%: {median}, and a request waited "
        f"{cell(kv, 2)} s on average before its first step, {way} vLLM's {cell(vllm, 2)} s."
    )


CPU_MODEL, CPU_GPU = "meta-llama/Llama-3.1-8B", "RTX-PRO-6000-Server-96GB"  # a complete operator profile
CPU_BATCH_SIZES = (1, 8, 32, 128, 256)


def cpu_share_table(
    model: str = CPU_MODEL, gpu: str = CPU_GPU, context_tokens: int = 1024, batch_sizes=CPU_BATCH_SIZES
) -> pd.DataFrame:
    """The CPU's scheduling beside a decode step's GPU work on the measured clock, per batch size (decodes of
    context_tokens each, vLLM's default settings, TP 1): the GPU's step (every term but the CPU's), vLLM's
    scheduler on the CPU (schedule() + update_from_output(), kvlab.core.profiles.scheduler_cpu_us), the step
    with synchronous scheduling (their sum) and with asynchronous scheduling (the longer), all ms, and the CPU's
    share of the synchronous step (%)."""
    from kvlab.core.config import EngineConfig
    from kvlab.core.cost import Batch, make_step_cost

    spec, card = get_model(model), get_gpu(gpu)
    clocks = {
        mode: make_step_cost("measured", model=spec, gpu=card, config=EngineConfig().replace(async_scheduling=mode))
        for mode in (False, True)
    }
    if not all(hasattr(c, "without") for c in clocks.values()):
        validate.fail("model", model, f"has no complete operator profile on the {gpu} (data/profiles/index.csv)")
    rows = []
    for b in validate.non_empty("batch_sizes", batch_sizes):
        batch = Batch(b, b * (context_tokens + 1), b, b * (context_tokens + 1))
        gpu_ms = clocks[False].without("CPU scheduling").step_s(batch) * 1e3
        sync_ms = clocks[False].step_s(batch) * 1e3
        rows.append(
            {
                "batch_size": b,
                "gpu_step_ms": gpu_ms,
                "cpu_scheduling_ms": sync_ms - gpu_ms,
                "synchronous_step_ms": sync_ms,
                "asynchronous_step_ms": clocks[True].step_s(batch) * 1e3,
                "cpu_share_pct": 100.0 * (sync_ms - gpu_ms) / sync_ms,
            }
        )
    return pd.DataFrame(rows).set_index("batch_size")


def cpu_share_text(table: pd.DataFrame, model: str = CPU_MODEL, gpu: str = CPU_GPU) -> str:
    """cpu_share_table in one paragraph, every figure at the table's 2 decimals (ms) or 1 (%)."""
    first, last = table.iloc[0], table.iloc[-1]
    hidden = [
        b
        for b, r in table.iterrows()
        if phrases.shown(r["asynchronous_step_ms"], 2) == phrases.shown(r["gpu_step_ms"], 2)
    ]
    if len(hidden) == len(table):
        overlap = "asynchronous scheduling hides it at every batch size here: the GPU's step is the longer"
    elif hidden:
        overlap = (
            f"asynchronous scheduling hides it at {', '.join(f'{b:,}' for b in hidden)} "
            f"request{'' if hidden == [1] else 's'}, where the GPU's step is the longer, and not at the others"
        )
    else:
        overlap = "asynchronous scheduling hides none of it here: the CPU's work is the longer at every batch size"
    return (
        f"On the measured clock of {model} on the {gpu}, vLLM's scheduler takes {cell(first['cpu_scheduling_ms'], 2)} "
        f"ms of CPU a step for {table.index[0]:,} request{'s' if table.index[0] > 1 else ''} and "
        f"{cell(last['cpu_scheduling_ms'], 2)} ms for {table.index[-1]:,}, {cell(table['cpu_share_pct'].min(), 1)}% "
        f"to {cell(table['cpu_share_pct'].max(), 1)}% of a synchronous step; {overlap}. It was timed on kvlab's "
        "machine (data/profiles/cpu/); vLLM's other CPU work per step is not measured and not counted."
    )


# ---------------------------------------------------------------- the answer, from the GPU runs
def answer_text(
    calibrations: list[Calibration],
    article_ms: float = article.MS_PER_TOKEN,
    article_mib: float = article.MIB_PER_TOKEN,
    context_tokens: int = 1024,
) -> str:
    """The section's answer in one paragraph, from each calibration file: the KV bytes a token the allocator held
    against the article's, and the measured decode step at context_tokens cached tokens from batch 1 to the largest
    batch measured below the article's ms per token, against it."""
    if not calibrations:
        return (
            "No GPU has measured the article's shape yet: the figures below are arithmetic, operator measurements "
            "of other GPUs and bounds."
        )
    parts = []
    for c in calibrations:
        kv = [r["value"] for r in c.kind("kv_bytes_per_token")]
        steps = {r["batch_size"]: r["value"] for r in c.kind("decode_step_ms") if r["context_tokens"] == context_tokens}
        words = [f"On the {c.name} (measured for kvlab)"]
        if kv:
            held = kv[0] / MIB
            relation = "exactly" if held == article_mib else ("more than" if held > article_mib else "less than")
            words.append(
                f"a token's K and V held {kv[0]:,.0f} bytes, {held:g} MiB: {relation} the article's {article_mib:g} MB"
            )
        if steps:
            batches = sorted(steps)
            under = [b for b in batches if steps[b] <= article_ms]
            first = steps[batches[0]]
            step_words = (
                f"a decode step of the article's shape at {context_tokens:,} cached tokens took {first:.2f} ms at "
                f"batch {batches[0]}"
            )
            if under and under[-1] != batches[0]:
                step_words += f" and {steps[under[-1]]:.2f} ms at batch {under[-1]}"
            if under:
                step_words += (
                    f": under the article's {article_ms:g} ms up to batch {under[-1]} (the largest batch measured "
                    f"under it), so on this GPU the article's per-token time is an upper bound for small batches"
                )
            else:
                step_words += f": more than the article's {article_ms:g} ms at every batch measured"
            over = [b for b in batches if steps[b] > article_ms]
            if over:
                step_words += f", and {steps[over[0]]:.2f} ms from batch {over[0]}, over it"
            words.append(step_words)
        parts.append(words[0] + ", " + "; ".join(words[1:]) + ".")
    return " ".join(parts)


# ---------------------------------------------------------------- one H200, two sources
H200_SHARDS = DATA_DIR / "profiles" / "kvlab" / "h200"
H200_GPU = "H200-141GB"
H200_LINEAR = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
H200_ATTENTION_MODEL = "meta-llama/Llama-3.1-8B"


def _linear_shapes(meta: dict) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear layer of one of kvlab's H200 shards (its meta.json: one GPU's share at its TP)."""
    tp = meta["tensor_parallel_size"]
    heads, kv, head_dim, hidden = meta["heads"] // tp, max(1, meta["kv"] // tp), meta["hd"], meta["hidden"]
    inter = meta.get("inter", 0) // tp
    shapes = {"qkv_proj": ((heads + 2 * kv) * head_dim, hidden), "o_proj": (hidden, heads * head_dim)}
    if inter:
        shapes |= {"gate_up_proj": (2 * inter, hidden), "down_proj": (hidden, inter)}
    return shapes


def h200_gemm_table() -> pd.DataFrame:
    """kvlab's own H200 GEMMs (F.linear through cuBLAS) against AIConfigurator's H200 table (vLLM 0.24's
    F.linear) at every shape both measured: (tokens, out, in) on both grids, no interpolation. One row a shard and
    layer: shapes compared, the median and range of kvlab / AIConfigurator - 1 (%)."""
    import json

    from kvlab.core import operators

    z = np.load(operators.operator_tables(H200_GPU).folder / "gemm.npz")
    aic = {
        (int(m), int(n), int(k)): float(us) for m, n, k, us in zip(z["bf16_m"], z["bf16_n"], z["bf16_k"], z["bf16_us"])
    }
    rows = []
    for meta_path in sorted(H200_SHARDS.glob("*/*/bf16/tp*/meta.json")):
        meta = json.loads(meta_path.read_text())
        dense = pd.read_csv(meta_path.parent / "dense.csv")
        for layer, (n, k) in _linear_shapes(meta).items():
            ours = dense[dense["layer"] == layer]
            diffs = [us / aic[(t, n, k)] - 1 for t, us in zip(ours["tokens"], ours["time_us"]) if (t, n, k) in aic]
            if diffs:
                rows.append(
                    {
                        "shard": f"{meta['model'].split('/')[-1]} TP {meta['tensor_parallel_size']}",
                        "layer": layer,
                        "out x in": f"{n:,} x {k:,}",
                        "shapes": len(diffs),
                        "median_pct": 100 * float(np.median(diffs)),
                        "min_pct": 100 * min(diffs),
                        "max_pct": 100 * max(diffs),
                    }
                )
    return pd.DataFrame(rows)


def h200_attention_table() -> pd.DataFrame:
    """One layer's attention of Llama-3.1-8B (32 heads, 8 KV heads, head dim 128) on the H200 by three kernels:
    PyTorch's flash and cuDNN backends (kvlab's measurements, attention_backends.csv; each the faster of its
    packed and grouped-heads calls) and vLLM's FlashAttention 3 (AIConfigurator's tables): decodes at 2,048 and
    16,384 cached tokens, and prefills with no history (us)."""
    from kvlab.core import operators

    backends = pd.read_csv(H200_SHARDS / "attention_backends.csv")
    backends = backends[backends["model"] == H200_ATTENTION_MODEL]
    tables = operators.operator_tables(H200_GPU)
    generation, context = tables.attention("generation", "bf16"), tables.attention("context", "bf16")
    shape = [(1.0, (32, 8, 128))]
    rows = []
    for n, kv in [(n, kv) for kv in (2048, 16384) for n in (1, 8, 64, 256)]:
        at = backends[(backends["prefill_chunk"] == 0) & (backends["n_decode"] == n) & (backends["kv_decode"] == kv)]
        rows.append(
            {
                "batch": f"{n} decode{'s' if n > 1 else ''} x {kv:,} tokens",
                "flash_us": float(at.loc[at["backend"].isin(["flash", "flash-gqa"]), "time_us"].min()),
                "cudnn_us": float(at.loc[at["backend"].isin(["cudnn", "cudnn-gqa"]), "time_us"].min()),
                "fa3_us": float(generation.us_at(shape, n, kv)),
            }
        )
    for chunk in (256, 2048, 8192):
        at = backends[(backends["prefill_chunk"] == chunk) & (backends["kv_prefill"] == 0)]
        rows.append(
            {
                "batch": f"prefill of {chunk:,} tokens",
                "flash_us": float(at.loc[at["backend"].isin(["flash", "flash-gqa"]), "time_us"].min()),
                "cudnn_us": float(at.loc[at["backend"].isin(["cudnn", "cudnn-gqa"]), "time_us"].min()),
                "fa3_us": float(context.us_at(shape, 1, chunk)),
            }
        )
    table = pd.DataFrame(rows).set_index("batch")
    table["fa3_vs_cudnn_pct"] = 100 * (table["fa3_us"] / table["cudnn_us"] - 1)
    return table


def h200_sources_text(gemm: pd.DataFrame, attention: pd.DataFrame) -> str:
    """The two H200 sources compared, in words, from the two tables (their rounding)."""
    shapes = int(gemm["shapes"].sum())
    low, high = gemm["min_pct"].min(), gemm["max_pct"].max()
    weighted = float(np.average(gemm["median_pct"], weights=gemm["shapes"]))
    decode = attention[attention.index.str.contains("decode")]
    small = decode.iloc[0]
    large = decode.iloc[-1]

    def relation(pct: float) -> str:
        return f"{abs(pct):.0f}% {'slower' if pct > 0 else 'faster'} than"

    return (
        f"At the {shapes:,} GEMM shapes both measured on the H200, kvlab's times are {low:+.1f}% to {high:+.1f}% off "
        f"AIConfigurator's, the per-layer medians {weighted:+.1f}% on average (weighted by shapes): "
        + (
            "the two agree at the median and scatter shape by shape, "
            if abs(weighted) < 5
            else "the two differ even at the median, "
        )
        + "and the measured clock reads AIConfigurator's, which cover every shape a model asks for. For attention "
        f"the kernels differ: vLLM's FlashAttention 3 is "
        f"{relation(small['fa3_vs_cudnn_pct'])} PyTorch's cuDNN backend at {small.name} and "
        f"{relation(large['fa3_vs_cudnn_pct'])} it at {large.name}. AIConfigurator's call also writes the new keys "
        f"and values into the paged cache, which PyTorch's does not; kvlab has not isolated how much of the gap that "
        f"is. The clock reads vLLM's own kernel, the one vLLM runs."
    )


def _ranges_by_step_kind(percent: pd.Series, kinds: pd.Series) -> pd.DataFrame:
    """Per step kind (decode, prefill, mixed): the steps and the least, median and most of percent."""
    table = percent.groupby(kinds).agg(["count", "min", "median", "max"])
    table.columns = ["steps", "least_pct", "median_pct", "most_pct"]
    return table.reindex([k for k in ("decode", "prefill", "mixed") if k in table.index])


def _ranges_text(table: pd.DataFrame, number: str) -> str:
    """_ranges_by_step_kind's rows in words, each percentage in the format number (e.g. "+.0f")."""
    return "; ".join(
        (f"{row.least_pct:{number}}% to {row.most_pct:{number}}%" if row.steps > 1 else f"{row.least_pct:{number}}%")
        + f" on {int(row.steps)} {kind} step{'s' if row.steps > 1 else ''}"
        for kind, row in table.iterrows()
    )


def h200_whole_step_table() -> pd.DataFrame:
    """What a whole step adds to its operators timed one by one, on kvlab's H200 (scripts/gpu/time_whole_step.py:
    Llama-3.1-8B's step in one CUDA graph against the sum of the same kernels alone, the KV-cache write included):
    per step kind, the steps measured and the least, median and most of whole / composed - 1 (%)."""
    steps = pd.read_csv(H200_SHARDS / "whole_step" / "whole_step.csv")
    steps = steps[steps["error"].isna()]
    gap = 100 * (steps["ratio_whole_over_composed_with_kv_write"] - 1)
    return _ranges_by_step_kind(gap, steps["step_kind"])


def h200_whole_step_text(table: pd.DataFrame) -> str:
    """h200_whole_step_table in words, with its rounding, and what of it the measured clock adds."""
    from kvlab.core.operators import kernel_gap_us_per_layer

    gap_us, steps = kernel_gap_us_per_layer()
    return (
        "The same H200 also timed whole steps of Llama-3.1-8B, each captured in one CUDA graph, against the sum of the "
        "same kernels timed one at a time, the KV-cache write included: the whole step "
        + ("took longer than the sum by " if (table["least_pct"] > 0).all() else "differed from the sum by ")
        + _ranges_text(table, ".1f")
        + f". The measured clock adds the time the decode steps left unexplained by their kernels, {gap_us:.1f} us a "
        f"decoder layer (the median of {steps} steps), as its kernel gaps"
        + (
            "; the larger share prefill steps left is not added, so the clock stays short there."
            if "prefill" in table.index and table.loc["prefill", "median_pct"] > table.loc["decode", "median_pct"]
            else "."
        )
    )


def h200_clock_table() -> pd.DataFrame:
    """The measured clock (composed from vLLM's kernels by shape, its CPU term off) against the whole steps kvlab
    timed on its H200 (PyTorch's attention, Triton's small operators: not vLLM's kernels), by step kind: steps, and
    the least, median and most of clock / whole step - 1 (%)."""
    from kvlab.core.config import EngineConfig
    from kvlab.core.cost.batch import Batch
    from kvlab.core.cost.measured import measured_step_cost

    model = get_model("meta-llama/Llama-3.1-8B")
    clock = measured_step_cost(model, get_gpu(H200_GPU), EngineConfig()).without("CPU scheduling")
    steps = pd.read_csv(H200_SHARDS / "whole_step" / "whole_step.csv")
    steps = steps[steps["error"].isna()]
    errors = []
    for row in steps.itertuples():
        chunk, decodes, context = int(row.chunk_tokens), int(row.B), int(row.C)
        pairs = chunk * (chunk + 1) // 2
        batch = Batch(chunk + decodes, chunk + decodes * context, decodes, decodes * context, int(chunk > 0), pairs)
        errors.append(100 * (clock.step_s(batch) * 1e6 / row.whole_step_us - 1))
    return _ranges_by_step_kind(pd.Series(errors, index=steps.index), steps["step_kind"])


def h200_clock_text(table: pd.DataFrame, attention: pd.DataFrame) -> str:
    """h200_clock_table in words, with what h200_attention_table says of the kernels the two ran."""
    largest = attention[attention.index.str.contains("decode")].iloc[-1]
    ratio = largest["flash_us"] / largest["fa3_us"]
    relation = f"{ratio:.1f}x as long as" if ratio >= 1 else f"{1 / ratio:.1f}x as fast as"
    return (
        "Set against those whole steps, the measured clock for Llama-3.1-8B on the H200 (its CPU term off) is off by "
        + _ranges_text(table, "+.0f")
        + ". The two do not run the same kernels: the whole steps ran PyTorch's attention (its flash backend for "
        f"decodes, {relation} vLLM's FlashAttention 3 at {largest.name} in the table of kernels above) and Triton "
        "stand-ins for the small operators, so this compares the clock with another composition of kernels; it does "
        "not measure the clock's error."
    )
