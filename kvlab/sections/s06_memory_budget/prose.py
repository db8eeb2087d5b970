"""Section 6's figures in words: the numbers the notebook's prose states, each read from the table it is about, and
the section's headline lines."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvlab.core import capacity
from kvlab.core.units import GIB
from kvlab.sections.s06_memory_budget.runs import (
    ARTICLE_KV_GIB,
    ARTICLE_MAX_LEN,
    ARTICLE_MIB_PER_TOKEN,
    DATASETS,
    MODE_LABELS,
    MODES,
)
from kvlab.sections.s06_memory_budget.tables import (
    BLOCK_DECIMALS,
    MEMORY_DECIMALS,
    SCHEDULING_LABELS,
    SECTION,
    best_block_size,
    paper_vllm_latency,
    setting_table,
    sustains,
)
from kvlab.sections.shared import ledger, phrases
from kvlab.sections.shared.ledger import round_half_up
from kvlab.sections.shared.present import cell, joined, label, published
from kvlab.studies.paper_setting import PaperSetting, prefix_setting
from kvlab.studies.paper_workloads import TraceWorkload

PAPER_TOKEN_SLOTS = 15_700  # Table 1: "15.7K" token slots for OPT-13B's 12 GB of KV cache


def grid_figures(rates: dict, num_requests: int, num_seeds: int) -> dict:
    """The rate grids in words: per dataset (keys by its name in lower case) the lowest and highest rate and the
    largest step between neighbours (x); the requests per run and the seeds."""
    out = {"num_requests": num_requests, "num_seeds": num_seeds}
    for name, grid in rates.items():
        grid = np.asarray(grid, dtype=float)
        key = name.lower()
        out |= {
            f"{key}_low": grid.min(),
            f"{key}_high": grid.max(),
            f"{key}_points": len(grid),
            f"{key}_step": float(np.max(grid[1:] / grid[:-1])) if len(grid) > 1 else float("nan"),
        }
    return out


def setting_figures(setting: PaperSetting) -> dict:
    """The setting in numbers: KV per token (KiB), blocks, token slots against the paper's 15.7K, max-length
    requests that fit, vLLM 0.33's own KV cache on the GPU (GiB, token slots), the model's weights and what vLLM keeps
    for activations and other memory (GiB)."""
    table = setting_table(setting)
    paper = table.iloc[0]
    out = {
        "kv_kib": setting.kv_bytes_per_token / 1024,
        "blocks": setting.num_gpu_blocks(),
        "slots": setting.pool_tokens(),
        "paper_slots": PAPER_TOKEN_SLOTS,
        "kv_gib": setting.kv_cache_gib,
        "max_requests": int(paper["max_length_requests"]),
        "model": setting.model,
        "gpu": setting.gpu,
        "block_size": setting.block_size,
        "max_model_len": setting.max_model_len,
        "weights_gib": setting.model_spec.num_params_b * 1e9 * 2 / GIB,
        "gpu_gib": setting.gpu_spec.memory_gib,
        "other_gib": capacity.ACTIVATION_PEAK_GIB + capacity.NON_TORCH_GIB,
        "layers": setting.model_spec.num_layers,
        "kv_heads": setting.model_spec.num_kv_heads,
        "head_dim": setting.model_spec.head_dim,
        "bandwidth": setting.gpu_spec.memory_bandwidth_gb_s,
        "tflops": setting.gpu_spec.bf16_dense_tflops,
    }
    if len(table) > 1:
        vllm = table.iloc[1]
        out |= {
            "vllm_gib": float(vllm["kv_cache_gib"]),
            "vllm_slots": int(vllm["token_slots_tokens"]),
            "vllm_requests": int(vllm["max_length_requests"]),
        }
    else:
        out |= {"vllm_gib": float("nan"), "vllm_slots": 0, "vllm_requests": 0}
    return out


def _more(a: float, b: float) -> str:
    return "more" if a > b else "fewer" if a < b else "as many"


def fig13_figures(fig13: pd.DataFrame, fig2: pd.DataFrame) -> dict:
    """Fig. 13 and Fig. 2 in numbers: per dataset vLLM's requests batched and its lead over Orca (Oracle) and Orca
    (Max), kvlab and the paper; per mode on the Fig. 2 dataset the share of the KV cache holding token states, held,
    token states of held (%) and requests waiting; whether kvlab's Orca (Pow2) and (Oracle) batch more or fewer
    requests than the paper's."""
    out = {}
    for name in DATASETS:
        if f"{name}: kvlab" not in fig13:
            continue
        mine, theirs = fig13[f"{name}: kvlab"], fig13[f"{name}: paper"]
        key = name.lower()
        out |= {
            f"{key}_vllm": mine["vLLM"],
            f"{key}_paper_vllm": theirs["vLLM"],
            f"{key}_max": mine["Orca (Max)"],
            f"{key}_oracle": mine["Orca (Oracle)"],
            f"{key}_pow2": mine["Orca (Pow2)"],
            f"{key}_paper_oracle": theirs["Orca (Oracle)"],
            f"{key}_paper_pow2": theirs["Orca (Pow2)"],
            f"{key}_over_oracle": mine["vLLM"] / mine["Orca (Oracle)"],
            f"{key}_paper_over_oracle": theirs["vLLM"] / theirs["Orca (Oracle)"],
            f"{key}_over_max": mine["vLLM"] / mine["Orca (Max)"],
            f"{key}_paper_over_max": theirs["vLLM"] / theirs["Orca (Max)"],
            f"{key}_pow2_words": _more(mine["Orca (Pow2)"], theirs["Orca (Pow2)"]),
            f"{key}_oracle_words": _more(mine["Orca (Oracle)"], theirs["Orca (Oracle)"]),
        }
    if "sharegpt_pow2_words" in out:
        same = out["sharegpt_pow2_words"] == out["sharegpt_oracle_words"]
        out["sharegpt_orca_words"] = (
            f"both batch {out['sharegpt_pow2_words']} requests than the paper's"
            if same
            else f"batch {out['sharegpt_pow2_words']} and {out['sharegpt_oracle_words']} requests than the paper's"
        )
    for m, key in (("vLLM", "vllm"), ("Orca (Max)", "max"), ("Orca (Pow2)", "pow2"), ("Orca (Oracle)", "oracle")):
        out |= {
            f"{key}_token_pct": fig2.loc[m, "token_states_pct"],
            f"{key}_held_pct": fig2.loc[m, "held_pct"],
            f"{key}_of_held_pct": fig2.loc[m, "token_states_of_held_pct"],
            f"{key}_waiting": fig2.loc[m, "mean_waiting_requests"],
            f"{key}_paper_pct": fig2.loc[m, "paper_token_states_pct"],
        }
    out["vllm_limit"] = limit_words(out["vllm_held_pct"], fig2.loc["vLLM", "external_frag_pct"], out["vllm_waiting"])
    return out


