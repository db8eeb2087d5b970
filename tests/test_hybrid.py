"""Hybrid models in the engine: KV cache groups of full attention and sliding windows sharing one pool
(kvlab.core.engine.kv_cache_manager.KVCacheManager over its coordinator and a manager per group kind), against hand-checked tables, equivalences with the
one-group engine, and vLLM's refusals. make parity holds them to vLLM 0.33's own scheduler (gpt-oss-20b and
Gemma-3-27B's groups, both scheduling modes)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import draw_requests
from kvlab.core import models
from kvlab.core.capacity import KVCacheGroup, kv_cache_groups
from kvlab.core.config import EngineConfig
from kvlab.core.cost import ConstantStepCost, LinearStepCost
from kvlab.core.engine import Engine, Recorder
from kvlab.core.engine.kv_cache_manager import KVCacheManager
from kvlab.core.engine.request import Request
from kvlab.core.workload import Workload

FULL = KVCacheGroup("full_attention", 2, ())
WINDOW_4 = KVCacheGroup("sliding_attention", 2, (), 4)


def test_a_window_frees_the_block_behind_it_and_the_next_block_taken_is_that_one():
    """A 6-token prompt, blocks of 2 tokens, a window of 4: each group takes 3 blocks (the window's group first).
    With 6 tokens computed the next, token 7, attends to tokens 4-7: block 1 (tokens 1-2) is freed, the null block
    (0) left in its place, and the block the window's group then takes for token 7 is that same one, the free
    queue's head; the full group takes the next."""
    kv = KVCacheManager(20, (WINDOW_4, FULL), 2, max_model_len=64, max_in_flight_tokens=64)
    request = Request(0, 0.0, 6, 4, 64)
    assert kv.num_blocks_to_admit(6) == 6
    assert kv.allocate_slots(request, 6, full_sequence_must_fit=True)
    assert kv.tables[0] == [[1, 2, 3], [4, 5, 6]]
    request.num_computed_tokens, request.num_tokens = 6, 7
    assert kv.allocate_slots(request, 1)
    assert kv.tables[0] == [[0, 2, 3, 1], [4, 5, 6, 7]]
    assert kv.num_held == 7
    request.num_computed_tokens, request.num_tokens = 7, 8
    assert kv.allocate_slots(request, 1)  # token 8 attends to 5-8: block 2 freed; token 8 fits the 4th blocks
    assert kv.tables[0] == [[0, 0, 3, 1], [4, 5, 6, 7]]
    request.num_computed_tokens, request.num_tokens = 8, 9
    assert kv.allocate_slots(request, 1)  # token 9 needs a 5th block in each group: block 2 again, then 8
    assert kv.tables[0] == [[0, 0, 3, 1, 2], [4, 5, 6, 7, 8]]
    assert kv.free(request) == 3 + 5
    assert kv.pool.free_block_ids()[:8] == [8, 7, 6, 5, 4, 2, 1, 3]  # group by group, each table last block first


def test_a_window_admits_at_most_its_cap_and_frees_even_when_the_step_is_refused():
    """Admission needs the window's blocks up to max_admission_blocks_per_request (cdiv(window - 1 + tokens in
    flight, block size) + 1), the full group's all; a running request's blocks behind the window are freed before
    the pool is asked, so a refused allocation still frees them (vLLM: 'we can do this even if we cannot
    schedule')."""
    kv = KVCacheManager(12, (WINDOW_4, FULL), 2, max_model_len=64, max_in_flight_tokens=2)
    assert kv.caps == [4, 0]  # cdiv(4 - 1 + 2, 2) + 1
    assert kv.num_blocks_to_admit(20) == 4 + 10
    assert not kv.allocate_slots(Request(0, 0.0, 20, 1, 64), 2, full_sequence_must_fit=True)  # 14 of 11 usable
    request = Request(1, 0.0, 10, 50, 64)
    assert kv.num_blocks_to_admit(10) == 4 + 5
    assert kv.allocate_slots(request, 10, full_sequence_must_fit=True)  # the cap is admission's: it takes 5 + 5
    assert kv.num_free_blocks == 1
    request.num_computed_tokens, request.num_tokens = 10, 40  # (as if 30 tokens more were known)
    assert not kv.allocate_slots(request, 20)  # 10 + 10 blocks more: refused ...
    assert kv.tables[1][0] == [0, 0, 0, 4, 5]  # ... after tokens 1-6 left the window of token 11
    assert kv.num_free_blocks == 4


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"mamba": True}, r"block_size=64 is not allowed: must be every group's block size for Mamba"),
        (
            {"path": "compiled", "caching": True},
            "path='compiled' is not allowed: must be 'auto' or 'reference' with pre",
        ),
        ({"allocation": "max"}, "allocation='max' is not allowed: must be paged"),
        ({"recorder": Recorder(frees=True)}, "Recorder\\(frees=True\\)=True is not allowed"),
    ],
)
def test_what_the_engine_does_not_serve_for_hybrid_models_yet_is_refused_in_one_line(bad, message):
    workload = Workload(np.zeros(2), np.array([5, 9]), np.array([3, 3]))
    mamba = bad.pop("mamba", False)
    config = EngineConfig().replace(async_scheduling=False, block_size=2, max_model_len=64,
                                    enable_prefix_caching=bad.pop("caching", mamba))  # fmt: skip
    groups = (KVCacheGroup("mamba", 64, ()), FULL) if mamba else (WINDOW_4, FULL)
    with pytest.raises(ValueError, match=message):
        Engine(workload, config, num_gpu_blocks=40, kv_cache_groups=groups, **bad)


