"""The catalogs' layer sizes, quantization and GPUs (data/models.csv, data/gpus.csv, data/operator_gpus.csv)."""

import csv

import pytest

from kvlab.core import models
from kvlab.core.models import DATA_DIR, LAYER_SIZE_COLUMNS, get_gpu, get_model, layer_shape, load_gpus, load_models

CONFIGS = DATA_DIR.parent / "tests" / "data" / "configs"
QUANTIZATIONS = ("", "fp8", "fp8_block", "mxfp4")
# Rows whose config.json sizes no citable public copy was found for (data/README.md): their sizes stay empty.
SIZES_UNKNOWN = {
    "Qwen/Qwen2.5-72B-Instruct",
    "microsoft/phi-4",
    "Qwen/Qwen3-Next-80B-A3B-Instruct",
}


def test_every_row_has_its_layer_sizes_or_is_listed_unknown():
    rows = load_models()
    assert SIZES_UNKNOWN <= set(rows)
    for name, row in rows.items():
        spec = get_model(name)
        if name in SIZES_UNKNOWN:
            assert spec.layer_sizes == () and all(row[c] == "" for c in LAYER_SIZE_COLUMNS), name
        else:
            assert len(spec.layer_sizes) == 5 and all(row[c] != "" for c in LAYER_SIZE_COLUMNS), name
            assert len(layer_shape(spec)) == 9, name


def test_moe_rows_have_no_dense_mlp_and_some_experts():
    moe = [name for name, row in load_models().items() if int(row["num_experts"] or 0)]
    assert len(moe) == 11
    for name in moe:
        intermediate, vocab, experts, per_token, expert = get_model(name).layer_sizes
        assert intermediate == 0 and vocab > 0 and experts > per_token > 0 and expert > 0, name
        assert get_model(name).expert_params_b > 0, name
    for name in load_models():
        if name not in moe and name not in SIZES_UNKNOWN:
            assert get_model(name).layer_sizes[0] > 0 and get_model(name).layer_sizes[2:] == (0, 0, 0), name


@pytest.mark.parametrize(
    "name,sizes",
    [
        ("meta-llama/Llama-3.1-8B", (14336, 128256, 0, 0, 0)),
        ("Qwen/Qwen3-30B-A3B", (0, 151936, 128, 8, 768)),
        # gpt-oss: 32 experts of intermediate_size 2880 (no moe_intermediate_size), 4 a token
        ("openai/gpt-oss-20b", (0, 201088, 32, 4, 2880)),
        # Mixtral's experts are intermediate_size wide
        ("mistralai/Mixtral-8x7B-v0.1", (0, 32000, 8, 2, 14336)),
        # DeepSeek names its experts n_routed_experts; the first 3 dense layers' 18432 is not in the tuple
        ("deepseek-ai/DeepSeek-V3", (0, 129280, 256, 8, 2048)),
        ("deepseek-ai/DeepSeek-R1", (0, 129280, 256, 8, 2048)),
        ("Qwen/Qwen3-4B", (9728, 151936, 0, 0, 0)),
        # Llama 2: 32,000 tokens (scaleapi/llm-engine's copy of the config.json)
        ("meta-llama/Llama-2-70b-hf", (28672, 32000, 0, 0, 0)),
        # Llama 3 base: the 128,256-token vocabulary and MLP of Llama 3.1-8B
        ("meta-llama/Meta-Llama-3-8B", (14336, 128256, 0, 0, 0)),
        # Gemma 2: MaxText's HF config (intermediate 36,864) with Gemma2Config's vocabulary, 256,000
        ("google/gemma-2-27b-it", (36864, 256000, 0, 0, 0)),
        # Gemma 3: text_config has no vocab_size, so Gemma3TextConfig's 262,208 (not the tokenizer's 262,144)
        ("google/gemma-3-27b-it", (21504, 262208, 0, 0, 0)),
    ],
)
def test_hand_checked_sizes(name, sizes):
    assert get_model(name).layer_sizes == sizes


def test_catalog_rows_match_from_config_of_the_same_config_json():
    """get_model reads the columns as from_config reads the config.json (the committed fixtures)."""
    for fixture, name in [
        ("llama-3.1-8b-instruct.json", "meta-llama/Llama-3.1-8B-Instruct"),
        ("mistral-7b-v0.1.json", "mistralai/Mistral-7B-v0.1"),
        ("qwen2.5-7b-instruct.json", "Qwen/Qwen2.5-7B-Instruct"),
        ("qwen3-30b-a3b.json", "Qwen/Qwen3-30B-A3B"),
        ("phi-3-mini-4k-instruct.json", "microsoft/Phi-3-mini-4k-instruct"),
        ("gemma-2-9b-it.json", "google/gemma-2-9b-it"),
        ("deepseek-v2-lite.json", "deepseek-ai/DeepSeek-V2-Lite"),
        ("gpt-neox-20b.json", "EleutherAI/gpt-neox-20b"),
        ("opt-13b.json", "facebook/opt-13b"),
    ]:
        assert models.from_config(CONFIGS / fixture).layer_sizes == get_model(name).layer_sizes, name


def test_quantization_column_holds_allowed_values():
    values = {name: row["quantization"] for name, row in load_models().items()}
    assert set(values.values()) <= set(QUANTIZATIONS)
    assert {n for n, q in values.items() if q} == {
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-R1",
        "openai/gpt-oss-20b",
        "openai/gpt-oss-120b",
    }
    assert get_model("DeepSeek-V3").quantization == get_model("DeepSeek-R1").quantization == "fp8_block"
    assert get_model("gpt-oss-20b").quantization == get_model("gpt-oss-120b").quantization == "mxfp4"
    assert get_model("Llama-3.1-8B").quantization == ""


def test_new_rows_are_in_the_catalog():
    names = set(load_models())
    for name in [
        "meta-llama/Llama-3.3-70B-Instruct",
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-4B",
        "openai/gpt-oss-120b",
        "mistralai/Mixtral-8x22B-v0.1",
        "deepseek-ai/DeepSeek-R1",
        "meta-llama/Llama-3.1-8B",
    ]:
        assert name in names
    assert len(names) == 35
    r1, v3 = get_model("DeepSeek-R1"), get_model("DeepSeek-V3")
    assert (r1.num_layers, r1.head_dim, r1.kv_lora_rank, r1.expert_params_b) == (
        v3.num_layers,
        v3.head_dim,
        v3.kv_lora_rank,
        v3.expert_params_b,
    )
    big = get_model("gpt-oss-120b")
    assert (big.num_layers, big.sliding_window, big.sliding_window_pattern) == (36, 128, 2)
    assert big.expert_params_b == pytest.approx(36 * 128 * 3 * 2880 * 2880 / 1e9)


def test_every_operator_gpu_is_a_catalog_gpu():
    with open(DATA_DIR / "operator_gpus.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["aiconfigurator_system"] for r in rows] == [
        "a100_sxm",
        "b200_sxm",
        "b300_sxm",
        "gb200",
        "gb300",
        "h100_sxm",
        "h200_sxm",
        "l40s",
        "rtx_pro_6000_server",
        "b60",
    ]
    gpus = load_gpus()
    for row in rows:
        assert row["gpu"] in gpus
        gpu = get_gpu(row["gpu"])
        assert gpu.memory_gib > 0 and gpu.memory_bandwidth_gb_s > 0 and gpu.bf16_dense_tflops > 0
        assert gpu.source
    assert get_gpu("B300-SXM").memory_gib == 268.59  # 275,040 MiB
    assert get_gpu("Arc-Pro-B60-24GB").memory_bandwidth_gb_s == 456
