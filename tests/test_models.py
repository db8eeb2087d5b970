"""Model specs: the catalogs, config.json parsing as vLLM reads it, pipeline stages, one-line errors."""

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core import models
from kvlab.core.models import ModelSpec

CONFIGS = Path(__file__).parent / "data" / "configs"

# fixture file -> the catalog row it must agree with
FIXTURES = {
    "llama-3.1-8b-instruct.json": "meta-llama/Llama-3.1-8B-Instruct",
    "mistral-7b-v0.1.json": "mistralai/Mistral-7B-v0.1",
    "qwen2.5-7b-instruct.json": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3-30b-a3b.json": "Qwen/Qwen3-30B-A3B",
    "phi-3-mini-4k-instruct.json": "microsoft/Phi-3-mini-4k-instruct",
    "gemma-2-9b-it.json": "google/gemma-2-9b-it",
    "gemma-3-27b-it.json": "google/gemma-3-27b-it",
    "deepseek-v2-lite.json": "deepseek-ai/DeepSeek-V2-Lite",
    "opt-13b.json": "facebook/opt-13b",
    "gpt-neox-20b.json": "EleutherAI/gpt-neox-20b",
}
SHAPE = [
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "attention",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "sliding_window",
    "sliding_window_pattern",
    "max_position_embeddings",
    "hidden_size",
    "expert_params_b",
    "layer_sizes",
    "shared_expert_intermediate_size",
    "first_k_dense_replace",
    "dense_intermediate_size",
]


@pytest.mark.parametrize("fixture,name", FIXTURES.items())
def test_config_json_gives_the_catalog_shape(fixture, name):
    parsed = models.from_config(CONFIGS / fixture)
    listed = models.get_model(name)
    # the shape, and the layer sizes where the file gives them all (gemma-3-27b-it's has no vocab_size: data/README.md)
    shape = [k for k in SHAPE if k != "layer_sizes" or parsed.layer_sizes]
    assert {k: getattr(parsed, k) for k in shape} == {k: getattr(listed, k) for k in shape}
    assert listed.hidden_size > 0


def test_catalogs_are_large_enough_and_sourced():
    table = models.load_models()
    assert len(table) >= 15
    assert all(row["config_source"].startswith("https://huggingface.co/") for row in table.values())
    assert all(row["params_source"] for row in table.values())
    assert {"mha", "gqa", "mla"} <= {row["attention"] for row in table.values()}
    for name in table:  # every row is a valid spec
        models.get_model(name)
    gpus = models.load_gpus()
    assert len(gpus) >= 10
    assert all(
        float(row[k]) > 0 for row in gpus.values() for k in ("memory_gib", "memory_bandwidth_gb_s", "bf16_dense_tflops")
    )
    assert all(row["source"].startswith("https://") for row in gpus.values())


def test_sliding_layers_per_architecture():
    assert models.get_model("gemma-3-27b-it").num_sliding_layers == 62 - 62 // 6  # 5 local : 1 global
    assert models.get_model("gemma-2-9b-it").num_sliding_layers == 21  # alternating
    assert models.get_model("Mistral-7B-v0.1").num_sliding_layers == 32  # every layer
    assert models.from_config(CONFIGS / "qwen2.5-7b-instruct.json").sliding_window == 0  # use_sliding_window false
    gemma2 = models.get_model("gemma-2-9b-it")
    assert [gemma2.is_sliding(i) for i in range(4)] == [True, False, True, False]


def test_layer_types_are_read_as_a_pattern():
    config = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 512,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
    }
    spec = models.from_config(config)
    assert (spec.sliding_window, spec.sliding_window_pattern, spec.num_sliding_layers) == (512, 6, 10)
    config["layer_types"] = ["full_attention"] * 12
    assert models.from_config(config).sliding_window_pattern == 0


