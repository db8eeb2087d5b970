"""Tensor parallelism's all-reduces as vLLM 0.33 runs them: how many a step runs, which kernel it picks for each
size, and their time from that kernel's measured latency-and-size table or, where none is measured, a bound over the
link; and the expert dispatch and combine of data and expert parallelism, timed the same way.

Which kernel (vllm/distributed/device_communicators/cuda_communicator.py CudaCommunicator.all_reduce, in order):
FlashInfer's all-reduce on compute capability 9.0 and 10.x up to its size limit per GPU count; then vLLM's custom
all-reduce (custom_all_reduce.py should_custom_ar: 2, 4, 6 or 8 GPUs whose driver grants peer access, all joined
by NVLink or exactly two, below 8 MiB, or below CUSTOM_ALL_REDUCE_MAX_SIZES where torch symmetric memory is on;
one-stage for two GPUs, for up to four below 512 KiB and for up to eight below 256 KiB, else two-stage); then torch
symmetric memory (9.0 and 10.x, NVSwitch, up to SYMM_MEM_ALL_REDUCE_MAX_SIZES); else NCCL. All are captured in
vLLM's CUDA graphs. How many (vllm/model_executor/models/llama.py, qwen3.py): the embedding's and two a decoder
layer (o_proj and down_proj, RowParallelLinear), each of num_tokens x hidden_size x 2 bytes; the lm_head gathers
its logits (an all-gather, not counted here).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvlab.core import validate
from kvlab.core.cost.interpolate import interp

MIB = 1 << 20
# vLLM 0.33: FlashInfer's all-reduce limit (MiB) by compute capability and GPU count
# (compilation/passes/fusion/allreduce_rms_fusion.py FI_ALLREDUCE_FUSION_MAX_SIZE_MB)
FLASHINFER_MAX_MIB = {
    "9.0": {2: 64, 4: 2, 8: 0.5},
    "10.0": {2: 64, 4: 32, 8: 1},
    "10.3": {2: 64, 4: 64, 8: 4},
    "10.7": {2: 64, 4: 64, 8: 2},
}
CUSTOM_MAX_BYTES = 8 * MIB  # custom_all_reduce.py CustomAllreduce(max_size=8192 * 1024)
# where torch symmetric memory is on, custom all-reduce stops at the smaller of these (all_reduce_utils.py)
CUSTOM_MAX_WITH_SYMM_MEM_MIB = {
    "9.0": {2: 64, 4: 32, 6: 0.5, 8: 0.25},
    "10.0": {2: 2, 4: 2, 6: 1, 8: 1},
    "10.3": {2: 4, 4: 4, 6: 8, 8: 4},
    "10.7": {2: 4, 4: 4, 6: 8, 8: 4},
}
SYMM_MEM_MAX_MIB = {  # all_reduce_utils.py SYMM_MEM_ALL_REDUCE_MAX_SIZES
    "9.0": {2: 64, 4: 32, 6: 64, 8: 64},
    "10.0": {2: 8, 4: 32, 6: 128, 8: 128},
    "10.3": {2: 4, 4: 32, 6: 32, 8: 64},
    "10.7": {2: 4, 4: 32, 6: 32, 8: 64},
}


def vllm_kernel(link, num_gpus: int, size_bytes: int) -> str:
    """The all-reduce vLLM 0.33 runs for size_bytes among num_gpus GPUs of one node joined by link (a
    kvlab.core.profiles.Interconnect), with its default settings (see the module)."""
    cap, n = link.compute_capability, num_gpus
    if size_bytes <= FLASHINFER_MAX_MIB.get(cap, {}).get(n, -1) * MIB:
        return "FlashInfer all-reduce"
    symm_mem = link.nvlink and n in SYMM_MEM_MAX_MIB.get(cap, {})
    custom_max = CUSTOM_MAX_BYTES
    if symm_mem:
        custom_max = min(custom_max, CUSTOM_MAX_WITH_SYMM_MEM_MIB[cap][n] * MIB)
    if n in (2, 4, 6, 8) and link.p2p and (n == 2 or link.nvlink) and size_bytes % 16 == 0 and size_bytes < custom_max:
        one_stage = n == 2 or (n <= 4 and size_bytes < 512 * 1024) or size_bytes < 256 * 1024
        return f"vLLM's custom all-reduce ({'one' if one_stage else 'two'}-stage)"
    if symm_mem and size_bytes <= SYMM_MEM_MAX_MIB[cap][n] * MIB:
        return "torch symmetric-memory all-reduce"
    return "NCCL"


@dataclass(frozen=True, eq=False)
class AllReduceCost:
    """One step's all-reduces: num_per_step of num_tokens x bytes_per_token each, one taking times_us at
    sizes_bytes (piecewise linear, from 0 bytes in 0 us; linear past the last size), kernels naming what vLLM runs
    at each size (in words) and source where the times come from."""

    sizes_bytes: np.ndarray
    times_us: np.ndarray
    bytes_per_token: float
    num_per_step: int
    kernels: str = ""
    source: str = ""

    def __post_init__(self):
        validate.positive_number("bytes_per_token", self.bytes_per_token)
        validate.positive_int("num_per_step", self.num_per_step)
        sizes, times = np.asarray(self.sizes_bytes, dtype=np.float64), np.asarray(self.times_us, dtype=np.float64)
        if sizes.ndim != 1 or len(sizes) < 2 or sizes[0] != 0 or np.any(np.diff(sizes) <= 0):
            validate.fail("sizes_bytes", sizes.tolist()[:4], "must be at least 2 increasing sizes from 0 bytes")
        if times.shape != sizes.shape or not np.all(np.isfinite(times)) or times.min() < 0:
            validate.fail("times_us", times.tolist()[:4], "must be one finite time >= 0 us per size")
        object.__setattr__(self, "_table", (sizes.tolist(), times.tolist()))
        object.__setattr__(self, "_at", {})  # step_us by tokens, as read

    @classmethod
    def for_step(cls, link, num_gpus: int, hidden_size: int, num_layers: int) -> AllReduceCost | None:
        """The all-reduces of one step of a model of num_layers decoder layers and hidden_size on num_gpus GPUs
        joined by link (None: no link figure, the all-reduce is left out), each size timed by the kernel vLLM runs
        there (vllm_kernel) where data/ measures it for that GPU count: AIConfigurator's vLLM custom all-reduce and
        NCCL tables (by_kernel), or vidur's NCCL for every size; else the ring's bound, 2 (n - 1) / n x size over the
        link's bandwidth each way (no latency)."""
        from kvlab.core import profiles

        if link is None or num_gpus == 1:
            return None
        bytes_per_token = 2.0 * hidden_size
        folder = link.all_reduce_profile
        custom = profiles.all_reduce_us(folder, num_gpus) if folder else None
        kernels = kernel_ranges(link, num_gpus, bytes_per_token)
        if custom is not None and folder.startswith("../operators/"):
            nccl = profiles.nccl_us(folder, "all_reduce", num_gpus)
            sizes, times, source = by_kernel(link, num_gpus, bytes_per_token, custom, nccl)
        elif custom is not None:
            sizes, times = custom
            source = (
                f"vidur's NCCL all-reduce measured among {num_gpus} GPUs over {link.interconnect} "
                "(eager, fp16; not the kernel vLLM runs where it runs another)"
            )
        else:
            ring = 2.0 * (num_gpus - 1) / num_gpus
            sizes, times = np.array([0.0, MIB]), np.array([0.0, ring * MIB / (link.bandwidth_gb_s * 1e3)])
            source = (
                f"no measurement of an all-reduce among {num_gpus} of these GPUs: the ring's bound over "
                f"{link.interconnect} at {link.bandwidth_gb_s:g} GB/s each way, no latency (a lower bound)"
            )
        return cls(sizes, times, bytes_per_token, 2 * num_layers + 1, kernels, source)

    def step_us(self, num_tokens: float) -> float:
        """The step's all-reduces for num_tokens tokens (us)."""
        us = self._at.get(num_tokens)
        if us is None:
            sizes, times = self._table
            us = self._at[num_tokens] = self.num_per_step * interp(sizes, times, num_tokens * self.bytes_per_token)
        return us

    def describe(self) -> str:
        """In words: how many, which kernels vLLM runs, where the times come from."""
        return f"{self.num_per_step} all-reduces a step ({self.kernels}); timed by {self.source}"