@st.composite
def hybrid_runs(draw):
    """A small workload on a pool tight enough to preempt, either scheduling mode."""
    n, bs, max_model_len, gaps, prompts, outputs = draw_requests(draw, st)
    final = [min(p + o, max_model_len) for p, o in zip(prompts, outputs)]
    least = max(-(-(f - 1) // bs) for f in final) + 1
    config = EngineConfig().replace(
        async_scheduling=draw(st.booleans()),
        block_size=bs,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(8, 96)),
        max_model_len=max_model_len,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 3])),
    )
    workload = Workload(np.cumsum(gaps) - gaps[0], np.array(prompts), np.array(outputs))
    cost = draw(st.sampled_from([ConstantStepCost(8.0), LinearStepCost(5.0, 0.1)]))
    return workload, config, least + draw(st.sampled_from([0, 1, 3, 10, 400])), cost


@given(hybrid_runs())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_two_groups_that_free_nothing_are_one_group_of_blocks_twice_as_large(run):
    """A full-attention group beside a window no request outgrows (or a second full group) holds, in every group,
    what the one group holds: the same decisions as the one-group engine over a pool of blocks twice as large,
    every step, with twice the blocks in use."""
    workload, config, num_gpu_blocks, cost = run
    bs, max_len = config.cache.block_size, config.scheduler.max_model_len
    one = Engine(workload, config, num_gpu_blocks=num_gpu_blocks, cost=cost, path="reference").run()
    for other in (KVCacheGroup("full_attention", bs, ()), KVCacheGroup("sliding_attention", bs, (), max_len + 1)):
        groups = (other, KVCacheGroup("full_attention", bs, ()))
        two = Engine(workload, config, num_gpu_blocks=2 * num_gpu_blocks - 1, cost=cost, kv_cache_groups=groups).run()
        for name in ("first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens", "num_preemptions"):
            assert np.array_equal(getattr(one, name), getattr(two, name)), name
        for name in one.steps:  # (the columns of token slots count blocks at block_size tokens: left out)
            if name not in ("num_reserved_tokens", "num_internal_frag_tokens"):
                scale = 2 if name == "num_blocks_in_use" else 1
                assert np.array_equal(scale * one.steps[name], two.steps[name]), name


@given(hybrid_runs(), st.integers(1, 40))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_window_holds_what_it_attends_to_and_every_block_comes_back(run, window):
    """Between steps each request's window group holds, as real blocks, exactly the blocks of its table from the
    first one the next token still attends to (its table nulls before), the full group every block; the pool's
    blocks in use are the sum; at the end every block is free again."""
    workload, config, num_gpu_blocks, cost = run
    bs = config.cache.block_size
    groups = (KVCacheGroup("sliding_attention", bs, (), window), KVCacheGroup("full_attention", bs, ()))
    engine = Engine(workload, config, num_gpu_blocks=2 * num_gpu_blocks, cost=cost, kv_cache_groups=groups)
    kv, scheduler = engine.kv_cache_manager, engine.scheduler
    original = scheduler.schedule

    def checked():
        held = 0
        for request in scheduler.running:
            sliding, full = kv.tables[request.request_id]
            assert 0 not in full and len(full) == len(sliding)
            processed = request.num_computed_tokens - request.num_in_flight_tokens
            gone = max(processed - window + 1, 0) // bs  # blocks wholly outside the window, freed by now or next
            live = [b for b in sliding if b]
            assert sliding[: len(sliding) - len(live)] == [0] * (len(sliding) - len(live))
            assert len(sliding) - len(live) <= gone
            held += len(live) + len(full)
        assert held == kv.num_held
        return original()

    scheduler.schedule = checked
    result = engine.run()
    assert kv.num_held == 0 and not kv.tables
    assert int(result.num_output_tokens.sum()) == int(np.minimum(workload.prompt_tokens + workload.output_tokens,
                                                                 config.scheduler.max_model_len).sum()
                                                      - workload.prompt_tokens.sum())  # fmt: skip


