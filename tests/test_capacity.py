"""kvlab.core.capacity: the article's arithmetic and vLLM's accounting for real models."""

import math
from fractions import Fraction
from math import ceil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import capacity as cap
from kvlab.core import models
from kvlab.core.config import EngineConfig
from kvlab.core.models import ModelSpec
from kvlab.sections.s03_capacity import ARTICLE_SHAPE, fit_table

GIB = 2**30


# ---------------------------------------------------------------- the article's figures stay as they were
def test_article_figures_unchanged():
    assert ARTICLE_SHAPE.kv_bytes_per_token == 524288
    fit = fit_table(ARTICLE_SHAPE, 80, 16, [1000, 4000, 8000, 32000, 128000])
    assert fit["max_num_requests"].tolist() == [131, 32, 16, 4, 1]


# ---------------------------------------------------------------- bytes per token
def test_gqa_needs_a_quarter_of_the_articles_bytes():
    llama3 = models.get_model("Meta-Llama-3-8B")
    assert cap.kv_bytes_per_token(llama3) * 4 == ARTICLE_SHAPE.kv_bytes_per_token
    assert cap.kv_bytes_per_token(models.get_model("Llama-2-7b-hf")) == ARTICLE_SHAPE.kv_bytes_per_token


@pytest.mark.parametrize(
    "dtype,per_layer",
    [
        ("bf16", 2 * 8 * 128 * 2),
        ("fp16", 2 * 8 * 128 * 2),
        ("fp8", 2 * 8 * 128),
        ("int8", 2 * 8 * 128 + 2 * 8 * 4),  # vLLM int8_per_token_head: an fp32 scale per token, head, K and V
        ("int4", 2 * 8 * (64 + 8)),  # vLLM nvfp4: 128/2 bytes of values + 128/16 fp8 scales per head, K and V
    ],
)
def test_kv_cache_dtypes(dtype, per_layer):
    assert cap.kv_bytes_per_token_per_layer(models.get_model("Meta-Llama-3-8B"), dtype) == per_layer


def test_mla_one_latent_not_split_by_tp():
    v3 = models.get_model("DeepSeek-V3")
    assert cap.kv_bytes_per_token(v3) == 61 * 576 * 2  # no K/V factor 2
    assert cap.kv_bytes_per_token(v3, EngineConfig().replace(tensor_parallel_size=8)) == 61 * 576 * 2
    assert cap.kv_bytes_per_token(v3, EngineConfig().replace(kv_cache_dtype="fp8")) == 61 * 576
    with pytest.raises(ValueError, match="must be fp16, bf16 or fp8 for mla"):
        cap.kv_bytes_per_token(v3, EngineConfig().replace(kv_cache_dtype="int4"))