class DispatchCombine(AllReduceCost):
    """The expert dispatch and combine of a step under data and expert parallelism, as vLLM 0.33's default all2all
    backend runs them (allgather_reducescatter: vllm/distributed/device_communicators/all2all.py AgRsAll2AllManager,
    among the data-parallel group's ranks): before each MoE block an all-gather of every rank's hidden states, after it
    a reduce-scatter of the experts' outputs, each a buffer of the tokens of all the ranks x hidden_size x 2 bytes.
    Read by the tokens of all the ranks."""

    @classmethod
    def for_step(cls, link, num_ranks: int, hidden_size: int, num_layers: int) -> DispatchCombine:
        """A step's dispatch and combine among num_ranks GPUs joined by link: NCCL's all-gather plus its reduce-scatter
        as AIConfigurator measured them (nccl-tests) where data/ has them among that many GPUs, else the ring's bound
        of both, 2 (n - 1) / n x the buffer over the link's bandwidth each way (no latency)."""
        from kvlab.core import profiles

        folder = link.all_reduce_profile
        gather, scatter = (
            (profiles.nccl_us(folder, op, num_ranks) for op in ("all_gather", "reduce_scatter"))
            if folder.startswith("../operators/")
            else (None, None)
        )
        kernels = "vLLM's allgather_reducescatter"
        if gather is not None and scatter is not None:
            sizes = np.union1d(gather[0], scatter[0])
            tables = [(t[0].tolist(), t[1].tolist()) for t in (gather, scatter)]
            times = np.array([sum(interp(*table, size) for table in tables) for size in sizes.tolist()])
            source = (
                f"NCCL's all-gather and reduce-scatter among {num_ranks} GPUs over {link.interconnect} measured by "
                "AIConfigurator (nccl-tests, eager, half; the top-k ids and weights gathered with the hidden states "
                "left out)"
            )
        else:
            ring = 2.0 * (num_ranks - 1) / num_ranks
            sizes, times = np.array([0.0, MIB]), np.array([0.0, 2 * ring * MIB / (link.bandwidth_gb_s * 1e3)])
            source = (
                f"the ring's bound of both over {link.interconnect} at {link.bandwidth_gb_s:g} GB/s each way, no "
                "latency (no measurement of either among these GPUs)"
            )
        return cls(sizes, times, 2.0 * hidden_size, num_layers, kernels, source)

    def describe(self) -> str:
        return f"dispatch and combine ({self.kernels}), {self.num_per_step} a step: {self.source}"


