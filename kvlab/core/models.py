"""Model and GPU specs for capacity planning: data/models.csv, data/gpus.csv and HF config.json files.

A ModelSpec holds what the KV cache depends on: layers, heads, head dim, the attention kind
(mha, gqa, mqa, mla) and which layers use a sliding window. `from_config` reads it from a Hugging
Face config.json (a local path, no hub access) the way vLLM reads it.
"""

from __future__ import annotations

import csv
import difflib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from kvlab.core import validate

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
MODELS_CSV = DATA_DIR / "models.csv"
GPUS_CSV = DATA_DIR / "gpus.csv"
ATTENTIONS = ("mha", "gqa", "mqa", "mla")
# config.json's layer_types that kvlab models: Llama 4's chunked local attention and Qwen3-Next's linear attention
# (Gated DeltaNet, a Mamba-like state a request) besides full and sliding-window attention.
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")
# config.json model_types whose MLP is up and down projections alone (no gate): ModelSpec.gated_mlp False.
PLAIN_MLP_FAMILIES = ("gpt_neox", "opt", "gpt2", "gptj", "gpt_bigcode", "falcon", "bloom", "phi", "starcoder2")
# ModelSpec.quantization: how vLLM holds the weights ("" for the checkpoint's 16-bit dtype; quantized_weights_bytes).
QUANTIZATIONS = ("", "fp8", "fp8_block", "mxfp4")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder's KV-cache shape.

    sliding_window_pattern: 0 = no sliding-window layer; 1 = every layer slides; p >= 2 = layer i
    (from 0) is a full-attention layer when (i + 1) % p == 0 and a sliding-window layer otherwise
    (Gemma 2: p = 2, Gemma 3: p = 6). layer_types: each layer's kind as config.json's layer_types
    names it (LAYER_TYPES), for layouts that repeat no such pattern (sliding_window_pattern is then 0)
    and for chunked local attention (attention_chunk_size tokens a chunk) and linear attention layers
    (Gated DeltaNet: a conv state and a temporal state a request, sized by the linear_* fields, as
    config.json names them). For MLA, num_kv_heads is 1 and head_dim is the cached latent,
    kv_lora_rank + qk_rope_head_dim values.
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    attention: str = "gqa"
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int = 0
    sliding_window_pattern: int = 0
    max_position_embeddings: int = 0
    num_params_b: float = 0.0
    layer_types: tuple[str, ...] = ()
    hidden_size: int = 0  # config.json's; 0 = unknown (the all-reduce's size per token)
    # From a config.json: (intermediate_size (0 for an MoE), vocab_size, experts, experts per token, an expert's MLP
    # size), with the attention's shape and hidden_size what an operator profile's layers are measured at
    # (layer_shape); () where unknown.
    layer_sizes: tuple[int, ...] = ()
    # Beside the routed experts (moe_extras): the shared experts' MLP width every MoE layer runs on every token
    # (DeepSeek's n_shared_experts x moe_intermediate_size, Qwen's shared_expert_intermediate_size, Llama 4's
    # intermediate_size), and the leading dense layers of an MoE (DeepSeek's first_k_dense_replace) with their MLP
    # width (its intermediate_size); 0 for none.
    shared_expert_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    dense_intermediate_size: int = 0
    # The routed experts' parameters (billions; 0 for a dense model): what vLLM splits over every GPU of the data-
    # and tensor-parallel group (routed_expert_params).
    expert_params_b: float = 0.0
    # Parameters vLLM adds by padding the vocabulary (vocab_padding_params): held in memory, not the model's own.
    vocab_padding_params: int = 0
    attention_chunk_size: int = 0  # tokens a chunk of the chunked_attention layers (Llama 4); 0 for none
    # Gated DeltaNet (linear_attention layers): key and value heads, their dims, the causal conv's kernel; 0 for none.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # The dense MLP's shape: gate and up projections beside down (SwiGLU, GeGLU: 3 matrices), or up and down alone
    # (GPT-NeoX, OPT: 2; PLAIN_MLP_FAMILIES). What quantized_weights_bytes counts of an MLP's linear layers.
    gated_mlp: bool = True
    quantization: str = ""  # weights as vLLM loads them: "" (the checkpoint's 16-bit dtype), "fp8" (per-tensor FP8), "fp8_block" (block-scaled FP8), "mxfp4" (gpt-oss's MoE experts)

    def __post_init__(self):
        validate.positive_int("num_layers", self.num_layers)
        validate.positive_int("num_attention_heads", self.num_attention_heads)
        validate.positive_int("num_kv_heads", self.num_kv_heads)
        validate.positive_int("head_dim", self.head_dim)
        validate.one_of("attention", self.attention, ATTENTIONS)
        validate.one_of("quantization", self.quantization, QUANTIZATIONS)
        validate.non_negative_int("sliding_window", self.sliding_window)
        validate.non_negative_int("sliding_window_pattern", self.sliding_window_pattern)
        validate.non_negative_int("max_position_embeddings", self.max_position_embeddings)
        validate.non_negative_int("hidden_size", self.hidden_size)
        validate.non_negative_int("attention_chunk_size", self.attention_chunk_size)
        for name in ("shared_expert_intermediate_size", "first_k_dense_replace", "dense_intermediate_size"):
            validate.non_negative_int(name, getattr(self, name))
        if self.first_k_dense_replace >= self.num_layers:
            validate.fail(
                "first_k_dense_replace", self.first_k_dense_replace, f"must be below num_layers ({self.num_layers})"
            )
        for name in LINEAR_FIELDS:
            validate.non_negative_int(name, getattr(self, name))
        validate.non_negative_number("num_params_b", self.num_params_b)
        validate.non_negative_number("expert_params_b", self.expert_params_b)
        if self.num_params_b and self.expert_params_b > self.num_params_b:
            validate.fail(
                "expert_params_b", self.expert_params_b, f"must be at most num_params_b ({self.num_params_b})"
            )
        heads, kv = self.num_attention_heads, self.num_kv_heads
        if self.attention == "mha" and kv != heads:
            validate.fail("num_kv_heads", kv, f"must equal num_attention_heads ({heads}) for mha")
        if self.attention == "mqa" and kv != 1:
            validate.fail("num_kv_heads", kv, "must be 1 for mqa")
        if self.attention == "gqa" and heads % kv:
            validate.fail("num_kv_heads", kv, f"must divide num_attention_heads ({heads}) for gqa")
        if self.attention == "mla":
            validate.positive_int("kv_lora_rank", self.kv_lora_rank)
            validate.positive_int("qk_rope_head_dim", self.qk_rope_head_dim)
            if kv != 1:
                validate.fail("num_kv_heads", kv, "must be 1 for mla (one latent per token and layer)")
            if self.head_dim != self.kv_lora_rank + self.qk_rope_head_dim:
                validate.fail(
                    "head_dim",
                    self.head_dim,
                    f"must be kv_lora_rank + qk_rope_head_dim for mla ({self.kv_lora_rank + self.qk_rope_head_dim})",
                )
        if self.layer_types:
            self._check_layer_types()
        elif self.attention_chunk_size or any(getattr(self, name) for name in LINEAR_FIELDS):
            validate.fail("layer_types", (), "must say which layers are chunked_attention or linear_attention")
        elif (self.sliding_window == 0) != (self.sliding_window_pattern == 0):
            validate.fail(
                "sliding_window_pattern", self.sliding_window_pattern, "must be 0 exactly when sliding_window is 0"
            )

    def _check_layer_types(self):
        types = self.layer_types
        if len(types) != self.num_layers or not set(types) <= set(LAYER_TYPES):
            validate.fail(
                "layer_types", types, f"must name each of the {self.num_layers} layers {', '.join(LAYER_TYPES)}"
            )
        if self.sliding_window_pattern:
            validate.fail("sliding_window_pattern", self.sliding_window_pattern, "must be 0 beside layer_types")
        if (self.sliding_window == 0) == ("sliding_attention" in types):
            validate.fail(
                "sliding_window",
                self.sliding_window,
                "must be 0 exactly when layer_types has no sliding_attention layer",
            )
        if (self.attention_chunk_size == 0) == ("chunked_attention" in types):
            validate.fail(
                "attention_chunk_size",
                self.attention_chunk_size,
                "must be 0 exactly when layer_types has no chunked_attention layer",
            )
        linear = [getattr(self, name) for name in LINEAR_FIELDS]
        if ("linear_attention" in types) != all(linear) or any(linear) != all(linear):
            validate.fail(
                "linear_num_key_heads",
                self.linear_num_key_heads,
                f"{', '.join(LINEAR_FIELDS)} must all be > 0 exactly when layer_types has a linear_attention layer",
            )

    def is_sliding(self, layer: int) -> bool:
        """Whether layer (0-based) attends over a sliding window."""
        if self.layer_types:
            return self.layer_types[layer] == "sliding_attention"
        p = self.sliding_window_pattern
        return p == 1 or (p >= 2 and (layer + 1) % p != 0)

    def layer_type(self, layer: int) -> str:
        """Layer's kind (0-based), as config.json's layer_types names it (LAYER_TYPES)."""
        if self.layer_types:
            return self.layer_types[layer]
        return "sliding_attention" if self.is_sliding(layer) else "full_attention"

    @property
    def num_sliding_layers(self) -> int:
        """Layers that attend over a sliding window."""
        return sum(self.is_sliding(i) for i in range(self.num_layers))


