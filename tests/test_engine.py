"""The serving engine: vLLM 0.33's own outputs on hand-checked cases, the fast path against the per-step loop,
invariants, the reservation baselines and the article's model inside the engine."""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, draw_requests
from kvlab.core import batching
from kvlab.core.config import EngineConfig
from kvlab.core.cost import ConstantStepCost, LinearStepCost
from kvlab.core.engine import Engine, NoProgressError, Recorder, replay, simulate
from kvlab.core.service_time import TokenServiceTime
from kvlab.core.workload import Workload

CASES = json.loads((ROOT / "tests" / "data" / "vllm_scheduler_cases.json").read_text())["cases"]
REQUEST_KEYS = ("first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens", "num_preemptions")


def config(**settings) -> EngineConfig:
    return EngineConfig().replace(**{"async_scheduling": False, **settings})


# ---------------------------------------------------------------- vLLM's own outputs (no vLLM needed)
@pytest.mark.parametrize("case", [c for c in CASES if "out" in c], ids=lambda c: c["name"])
def test_hand_checked_cases_equal_vllms_outputs(case):
    """Every request's times and preemptions and every step's batch, blocks (ids too) and queues as vLLM 0.33."""
    got = replay.to_document(replay.run_document(case["in"], recorder=Recorder(scheduled=True, block_ids=True)))
    want = case["out"]
    for mine, theirs in zip(got["requests"], want["requests"], strict=True):
        assert {k: mine[k] for k in REQUEST_KEYS} == {k: theirs[k] for k in REQUEST_KEYS}, mine["request_id"]
    assert len(got["steps"]) == len(want["steps"])
    for j, (mine, theirs) in enumerate(zip(got["steps"], want["steps"])):
        assert mine == {k: theirs[k] for k in mine}, f"step {j}"


def test_a_request_that_never_fits_stops_with_vllms_message_or_is_refused_up_front():
    case = next(c for c in CASES if c["name"] == "no_progress_never_fits")
    with pytest.raises(NoProgressError, match=r"at t=0\.030000 s: .* request 1, has 20 tokens = 5 blocks and 4 of 4"):
        replay.run_document(case["in"], check=False)
    with pytest.raises(
        ValueError,
        match=r"request 1='20 prompt \+ 2 output tokens' is not allowed: needs 6 blocks of 4 "
        r"tokens at its longest \(21 tokens\) but the pool has 4 usable blocks",
    ):
        replay.run_document(case["in"])


# ---------------------------------------------------------------- invariants of the per-step loop
@st.composite
def engine_runs(draw):
    """A small workload and engine settings, some tight enough to preempt, some with shared prompts."""
    n, bs, max_model_len, gaps, prompts, outputs = draw_requests(draw, st)
    allocation = draw(st.sampled_from(["paged", "paged", "paged", "max", "pow2", "oracle"]))
    caching = allocation == "paged" and draw(st.booleans())
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max_num_seqs, 96))
    if not chunked:
        budget = max(budget, max_model_len)
    final = [min(p + o, max_model_len) for p, o in zip(prompts, outputs)]
    if allocation == "paged":
        least = max(-(-(f - 1) // bs) for f in final) + 1
    else:
        asked = [
            max_model_len
            if allocation == "max"
            else min(p + (1 << (f - p - 1).bit_length()), max_model_len)
            if allocation == "pow2"
            else f
            for p, f in zip(prompts, final)
        ]
        least = -(-(1 << (max(asked) - 1).bit_length()) // bs) + 1  # the largest buddy arena holds its chunk
    num_gpu_blocks = least + draw(st.sampled_from([0, 0, 1, 3, 10, 400]))
    cost = draw(
        st.sampled_from(
            [ConstantStepCost(8.0), ConstantStepCost(10.0), LinearStepCost(5.0, 0.1), LinearStepCost(2.0, 0.013)]
        )
    )
    ids = None
    if caching:  # prompts drawn from a few shared stems
        stems = [list(range(100 * s, 100 * s + 40)) for s in range(3)]
        ids = [np.array(stems[draw(st.integers(0, 2))][: p - 1] + [draw(st.integers(0, 2))]) for p in prompts]
    workload = Workload(np.cumsum(gaps) - gaps[0], np.array(prompts), np.array(outputs))
    settings_ = config(
        async_scheduling=draw(st.booleans()),
        block_size=bs,
        enable_prefix_caching=caching,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 3, 16])) if max_model_len >= 16 else 0,
    )
    return dict(
        workload=workload,
        config=settings_,
        num_gpu_blocks=num_gpu_blocks,
        cost=cost,
        allocation=allocation,
        prompt_token_ids=ids,
    )