def test_a_hybrid_models_groups_are_the_ones_capacity_lays_out_with_their_windows():
    """Gemma-3-27B: six groups of its 1,024-token window and one of full attention, as vLLM groups them; served by
    the engine through them."""
    model = models.get_model("google/gemma-3-27b-it")
    groups = kv_cache_groups(model, EngineConfig())
    assert [(g.kind, g.sliding_window, len(g.layers)) for g in groups] == [
        ("sliding_attention", 1024, 9), ("sliding_attention", 1024, 9), ("sliding_attention", 1024, 9),
        ("sliding_attention", 1024, 9), ("sliding_attention", 1024, 8), ("sliding_attention", 1024, 8),
        ("full_attention", 0, 10),
    ]  # fmt: skip
    workload = Workload(np.array([0.0, 0.1]), np.array([3000, 200]), np.array([5, 5]))
    engine = Engine(workload, EngineConfig().replace(max_model_len=4096), num_gpu_blocks=2000, kv_cache_groups=groups)
    assert isinstance(engine.kv_cache_manager, KVCacheManager)
    assert engine.run().num_output_tokens.tolist() == [5, 5]


def test_a_mamba_group_holds_one_block_a_request_its_state_from_admission_to_the_end():
    """A Mamba group in vLLM's mode without prefix caching: blocks of max_model_len tokens, so admission needs one
    and a request keeps that one as it grows, beside the full-attention group's blocks."""
    mamba = KVCacheGroup("mamba", 64, ())
    kv = KVCacheManager(30, (mamba, FULL), 64, max_model_len=64, max_in_flight_tokens=64)
    request = Request(0, 0.0, 6, 10, 64)
    assert kv.num_blocks_to_admit(6) == 1 + 3
    assert kv.allocate_slots(request, 6, full_sequence_must_fit=True)
    for computed in range(6, 15):
        request.num_computed_tokens, request.num_tokens = computed, computed + 1
        assert kv.allocate_slots(request, 1)
    assert kv.tables[0] == [[1], list(range(2, 10))]
    assert kv.free(request) == 9


@pytest.mark.parametrize(
    "group, message",
    [
        (KVCacheGroup("mamba", 16, ()), "block_size=16 is not allowed: must be max_model_len=64 for Mamba layers"),
        (KVCacheGroup("sliding_attention", 2, ()), r"sliding_window=0 is not allowed: must be > 0 exactly for sliding"),
        (KVCacheGroup("cross_attention", 2, ()), r"kind='cross_attention' is not allowed"),
        (
            KVCacheGroup("mamba", 64, (), mamba_cache_mode="align", num_prefill_checkpoint_blocks=2),
            r"num_prefill_checkpoint_blocks=2 is not allowed: must be 0, or 1 for Mamba layers",
        ),
        (
            KVCacheGroup("full_attention", 2, (), num_prefill_checkpoint_blocks=1),
            r"num_prefill_checkpoint_blocks=1 is not allowed: must be 0, or 1 for Mamba layers",
        ),
    ],
)
def test_a_group_the_engine_cannot_serve_is_refused_in_one_line(group, message):
    workload = Workload(np.zeros(1), np.array([5]), np.array([3]))
    config = EngineConfig().replace(async_scheduling=False, block_size=2, max_model_len=64)
    with pytest.raises(ValueError, match=message):
        Engine(workload, config, num_gpu_blocks=40, kv_cache_groups=(group, FULL))


# ---------------------------------------------------------------- prefix caching
WINDOW_4_CACHED = (FULL, WINDOW_4)  # vLLM looks full attention up first whatever the order; here it is also first


def computed(kv, request, num_tokens):
    """Admit request with its prefix hit and compute its whole prompt in one step."""
    hit, num_hit_tokens = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, num_tokens - num_hit_tokens, hit, full_sequence_must_fit=True)
    request.num_computed_tokens = num_tokens
    return hit, num_hit_tokens