def test_layer_types_without_a_pattern_are_kept_per_layer():
    """vLLM reads any layout of layer_types (full layers first, uneven counts); kvlab keeps it layer by layer."""
    types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(8)]
    config = {
        "model_type": "llama",
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "sliding_window": 1024,
        "layer_types": types,
    }
    spec = models.from_config(config)
    assert (spec.sliding_window_pattern, spec.layer_types, spec.num_sliding_layers) == (0, tuple(types), 6)
    assert [spec.is_sliding(i) for i in range(5)] == [False, True, True, True, False]
    with pytest.raises(
        ValueError,
        match=r"^config='cfg' is not allowed: layer_types holds mamba; "
        "kvlab models full_attention, sliding_attention, chunked_attention and linear_attention layers only$",
    ):
        models.from_config({**config, "layer_types": ["mamba"] * 8}, name="cfg")
    with pytest.raises(ValueError, match="layer_types must list num_hidden_layers=8 layers"):
        models.from_config({**config, "layer_types": types[:7]})
    with pytest.raises(ValueError, match="sliding_window=0 is not allowed: must be 0 exactly when layer_types"):
        ModelSpec("x", 8, 8, 4, 128, sliding_window=0, layer_types=tuple(types))
    with pytest.raises(ValueError, match="layer_types=.* is not allowed: must name each of the 8 layers"):
        ModelSpec("x", 8, 8, 4, 128, sliding_window=1024, layer_types=("sliding_attention",) * 7)


def test_mla_latent_is_rank_plus_rope():
    spec = models.from_config(CONFIGS / "deepseek-v2-lite.json")
    assert (spec.attention, spec.num_kv_heads, spec.head_dim) == ("mla", 1, 512 + 64)


def test_missing_field_is_named(tmp_path):
    config = json.loads((CONFIGS / "llama-3.1-8b-instruct.json").read_text())
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"has no field 'num_hidden_layers'") as error:
        models.from_config(path)
    assert "\n" not in str(error.value)
    del config["head_dim"], config["hidden_size"]
    config["num_hidden_layers"] = 32
    with pytest.raises(ValueError, match="'hidden_size'"):
        models.from_config(config)
    with pytest.raises(ValueError, match="'kv_lora_rank'"):
        models.from_config({"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128})


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"num_attention_heads": 32, "num_kv_heads": 6, "attention": "gqa"}, "must divide num_attention_heads"),
        ({"num_attention_heads": 32, "num_kv_heads": 8, "attention": "mha"}, "must equal num_attention_heads"),
        ({"num_attention_heads": 32, "num_kv_heads": 2, "attention": "mqa"}, "must be 1 for mqa"),
    ],
)
def test_heads_must_divide_as_the_architecture_requires(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(name="x", num_layers=4, head_dim=64, **kwargs)


def test_config_heads_not_divisible():
    with pytest.raises(ValueError, match="num_key_value_heads=3 must divide num_attention_heads=32"):
        models.from_config(
            {"num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 3, "head_dim": 64}
        )
    with pytest.raises(ValueError, match="must be kv_lora_rank \\+ qk_rope_head_dim"):
        ModelSpec("x", 2, 16, 1, 512, "mla", 512, 64)


def test_unknown_names_list_close_matches():
    with pytest.raises(ValueError, match="did you mean meta-llama/Meta-Llama-3-8B"):
        models.get_model("llama-3-8b")
    with pytest.raises(ValueError, match="did you mean H100-SXM-80GB or H100-PCIe-80GB"):
        models.get_gpu("H100")
    assert models.get_model("qwen3-14b").name == "Qwen/Qwen3-14B"  # the part after '/' in any case


def test_unreadable_config_paths(tmp_path):
    with pytest.raises(ValueError, match="must be the path of a config.json"):
        models.from_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="must be JSON"):
        models.from_config(tmp_path / "bad.json")


def test_pipeline_stages_split_as_vllm():
    assert [len(s) for s in models.stage_layers(27, 2)] == [14, 13]
    assert [len(s) for s in models.stage_layers(32, 3)] == [11, 11, 10]
    assert [len(s) for s in models.stage_layers(61, 4)] == [
        15,
        15,
        16,
        15,
    ]  # vllm get_pp_indices: extra layers before the last stage
    with pytest.raises(ValueError, match="must be at most num_layers"):
        models.stage_layers(4, 8)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.integers(1, 16))
def test_pipeline_stages_cover_every_layer_once(num_layers, pp):
    if pp > num_layers:
        return
    stages = models.stage_layers(num_layers, pp)
    assert [i for s in stages for i in s] == list(range(num_layers))
    sizes = [len(s) for s in stages]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) == math.ceil(num_layers / pp)


