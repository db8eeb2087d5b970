"""The step cost of vLLM 2023 on OPT-13B and one A100-40GB, fitted to measurements section 6 does not reproduce.

The step cost (kvlab.core.cost.Vllm2023StepCost, with the measurements it is fitted to in
kvlab.core.cost.vllm_2023) has MeasuredStepCost's terms in closed form. Its coefficients:

- memory_bandwidth_fraction: fixed, the share of the datasheet bandwidth the A100's linear layers sustain in
  vidur's operator profiles (kvlab.core.profiles.sustained_fractions("A100-SXM-80GB")), not fitted;
- attention_launch_us, attention_us_per_sequence, attention_us_per_token: fitted to the vLLM paper's Fig. 18a
  (its PagedAttention kernel at batch 8 and 32, context 64 to 256, block size 16), relative residuals;
- attention_us_per_block: tied to attention_us_per_token by the one public measurement of a paged kernel at
  block sizes 1 and 16 (latency ratio R, kvlab.core.cost.vllm_2023.block_size_ratio): per block =
  per token x (R - 1) / (1 - R/16), so that block size 1 costs R times block size 16 at the same KV;
- step_overhead_ms and flop_fraction: fitted to Anyscale's June 2023 benchmark, which kvlab's engine serves
  (all 1,000 requests at t=0, the paper's 12 GiB pool) with the step cost, comparing throughput per cap.

Never fitted to a figure section 6 reproduces (Fig. 13, Fig. 2, §6.2's rates, Fig. 18b, Fig. 11). The fit's
coefficients are committed (data/vllm_2023/coefficients.csv, fit_residuals.csv); write_fit() refits them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from kvlab.core import models, profiles, validate
from kvlab.core.config import EngineConfig
from kvlab.core.cost import Batch, Vllm2023StepCost, paged_attention_us
from kvlab.core.cost import vllm_2023 as data
from kvlab.core.engine import simulate
from kvlab.studies.paper_setting import PaperSetting

COEFFICIENTS_CSV = data.COEFFICIENTS_CSV
load_coefficients = data.load_coefficients  # the notebook's
RESIDUALS_CSV = data.VLLM_2023_DIR / "fit_residuals.csv"
FIT_BLOCK_SIZE = 16  # Fig. 18a's and the benchmark's (vLLM's default)
# The benchmark's scheduler: the vLLM of June 2023 put prompts into decode steps under one token budget (0.1.0-0.1.2;
# prompt-only steps came with 0.1.3), which vLLM 0.33's v1 scheduler, synchronous, without chunked prefill, follows.
STAND_IN_CONFIG = EngineConfig().replace(
    async_scheduling=False,
    enable_chunked_prefill=False,
    max_num_batched_tokens=2560,
    max_num_seqs=256,
    max_model_len=2048,
    block_size=FIT_BLOCK_SIZE,
)
# least_squares' tolerances (xtol, ftol, gtol): a refit agrees with the committed coefficients to about 1e-9
# relative; the tests allow 1e-6.
TOLERANCE = 1e-12
COEFFICIENT_UNITS = {
    "memory_bandwidth_fraction": "fraction",
    "flop_fraction": "fraction",
    "attention_launch_us": "us",
    "attention_us_per_sequence": "us",
    "attention_us_per_token": "us",
    "attention_us_per_block": "us",
    "step_overhead_ms": "ms",
}


def spec() -> tuple[models.ModelSpec, models.GpuSpec]:
    """OPT-13B and the A100-40GB (data/models.csv, data/gpus.csv)."""
    return models.get_model(data.MODEL), models.get_gpu(data.GPU)


def per_block_share(ratio: float) -> float:
    """attention_us_per_block / attention_us_per_token such that block size 1 costs ratio x block size 16."""
    if not 1.0 <= ratio < 16.0:
        validate.fail("block_size_ratio", ratio, "must be in [1, 16): block size 1 at least as slow as 16")
    return (ratio - 1.0) / (1.0 - ratio / 16.0)


def step_cost(coefficients: dict, block_size: int = FIT_BLOCK_SIZE) -> Vllm2023StepCost:
    """The step cost of OPT-13B on the A100-40GB with these coefficients, its PagedAttention at block_size."""
    model, gpu = spec()
    return Vllm2023StepCost.from_coefficients(model, gpu, coefficients, block_size)


# ---------------------------------------------------------------- Fig. 18a: the attention kernel
def kernel_us(coefficients: dict, batch_size, context_tokens, block_size: int = FIT_BLOCK_SIZE) -> np.ndarray:
    """The step cost's attention term for one layer: batch_size decodes of context_tokens tokens each (us, an array)."""
    b, ctx = np.broadcast_arrays(
        np.atleast_1d(np.asarray(batch_size, dtype=np.float64)),
        np.atleast_1d(np.asarray(context_tokens, dtype=np.float64)),
    )
    c = coefficients
    return paged_attention_us(
        c["attention_launch_us"],
        c["attention_us_per_sequence"],
        c["attention_us_per_token"],
        c["attention_us_per_block"],
        block_size,
        b,
        b * ctx,
    )


