"""Operator tables by shape (kvlab.core.operators): lookups equal the measured points, interpolation exact where
the time has the form it assumes, and a composed step set against an independent profile of the same GPU."""

import csv
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import models, operators, profiles
from kvlab.core.config import EngineConfig
from kvlab.core.cost.batch import Batch
from kvlab.core.cost.measured import MeasuredStepCost, measured_step_cost

LLAMA_8B = dataclasses.replace(models.get_model("meta-llama/Llama-3.1-8B"), layer_sizes=(14336, 128256, 0, 0, 0))
RTX_PRO = "RTX-PRO-6000-Server-96GB"


def test_every_gpu_with_tables_names_its_source_commit_and_versions():
    assert {"H100-SXM-80GB", "H200-141GB", "B200-180GB", "A100-SXM-80GB", RTX_PRO} <= set(operators.operator_gpus())
    for gpu in operators.operator_gpus():
        meta = json.loads((operators.OPERATORS_DIR / operators.operator_systems()[gpu] / "meta.json").read_text())
        assert len(meta["commit"]) == 40 and "Apache-2.0" in meta["source"]
        assert {"gemm", "context_attention", "generation_attention"} <= set(meta["tables"])
        assert all(
            t.get("vllm_version", t.get("nccl_version", "")).startswith(("0.", "2.")) for t in meta["tables"].values()
        )
        assert all("vllm_version" in t for name, t in meta["tables"].items() if name != "nccl")
    size = sum(p.stat().st_size for p in operators.OPERATORS_DIR.rglob("*") if p.is_file())
    assert size < 6e6


def test_a_measured_gemm_is_read_as_measured():
    tables = operators.operator_tables("H200-141GB")
    z = np.load(tables.folder / "gemm.npz")
    gemm = tables.gemm("bf16")
    for row in (0, 1000, 20000, len(z["bf16_m"]) - 1):
        m, n, k = (int(z[f"bf16_{c}"][row]) for c in "mnk")
        assert gemm.us_at(m, n, k) == pytest.approx(float(z["bf16_us"][row]), rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.floats(1, 64), st.floats(32, 200_000), st.floats(32, 200_000))
def test_gemm_interpolation_is_exact_where_time_grows_as_m_n_k(m, n, k):
    axes = [np.array([1.0, 16, 64]), np.array([32.0, 1024, 65536]), np.array([32.0, 4096, 65536])]
    grid = np.einsum("i,j,k->ijk", *axes) * 1e-6  # t = m n k x 1e-6 us
    table = operators.GemmTable(*axes, grid)
    assert table.us_at(m, n, k) == pytest.approx(m * n * k * 1e-6, rel=1e-9)


def test_prefill_pairs_by_hand():
    assert operators.prefill_pairs(4, 0) == 10  # 1 + 2 + 3 + 4
    assert operators.prefill_pairs(2, 5) == 6 + 7
    # a window of 4: queries see min(4, 5 + i) keys: 4 + 4
    assert operators.prefill_pairs(2, 5, window=4) == 8
    # a window of 3 over a fresh chunk of 5: 1 + 2 + 3 + 3 + 3
    assert operators.prefill_pairs(5, 0, window=3) == 12
    assert operators.equal_pairs_prompt(operators.prefill_pairs(1000, 0)) == pytest.approx(1000)


def test_the_composed_dense_term_is_the_sum_of_the_models_gemms():
    profile, words = operators.compose_profile(LLAMA_8B, "H200-141GB", 2)
    tables = operators.operator_tables("H200-141GB")
    gemm = tables.gemm("bf16")
    tokens, dense = profile.dense
    # Llama-3.1-8B at TP 2: qkv (16 + 2 x 4) x 128 out of 4096; gate_up 2 x 7168 out of 4096; down 4096 out of 7168
    assert dense["qkv_proj"][0] == pytest.approx(gemm.us_at(1, 3072, 4096)[()], rel=1e-9)
    assert dense["gate_up_proj"][-1] == pytest.approx(gemm.us_at(tokens[-1], 14336, 4096)[()], rel=1e-9)
    assert dense["down_proj"][5] == pytest.approx(gemm.us_at(tokens[5], 4096, 7168)[()], rel=1e-9)
    assert words.startswith("composed from the H200-141GB's operator tables (AIConfigurator, vLLM 0.24.0)")
    assert "vllm_flash_attn_fa3" in words