def by_kernel(link, num_gpus: int, bytes_per_token: float, custom, nccl) -> tuple[np.ndarray, np.ndarray, str]:
    """(sizes, times, in words) of one all-reduce that reads, at each step's tokens, the table of the kernel vLLM
    runs there: nccl's (sizes, times) where it runs NCCL, custom's (vLLM's custom all-reduce) elsewhere, FlashInfer's
    and torch symmetric memory's all-reduce included (unmeasured; said). One piecewise-linear table whose pieces
    are each kernel's own measurements inside its token range, so integer tokens read exactly that kernel's table;
    without nccl, custom stands for NCCL too."""
    tables = {"custom": custom, "nccl": nccl if nccl is not None else custom}
    sizes, times = [0.0], [0.0]
    ranges = token_ranges(link, num_gpus, bytes_per_token, max_tokens=None)
    for i, (kernel, first, last) in enumerate(ranges):
        axis, values = tables["nccl" if kernel == "NCCL" else "custom"]
        axis, values = axis.tolist(), values.tolist()
        lo = first * bytes_per_token
        hi = last * bytes_per_token if i + 1 < len(ranges) else np.inf
        inner = [(a, v) for a, v in zip(axis, values) if lo < a < hi]
        ends = [(lo, interp(axis, values, lo))] + inner + ([(hi, interp(axis, values, hi))] if hi < np.inf else [])
        for a, v in ends:
            if a > sizes[-1]:
                sizes.append(a)
                times.append(v)
    used = {k for k, _, _ in ranges}
    words = [f"vLLM's custom all-reduce in a CUDA graph measured among {num_gpus} GPUs over {link.interconnect} by "
             "AIConfigurator (bf16)"]  # fmt: skip
    if "NCCL" in used:
        words.append(
            "NCCL's all-reduce by nccl-tests (eager, half) where vLLM runs NCCL"
            if nccl is not None
            else "the custom all-reduce's times where vLLM runs NCCL (no NCCL measurement among these GPUs)"
        )
    others = sorted(k for k in used if k != "NCCL" and "custom" not in k)
    if others:
        words.append(f"the custom all-reduce's times where vLLM runs {' or '.join(others)} (unmeasured)")
    return np.array(sizes), np.array(times), "; ".join(words)


