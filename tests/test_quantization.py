"""Weights as vLLM 0.33 loads them quantized (kvlab.core.models.quantized_weights_bytes), config.json's
quantization_config, and --quantization on kvlab capacity, simulate and plan."""

import dataclasses
import json

import pytest

from conftest import ROOT
from kvlab.cli import main
from kvlab.core import models

LLAMA = ROOT / "tests" / "data" / "configs" / "llama-3.1-8b-instruct.json"


def llama():
    return models.from_config(LLAMA)


def test_16_bit_weights_are_unchanged():
    spec = llama()
    assert spec.quantization == ""
    assert models.weights_bytes_per_gpu(spec, 2) == 8_030_261_248 * 2
    assert models.quantized_weights_bytes(spec) == 8_030_261_248 * 2


def test_fp8_per_tensor_llama_8b():
    # A layer's linear weights: qkv 4,096 x (32 + 2 x 8) x 128 = 25,165,824; o 4,096 x 4,096 = 16,777,216;
    # gate_up 2 x 14,336 x 4,096 = 117,440,512; down 14,336 x 4,096 = 58,720,256: 218,103,808, x 32 layers
    # = 6,979,321,856 weights at 1 byte instead of 2, and 4 fp32 scales a layer (512 B). Embeddings, lm_head
    # (2 x 128,256 x 4,096) and norms stay bf16.
    spec = dataclasses.replace(llama(), quantization="fp8")
    assert models.weights_bytes_per_gpu(spec, 2) == 16_060_522_496 - 6_979_321_856 + 32 * 4 * 4 == 9_081_201_152


def test_fp8_per_tensor_gpt_neox_20b_has_a_plain_mlp():
    # GPT-NeoX's MLP is up and down alone (dense_h_to_4h, dense_4h_to_h): a layer's linear weights are qkv
    # 6,144 x 3 x 6,144 = 113,246,208; dense 37,748,736; the MLP 2 x 6,144 x 24,576 = 301,989,888: 452,984,832, x 44
    # layers = 19,931,332,608 at 1 byte; 4 fp32 scales a layer. Its 20,554,567,680 parameters (count_params).
    spec = models.from_config(ROOT / "tests" / "data" / "configs" / "gpt-neox-20b.json")
    assert not spec.gated_mlp and llama().gated_mlp
    fp8 = dataclasses.replace(spec, quantization="fp8")
    expected = 20_554_567_680 * 2 - 19_931_332_608 + 44 * 16
    assert models.weights_bytes_per_gpu(fp8, 2) == expected == 21_177_803_456
    # the catalog row (its model_type gpt_neox) alike, from its rounded 20.55 B
    row = dataclasses.replace(models.get_model("gpt-neox-20b"), quantization="fp8")
    assert not row.gated_mlp
    assert models.weights_bytes_per_gpu(row, 2) == pytest.approx(20.55e9 * 2 - 19_931_332_608 + 44 * 16, rel=1e-12)


def test_fp8_block_llama_8b():
    # fp32 scales a 128 x 128 block: qkv 48 x 32, o 32 x 32, gate_up 224 x 32, down 32 x 112 = 13,312 a layer.
    spec = dataclasses.replace(llama(), quantization="fp8_block")
    expected = 16_060_522_496 - 6_979_321_856 + 32 * 13_312 * 4
    assert models.weights_bytes_per_gpu(spec, 2) == expected == 9_082_904_576


def test_mxfp4_gpt_oss_20b():
    # 24 layers x 32 experts x 3 x 2,880 x 2,880 = 19,110,297,600 expert weights: 4 bits each and an e8m0 byte a
    # 32 (17/32 bytes) instead of 2 bytes; the other 1.8B parameters stay bf16 (20.91B of data/models.csv).
    spec = dataclasses.replace(models.get_model("gpt-oss-20b"), quantization="mxfp4")
    experts = 19_110_297_600
    assert models.weights_bytes_per_gpu(spec, 2) == pytest.approx(20.91e9 * 2 - experts * 2 + experts * 17 / 32)


