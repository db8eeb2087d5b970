"""vLLM 0.1.4's scheduler (scheduler_cls="v0-2023"): hand-checked steps, invariants of the per-step loop, its decode
runs against the per-step loop, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_identical, draw_requests
from kvlab.core.config import EngineConfig
from kvlab.core.cost import ConstantStepCost, LinearStepCost
from kvlab.core.engine import Engine, Recorder, simulate
from kvlab.core.engine.fast import compiled
from kvlab.core.engine.scheduler_v0 import SchedulerV0, blocks_to_finish, watermark_blocks
from kvlab.core.workload import Workload


def v0(**settings) -> EngineConfig:
    return EngineConfig().replace(
        **{
            "scheduler_cls": "v0-2023",
            "async_scheduling": False,
            "enable_chunked_prefill": False,
            "max_num_seqs": 8,
            **settings,
        }
    )


def workload(prompts, outputs, arrivals=None) -> Workload:
    arrivals = [0.0] * len(prompts) if arrivals is None else arrivals
    return Workload(np.array(arrivals, dtype=float), np.array(prompts), np.array(outputs))


def run(w, config, num_gpu_blocks, allocation="paged"):
    return simulate(
        w, config, num_gpu_blocks=num_gpu_blocks, allocation=allocation, recorder=Recorder(scheduled=True, frees=True)
    )


# ---------------------------------------------------------------- hand-checked steps (8 ms a step)
def test_a_prompt_step_then_decode_steps():
    """One request of 5 prompt tokens and 3 output tokens: its prompt in one step (first token), then 2 decodes."""
    result = run(workload([5], [3]), v0(block_size=4, max_model_len=32, max_num_batched_tokens=32), 4)
    assert result.scheduled == [([(0, 5)], []), ([(0, 1)], []), ([(0, 1)], [])]
    assert result.first_token_s.tolist() == [0.008] and result.finish_s.tolist() == [0.024]
    assert result.steps["num_blocks_in_use"].tolist() == [2, 2, 0]  # 5 and 6 tokens' KV: 2 blocks; then freed


def test_a_prompt_step_pauses_the_running_requests():
    """Request 1 arrives while request 0 decodes: the step that admits it runs its prompt alone."""
    result = run(
        workload([4, 4], [4, 2], [0.0, 0.01]), v0(block_size=4, max_model_len=32, max_num_batched_tokens=32), 8
    )
    assert result.scheduled == [([(0, 4)], []), ([(0, 1)], []), ([(1, 4)], []), ([(0, 1), (1, 1)], []), ([(0, 1)], [])]
    assert result.finish_s.tolist() == [0.040, 0.032]


def test_admission_stops_at_the_token_budget():
    """Prompts of 10 and 8 tokens with max_num_batched_tokens=16: one prompt step each, then decodes together."""
    result = run(workload([10, 8], [2, 2]), v0(block_size=4, max_model_len=16, max_num_batched_tokens=16), 10)
    assert result.scheduled == [([(0, 10)], []), ([(1, 8)], []), ([(0, 1), (1, 1)], [])]
    assert result.steps["num_scheduled_tokens"].tolist() == [10, 8, 2]


def test_admission_stops_at_max_num_seqs():
    result = run(
        workload([2, 2, 2], [2, 2, 2]),
        v0(block_size=4, max_model_len=16, max_num_batched_tokens=16, max_num_seqs=2),
        10,
    )
    assert result.scheduled[:3] == [([(0, 2), (1, 2)], []), ([(0, 1), (1, 1)], []), ([(2, 2)], [])]


def test_the_watermark_refuses_an_admission_that_v1_makes():
    """100 usable blocks keep a watermark of int(0.01 x 100) = 1: after request 0's 98 blocks, request 1's 2 blocks
    would leave 0 free, so it waits for request 0 to finish; vLLM 0.33 admits it at once."""
    w = workload([392, 8], [2, 1])
    settings_ = dict(block_size=4, max_model_len=512, max_num_batched_tokens=512)
    assert watermark_blocks(101) == 1 and watermark_blocks(100) == 0
    old = run(w, v0(**settings_), 101)
    assert old.scheduled == [([(0, 392)], []), ([(0, 1)], []), ([(1, 8)], [])]
    assert old.first_scheduled_s.tolist() == [0.0, 0.016]
    new = run(
        w,
        EngineConfig().replace(async_scheduling=False, enable_chunked_prefill=False, max_num_seqs=8, **settings_),
        101,
    )
    assert new.scheduled[0] == ([(0, 392), (1, 8)], [])


def test_a_decode_without_a_free_block_preempts_the_latest_request_which_is_recomputed_from_the_front():
    """Prompts of 5, 6 and 3 tokens fill all 5 blocks of 4. Step 1: no block is free, and vLLM 0.1.4 needs one for
    every decode (can_append_slot), so request 2 (the latest) is preempted though no request opens a block; step 2
    recomputes it first (front of the waiting queue): its 3 prompt tokens and its first output token."""
    w = workload([5, 6, 3], [4, 3, 5])
    settings_ = dict(block_size=4, max_model_len=32, max_num_batched_tokens=32)
    result = run(w, v0(**settings_), 6)
    assert result.scheduled == [
        ([(0, 5), (1, 6), (2, 3)], []),
        ([(0, 1), (1, 1)], [2]),
        ([(2, 4)], []),
        ([(0, 1), (1, 1)], [2]),
        ([(2, 5)], []),
        ([(0, 1), (2, 1)], []),
        ([(2, 1)], []),
    ]
    assert result.num_preemptions.tolist() == [0, 0, 2]
    assert result.num_output_tokens.tolist() == [4, 3, 5]
    assert result.finish_s.tolist() == [0.048, 0.032, 0.056]
    assert [rid for rid, _ in result.freed_tables] == [2, 2, 1, 0, 2]
    v1 = run(
        w, EngineConfig().replace(async_scheduling=False, enable_chunked_prefill=False, max_num_seqs=8, **settings_), 6
    )
    assert v1.scheduled[1] == ([(0, 1), (1, 1), (2, 1)], [])  # it takes a block only when one is opened


def test_a_request_stops_one_token_past_max_model_len():
    """vLLM 0.1.4 finishes a request once get_len() > max_model_len: 7 output tokens after a prompt of 10 with
    max_model_len=16, where vLLM 0.33 stops at 16 tokens (6 output tokens)."""
    w = workload([10], [100])
    assert run(w, v0(block_size=4, max_model_len=16, max_num_batched_tokens=16), 8).num_output_tokens.tolist() == [7]
    v1 = EngineConfig().replace(
        async_scheduling=False, block_size=4, max_model_len=16, max_num_batched_tokens=16, max_num_seqs=8
    )
    assert run(w, v1, 8).num_output_tokens.tolist() == [6]


def test_an_orca_reservation_waits_for_room_and_is_never_preempted():
    """Oracle reservations of 8 slots from a pool of (4 - 1) x 4 = 12: request 1 waits for request 0's 8."""
    result = run(workload([4, 4], [4, 4]), v0(block_size=4, max_model_len=16, max_num_batched_tokens=16), 4, "oracle")
    assert result.scheduled == [
        ([(0, 4)], []),
        ([(0, 1)], []),
        ([(0, 1)], []),
        ([(0, 1)], []),
        ([(1, 4)], []),
        ([(1, 1)], []),
        ([(1, 1)], []),
        ([(1, 1)], []),
    ]
    assert result.num_preemptions.tolist() == [0, 0]
    assert result.steps["num_reserved_tokens"].tolist() == [8] * 3 + [0] + [8] * 3 + [0]