@given(engine_runs())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_invariants_hold(args):
    """No block over-committed, every request finishes once with its tokens, every scheduled token accounted for."""
    engine = Engine(**args, recorder=Recorder(scheduled=True, frees=True))
    result = engine.run()
    w, settings_ = args["workload"], args["config"]
    max_model_len, bs = settings_.scheduler.max_model_len, settings_.cache.block_size
    final = np.minimum(w.prompt_tokens + w.output_tokens, max_model_len)
    # every request finishes, once, with all its tokens
    assert np.isfinite(result.finish_s).all()
    assert np.array_equal(result.num_output_tokens, final - w.prompt_tokens)
    assert (result.first_scheduled_s >= w.arrival_s).all()
    assert (result.first_token_s <= result.finish_s).all() and (result.first_scheduled_s < result.first_token_s).all()
    freed = [rid for rid, _ in result.freed_tables]
    assert sorted(freed) == sorted(i for i in range(w.num_requests) for _ in range(1 + result.num_preemptions[i]))
    # no block over-committed; nothing left held
    assert engine.num_kv_tokens == 0 and not engine.scheduler.running and not engine.scheduler.waiting
    steps = result.steps
    assert (steps["num_blocks_in_use"] <= args["num_gpu_blocks"] - 1).all()
    assert (steps["num_scheduled_tokens"] <= settings_.scheduler.max_num_batched_tokens).all()
    assert (steps["num_running"] <= settings_.scheduler.max_num_seqs).all()
    if args["allocation"] == "paged":
        pool = engine.kv_cache_manager.pool
        pool.check_invariants()
        assert pool.num_free_blocks == args["num_gpu_blocks"] - 1
        if not settings_.cache.enable_prefix_caching:
            assert (steps["num_kv_tokens"] <= steps["num_reserved_tokens"]).all()
            running = steps["num_running"]
            if settings_.scheduler.async_scheduling:  # read after the update, when the next batch has admitted
                running = np.maximum(running, np.append(running[1:], 0))
            assert (steps["num_reserved_tokens"] - steps["num_kv_tokens"] < bs * np.maximum(running, 1)).all()
    else:
        assert result.num_preemptions.sum() == 0
        assert (steps["num_kv_tokens"] <= steps["num_reserved_tokens"]).all()
        assert engine.kv_cache_manager.num_free_tokens == engine.kv_cache_manager.num_tokens_total
        engine.kv_cache_manager.buddy.check_invariants()
        # Fig. 2's split: token states + reservation + internal fragmentation == held; rounding within internal
        reservation, internal = steps["num_reservation_tokens"], steps["num_internal_frag_tokens"]
        assert (steps["num_kv_tokens"] + reservation + internal == steps["num_reserved_tokens"]).all()
        assert (reservation >= 0).all() and (steps["num_rounding_tokens"] <= internal).all()
        if args["allocation"] == "oracle":  # it asks exactly its final length: all it wastes is rounding
            assert np.array_equal(steps["num_rounding_tokens"], internal)
        external = steps["num_external_frag_tokens"]
        pool = engine.kv_cache_manager.num_tokens_total
        assert (external <= pool - steps["num_reserved_tokens"]).all() and (external >= 0).all()
        if not settings_.scheduler.async_scheduling:
            assert (external[steps["num_waiting"] == 0] == 0).all()
    # tokens conserved: since its last admission each request computed exactly its tokens but the last sampled one
    # (async: or it finished in the waiting queue by the token of a batch in flight when it was preempted, so
    # before that preemption)
    computed = np.zeros(w.num_requests, dtype=np.int64)
    before_preemption = np.zeros(w.num_requests, dtype=np.int64)
    for batch, preempted in result.scheduled:
        for rid in preempted:
            computed[rid], before_preemption[rid] = 0, computed[rid]
        for rid, n in batch:
            computed[rid] += n
    assert sum(n for batch, _ in result.scheduled for _, n in batch) == steps["num_scheduled_tokens"].sum()
    if settings_.scheduler.async_scheduling:
        finished_waiting = computed == 0
        computed[finished_waiting] = before_preemption[finished_waiting]
    if not settings_.cache.enable_prefix_caching:
        assert np.array_equal(computed, final - 1)
    else:  # prefix hits are not computed
        assert (computed <= final - 1).all() and (computed >= 1).all()


