"""What `kvlab plan` searches and against what: the objectives, a candidate configuration (its engine settings made
by kvlab.studies.serving, as every run's are), the search space and the deployment it does not search
(kvlab.studies.plan searches). The command's parser reads its defaults here."""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, fields

from kvlab.core import models, validate
from kvlab.core.config import CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig, serve_flag
from kvlab.studies import serving


# ---------------------------------------------------------------- objectives
@dataclass(frozen=True)
class Objectives:
    """Service-level objectives at the 95th percentile over requests: TTFT (s), TPOT (ms) and E2E latency (s);
    None: not an objective. At least one is given."""

    ttft_p95_s: float | None = None
    tpot_p95_ms: float | None = None
    e2e_p95_s: float | None = None

    def __post_init__(self):
        given = self.given()
        if not given:
            validate.fail("objectives", "none", "must give at least one of ttft_p95_s, tpot_p95_ms and e2e_p95_s")
        for name, limit in given.items():
            if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
                validate.fail(name, limit, "must be a finite number > 0")

    def given(self) -> dict:
        """The objectives set, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def shares(self, metrics: dict) -> dict:
        """Each objective's value over its limit (<= 1: met)."""
        return {name: metrics[name] / limit for name, limit in self.given().items()}

    def misses(self, metrics: dict) -> list[str]:
        """The objectives missed, in words with by how much."""
        out = []
        for name, limit in self.given().items():
            value = metrics[name]
            if value > limit:
                out.append(
                    f"{OBJECTIVE_WORDS[name]} {figure(value)} {OBJECTIVE_UNITS[name]} > {limit:g} "
                    f"({value / limit:.2f}x the objective)"
                )
        return out