def test_weights_estimate():
    spec = models.get_model("Llama-3.1-70B-Instruct")
    assert models.weights_bytes_per_gpu(spec, 2, tensor_parallel_size=4) == pytest.approx(70.55e9 * 2 / 4)
    # OPT-13B's own parameters, and the 32 rows of 5,120 vLLM pads its 50,272-token vocabulary with (tied lm_head)
    assert (
        models.weights_bytes_per_gpu(models.from_config(CONFIGS / "opt-13b.json"), 2) == (12_853_473_280 + 163_840) * 2
    )
    unknown = {**json.loads((CONFIGS / "opt-13b.json").read_text()), "model_type": "falcon"}
    with pytest.raises(ValueError, match="give weights_gib instead"):
        models.weights_bytes_per_gpu(models.from_config(unknown), 2)


@pytest.mark.parametrize(
    "field, value",
    [("num_hidden_layers", "x"), ("num_key_value_heads", 2.5), ("hidden_size", [4096]), ("head_dim", True)],
)
def test_a_field_that_is_not_a_whole_number_is_named(field, value):
    config = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        field: value,
    }
    with pytest.raises(ValueError, match=rf"^config='cfg' is not allowed: field '{field}' is .*, not a whole number$"):
        models.from_config(config, name="cfg")


# Each fixture's parameters as its published weights hold them (the model card or the safetensors metadata the
# catalog's params_source names), counted from config.json alone.
PUBLISHED_PARAMS = {
    "llama-3.1-8b-instruct.json": 8_030_261_248,
    "mistral-7b-v0.1.json": 7_241_732_096,
    "qwen2.5-7b-instruct.json": 7_615_616_512,
    "qwen3-30b-a3b.json": 30_532_122_624,
    "phi-3-mini-4k-instruct.json": 3_821_079_552,
    "gemma-2-9b-it.json": 9_241_705_984,
    "deepseek-v2-lite.json": 15_706_484_224,
    "opt-13b.json": 12_853_473_280,
    "gpt-neox-20b.json": 20_554_567_680,
}


@pytest.mark.parametrize("fixture, published", PUBLISHED_PARAMS.items())
def test_parameters_are_counted_from_config_json_to_the_published_figure(fixture, published):
    assert models.count_params(json.loads((CONFIGS / fixture).read_text())) == (published, "")
    spec = models.from_config(CONFIGS / fixture)
    assert spec.num_params_b == published / 1e9
    listed = models.get_model(FIXTURES[fixture]).num_params_b  # the catalog's figure, at its own precision
    assert round(spec.num_params_b, len(str(listed).split(".")[1])) == listed


def test_a_model_kvlab_cannot_count_says_why_and_keeps_a_given_count():
    gemma3 = models.from_config(CONFIGS / "gemma-3-27b-it.json")  # the fixture leaves out vocab_size
    assert gemma3.num_params_b == 0.0
    config = json.loads((CONFIGS / "gemma-3-27b-it.json").read_text())["text_config"]
    assert models.count_params({**config, "model_type": "gemma3_text"})[1] == (
        "config.json has no field 'vocab_size', which kvlab needs to count a gemma3_text model's parameters"
    )
    assert "not of falcon" in models.count_params({"model_type": "falcon"})[1]
    assert models.from_config(CONFIGS / "opt-13b.json", num_params_b=13.0).num_params_b == 13.0


def test_a_config_gives_the_layer_shape_a_profile_is_matched_on():
    spec = models.from_config(CONFIGS / "qwen3-30b-a3b.json")
    # heads, KV heads, head dim, hidden, no dense MLP, vocabulary, 128 experts, 8 a token, 768 wide
    assert models.layer_shape(spec) == (32, 4, 128, 2048, 0, 151936, 128, 8, 768)
    # the catalog's row holds the same config.json's sizes (data/models.csv), so it has the same shape
    assert models.layer_shape(models.get_model("Qwen/Qwen3-30B-A3B")) == models.layer_shape(spec)
    # OPT names its MLP ffn_dim (an up and a down projection: gated_mlp False)
    opt = models.get_model("facebook/opt-13b")
    assert models.layer_shape(opt) == (40, 40, 128, 5120, 20480, 50272, 0, 0, 0) and not opt.gated_mlp