LINEAR_FIELDS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


def interval_layer_types(num_layers: int, interval: int, local: str) -> tuple[str, ...]:
    """Layer types where every interval-th layer (i + 1) % interval == 0 is full attention and the others are local
    (Qwen3-Next's full_attention_interval, Llama 4's no_rope_layer_interval)."""
    return tuple("full_attention" if (i + 1) % interval == 0 else local for i in range(num_layers))


# ---------------------------------------------------------------- catalogs
@dataclass(frozen=True)
class GpuSpec:
    """One GPU of data/gpus.csv: memory (GiB), memory bandwidth (GB/s of 10^9 bytes), dense bf16 TFLOPS."""

    name: str
    memory_gib: float
    memory_bandwidth_gb_s: float
    bf16_dense_tflops: float
    source: str = ""


def _close_matches(kind: str, name: str, names: list[str]) -> str:
    lowered = {n.lower(): n for n in names}
    short = {n.split("/")[-1].lower(): n for n in names}
    found = [n for n in lowered if name.lower() in n]
    found += difflib.get_close_matches(name.lower(), list(lowered), n=4, cutoff=0.5)
    found += difflib.get_close_matches(name.lower(), list(short), n=4, cutoff=0.5)
    matches = list(dict.fromkeys([lowered.get(f) or short[f] for f in found]))[:4]
    hint = f"; did you mean {' or '.join(matches)}?" if matches else ""
    return f"{kind}={name!r} is not allowed: not a {kind} of data/{kind}s.csv{hint}"


