"""What each notebook parameter may be, and what a notebook's run will need, checked before anything runs.

One rule per parameter (its sane range, or the names it must be one of, with close matches suggested),
cross-parameter checks, and an estimate of each notebook's peak memory and time. The report checks
every notebook here before running any; each notebook checks its own parameters in its first cell, so
`papermill -p SEED -1` stops with one line naming SEED, not deep inside numpy. Messages name the
notebook's own parameter (GPU_MEMORY_GIB), never a library argument (gpu_memory).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from kvlab.core import article, batching, models, resources, validate
from kvlab.core.allocator import PEAK_BYTES_PER_REQUEST as ALLOCATION_BYTES_PER_REQUEST
from kvlab.core.calibration import DTYPES
from kvlab.core.config import KV_CACHE_DTYPES
from kvlab.core.engine import PEAK_BYTES_PER_REQUEST as ENGINE_BYTES_PER_REQUEST
from kvlab.core.fleet.fleet import BYTES_PER_PROMPT_BLOCK, INSTANCE_BYTES_PER_PROMPT_BLOCK, TRIE_BYTES_PER_PROMPT_BLOCK
from kvlab.core.fleet.routers import ROUTERS
from kvlab.studies.paper_setting import SCHEDULERS, SETTING_STEP_COSTS, PaperSetting, prefix_setting
from kvlab.workloads.paper_datasets import ALPACA_FAMILIES, SHAREGPT_INPUTS
from kvlab.workloads.synthetic import LENGTH_DISTRIBUTIONS
from kvlab.workloads.traces import TRACE_FORMATS

Rule = Callable[[str, object], object]

# Seconds of work per request and run, measured by make bench on this project's 2-core machine (with margin).
SECONDS_PER_REQUEST_DRAWN = 1e-7  # section 1: draw a length and count its blocks
SECONDS_PER_REQUEST_SERVED = 1.5e-6  # section 2: draw and serve one request under one policy
SECONDS_PER_NOTEBOOK = 5.0  # a kernel's start, imports, figures
SECONDS_PER_REQUEST_ENGINE = 6e-5  # section 6: one request through the engine (roofline cost, no prefix caching)
# section 6: one request through the compiled loop (vLLM 0.1.4's on the 2023 clock: 6e-6 s over its default grids)
SECONDS_PER_REQUEST_COMPILED = 1e-5
SECONDS_CALIBRATION_REPLAYS = (
    15.0  # section 5: every real run of data/checks replayed on each clock and term off (11 s)
)
SECONDS_PER_REQUEST_PREFIX = 4e-3  # section 6: one Mooncake request through the engine with prefix caching
SECONDS_PER_ENGINE_RUN = 0.02  # section 6: a run's set-up and its pickling to a process
SECONDS_PER_REQUEST_FLEET = 2e-3  # section 8: one Mooncake request through a fleet of 8 (compiled, prefix caching;
# measured 0.5-1.5 ms, or 6 ms behind a router that sends every request to one instance)
MOONCAKE_PROMPT_BLOCKS = 760  # section 8: a Mooncake request's full prompt blocks of 16 tokens, on average
SECONDS_PER_REQUEST_HYBRID = 0.02  # section 3: one long-context request through a deployment (per-step loop, hits)
SECONDS_PER_REQUEST_PLAN = 2e-5  # section 7: one request through a candidate's replicas (the compiled loop on the
# measured clock: 1.3e-5 s on a saturated replica of 10,000 Azure requests, the slowest case, on this machine)
AZURE_REQUESTS = 19_366  # rows of the Azure conversation trace (the most section 6 serves from it)


def _each(rule: Rule) -> Rule:
    """A rule for a list parameter: not empty, rule on every element."""

    def check(name, values):
        if not isinstance(values, (list, tuple)):
            validate.fail(name, values, "must be a list, e.g. [1, 2]")
        for i, value in enumerate(validate.non_empty(name, values)):
            rule(f"{name}[{i}]", value)

    return check


def _increasing(rule: Rule) -> Rule:
    """A rule for a list that must also be strictly increasing (a grid)."""

    def check(name, values):
        _each(rule)(name, values)
        if any(b <= a for a, b in zip(values, values[1:])):
            validate.fail(name, values, "must be increasing, each value above the one before")

    return check


def _distinct(rule: Rule) -> Rule:
    """A rule for a list whose values must not repeat (a set of choices)."""

    def check(name, values):
        _each(rule)(name, values)
        if len(set(values)) != len(values):
            validate.fail(name, values, "must not repeat a value")

    return check


def _optional(rule: Rule) -> Rule:
    """A rule for a parameter that may be None (not given)."""
    return lambda name, value: None if value is None else rule(name, value)


def _bool(name, value):
    if not isinstance(value, bool):
        validate.fail(name, value, "must be True or False")


def _range(quantity: str) -> Rule:
    return lambda name, value: validate.in_range(name, value, quantity)


def _choice(choices, *, empty_ok: bool = False) -> Rule:
    def check(name, value):
        if not (empty_ok and value == ""):
            validate.one_of(name, value, choices)

    return check


def _folder(name, value):
    if value and not Path(value).is_dir():
        validate.fail(name, value, "must be an existing folder (or empty for the default)")


def _percent(name, value):
    x = validate.non_negative_number(name, value)
    if x > 100:
        validate.fail(name, value, "must be a percentile from 0 to 100")


def _scale(name, value):
    x = validate.positive_number(name, value)
    if not 0.001 <= x <= 1000:
        validate.fail(name, value, "must be a rate scale from 0.001 to 1,000 (1: the trace's own timestamps)")
    return x


def _scheduler(name, value):
    if value != "":
        from kvlab.studies.sweep import check_reachable, scheduler_of

        check_reachable(scheduler_of(value))  # before any notebook runs, not after minutes of work


def _fraction(name, value):
    return validate.fraction(name, value)


def _gpu(name, value):
    models.get_gpu(value)  # its error lists close matches


def _model(name, value):
    models.get_model(value)


def _named(check: Callable[[str], object], kind: str) -> Rule:
    """A rule for a catalog name whose error starts 'gpu=' or 'model=': restated with the parameter's name."""

    def rule(name, value):
        try:
            check(name, value)
        except ValueError as error:
            message = str(error)
            raise ValueError(name + message[len(kind) :] if message.startswith(kind + "=") else message) from None

    return rule


