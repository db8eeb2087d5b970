"""kvlab against what vLLM printed in public issues, with the source of each log named.

vLLM logs "Available KV cache memory: X GiB" rounded to 0.01 GiB, so the exact budget is only known
to +-0.005 GiB. Each test checks three things:
1. a budget inside the logged X +- 0.005 GiB gives exactly the logged block count (kvlab's
   page size and layers agree with vLLM's);
2. with that budget kvlab prints exactly vLLM's "GPU KV cache size" and "Maximum concurrency";
3. from the rounded X alone, kvlab's block count is within the rounding (the report's "how close").
"""

from dataclasses import dataclass, field
from math import ceil

import pytest

from kvlab.core import capacity as cap
from kvlab.core import models
from kvlab.core.config import EngineConfig

GIB = 2**30


@dataclass(frozen=True)
class VllmLog:
    source: str
    model: str
    max_model_len: int
    num_gpu_blocks: int
    concurrency: str  # as printed, "%.2f"
    available_gib: float | None = None  # as printed, None where the log does not show it
    tokens: int | None = None  # "GPU KV cache size", where printed
    config: dict = field(default_factory=dict)
    # vLLM 0.6's "maximum number of tokens that can be stored in KV cache", blocks x block size: a figure
    # vLLM 0.33 no longer prints (its "GPU KV cache size" is int(blocks / blocks per request x max_model_len))
    stored_tokens: int | None = None


LOGS = [
    VllmLog(
        "vllm-project/vllm#10517 (RTX 3090, vLLM 0.6, --max-model-len 20000: kv_cache_size=3.81GiB, "
        "# GPU blocks: 1952, Maximum concurrency for 20000 tokens per request: 1.56x)",
        "meta-llama/Llama-3.1-8B-Instruct",
        20000,
        1952,
        "1.56",
        available_gib=3.81,
    ),
    VllmLog(
        "vllm-project/vllm#10517 (RTX 3090, vLLM 0.6, --max-model-len 29000: kv_cache_size=2.89GiB, "
        "# GPU blocks: 1478, 0.82x, 'maximum number of tokens that can be stored in KV cache (23648)')",
        "meta-llama/Llama-3.1-8B-Instruct",
        29000,
        1478,
        "0.82",
        available_gib=2.89,
        stored_tokens=23648,
    ),
    VllmLog(
        "LMCache/LMCache#1739 (Qwen3-14B, one GPU, vLLM v1: Available KV cache memory: 6.51 GiB, "
        "GPU KV cache size: 42,656 tokens, Maximum concurrency for 32,768 tokens per request: 1.30x)",
        "Qwen/Qwen3-14B",
        32768,
        2666,
        "1.30",
        available_gib=6.51,
        tokens=42656,
    ),
    VllmLog(
        "vllm-project/vllm#25350 (--kv-cache-dtype fp8 --max-model-len 100000: Available KV cache memory: "
        "10.55 GiB, GPU KV cache size: 230,528 tokens, 2.31x; the issue does not name the model: 48 KiB per "
        "token at fp8 is Qwen3-30B-A3B's 48 layers x 4 KV heads x 128, used here)",
        "Qwen/Qwen3-30B-A3B",
        100000,
        14408,
        "2.31",
        available_gib=10.55,
        tokens=230528,
        config={"kv_cache_dtype": "fp8"},
    ),
    VllmLog(
        "vllm-project/vllm#15676 (gemma-3-27b-it, --tensor-parallel-size 2, vLLM 0.8.2 before the hybrid "
        "manager: GPU KV cache size: 54,048 tokens, Maximum concurrency for 4,096 tokens per request: 13.20x)",
        "google/gemma-3-27b-it",
        4096,
        3378,
        "13.20",
        tokens=54048,
        config={"tensor_parallel_size": 2, "hybrid_kv_cache": False},
    ),
]


def _unit_bytes(log: VllmLog) -> int:
    """Bytes of one block over the layers that share it (vLLM's page size x the largest group's layers)."""
    spec = models.get_model(log.model)
    config = EngineConfig().replace(**log.config)
    return cap.vllm_capacity(spec, 10**15, log.max_model_len, config)["bytes_per_block"]