# ---------------------------------------------------------------- the block pool's order, in the engine
def test_preempted_requests_blocks_go_to_the_requester_last_block_first():
    case = next(c for c in CASES if c["name"] == "preempt_two_victims_one_step")
    result = replay.run_document(case["in"], path="reference", recorder=Recorder(block_ids=True, frees=True))
    assert result.freed_tables[:2] == [(2, (4,)), (1, (3,))]  # victims freed last-admitted first, then reused


# ---------------------------------------------------------------- reservation baselines
def test_reservations_admit_by_their_size_and_never_preempt():
    w = Workload(np.zeros(4), np.full(4, 10), np.array([6, 6, 6, 6]))  # each ends at 16 tokens
    blocks = {"oracle": None, "pow2": None, "max": None}
    for allocation in blocks:
        result = simulate(
            w,
            config(block_size=4, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64),
            num_gpu_blocks=17,
            allocation=allocation,
        )  # 64 token slots
        assert result.num_preemptions.sum() == 0
        blocks[allocation] = result.steps["num_running"][0]
    # oracle asks 16 slots each (all 4 fit), pow2 10 + 8 = 18 (a chunk of 32: 2 fit), max 64 (only 1 at a time)
    assert blocks == {"oracle": 4, "pow2": 2, "max": 1}
    w = Workload(np.zeros(4), np.full(4, 10), np.array([7, 7, 7, 7]))  # 17 tokens: pow2 asks 18, a chunk of 32
    result = simulate(
        w,
        config(block_size=4, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64),
        num_gpu_blocks=17,
        allocation="pow2",
    )
    assert result.steps["num_running"][0] == 2 and result.steps["num_reserved_tokens"][0] == 64


def test_orca_max_holds_seven_requests_of_2048_in_the_opt_13b_pool():
    """Section 6's pool (983 blocks of 16 = 15,728 slots: arenas of 8,192, 4,096, 2,048 and smaller) holds 4 + 2 + 1
    chunks of max_model_len 2,048, and the 1,360 slots left are too small for an eighth (external fragmentation)."""
    w = Workload(np.zeros(9), np.full(9, 100), np.full(9, 50))
    result = simulate(w, config(block_size=16, max_model_len=2048), num_gpu_blocks=984, allocation="max")
    steps = result.steps
    assert steps["num_running"].max() == 7 and steps["num_running"][0] == 7
    assert steps["num_reserved_tokens"][0] == 7 * 2048 and steps["num_external_frag_tokens"][0] == 15_728 - 7 * 2048
    assert steps["num_internal_frag_tokens"][0] == 7 * (2048 - 150) and steps["num_rounding_tokens"][0] == 0


def test_pow2_reserves_the_prompt_plus_a_power_of_two_of_the_output():
    """§6.1 of the vLLM paper: an output of 25 tokens reserves 32 positions, beside the prompt: 100 + 32 = 132 slots
    asked, a buddy chunk of 256; internal fragmentation is the 7 output slots and the 124 of the rounding."""
    w = Workload(np.zeros(1), np.array([100]), np.array([25]))
    result = simulate(w, config(block_size=16, max_model_len=2048), num_gpu_blocks=65, allocation="pow2")
    steps = result.steps
    assert steps["num_reserved_tokens"][0] == 256
    assert steps["num_rounding_tokens"][0] == 256 - 132 and steps["num_internal_frag_tokens"][0] == 256 - 125
    assert steps["num_reservation_tokens"][0] == 125 - 100  # its prefill computed 100 tokens