_gpu_name = _named(_gpu, "gpu")
_model_name = _named(_model, "model")
_count = _range("count")
_seed = _range("seed")
_tokens = _range("tokens")

RULES: dict[str, dict[str, Rule]] = {
    "01_allocation": {
        "NUM_REQUESTS": _range("num_requests"),
        "MAX_LEN_TOKENS": _tokens,
        "LENGTHS": _choice(LENGTH_DISTRIBUTIONS),
        "SEED": _seed,
        "BLOCK_SIZES": _each(_range("block_size")),
        "MEMORY_GIB": _range("memory_gib"),
        "MIB_PER_TOKEN": _range("mib_per_token"),
        "POLICY_BLOCK_SIZE": _range("block_size"),
        "NUM_SEEDS": _range("num_seeds"),
        "TRACE": _choice(TRACE_FORMATS, empty_ok=True),
        "TRACE_DIR": _folder,
        "TRACE_MAX_LEN_TOKENS": _tokens,
    },
    "02_batching": {
        "NUM_REQUESTS": _range("num_requests"),
        "MAX_NUM_SEQS": _range("max_num_seqs"),
        "MS_PER_TOKEN": _range("ms_per_token"),
        "ARRIVAL_RATE": _range("arrival_rate"),
        "CONSTANT_TOKENS": _tokens,
        "SEED": _seed,
        "NUM_SEEDS": _range("num_seeds"),
        "BAND_LOW_PCT": _percent,
        "BAND_HIGH_PCT": _percent,
        "TIMELINE_S": _range("seconds"),
        "SWEEP_RATES": _increasing(_range("arrival_rate")),
        "SWEEP_CVS": _increasing(_range("cv")),
        "SWEEP_SEEDS": _range("num_seeds"),
        "TRACE": _choice(TRACE_FORMATS, empty_ok=True),
        "TRACE_DIR": _folder,
        "TRACE_NUM_REQUESTS": _range("num_requests"),
        "SHAREGPT_RATE_PER_S": _range("arrival_rate"),
    },
    "03_capacity": {
        "NUM_LAYERS": _count,
        "NUM_KV_HEADS": _count,
        "HEAD_DIM": _count,
        "DTYPE_BYTES": validate.positive_number,
        "GPU_MEMORY_GIB": _range("memory_gib"),
        "WEIGHTS_GIB": validate.non_negative_number,
        "CONTEXTS": _each(_tokens),
        "CONCURRENCY": _each(_count),
        "PLAN_GPU": _gpu_name,
        "PLAN_MODELS": _each(_model_name),
        "TABLE_MODELS": _each(_model_name),
        "PLAN_CONTEXTS": _increasing(_tokens),
        "PLAN_KV_CACHE_DTYPES": _each(_choice(KV_CACHE_DTYPES)),
        "PLAN_TENSOR_PARALLEL_SIZES": _increasing(_count),
        "GPU_MEMORY_UTILIZATION": _fraction,
        "BLOCK_SIZE": _range("block_size"),
        "LOG_MAX_MODEL_LEN": _tokens,
        "HYBRID_GPU": _gpu_name,
        "HYBRID_MODELS": _distinct(_model_name),
        "HYBRID_MAX_MODEL_LEN": _tokens,
        "HYBRID_AT_ONCE": _count,
        "HYBRID_NUM_REQUESTS": _range("num_requests"),
        "HYBRID_ARRIVAL_RATE": _range("arrival_rate"),
        "HYBRID_SEED": _seed,
    },
    "04_traces": {
        "TRACE_DIR": _folder,
        "SHAREGPT_RATE_PER_S": _range("arrival_rate"),
        "SEED": _seed,
        "RATE_WINDOW_S": _range("seconds"),
        "CACHE_SIZES_BLOCKS": _increasing(_count),
    },
    "05_calibration": {
        "CALIBRATION_DIR": _folder,
        "NUM_LAYERS": _count,
        "NUM_HEADS": _count,
        "HEAD_DIM": _count,
        "HIDDEN_SIZE": _count,
        "INTERMEDIATE_SIZE": _count,
        "VOCAB_SIZE": _count,
        "DTYPE": _choice(DTYPES),
        "GPUS": _each(_gpu_name),
        "BATCH_SIZES": _increasing(_count),
        "CONTEXTS": _increasing(_tokens),
        "FREE_GIB": _range("memory_gib"),
        "CONTEXT_TOKENS": _tokens,
        "MAX_NUM_SEQS": _range("max_num_seqs"),
        "SEED": _seed,
    },
    "06_memory_budget": {
        "MODEL": _model_name,
        "GPU": _gpu_name,
        "KV_CACHE_GIB": _range("memory_gib"),
        "BLOCK_SIZE": _range("block_size"),
        "MAX_MODEL_LEN": _tokens,
        "MAX_NUM_SEQS": _range("max_num_seqs"),
        "MAX_NUM_BATCHED_TOKENS": _tokens,
        "SCHEDULER_CLS": _choice(SCHEDULERS),
        "STEP_COST": _choice(SETTING_STEP_COSTS),
        "SHAREGPT_INPUTS": _choice(SHAREGPT_INPUTS),
        "ALPACA_LENGTHS": _choice(ALPACA_FAMILIES),
        "NUM_REQUESTS": _range("num_requests"),
        "SEED": _seed,
        "NUM_SEEDS": _range("num_seeds"),
        "SHAREGPT_RATE": _range("arrival_rate"),
        "ALPACA_RATE": _range("arrival_rate"),
        "SHAREGPT_RATES": _increasing(_range("arrival_rate")),
        "ALPACA_RATES": _increasing(_range("arrival_rate")),
        "LATENCY_BOUND_S": _range("seconds"),
        "LATENCY_BOUNDS_S": _increasing(_range("seconds")),
        "KNEE_STEPS": _count,
        "KNEE_SEEDS": _range("num_seeds"),
        "BLOCK_SIZES": _increasing(_range("block_size")),
        "KV_CACHE_GIBS": _increasing(_range("memory_gib")),
        "AZURE_RATE_SCALES": _increasing(_scale),
        "SCHEDULING_RATE_SCALES": _increasing(_scale),
        "PREFIX_MODEL": _model_name,
        "PREFIX_GPU": _gpu_name,
        "MOONCAKE_NUM_REQUESTS": _range("num_requests"),
        "MOONCAKE_RATE_SCALES": _increasing(_scale),
        "ARTICLE_MS_PER_TOKEN": _range("ms_per_token"),
        "ARTICLE_MAX_NUM_SEQS": _increasing(_range("max_num_seqs")),
        "TRACE_DIR": _folder,
        "SWEEP_SCHEDULER": _scheduler,
    },
    "07_plan": {
        "MODEL": _model_name,
        "GPU": _gpu_name,
        "MAX_MODEL_LEN": _tokens,
        "SLO_TTFT_P95_S": _optional(_range("seconds")),
        "SLO_TPOT_P95_MS": _optional(_range("ms_per_token")),
        "SLO_E2E_P95_S": _optional(_range("seconds")),
        "TRACE": _choice(TRACE_FORMATS, empty_ok=True),
        "TRACE_DIR": _folder,
        "NUM_REQUESTS": _range("num_requests"),
        "SYNTHETIC_RATE_PER_S": _range("arrival_rate"),
        "SYNTHETIC_PROMPT_TOKENS": _tokens,
        "SYNTHETIC_OUTPUT_TOKENS": _tokens,
        "SEED": _seed,
        "TENSOR_PARALLEL_SIZES": _increasing(_count),
        "MAX_NUM_SEQS": _increasing(_range("max_num_seqs")),
        "MAX_NUM_BATCHED_TOKENS": _increasing(_tokens),
        "BLOCK_SIZES": _increasing(_range("block_size")),
        "GPU_MEMORY_UTILIZATIONS": _increasing(_fraction),
        "KV_CACHE_DTYPES": _distinct(_choice(KV_CACHE_DTYPES)),
        "ASYNC_SCHEDULING": _distinct(_bool),
        "NUM_REPLICAS": _increasing(_count),
        "HALVING_CHECKS": validate.non_negative_int,
        "SWEEP_SCHEDULER": _scheduler,
    },
    "08_fleet": {
        "MODEL": _model_name,
        "GPU": _gpu_name,
        "STEP_COST": _choice(("measured", "roofline")),
        "NUM_INSTANCES": _count,
        "ROUTERS": _distinct(_choice(ROUTERS)),
        "NUM_REQUESTS": _range("num_requests"),
        "RATE_SCALES": _increasing(_scale),
        "TRACE_DIR": _folder,
    },
}


