"""Section 6's setting: the vLLM paper's model, GPU and KV cache (or another), checked as the engine needs it.

NumPy only (no pandas), so that the report's checks (kvlab.sections.shared.parameters) can import it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvlab.core import capacity, models, validate
from kvlab.core.buddy import chunk_order
from kvlab.core.config import EngineConfig
from kvlab.core.cost import RooflineStepCost, Vllm2023StepCost, make_step_cost
from kvlab.core.units import GIB, cdiv

# The paper's setting (§6.1, Table 1): what a run must keep for its section 6 figures to be compared.
PAPER_MODEL, PAPER_GPU, PAPER_KV_CACHE_GIB, PAPER_BLOCK_SIZE = "facebook/opt-13b", "A100-40GB", 12.0, 16
# The step costs a setting may use: the vLLM of 2023 fitted to measurements of it (kvlab.studies.vllm_2023_fit), or
# kvlab's roofline of the model on the GPU (a lower bound).
SETTING_STEP_COSTS = {
    "vllm-2023": "vLLM 2023's step, fitted to Anyscale's June 2023 benchmark and the paper's Fig. 18a",
    "roofline": "kvlab's roofline of the model on the GPU (a lower bound on the step)",
}
# vLLM 0.33's scheduler and its default step budget (the engine's own, beside the paper's of 2023).
TODAY = {"scheduler_cls": "v1", "max_num_batched_tokens": 8192}
# The measured GPU whose sustained fractions today's step cost of the paper's A100-40GB borrows (the same GA100 chip).
TODAY_FRACTIONS_GPU = {"A100-40GB": "A100-SXM-80GB"}
SCHEDULERS = {
    "v0-2023": "vLLM 0.1.4's scheduler (mid-2023; the paper names no version): prefill steps apart from decode steps",
    "v1": "vLLM 0.33's scheduler, synchronous: prefill chunks and decodes share a step's token budget",
}


@dataclass(frozen=True)
class PaperSetting:
    """A model on one GPU with a KV cache of kv_cache_gib GiB, served by vLLM's scheduler: the paper's by default."""

    model: str = PAPER_MODEL
    gpu: str = PAPER_GPU
    kv_cache_gib: float = PAPER_KV_CACHE_GIB
    block_size: int = PAPER_BLOCK_SIZE
    max_model_len: int = 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2560  # vLLM 0.1.4's default (0.33's: 8192)
    scheduler_cls: str = "v0-2023"
    step_cost: str = "vllm-2023"  # the step cost's family (SETTING_STEP_COSTS)

    def __post_init__(self):
        spec = models.get_model(self.model)
        models.get_gpu(self.gpu)
        validate.one_of("scheduler_cls", self.scheduler_cls, SCHEDULERS)
        validate.one_of("step_cost", self.step_cost, SETTING_STEP_COSTS)
        validate.in_range("kv_cache_gib", self.kv_cache_gib, "memory_gib")
        validate.in_range("block_size", self.block_size, "block_size")
        validate.in_range("max_model_len", self.max_model_len, "tokens")
        if spec.max_position_embeddings and self.max_model_len > spec.max_position_embeddings:
            validate.fail(
                "max_model_len",
                self.max_model_len,
                f"must be at most {spec.name}'s max_position_embeddings ({spec.max_position_embeddings:,})",
            )
        self.config()  # the scheduler's own checks

    def replace(self, **changes) -> PaperSetting:
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)

    @property
    def model_spec(self) -> models.ModelSpec:
        """The model's KV shape and size."""
        return models.get_model(self.model)

    @property
    def gpu_spec(self) -> models.GpuSpec:
        """The GPU's memory, bandwidth and FLOP/s."""
        return models.get_gpu(self.gpu)

    def config(self, block_size: int | None = None, enable_prefix_caching: bool = False) -> EngineConfig:
        """The engine's settings: synchronous scheduling by scheduler_cls (v0-2023: without chunked prefill, which
        the vLLM of 2023 did not have)."""
        v0 = self.scheduler_cls == "v0-2023"
        return EngineConfig().replace(
            async_scheduling=False,
            block_size=block_size or self.block_size,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
            scheduler_cls=self.scheduler_cls,
            enable_chunked_prefill=not v0,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token of the model (bf16 cache)."""
        return int(capacity.kv_bytes_per_token(self.model_spec, self.config()))

    def num_gpu_blocks(self, block_size: int | None = None, kv_cache_gib: float | None = None) -> int:
        """Blocks of block_size tokens the KV cache holds, plus vLLM's null block."""
        bs = block_size or self.block_size
        gib = self.kv_cache_gib if kv_cache_gib is None else kv_cache_gib
        return int(gib * GIB // (self.kv_bytes_per_token * bs)) + 1

    def pool_tokens(self, block_size: int | None = None, kv_cache_gib: float | None = None) -> int:
        """Token slots of the usable blocks: (num_gpu_blocks - 1) x block_size."""
        bs = block_size or self.block_size
        return (self.num_gpu_blocks(bs, kv_cache_gib) - 1) * bs

    def cost(self, block_size: int | None = None) -> Vllm2023StepCost | RooflineStepCost:
        """The step cost: vLLM 2023's with its PagedAttention at block_size (the fit's coefficients on this model
        and GPU), or the roofline."""
        return make_step_cost(self.step_cost, model=self.model_spec, gpu=self.gpu_spec, config=self.config(block_size))

    def check_fits(self, name: str = "kv_cache_gib", kv_cache_gib: float | None = None) -> None:
        """One request of max_model_len must fit the pool's largest buddy arena (else Orca (Max) could start
        nothing): the pool holds at least the next power of two of max_model_len token slots."""
        gib = self.kv_cache_gib if kv_cache_gib is None else kv_cache_gib
        chunk = 1 << chunk_order(self.max_model_len)
        if self.pool_tokens(kv_cache_gib=gib) < chunk:
            need = (cdiv(chunk, self.block_size) + 1) * self.block_size * self.kv_bytes_per_token / GIB
            validate.fail(
                name,
                gib,
                f"holds {self.pool_tokens(kv_cache_gib=gib):,} token slots, fewer than one "
                f"request of max_model_len={self.max_model_len:,} tokens needs (a buddy chunk of {chunk:,}; "
                f"at least {need:.2f} GiB)",
            )

    @property
    def is_papers(self) -> bool:
        """True when the model, GPU, KV cache and block size are the paper's (its figures can be compared)."""
        return (self.model, self.gpu, self.kv_cache_gib, self.block_size) == (
            PAPER_MODEL,
            PAPER_GPU,
            PAPER_KV_CACHE_GIB,
            PAPER_BLOCK_SIZE,
        )


def prefix_setting(model: str, gpu: str) -> tuple[EngineConfig, EngineConfig, int, RooflineStepCost]:
    """The engine for the prefix-caching runs: the model's own max_model_len, the pool vLLM 0.33 sizes on the GPU
    (kvlab.core.capacity.plan_capacity), caching off and on, and the roofline cost."""
    spec, device = models.get_model(model), models.get_gpu(gpu)
    max_len = spec.max_position_embeddings
    off = EngineConfig().replace(async_scheduling=False, max_model_len=max_len)
    planned = capacity.plan_capacity(spec, device.memory_gib, max_len, off)
    if planned is None or not planned["starts"]:
        validate.fail(
            "PREFIX_GPU",
            gpu,
            f"cannot hold one request of {max_len:,} tokens of {spec.name} (kvlab.core.capacity.plan_capacity)",
        )
    return (
        off,
        off.replace(enable_prefix_caching=True),
        planned["num_gpu_blocks"],
        RooflineStepCost.from_specs(spec, device, off),
    )
