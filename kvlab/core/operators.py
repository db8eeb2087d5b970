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
  time grows as n x k), past the table's largest n, k or m in proportion (a GEMM's bytes and FLOPs grow as each),
  below its smallest the smallest's (a launch's floor);
- the small operators no table holds (RMSNorm with the residual, rotary, SiLU-and-mul, Qwen3's q/k norm, the
  embedding): LLMServingSim's measurements of vLLM's own layers on the RTX PRO 6000 (data/profiles/llmservingsim/)
  read at the same bytes: the time of the reference model's operator at tokens x (this model's bytes a token / the
  reference's) x (the reference GPU's datasheet bandwidth / this GPU's), so a launch's floor stays a floor
  (below the fewest bytes measured, the fewest's time; past the most, in proportion);
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
  FlashAttention 2, g the model's query heads per KV head; where it is negative, the decodes cheaper merged than
  alone, a launch saved rather than re-reading, it is taken as 0). FlashAttention 3 (Hopper) packs GQA heads in every
  varlen launch and FlashInfer (data-center Blackwell, an fp8 KV cache) runs prefills and decodes as two launches:
  the sum stands there (kvlab's H200 measurements put both kernels in one graph at -5% to +14% of it). Head shapes the
  table did not measure: linear in KV heads (decode) from the two nearest at the same heads and head dim, the
  nearest measured heads, scaled by head dim (decode: the bytes) or heads x head dim (prefill: the FLOPs);
  batches past the largest measured at a length, linear in the batch; prompts past the largest, as the square;
- MoE: the table's block at (tokens, the model's hidden, expert MLP, experts, top-k, TP) under balanced routing,
  plus the router's GEMM and any shared experts' MLP (two GEMMs; beside the routed experts on a second stream up
  to vLLM's 256 tokens, after them past it); an MoE's leading dense layers (DeepSeek's first
  three) take a dense MLP's GEMMs in place of the block, averaged over the layers; a block the table did not
  measure is read from its nearest measured block by the ratio of the two blocks' rooflines (or, on a GPU that
  measures none, as the GEMMs of the active experts' bytes and FLOPs), its error against the table said.
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

from kvlab.core.models import DATA_DIR, MXFP4_BYTES_PER_WEIGHT, get_gpu

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
# vLLM 0.33's VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD default: up to this many tokens a step's shared experts run
# on an auxiliary CUDA stream beside the routed experts (vllm/model_executor/layers/fused_moe/runner/shared_experts.py)
SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD = 256
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


def extend(x, xs, ys) -> np.ndarray:
    """ys over xs read at x: linear between measured points, the first's value below them (a launch's floor), and
    past the last in proportion to x (x / xs[-1] times the last: a kernel whose bytes and FLOPs grow with x)."""
    x, xs, ys = np.asarray(x, dtype=np.float64), np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    return np.interp(x, xs, ys) * np.maximum(1.0, x / xs[-1])


def _fill_along(values: np.ndarray, axis_values: np.ndarray, axis: int, fill=None) -> np.ndarray:
    """values with each NaN filled along one axis from the measured points of its line, by fill(x, xs, ys)
    (interp_linear: linear, extrapolated from the two end points, unless given); a line with fewer than two
    measured points is left as it is."""
    fill = interp_linear if fill is None else fill
    moved = np.moveaxis(values.copy(), axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    for row in flat:
        known = ~np.isnan(row)
        if known.sum() >= 2 and not known.all():
            row[~known] = fill(axis_values[~known], axis_values[known], row[known])
    return np.moveaxis(flat.reshape(moved.shape), -1, axis)


@dataclass(frozen=True)
class GemmTable:
    """One weight dtype's GEMMs on a dense (m, n, k) grid (us); unmeasured cells filled along m, then k, then n
    (extend: linear between measured points, in proportion past the last)."""

    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    us: np.ndarray  # [m, n, k]

    @classmethod
    def from_columns(cls, m, n, k, us) -> GemmTable:
        axes = [np.unique(a) for a in (m, n, k)]
        grid = np.full(tuple(len(a) for a in axes), np.nan)
        grid[tuple(np.searchsorted(a, v) for a, v in zip(axes, (m, n, k)))] = us
        for axis in (0, 2, 1):
            grid = _fill_along(grid, axes[axis].astype(np.float64), axis, extend)
        return cls(*(a.astype(np.float64) for a in axes), grid)

    def at(self, n: int, k: int) -> np.ndarray:
        """The GEMM of (m, n, k) at every measured m (us): bilinear in (n, k) between measured points, the smallest
        measured below them, and past the largest n or k in proportion (the time at the largest x n / largest: a
        GEMM's weight bytes and FLOPs grow as n and as k)."""
        i, u = _extrapolating(min(max(n, self.n[0]), self.n[-1]), self.n)
        j, v = _extrapolating(min(max(k, self.k[0]), self.k[-1]), self.k)
        g = self.us
        inside = (
            (1 - u) * (1 - v) * g[:, i, j]
            + u * (1 - v) * g[:, i + 1, j]
            + (1 - u) * v * g[:, i, j + 1]
            + u * v * g[:, i + 1, j + 1]
        )
        return inside * max(1.0, n / self.n[-1]) * max(1.0, k / self.k[-1])

    def us_at(self, m, n: int, k: int) -> np.ndarray:
        """The GEMM of (m, n, k) (us) at any m: piecewise linear between measured m, in proportion past the last."""
        return extend(m, self.m, self.at(n, k))

    def past(self, name: str, n: int, k: int) -> str:
        """Words for a GEMM whose n or k lies past the table's largest ("" where none does)."""
        over = [
            f"{axis} {x:,} past the largest measured {top:,.0f}"
            for axis, x, top in (("n", n, self.n[-1]), ("k", k, self.k[-1]))
            if x > top
        ]
        return f"{name} ({', '.join(over)}: in proportion)" if over else ""


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
    """The fused MoE block's measured shapes: (hidden, expert MLP, top-k, experts, moe TP, moe EP) -> (tokens, us);
    a shape measured at fewer than two token counts is left out (nothing to read between)."""

    shapes: dict

    @classmethod
    def from_columns(cls, distribution, hidden, inter, topk, experts, tp, ep, tokens, us) -> MoeTable:
        shapes = {}
        rows_of = np.asarray(distribution) == MOE_DISTRIBUTION
        keys = np.stack([hidden, inter, topk, experts, tp, ep], axis=1)[rows_of]
        for key in np.unique(keys, axis=0):
            rows = np.flatnonzero(rows_of)[np.all(keys == key, axis=1)]
            order = np.argsort(tokens[rows])
            if len(rows) >= 2:
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
    bytes on the reference GPU (count x bytes_ratio), read faster or slower by the datasheet bandwidths; below the
    fewest it measured, the fewest's (a launch's floor), past the most, in proportion to the bytes."""
    axis, us = _reference_ops(model)[op]
    reference_gb_s = get_gpu(REFERENCE_GPU).memory_bandwidth_gb_s
    return extend(np.asarray(count, dtype=np.float64) * bytes_ratio * reference_gb_s / gpu_bandwidth_gb_s, axis, us)


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
        (f"the {operator_tables(gpu).system} operator tables' bf16 GEMM of {FRACTIONS_GEMM:,} x {FRACTIONS_GEMM:,}",),
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
        latent = (model.kv_lora_rank, model.qk_rope_head_dim)
        if latent != MLA_SHAPE[2:]:
            return (
                f"its multi-head latent attention (kv_lora_rank, qk_rope_head_dim = {latent}) is not DeepSeek-V3's "
                f"{MLA_SHAPE[2:]}, the one latent the MLA tables measure"
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

    def linear(table: GemmTable, name: str, n: int, k: int, m=None) -> np.ndarray:
        """table's GEMM of (m, n, k) at the table's m (or at m), its extrapolation noted."""
        notes.append(table.past(name, n, k))
        return table.at(n, k) if m is None else table.us_at(m, n, k)

    q_heads, kv_per_gpu = heads // t, max(1, kv_heads // t)
    tokens = gemm.m
    mla = model.attention == "mla"  # its projections are in the MLA module the attention term reads
    dense = (
        {}
        if mla
        else {
            "qkv_proj": linear(gemm, "qkv_proj", (q_heads + 2 * kv_per_gpu) * head_dim, hidden),
            "o_proj": linear(gemm, "o_proj", hidden, q_heads * head_dim),
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
        shape = (hidden, expert_intermediate, top_k, experts)
        moe_tokens, moe_us, moe_words = _moe_block(
            tables, quantization, shape, t, expert_parallel_size, data_parallel_size
        )
        notes.append(moe_words)
        router = linear(lm_head, "the router", experts, hidden, moe_tokens)
        shared = model.shared_expert_intermediate_size
        if shared:  # a dense MLP beside the routed experts, on every token (split over TP like one)
            shared_us = _mlp_us(linear, gemm, "the shared experts", shared, hidden, t, moe_tokens)
            # vLLM 0.33 runs them on a second CUDA stream beside the routed experts up to a threshold of tokens
            # (SharedExperts._determine_shared_experts_order): the longer of the two there, their sum past it
            overlapped = moe_tokens <= SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD
            moe_us = np.where(overlapped, np.maximum(moe_us, shared_us), moe_us + shared_us)
            notes.append(
                f"the shared experts (MLP {shared:,}) as two GEMMs, overlapping the routed experts on a second stream "
                f"up to {SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD} tokens (vLLM's threshold) and after them past it"
            )
        block = moe_us + router
        first = model.first_k_dense_replace
        if first:  # the leading dense layers run a dense MLP in place of the MoE block: the mean over the layers
            dense_mlp = _mlp_us(linear, gemm, "the dense layers", model.dense_intermediate_size, hidden, t, moe_tokens)
            block = (block * (model.num_layers - first) + dense_mlp * first) / model.num_layers
            notes.append(
                f"the first {first} of {model.num_layers} layers' dense MLP ({model.dense_intermediate_size:,}) in place "
                "of the MoE block, by their share of the layers"
            )
        moe = (moe_tokens, np.array([1.0, float(experts)]), np.stack([block, block], axis=1))
    else:
        if intermediate % t:
            return None, f"an MLP of {intermediate} does not split over {t} GPUs"
        gates = 2 if model.gated_mlp else 1  # gate and up (Llama, Qwen), or up alone (GPT-NeoX)
        dense["gate_up_proj"] = linear(gemm, "gate_up_proj", gates * intermediate // t, hidden)
        dense["down_proj"] = linear(gemm, "down_proj", hidden, intermediate // t)
        dense["act_fn"] = small_op_us("act_fn", tokens, intermediate / t / 14336, bandwidth)
    sequences = np.array(SEQUENCES, dtype=np.float64)
    per_sequence = {
        "lm_head": linear(lm_head, "lm_head", -(-vocab // t), hidden, sequences),
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
        + "".join(f"; {n}" for n in notes if n)
    )
    return profile, words


def _mlp_us(linear, gemm: GemmTable, name: str, intermediate: int, hidden: int, tp: int, tokens) -> np.ndarray:
    """A gated MLP of width intermediate split over tp GPUs at tokens (us): gate-and-up and down GEMMs."""
    up = linear(gemm, f"{name}' gate_up_proj", 2 * intermediate // tp, hidden, tokens)
    return up + linear(gemm, f"{name}' down_proj", hidden, intermediate // tp, tokens)


def _moe_block(tables: OperatorTables, quantization: str, shape: tuple, tp: int, ep: int, dp: int):
    """(a rank's tokens, the MoE block's us at them, words: "" where measured) of shape (hidden, expert MLP, top-k,
    experts) at TP tp, or under expert parallelism over ep GPUs of dp data-parallel ranks: the MoE table's block where
    it measured it, else moe_from_gemms, named."""
    dtype = MOE_DTYPE[quantization]
    moe_table = tables.moe(dtype)
    measured = moe_table.shapes if moe_table else {}
    if ep > 1:
        # vLLM's expert parallelism over DP x TP GPUs: each holds E / EP whole experts and runs them on the tokens of
        # every data-parallel rank (its all-gather), the table's tokens on one GPU; read by this rank's tokens, the
        # table's / DP
        if (*shape, 1, ep) in measured:
            moe_tokens, moe_us = measured[(*shape, 1, ep)]
            keep = moe_tokens >= dp  # a rank's tokens from 1
            return moe_tokens[keep] / dp, moe_us[keep], ""
    else:
        below = [k[4] for k in sorted(measured) if k[:4] == shape and k[5] == 1 and k[4] <= tp]
        if below:
            moe_tokens, moe_us = measured[(*shape, below[-1], 1)]
            if below[-1] == tp:
                return moe_tokens, moe_us, ""
            # each GPU's share of every expert shrinks as 1 / TP: its bytes and FLOPs alike
            return (
                moe_tokens,
                moe_us * below[-1] / tp,
                f"the MoE block at TP {tp} read from TP {below[-1]}'s, x {below[-1]}/{tp}",
            )
    where = f"{tp} GPUs of TP" if ep == 1 else f"{ep} GPUs of expert parallelism"
    what = (
        f"the MoE block (hidden {shape[0]}, expert MLP {shape[1]}, top-{shape[2]} of {shape[3]} experts over {where}) "
        f"is not in the {tables.gpu}'s {dtype} MoE table: "
    )
    if measured:
        near = nearest_moe_block(measured, shape, tp, ep)
        tokens, us = measured[near]
        us = us * moe_roofline_ratio(shape, tp, ep, near, tokens, quantization, tables.gpu)
        low, high, median, compared = moe_fallback_error(tables.gpu, quantization)
        if ep > 1:
            keep = tokens >= dp
            tokens, us = tokens[keep] / dp, us[keep]
        return (
            tokens,
            us,
            (
                f"{what}the nearest measured block ({near[0]}, {near[1]}, top-{near[2]} of {near[3]}, TP {near[4]}, EP "
                f"{near[5]}) x the two blocks' roofline ratio; each block the table measured, read this way "
                f"from its nearest other shape, is off by {100 * low:+.0f}% to {100 * high:+.0f}% (median "
                f"{100 * median:.0f}%, {compared} shapes)"
            ),
        )
    gemm_dtype = GEMM_DTYPE[quantization]
    tokens = tables.gemm(gemm_dtype).m
    us = moe_from_gemms(tables.gemm(gemm_dtype), shape, tp, ep, dp, tokens)
    low, high, median, compared = moe_gemm_rule_error(quantization)
    return (
        tokens,
        us,
        (
            f"{what}it measures no {dtype} block, so the active experts run as two {gemm_dtype} GEMMs of the same bytes and "
            f"FLOPs; on the GPUs whose tables measure {dtype} blocks at TP 1 this rule is off them by "
            f"{100 * low:+.0f}% to {100 * high:+.0f}% (median {100 * median:.0f}%, {compared} blocks)"
        ),
    )


def _moe_active(shape: tuple, tp: int, ep: int, tokens) -> tuple[np.ndarray, np.ndarray]:
    """(expert slots, active experts) on one GPU of a block of shape (hidden, expert MLP, top-k, experts) holding
    experts / ep of them, at tokens routed to its group (balanced routing: a = min(experts / ep, slots))."""
    slots = np.asarray(tokens, dtype=np.float64) * shape[2] / ep
    return slots, np.minimum(shape[3] / ep, slots)


def moe_roofline_ratio(shape: tuple, tp: int, ep: int, near: tuple, tokens, quantization: str, gpu: str) -> np.ndarray:
    """At each count of tokens routed to the group, the roofline time of block shape at (tp, ep) over that of the
    measured block near (its key: shape, TP, EP) on gpu: each max(active experts' gate, up and down weights /
    datasheet bandwidth, 2 x their FLOPs / datasheet dense bf16 FLOP/s, twice that for fp8 weights)."""
    spec = get_gpu(gpu)
    flops = spec.bf16_dense_tflops * 1e12 * (2.0 if quantization.startswith("fp8") else 1.0)

    def roofline(s, t, e):
        slots, active = _moe_active(s, t, e, tokens)
        weights = 3.0 * s[0] * s[1] / t
        read = active * weights * WEIGHT_BYTES_MOE[quantization] / (spec.memory_bandwidth_gb_s * 1e9)
        return np.maximum(read, 2.0 * slots * weights / flops)

    return roofline(shape, tp, ep) / roofline(near[:4], near[4], near[5])


# Bytes a weight of an expert, by ModelSpec.quantization (mxfp4: 4 bits and one 8-bit scale a block of 32 weights)
WEIGHT_BYTES_MOE = {"": 2.0, "fp8": 1.0, "fp8_block": 1.0, "mxfp4": MXFP4_BYTES_PER_WEIGHT}


def nearest_moe_block(measured: dict, shape: tuple, tp: int, ep: int) -> tuple:
    """The measured block key nearest (shape, tp, ep): the least sum of |log| ratios of hidden, expert MLP, top-k,
    experts, TP and EP, another shape than its own."""
    want = (*shape, tp, ep)
    others = [k for k in measured if k[:4] != shape]
    return min(others or measured, key=lambda k: (sum(abs(math.log(a / b)) for a, b in zip(k, want)), k))


@lru_cache(maxsize=32)
def moe_fallback_error(gpu: str, quantization: str) -> tuple[float, float, float, int]:
    """How far the nearest-block rule is off the GPU's own MoE table: each block it measured (each shape at each TP
    and EP) read from its nearest other shape (nearest_moe_block, moe_roofline_ratio) at its measured tokens,
    fallback / measured - 1: (lowest, highest, median of |error|, blocks compared); zeros where none."""
    table = operator_tables(gpu).moe(MOE_DTYPE[quantization])
    errors, compared = [], 0
    for key, (tokens, us) in sorted(table.shapes.items() if table else ()):
        near = nearest_moe_block(table.shapes, key[:4], *key[4:])
        near_tokens, near_us = table.shapes[near]
        ratio = moe_roofline_ratio(key[:4], *key[4:], near, tokens, quantization, gpu)
        guess = extend(tokens, near_tokens, near_us) * ratio
        errors.extend(guess / us - 1.0)
        compared += 1
    if not compared:
        return 0.0, 0.0, 0.0, 0
    return float(min(errors)), float(max(errors)), float(np.median(np.abs(errors))), compared


def moe_from_gemms(gemm: GemmTable, shape: tuple, tp: int, ep: int, dp: int, tokens) -> np.ndarray:
    """The MoE block's time (us) at each of a rank's tokens on a GPU whose tables measure no MoE block: under balanced
    routing a GPU holding E / ep experts (each of expert MLP I / tp) gets A = tokens x dp x top-k / ep of the tokens'
    expert slots, spread over a = min(E / ep, A) active experts of m = A / a tokens each; their gate-and-up and down
    projections read from the GEMM table as the two GEMMs of the same weight bytes and FLOPs, (m, a x 2I / tp, hidden)
    and (m, a x hidden, I / tp), a grouped GEMM's work in one launch."""
    hidden, inter = shape[0], shape[1]
    slots, active = _moe_active(shape, tp, ep, np.asarray(tokens, dtype=np.float64) * dp)
    return np.array(
        [
            gemm.us_at(m, int(a * 2 * inter / tp), hidden)[()] + gemm.us_at(m, int(a * hidden), inter // tp)[()]
            for m, a in zip(slots / active, active)
        ]
    )


@lru_cache(maxsize=8)
def moe_gemm_rule_error(quantization: str) -> tuple[float, float, float, int]:
    """How far moe_from_gemms is off the MoE blocks measured at TP 1 without expert parallelism on every GPU whose
    tables hold them in quantization's dtype: (lowest, highest, median of |error|, blocks compared)."""
    errors, compared = [], 0
    for gpu in operator_gpus():
        tables = operator_tables(gpu)
        table, gemm = tables.moe(MOE_DTYPE[quantization]), tables.gemm(GEMM_DTYPE[quantization])
        for key, (tokens, us) in sorted(table.shapes.items() if table and gemm else ()):
            if key[4:] == (1, 1):
                errors.extend(moe_from_gemms(gemm, key[:4], 1, 1, 1, tokens) / us - 1.0)
                compared += 1
    if not compared:
        return 0.0, 0.0, 0.0, 0
    return float(min(errors)), float(max(errors)), float(np.median(np.abs(errors))), compared


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
    words = (
        f"MLA: the whole attention module of DeepSeek-V3's shape ({tables.kernel('generation_mla', f'{kv_dtype}_{gemm_dtype}')}), "
        "its projections included, read for the prefill and the decodes apart"
    )
    if model.hidden_size != MLA_SHAPE[0]:
        bound = "an upper" if model.hidden_size < MLA_SHAPE[0] else "a lower"
        words += (
            f"; read at the same {q_heads} heads a GPU and latent: its projections are DeepSeek-V3's, of hidden "
            f"{MLA_SHAPE[0]:,} against this model's {model.hidden_size:,} ({bound} bound on them)"
        )
    return (axes, grid), words


# Attention kernels that run a mixed batch as one varlen launch without packing GQA heads (FlashAttention 2)
UNPACKED_MIXED_KERNELS = ("vllm_flash_attn", "vllm_flash_attn_fa2")


@lru_cache(maxsize=1)
def mixed_decode_share() -> tuple[tuple[np.ndarray, ...], np.ndarray, int]:
    """How much of FlashAttention 2's re-reading of the KV cache per query head (GQA heads not packed) shows in a
    mixed batch, where LLMServingSim measured vLLM's attention on the reference GPU (RTX PRO 6000): at each (prefill
    chunk, decodes, decode history) of its grids with no prefill history, ((mixed - prefill alone) / decodes alone
    - 1) / (g - 1) for each profile of a model with g > 1 query heads per KV head, the median over the profiles. ((chunk, decodes, history) axes, share grid,
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
        # a negative share (the decodes cheaper in the mixed launch than alone: a launch saved, not re-reading) is
        # taken as none, the sum of the parts, so that it is not multiplied by g - 1
        factor = 1.0 + (g - 1.0) * np.maximum(_mixed_share_at(c, n, h), 0.0)  # (chunk, decodes, history)
        mixed = decode[None, None, :, :] * (factor[:, None, :, :] - 1.0)
        grid = grid + np.where((axes[0] > 0)[:, None, None, None] & (axes[2] > 0)[None, None, :, None], mixed, 0.0)
        _, _, read = mixed_decode_share()
        words += ("; " if words else "") + (
            f"a mixed batch's decodes x (1 + ({g:g} - 1) x the share of the KV cache FlashAttention 2 reads again "
            "for each query head of a group (its GQA heads not packed into one read) that LLMServingSim measured "
            f"in vLLM's mixed batches on the {REFERENCE_GPU}, median of {read} profiles; "
            "the nearest measured point past them; a negative share taken as 0)"
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