def test_a_composed_step_is_near_an_independent_profile_of_the_same_gpu():
    """LLMServingSim timed Llama-3.1-8B through vLLM's layers on the RTX PRO 6000; AIConfigurator timed the same GEMMs
    and attention kernels one at a time: decode steps composed from the second are within 8% of the first."""
    config = EngineConfig()
    whole = MeasuredStepCost.from_profile(profiles.find_profile(RTX_PRO, LLAMA_8B, 1), LLAMA_8B, config)
    composed = MeasuredStepCost.from_profile(operators.compose_profile(LLAMA_8B, RTX_PRO, 1)[0], LLAMA_8B, config)
    for n, context in ((1, 512), (8, 2048), (32, 2048), (128, 1024)):
        batch = Batch(n, n * context, n, n * context)
        assert composed.step_s(batch) / whole.step_s(batch) - 1 == pytest.approx(0, abs=0.08), (n, context)


def test_any_covered_gpu_is_timed_from_the_tables_and_the_rest_refused_or_named():
    config = EngineConfig()
    for gpu in ("H100-SXM-80GB", "H200-141GB", "B200-180GB"):
        cost = measured_step_cost(LLAMA_8B, models.get_gpu(gpu), config)
        assert isinstance(cost, MeasuredStepCost) and cost.source.startswith(f"composed from the {gpu}'s")
    # a faster GPU takes less time for the same decode step
    times = {
        gpu: measured_step_cost(LLAMA_8B, models.get_gpu(gpu), config).step_s(Batch(32, 65536, 32, 65536))
        for gpu in ("H100-SXM-80GB", "H200-141GB", "B200-180GB")
    }
    assert times["B200-180GB"] < times["H200-141GB"] < times["H100-SXM-80GB"]
    unknown = models.get_model("Qwen/Qwen2.5-72B-Instruct")
    assert "MLP and vocabulary sizes are unknown (give its config.json)" in operators.composable(unknown)


def test_a_windowed_model_reads_fewer_keys_than_full_attention():
    gemma = dataclasses.replace(
        LLAMA_8B, name="windowed", sliding_window=1024, sliding_window_pattern=6, max_position_embeddings=131072
    )
    full, _ = operators.compose_profile(LLAMA_8B, "H200-141GB", 1)
    windowed, words = operators.compose_profile(gemma, "H200-141GB", 1)
    axes, grid = full.attention
    _, wgrid = windowed.attention
    long_history = list(axes[3]).index(16384)
    assert (wgrid[0, 0, 1:, long_history] < grid[0, 0, 1:, long_history]).all()
    assert np.array_equal(wgrid[0, 0, 1:, 1], grid[0, 0, 1:, 1])  # 16 tokens: inside the window
    assert "windowed layers read at the keys their window keeps" in words


def test_a_composed_step_says_how_far_the_composition_is_off_where_a_profile_also_measures():
    from kvlab.core.cost import measured as module

    low, high, n, gpus = module.composition_error()
    assert n == 5 and gpus == (RTX_PRO,)  # LLMServingSim's complete profiles on a GPU the tables cover
    assert -0.5 < low < 0 < high < 0.5
    cost = measured_step_cost(LLAMA_8B, models.get_gpu("H200-141GB"), EngineConfig())
    assert f"are off it by {100 * low:+.0f}% to {100 * high:+.0f}%" in cost.source