def _check_batching(p: dict) -> None:
    if p["BAND_LOW_PCT"] >= p["BAND_HIGH_PCT"]:
        validate.fail("BAND_LOW_PCT", p["BAND_LOW_PCT"], f"must be below BAND_HIGH_PCT={p['BAND_HIGH_PCT']}")


def _check_capacity(p: dict) -> None:
    if p["WEIGHTS_GIB"] >= p["GPU_MEMORY_GIB"]:
        validate.fail("WEIGHTS_GIB", p["WEIGHTS_GIB"], f"must be below GPU_MEMORY_GIB={p['GPU_MEMORY_GIB']}")


# The engine's setting of notebook 06, by the notebook's names.
_SETTING_PARAMETERS = {
    "model": "MODEL",
    "gpu": "GPU",
    "kv_cache_gib": "KV_CACHE_GIB",
    "block_size": "BLOCK_SIZE",
    "max_model_len": "MAX_MODEL_LEN",
    "max_num_seqs": "MAX_NUM_SEQS",
    "max_num_batched_tokens": "MAX_NUM_BATCHED_TOKENS",
    "scheduler_cls": "SCHEDULER_CLS",
    "step_cost": "STEP_COST",
}


def _renamed(error: ValueError, names: dict) -> ValueError:
    """error's one line with the library field it starts with ('block_size=0 ...') named as the notebook names it."""
    message = str(error)
    field = message.split("=", 1)[0]
    return ValueError(names[field] + message[len(field) :] if field in names else message)


