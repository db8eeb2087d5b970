"""Section 6's requests: the vLLM paper's datasets as kvlab builds them (kvlab.workloads.paper_datasets) and the real
traces (kvlab.workloads.traces) kept at a model's maximum length. NumPy only, like paper_setting."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.core import models, validate
from kvlab.core.workload import Workload
from kvlab.studies.paper_setting import PaperSetting
from kvlab.workloads import paper_datasets, traces


def datasets(
    setting: PaperSetting, trace_dir=None, sharegpt_inputs: str = "turn", alpaca_lengths: str = "geometric"
) -> dict:
    """ShareGPT (from the processed file in the trace folder; requests longer than max_model_len dropped) and
    synthetic Alpaca, as the runs draw them: {"ShareGPT": LengthPool, "Alpaca": SyntheticLengths}."""
    prefill, decode = sharegpt_counts(trace_dir)
    return {
        "ShareGPT": paper_datasets.sharegpt_pool(prefill, decode, sharegpt_inputs, setting.max_model_len),
        "Alpaca": paper_datasets.alpaca_lengths(alpaca_lengths),
    }


def sharegpt_counts(trace_dir=None) -> tuple[np.ndarray, np.ndarray]:
    """The processed ShareGPT file's prefill and decode tokens per row, in file order (every row checked)."""
    path = traces.trace_path("sharegpt", trace_dir or None)
    load = traces.load_trace(path, "sharegpt", arrival_rate_per_s=1.0, rng=np.random.default_rng(0))
    return load.workload.prompt_tokens, load.workload.output_tokens


def variants(setting: PaperSetting, trace_dir=None) -> dict:
    """Every dataset variant kvlab offers, name -> (the paper's dataset it stands for, the dataset): ShareGPT turn
    inputs and as processed, synthetic Alpaca of either family."""
    prefill, decode = sharegpt_counts(trace_dir)
    found = {}
    for inputs in paper_datasets.SHAREGPT_INPUTS:
        pool = paper_datasets.sharegpt_pool(prefill, decode, inputs, setting.max_model_len)
        found[pool.name] = ("ShareGPT", pool)
    for family in paper_datasets.ALPACA_FAMILIES:
        lengths = paper_datasets.alpaca_lengths(family)
        found[lengths.name] = ("Alpaca", lengths)
    return found


def conversation_figures(trace_dir=None) -> dict:
    """What the turn-input heuristic finds in the processed ShareGPT file: rows, conversations, turns per
    conversation, the mean prefill as processed and the mean new input (tokens)."""
    prefill, decode = sharegpt_counts(trace_dir)
    turns = paper_datasets.turn_inputs(prefill, decode)
    per = np.bincount(turns.conversation)
    return {
        "rows": len(prefill),
        "conversations": turns.num_conversations,
        "turns_mean": float(per.mean()),
        "turns_max": int(per.max()),
        "prefill_mean": float(prefill.mean()),
        "input_mean": float(turns.input_tokens.mean()),
        "input_p50": float(np.median(turns.input_tokens)),
        "first_turn_input_mean": float(turns.input_tokens[turns.turn == 0].mean()),
    }


@dataclass(frozen=True, eq=False)
class TraceWorkload:
    """A real trace kept at max_model_len (longer requests dropped), arrivals from its first request."""

    name: str
    workload: Workload
    num_rows: int
    num_dropped: int

    def at(self, rate_scale: float) -> Workload:
        """The trace with its arrival rate scaled: timestamps divided by rate_scale (1: its own timestamps)."""
        scale = validate.positive_number("rate_scale", rate_scale)
        w = self.workload
        return Workload(
            w.arrival_s / scale, w.prompt_tokens, w.output_tokens, w.prefix_hashes, w.prefix_block_tokens, name=w.name
        )


def trace_workload(name: str, max_model_len: int, trace_dir=None, max_requests: int | None = None) -> TraceWorkload:
    """The trace called name (azure, mooncake) from the trace folder, its first max_requests requests, without those
    longer than max_model_len tokens (prompt + output), arrivals counted from the first request kept."""
    load = traces.load_trace(traces.trace_path(name, trace_dir or None), name, max_requests=max_requests, name=name)
    w = load.workload
    keep = w.prompt_tokens + w.output_tokens <= max_model_len
    if not keep.any():
        validate.fail("max_model_len", max_model_len, f"is shorter than every request of the {name} trace")
    index = np.flatnonzero(keep)
    hashes = tuple(w.prefix_hashes[i] for i in index) if w.prefix_hashes is not None else None
    arrival = w.arrival_s[keep]
    kept = Workload(
        arrival - arrival[0],
        w.prompt_tokens[keep],
        w.output_tokens[keep],
        hashes,
        w.prefix_block_tokens if hashes is not None else None,
        name=name,
    )
    return TraceWorkload(name, kept, w.num_requests, int((~keep).sum()))


def mooncake_window(model: str, trace_dir=None, num_requests: int | None = None) -> TraceWorkload:
    """The first num_requests requests of the Mooncake trace, kept at the model's own maximum length."""
    return trace_workload("mooncake", models.get_model(model).max_position_embeddings, trace_dir, num_requests)