def fig2_split_text(split: pd.DataFrame, fig2: pd.DataFrame) -> str:
    """Fig. 2's whole split in words, from fig2_split_table (split) and fig2_table (fig2): where the buddy's rounding
    is counted and why (the paper's Orca (Oracle) bar), how far each Orca row is from the paper's on its farthest share,
    and what the paper leaves unlabelled for vLLM."""
    oracle_internal = split.loc["Orca (Oracle): paper", "internal fragmentation (%)"]
    rounding = fig2.loc["Orca (Oracle)", "rounding_pct"]
    if oracle_internal == 0:
        where = (
            "kvlab counts the buddy allocator's rounding (a reservation rounded up to its power-of-two chunk) under "
            "external fragmentation & others, as the paper's bars imply: its Orca (Oracle) reserves exactly each "
            "request's final length, so its only internal waste is that rounding, and the paper shows none there, "
            f"where the rounding takes {cell(rounding, 1)}% of kvlab's cache"
        )
    else:
        where = (
            f"the paper's Orca (Oracle) shows {cell(oracle_internal, 1)}% internal fragmentation, so its bars do not "
            "settle where it counts the buddy's rounding; kvlab counts it under external fragmentation & others"
        )
    gaps = []
    for allocation in ("Orca (Max)", "Orca (Pow2)", "Orca (Oracle)"):
        diff = (split.loc[f"{allocation}: kvlab"] - split.loc[f"{allocation}: paper"]).abs()
        gaps.append(f"{cell(diff.max(), 1)} points for {allocation} (on {diff.idxmax().removesuffix(' (%)')})")
    vllm = split.loc["vLLM: kvlab"]
    return (
        f"Fig. 2's whole split, share by share (each a % of the KV cache): {where}. "
        f"Counted so, kvlab's shares differ from the paper's by at most {joined(gaps)}. The paper labels only vLLM's "
        f"token states ({cell(split.loc['vLLM: paper', 'token states (%)'], 1)}%); kvlab's vLLM keeps "
        f"{cell(vllm['internal fragmentation (%)'], 1)}% in the unfilled part of requests' last blocks and leaves "
        f"{cell(vllm['external fragmentation & others (%)'], 1)}% free."
    )


NEARLY_FULL_PCT = 90.0  # a cache whose requests hold at least this share (%), with its fragments, is nearly full


def limit_words(held_pct: float, external_frag_pct: float, mean_waiting: float) -> str:
    """What a run's queue and cache say about memory as its limit, worded as what it is: a queue beside a cache that
    is nearly full (held, or free only in chunks too small for the next request) points at memory, a likely cause
    that no run here isolates; a queue beside usable free memory says something else limits it too; no queue, that
    memory does not."""
    if mean_waiting < 1:
        return "no queue, so memory is not what limits it at this rate"
    usable_pct = 100.0 - held_pct - external_frag_pct
    if usable_pct <= 100.0 - NEARLY_FULL_PCT:
        return "a queue beside a nearly full cache, so memory is the likely limit (no run here isolates it)"
    return (
        f"a queue with {cell(usable_pct, 0)}% of the cache free and usable, so something besides memory limits it too "
        "(the prompt step's token budget, max_num_seqs or the watermark; no run here isolates which)"
    )


def regime_text(regime: pd.DataFrame, bound_s: float) -> str:
    """In words, built from regime_table: at the paper's rates which of kvlab's Fig. 13 runs are saturated and which
    sustain the rate, and that the paper's own regime there is not in kvlab's data."""
    parts = []
    for column in (c for c in regime.columns if c.endswith(": regime")):
        name = column.split(":")[0]
        by = {kind: [m for m in regime.index if regime.loc[m, column] == kind] for kind in ("saturated", "sustained")}
        said = [
            f"{'saturated' if kind == 'saturated' else 'within the bound'} for {joined(modes)}"
            for kind, modes in by.items()
            if modes
        ]
        parts.append(f"on {name} {' and '.join(said)}")
    if not parts:
        return ""
    return (
        f"At the paper's rates kvlab's runs are, against the section's bound of {bound_s:g} s per token, "
        f"{'; '.join(parts)}. The paper's own regime at these rates shows only in its Fig. 12 curves, which kvlab "
        "does not hold as numbers: a Fig. 13 row that passes matches the paper's batch size, not yet its regime."
    )


