"""The measured step cost (kvlab.core.cost.MeasuredStepCost): steps rebuilt from the committed operator profiles,
piecewise-linear between measured points, decode runs equal to their steps, CUDA-graph padding, coverage."""

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import models, operators, profiles
from kvlab.core.config import EngineConfig
from kvlab.core.cost import (
    STEP_COSTS,
    Batch,
    MeasuredStepCost,
    RooflineStepCost,
    cudagraph_capture_sizes,
    make_step_cost,
    step_time,
)
from kvlab.core.engine import Engine
from kvlab.core.workload import Workload

RTX_PRO = "RTX-PRO-6000-Server-96GB"
LLAMA = "meta-llama/Llama-3.1-8B"
CONFIG = EngineConfig().replace(
    max_num_seqs=128, max_num_batched_tokens=2048, async_scheduling=False, max_model_len=8192
)
FOLDER = profiles.PROFILES_DIR / "llmservingsim" / "RTXPRO6000" / LLAMA / "bf16" / "tp1"


def measured(model=LLAMA, gpu=RTX_PRO, **changes) -> MeasuredStepCost | RooflineStepCost:
    return make_step_cost(
        "measured", model=models.get_model(model), gpu=models.get_gpu(gpu), config=CONFIG.replace(**changes)
    )


LLAMA_COST = measured()


def read(name: str, *keys: str) -> dict:
    """A committed profile CSV as {(layer or key columns...): time_us}, read with the csv module only."""
    with open(FOLDER / f"{name}.csv", newline="") as f:
        return {
            tuple(row[k] if k == "layer" else int(row[k]) for k in keys): float(row["time_us"])
            for row in csv.DictReader(f)
        }


DENSE, PER_SEQUENCE = read("dense", "layer", "tokens"), read("per_sequence", "layer", "sequences")
ATTENTION = read("attention", "prefill_chunk", "kv_prefill", "n_decode", "kv_decode")


def expected_step_us(tokens: int, sequences: int, attention_point: tuple) -> float:
    """One step at a measured point, by hand: 32 layers of (2 RMSNorms, qkv, rotary, o, gate_up, act, down) and
    of attention, the embedding and final norm once, lm_head and the sampler once."""
    layer = sum(
        calls * DENSE[(op, tokens)]
        for op, calls in [
            ("layernorm", 2),
            ("qkv_proj", 1),
            ("rotary_emb", 1),
            ("o_proj", 1),
            ("gate_up_proj", 1),
            ("act_fn", 1),
            ("down_proj", 1),
        ]
    )
    once = DENSE[("embedding", tokens)] + DENSE[("final_layernorm", tokens)]
    per_sequence = PER_SEQUENCE[("lm_head", sequences)] + PER_SEQUENCE[("sampler", sequences)]
    return 32 * layer + once + per_sequence + 32 * ATTENTION[attention_point] + scheduler_cpu_us(sequences)


def scheduler_cpu_us(sequences: int, prefix_caching: int = 0, async_scheduling: int = 0) -> float:
    """vLLM's schedule() + update_from_output() for a step of sequences, from the committed CSV, linear between
    its running-request counts."""
    with open(profiles.SCHEDULER_CPU_CSV, newline="") as f:
        rows = [
            r
            for r in csv.DictReader(f)
            if (int(r["enable_prefix_caching"]), int(r["async_scheduling"])) == (prefix_caching, async_scheduling)
        ]
    points = sorted((int(r["num_running"]), float(r["schedule_us"]) + float(r["update_from_output_us"])) for r in rows)
    return float(np.interp(sequences, [n for n, _ in points], [us for _, us in points]))


def test_the_cpu_adds_to_a_synchronous_step_and_overlaps_an_asynchronous_one():
    batch = Batch(64, 64 * 2048, 64, 64 * 2048)
    gpu_s = LLAMA_COST.without("CPU scheduling").step_s(batch)
    assert LLAMA_COST.step_s(batch) == pytest.approx(gpu_s + scheduler_cpu_us(64) / 1e6, rel=1e-12)
    overlapped = measured(async_scheduling=True)
    assert overlapped.step_s(batch) == pytest.approx(max(gpu_s, scheduler_cpu_us(64, 0, 1) / 1e6), rel=1e-12)
    assert "overlapping the GPU" in overlapped.describe() and "added to each step" in LLAMA_COST.describe()
    # a GPU step shorter than the CPU's scheduling takes the CPU's time when overlapped
    tiny = dataclasses.replace(overlapped, dense_us=overlapped.dense_us * 0, attention_us=overlapped.attention_us * 0)
    tiny = dataclasses.replace(tiny, per_sequence_us=tiny.per_sequence_us * 0)
    assert tiny.step_s(batch) == pytest.approx(scheduler_cpu_us(64, 0, 1) / 1e6, rel=1e-12)
    assert tiny.min_step_s(64) <= tiny.step_s(batch)