def _check_memory_budget(p: dict) -> None:
    """The setting must be one the engine can run: MAX_MODEL_LEN within the model's, one request of it in the KV
    cache and in each KV_CACHE_GIBS size, and the prefix-caching model on its GPU."""
    try:
        setting = PaperSetting(**{field: p[name] for field, name in _SETTING_PARAMETERS.items()})
    except ValueError as error:
        raise _renamed(error, _SETTING_PARAMETERS) from None
    setting.check_fits("KV_CACHE_GIB")
    for i, gib in enumerate(p["KV_CACHE_GIBS"]):
        setting.check_fits(f"KV_CACHE_GIBS[{i}]", gib)
    prefix_setting(p["PREFIX_MODEL"], p["PREFIX_GPU"])


# The search space of notebook 07, by the notebook's parameter names (kvlab.sections.s07_plan.search_space).
SPACE_PARAMETERS = {
    "tensor_parallel_size": "TENSOR_PARALLEL_SIZES",
    "max_num_seqs": "MAX_NUM_SEQS",
    "max_num_batched_tokens": "MAX_NUM_BATCHED_TOKENS",
    "block_size": "BLOCK_SIZES",
    "gpu_memory_utilization": "GPU_MEMORY_UTILIZATIONS",
    "kv_cache_dtype": "KV_CACHE_DTYPES",
    "async_scheduling": "ASYNC_SCHEDULING",
    "num_replicas": "NUM_REPLICAS",
}


