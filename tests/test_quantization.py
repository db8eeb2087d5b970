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
    return models.from_config(
        {
            "model_type": "gpt_oss",
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
        },
        num_params_b=20.914757184,
    )


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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "gpt-oss-20b", "--gpu", "H100-SXM-80GB", "--quantization", "int8"], "invalid choice: 'int8'"),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-SXM-80GB", "--quantization", "fp8"],
            "--quantization='fp8' is not allowed: kvlab sizes fp8 weights of dense",
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