def test_expert_parallelism_reads_the_tables_expert_parallel_rows_by_the_ranks_tokens():
    qwen = models.get_model("Qwen/Qwen3-30B-A3B")
    tables = operators.operator_tables("H200-141GB")
    profile, words = operators.compose_profile(qwen, "H200-141GB", 1, expert_parallel_size=4, data_parallel_size=4)
    tokens, experts, grid = profile.moe
    measured_tokens, measured_us = tables.moe("bf16").shapes[(2048, 768, 8, 128, 1, 4)]
    # a rank's 16 tokens meet every rank's at its experts: the table's 64 tokens on one GPU, plus the router's GEMM
    row = list(tokens).index(16)
    router = tables.gemm("bf16").us_at(16, 128, 2048)
    assert grid[row, 0] == pytest.approx(measured_us[list(measured_tokens).index(64)] + router, rel=1e-9)
    assert tokens[0] >= 1


def test_an_unmeasured_moe_block_reads_the_nearest_measured_one_scaled_by_the_two_rooflines():
    qwen = models.get_model("Qwen/Qwen3-30B-A3B")
    tables = operators.operator_tables("H200-141GB")
    measured = tables.moe("bf16").shapes
    assert (2048, 768, 8, 128, 1, 3) not in measured
    profile, words = operators.compose_profile(qwen, "H200-141GB", 1, expert_parallel_size=3, data_parallel_size=3)
    near = operators.nearest_moe_block(measured, (2048, 768, 8, 128), 1, 3)
    assert near[:4] != (2048, 768, 8, 128) and near[5] in (2, 4)  # another shape, at a neighbouring EP
    near_tokens, near_us = measured[near]
    tokens, _, grid = profile.moe
    # the ranks' 3 x 32 = 96 tokens meet at each GPU: the neighbour's time there x the ratio of the two rooflines
    row, x = list(tokens).index(32), 96.0
    ratio = operators.moe_roofline_ratio((2048, 768, 8, 128), 1, 3, near, x, "", "H200-141GB")
    router = tables.gemm("bf16").us_at(32, 128, 2048)
    assert grid[row, 0] == pytest.approx(near_us[list(near_tokens).index(x)] * ratio + router, rel=1e-9)
    low, high, median, compared = operators.moe_fallback_error("H200-141GB", "")
    assert compared == len(measured) and low < 0 < high and 0 < median < 0.5
    assert "is not in the H200-141GB's bf16 MoE table: the nearest measured block" in words
    assert f"off by {100 * low:+.0f}% to {100 * high:+.0f}% (median {100 * median:.0f}%, {compared} shapes)" in words


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([(2048, 768, 8, 128), (4096, 14336, 2, 8), (2880, 2880, 4, 32)]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 8]),
    st.integers(1, 4096),
)
def test_moe_from_gemms_is_the_sum_of_each_active_experts_gemms_where_time_is_m_n_k(shape, tp, ep, tokens):
    """Where a GEMM's time is m n k (no floor), the two GEMMs of the active experts' bytes and FLOPs take what every
    active expert's own gate-up and down GEMMs take, summed one by one (balanced routing)."""
    axes = [np.array([1.0, 8192, 65536]), np.array([32.0, 4096, 65536]), np.array([32.0, 4096, 65536])]
    table = operators.GemmTable(*axes, np.einsum("i,j,k->ijk", *axes) * 1e-6)
    hidden, inter, top_k, experts = shape
    slots = tokens * top_k / ep
    active = min(experts / ep, slots)
    per_expert = slots / active
    one_by_one = active * (
        table.us_at(per_expert, 2 * inter / tp, hidden) + table.us_at(per_expert, hidden, inter / tp)
    )
    got = operators.moe_from_gemms(table, shape, tp, ep, 1, [tokens])[0]
    assert got == pytest.approx(float(one_by_one), rel=1e-3)  # int() of the concatenated widths