def search_space(p: dict):
    """Notebook 07's SearchSpace (chunked prefill on, vLLM 0.33's default; prefix caching off, where vLLM 0.33's default
    is on: the trace gives no prompt contents; data-parallel ranks as SearchSpace's for a mixture-of-experts model),
    each candidate
    checked as vLLM checks its settings; a refusal names the notebook's parameter."""
    from kvlab.core.models import get_model
    from kvlab.studies.plan_space import SearchSpace

    try:
        space = SearchSpace(
            **{field: tuple(p[name]) for field, name in SPACE_PARAMETERS.items()},
            enable_chunked_prefill=(True,),
            enable_prefix_caching=(False,),
            # data-parallel ranks for a mixture-of-experts model only (SearchSpace.candidates)
            **({} if get_model(p["MODEL"]).expert_params_b > 0 else {"data_parallel_size": (1,)}),
        )
        for candidate in space.candidates():
            candidate.config(p["MAX_MODEL_LEN"])
    except ValueError as error:
        raise _renamed(error, SPACE_PARAMETERS) from None
    return space


def _check_plan(p: dict) -> None:
    """At least one objective, at least two requests (a rate), and a search space vLLM accepts."""
    if all(p[name] is None for name in ("SLO_TTFT_P95_S", "SLO_TPOT_P95_MS", "SLO_E2E_P95_S")):
        validate.fail(
            "SLO_TTFT_P95_S",
            None,
            "an objective is needed: give SLO_TTFT_P95_S, SLO_TPOT_P95_MS or SLO_E2E_P95_S (None: not an objective)",
        )
    if p["NUM_REQUESTS"] < 2:
        validate.fail("NUM_REQUESTS", p["NUM_REQUESTS"], "must be at least 2 (a rate needs two arrivals)")
    context = models.get_model(p["MODEL"]).max_position_embeddings
    if context and p["MAX_MODEL_LEN"] > context:
        validate.fail(
            "MAX_MODEL_LEN", p["MAX_MODEL_LEN"], f"must be at most {p['MODEL']}'s context, {context:,} tokens"
        )
    search_space(p)


# The article's own settings per notebook: a run with other values cannot be held to the article's figures, so
# the report sets that section's ledger rows aside ('not compared'). kvlab's choices (seeds, the length
# family, the arrival rate, band percentiles) are not here: changing them is exploring, not another set-up.
ARTICLE_SETTINGS: dict[str, dict] = {
    "01_allocation": {
        "NUM_REQUESTS": article.NUM_REQUESTS_S1,
        "MAX_LEN_TOKENS": article.MAX_LEN_TOKENS,
        "BLOCK_SIZES": list(article.BLOCK_SIZES),
        "MEMORY_GIB": article.MEMORY_GIB,
        "MIB_PER_TOKEN": article.MIB_PER_TOKEN,
    },
    "02_batching": {
        "NUM_REQUESTS": article.NUM_REQUESTS_S2,
        "MAX_NUM_SEQS": article.MAX_NUM_SEQS,
        "MS_PER_TOKEN": article.MS_PER_TOKEN,
        "CONSTANT_TOKENS": article.CONSTANT_TOKENS,
    },
    "03_capacity": {
        "NUM_LAYERS": article.NUM_LAYERS,
        "NUM_KV_HEADS": article.NUM_KV_HEADS,
        "HEAD_DIM": article.HEAD_DIM,
        "DTYPE_BYTES": article.DTYPE_BYTES,
        "GPU_MEMORY_GIB": article.GPU_MEMORY_GIB,
        "WEIGHTS_GIB": article.WEIGHTS_GIB,
        "CONTEXTS": list(article.CONTEXTS),
        "CONCURRENCY": list(article.CONCURRENCY),
    },
    # The vLLM paper's setting (Kwon et al., SOSP 2023, §6.1, Table 1 and Fig. 13's rates).
    "06_memory_budget": {
        "MODEL": "facebook/opt-13b",
        "GPU": "A100-40GB",
        "KV_CACHE_GIB": 12.0,
        "BLOCK_SIZE": 16,
        "MAX_MODEL_LEN": 2048,
        "SHAREGPT_RATE": 2.0,
        "ALPACA_RATE": 30.0,
    },
}


