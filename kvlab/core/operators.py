"""Operator tables by shape (data/operators/): vLLM's own kernels measured one at a time on each GPU, and the
operator profile of any model composed from them.

data/operators/<system>/ holds AIConfigurator's vLLM tables (github.com/ai-dynamo/aiconfigurator, Apache-2.0;
scripts/profiles/import_aiconfigurator.py wrote them; meta.json names the commit, the vLLM version and the kernel of
each table): gemm.npz (m, n, k -> us, per weight dtype), context_attention.npz (one causal prefill of a batch of
prompts), generation_attention.npz (one decode token of a batch over its cached tokens), moe.npz (the fused MoE
block) and all_reduce.csv (vLLM's custom all-reduce in a CUDA graph). OperatorTables reads them; compose_profile
builds, from a model's shapes, the OperatorProfile (kvlab.core.profiles) that MeasuredStepCost is made of:

- dense: each decoder layer's linear layers as GEMMs of (tokens, out, in) at the weights' dtype at the model's
  tensor-parallel split (qkv_proj, o_proj, gate_up_proj, down_proj; an MoE layer's MLP is its MoE block), read at
  the table's measured tokens (the step's batched tokens); between measured (n, k) bilinear in n and k (exact where
  time grows as n x k), past the table's largest n or k linear from its last two;
- the small operators no table holds (RMSNorm with the residual, rotary, SiLU-and-mul, Qwen3's q/k norm, the
  embedding): LLMServingSim's measurements of vLLM's own layers on the RTX PRO 6000 (data/profiles/llmservingsim/)
  read at the same bytes: the time of the reference model's operator at tokens x (this model's bytes a token / the
  reference's) x (the reference GPU's datasheet bandwidth / this GPU's), so a launch's floor stays a floor;
- per sequence: lm_head as a GEMM of (sequences, vocabulary / TP, hidden) in bf16; the sampler as the small
  operators are (its bytes: the vocabulary);
- attention, one layer's (the mean over the model's layers, each at its window), on the grid MeasuredStepCost reads
  (prefill chunk, its history, decodes, their mean history): a prefill chunk of n tokens after c cached is read
  from the context table at batch 1 as the prompt of the same query-key pairs (n x c + n(n+1)/2 = s(s+1)/2; the
  FLOPs), divided by how much longer such a prompt takes than the chunk after its history as kvlab measured it on
  an H200 (chunk_ratio: up to 1.67x for chunks of 64-1,024 tokens after history; PyTorch's flash kernel, its shape
  taken for vLLM's), decodes from the generation table at (decodes, history); a sliding window keeps min(history, window) keys
  for a decode and its pairs for a chunk; a mixed batch (prefill chunks with decodes) is the sum of the two, except
  under FlashAttention 2 (Ampere, Ada and workstation Blackwell at a bf16 KV cache): vLLM runs a mixed batch in
  one varlen launch, and FlashAttention 2 packs a GQA group's query heads onto one KV head only when every query is
  one token (flash_api.cpp mha_varlen_fwd: seqlenq_ngroups_swapped needs max_seqlen_q == 1), so in a mixed batch
  each query head reads its KV head again. There the decodes' part is multiplied by 1 + (g - 1) x the share of
  that re-reading that shows (mixed_decode_share: measured by LLMServingSim on the RTX PRO 6000 for vLLM's
  FlashAttention 2, g the model's query heads per KV head). FlashAttention 3 (Hopper) packs GQA heads in every
  varlen launch and FlashInfer (data-center Blackwell, an fp8 KV cache) runs prefills and decodes as two launches:
  the sum stands there (kvlab's H200 measurements put both kernels in one graph at -5% to +14% of it). Head shapes the
  table did not measure: linear in KV heads (decode) from the two nearest at the same heads and head dim, the
  nearest measured heads, scaled by head dim (decode: the bytes) or heads x head dim (prefill: the FLOPs);
  batches past the largest measured at a length, linear in the batch; prompts past the largest, as the square;
- MoE: the table's block at (tokens, the model's hidden, expert MLP, experts, top-k, TP) under balanced routing,
  plus the router's GEMM.
Only measured shapes are read; every rule above that leaves them (a scaled head shape, an extrapolated size) is
named in the profile's words. Interpolation between the grid's points is MeasuredStepCost's.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvlab.core.models import DATA_DIR, get_gpu

OPERATORS_DIR = DATA_DIR / "operators"
# LLMServingSim's measurements of vLLM's own layers, whose small operators and sampler stand in where no table times
# them (kvlab's H200 measurements time Triton stand-ins for these operators, not vLLM's kernels)
REFERENCE_GPU = "RTX-PRO-6000-Server-96GB"
REFERENCE_DIR = DATA_DIR / "profiles" / "llmservingsim" / "RTXPRO6000"
REFERENCE_MODEL = "meta-llama/Llama-3.1-8B"  # hidden 4096, 32 heads, 8 KV heads, head dim 128, MLP 14336
REFERENCE_QK_NORM_MODEL = "Qwen/Qwen3-32B"  # the reference of q_norm and k_norm (64 heads, 8 KV heads)
# The attention grid's axes (tokens): half-doublings on the prefill chunk, whose time grows as its square.
PREFILL_CHUNKS = (0, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
HISTORIES = (0,) + tuple(16 << i for i in range(14))  # 16 .. 131,072
DECODES = (0,) + tuple(1 << i for i in range(11))  # 1 .. 1,024
SEQUENCES = tuple(range(1, 17)) + tuple(range(24, 1025, 8))
# Weight dtypes by ModelSpec.quantization ("": the 16-bit checkpoint)
GEMM_DTYPE = {"": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "mxfp4": "bf16"}
MOE_DTYPE = {"": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "mxfp4": "mxfp4"}
MOE_DISTRIBUTION = "balanced"
# The MLA module tables measure DeepSeek-V3's attention: (hidden, heads, kv_lora_rank, qk_rope_head_dim)
MLA_SHAPE = (7168, 128, 512, 64)
MLA_HEAD_DIM = 576  # the cached latent, kv_lora_rank + qk_rope_head_dim


@lru_cache(maxsize=1)
def operator_systems() -> dict[str, str]:
    """kvlab's GPU name -> its folder under data/operators/ (from each folder's meta.json)."""
    found = {}
    for meta in sorted(OPERATORS_DIR.glob("*/meta.json")):
        found[json.loads(meta.read_text())["gpu"]] = meta.parent.name
    return found


def operator_gpus() -> list[str]:
    """GPUs whose operator tables data/operators holds."""
    return sorted(operator_systems())


def _extrapolating(x: float, xs: np.ndarray) -> tuple[int, float]:
    """(i, w): x = (1 - w) xs[i] + w xs[i + 1] on the segment that brackets x, else the first or last (w < 0 or > 1:
    linear extrapolation)."""
    if len(xs) == 1:
        return 0, 0.0
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    return i, float((x - xs[i]) / (xs[i + 1] - xs[i]))


def interp_linear(x, xs, ys) -> np.ndarray:
    """np.interp with linear extrapolation past both ends (from the two end points)."""
    x, xs, ys = np.asarray(x, dtype=np.float64), np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    y = np.interp(x, xs, ys)
    if len(xs) > 1:
        low, high = x < xs[0], x > xs[-1]
        y = np.where(low, ys[0] + (x - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0]), y)
        y = np.where(high, ys[-1] + (x - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), y)
    return y


def _segment(x: np.ndarray, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, i + 1, w) per x: x = (1 - w) xs[i] + w xs[i + 1] on the bracketing segment, else the first or last
    (w < 0 or > 1: linear extrapolation); an axis of one point gives i = i + 1 = 0."""
    if len(xs) == 1:
        zero = np.zeros(x.shape, dtype=np.intp)
        return zero, zero, np.zeros(x.shape)
    i = np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2)
    return i, i + 1, (x - xs[i]) / (xs[i + 1] - xs[i])


