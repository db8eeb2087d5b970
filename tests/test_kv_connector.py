"""vLLM's scheduler with a KV connector (kvlab.core.engine.kv_connector): a hand-checked run, invariants over drawn
runs, the engine's own decisions where no request has a role, and one-line refusals. make parity proves it identical
to vLLM 0.33's scheduler with NIXL's connector's rules (scripts/parity/vllm_fake_nixl.py, the pd-* runs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.core.config import EngineConfig
from kvlab.core.cost import LinearStepCost
from kvlab.core.engine import Engine
from kvlab.core.engine.kv_connector import CONSUMER, NONE, PRODUCER, KVTransfers
from kvlab.core.workload import Workload

COST = LinearStepCost(8.0, 0.01)
SYNC = EngineConfig().replace(async_scheduling=False, max_model_len=256)


def test_a_decode_instance_loads_a_prompt_then_computes_its_last_token_and_a_prefill_instance_holds_its_blocks():
    """Steps of 8 ms + 0.01 ms a token. Request 0 (consumer, 100 tokens, its KV 50 ms away) and 1 (producer, 40 tokens,
    one output) at 0 s: 0's blocks are allocated, it waits off the running list, and 1 runs alone (40 tokens, 8.4 ms),
    finishing at once, its 3 blocks held 100 ms more. Request 2 (consumer, 64 tokens, 3 ms) arrives at 10 ms to an
    idle engine: its load runs 10-13 ms, then it computes its last prompt token (8.01 ms, first token at 21.01 ms).
    Request 0's KV arrives at 50 ms, inside a step: it is promoted at the next step (from 53.36 ms), first token at
    61.37 ms. (The same times come out of vLLM's own scheduler: make parity.)"""
    w = Workload(np.array([0.0, 0.0, 0.01, 0.02]), [100, 40, 64, 30], [5, 1, 3, 4])
    transfers = KVTransfers(np.array([2, 1, 2, 0]), np.array([0.05, 0, 0.003, 0]), np.array([0, 0.1, 0, 0]))
    engine = Engine(w, SYNC, num_gpu_blocks=30, cost=COST, kv_transfers=transfers)
    result = engine.run()
    assert result.first_token_s.tolist() == pytest.approx([0.06137, 0.0084, 0.02101, 0.02932], abs=1e-12)
    assert result.finish_s.tolist() == pytest.approx([0.09341, 0.0084, 0.03734, 0.05336], abs=1e-12)
    steps = result.steps
    assert steps["num_scheduled_tokens"][:2].tolist() == [40, 1]  # request 2's one token, not its prompt
    # request 1's blocks stay held for 100 ms after it finished: 7 (request 0, loading) + 3 in the first steps
    assert steps["num_blocks_in_use"][0] == 7 + 3
    assert engine.kv_cache_manager.num_held == 3  # request 1's read ends at 108.4 ms, after the last step (93.41 ms)


@st.composite
def connector_runs(draw):
    n = draw(st.integers(1, 14))
    bs = draw(st.sampled_from([4, 16]))
    prompts = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.004, 0.03]), min_size=n, max_size=n))
    roles = np.array(draw(st.lists(st.sampled_from([NONE, PRODUCER, CONSUMER]), min_size=n, max_size=n)))
    load_s = np.array(draw(st.lists(st.sampled_from([0.0, 0.002, 0.02]), min_size=n, max_size=n)))
    hold_s = np.array(draw(st.lists(st.sampled_from([0.0, 0.005, 0.05]), min_size=n, max_size=n)))
    chunked = draw(st.booleans())
    max_model_len = 80
    budget = draw(st.integers(8, 96)) if chunked else 96
    caching = draw(st.booleans())
    ids = None
    if caching:  # prompts from two shared stems
        stems = [list(range(100 * s, 100 * s + 60)) for s in range(2)]
        ids = [np.array(stems[draw(st.integers(0, 1))][: p - 1] + [7]) for p in prompts]
    least = max(-(-min(p + o, max_model_len) // bs) for p, o in zip(prompts, outputs)) + 1
    config = SYNC.replace(
        block_size=bs,
        max_model_len=max_model_len,
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8])),
    )
    return dict(
        workload=Workload(np.cumsum(gaps) - gaps[0], np.array(prompts), np.array(outputs)),
        config=config,
        num_gpu_blocks=least + draw(st.sampled_from([0, 1, 4, 40])),
        cost=COST,
        prompt_token_ids=ids,
        kv_transfers=KVTransfers(roles, load_s, hold_s),
    )