def test_admission_waits_for_a_chunk_though_enough_slots_are_free():
    """64 slots (one arena): A, B and C take chunks of 16 at 0, 16 and 32; B finishes first and frees 16 at 16, so 32
    slots are free (16 at 16, 16 at 48) but not as one chunk: D (32 slots) waits until A and C finish."""
    w = Workload(np.zeros(4), np.full(4, 8), np.array([8, 2, 8, 24]))
    result = simulate(
        w,
        config(block_size=4, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64),
        num_gpu_blocks=17,
        allocation="oracle",
        path="reference",
    )
    steps = result.steps
    b_done = result.finish_s[1]
    refused = (steps["end_s"] >= b_done) & (steps["end_s"] < result.finish_s[0]) & (steps["num_waiting"] == 1)
    assert refused.any()
    assert (64 - steps["num_reserved_tokens"][refused] == 32).all() and (
        steps["num_external_frag_tokens"][refused] == 32
    ).all()
    assert result.first_scheduled_s[3] >= max(result.finish_s[0], result.finish_s[2])
    assert steps["num_external_frag_tokens"][0] == 16  # before B finishes: 16 free at 48, D needs 32


def test_paged_allocation_preempts_where_oracle_reservation_waits():
    w = Workload(np.zeros(3), np.full(3, 8), np.full(3, 16))
    settings_ = config(block_size=4, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64)
    paged = simulate(w, settings_, num_gpu_blocks=13)
    oracle = simulate(w, settings_, num_gpu_blocks=13, allocation="oracle")
    assert paged.num_preemptions.sum() > 0 and oracle.num_preemptions.sum() == 0
    # 48 slots are buddy arenas of 32 and 16: one request's 24 slots take a chunk of 32, and the 16 free slots are
    # too small for the next one (external fragmentation)
    assert oracle.steps["num_running"][0] == 1 and oracle.steps["num_external_frag_tokens"][0] == 16


# ---------------------------------------------------------------- the article's model inside the engine
def article_engine(workload, max_num_seqs=8, ms=8.0):
    """Unlimited blocks and budget, prompts free (one token), a constant cost per step: section 2's slots."""
    settings_ = config(block_size=16, max_model_len=4096, max_num_seqs=max_num_seqs, max_num_batched_tokens=1 << 20)
    return simulate(workload, settings_, num_gpu_blocks=1 << 20, cost=ConstantStepCost(ms))


@given(
    st.lists(st.integers(0, 60), min_size=1, max_size=60),
    st.lists(st.integers(1, 300), min_size=60, max_size=60),
    st.integers(1, 8),
)
@settings(max_examples=60, deadline=None)
def test_engine_equals_the_continuous_slot_model_on_step_aligned_arrivals(steps_apart, outputs, slots):
    # A step of 2^-7 s (7.8125 ms): step boundaries and arrivals are then exact binary fractions, so an arrival on a
    # boundary is on it in float64 too (with 8 ms, 0.008 is inexact: the engine's summed clock may pass an arrival
    # a step early or late, where the slot model's multiples do not).
    step_ms = 7.8125
    arrival = np.cumsum(steps_apart) * (step_ms / 1000)
    n = len(arrival)
    w = Workload(arrival, np.ones(n, dtype=np.int64), np.array(outputs[:n]))
    engine = article_engine(w, slots, ms=step_ms)
    slot_model = batching.simulate(
        Workload(arrival, np.zeros(n, dtype=np.int64), w.output_tokens),
        "continuous",
        max_num_seqs=slots,
        cost=TokenServiceTime(step_ms),
    )
    assert np.allclose(engine.finish_s, slot_model.finish_s, rtol=0, atol=1e-9)
    assert np.allclose(engine.first_scheduled_s, slot_model.start_s, rtol=0, atol=1e-9)


