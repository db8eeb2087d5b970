"""One run of kvlab's engine set up from its options, once: `setup(ServingOptions(...))` gives the Serving the engine
needs (the model, the EngineConfig, the KV pool, the KV cache groups, the step cost and the workload).

ServingOptions holds the options of a run as given, in vLLM's names and units (None where a default is a rule), and
this module owns every default and every refusal of them: each a one-line ValueError naming the option, its value,
what is allowed and the fix. `kvlab simulate --policy vllm` calls setup; `kvlab capacity` (kvlab.studies.sizing) and
`kvlab plan` (kvlab.studies.plan_space, kvlab.studies.plan) call its parts (load_model, max_model_len_of,
engine_config, check_data_parallel, workload). FLAGS is each option's flag on kvlab's command line, vLLM's
(kvlab.core.config.VLLM_FLAGS) where vLLM has one: the parsers are made from it, and a refusal naming a second option
names its flag from it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from kvlab.core import article, batching, capacity, models, resources, validate
from kvlab.core.config import VLLM_FLAGS, CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig
from kvlab.core.cost import HARDWARE_STEP_COSTS, make_step_cost
from kvlab.core.engine import DEFAULT_CONFIG, PEAK_BYTES_PER_REQUEST, NoProgressError, check_max_concurrency
from kvlab.core.engine import simulate as engine_simulate
from kvlab.core.fleet.disaggregated import DisaggregatedFleet
from kvlab.core.fleet.fleet import Fleet, bytes_per_request
from kvlab.core.fleet.routers import ROUTERS, make_router
from kvlab.core.kv_transfer import LINKS, transfer_cost
from kvlab.core.models import ModelSpec
from kvlab.core.pool import size_kv_pool
from kvlab.core.workload import Workload
from kvlab.workloads import synthetic, traces

# Each option's flag on kvlab's command line (ServingOptions', and kvlab.studies.sizing.SizingOptions' of kvlab
# capacity): vLLM's (kvlab.core.config.VLLM_FLAGS) where vLLM has one, else kvlab's.
FLAGS = VLLM_FLAGS | {"hf_config_path": "--config"}
FLAGS |= {"num_instances": "--instances", "prefill_instances": "--prefill-instances"}
FLAGS |= {"decode_instances": "--decode-instances", "kv_transfer_link": "--kv-transfer-link"}
FLAGS |= {
    name: "--" + name.replace("_", "-")
    for name in (
        "policy router num_params_b gpu num_gpu_blocks allocation cost step_ms step_ms_per_token calibration trace "
        "trace_format skip_bad_rows num_requests arrival_rate lengths constant_tokens prompt_tokens output_tokens seed "
        "num_layers num_kv_heads head_dim num_attention_heads attention kv_lora_rank qk_rope_head_dim available_kv_gib "
        "gpu_memory_gib weights_gib weight_dtype activation_peak_gib non_torch_gib unit"
    ).split()
}

# The longest request where neither max_model_len nor the model gives one: the engine's default, tokens.
DEFAULT_MAX_MODEL_LEN = DEFAULT_CONFIG.scheduler.max_model_len
# The synthetic workloads: section 2's article and constant output lengths (no prompts), or gamma prompt and output
# lengths of CV 1 (kvlab plan's stand-in for a trace, kvlab's choice of means); requests of each when not given.
LENGTHS = (*synthetic.S2_LENGTHS, "gamma")
DEFAULT_NUM_REQUESTS = {"article": article.NUM_REQUESTS_S2, "constant": article.NUM_REQUESTS_S2, "gamma": 10_000}
GAMMA_MEAN_TOKENS = {"prompt_tokens": 1000, "output_tokens": 250}
# What a step cost of a model on a GPU reads from them, for the line that asks for --model and --gpu.
HARDWARE_NEEDS = {
    "roofline": "weights, KV bytes, bandwidth and FLOPS",
    "measured": "the operator profile of the model on the GPU",
    "vllm-2023": "its weights and layers, the GPU's bandwidth and FLOPS",
}


@dataclass(frozen=True)
class ServingOptions:
    """The options of one run, as given (their flags: FLAGS). policy: vllm (kvlab's engine) or section 2's slots
    (static, continuous; they take the workload only). The model: a catalog name or a
    config.json (hf_config_path, with num_params_b where kvlab cannot count it), as quantization loads it, on a GPU
    of data/gpus.csv. The engine's settings default to vLLM's (kvlab.core.config); max_model_len None: the model's
    context, else default_max_model_len (None: refused). The pool: num_gpu_blocks, else sized from the model on the
    GPU, else the article's KV memory. The step cost: cost (None: constant, or linear with step_ms_per_token). The
    workload: the trace's requests, or a synthetic one (lengths: LENGTHS); seed None: 0, and a trace's own arrivals
    are kept; max_concurrency: vLLM bench's closed loop. num_instances > 1 or a router: a fleet of that many engines,
    each with the pool and step cost above, behind the router (kvlab.core.fleet.routers.ROUTERS)."""

    policy: str = "vllm"
    # the model and the GPU
    model: str | None = None
    hf_config_path: str | None = None
    num_params_b: float | None = None
    quantization: str | None = None
    gpu: str | None = None
    # the KV cache and the GPUs
    num_gpu_blocks: int | None = None
    block_size: int = CacheConfig.block_size
    kv_cache_dtype: str = CacheConfig.kv_cache_dtype
    gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization
    enable_prefix_caching: bool = CacheConfig.enable_prefix_caching
    disable_hybrid_kv_cache_manager: bool = not CacheConfig.hybrid_kv_cache
    attention_backend: str | None = CacheConfig.attention_backend
    tensor_parallel_size: int = ParallelConfig.tensor_parallel_size
    pipeline_parallel_size: int = ParallelConfig.pipeline_parallel_size
    data_parallel_size: int = ParallelConfig.data_parallel_size
    enable_expert_parallel: bool = ParallelConfig.enable_expert_parallel
    # the scheduler
    max_num_seqs: int = SchedulerConfig.max_num_seqs
    max_num_batched_tokens: int = SchedulerConfig.max_num_batched_tokens
    max_model_len: int | None = None
    default_max_model_len: int | None = DEFAULT_MAX_MODEL_LEN
    enable_chunked_prefill: bool = SchedulerConfig.enable_chunked_prefill
    long_prefill_token_threshold: int = SchedulerConfig.long_prefill_token_threshold
    async_scheduling: bool = SchedulerConfig.async_scheduling
    allocation: str = "paged"
    # the step cost
    cost: str | None = None
    step_ms: float | None = None
    step_ms_per_token: float | None = None
    calibration: str | None = None
    # the workload
    trace: str | None = None
    trace_format: str = "auto"
    skip_bad_rows: bool = False
    num_requests: int | None = None
    arrival_rate: float | None = None
    lengths: str = "article"
    constant_tokens: int = article.CONSTANT_TOKENS
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    seed: int | None = None
    max_concurrency: int | None = None
    # the fleet: num_instances engines behind a router (kvlab.core.fleet; None: round-robin where num_instances > 1)
    num_instances: int = 1
    router: str | None = None
    # disaggregated prefill and decode (kvlab.core.fleet.disaggregated): that many instances of each, joined by a KV
    # connector over kv_transfer_link (kvlab.core.kv_transfer.LINKS); 0: none
    prefill_instances: int = 0
    decode_instances: int = 0
    kv_transfer_link: str = "rdma-400g"

    @property
    def cost_name(self) -> str:
        """The step cost's family: cost, else linear where step_ms_per_token is given, else constant."""
        return self.cost or ("linear" if self.step_ms_per_token is not None else "constant")


# ---------------------------------------------------------------- the model and the engine's settings
def load_model(options: ServingOptions, *, params_needed: bool = True) -> ModelSpec | None:
    """The model options name (a catalog model or a config.json; None when neither), as options.quantization
    loads it; params_needed: refuse a config.json whose parameters are neither given nor countable (the weights and
    the step cost need them)."""
    if options.model is not None and options.hf_config_path is not None:
        validate.fail("model", options.model, f"give {FLAGS['model']} or {FLAGS['hf_config_path']}, not both")
    if options.model:
        model = models.get_model(options.model)
    elif options.hf_config_path is None:
        return None
    else:
        path = options.hf_config_path
        given_b = (
            0.0 if options.num_params_b is None else validate.positive_number("num_params_b", options.num_params_b)
        )
        model = models.from_config(path, num_params_b=given_b)
        if params_needed and model.num_params_b <= 0:
            why = models.count_params(models.load_config(path)[0])[1]
            raise ValueError(
                f"{FLAGS['hf_config_path']} {path}: {why}; give {FLAGS['num_params_b']} (the model's parameters, "
                "billions)"
            )
    return quantized(model, options.quantization)


def quantized(model: ModelSpec, quantization: str | None) -> ModelSpec:
    """The model as vLLM's --quantization loads it: fp8 on a 16-bit checkpoint makes its weights per-tensor FP8 (a
    checkpoint already in FP8 is loaded as it is, as vLLM loads it); none keeps a 16-bit checkpoint; one line for a
    checkpoint quantized otherwise (vLLM refuses a --quantization other than its quantization_config's method)."""
    if quantization is None:
        return model
    flag = FLAGS["quantization"]
    if quantization not in ("fp8", "none"):
        raise ValueError(f"{flag}={quantization!r} is not allowed: kvlab serves fp8 and none")
    if not model.quantization:
        return dataclasses.replace(model, quantization="fp8") if quantization == "fp8" else model
    if quantization == "fp8" and model.quantization in ("fp8", "fp8_block"):
        return model
    raise ValueError(
        f"{flag}={quantization!r} is not allowed: {model.name}'s checkpoint is already {model.quantization}, "
        f"which vLLM loads as it is; drop {flag}"
    )


def max_model_len_of(options: ServingOptions, model: ModelSpec | None) -> int:
    """The longest request, tokens: max_model_len where given, else the model's context (max_position_embeddings),
    else default_max_model_len; refused where that is None too, or out of range."""
    if options.max_model_len is not None:
        max_model_len = options.max_model_len
    elif model is not None and model.max_position_embeddings:
        max_model_len = model.max_position_embeddings
    elif options.default_max_model_len is None:
        raise ValueError(f"max_model_len is needed: {model.name if model else 'the run'} gives no context length")
    else:
        max_model_len = options.default_max_model_len
    return validate.in_range("max_model_len", max_model_len, "tokens")


def engine_config(options: ServingOptions, max_model_len: int | None) -> EngineConfig:
    """The engine's settings of the options at max_model_len (max_model_len_of; None: unset); each config checks
    its own values."""
    cache = CacheConfig(
        block_size=options.block_size,
        kv_cache_dtype=options.kv_cache_dtype,
        gpu_memory_utilization=options.gpu_memory_utilization,
        hybrid_kv_cache=not options.disable_hybrid_kv_cache_manager,
        enable_prefix_caching=options.enable_prefix_caching,
        attention_backend=options.attention_backend,
    )
    scheduler = SchedulerConfig(
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=options.enable_chunked_prefill,
        long_prefill_token_threshold=options.long_prefill_token_threshold,
        async_scheduling=options.async_scheduling,
    )
    parallel = ParallelConfig(
        tensor_parallel_size=options.tensor_parallel_size,
        pipeline_parallel_size=options.pipeline_parallel_size,
        data_parallel_size=options.data_parallel_size,
        enable_expert_parallel=options.enable_expert_parallel,
    )
    return EngineConfig(cache, parallel, scheduler)


def check_data_parallel(model: ModelSpec, data_parallel_size: int, as_given: str = "", fix: str = "") -> None:
    """Refuse data-parallel ranks (data_parallel_size > 1) of a dense model, in one line: vLLM runs a dense model's
    ranks as independent engines, which kvlab serves as one rank on its share of the load (kvlab plan's replicas).
    as_given: the setting as the user wrote it (default '=N'); fix: what to do instead."""
    if data_parallel_size > 1 and model.expert_params_b <= 0:
        raise ValueError(
            f"data_parallel_size{as_given or f'={data_parallel_size}'} is not allowed for {model.name}: it is dense, "
            "and vLLM runs a dense model's data-parallel ranks as independent engines "
            f"({fix or 'drop ' + FLAGS['data_parallel_size'] + ' and serve one rank on its share of the requests'})"
        )


def check_parallel(model: ModelSpec | None, config: EngineConfig) -> None:
    """Data and expert parallelism need a mixture-of-experts model (one-line errors): kvlab steps a mixture-of-experts
    model's ranks together (kvlab.core.engine.DataParallelEngine); check_data_parallel refuses a dense model's."""
    parallel = config.parallel
    if parallel.data_parallel_size == 1 and not parallel.enable_expert_parallel:
        return
    if model is None:
        name = "data_parallel_size" if parallel.data_parallel_size > 1 else "enable_expert_parallel"
        raise ValueError(
            f"{FLAGS[name]} needs {FLAGS['model']} (or {FLAGS['hf_config_path']}): only a mixture-of-experts model's "
            "ranks step together"
        )
    capacity.check_expert_parallel(model, config)
    check_data_parallel(model, parallel.data_parallel_size)


# ---------------------------------------------------------------- the pool and the step cost
def kv_pool(options: ServingOptions, model: ModelSpec | None, config: EngineConfig, groups=None) -> tuple[int, str]:
    """num_gpu_blocks (vLLM's null block included) and where it comes from: num_gpu_blocks where given, else
    kvlab.core.pool (the model on the GPU as vLLM sizes it over groups, its KV cache groups; else the article's)."""
    if options.num_gpu_blocks is not None:
        return validate.in_range("num_gpu_blocks", options.num_gpu_blocks, "count"), FLAGS["num_gpu_blocks"]
    return size_kv_pool(config, model, options.gpu, groups)


def step_cost(options: ServingOptions, model: ModelSpec | None, config: EngineConfig):
    """The step cost of options.cost_name (kvlab.core.cost.make_step_cost), refused in one line where it lacks what
    it reads: a model on a GPU, or a readable calibration file."""
    name = options.cost_name
    if name in ("constant", "linear"):  # the step cost checks its own figures (defaults: make_step_cost's)
        return make_step_cost(name, step_ms=options.step_ms, step_ms_per_token=options.step_ms_per_token)
    if name in HARDWARE_STEP_COSTS:
        if model is None:
            raise ValueError(
                f"{FLAGS['cost']} {name} needs {FLAGS['model']} and {FLAGS['gpu']} ({HARDWARE_NEEDS[name]})"
            )
        return make_step_cost(name, model=model, gpu=models.get_gpu(options.gpu), config=config)
    try:
        return make_step_cost(name, calibration=options.calibration)
    except OSError as err:
        validate.fail("calibration", options.calibration, f"cannot be read ({err.strerror or err})")


# ---------------------------------------------------------------- the workload
def read_trace(path: str, trace_format: str = "auto", skip_bad_rows: bool = False, **kwargs) -> traces.TraceLoad:
    """The trace file as a TraceLoad (kvlab.workloads.traces.load_trace); an unreadable file is a one-line
    ValueError naming the trace."""
    try:
        return traces.load_trace(path, trace_format, on_bad_row="skip" if skip_bad_rows else "raise", **kwargs)
    except OSError as err:
        validate.fail("trace", path, f"cannot be read ({err.strerror or err})")


def trace_file_format(path: str) -> str:
    """The trace file's format as told from its first lines, or auto when it cannot be read (read_trace then
    says why in full)."""
    try:
        return traces.file_format(path)
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return "auto"


def trace_keys(load: traces.TraceLoad) -> dict:
    """What a trace adds to a run's figures (the JSON keys of kvlab simulate and kvlab plan)."""
    return {
        "trace": load.path,
        "trace_format": load.trace_format,
        "num_rows": load.num_rows,
        "num_skipped_rows": load.num_skipped,
    }


def closed_loop_arrivals(workload: Workload, rate: float | None, seed: int) -> Workload:
    """A closed loop's open-loop arrivals, vLLM bench's --request-rate: all at t=0 (its default, inf), or Poisson at
    rate requests/s drawn with seed; the workload's lengths and prefixes kept."""
    n = workload.num_requests
    arrival = np.zeros(n) if rate is None else synthetic.poisson_arrivals(n, rate, np.random.default_rng(seed))
    return dataclasses.replace(workload, arrival_s=arrival)


def workload(options: ServingOptions) -> tuple[Workload, traces.TraceLoad | None]:
    """The requests of the run and the trace's load (None for a synthetic workload): the trace's (its first
    num_requests where given; under max_concurrency its lengths only, made at t=0 or Poisson at arrival_rate), or
    a synthetic one of options.lengths (LENGTHS: Poisson at arrival_rate, all made at t=0 in a closed loop without
    one; section 2's at the article's rate by default). kvlab's engine gets section 2's requests with prompts of
    prompt_tokens (default 1: the article's workload has none and vLLM needs one). Refused where it would not fit
    this machine's memory."""
    closed = options.max_concurrency is not None
    peak = PEAK_BYTES_PER_REQUEST if options.policy == "vllm" else batching.PEAK_BYTES_PER_REQUEST
    if options.trace is None and options.lengths == "gamma":
        return _gamma_workload(options, closed, peak), None
    prompt = None
    if options.trace is None and options.policy == "vllm":
        prompt = (
            1 if options.prompt_tokens is None else validate.in_range("prompt_tokens", options.prompt_tokens, "tokens")
        )
    seed = 0 if options.seed is None else validate.in_range("seed", options.seed, "seed")
    if options.num_requests is not None:
        validate.in_range("num_requests", options.num_requests, "num_requests")
    if options.arrival_rate is not None:
        validate.in_range("arrival_rate", options.arrival_rate, "arrival_rate")
    if options.trace is not None:
        return _trace_workload(options, seed, closed, peak)
    num_requests = _num_requests(options)
    resources.refuse_if_too_big("num_requests", num_requests, peak)
    rate = synthetic.S2_ARRIVAL_RATE_PER_S if options.arrival_rate is None else options.arrival_rate
    rng = np.random.default_rng(seed)
    drawn = synthetic.article_s2_workload(
        num_requests, rate, options.lengths, rng, constant_tokens=options.constant_tokens
    )
    if closed and options.arrival_rate is None:
        drawn = dataclasses.replace(drawn, arrival_s=np.zeros(num_requests))  # vLLM bench's rate inf
    if prompt is None:
        return drawn, None
    return Workload(drawn.arrival_s, np.full(num_requests, prompt), drawn.output_tokens, name=drawn.name), None


def _num_requests(options: ServingOptions) -> int:
    """A synthetic workload's requests: num_requests, else DEFAULT_NUM_REQUESTS of its lengths."""
    if options.num_requests is not None:
        return options.num_requests
    return DEFAULT_NUM_REQUESTS[validate.one_of("lengths", options.lengths, LENGTHS)]


def _trace_workload(options: ServingOptions, seed: int, closed: bool, peak: float) -> tuple:
    """The trace's requests (workload's)."""
    rate = options.arrival_rate
    if closed:  # the file's lengths only: a ShareGPT file's arrivals are drawn at any rate, then replaced
        fmt = options.trace_format if options.trace_format != "auto" else trace_file_format(options.trace)
        rate = (rate or 1.0) if fmt == "sharegpt" else None
    load = read_trace(
        options.trace,
        options.trace_format,
        options.skip_bad_rows,
        arrival_rate_per_s=rate,
        rng=np.random.default_rng(seed),
        max_requests=options.num_requests,
    )
    if closed:
        if options.seed is not None and options.arrival_rate is None:
            raise ValueError(
                f"{FLAGS['seed']} applies with {FLAGS['trace']} and {FLAGS['max_concurrency']} only beside "
                f"{FLAGS['arrival_rate']}: the closed loop sends the trace's requests from t=0, and {FLAGS['seed']} "
                f"draws Poisson arrivals at {FLAGS['arrival_rate']}"
            )
        requests = closed_loop_arrivals(load.workload, options.arrival_rate, seed)
    else:
        if options.seed is not None and not load.poisson_arrivals:
            raise ValueError(
                f"{FLAGS['seed']} and {FLAGS['trace']} cannot be used together: the {load.trace_format} trace has its "
                f"own arrival times ({FLAGS['seed']} draws Poisson arrivals for a ShareGPT file only)"
            )
        requests = load.workload
    resources.refuse_if_too_big("num_requests", requests.num_requests, peak)
    return requests, load


def _gamma_workload(options: ServingOptions, closed: bool, peak: float) -> Workload:
    """kvlab plan's synthetic workload (workload's): Poisson arrivals at arrival_rate (all made at t=0 in a closed
    loop without one), gamma prompt and output lengths of CV 1 with GAMMA_MEAN_TOKENS' means unless given."""
    if options.num_requests is not None:
        validate.in_range("num_requests", options.num_requests, "num_requests")
    at_once = closed and options.arrival_rate is None
    if options.arrival_rate is None and not at_once:
        raise ValueError(
            f"kvlab plan needs a workload: {FLAGS['trace']} FILE, or {FLAGS['arrival_rate']} R for a synthetic one "
            f"(with {FLAGS['num_requests']}, {FLAGS['prompt_tokens']} and {FLAGS['output_tokens']})"
        )
    rate = 1.0 if at_once else validate.in_range("arrival_rate", options.arrival_rate, "arrival_rate")
    num_requests = _num_requests(options)
    resources.refuse_if_too_big("num_requests", num_requests, peak)
    means = {name: getattr(options, name) for name in GAMMA_MEAN_TOKENS}
    means = {name: GAMMA_MEAN_TOKENS[name] if tokens is None else tokens for name, tokens in means.items()}
    for name, tokens in means.items():
        validate.in_range(name, tokens, "tokens")
    seed = 0 if options.seed is None else options.seed
    rng = np.random.default_rng(validate.in_range("seed", seed, "seed"))
    w = synthetic.gamma_workload(num_requests, rate, means["prompt_tokens"], means["output_tokens"], rng)
    made = f"all made at t=0, seed {seed}" if at_once else f"Poisson arrivals at {rate:g} requests/s, seed {seed}"
    name = (
        f"synthetic ({made}; gamma lengths of CV 1, means {means['prompt_tokens']:,} prompt and "
        f"{means['output_tokens']:,} output tokens)"
    )
    return Workload(np.zeros(num_requests) if at_once else w.arrival_s, w.prompt_tokens, w.output_tokens, name=name)


# ---------------------------------------------------------------- the run
@dataclass(frozen=True)
class Serving:
    """What kvlab's engine serves a run with: the options it came from, the model (None: none named), the
    EngineConfig, the KV pool (num_gpu_blocks, vLLM's null block included, and its source in words), the model's KV
    cache groups (None: one full-attention group, served as a plain decoder), the step cost and the workload (with
    the trace's load, None for a synthetic one)."""

    options: ServingOptions
    model: ModelSpec | None
    config: EngineConfig
    num_gpu_blocks: int
    pool_source: str
    kv_cache_groups: list | None
    cost: object
    workload: Workload
    trace: traces.TraceLoad | None

    def run(self):
        """Serve the workload (kvlab.core.engine.simulate: the engine refuses its config, pool and workload in one
        line before any step); a run that cannot go on stops with why, as a one-line ValueError."""
        try:
            if self.disaggregated:
                transfer = transfer_cost(self.model, self.options.gpu, self.options.kv_transfer_link, self.config)
                return DisaggregatedFleet(self.workload, self.config, self.options.prefill_instances,
                                          self.options.decode_instances, transfer, num_gpu_blocks=self.num_gpu_blocks,
                                          cost=self.cost).run()  # fmt: skip
            if self.fleet:
                router = make_router(self.router_name, self.options.num_instances, self.config.cache.block_size,
                                     self.options.seed or 0)  # fmt: skip
                return Fleet(self.workload, self.config, router, self.options.num_instances,
                             num_gpu_blocks=self.num_gpu_blocks, cost=self.cost,
                             kv_cache_groups=self.kv_cache_groups).run()  # fmt: skip
            return engine_simulate(
                self.workload,
                self.config,
                num_gpu_blocks=self.num_gpu_blocks,
                cost=self.cost,
                allocation=self.options.allocation,
                kv_cache_groups=self.kv_cache_groups,
                max_concurrency=self.options.max_concurrency,
            )
        except NoProgressError as err:
            raise ValueError(str(err)) from None

    @property
    def fleet(self) -> bool:
        """Whether the run is a fleet's (kvlab.core.fleet): more than one instance, or a router named."""
        return self.options.num_instances > 1 or self.options.router is not None

    @property
    def disaggregated(self) -> bool:
        """Whether prefill and decode run on instances of their own (kvlab.core.fleet.disaggregated)."""
        return self.options.prefill_instances > 0

    @property
    def router_name(self) -> str:
        return self.options.router or "round-robin"

    def summary(self, result) -> dict:
        """The run's figures (kvlab simulate --policy vllm --json): the settings served, the step cost and where its
        numbers come from, latency, preemptions, steps, KV blocks and throughput; a fleet's, its own
        (kvlab.core.fleet.FleetResult.summary: TTFT's parts, the prefix caches' hit rate, each instance's counts)."""
        summary = result.summary()
        if self.disaggregated:
            transfer = transfer_cost(self.model, self.options.gpu, self.options.kv_transfer_link, self.config)
            keys = {
                "num_prefill_instances": self.options.prefill_instances,
                "num_decode_instances": self.options.decode_instances,
                "kv_transfer_link": transfer.link,
                "kv_transfer_source": transfer.source,
                "kv_transfer_bytes_per_block": transfer.bytes_per_block,
            }
            return self.settings() | keys | summary | self.model_keys() | self.trace_summary()
        if self.fleet:
            return self.settings() | summary | self.model_keys() | self.trace_summary()
        out = self.settings() | {
            "num_requests": summary["num_requests"],
            **{k: summary[k] for k in SUMMARY_KEYS},
            "num_output_tokens": summary["num_output_tokens"],
            "num_capped_by_max_model_len": int((result.num_output_tokens < self.workload.output_tokens).sum()),
            "makespan_s": summary["makespan_s"],
            "mean_kv_token_share": summary["mean_kv_token_share"],
        }
        if self.options.max_concurrency is not None:
            out["max_concurrency"] = self.options.max_concurrency
        out |= self.model_keys()
        parallel = self.config.parallel
        ranks = parallel.data_parallel_size
        if ranks > 1:
            out |= {
                "data_parallel_size": ranks,
                "enable_expert_parallel": parallel.enable_expert_parallel,
                "requests_per_rank": np.bincount(result.data_parallel_rank, minlength=ranks).tolist(),
            }
        return out | self.trace_summary()

    def settings(self) -> dict:
        """The settings served and the step cost (the first keys of kvlab simulate --policy vllm --json)."""
        scheduler, cache = self.config.scheduler, self.config.cache
        return {
            "policy": "vllm",
            "async_scheduling": scheduler.async_scheduling,
            "allocation": self.options.allocation,
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": cache.block_size,
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "max_model_len": scheduler.max_model_len,
            "enable_chunked_prefill": scheduler.enable_chunked_prefill,
            "enable_prefix_caching": cache.enable_prefix_caching,
            "cost": self.options.cost_name,
            "cost_source": f"{self.options.cost_name}, {self.cost.describe()}",
        }

    def model_keys(self) -> dict:
        """The model's quantization and KV cache groups, where they apply."""
        out = {}
        if self.model is not None:
            out["quantization"] = self.model.quantization or "none"
        if self.kv_cache_groups is not None:
            out["kv_cache_groups"] = describe_groups(self.kv_cache_groups)
        return out

    def trace_summary(self) -> dict:
        """The trace's keys (trace_keys), where a trace is served, and whether its arrivals are Poisson."""
        if self.trace is None:
            return {}
        closed = self.options.max_concurrency is not None  # a closed loop draws its own arrivals: Poisson only
        poisson = self.options.arrival_rate is not None if closed else self.trace.poisson_arrivals  # at arrival_rate
        return trace_keys(self.trace) | {"poisson_arrivals": poisson}


SUMMARY_KEYS = (
    "mean_ttft_s",
    "p95_ttft_s",
    "mean_tpot_s",
    "num_preemptions",
    "num_steps",
    "peak_kv_blocks",
    "mean_running",
    "output_tokens_per_s",
)
KINDS_OF_WINDOW = {"sliding_attention": "sliding window", "chunked_local_attention": "attention chunk"}


def describe_groups(groups) -> str:
    """A hybrid model's KV cache groups in words: how many of each kind, their windows and block sizes."""
    kinds: dict[tuple, int] = {}
    for g in groups:
        key = (g.kind, g.sliding_window or g.attention_chunk_size, g.block_size)
        kinds[key] = kinds.get(key, 0) + 1
    what = {"full_attention": "full attention", "mamba": "Mamba states"}
    parts = [
        f"{n} of {what.get(kind) or f'a {window:,}-token {KINDS_OF_WINDOW[kind]}'} ({bs:,} tokens a block)"
        for (kind, window, bs), n in kinds.items()
    ]
    return f"{len(groups)} sharing the pool: " + ", ".join(parts) + " (vLLM's hybrid KV cache manager)"


# Bytes a fleet's instance holds per KV block of its pool (its block pool's lists; measured: 88 B).
INSTANCE_BYTES_PER_BLOCK = 100


def check_disaggregated(options: ServingOptions) -> None:
    """Disaggregated prefill and decode (--prefill-instances X --decode-instances Y) as kvlab serves it: one-line
    errors for the rest, each naming its fix."""
    x, y = options.prefill_instances, options.decode_instances
    if not x and not y:
        return
    for name, value in (("prefill_instances", x), ("decode_instances", y)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{FLAGS[name]} {value} is not allowed: a disaggregated deployment needs at least one prefill and one "
                f"decode instance (give both {FLAGS['prefill_instances']} and {FLAGS['decode_instances']})"
            )
    validate.one_of("kv_transfer_link", options.kv_transfer_link, LINKS)
    both = f"{FLAGS['prefill_instances']} {x} {FLAGS['decode_instances']} {y}"
    if options.async_scheduling:
        raise ValueError(
            f"{both} runs vLLM's synchronous scheduler (kvlab models its KV connector's asynchronous path not yet), "
            "and asynchronous scheduling is on (vLLM's default): add --no-async-scheduling"
        )
    for name, fix in (("model", "the KV bytes a request moves come from the model"),
                      ("gpu", "the link's bandwidth comes from the GPU")):  # fmt: skip
        if getattr(options, name) is None:
            raise ValueError(f"{both} needs {FLAGS[name]}: {fix}")
    for name, served, what in (
        ("num_instances", options.num_instances == 1, "each side's instances take requests in turn, as vLLM's example "
         "proxies send them (drop it)"),
        ("router", options.router is None, "each side's instances take requests in turn (drop it)"),
        ("data_parallel_size", options.data_parallel_size == 1, "its instances are single-rank engines"),
        ("max_concurrency", options.max_concurrency is None, "a closed loop is served for one engine only"),
        ("allocation", options.allocation == "paged", "its instances are vLLM's paged engines"),
    ):  # fmt: skip
        if not served:
            value = getattr(options, name)
            shown = "" if value is True else f" {value}"
            raise ValueError(f"{both} and {FLAGS[name]}{shown} cannot be used together: {what}")


def check_fleet(options: ServingOptions) -> None:
    """A fleet (num_instances > 1 or a router) of engines kvlab's fleet serves: one-line errors for the rest."""
    n = validate.positive_int("num_instances", options.num_instances)
    if options.router is not None and options.router not in ROUTERS:
        raise ValueError(f"{FLAGS['router']} {options.router!r} is not a router kvlab has: {', '.join(ROUTERS)}")
    if n == 1 and options.router is None:
        return
    fleet = f"{FLAGS['num_instances']} {n}" if n > 1 else f"{FLAGS['router']} {options.router}"
    for name, served, what in (
        ("data_parallel_size", options.data_parallel_size == 1, "its instances are single-rank engines"),
        ("max_concurrency", options.max_concurrency is None, "a closed loop is served for one engine only"),
        ("allocation", options.allocation == "paged", "its instances are vLLM's paged engines"),
    ):
        if not served:
            raise ValueError(
                f"{fleet} and {FLAGS[name]} {getattr(options, name)} cannot be used together: {what} (kvlab's fleet)"
            )


def setup(options: ServingOptions) -> Serving:
    """What kvlab's engine needs to serve the run of options, each part made once and refused in one line where the
    options cannot make it: the model, the EngineConfig (max_model_len's default: max_model_len_of), data and expert
    parallelism, the KV cache groups, the KV pool, the step cost and the workload."""
    name = options.cost_name
    if name == "calibrated" and not options.calibration:
        raise ValueError(f"{FLAGS['cost']} calibrated needs {FLAGS['calibration']} FILE (a CSV of kvlab calibrate)")
    if options.enable_prefix_caching and options.allocation != "paged":
        raise ValueError(
            f"{FLAGS['enable_prefix_caching']} and {FLAGS['allocation']} {options.allocation} cannot be used together: "
            "prefix caching shares the paged pool's blocks"
        )
    if options.max_concurrency is not None:
        check_max_concurrency(options.max_concurrency)
    check_fleet(options)
    check_disaggregated(options)
    model = load_model(options)
    config = engine_config(options, max_model_len_of(options, model))
    check_parallel(model, config)
    groups = None if model is None else capacity.kv_cache_groups(model, config)
    num_gpu_blocks, pool_source = kv_pool(options, model, config, groups)
    if options.prefill_instances:  # each instance's pool, held in this machine's memory
        x, y = options.prefill_instances, options.decode_instances
        resources.refuse_if_too_big("prefill_instances", x, num_gpu_blocks * INSTANCE_BYTES_PER_BLOCK * (x + y) / x,
                                    unit=f"prefill instances with {y:,} decode instances")  # fmt: skip
    if options.num_instances > 1:  # each instance's pool, held in this machine's memory
        resources.refuse_if_too_big("num_instances", options.num_instances, num_gpu_blocks * INSTANCE_BYTES_PER_BLOCK,
                                    unit="instances of this pool")  # fmt: skip
    if options.router == "dynamo-kv" and groups is not None and len(groups) > 1:
        raise ValueError(
            f"{FLAGS['router']} dynamo-kv reads the instances' prefix caches, which kvlab's fleet reads for one "
            f"full-attention group only, and {model.name} has {len(groups)} KV cache groups (choose another "
            f"{FLAGS['router']})"
        )
    cost = step_cost(options, model, config)
    requests, load = workload(options)
    if options.num_instances > 1 or options.router is not None:  # the prompts' hashes a fleet's run keeps
        per_request = bytes_per_request(requests, config.cache.block_size, options.router or "round-robin",
                                        config.cache.enable_prefix_caching, options.num_instances)  # fmt: skip
        resources.refuse_if_too_big("num_requests", requests.num_requests, PEAK_BYTES_PER_REQUEST + per_request)
    if groups is not None and len(groups) == 1 and groups[0].kind == "full_attention":
        groups = None  # one full-attention group: the engine serves a plain decoder (capacity.engine_kv_cache_groups)
    return Serving(options, model, config, num_gpu_blocks, pool_source, groups, cost, requests, load)
