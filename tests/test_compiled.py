"""The compiled loop (kvlab.core.engine.fast.compiled, its runs of steps at once too) against the Python engine: the same results,
bit for bit."""

import dataclasses
import importlib.util

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler_v0 import v0_runs

from conftest import assert_identical, draw_requests
from kvlab.core import models
from kvlab.core.capacity import KVCacheGroup
from kvlab.core.config import EngineConfig
from kvlab.core.cost import Batch, ConstantStepCost, LinearStepCost, RooflineStepCost, make_step_cost
from kvlab.core.cost.all_reduce import AllReduceCost
from kvlab.core.engine import Engine, NoProgressError, Recorder, warm
from kvlab.core.engine.fast import compiled
from kvlab.core.workload import Workload

pytest.importorskip("numba", reason="numba is not installed (fix: make setup installs it from requirements.lock)")


@st.composite
def compiled_runs(draw):
    """Small workloads, synchronous or asynchronous, with chunked prefill on or off, a threshold, memory that may
    preempt."""
    n, bs, max_model_len, gaps, prompts, outputs = draw_requests(draw, st)
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max(max_num_seqs, 8), 96)) if chunked else max_model_len + draw(st.integers(0, 40))
    threshold = draw(st.sampled_from([0, 0, 5, 24])) if chunked else 0
    prompt = np.minimum(np.array(prompts), max_model_len - 1)
    output = np.array(outputs)
    need = int((-(-(np.minimum(prompt + output, max_model_len) - 1) // bs)).max())
    config = EngineConfig().replace(
        async_scheduling=draw(st.booleans()),
        block_size=bs,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
    )
    cost = draw(st.sampled_from([ConstantStepCost(8.0), LinearStepCost(8.0, 0.01), LinearStepCost(3, 0.37)]))
    workload = Workload(np.cumsum(gaps), prompt, output)
    return {
        "workload": workload,
        "config": config,
        "cost": cost,
        "num_gpu_blocks": 1 + need + draw(st.integers(0, 3 * need)),
    }


@given(compiled_runs())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_compiled_loop_equals_the_python_engine(args):
    """The per-step loop in Python and the compiled loop (its runs of steps at once too) agree on every request and
    step."""
    assert_identical(Engine(**args, path="reference").run(), Engine(**args, path="compiled").run())


@given(compiled_runs(), st.integers(1, 6), st.booleans())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_compiled_loop_under_a_closed_loop_equals_the_python_engine(args, max_concurrency, at_zero):
    """A closed loop (vLLM bench's --max-concurrency; every request made at t=0, its default rate, or at the drawn
    arrivals): the per-step loop and the compiled loop (its decode and prefill runs) send every
    request at the same bits and agree on every request and step, in both scheduling modes, with memory that
    preempts."""
    if at_zero:
        w = args["workload"]
        args["workload"] = Workload(np.zeros(w.num_requests), w.prompt_tokens, w.output_tokens)
    step_by_step = Engine(**args, path="reference", max_concurrency=max_concurrency).run()
    loop = Engine(**args, path="compiled", max_concurrency=max_concurrency)
    assert loop.compiled
    assert_identical(step_by_step, loop.run())


def test_the_closed_loops_decode_runs_in_the_compiled_loop_send_what_steps_send(monkeypatch):
    """Long decodes and chunked prompts under a closed loop of 24 in flight, all made at t=0, memory that preempts: the
    compiled loop's decode runs (hundreds) send and record what its step-by-step loop and the Python engine
    do."""
    rng = np.random.default_rng(3)
    n = 400
    workload = Workload(np.zeros(n), rng.integers(1, 300, n), rng.integers(20, 300, n))
    for async_scheduling in (False, True):
        args = {
            "workload": workload,
            "config": EngineConfig().replace(
                async_scheduling=async_scheduling, max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=64
            ),
            "num_gpu_blocks": 260,
            "cost": LinearStepCost(8.0, 0.01),
            "max_concurrency": 24,
        }
        fast = Engine(**args, path="compiled")
        result = fast.run()
        assert fast.num_decode_runs > 50
        assert result.num_preemptions.sum() > 0 and result.arrival_s[-1] > 0
        assert_identical(Engine(**args, path="reference").run(), result)
        monkeypatch.setattr(compiled, "DECODE_RUNS", False)
        assert_identical(Engine(**args, path="compiled").run(), result)
        monkeypatch.setattr(compiled, "DECODE_RUNS", True)


@st.composite
def caching_runs(draw):
    """Prefix caching over prompts that share leading blocks (a few system prompts of tokens 0-2 and questions of
    tokens 0-1), known by their token ids or by ids of their prompt blocks (Workload.prefix_hashes), tight memory that
    evicts cached blocks and preempts, either scheduling mode."""
    n = draw(st.integers(1, 30))
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    max_model_len = draw(st.sampled_from([64, 160]))
    systems = draw(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=48), min_size=1, max_size=3))
    ids = [
        np.array(
            (systems[draw(st.integers(0, len(systems) - 1))] + draw(st.lists(st.integers(0, 1), max_size=12)))[
                : max_model_len - 1
            ],
            dtype=np.int64,
        )
        for _ in range(n)
    ]
    prompt = np.array([len(x) for x in ids])
    output = np.array(draw(st.lists(st.integers(1, 50), min_size=n, max_size=n)))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.008, 0.02, 0.3]), min_size=n, max_size=n))
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max(max_num_seqs, 8), 96)) if chunked else max_model_len
    config = EngineConfig().replace(
        async_scheduling=draw(st.booleans()),
        block_size=bs,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=True,
        long_prefill_token_threshold=draw(st.sampled_from([0, 5])) if chunked else 0,
    )
    need = int((-(-(np.minimum(prompt + output, max_model_len) - 1) // bs)).max())
    shared = draw(st.sampled_from(["token ids", "prompt block ids", "nothing"]))
    workload = Workload(np.cumsum(gaps), prompt, output)
    if shared == "prompt block ids":  # Mooncake's form: an id a run of `size` prompt tokens, equal runs equal ids
        size = draw(st.sampled_from([bs, 2 * bs, 3]))
        names: dict = {}
        blocks = [
            np.array([names.setdefault(tuple(x[k : k + size]), len(names)) for k in range(0, len(x), size)])
            for x in ids
        ]
        workload = Workload(workload.arrival_s, prompt, output, prefix_hashes=tuple(blocks), prefix_block_tokens=size)
    return {
        "workload": workload,
        "config": config,
        "cost": LinearStepCost(8.0, 0.01),
        "num_gpu_blocks": 1 + need + draw(st.integers(0, 2 * need)),
        "prompt_token_ids": ids if shared == "token ids" else None,
    }


@given(caching_runs())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_compiled_prefix_caching_equals_the_python_engine(args):
    """With prefix caching (hits, evictions from the free queue's tail, preemptions), the same bits too."""
    assert_identical(Engine(**args, path="reference").run(), Engine(**args, path="compiled").run())


@given(caching_runs(), st.integers(1, 4))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_compiled_prefix_caching_under_a_closed_loop_equals_the_python_engine(args, max_concurrency):
    """Prefix caching under a closed loop: the same sends and the same bits."""
    assert_identical(
        Engine(**args, path="reference", max_concurrency=max_concurrency).run(),
        Engine(**args, path="compiled", max_concurrency=max_concurrency).run(),
    )


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_loop_equals_the_per_step_loop_on_larger_workloads(seed, async_scheduling):
    """Hundreds of requests, long decode runs crossing many blocks, preemption, prefix caching and arrivals in runs."""
    rng = np.random.default_rng(seed)
    n = 300
    prompts = rng.integers(1, 400, n)
    outputs = rng.integers(1, 300, n)
    w = Workload(np.cumsum(rng.exponential(0.05, n)), prompts, outputs)
    caching = seed % 2 == 1
    stems = [rng.integers(0, 50_000, 400) for _ in range(4)]
    ids = [np.concatenate([stems[rng.integers(4)][: p // 2], rng.integers(0, 50_000, p - p // 2)]) for p in prompts]
    settings_ = EngineConfig().replace(
        async_scheduling=async_scheduling,
        block_size=16,
        max_model_len=1024,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        enable_prefix_caching=caching,
        long_prefill_token_threshold=128 if seed >= 2 else 0,
    )
    args = dict(
        workload=w,
        config=settings_,
        num_gpu_blocks=[90, 160, 400, 120][seed],
        cost=LinearStepCost(8.0, 0.01),
        prompt_token_ids=ids if caching else None,
    )
    slow = Engine(**args, path="reference").run()
    engine = Engine(**args, path="compiled")
    fast = engine.run()
    assert engine.num_decode_runs > 0 or caching  # runs of steps at once (without prefix caching)
    assert slow.num_preemptions.sum() > 0 or seed == 2
    assert_identical(slow, fast)
    assert fast.steps["num_hit_tokens"].sum() > 0 or not caching


def test_chunks_join_into_one_record(monkeypatch):
    """A run longer than a chunk of steps records the same as one chunk (runs of equal values joined across)."""
    rng = np.random.default_rng(7)
    n = 300
    workload = Workload(np.cumsum(rng.exponential(0.05, n)), rng.integers(1, 600, n), rng.integers(1, 200, n))
    args = {
        "workload": workload,
        "config": EngineConfig().replace(async_scheduling=False, max_model_len=1024),
        "num_gpu_blocks": 200,
        "cost": LinearStepCost(8.0, 0.01),
    }
    whole = Engine(**args, path="compiled").run()
    monkeypatch.setattr(compiled, "CHUNK_STEPS", 37)
    assert_identical(whole, Engine(**args, path="compiled").run())
    python = Engine(**args, path="reference").run()
    assert_identical(python, whole)
    assert python.num_preemptions.sum() > 0  # memory that preempts: the victims' path is exercised


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("block_size, num_gpu_blocks, threshold", [(16, 200, 0), (4, 700, 0), (1, 3000, 24)])
def test_decode_runs_record_what_steps_record(monkeypatch, block_size, num_gpu_blocks, threshold, async_scheduling):
    """Both loops' decode runs (ended by a finish, a block boundary the pool cannot cover, an arrival it admits, the
    chunk's end; asynchronous ones by their last iteration too) are taken, and change nothing: the Python engine's
    bits, and the loop's without runs."""
    rng = np.random.default_rng(3)
    n = 400
    workload = Workload(np.cumsum(rng.exponential(0.05, n)), rng.integers(1, 600, n), rng.integers(1, 200, n))
    config = EngineConfig().replace(
        async_scheduling=async_scheduling,
        max_model_len=1024,
        block_size=block_size,
        long_prefill_token_threshold=threshold,
    )
    args = {"workload": workload, "config": config, "num_gpu_blocks": num_gpu_blocks, "cost": LinearStepCost(8.0, 0.01)}
    python = Engine(**args, path="reference").run()
    assert python.num_preemptions.sum() > 0
    engine = Engine(**args, path="compiled")
    assert_identical(python, engine.run())
    assert engine.num_decode_runs > 0
    monkeypatch.setattr(compiled, "CHUNK_STEPS", 37)
    assert_identical(python, Engine(**args, path="compiled").run())
    monkeypatch.setattr(compiled, "DECODE_RUNS", False)
    stepping = Engine(**args, path="compiled")
    assert_identical(python, stepping.run())
    assert stepping.num_decode_runs == 0


def test_no_progress_is_the_python_engines_error():
    """A step that schedules nothing: the compiled loop hands back, and the Python loop raises its one-line error."""
    config = EngineConfig().replace(
        async_scheduling=False,
        max_model_len=64,
        max_num_batched_tokens=64,
        enable_chunked_prefill=False,
        max_num_seqs=2,
    )
    workload = Workload(np.array([0.0]), np.array([40]), np.array([10]))
    with pytest.raises(NoProgressError, match="no progress possible") as python:
        Engine(workload, config, num_gpu_blocks=3, cost=ConstantStepCost(), check=False, path="reference").run()
    with pytest.raises(NoProgressError, match="no progress possible") as loop:
        Engine(workload, config, num_gpu_blocks=3, cost=ConstantStepCost(), check=False, path="compiled").run()
    assert str(python.value) == str(loop.value)


def test_which_runs_take_the_compiled_loop(monkeypatch):
    """None decides by size and kind; True on a run it cannot do is refused in one line naming what it needs."""
    monkeypatch.setattr(compiled, "loaded", lambda: False)  # a process that has not run the compiled loop yet
    n = compiled.COMPILED_FROM_REQUESTS
    big = Workload(np.arange(n) * 0.01, np.full(n, 10), np.full(n, 5))
    small = Workload(np.zeros(3), np.full(3, 10), np.full(3, 5))
    sync = EngineConfig().replace(async_scheduling=False, max_model_len=64)
    assert Engine(big, sync, num_gpu_blocks=100).compiled
    assert not Engine(small, sync, num_gpu_blocks=100).compiled
    monkeypatch.setattr(compiled, "loaded", lambda: True)  # once loaded, a small run takes it too
    assert Engine(small, sync, num_gpu_blocks=100).compiled
    monkeypatch.setattr(compiled, "loaded", lambda: False)
    assert not Engine(big, sync, num_gpu_blocks=100, path="reference").compiled
    assert Engine(big, sync, num_gpu_blocks=100, max_concurrency=8).compiled  # a closed loop as an open one
    assert not Engine(small, sync, num_gpu_blocks=100, max_concurrency=8).compiled
    assert Engine(big, sync.replace(async_scheduling=True), num_gpu_blocks=100).compiled
    assert Engine(big, sync.replace(enable_prefix_caching=True), num_gpu_blocks=100).compiled
    hashed = Workload(
        big.arrival_s, big.prompt_tokens, big.output_tokens, prefix_hashes=[np.arange(1)] * n, prefix_block_tokens=16
    )
    assert Engine(hashed, sync.replace(enable_prefix_caching=True), num_gpu_blocks=100).compiled  # Mooncake's form
    assert not Engine(big, sync, num_gpu_blocks=100, allocation="oracle").compiled
    v0 = sync.replace(scheduler_cls="v0-2023", enable_chunked_prefill=False, max_num_batched_tokens=256)
    assert Engine(big, v0, num_gpu_blocks=100).compiled  # vLLM 0.1.4's scheduler: its own loop, paged
    assert Engine(big, v0, num_gpu_blocks=100, allocation="oracle").compiled  # or reserving
    roofline = RooflineStepCost.from_specs(models.get_model("facebook/opt-13b"), models.get_gpu("A100-40GB"))
    assert Engine(big, sync, num_gpu_blocks=100, cost=roofline).compiled
    reduced = AllReduceCost(
        np.array([0.0, 1024.0]), np.array([0.0, 8.0]), 10240.0, 80
    )  # the measured clock's TP fallback
    tp2 = dataclasses.replace(roofline, all_reduce=reduced)
    assert not Engine(big, sync, num_gpu_blocks=100, cost=tp2).compiled
    window = (KVCacheGroup("sliding_attention", 16, (), 32), KVCacheGroup("full_attention", 16, ()))
    m = compiled.COMPILED_FROM_REQUESTS_HYBRID  # a hybrid model's groups: the Python loop has no decode runs for them
    hybrid = Workload(big.arrival_s[:m], big.prompt_tokens[:m], big.output_tokens[:m])
    assert Engine(hybrid, sync, num_gpu_blocks=100, kv_cache_groups=window).compiled
    assert not Engine(hybrid, sync, num_gpu_blocks=100).compiled
    assert not Engine(small, sync, num_gpu_blocks=100, kv_cache_groups=window).compiled
    assert not Engine(
        hybrid, sync.replace(enable_prefix_caching=True), num_gpu_blocks=100, kv_cache_groups=window
    ).compiled
    with pytest.raises(ValueError, match=r"^path='compiled' is not allowed: applies only to the v1 scheduler") as err:
        Engine(small, sync, num_gpu_blocks=100, path="compiled", recorder=Recorder(scheduled=True))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_run_that_must_compile_first_says_so_and_a_cached_one_says_nothing(monkeypatch, caplog, async_scheduling):
    w = Workload(np.zeros(3), np.array([30, 5, 12]), np.array([4, 7, 2]))
    config = EngineConfig().replace(async_scheduling=async_scheduling, max_model_len=64)
    warm.warm()  # make setup's step: both loops compiled (or loaded from numba's cache) now
    with caplog.at_level("INFO", logger="kvlab"):
        assert warm.warm() == []  # nothing left to compile
        Engine(w, config, num_gpu_blocks=64, path="compiled").run()
        assert not caplog.records
        monkeypatch.setattr(compiled, "cached", lambda loop: False)  # as in a process that has not run it yet
        monkeypatch.setattr(compiled, "_RAN", set())
        Engine(w, config, num_gpu_blocks=64, path="compiled").run()
    mode = "asynchronous" if async_scheduling else "synchronous"
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"numba compiles the engine's {mode} loop, once for this machine")
    assert said[1].startswith("compiled, with the first steps run, in ") and len(said) == 2


RTX_PRO = "RTX-PRO-6000-Server-96GB"
MEASURED = {  # one of each kind of term: the skew fit, tensor parallelism's all-reduce, experts and their dispatch
    (model, tp, dp): make_step_cost(
        "measured",
        model=models.get_model(model),
        gpu=models.get_gpu(RTX_PRO),
        config=EngineConfig().replace(
            tensor_parallel_size=tp, data_parallel_size=dp, enable_expert_parallel=dp > 1, async_scheduling=mode
        ),
    )
    for model, tp, dp, mode in [
        ("meta-llama/Llama-3.1-8B", 1, 1, False),
        ("Qwen/Qwen3-32B", 2, 1, True),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", 1, 1, False),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", 1, 2, True),
    ]
}


@st.composite
def batches(draw):
    """A step's Batch as account() builds it: decodes of unequal context beside prefill chunks, or not."""
    decodes = draw(st.integers(0, 300))
    low = draw(st.integers(1, 40_000))
    high = low + draw(st.integers(0, 20_000)) if decodes > 1 else low
    decode_context = decodes * low + (high - low) * min(decodes, 1) if decodes else 0
    if decodes > 2:
        decode_context += draw(st.integers(0, (decodes - 2) * (high - low)))
    chunks = draw(st.lists(st.tuples(st.integers(1, 9000), st.integers(0, 30_000)), max_size=3))
    if not decodes and not chunks:
        chunks = [(1, 0)]
    tokens = decodes + sum(n for n, _ in chunks)
    context = decode_context + sum(n + c for n, c in chunks)
    pairs = sum(n * c + n * (n + 1) // 2 for n, c in chunks)
    low, high = (low, high) if decodes else (0, 0)
    return Batch(tokens, context, decodes, decode_context, len(chunks), pairs, low, high)


MEASURED[("facebook/opt-13b", "roofline")] = RooflineStepCost.from_specs(
    models.get_model("facebook/opt-13b"), models.get_gpu("A100-40GB")
)  # the roofline on one GPU (section 6's today's clock, the ablation's)
MEASURED[("facebook/opt-13b", "vllm-2023")] = make_step_cost(
    "vllm-2023", model=models.get_model("facebook/opt-13b"), gpu=models.get_gpu("A100-40GB")
)  # section 6's clock of the vLLM of 2023
MEASURED_ONLY = sorted((k for k in MEASURED if k[1] not in ("vllm-2023", "roofline")), key=str)


@given(st.sampled_from(sorted(MEASURED, key=str)), batches())
@settings(max_examples=400, deadline=None)
def test_the_compiled_measured_and_2023_clocks_give_the_python_steps_bits(which, batch):
    cost = MEASURED[which]
    from kvlab.core.engine.fast.loops import clock

    assert clock.cost_s(compiled.clock_of(cost), *batch) == cost.step_s(batch)


@given(compiled_runs(), st.sampled_from(sorted(MEASURED, key=str)))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_compiled_loop_on_the_measured_and_2023_clocks_equals_the_python_engine(args, which):
    """Every term of the measured clock and the 2023 one, decode runs with their growing steps included, bit for
    bit."""
    args = args | {"cost": MEASURED[which]}
    assert_identical(Engine(**args, path="reference").run(), Engine(**args, path="compiled").run())


def test_the_loops_leave_every_array_they_take_as_they_found_it_but_for_its_contents():
    """The loops take their arrays unowned (loops.jit.unowned): many runs later, no array has gained or lost a Python
    reference (a view that owned one and dropped it, or kept it, would change the count), and a view
    written through writes the array."""
    import sys

    from kvlab.core.engine.fast.loops import jit

    values = np.arange(6, dtype=np.int64)
    tuple_of = (values, 3, np.zeros(2))
    before = sys.getrefcount(values), sys.getrefcount(tuple_of[2])

    @jit.numba.njit
    def through(x):
        view = jit.unowned(x)
        view[0][1] = 100 + view[1]
        view[2][0] = view[0].sum()
        return view[0].shape[0]

    for _ in range(1000):
        assert through(tuple_of) == 6
    assert (sys.getrefcount(values), sys.getrefcount(tuple_of[2])) == before
    assert values[1] == 103 and tuple_of[2][0] == 100 + 3 + 0 + 2 + 3 + 4 + 5


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("clock", ["linear", *sorted(MEASURED, key=str)], ids=str)
@pytest.mark.parametrize(
    "block_size, num_gpu_blocks, max_num_batched_tokens, threshold",
    [(16, 400, 64, 0), (16, 90, 100, 0), (4, 1200, 48, 16), (1, 4000, 40, 0)],
)
def test_long_prompts_chunks_beside_decodes_record_what_the_python_engine_records(
    monkeypatch, clock, block_size, num_gpu_blocks, max_num_batched_tokens, threshold, async_scheduling
):
    """A long prompt's chunks beside the same decodes, in both modes, between decode runs (ended by a finish, the
    blocks the pool has not got, an arrival it admits, the chunk of records' end): the Python engine's bits on every
    clock (each term of the measured one), with and without decode runs."""
    rng = np.random.default_rng(5)
    n = 150
    prompts = np.where(rng.random(n) < 0.3, rng.integers(200, 900, n), rng.integers(1, 40, n))
    workload = Workload(np.cumsum(rng.exponential(0.08, n)), prompts, rng.integers(1, 120, n))
    config = EngineConfig().replace(
        async_scheduling=async_scheduling,
        max_model_len=1024,
        block_size=block_size,
        max_num_seqs=8,
        max_num_batched_tokens=max_num_batched_tokens,
        long_prefill_token_threshold=threshold,
    )
    cost = LinearStepCost(8.0, 0.01) if clock == "linear" else MEASURED[clock]
    args = {"workload": workload, "config": config, "num_gpu_blocks": num_gpu_blocks, "cost": cost}
    python = Engine(**args, path="reference").run()
    engine = Engine(**args, path="compiled")
    assert_identical(python, engine.run())
    assert engine.num_decode_runs > 0
    monkeypatch.setattr(compiled, "CHUNK_STEPS", 29)
    assert_identical(python, Engine(**args, path="compiled").run())
    monkeypatch.setattr(compiled, "DECODE_RUNS", False)
    stepping = Engine(**args, path="compiled")
    assert_identical(python, stepping.run())
    assert stepping.num_decode_runs == 0


def decode_run_steps(cost, num_decodes: int, context: int, low: int, high: int, num_steps: int) -> tuple:
    """The compiled decode run's step times (decode_step_s, with what decode_run_clock read once for the run) and the
    step_s of each step's Batch: num_decodes decodes of context tokens in all, from low to high each, a token more a
    step."""
    from kvlab.core.engine.fast.loops import clock as kernels

    clock = compiled.clock_of(cost)
    run = kernels.decode_run_clock(clock, num_decodes, context, low, high)
    n = num_decodes
    steps = [
        cost.step_s(Batch(n, context + n * j, n, context + n * j, 0, 0, low + j, high + j)) for j in range(num_steps)
    ]
    return [kernels.decode_step_s(clock, run, j) for j in range(num_steps)], steps


@given(
    st.sampled_from(MEASURED_ONLY),
    st.integers(1, 300),
    st.integers(0, 30_000),
    st.integers(0, 30_000),
    st.integers(1, 60),
)
@settings(max_examples=120, deadline=None)
def test_a_decode_runs_steps_on_the_measured_clock_are_the_python_steps_bits(which, num_decodes, history, spread, k):
    """num_decodes - 1 decodes of history + 1 context tokens and one of spread more (all equal with one decode)."""
    spread *= num_decodes > 1
    low = history + 1
    run, steps = decode_run_steps(MEASURED[which], num_decodes, num_decodes * low + spread, low, low + spread, k)
    assert run == steps


@pytest.mark.parametrize("largest", [1019, 4090, 16380, 30])  # the run crosses the fit's bin edge at 1,024, 4,096, ...
def test_a_decode_run_across_a_skew_bin_edge_gives_the_bits_of_its_steps(largest):
    cost = MEASURED[("meta-llama/Llama-3.1-8B", 1, 1)]
    n, low = 12, 10
    run, steps = decode_run_steps(cost, n, (n - 1) * low + largest, low, largest, 12)
    assert run == steps
    context = (n - 1) * low + largest
    plain = cost.without("attention skew")
    assert steps != [plain.step_s(Batch(n, context + n * j, n, context + n * j)) for j in range(12)]


@st.composite
def hybrid_runs(draw):
    """A hybrid model's groups (a window, full attention, maybe a chunked group and a Mamba state) on a small workload
    and a pool tight enough to preempt, either scheduling mode, without prefix caching."""
    n, bs, max_model_len, gaps, prompts, outputs = draw_requests(draw, st)
    chunked = draw(st.booleans())
    budget = draw(st.integers(8, 96)) if chunked else max_model_len + draw(st.integers(0, 40))
    config = EngineConfig().replace(
        async_scheduling=draw(st.booleans()),
        block_size=bs,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 3])) if chunked else 0,
    )
    groups = [KVCacheGroup("sliding_attention", bs, (), draw(st.integers(1, 40)))] * draw(st.integers(1, 3))
    groups.append(KVCacheGroup("full_attention", bs, ()))
    other = draw(st.sampled_from(["none", "chunked", "mamba"]))  # a chunk needs the groups' common block size
    if other == "chunked":
        groups.append(
            KVCacheGroup("chunked_local_attention", bs, (), attention_chunk_size=bs * draw(st.integers(1, 4)))
        )
    elif other == "mamba":
        groups.insert(0, KVCacheGroup("mamba", max_model_len, ()))
    final = [min(p + o, max_model_len) for p, o in zip(prompts, outputs)]
    least = len(groups) * (max(-(-(f - 1) // bs) for f in final) + 1)
    return {
        "workload": Workload(np.cumsum(gaps), np.minimum(prompts, max_model_len - 1), np.array(outputs)),
        "config": config,
        "cost": draw(st.sampled_from([ConstantStepCost(8.0), LinearStepCost(5.0, 0.1)])),
        "num_gpu_blocks": least + draw(st.sampled_from([0, 1, 3, 10, 400])),
        "kv_cache_groups": groups,
    }


@given(hybrid_runs())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_compiled_loop_serves_a_hybrid_models_groups_as_the_python_engine_does(args):
    """Windows, chunks and Mamba states in the compiled loop: every request and step the Python engine's, and the
    blocks the windows and chunks gave back."""
    python = Engine(**args, path="reference")
    loop = Engine(**args, path="compiled")
    assert_identical(python.run(), loop.run())
    assert loop.kv_cache_manager.num_window_freed == python.kv_cache_manager.num_window_freed


@given(hybrid_runs(), st.integers(1, 4))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_compiled_loop_serves_a_hybrid_models_groups_under_a_closed_loop_as_the_python_engine_does(args, n_max):
    assert_identical(
        Engine(**args, path="reference", max_concurrency=n_max).run(),
        Engine(**args, path="compiled", max_concurrency=n_max).run(),
    )


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_hybrid_models_decodes_run_at_once_as_they_run_step_by_step(async_scheduling):
    """Gemma-3-like groups (two windows, one full) on long decodes, memory binding: the compiled loop does decode runs
    (windows give blocks back in them, waiting requests are admitted once enough come back) and every request and step
    is the Python engine's."""
    rng = np.random.default_rng(7)
    n = 300
    workload = Workload(np.cumsum(rng.exponential(0.02, n)), rng.integers(8, 400, n), rng.integers(50, 600, n))
    config = EngineConfig().replace(async_scheduling=async_scheduling, max_model_len=2048, max_num_seqs=64)
    groups = [KVCacheGroup("sliding_attention", 16, (), 128)] * 2 + [KVCacheGroup("full_attention", 16, ())]
    args = {"workload": workload, "config": config, "cost": LinearStepCost(8.0, 0.01), "num_gpu_blocks": 1200}
    python = Engine(**args, kv_cache_groups=groups, path="reference")
    loop = Engine(**args, kv_cache_groups=groups, path="compiled")
    result = python.run()
    assert_identical(result, loop.run())
    assert result.summary()["num_preemptions"] > 0 and loop.num_decode_runs > 100
    assert loop.kv_cache_manager.num_window_freed == python.kv_cache_manager.num_window_freed > 0


# ---------------------------------------------------------------- vLLM 0.1.4's scheduler (fast/loops/v0.py)
@given(v0_runs(), st.sampled_from([None, None, 1, 3]), st.booleans())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_compiled_loop_serves_vllm_0_1_4_as_the_python_engine_does(args, max_concurrency, clock_2023):
    """Tight pools (preemptions), the watermark, the three Orca reservations in buddy arenas (the Fig. 2 split's
    records among the steps'), section 6's 2023 clock or a simple one, open or closed loops: bit for bit."""
    if clock_2023:
        args = args | {"cost": MEASURED[("facebook/opt-13b", "vllm-2023")]}
    step_by_step = Engine(**args, path="reference", max_concurrency=max_concurrency).run()
    loop = Engine(**args, path="compiled", max_concurrency=max_concurrency)
    assert loop.compiled
    assert_identical(step_by_step, loop.run())


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 700)), max_size=60), st.integers(1, 1500))
@settings(max_examples=300, deadline=None)
def test_the_compiled_buddy_places_every_chunk_where_kvlabs_buddy_does(operations, num_slots):
    """Allocations and frees in any order over a pool of any size (arenas of every power of two): the same offsets,
    the same free chunks and counters as kvlab.core.buddy."""
    from kvlab.core.buddy import BuddyAllocator
    from kvlab.core.engine.fast.loops import v0

    buddy = BuddyAllocator(num_slots)
    workload = Workload(np.zeros(1), np.array([1]), np.array([1]))
    config = EngineConfig().replace(async_scheduling=False, block_size=1, max_model_len=num_slots + 1)
    engine = Engine(workload, config, num_gpu_blocks=num_slots + 1, allocation="oracle", check=False)
    orca = compiled.reservations(engine, np.array([1]), np.array([1]))
    held = []  # (offset, size)
    for allocate, size in operations:
        if allocate or not held:
            expected = buddy.allocate(size)
            assert v0.allocate_chunk(orca, size) == (-1 if expected is None else expected)
            if expected is not None:
                held.append((expected, size))
        else:
            offset, size = held.pop(size % len(held))
            buddy.free(offset)
            v0.free_chunk(orca, offset, size)
        assert [(int(o), 1 << int(j)) for o, j in enumerate(orca.free_at) if j >= 0] == buddy.free_chunks()
        assert orca.counters[0] == buddy.num_free_slots and orca.counters[1] == buddy.num_rounding_slots
        for size in (1, 5, 64, 700):
            assert v0.can_allocate(orca, size) == buddy.can_allocate(size)
            assert v0.free_slots_below(orca, size) == buddy.free_slots_below(size)


@pytest.mark.parametrize("allocation", ["paged", "max"])
def test_vllm_0_1_4_with_no_progress_is_the_python_engines_error(allocation):
    """A request no pool of vLLM 0.1.4's can admit (unchecked): its compiled loop hands back, and the Python loop raises
    its one-line error."""
    config = EngineConfig().replace(
        scheduler_cls="v0-2023",
        async_scheduling=False,
        enable_chunked_prefill=False,
        max_model_len=64,
        max_num_batched_tokens=64,
        max_num_seqs=2,
    )
    workload = Workload(np.array([0.0]), np.array([40]), np.array([10]))
    errors = []
    for path in ("reference", "compiled"):
        engine = Engine(workload, config, num_gpu_blocks=3, allocation=allocation, check=False, path=path)
        with pytest.raises(NoProgressError, match="no progress possible") as error:
            engine.run()
        errors.append(str(error.value))
    assert errors[0] == errors[1]


def test_the_loops_cache_is_named_by_every_source_they_compile():
    """numba keys a cached loop by its own file only, so the cache folder is named by the contents of every kvlab
    module the loops import (an edit to rules.py must not load loops compiled with the old rules): each such module
    is in SOURCE_FILES, and the folder is named by their digest."""
    import ast
    import hashlib
    from pathlib import Path

    from kvlab.core.engine.fast.loops import jit

    imported = set()
    for path in Path(jit.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvlab"):
                for alias in node.names:
                    module = f"{node.module}.{alias.name}"
                    spec = (
                        importlib.util.find_spec(module)
                        if _is_module(module)
                        else importlib.util.find_spec(node.module)
                    )
                    imported.add(Path(spec.origin))
    assert imported <= set(jit.SOURCE_FILES), sorted(map(str, imported - set(jit.SOURCE_FILES)))
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in jit.SOURCE_FILES)).hexdigest()[:16]
    assert not jit.CACHE_DIR or jit.CACHE_DIR.endswith(f"loops-{digest}")


def _is_module(name: str) -> bool:
    """Whether name is an importable module (from a.b import c: c a module, not a function)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_the_time_loop_reads_the_same_state_on_both_sides():
    """engine_core's run_sync and run_async, written once, read the loop's state by name: every name they read on it
    is an attribute of the Python Engine and a field of the compiled loops' record (arrays.LOOP_STATE), and every
    binding they call exists on both sides."""
    import ast
    import inspect

    from kvlab.core.engine import engine_core
    from kvlab.core.engine.fast.arrays import LOOP_STATE

    source = ast.parse(inspect.getsource(engine_core))
    shared = [node for node in source.body if isinstance(node, ast.FunctionDef) and node.name in ENGINE_CORE_LOOP]
    state = {
        n.attr
        for f in shared
        for n in ast.walk(f)
        if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "loop"
    }
    calls = {n.func.id for f in shared for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    engine = Engine(Workload(np.zeros(1), np.array([4]), np.array([2])), num_gpu_blocks=8)
    assert state and all(hasattr(engine, name) for name in state) and state <= set(LOOP_STATE.names)
    loops = compiled.kernels()
    bound = calls - set(ENGINE_CORE_LOOP)
    assert len(bound) > 15 and all(hasattr(engine_core, name) and name in loops.BINDINGS for name in bound)


ENGINE_CORE_LOOP = ("run_sync", "next_step", "run_async")