def fit_kernel(kernel: data.KernelLatency | None = None, ratio: float | None = None) -> dict:
    """The attention coefficients fitted to Fig. 18a's vLLM points (relative residuals, least_squares)."""
    kernel = data.fig18a() if kernel is None else kernel
    share = per_block_share(data.block_size_ratio() if ratio is None else ratio)

    def coefficients(x) -> dict:
        return {
            "attention_launch_us": float(x[0]),
            "attention_us_per_sequence": float(x[1]),
            "attention_us_per_token": float(x[2]),
            "attention_us_per_block": share * float(x[2]),
        }

    fit = least_squares(
        lambda x: kernel_us(coefficients(x), kernel.batch_size, kernel.context_tokens) / kernel.latency_us - 1.0,
        x0=[10.0, 1.0, 0.02],
        bounds=(0.0, np.inf),
        xtol=TOLERANCE,
        ftol=TOLERANCE,
        gtol=TOLERANCE,
    )
    return coefficients(fit.x)


# ---------------------------------------------------------------- Anyscale's benchmark: the whole step
def benchmark_config(run: data.AnyscaleRun, config: EngineConfig, benchmark_batched_tokens: bool) -> EngineConfig:
    """The engine for one cap: config, with the benchmark's own max_num_batched_tokens for the cap if asked."""
    return config.replace(max_num_batched_tokens=run.max_num_batched_tokens) if benchmark_batched_tokens else config


def serve_benchmark(
    cost,
    config: EngineConfig = STAND_IN_CONFIG,
    benchmark_batched_tokens: bool = True,
    num_gpu_blocks: int | None = None,
) -> np.ndarray:
    """Throughput (prompt + output tokens per second, as the benchmark counts it) kvlab's engine gives each cap
    of Anyscale's benchmark with this step cost: all requests at t=0, the paper's pool by default."""
    if not isinstance(config, EngineConfig):
        validate.fail("config", type(config).__name__, "must be a kvlab.core.config.EngineConfig")
    blocks = PaperSetting().num_gpu_blocks(config.cache.block_size) if num_gpu_blocks is None else num_gpu_blocks
    out = []
    for run in data.anyscale_runs():
        workload = data.anyscale_workload(run.max_tokens_cap)
        result = simulate(
            workload, benchmark_config(run, config, benchmark_batched_tokens), num_gpu_blocks=blocks, cost=cost
        )
        tokens = int(workload.prompt_tokens.sum() + result.num_output_tokens.sum())
        out.append(tokens / float(np.max(result.finish_s)))
    return np.array(out)