def variant_figures(table: pd.DataFrame, lengths: pd.DataFrame) -> dict:
    """The sensitivity to the dataset variant in numbers: per variant (keys sharegpt_turn, sharegpt_processed,
    alpaca_geometric, alpaca_gamma) vLLM's and Orca (Max)'s batch, vLLM's token-state share (%) and the mean input
    (tokens)."""
    out = {}
    for variant in table.index:
        key = variant.lower().replace(" (", "_").replace(")", "").replace("-cv0.5", "")
        out[f"{key}_vllm"] = table.loc[variant, "vLLM: batched"]
        out[f"{key}_oracle"] = table.loc[variant, "Orca (Oracle): batched"]
        out[f"{key}_max"] = table.loc[variant, "Orca (Max): batched"]
        out[f"{key}_pow2"] = table.loc[variant, "Orca (Pow2): batched"]
        out[f"{key}_vllm_pct"] = table.loc[variant, "vLLM: token states (%)"]
        out[f"{key}_input"] = lengths.loc[variant, "input_mean_tokens"] if variant in lengths.index else float("nan")
    return out


VARIANT_DECIMALS = 1  # the notebook's variant table: requests batched and token states (%), 1 decimal


def variant_text(v: dict) -> str:
    """The dataset variants in words (v: variant_figures), at the variant table's rounding: what ShareGPT's processed
    prompts do to vLLM's cache, and how much the Alpaca family moves each mode's batch."""
    d = VARIANT_DECIMALS
    modes = (("vLLM", "vllm"), ("Orca (Oracle)", "oracle"), ("Orca (Pow2)", "pow2"), ("Orca (Max)", "max"))
    moves = {name: (v[f"alpaca_geometric_{k}"], v[f"alpaca_gamma_{k}"]) for name, k in modes}
    little = all(phrases.alike(a, b, d, phrases.ALIKE_SHARE) for a, b in moves.values())
    shifts = ", ".join(f"{name} {phrases.shift(a, b, d)}" for name, (a, b) in moves.items())
    share = phrases.change(
        v["alpaca_geometric_vllm_pct"], v["alpaca_gamma_vllm_pct"], d, ("rises", "falls", "stays"), "%"
    )
    alpaca = (
        f"The Alpaca family matters little: from geometric lengths to the narrower gamma lengths every mode's batch "
        f"moves by at most {100 * phrases.ALIKE_SHARE:g}% ({shifts})"
        if little
        else f"The Alpaca family matters: from geometric lengths to the narrower gamma lengths the requests batched "
        f"move {shifts}"
    )
    return (
        f"Taking ShareGPT's prompts as processed (the whole conversation so far, "
        f"{v['sharegpt_processed_input']:.0f} tokens on average after the drop), token states take "
        f"{cell(v['sharegpt_processed_vllm_pct'], d)}% of vLLM's cache and vLLM batches "
        f"{cell(v['sharegpt_processed_vllm'], d)} requests against Orca (Oracle)'s "
        f"{cell(v['sharegpt_processed_oracle'], d)} and Orca (Max)'s {cell(v['sharegpt_processed_max'], d)}. "
        f"With turn inputs ({v['sharegpt_turn_input']:.0f} tokens) the same rate leaves token states in "
        f"{cell(v['sharegpt_turn_vllm_pct'], d)}% of vLLM's cache. {alpaca}, and the share of vLLM's cache holding token states {share}."
    )


def sustained_figures(sustained: pd.DataFrame, bound_s: float, dataset: str = "ShareGPT") -> dict:
    """The default bound's sustained rates (requests/s) and ratios on one dataset, the range of the ratios over the
    bounds shown, and the other dataset's note at the default bound."""
    part = sustained.xs(dataset, level="dataset")
    row = part.loc[bound_s]
    others = [d for d in dict.fromkeys(sustained.index.get_level_values("dataset")) if d != dataset]
    other = sustained.loc[(others[0], bound_s)] if others else None
    ranges = ledger.paper_figures(SECTION).query("table == 's6.2'").set_index("row")

    def against(value: float, row: str) -> str:
        low, high = ranges.loc[row, "value"], ranges.loc[row, "tolerance"]
        return "within" if low <= value <= high else "below" if value < low else "above" if value > high else "not in"

    return {
        "max_words": against(row["vllm_over_max_x"], "vLLM over Orca (Max)"),
        "oracle_words": against(row["vllm_over_oracle_x"], "vLLM over Orca (Oracle)"),
        "other": others[0] if others else "",
        "other_note": (other["note"] or "every mode crosses the bound inside the grid") if other is not None else "",
        "other_vllm": other["vLLM"] if other is not None else float("nan"),
        "other_max": other["Orca (Max)"] if other is not None else float("nan"),
        "bound": bound_s,
        "vllm": row["vLLM"],
        "oracle": row["Orca (Oracle)"],
        "pow2": row["Orca (Pow2)"],
        "max": row["Orca (Max)"],
        "over_oracle": row["vllm_over_oracle_x"],
        "over_max": row["vllm_over_max_x"],
        "over_oracle_low": part["vllm_over_oracle_x"].min(),
        "over_oracle_high": part["vllm_over_oracle_x"].max(),
        "over_max_low": part["vllm_over_max_x"].min(),
        "over_max_high": part["vllm_over_max_x"].max(),
        "note": row["note"] or "every mode crosses the bound inside the grid",
    }


