"""Public operator-level GPU measurements (data/profiles/): what MeasuredStepCost (kvlab.core.cost) is made of.

data/profiles/index.csv lists each profile: the GPU (kvlab's name, data/gpus.csv), the model (its Hugging Face
name), the dtype, the tensor parallel size and the folder of its CSVs, with the layer shapes its operators were
measured at (ProfileEntry.layer_shape: a model of the same shapes is timed by it). A folder holds some of:

- dense.csv (layer, tokens, time_us): one call of each operator that scales with the step's batched tokens
  (projections, norms, rotary embedding, activation, embedding), per token count;
- per_sequence.csv (layer, sequences, time_us): lm_head (LogitsProcessor) and the sampler, per sequence count;
- attention.csv (prefill_chunk, kv_prefill, n_decode, kv_decode, time_us): one layer's attention for a batch
  of at most one prefill chunk (prefill_chunk new tokens after kv_prefill computed ones) and n_decode decodes
  of kv_decode computed tokens each;
- moe.csv (tokens, activated_experts, time_us): one layer's MoE block with that many experts active;
- skew_fit.csv (prefill_chunk, n_decode, skew_rate, kv_big, kv_prefill, alpha) and skew_fit.json (the bins of
  each bucket axis, the pooled alpha_default, the fit's errors): LLMServingSim's fit of what decodes of unequal
  history add to attention (SkewFit).

Times are microseconds of GPU kernels, one decoder layer (LLMServingSim runs vLLM with one layer), as the
sources measured them; data/README.md gives each file's origin. Nothing here interpolates: kvlab.core.cost does.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvlab.core import validate
from kvlab.core.models import DATA_DIR, get_gpu, get_model, layer_shape

PROFILES_DIR = DATA_DIR / "profiles"
INDEX_CSV = PROFILES_DIR / "index.csv"
INTERCONNECTS_CSV = PROFILES_DIR / "interconnects.csv"
SCHEDULER_CPU_CSV = PROFILES_DIR / "cpu" / "vllm_scheduler.csv"
# The CPU data/profiles/cpu/vllm_scheduler.csv was timed on (scripts/profiles/time_vllm_scheduler.py).
SCHEDULER_CPU_MACHINE = "vLLM 0.33.0's scheduler timed on a 2-core Intel Xeon virtual machine"
SOURCES = {
    "llmservingsim": "LLMServingSim profile",
    "vidur": "vidur profile",
    "aiconfigurator": "operator tables composed",
}
# Calls of each dense operator in one decoder layer as vLLM's Llama and Qwen3 models run them (input and
# post-attention RMSNorm; Qwen3's q_norm and k_norm), and once per step (before and after the layers).
LAYER_CALLS = {
    "layernorm": 2,
    "qkv_proj": 1,
    "qk_norm": 2,
    "rotary_emb": 1,
    "o_proj": 1,
    "gate_up_proj": 1,
    "act_fn": 1,
    "down_proj": 1,
}
STEP_CALLS = {"embedding": 1, "final_layernorm": 1}
LINEAR_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
WEIGHT_BYTES = {"bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class ProfileEntry:
    """One row of data/profiles/index.csv: which GPU, model, dtype and TP a folder of operator times measures."""

    source: str  # llmservingsim or vidur
    gpu: str  # kvlab's GPU name (data/gpus.csv)
    source_gpu: str  # the source's folder name for the GPU
    model: str  # Hugging Face name (data/models.csv)
    dtype: str
    tensor_parallel_size: int
    path: str  # folder under data/profiles/
    hidden_size: int
    intermediate_size: int  # MLP size (dense models; unused by an MoE's layers)
    vocab_size: int
    num_experts: int = 0  # MoE: experts per layer, experts per token, one expert's MLP size
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_attention_heads: int = 0  # the attention's shape the linear layers were measured at
    num_kv_heads: int = 0
    head_dim: int = 0
    gated_mlp: int = 1  # 1: gate_up_proj holds the gate and up projections (Llama, Qwen); 0: up only (Phi-2)
    vllm_version: str = ""
    profiled_at: str = ""

    @property
    def layer_shape(self) -> tuple[int, ...]:
        """The shapes a decoder layer's operators are measured at, as kvlab.core.models.layer_shape gives a
        model's: (heads, KV heads, head dim, hidden, MLP (0 for an MoE), vocabulary, experts, experts per token, expert
        MLP)."""
        return (
            self.num_attention_heads,
            self.num_kv_heads,
            self.head_dim,
            self.hidden_size,
            0 if self.num_experts else self.intermediate_size,
            self.vocab_size,
            self.num_experts,
            self.num_experts_per_tok,
            self.moe_intermediate_size,
        )

    @property
    def label(self) -> str:
        """Where the numbers come from, e.g. "LLMServingSim profile RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1"."""
        return f"{SOURCES[self.source]} {self.source_gpu}/{self.model}/{self.dtype}/tp{self.tensor_parallel_size}"

    @property
    def folder(self) -> Path:
        """The folder of its CSVs."""
        return PROFILES_DIR / self.path


@lru_cache(maxsize=4)
def load_index(path: str | Path = INDEX_CSV) -> tuple[ProfileEntry, ...]:
    """Every profile of data/profiles/index.csv."""
    ints = (
        "tensor_parallel_size",
        "hidden_size",
        "intermediate_size",
        "vocab_size",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "num_attention_heads",
        "num_kv_heads",
        "head_dim",
        "gated_mlp",
    )
    with open(path, newline="", encoding="utf-8") as f:
        return tuple(
            ProfileEntry(**{k: int(v) if k in ints else v for k, v in row.items()}) for row in csv.DictReader(f)
        )


def measured_gpus(entries=None) -> list[str]:
    """GPUs that have at least one operator profile, sorted."""
    return sorted({e.gpu for e in (load_index() if entries is None else entries)})


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _by_layer(path: Path, key: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A (layer, key, time_us) file as one increasing key grid and each layer's times on it."""
    table: dict[str, dict[int, float]] = {}
    for row in _rows(path):
        table.setdefault(row["layer"], {})[int(row[key])] = float(row["time_us"])
    grids = {tuple(sorted(times)) for times in table.values()}
    if len(grids) != 1:
        validate.fail("profile", str(path), f"must measure every layer at the same {key}")
    grid = np.array(grids.pop(), dtype=np.float64)
    return grid, {layer: np.array([times[int(x)] for x in grid]) for layer, times in table.items()}