def test_a_step_at_measured_points_is_the_sum_of_their_operator_times():
    # a 512-token prefill chunk after 1,024 computed tokens (past the CUDA-graph sizes: not padded)
    pairs = 512 * 1024 + 512 * 513 // 2
    assert LLAMA_COST.step_s(Batch(512, 1536, 0, 0, 1, pairs)) * 1e6 == pytest.approx(
        expected_step_us(512, 1, (512, 1024, 0, 0)), rel=1e-12
    )
    # 64 decodes of 2,048 computed tokens each (64 is a capture size)
    assert LLAMA_COST.step_s(Batch(64, 64 * 2049, 64, 64 * 2049)) * 1e6 == pytest.approx(
        expected_step_us(64, 64, (0, 0, 64, 2048)), rel=1e-12
    )
    # a 16-token chunk after 1,024 beside 8 decodes of 4,096: 24 tokens, 9 sequences
    step = LLAMA_COST.step_s(Batch(24, 1040 + 8 * 4097, 8, 8 * 4097, 1, 16 * 1024 + 16 * 17 // 2))
    assert step * 1e6 == pytest.approx(expected_step_us(24, 9, (16, 1024, 8, 4096)), rel=1e-12)
    # a caller without the prefill aggregates: the chunk's history from the contexts
    assert LLAMA_COST.step_s(Batch(24, 1040 + 8 * 4097, 8, 8 * 4097)) == step


def test_the_cost_names_its_source_and_the_interface():
    assert LLAMA_COST.name == "measured" and "measured" in STEP_COSTS
    assert LLAMA_COST.source.startswith("LLMServingSim profile RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1; CPU: ")
    tp2 = measured("Qwen/Qwen3-32B", tensor_parallel_size=2)
    assert tp2.source.startswith("LLMServingSim profile RTXPRO6000/Qwen/Qwen3-32B/bf16/tp2; all-reduce")
    assert tp2.all_reduce.bytes_per_token == 5120 * 2 and tp2.all_reduce.num_per_step == 2 * 64 + 1
    moe = measured("Qwen/Qwen3-30B-A3B-Instruct-2507")
    assert (moe.num_experts, moe.num_experts_per_tok) == (128, 8)
    assert moe.active_experts(1) == 8 and moe.active_experts(2048) == 128


def neighbours(axis: np.ndarray, x: float) -> tuple[float, float]:
    j = int(np.searchsorted(axis, x, side="right")) - 1
    return float(axis[j]), float(axis[j + 1])


@settings(max_examples=60, deadline=None)
@given(st.integers(257, 2047), st.integers(1, 256))
def test_the_dense_term_is_linear_between_its_measured_neighbours(tokens, sequences):
    low, high = neighbours(LLAMA_COST.dense_tokens, tokens)
    w = (tokens - low) / (high - low)
    at = LLAMA_COST.fixed_us
    assert at(tokens, sequences) == pytest.approx(
        (1 - w) * at(int(low), sequences) + w * at(int(high), sequences), rel=1e-12
    )
    assert min(at(int(low), sequences), at(int(high), sequences)) <= at(tokens, sequences) * (1 + 1e-12)
    assert at(tokens, sequences) <= max(at(int(low), sequences), at(int(high), sequences)) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 8), st.integers(0, 10), st.integers(0, 8), st.integers(0, 10), st.floats(0.0, 1.0), st.integers(0, 3)
)
def test_attention_is_multilinear_between_grid_points(pc, kp, nd, kv, w, axis):
    """Along any axis of the grid, a point between two measured ones is their blend."""
    axes = LLAMA_COST.attention_axes
    point = [axes[0][max(pc, 1)], axes[1][kp], axes[2][nd], axes[3][max(kv, 1)]]
    low, high = list(point), list(point)
    i = [max(pc, 1), kp, nd, max(kv, 1)][axis]
    if i + 1 >= len(axes[axis]):
        i -= 1
    low[axis], high[axis] = axes[axis][i], axes[axis][i + 1]
    between = list(low)
    between[axis] = (1 - w) * low[axis] + w * high[axis]
    at = LLAMA_COST.mixed_attention_us
    expected = (1 - w) * at(*low) + w * at(*high)
    assert at(*between) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_attention_reads_the_measured_grid_and_extrapolates_past_it():
    at = LLAMA_COST.mixed_attention_us
    assert at(256, 4096, 32, 1024) == ATTENTION[(256, 4096, 32, 1024)]
    assert LLAMA_COST.decode_attention_us(128, 16384) == ATTENTION[(0, 0, 128, 16384)]
    # past the last decode history: linear from the last two points
    last, before = ATTENTION[(0, 0, 128, 16384)], ATTENTION[(0, 0, 128, 8192)]
    assert LLAMA_COST.decode_attention_us(128, 24576) == pytest.approx(last + (last - before), rel=1e-12)