def saturation_figures(runs: pd.DataFrame, fig13: pd.DataFrame) -> dict:
    """Requests batched at the top rate of each dataset's grid (mean over seeds), per mode (keys like sharegpt_vllm),
    vLLM's over Orca (Oracle)'s and Orca (Max)'s there, and the paper's ratios at its Fig. 13 rate."""
    out = {}
    for name in dict.fromkeys(runs["dataset"]):
        part = runs[runs["dataset"] == name]
        top = part[part["rate"] == part["rate"].max()]
        mean = top.groupby("mode")["mean_batched_requests"].mean()
        key = name.lower()
        out |= {
            f"{key}_top_rate": float(part["rate"].max()),
            **{f"{key}_{m}": float(mean[m]) for m in MODES},
            f"{key}_over_oracle": float(mean["paged"] / mean["oracle"]),
            f"{key}_over_max": float(mean["paged"] / mean["max"]),
        }
        if f"{name}: paper" in fig13:
            paper = fig13[f"{name}: paper"]
            out |= {
                f"{key}_paper_vllm": paper["vLLM"],
                f"{key}_paper_over_oracle": paper["vLLM"] / paper["Orca (Oracle)"],
                f"{key}_paper_over_max": paper["vLLM"] / paper["Orca (Max)"],
            }
    return out


def block_figures(sharegpt: pd.DataFrame, alpaca: pd.DataFrame, busy: pd.DataFrame | None = None) -> dict:
    """The block-size tables in numbers: the best sizes, latency at the ends of the grid, the share of held memory
    holding token states at block 16 and the largest size, block-table entries at the smallest and largest size;
    at the busy rate (when run) the best size, latency at the ends and at 16, requests batched and preemptions."""
    best, ties = best_block_size(sharegpt)
    a_best, a_ties = best_block_size(alpaca)
    small, large = sharegpt.index.min(), sharegpt.index.max()
    out = {}
    if busy is not None and len(busy):
        b_best, b_ties = best_block_size(busy)
        out = {
            "busy_best": b_best,
            "busy_ties": ", ".join(map(str, b_ties)),
            "busy_latency_small": busy.loc[small, "normalized_latency_s"],
            "busy_latency_16": busy.loc[16, "normalized_latency_s"] if 16 in busy.index else float("nan"),
            "busy_latency_large": busy.loc[large, "normalized_latency_s"],
            "busy_batched_small": busy.loc[small, "mean_batched_requests"],
            "busy_batched_large": busy.loc[large, "mean_batched_requests"],
            "busy_preemptions_small": int(round(busy.loc[small, "num_preemptions"])),
            "busy_preemptions_large": int(round(busy.loc[large, "num_preemptions"])),
            # the whole series, for sentences about its trend
            "busy_blocks": [int(x) for x in busy.index],
            "busy_latency": [float(x) for x in busy["normalized_latency_s"]],
            "busy_preemptions": [int(round(x)) for x in busy["num_preemptions"]],
        }
    return out | {
        "best": best,
        "ties": ", ".join(map(str, ties)),
        "alpaca_best": a_best,
        "alpaca_ties": ", ".join(map(str, a_ties)),
        "small": small,
        "large": large,
        "latency_small": sharegpt.loc[small, "normalized_latency_s"],
        "latency_large": sharegpt.loc[large, "normalized_latency_s"],
        "alpaca_latency_small": alpaca.loc[small, "normalized_latency_s"],
        "alpaca_latency_large": alpaca.loc[large, "normalized_latency_s"],
        "alpaca_ratio": alpaca.loc[large, "normalized_latency_s"] / alpaca.loc[16, "normalized_latency_s"]
        if 16 in alpaca.index
        else float("nan"),
        "of_held_16": sharegpt.loc[16, "token_states_of_held_pct"] if 16 in sharegpt.index else float("nan"),
        "of_held_large": sharegpt.loc[large, "token_states_of_held_pct"],
        "alpaca_of_held_large": alpaca.loc[large, "token_states_of_held_pct"],
        "alpaca_batched_16": alpaca.loc[16, "mean_batched_requests"] if 16 in alpaca.index else float("nan"),
        "alpaca_batched_large": alpaca.loc[large, "mean_batched_requests"],
        "entries_small": sharegpt.loc[small, "block_table_entries"],
        "entries_large": sharegpt.loc[large, "block_table_entries"],
        "preemptions_large": int(round(sharegpt.loc[large, "num_preemptions"])),
        "alpaca_preemptions_large": int(round(alpaca.loc[large, "num_preemptions"])),
    }


def memory_figures(table: pd.DataFrame) -> dict:
    """The memory table in numbers: the smallest and largest KV cache, vLLM's preemptions per request at each, and
    its latency over Orca (Oracle)'s at the smallest."""
    small, large = table.index.min(), table.index.max()
    return {
        "small_gib": small,
        "large_gib": large,
        "preempt_small": table.loc[small, "vLLM: preemptions per request"],
        # rounded as the table rounds it (half up), so the prose and the table print the same digits
        "preempted_pct_small": round_half_up(
            table.loc[small, "vLLM: requests preempted (%)"], MEMORY_DECIMALS["vLLM: requests preempted (%)"]
        ),
        "preempt_large": table.loc[large, "vLLM: preemptions per request"],
        "vllm_small": table.loc[small, "vLLM: latency (s/token)"],
        "oracle_small": table.loc[small, "Orca (Oracle): latency (s/token)"],
        "max_small": table.loc[small, "Orca (Max): latency (s/token)"],
        "vllm_large": table.loc[large, "vLLM: latency (s/token)"],
        "oracle_large": table.loc[large, "Orca (Oracle): latency (s/token)"],
    }