def knob_value(value) -> str:
    """A knob's value as the command line writes it: on/off, 0.9, 8192, bf16."""
    return (
        ("on" if value else "off")
        if isinstance(value, bool)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def arrival_rate_per_s(arrival_s) -> float:
    """A workload's arrival rate (requests/s): its requests after the first over its arrivals' span."""
    span = float(arrival_s[-1] - arrival_s[0])
    return (len(arrival_s) - 1) / span if span > 0 else math.inf


def check_max_model_len(name: str, max_model_len: int, longest_prompt_tokens: int) -> None:
    """Refuse, in one line naming `name` (the flag or parameter the user gave), a max_model_len that a prompt of
    the workload reaches: vLLM refuses a prompt of max_model_len tokens or more."""
    longest = int(longest_prompt_tokens)
    if longest >= max_model_len:
        validate.fail(
            name,
            max_model_len,
            f"must exceed the workload's longest prompt, {longest:,} tokens (vLLM "
            f"refuses a prompt of {max_model_len:,} tokens or more); give {name} {longest + 1:,} or more",
        )


def figure(value: float) -> str:
    """A latency in words: three significant figures, whole numbers from 100 up (1,234 not 1.23e+03)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


OBJECTIVE_WORDS = {"ttft_p95_s": "p95 TTFT", "tpot_p95_ms": "p95 TPOT", "e2e_p95_s": "p95 E2E latency"}
OBJECTIVE_UNITS = {"ttft_p95_s": "s", "tpot_p95_ms": "ms", "e2e_p95_s": "s"}


# ---------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Candidate:
    """One configuration of vLLM and the number of replicas serving the workload."""

    tensor_parallel_size: int = ParallelConfig.tensor_parallel_size  # vLLM's defaults (kvlab.core.config)
    data_parallel_size: int = ParallelConfig.data_parallel_size  # > 1: a mixture-of-experts model's ranks, with EP
    max_num_seqs: int = SchedulerConfig.max_num_seqs
    max_num_batched_tokens: int = SchedulerConfig.max_num_batched_tokens
    block_size: int = CacheConfig.block_size
    gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization
    kv_cache_dtype: str = CacheConfig.kv_cache_dtype
    enable_chunked_prefill: bool = SchedulerConfig.enable_chunked_prefill
    enable_prefix_caching: bool = CacheConfig.enable_prefix_caching
    async_scheduling: bool = SchedulerConfig.async_scheduling
    num_replicas: int = 1

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size * self.num_replicas

    @property
    def settings(self) -> dict:
        """vLLM's settings of one replica by name (data parallelism with expert parallelism, as vLLM serves a
        mixture-of-experts model on several ranks)."""
        settings = {k: v for k, v in asdict(self).items() if k != "num_replicas"}
        return settings | {"enable_expert_parallel": self.data_parallel_size > 1}

    def config(self, max_model_len: int) -> EngineConfig:
        """The engine settings of one replica (kvlab.studies.serving.engine_config)."""
        return serving.engine_config(serving.ServingOptions(**self.settings), max_model_len)

    def serve_command(self, model_name: str, max_model_len: int, quantization: str = "") -> str:
        """The `vllm serve` command line of one replica (vLLM 0.33's flags, kvlab.core.config.serve_flag; each replica
        its own server); quantization "fp8" adds --quantization fp8 (a checkpoint's own block FP8 or MXFP4 needs no
        flag)."""
        settings = self.settings | {"max_model_len": max_model_len}
        names = ["tensor_parallel_size", "data_parallel_size", "enable_expert_parallel", "max_model_len"]
        names += ["max_num_seqs", "max_num_batched_tokens", "block_size", "gpu_memory_utilization", "kv_cache_dtype"]
        names += ["enable_chunked_prefill", "enable_prefix_caching", "async_scheduling"]
        if self.data_parallel_size == 1:  # vLLM's defaults: one rank, no expert parallelism
            names = [n for n in names if n not in ("data_parallel_size", "enable_expert_parallel")]
        flags = [serve_flag("quantization", "fp8")] if quantization == "fp8" else []
        return " ".join([f"vllm serve {model_name}", *flags, *(serve_flag(n, settings[n]) for n in names)])

    def label(self) -> str:
        """The candidate in a few words."""
        return (
            f"TP {self.tensor_parallel_size}"
            + (f" x DP {self.data_parallel_size} + EP" if self.data_parallel_size > 1 else "")
            + f" x {self.num_replicas} replica{'s' * (self.num_replicas > 1)}, "
            f"max_num_seqs {self.max_num_seqs}, max_num_batched_tokens {self.max_num_batched_tokens}, "
            f"block_size {self.block_size}, gpu_memory_utilization {self.gpu_memory_utilization:g}, "
            f"kv_cache_dtype {self.kv_cache_dtype}, chunked prefill {'on' if self.enable_chunked_prefill else 'off'}"
            f", prefix caching {'on' if self.enable_prefix_caching else 'off'}, "
            f"{'async' if self.async_scheduling else 'sync'} scheduling"
        )


@dataclass(frozen=True)
class SearchSpace:
    """The values each knob may take; the candidates are every combination."""

    tensor_parallel_size: tuple = (1, 2)
    data_parallel_size: tuple = (1, 2)  # above 1 for a mixture-of-experts model only (candidates(model))
    max_num_seqs: tuple = (64, 128, 256, 512)
    max_num_batched_tokens: tuple = (2048, 4096, 8192)
    block_size: tuple = (16, 32)
    gpu_memory_utilization: tuple = (0.9,)
    kv_cache_dtype: tuple = ("bf16", "fp8")
    enable_chunked_prefill: tuple = (True,)
    enable_prefix_caching: tuple = (False,)
    async_scheduling: tuple = (True, False)
    num_replicas: tuple = (1, 2, 3, 4)

    def __post_init__(self):
        for f in fields(self):
            values = getattr(self, f.name)
            if not isinstance(values, tuple) or not values:
                validate.fail(f.name, values, "must be a non-empty tuple of values")
            if len(set(values)) != len(values):
                validate.fail(f.name, values, "must not repeat a value")
        for name in ("tensor_parallel_size", "data_parallel_size", "num_replicas"):
            for v in getattr(self, name):
                validate.positive_int(name, v)

    @property
    def size(self) -> int:
        return math.prod(len(getattr(self, f.name)) for f in fields(self))

    def candidates(self, model=None) -> list[Candidate]:
        """Every combination, in a fixed order (each Candidate validated as its EngineConfig is built); for a dense
        model (a ModelSpec without routed experts) only those of data_parallel_size 1: vLLM runs a dense model's
        data-parallel ranks as independent engines, which the replicas are."""
        names = [f.name for f in fields(self)]
        dense = model is not None and model.expert_params_b <= 0
        return [
            Candidate(**dict(zip(names, values)))
            for values in itertools.product(*(getattr(self, n) for n in names))
            if not (dense and values[names.index("data_parallel_size")] > 1)
        ]


@dataclass(frozen=True)
class Deployment:
    """What the plan does not search: the model, the GPU, max_model_len, and whether a (model, GPU, TP) without an
    operator profile may be planned on the roofline."""

    model: object  # kvlab.core.models.ModelSpec
    gpu: object  # kvlab.core.models.GpuSpec
    max_model_len: int
    allow_roofline: bool = False

    def __post_init__(self):
        validate.in_range("max_model_len", self.max_model_len, "tokens")


def deployment(options: serving.ServingOptions, longest_prompt_tokens: int, allow_roofline: bool = False) -> Deployment:
    """The Deployment of the options' model (kvlab.studies.serving.load_model) on their GPU, max_model_len by
    serving's rule (the model's context where not given; none: refused), each refusal in one line: no GPU or model,
    a model of local-attention layers (the planner's proofs that a pool never binds count one full-attention group's
    blocks), a max_model_len that the workload's longest prompt reaches."""
    model = serving.load_model(options)
    if options.gpu is None:
        raise ValueError("kvlab plan needs --gpu, a GPU of data/gpus.csv (e.g. --gpu RTX-PRO-6000-Server-96GB)")
    if model is None:
        raise ValueError("kvlab plan needs --model (a model of data/models.csv) or --config PATH (a config.json)")
    local = sorted({model.layer_type(i) for i in range(model.num_layers)} - {"full_attention"})
    if local:
        kinds = {"sliding_attention": "sliding-window", "chunked_attention": "chunked-attention",
                 "linear_attention": "linear-attention (Mamba)"}  # fmt: skip
        raise ValueError(
            f"kvlab plan cannot plan {model.name} yet: its {' and '.join(kinds[k] for k in local)} layers make vLLM's "
            "hybrid KV cache groups, whose blocks the planner's shortcuts do not count yet (kvlab simulate --model "
            "serves them)"
        )
    gpu = models.get_gpu(options.gpu)
    max_model_len = serving.max_model_len_of(options, model)
    check_max_model_len(serving.FLAGS["max_model_len"], max_model_len, longest_prompt_tokens)
    return Deployment(model, gpu, max_model_len, allow_roofline=allow_roofline)
