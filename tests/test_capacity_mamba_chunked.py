"""Mamba (Gated DeltaNet) and chunked-local-attention layouts as vLLM 0.33 lays them out at start-up (no vLLM needed).

Hand-checked figures; scripts/parity/compare_capacity.py (make parity) checks the same models against vLLM's own code.
Qwen3-Next-80B-A3B (config.json): 48 layers, every 4th full attention (16 heads, 2 KV heads of 256), the others Gated
DeltaNet with 16 key and 32 value heads of 128 and a conv kernel of 4. Its state on one GPU in bf16: a conv state of
(2 x 16 x 128 + 32 x 128) x 3 = 24,576 values and a temporal state of 32 x 128 x 128 = 524,288, 1,097,728 bytes.
"""

import pytest

from kvlab.core import capacity as cap
from kvlab.core.config import EngineConfig
from kvlab.core.models import from_config, get_model

QWEN3_NEXT = get_model("Qwen/Qwen3-Next-80B-A3B-Instruct")
SCOUT = get_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
GPT_OSS = get_model("openai/gpt-oss-20b")
PREFIX = EngineConfig().replace(enable_prefix_caching=True, max_model_len=16384)  # vLLM's default: "align"
NO_PREFIX = EngineConfig().replace(enable_prefix_caching=False, max_model_len=16384)  # "none"


def test_qwen3_next_mamba_state():
    assert cap.mamba_state_shapes(QWEN3_NEXT) == ((8192, 3), (32, 128, 128))
    assert cap.mamba_state_shapes(QWEN3_NEXT, 4) == ((2048, 3), (8, 128, 128))
    assert cap.mamba_page_size_bytes(QWEN3_NEXT) == 1_097_728


def test_qwen3_next_attention_block_raised_to_cover_the_state():
    # An attention token is 2 x 2 heads x 256 x 2 B = 2,048 B. "none": multiples of FLASH_ATTN's 16 tokens,
    # 16 x cdiv(1,097,728, 16 x 2,048) = 544. "align": multiples of 64 (FlashInfer's GDN checkpoints), 64 x 9 = 576.
    assert cap.attention_block_size(QWEN3_NEXT, NO_PREFIX) == 544
    assert cap.attention_block_size(QWEN3_NEXT, PREFIX) == 576
    # fp8 halves the attention token, so the block doubles: 64 x cdiv(1,097,728, 64 x 1,024) = 1,088
    assert cap.attention_block_size(QWEN3_NEXT, PREFIX.replace(kv_cache_dtype="fp8")) == 1088
    assert cap.attention_block_size(GPT_OSS, PREFIX) == 16  # no Mamba layer: block_size as given


def test_qwen3_next_groups_and_padded_page():
    groups = cap.kv_cache_groups(QWEN3_NEXT, PREFIX)
    assert [(g.kind, g.block_size, len(g.layers)) for g in groups] == [("mamba", 576, 12)] * 3 + [
        ("full_attention", 576, 12)
    ]
    assert groups[0].layers == tuple(range(0, 48, 4))  # every 3rd linear-attention layer from layer 0
    assert groups[3].layers == tuple(range(3, 48, 4))
    none = cap.kv_cache_groups(QWEN3_NEXT, NO_PREFIX)
    assert [(g.kind, g.block_size) for g in none] == [("mamba", 16384)] * 3 + [("full_attention", 544)]
    # The Mamba page is padded to the attention page: 576 x 2,048 = 1,179,648 B, 12 layers a block
    r = cap.vllm_capacity(QWEN3_NEXT, 20 * 2**30, 4096, PREFIX)
    assert (r["page_size_bytes"], r["bytes_per_block"]) == (1_179_648, 14_155_776)
    # per request: 3 Mamba groups x (2 states + 1 prefill checkpoint) + cdiv(4,096, 576) = 9 + 8
    assert r["blocks_per_request"] == 17
    assert r["num_gpu_blocks"] == 20 * 2**30 // 14_155_776 == 1517
    r = cap.vllm_capacity(QWEN3_NEXT, 20 * 2**30, 4096, NO_PREFIX)
    assert (r["page_size_bytes"], r["blocks_per_request"]) == (1_114_112, 3 + 8)