def block_text(b: dict) -> str:
    """The block-size tables in words (b: block_figures), at the block tables' rounding: waste and bookkeeping
    against the block size, the best block, and, at the busy rate when run, latency and preemptions."""
    pct, lat = BLOCK_DECIMALS["token_states_of_held_pct"], BLOCK_DECIMALS["normalized_latency_s"]
    waste = phrases.direction(b["of_held_large"], b["of_held_16"], pct, ("grows", "shrinks", "stays the same"))
    entries = phrases.direction(b["entries_small"], b["entries_large"], 1, ("rises", "falls", "stays the same"))
    text = (
        f"Waste {waste} with the block: at block {b['large']}, {cell(b['of_held_large'], pct)}% of what ShareGPT "
        f"requests hold is token states ({cell(b['alpaca_of_held_large'], pct)}% on Alpaca), against "
        f"{cell(b['of_held_16'], pct)}% at 16. Bookkeeping {entries} as the block grows: {b['entries_small']:,.0f} "
        f"block-table entries per ShareGPT request at block {b['small']}, {b['entries_large']:.1f} at {b['large']}. "
        f"At Fig. 13's rates normalized latency is within 1% of the lowest at block sizes {b['ties']} on ShareGPT and "
        f"{b['alpaca_ties']} on Alpaca, and at block {b['large']} Alpaca's latency is {cell(b['alpaca_ratio'], 2)}x that "
        f"at 16. kvlab's best block, the smallest within 1%, is {b['best']} on ShareGPT (the ledger's row; the paper "
        f"finds 16-128) and {b['alpaca_best']} on Alpaca. kvlab's step "
        "cost charges small blocks what the one public measurement of paged kernels against block size shows (FlyDSL's "
        "and AITER's paged-attention kernels on an AMD MI350X, block 1 about 14% slower than 16); that this term is why small blocks stay close here is a "
        "hypothesis, not a run of kvlab's."
    )
    if "busy_best" not in b:
        return text
    sizes = [f"block size {x}" for x in b["busy_blocks"]]
    latency = phrases.trend(b["busy_latency"], sizes, lat, "s per token", ("rises", "falls", "stays the same"))
    preemptions = phrases.trend(b["busy_preemptions"], sizes, 0)
    why = (
        "larger blocks leave more of each request's last block empty, so the pool runs out sooner"
        if phrases.direction(b["busy_preemptions_small"], b["busy_preemptions_large"], 0) == "rise"
        else "fewer requests are admitted to compete for the pool"
    )
    return (
        f"{text}\n\nAt the busy rate waste, bookkeeping and preemption meet. vLLM runs "
        f"{b['busy_batched_small']:.2f} requests at once with blocks of {b['small']} and "
        f"{b['busy_batched_large']:.2f} with blocks of {b['large']}; normalized latency {latency} "
        f"and is {cell(b['busy_latency_16'], lat)} at 16. As blocks grow, preemptions {preemptions}; a likely cause, "
        f"which no run here isolates: {why}. The best block here is {b['busy_best']}. The paper's 16-128 rests on "
        "its 2023 kernel, whose cost against block size is not published, so kvlab cannot check it."
    )


def memory_text(m: dict) -> str:
    """The memory table in words (m: memory_figures), at the memory table's rounding."""
    lat, pre = MEMORY_DECIMALS["vLLM: latency (s/token)"], MEMORY_DECIMALS["vLLM: preemptions per request"]
    pct = MEMORY_DECIMALS["vLLM: requests preempted (%)"]
    small = {
        name: m[f"{key}_small"] for name, key in (("vLLM", "vllm"), ("Orca (Oracle)", "oracle"), ("Orca (Max)", "max"))
    }
    mine, orcas = (
        phrases.shown(small["vLLM"], lat),
        [phrases.shown(small[n], lat) for n in ("Orca (Oracle)", "Orca (Max)")],
    )
    if mine < min(orcas):
        verdict = (
            "on the same requests and memory, recomputing preempted requests costs vLLM less than the slots Orca "
            "reserves and leaves empty cost Orca"
        )
    elif mine > max(orcas):
        verdict = (
            "on the same requests and memory, vLLM's recomputation costs it more than Orca's reservations cost Orca"
        )
    else:
        verdict = "vLLM's latency lies between the two Orca modes'"
    return (
        f"With {m['small_gib']:g} GiB vLLM preempts {cell(m['preempt_small'], pre)} times per request "
        f"({cell(m['preempted_pct_small'], pct)}% of requests at least once); its normalized latency is "
        f"{cell(small['vLLM'], lat)} s per token against Orca (Oracle)'s {cell(small['Orca (Oracle)'], lat)} and Orca "
        f"(Max)'s {cell(small['Orca (Max)'], lat)}: {verdict}. With {m['large_gib']:g} GiB preemption is "
        f"{cell(m['preempt_large'], pre)} per request and "
        f"{phrases.comparison('vLLM', m['vllm_large'], 'Orca (Oracle)', m['oracle_large'], lat, 's per token')}."
    )