def test_past_the_dense_axis_a_step_grows_along_its_last_doubling():
    """Past 2,048 tokens the dense term follows the secant from 1,024 to 2,048 tokens, by hand; never the last two
    points, 16 tokens apart, whose slope is noise (Qwen3-32B's falls, and a step of 8,192 tokens came out negative)."""
    at_1024, at_2048 = (
        32
        * sum(
            c * DENSE[(op, n)]
            for op, c in [
                ("layernorm", 2),
                ("qkv_proj", 1),
                ("rotary_emb", 1),
                ("o_proj", 1),
                ("gate_up_proj", 1),
                ("act_fn", 1),
                ("down_proj", 1),
            ]
        )
        + DENSE[("embedding", n)]
        + DENSE[("final_layernorm", n)]
        for n in (1024, 2048)
    )
    per_seq = PER_SEQUENCE[("lm_head", 1)] + PER_SEQUENCE[("sampler", 1)]
    assert LLAMA_COST.fixed_us(8192, 1) == pytest.approx(at_2048 + (at_2048 - at_1024) * 6 + per_seq, rel=1e-12)
    for model, tp in ((LLAMA, 1), ("Qwen/Qwen3-32B", 1), ("Qwen/Qwen3-32B", 2)):
        cost = measured(model, tensor_parallel_size=tp, max_num_batched_tokens=16384)
        steps = [cost.fixed_us(n, 1) for n in (2048, 4096, 8192, 16384)]
        assert all(b > 1.5 * a for a, b in zip(steps, steps[1:])), (model, tp, steps)


MOE_NAME = "Qwen/Qwen3-30B-A3B-Instruct-2507"
MOE = measured(MOE_NAME)


def test_the_engine_with_the_measured_step_cost_takes_the_same_steps_compiled_or_not():
    pytest.importorskip("numba", reason="numba is not installed (fix: make setup installs it from requirements.lock)")
    rng = np.random.default_rng(1)
    w = Workload(np.cumsum(rng.exponential(0.05, 300)), rng.integers(10, 3000, 300), rng.integers(1, 600, 300))
    slow, fast = (
        Engine(w, CONFIG, num_gpu_blocks=3000, cost=LLAMA_COST, path=path).run() for path in ("reference", "compiled")
    )
    assert np.array_equal(slow.finish_s, fast.finish_s) and np.array_equal(slow.steps["end_s"], fast.steps["end_s"])


def test_decode_batches_are_padded_to_vllms_cudagraph_capture_sizes():
    sizes = cudagraph_capture_sizes(128, 2048)
    assert sizes == (1, 2, 4, *range(8, 256, 8), 256)
    assert cudagraph_capture_sizes(256, 8192)[-3:] == (480, 496, 512)
    assert cudagraph_capture_sizes(256, 300)[-3:] == (272, 288, 300)  # max_num_batched_tokens is captured
    assert cudagraph_capture_sizes(100, 8192)[-2:] == (192, 200)
    assert LLAMA_COST.padded_tokens(3) == 4 and LLAMA_COST.padded_tokens(257) == 257
    # a decode batch of 3 costs what one of 4 costs in the linear (dense) term
    assert LLAMA_COST.fixed_us(3, 1) == LLAMA_COST.fixed_us(4, 1)
    eager = dataclasses.replace(LLAMA_COST, cudagraph_capture_sizes=())  # no CUDA graphs: 3 tokens as measured
    assert eager.fixed_us(3, 1) != LLAMA_COST.fixed_us(3, 1) and eager.fixed_us(4, 1) == LLAMA_COST.fixed_us(4, 1)
    three, four = (LLAMA_COST.step_s(Batch(n, n * 101, n, n * 101)) for n in (3, 4))
    per_sequence = LLAMA_COST.fixed_us(4, 4) - LLAMA_COST.fixed_us(4, 3)
    attention = 32 * (LLAMA_COST.decode_attention_us(4, 100) - LLAMA_COST.decode_attention_us(3, 100))
    cpu = scheduler_cpu_us(4) - scheduler_cpu_us(3)
    assert (four - three) * 1e6 == pytest.approx(per_sequence + attention + cpu, rel=1e-9)