@given(
    st.lists(st.floats(0, 0.5), min_size=1, max_size=60),
    st.lists(st.integers(1, 300), min_size=60, max_size=60),
    st.integers(1, 8),
)
@settings(max_examples=60, deadline=None)
def test_engine_is_within_one_step_of_the_slot_model_otherwise(gaps, outputs, slots):
    arrival = np.cumsum(gaps)
    n = len(arrival)
    w = Workload(arrival, np.ones(n, dtype=np.int64), np.array(outputs[:n]))
    engine = article_engine(w, slots)
    slot_model = batching.simulate(
        Workload(arrival, np.zeros(n, dtype=np.int64), w.output_tokens),
        "continuous",
        max_num_seqs=slots,
        cost=TokenServiceTime(8.0),
    )
    late = engine.finish_s - slot_model.finish_s
    assert (late > -1e-9).all() and (late < 0.008 + 1e-9).all()


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "settings_, blocks, message",
    [
        (dict(max_model_len=32), 100, r"prompt_tokens\[1\]=40 is not allowed: must be shorter than max_model_len=32"),
        (
            dict(max_model_len=128),
            3,
            r"request 1='40 prompt \+ 8 output tokens' is not allowed: needs 3 blocks of 16 "
            r"tokens at its longest \(47 tokens\) but the pool has 2 usable blocks",
        ),
        (dict(max_model_len=128), 1, r"num_gpu_blocks=1 is not allowed: must be >= 2"),
        (
            dict(max_model_len=4096, enable_chunked_prefill=False),
            100,
            r"max_num_batched_tokens=2048 is not allowed: is smaller than max_model_len \(4,096\) with chunked prefill off",
        ),
        (
            dict(max_model_len=128, max_num_seqs=4096),
            100,
            r"max_num_batched_tokens=2048 is not allowed: must be >= max_num_seqs",
        ),
        (
            dict(max_model_len=128, long_prefill_token_threshold=200),
            100,
            r"long_prefill_token_threshold=200 is not allowed",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line_before_any_work(settings_, blocks, message):
    w = Workload(np.zeros(2), np.array([10, 40]), np.array([4, 8]))
    settings_ = config(max_num_batched_tokens=2048, **settings_)
    with pytest.raises(ValueError, match=message):
        simulate(w, settings_, num_gpu_blocks=blocks)


class BackwardsStepCost:
    """A step cost gone wrong, as an extrapolated profile or fitted coefficients can: a prompt step of
    bad_from_tokens tokens or more lasts -1 ms."""

    name = "backwards"

    def __init__(self, bad_from_tokens: int):
        self.bad_from_tokens = bad_from_tokens

    def step_s(self, batch) -> float:
        return -0.001 if batch.num_scheduled_tokens >= self.bad_from_tokens else 0.01


def test_a_step_cost_that_runs_the_clock_backwards_is_refused_in_one_line():
    w = Workload(np.zeros(2), np.array([10, 40]), np.array([40, 30]))
    with pytest.raises(
        ValueError,
        match=r"^the backwards step cost gave a step of 50 tokens -0\.001 s: a step lasts "
        r"0 s or more, so its profile or coefficients are wrong there \(fix them, "
        r"or choose another step cost\)$",
    ):
        simulate(
            w,
            config(max_model_len=128),
            num_gpu_blocks=100,
            cost=BackwardsStepCost(50),
        )


def test_a_path_kvlab_does_not_have_is_refused_naming_those_it_has():
    w = Workload(np.zeros(1), np.array([10]), np.array([4]))
    with pytest.raises(ValueError, match=r"^path='python' is not allowed: must be one of auto, reference, compiled$"):
        Engine(w, config(max_model_len=64), num_gpu_blocks=10, path="python")


def test_a_missing_max_model_len_and_an_empty_prompt_are_refused():
    w = Workload(np.zeros(1), np.array([10]), np.array([4]))
    with pytest.raises(ValueError, match="max_model_len=None is not allowed"):
        simulate(w, config(), num_gpu_blocks=10)
    with pytest.raises(ValueError, match="prompt_tokens.0.=0 is not allowed: must be >= 1"):
        simulate(Workload(np.zeros(1), np.array([0]), np.array([4])), config(max_model_len=64), num_gpu_blocks=10)


def test_summary_has_the_figures_of_the_command_line():
    w = Workload(np.array([0.0, 0.0]), np.array([10, 20]), np.array([5, 1]))
    result = simulate(w, config(max_model_len=64, block_size=4), num_gpu_blocks=20)
    summary = result.summary()
    assert summary["num_steps"] == 5 and summary["num_preemptions"] == 0
    assert summary["mean_ttft_s"] == pytest.approx(0.008)
    assert summary["mean_tpot_s"] == pytest.approx(0.008)  # only request 0 has more than one token
    assert summary["peak_kv_blocks"] == 4  # request 0 at 13 tokens (1 finished in step 0)
    assert summary["output_tokens_per_s"] == pytest.approx(6 / 0.040)
    assert math.isclose(summary["mean_running"], (2 + 1 + 1 + 1 + 1) / 5)


@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40)), min_size=1, max_size=8), st.sampled_from([1, 4, 16]))
@settings(max_examples=60, deadline=None)
def test_async_scheduling_on_an_idle_engine_gives_the_synchronous_times(requests, bs):
    """One request at a time (each arrives after the last finished): async scheduling changes no time."""
    prompts, outputs = (np.array(x) for x in zip(*requests))
    arrival = np.arange(len(requests)) * 1.0  # 1 s apart: every request is long done by the next
    w = Workload(arrival, prompts, outputs)
    results = [
        simulate(w, config(async_scheduling=mode, block_size=bs, max_model_len=128), num_gpu_blocks=200)
        for mode in (False, True)
    ]
    for name in ("first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens"):
        assert np.array_equal(getattr(results[0], name), getattr(results[1], name)), name