def trace_figures(trace: TraceWorkload, table: pd.DataFrame) -> dict:
    """The Azure runs in numbers: rows read, requests dropped as too long, requests and rate kept, and at its own
    timestamps (scale 1, or the largest scale run) each mode's requests batched and normalized latency."""
    w = trace.workload
    scale = (
        1.0 if 1.0 in table.index.get_level_values("rate_scale") else table.index.get_level_values("rate_scale").max()
    )
    own = table.xs(scale, level="rate_scale")
    return {
        "rows": trace.num_rows,
        "dropped": trace.num_dropped,
        "requests": w.num_requests,
        "duration_min": float(w.arrival_s[-1]) / 60,
        "rate": w.num_requests / float(w.arrival_s[-1]),
        "prompt_mean": float(w.prompt_tokens.mean()),
        "output_mean": float(w.output_tokens.mean()),
        "scale": scale,
        **{f"{m}_batched": own.loc[MODE_LABELS[m], "mean_batched_requests"] for m in MODES},
        **{f"{m}_latency": own.loc[MODE_LABELS[m], "normalized_latency_s"] for m in MODES},
        "vllm_token_pct": own.loc["vLLM", "token_states_pct"],
        "max_token_pct": own.loc["Orca (Max)", "token_states_pct"],
    }


def article_workload_figures(table: pd.DataFrame, arrival_rate: float) -> dict:
    """The article's workload in the engine in numbers: at the article's 8 slots, vLLM's mean latency against the
    slot model's, and how many requests each mode batches with 256 allowed; there, the requests in the system by
    Little's law (arrival_rate in requests/s x mean latency in s: the run's own rate gives the mean over time)."""
    seqs = sorted(set(table.index.get_level_values("max_num_seqs")))
    small, large = seqs[0], seqs[-1]

    def alike(seqs: int, column: str) -> str:
        values = table.xs(seqs, level="max_num_seqs")[column]
        return "the same for every allocation mode" if values.nunique() == 1 else "different across allocation modes"

    return {
        "slots": small,
        "many": large,
        "alike_small": alike(small, "mean_latency_s"),
        "alike_many": alike(large, "mean_batched_requests"),
        "engine_latency": table.loc[(small, "vLLM"), "mean_latency_s"],
        "slot_latency": table.loc[(small, "vLLM"), "slot_model_mean_latency_s"],
        "max_latency": table.loc[(small, "Orca (Max)"), "mean_latency_s"],
        **{f"{m}_batched_many": table.loc[(large, MODE_LABELS[m]), "mean_batched_requests"] for m in MODES},
        "vllm_latency_many": table.loc[(large, "vLLM"), "mean_latency_s"],
        "in_system_many": arrival_rate * table.loc[(large, "vLLM"), "mean_latency_s"],
        "max_latency_many": table.loc[(large, "Orca (Max)"), "mean_latency_s"],
        "max_fit": int(ARTICLE_KV_GIB * 1024 / ARTICLE_MIB_PER_TOKEN) // ARTICLE_MAX_LEN,
    }


def prefix_setting_figures(model: str, gpu: str, rate_scales) -> dict:
    """The prefix-caching set-up in words: model, GPU, the model's maximum length (tokens), num_gpu_blocks, the pool
    the engine fills ((num_gpu_blocks - 1) x block_size tokens: vLLM's null block holds none), the tokens vLLM logs
    (num_gpu_blocks x block_size, section 3's figure) and the rate scales run."""
    off, _, blocks, _ = prefix_setting(model, gpu)
    scales = [f"{s:g}x" for s in rate_scales]
    return {
        "model": model,
        "gpu": gpu,
        "max_len": off.scheduler.max_model_len,
        "num_gpu_blocks": blocks,
        "block_size": off.cache.block_size,
        "pool_tokens": (blocks - 1) * off.cache.block_size,
        "logged_tokens": blocks * off.cache.block_size,
        "scales": joined(scales),
    }


def prefix_figures(trace: TraceWorkload, table: pd.DataFrame, model: str, gpu: str) -> dict:
    """The prefix-caching runs in numbers: the window (requests, minutes, mean prompt), the pool (tokens), and per
    the first and last rate scale the hit share and the TTFT saved."""
    off, on, blocks, cost = prefix_setting(model, gpu)
    w = trace.workload
    first, last = table.index.min(), table.index.max()
    return {
        "requests": w.num_requests,
        "minutes": float(w.arrival_s[-1]) / 60,
        "prompt_mean": float(w.prompt_tokens.mean()),
        "pool_tokens": (blocks - 1) * off.cache.block_size,
        "model": model,
        "gpu": gpu,
        "dropped": trace.num_dropped,
        "max_len": off.scheduler.max_model_len,
        "low": first,
        "high": last,
        "hit_low": table.loc[first, "hit_pct"],
        "hit_high": table.loc[last, "hit_pct"],
        "saved_low": table.loc[first, "ttft_saved_s"],
        "saved_low_pct": table.loc[first, "ttft_saved_pct"],
        "saved_high": table.loc[last, "ttft_saved_s"],
        "saved_high_pct": table.loc[last, "ttft_saved_pct"],
        "ttft_off_low": table.loc[first, "mean_ttft_off_s"],
        "ttft_off_high": table.loc[last, "mean_ttft_off_s"],
        "lru_same": table.loc[first, "lru_same_size_saved_pct"],
        "lru_unbounded": table.loc[first, "lru_unbounded_saved_pct"],
    }