def test_a_gpu_with_no_measurement_is_refused_in_one_line():
    with pytest.raises(ValueError) as error:
        measured(gpu="MI300X-192GB")
    message = str(error.value)
    assert "\n" not in message and message.startswith("gpu='MI300X-192GB' is not allowed")
    assert "A100-SXM-80GB, A40-48GB, Arc-Pro-B60-24GB, B200-180GB" in message and "H200-141GB" in message
    assert "--cost roofline" in message


def test_a_model_without_a_profile_gets_the_roofline_at_the_gpus_sustained_rates():
    fractions = profiles.sustained_fractions("H100-SXM-80GB")
    assert 0.5 < fractions.memory_bandwidth_fraction < 1 and 0.5 < fractions.flop_fraction < 1
    cost = measured("Qwen/Qwen2.5-72B-Instruct", gpu="H100-SXM-80GB")  # its layer sizes unknown: no table composes it
    assert isinstance(cost, RooflineStepCost)  # the roofline itself, its provenance saying why
    assert cost.source.startswith("roofline scaled by sustained fractions measured on H100-SXM-80GB")
    roofline = RooflineStepCost.from_specs(
        models.get_model("Qwen/Qwen2.5-72B-Instruct"), models.get_gpu("H100-SXM-80GB"), CONFIG
    )
    assert cost.memory_bandwidth_gb_s == roofline.memory_bandwidth_gb_s * fractions.memory_bandwidth_fraction
    assert cost.step_s(Batch(8, 8000, 8, 8000)) > roofline.step_s(Batch(8, 8000, 8, 8000))
    assert measured(LLAMA, pipeline_parallel_size=2).source.startswith("roofline scaled")


def test_every_profile_names_a_catalog_gpu_and_its_layer_shape_and_is_small():
    catalog = models.load_models()
    for entry in profiles.load_index():
        models.get_gpu(entry.gpu)
        assert entry.folder.is_dir(), entry.path
        assert min(entry.layer_shape[:4]) > 0 and entry.vocab_size > 0, entry.label
        assert entry.num_attention_heads % entry.num_kv_heads == 0, entry.label
        if entry.model in catalog:  # the attention's shape is the catalog's
            spec = models.get_model(entry.model)
            assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == entry.layer_shape[:3], entry.label
    size = sum(p.stat().st_size for p in profiles.PROFILES_DIR.rglob("*") if p.is_file())
    assert size < 5.2e6  # kvlab's own H200 measurements (data/profiles/kvlab/) included


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"num_layers": 0}, "num_layers=0 is not allowed: must be an integer >= 1"),
        ({"step_overhead_ms": -1.0}, "step_overhead_ms=-1.0 is not allowed"),
        ({"dense_us": np.zeros(3)}, "dense_us=(3,) is not allowed: must have the shape"),
        ({"cudagraph_capture_sizes": (4, 2)}, "cudagraph_capture_sizes=(4, 2) is not allowed"),
    ],
)
def test_bad_tables_are_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(LLAMA_COST, **changes)