@dataclass(frozen=True)
class StepCostFit:
    """A fit's coefficients and what it left: throughput per cap (measured, fitted) and Fig. 18a (measured, fitted)."""

    coefficients: dict
    caps: np.ndarray
    measured_tokens_s: np.ndarray
    fitted_tokens_s: np.ndarray
    kernel_measured_us: np.ndarray
    kernel_fitted_us: np.ndarray

    @property
    def throughput_residual_pct(self) -> np.ndarray:
        """(fitted - measured) / measured per cap, %."""
        return 100.0 * (self.fitted_tokens_s / self.measured_tokens_s - 1.0)

    @property
    def kernel_residual_pct(self) -> np.ndarray:
        """(fitted - measured) / measured per Fig. 18a point, %."""
        return 100.0 * (self.kernel_fitted_us / self.kernel_measured_us - 1.0)


def fit(config: EngineConfig = STAND_IN_CONFIG, benchmark_batched_tokens: bool = True) -> StepCostFit:
    """Fit the step cost: the kernel to Fig. 18a, then step_overhead_ms and flop_fraction to Anyscale's throughputs
    served by kvlab's engine under config."""
    fixed = {
        "memory_bandwidth_fraction": profiles.sustained_fractions("A100-SXM-80GB").memory_bandwidth_fraction,
        **fit_kernel(),
    }
    runs = data.anyscale_runs()
    measured = np.array([r.throughput_tokens_s for r in runs])

    def coefficients(x) -> dict:
        return {**fixed, "step_overhead_ms": float(x[0]), "flop_fraction": float(x[1])}

    def residuals(x):
        return serve_benchmark(step_cost(coefficients(x)), config, benchmark_batched_tokens) / measured - 1.0

    result = least_squares(
        residuals,
        x0=[10.0, 0.6],
        bounds=([0.0, 0.05], [100.0, 1.0]),
        x_scale=[10.0, 0.5],
        xtol=TOLERANCE,
        ftol=TOLERANCE,
        gtol=TOLERANCE,
    )
    best = coefficients(result.x)
    kernel = data.fig18a()
    return StepCostFit(
        best,
        np.array([r.max_tokens_cap for r in runs]),
        measured,
        serve_benchmark(step_cost(best), config, benchmark_batched_tokens),
        kernel.latency_us,
        kernel_us(best, kernel.batch_size, kernel.context_tokens),
    )