def scheduling_figures(table: pd.DataFrame) -> dict:
    """What asynchronous scheduling changes at the lightest rate scale of the table, async against sync: the first
    token's delay (ms, and in steps of the synchronous mean TPOT), TPOT, the KV cache held, throughput, preemptions."""
    scale = min(table.index.get_level_values("rate_scale"))
    sync, async_ = (table.loc[(scale, SCHEDULING_LABELS[mode])] for mode in (False, True))
    delay_ms = 1e3 * (async_["mean_ttft_s"] - sync["mean_ttft_s"])
    return {
        "scale": scale,
        "ttft_delay_ms": delay_ms,
        "ttft_delay_steps": delay_ms / sync["mean_tpot_ms"],
        "sync_ttft_ms": 1e3 * sync["mean_ttft_s"],
        "async_ttft_ms": 1e3 * async_["mean_ttft_s"],
        "sync_tpot": sync["mean_tpot_ms"],
        "async_tpot": async_["mean_tpot_ms"],
        "sync_held": sync["held_pct"],
        "async_held": async_["held_pct"],
        "sync_throughput": sync["output_tokens_per_s"],
        "async_throughput": async_["output_tokens_per_s"],
        "sync_preemptions": int(sync["num_preemptions"]),
        "async_preemptions": int(async_["num_preemptions"]),
    }


def ledger_figures(section_ledger: pd.DataFrame) -> dict:
    """The section's ledger in words: how many rows pass, and the rows within and outside their tolerance, each as
    'table row' in a list."""

    pairs = list(zip(section_ledger["table"], section_ledger["row"]))

    def listed(rows):
        names = [
            f"{ledger.table_name(r['table'])} {r['row']}"
            + (f" {label(r['column'])}" if pairs.count((r["table"], r["row"])) > 1 else "")
            for _, r in rows.iterrows()
        ]
        return ", ".join(names) if names else "none"

    return {
        "passed": int((section_ledger["status"] == "pass").sum()),
        "total": len(section_ledger),
        "within": listed(section_ledger[section_ledger["status"] == "pass"]),
        "outside": listed(section_ledger[section_ledger["status"] == "fail"]),
    }


def rerun_text(fit: pd.DataFrame) -> str:
    """What the Anyscale benchmark's own rerun (vLLM 0.1.2) says of the blog's figures that the 2023 step cost is
    fitted to (fit: vllm_2023_fit.fit_table), at the table's rounding."""
    gap = 100.0 * (fit["rerun_tokens_per_s"] / fit["blog_tokens_per_s"] - 1.0)
    side = "below" if (gap < 0).all() else "above" if (gap > 0).all() else "around"
    ends = (gap.abs().min(), gap.abs().max()) if side != "around" else (gap.min(), gap.max())
    spread = f"{cell(ends[0], 0)}% to {cell(ends[1], 0)}%"
    return (
        f"The benchmark's own rerun on vLLM 0.1.2, in its repository, lands {spread} {side} the blog's figures "
        f"that the fit targets: the fit's residuals, at most {cell(fit['residual_pct'].abs().max(), 1)}%, measure how "
        "closely kvlab's step cost matches the blog, not how closely the blog matches a rerun of the benchmark."
    )


def finding_text(section_ledger: pd.DataFrame, bound_s: float) -> str:
    """The section's finding (the front page's sentence): vLLM's sustained rate over Orca (Max)'s and Orca
    (Oracle)'s on ShareGPT as the ledger holds them (refined at each knee) and the paper's, at the ledger's rounding."""
    figures, rows = ledger.figures(SECTION).set_index(ledger.KEY), section_ledger.set_index(ledger.KEY)
    said = {}
    for other in ("Orca (Max)", "Orca (Oracle)"):
        key = (SECTION, "s6.2", f"vLLM over {other}", "sustained_rate_ratio_x")
        decimals = int(figures.loc[key, "decimals"])
        said[other] = (cell(rows.loc[key, "reproduced"], decimals), published(figures.loc[key], decimals))
    (mine_max, paper_max), (mine_oracle, paper_oracle) = said["Orca (Max)"], said["Orca (Oracle)"]
    return (
        f"Under one memory budget vLLM sustains {mine_max}x Orca (Max)'s request rate on ShareGPT (the paper: "
        f"{paper_max}x) and {mine_oracle}x Orca (Oracle)'s (the paper: {paper_oracle}x), below {bound_s:g} s per "
        "output token, each rate refined at its knee."
    )