def test_async_scheduling_under_load_emits_first_tokens_a_step_later():
    """Busy engine: a request arriving mid-batch is scheduled after the batch queued behind the running one."""
    w = Workload(np.array([0.0, 0.005]), np.array([8, 6]), np.array([4, 2]))
    sync, async_ = (
        simulate(
            w,
            config(async_scheduling=mode, block_size=4, max_model_len=64),
            num_gpu_blocks=64,
            cost=ConstantStepCost(10.0),
        )
        for mode in (False, True)
    )
    assert sync.first_token_s[1] == pytest.approx(0.020) and async_.first_token_s[1] == pytest.approx(0.030)
    assert async_.first_scheduled_s[1] == pytest.approx(0.010)  # the schedule() call, at the clock


@given(
    num_computed_tokens=st.integers(0, 5000),
    block_size=st.integers(1, 64),
    num_steps=st.integers(0, 400),
    num_new_tokens=st.integers(1, 300),
)
def test_the_runs_closed_forms_count_what_a_step_by_step_walk_counts(
    num_computed_tokens, block_size, num_steps, num_new_tokens
):
    """rules.block_phase and blocks_crossed: the steps at which a decoding request's computed tokens fill a block, and
    how many it fills in num_steps one-token steps, as stepping through them counts; rules.attention_pairs: each new
    token with every token up to itself."""
    from kvlab.core.engine import rules

    c, bs = num_computed_tokens, block_size
    phase = rules.block_phase(c, bs)
    crossings = [j for j in range(num_steps) if (c + j) % bs == 0]  # step j computes token c + j + 1: a new block
    assert 0 <= phase < bs and all(j % bs == phase for j in crossings)
    assert rules.blocks_crossed(phase, num_steps, bs) == len(crossings)
    assert rules.attention_pairs(num_new_tokens, c) == sum(c + i + 1 for i in range(num_new_tokens))
    assert rules.steps_to_finish(c, c + num_steps, 0) == num_steps and rules.steps_to_finish(c, c + num_steps, 1) == (
        num_steps - 1
    )


@given(
    num_computed_tokens=st.integers(1, 3000),
    block_size=st.sampled_from([1, 2, 16, 32, 64]),
    window_blocks=st.integers(0, 40),
    spare=st.integers(0, 63),
    chunked=st.booleans(),
    lag=st.integers(0, 1),
)
def test_a_window_or_chunk_gives_blocks_back_at_the_steps_its_closed_form_says(
    num_computed_tokens, block_size, window_blocks, spare, chunked, lag
):
    """rules.window_release_step: the steps j >= 1 of one-token steps at which the blocks of num_skipped_tokens of the
    settled tokens (c + j - lag) grow, and by how many, as stepping through them counts, for a sliding window of any
    length and an attention chunk of whole blocks."""
    from kvlab.core.engine import rules

    c, bs = num_computed_tokens, block_size
    window, chunk = (0, (window_blocks + 1) * bs) if chunked else (window_blocks * bs + spare % bs + 1, 0)
    first = rules.window_release_step(c, window, chunk, bs, lag)

    def blocks(j):
        return rules.num_skipped_tokens(c + j - lag, window, chunk) // bs

    for j in range(1, 3 * (chunk or bs) + window + 2):
        released = blocks(j) - blocks(j - 1)
        if chunk:
            assert 0 <= first < chunk and released == (chunk // bs if (j - first) % chunk == 0 else 0)
        else:
            assert released == (1 if j >= first and (j - first) % bs == 0 else 0)
