"""`kvlab capacity`: the article's flags print the article's figures, vLLM's flags print vLLM's; JSON keys,
one-line errors with exit status 2, the console script and --help."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from kvlab.cli import main

CONFIGS = Path(__file__).parent / "data" / "configs"


def run(capsys, *argv):
    code = main(["capacity", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_foundation_flags_print_the_article_figures(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    assert out.splitlines() == [
        "KV bytes per token   524,288 B (512.0 KiB)",
        "memory per request   0.488 GiB at 1,000 tokens (524,288,000 B)",
        "free for KV cache    64.000 GiB (80 GiB GPU - 16 GiB weights)",
        "requests that fit    131",
    ]
    code, out, _ = run(capsys, "--context", "128000", "--json")
    assert json.loads(out) == {
        "context_tokens": 128000,
        "unit": "GiB",
        "kv_bytes_per_token": 524288,
        "bytes_per_request": 67108864000,
        "free_bytes": 68719476736,
        "max_num_requests": 1,
    }


def test_vllm_log_figures_from_the_cli(capsys):
    code, out, _ = run(capsys, "--model", "Qwen3-14B", "--available-kv-gib", "6.51", "--max-model-len", "32768")
    assert code == 0
    assert "GPU KV cache size: 42,656 tokens" in out
    assert "Maximum concurrency for 32,768 tokens per request: 1.30x" in out


def test_json_has_the_issue_keys(capsys):
    code, out, _ = run(
        capsys,
        "--config",
        str(CONFIGS / "deepseek-v2-lite.json"),
        "--tensor-parallel-size",
        "2",
        "--available-kv-gib",
        "12.13",
        "--max-model-len",
        "1024",
        "--json",
    )
    result = json.loads(out)
    assert code == 0
    assert result["kv_bytes_per_token"] == 27 * 576 * 2
    assert result["num_gpu_blocks"] == int(12.13 * 2**30 // (16 * 1152) // 27)
    assert result["gpu_kv_cache_tokens"] == result["num_gpu_blocks"] * 16
    assert result["max_concurrency"] == result["num_gpu_blocks"] / 64


def test_gpu_budget_from_the_catalog(capsys):
    code, out, _ = run(
        capsys, "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-SXM-80GB", "--max-model-len", "8192", "--json"
    )
    result = json.loads(out)
    weights_gib = 8.03e9 * 2 / 2**30
    assert result["available_kv_cache_gib"] == pytest.approx(80 * 0.9 - weights_gib - 2.0 - 0.4)
    assert result["num_gpu_blocks"] == int(result["available_kv_cache_bytes"] // 65536 // 32)


def test_architecture_flags(capsys):
    code, out, _ = run(
        capsys,
        "--num-layers",
        "32",
        "--num-kv-heads",
        "8",
        "--head-dim",
        "128",
        "--kv-cache-dtype",
        "fp8",
        "--available-kv-gib",
        "10",
        "--max-model-len",
        "4096",
        "--json",
    )
    result = json.loads(out)
    assert (code, result["attention"], result["kv_bytes_per_token"]) == (0, "mha", 32 * 2 * 8 * 128)
    code, out, _ = run(
        capsys,
        "--attention",
        "mla",
        "--num-layers",
        "61",
        "--kv-lora-rank",
        "512",
        "--qk-rope-head-dim",
        "64",
        "--tensor-parallel-size",
        "8",
        "--available-kv-gib",
        "10",
        "--json",
    )
    assert json.loads(out)["kv_bytes_per_token"] == 61 * 576 * 2


def test_concurrency_below_one_is_flagged(capsys):
    code, out, _ = run(
        capsys, "--model", "Llama-3.1-8B-Instruct", "--available-kv-gib", "2.89", "--max-model-len", "29000"
    )
    assert code == 0 and "# GPU blocks: 1,479 (1,813 per request of 29,000 tokens: 0.82x)" in out
    assert "GPU KV cache size" not in out  # vLLM 0.33 logs no capacity line when it refuses
    assert (
        "note: vLLM refuses to start: one request of 29,000 tokens needs 3.54 GiB of KV cache (1,813 blocks of "
        "2,097,152 B), more than the 2.89 GiB left once vLLM keeps one block back; the longest max_model_len that "
        "fits is 23,648 tokens"
    ) in out


def test_vllm_settings_flags(capsys):
    """--no-async-scheduling, --disable-hybrid-kv-cache-manager and --attention-backend change what vLLM computes
    (vLLM 0.33's figures for Gemma 2 9B, 20 GiB, max_model_len 8192, 2048 tokens per step)."""
    base = [
        "--model",
        "gemma-2-9b-it",
        "--available-kv-gib",
        "20",
        "--max-model-len",
        "8192",
        "--max-num-batched-tokens",
        "2048",
        "--json",
    ]
    figures = {}
    for extra in (
        [],
        ["--no-async-scheduling"],
        ["--disable-hybrid-kv-cache-manager"],
        ["--attention-backend", "CPU_ATTN"],
    ):
        code, out, _ = run(capsys, *base, *extra)
        result = json.loads(out)
        figures[" ".join(extra)] = (
            code,
            result["num_gpu_blocks"],
            result["blocks_per_request"],
            result["gpu_kv_cache_tokens"],
        )
    assert figures == {
        "": (0, 7801, 1025, 62347),
        "--no-async-scheduling": (0, 7801, 897, 71243),
        "--disable-hybrid-kv-cache-manager": (0, 3900, 512, 62400),
        "--attention-backend CPU_ATTN": (0, 3900, 513, 62278),
    }


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--model", "llama-3-8b"],
            "--model='llama-3-8b' is not allowed: not a model of data/models.csv; did you mean meta-llama/Meta-Llama-3-8B",
        ),
        (["--gpu", "H100"], "--gpu='H100' is not allowed: not a gpu of data/gpus.csv; did you mean H100-SXM-80GB"),
        (
            ["--model", "Qwen3-14B", "--tensor-parallel-size", "3"],
            "--tensor-parallel-size=3 is not allowed: must divide num_attention_heads (40)",
        ),
        (
            ["--model", "Llama-3.1-70B-Instruct", "--gpu", "H100-SXM-80GB"],
            "--gpu='H100-SXM-80GB' is not allowed: meta-llama/Llama-3.1-70B-Instruct on one GPU of 80 GiB leaves no KV memory",
        ),
        (
            ["--model", "Llama-3.1-70B-Instruct", "--available-kv-gib", "0.001"],
            "one request of 131,072 tokens needs 40.00 GiB, 40.00 GiB more",
        ),
        (["--attention", "mla", "--available-kv-gib", "1"], "needs --kv-lora-rank and --qk-rope-head-dim"),
        (
            ["--kv-cache-dtype", "fp8", "--dtype-bytes", "1"],
            "--dtype-bytes and --kv-cache-dtype cannot be used together",
        ),
        (
            ["--num-kv-heads", "6", "--num-attention-heads", "32", "--available-kv-gib", "1"],
            "--num-kv-heads=6 is not allowed: must divide",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvlab capacity: error: ")
    assert message in err


def test_missing_config_field_is_named(capsys, tmp_path):
    config = json.loads((CONFIGS / "mistral-7b-v0.1.json").read_text())
    del config["num_attention_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, _, err = run(capsys, "--config", str(tmp_path / "config.json"))
    assert code == 2 and "has no field 'num_attention_heads'" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        # a zero is a value the user gave, not an absent flag: it must not fall back to the article's figures
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size=0 is not allowed: must be an integer >= 1"),
        (["--pipeline-parallel-size", "0"], "--pipeline-parallel-size=0 is not allowed: must be an integer >= 1"),
        (["--block-size", "0"], "--block-size=0 is not allowed: must be an integer from 1 to 1,048,576 tokens"),
        (["--max-model-len", "0"], "--max-model-len=0 is not allowed: must be an integer from 1 to 100,000,000 tokens"),
        (["--num-attention-heads", "0"], "--num-attention-heads=0 is not allowed: must be an integer >= 1"),
        (
            ["--max-num-batched-tokens", "0"],
            "--max-num-batched-tokens=0 is not allowed: must be an integer from 1 to 100,000,000 tokens",
        ),
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization=0.0 is not allowed: must be a number in (0, 1]"),
        (
            ["--available-kv-gib", "0"],
            "--available-kv-gib=0.0 is not allowed: must be a number from 0.001 to 100,000 GiB",
        ),
        (
            ["--model", "Qwen3-14B", "--available-kv-gib", "5", "--max-model-len", "0"],
            "--max-model-len=0 is not allowed",
        ),
    ],
)
def test_zero_valued_flags_are_errors_not_the_defaults(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_a_directory_or_binary_file_as_config_is_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "--config", str(tmp_path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"--config='{tmp_path}' is not allowed: must be the path of a config.json file" in err
    (tmp_path / "config.json").write_bytes(b"\xff\xfe\x00binary")
    code, out, err = run(capsys, "--config", str(tmp_path / "config.json"))
    assert code == 2 and err.count("\n") == 1 and "--config=" in err and "UTF-8" in err
    (tmp_path / "list.json").write_text("[1, 2]")
    code, out, err = run(capsys, "--config", str(tmp_path / "list.json"))
    assert code == 2 and err.count("\n") == 1 and "--config=" in err and "JSON object" in err


# ---------------------------------------------------------------- the article's accounting
ARTICLE = [
    "--num-layers",
    "32",
    "--num-kv-heads",
    "32",
    "--head-dim",
    "128",
    "--dtype-bytes",
    "2",
    "--gpu-memory-gib",
    "80",
    "--weights-gib",
    "16",
]


@pytest.mark.parametrize("context, fit", [(1000, 131), (4000, 32), (8000, 16), (32000, 4), (128000, 1)])
def test_json_gives_the_article_figures(capsys, context, fit):
    assert main(["capacity", *ARTICLE, "--context", str(context), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 524288
    assert out["bytes_per_request"] == 524288 * context
    assert out["max_num_requests"] == fit


def test_text_output_has_units(capsys):
    assert main(["capacity"]) == 0
    text = capsys.readouterr().out
    assert "524,288 B" in text and "0.488 GiB at 1,000 tokens" in text and "requests that fit    131" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num-layers", "-1"], "kvlab capacity: error: --num-layers=-1 is not allowed: must be an integer >= 1"),
        (
            ["--gpu-memory-gib", "0"],
            "kvlab capacity: error: --gpu-memory-gib=0.0 is not allowed: must be a number from 0.001 to 100,000 GiB",
        ),
        (
            ["--context", "0"],
            "kvlab capacity: error: --context=0 is not allowed: must be an integer from 1 to 100,000,000 tokens",
        ),
        (
            ["--weights-gib", "80"],
            "kvlab capacity: error: --weights-gib=80.0 is not allowed: must be below the GPU memory (80 GiB)",
        ),
    ],
)
def test_article_accounting_bad_input_is_one_line_and_exit_2(capsys, args, message):
    assert main(["capacity", *args]) == 2
    err = capsys.readouterr().err
    assert err.strip() == message


def test_argparse_errors_are_one_line_too(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["capacity", "--num-layers", "many"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--num-layers: invalid int value: 'many'" in err


@pytest.mark.parametrize("command", [["kvlab"], [sys.executable, "-m", "kvlab"]])
def test_console_script_and_module(command):
    exe = [str(ROOT / ".venv" / "bin" / "kvlab")] if command == ["kvlab"] else command
    done = subprocess.run([*exe, "capacity", "--context", "128000", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["max_num_requests"] == 1
    bad = subprocess.run([*exe, "capacity", "--num-layers", "-3"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_help_explains(capsys):
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "KV bytes per token = 2 (K and V)" in text and "GiB = 2^30 bytes" in text
    text = text.replace("- ", "-")  # argparse wraps lines after a hyphen (--max- model-len)
    assert "'GPU KV cache size' = int(blocks / R x --max-model-len) tokens" in text
    for setting in (
        "async scheduling on (--no-async-scheduling)",
        "the hybrid KV-cache manager on (--disable-hybrid-kv-cache-manager)",
        "the attention backend vLLM picks (--attention-backend)",
    ):
        assert setting in text


def test_a_config_json_gets_its_counted_weights_or_says_it_cannot_count_them(capsys):
    code, out, _ = run(capsys, "--config", str(CONFIGS / "llama-3.1-8b-instruct.json"), "--gpu", "H100-SXM-80GB")
    assert code == 0 and "14.96 GiB weights (8.03026B parameters)" in out
    code, out, _ = run(capsys, "--config", str(CONFIGS / "gemma-3-27b-it.json"), "--gpu", "H100-SXM-80GB")
    assert code == 0 and "16.00 GiB weights (the article's default: kvlab cannot count this config.json's" in out


def test_data_parallel_ranks_split_a_mixture_of_experts_routed_experts(capsys):
    flags = ["--model", "Qwen3-30B-A3B-Instruct-2507", "--gpu", "RTX-PRO-6000-Server-96GB", "--max-model-len", "32768"]
    one = json.loads(run(capsys, *flags, "--json")[1])
    for extra in ([], ["--enable-expert-parallel"]):
        code, out, _ = run(capsys, *flags, "--data-parallel-size", "2", *extra, "--json")
        rank = json.loads(out)
        # 48 layers x 128 experts x 3 x 2,048 x 768 = 28,991,029,248 routed parameters, half of them on each GPU
        assert rank["weights_gib"] == pytest.approx((30.5e9 - 28_991_029_248 / 2) * 2 / 2**30, rel=1e-12)
        assert rank["weights_gib"] == pytest.approx(one["weights_gib"] - 28_991_029_248 / 2**30, rel=1e-12)
        assert rank["data_parallel_size"] == 2 and rank["enable_expert_parallel"] == bool(extra)
        assert rank["num_gpu_blocks"] > 1.9 * one["num_gpu_blocks"]  # the freed weights hold KV blocks
    code, out, _ = run(capsys, *flags, "--data-parallel-size", "2", "--enable-expert-parallel")
    assert "DP 2 + EP" in out and "28.99B of them routed experts split over 2 GPUs" in out
    assert (
        f"2 data-parallel ranks on 2 GPUs, each as above (its own pool and scheduler): {2 * rank['num_gpu_blocks']:,}"
        in out
    )
    # a dense model keeps its weights whole on every rank
    dense = ["--model", "Llama-3.1-8B", "--gpu", "H100-SXM-80GB", "--max-model-len", "8192", "--json"]
    assert (
        json.loads(run(capsys, *dense)[1])["weights_gib"]
        == json.loads(run(capsys, *dense, "--data-parallel-size", "4")[1])["weights_gib"]
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "Llama-3.1-8B", "--data-parallel-size", "2", "--enable-expert-parallel"], "Llama-3.1-8B has none"),
        (["--model", "Qwen3-30B-A3B", "--enable-expert-parallel"], "there is one"),
        (["--model", "Qwen3-30B-A3B", "--data-parallel-size", "0"], "--data-parallel-size=0 is not allowed"),
    ],
)
def test_expert_parallelism_where_vllm_would_ignore_it_is_refused(capsys, argv, message):
    code, out, err = run(capsys, *argv, "--gpu", "H100-SXM-80GB")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