def test_a_gpu_whose_tables_measure_no_moe_block_runs_the_experts_as_gemms_and_says_how_far_that_rule_is_off():
    mixtral = models.get_model("mistralai/Mixtral-8x7B-v0.1")
    assert operators.operator_tables("A100-SXM-80GB").moe("bf16") is None or not (
        operators.operator_tables("A100-SXM-80GB").moe("bf16").shapes
    )
    profile, words = operators.compose_profile(mixtral, "A100-SXM-80GB", 2)
    low, high, median, compared = operators.moe_gemm_rule_error("")
    assert compared > 50 and low < 0 < high
    assert "it measures no bf16 block, so the active experts run as two bf16 GEMMs" in words
    assert (
        f"off them by {100 * low:+.0f}% to {100 * high:+.0f}% (median {100 * median:.0f}%, {compared} blocks)" in words
    )
    tokens, _, grid = profile.moe
    gemm = operators.operator_tables("A100-SXM-80GB").gemm("bf16")
    expected = operators.moe_from_gemms(gemm, (4096, 14336, 2, 8), 2, 1, 1, tokens) + gemm.us_at(tokens, 8, 4096)
    np.testing.assert_allclose(grid[:, 0], expected, rtol=1e-12)


MODEL_NAMES = sorted(models.load_models())
REFUSALS = (
    "do not split",
    "does not split",
    "sizes are unknown",
    "multi-head latent attention",
    "has no fp8_block GEMMs",
    "MLA tables have no",
    "linear-attention",
)


def test_every_catalog_model_on_every_table_gpu_composes_to_finite_positive_times_or_says_why_not():
    refused = set()
    for gpu in operators.operator_gpus():
        for name in MODEL_NAMES:
            model = models.get_model(name)
            moe = bool(model.layer_sizes and model.layer_sizes[2])
            for tp in (1, 2, 4, 8):
                for ep, dp in ((1, 1), (2 * tp, 2)) if moe else ((1, 1),):
                    profile, words = operators.compose_profile(model, gpu, tp, "bf16", ep, dp)
                    if profile is None:
                        assert any(r in words for r in REFUSALS), (gpu, name, tp, words)
                        if "split" not in words:  # vLLM refuses those too
                            refused.add(name)
                        continue
                    parts = {**profile.dense[1], **profile.per_sequence[1], "attention": profile.attention[1]}
                    if profile.moe is not None:
                        parts["moe"] = profile.moe[2]
                    for part, us in parts.items():
                        assert us.size and np.isfinite(us).all() and us.min() >= 0, (gpu, name, tp, ep, part)
    # the models refused somewhere other than where vLLM refuses the split: sizes unknown, MLA of another shape, or
    # block-FP8 on a GPU without its GEMMs
    assert refused <= {
        "Qwen/Qwen2.5-72B-Instruct",
        "microsoft/phi-4",
        "facebook/opt-13b",
        "Qwen/Qwen3-Next-80B-A3B-Instruct",
        "deepseek-ai/DeepSeek-V2-Lite",
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-R1",
    }


def test_deepseek_v3s_mla_is_read_from_the_module_tables_and_other_latents_are_refused():
    v3 = models.get_model("deepseek-ai/DeepSeek-V3")
    profile, words = operators.compose_profile(v3, "H200-141GB", 8, expert_parallel_size=8)
    assert "MLA: the whole attention module of DeepSeek-V3's shape" in words
    assert "qkv_proj" not in profile.dense[1] and "o_proj" not in profile.dense[1]  # inside the module
    axes, grid = profile.attention
    generation = operators.operator_tables("H200-141GB").mla("generation", "bf16", "fp8_block")
    decodes, history = list(axes[2]).index(32), list(axes[3]).index(2048)
    assert grid[0, 0, decodes, history] == pytest.approx(generation.us_at([(1.0, (16, 1, 576))], 32, 2048))
    # DeepSeek-V2-Lite has V3's latent (512) and rope (64) dims at 16 heads: V3's module at 16 heads a GPU, named
    lite = models.get_model("deepseek-ai/DeepSeek-V2-Lite")
    profile, words = operators.compose_profile(lite, "H200-141GB", 1)
    generation = operators.operator_tables("H200-141GB").mla("generation", "bf16", "bf16")
    axes, grid = profile.attention
    assert grid[0, 0, decodes, history] == pytest.approx(generation.us_at([(1.0, (16, 1, 576))], 32, 2048))
    assert "projections are DeepSeek-V3's, of hidden 7,168 against this model's 2,048 (an upper bound" in words
    other = dataclasses.replace(lite, kv_lora_rank=256, head_dim=256 + 64)
    assert "not DeepSeek-V3's (512, 64)" in operators.composable(other)


