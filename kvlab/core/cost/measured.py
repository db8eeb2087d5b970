"""The measured step cost: a step composed from public operator-level GPU measurements of vLLM's layers."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from kvlab.core import validate
from kvlab.core.cost import step_time
from kvlab.core.cost.all_reduce import AllReduceCost, DispatchCombine
from kvlab.core.cost.batch import Batch
from kvlab.core.cost.cpu import combine_cpu
from kvlab.core.cost.interpolate import interp
from kvlab.core.cost.linear_profile import LinearProfileStepCost
from kvlab.core.cost.roofline import RooflineStepCost
from kvlab.core.profiles import SkewFit


def cudagraph_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, max_capture_size: int = 512
) -> tuple[int, ...]:
    """vLLM 0.33's default CUDA-graph capture sizes (tokens), as VllmConfig._set_cudagraph_sizes builds them
    (vllm/config/vllm.py; the pattern documented at CompilationConfig.max_cudagraph_capture_size in
    vllm/config/compilation.py) for one token per decode: [1, 2, 4] + range(8, 256, 8) + range(256, M + 1, 16)
    with M = min(2 x max_num_seqs, max_capture_size, max_num_batched_tokens), plus max_num_batched_tokens and
    max_num_seqs where they fit. max_capture_size: 512, or 1024 on data-center Blackwell (B200) GPUs."""
    validate.positive_int("max_num_seqs", max_num_seqs)
    validate.positive_int("max_num_batched_tokens", max_num_batched_tokens)
    ceiling = min(2 * max_num_seqs, validate.positive_int("max_capture_size", max_capture_size))
    uniform_decode = [max_num_seqs] if max_num_seqs <= ceiling else []
    ceiling = min(max_num_batched_tokens, ceiling)
    sizes = [s for s in (1, 2, 4) if s <= ceiling]
    if ceiling >= 8:
        sizes += range(8, min(ceiling + 1, 256), 8)
    if ceiling >= 256:
        sizes += range(256, ceiling + 1, 16)
    if max_num_batched_tokens <= ceiling:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in uniform_decode if s <= max_num_batched_tokens]
    return tuple(sorted(set(sizes)))


# The terms a measured step is the sum of (MeasuredStepCost's docstring), each of which MeasuredStepCost.without
# switches off.
MEASURED_TERMS = (
    "dense layers",
    "attention",
    "attention skew",
    "lm_head and sampler",
    "MoE block",
    "expert dispatch",
    "all-reduce",
    "CUDA-graph padding",
    "CPU scheduling",
)


@dataclass(frozen=True, eq=False)
class MeasuredStepCost:
    """A step's duration from public operator-level GPU measurements of vLLM's layers, for the batch the
    scheduler built: the sum of these terms (microseconds of GPU kernels; numbers from kvlab.core.profiles):

    - dense: the operators that scale with the step's batched tokens, num_layers x one decoder layer's
      (qkv_proj, o_proj, gate_up_proj, down_proj, act_fn, rotary_emb, input and post-attention RMSNorm, Qwen3's
      q_norm and k_norm) plus the embedding and final norm once, by tokens: LLMServingSim's dense.csv, measured
      through vLLM 0.19's layers, one layer, eager, at 1..2,048 tokens;
    - attention, num_layers x one layer's, by (prefill chunk tokens, their history, decodes, the decodes' mean
      history): LLMServingSim's attention.csv, a 4-D grid measured with at most one prefill chunk beside
      n_decode decodes of equal history (FlashAttention's varlen kernel: a mixed batch is slower than its parts
      apart, so the grid is read whole). The step's prefill chunks are looked up as one chunk of their summed
      tokens n whose history gives their query-key pairs (prefill_attention_pairs = n x c + n(n+1)/2, so
      c = (pairs - n(n+1)/2) / n, at least 0); a caller that gives no pairs (num_prefills=0) has its prefill
      tokens taken as one chunk of history context_tokens - decode_context_tokens - n. Decodes are looked up at
      their mean history;
    - attention skew, where the profile has LLMServingSim's fit of it (kvlab.core.profiles.SkewFit) and the batch
      has decodes of unequal history: num_layers x alpha x (t_max - t_mean), t_mean the attention above and t_max
      the grid's at the decodes' largest history, alpha the fit's for the batch's bucket (the prefill chunk the
      lookup above uses, its history truncated to whole tokens); none where t_max <= t_mean, and the layer's
      attention kept at least 0 (some buckets of mixed batches hold a few shots whose alpha is far below 0: -735
      in one of Llama-3.1-8B's at TP 2), as LLMServingSim's simulator reads it;
    - per sequence: lm_head (LogitsProcessor) and the sampler once a step, by scheduled sequences
      (num_decodes + num_prefills): LLMServingSim's per_sequence.csv;
    - MoE, num_layers x one layer's block, by (tokens, experts active): LLMServingSim's moe.csv (TP 1 only).
      Experts active are their expectation under uniform top-k routing, E x (1 - (1 - k/E)^tokens); a profile
      without moe.csv is a dense model's (an MoE model without it has no profile);
    - expert parallelism (vLLM's --enable-expert-parallel over DP x TP GPUs, expert_parallel_size > 1): a GPU holds
      E / EP experts and receives the tokens of every data-parallel rank routed to them. The ranks step in
      lockstep, padded to the largest rank's tokens where all run CUDA graphs, else each at its own with the
      experts at the ranks' mean (group_step_s; step_s, one batch alone, takes every rank to carry its tokens):
      the MoE block is read at (the rank's tokens, the experts of its E / EP hit by DP x those tokens: E / EP x (1 - (1 - k/E)^(DP x
      tokens))), the table's tokens routing as many token-expert pairs as the rank's share of all the ranks'; and
      the expert dispatch and combine, vLLM 0.33's default all2all backend (allgather_reducescatter: an all-gather
      of every rank's hidden states and a reduce-scatter of the experts' outputs in each MoE layer, among the DP
      ranks), each a buffer of DP x tokens x hidden_size x 2 bytes, timed by NCCL's measured all-gather and
      reduce-scatter where data/operators holds them for the GPU (kvlab.core.cost.all_reduce.DispatchCombine), else
      at the ring's bound over the link (no latency);
    - all-reduce when TP > 1: 2 x num_layers + 1 a step (after o_proj and the MLP, and the embedding's), each
      summing tokens x hidden_size x 2 bytes (kvlab.core.cost.all_reduce.AllReduceCost: which kernel vLLM runs
      at each size, and that kernel's measured time where data/operators holds it for the GPU, else the ring's
      bound over the link, data/profiles/interconnects.csv, its latency left out);
    - CUDA graphs: a step of at most max_cudagraph_capture_size tokens runs padded to the next of
      cudagraph_capture_sizes (vLLM 0.33's CudagraphDispatcher, vllm/v1/cudagraph_dispatcher.py: a decode-only
      batch in a full graph, a mixed one in piecewise graphs, both padded), which the dense, MoE and all-reduce
      terms are read at; attention and per-sequence work run on the real requests;
    - the CPU's scheduling: vLLM's schedule() and update_from_output() for the step's scheduled sequences, timed
      on a CPU (kvlab.core.profiles.scheduler_cpu_us: vLLM 0.33's own scheduler, its medians by running
      requests, for the config's prefix caching and scheduling mode). Synchronous scheduling runs them between
      GPU steps, so they add to every step; asynchronous scheduling (a batch queue of two) runs them while the GPU
      runs the batch before, so a step takes the longer of the two. vLLM's other CPU work (the model runner's
      input preparation, the sampler's CPU side, detokenization and output processing in the API server's
      process) has no public measurement for vLLM 0.33 and is left out;
    - step_overhead_ms once a step: 0 by default (kernel-launch gaps are in no operator profile).

    Interpolation is piecewise linear between measured points (multilinear on the attention grid, bilinear on
    the MoE grid), a measured point giving its own time; below an axis's first point its value is kept, above
    its last it is extrapolated linearly (tokens past 2,048, contexts past 16,384, decodes past 256: linear in
    those where the kernels are bandwidth- or compute-bound, an underestimate for a prefill chunk's causal
    attention, which grows as its square): on the grids from their last two points (powers of two, a doubling
    apart), on the densely measured dense and per-sequence axes along the secant of their last doubling (interp). Points the profiles could not measure are
    filled as kvlab.core.profiles.attention_grid and moe_grid say.

    Where (model, GPU, TP) has no profile, measured_step_cost gives the roofline itself (RooflineStepCost at the
    GPU's sustained bandwidth and FLOP/s), its provenance saying so. The coefficients are only ever read from
    operator-level measurements; end-to-end vLLM runs are checks."""

    num_layers: int
    dense_tokens: np.ndarray  # tokens measured, increasing
    dense_us: np.ndarray  # the step's dense operators (us)
    sequences: np.ndarray  # sequences measured, increasing
    per_sequence_us: np.ndarray  # lm_head + sampler (us)
    attention_axes: tuple  # (prefill chunk tokens, their history, decodes, decode history), from 0
    attention_us: np.ndarray  # one layer's (us)
    cudagraph_capture_sizes: tuple = ()  # tokens; () = no CUDA graphs
    moe_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # MoE grid: tokens, experts active
    moe_experts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    moe_us: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # one layer's MoE block (us)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    all_reduce: AllReduceCost | None = None  # the step's all-reduces (None: TP 1, or no link figure)
    tensor_parallel_size: int = 1
    step_overhead_ms: float = 0.0
    source: str = ""  # the profile it was read from, in words
    cpu_sequences: np.ndarray = field(default_factory=lambda: np.zeros(0))  # scheduled sequences (empty: no CPU)
    cpu_us: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the CPU's scheduling of a step (us)
    cpu_overlapped: bool = False  # asynchronous scheduling: the CPU's work overlaps the GPU's
    skew: SkewFit | None = None  # the attention's penalty for decodes of unequal history (None: none)
    expert_parallel_size: int = 1  # GPUs the experts are split over (1: every expert on this GPU)
    data_parallel_size: int = 1  # ranks whose tokens meet at the experts (expert parallelism)
    dispatch: AllReduceCost | None = (
        None  # the expert dispatch and combine, by the tokens of all the ranks (None: none)
    )
    name = "measured"

    def __post_init__(self):
        validate.positive_int("num_layers", self.num_layers)
        validate.positive_int("tensor_parallel_size", self.tensor_parallel_size)
        validate.in_range("step_overhead_ms", self.step_overhead_ms, "step_ms")
        self._check_axis("dense_tokens", self.dense_tokens, 1)
        self._check_axis("sequences", self.sequences, 1)
        self._check_values("dense_us", self.dense_us, (len(self.dense_tokens),))
        self._check_values("per_sequence_us", self.per_sequence_us, (len(self.sequences),))
        if len(self.attention_axes) != 4:
            validate.fail(
                "attention_axes",
                len(self.attention_axes),
                "must be the 4 axes (prefill chunk tokens, their history, decodes, decode history)",
            )
        for name, axis in zip(("prefill_chunk", "kv_prefill", "n_decode", "kv_decode"), self.attention_axes):
            self._check_axis(f"attention_axes[{name}]", axis, 0)
        self._check_values("attention_us", self.attention_us, tuple(len(a) for a in self.attention_axes))
        if self.num_experts:
            validate.positive_int("num_experts_per_tok", self.num_experts_per_tok)
            self._check_axis("moe_tokens", self.moe_tokens, 1)
            self._check_axis("moe_experts", self.moe_experts, 1)
            self._check_values("moe_us", self.moe_us, (len(self.moe_tokens), len(self.moe_experts)))
        if len(self.cpu_sequences):
            self._check_axis("cpu_sequences", self.cpu_sequences, 1)
            self._check_values("cpu_us", self.cpu_us, (len(self.cpu_sequences),))
        validate.one_of("cpu_overlapped", self.cpu_overlapped, [True, False])
        validate.positive_int("expert_parallel_size", self.expert_parallel_size)
        validate.positive_int("data_parallel_size", self.data_parallel_size)
        sizes = list(self.cudagraph_capture_sizes)
        if sizes and (sizes != sorted(set(sizes)) or sizes[0] < 1):
            validate.fail("cudagraph_capture_sizes", tuple(sizes), "must be increasing token counts >= 1")
        for name in ("all_reduce", "dispatch"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), AllReduceCost):
                validate.fail(name, type(getattr(self, name)).__name__, "must be an AllReduceCost or None")
        if self.skew is not None and not isinstance(self.skew, SkewFit):
            validate.fail("skew", type(self.skew).__name__, "must be a SkewFit or None")
        object.__setattr__(self, "clock", self._clock())

    def _clock(self) -> step_time.Clock:
        """The step cost as kvlab.core.cost.step_time reads it: its tables as Python lists (a step is a few bisections
        and blends, no numpy call), its scalars as numbers."""
        attention = np.asarray(self.attention_us)
        parts = {
            "sizes": self.cudagraph_capture_sizes,
            "dense_tokens": self.dense_tokens,
            "dense_us": self.dense_us,
            "sequences": self.sequences,
            "per_sequence_us": self.per_sequence_us,
            "attention": attention,
            "decode_grid": attention[0, 0],  # no prefill chunk: the decode-only plane
        }
        parts |= dict(zip(("axis0", "axis1", "axis2", "axis3"), self.attention_axes))
        if self.num_experts:
            parts |= {"moe_tokens": self.moe_tokens, "moe_experts": self.moe_experts, "moe_us": self.moe_us}
        scalars = {}
        for name, cost in (("all_reduce", self.all_reduce), ("dispatch", self.dispatch)):
            if cost is not None:
                parts[f"{name}_sizes"], parts[f"{name}_us"] = cost._table
                scalars[f"{name}_per_step"] = cost.num_per_step
                scalars[f"{name}_bytes_per_token"] = cost.bytes_per_token
        parts["cpu_sequences"], parts["cpu_us"] = self.cpu_sequences, self.cpu_us
        skew = self.skew
        if skew is not None:
            parts["skew_chunks"] = sorted(skew.prefill_chunks, key=skew.prefill_chunks.get)
            parts |= dict(zip(("skew_bins0", "skew_bins1", "skew_bins2", "skew_bins3"), skew.bins))
            parts["skew_alpha"] = skew.alpha
            scalars["skew"], scalars["skew_default"] = 1, skew.alpha_default
        experts = ("num_experts", "num_experts_per_tok", "expert_parallel_size", "data_parallel_size")
        return step_time.clock(
            2,
            {name: np.asarray(table, dtype=np.float64).ravel().tolist() for name, table in parts.items()},
            layers=self.num_layers,
            **{name: getattr(self, name) for name in experts},
            cpu_overlapped=self.cpu_overlapped,
            overhead_us=self.step_overhead_ms * 1000.0,
            **scalars,
        )

    @staticmethod
    def _check_axis(name: str, axis, first: int) -> None:
        values = np.asarray(axis, dtype=np.float64)
        if values.ndim != 1 or len(values) < 2 or values[0] < first or np.any(np.diff(values) <= 0):
            validate.fail(name, values.tolist()[:6], f"must be at least 2 increasing points from {first}")

    @staticmethod
    def _check_values(name: str, values, shape: tuple) -> None:
        values = np.asarray(values, dtype=np.float64)
        if values.shape != shape:
            validate.fail(name, values.shape, f"must have the shape {shape} of its axes")
        if not np.all(np.isfinite(values)) or values.min() < 0:
            validate.fail(
                name, float(values[~np.isfinite(values) | (values < 0)].flat[0]), "must be finite times >= 0 us"
            )

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_profile(
        cls, profile, model, config=None, step_overhead_ms: float = 0.0, words: str = ""
    ) -> MeasuredStepCost:
        """The measured step cost of a complete kvlab.core.profiles.OperatorProfile for model (its layers) under
        config's scheduler (CUDA-graph sizes) and tensor parallelism (the all-reduce); words: where the profile
        comes from (default: its label)."""
        from kvlab.core import profiles
        from kvlab.core.config import EngineConfig

        config = EngineConfig() if config is None else config
        entry = profile.entry
        if not profiles.serves(entry, model) or not profile.complete:
            validate.fail(
                "profile", entry.label, f"must be a complete profile of {model.name} or of a model of its layer shapes"
            )
        tp = config.parallel.tensor_parallel_size
        if tp != entry.tensor_parallel_size:
            validate.fail("tensor_parallel_size", tp, f"must be the profile's ({entry.tensor_parallel_size})")
        tokens, dense = profile.dense
        unknown = sorted(set(dense) - set(profiles.LAYER_CALLS) - set(profiles.STEP_CALLS))
        if unknown:
            validate.fail("profile", entry.label, f"has operators kvlab does not place in a step: {', '.join(unknown)}")
        layer_us = sum(calls * dense[op] for op, calls in profiles.LAYER_CALLS.items() if op in dense)
        step_us = sum(calls * dense[op] for op, calls in profiles.STEP_CALLS.items() if op in dense)
        sequences, per_sequence = profile.per_sequence
        axes, attention = profile.attention
        source = words or entry.label
        if entry.model != model.name:
            source += f" (a model of {model.name}'s layer shapes, timed at its {model.num_layers} layers)"
        all_reduce, why = step_all_reduce(entry.gpu, tp, entry.hidden_size, model.num_layers)
        source += why
        moe = profile.moe if entry.num_experts else (np.zeros(0), np.zeros(0), np.zeros((0, 0)))
        scheduler = config.scheduler
        cpu_sequences, cpu_us, overlapped, cpu_words = scheduler_cpu(config)
        source += cpu_words
        if profile.skew is not None:
            source += f"; attention skew: {profile.skew.describe()}"
        ep, dp, dispatch, ep_words = expert_parallel(entry, model, config)
        source += ep_words
        return cls(
            model.num_layers,
            tokens,
            model.num_layers * layer_us + step_us,
            sequences,
            sum(per_sequence.values()),
            axes,
            attention,
            cudagraph_capture_sizes(scheduler.max_num_seqs, scheduler.max_num_batched_tokens),
            *moe,
            entry.num_experts,
            entry.num_experts_per_tok,
            all_reduce,
            tp,
            step_overhead_ms,
            source,
            cpu_sequences,
            cpu_us,
            overlapped,
            profile.skew,
            ep,
            dp,
            dispatch,
        )

    # ---------------------------------------------------------------- terms (us)
    @property
    def terms(self) -> tuple[str, ...]:
        """The terms of MEASURED_TERMS this step cost has (the MoE block, the all-reduce and the CUDA-graph padding
        only where it has them)."""
        has = {
            "MoE block": bool(self.num_experts),
            "expert dispatch": self.dispatch is not None,
            "all-reduce": self.all_reduce is not None,
            "CUDA-graph padding": bool(self.cudagraph_capture_sizes),
            "CPU scheduling": bool(len(self.cpu_sequences)),
            "attention skew": self.skew is not None,
        }
        return tuple(t for t in MEASURED_TERMS if has.get(t, True))

    def without(self, term: str) -> MeasuredStepCost:
        """The same step cost with one of its terms switched off (its times 0, or no padding), to see what the term
        adds to a run: a counterfactual, never a step cost to serve with."""
        validate.one_of("term", term, self.terms)
        off = {
            "dense layers": {"dense_us": np.zeros_like(self.dense_us)},
            "attention": {"attention_us": np.zeros_like(np.asarray(self.attention_us))},
            "lm_head and sampler": {"per_sequence_us": np.zeros_like(self.per_sequence_us)},
            "MoE block": {"moe_us": np.zeros_like(self.moe_us)},
            "expert dispatch": {"dispatch": None},
            "all-reduce": {"all_reduce": None},
            "CUDA-graph padding": {"cudagraph_capture_sizes": ()},
            "CPU scheduling": {"cpu_sequences": np.zeros(0), "cpu_us": np.zeros(0)},
            "attention skew": {"skew": None},
        }[term]
        return replace(self, **off, source=f"{self.source}, without its {term}")

    def padded_tokens(self, num_tokens: int) -> int:
        """The tokens a step of num_tokens runs with: the next CUDA-graph capture size, or itself past the last."""
        return step_time.padded_tokens(self.clock, num_tokens)

    def active_experts(self, num_tokens: int) -> float:
        """Experts this GPU runs in a layer for num_tokens tokens of its rank (the class's docstring)."""
        return step_time.active_experts(self.clock, num_tokens)

    def moe_block_us(self, num_tokens: int) -> float:
        """One layer's MoE block at num_tokens (us; 0 for a dense model): with expert parallelism, this GPU's E / EP
        experts, as many of them as the data-parallel ranks' tokens hit (the class's docstring)."""
        return step_time.moe_block_us(self.clock, num_tokens)

    def fixed_us(
        self, num_tokens: int, num_sequences: int, expert_tokens: float | None = None, pad: bool = True
    ) -> float:
        """Every term but attention (us): dense and all-reduce at the padded tokens (num_tokens itself with pad
        False), MoE and dispatch there too or at expert_tokens (a rank's share of the tokens every rank sends the
        experts), per-sequence (none for 0 sequences: vLLM's dummy batch samples nothing), overhead."""
        return step_time.fixed_us(
            self.clock, num_tokens, num_sequences, -1.0 if expert_tokens is None else expert_tokens, pad
        )

    def with_cpu_us(self, gpu_us: float, num_sequences: int) -> float:
        """A step of gpu_us of GPU work for num_sequences scheduled sequences with the CPU's scheduling (us): added
        (synchronous) or the longer of the two (asynchronous); gpu_us itself without a CPU table."""
        return step_time.with_cpu_us(self.clock, gpu_us, step_time.cpu_us(self.clock, num_sequences))

    def decode_attention_us(self, num_decodes: int, history_tokens: float) -> float:
        """One layer's attention for num_decodes decodes of history_tokens computed tokens each (us)."""
        return step_time.decode_attention_us(self.clock, num_decodes, history_tokens)

    def mixed_attention_us(
        self, prefill_tokens: int, prefill_history_tokens: float, num_decodes: int, decode_history_tokens: float
    ) -> float:
        """One layer's attention for a prefill chunk of prefill_tokens after prefill_history_tokens beside
        num_decodes decodes of decode_history_tokens each (us): multilinear on the measured grid."""
        if not prefill_tokens:
            return self.decode_attention_us(num_decodes, decode_history_tokens)
        return step_time.mixed_attention_us(
            self.clock, prefill_tokens, prefill_history_tokens, num_decodes, decode_history_tokens
        )

    def step_s(self, batch: Batch) -> float:
        """Seconds of one step (see the class)."""
        return step_time.measured_s(self.clock, *batch)

    def group_step_s(self, batches) -> float:
        """Seconds of one step of data-parallel ranks in lockstep (vLLM's mixture-of-experts data parallelism; one
        Batch a rank, None for a rank with nothing scheduled, which runs vLLM's dummy batch of one token: no
        attention, no sampling, no scheduling). vLLM's coordinate_batch_across_dp (vllm/v1/worker/dp_utils.py): where
        every rank runs a CUDA graph (the largest rank's tokens at most the last capture size), every rank runs padded
        to the largest rank's graph size, and the dense, MoE, all-reduce and dispatch terms are read there, the
        experts hit by DP x those tokens; otherwise every rank runs eagerly at its own tokens, and the experts receive
        every rank's tokens, read as the ranks' mean. Attention, per-sequence work and the CPU's scheduling are each
        rank's own. The step lasts as long as its slowest rank."""
        tokens = [b[0] if b is not None and b[0] else 1 for b in batches]
        largest, sizes = max(tokens), self.cudagraph_capture_sizes
        graphs = bool(sizes) and largest <= sizes[-1]
        experts = -1.0 if graphs else sum(tokens) / len(tokens)
        slowest = 0.0
        for batch, own in zip(batches, tokens):
            run = largest if graphs else own
            if batch is None or not batch[0]:
                us = step_time.fixed_us(self.clock, run, 0, experts, graphs)
            else:
                us = self.with_cpu_us(*step_time.gpu_us(self.clock, run, experts, graphs, *batch))
            slowest = us if us > slowest else slowest
        return slowest / 1e6

    def _gpu_us(
        self, batch: Batch, num_tokens: int, expert_tokens: float | None = None, pad: bool = True
    ) -> tuple[float, int]:
        """The GPU's work of a step (us) with its dense, MoE and all-reduce terms read at num_tokens (the batch's
        own, or the largest of data-parallel ranks in lockstep; fixed_us says what expert_tokens and pad change),
        and the sequences it schedules."""
        experts = -1.0 if expert_tokens is None else expert_tokens
        return step_time.gpu_us(self.clock, num_tokens, experts, pad, *batch)

    def min_step_s(self, num_tokens: int) -> float:
        """A lower bound on any step of num_tokens scheduled tokens (s), whatever the batch: every term but
        attention (at least 0) at those tokens, the per-sequence term at its least measured value."""
        one = interp(self.sequences.tolist(), self.per_sequence_us.tolist(), 1)
        us = self.fixed_us(num_tokens, 1) - one + min(self.per_sequence_us.tolist())
        return combine_cpu(us, min(self.cpu_us.tolist(), default=0.0), self.cpu_overlapped) / 1e6

    def describe(self) -> str:
        """The step cost in words: the profile it was read from."""
        return self.source


@lru_cache(maxsize=64)
def step_all_reduce(gpu_name: str, tensor_parallel_size: int, hidden_size: int, num_layers: int):
    """(AllReduceCost or None, in words for a provenance) of a step on tensor_parallel_size GPUs of gpu_name."""
    from kvlab.core import profiles

    if tensor_parallel_size == 1:
        return None, ""
    link = profiles.interconnect(gpu_name)
    if link is None:
        return None, f"; all-reduce left out (data/profiles/interconnects.csv has no link for the {gpu_name})"
    cost = AllReduceCost.for_step(link, tensor_parallel_size, hidden_size, num_layers)
    return cost, f"; all-reduce: {cost.describe()}"


def expert_parallel(entry, model, config) -> tuple[int, int, AllReduceCost | None, str]:
    """(expert_parallel_size, data_parallel_size, the expert dispatch and combine or None, in words) of a MoE profile
    under config: expert parallelism over DP x TP GPUs where config enables it (MeasuredStepCost's docstring), else
    (1, 1, None, "") or, with data parallelism alone, the MoE block as on one rank, saying so."""
    from kvlab.core import profiles

    parallel = config.parallel
    dp, tp = parallel.data_parallel_size, parallel.tensor_parallel_size
    if not entry.num_experts or dp * tp == 1:
        return 1, 1, None, ""
    if not parallel.enable_expert_parallel:
        if dp == 1:
            return 1, 1, None, ""
        return (
            1,
            1,
            None,
            (
                f"; data parallelism without expert parallelism: the MoE block as one rank's alone (vLLM slices every "
                f"expert over the {dp * tp} GPUs; not modelled)"
            ),
        )
    ep = dp * tp
    link = profiles.interconnect(entry.gpu)
    words = f"; expert parallelism over {ep} GPUs: {entry.num_experts // ep} of {entry.num_experts} experts a GPU"
    words += f", the {dp} ranks in lockstep (padded to the largest rank's tokens where all run CUDA graphs)"
    if link is None:
        words += f"; the expert dispatch and combine left out (data/profiles/interconnects.csv has no link for the {entry.gpu})"
        return ep, dp, None, words
    dispatch = DispatchCombine.for_step(link, dp, entry.hidden_size, model.num_layers)
    return ep, dp, dispatch, words + f"; {dispatch.describe()}"


def model_all_reduce(model, gpu_name: str, tensor_parallel_size: int):
    """step_all_reduce of a ModelSpec, or (None, why) where its hidden_size is unknown."""
    if tensor_parallel_size > 1 and not model.hidden_size:
        return None, f"; all-reduce left out ({model.name}'s hidden_size is unknown)"
    return step_all_reduce(gpu_name, tensor_parallel_size, model.hidden_size, model.num_layers)


def scheduler_cpu(config) -> tuple[np.ndarray, np.ndarray, bool, str]:
    """The CPU's scheduling under config (kvlab.core.profiles.scheduler_cpu_us): (scheduled sequences, us a step,
    whether it overlaps the GPU, in words for a provenance)."""
    from kvlab.core import profiles

    overlapped = config.scheduler.async_scheduling
    sequences, cpu_us = profiles.scheduler_cpu_us(config.cache.enable_prefix_caching, overlapped)
    words = f"; CPU: {profiles.SCHEDULER_CPU_MACHINE}, " + (
        "overlapping the GPU (asynchronous scheduling)" if overlapped else "added to each step"
    )
    return sequences, cpu_us, overlapped, words


def measured_step_cost(
    model, gpu, config=None, step_overhead_ms: float = 0.0, fractions_gpu: str | None = None
) -> MeasuredStepCost | RooflineStepCost:
    """The measured step cost of a ModelSpec on a GpuSpec at config's parallelism: its operator profile where
    data/profiles has one (same GPU and tensor_parallel_size, no pipeline parallelism; the model's own, else a model's
    of the same layer shapes, kvlab.core.profiles.find_profile: LLMServingSim's, which times vLLM's own layers whole
    and mixed batches as they run), else its profile composed from the GPU's operator tables by shape
    (kvlab.core.operators.compose_profile: vLLM's kernels one at a time, AIConfigurator's, which time every term and so
    win over the next), else its linear layers where a profile times only
    those (vidur's: kvlab.core.cost.linear_profile.LinearProfileStepCost), else the roofline
    at the GPU's sustained bandwidth and FLOP/s (kvlab.core.profiles.sustained_fractions), a RooflineStepCost
    whose provenance says so; a GPU no profile measures is refused, unless fractions_gpu names a measured GPU of
    the same chip whose sustained fractions it takes (e.g. the A100-40GB from the A100-SXM-80GB)."""
    from kvlab.core import operators, profiles
    from kvlab.core.config import EngineConfig

    config = EngineConfig() if config is None else config
    covered = sorted(set(profiles.measured_gpus()) | set(operators.operator_gpus()))
    if fractions_gpu is not None:
        validate.one_of("fractions_gpu", fractions_gpu, covered)
    elif gpu.name not in covered:
        validate.fail(
            "gpu",
            gpu.name,
            f"has no operator-level measurement for the measured clock; GPUs with measurements: {', '.join(covered)} "
            "(or use the roofline clock: --cost roofline)",
        )
    tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
    profile = profiles.find_profile(gpu.name, model, tp) if pp == 1 else None
    if profile is not None:
        return MeasuredStepCost.from_profile(profile, model, config, step_overhead_ms)
    why_not_tables = ""
    if pp == 1 and fractions_gpu is None:
        composed, words = composed_step_cost(model, gpu.name, config, step_overhead_ms)
        if composed is not None:
            return replace(composed, source=f"{composed.source}; {composition_error_text()}")
        why_not_tables = f"; operator tables: {words}"
    if pp == 1 and fractions_gpu is None and not step_overhead_ms:
        partly = linear_profile_step_cost(model, gpu, config)
        if partly is not None:
            return partly
    why = "pipeline parallelism is not profiled" if pp > 1 else f"no profile of {model.name} at TP {tp}"
    source = fractions_gpu or gpu.name
    return sustained_roofline(model, gpu, config, source, f"{why}{why_not_tables}; {fallback_error_text(source)}")


def linear_profile_step_cost(model, gpu, config):
    """A LinearProfileStepCost where data/profiles times model's linear layers on gpu at config's TP but nothing else
    (vidur's profiles), else None: those layers measured, the rest at the sustained rates (sustained_roofline less
    the linear layers' weights and FLOPs), the CPU's scheduling as the measured clock has it."""
    from kvlab.core import profiles

    tp = config.parallel.tensor_parallel_size
    for entry in profiles.load_index():
        if (entry.gpu, entry.tensor_parallel_size) != (gpu.name, tp) or not profiles.serves(entry, model):
            continue
        profile = profiles.load_profile(entry)
        if profile.dense is None or not set(profiles.LINEAR_LAYERS) <= set(profile.dense[1]):
            continue
        tokens, times = profile.dense
        layer_bytes = sum(profiles.linear_weights_bytes(entry).values())  # one GPU's share of one layer
        whole = sustained_roofline(model, gpu, config, gpu.name, "")
        rest_bytes = whole.weights_bytes - model.num_layers * layer_bytes
        if rest_bytes <= 0:  # a parameter count below the layers' own: not this model's
            return None
        rest = replace(
            whole,
            weights_bytes=rest_bytes,
            num_params=rest_bytes / profiles.WEIGHT_BYTES[entry.dtype],
            provenance="",
        )
        scheduler = config.scheduler
        cpu_sequences, cpu_us, overlapped, cpu_words = scheduler_cpu(config)
        _, all_reduce_why = model_all_reduce(model, gpu.name, tp)
        return LinearProfileStepCost(
            model.num_layers,
            tokens,
            sum(times[name] for name in profiles.LINEAR_LAYERS),
            rest,
            cudagraph_capture_sizes(scheduler.max_num_seqs, scheduler.max_num_batched_tokens),
            tuple(cpu_sequences.tolist()),
            tuple(cpu_us.tolist()),
            overlapped,
            f"{entry.label}: its linear layers measured (no complete profile of {model.name} on the {gpu.name}); the "
            f"rest (the other weights, the KV cache, attention) at {profiles.sustained_fractions(gpu.name).describe()}"
            + all_reduce_why
            + cpu_words,
        )
    return None


def gpu_fractions(gpu_name: str):
    """The sustained fractions of a GPU's datasheet: its profiles' (kvlab.core.profiles.sustained_fractions), else
    its operator tables' (kvlab.core.operators.table_fractions)."""
    from kvlab.core import operators, profiles

    if gpu_name not in profiles.measured_gpus() and gpu_name in operators.operator_gpus():
        return operators.table_fractions(gpu_name)
    return profiles.sustained_fractions(gpu_name)


def sustained_roofline(model, gpu, config, fractions_gpu: str, why: str) -> RooflineStepCost:
    """The roofline of model on gpu at the bandwidth and FLOP/s fractions the profiles of fractions_gpu sustain
    (kvlab.core.profiles.sustained_fractions), plus the all-reduces at TP > 1 (step_all_reduce): the measured step
    cost's fallback, its provenance saying why."""
    fractions = gpu_fractions(fractions_gpu)
    roofline = RooflineStepCost.from_specs(model, gpu, config)
    all_reduce, all_reduce_why = model_all_reduce(model, gpu.name, config.parallel.tensor_parallel_size)
    return RooflineStepCost(
        roofline.weights_bytes,
        roofline.kv_bytes_per_token,
        roofline.num_params,
        roofline.memory_bandwidth_gb_s * fractions.memory_bandwidth_fraction,
        roofline.bf16_dense_tflops * fractions.flop_fraction,
        f"roofline scaled by sustained fractions measured on {fractions_gpu} ({why}): {fractions.describe()}"
        + all_reduce_why,
        all_reduce,
    )


# The models on which the fallback is set against a step composed from the operator tables, on a GPU no complete
# profile measures (TP 1, vLLM's defaults): a dense one and a mixture of experts every table GPU composes.
TABLE_CHECK_MODELS = ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B")
# The decode steps on which the fallback is set against a profile: requests x tokens cached per request.
FALLBACK_CHECK_BATCHES = (1, 8, 32, 128)
FALLBACK_CHECK_CONTEXTS = (512, 2048, 8192)


@lru_cache(maxsize=16)
def fallback_error(gpu_name: str) -> dict[str, tuple[float, float, int]]:
    """How far the fallback (sustained_roofline) is off the profiles where both are known: for every complete
    profile on gpu_name, each decode step of FALLBACK_CHECK_BATCHES x FALLBACK_CHECK_CONTEXTS timed both ways
    (vLLM's default settings at the profile's TP), fallback / profile - 1. By kind of model ("dense", "mixture-of-
    experts", whose every expert the roofline counts): (lowest, highest, profiles compared); {} where the GPU has
    no complete profile."""
    from kvlab.core import operators, profiles
    from kvlab.core.config import EngineConfig, ParallelConfig
    from kvlab.core.models import get_gpu, get_model

    gpu, references = get_gpu(gpu_name), []  # (model, kind, config, the measured or composed step cost)
    for entry in profiles.load_index():
        profile = profiles.load_profile(entry) if entry.gpu == gpu_name else None
        if profile is None or not profile.complete:
            continue
        model, kind = get_model(entry.model), "mixture-of-experts" if entry.num_experts else "dense"
        config = EngineConfig(parallel=ParallelConfig(tensor_parallel_size=entry.tensor_parallel_size))
        references.append((model, kind, config, MeasuredStepCost.from_profile(profile, model, config)))
    if gpu_name not in profiles.measured_gpus() and gpu_name in operators.operator_gpus():
        # a GPU the tables alone measure: set against the steps they compose
        for name in TABLE_CHECK_MODELS:
            model, config = get_model(name), EngineConfig()
            composed, _ = composed_step_cost(model, gpu_name, config)
            if composed is not None:
                references.append((model, "mixture-of-experts" if model.layer_sizes[2] else "dense", config, composed))
    errors, compared = {}, {}
    for model, kind, config, reference in references:
        fallback = sustained_roofline(model, gpu, config, gpu_name, "")
        for b in FALLBACK_CHECK_BATCHES:
            for c in FALLBACK_CHECK_CONTEXTS:
                batch = Batch(b, b * c, b, b * c)
                errors.setdefault(kind, []).append(fallback.step_s(batch) / reference.step_s(batch) - 1.0)
        compared[kind] = compared.get(kind, 0) + 1
    return {kind: (min(e), max(e), compared[kind]) for kind, e in errors.items()}


@lru_cache(maxsize=16)
def linear_fallback_error(gpu_name: str) -> tuple[float, float, int] | None:
    """Where gpu_name's profiles time the linear layers only (vidur's): how far the fallback's rule is off them on
    those layers, at FALLBACK_CHECK_BATCHES tokens: max(their weights at the sustained bandwidth, 2 FLOPs a weight
    a token at the sustained FLOP/s) / the measured qkv_proj + o_proj + gate_up_proj + down_proj - 1, as (lowest,
    highest, profiles compared); None where no profile times them. The sustained fractions are the median of
    these same profiles, so this is the spread around them, not an independent check."""
    from kvlab.core import profiles
    from kvlab.core.models import get_gpu

    gpu, fractions = get_gpu(gpu_name), profiles.sustained_fractions(gpu_name)
    bandwidth = gpu.memory_bandwidth_gb_s * 1e9 * fractions.memory_bandwidth_fraction
    flops = gpu.bf16_dense_tflops * 1e12 * fractions.flop_fraction
    errors, compared = [], 0
    for entry in profiles.load_index():
        profile = profiles.load_profile(entry) if entry.gpu == gpu_name else None
        if profile is None or profile.dense is None or not set(profiles.LINEAR_LAYERS) <= set(profile.dense[1]):
            continue
        tokens, times = profile.dense
        weights = sum(profiles.linear_weights_bytes(entry).values())
        for t in FALLBACK_CHECK_BATCHES:
            measured_us = sum(np.interp(t, tokens, times[name]) for name in profiles.LINEAR_LAYERS)
            rule_s = max(weights / bandwidth, 2.0 * weights / profiles.WEIGHT_BYTES[entry.dtype] * t / flops)
            errors.append(rule_s * 1e6 / measured_us - 1.0)
        compared += 1
    return (min(errors), max(errors), compared) if compared else None


def composed_step_cost(model, gpu_name: str, config, step_overhead_ms: float = 0.0):
    """(the MeasuredStepCost of model's profile composed from gpu_name's operator tables, with the kernel gaps a whole
    step adds (kvlab.core.operators.kernel_gap_us_per_layer) as its step overhead, or None; in words: its provenance,
    or why the tables cannot time it)."""
    from kvlab.core import operators

    parallel = config.parallel
    tp = parallel.tensor_parallel_size
    dp = parallel.data_parallel_size
    ep = dp * tp if parallel.enable_expert_parallel else 1
    composed, words = operators.compose_profile(model, gpu_name, tp, config.cache.kv_cache_dtype, ep, dp)
    if composed is None:
        return None, words
    gap_us, steps = operators.kernel_gap_us_per_layer()
    gap_ms = gap_us * model.num_layers / 1000.0
    words += (
        f"; kernel gaps: {gap_us:.1f} us a decoder layer, {gap_ms:.2f} ms a step (a whole decode step on kvlab's H200 "
        f"against its kernels timed alone, median of {steps} steps; taken for every GPU)"
    )
    return MeasuredStepCost.from_profile(composed, model, config, step_overhead_ms + gap_ms, words), words


@lru_cache(maxsize=1)
def composition_error() -> tuple[float, float, int, tuple[str, ...]]:
    """How far a step composed from the operator tables (kvlab.core.operators) is off a whole-model profile where
    both measure the same model on the same GPU at the same TP: each decode step of FALLBACK_CHECK_BATCHES x
    FALLBACK_CHECK_CONTEXTS, composed / profile - 1, as (lowest, highest, profiles compared, their GPUs)."""
    from kvlab.core import operators, profiles
    from kvlab.core.config import EngineConfig, ParallelConfig
    from kvlab.core.models import get_model

    errors, compared, gpus = [], 0, set()
    for entry in profiles.load_index():
        profile = profiles.load_profile(entry)
        if not profile.complete or entry.gpu not in operators.operator_gpus():
            continue
        model = get_model(entry.model)
        config = EngineConfig(parallel=ParallelConfig(tensor_parallel_size=entry.tensor_parallel_size))
        parts, _ = composed_step_cost(model, entry.gpu, config)
        if parts is None:
            continue
        whole = MeasuredStepCost.from_profile(profile, model, config)
        for b in FALLBACK_CHECK_BATCHES:
            for c in FALLBACK_CHECK_CONTEXTS:
                batch = Batch(b, b * c, b, b * c)
                errors.append(parts.step_s(batch) / whole.step_s(batch) - 1.0)
        compared += 1
        gpus.add(entry.gpu)
    return (min(errors), max(errors), compared, tuple(sorted(gpus))) if compared else (0.0, 0.0, 0, ())


def composition_error_text() -> str:
    """composition_error in words, for a composed step cost's provenance."""
    low, high, n, gpus = composition_error()
    if not n:
        return "no whole-model profile measures a GPU the tables cover, to say how far the composition is off"
    return (
        f"where a whole-model profile also measures (LLMServingSim's, {n} on the {', '.join(gpus)}), decode steps of "
        f"{FALLBACK_CHECK_BATCHES[0]}-{FALLBACK_CHECK_BATCHES[-1]} requests x {FALLBACK_CHECK_CONTEXTS[0]:,}-"
        f"{FALLBACK_CHECK_CONTEXTS[-1]:,} tokens composed this way are off it by {100 * low:+.0f}% to {100 * high:+.0f}%"
    )


def fallback_error_text(gpu_name: str) -> str:
    """fallback_error in words, for the fallback's provenance."""
    from kvlab.core import profiles

    found = fallback_error(gpu_name)
    if not found:
        linear = linear_fallback_error(gpu_name) if gpu_name in profiles.measured_gpus() else None
        if linear is None:
            return f"no complete profile on the {gpu_name} to say how far this fallback is off"
        low, high, n = linear
        return (
            f"no complete profile on the {gpu_name} times a whole step; on the linear layers alone, at "
            f"{FALLBACK_CHECK_BATCHES[0]}-{FALLBACK_CHECK_BATCHES[-1]} tokens, its rule is off {n} measured "
            f"profile{'s' if n > 1 else ''} by {100 * low:+.0f}% to {100 * high:+.0f}% (the spread around the fractions, "
            "their median)"
        )
    profiled = any(e.gpu == gpu_name and profiles.load_profile(e).complete for e in profiles.load_index())
    unit, against = ("profile", "the profile") if profiled else ("model", "the step composed from its operator tables")
    kinds = "; ".join(
        f"{100 * low:+.0f}% to {100 * high:+.0f}% on {n} {kind} {unit}{'s' if n > 1 else ''}"
        for kind, (low, high, n) in found.items()
    )
    return (
        f"where both are known, on decode steps of {FALLBACK_CHECK_BATCHES[0]}-{FALLBACK_CHECK_BATCHES[-1]} requests x "
        f"{FALLBACK_CHECK_CONTEXTS[0]:,}-{FALLBACK_CHECK_CONTEXTS[-1]:,} tokens on the {gpu_name}, this fallback is "
        f"off {against} by {kinds}"
    )