def test_mamba_padding_or_raise_broken_would_change_the_blocks():
    # Without the raise the attention page (16 x 2,048 B) would not hold a state; without the padding the Mamba
    # page (1,097,728 B) would differ from the attention page. Either changes vLLM's 1,517 blocks.
    raised = cap.attention_block_size(QWEN3_NEXT, PREFIX)
    assert raised * 2048 >= cap.mamba_page_size_bytes(QWEN3_NEXT) > (raised - 64) * 2048
    assert 16 * 2048 < cap.mamba_page_size_bytes(QWEN3_NEXT)  # block_size 16 alone would not hold a state
    assert all(g.block_size == raised for g in cap.kv_cache_groups(QWEN3_NEXT, PREFIX))
    r = cap.vllm_capacity(QWEN3_NEXT, 20 * 2**30, 4096, PREFIX)
    assert r["num_gpu_blocks"] == 1517 and r["page_size_bytes"] == raised * 2048


def test_llama_4_scout_groups():
    groups = cap.kv_cache_groups(SCOUT, PREFIX)
    assert [(g.kind, g.block_size, g.attention_chunk_size, len(g.layers)) for g in groups] == [
        ("chunked_local_attention", 16, 8192, 12)
    ] * 3 + [("full_attention", 16, 0, 12)]
    assert groups[3].layers == tuple(range(3, 48, 4))
    # a chunk and the tokens in flight ((1 + async) x 8,192): cdiv(min(8,192 + 16,384, 16,384), 16) = 1,024 a group
    assert groups[0].blocks_per_request(16384, PREFIX.max_in_flight_tokens) == 1024
    off = cap.kv_cache_groups(SCOUT, PREFIX.replace(hybrid_kv_cache=False))
    assert [(g.kind, len(g.layers)) for g in off] == [("full_attention", 48)]


def test_gpt_oss_20b_groups():
    groups = cap.kv_cache_groups(GPT_OSS)
    assert [(g.kind, g.block_size, g.sliding_window, g.layers[:2]) for g in groups] == [
        ("sliding_attention", 16, 128, (0, 2)),
        ("full_attention", 16, 0, (1, 3)),
    ]


def test_mamba_without_hybrid_manager_is_refused_in_one_line():
    with pytest.raises(ValueError, match="hybrid_kv_cache=False is not allowed") as error:
        cap.kv_cache_groups(QWEN3_NEXT, PREFIX.replace(hybrid_kv_cache=False))
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="must divide"):
        cap.mamba_state_shapes(QWEN3_NEXT, 3)


def test_from_config_reads_what_vllm_reads():
    qwen = {
        "model_type": "qwen3_next",
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_size": 2048,
        "max_position_embeddings": 262144,
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    spec = from_config(qwen, name="Qwen/Qwen3-Next-80B-A3B-Instruct", num_params_b=80.0)
    assert spec.layer_types == QWEN3_NEXT.layer_types
    assert cap.kv_cache_groups(spec, PREFIX) == cap.kv_cache_groups(QWEN3_NEXT, PREFIX)
    text = {
        "model_type": "llama4_text",
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "attention_chunk_size": 8192,
        "no_rope_layers": [],  # transformers' default: every 4th layer NoPE (full attention)
    }
    scout = from_config({"model_type": "llama4", "text_config": text}, name="scout")
    assert scout.layer_types == SCOUT.layer_types and scout.attention_chunk_size == 8192
    with pytest.raises(ValueError, match="linear_conv_kernel_dim") as error:
        from_config({k: v for k, v in qwen.items() if k != "linear_conv_kernel_dim"})
    assert "\n" not in str(error.value)
