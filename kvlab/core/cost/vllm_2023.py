"""vLLM of mid-2023 (v0.1) as a step cost, and the measurements it is fitted to (data/vllm_2023/, data/README.md
gives their origin): the one home of the 2023 family. kvlab.studies.vllm_2023_fit fits the coefficients (it serves
Anyscale's benchmark with the engine) and writes COEFFICIENTS_CSV, which committed_step_cost reads.

The measurements: Anyscale's continuous-batching benchmark of June 2023 (OPT-13B on one A100-40GB, 1,000 requests
of 512 prompt tokens sent at once, capped-exponential outputs of mean 128): vLLM's throughput per cap and the
benchmark's own output lengths (anyscale_workload); the vLLM paper's Fig. 18a (PagedAttention kernel latency by
batch and context, read from the PDF's vector graphics); one public measurement of a paged attention kernel at
block sizes 1 and 16 (the per-block cost). Read with the csv module; nothing is downloaded.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvlab.core import models, validate
from kvlab.core.cost import step_time
from kvlab.core.cost.batch import Batch
from kvlab.core.models import DATA_DIR
from kvlab.core.workload import Workload

VLLM_2023_DIR = DATA_DIR / "vllm_2023"
COEFFICIENTS_CSV = VLLM_2023_DIR / "coefficients.csv"
CAPS = (32, 128, 512, 1536)
MODEL, GPU = "facebook/opt-13b", "A100-40GB"  # the benchmark's and Fig. 18a's setting


# ---------------------------------------------------------------- the step cost
def paged_attention_us(
    launch_us, us_per_sequence, us_per_token, us_per_block, block_size: int, num_decodes, decode_context_tokens
):
    """One layer's PagedAttention kernel (us; kvlab.core.cost.step_time.paged_attention_kernel_us), 0 without decodes.
    Floats or arrays alike."""
    us = step_time.paged_attention_kernel_us(
        launch_us, us_per_sequence, us_per_token, us_per_block, block_size, num_decodes, decode_context_tokens
    )
    if np.ndim(num_decodes) == 0:
        return us if num_decodes else 0.0 * decode_context_tokens
    return np.where(np.asarray(num_decodes) > 0, us, 0.0)


@dataclass(frozen=True)
class Vllm2023StepCost:
    """vLLM of mid-2023 (v0.1: eager PyTorch, no CUDA graphs, its first PagedAttention kernel) serving one model on
    one GPU: MeasuredStepCost's terms, each in closed form with a few coefficients (kvlab.studies.vllm_2023_fit
    fits them to Anyscale's June 2023 benchmark and to the vLLM paper's Fig. 18a; COEFFICIENTS_CSV holds the fit). A
    step is the sum of

    - step_overhead_ms once (the CPU's scheduling, input preparation and the server's loop);
    - dense: max(weights_bytes / memory_bandwidth_gb_s, 2 x num_params x num_tokens / dense_tflops), the sustained
      (not datasheet) figures: the linear layers read their weights once and do 2 FLOPs a parameter a token;
    - decode attention, num_layers x (attention_launch_us + attention_us_per_sequence x decodes
      + attention_us_per_token x their context tokens + attention_us_per_block x the blocks they touch), the
      PagedAttention kernel; blocks = context tokens / block_size + decodes x (1 - 1/block_size) / 2 (a
      sequence's last block is half full on average: the engine gives only the decodes' summed context);
    - prefill attention, num_layers x 4 x hidden_size FLOPs a query-key pair at dense_tflops (QK^T and PV).
    """

    num_layers: int
    hidden_size: int
    weights_bytes: float
    num_params: float
    memory_bandwidth_gb_s: float  # sustained
    dense_tflops: float  # sustained
    attention_launch_us: float
    attention_us_per_sequence: float
    attention_us_per_token: float
    attention_us_per_block: float
    block_size: int = 16
    step_overhead_ms: float = 0.0
    source: str = ""
    name = "vllm-2023"

    def __post_init__(self):
        validate.positive_int("num_layers", self.num_layers)
        validate.positive_int("hidden_size", self.hidden_size)
        for name in ("weights_bytes", "num_params", "memory_bandwidth_gb_s", "dense_tflops"):
            validate.positive_number(name, getattr(self, name))
        for name in (
            "attention_launch_us",
            "attention_us_per_sequence",
            "attention_us_per_token",
            "attention_us_per_block",
        ):
            validate.non_negative_number(name, getattr(self, name))
        validate.in_range("block_size", self.block_size, "block_size")
        validate.in_range("step_overhead_ms", self.step_overhead_ms, "step_ms")
        figures = [float(getattr(self, name)) for name in step_time.VLLM_2023]
        object.__setattr__(self, "clock", step_time.clock(3, {"cost_ms": figures}, layers=self.num_layers))

    @classmethod
    def from_coefficients(cls, model, gpu, coefficients: dict, block_size: int = 16) -> Vllm2023StepCost:
        """The step cost of a ModelSpec (num_params_b > 0) on a GpuSpec from named coefficients: memory_bandwidth_fraction
        and flop_fraction (of the GPU's datasheet bandwidth and dense bf16 FLOP/s), attention_launch_us,
        attention_us_per_sequence, attention_us_per_token, attention_us_per_block, step_overhead_ms."""
        from kvlab.core.models import weights_bytes_per_gpu

        need = (
            "memory_bandwidth_fraction",
            "flop_fraction",
            "attention_launch_us",
            "attention_us_per_sequence",
            "attention_us_per_token",
            "attention_us_per_block",
            "step_overhead_ms",
        )
        missing = [name for name in need if name not in coefficients]
        if missing:
            validate.fail("coefficients", ", ".join(missing), f"are missing; the step cost needs {', '.join(need)}")
        if model.num_params_b <= 0:
            validate.fail("model", model.name, "has no parameter count (num_params_b) for the dense term")
        c = {name: float(coefficients[name]) for name in need}
        validate.fraction("memory_bandwidth_fraction", c["memory_bandwidth_fraction"])
        validate.fraction("flop_fraction", c["flop_fraction"])
        return cls(
            model.num_layers,
            model.num_attention_heads * model.head_dim,
            weights_bytes_per_gpu(model, 2.0, 1, 1),
            model.num_params_b * 1e9,
            gpu.memory_bandwidth_gb_s * c["memory_bandwidth_fraction"],
            gpu.bf16_dense_tflops * c["flop_fraction"],
            c["attention_launch_us"],
            c["attention_us_per_sequence"],
            c["attention_us_per_token"],
            c["attention_us_per_block"],
            block_size,
            c["step_overhead_ms"],
            f"vLLM 2023 step cost of {model.name} on {gpu.name}",
        )

    # ---------------------------------------------------------------- the engine's interface
    def step_s(self, batch: Batch) -> float:
        """Seconds of one step (see the class; kvlab.core.cost.step_time.vllm_2023_s)."""
        return step_time.vllm_2023_s(self.clock, *batch[:6])

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s): the overhead and the dense term (every
        attention term is 0 or more)."""
        return (self.step_overhead_ms * 1000.0 + step_time.vllm_2023_dense_us(self.clock, num_tokens)) / 1e6

    def describe(self) -> str:
        """The step cost in words: its model, GPU and coefficients' source."""
        return self.source


# ---------------------------------------------------------------- its coefficients and the measurements they fit
def load_coefficients(path: str | Path = COEFFICIENTS_CSV) -> dict:
    """The committed coefficients of the fit (name -> value; kvlab.studies.vllm_2023_fit writes them)."""
    with open(path, newline="", encoding="utf-8") as f:
        return {r["name"]: float(r["value"]) for r in csv.DictReader(f)}


def committed_step_cost(block_size: int = 16, model: str = MODEL, gpu: str = GPU) -> Vllm2023StepCost:
    """The vLLM 2023 step cost of the committed coefficients, its PagedAttention at block_size (fitted for OPT-13B on
    the A100-40GB; another model or GPU gets the same coefficients on its own sizes and datasheet)."""
    return Vllm2023StepCost.from_coefficients(
        models.get_model(model), models.get_gpu(gpu), load_coefficients(), block_size
    )


def _rows(name: str, directory: str | Path = VLLM_2023_DIR) -> list[dict]:
    with open(Path(directory) / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class AnyscaleRun:
    """One cap of Anyscale's benchmark: its settings and vLLM's throughput (tokens/s, prompt + output tokens)."""

    max_tokens_cap: int
    max_num_batched_tokens: int  # the benchmark's setting for this cap (benchmark_configs/vllm_variable_size)
    num_requests: int
    prompt_tokens: int  # every request's
    output_tokens_total: int
    throughput_tokens_s: float  # the blog's
    reproduced_tokens_s: float  # the benchmark's issue #4 rerun (vLLM 0.1.2): a check, not a fit input
    source: str


def anyscale_runs(directory: str | Path = VLLM_2023_DIR) -> tuple[AnyscaleRun, ...]:
    """The four caps of anyscale_throughput.csv, in increasing cap."""
    ints = ("max_tokens_cap", "max_num_batched_tokens", "num_requests", "prompt_tokens", "output_tokens_total")
    runs = [
        AnyscaleRun(**{k: int(v) if k in ints else (v if k == "source" else float(v)) for k, v in r.items()})
        for r in _rows("anyscale_throughput.csv", directory)
    ]
    return tuple(sorted(runs, key=lambda r: r.max_tokens_cap))


def anyscale_run(cap: int, directory: str | Path = VLLM_2023_DIR) -> AnyscaleRun:
    """One cap's run (a cap the benchmark did not run is a one-line ValueError)."""
    for run in anyscale_runs(directory):
        if run.max_tokens_cap == cap:
            return run
    validate.fail("max_tokens_cap", cap, f"is not a cap of Anyscale's benchmark; caps: {', '.join(map(str, CAPS))}")


def anyscale_workload(cap: int, directory: str | Path = VLLM_2023_DIR) -> Workload:
    """The benchmark's 1,000 requests at one cap, all arriving at t=0: 512 prompt tokens each and the output
    lengths its seeded draw gave (anyscale_output_tokens.csv; vLLM ran with ignore_eos)."""
    run = anyscale_run(cap, directory)
    output = np.array([int(r[f"cap_{cap}"]) for r in _rows("anyscale_output_tokens.csv", directory)], dtype=np.int64)
    if len(output) != run.num_requests or int(output.sum()) != run.output_tokens_total:
        validate.fail(
            "anyscale_output_tokens.csv",
            f"{len(output)} requests, {int(output.sum())} tokens at cap {cap}",
            f"must match anyscale_throughput.csv ({run.num_requests} requests, {run.output_tokens_total})",
        )
    n = run.num_requests
    return Workload(
        np.zeros(n),
        np.full(n, run.prompt_tokens, dtype=np.int64),
        output,
        name=f"Anyscale 2023 benchmark, max_tokens cap {cap}",
    )


@dataclass(frozen=True)
class KernelLatency:
    """Fig. 18a's points of one system: batch size, context length (tokens) and kernel latency (us) each."""

    system: str
    batch_size: np.ndarray
    context_tokens: np.ndarray
    latency_us: np.ndarray
    read_precision_us: float


def fig18a(system: str = "vLLM", directory: str | Path = VLLM_2023_DIR) -> KernelLatency:
    """Fig. 18a's attention kernel latencies of vLLM (the fit's) or FasterTransformer (a reference)."""
    rows = [r for r in _rows("fig18a_kernel_latency.csv", directory) if r["system"] == system]
    if not rows:
        validate.fail("system", system, "must be vLLM or FasterTransformer (the systems of Fig. 18a)")

    def column(key: str, kind=float) -> np.ndarray:
        return np.array([kind(r[key]) for r in rows])

    return KernelLatency(
        system,
        column("batch_size", int),
        column("context_tokens", int),
        column("latency_us"),
        max(float(r["read_precision_us"]) for r in rows),
    )


def block_size_ratio(directory: str | Path = VLLM_2023_DIR) -> float:
    """How much slower a paged attention kernel runs at block size 1 than at 16 over the same KV: the mean over
    the kernels of paged_kernel_block_size.csv of latency(1) / latency(16)."""
    by_kernel: dict[str, dict[int, float]] = {}
    for r in _rows("paged_kernel_block_size.csv", directory):
        by_kernel.setdefault(r["kernel"], {})[int(r["block_size"])] = float(r["latency_ms"])
    ratios = [t[1] / t[16] for t in by_kernel.values() if 1 in t and 16 in t]
    if not ratios:
        validate.fail("paged_kernel_block_size.csv", str(directory), "has no kernel measured at block sizes 1 and 16")
    return float(np.mean(ratios))