def _doubling_axis(values) -> np.ndarray:
    return np.array(sorted({int(v) for v in values}), dtype=np.float64)


def attention_grid(path: Path) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """attention.csv as a full grid: axes (prefill_chunk, kv_prefill, n_decode, kv_decode) and one layer's
    attention (us) at every point. Points the source could not measure are filled as follows (the rest are
    measured): with no prefill chunk its history changes nothing (the kv_prefill=0 time at every kv_prefill),
    likewise with no decode the decode history; no prefill and no decode takes 0; a decode of less history
    than the first measured one takes that one's time; and n_decode=256 beside a prefill chunk (257
    sequences, past the profile's max_num_seqs) is extrapolated linearly from n_decode 64 and 128."""
    rows = _rows(path)
    points = {
        (int(r["prefill_chunk"]), int(r["kv_prefill"]), int(r["n_decode"]), int(r["kv_decode"])): float(r["time_us"])
        for r in rows
    }
    axes = tuple(_doubling_axis(k[i] for k in points) for i in range(4))
    if 0 not in axes[0] or 0 not in axes[2]:
        validate.fail("profile", str(path), "must measure decode-only and prefill-only batches")
    grid = np.full(tuple(len(a) for a in axes), np.nan)
    index = [{int(v): i for i, v in enumerate(a)} for a in axes]
    for (pc, kp, nd, kv), us in points.items():
        grid[index[0][pc], index[1][kp], index[2][nd], index[3][kv]] = us
    grid[0] = grid[0, 0]  # no prefill: its history does not matter
    grid[:, :, 0] = grid[:, :, 0, :1]  # no decode: nor does theirs
    grid[0, :, 0] = 0.0
    grid[:, :, 1:, 0] = grid[:, :, 1:, 1]  # below the first measured decode history: its time
    if np.isnan(grid[..., -1, :]).any() and len(axes[2]) >= 3:
        n = axes[2]
        low, high = grid[..., -3, :], grid[..., -2, :]
        extrapolated = high + (high - low) * ((n[-1] - n[-2]) / (n[-2] - n[-3]))
        grid[..., -1, :] = np.where(np.isnan(grid[..., -1, :]), extrapolated, grid[..., -1, :])
    if np.isnan(grid).any():
        at = tuple(int(axes[i][j]) for i, j in enumerate(np.argwhere(np.isnan(grid))[0]))
        validate.fail(
            "profile",
            str(path),
            f"has no attention time at (prefill_chunk, kv_prefill, n_decode, kv_decode)={at}, which the grid needs",
        )
    return axes, grid