@pytest.mark.parametrize("log", LOGS, ids=lambda log: log.source.split(" ")[0])
def test_kvlab_prints_what_vllm_printed(log):
    spec, config = models.get_model(log.model), EngineConfig().replace(**log.config)
    unit = _unit_bytes(log)
    budget = log.num_gpu_blocks * unit  # the smallest budget that holds exactly the logged blocks
    if log.available_gib is not None:  # 1. that budget range meets the logged GiB range
        low, high = (log.available_gib - 0.005) * GIB, (log.available_gib + 0.005) * GIB
        assert budget < high and budget + unit > low
        budget = max(budget, low)
    result = cap.vllm_capacity(spec, budget, log.max_model_len, config)
    assert result["num_gpu_blocks"] == log.num_gpu_blocks  # 2. the same blocks, tokens and concurrency
    assert result["gpu_kv_cache_tokens"] == log.tokens or log.tokens is None
    assert result["num_gpu_blocks"] * config.cache.block_size == log.stored_tokens or log.stored_tokens is None
    assert f"{result['max_concurrency']:.2f}" == log.concurrency
    if log.available_gib is not None:  # 3. from the printed GiB alone, off by at most the rounding
        rounded = cap.vllm_capacity(spec, log.available_gib * GIB, log.max_model_len, config)
        assert abs(rounded["num_gpu_blocks"] - log.num_gpu_blocks) <= ceil(0.005 * GIB / unit)


def test_deepseek_v2_lite_mla_tp2_pp2():
    """vllm-project/vllm#20665: DeepSeek-V2-Lite, --tensor-parallel-size 2 --pipeline-parallel-size 2,
    --max-model-len 1024: ranks 0-1 'Available KV cache memory: 12.13 GiB', ranks 2-3 '11.33 GiB',
    'GPU KV cache size: 807,792 tokens', 'Maximum concurrency for 1,024 tokens per request: 788.86x'."""
    spec = models.get_model("deepseek-ai/DeepSeek-V2-Lite")
    config = EngineConfig().replace(tensor_parallel_size=2, pipeline_parallel_size=2)
    # MLA: 512 + 64 values x 2 B per token and layer, not split by TP; stage 0 holds 14 of 27 layers
    assert cap.page_size_bytes(spec, config) == 16 * 576 * 2
    unit = 16 * 576 * 2 * 14
    stage0 = 807792 // 16 * unit
    assert (12.13 - 0.005) * GIB < stage0 + unit and stage0 < (12.13 + 0.005) * GIB
    result = cap.vllm_capacity(spec, [stage0, 11.33 * GIB], 1024, config)
    assert result["layers_per_group"] == 14  # the 14-layer stage binds though the other has less memory
    assert result["gpu_kv_cache_tokens"] == 807792
    assert f"{result['max_concurrency']:.2f}" == "788.86"
    rounded = cap.vllm_capacity(spec, [12.13 * GIB, 11.33 * GIB], 1024, config)
    assert abs(rounded["gpu_kv_cache_tokens"] - 807792) <= 16 * ceil(0.005 * GIB / unit)


@pytest.mark.parametrize("non_torch_gib,printed", [(0.34, "0.13"), (0.43, "0.04"), (0.38, "0.09")])
def test_budget_qwen2_5_vl_72b_tp4_a100_40gb(non_torch_gib, printed):
    """vllm-project/vllm#16570 (Qwen2.5-VL-72B, 4 x A100 40GB, vLLM 0.8.3), one line per rank: 'total_gpu_memory
    (39.38GiB) x gpu_memory_utilization (0.95) = 37.41GiB; model weights take 34.43GiB; non_torch_memory takes
    0.34GiB; PyTorch activation peak memory takes 2.51GiB; the rest of the memory reserved for KV Cache is 0.13GiB'."""
    available = cap.available_kv_cache_bytes(39.38, 34.43, 0.95, 2.51, non_torch_gib)
    assert f"{available / GIB:.2f}" == printed


@pytest.mark.parametrize("peak_torch_gib,printed", [(17.06, "3.81"), (17.98, "2.89")])
def test_budget_llama_3_1_8b_rtx_3090(peak_torch_gib, printed):
    """vllm-project/vllm#10517: 'Loading model weights took 14.9888 GB; total_gpu_memory=23.58GiB
    peak_torch_memory=17.06GiB (17.98GiB at 29k) non_torch_memory=0.35GiB kv_cache_size=3.81GiB (2.89GiB)
    gpu_memory_utilization=0.90'; the activation peak is peak torch memory less the weights."""
    weights = 14.9888
    available = cap.available_kv_cache_bytes(23.58, weights, 0.90, peak_torch_gib - weights, 0.35)
    assert f"{available / GIB:.2f}" == printed
    gpu = models.get_gpu("RTX-3090-24GB")
    assert gpu.memory_gib == 23.58