def _read_catalog(path: str | Path) -> dict[str, dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return {row["name"]: row for row in csv.DictReader(f)}


def load_models(path: str | Path = MODELS_CSV) -> dict[str, dict]:
    """The model catalog (data/models.csv): name -> its row (strings), sources included."""
    return _read_catalog(path)


def load_gpus(path: str | Path = GPUS_CSV) -> dict[str, dict]:
    """The GPU catalog (data/gpus.csv): name -> its row (strings), sources included."""
    return _read_catalog(path)


def _lookup(kind: str, name: str, table: dict[str, dict]) -> dict:
    if name in table:
        return table[name]
    for full, row in table.items():  # the part after the organisation is enough: "Qwen3-14B"
        if full.split("/")[-1].lower() == str(name).lower():
            return row
    raise ValueError(_close_matches(kind, str(name), list(table)))


def get_model(name: str, path: str | Path = MODELS_CSV) -> ModelSpec:
    """The ModelSpec of one catalog model (full name or the part after '/'); close matches on a miss."""
    row = _lookup("model", name, load_models(path))
    ints = [
        "num_layers",
        "num_attention_heads",
        "num_kv_heads",
        "head_dim",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "sliding_window",
        "sliding_window_pattern",
        "max_position_embeddings",
        "hidden_size",
        "attention_chunk_size",
        *LINEAR_FIELDS,
    ]
    values = {k: int(row.get(k) or 0) for k in ints}
    extras = moe_extras({k: int(row[k]) for k in MOE_EXTRA_COLUMNS + ("intermediate_size",) if row.get(k)})
    interval = int(row.get("full_attention_interval") or 0)
    local = "chunked_attention" if values["attention_chunk_size"] else "linear_attention"
    return ModelSpec(
        name=row["name"],
        attention=row["attention"],
        num_params_b=float(row["num_params_b"]),
        expert_params_b=float(row.get("expert_params_b") or 0.0),
        layer_types=interval_layer_types(values["num_layers"], interval, local) if interval else (),
        layer_sizes=_layer_sizes({k: int(row[k]) if row.get(k) else None for k in LAYER_SIZE_COLUMNS}),
        quantization=row.get("quantization") or "",
        gated_mlp=row.get("model_type") not in PLAIN_MLP_FAMILIES,
        **extras,
        **values,
    )


def get_gpu(name: str, path: str | Path = GPUS_CSV) -> GpuSpec:
    """One GPU of data/gpus.csv (memory_gib, memory_bandwidth_gb_s, bf16_dense_tflops); close matches on a miss."""
    row = _lookup("gpu", name, load_gpus(path))
    return GpuSpec(
        row["name"],
        float(row["memory_gib"]),
        float(row["memory_bandwidth_gb_s"]),
        float(row["bf16_dense_tflops"]),
        row.get("source", ""),
    )


# ---------------------------------------------------------------- config.json
def _field(config: dict, field: str, source: str, why: str):
    if config.get(field) is None:
        raise ValueError(f"config={source!r} is not allowed: it has no field {field!r}, which kvlab needs for {why}")
    return config[field]


def _whole(config: dict, field: str, source: str, default=None) -> int:
    """config[field] (or default when absent) as an int; anything but a whole number is a one-line error."""
    value = config.get(field)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        validate.fail("config", source, f"field {field!r} is {value!r}, not a whole number")
    return int(value)


def _sliding(config: dict, model_type: str, num_layers: int, source: str) -> tuple[int, int, tuple[str, ...]]:
    """(sliding_window, sliding_window_pattern, layer_types) the way vLLM reads them from config.json: a layer
    slides where layer_types says "sliding_attention" (any layout), else every layer slides where the model has
    a window (Gemma 2 and 3 alternate, as transformers derives their layer_types)."""
    layer_types = config.get("layer_types")
    if layer_types:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            validate.fail("config", source, f"layer_types must list num_hidden_layers={num_layers} layers")
        unknown = sorted({str(t) for t in layer_types} - set(LAYER_TYPES))
        if unknown:
            validate.fail(
                "config",
                source,
                f"layer_types holds {', '.join(unknown)}; kvlab models {', '.join(LAYER_TYPES[:-1])} and "
                f"{LAYER_TYPES[-1]} layers only",
            )
        sliding = [t == "sliding_attention" for t in layer_types]
        if not any(sliding):
            return 0, 0, ()
        _field(config, "sliding_window", source, "its sliding_attention layers")
        window = _whole(config, "sliding_window", source)
        for p in [1] + list(range(2, num_layers + 1)):
            if sliding == [p == 1 or (i + 1) % p != 0 for i in range(num_layers)]:
                return window, p, ()
        return window, 0, tuple(layer_types)
    window = config.get("sliding_window")
    if not window or config.get("use_sliding_window") is False:
        return 0, 0, ()
    window = _whole(config, "sliding_window", source)
    if model_type == "gemma2":
        return window, 2, ()
    if model_type.startswith("gemma3"):
        return window, _whole(config, "sliding_window_pattern", source, default=6), ()
    return window, 1, ()


def _local_layers(config: dict, model_type: str, num_layers: int, source: str) -> dict:
    """ModelSpec's layer_types, attention_chunk_size and linear_* fields for chunked local attention and linear
    attention layers, as vLLM's model classes decide them: Llama 4 (llama4.py) chunks a layer's attention where
    no_rope_layers[i] is 1 (transformers' default: all but every no_rope_layer_interval-th layer); Qwen3-Next
    (qwen3_next.py) makes a layer Gated DeltaNet where layer_types says linear_attention (transformers' default: all
    but every full_attention_interval-th layer). {} for a model with neither."""
    types = config.get("layer_types") or []
    if model_type.startswith("llama4") and config.get("attention_chunk_size"):
        flags = config.get("no_rope_layers") or [
            int((i + 1) % _whole(config, "no_rope_layer_interval", source, default=4) != 0) for i in range(num_layers)
        ]
        if not isinstance(flags, list) or len(flags) != num_layers:
            validate.fail("config", source, f"no_rope_layers must list num_hidden_layers={num_layers} layers")
        types = ["chunked_attention" if flag else "full_attention" for flag in flags]
    elif model_type == "qwen3_next" and not types:
        types = interval_layer_types(
            num_layers, _whole(config, "full_attention_interval", source, default=4), "linear_attention"
        )
    types = tuple(types)
    if not {"chunked_attention", "linear_attention"} & set(types):
        return {}
    if len(types) != num_layers or not set(types) <= {"full_attention", "chunked_attention", "linear_attention"}:
        validate.fail("config", source, f"layer_types must name each of {num_layers} layers full, chunked or linear")
    out = {"layer_types": types}
    if "chunked_attention" in types:
        _field(config, "attention_chunk_size", source, "its chunked_attention layers")
        out["attention_chunk_size"] = _whole(config, "attention_chunk_size", source)
    if "linear_attention" in types:
        for name in LINEAR_FIELDS:
            _field(config, name, source, "the state of its linear_attention layers")
            out[name] = _whole(config, name, source)
    return out


# Families whose parameters kvlab counts from config.json (count_params), with whether they tie the lm_head to the
# input embedding when config.json does not say (transformers' defaults for each config class).
GATED_FAMILIES = {
    "llama": False,
    "mistral": False,
    "mixtral": False,
    "qwen2": False,
    "qwen3": False,
    "qwen3_moe": False,
    "phi3": False,
    "gemma": True,
    "gemma2": True,
    "gemma3_text": True,
}
COUNTED_FAMILIES = (*GATED_FAMILIES, "gpt_neox", "opt", "deepseek_v2", "deepseek_v3")


def routed_expert_params(config: dict) -> int:
    """The routed experts' parameters of a config.json (0 for a dense model or a family count_params does not
    count): MoE layers x experts x 3 x hidden_size x an expert's MLP size (gate, up and down projections). vLLM's
    FusedMoE holds exactly these, split over data x tensor parallel GPUs (FusedMoEParallelConfig.make in
    vllm/model_executor/layers/fused_moe/config.py: experts sharded across DP x TP, or whole experts with
    expert parallelism); the router, shared experts and attention are split over TP alone."""
    family = str(config.get("model_type", ""))
    try:
        h, n = int(config["hidden_size"]), int(config["num_hidden_layers"])
        if family.startswith("deepseek"):
            experts, expert, dense = (
                int(config[k]) for k in ("n_routed_experts", "moe_intermediate_size", "first_k_dense_replace")
            )
            return (n - dense) * experts * 3 * h * expert
        if family == "qwen3_moe":
            return n * int(config["num_experts"]) * 3 * h * int(config["moe_intermediate_size"])
        if family in ("mixtral", "gpt_oss"):
            return n * int(config["num_local_experts"]) * 3 * h * int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return 0
    return 0


VOCAB_PADDING_SIZE = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (vllm/model_executor/layers/vocab_parallel_embedding.py)


def vocab_padding_params(config: dict) -> int:
    """Parameters vLLM allocates beyond a config.json's count: its VocabParallelEmbedding and ParallelLMHead pad the
    vocabulary to a multiple of 64 rows (pad_vocab_size), the lm_head too unless it is tied to the embedding (OPT-13B:
    50,272 -> 50,304 rows of 5,120, 163,840 parameters). 0 where count_params does not count the family."""
    family = str(config.get("model_type", ""))
    if family not in COUNTED_FAMILIES:
        return 0
    try:
        vocab, hidden = int(config["vocab_size"]), int(config["hidden_size"])
    except (KeyError, TypeError, ValueError):
        return 0
    if family == "opt" and int(config.get("word_embed_proj_dim") or hidden) != hidden:
        hidden = int(config["word_embed_proj_dim"])  # OPT-350m's embeddings are narrower than its layers
    default_tied = {"opt": True, "gpt_neox": False}.get(family, GATED_FAMILIES.get(family, False))
    tied = config.get("tie_word_embeddings", default_tied)
    rows = -(-vocab // VOCAB_PADDING_SIZE) * VOCAB_PADDING_SIZE - vocab
    return rows * hidden * (1 if tied else 2)


def count_params(config: dict) -> tuple[int, str]:
    """(parameters, '') of a decoder's config.json, as its transformers model class holds them (embeddings, every
    layer's attention, MLP or experts with their router, norms, the lm_head unless tied), or (0, why not): a family
    kvlab does not count (COUNTED_FAMILIES) or a field it needs that the file lacks. Matches the published counts of
    Llama 3.1 8B, Mistral 7B, Qwen2.5 7B, Qwen3-30B-A3B, Phi-3 mini, Gemma 2 9B, OPT-13B, GPT-NeoX-20B and
    DeepSeek-V2-Lite to the parameter (tests/test_models.py)."""
    family = str(config.get("model_type", ""))
    if family not in COUNTED_FAMILIES:
        return 0, f"kvlab counts the parameters of {', '.join(COUNTED_FAMILIES)} models, not of {family or 'this'} one"

    def need(*fields):
        missing = [f for f in fields if config.get(f) is None]
        if missing:
            raise KeyError(missing[0])
        return [int(config[f]) for f in fields]

    try:
        h, n, heads, vocab = need("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        if family == "opt":  # learned positions (2 extra), biases everywhere, LayerNorm with bias
            (ffn,) = need("ffn_dim")
            positions = (int(config.get("max_position_embeddings") or 2048) + 2) * h
            layer = 4 * h * h + 4 * h + 2 * h * ffn + ffn + h + 4 * h
            project = (
                0 if int(config.get("word_embed_proj_dim") or h) == h else 2 * h * int(config["word_embed_proj_dim"])
            )
            tied = config.get("tie_word_embeddings", True)
            return vocab * h * (1 if tied else 2) + positions + n * layer + 2 * h + project, ""
        if family == "gpt_neox":  # fused QKV and MLP with biases, LayerNorm with bias, untied embed_out
            (ffn,) = need("intermediate_size")
            layer = 4 * h * h + 4 * h + 2 * h * ffn + ffn + h + 4 * h
            return vocab * h * (1 if config.get("tie_word_embeddings", False) else 2) + n * layer + 2 * h, ""
        tied = config.get("tie_word_embeddings", GATED_FAMILIES.get(family, False))
        embeddings = vocab * h * (1 if tied else 2) + h  # and the final norm
        if family.startswith("deepseek"):  # MLA, a first few dense layers, routed and shared experts
            nope, rope, v, rank, ffn, expert, experts, shared, dense = need(
                "qk_nope_head_dim",
                "qk_rope_head_dim",
                "v_head_dim",
                "kv_lora_rank",
                "intermediate_size",
                "moe_intermediate_size",
                "n_routed_experts",
                "n_shared_experts",
                "first_k_dense_replace",
            )
            q_rank = config.get("q_lora_rank")
            q = h * heads * (nope + rope) if not q_rank else h * q_rank + q_rank + q_rank * heads * (nope + rope)
            attention = q + h * (rank + rope) + rank + rank * heads * (nope + v) + heads * v * h
            moe = (experts + shared) * 3 * h * expert + h * experts + (experts if family == "deepseek_v3" else 0)
            return embeddings + n * (attention + 2 * h) + dense * 3 * h * ffn + (n - dense) * moe, ""
        kv = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or h // heads)
        attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
        if family == "qwen2" or config.get("attention_bias"):
            attention += heads * head_dim + 2 * kv * head_dim + (h if config.get("attention_bias") else 0)
        if family in ("qwen3", "qwen3_moe", "gemma3_text"):
            attention += 2 * head_dim  # q_norm and k_norm
        norms = 4 * h if family in ("gemma2", "gemma3_text") else 2 * h
        if family in ("qwen3_moe", "mixtral"):
            experts_key = "num_experts" if family == "qwen3_moe" else "num_local_experts"
            experts, ffn = need(experts_key, "moe_intermediate_size" if family == "qwen3_moe" else "intermediate_size")
            mlp = experts * 3 * h * ffn + h * experts
            dense_layers = len(config.get("mlp_only_layers") or [])
            if dense_layers or int(config.get("decoder_sparse_step") or 1) != 1:
                return 0, "kvlab counts MoE models whose every layer is sparse"
        else:
            (ffn,) = need("intermediate_size")
            mlp = 3 * h * ffn
        return embeddings + n * (attention + mlp + norms), ""
    except KeyError as missing:
        return (
            0,
            f"config.json has no field {missing.args[0]!r}, which kvlab needs to count a {family} model's parameters",
        )
    except (TypeError, ValueError):
        return 0, f"a field kvlab counts a {family} model's parameters from is not a whole number"


def load_config(path: str | Path | dict, name: str | None = None) -> tuple[dict, str]:
    """(the decoder's fields, where they came from) of a Hugging Face config.json (a path or its parsed dict; a
    multimodal wrapper's text_config); one-line errors for a file that is not a JSON object."""
    if isinstance(path, dict):
        config, source = path, name or "config.json"
    else:
        source = str(path)
        try:
            config = json.loads(Path(path).read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            validate.fail("config", source, "must be a UTF-8 JSON text file")
        except json.JSONDecodeError as error:
            validate.fail("config", source, f"must be JSON ({error.msg} at line {error.lineno})")
        except OSError as error:  # missing, a directory, unreadable
            validate.fail("config", source, f"must be the path of a config.json file ({error.strerror or error})")
    if not isinstance(config, dict):
        validate.fail("config", source, f"must hold a JSON object, not a {type(config).__name__}")
    if isinstance(config.get("text_config"), dict):  # multimodal wrappers (Gemma 3) keep the decoder here
        wrapper = {k: config[k] for k in ("model_type", "quantization_config") if k in config}
        config = {"model_type": "", **wrapper, **config["text_config"]}
    return config, source


def _quantization(config: dict, source: str, model_type: str) -> str:
    """ModelSpec.quantization of a config.json, read as vLLM reads quantization_config (Fp8Config.from_config in
    vllm/model_executor/layers/quantization/fp8.py, GptOssMxfp4Config in mxfp4.py): quant_method fp8 with
    weight_block_size is "fp8_block", without it "fp8"; mxfp4 (gpt-oss) is "mxfp4"; none is "" (16-bit)."""
    quant = config.get("quantization_config")
    if quant is None:
        return ""
    served = "kvlab sizes fp8 (per tensor or 128 x 128 blocks) and mxfp4 (gpt-oss) weights"
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "fp8":
        block = quant.get("weight_block_size")
        if block is None:
            return "fp8"
        if list(block) != [FP8_BLOCK, FP8_BLOCK]:
            validate.fail("config", source, f"quantization_config's weight_block_size is {block!r}; {served}")
        return "fp8_block"
    if method == "mxfp4" and model_type == "gpt_oss":
        return "mxfp4"
    what = f"quant_method {method!r}" if method != "mxfp4" else f"mxfp4 on a {model_type or 'non-gpt-oss'} model"
    validate.fail("config", source, f"quantization_config's {what} is not served; {served}")


def from_config(path: str | Path | dict, name: str | None = None, num_params_b: float = 0.0) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (a path or its parsed dict); no hub access. Its parameters are
    num_params_b where given (billions), else count_params' where kvlab counts them, else 0 (unknown)."""
    config, source = load_config(path, name)
    model_type = str(config.get("model_type", ""))
    _field(config, "num_hidden_layers", source, "the number of layers")
    _field(config, "num_attention_heads", source, "the number of heads")
    layers = _whole(config, "num_hidden_layers", source)
    heads = _whole(config, "num_attention_heads", source)
    label = name or config.get("_name_or_path") or source
    local = _local_layers(config, model_type, layers, source)
    window, pattern, layer_types = (0, 0, ()) if local else _sliding(config, model_type, layers, source)
    quantization = _quantization(config, source, model_type)
    counted = not num_params_b and count_params(config)[0] > 0  # a given count is taken as the weights, as given
    num_params_b = num_params_b or count_params(config)[0] / 1e9
    common = {
        "name": label,
        "num_layers": layers,
        "num_attention_heads": heads,
        "sliding_window": window,
        "sliding_window_pattern": pattern,
        "max_position_embeddings": _whole(config, "max_position_embeddings", source, default=0),
        "num_params_b": num_params_b,
        "layer_types": layer_types,
        "hidden_size": _whole(config, "hidden_size", source, default=0),
        "expert_params_b": routed_expert_params(config) / 1e9 if num_params_b else 0.0,
        "vocab_padding_params": vocab_padding_params(config) if counted else 0,
        "quantization": quantization,
        "gated_mlp": model_type not in PLAIN_MLP_FAMILIES,
        **moe_extras(_config_moe_extras(config, model_type)),
        **local,
    }
    if "kv_lora_rank" in config or model_type.startswith("deepseek_v"):
        _field(config, "kv_lora_rank", source, "the MLA latent size")
        _field(config, "qk_rope_head_dim", source, "the MLA latent size")
        rank, rope = _whole(config, "kv_lora_rank", source), _whole(config, "qk_rope_head_dim", source)
        return ModelSpec(
            **common,
            num_kv_heads=1,
            head_dim=rank + rope,
            attention="mla",
            kv_lora_rank=rank,
            qk_rope_head_dim=rope,
            layer_sizes=_layer_sizes(config),
        )
    kv = _whole(config, "num_key_value_heads", source, default=1 if config.get("multi_query") else heads)
    head_dim = config.get("head_dim")
    if head_dim is None:
        _field(config, "hidden_size", source, "the head dim (hidden_size / num_attention_heads)")
        if common["hidden_size"] % heads:
            validate.fail(
                "config",
                source,
                f"hidden_size={common['hidden_size']} must be divisible by num_attention_heads={heads}",
            )
        head_dim = common["hidden_size"] // heads
    if kv > heads or heads % kv:
        validate.fail("config", source, f"num_key_value_heads={kv} must divide num_attention_heads={heads}")
    attention = "mha" if kv == heads else ("mqa" if kv == 1 else "gqa")
    head_dim = _whole(config, "head_dim", source, default=head_dim)
    return ModelSpec(
        **common, num_kv_heads=kv, head_dim=head_dim, attention=attention, layer_sizes=_layer_sizes(config)
    )


def layer_shape(model: ModelSpec) -> tuple[int, ...]:
    """The shapes a decoder layer's operators run at: (heads, KV heads, head dim, hidden size, *model.layer_sizes),
    or () where the sizes are unknown (a config.json that lacks one, or a data/models.csv row whose sizes are empty)."""
    if not model.layer_sizes or not model.hidden_size:
        return ()
    return (model.num_attention_heads, model.num_kv_heads, model.head_dim, model.hidden_size, *model.layer_sizes)


# data/models.csv's columns of a model's layer sizes, as config.json names them (num_experts: also its
# num_local_experts or n_routed_experts); empty where unknown.
LAYER_SIZE_COLUMNS = ("intermediate_size", "vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size")


# data/models.csv's columns of moe_extras, as config.json names them (DeepSeek's shared width: n_shared_experts x
# moe_intermediate_size; Llama 4's: its intermediate_size).
MOE_EXTRA_COLUMNS = ("shared_expert_intermediate_size", "first_k_dense_replace")


def moe_extras(columns: dict) -> dict:
    """ModelSpec's shared_expert_intermediate_size, first_k_dense_replace and dense_intermediate_size from
    MOE_EXTRA_COLUMNS and intermediate_size (the leading dense layers' MLP); zeros where absent."""
    dense = int(columns.get("first_k_dense_replace") or 0)
    return {
        "shared_expert_intermediate_size": int(columns.get("shared_expert_intermediate_size") or 0),
        "first_k_dense_replace": dense,
        "dense_intermediate_size": int(columns.get("intermediate_size") or 0) if dense else 0,
    }


def _config_moe_extras(config: dict, model_type: str) -> dict:
    """A config.json's MOE_EXTRA_COLUMNS (and intermediate_size) as moe_extras reads them: DeepSeek's shared experts
    (n_shared_experts x moe_intermediate_size) and first_k_dense_replace, Qwen2-MoE's and Qwen3-Next's
    shared_expert_intermediate_size, Llama 4's one shared expert of intermediate_size; {} for other models."""
    try:
        if model_type.startswith("deepseek"):
            shared = int(config.get("n_shared_experts") or 0) * int(config.get("moe_intermediate_size") or 0)
            return {
                "shared_expert_intermediate_size": shared,
                "first_k_dense_replace": int(config.get("first_k_dense_replace") or 0),
                "intermediate_size": int(config.get("intermediate_size") or 0),
            }
        if config.get("shared_expert_intermediate_size"):
            return {"shared_expert_intermediate_size": int(config["shared_expert_intermediate_size"])}
        if model_type.startswith("llama4") and config.get("num_local_experts"):
            return {"shared_expert_intermediate_size": int(config.get("intermediate_size") or 0)}
    except (TypeError, ValueError):
        return {}
    return {}


def _layer_sizes(config: dict) -> tuple[int, ...]:
    """from_config's layer_sizes (and get_model's, from the catalog's columns); () when config.json lacks a size."""
    experts = config.get("num_experts", config.get("num_local_experts", config.get("n_routed_experts"))) or 0
    if experts:  # every layer sparse: no dense MLP (Mixtral's experts are intermediate_size wide)
        expert = config.get("moe_intermediate_size") or config.get("intermediate_size")
        fields = [0, config.get("vocab_size"), experts, config.get("num_experts_per_tok"), expert]
    else:
        mlp = config.get("intermediate_size", config.get("ffn_dim"))  # OPT names its MLP ffn_dim
        fields = [mlp, config.get("vocab_size"), 0, 0, 0]
    if any(f is None for f in fields):
        return ()
    try:
        return tuple(int(f) for f in fields)
    except (TypeError, ValueError):
        return ()


def stage_layers(num_layers: int, pipeline_parallel_size: int) -> list[range]:
    """Layer indices of each pipeline stage, split as vLLM splits them (extra layers before the last stage)."""
    num_layers = validate.positive_int("num_layers", num_layers)
    pp = validate.positive_int("pipeline_parallel_size", pipeline_parallel_size)
    if pp > num_layers:
        validate.fail("pipeline_parallel_size", pp, f"must be at most num_layers ({num_layers})")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [0, *itertools.accumulate(sizes)]
    return [range(starts[i], starts[i + 1]) for i in range(pp)]


def weights_bytes_per_gpu(
    model: ModelSpec,
    weight_bytes_per_param: float,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    enable_expert_parallel: bool = False,
) -> float:
    """Weights one GPU holds (bytes): parameters x bytes per parameter / (TP x PP), embeddings split alike, except
    the routed experts (model.expert_params_b), which vLLM splits over the data-parallel GPUs too: / (DP x TP x PP),
    with expert parallelism or without (routed_expert_params); vLLM's vocabulary padding included where kvlab knows
    it (vocab_padding_params, a config.json's). A quantized model (model.quantization) of a 16-bit checkpoint's
    2 bytes a parameter holds what quantized_weights_bytes says."""
    if model.quantization:
        if weight_bytes_per_param != 2:
            validate.fail(
                "weight_bytes_per_param",
                weight_bytes_per_param,
                f"must be 2 (a 16-bit checkpoint) for {model.name}'s {model.quantization} weights",
            )
        return quantized_weights_bytes(
            model, tensor_parallel_size, pipeline_parallel_size, data_parallel_size, enable_expert_parallel
        )
    return _weights_bytes(
        model, weight_bytes_per_param, tensor_parallel_size, pipeline_parallel_size, data_parallel_size
    )


def _weights_bytes(model: ModelSpec, weight_bytes_per_param: float, tp: int, pp: int, dp: int) -> float:
    """weights_bytes_per_gpu of every parameter at weight_bytes_per_param bytes."""
    if model.num_params_b <= 0:
        validate.fail(
            "num_params_b", model.num_params_b, "must be > 0 to estimate the weights; give weights_gib instead"
        )
    validate.positive_number("weight_bytes_per_param", weight_bytes_per_param)
    validate.positive_int("data_parallel_size", dp)
    params_b = model.num_params_b
    if dp > 1:
        params_b -= model.expert_params_b * (1 - 1 / dp)
    params = params_b * 1e9 + model.vocab_padding_params if model.vocab_padding_params else params_b * 1e9
    return params * weight_bytes_per_param / (tp * pp)


FP8_BLOCK = 128  # the block of block-scaled FP8 (weight_block_size [128, 128]): one fp32 scale a 128 x 128 block
MXFP4_BLOCK = 32  # OCP_MX_BLOCK_SIZE: one e8m0 scale (1 byte) a 32 4-bit values
MXFP4_BYTES_PER_WEIGHT = 1 / 2 + 1 / MXFP4_BLOCK  # a 4-bit value and its share of the block's scale
# Hopper's MXFP4 MoE backend (Triton's, the first of _get_priority_backends_for_gpt_oss an SM90 GPU takes) rounds an
# expert's intermediate size per GPU up to a multiple of 64 (mxfp4_round_up_hidden_size_and_intermediate_size).
MXFP4_INTERMEDIATE_ALIGN = 64


def _dense_linear_shapes(model: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """(output, input) per GPU of one decoder layer's linear layers as vLLM builds them: qkv_proj (QKVParallelLinear:
    KV heads replicated when TP exceeds them), o_proj, gate_up_proj (merged gate and up; the up projection alone of a
    plain MLP, model.gated_mlp False: GPT-NeoX's dense_h_to_4h) and down_proj."""
    h, heads, kv, d = model.hidden_size, model.num_attention_heads, model.num_kv_heads, model.head_dim
    ffn = model.layer_sizes[0]
    return [
        ((heads // tp + 2 * max(1, kv // tp)) * d, h),
        (h, heads * d // tp),
        ((2 if model.gated_mlp else 1) * ffn // tp, h),
        (h, ffn // tp),
    ]


def quantized_weights_bytes(
    model: ModelSpec,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    enable_expert_parallel: bool = False,
) -> float:
    """Weights one GPU holds (bytes) as vLLM 0.33 loads model.quantization's: the 16-bit estimate of
    weights_bytes_per_gpu (embeddings, lm_head, norms, biases, routers stay 16-bit), less what the quantized weights
    save, plus their scales.

    "fp8" (per-tensor FP8: `--quantization fp8` on a 16-bit checkpoint, which vLLM runs as fp8_per_tensor,
    Fp8PerTensorOnlineLinearMethod.process_weights_after_loading in
    vllm/model_executor/layers/quantization/online/fp8.py; or a checkpoint's fp8 without blocks): every linear layer
    of a decoder layer (qkv_proj, o_proj, gate_up_proj, down_proj) 1 byte a weight and one fp32 scale.
    "fp8_block" (a checkpoint's fp8 with weight_block_size [128, 128], Fp8LinearMethod.create_weights in
    vllm/model_executor/layers/quantization/fp8.py): those layers 1 byte a weight and one fp32 scale (weight_scale_inv)
    a 128 x 128 block of each GPU's slice, cdiv(output, 128) x cdiv(input, 128). The embeddings and lm_head are no
    LinearBase and stay 16-bit. Exact for dense decoders with layer shapes (a config.json's, or a data/models.csv row's
    sizes). A mixture-of-experts or MLA model in fp8_block (DeepSeek-V3 and R1's checkpoints, which vLLM loads in
    block FP8; fp8_block_estimate) is estimated from its parameter count: the embeddings and lm_head 16-bit, every
    other parameter 1 byte and a 128 x 128 block's scale; "fp8" on such a model is refused.
    "mxfp4" (gpt-oss, GptOssMxfp4MoEMethod.create_weights in vllm/model_executor/layers/quantization/mxfp4.py): the
    routed experts' gate_up (w13) and down (w2) weights 4 bits a weight and one e8m0 byte a 32 (w13_weight_scale,
    w2_weight_scale), with an expert's intermediate size per GPU (intermediate_size / (DP x TP), whole with expert
    parallelism) rounded up to a multiple of 64 (MXFP4_INTERMEDIATE_ALIGN) as is the bf16 w13_bias; attention, router
    and embeddings stay bf16 (Mxfp4Config.get_quant_method: UnquantizedLinearMethod). Without the expert size (a
    config.json or data/models.csv row without layer sizes) no padding is added: exact where that size per GPU is a
    multiple of 64 (gpt-oss's 2,880 at TP 1 or with expert parallelism)."""
    tp = validate.positive_int("tensor_parallel_size", tensor_parallel_size)
    pp = validate.positive_int("pipeline_parallel_size", pipeline_parallel_size)
    dp = validate.positive_int("data_parallel_size", data_parallel_size)
    quant = validate.one_of("quantization", model.quantization, QUANTIZATIONS)
    bf16 = _weights_bytes(model, 2, tp, pp, dp)
    if not quant:
        return bf16
    layers = model.num_layers / pp
    if quant in ("fp8", "fp8_block"):
        dense = len(model.layer_sizes) == 5 and model.layer_sizes[0] > 0 and model.layer_sizes[2] == 0
        if quant == "fp8_block" and len(model.layer_sizes) == 5 and model.hidden_size:
            if model.attention == "mla" or not dense:
                return fp8_block_estimate(model, tp, pp, dp)
        if model.attention == "mla" or not dense or not model.hidden_size:
            validate.fail(
                "quantization",
                quant,
                f"kvlab sizes {quant} weights of dense (not MLA, not mixture-of-experts) decoders read from a "
                f"config.json; {model.name} is not one"
                + ("" if model.layer_sizes else " (no layer shapes: give its config.json with --config)"),
            )
        h, heads, kv, d, ffn = (
            model.hidden_size,
            model.num_attention_heads,
            model.num_kv_heads,
            model.head_dim,
            model.layer_sizes[0],
        )
        mlp = (3 if model.gated_mlp else 2) * h * ffn
        linear = model.num_layers * (h * (heads + 2 * kv) * d + heads * d * h + mlp)  # whole model
        shapes = _dense_linear_shapes(model, tp)
        if quant == "fp8":
            scales = len(shapes) * 4
        else:
            scales = sum(-(-out // FP8_BLOCK) * -(-inp // FP8_BLOCK) for out, inp in shapes) * 4
        return bf16 - linear * (2 - 1) / (tp * pp) + layers * scales
    return _mxfp4_weights_bytes(model, bf16, tp, pp, dp, enable_expert_parallel)


def fp8_block_estimate(model: ModelSpec, tp: int = 1, pp: int = 1, dp: int = 1) -> float:
    """Weights one GPU holds (bytes) of a mixture-of-experts or MLA model whose checkpoint is block FP8 (DeepSeek-V3
    and R1), estimated from its parameter count and sizes, not its layers: the embeddings and lm_head (2 x vocab x
    hidden, untied, and vLLM's vocabulary padding where known) 16-bit, every other parameter 1 byte and one fp32 scale
    a 128 x 128 block (4 / 16,384 bytes a weight), split as weights_bytes_per_gpu splits the 16-bit parameters (the
    routed experts over DP x TP x PP too). What it leaves out: the routers (DeepSeek's gate stays bf16 and its
    e_score_correction_bias fp32) and norms are counted at 1 byte, and each GPU's slices round up to whole blocks;
    for DeepSeek-V3 at TP 1 it is 0.016% under the bytes its layers give (673,043,149,609 of 673,150,611,808 from
    its 671,026,419,200 parameters; 0.020% under from the catalog's rounded 671.0 B)."""
    embeddings = 2 * model.layer_sizes[1] * model.hidden_size + model.vocab_padding_params
    per_weight = 1 + 4 / FP8_BLOCK**2
    return _weights_bytes(model, per_weight, tp, pp, dp) + embeddings * (2 - per_weight) / (tp * pp)


def _mxfp4_weights_bytes(model: ModelSpec, bf16: float, tp: int, pp: int, dp: int, enable_expert_parallel: bool):
    """quantized_weights_bytes of an mxfp4 model, from its 16-bit estimate bf16."""
    layers = model.num_layers / pp
    if model.expert_params_b <= 0 or not model.hidden_size:
        validate.fail("quantization", "mxfp4", f"mxfp4 quantizes gpt-oss's routed experts, and {model.name} has none")
    group = dp * tp
    expert_params = model.expert_params_b * 1e9 / (group * pp)  # what the 16-bit estimate charges a GPU
    packed = expert_params * MXFP4_BYTES_PER_WEIGHT
    padding = 0.0
    if len(model.layer_sizes) == 5 and model.layer_sizes[2]:
        experts, size = model.layer_sizes[2], model.layer_sizes[4]
        local_experts, local_size = (experts // group, size) if enable_expert_parallel else (experts, size / group)
        padded = -(-int(local_size) // MXFP4_INTERMEDIATE_ALIGN) * MXFP4_INTERMEDIATE_ALIGN
        extra = local_experts * (padded - local_size)  # rows of w13 (x2) and columns of w2 each expert gains
        padding = layers * extra * (3 * model.hidden_size * MXFP4_BYTES_PER_WEIGHT + 2 * 2)
    return bf16 - expert_params * 2 + packed + padding


__all__ = [
    "ModelSpec",
    "GpuSpec",
    "layer_shape",
    "COUNTED_FAMILIES",
    "count_params",
    "routed_expert_params",
    "vocab_padding_params",
    "load_config",
    "ATTENTIONS",
    "load_models",
    "load_gpus",
    "get_model",
    "get_gpu",
    "from_config",
    "interval_layer_types",
    "LAYER_TYPES",
    "LINEAR_FIELDS",
    "LAYER_SIZE_COLUMNS",
    "stage_layers",
    "weights_bytes_per_gpu",
    "quantized_weights_bytes",
    "fp8_block_estimate",
    "QUANTIZATIONS",
    "PLAIN_MLP_FAMILIES",
]