@pytest.mark.parametrize("model, tp", [(LLAMA, 1), ("Qwen/Qwen3-32B", 2), ("Qwen/Qwen3-30B-A3B-Instruct-2507", 1)])
def test_switching_a_term_off_takes_away_exactly_that_term(model, tp):
    cost = measured(model, tensor_parallel_size=tp)
    assert ("all-reduce" in cost.terms) == (tp > 1)
    assert ("MoE block" in cost.terms) == bool(cost.num_experts)
    batch = Batch(24, 24 * 700, 24, 24 * 700)  # 24 decodes: padded to the capture size 24, no padding to take away
    whole = cost.step_s(batch)
    assert cost.without("attention").step_s(batch) == pytest.approx(
        whole - cost.num_layers * cost.decode_attention_us(24, 699) / 1e6
    )
    assert cost.without("lm_head and sampler").step_s(batch) < whole
    if tp > 1:
        share = cost.all_reduce.step_us(24) / 1e6
        assert share > 0 and cost.without("all-reduce").step_s(batch) == pytest.approx(whole - share)
    off = cost
    for term in cost.terms:
        off = off.without(term)
    assert off.step_s(batch) == 0.0
    with pytest.raises(ValueError, match="term"):
        measured(LLAMA).without("all-reduce")


def test_the_fallback_says_how_far_it_is_off_where_a_profile_also_measures():
    from kvlab.core.cost import measured as module

    found = module.fallback_error("RTX-4090-24GB")  # one complete profile: Llama-3.1-8B at TP 1
    assert list(found) == ["dense"] and found["dense"][2] == 1
    profiled = make_step_cost("measured", model=models.get_model(LLAMA), gpu=models.get_gpu("RTX-4090-24GB"))
    fallback = module.sustained_roofline(models.get_model(LLAMA), models.get_gpu("RTX-4090-24GB"), EngineConfig(),
                                         "RTX-4090-24GB", "")  # fmt: skip
    errors = [fallback.step_s(Batch(b, b * c, b, b * c)) / profiled.step_s(Batch(b, b * c, b, b * c)) - 1
              for b in module.FALLBACK_CHECK_BATCHES for c in module.FALLBACK_CHECK_CONTEXTS]  # fmt: skip
    assert found["dense"][:2] == (min(errors), max(errors))
    assert module.fallback_error("A100-SXM-80GB") == {}  # vidur's profiles there are linear layers only
    assert "no complete profile on the A100-SXM-80GB" in module.fallback_error_text("A100-SXM-80GB")
    assert "off the profile by" in measured("Qwen/Qwen2.5-72B-Instruct").source  # sizes unknown: no table composes it


def test_where_profiles_time_linear_layers_only_the_rule_is_set_against_them():
    from kvlab.core.cost import measured as module

    low, high, n = module.linear_fallback_error("A100-SXM-80GB")
    assert n == sum(e.gpu == "A100-SXM-80GB" for e in profiles.load_index()) == 29
    # Llama-2-7B at TP 1, one token: its 4 layers' weights at the sustained bandwidth against vidur's times, by hand
    entry = next(e for e in profiles.load_index() if e.path == "vidur/a100/meta-llama/Llama-2-7b-hf/tp1")
    with open(entry.folder / "dense.csv", newline="") as f:
        one = sum(float(r["time_us"]) for r in csv.DictReader(f) if r["tokens"] == "1")
    weights = 2 * 4096 * (3 * 4096 + 4096 + 3 * 11008)  # qkv, o, gate_up, down in fp16
    bandwidth = 2039e9 * profiles.sustained_fractions("A100-SXM-80GB").memory_bandwidth_fraction
    assert low <= weights / bandwidth * 1e6 / one - 1 <= high
    text = module.fallback_error_text("A100-SXM-80GB")
    assert (
        f"on the linear layers alone, at 1-128 tokens, its rule is off 29 measured profiles by {100 * low:+.0f}%"
        in text
    )
    assert module.linear_fallback_error("RTX-4090-24GB")[2] == 1  # LLMServingSim's profile times them too
    with pytest.raises(ValueError, match="has no operator profile"):
        module.linear_fallback_error("H200-141GB")


CONFIGS = Path(__file__).parent / "data" / "configs"


@pytest.mark.parametrize(
    "config_file, profiled",
    [("llama-3.1-8b-instruct.json", LLAMA), ("qwen3-30b-a3b.json", "Qwen/Qwen3-30B-A3B-Instruct-2507")],
)
def test_a_config_of_a_profiled_architecture_is_timed_by_that_profile(config_file, profiled):
    spec = models.from_config(CONFIGS / config_file)
    assert spec.name != profiled
    cost = make_step_cost("measured", model=spec, gpu=models.get_gpu(RTX_PRO), config=CONFIG)
    own = measured(profiled)
    assert isinstance(cost, MeasuredStepCost) and f"a model of {spec.name}'s layer shapes" in cost.describe()
    for batch in (Batch(1, 100, 1, 100), Batch(64, 64 * 900, 64, 64 * 900), Batch(600, 5000, 88, 4400, 1, 200_000)):
        assert cost.step_s(batch) == own.step_s(batch)