# Whose settings ARTICLE_SETTINGS holds for a notebook, where not the article's.
SETTINGS_SOURCE = {"06_memory_budget": "the vLLM paper's"}


def departures(stem: str, p: dict) -> str:
    """The published settings (the article's, or the vLLM paper's for section 6) that the parameters p of notebook
    stem change, as one phrase ('' when none)."""
    whose = SETTINGS_SOURCE.get(stem, "the article's")
    changed = [
        f"{name}={p[name]!r} ({whose} {value!r})"
        for name, value in ARTICLE_SETTINGS.get(stem, {}).items()
        if name in p and p[name] != value
    ]
    return ", ".join(changed)


# Checks that need several parameters together (run after the per-parameter rules).
CROSS_CHECKS: dict[str, Callable[[dict], None]] = {
    "02_batching": _check_batching,
    "03_capacity": _check_capacity,
    "06_memory_budget": _check_memory_budget,
    "07_plan": _check_plan,
}


def check(stem: str, params: dict) -> None:
    """Raise a one-line ValueError naming the notebook's parameter if any of params (name -> value) is not allowed.

    params may hold other names (a notebook's globals()): only the notebook's parameters are checked."""
    for name, rule in RULES.get(stem, {}).items():
        if name in params:
            rule(name, params[name])
    if stem in CROSS_CHECKS:
        CROSS_CHECKS[stem](params)
    refuse_if_too_big(stem, params)