def test_blocks_to_finish_counts_the_last_readmission_and_the_last_decode():
    prompt, final = np.array([8, 8, 3]), np.array([9, 10, 17])
    # 9: no decode, readmit 8 tokens = 2 blocks (+1); 10: readmit 9 = 3 (+1) / decode holding 2 + 1 free;
    # 17: readmit 16 = 4 (+1) / decode at 16 tokens holding 15 = 4 + 1 free
    assert blocks_to_finish(prompt, final, 4, 1).tolist() == [3, 4, 5]
    assert blocks_to_finish(prompt, final, 4, 0).tolist() == [2, 3, 5]


# ---------------------------------------------------------------- invariants of the per-step loop
@st.composite
def v0_runs(draw):
    """A small workload and vLLM 0.1.4 settings, some tight enough to preempt, some with a watermark."""
    n, bs, max_model_len, gaps, prompts, outputs = draw_requests(draw, st)
    prompts, outputs = np.array(prompts), np.array(outputs)
    allocation = draw(st.sampled_from(["paged", "paged", "paged", "max", "pow2", "oracle"]))
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max_model_len, 160))
    final = np.minimum(prompts + outputs, max_model_len + 1)
    extra = draw(st.sampled_from([0, 0, 1, 3, 10, "watermark", 400]))
    if allocation == "paged":
        least = int(blocks_to_finish(prompts, final, bs, 0).max())
        if extra == "watermark":  # 100 to 130 usable blocks: a watermark of 1 under pressure
            extra = max(0, draw(st.integers(100, 130)) - least)
        while int(blocks_to_finish(prompts, final, bs, watermark_blocks(least + extra + 1)).max()) > least + extra:
            least += 1
        num_gpu_blocks = least + extra + 1
    else:
        extra = 100 if extra == "watermark" else extra
        need = [
            max_model_len
            if allocation == "max"
            else min(int(p) + (1 << (int(f - p) - 1).bit_length()), max_model_len)
            if allocation == "pow2"
            else int(f)
            for p, f in zip(prompts, final)
        ]
        chunk = 1 << (max(need) - 1).bit_length()  # the buddy allocator's chunk for the largest
        num_gpu_blocks = -(-chunk // bs) + 1 + extra
    cost = draw(st.sampled_from([ConstantStepCost(8.0), LinearStepCost(5.0, 0.1), LinearStepCost(2.0, 0.013)]))
    w = Workload(np.cumsum(gaps) - gaps[0], prompts, outputs)
    config = v0(block_size=bs, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len)
    return dict(workload=w, config=config, num_gpu_blocks=num_gpu_blocks, cost=cost, allocation=allocation)


def checked_engine(args) -> tuple[Engine, list[str]]:
    """An engine whose every schedule() is checked against vLLM 0.1.4's rules; the list collects what failed."""
    engine = Engine(**args, path="reference", recorder=Recorder(scheduled=True, frees=True))
    scheduler, kv = engine.scheduler, engine.kv_cache_manager
    paged = args["allocation"] == "paged"
    schedule, failures = scheduler.schedule, []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    def checked_schedule():
        waiting, running = list(scheduler.waiting), list(scheduler.running)
        num_free = kv.num_free_blocks if paged else 0
        held = {r.request_id: len(r.block_ids) for r in running}
        out = schedule()
        batch = [r for r, _ in out.scheduled]
        if out.admitted:  # a prompt step: a prefix of the waiting queue, whole, within the budget
            check(batch == out.admitted == waiting[: len(batch)] and not out.preempted, "prompt step: not FCFS")
            check(all(n == r.num_tokens == r.num_computed_tokens for r, n in out.scheduled), "prompt step: partial")
            check(out.batch.num_scheduled_tokens <= scheduler.max_num_batched_tokens, "prompt step: over the budget")
            check(len(scheduler.running) <= scheduler.max_num_seqs, "prompt step: over max_num_seqs")
            if paged:
                check(kv.num_free_blocks >= scheduler.watermark_blocks, "prompt step: under the watermark")
        else:  # a decode step: every running request by arrival, the latest preempted
            order = sorted(running, key=lambda r: r.arrival_s)
            check(running == order, "running requests not in arrival order (the decode run relies on it)")
            check(batch + out.preempted[::-1] == order, "decode step: not the running requests by arrival")
            check(all(n == 1 for _, n in out.scheduled), "decode step: more than a token")
            check(list(scheduler.waiting)[: len(out.preempted)] == out.preempted[::-1], "preempted: not in front")
            check(not out.preempted or paged, "a reservation preempted")
            if paged and not out.preempted:  # can_append_slot: a free block before every decode
                for request in batch:
                    check(num_free >= 1, "decode step: a decode with no block free")
                    num_free -= len(request.block_ids) - held[request.request_id]
        if paged:
            check(kv.num_free_blocks >= 0 and kv.num_held <= engine.num_gpu_blocks - 1, "blocks over-committed")
            check(sum(len(r.block_ids) for r in scheduler.running) == kv.num_held, "blocks held by no request")
        return out

    scheduler.schedule = checked_schedule
    return engine, failures


@given(v0_runs())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_invariants_hold(args):
    """Each step follows vLLM 0.1.4's rules; no block over-committed; every request finishes once with its tokens."""
    engine, failures = checked_engine(args)
    assert isinstance(engine.scheduler, SchedulerV0)
    result = engine.run()
    assert failures == []
    w, config = args["workload"], args["config"]
    final = np.minimum(w.prompt_tokens + w.output_tokens, config.scheduler.max_model_len + 1)
    assert np.isfinite(result.finish_s).all()
    assert np.array_equal(result.num_output_tokens, final - w.prompt_tokens)
    assert (result.first_scheduled_s >= w.arrival_s).all() and (result.first_scheduled_s < result.first_token_s).all()
    freed = sorted(rid for rid, _ in result.freed_tables)
    assert freed == sorted(i for i in range(w.num_requests) for _ in range(1 + result.num_preemptions[i]))
    assert engine.num_kv_tokens == 0 and not engine.scheduler.running and not engine.scheduler.waiting
    steps = result.steps
    assert (steps["num_blocks_in_use"] <= args["num_gpu_blocks"] - 1).all()
    assert (steps["num_kv_tokens"] <= steps["num_reserved_tokens"]).all()
    if args["allocation"] == "paged":
        engine.kv_cache_manager.pool.check_invariants()
        assert engine.kv_cache_manager.num_free_blocks == args["num_gpu_blocks"] - 1
    else:
        assert result.num_preemptions.sum() == 0
        assert engine.kv_cache_manager.num_free_tokens == engine.kv_cache_manager.num_tokens_total
    # tokens conserved: since its last admission each request computed all its tokens but the last sampled one
    computed = np.zeros(w.num_requests, dtype=np.int64)
    for batch, preempted in result.scheduled:
        for rid in preempted:
            computed[rid] = 0
        for rid, n in batch:
            computed[rid] += n
    assert sum(n for batch, _ in result.scheduled for _, n in batch) == steps["num_scheduled_tokens"].sum()
    assert np.array_equal(computed, final - 1)


# ---------------------------------------------------------------- hand-checked steps, and the compiled loop the same
def both(args) -> tuple:
    """The per-step loop's result with its batches, and the compiled loop's where numba is installed (else None)."""
    slow = Engine(**args, path="reference", recorder=Recorder(scheduled=True, frees=True)).run()
    return slow, Engine(**args, path="compiled").run() if compiled.available() else None


def assert_compiled_same(slow, fast) -> None:
    """The compiled loop (fast/loops/v0.py, which keeps no batches or tables) gives the per-step loop's records."""
    if fast is not None:
        assert_identical(slow, fast)


@pytest.mark.parametrize(
    "allocation, num_gpu_blocks",
    [("paged", 70), ("paged", 130), ("paged", 400), ("oracle", 70), ("pow2", 90), ("max", 200)],
)
def test_the_compiled_loop_equals_the_per_step_loop_on_larger_workloads(allocation, num_gpu_blocks):
    """300 requests, long decodes across many blocks, arrivals while they run, preemptions in the tight pools."""
    rng = np.random.default_rng(num_gpu_blocks)
    n = 300
    w = Workload(np.cumsum(rng.exponential(0.05, n)), rng.integers(1, 400, n), rng.integers(1, 300, n))
    config = v0(block_size=16, max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=1024)
    args = dict(
        workload=w, config=config, num_gpu_blocks=num_gpu_blocks, cost=LinearStepCost(8.0, 0.01), allocation=allocation
    )
    slow, fast = both(args)
    assert_compiled_same(slow, fast)
    if allocation == "paged" and num_gpu_blocks < 400:
        assert slow.num_preemptions.sum() > 0
        assert Engine(**args).scheduler.watermark_blocks == (num_gpu_blocks > 100)
    if allocation != "paged":
        assert slow.steps["num_external_frag_tokens"].any()


def test_a_decode_that_finds_no_free_block_preempts_though_it_needs_none():
    """Prompts of 5 and 4 tokens leave 2 of 5 blocks free; request 1 takes one in decode step 0, request 0 the last in
    step 3, where request 1 then finds none free and is preempted (can_append_slot) though it needs no block: vLLM
    0.33's rule (a block for every boundary crossed) would run step 3 whole."""
    w, config = workload([5, 4], [10, 10]), v0(block_size=4, max_model_len=32, max_num_batched_tokens=32)
    slow, fast = both(dict(workload=w, config=config, num_gpu_blocks=6))
    assert slow.scheduled[:6] == [([(0, 5), (1, 4)], [])] + [([(0, 1), (1, 1)], [])] * 3 + [
        ([(0, 1)], [1]),
        ([(1, 8)], []),
    ]
    assert_compiled_same(slow, fast)


def test_the_last_free_block_goes_to_the_last_decode_of_a_step():
    """Prompts of 5 and 6 tokens leave 1 of 5 blocks free; request 1, the last of the step, takes it in decode step 2:
    every decode of steps 0-2 found a free block; in step 3 request 0 finds none and preempts request 1."""
    w, config = workload([5, 6], [10, 10]), v0(block_size=4, max_model_len=32, max_num_batched_tokens=32)
    slow, fast = both(dict(workload=w, config=config, num_gpu_blocks=6))
    assert slow.scheduled[:5] == [([(0, 5), (1, 6)], [])] + [([(0, 1), (1, 1)], [])] * 3 + [([(0, 1)], [1])]
    assert_compiled_same(slow, fast)


def test_the_watermark_refuses_an_arrival_vllm_0_33_would_admit():
    """101 usable blocks keep a watermark of 1: request 0 (98 blocks, a block every 4 decodes) leaves 2 free when
    request 1 (8 tokens, 2 blocks) arrives at decode step 2, and 2 - 2 < 1 refuses it (vLLM 0.33 would admit it):
    8 decode steps to request 0's finish, a prompt step, request 1's 2 decodes."""
    w, config = workload([392, 8], [9, 3], [0.0, 0.02]), v0(block_size=4, max_model_len=512, max_num_batched_tokens=512)
    args = dict(workload=w, config=config, num_gpu_blocks=102)
    slow, fast = both(args)
    assert Engine(**args).scheduler.watermark_blocks == 1
    assert slow.scheduled == [([(0, 392)], [])] + [([(0, 1)], [])] * 8 + [([(1, 8)], [])] + [([(1, 1)], [])] * 2
    assert_compiled_same(slow, fast)


def test_an_arrival_is_admitted_before_the_steps_decodes():
    """Request 1 (24 tokens, 6 blocks) arrives at decode step 4, when request 0 has taken 1 of the 7 free blocks (step
    0): the prompt step admits it before step 4's decodes (which would take a block)."""
    w, config = workload([4, 24], [20, 2], [0.0, 0.035]), v0(block_size=4, max_model_len=32, max_num_batched_tokens=32)
    slow, fast = both(dict(workload=w, config=config, num_gpu_blocks=9))
    assert slow.scheduled[:6] == [([(0, 4)], [])] + [([(0, 1)], [])] * 4 + [([(1, 24)], [])]
    assert_compiled_same(slow, fast)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(scheduler_cls="v0"), r"scheduler_cls='v0' is not allowed: .*v1.*v0-2023"),
        (
            dict(scheduler_cls="v0-2023", enable_chunked_prefill=False),
            r"async_scheduling=True is not allowed: scheduler_cls='v0-2023' .* set async_scheduling=False",
        ),
        (
            dict(scheduler_cls="v0-2023", async_scheduling=False),
            r"enable_chunked_prefill=True is not allowed: .* set enable_chunked_prefill=False",
        ),
        (
            dict(
                scheduler_cls="v0-2023",
                async_scheduling=False,
                enable_chunked_prefill=False,
                long_prefill_token_threshold=16,
            ),
            r"long_prefill_token_threshold=16 is not allowed: .* set long_prefill",
        ),
        (
            dict(
                scheduler_cls="v0-2023",
                async_scheduling=False,
                enable_chunked_prefill=False,
                enable_prefix_caching=True,
            ),
            r"enable_prefix_caching=True is not allowed: scheduler_cls='v0-2023' .* no prefix cache",
        ),
    ],
)
def test_settings_vllm_0_1_4_did_not_have_are_refused_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as error:
        EngineConfig().replace(**changes)
    assert "\n" not in str(error.value)


def test_a_request_that_cannot_finish_under_the_watermark_is_refused_up_front():
    """100 usable blocks of 4 (watermark 1): a readmission of 400 tokens needs 100 blocks and the watermark's one."""
    w = workload([394], [7])
    with pytest.raises(
        ValueError,
        match=r"request 0='394 prompt \+ 7 output tokens' is not allowed: needs 101 blocks "
        r"of 4 tokens at its longest \(400 tokens\) with scheduler_cls='v0-2023' .* "
        r"100 usable blocks",
    ):
        simulate(w, v0(block_size=4, max_model_len=512, max_num_batched_tokens=512), num_gpu_blocks=101)
    assert simulate(
        w, v0(block_size=4, max_model_len=512, max_num_batched_tokens=512), num_gpu_blocks=102
    ).num_output_tokens.tolist() == [7]