def test_a_chunk_after_history_is_read_at_its_pairs_and_the_measured_chunk_shape():
    # no history: the fresh prompt itself; with history: the measured ratio at its points, clamped past them
    assert operators.chunk_ratio(16, 0) == 1.0 and operators.chunk_ratio(8192, 0) == 1.0
    assert operators.chunk_ratio(128, 4096) == pytest.approx(1.6474)  # chunked_prefill.csv's point
    assert operators.chunk_ratio(128, 10**6) == operators.chunk_ratio(128, 32768)
    profile, _ = operators.compose_profile(LLAMA_8B, "H200-141GB", 1)
    axes, grid = profile.attention
    context = operators.operator_tables("H200-141GB").attention("context", "bf16")
    n, c = list(axes[0]).index(128), list(axes[1]).index(4096)
    fresh = context.us_at([(1.0, (32, 8, 128))], 1.0, operators.equal_pairs_prompt(128 * 4096 + 128 * 129 / 2))
    assert grid[n, c, 0, 0] == pytest.approx(fresh / 1.6474, rel=1e-9)


def test_a_plain_mlp_is_one_up_projection_not_gate_and_up():
    neox = models.get_model("EleutherAI/gpt-neox-20b")
    assert not neox.gated_mlp
    profile, _ = operators.compose_profile(neox, "H200-141GB", 2)
    gemm = operators.operator_tables("H200-141GB").gemm("bf16")
    intermediate, hidden = neox.layer_sizes[0], neox.hidden_size
    assert profile.dense[1]["gate_up_proj"][0] == pytest.approx(gemm.us_at(1, intermediate // 2, hidden)[()])


def test_kv_heads_past_the_measured_ones_scale_the_nearest_and_never_go_negative():
    """Llama-2-7B's 32 KV heads: the generation tables measured 1-8, so 8's times x 4 (a secant from 4 and 8 went
    below 0 on the A100's table)."""
    llama2 = dataclasses.replace(models.get_model("meta-llama/Llama-2-7b-hf"), layer_sizes=(11008, 32000, 0, 0, 0))
    for gpu in ("A100-SXM-80GB", "H100-SXM-80GB", "H200-141GB"):
        profile, words = operators.compose_profile(llama2, gpu, 1)
        assert profile.attention[1].min() >= 0, gpu
        assert "read from 32/8/128 x 4" in words
    generation = operators.operator_tables("A100-SXM-80GB").attention("generation", "bf16")
    parts, _ = generation.shape_for(32, 32, 128, "generation")
    assert parts == [(4.0, (32, 8, 128))]


def reference_share(chunk: int, decodes: int, history: int) -> float:
    """mixed_decode_share at a measured point, straight from LLMServingSim's RTX PRO 6000 attention.csv files: the
    median over the GQA profiles of ((mixed - prefill alone) / decodes alone - 1) / (heads per KV head - 1)."""
    shares = []
    for path in sorted((operators.REFERENCE_DIR).rglob("attention.csv")):
        model = models.get_model("/".join(path.relative_to(operators.REFERENCE_DIR).parts[:2]))
        g = model.num_attention_heads / model.num_kv_heads
        with open(path, newline="") as f:
            t = {tuple(int(r[c]) for c in ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")): float(r["time_us"])
                 for r in csv.DictReader(f)}  # fmt: skip
        mixed, prefill, alone = t[(chunk, 0, decodes, history)], t[(chunk, 0, 0, 0)], t[(0, 0, decodes, history)]
        shares.append(((mixed - prefill) / alone - 1) / (g - 1))
    return float(np.median(shares))


@pytest.mark.parametrize("chunk, decodes, history", [(512, 32, 1024), (128, 128, 4096), (2048, 8, 256)])
def test_flash_attention_2_mixed_batches_pay_the_measured_share_of_unpacked_gqa(chunk, decodes, history):
    # RTX PRO 6000 at a bf16 KV cache runs vLLM's FlashAttention 2: a mixed batch's decodes cost
    # 1 + (g - 1) x the share LLMServingSim measured there (Llama-3.1-8B: g = 4)
    axes, grid = operators.compose_profile(LLAMA_8B, RTX_PRO, 1)[0].attention
    i, k, j = (int(np.flatnonzero(a == v)[0]) for a, v in zip((axes[0], axes[2], axes[3]), (chunk, decodes, history)))
    prefill, decode = grid[i, 0, 0, 0], grid[0, 0, k, j]
    assert grid[i, 0, k, j] == pytest.approx(prefill + decode * (1 + 3 * reference_share(chunk, decodes, history)))
    # FlashAttention 3 (H200) packs GQA heads in every varlen launch: the sum of the two
    axes, grid = operators.compose_profile(LLAMA_8B, "H200-141GB", 1)[0].attention
    assert grid[i, 0, k, j] == pytest.approx(grid[i, 0, 0, 0] + grid[0, 0, k, j], rel=1e-12)


def test_shared_experts_overlap_the_routed_ones_up_to_vllms_threshold_and_dense_layers_take_their_share():
    """DeepSeek-V3 at TP 8 with expert parallelism on the H200: each MoE layer's block is the routed experts and the
    shared expert (MLP 2,048 split over 8) on two streams (the longer) up to 256 tokens, one after the other past
    them; its first 3 of 61 layers run a dense MLP of 18,432 instead, averaged in by 3 / 61; plus the router."""
    v3 = models.get_model("deepseek-ai/DeepSeek-V3")
    assert (v3.shared_expert_intermediate_size, v3.first_k_dense_replace, v3.dense_intermediate_size) == (
        2048,
        3,
        18432,
    )
    bare = dataclasses.replace(
        v3, shared_expert_intermediate_size=0, first_k_dense_replace=0, dense_intermediate_size=0
    )
    profile, words = operators.compose_profile(v3, "H200-141GB", 8, expert_parallel_size=8)
    routed, _ = operators.compose_profile(bare, "H200-141GB", 8, expert_parallel_size=8)
    tables = operators.operator_tables("H200-141GB")
    gemm = tables.gemm("fp8_block")
    tokens, _, grid = profile.moe
    router = tables.gemm("bf16").us_at(tokens, 256, 7168)
    alone = routed.moe[2][:, 0] - router
    shared = gemm.us_at(tokens, 512, 7168) + gemm.us_at(tokens, 7168, 256)
    dense = gemm.us_at(tokens, 4608, 7168) + gemm.us_at(tokens, 7168, 2304)
    moe = np.where(tokens <= 256, np.maximum(alone, shared), alone + shared) + router
    np.testing.assert_allclose(grid[:, 0], (58 * moe + 3 * dense) / 61, rtol=1e-12)
    assert "overlapping the routed experts on a second stream up to 256 tokens" in words
    assert "the first 3 of 61 layers' dense MLP (18,432)" in words
    # the extras change the block where they run and only there
    assert (grid[:, 0] != routed.moe[2][:, 0]).all()
    qwen = models.get_model("Qwen/Qwen3-30B-A3B")
    assert (qwen.shared_expert_intermediate_size, qwen.first_k_dense_replace) == (0, 0)