def headline(fig13: pd.DataFrame, knee: pd.DataFrame, bound_s: float, section_ledger: pd.DataFrame) -> list[str]:
    """The section's headline lines, fixed precision (the sustained rates refined at the knee: knee_sustained)."""
    row = knee.loc[("ShareGPT", float(bound_s))]
    f = {
        "vllm": row["vLLM"],
        "oracle": row["Orca (Oracle)"],
        "max": row["Orca (Max)"],
        "over_oracle": row["vllm_over_oracle_x"],
        "over_max": row["vllm_over_max_x"],
    }
    counts = section_ledger["status"].value_counts()
    lines = []
    for name in DATASETS:
        if f"{name}: kvlab" in fig13:
            lines.append(
                f"{name}, requests batched: vLLM {fig13.loc['vLLM', f'{name}: kvlab']:.2f} (paper "
                f"{fig13.loc['vLLM', f'{name}: paper']:.2f}), Orca (Oracle) "
                f"{fig13.loc['Orca (Oracle)', f'{name}: kvlab']:.2f} (paper "
                f"{fig13.loc['Orca (Oracle)', f'{name}: paper']:.2f}), Orca (Max) "
                f"{fig13.loc['Orca (Max)', f'{name}: kvlab']:.2f} (paper {fig13.loc['Orca (Max)', f'{name}: paper']:.2f})"
            )
    lines.append(
        f"ShareGPT, sustained under {bound_s:g} s/token: vLLM {f['vllm']:.3f}/s, Orca (Oracle) {f['oracle']:.3f}/s "
        f"({f['over_oracle']:.2f}x; paper 1.7-2.7x), Orca (Max) {f['max']:.3f}/s ({f['over_max']:.2f}x; paper 2.7-8x)"
    )
    lines.append(
        f"ledger (the vLLM paper's figures): {counts.get('pass', 0)} pass, {counts.get('fail', 0)} fail, "
        f"{counts.get('missing', 0)} missing of {len(section_ledger)}"
    )
    return lines


def ablation_figures(table: pd.DataFrame) -> dict:
    """tables.ablation_table in numbers: for each run ('as run' and each change), which of Fig. 13's eight figures
    (4 modes x 2 datasets) lie within the paper's tolerance (data/paper_figures.csv), which of those that held as run
    it loses, and vLLM's batch per dataset."""
    figures = ledger.paper_figures(SECTION)
    figures = figures[figures["column"] == "mean_batched_requests"]
    tolerance = {(r.table, r.row): float(r.tolerance) for r in figures.itertuples()}
    paper = {(r.table, r.row): float(r.value) for r in figures.itertuples()}
    out = {}
    for run in dict.fromkeys(table.index.get_level_values("run")):
        if run == "the paper":
            continue
        held, vllm = [], {}
        for dataset, figure in (("ShareGPT", "fig13a"), ("Alpaca", "fig13b")):
            if (dataset, run) not in table.index:
                continue
            for mode in MODE_LABELS.values():
                value, target = table.loc[(dataset, run), mode], paper[(figure, mode)]
                if abs(round_half_up(value, 2) - target) <= tolerance[(figure, mode)] * target:
                    held.append(f"{ledger.table_name(figure)} {mode}")
            vllm[dataset] = table.loc[(dataset, run), "vLLM"]
        out[run] = {"held": held, "vllm": vllm}
    for figures in out.values():  # what a change loses of what held as run
        figures["lost"] = [x for x in out["as run"]["held"] if x not in figures["held"]]
    return out


def ablation_text(table: pd.DataFrame, budget_tokens: int, model: str, gpu: str) -> str:
    """The ablation in words, every count and direction from ablation_figures: how many of Fig. 13's figures hold as
    run and with each choice changed, vLLM's batch beside the paper's, and which figures each choice carries."""
    f = ablation_figures(table)
    base = f["as run"]
    total = 4 * len(base["vllm"])

    def batches(run: str) -> str:
        return " and ".join(
            f"{cell(v, 2)} on {d} (the paper's {cell(table.loc[(d, 'the paper'), 'vLLM'], 2)})"
            for d, v in f[run]["vllm"].items()
        )

    changes = {
        "mixed steps": (
            "With waiting prompts in the same step as the decodes, as the paper's §4.3 describes an iteration "
            f"(vLLM 0.33's scheduler without chunked prefill, at the same {budget_tokens:,}-token budget and clock)"
        ),
        "roofline clock": f"With kvlab's roofline of {model} on the {gpu} as the clock (the same scheduler)",
    }
    parts = [
        f"As run, {len(base['held'])} of Fig. 13's {total} figures lie within their tolerance; vLLM batches "
        f"{batches('as run')}."
    ]
    for run, words in changes.items():
        if run not in f:
            continue
        lost = f[run]["lost"]
        carried = f"; {joined(lost)} then miss{'es' if len(lost) == 1 else ''}" if lost else "; none that held misses"
        parts.append(f"{words}, {len(f[run]['held'])} of {total} hold: vLLM batches {batches(run)}{carried}.")
    return " ".join(parts)


def paper_regime_text(regime: pd.DataFrame, rates: dict, bound_s: float) -> str:
    """What the paper publishes of its Fig. 13 runs' regime (its Fig. 12a vLLM curve, on ShareGPT only) beside
    kvlab's, said once for the rows it does not cover."""
    rate = rates["ShareGPT"]
    paper = paper_vllm_latency(rate)
    if paper is None or "ShareGPT: normalized latency (s/token)" not in regime:
        return (
            "The paper publishes no regime of its Fig. 13 runs that kvlab reads at these rates, so whether its runs "
            "sustained them is unverified for every row."
        )
    ours = regime.loc["vLLM", "ShareGPT: normalized latency (s/token)"]
    same = sustains(paper, bound_s) == sustains(ours, bound_s)
    return (
        f"The paper publishes one regime of its Fig. 13 runs: its vLLM on ShareGPT at {rate:g} requests/s takes "
        f"{paper:.2f} s per output token (Fig. 12a, read from the e-print's vector graphics), "
        f"{'within' if sustains(paper, bound_s) else 'past'} the {bound_s:g} s bound, against kvlab's {ours:.2f}: "
        f"{'the same regime' if same else 'the other regime'}. For the other rows the paper's regime is not "
        "published in a form kvlab reads: unverified."
    )