def test_a_window_caches_its_blocks_at_the_prompts_end_and_a_repeat_hits_them_behind_nulls():
    """Blocks of 2 tokens, a window of 4 (a hit needs the cdiv(4 - 1, 2) = 2 blocks before it). A 10-token prompt
    caches all 5 of full attention's blocks, but the window only the 2 blocks before its last boundary (token
    9 floored to 8: blocks 2 and 3; vLLM's prefix_cache_retention_interval 0). The same prompt again looks up 9
    tokens: full attention finds 4 blocks, the window its 2 blocks before token 8, so it hits 8 tokens and its window
    table holds the null block for blocks 0-1, behind the window of token 9."""
    kv = KVCacheManager(40, WINDOW_4_CACHED, 2, max_model_len=64, max_in_flight_tokens=64, enable_caching=True)
    prompt = np.arange(10)
    first = Request(0, 0.0, 10, 5, 64, prompt_token_ids=prompt)
    assert computed(kv, first, 10) == (None, 0)
    full, window = kv.tables[0]
    assert full == [1, 2, 3, 4, 5] and window == [6, 7, 8, 9, 10]
    cached = {b for b in range(40) if kv.pool.hash_of[b] >= 0}
    assert cached == {1, 2, 3, 4, 5, 8, 9}
    again = Request(1, 0.0, 10, 5, 64, prompt_token_ids=prompt)
    (tables, junction, hit_tokens), n = kv.get_computed_blocks(again)
    assert (tables, junction, hit_tokens, n) == ([[1, 2, 3, 4], [0, 0, 8, 9]], 0, 8, 8)
    assert kv.allocate_slots(again, 2, (tables, junction, hit_tokens), full_sequence_must_fit=True)
    assert kv.tables[1] == [[1, 2, 3, 4, 11], [0, 0, 8, 9, 12]]  # skipped: (8 - 4 + 1) // 2 = 2 blocks behind
    assert kv.pool.ref[8] == kv.pool.ref[1] == 2


def test_where_full_attention_finds_more_than_the_window_the_window_caches_there_for_the_next_request():
    """A prompt sharing 6 tokens with a cached one: full attention finds 3 blocks, the window none (only the first
    prompt's last blocks are cached in it), so there is no hit, but 6 is its shared prefix boundary
    (shared_prefix_boundary). Its window caches the blocks before it (1-2) besides those before its own end (2-3);
    a third prompt sharing those 6 tokens then hits them: the window finds blocks 1-2 before token 6 (of block 2, the
    block cached first under its hash)."""
    kv = KVCacheManager(60, WINDOW_4_CACHED, 2, max_model_len=64, max_in_flight_tokens=64, enable_caching=True)
    computed(kv, Request(0, 0.0, 10, 5, 64, prompt_token_ids=np.arange(10)), 10)
    shared = np.concatenate([np.arange(6), [90, 91, 92, 93]])
    second = Request(1, 0.0, 10, 5, 64, prompt_token_ids=shared)
    hit, n = computed(kv, second, 10)
    assert (hit[0], hit[1], n) == ([[], []], 6, 0)
    window = kv.tables[1][1]
    assert [kv.pool.hash_of[b] >= 0 for b in window] == [False, True, True, True, False]
    third = Request(2, 0.0, 9, 5, 64, prompt_token_ids=np.concatenate([np.arange(6), [70, 71, 72]]))
    (tables, junction, hit_tokens), n = kv.get_computed_blocks(third)
    assert (n, junction) == (6, 0)
    assert tables[1] == [0, window[1], 8]  # block 2: the first prompt's, cached first under that hash


@st.composite
def shared_prompts(draw):
    """A hybrid run (hybrid_runs) whose prompts share prefixes: each is one of 3 stems cut at a drawn length."""
    workload, config, num_gpu_blocks, cost = draw(hybrid_runs())
    stems = [np.arange(1000 * s, 1000 * s + 64) for s in range(3)]
    which = draw(st.lists(st.integers(0, 2), min_size=workload.num_requests, max_size=workload.num_requests))
    ids = [stems[s][:p] for s, p in zip(which, workload.prompt_tokens)]
    return workload, config.replace(enable_prefix_caching=True), num_gpu_blocks, cost, ids