def test_tensor_parallel_heads_per_gpu():
    llama70 = models.get_model("Llama-3.1-70B-Instruct")  # 64 heads, 8 KV heads
    assert [cap.kv_heads_per_gpu(llama70, tp) for tp in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    with pytest.raises(ValueError, match="tensor_parallel_size=3 is not allowed: must divide num_attention_heads"):
        cap.kv_heads_per_gpu(llama70, 3)
    mqa = ModelSpec("mqa", 4, 8, 1, 64, "mqa")
    assert cap.kv_heads_per_gpu(mqa, 8) == 1  # the one head replicated on every GPU
    odd = ModelSpec("odd", 4, 24, 6, 64, "gqa")
    with pytest.raises(ValueError, match="must divide num_kv_heads \\(6\\) or be a multiple of it"):
        cap.kv_heads_per_gpu(odd, 4)


def test_pipeline_stage_with_most_layers_binds():
    llama = models.get_model("Llama-3.1-8B-Instruct")  # 32 layers: PP 3 -> 11, 11, 10
    one = cap.vllm_capacity(llama, 10 * GIB, 8192, EngineConfig().replace(pipeline_parallel_size=3))
    assert one["layers_per_group"] == 11
    assert one["num_gpu_blocks"] == int(10 * GIB // (16 * 4096) // 11)
    assert cap.kv_bytes_per_token(llama, EngineConfig().replace(pipeline_parallel_size=3)) == 11 * 4096


# ---------------------------------------------------------------- blocks: equal to a simple reference
def _reference_blocks(layers, kv_heads, head_dim, dtype_bytes, block_size, available):
    """floor(available / (block_size x bytes per token per layer) / layers), in exact arithmetic."""
    per_block_layer = Fraction(block_size * 2 * kv_heads * head_dim) * Fraction(dtype_bytes)
    return int(Fraction(available) / per_block_layer / layers)


@settings(max_examples=80, deadline=None)
@given(
    layers=st.integers(1, 128),
    kv=st.sampled_from([1, 2, 4, 8, 16, 32]),
    head_dim=st.sampled_from([64, 96, 128, 256]),
    dtype=st.sampled_from(["bf16", "fp8"]),
    block_size=st.sampled_from([8, 16, 32, 64]),
    available=st.integers(0, 200 * GIB),
    max_model_len=st.integers(1, 262144),
)
def test_uniform_model_matches_reference(layers, kv, head_dim, dtype, block_size, available, max_model_len):
    spec = ModelSpec("m", layers, kv, kv, head_dim, "mha")
    config = EngineConfig().replace(block_size=block_size, kv_cache_dtype=dtype)
    blocks = _reference_blocks(layers, kv, head_dim, cap.KV_CACHE_DTYPE_BYTES[dtype], block_size, available)
    per_request = ceil(max_model_len / block_size)
    result = cap.vllm_capacity(spec, available, max_model_len, config)
    assert result["num_gpu_blocks"] == blocks
    assert result["blocks_per_request"] == per_request
    assert result["max_concurrency"] == blocks / per_request
    # int(blocks / R x L) in floats, as vLLM computes it: the exact quotient's floor, or one less where the
    # quotient is whole and the float product lands just below it
    tokens = Fraction(blocks * max_model_len, per_request)
    assert math.floor(tokens) - (tokens.denominator == 1) <= result["gpu_kv_cache_tokens"] <= math.floor(tokens)
    assert result["starts"] == (blocks >= per_request + 1)  # one block is kept back


@settings(max_examples=40, deadline=None)
@given(gib=st.floats(1, 100), tp=st.sampled_from([1, 2, 4, 8]))
def test_fp8_and_tp_never_lose_capacity(gib, tp):
    llama70 = models.get_model("Llama-3.1-70B-Instruct")
    base = cap.vllm_capacity(llama70, gib * GIB, 8192, EngineConfig().replace(tensor_parallel_size=tp))
    fp8 = cap.vllm_capacity(
        llama70, gib * GIB, 8192, EngineConfig().replace(tensor_parallel_size=tp, kv_cache_dtype="fp8")
    )
    assert fp8["num_gpu_blocks"] >= 2 * base["num_gpu_blocks"]
    more = cap.vllm_capacity(llama70, gib * GIB, 8192, EngineConfig().replace(tensor_parallel_size=min(8, 2 * tp)))
    assert more["num_gpu_blocks"] >= base["num_gpu_blocks"]


# ---------------------------------------------------------------- sliding windows and vLLM's KV cache groups
def test_all_sliding_layers_hold_at_most_the_window():
    mistral = models.get_model("Mistral-7B-v0.1")  # window 4096 on all 32 layers
    result = cap.vllm_capacity(mistral, 20 * GIB, 32768)
    # vLLM's SlidingWindowSpec: ceil(min(window - 1 + (PP + 1) x max_num_batched_tokens, max_model_len) / block) + 1
    assert result["max_in_flight_tokens"] == 2 * 8192
    assert result["blocks_per_request"] == ceil((4095 + 2 * 8192) / 16) + 1 == 1281
    assert result["num_gpu_blocks"] == int(20 * GIB // (16 * 2 * 8 * 128 * 2) // 32)
    short = cap.vllm_capacity(mistral, 20 * GIB, 2048)
    assert short["blocks_per_request"] == 2048 // 16 + 1  # a request shorter than the window


def test_gemma3_hybrid_groups_as_vllm():
    """Gemma 3 27B: 52 local and 10 global layers -> groups of at most 10 layers: 1 full + 6 sliding
    (vLLM 0.33, 20 GiB, max_num_batched_tokens 2048: 16,384 blocks, R 3,974, 135,095 tokens)."""
    gemma = models.get_model("gemma-3-27b-it")
    page = 16 * 2 * 16 * 128 * 2
    config = EngineConfig().replace(max_num_batched_tokens=2048)
    result = cap.vllm_capacity(gemma, 20 * GIB, 32768, config)
    assert (result["layers_per_group"], result["num_kv_cache_groups"]) == (10, 7)
    assert [len(g.layers) for g in cap.kv_cache_groups(gemma, config)] == [9, 9, 9, 9, 8, 8, 10]
    assert result["num_gpu_blocks"] == 20 * GIB // (10 * page) == 16384
    assert result["blocks_per_request"] == 32768 // 16 + 6 * (ceil((1023 + 2 * 2048) / 16) + 1) == 3974
    assert (result["gpu_kv_cache_tokens"], f"{result['max_concurrency']:.2f}") == (135095, "4.12")
    flat = cap.vllm_capacity(gemma, 20 * GIB, 32768, config.replace(hybrid_kv_cache=False))
    assert (flat["num_gpu_blocks"], flat["blocks_per_request"], flat["gpu_kv_cache_tokens"]) == (2642, 2048, 42272)
    assert result["max_concurrency"] > 3 * flat["max_concurrency"]  # windows pay off at long contexts


def test_gemma2_alternating_layers_make_two_groups():
    gemma = models.get_model("gemma-2-9b-it")  # 21 local + 21 global
    result = cap.vllm_capacity(gemma, 10 * GIB, 8192)
    assert (result["layers_per_group"], result["num_kv_cache_groups"]) == (21, 2)
    assert result["blocks_per_request"] == 512 + ceil(min(4095 + 2 * 8192, 8192) / 16) + 1


# ---------------------------------------------------------------- budget and bad input
def test_budget_formula():
    assert cap.available_kv_cache_bytes(80, 15, 0.9, 2, 0.4) == pytest.approx((72 - 17.4) * GIB)
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5 is not allowed"):
        cap.available_kv_cache_bytes(80, 15, 1.5)


def test_budget_that_fits_no_block_is_refused():
    llama70 = models.get_model("Llama-3.1-70B-Instruct")
    result = cap.vllm_capacity(llama70, 1_000_000, 8192)
    assert (result["starts"], result["num_gpu_blocks"], result["max_concurrency"]) == (False, 0, 0.0)
    assert result["refusal"] == (
        "no KV-cache memory is left once vLLM keeps one block of 5,242,880 B back (1,000,000 B available)"
    )


def test_bad_cache_settings():
    with pytest.raises(ValueError, match="kv_cache_dtype='fp4' is not allowed: must be one of fp16, bf16"):
        EngineConfig().replace(kv_cache_dtype="fp4")
    with pytest.raises(ValueError, match="block_size=0 is not allowed"):
        EngineConfig().replace(block_size=0)
    with pytest.raises(ValueError, match="must be one number or one per pipeline stage"):
        cap.vllm_capacity(
            models.get_model("Qwen3-14B"), [GIB, GIB, GIB], 1024, EngineConfig().replace(pipeline_parallel_size=2)
        )


def test_log_lines_use_vllms_wording():
    result = cap.vllm_capacity(models.get_model("Qwen3-14B"), 2666 * 16 * 163840, 32768)  # 2,666 blocks of 40 layers
    assert cap.vllm_log_lines(result) == [
        "Available KV cache memory: 6.51 GiB",
        "GPU KV cache size: 42,656 tokens, Maximum concurrency for 32,768 tokens per request: 1.30x",
    ]
    refused = cap.vllm_capacity(models.get_model("Qwen3-14B"), 1280 * 163840, 32768)
    assert cap.vllm_log_lines(refused) == ["Available KV cache memory: 0.2 GiB"]  # vLLM's round(x, 2), then stops


def test_data_parallel_ranks_raise_a_mixture_of_experts_concurrency_per_gpu_and_not_a_dense_models():
    from kvlab.sections import s03_capacity

    table = s03_capacity.data_parallel_table(s03_capacity.DATA_PARALLEL_MODELS, 80.0, 32768)
    moe = table.loc["Qwen/Qwen3-30B-A3B-Instruct-2507"]
    dense = table.loc["Qwen/Qwen3-32B"]
    assert list(moe["expert_parallel"]) == [False, True, True] and not dense["expert_parallel"].any()
    # each rank holds (30.5 - 28.99 (1 - 1/N)) B parameters in bf16
    assert moe["weights_per_gpu_gib"].tolist() == [
        round((30.5e9 - 28_991_029_248 * (1 - 1 / n)) * 2 / 2**30, 2) for n in (1, 2, 4)
    ]
    assert moe["max_concurrency_per_rank"].is_monotonic_increasing and dense["max_concurrency_per_rank"].nunique() == 1
    ranks = table.index.get_level_values(1).to_numpy()
    assert abs(table["max_concurrency_all_ranks"] - table["max_concurrency_per_rank"] * ranks).max() <= 0.02
    figures = s03_capacity.data_parallel_figures(table)
    assert figures["dense"]["gain"] == 1.0 and figures["moe"]["gain"] > 3
    flipped = table.copy()  # the prose's figures follow the table, not the model's kind
    rows = flipped.index.get_level_values(0) == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    flipped.loc[rows, "max_concurrency_per_rank"] = flipped.loc[rows, "max_concurrency_per_rank"].to_numpy()[::-1]
    assert s03_capacity.data_parallel_figures(flipped)["moe"]["gain"] < 1