# ---------------------------------------------------------------- what a run needs
def estimate(stem: str, p: dict) -> resources.Estimate:
    """Peak memory (bytes) and time (s) of one notebook run with parameters p (its defaults merged in)."""
    if stem == "01_allocation":
        n = p["NUM_REQUESTS"]
        draws = p["NUM_SEEDS"] + 4 + 2  # the band, four length families, the table and the powers of two
        return resources.Estimate(
            2 * n * ALLOCATION_BYTES_PER_REQUEST, SECONDS_PER_NOTEBOOK + draws * n * SECONDS_PER_REQUEST_DRAWN
        )
    if stem == "02_batching":
        n = p["NUM_REQUESTS"]
        runs = 4 * p["NUM_SEEDS"] + 2 * p["SWEEP_SEEDS"] * (len(p["SWEEP_RATES"]) + len(p["SWEEP_CVS"]) + 1) + 6
        return resources.Estimate(
            n * batching.PEAK_BYTES_PER_REQUEST, SECONDS_PER_NOTEBOOK + runs * n * SECONDS_PER_REQUEST_SERVED
        )
    if stem == "06_memory_budget":
        n, seeds = p["NUM_REQUESTS"], p["NUM_SEEDS"]
        runs = seeds * 4 * (4 + len(p["SHAREGPT_RATES"]) + len(p["ALPACA_RATES"]) + len(p["KV_CACHE_GIBS"]))
        runs += seeds * 2 * (len(p["BLOCK_SIZES"]) + 1)  # the block grid, and today's vLLM
        runs += 4 * (p["KNEE_STEPS"] + 1) * p["KNEE_SEEDS"]  # the knee
        azure_runs = 4 * len(p["AZURE_RATE_SCALES"]) + 2 * len(p["SCHEDULING_RATE_SCALES"])
        served = runs * n + azure_runs * AZURE_REQUESTS
        served += 4 * len(p["ARTICLE_MAX_NUM_SEQS"]) * 600
        cached = 2 * len(p["MOONCAKE_RATE_SCALES"]) * p["MOONCAKE_NUM_REQUESTS"]
        largest = max(n, AZURE_REQUESTS, p["MOONCAKE_NUM_REQUESTS"])
        compiled = p["STEP_COST"] == "vllm-2023"  # the compiled loop's clocks (the roofline runs in Python)
        return resources.Estimate(
            2 * largest * ENGINE_BYTES_PER_REQUEST,  # a run in each of two processes
            SECONDS_PER_NOTEBOOK
            + served * (SECONDS_PER_REQUEST_COMPILED if compiled else SECONDS_PER_REQUEST_ENGINE)
            + cached * SECONDS_PER_REQUEST_PREFIX
            + (runs + azure_runs) * SECONDS_PER_ENGINE_RUN,
        )
    if stem == "03_capacity":  # part 3: a hybrid model served twice (windows, every layer full), a plain one once
        n = p["HYBRID_NUM_REQUESTS"]
        deployments = sum(2 if models.get_model(m).sliding_window else 1 for m in p["HYBRID_MODELS"])
        return resources.Estimate(
            n * (ENGINE_BYTES_PER_REQUEST + 8 * p["HYBRID_MAX_MODEL_LEN"]),  # a request's prompt token ids
            SECONDS_PER_NOTEBOOK + deployments * n * SECONDS_PER_REQUEST_HYBRID,
        )
    if stem == "07_plan":
        from kvlab.studies.plan import MIN_RUNG_REQUESTS, PROOF_FRACTION, RUNG_FRACTIONS, RUNG_KEEP

        n = p["NUM_REQUESTS"]
        size = math.prod(len(p[name]) for name in SPACE_PARAMETERS.values())
        # at most: the halving (every candidate served on the first rung, RUNG_KEEP of those on the next, and so on)
        # and every candidate served to the end after the proof rung (the plan, or the halving's check)
        served = sum(
            math.ceil(size * RUNG_KEEP**k) * min(n, max(MIN_RUNG_REQUESTS, math.ceil(f * n)))
            for k, f in enumerate(RUNG_FRACTIONS)
        ) + size * (n + min(n, max(MIN_RUNG_REQUESTS, math.ceil(PROOF_FRACTION * n))))
        return resources.Estimate(
            2 * n * ENGINE_BYTES_PER_REQUEST,  # a candidate in each of two processes
            SECONDS_PER_NOTEBOOK + served * SECONDS_PER_REQUEST_PLAN,
        )
    if stem == "05_calibration":
        return resources.Estimate(0, SECONDS_PER_NOTEBOOK + SECONDS_CALIBRATION_REPLAYS)
    if stem == "08_fleet":  # each router at each rate: the fleet's run (its instances compiled) of the trace's requests
        n, runs = p["NUM_REQUESTS"], len(p["ROUTERS"]) * len(p["RATE_SCALES"])
        per_block = BYTES_PER_PROMPT_BLOCK + INSTANCE_BYTES_PER_PROMPT_BLOCK * p["NUM_INSTANCES"]
        per_request = ENGINE_BYTES_PER_REQUEST + MOONCAKE_PROMPT_BLOCKS * (per_block + TRIE_BYTES_PER_PROMPT_BLOCK)
        return resources.Estimate(n * per_request, SECONDS_PER_NOTEBOOK + runs * n * SECONDS_PER_REQUEST_FLEET)
    return resources.Estimate(0, SECONDS_PER_NOTEBOOK)


# What to lower where a notebook's time is too long (kvlab report's refusal), where not its SIZE_PARAMETER alone.
TIME_PARAMETERS = {
    "06_memory_budget": "NUM_SEEDS or NUM_REQUESTS",
    "07_plan": "NUM_REQUESTS or the values it searches",
    "08_fleet": "NUM_REQUESTS, ROUTERS or RATE_SCALES",
}


# The parameter whose size drives each notebook's memory, to name in a refusal.
SIZE_PARAMETER = {
    "01_allocation": "NUM_REQUESTS",
    "03_capacity": "HYBRID_NUM_REQUESTS",
    "02_batching": "NUM_REQUESTS",
    "06_memory_budget": "NUM_REQUESTS",
    "07_plan": "NUM_REQUESTS",
    "08_fleet": "NUM_REQUESTS",
}


def refuse_if_too_big(stem: str, p: dict) -> None:
    """A one-line ValueError naming the size parameter when the notebook's estimate exceeds this machine's memory."""
    name = SIZE_PARAMETER.get(stem)
    if name is None or name not in p:
        return
    needed = estimate(stem, p).peak_bytes
    per_unit = needed / p[name]
    resources.refuse_if_too_big(name, p[name], per_unit)