@given(shared_prompts())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_with_prefix_caching_and_memory_to_spare_a_second_full_group_is_one_group_of_blocks_twice_as_large(run):
    """Where no cached block is ever evicted, a second full-attention group caches and hits what the first does: the
    same decisions and prefix hits as the one-group engine with prefix caching, every step."""
    workload, config, num_gpu_blocks, cost, ids = run
    bs = config.cache.block_size
    ample = num_gpu_blocks + workload.num_requests * (config.scheduler.max_model_len // bs + 1)
    one = Engine(workload, config, num_gpu_blocks=ample, cost=cost, prompt_token_ids=ids, path="reference").run()
    groups = (KVCacheGroup("full_attention", bs, ()), KVCacheGroup("full_attention", bs, ()))
    two = Engine(workload, config, num_gpu_blocks=2 * ample - 1, cost=cost, prompt_token_ids=ids,
                 kv_cache_groups=groups).run()  # fmt: skip
    for name in ("first_scheduled_s", "first_token_s", "finish_s", "num_output_tokens", "num_preemptions"):
        assert np.array_equal(getattr(one, name), getattr(two, name)), name
    assert np.array_equal(one.steps["num_hit_tokens"], two.steps["num_hit_tokens"])
    assert np.array_equal(2 * one.steps["num_blocks_in_use"], two.steps["num_blocks_in_use"])


def serve_checked(run, groups, each_request=None):
    """Serve run (shared_prompts) over groups; between steps each running request's tables pass each_request(request,
    tables) and, with prefix caching, each block's reference count is the number of tables holding it and the pool's
    free queue and cache agree; at the end every block is free again. The result."""
    workload, config, num_gpu_blocks, cost, ids = run
    engine = Engine(workload, config, num_gpu_blocks=2 * num_gpu_blocks, cost=cost, prompt_token_ids=ids,
                    kv_cache_groups=groups)  # fmt: skip
    kv, scheduler = engine.kv_cache_manager, engine.scheduler
    original = scheduler.schedule

    def checked():
        for request in scheduler.running:
            if each_request is not None:
                each_request(request, kv.tables[request.request_id])
        if kv.enable_caching:
            refs = {}
            for tables in kv.tables.values():
                for b in (b for table in tables for b in table if b):
                    refs[b] = refs.get(b, 0) + 1
            assert all(kv.pool.ref[b] == refs.get(b, 0) for b in range(1, kv.pool.num_gpu_blocks))
            kv.pool.check_invariants()
        return original()

    scheduler.schedule = checked
    result = engine.run()
    assert kv.num_held == 0 and not kv.tables
    kv.pool.check_invariants()
    return result


def nulls_then_blocks(table) -> int:
    """The table's leading nulls, asserting no null follows a block."""
    live = [b for b in table if b]
    assert table[: len(table) - len(live)] == [0] * (len(table) - len(live))
    return len(table) - len(live)


@given(shared_prompts(), st.integers(1, 40))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_with_prefix_caching_a_window_holds_its_hit_and_every_block_comes_back(run, window):
    """Prefix caching on a window and full attention with memory that preempts: every hit is a multiple of the block
    size; between steps a window's table is nulls then real blocks, the full group's all real (serve_checked)."""
    bs = run[1].cache.block_size
    groups = (KVCacheGroup("sliding_attention", bs, (), window), KVCacheGroup("full_attention", bs, ()))

    def tables_hold(request, tables):
        nulls_then_blocks(tables[0])
        assert 0 not in tables[1]

    result = serve_checked(run, groups, tables_hold)
    assert not (result.steps["num_hit_tokens"] % bs).any()


# ---------------------------------------------------------------- section 3, part 3
def test_section_3s_hybrid_deployments_run_more_long_requests_at_once_with_their_windows():
    """Gemma 3 27B on an H200 (140.40 GiB, as CUDA reports it) at 131,072 tokens: vLLM's sizing gives 59,738 blocks for
    its 7 groups (9,635 with every layer full); served, 6 requests of nearly that length run at once, against 1 with
    every layer full; Qwen3-32B, full attention, has one deployment."""
    from kvlab.sections import s03_hybrid as hybrid

    config = EngineConfig().replace(max_model_len=131072)
    names = ["Qwen/Qwen3-32B", "google/gemma-3-27b-it"]
    kv = hybrid.kv_cache_table(names, "H200-141GB", config)
    assert list(kv.index) == ["Qwen/Qwen3-32B", "google/gemma-3-27b-it", "google/gemma-3-27b-it (every layer full)"]
    assert kv["num_gpu_blocks"].tolist() == [16093, 59738, 9635]
    assert kv["kv_cache_groups"].iloc[1] == "7 (6 of a 1,024-token window, 1 full)"
    at_once = hybrid.at_once_table(kv, names, config, 12)
    assert at_once["peak_running"].tolist() == [1, 6, 1]
    assert hybrid.plain_models(kv) == ["Qwen/Qwen3-32B"]


def test_section_3s_hybrid_prose_follows_its_figures():
    """Each sentence's direction and cause come from the figures: flip them and the words flip."""
    from kvlab.sections import s03_hybrid as hybrid

    pair = {
        "model": "m", "kv_cache_groups": "2 (1 of a 4-token window, 1 full)", "num_gpu_blocks": 200,
        "num_gpu_blocks_full": 100, "max_concurrency": 2.5, "max_concurrency_full": 1.2, "at_once_peak_running": 4,
        "at_once_peak_running_full": 1, "mean_running": 8.0, "mean_running_full": 4.0, "num_preemptions": 0,
        "num_preemptions_full": 3, "mean_ttft_s": 0.5, "mean_ttft_s_full": 2.0, "window_blocks_returned_per_request": 9,
        "prefix_hit_pct": 5.0, "prefix_hit_pct_full": 8.0,
    }  # fmt: skip
    text = hybrid.prose(pair, 12, 1024)
    assert "4 run at once against 1, more than vLLM's figure" in text
    assert "mean running batch rises from 4.0 to 8.0 (2.0x)" in text and "preemptions fall from 3 to 0" in text
    assert (
        "Prefix hits fall from 8.0 to 5.0% of the prompt tokens (to 0.62x); the likely reason, from vLLM's code" in text
    )
    flipped = pair | {"at_once_peak_running": 2, "mean_running": 3.0, "prefix_hit_pct": 9.0}
    text = hybrid.prose(flipped, 12, 1024)
    assert "2 run at once against 1, as vLLM's figure says" in text
    assert "mean running batch falls from 4.0 to 3.0" in text
    assert "Prefix hits rise from 8.0 to 9.0% of the prompt tokens (1.1x)." in text


# ---------------------------------------------------------------- chunked local attention
CHUNK_4 = KVCacheGroup("chunked_local_attention", 2, (), attention_chunk_size=4)


def test_chunked_local_attention_frees_a_chunk_once_the_next_starts_and_hits_from_its_chunk():
    """Blocks of 2 tokens, chunks of 4: with 9 tokens computed, token 10 attends to tokens 9-10 only (its chunk is
    9-12), so blocks 0-3 (tokens 1-8) are freed, null in the table, and the full group keeps all. A repeat of the
    prompt looks up 8 tokens' blocks: full attention finds all 4, and the chunked group needs none, every block
    before the chunk of token 9 a null; its cap at admission is cdiv(min(4 + tokens in flight, max_model_len), 2)."""
    kv = KVCacheManager(60, (CHUNK_4, FULL), 2, max_model_len=64, max_in_flight_tokens=2, enable_caching=True)
    assert kv.caps == [3, 0]
    first = Request(0, 0.0, 10, 5, 64, prompt_token_ids=np.arange(10))
    computed(kv, first, 10)
    assert kv.tables[0][0] == [1, 2, 3, 4, 5]
    first.num_tokens = 11
    assert kv.allocate_slots(first, 1)  # 10 settled: chunk 9-12 runs, tokens 1-8 are behind it
    assert kv.tables[0][0] == [0, 0, 0, 0, 5, 11]
    assert kv.num_window_freed == 4
    (tables, junction, hit_tokens), n = kv.get_computed_blocks(
        Request(1, 0.0, 10, 5, 64, prompt_token_ids=np.arange(10))
    )
    assert (tables[0], tables[1], n, junction) == ([0, 0, 0, 0], [6, 7, 8, 9], 8, 0)


def test_a_chunked_group_needs_the_common_block_size():
    workload = Workload(np.zeros(1), np.array([5]), np.array([3]))
    config = EngineConfig().replace(async_scheduling=False, block_size=2, max_model_len=64)
    chunked = KVCacheGroup("chunked_local_attention", 2, (), attention_chunk_size=4)
    with pytest.raises(ValueError, match=r"block_size=2 is not allowed: must be 4, every group's common block size"):
        Engine(workload, config, num_gpu_blocks=40, kv_cache_groups=(chunked, KVCacheGroup("full_attention", 4, ())))


@given(shared_prompts(), st.integers(1, 12), st.booleans())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_chunked_local_attention_holds_its_chunk_and_every_block_comes_back(run, chunks, caching):
    """Chunked local attention beside full attention, with and without prefix caching and memory that preempts:
    between steps a chunked table is nulls, then real blocks from at most the block of its current chunk's start
    (serve_checked)."""
    bs = run[1].cache.block_size
    chunk = chunks * bs
    groups = (KVCacheGroup("chunked_local_attention", bs, (), attention_chunk_size=chunk),
              KVCacheGroup("full_attention", bs, ()))  # fmt: skip

    def tables_hold(request, tables):
        processed = request.num_computed_tokens - request.num_in_flight_tokens
        assert nulls_then_blocks(tables[0]) <= processed // chunk * chunk // bs and 0 not in tables[1]

    serve_checked(run[:1] + (run[1].replace(enable_prefix_caching=caching),) + run[2:], groups, tables_hold)


# ---------------------------------------------------------------- Mamba states with prefix caching ("align")
MAMBA_2 = KVCacheGroup("mamba", 2, ())


def test_mamba_states_with_prefix_caching_are_a_block_a_boundary_and_the_prefill_is_cut_there():
    """vLLM's mamba_cache_mode "align", blocks of 2 tokens: a 9-token prompt's prefill is cut at the last block
    boundary before its last token (8: rules.mamba_aligned_num_new_tokens); its Mamba table is nulls then the state
    after token 8 (block index 3), which is cached (the prompt's boundary) and, with 9 tokens computed, the next
    state block is taken and the one before it freed once the settled tokens pass it. A repeat hits the state."""
    from kvlab.core.engine.rules import mamba_aligned_num_new_tokens

    assert mamba_aligned_num_new_tokens(0, 9, 9, 9, 2, 100, 0) == 8
    assert mamba_aligned_num_new_tokens(8, 1, 9, 9, 2, 100, 0) == 1
    assert mamba_aligned_num_new_tokens(0, 7, 20, 20, 2, 100, 0) == 6  # a chunk before the end ends on a boundary
    assert mamba_aligned_num_new_tokens(3, 9, 20, 20, 2, 100, 0) == 1  # starting mid-block: up to the next boundary
    assert mamba_aligned_num_new_tokens(0, 12, 20, 20, 2, 100, 7) == 6  # the shared prefix, floored to blocks
    kv = KVCacheManager(40, (MAMBA_2, FULL), 2, max_model_len=64, max_in_flight_tokens=64, enable_caching=True)
    assert kv.mamba_block_size == 2 and kv.caps == [1, 0]
    first = Request(0, 0.0, 9, 5, 64, prompt_token_ids=np.arange(9))
    assert kv.allocate_slots(first, 8, None, full_sequence_must_fit=True)
    assert kv.tables[0][0] == [0, 0, 0, 1] and kv.tables[0][1] == [2, 3, 4, 5]
    assert kv.pool.hash_of[1] >= 0  # the state after token 8 is cached
    first.num_computed_tokens = 8
    assert kv.allocate_slots(first, 1)
    assert kv.tables[0][0] == [0, 0, 0, 1, 6]
    first.num_computed_tokens, first.num_tokens = 9, 10
    assert kv.allocate_slots(first, 1)  # 9 settled: the state after 8 (block 3) is behind; token 10 fits block 4
    assert kv.tables[0][0] == [0, 0, 0, 0, 6]
    kv.new_step_starts()
    (tables, junction, hit_tokens), n = kv.get_computed_blocks(Request(1, 0.0, 9, 5, 64, prompt_token_ids=np.arange(9)))
    assert (tables[0], n) == ([0, 0, 0, 1], 8)


@given(shared_prompts())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mamba_states_with_prefix_caching_hold_at_most_two_blocks_and_every_block_comes_back(run):
    """Mamba states beside full attention with prefix caching and memory that preempts: between steps a running
    request's Mamba table holds at most two real blocks (its state and the one before, kept until the settled tokens
    pass it), three under asynchronous scheduling (a batch in flight settles none) (serve_checked)."""
    config = run[1]
    bs = config.cache.block_size
    most = 3 if config.scheduler.async_scheduling else 2

    def tables_hold(request, tables):
        assert len([b for b in tables[0] if b]) <= most and 0 not in tables[1]

    result = serve_checked(run, (KVCacheGroup("mamba", bs, ()), KVCacheGroup("full_attention", bs, ())), tables_hold)
    assert int(result.num_output_tokens.sum()) > 0


# ---------------------------------------------------------------- Mamba prefill checkpoints (a Hopper GPU's kernel)
MAMBA_CK_4 = KVCacheGroup(
    "mamba", 4, (), mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=4
)
FULL_4 = KVCacheGroup("full_attention", 4, ())


def test_a_checkpointed_prefill_runs_through_and_caches_its_checkpoint_in_a_block_of_its_own():
    """Blocks of 4 tokens, a Mamba group with a prefill checkpoint block. A 10-token prompt is not cut at 8, its last
    cacheable boundary (it would be without checkpoint blocks): the kernel exports the state after token 8 into the
    block before last, so the Mamba table is a null, the checkpoint (block 1, index 1) and the running state (block
    2), both counted at admission (2 + 3 full-attention blocks); block 1 is cached under the prompt's boundary, the
    running state not. With 10 tokens settled the checkpoint is freed (it stays cached, at the free queue's tail).
    An 18-token prompt sharing the first 10 hits 8 tokens (Mamba: block 1 back from the free queue, counted at
    admission) and checkpoints again from there: nulls up to index 3, the checkpoint (state after 16, block 6) and
    the running state (block 7), the hit state kept as the previous one until the settled tokens pass it; both are
    then freed, the checkpoint first. A 19-token repeat hits 16 tokens on the checkpoint."""
    from kvlab.core.engine.rules import mamba_aligned_num_new_tokens

    assert mamba_aligned_num_new_tokens(0, 10, 10, 10, 4, 100, 0, 4) == 10  # the checkpoint is exported: no cut
    assert mamba_aligned_num_new_tokens(0, 10, 10, 10, 4, 100, 0) == 8  # without checkpoint blocks: cut at 8
    assert mamba_aligned_num_new_tokens(8, 2, 10, 10, 4, 100, 0, 4) == 2  # no checkpoint inside: as before
    assert mamba_aligned_num_new_tokens(8, 10, 18, 18, 4, 100, 0, 4) == 10  # after a hit on a block boundary
    assert mamba_aligned_num_new_tokens(2, 8, 10, 10, 4, 100, 0, 4) == 2  # mid-block: no checkpoint, next boundary
    kv = KVCacheManager(40, (MAMBA_CK_4, FULL_4), 4, max_model_len=64, max_in_flight_tokens=64, enable_caching=True)
    assert kv.caps == [2, 0] and kv.checkpoint_alignment == 4
    first = Request(0, 0.0, 10, 5, 64, prompt_token_ids=np.arange(10))
    assert kv.num_blocks_to_admit(10, 10) == 5
    assert kv.allocate_slots(first, 10, None, full_sequence_must_fit=True)
    assert kv.tables[0] == [[0, 1, 2], [3, 4, 5]] and kv.checkpoints[0] == [(8, 1), None]
    hashed = [b for b in range(1, 7) if kv.pool.hash_of[b] >= 0]
    assert hashed == [1, 3, 4]  # the checkpoint, full attention's two full blocks
    first.num_computed_tokens, first.num_tokens = 10, 11
    assert kv.allocate_slots(first, 1)
    assert kv.tables[0] == [[0, 0, 2], [3, 4, 5]] and kv.checkpoints[0] == [None, None]
    assert kv.num_held == 4 and kv.pool.free_block_ids()[-1] == 1
    kv.new_step_starts()
    second = Request(2, 0.0, 18, 5, 64, prompt_token_ids=np.arange(18))
    hit, n = kv.get_computed_blocks(second)
    assert hit == ([[0, 1], [3, 4]], 0, 8) and n == 8
    assert kv.hit_blocks_to_admit(hit, 8, 18, True, 18) == 6  # Mamba: 2 new + its hit state; full attention: 3 new
    assert kv.allocate_slots(second, 10, hit, full_sequence_must_fit=True)
    assert kv.tables[2] == [[0, 1, 0, 6, 7], [3, 4, 8, 9, 10]] and kv.checkpoints[2] == [(16, 3), None]
    assert kv.last_state[2][0] == 1 and kv.pool.hash_of[6] >= 0 and kv.pool.hash_of[7] < 0
    second.num_computed_tokens, second.num_tokens = 18, 19
    assert kv.allocate_slots(second, 1)
    assert kv.tables[2][0] == [0, 0, 0, 0, 7] and kv.pool.free_block_ids()[-2:] == [6, 1]
    kv.new_step_starts()
    hit, n = kv.get_computed_blocks(Request(3, 0.0, 19, 5, 64, prompt_token_ids=np.arange(19)))
    assert hit[0][0] == [0, 0, 0, 6] and n == 16
    kv.free(first)
    kv.free(second)
    assert kv.num_held == 0
    kv.pool.check_invariants()


@given(shared_prompts())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mamba_prefill_checkpoints_hold_at_most_three_blocks_and_every_block_comes_back(run):
    """Two Mamba groups with prefill checkpoint blocks beside full attention, prefix caching and memory that
    preempts: between steps every block's reference count is the number of tables holding it, and a running
    request's Mamba table holds at most three real blocks (its state, the one before, and a checkpoint), four under
    asynchronous scheduling; at the end every block is free again (serve_checked)."""
    config = run[1]
    bs = config.cache.block_size
    most = 4 if config.scheduler.async_scheduling else 3
    mamba = KVCacheGroup(
        "mamba", bs, (), mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=bs
    )

    def tables_hold(request, tables):
        assert all(len([b for b in tables[i] if b]) <= most for i in (0, 1)) and 0 not in tables[2]

    workload, config, num_gpu_blocks, cost, ids = run
    run = (workload, config, num_gpu_blocks + 2, cost, ids)  # each Mamba group's checkpoint: a block more a request
    result = serve_checked(run, (mamba, mamba, KVCacheGroup("full_attention", bs, ())), tables_hold)
    assert int(result.num_output_tokens.sum()) > 0


def test_the_hybrid_figure_colours_only_windowed_models_blue():
    import pandas as pd

    from kvlab.sections.shared import plots

    names = ["Qwen/Qwen3-32B", "google/gemma-3-27b-it", "google/gemma-3-27b-it (every layer full)"]
    served = pd.DataFrame({"mean_running": [1, 6, 1], "mean_ttft_s": [3.0, 1.0, 4.0]}, index=names)
    bars = plots.hybrid_serving(served).figure.axes[0].patches
    blue = [tuple(round(x, 3) for x in bar.get_facecolor()[:3]) == (0.122, 0.467, 0.706) for bar in bars]
    assert blue == [False, True, False]  # full attention alone is not drawn as windows