def test_a_config_of_other_layer_shapes_is_composed_from_the_operator_tables_else_falls_back_saying_so():
    config = json.loads((CONFIGS / "llama-3.1-8b-instruct.json").read_text()) | {"intermediate_size": 16384}
    spec = models.from_config(config, name="wider-llama", num_params_b=9.0)
    cost = make_step_cost("measured", model=spec, gpu=models.get_gpu(RTX_PRO), config=CONFIG)
    assert isinstance(cost, MeasuredStepCost)
    assert cost.source.startswith(f"composed from the {RTX_PRO}'s operator tables")
    llama_spec = models.from_config(CONFIGS / "llama-3.1-8b-instruct.json")
    llama = MeasuredStepCost.from_profile(operators.compose_profile(llama_spec, RTX_PRO, 1)[0], llama_spec, CONFIG)
    batch = Batch(64, 64 * 1000, 64, 64 * 1000)
    assert cost.step_s(batch) > llama.step_s(batch)  # a wider MLP takes longer
    # a GPU with profiles but no tables (the A40): the roofline, saying why
    cost = make_step_cost("measured", model=spec, gpu=models.get_gpu("A40-48GB"), config=CONFIG)
    assert isinstance(cost, RooflineStepCost) and "no profile of wider-llama at TP 1" in cost.provenance
    assert "data/operators has no operator tables of the A40-48GB" in cost.provenance


# ---------------------------------------------------------------- attention skew (LLMServingSim's fit)
def skew_rows() -> dict:
    """The committed skew_fit.csv as {(prefill_chunk, n_decode, skew_rate, kv_big, kv_prefill): alpha}."""
    with open(FOLDER / "skew_fit.csv", newline="") as f:
        return {tuple(float(r[k]) for k in list(r)[:5]): float(r["alpha"]) for r in csv.DictReader(f)}