# ---------------------------------------------------------------- the committed fit
def write_fit(result: StepCostFit, directory: str | Path = data.VLLM_2023_DIR) -> None:
    """Write a fit's coefficients and residuals (coefficients.csv, fit_residuals.csv)."""
    roles = {
        "memory_bandwidth_fraction": "fixed: vidur A100 linear layers (kvlab.core.profiles.sustained_fractions)",
        "attention_launch_us": "fitted: Fig. 18a",
        "attention_us_per_sequence": "fitted: Fig. 18a",
        "attention_us_per_token": "fitted: Fig. 18a",
        "attention_us_per_block": "tied: per token x (R - 1) / (1 - R/16), R from paged_kernel_block_size.csv",
        "step_overhead_ms": "fitted: Anyscale throughputs",
        "flop_fraction": "fitted: Anyscale throughputs",
    }
    directory = Path(directory)
    with open(directory / "coefficients.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["name", "value", "unit", "source"])
        for name, value in result.coefficients.items():
            writer.writerow([name, repr(float(value)), COEFFICIENT_UNITS[name], roles[name]])
    kernel = data.fig18a()
    with open(directory / "fit_residuals.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["measurement", "point", "measured", "fitted", "unit", "residual_pct"])
        for cap, m, v, r in zip(
            result.caps, result.measured_tokens_s, result.fitted_tokens_s, result.throughput_residual_pct
        ):
            writer.writerow(["anyscale_throughput", f"cap {cap}", f"{m:g}", f"{v:.2f}", "tokens/s", f"{r:.3f}"])
        for b, ctx, m, v, r in zip(
            kernel.batch_size,
            kernel.context_tokens,
            result.kernel_measured_us,
            result.kernel_fitted_us,
            result.kernel_residual_pct,
        ):
            writer.writerow(["fig18a_vllm", f"batch {b} context {ctx}", f"{m:g}", f"{v:.3f}", "us", f"{r:.3f}"])


def load_residuals(path: str | Path = RESIDUALS_CSV) -> pd.DataFrame:
    """The committed fit's residuals, one row per measured point."""
    return pd.read_csv(path)


# ---------------------------------------------------------------- tables
def fit_table(config: EngineConfig = STAND_IN_CONFIG, benchmark_batched_tokens: bool = True) -> pd.DataFrame:
    """Anyscale's throughput per cap (tokens/s, as its blog gives it) against the committed step cost's (served by
    kvlab's engine under config), and the benchmark's own rerun on vLLM 0.1.2 (a check, not a fit input)."""
    runs = data.anyscale_runs()
    fitted = serve_benchmark(data.committed_step_cost(), config, benchmark_batched_tokens)
    rows = [
        {
            "max_tokens_cap": r.max_tokens_cap,
            "output_tokens": r.output_tokens_total,
            "blog_tokens_per_s": r.throughput_tokens_s,
            "step_cost_tokens_per_s": round(float(v), 1),
            "residual_pct": round(100.0 * (v / r.throughput_tokens_s - 1.0), 2),
            "rerun_tokens_per_s": r.reproduced_tokens_s,
        }
        for r, v in zip(runs, fitted)
    ]
    return pd.DataFrame(rows)


def kernel_table() -> pd.DataFrame:
    """Fig. 18a (vLLM's kernel, FasterTransformer's beside it) against the committed step cost's attention term."""
    vllm, ft = data.fig18a("vLLM"), data.fig18a("FasterTransformer")
    fitted = kernel_us(load_coefficients(), vllm.batch_size, vllm.context_tokens)
    return pd.DataFrame(
        {
            "batch_size": vllm.batch_size,
            "context_tokens": vllm.context_tokens,
            "vllm_kernel_us": vllm.latency_us,
            "clock_attention_us": np.round(fitted, 2),
            "residual_pct": np.round(100.0 * (fitted / vllm.latency_us - 1.0), 2),
            "fastertransformer_us": ft.latency_us,
        }
    )


def step_times(batch_sizes=(1, 8, 32, 128), context_tokens: int = 500) -> pd.DataFrame:
    """Decode step time (ms) of OPT-13B on the A100-40GB at each batch size, every request at context_tokens:
    the committed step cost against section 6's roofline."""
    vllm, roofline = data.committed_step_cost(), PaperSetting(step_cost="roofline").cost()
    rows = []
    for b in batch_sizes:
        b = validate.positive_int("batch_size", b)
        # each request's context_tokens cached plus the token it decodes: as section 6's cost table counts a step
        context = b * (validate.positive_int("context_tokens", context_tokens) + 1)
        vllm_ms, roofline_ms = (
            vllm.step_s(Batch(b, context, b, context)) * 1e3,
            roofline.step_s(Batch(b, context, b, context)) * 1e3,
        )
        rows.append(
            {
                "batch_size": b,
                "context_tokens": context_tokens,
                "clock_2023_ms": round(vllm_ms, 2),
                "roofline_ms": round(roofline_ms, 2),
                "clock_over_roofline_x": round(vllm_ms / roofline_ms, 2),
            }
        )
    return pd.DataFrame(rows)


__all__ = [
    "COEFFICIENTS_CSV",
    "FIT_BLOCK_SIZE",
    "RESIDUALS_CSV",
    "STAND_IN_CONFIG",
    "TOLERANCE",
    "StepCostFit",
    "fit",
    "fit_kernel",
    "fit_table",
    "kernel_table",
    "kernel_us",
    "load_coefficients",
    "load_residuals",
    "per_block_share",
    "serve_benchmark",
    "spec",
    "step_cost",
    "step_times",
    "write_fit",
]
