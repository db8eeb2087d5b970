"""The measurements the vLLM 2023 clock is fitted to (data/clock_2023/, data/README.md gives their origin).

Anyscale's continuous-batching benchmark of June 2023 (OPT-13B on one A100-40GB, 1,000 requests of 512 prompt
tokens sent at once, capped-exponential outputs of mean 128): vLLM's throughput per cap and the benchmark's own
output lengths (anyscale_workload); the vLLM paper's Fig. 18a (PagedAttention kernel latency by batch and
context, read from the PDF's vector graphics); one public measurement of a paged attention kernel at block
sizes 1 and 16 (the per-block cost). Read with the csv module; nothing is downloaded.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvlab.core import models, validate
from kvlab.core.cost import Clock2023StepCost
from kvlab.core.models import DATA_DIR
from kvlab.core.workload import Workload

CLOCK_DIR = DATA_DIR / "clock_2023"
COEFFICIENTS_CSV = CLOCK_DIR / "coefficients.csv"
CAPS = (32, 128, 512, 1536)
MODEL, GPU = "facebook/opt-13b", "A100-40GB"   # the benchmark's and Fig. 18a's setting


def _rows(name: str, directory: str | Path = CLOCK_DIR) -> list[dict]:
    with open(Path(directory) / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class AnyscaleRun:
    """One cap of Anyscale's benchmark: its settings and vLLM's throughput (tokens/s, prompt + output tokens)."""

    max_tokens_cap: int
    max_num_batched_tokens: int        # the benchmark's setting for this cap (benchmark_configs/vllm_variable_size)
    num_requests: int
    prompt_tokens: int                 # every request's
    output_tokens_total: int
    throughput_tokens_s: float         # the blog's
    reproduced_tokens_s: float         # the benchmark's issue #4 rerun (vLLM 0.1.2): a check, not a fit input
    source: str


def anyscale_runs(directory: str | Path = CLOCK_DIR) -> tuple[AnyscaleRun, ...]:
    """The four caps of anyscale_throughput.csv, in increasing cap."""
    ints = ("max_tokens_cap", "max_num_batched_tokens", "num_requests", "prompt_tokens", "output_tokens_total")
    runs = [AnyscaleRun(**{k: int(v) if k in ints else (v if k == "source" else float(v)) for k, v in r.items()})
            for r in _rows("anyscale_throughput.csv", directory)]
    return tuple(sorted(runs, key=lambda r: r.max_tokens_cap))


def anyscale_run(cap: int, directory: str | Path = CLOCK_DIR) -> AnyscaleRun:
    """One cap's run (a cap the benchmark did not run is a one-line ValueError)."""
    for run in anyscale_runs(directory):
        if run.max_tokens_cap == cap:
            return run
    validate.fail("max_tokens_cap", cap, f"is not a cap of Anyscale's benchmark; caps: {', '.join(map(str, CAPS))}")


def anyscale_workload(cap: int, directory: str | Path = CLOCK_DIR) -> Workload:
    """The benchmark's 1,000 requests at one cap, all arriving at t=0: 512 prompt tokens each and the output
    lengths its seeded draw gave (anyscale_output_tokens.csv; vLLM ran with ignore_eos)."""
    run = anyscale_run(cap, directory)
    output = np.array([int(r[f"cap_{cap}"]) for r in _rows("anyscale_output_tokens.csv", directory)], dtype=np.int64)
    if len(output) != run.num_requests or int(output.sum()) != run.output_tokens_total:
        validate.fail("anyscale_output_tokens.csv", f"{len(output)} requests, {int(output.sum())} tokens at cap {cap}",
                      f"must match anyscale_throughput.csv ({run.num_requests} requests, {run.output_tokens_total})")
    n = run.num_requests
    return Workload(np.zeros(n), np.full(n, run.prompt_tokens, dtype=np.int64), output,
                    name=f"Anyscale 2023 benchmark, max_tokens cap {cap}")


@dataclass(frozen=True)
class KernelLatency:
    """Fig. 18a's points of one system: batch size, context length (tokens) and kernel latency (us) each."""

    system: str
    batch_size: np.ndarray
    context_tokens: np.ndarray
    latency_us: np.ndarray
    read_precision_us: float


def fig18a(system: str = "vLLM", directory: str | Path = CLOCK_DIR) -> KernelLatency:
    """Fig. 18a's attention kernel latencies of vLLM (the fit's) or FasterTransformer (a reference)."""
    rows = [r for r in _rows("fig18a_kernel_latency.csv", directory) if r["system"] == system]
    if not rows:
        validate.fail("system", system, "must be vLLM or FasterTransformer (the systems of Fig. 18a)")

    def column(key: str, kind=float) -> np.ndarray:
        return np.array([kind(r[key]) for r in rows])

    return KernelLatency(system, column("batch_size", int), column("context_tokens", int), column("latency_us"),
                         max(float(r["read_precision_us"]) for r in rows))


def block_size_ratio(directory: str | Path = CLOCK_DIR) -> float:
    """How much slower a paged attention kernel runs at block size 1 than at 16 over the same KV: the mean over
    the kernels of paged_kernel_block_size.csv of latency(1) / latency(16)."""
    by_kernel: dict[str, dict[int, float]] = {}
    for r in _rows("paged_kernel_block_size.csv", directory):
        by_kernel.setdefault(r["kernel"], {})[int(r["block_size"])] = float(r["latency_ms"])
    ratios = [t[1] / t[16] for t in by_kernel.values() if 1 in t and 16 in t]
    if not ratios:
        validate.fail("paged_kernel_block_size.csv", str(directory), "has no kernel measured at block sizes 1 and 16")
    return float(np.mean(ratios))


__all__ = ["CAPS", "CLOCK_DIR", "GPU", "MODEL", "AnyscaleRun", "KernelLatency", "anyscale_run", "anyscale_runs",
           "anyscale_workload", "block_size_ratio", "fig18a"]


def load_coefficients(path: str | Path = COEFFICIENTS_CSV) -> dict:
    """The committed coefficients of the fit (name -> value; kvlab.sections.clock_2023 writes them)."""
    with open(path, newline="", encoding="utf-8") as f:
        return {r["name"]: float(r["value"]) for r in csv.DictReader(f)}


def committed_clock(block_size: int = 16, model: str = MODEL, gpu: str = GPU) -> Clock2023StepCost:
    """The vLLM 2023 clock of the committed coefficients, its PagedAttention at block_size (fitted for OPT-13B on
    the A100-40GB; another model or GPU gets the same coefficients on its own sizes and datasheet)."""
    return Clock2023StepCost.from_coefficients(models.get_model(model), models.get_gpu(gpu), load_coefficients(),
                                               block_size)