def bilinear(x, y, xs: np.ndarray, ys: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """grid [len(xs), len(ys)] read at (x, y) (arrays of one shape, or scalars): bilinear, linear past the ends."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    i0, i1, u = _segment(x, xs)
    j0, j1, v = _segment(y, ys)
    return (
        (1 - u) * (1 - v) * grid[i0, j0]
        + u * (1 - v) * grid[i1, j0]
        + (1 - u) * v * grid[i0, j1]
        + u * v * grid[i1, j1]
    )


def _fill_along(values: np.ndarray, axis_values: np.ndarray, axis: int) -> np.ndarray:
    """values with each NaN filled by linear interpolation (extrapolation at the ends) along one axis from the
    measured points of its line; a line with fewer than two measured points is left as it is."""
    moved = np.moveaxis(values.copy(), axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    for row in flat:
        known = ~np.isnan(row)
        if known.sum() >= 2 and not known.all():
            row[~known] = interp_linear(axis_values[~known], axis_values[known], row[known])
    return np.moveaxis(flat.reshape(moved.shape), -1, axis)


@dataclass(frozen=True)
class GemmTable:
    """One weight dtype's GEMMs on a dense (m, n, k) grid (us); unmeasured cells filled along m."""

    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    us: np.ndarray  # [m, n, k]

    @classmethod
    def from_columns(cls, m, n, k, us) -> GemmTable:
        axes = [np.unique(a) for a in (m, n, k)]
        grid = np.full(tuple(len(a) for a in axes), np.nan)
        grid[tuple(np.searchsorted(a, v) for a, v in zip(axes, (m, n, k)))] = us
        grid = _fill_along(grid, axes[0].astype(np.float64), 0)
        return cls(*(a.astype(np.float64) for a in axes), grid)

    def at(self, n: int, k: int) -> np.ndarray:
        """The GEMM of (m, n, k) at every measured m (us): bilinear in (n, k), linear past the grid's ends."""
        i, u = _extrapolating(n, self.n)
        j, v = _extrapolating(k, self.k)
        g = self.us
        return (
            (1 - u) * (1 - v) * g[:, i, j]
            + u * (1 - v) * g[:, i + 1, j]
            + (1 - u) * v * g[:, i, j + 1]
            + u * v * g[:, i + 1, j + 1]
        )

    def us_at(self, m, n: int, k: int) -> np.ndarray:
        """The GEMM of (m, n, k) (us) at any m: piecewise linear between measured m, linear past the last."""
        return interp_linear(m, self.m, self.at(n, k))


@dataclass(frozen=True)
class AttentionTable:
    """One phase's attention (context or generation) for one KV dtype: each measured head shape's grid of
    (batch, tokens) -> us."""

    shapes: dict  # (heads, kv_heads, head_dim) -> (batch axis, tokens axis, us [batch, tokens])

    @classmethod
    def from_columns(cls, heads, kv_heads, head_dim, batch, tokens, us) -> AttentionTable:
        shapes = {}
        keys = np.stack([heads, kv_heads, head_dim], axis=1)
        for key in np.unique(keys, axis=0):
            rows = np.all(keys == key, axis=1)
            b_axis, t_axis = np.unique(batch[rows]), np.unique(tokens[rows])
            grid = np.full((len(b_axis), len(t_axis)), np.nan)
            grid[np.searchsorted(b_axis, batch[rows]), np.searchsorted(t_axis, tokens[rows])] = us[rows]
            # past the largest batch measured at a length: linear in the batch (the kernel is bound by the bytes
            # or the FLOPs it has, which grow with the batch)
            grid = _fill_along(grid, b_axis.astype(np.float64), 0)
            grid = _fill_along(grid, t_axis.astype(np.float64), 1)
            if not np.isnan(grid).any():
                shapes[tuple(int(x) for x in key)] = (b_axis.astype(np.float64), t_axis.astype(np.float64), grid)
        return cls(shapes)

    def shape_for(self, heads: int, kv_heads: int, head_dim: int, phase: str) -> tuple[list, str]:
        """[(weight, measured shape)] whose weighted sum stands for (heads, kv_heads, head_dim), and the words that
        say how ("" where the shape was measured)."""
        wanted = (heads, kv_heads, head_dim)
        if wanted in self.shapes:
            return [(1.0, wanted)], ""
        head_dims = sorted({s[2] for s in self.shapes})
        near_dim = min(head_dims, key=lambda d: (abs(math.log(d / head_dim)), d))
        same_dim = [s for s in self.shapes if s[2] == near_dim]
        near_heads = min({s[0] for s in same_dim}, key=lambda h: (abs(math.log(h / heads)), h))
        if phase == "generation":
            kvs = sorted(s[1] for s in same_dim if s[0] == near_heads)
            if kv_heads in kvs:
                parts = [(1.0, (near_heads, kv_heads, near_dim))]
            elif kvs[0] < kv_heads < kvs[-1]:  # between two measured: linear in the KV heads
                lo = max(k for k in kvs if k < kv_heads)
                hi = min(k for k in kvs if k > kv_heads)
                w = (kv_heads - lo) / (hi - lo)
                parts = [(1 - w, (near_heads, lo, near_dim)), (w, (near_heads, hi, near_dim))]
            else:  # past them: the nearest measured, scaled by the KV bytes read (never a secant's sign flip)
                near_kv = kvs[-1] if kv_heads > kvs[-1] else kvs[0]
                parts = [(kv_heads / near_kv, (near_heads, near_kv, near_dim))]
            scale = head_dim / near_dim
        else:
            kvs = sorted(s[1] for s in same_dim if s[0] == near_heads)
            near_kv = min(kvs, key=lambda k: (abs(math.log(k / kv_heads)), k))
            parts = [(1.0, (near_heads, near_kv, near_dim))]
            scale = heads * head_dim / (near_heads * near_dim)
        parts = [(w * scale, s) for w, s in parts]
        measured = (
            f"{parts[0][1][0]}/{parts[0][1][1]}/{parts[0][1][2]} x {parts[0][0]:.3g}"
            if len(parts) == 1
            else " and ".join(f"{s[0]}/{s[1]}/{s[2]}" for _, s in parts)
        )
        return (
            parts,
            f"{phase} attention of {heads}/{kv_heads}/{head_dim} (heads/KV heads/head dim) read from {measured}",
        )

    def us_at(self, parts: list, batch, tokens) -> np.ndarray:
        """The weighted measured shapes' time (us) at (batch, tokens), bilinear on each grid, linear past its ends."""
        return sum(weight * bilinear(batch, tokens, *self.shapes[shape]) for weight, shape in parts)


@dataclass(frozen=True)
class MoeTable:
    """The fused MoE block's measured shapes: (hidden, expert MLP, top-k, experts, moe TP, moe EP) -> (tokens, us)."""

    shapes: dict

    @classmethod
    def from_columns(cls, distribution, hidden, inter, topk, experts, tp, ep, tokens, us) -> MoeTable:
        shapes = {}
        rows_of = np.asarray(distribution) == MOE_DISTRIBUTION
        keys = np.stack([hidden, inter, topk, experts, tp, ep], axis=1)[rows_of]
        for key in np.unique(keys, axis=0):
            rows = np.flatnonzero(rows_of)[np.all(keys == key, axis=1)]
            order = np.argsort(tokens[rows])
            shapes[tuple(int(x) for x in key)] = (tokens[rows][order].astype(np.float64), us[rows][order])
        return cls(shapes)


@dataclass(frozen=True, eq=False)
class OperatorTables:
    """A GPU's operator tables (data/operators/<system>/): GEMMs and MoE by weight dtype, attention by KV dtype."""

    gpu: str
    folder: Path
    meta: dict

    @property
    def system(self) -> str:
        return self.folder.name

    def _npz(self, name: str):
        path = self.folder / f"{name}.npz"
        return np.load(path) if path.exists() else None

    @lru_cache(maxsize=8)  # noqa: B019 (one instance per GPU, cached itself)
    def gemm(self, dtype: str) -> GemmTable | None:
        """The GEMMs of one weight dtype (bf16, fp8, fp8_block), or None where the GPU's table has none."""
        z = self._npz("gemm")
        if z is None or f"{dtype}_us" not in z:
            return None
        return GemmTable.from_columns(z[f"{dtype}_m"], z[f"{dtype}_n"], z[f"{dtype}_k"], z[f"{dtype}_us"])

    @lru_cache(maxsize=8)  # noqa: B019
    def attention(self, phase: str, kv_dtype: str) -> AttentionTable | None:
        """context or generation attention at one KV dtype (bf16, fp8), or None."""
        z = self._npz(f"{phase}_attention")
        if z is None or f"{kv_dtype}_us" not in z:
            return None
        cols = ("heads", "kv_heads", "head_dim", "batch", "tokens", "us")
        return AttentionTable.from_columns(*(z[f"{kv_dtype}_{c}"] for c in cols))

    @lru_cache(maxsize=8)  # noqa: B019
    def moe(self, dtype: str) -> MoeTable | None:
        """The MoE block's table at one weight dtype (bf16, fp8, fp8_block, mxfp4), or None."""
        z = self._npz("moe")
        if z is None or f"{dtype}_us" not in z:
            return None
        cols = ("distribution", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size")
        return MoeTable.from_columns(*(z[f"{dtype}_{c}"] for c in cols), z[f"{dtype}_num_tokens"], z[f"{dtype}_us"])

    @lru_cache(maxsize=8)  # noqa: B019
    def mla(self, phase: str, kv_dtype: str, gemm_dtype: str) -> AttentionTable | None:
        """The whole MLA attention module of DeepSeek-V3's shape (projections and attention of one layer) for one
        phase (context, generation), KV dtype and projection dtype, keyed (heads on the GPU, 1, MLA_HEAD_DIM), or
        None."""
        z = self._npz(f"{phase}_mla")
        prefix = f"{kv_dtype}_{gemm_dtype}"
        if z is None or f"{prefix}_us" not in z:
            return None
        heads = z[f"{prefix}_heads"]
        ones = np.ones_like(heads)
        return AttentionTable.from_columns(
            heads, ones, ones * MLA_HEAD_DIM, z[f"{prefix}_batch"], z[f"{prefix}_tokens"], z[f"{prefix}_us"]
        )

    def version(self, table: str) -> str:
        """The vLLM version a table was measured with."""
        return self.meta["tables"].get(table, {}).get("vllm_version", "")

    def kernel(self, table: str, dtype: str) -> str:
        """The kernel (or kernels) a table measured at a dtype, in words."""
        entry = self.meta["tables"].get(table, {}).get("by_dtype", {}).get(dtype, {})
        return entry.get("kernel") or ", ".join(entry.get("kernels", []))


@lru_cache(maxsize=16)
def operator_tables(gpu: str) -> OperatorTables | None:
    """The GPU's operator tables, or None where data/operators has none."""
    system = operator_systems().get(gpu)
    if system is None:
        return None
    folder = OPERATORS_DIR / system
    return OperatorTables(gpu, folder, json.loads((folder / "meta.json").read_text()))


@lru_cache(maxsize=4)
def _reference_ops(model: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The reference measurements of one model at TP 1: operator -> (tokens or sequences, us)."""
    folder = REFERENCE_DIR / model / "bf16" / "tp1"
    table: dict[str, dict[int, float]] = {}
    for name, key in (("dense.csv", "tokens"), ("per_sequence.csv", "sequences")):
        with open(folder / name, newline="") as f:
            for row in csv.DictReader(f):
                table.setdefault(row["layer"], {})[int(row[key])] = float(row["time_us"])
    return {op: (np.array(sorted(t), dtype=np.float64), np.array([t[x] for x in sorted(t)])) for op, t in table.items()}


def small_op_us(op: str, count, bytes_ratio: float, gpu_bandwidth_gb_s: float, model: str = REFERENCE_MODEL):
    """A small (memory-bound) operator's time (us) at count tokens or sequences: the reference's time at the same
    bytes on the reference GPU (count x bytes_ratio), read faster or slower by the datasheet bandwidths."""
    axis, us = _reference_ops(model)[op]
    reference_gb_s = get_gpu(REFERENCE_GPU).memory_bandwidth_gb_s
    return interp_linear(
        np.asarray(count, dtype=np.float64) * bytes_ratio * reference_gb_s / gpu_bandwidth_gb_s, axis, us
    )


def prefill_pairs(chunk, history, window: int = 0):
    """Query-key pairs of a causal chunk of chunk tokens after history cached ones (a window keeps at most window
    keys a query)."""
    chunk, history = np.asarray(chunk, dtype=np.float64), np.asarray(history, dtype=np.float64)
    full = chunk * history + chunk * (chunk + 1) / 2
    if not window:
        return full
    # query i (1-based) sees min(window, history + i) keys
    first = np.clip(window - history, 0, chunk)  # queries that see history + i <= window keys
    return np.minimum(full, first * history + first * (first + 1) / 2 + (chunk - first) * window)


def equal_pairs_prompt(pairs):
    """The prompt length s whose causal pairs s(s+1)/2 equal pairs."""
    return (np.sqrt(1.0 + 8.0 * np.asarray(pairs, dtype=np.float64)) - 1.0) / 2.0


# The weight matrix the sustained fractions of a GPU with tables only are read at: 8,192 x 8,192 in bf16, at the
# table's fewest tokens (bandwidth: its bytes over the time) and its most (FLOP/s).
FRACTIONS_GEMM = 8192


@lru_cache(maxsize=16)
def table_fractions(gpu: str):
    """The bandwidth and FLOP fractions of the datasheet that the GPU's bf16 GEMM table sustains on an 8,192 x 8,192
    weight (kvlab.core.profiles.SustainedFractions): the roofline fallback's rates where no profile measures the GPU."""
    from kvlab.core.profiles import SustainedFractions

    spec, gemm = get_gpu(gpu), operator_tables(gpu).gemm("bf16")
    times_us = gemm.at(FRACTIONS_GEMM, FRACTIONS_GEMM)
    weight_bytes = 2.0 * FRACTIONS_GEMM * FRACTIONS_GEMM
    bandwidth = weight_bytes / (times_us[0] * 1e-6) / (spec.memory_bandwidth_gb_s * 1e9)
    flops = 2.0 * FRACTIONS_GEMM * FRACTIONS_GEMM * gemm.m[-1] / (times_us[-1] * 1e-6) / (spec.bf16_dense_tflops * 1e12)
    return SustainedFractions(
        gpu,
        float(bandwidth),
        float(flops),
        (f"operator tables {operator_tables(gpu).system} (bf16 GEMM {FRACTIONS_GEMM} x {FRACTIONS_GEMM})",),
    )


CHUNKED_PREFILL_CSV = DATA_DIR / "profiles" / "kvlab" / "h200" / "chunked_prefill" / "chunked_prefill.csv"


@lru_cache(maxsize=1)
def _chunk_ratios() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(chunk tokens, history tokens, fresh prompt of equal pairs / chunk) measured on kvlab's H200."""
    with open(CHUNKED_PREFILL_CSV, newline="") as f:
        rows = [(int(r["chunk_tokens"]), int(r["history_tokens"]), float(r["ratio"])) for r in csv.DictReader(f)]
    chunks, histories = sorted({r[0] for r in rows}), sorted({r[1] for r in rows})
    grid = np.full((len(chunks), len(histories)), np.nan)
    for n, c, ratio in rows:
        grid[chunks.index(n), histories.index(c)] = ratio
    grid[:, histories.index(0)] = 1.0  # no history: the chunk is its own prompt (the two timings differ by noise)
    return np.array(chunks, dtype=np.float64), np.array(histories, dtype=np.float64), grid


def chunk_ratio(chunk, history) -> np.ndarray:
    """How much longer a fresh prompt of a chunk's query-key pairs takes than the chunk after its history, measured
    for kvlab on an H200 (scripts/gpu/time_chunked_prefill.py: PyTorch's flash attention, Llama-3.1-8B's heads, in
    CUDA graphs): bilinear between its (chunk, history) points, the nearest edge's past them. 1 with no history."""
    chunks, histories, grid = _chunk_ratios()
    chunk = np.clip(np.asarray(chunk, dtype=np.float64), chunks[0], chunks[-1])
    history = np.clip(np.asarray(history, dtype=np.float64), histories[0], histories[-1])
    return bilinear(chunk, history, chunks, histories, grid)


WHOLE_STEP_CSV = DATA_DIR / "profiles" / "kvlab" / "h200" / "whole_step" / "whole_step.csv"
WHOLE_STEP_LAYERS = 32  # the decoder those steps ran (Llama-3.1-8B's shape)


@lru_cache(maxsize=1)
def kernel_gap_us_per_layer() -> tuple[float, int]:
    """What a whole decode step takes beyond its kernels timed one at a time, a decoder layer (us), and the steps it
    is the median of: kvlab's H200 measurement (scripts/gpu/time_whole_step.py: Llama-3.1-8B's step in one CUDA
    graph against the sum of its kernels alone, the KV-cache write and the copies it timed apart taken out), the
    median over its decode steps of the time left, / the decoder's layers."""
    with open(WHOLE_STEP_CSV, newline="") as f:
        left = [float(r["unexplained_us"]) for r in csv.DictReader(f) if r["step_kind"] == "decode" and not r["error"]]
    return float(np.median(left)) / WHOLE_STEP_LAYERS, len(left)


def _kv_dtype(kv_cache_dtype: str) -> str:
    """The attention tables' KV dtype for vLLM's --kv-cache-dtype."""
    return "fp8" if kv_cache_dtype.startswith("fp8") else "bf16"


def composable(model) -> str:
    """Why compose_profile cannot compose model's step ("" where it can)."""
    if not model.layer_sizes or not model.hidden_size:
        return f"{model.name}'s MLP and vocabulary sizes are unknown (give its config.json)"
    if model.attention == "mla":
        shape = (model.hidden_size, model.num_attention_heads, model.kv_lora_rank, model.qk_rope_head_dim)
        if shape != MLA_SHAPE:
            return (
                f"its multi-head latent attention (hidden, heads, kv_lora_rank, qk_rope_head_dim = {shape}) is not "
                f"DeepSeek-V3's {MLA_SHAPE}, the one shape the MLA tables measure"
            )
    kinds = {model.layer_type(i) for i in range(model.num_layers)}
    if "linear_attention" in kinds:
        return "linear-attention (Gated DeltaNet) layers are not composed from the tables yet"
    return ""


def compose_profile(
    model,
    gpu: str,
    tensor_parallel_size: int,
    kv_cache_dtype: str = "bf16",
    expert_parallel_size: int = 1,
    data_parallel_size: int = 1,
):
    """The OperatorProfile of model on gpu at tensor_parallel_size (and, for an MoE, expert_parallel_size GPUs of
    expert parallelism over data_parallel_size ranks) composed from the GPU's operator tables (the module's docstring
    says how), and its provenance in words; None and why where the tables cannot time it."""
    from kvlab.core import profiles

    tables = operator_tables(gpu)
    if tables is None:
        return None, f"data/operators has no operator tables of the {gpu}"
    why = composable(model)
    if why:
        return None, why
    quantization = model.quantization
    intermediate, vocab, experts, top_k, expert_intermediate = model.layer_sizes
    t = tensor_parallel_size
    heads, kv_heads, head_dim, hidden = model.num_attention_heads, model.num_kv_heads, model.head_dim, model.hidden_size
    if heads % t:
        return None, f"{heads} attention heads do not split over {t} GPUs"
    gemm_dtype = GEMM_DTYPE[quantization]
    gemm, lm_head = tables.gemm(gemm_dtype), tables.gemm("bf16")
    if gemm is None or lm_head is None:
        return None, f"the {gpu}'s table has no {gemm_dtype} GEMMs"
    notes = []
    q_heads, kv_per_gpu = heads // t, max(1, kv_heads // t)
    tokens = gemm.m
    mla = model.attention == "mla"  # its projections are in the MLA module the attention term reads
    dense = (
        {}
        if mla
        else {
            "qkv_proj": gemm.at((q_heads + 2 * kv_per_gpu) * head_dim, hidden),
            "o_proj": gemm.at(hidden, q_heads * head_dim),
        }
    )
    bandwidth = get_gpu(gpu).memory_bandwidth_gb_s
    norm = small_op_us("layernorm", tokens, hidden / 4096, bandwidth)
    dense["layernorm"] = norm
    dense["final_layernorm"] = small_op_us("final_layernorm", tokens, hidden / 4096, bandwidth)
    dense["embedding"] = small_op_us("embedding", tokens, hidden / 4096, bandwidth)
    if not mla:
        dense["rotary_emb"] = small_op_us(
            "rotary_emb", tokens, (q_heads + kv_per_gpu) * head_dim / (40 * 128), bandwidth
        )
    if "qwen3" in model.name.lower():
        dense["qk_norm"] = small_op_us(
            "qk_norm", tokens, q_heads * head_dim / (64 * 128), bandwidth, REFERENCE_QK_NORM_MODEL
        )
    moe = None
    if experts:
        moe_table = tables.moe(MOE_DTYPE[quantization])
        shape = (hidden, expert_intermediate, top_k, experts)
        if expert_parallel_size > 1:
            # vLLM's expert parallelism over DP x TP GPUs: each holds E / EP whole experts and runs them on the
            # tokens of every data-parallel rank (its all-gather), the table's tokens on one GPU; read by this
            # rank's tokens, the table's / DP
            key = (*shape, 1, expert_parallel_size)
            if moe_table is None or key not in moe_table.shapes:
                return None, (
                    f"the {gpu}'s MoE table has no block of hidden {hidden}, expert MLP {expert_intermediate}, "
                    f"{experts} experts, top-{top_k} over {expert_parallel_size} GPUs of expert parallelism in "
                    f"{MOE_DTYPE[quantization]}"
                )
            moe_tokens, moe_us = moe_table.shapes[key]
            keep = moe_tokens >= data_parallel_size  # a rank's tokens from 1
            moe_tokens, moe_us = moe_tokens[keep] / data_parallel_size, moe_us[keep]
        else:
            measured_tp = sorted(k[4] for k in (moe_table.shapes if moe_table else {}) if k[:4] == shape and k[5] == 1)
            below = [m for m in measured_tp if m <= t]
            if not below:
                return None, (
                    f"the {gpu}'s MoE table has no block of hidden {hidden}, expert MLP {expert_intermediate}, "
                    f"{experts} experts, top-{top_k} at TP {t} or less in {MOE_DTYPE[quantization]}"
                )
            moe_tokens, moe_us = moe_table.shapes[(*shape, below[-1], 1)]
            if below[-1] != t:  # each GPU's share of every expert shrinks as 1 / TP: its bytes and FLOPs alike
                moe_us = moe_us * below[-1] / t
                notes.append(f"the MoE block at TP {t} read from TP {below[-1]}'s, x {below[-1]}/{t}")
        router = lm_head.us_at(moe_tokens, experts, hidden)
        block = moe_us + router
        moe = (moe_tokens, np.array([1.0, float(experts)]), np.stack([block, block], axis=1))
    else:
        if intermediate % t:
            return None, f"an MLP of {intermediate} does not split over {t} GPUs"
        gates = 2 if model.gated_mlp else 1  # gate and up (Llama, Qwen), or up alone (GPT-NeoX)
        dense["gate_up_proj"] = gemm.at(gates * intermediate // t, hidden)
        dense["down_proj"] = gemm.at(hidden, intermediate // t)
        dense["act_fn"] = small_op_us("act_fn", tokens, intermediate / t / 14336, bandwidth)
    sequences = np.array(SEQUENCES, dtype=np.float64)
    per_sequence = {
        "lm_head": lm_head.us_at(sequences, -(-vocab // t), hidden),
        "sampler": small_op_us("sampler", sequences, vocab / 128256, bandwidth),
    }
    if mla:
        attention, attention_words = _mla_grid(tables, model, q_heads, _kv_dtype(kv_cache_dtype), gemm_dtype)
    else:
        attention, attention_words = _attention_grid(tables, model, q_heads, kv_per_gpu, _kv_dtype(kv_cache_dtype))
    if attention is None:
        return None, attention_words
    if attention_words:
        notes.append(attention_words)
    entry = profiles.ProfileEntry(
        "aiconfigurator",
        gpu,
        tables.system,
        model.name,
        gemm_dtype,
        t,
        str(tables.folder.relative_to(profiles.PROFILES_DIR.parent)),
        hidden,
        intermediate,
        vocab,
        experts,
        top_k,
        expert_intermediate,
        heads,
        kv_heads,
        head_dim,
        1,
        tables.version("gemm"),
    )
    profile = profiles.OperatorProfile(entry, (tokens, dense), (sequences, per_sequence), attention, moe)
    words = (
        f"composed from the {gpu}'s operator tables (AIConfigurator, vLLM {tables.version('gemm')}): GEMMs "
        f"({tables.kernel('gemm', gemm_dtype)}, {gemm_dtype}), attention ({tables.kernel('generation_attention', _kv_dtype(kv_cache_dtype))}, "
        f"{_kv_dtype(kv_cache_dtype)} KV)"
        + (f", MoE ({tables.kernel('moe', MOE_DTYPE[quantization])}, {MOE_DISTRIBUTION} routing)" if experts else "")
        + "; small operators and the sampler from LLMServingSim's RTX PRO 6000 measurements of vLLM's layers at the same bytes"
        + "".join(f"; {n}" for n in notes)
    )
    return profile, words


def _grid_axes():
    """The attention grid's axes and the meshes of its two planes: (axes, chunk, history, decodes, decode history)."""
    axes = tuple(np.array(a, dtype=np.float64) for a in (PREFILL_CHUNKS, HISTORIES, DECODES, HISTORIES))
    chunk, history = np.meshgrid(axes[0], axes[1], indexing="ij")
    decodes, decode_history = np.meshgrid(axes[2], axes[3], indexing="ij")
    return axes, chunk, history, decodes, decode_history


def _mla_grid(tables: OperatorTables, model, q_heads: int, kv_dtype: str, gemm_dtype: str):
    """The MLA module of one layer (projections and attention) on the attention grid: a prefill chunk from the
    context table at batch 1 as the prompt of the same query-key pairs, decodes from the generation table; (None,
    why) where the GPU's tables lack them."""
    context, generation = tables.mla("context", kv_dtype, gemm_dtype), tables.mla("generation", kv_dtype, gemm_dtype)
    if context is None or generation is None:
        return None, f"the {tables.gpu}'s MLA tables have no {kv_dtype} KV cache with {gemm_dtype} projections"
    shape = (q_heads, 1, MLA_HEAD_DIM)
    if shape not in context.shapes or shape not in generation.shapes:
        return None, f"the {tables.gpu}'s MLA tables have no module of {q_heads} heads on a GPU"
    axes, chunk, history, decodes, decode_history = _grid_axes()
    parts = [(1.0, shape)]
    prompt = equal_pairs_prompt(prefill_pairs(chunk, history))
    longest = context.shapes[shape][1][-1]
    p = context.us_at(parts, np.ones_like(prompt), np.maximum(prompt, 1.0))
    p = np.where(prompt > longest, context.us_at(parts, 1.0, longest) * (prompt / longest) ** 2, p)
    d = generation.us_at(parts, np.maximum(decodes, 1.0), decode_history)
    grid = np.where(chunk > 0, p, 0.0)[:, :, None, None] + np.where(decodes > 0, d, 0.0)[None, None, :, :]
    return (axes, grid), (
        f"MLA: the whole attention module of DeepSeek-V3's shape ({tables.kernel('generation_mla', f'{kv_dtype}_{gemm_dtype}')}), "
        "its projections included, read for the prefill and the decodes apart; the first dense layers and the "
        "shared expert are left out"
    )


# Attention kernels that run a mixed batch as one varlen launch without packing GQA heads (FlashAttention 2)
UNPACKED_MIXED_KERNELS = ("vllm_flash_attn", "vllm_flash_attn_fa2")


@lru_cache(maxsize=1)
def mixed_decode_share() -> tuple[tuple[np.ndarray, ...], np.ndarray, int]:
    """How much of FlashAttention 2's un-packed GQA re-reading shows in a mixed batch, where LLMServingSim measured
    vLLM's attention on the reference GPU (RTX PRO 6000): at each (prefill chunk, decodes, decode history) of its
    grids with no prefill history, ((mixed - prefill alone) / decodes alone - 1) / (g - 1) for each profile of a model
    with g > 1 query heads per KV head, the median over the profiles. ((chunk, decodes, history) axes, share grid,
    profiles read)."""
    from kvlab.core import profiles

    shares, axes = [], None
    for entry in profiles.load_index():
        if entry.gpu != REFERENCE_GPU or entry.num_kv_heads in (0, entry.num_attention_heads):
            continue
        profile = profiles.load_profile(entry)
        if profile.attention is None:
            continue
        (chunk, history, decodes, decode_history), grid = profile.attention
        at = grid[:, 0, :, :]  # no prefill history
        mixed, prefill, decode = at[1:, 1:, 1:], at[1:, :1, :1], at[:1, 1:, 1:]
        g = entry.num_attention_heads / entry.num_kv_heads
        shares.append(((mixed - prefill) / decode - 1.0) / (g - 1.0))
        found = (chunk[1:], decodes[1:], decode_history[1:])
        if axes is not None and any(not np.array_equal(a, b) for a, b in zip(axes, found)):
            raise ValueError(f"{entry.label}: attention axes differ from the other reference profiles'")
        axes = found
    return axes, np.median(np.array(shares), axis=0), len(shares)


def _mixed_share_at(chunk, decodes, decode_history) -> np.ndarray:
    """mixed_decode_share read at these points: linear in log2 of each axis between its measured points, the nearest
    measured point past them."""
    from scipy.interpolate import RegularGridInterpolator

    axes, share, _ = mixed_decode_share()
    logs = tuple(np.log2(a) for a in axes)
    points = [np.clip(np.log2(np.maximum(x, 1.0)), a[0], a[-1]) for x, a in zip((chunk, decodes, decode_history), logs)]
    return RegularGridInterpolator(logs, share)(np.stack(np.broadcast_arrays(*points), axis=-1))


def _attention_grid(tables: OperatorTables, model, q_heads: int, kv_heads: int, kv_dtype: str):
    """(axes, one layer's attention on them (us): the mean of the model's layers), words; (None, why) where the
    tables lack the KV dtype."""
    context, generation = tables.attention("context", kv_dtype), tables.attention("generation", kv_dtype)
    if context is None or generation is None:
        return None, f"the {tables.gpu}'s attention tables have no {kv_dtype} KV cache"
    head_dim = model.head_dim
    prefill_parts, prefill_words = context.shape_for(q_heads, kv_heads, head_dim, "context")
    decode_parts, decode_words = generation.shape_for(q_heads, kv_heads, head_dim, "generation")
    axes, chunk, history, decodes, decode_history = _grid_axes()
    windows: dict[int, int] = {}
    for layer in range(model.num_layers):
        kind = model.layer_type(layer)
        window = model.sliding_window if kind == "sliding_attention" else 0
        window = model.attention_chunk_size if kind == "chunked_attention" else window
        windows[window] = windows.get(window, 0) + 1
    prefill, decode = 0.0, 0.0
    for window, count in windows.items():
        prompt = equal_pairs_prompt(prefill_pairs(chunk, history, window))
        p = context.us_at(prefill_parts, np.ones_like(prompt), np.maximum(prompt, 1.0))
        # past the longest measured prompt the causal FLOPs grow as its square
        longest = max(context.shapes[s][1][-1] for _, s in prefill_parts)
        at_longest = context.us_at(prefill_parts, 1.0, longest)
        p = np.where(prompt > longest, at_longest * (prompt / longest) ** 2, p)
        p = p / chunk_ratio(chunk, history)  # a chunk after history against the fresh prompt of its pairs
        kept = np.minimum(decode_history, window) if window else decode_history
        d = generation.us_at(decode_parts, np.maximum(decodes, 1.0), kept)
        prefill = prefill + count * np.where(chunk > 0, p, 0.0)
        decode = decode + count * np.where(decodes > 0, d, 0.0)
    prefill, decode = prefill / model.num_layers, decode / model.num_layers
    grid = prefill[:, :, None, None] + decode[None, None, :, :]
    words = "; ".join(w for w in (prefill_words, decode_words) if w)
    g = q_heads / kv_heads
    if tables.kernel("context_attention", kv_dtype) in UNPACKED_MIXED_KERNELS and g > 1:
        c, n, h = np.meshgrid(axes[0], axes[2], axes[3], indexing="ij")
        factor = 1.0 + (g - 1.0) * _mixed_share_at(c, n, h)  # (chunk, decodes, history)
        mixed = decode[None, None, :, :] * (factor[:, None, :, :] - 1.0)
        grid = grid + np.where((axes[0] > 0)[:, None, None, None] & (axes[2] > 0)[None, None, :, None], mixed, 0.0)
        _, _, read = mixed_decode_share()
        words += ("; " if words else "") + (
            f"a mixed batch's decodes x (1 + ({g:g} - 1) x the share of FlashAttention 2's un-packed GQA re-reading "
            f"that LLMServingSim measured in vLLM's mixed batches on the {REFERENCE_GPU}, median of {read} profiles; "
            "the nearest measured point past them)"
        )
    if len(windows) > 1 or 0 not in windows:
        words += ("; " if words else "") + "windowed layers read at the keys their window keeps"
    return (axes, grid), words


__all__ = [
    "AttentionTable",
    "compose_profile",
    "composable",
    "GemmTable",
    "MoeTable",
    "OPERATORS_DIR",
    "OperatorTables",
    "equal_pairs_prompt",
    "interp_linear",
    "operator_gpus",
    "operator_systems",
    "operator_tables",
    "prefill_pairs",
    "small_op_us",
]