def test_unequal_decode_histories_add_the_fitted_share_of_the_gap_to_the_max():
    # 56 decodes after 1,000 tokens and 8 after 4,000: mean history 1,375, skew rate 375 / 3,000 = 0.125; the
    # bucket n in (32, 64], rate in (0.05, 0.15], largest history in (1,024, 4,096], no prefill
    alpha = skew_rows()[(0, 64, 0.15, 4096, 0)]
    context = 56 * 1001 + 8 * 4001
    batch = Batch(64, context, 64, context, 0, 0, 1001, 4001)
    t_mean, t_max = LLAMA_COST.decode_attention_us(64, 1375.0), LLAMA_COST.decode_attention_us(64, 4000)
    assert t_max > t_mean and alpha != 0
    added_s = LLAMA_COST.step_s(batch) - LLAMA_COST.without("attention skew").step_s(batch)
    assert added_s == pytest.approx(32 * alpha * (t_max - t_mean) / 1e6, rel=1e-9)
    # not given, or equal histories: nothing added
    assert LLAMA_COST.step_s(batch._replace(min_decode_context_tokens=0, max_decode_context_tokens=0)) == (
        LLAMA_COST.without("attention skew").step_s(batch)
    )
    # a prefill chunk of tokens the fit did not profile (100) takes the pooled alpha
    mixed = Batch(164, context + 100, 64, context, 1, 100 * 101 // 2, 1001, 4001)
    t_mean, t_max = (LLAMA_COST.mixed_attention_us(100, 0.0, 64, h) for h in (1375.0, 4000))
    added_s = LLAMA_COST.step_s(mixed) - LLAMA_COST.without("attention skew").step_s(mixed)
    with open(FOLDER / "skew_fit.json") as f:
        assert added_s == pytest.approx(32 * json.load(f)["alpha_default"] * (t_max - t_mean) / 1e6, rel=1e-9)


def llmservingsim_bucket(bins, val):
    """LLMServingSim's _bucket_label, returning the label's index: (bins[i], bins[i + 1]], the last past the end."""
    for i in range(len(bins) - 1):
        if val <= bins[i + 1]:
            return i
    return len(bins) - 2


@given(st.integers(0, 2), st.floats(-1, 2e9, allow_nan=False))
def test_a_bucket_is_llmservingsims(axis, value):
    bins = list(profiles.load_profile(profiles.load_index()[0]).skew.bins[axis])
    clock = step_time.clock(2, {"skew_bins0": bins})
    assert step_time.skew_bucket(clock, step_time.SKEW_BINS0, value) == llmservingsim_bucket(bins, value)


class BatchSpy:
    """The constant step cost that keeps every batch it is asked about."""

    name = "spy"

    def __init__(self):
        self.batches = []

    def step_s(self, batch) -> float:
        self.batches.append(batch)
        return 0.01


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_engines_batches_carry_their_decodes_least_and_most_context(async_scheduling):
    config = CONFIG.replace(async_scheduling=async_scheduling)
    spy = BatchSpy()
    w = Workload(np.zeros(2), np.array([10, 40]), np.array([5, 5]))
    Engine(w, config, num_gpu_blocks=100, cost=spy, path="reference").run()
    # both prompts in the first step, then both decoding: contexts 11 and 41, 12 and 42, ...
    assert spy.batches[0][-2:] == (0, 0)
    decodes = [b for b in spy.batches if b.num_decodes == 2]
    assert [b[-2:] for b in decodes] == [(11 + j, 41 + j) for j in range(len(decodes))] and len(decodes) >= 3
    spy = BatchSpy()
    rng = np.random.default_rng(3)
    w = Workload(np.cumsum(rng.exponential(0.02, 200)), rng.integers(1, 900, 200), rng.integers(1, 300, 200))
    Engine(w, config, num_gpu_blocks=600, cost=spy, path="reference").run()
    for b in spy.batches:
        n, low, high = b.num_decodes, b.min_decode_context_tokens, b.max_decode_context_tokens
        assert (low, high) == (0, 0) if n == 0 else 1 <= low <= b.decode_context_tokens / n <= high
        assert n != 1 or low == high == b.decode_context_tokens
    assert any(b.max_decode_context_tokens > b.min_decode_context_tokens for b in spy.batches)


def test_expert_parallel_ranks_run_their_share_of_the_experts_and_pay_the_dispatch():
    ep = measured(MOE_NAME, data_parallel_size=2, enable_expert_parallel=True)
    assert (ep.expert_parallel_size, ep.data_parallel_size) == (2, 2) and "64 of 128 experts a GPU" in ep.source
    # 48 layers x (NCCL's all-gather + reduce-scatter of both ranks' tokens x 2,048 x 2 bytes), as nccl-tests timed them
    folder = profiles.interconnect("RTX-PRO-6000-Server-96GB").all_reduce_profile
    gather, scatter = (profiles.nccl_us(folder, op, 2) for op in ("all_gather", "reduce_scatter"))
    for tokens in (1, 32, 1000):
        size = tokens * 2048 * 2
        assert ep.dispatch.step_us(tokens) == pytest.approx(
            48 * (np.interp(size, *gather) + np.interp(size, *scatter)), rel=1e-12
        )
    assert "NCCL's all-gather and reduce-scatter among 2 GPUs" in ep.source
    tokens, experts, grid = (np.asarray(a) for a in (MOE.moe_tokens, MOE.moe_experts, MOE.moe_us))
    for n in (1, 8, 64):  # measured token counts: the block is the table's at this GPU's 64 experts' share
        active = 64 * (1 - (1 - 8 / 128) ** (2 * n))
        i = int(np.flatnonzero(tokens == n)[0])
        assert ep.moe_block_us(n) == pytest.approx(np.interp(active, experts, grid[i]), rel=1e-12)
        assert ep.moe_block_us(n) <= MOE.moe_block_us(n)  # no more experts to read than all 128's share
    assert ep.moe_block_us(64) < 0.8 * MOE.moe_block_us(64)
    batch = Batch(16, 16 * 1001, 16, 16 * 1001)
    assert ep.step_s(batch) - ep.without("expert dispatch").step_s(batch) == pytest.approx(
        ep.dispatch.step_us(2 * 16) / 1e6, rel=1e-9
    )
    alone = measured(MOE_NAME, data_parallel_size=2)  # data parallelism without expert parallelism: said, not modelled
    assert alone.expert_parallel_size == 1 and "not modelled" in alone.source