def moe_grid(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """moe.csv as a full grid: tokens, activated experts, one layer's MoE block (us). A token count measures only
    as many experts as its tokens can activate; the cells past them are extrapolated linearly along the experts
    from that count's last two measured points (the exact cells are never asked for: T tokens activate at most
    T x experts-per-token experts)."""
    rows = _rows(path)
    tokens = _doubling_axis(r["tokens"] for r in rows)
    experts = _doubling_axis(r["activated_experts"] for r in rows)
    grid = np.full((len(tokens), len(experts)), np.nan)
    for r in rows:
        grid[np.searchsorted(tokens, int(r["tokens"])), np.searchsorted(experts, int(r["activated_experts"]))] = float(
            r["time_us"]
        )
    for i, row in enumerate(grid):
        known = np.flatnonzero(~np.isnan(row))
        if len(known) == 0:
            validate.fail("profile", str(path), f"has no MoE time at {int(tokens[i])} tokens")
        if len(known) == 1:
            row[known[-1] + 1 :] = row[known[-1]]
            continue
        a, b = known[-2], known[-1]
        slope = (row[b] - row[a]) / (experts[b] - experts[a])
        row[b + 1 :] = row[b] + slope * (experts[b + 1 :] - experts[b])
    return tokens, experts, grid


SKEW_AXES = ("n_decode", "skew_rate", "kv_big", "kv_prefill")


@dataclass(frozen=True, eq=False)
class SkewFit:
    """LLMServingSim's fit of FlashAttention's penalty for decodes of unequal history (its profiler's skew sweep:
    batches of n decodes, nb of them at kv_big computed tokens and the rest at a smaller one, beside a prefill chunk
    or none, each timed against uniform batches at their mean and at their max history). A batch's attention is
    t_mean + alpha x (t_max - t_mean), t_mean and t_max the uniform grid's at the decodes' mean and largest history;
    alpha is fitted per bucket of (prefill chunk tokens, decodes, skew rate = (mean - min) / (max - min), largest
    history, the prefill chunk's history), a bucket being (bins[i], bins[i + 1]] of each axis and the prefill chunk
    one of its profiled values; a batch in no fitted bucket takes the fit's pooled alpha_default. As LLMServingSim's
    simulator reads it (serving/core/trace_generator.py: _skew_alpha, _lookup_attention_with_skew); the measured step
    cost reads it through its Clock (kvlab.core.cost.step_time.skew_alpha)."""

    prefill_chunks: dict  # profiled prefill chunk tokens -> index
    bins: tuple  # per SKEW_AXES: the bucket edges
    alpha: np.ndarray  # [prefill chunk, n_decode, skew_rate, kv_big, kv_prefill] bucket; alpha_default where unfitted
    alpha_default: float
    num_buckets: int  # buckets fitted
    rel_err_p50: float  # the fit's relative error, as the source reports it (meta.yaml's rel_err_p50)
    rel_err_p90: float

    def describe(self) -> str:
        return (
            f"LLMServingSim's fit of unequal decode histories ({self.num_buckets:,} cells of batches binned by "
            f"prefill chunk, decode count, history skew and context, pooled alpha {self.alpha_default}; the fit's "
            "relative error as the source reports it: median "
            f"{100 * self.rel_err_p50:.1f}%, p90 {100 * self.rel_err_p90:.1f}%)"
        )


def skew_fit(folder: Path) -> SkewFit:
    """A folder's skew_fit.csv and skew_fit.json as a SkewFit."""
    with open(folder / "skew_fit.json", encoding="utf-8") as f:
        meta = json.load(f)
    bins = tuple(tuple(meta["bins"][axis]) for axis in SKEW_AXES)
    rows = _rows(folder / "skew_fit.csv")
    chunks = {pc: i for i, pc in enumerate(sorted({int(r["prefill_chunk"]) for r in rows}))}
    alpha = np.full((len(chunks), *(len(b) - 1 for b in bins)), np.nan)
    for r in rows:
        cell = tuple(b.index(float(r[axis])) - 1 for b, axis in zip(bins, SKEW_AXES))
        if min(cell) < 0:
            validate.fail("profile", str(folder), f"has a skew bucket at {r} on no edge of skew_fit.json's bins")
        alpha[(chunks[int(r["prefill_chunk"])], *cell)] = float(r["alpha"])
    return SkewFit(
        chunks, bins, np.where(np.isnan(alpha), meta["alpha_default"], alpha), float(meta["alpha_default"]),
        len(rows), float(meta["rel_err_p50"]), float(meta["rel_err_p90"]),
    )  # fmt: skip


@dataclass(frozen=True, eq=False)
class OperatorProfile:
    """The measured operator times of one ProfileEntry (us); a table the folder lacks is None."""

    entry: ProfileEntry
    dense: tuple[np.ndarray, dict[str, np.ndarray]] | None
    per_sequence: tuple[np.ndarray, dict[str, np.ndarray]] | None
    attention: tuple[tuple[np.ndarray, ...], np.ndarray] | None
    moe: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    skew: SkewFit | None = None

    @property
    def complete(self) -> bool:
        """Whether it measures every operator of a step: dense, per-sequence, attention (and MoE for an MoE)."""
        return (
            self.dense is not None
            and self.per_sequence is not None
            and self.attention is not None
            and (self.moe is not None or self.entry.num_experts == 0)
        )


@lru_cache(maxsize=32)
def load_profile(entry: ProfileEntry) -> OperatorProfile:
    """The operator times of one profile (its folder's CSVs)."""
    folder = entry.folder
    found = {name: (folder / f"{name}.csv").is_file() for name in ("dense", "per_sequence", "attention", "moe")}
    if not any(found.values()):
        validate.fail("profile", entry.path, f"has no operator CSV in {folder}")
    return OperatorProfile(
        entry,
        _by_layer(folder / "dense.csv", "tokens") if found["dense"] else None,
        _by_layer(folder / "per_sequence.csv", "sequences") if found["per_sequence"] else None,
        attention_grid(folder / "attention.csv") if found["attention"] else None,
        moe_grid(folder / "moe.csv") if found["moe"] else None,
        skew_fit(folder) if (folder / "skew_fit.csv").is_file() else None,
    )


def find_profile(gpu: str, model, tensor_parallel_size: int) -> OperatorProfile | None:
    """The complete profile on gpu at tensor_parallel_size of a ModelSpec: its own (the same name), else one of a
    model of the same layer shapes (models.layer_shape: a fine-tune, or a config.json of a profiled architecture;
    the layer count may differ, since a profile times one layer), if one is committed."""
    candidates = [e for e in load_index() if (e.gpu, e.tensor_parallel_size) == (gpu, tensor_parallel_size)]
    for entry in sorted(candidates, key=lambda e: e.model != model.name):
        if serves(entry, model):
            profile = load_profile(entry)
            if profile.complete:
                return profile
    return None


def serves(entry: ProfileEntry, model) -> bool:
    """Whether a profile times model's layers: its own, or a model's of the same layer shapes."""
    return entry.model == model.name or (bool(layer_shape(model)) and entry.layer_shape == layer_shape(model))


def linear_weights_bytes(entry: ProfileEntry) -> dict[str, float]:
    """Weights one GPU reads for each linear layer of one decoder layer (bytes), from the model's shape."""
    h, tp = entry.hidden_size, entry.tensor_parallel_size
    q, kv = entry.num_attention_heads * entry.head_dim, entry.num_kv_heads * entry.head_dim
    params = {
        "qkv_proj": h * (q + 2 * kv),
        "o_proj": q * h,
        "gate_up_proj": (1 + entry.gated_mlp) * h * entry.intermediate_size,
        "down_proj": entry.intermediate_size * h,
    }
    return {name: p * WEIGHT_BYTES[entry.dtype] / tp for name, p in params.items()}


def linear_layers_ms(profile: OperatorProfile, num_tokens) -> np.ndarray:
    """One step's linear layers (qkv_proj, o_proj, gate_up_proj, down_proj of every decoder layer) at each of
    num_tokens batched tokens (ms): the profile's measured times, linear between its measured token counts."""
    tokens, times = profile.dense
    x = np.asarray(num_tokens, dtype=np.float64)
    if x.min() < tokens[0] or x.max() > tokens[-1]:
        validate.fail(
            "num_tokens", int(x.max()), f"must lie within the profile's {tokens[0]:.0f}..{tokens[-1]:,.0f} tokens"
        )
    per_layer = sum(np.interp(x, tokens, times[n]) for n in LINEAR_LAYERS)
    return per_layer * get_model(profile.entry.model).num_layers / 1000.0


@dataclass(frozen=True)
class SustainedFractions:
    """What share of a GPU's datasheet memory bandwidth and dense bf16 FLOP/s its linear layers sustain."""

    gpu: str
    memory_bandwidth_fraction: float  # weights bytes / time at the fewest tokens measured, over the datasheet's
    flop_fraction: float  # 2 x parameters x tokens / time at the most tokens measured, over the peak
    sources: tuple[str, ...]  # the profiles they are the median of

    def describe(self) -> str:
        """In words, e.g. "91% of the bandwidth and 80% of the FLOP/s (median of 5 profiles)"."""
        rates = f"{self.memory_bandwidth_fraction:.0%} of the datasheet bandwidth and {self.flop_fraction:.0%} of its dense bf16 FLOP/s"
        if len(self.sources) == 1 and "operator tables'" in self.sources[0]:
            return f"{rates}, as {self.sources[0]} sustains them"
        return (
            f"{rates}, as the linear layers of {len(self.sources)} operator "
            f"profile{'s' if len(self.sources) > 1 else ''} sustain them"
        )


def profile_fractions(profile: OperatorProfile) -> tuple[float, float]:
    """(bandwidth, FLOP) fractions the linear layers of one profile sustain on its GPU (see SustainedFractions)."""
    gpu = get_gpu(profile.entry.gpu)
    tokens, times = profile.dense
    weights = linear_weights_bytes(profile.entry)
    names = [n for n in LINEAR_LAYERS if n in times]
    total_bytes = sum(weights[n] for n in names)
    read_s = sum(times[n][0] for n in names) / 1e6
    compute_s = sum(times[n][-1] for n in names) / 1e6
    flops = 2.0 * total_bytes / WEIGHT_BYTES[profile.entry.dtype] * tokens[-1]
    return (
        float(total_bytes / read_s / (gpu.memory_bandwidth_gb_s * 1e9)),
        float(flops / compute_s / (gpu.bf16_dense_tflops * 1e12)),
    )


@lru_cache(maxsize=16)
def sustained_fractions(gpu: str) -> SustainedFractions:
    """The median fractions over every profile of gpu (ValueError when it has none)."""
    entries = [e for e in load_index() if e.gpu == gpu]
    if not entries:
        validate.fail("gpu", gpu, f"has no operator profile; GPUs with measurements: {', '.join(measured_gpus())}")
    fractions = [profile_fractions(load_profile(e)) for e in entries]
    return SustainedFractions(
        gpu,
        statistics.median(f[0] for f in fractions),
        statistics.median(f[1] for f in fractions),
        tuple(e.label for e in entries),
    )


@lru_cache(maxsize=8)
def scheduler_cpu_us(
    enable_prefix_caching: bool, async_scheduling: bool, path: str | Path = SCHEDULER_CPU_CSV
) -> tuple[np.ndarray, np.ndarray]:
    """(running requests, CPU us of vLLM's schedule() + update_from_output() for one decode step of that many):
    the medians data/profiles/cpu/vllm_scheduler.csv holds for those settings."""
    rows = [
        r
        for r in _rows(Path(path))
        if (int(r["enable_prefix_caching"]), int(r["async_scheduling"])) == (enable_prefix_caching, async_scheduling)
    ]
    rows.sort(key=lambda r: int(r["num_running"]))
    return (
        np.array([float(r["num_running"]) for r in rows]),
        np.array([float(r["schedule_us"]) + float(r["update_from_output_us"]) for r in rows]),
    )


@dataclass(frozen=True)
class Interconnect:
    """How two GPUs of a kind are joined, as data/profiles/interconnects.csv gives it."""

    gpu: str
    interconnect: str  # e.g. "PCIe 5.0 x16", "NVLink 4 (NVSwitch)"
    bandwidth_gb_s: float  # each way, GB/s (datasheet)
    compute_capability: str  # CUDA's, e.g. "9.0": what vLLM's all-reduce choice reads
    nvlink: bool  # every GPU of a node reaches every other over NVLink (vLLM's fully_connected)
    p2p: bool  # the driver grants peer access (vLLM's _can_p2p)
    all_reduce_profile: str  # folder under data/profiles/ of measured all-reduce times, or ""


@lru_cache(maxsize=16)
def interconnect(gpu: str, path: str | Path = INTERCONNECTS_CSV) -> Interconnect | None:
    """The link between two GPUs of this kind, or None where data/profiles/interconnects.csv has none."""
    for row in _rows(Path(path)):
        if row["gpu"] == gpu:
            return Interconnect(
                gpu,
                row["interconnect"],
                float(row["bandwidth_gb_s"]),
                row["compute_capability"],
                row["nvlink"] == "1",
                row["p2p"] == "1",
                row["all_reduce_profile"],
            )
    return None


@lru_cache(maxsize=16)
def all_reduce_us(folder: str, num_gpus: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(sizes in bytes, from 0; one all-reduce's time, us) among num_gpus GPUs from a folder's all_reduce.csv
    (0 bytes take 0 us), or None where it measures no all-reduce among that many."""
    rows = [r for r in _rows(PROFILES_DIR / folder / "all_reduce.csv") if int(r["num_gpus"]) == num_gpus]
    if not rows:
        return None
    points = sorted((int(r["size_bytes"]), float(r["time_us"])) for r in rows)
    return np.array([0.0] + [p[0] for p in points]), np.array([0.0] + [p[1] for p in points])


@lru_cache(maxsize=32)
def nccl_us(folder: str, op: str, num_gpus: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(sizes in bytes, from 0; one call's time, us) of NCCL's op (all_reduce, all_gather, reduce_scatter) among
    num_gpus GPUs from a folder's nccl.csv (nccl-tests' size: the whole buffer), or None where it has none."""
    path = PROFILES_DIR / folder / "nccl.csv"
    if not path.exists():
        return None
    rows = [r for r in _rows(path) if r["op"] == op and int(r["num_gpus"]) == num_gpus]
    if not rows:
        return None
    points = sorted((int(r["size_bytes"]), float(r["time_us"])) for r in rows)
    return np.array([0.0] + [p[0] for p in points]), np.array([0.0] + [p[1] for p in points])


__all__ = [
    "INDEX_CSV",
    "LAYER_CALLS",
    "LINEAR_LAYERS",
    "OperatorProfile",
    "PROFILES_DIR",
    "ProfileEntry",
    "STEP_CALLS",
    "SustainedFractions",
    "attention_grid",
    "find_profile",
    "Interconnect",
    "all_reduce_us",
    "interconnect",
    "nccl_us",
    "linear_layers_ms",
    "linear_weights_bytes",
    "load_index",
    "load_profile",
    "measured_gpus",
    "moe_grid",
    "profile_fractions",
    "scheduler_cpu_us",
    "serves",
    "sustained_fractions",
]