def token_ranges(link, num_gpus: int, bytes_per_token: float, max_tokens: int | None = 8192) -> list[list]:
    """[kernel, first, last tokens] of each run of step tokens (1 to max_tokens; None: the last run open-ended) over
    which vLLM runs one all-reduce kernel (vllm_kernel). The kernel changes only where the size crosses one of
    vllm_kernel's limits, or, for sizes not a multiple of 16 bytes, between tokens; tokens are read there only."""
    cap = link.compute_capability
    limits = [CUSTOM_MAX_BYTES, 512 * 1024, 256 * 1024]
    for table in (FLASHINFER_MAX_MIB, CUSTOM_MAX_WITH_SYMM_MEM_MIB, SYMM_MEM_MAX_MIB):
        limits += [mib * MIB for mib in table.get(cap, {}).values()]
    end = max_tokens if max_tokens is not None else int(max(limits) // bytes_per_token) + 2
    if bytes_per_token % 16:
        candidates = range(1, end + 1)
    else:
        candidates = sorted({1} | {t for b in limits for t in (int(b // bytes_per_token), int(b // bytes_per_token) + 1)
                                   if 1 <= t <= end})  # fmt: skip
    ranges: list[list] = []
    for tokens in candidates:
        kernel = vllm_kernel(link, num_gpus, int(tokens * bytes_per_token))
        if ranges and ranges[-1][0] == kernel:
            continue
        if ranges:
            ranges[-1][2] = tokens - 1
        ranges.append([kernel, tokens, end])
    return ranges


@lru_cache(maxsize=64)
def kernel_ranges(link, num_gpus: int, bytes_per_token: float, max_tokens: int | None = None) -> str:
    """Which kernel vLLM runs for a step's all-reduces, by the step's tokens, in words, e.g. "vLLM's custom
    all-reduce (one-stage) at 1-1,023 tokens, NCCL at 1,024-8,192 tokens" up to max_tokens (a run's token budget),
    or, without it, "... NCCL from 1,024 tokens" (whatever the budget)."""
    ranges = token_ranges(link, num_gpus, bytes_per_token, max_tokens)
    words = [f"{k} at {a:,}-{b:,} tokens" for k, a, b in ranges]
    if max_tokens is None:
        kernel, first, _ = ranges[-1]
        words[-1] = f"{kernel} from {first:,} tokens" if len(ranges) > 1 else f"{kernel} at every size"
    return ", ".join(words)