@given(connector_runs())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_request_finishes_with_its_tokens_and_no_block_is_overcommitted_or_kept(args):
    engine = Engine(**args, path="reference")
    pool = engine.kv_cache_manager.pool
    result = engine.run()
    w, roles = args["workload"], args["kv_transfers"].role
    assert (result.num_output_tokens == np.minimum(w.output_tokens, 80 - w.prompt_tokens)).all()
    assert (result.first_token_s >= w.arrival_s).all() and (result.finish_s >= result.first_token_s).all()
    assert (result.steps["num_blocks_in_use"] <= engine.num_gpu_blocks - 1).all()
    scheduler = engine.scheduler
    assert not scheduler.kv_holding and not scheduler.running and not scheduler.waiting
    # every block is back but those of producers whose read has not been reported (held past the last step)
    held = [r for _, _, kind, r in scheduler.connector.events if kind == "send"]
    assert all(roles[r.request_id] == PRODUCER for r in held)
    assert pool.num_used_blocks == len(set().union(*(r.block_ids for r in held)))


@given(connector_runs())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_without_roles_the_connectors_scheduler_makes_the_engines_decisions(args):
    """Requests of no role through the connector's scheduler (its two queues, its waiting loop) against the engine's
    own scheduler: the same times and steps."""
    n = args["workload"].num_requests
    args["kv_transfers"] = KVTransfers(np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n))
    mine = Engine(**args, path="reference").run()
    del args["kv_transfers"]
    theirs = Engine(**args, path="reference").run()
    for name in ("first_scheduled_s", "first_token_s", "finish_s", "num_preemptions"):
        assert getattr(mine, name).tolist() == getattr(theirs, name).tolist(), name
    for name in ("start_s", "end_s", "num_scheduled_tokens", "num_blocks_in_use", "num_running", "num_waiting"):
        assert mine.steps[name].tolist() == theirs.steps[name].tolist(), name


@pytest.mark.parametrize(
    "change, message",
    [
        ({"async_scheduling": True}, "async_scheduling=True is not allowed: is not modelled with a KV connector yet"),
        ({"role": [3, 0]}, "kv_transfers.role=np.int64(3) is not allowed: must be 0, 1 or 2"),
        ({"load_s": [float("nan"), 0.0]}, "kv_transfers.load_s=nan is not allowed: must be finite seconds >= 0"),
        ({"hold_s": [0.0]}, "kv_transfers.hold_s='1 entries' is not allowed: must have one per request (2)"),
    ],
)
def test_bad_transfers_are_refused_in_one_line(change, message):
    w = Workload(np.array([0.0, 0.0]), [10, 10], [2, 2])
    parts = {"role": [2, 1], "load_s": [0.0, 0.0], "hold_s": [0.0, 0.0]}
    config = SYNC.replace(async_scheduling=change.pop("async_scheduling", False))
    parts |= change
    transfers = KVTransfers(*(np.array(parts[k]) for k in ("role", "load_s", "hold_s")))
    with pytest.raises(ValueError) as caught:
        Engine(w, config, num_gpu_blocks=30, kv_transfers=transfers)
    assert str(caught.value).startswith(message)


def test_a_producers_blocks_are_held_until_the_read_end_given():
    """A producer finishing at 9 ms whose read ends at 50 ms (read_end_s, a fleet's): its 7 blocks stay held through
    the steps of a second request until the first step output at or after 50 ms, and are free after it."""
    w = Workload(np.array([0.0, 0.001]), [100, 10], [1, 12])
    transfers = KVTransfers(np.array([PRODUCER, NONE]), np.zeros(2), np.zeros(2), np.array([0.05, 0.0]))
    result = Engine(w, SYNC, num_gpu_blocks=30, cost=COST, kv_transfers=transfers).run()
    held, end_s = result.steps["num_blocks_in_use"], result.steps["end_s"]  # request 1 holds 1 or 2 blocks
    assert held.tolist() == [7, 8, 8, 8, 8, 8, 1, 1, 2, 2, 2, 2, 0]
    assert end_s[5] < 0.05 <= end_s[6]  # freed in the output of the first step ending at or after 50 ms
