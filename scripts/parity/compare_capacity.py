#!/usr/bin/env python
"""make parity, capacity: kvlab's KV-cache sizing against vLLM 0.33's own sizing code, case by case.

    .venv/bin/python scripts/parity/compare_capacity.py --vllm-python .venv-vllm/bin/python [--out data/parity]

1. Builds the grid: every model of tests/data/configs and data/models.csv (each row written out as a
   config.json vLLM reads) and two synthetic layouts no catalog model has, each under several memory sizes
   (1, 5, 20, 60 GiB; exactly one request's memory, which vLLM refuses; one block more, which it accepts),
   bf16 and fp8 KV caches, max_model_len on and off the 16-token block grid, max_num_batched_tokens below
   and above max_model_len, async scheduling on (vLLM's default) and off, tensor parallel sizes 1-8,
   pipeline parallel sizes 1-4 (one budget for every stage, or one per stage), block sizes 16, 32, 48
   and 64, the hybrid KV-cache manager off, the CPU_ATTN and FLASHINFER attention backends, int8/int4
   caches (vLLM's int8_per_token_head, nvfp4), and, for mixture-of-experts models, 2 and 4 data-parallel
   ranks with expert parallelism and without (each rank's KV cache sized alone).
2. Runs scripts/parity/vllm_capacity.py on it with --vllm-python (vLLM's layer classes build each
   layer's spec on the CPU; its sizing functions run in EngineCore's order).
3. Runs kvlab.core.capacity.vllm_capacity on the same cases: the same model, settings and bytes (for the
   one-request boundary, the bytes vLLM computed), and compares num_gpu_blocks, the "GPU KV cache size"
   token figure, the maximum concurrency (as floats, exactly), whether vLLM starts, and, where it
   refuses, the figures of its refusal (GiB needed, GiB available, estimated maximum model length); and
   the weights one GPU holds: vLLM's model class built on the meta device at the case's TP, DP and expert
   parallelism, its parameters' bytes, against kvlab's estimate, where kvlab counts the model's every
   parameter (fixture and synthetic configs) at TP 1; at TP > 1 kvlab's error is reported, not compared.
4. Writes data/parity/capacity_summary.csv (one row per model), capacity_differences.csv (every case
   and figure that differs, with the reason) and capacity_run.json (versions, counts, seconds).

Exit status 0 only when every case is identical. --vllm-output OUT.json compares an earlier vLLM run
instead of running vLLM (for checking kvlab changes quickly); --keep DIR keeps vLLM's IN/OUT.json.
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kvlab.core.capacity import vllm_capacity  # noqa: E402
from kvlab.core.config import EngineConfig  # noqa: E402
from kvlab.core.models import from_config, get_model, load_models, weights_bytes_per_gpu  # noqa: E402

FIXTURES = ROOT / "tests" / "data" / "configs"
VLLM_SCRIPT = ROOT / "scripts" / "parity" / "vllm_capacity.py"
GIB = 2**30

# ---------------------------------------------------------------- models
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "opt": "OPTForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "llama4": "Llama4ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
}
FAMILIES = (
    ("gpt-oss", "gpt-oss"),
    ("gemma-2", "Gemma 2"),
    ("gemma2", "Gemma 2"),
    ("gemma-3", "Gemma 3"),
    ("llama", "Llama"),
    ("mistral", "Mistral"),
    ("mixtral", "Mistral"),
    ("qwen", "Qwen"),
    ("phi", "Phi"),
    ("deepseek", "DeepSeek"),
    ("opt", "OPT"),
    ("neox", "GPT-NeoX"),
)


# gpt-oss's YaRN rope scaling (openai/gpt-oss-20b's config.json), shared by the fixture and the catalog's row
GPT_OSS_ROPE_SCALING = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def catalog_config(row: dict) -> dict:
    """A config.json for one models.csv row: the row's KV-cache fields, and weight shapes (which the KV cache
    does not depend on) that vLLM's model classes split for any tensor size up to 8."""
    kind = row["model_type"]
    heads, head_dim = int(row["num_attention_heads"]), int(row["head_dim"])
    hidden = heads * head_dim if row["attention"] != "mla" else 128 * heads
    config = {
        "architectures": [ARCHITECTURES[kind]],
        "model_type": kind,
        "num_hidden_layers": int(row["num_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(row["num_kv_heads"]),
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "max_position_embeddings": int(row["max_position_embeddings"]),
        "vocab_size": 32768,
        "torch_dtype": "bfloat16",
        "head_dim": head_dim,
    }
    window = int(row["sliding_window"])
    if kind in ("opt", "gpt_neox"):  # these derive head_dim = hidden_size / heads
        del config["head_dim"]
    if kind == "opt":
        config.update(ffn_dim=4 * hidden, word_embed_proj_dim=hidden)
    if kind == "mixtral":
        config.update(num_local_experts=8, num_experts_per_tok=2)
    if kind == "qwen3_moe":
        config.update(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)
    if kind in ("qwen2", "qwen3", "qwen3_moe"):
        config.update(use_sliding_window=False, sliding_window=None)
    if kind in ("mistral", "phi3") and window:
        config["sliding_window"] = window
    if kind == "gemma2":
        config.update(sliding_window=window, query_pre_attn_scalar=head_dim)
    if kind.startswith("deepseek"):
        config.update(
            kv_lora_rank=int(row["kv_lora_rank"]),
            qk_rope_head_dim=int(row["qk_rope_head_dim"]),
            qk_nope_head_dim=128,
            v_head_dim=128,
            q_lora_rank=None if kind == "deepseek_v2" else 1536,
            n_routed_experts=64,
            num_experts_per_tok=6,
            moe_intermediate_size=1024,
            n_shared_experts=2,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            num_key_value_heads=heads,
        )
        del config["head_dim"]
    if kind == "gpt_oss":  # layer_types as its config.json; yarn RoPE, as vLLM's GptOssAttention reads it
        config.update(
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=window,
            layer_types=[
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(config["num_hidden_layers"])
            ],
            rope_scaling=dict(GPT_OSS_ROPE_SCALING),
        )
    if kind == "llama4":  # the text model alone (vLLM's Llama4ForCausalLM); no_rope_layers as transformers derives it
        config.update(
            model_type="llama4_text",
            attention_chunk_size=int(row["attention_chunk_size"]),
            no_rope_layer_interval=int(row["full_attention_interval"]),
            num_local_experts=4,
            num_experts_per_tok=1,
            intermediate_size_mlp=4 * hidden,
            interleave_moe_layer_step=1,
            use_qk_norm=True,
        )
    if kind == "qwen3_next":  # full_attention_interval as its config.json; the Gated DeltaNet fields of the row
        fields = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
        config.update(
            {f: int(row[f]) for f in (*fields, "linear_conv_kernel_dim")},
            full_attention_interval=int(row["full_attention_interval"]),
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            partial_rotary_factor=0.25,
        )
    if kind == "gemma3":
        text = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
        text.update(
            model_type="gemma3_text",
            sliding_window=window,
            query_pre_attn_scalar=head_dim,
            sliding_window_pattern=int(row["sliding_window_pattern"]),
        )
        config = {
            "architectures": [ARCHITECTURES[kind]],
            "model_type": "gemma3",
            "text_config": text,
            "vision_config": {"model_type": "siglip_vision_model", "num_attention_heads": 16},
            "torch_dtype": "bfloat16",
        }
    return config


def synthetic_configs() -> dict[str, dict]:
    """Layouts no catalog model has, for vLLM rules the catalog does not reach (config.json's layer_types).

    gemma2-12sw-13full: Gemma 2 9B with 25 layers, 12 sliding and 13 full: the larger bucket is under 1.5x
    the smaller, so vLLM makes groups of 13 (2 groups), not of 12 (3). llama-1full-3sw: Llama 3.1 8B whose
    layers 0, 4, 8, ... are full attention and the others slide over 1,024 tokens (full layers first)."""
    gemma = json.loads((FIXTURES / "gemma-2-9b-it.json").read_text())
    llama = json.loads((FIXTURES / "llama-3.1-8b-instruct.json").read_text())
    return {
        "gemma2-12sw-13full": dict(
            gemma,
            num_hidden_layers=25,
            layer_types=["sliding_attention" if i % 2 == 0 and i < 24 else "full_attention" for i in range(25)],
        ),
        "llama-1full-3sw": dict(
            llama,
            sliding_window=1024,
            layer_types=["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(32)],
        ),
    }


QWEN3_8B_FP8 = {  # Qwen/Qwen3-8B-FP8's config.json: block-scaled FP8 (128 x 128)
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}
GPT_OSS_20B = {  # openai/gpt-oss-20b's config.json: MXFP4 experts
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "vocab_size": 201088,
    "max_position_embeddings": 131072,
    "sliding_window": 128,
    "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(24)],
    "rope_theta": 150000,
    "rope_scaling": dict(GPT_OSS_ROPE_SCALING),
    "rms_norm_eps": 1e-05,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
}
# gpt-oss-20b's parameters (kvlab does not count the family): embeddings and lm_head 2 x 201,088 x 2,880, the final
# norm 2,880, and 24 layers of qkv (2,880 x 80 x 64 + 5,120 bias), o (4,096 x 2,880 + 2,880), 64 sinks, 2 norms,
# the router (2,880 x 32 + 32) and 32 experts (3 x 2,880 x 2,880 + 3 x 2,880 biases): 20,914,757,184.
GPT_OSS_20B_PARAMS_B = 20.914757184


def quantized_models() -> list[dict]:
    """Quantized weights as vLLM loads them: Llama 3.1 8B and GPT-NeoX-20B (a plain MLP) with `--quantization fp8`
    (online per-tensor FP8), Qwen3-8B-FP8 (block-scaled FP8 checkpoint) and gpt-oss-20b (MXFP4 experts); the case's
    quantization travels as vLLM's flag."""
    llama = json.loads((FIXTURES / "llama-3.1-8b-instruct.json").read_text())
    neox = json.loads((FIXTURES / "gpt-neox-20b.json").read_text())
    return [
        {
            "name": "quantized:llama-3.1-8b-instruct-fp8",
            "config": llama,
            "spec": dataclasses.replace(from_config(llama, name="llama-3.1-8b-instruct"), quantization="fp8"),
            "quantization": "fp8",
        },
        {  # a plain (ungated) MLP: dense_h_to_4h and dense_4h_to_h
            "name": "quantized:gpt-neox-20b-fp8",
            "config": neox,
            "spec": dataclasses.replace(from_config(neox, name="gpt-neox-20b"), quantization="fp8"),
            "quantization": "fp8",
        },
        {
            "name": "quantized:qwen3-8b-fp8",
            "config": QWEN3_8B_FP8,
            "spec": from_config(QWEN3_8B_FP8, name="Qwen3-8B-FP8"),
        },
        {
            "name": "quantized:gpt-oss-20b",
            "config": GPT_OSS_20B,
            "spec": from_config(GPT_OSS_20B, name="gpt-oss-20b", num_params_b=GPT_OSS_20B_PARAMS_B),
        },
    ]


def models() -> list[dict]:
    """[{name, config, spec (kvlab's ModelSpec)}]: fixtures, catalog rows, synthetic layouts."""
    out = [
        {"name": f"fixture:{p.stem}", "config": json.loads(p.read_text()), "spec": from_config(p)}
        for p in sorted(FIXTURES.glob("*.json"))
    ]
    out += [
        {"name": f"catalog:{name}", "config": catalog_config(row), "spec": get_model(name)}
        for name, row in load_models().items()
    ]
    out += [
        {"name": f"synthetic:{name}", "config": config, "spec": from_config(config, name=name)}
        for name, config in synthetic_configs().items()
    ]
    return out + quantized_models()


def family(name: str) -> str:
    kind, rest = name.split(":", 1)
    return kind if kind in ("synthetic", "quantized") else next(f for key, f in FAMILIES if key in rest.lower())


def kv_cache(spec) -> str:
    """The model's kind of KV cache, in a few words."""
    if spec.attention == "mla":
        return "MLA"
    if spec.linear_num_key_heads:
        return "Mamba hybrid"
    if spec.attention_chunk_size:
        return "chunked local"
    sliding = spec.num_sliding_layers
    return "full attention" if not sliding else "sliding window" if sliding == spec.num_layers else "hybrid"


def kv_layout(spec) -> str:
    """The model's KV-cache kind in words: attention, and which layers slide."""
    sliding = spec.num_sliding_layers
    for kind, what in (("linear_attention", "linear-attention (Gated DeltaNet)"), ("chunked_attention", "chunked")):
        local = sum(t == kind for t in spec.layer_types)
        if local:
            return f"{spec.attention}: {local} {what} + {spec.num_layers - local} full layers"
    if not sliding:
        return spec.attention
    if sliding == spec.num_layers:
        return f"{spec.attention} with a {spec.sliding_window}-token window on every layer"
    return f"{spec.attention}: {sliding} window + {spec.num_layers - sliding} full layers"


# ---------------------------------------------------------------- the grid
MEMORY_GIB = (1, 5, 13.37, 20, 60)
BOUNDARY = ({"requests": 1, "plus_blocks": 0}, {"requests": 1, "plus_blocks": 1})  # vLLM refuses / starts
BATCHING = ((2048, None), (2048, False), (8192, None), (65536, None))  # (max_num_batched_tokens, async)
ASYNC = {None: "default", False: "off"}


def lengths(max_pos: int) -> list[int]:
    """max_model_len on the 16-token grid, off it, and long, within the model's limit."""
    on = min(4096, max_pos)
    out = [on, 4100 if max_pos >= 4100 else on - 12]
    return out + ([min(32768, max_pos)] if min(32768, max_pos) > 4100 else [])


def tensor_sizes(spec) -> list[int]:
    """Tensor sizes vLLM accepts: they divide the heads, and divide or are multiples of the KV heads."""
    kv = 1 if spec.attention == "mla" else spec.num_kv_heads
    return [
        tp for tp in (1, 2, 4, 8) if spec.num_attention_heads % tp == 0 and (kv % tp == 0 if kv >= tp else tp % kv == 0)
    ]


def cases_for(model: dict, full: bool) -> list[dict]:
    """One model's cases: the one-GPU sweep, then (full) TP, PP, hybrid manager off, backends and dtypes."""
    spec, out = model["spec"], []

    def add(tag: str, memory, **settings):
        label = memory if isinstance(memory, (list, dict)) else f"{memory / GIB:g}GiB"
        out.append(
            {
                "id": f"{model['name']}|{tag}|mem={json.dumps(label, separators=(',', ':'))}",
                "model": model["name"],
                "config_ref": model["name"],
                "available_kv_bytes": memory,
                "block_size": 16,
                "max_num_batched_tokens": 2048,
                **({"quantization": model["quantization"]} if model.get("quantization") else {}),
                **settings,
            }
        )

    lens = lengths(spec.max_position_embeddings)
    memories = [int(m * GIB) for m in MEMORY_GIB] + list(BOUNDARY)
    for dtype in ("auto", "fp8") if full else ("auto",):
        for length in lens:
            for mnbt, async_ in BATCHING if full else BATCHING[:2]:
                for memory in memories:
                    add(
                        f"tp1pp1|{dtype}|len={length}|mnbt={mnbt}|async={ASYNC[async_]}",
                        memory,
                        kv_cache_dtype=dtype,
                        max_model_len=length,
                        max_num_batched_tokens=mnbt,
                        async_scheduling=async_,
                    )
    if spec.max_position_embeddings >= 20000:  # on the block grid, 1,250 blocks: vLLM's float product truncates
        for memory in memories:
            add("tp1pp1|auto|len=20000", memory, max_model_len=20000)
    if not full:
        return out
    tps = [tp for tp in tensor_sizes(spec) if tp > 1]
    for tp in tps:
        for dtype in ("auto", "fp8") if tp == tps[-1] else ("auto",):
            for length in lens[:2]:
                for memory in (5 * GIB, 20 * GIB, *BOUNDARY):
                    add(
                        f"tp{tp}pp1|{dtype}|len={length}",
                        memory,
                        kv_cache_dtype=dtype,
                        tensor_parallel_size=tp,
                        max_model_len=length,
                    )
    for pp in (2, 3, 4):
        for length in lens[:2]:
            for async_ in (None, False):
                for memory in (5 * GIB, 20 * GIB, [(20 - s) * GIB for s in range(pp)], *BOUNDARY):
                    add(
                        f"tp1pp{pp}|auto|len={length}|async={ASYNC[async_]}",
                        memory,
                        pipeline_parallel_size=pp,
                        max_model_len=length,
                        async_scheduling=async_,
                    )
    if 2 in tps:
        for async_ in (None, False):
            for memory in (20 * GIB, *BOUNDARY):
                add(
                    f"tp2pp2|auto|len={lens[0]}|async={ASYNC[async_]}",
                    memory,
                    tensor_parallel_size=2,
                    pipeline_parallel_size=2,
                    max_model_len=lens[0],
                    async_scheduling=async_,
                )
    if spec.num_sliding_layers or spec.attention_chunk_size:
        for pp in (1, 2):
            for length in (lens[0], lens[-1]):
                for memory in (20 * GIB, *BOUNDARY):
                    add(
                        f"tp1pp{pp}|auto|len={length}|hybrid=off",
                        memory,
                        pipeline_parallel_size=pp,
                        max_model_len=length,
                        hybrid_kv_cache_manager=False,
                    )
                    if not spec.num_sliding_layers:
                        continue
                    add(
                        f"tp1pp{pp}|auto|len={length}|CPU_ATTN",
                        memory,
                        pipeline_parallel_size=pp,
                        max_model_len=length,
                        attention_backend="CPU_ATTN",
                    )
    if spec.linear_num_key_heads:  # without prefix caching: Mamba states in mamba_cache_mode "none"
        for tp, length, mnbt in itertools.product([1, *tps], lens, (2048, 8192)):
            for memory in (5 * GIB, 20 * GIB, *BOUNDARY):
                add(
                    f"tp{tp}pp1|auto|len={length}|mnbt={mnbt}|prefix=off",
                    memory,
                    tensor_parallel_size=tp,
                    max_model_len=length,
                    max_num_batched_tokens=mnbt,
                    enable_prefix_caching=False,
                )
    if spec.expert_params_b:  # data-parallel ranks, with expert parallelism or without
        for dp, tp, ep, memory in itertools.product((2, 4), [1, *tps[:1]], (False, True), (20 * GIB, *BOUNDARY)):
            settings = {"tensor_parallel_size": tp, "data_parallel_size": dp, "enable_expert_parallel": ep}
            add(f"tp{tp}pp1dp{dp}{'ep' if ep else ''}|auto|len={lens[0]}", memory, max_model_len=lens[0], **settings)
    for block in (32, 64):
        for length in lens[:2]:
            for memory in (20 * GIB, *BOUNDARY):
                add(f"tp1pp1|auto|len={length}|block={block}", memory, block_size=block, max_model_len=length)
    if spec.num_sliding_layers:  # FLASHINFER's kernel blocks are 16, 32, 64: at 48, window pages are padded
        for memory in (20 * GIB, *BOUNDARY):
            add(
                f"tp1pp1|auto|len={lens[-1]}|block=48|FLASHINFER",
                memory,
                block_size=48,
                max_model_len=lens[-1],
                attention_backend="FLASHINFER",
            )
    if spec.attention != "mla" and model["name"].startswith("fixture:"):
        for dtype, backend in (("int8_per_token_head", None), ("nvfp4", "FLASHINFER")):
            for memory in (20 * GIB, *BOUNDARY):
                add(
                    f"tp1pp1|{dtype}|len={lens[0]}",
                    memory,
                    kv_cache_dtype=dtype,
                    max_model_len=lens[0],
                    **({"attention_backend": backend} if backend else {}),
                )
    return out


def grid(all_models: list[dict]) -> list[dict]:
    """Every model's cases; catalog rows that repeat a fixture get the one-GPU bf16 sweep only."""
    fixtures = {m["name"].split(":", 1)[1] for m in all_models if m["name"].startswith("fixture:")}
    out = []
    for model in all_models:
        kind, name = model["name"].split(":", 1)
        repeat = kind == "catalog" and name.split("/")[-1].lower() in fixtures
        out += cases_for(model, full=not repeat and kind != "quantized")  # quantized: weights, one GPU
    return out


# ---------------------------------------------------------------- kvlab on the same cases
KV_DTYPES = {"fp8": "fp8", "int8_per_token_head": "int8", "nvfp4": "int4"}  # vLLM's names -> kvlab's


def kvlab_config(case: dict, config_json: dict) -> EngineConfig:
    """kvlab's settings for a case: vLLM's where the case gives them, kvlab's defaults (vLLM's) otherwise."""
    dtype = case.get("kv_cache_dtype", "auto")
    if dtype == "auto":  # the model's dtype; vLLM runs a float32 checkpoint in bfloat16
        model_dtype = config_json.get("torch_dtype") or config_json.get("text_config", {}).get("torch_dtype")
        dtype = "fp16" if model_dtype == "float16" else "bf16"
    else:
        dtype = KV_DTYPES[dtype]
    settings = {
        "kv_cache_dtype": dtype,
        "block_size": case["block_size"],
        "tensor_parallel_size": case.get("tensor_parallel_size", 1),
        "pipeline_parallel_size": case.get("pipeline_parallel_size", 1),
        "data_parallel_size": case.get("data_parallel_size", 1),
        "enable_expert_parallel": case.get("enable_expert_parallel", False),
        "max_num_batched_tokens": case["max_num_batched_tokens"],
        "hybrid_kv_cache": case.get("hybrid_kv_cache_manager", True),
        "attention_backend": case.get("attention_backend"),
        "enable_prefix_caching": case.get("enable_prefix_caching", True),  # vLLM's default for generative models
    }
    if case.get("async_scheduling") is not None:
        settings["async_scheduling"] = case["async_scheduling"]
    return EngineConfig().replace(**settings)


VLLM_REFUSAL = re.compile(
    r"\(([\d.]+) GiB KV cache is needed, .* memory \(([\d.]+) GiB\)\. "
    r"(?:Based on the available memory, the estimated maximum model length is (\d+)\. )?"
)
KVLAB_REFUSAL = re.compile(r"needs ([\d.]+) GiB .* than the ([\d.]+) GiB")


def refusal_figures(message: str | None, pattern: re.Pattern, estimate) -> str:
    """A refusal as comparable text: 'needs X GiB, has Y GiB, fits M tokens', 'no memory', or '' (it starts)."""
    if message is None:
        return ""
    match = pattern.search(message)
    if not match:
        return "no memory"
    return f"needs {match.group(1)} GiB, has {match.group(2)} GiB, fits {estimate or 0} tokens"


FIGURES = ("starts", "num_gpu_blocks", "gpu_kv_cache_tokens", "max_concurrency", "refusal", "weights_bytes_per_gpu")
WEIGHT_BYTES = 2  # every model of the grid runs in bf16 or fp16 (vLLM runs a float32 checkpoint in bfloat16)


def vllm_figures(result: dict) -> dict:
    """vLLM's figures of a case: num_gpu_blocks from its per-stage blocks when it refuses."""
    refused = result["starts"] is False
    estimate = None
    if refused:
        match = VLLM_REFUSAL.search(result["error"])
        estimate = match.group(3) if match else None
    return {
        "starts": result["starts"],
        "num_gpu_blocks": min(s["num_blocks"] for s in result["stages"]) if "stages" in result else None,
        "gpu_kv_cache_tokens": result.get("gpu_kv_cache_tokens"),
        "max_concurrency": result.get("max_concurrency"),
        "refusal": refusal_figures(result.get("error") if refused else None, VLLM_REFUSAL, estimate),
    }


def kvlab_figures(spec, case: dict, config_json: dict, available: list[int]) -> dict:
    r = vllm_capacity(spec, available, case["max_model_len"], kvlab_config(case, config_json))
    return {
        "starts": r["starts"],
        "num_gpu_blocks": r["num_gpu_blocks"],
        "gpu_kv_cache_tokens": r["gpu_kv_cache_tokens"] if r["starts"] else None,
        "max_concurrency": r["max_concurrency"] if r["starts"] else None,
        "refusal": refusal_figures(r["refusal"], KVLAB_REFUSAL, r["estimated_max_model_len"]),
    }


# Why a difference remains, by a predicate on (case, vLLM's result). Empty: kvlab computes what vLLM does.
KNOWN_REASONS: list[tuple] = []


def reason(case: dict, vllm: dict) -> str:
    return next((why for applies, why in KNOWN_REASONS if applies(case, vllm)), "not explained: a kvlab bug to fix")


def compare(all_models: list[dict], cases: list[dict], vllm_out: dict) -> tuple[list[dict], list[dict]]:
    """(summary rows per model, difference rows): every case of the grid, kvlab beside vLLM."""
    by_name = {m["name"]: m for m in all_models}
    results = {r["id"]: r for r in vllm_out["cases"]}
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    differences, tp_weight_errors = [], []
    for case in cases:
        model, vllm = by_name[case["model"]], results[case["id"]]
        count = tally[model["name"]]
        count["cases"] += 1
        count[f"specs from {'layer classes' if vllm.get('spec_path') == 'model' else 'spec classes'}"] += 1
        if vllm["starts"] is None or "stages" not in vllm:  # vLLM could not build or size the case
            theirs, ours = {"starts": None}, {"starts": "-"}
            why = f"vLLM failed at {vllm.get('error_stage')}: {vllm.get('error', '')[:200]}"
        else:
            theirs, why = vllm_figures(vllm), reason(case, vllm)
            try:
                ours = kvlab_figures(model["spec"], case, model["config"], vllm["available_kv_bytes_per_stage"])
            except ValueError as error:  # kvlab refuses settings vLLM takes
                ours, why = {"starts": "-"}, f"kvlab refuses the case: {error}"
            weights = weights_figures(model, case, vllm)
            if weights is not None and case.get("tensor_parallel_size", 1) == 1:
                theirs["weights_bytes_per_gpu"], ours["weights_bytes_per_gpu"] = weights
                count["weights compared"] += 1
            elif weights is not None:  # kvlab's estimate divides every parameter by TP: its error, reported
                tp_weight_errors.append((weights[1] / weights[0] - 1, case["id"]))
        differ = [f for f in FIGURES if theirs.get(f) != ours.get(f)]
        count["refused by vLLM"] += vllm["starts"] is False
        count["identical"] += not differ
        for figure in differ:
            count[f"{figure} differs"] += 1
            differences.append(
                {
                    "case": case["id"],
                    "figure": figure,
                    "vllm": theirs.get(figure),
                    "kvlab": ours.get(figure),
                    "reason": why,
                }
            )
    summary = []
    for model in all_models:
        count = tally[model["name"]]
        kind, name = model["name"].split(":", 1)
        summary.append(
            {
                "source": kind,
                "model": name,
                "family": family(model["name"]),
                "kv_cache": kv_cache(model["spec"]),
                "kv_layout": kv_layout(model["spec"]),
                "cases": count["cases"],
                "identical": count["identical"],
                "refused_by_vllm": count["refused by vLLM"],
                **{f"{f}_differs": count[f"{f} differs"] for f in FIGURES},
                "weights_compared": count["weights compared"],
                "specs_from_layer_classes": count["specs from layer classes"],
                "specs_from_spec_classes": count["specs from spec classes"],
            }
        )
    return summary, differences, tp_weight_errors


def weights_figures(model: dict, case: dict, vllm: dict) -> tuple[int, int] | None:
    """(vLLM's, kvlab's) weight bytes on one GPU: vLLM's model class built on the meta device at the case's TP, DP
    and expert parallelism, its parameters' bytes; kvlab's weights_bytes_per_gpu. Only for a model whose every
    parameter kvlab counts from its config.json (a fixture or synthetic one: a catalog row's count is rounded) on
    one pipeline stage; None otherwise."""
    weights = (vllm.get("weights_bytes_per_stage") or [None])[0]
    spec = model["spec"]
    if weights is None or model["name"].startswith("catalog:") or not spec.num_params_b:
        return None
    if case.get("pipeline_parallel_size", 1) != 1:
        return None
    tp, dp = case.get("tensor_parallel_size", 1), case.get("data_parallel_size", 1)
    ep = case.get("enable_expert_parallel", False)
    return weights, round(weights_bytes_per_gpu(spec, WEIGHT_BYTES, tp, 1, dp, ep))


# ---------------------------------------------------------------- run
def run_vllm(python: str, grid_in: Path, grid_out: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run([python, str(VLLM_SCRIPT), str(grid_in), str(grid_out)], cwd=ROOT)
    if done.returncode:
        sys.exit(f"compare_capacity: {VLLM_SCRIPT.name} failed (exit status {done.returncode})")
    return time.perf_counter() - started


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", help="the Python of the environment vLLM 0.33 is installed in")
    parser.add_argument("--vllm-output", type=Path, help="compare this earlier OUT.json of vllm_capacity.py instead")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "parity", help="folder of the results")
    parser.add_argument("--keep", type=Path, help="folder to keep vLLM's IN.json and OUT.json in")
    parser.add_argument("--models", help="only the models whose name holds this text (a quick check; writes --out)")
    opts = parser.parse_args(argv)
    if not opts.vllm_python and not opts.vllm_output:
        parser.error("give --vllm-python (or --vllm-output)")
    started = time.perf_counter()
    all_models = [m for m in models() if not opts.models or opts.models.lower() in m["name"].lower()]
    cases = grid(all_models)
    work = opts.keep or Path(tempfile.mkdtemp(prefix="kvlab_parity_"))
    work.mkdir(parents=True, exist_ok=True)
    grid_in, grid_out = work / "capacity_in.json", opts.vllm_output or work / "capacity_out.json"
    grid_in.write_text(json.dumps({"configs": {m["name"]: m["config"] for m in all_models}, "cases": cases}))
    vllm_seconds = None
    if not opts.vllm_output:
        print(f"compare_capacity: {len(cases):,} cases through vLLM's sizing code ({opts.vllm_python})", flush=True)
        vllm_seconds = run_vllm(opts.vllm_python, grid_in, grid_out)
    vllm_out = json.loads(grid_out.read_text())
    summary, differences, tp_weight_errors = compare(all_models, cases, vllm_out)
    opts.out.mkdir(parents=True, exist_ok=True)
    write_csv(opts.out / "capacity_summary.csv", summary, list(summary[0]))
    write_csv(opts.out / "capacity_differences.csv", differences, ["case", "figure", "vllm", "kvlab", "reason"])
    identical = sum(row["identical"] for row in summary)
    run = {
        "vllm_version": vllm_out["vllm_version"],
        "torch_version": vllm_out["torch_version"],
        "cases": len(cases),
        "identical": identical,
        "models": len(summary),
        "differences": len(differences),
        "figures": list(FIGURES),
        "weights_compared": sum(row["weights_compared"] for row in summary),
        "weights_at_tp_above_1": {
            "cases": len(tp_weight_errors),
            "kvlab_error_range": [round(min(tp_weight_errors)[0], 4), round(max(tp_weight_errors)[0], 4)]
            if tp_weight_errors
            else None,
            "largest_at": max(tp_weight_errors, key=lambda e: abs(e[0]))[1] if tp_weight_errors else None,
        },
        "attention_backends": vllm_out["attention_backends"],
        "vllm_seconds": None if vllm_seconds is None else round(vllm_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    (opts.out / "capacity_run.json").write_text(json.dumps(run, indent=1) + "\n")
    print(
        f"compare_capacity: {identical:,} of {len(cases):,} cases identical ({identical / len(cases):.2%}) "
        f"over {len(summary)} models; {len(differences)} differing figures in "
        f"{opts.out / 'capacity_differences.csv'}; {run['total_seconds']} s"
    )
    above = run["weights_at_tp_above_1"]
    if above["cases"]:
        low, high = above["kvlab_error_range"]
        print(
            f"compare_capacity: weights per GPU compared on {run['weights_compared']:,} cases at TP 1 (any DP and "
            f"expert parallelism); at TP > 1 kvlab divides every parameter by TP where vLLM keeps some whole (norms, "
            f"the router, MLA's down-projections): {low:+.2%} to {high:+.2%} on {above['cases']:,} cases, reported, "
            "not compared"
        )
    return 0 if identical == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
