"""How long a request's KV takes from a disaggregated deployment's prefill instance to its decode instance: NIXL's read
of the prompt's blocks (kvlab.core.engine.kv_connector's KVTransfers.load_s, and the prefill instance's hold).

Bytes: the whole blocks of the prompt, every layer of a GPU's stage (kvlab.core.capacity, vLLM's page sizes); with
tensor parallelism each GPU reads its own share from its peer at the same rank, in parallel, so a transfer moves one
GPU's bytes over one GPU's link. Time: those bytes at the link's datasheet bandwidth, each way. kvlab has no measured
transfer table, so this is a lower bound (no per-transfer latency, no protocol overhead), labelled as such wherever it
is used (TransferCost.source).

Links (LINKS):
- "same-node": prefill and decode on one node, over the GPUs' own link (data/profiles/interconnects.csv: NVLink
  through NVSwitch on HGX and DGX nodes, PCIe elsewhere);
- "rdma-400g": across nodes, one 400 Gb/s NIC a GPU (50 GB/s each way: NVIDIA ConnectX-7, InfiniBand NDR or RoCE,
  as DGX H100, H200 and B200 nodes carry one a GPU for their compute fabric).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core import validate
from kvlab.core.capacity import attention_block_size, engine_kv_cache_groups, kv_bytes_per_token
from kvlab.core.config import EngineConfig
from kvlab.core.profiles import interconnect

RDMA_400G_GB_S = 400 / 8  # GB/s each way of one 400 Gb/s port
RDMA_400G_SOURCE = (
    "https://www.nvidia.com/en-us/networking/ethernet/connectx-7/ (datasheet: ConnectX-7, up to 400 Gb/s a port); "
    "one a GPU in DGX H100, H200 and B200 nodes"
)
LINKS = ("same-node", "rdma-400g")


@dataclass(frozen=True)
class TransferCost:
    """A prompt's KV transfer between instances: block_size tokens a block, bytes_per_block on one GPU (every layer
    of its stage), over a link of bandwidth_gb_s each way (10^9 bytes a second); source says where the bandwidth
    comes from."""

    block_size: int
    bytes_per_block: int | float
    bandwidth_gb_s: float
    link: str
    source: str

    def num_bytes(self, num_prompt_tokens: int) -> float:
        """Bytes one GPU reads for a prompt of num_prompt_tokens tokens: its whole blocks."""
        return -(-num_prompt_tokens // self.block_size) * self.bytes_per_block

    def transfer_s(self, num_prompt_tokens: int) -> float:
        """Seconds the read takes at the link's bandwidth (a lower bound: no latency, no overhead)."""
        return self.num_bytes(num_prompt_tokens) / (self.bandwidth_gb_s * 1e9)


def transfer_cost(model, gpu: str, link: str = "rdma-400g", config: EngineConfig = EngineConfig()) -> TransferCost:
    """The transfer cost of the model's KV (its KV cache dtype, tensor and pipeline parallel sizes: config's) between
    two instances on GPUs of this kind over the link (LINKS). A hybrid model's groups (windows, Mamba states) move
    other blocks than a prompt's whole length, which kvlab does not count yet: refused in one line."""
    validate.one_of("link", link, LINKS)
    if engine_kv_cache_groups(model, config) is not None:
        validate.fail(
            "model",
            model.name,
            "has KV cache groups beyond one of full attention (windows, chunks or Mamba states), whose transfer "
            "kvlab does not count yet: choose a model of full-attention layers",
        )
    if link == "same-node":
        joined = interconnect(gpu)
        if joined is None:
            validate.fail("gpu", gpu, "has no row in data/profiles/interconnects.csv: use link='rdma-400g'")
        bandwidth, source = joined.bandwidth_gb_s, f"{joined.interconnect}, datasheet bound (interconnects.csv)"
    else:
        bandwidth, source = RDMA_400G_GB_S, f"one 400 Gb/s NIC a GPU, datasheet bound ({RDMA_400G_SOURCE})"
    block_size = attention_block_size(model, config)
    return TransferCost(block_size, block_size * kv_bytes_per_token(model, config), bandwidth, link, source)
