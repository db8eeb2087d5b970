"""kvlab against vLLM 0.33's own sizing code, one case per rule where kvlab used to differ (no vLLM needed).

Every expected figure was computed by vLLM 0.33.0 itself (scripts/parity/vllm_capacity.py: vLLM's layer
classes and sizing functions on the CPU, as on an H100); `make parity` recomputes them with the whole grid
and writes data/parity/. Memory is KV-cache bytes per GPU; block size 16, bf16 unless said.
"""

import json
from pathlib import Path

import pytest

from kvlab.core import capacity as cap
from kvlab.core import models
from kvlab.core.config import EngineConfig

GIB = 2**30
CONFIGS = Path(__file__).parent / "data" / "configs"


def fixture(name: str, **changes):
    """A config.json fixture as kvlab reads it, with fields changed (e.g. layer_types)."""
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    return models.from_config({**config, **changes}, name=name)


GEMMA2 = fixture("gemma-2-9b-it")
GEMMA3 = fixture("gemma-3-27b-it")
MISTRAL = fixture("mistral-7b-v0.1")
PHI3 = fixture("phi-3-mini-4k-instruct")
LLAMA = fixture("llama-3.1-8b-instruct")
# Gemma 2 with 25 layers, 12 sliding and 13 full: no repeating pattern, and under vLLM's 1.5x rule
GEMMA2_12_13 = fixture(
    "gemma-2-9b-it",
    num_hidden_layers=25,
    layer_types=["sliding_attention" if i % 2 == 0 and i < 24 else "full_attention" for i in range(25)],
)
# Llama 3.1 8B with full attention on layers 0, 4, 8, ... and a 1,024-token window on the others
LLAMA_1FULL_3SW = fixture(
    "llama-3.1-8b-instruct",
    sliding_window=1024,
    layer_types=["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(32)],
)

# (what it shows, model, memory, max_model_len, settings,
#  vLLM's num_gpu_blocks, blocks per request, "GPU KV cache size" tokens, maximum concurrency)
STARTS = [
    # the token figure is int(num_blocks / R x max_model_len), not blocks x block size
    ("tokens: Gemma 2", GEMMA2, 20 * GIB, 4096, {}, 7801, 513, 62286, 15.206627680311891),
    ("tokens: Gemma 3", GEMMA3, 20 * GIB, 4096, {}, 16384, 1798, 37324, 9.112347052280311),
    ("tokens: Mistral", MISTRAL, 20 * GIB, 4096, {}, 10240, 257, 163202, 39.8443579766537),
    ("tokens: Phi-3 mini", PHI3, 20 * GIB, 4096, {}, 3413, 257, 54395, 13.280155642023347),
    ("tokens: Llama off the block grid", LLAMA, 20 * GIB, 4100, {}, 10240, 257, 163361, 39.8443579766537),
    ("tokens: Llama on the block grid", LLAMA, 20 * GIB, 4096, {}, 10240, 256, 163840, 40.0),
    # ... computed in floats: 5,851 / 1,250 x 20,000 lands just below 93,616 = 5,851 x 16 and truncates
    (
        "tokens: float product, Qwen2.5 7B",
        fixture("qwen2.5-7b-instruct"),
        5 * GIB,
        20000,
        {},
        5851,
        1250,
        93615,
        4.6808,
    ),
    (
        "tokens: float product, Llama 3.1 70B",
        models.get_model("Llama-3.1-70B-Instruct"),
        60 * GIB,
        20000,
        {},
        12288,
        1250,
        196607,
        9.8304,
    ),
    # a window keeps window - 1 + (PP + 1) x max_num_batched_tokens tokens with async scheduling, PP x without
    (
        "in flight: Gemma 2, async",
        GEMMA2,
        20 * GIB,
        8192,
        {"max_num_batched_tokens": 2048},
        7801,
        1025,
        62347,
        7.610731707317073,
    ),
    (
        "in flight: Gemma 2, no async",
        GEMMA2,
        20 * GIB,
        8192,
        {"max_num_batched_tokens": 2048, "async_scheduling": False},
        7801,
        897,
        71243,
        8.696767001114827,
    ),
    (
        "in flight: Mistral, async",
        MISTRAL,
        20 * GIB,
        32768,
        {"max_num_batched_tokens": 2048},
        10240,
        513,
        654082,
        19.96101364522417,
    ),
    (
        "in flight: Mistral, no async",
        MISTRAL,
        20 * GIB,
        32768,
        {"max_num_batched_tokens": 2048, "async_scheduling": False},
        10240,
        385,
        871543,
        26.5974025974026,
    ),
    (
        "in flight: Gemma 3, long",
        GEMMA3,
        20 * GIB,
        32768,
        {"max_num_batched_tokens": 2048},
        16384,
        3974,
        135095,
        4.122798188223452,
    ),
    # pipeline parallelism: the whole model grouped once, each stage's block its largest share of a group
    (
        "PP: Gemma 2 at PP 2",
        GEMMA2,
        20 * GIB,
        4096,
        {"max_num_batched_tokens": 2048, "pipeline_parallel_size": 2},
        14894,
        513,
        118919,
        29.033138401559455,
    ),
    (
        "PP: Gemma 3 at PP 4",
        GEMMA3,
        20 * GIB,
        4096,
        {"max_num_batched_tokens": 2048, "pipeline_parallel_size": 4},
        54613,
        1798,
        124413,
        30.374304783092324,
    ),
    # one block more than one request's memory: vLLM starts
    ("fit: Llama, one request + one block", LLAMA, 257 * 2 * 2**20, 4096, {}, 257, 256, 4112, 1.00390625),
    # the hybrid manager off (vLLM without CUDA, or --disable-hybrid-kv-cache-manager): one group of full layers
    ("hybrid off: Gemma 2", GEMMA2, 20 * GIB, 4096, {"hybrid_kv_cache": False}, 3900, 256, 62400, 15.234375),
    ("hybrid off: Gemma 3", GEMMA3, 20 * GIB, 32768, {"hybrid_kv_cache": False}, 2642, 2048, 42272, 1.2900390625),
    # group size: the larger bucket (13) when it is under 1.5 x the smaller (12)
    (
        "1.5x rule: 12 window + 13 full",
        GEMMA2_12_13,
        20 * GIB,
        4096,
        {"max_num_batched_tokens": 2048},
        12603,
        513,
        100627,
        24.567251461988302,
    ),
    # config.json layer_types with full layers first and no repeating pattern
    (
        "layer_types: Llama 1 full : 3 window",
        LLAMA_1FULL_3SW,
        20 * GIB,
        32768,
        {"max_num_batched_tokens": 2048},
        40960,
        3011,
        445757,
        13.603454001992693,
    ),
    # the attention backend: CPU_ATTN's kernel blocks are multiples of 32, so window layers take 32-token blocks
    # and the full layers' blocks grow to match
    (
        "backend: Gemma 2 on CPU_ATTN",
        GEMMA2,
        20 * GIB,
        8192,
        {"max_num_batched_tokens": 2048, "attention_backend": "CPU_ATTN"},
        3900,
        513,
        62278,
        7.60233918128655,
    ),
]


@pytest.mark.parametrize(
    "what,model,memory,length,settings,blocks,per_request,tokens,concurrency", STARTS, ids=[case[0] for case in STARTS]
)
def test_kvlab_computes_what_vllm_computes(
    what, model, memory, length, settings, blocks, per_request, tokens, concurrency
):
    result = cap.vllm_capacity(model, memory, length, EngineConfig().replace(**settings))
    assert result["starts"] and result["refusal"] is None
    assert (result["num_gpu_blocks"], result["blocks_per_request"]) == (blocks, per_request)
    assert result["gpu_kv_cache_tokens"] == tokens
    assert result["max_concurrency"] == concurrency  # the same float


def test_pipeline_stages_share_the_whole_models_groups():
    """Gemma 2 at PP 2: the window group is layers 0, 2, ..., 40 and the full group 1, 3, ..., 41; stage 0
    (layers 0-20) holds 11 window layers, stage 1 (21-41) 11 full ones: 11 pages per block on both."""
    config = EngineConfig().replace(pipeline_parallel_size=2)
    groups = cap.kv_cache_groups(GEMMA2, config)
    assert [(g.kind, g.layers[:3], len(g.layers)) for g in groups] == [
        ("sliding_attention", (0, 2, 4), 21),
        ("full_attention", (1, 3, 5), 21),
    ]
    result = cap.vllm_capacity(GEMMA2, 20 * GIB, 4096, config)
    assert (result["bytes_per_block"], result["layers_per_group"]) == (1441792, 11)
    gemma3 = cap.vllm_capacity(GEMMA3, 20 * GIB, 4096, config.replace(pipeline_parallel_size=4))
    assert (gemma3["num_kv_cache_groups"], gemma3["bytes_per_block"]) == (7, 393216)


def test_in_flight_tokens_follow_pipeline_and_async_scheduling():
    config = EngineConfig().replace(max_num_batched_tokens=2048, pipeline_parallel_size=2)
    assert (config.max_concurrent_batches, config.max_in_flight_tokens) == (3, 6144)
    off = config.replace(async_scheduling=False)
    assert (off.max_concurrent_batches, off.max_in_flight_tokens) == (2, 4096)


# (what it shows, model, memory, max_model_len, settings, vLLM's message figures: GiB needed, GiB available,
#  estimated maximum model length)
REFUSALS = [
    ("exactly one request: Llama", LLAMA, 256 * 2 * 2**20, 4096, {}, "0.5", "0.5", 4080),
    (
        "exactly one request: Gemma 2",
        GEMMA2,
        513 * 2752512,
        4096,
        {"max_num_batched_tokens": 2048},
        "1.32",
        "1.31",
        4080,
    ),
    (
        "exactly one request: Llama 2 fp8",
        models.get_model("Llama-2-7b-hf"),
        GIB,
        4096,
        {"kv_cache_dtype": "fp8"},
        "1.0",
        "1.0",
        4080,
    ),
    ("window in flight: Mistral", MISTRAL, GIB, 32768, {"max_num_batched_tokens": 2048}, "1.0", "1.0", 8160),
    (
        "window in flight: Gemma 3 fp8",
        GEMMA3,
        GIB,
        4096,
        {"max_num_batched_tokens": 2048, "kv_cache_dtype": "fp8"},
        "1.1",
        "1.0",
        3728,
    ),
]


@pytest.mark.parametrize(
    "what,model,memory,length,settings,needed,available,estimate", REFUSALS, ids=[case[0] for case in REFUSALS]
)
def test_vllm_refuses_where_kvlab_refuses(what, model, memory, length, settings, needed, available, estimate):
    """vLLM keeps one block back before checking that one request fits, so exactly one request's memory is
    refused; the refusal names vLLM's figures (its GiB rounding) and its estimated maximum model length."""
    result = cap.vllm_capacity(model, memory, length, EngineConfig().replace(**settings))
    assert not result["starts"]
    assert result["estimated_max_model_len"] == estimate
    assert f"one request of {length:,} tokens needs {needed} GiB of KV cache" in result["refusal"]
    assert f"more than the {available} GiB left once vLLM keeps one block back" in result["refusal"]
    assert result["refusal"].endswith(f"the longest max_model_len that fits is {estimate:,} tokens")
    assert "\n" not in result["refusal"] and cap.vllm_log_lines(result)[1:] == []


def test_refusal_names_the_pipeline_stage():
    result = cap.vllm_capacity(
        GEMMA2, [20 * GIB, 2 * 2752512 // 2], 4096, EngineConfig().replace(pipeline_parallel_size=2)
    )
    assert not result["starts"] and "on pipeline stage 1" in result["refusal"]


def test_sliding_window_block_size_per_backend():
    """vLLM's _largest_kernel_block_within: the largest kernel block within block_size tokens, else the smallest."""
    assert cap.sliding_window_block_size(16, "FLASH_ATTN") == 16
    assert cap.sliding_window_block_size(8, "FLASH_ATTN") == 16  # MultipleOf(16): at least 16
    assert cap.sliding_window_block_size(48, "FLASH_ATTN") == 48
    assert cap.sliding_window_block_size(16, "CPU_ATTN") == 32
    assert cap.sliding_window_block_size(48, "FLASHINFER") == 32  # fixed sizes 16, 32, 64
    assert cap.sliding_window_block_size(128, "FLASHINFER") == 64
    assert EngineConfig().replace(kv_cache_dtype="int4").cache.backend == "FLASHINFER"  # vLLM's nvfp4 backend
    assert EngineConfig().replace(kv_cache_dtype="int8").cache.backend == "TRITON_ATTN"
    with pytest.raises(ValueError, match="attention_backend='FLASH' is not allowed: must be one of None, FLASH_ATTN"):
        EngineConfig().replace(attention_backend="FLASH")


def test_a_window_page_that_does_not_divide_is_padded():
    """FLASHINFER at block size 48: window layers take 32-token blocks whose page is padded to the full layers'
    48-token page (unify_kv_cache_spec_page_size), so a window group counts its blocks in 32 tokens."""
    config = EngineConfig().replace(block_size=48, attention_backend="FLASHINFER", max_num_batched_tokens=2048)
    groups = cap.kv_cache_groups(GEMMA2, config)
    assert sorted((g.kind, g.block_size) for g in groups) == [("full_attention", 48), ("sliding_attention", 32)]
    result = cap.vllm_capacity(GEMMA2, 20 * GIB, 8192, config)
    assert result["page_size_bytes"] == 48 * 2 * 8 * 256 * 2 == 393216
    assert result["blocks_per_request"] == -(-8192 // 48) + -(-min(4095 + 2 * 2048, 8192) // 32) + 1
    # vLLM 0.33: 2,600 blocks, R 428, 49,764 tokens
    assert (result["num_gpu_blocks"], result["blocks_per_request"], result["gpu_kv_cache_tokens"]) == (2600, 428, 49764)
    assert result["max_concurrency"] == 6.074766355140187
