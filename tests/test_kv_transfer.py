"""A prompt's KV transfer between a disaggregated deployment's instances (kvlab.core.kv_transfer): hand-checked bytes
and times, whole blocks, a GPU's share under tensor parallelism, one-line refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core.config import EngineConfig
from kvlab.core.kv_transfer import transfer_cost
from kvlab.core.models import get_model

LLAMA = get_model("meta-llama/Llama-3.1-8B-Instruct")


def test_a_llama_8b_prompt_of_1000_tokens_moves_63_blocks_of_2_mib():
    """32 layers x 2 (K, V) x 8 heads x 128 x 2 bytes = 131,072 bytes a token; 1,000 tokens fill 63 blocks of 16:
    132,120,576 bytes, 2.642 ms at 50 GB/s (one 400 Gb/s NIC), 0.2936 ms at NVLink 4's 450 GB/s each way."""
    rdma = transfer_cost(LLAMA, "H100-SXM-80GB", "rdma-400g")
    assert rdma.bytes_per_block == 16 * 131_072 and rdma.num_bytes(1000) == 132_120_576
    assert rdma.transfer_s(1000) == pytest.approx(2.64241152e-3, rel=1e-12)
    node = transfer_cost(LLAMA, "H100-SXM-80GB", "same-node")
    assert node.bandwidth_gb_s == 450 and node.transfer_s(1000) == pytest.approx(2.9360128e-4, rel=1e-12)
    assert "datasheet bound" in rdma.source and "datasheet bound" in node.source


def test_tensor_parallelism_halves_what_one_gpu_moves():
    tp2 = transfer_cost(LLAMA, "H100-SXM-80GB", config=EngineConfig().replace(tensor_parallel_size=2))
    assert tp2.bytes_per_block * 2 == transfer_cost(LLAMA, "H100-SXM-80GB").bytes_per_block


@given(st.integers(1, 100_000))
def test_a_prompt_moves_its_whole_blocks(num_prompt_tokens):
    cost = transfer_cost(LLAMA, "H200-141GB")
    blocks = cost.num_bytes(num_prompt_tokens) / cost.bytes_per_block
    assert blocks == -(-num_prompt_tokens // 16)
    assert cost.transfer_s(num_prompt_tokens) <= cost.transfer_s(num_prompt_tokens + 16)


@pytest.mark.parametrize(
    "model, gpu, link, message",
    [
        (LLAMA, "H100-SXM-80GB", "pigeon", "link='pigeon' is not allowed: must be one of same-node, rdma-400g"),
        (get_model("google/gemma-3-27b-it"), "H100-SXM-80GB", "rdma-400g", "model='google/gemma-3-27b-it' is not"),
        (LLAMA, "H100-PCIe-80GB", "same-node", "gpu='H100-PCIe-80GB' is not allowed: has no row in data/profiles"),
    ],
)
def test_what_kvlab_cannot_time_is_refused_in_one_line(model, gpu, link, message):
    with pytest.raises(ValueError) as caught:
        transfer_cost(model, gpu, link)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