def test_mxfp4_pads_the_expert_size_per_gpu_to_64():
    # From a config.json (the expert size known): at TP 2 each GPU's 1,440 becomes 1,472 (Hopper's Triton backend):
    # 32 extra a layer and expert, 3 x 2,880 x 17/32 bytes of weights and scales and 2 x 2 bytes of w13_bias each.
    spec = _gpt_oss_config()
    one = models.weights_bytes_per_gpu(spec, 2, 2)
    no_pad = dataclasses.replace(spec, layer_sizes=())
    assert one - models.weights_bytes_per_gpu(no_pad, 2, 2) == pytest.approx(24 * 32 * 32 * (3 * 2880 * 17 / 32 + 4))
    # with expert parallelism each GPU holds 16 whole experts of 2,880: no padding
    assert models.weights_bytes_per_gpu(spec, 2, 2, 1, 1, True) == models.weights_bytes_per_gpu(no_pad, 2, 2)


def _gpt_oss_config():
    raw = {k: v for k, v in _gpt_oss_raw().items() if k != "_name_or_path"}
    return models.from_config(raw, num_params_b=20.914757184)


def test_from_config_reads_quantization_config():
    base = json.loads(LLAMA.read_text())
    assert models.from_config({**base, "quantization_config": {"quant_method": "fp8"}}).quantization == "fp8"
    block = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    assert models.from_config({**base, "quantization_config": block}).quantization == "fp8_block"
    assert _gpt_oss_config().quantization == "mxfp4"
    with pytest.raises(ValueError, match=r"quant_method 'awq' is not served; kvlab sizes fp8"):
        models.from_config({**base, "quantization_config": {"quant_method": "awq"}})
    with pytest.raises(ValueError, match=r"weight_block_size is \[64, 64\]"):
        models.from_config({**base, "quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}})
    with pytest.raises(ValueError, match=r"mxfp4 on a llama model is not served"):
        models.from_config({**base, "quantization_config": {"quant_method": "mxfp4"}})


def test_model_spec_refuses_an_unknown_quantization():
    with pytest.raises(ValueError, match=r"quantization='int4' is not allowed"):
        dataclasses.replace(llama(), quantization="int4")


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_capacity_flag_and_json(capsys):
    args = ["capacity", "--config", str(LLAMA), "--gpu", "H100-SXM-80GB", "--max-model-len", "8192", "--json"]
    code, out, _ = run(capsys, *args, "--quantization", "fp8")
    assert code == 0
    result = json.loads(out)
    assert result["quantization"] == "fp8"
    assert result["weights_gib"] == 9_081_201_152 / 2**30
    code, out, _ = run(capsys, *args)
    assert json.loads(out)["quantization"] == "none"
    assert json.loads(out)["weights_gib"] == 16_060_522_496 / 2**30


def test_catalog_row_with_layer_sizes_takes_fp8(capsys):
    # data/models.csv's Llama-3.1-8B-Instruct row: 8.03 B parameters (rounded), its layer sizes as its config.json's.
    # The linear layers' 6,979,321,856 weights (test_fp8_per_tensor_llama_8b) at 1 byte, 4 fp32 scales a layer.
    args = ["capacity", "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-SXM-80GB", "--max-model-len", "8192"]
    code, out, err = run(capsys, *args, "--json", "--quantization", "fp8")
    assert code == 0, err
    result = json.loads(out)
    assert result["quantization"] == "fp8"
    assert result["weights_gib"] == pytest.approx((16_060_000_000 - 6_979_321_856 + 512) / 2**30, rel=1e-12)
    assert 16_060_000_000 - 6_979_321_856 + 512 == 9_080_678_656  # vLLM's 9,081,201,152 less 8.03 B's rounding x 2
    code, out, _ = run(capsys, *args, "--json")
    assert json.loads(out)["weights_gib"] == pytest.approx(16_060_000_000 / 2**30, rel=1e-12)


# DeepSeek-V3's config.json: hidden 7,168, vocab 129,280, 61 layers (3 dense, first_k_dense_replace), MLA with
# q_lora_rank 1,536, kv_lora_rank 512, qk_rope 64, qk_nope 128, v_head 128, 128 heads; intermediate 18,432;
# 256 routed experts of 2,048 and 1 shared; its checkpoint block FP8, 128 x 128.
def _deepseek_v3_layers() -> tuple[int, int]:
    """(parameters, bytes at TP 1 as vLLM builds DeepSeek-V3's layers in block FP8), counted layer by layer."""
    h, vocab, layers, dense, heads = 7168, 129280, 61, 3, 128

    def blocks(shapes):
        return sum(-(-out // 128) * -(-inp // 128) for out, inp in shapes)

    attention = [(1536 + 512 + 64, h), (heads * 192, 1536), (heads * 256, 512), (h, heads * 128)]
    mlp, expert = [(2 * 18432, h), (h, 18432)], [(2 * 2048, h), (h, 2048)]
    linear = sum(o * i for o, i in attention) * layers + sum(o * i for o, i in mlp) * dense
    linear += sum(o * i for o, i in expert) * 257 * (layers - dense)
    scales = blocks(attention) * layers + blocks(mlp) * dense + blocks(expert) * 257 * (layers - dense)
    embeddings, norms = 2 * vocab * h, h + layers * (2 * h + 1536 + 512)
    router, bias = (layers - dense) * 256 * h, (layers - dense) * 256  # gate bf16, e_score_correction_bias fp32
    params = embeddings + norms + router + bias + linear
    return params, 2 * (embeddings + norms + router) + 4 * bias + linear + 4 * scales


def test_fp8_block_deepseek_v3_is_estimated_from_its_parameters():
    params, layer_bytes = _deepseek_v3_layers()
    assert (params, layer_bytes) == (671_026_419_200, 673_150_611_808)
    v3 = models.get_model("DeepSeek-V3")
    assert v3.quantization == "fp8_block"
    embeddings = 2 * 129280 * 7168
    estimate = (671.0e9 - embeddings) * (1 + 4 / 128**2) + 2 * embeddings
    assert models.weights_bytes_per_gpu(v3, 2) == pytest.approx(estimate, rel=1e-12)
    assert estimate / layer_bytes - 1 == pytest.approx(-0.000199, abs=1e-6)  # the rounded 671.0 B and the routers
    exact_params = dataclasses.replace(v3, num_params_b=params / 1e9)
    assert models.weights_bytes_per_gpu(exact_params, 2) / layer_bytes - 1 == pytest.approx(-0.00016, abs=1e-5)
    # about half the 16-bit estimate; TP 8 splits it evenly, DP 2 splits the routed experts once more
    assert models.weights_bytes_per_gpu(v3, 2) / (671.0e9 * 2) == pytest.approx(0.5016, abs=1e-4)
    assert models.weights_bytes_per_gpu(v3, 2, 8) == pytest.approx(estimate / 8, rel=1e-12)
    experts = v3.expert_params_b * 1e9 * (1 + 4 / 128**2)
    assert models.weights_bytes_per_gpu(v3, 2, 1, 1, 2) == pytest.approx(estimate - experts / 2, rel=1e-12)
    with pytest.raises(ValueError, match="not MLA, not mixture-of-experts"):
        models.weights_bytes_per_gpu(dataclasses.replace(v3, quantization="fp8"), 2)
    # DeepSeek-R1: the same architecture and checkpoint format, the same bytes
    assert models.weights_bytes_per_gpu(models.get_model("DeepSeek-R1"), 2) == models.weights_bytes_per_gpu(v3, 2)


def test_mxfp4_gpt_oss_120b():
    # 36 layers x 128 experts x 3 x 2,880 x 2,880 = 114,661,785,600 expert weights at 17/32 bytes; the other 2.14 B
    # of its 116.8 B bf16. At TP 2 each GPU's 1,440 of an expert pads to 1,472 (36 x 128 x 32 rows and columns more).
    big = models.get_model("gpt-oss-120b")
    experts = 114_661_785_600
    assert models.weights_bytes_per_gpu(big, 2) == pytest.approx(116.8e9 * 2 - experts * 2 + experts * 17 / 32)
    pad = 36 * 128 * 32 * (3 * 2880 * 17 / 32 + 2 * 2)
    assert models.weights_bytes_per_gpu(big, 2, 2) == pytest.approx(
        (116.8e9 * 2 - experts * 2 + experts * 17 / 32) / 2 + pad, rel=1e-12
    )


def test_notebook_03s_deepseek_v3_sentence():
    # Section 3: DeepSeek-V3's block-FP8 weights (about 627 GiB) leave no room on 8 H100s (78.3 GiB each of the
    # 72 GiB vLLM may use), so its row of vLLM's log figures is empty; on 8 H200s (126.9 GiB usable) it starts.
    from kvlab.core.config import EngineConfig
    from kvlab.sections import s03_capacity as section

    config = EngineConfig().replace(block_size=16, gpu_memory_utilization=0.9)
    figures = section.example_figures(config, "H100-SXM-80GB", [1, 2, 4, 8], ["bf16"])
    assert round(figures["deepseek_v3_weights_gib"]) == 627 and figures["deepseek_v3_quantization"] == "fp8_block"
    assert round(figures["deepseek_v3_weights_max_gpus_gib"], 1) == 78.3 > figures["usable_gib"] == 72
    assert round(figures["llama70b_weights_gib"]) == 131  # 16-bit: 70.55 B x 2 bytes
    names = ["deepseek-ai/DeepSeek-V3"]
    h100 = section.vllm_log_table(names, 80, 32768, (1, 2, 4, 8), config)
    assert h100["tensor_parallel_size"].isna().all()
    h200 = section.vllm_log_table(names, 141, 32768, (1, 2, 4, 8), config)
    assert h200["tensor_parallel_size"].tolist() == [8]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "gpt-oss-20b", "--gpu", "H100-SXM-80GB", "--quantization", "int8"], "invalid choice: 'int8'"),
        (
            ["--model", "Qwen2.5-72B-Instruct", "--gpu", "H100-SXM-80GB", "--quantization", "fp8"],
            "is not one (no layer shapes: give its config.json with --config)",
        ),
        (
            ["--model", "Qwen3-30B-A3B", "--gpu", "H100-SXM-80GB", "--quantization", "fp8"],
            "kvlab sizes fp8 weights of dense (not MLA, not mixture-of-experts) decoders",
        ),
        (
            ["--config", str(LLAMA), "--weights-gib", "9", "--quantization", "fp8"],
            "--quantization and --weights-gib cannot be used together",
        ),
    ],
)
def test_capacity_refusals(capsys, argv, message):
    code, _, err = run(capsys, "capacity", *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_already_quantized_checkpoint_is_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_gpt_oss_raw()))
    code, _, err = run(capsys, "capacity", "--config", str(path), "--weights-gib", "13", "--max-model-len", "4096")
    assert code == 0, err
    code, _, err = run(capsys, "capacity", "--config", str(path), "--gpu", "H100-SXM-80GB", "--quantization", "fp8")
    assert code == 2
    assert "--quantization='fp8' is not allowed: gpt-oss's checkpoint is already mxfp4" in err


def _gpt_oss_raw():
    return {
        "model_type": "gpt_oss",
        "_name_or_path": "gpt-oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "quantization_config": {"quant_method": "mxfp4"},
    }


def test_simulate_and_plan_take_the_flag(capsys):
    common = ["--config", str(LLAMA), "--quantization", "int4"]
    for command in ("simulate", "plan"):
        code, _, err = run(capsys, command, *common)
        assert code == 2 and "--quantization: invalid choice: 'int4'" in err
