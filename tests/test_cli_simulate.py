"""`kvlab simulate`: the command line over kvlab.core.batching."""

import json
import subprocess
import sys

import numpy as np
import pytest

from kvlab import cli
from kvlab.core import batching as simulator
from kvlab.workloads import synthetic

KEYS = [
    "num_requests",
    "mean_latency_s",
    "p95_latency_s",
    "max_latency_s",
    "mean_queue_s",
    "makespan_s",
    "throughput_rps",
    "busy_slot_s",
    "idle_share",
]


def run_json(capsys, *flags):
    assert cli.main(["simulate", *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_json_has_the_issue_keys_and_the_librarys_numbers(capsys, policy):
    out = run_json(
        capsys,
        "--policy",
        policy,
        "--slots",
        "8",
        "--ms-per-token",
        "8",
        "--num-requests",
        "600",
        "--arrival-rate",
        "11",
        "--lengths",
        "article",
        "--seed",
        "0",
    )
    assert list(out) == KEYS
    workload = synthetic.article_s2_workload(600, 11.0, "article", np.random.default_rng(0))
    assert out == pytest.approx(simulator.simulate(workload, policy).summary())


def test_constant_lengths_and_flags_reach_the_model(capsys):
    out = run_json(
        capsys,
        "--policy",
        "static",
        "--slots",
        "4",
        "--ms-per-token",
        "10",
        "--num-requests",
        "50",
        "--lengths",
        "constant",
        "--constant-tokens",
        "100",
    )
    assert out["num_requests"] == 50
    assert out["busy_slot_s"] == pytest.approx(50 * 100 * 0.010)
    assert out["max_latency_s"] >= 1.0  # every request holds its slot 1 s


def test_text_output_names_units(capsys):
    assert cli.main(["simulate", "--policy", "static", "--num-requests", "100"]) == 0
    out = capsys.readouterr().out
    assert "static, 8 slots, 8 ms per output token" in out
    summary = simulator.simulate(
        synthetic.article_s2_workload(100, 11.0, "article", np.random.default_rng(0)), "static"
    ).summary()
    assert f"mean {summary['mean_latency_s']:,.2f} s" in out
    assert f"{100 * summary['idle_share']:.1f}% idle" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--slots", "0"], "--slots=0 is not allowed: must be an integer from 1 to 1,000,000 requests"),
        (["--slots", "-2"], "--slots=-2 is not allowed"),
        (["--ms-per-token", "0"], "--ms-per-token=0.0 is not allowed: must be a number from 0.001 to 100,000 ms"),
        (["--ms-per-token", "-8"], "--ms-per-token=-8.0 is not allowed"),
        (
            ["--arrival-rate", "0"],
            "--arrival-rate=0.0 is not allowed: must be a number from 0.001 to 1,000,000 requests/s",
        ),
        (
            ["--num-requests", "0"],
            "--num-requests=0 is not allowed: must be an integer from 1 to 10,000,000,000 requests",
        ),
        (["--lengths", "constant", "--constant-tokens", "0"], "--constant-tokens=0 is not allowed"),
        (["--seed", "-1"], "--seed=-1 is not allowed: must be an integer from 0 to 9,223,372,036,854,775,807"),
        (["--ms-per-token", "nan"], "--ms-per-token=nan is not allowed: must be a number from 0.001 to 100,000 ms"),
        (
            ["--arrival-rate", "inf"],
            "--arrival-rate=inf is not allowed: must be a number from 0.001 to 1,000,000 requests/s",
        ),
    ],
)
def test_bad_values_give_one_line_naming_the_flag_and_status_2(capsys, flags, message):
    assert cli.main(["simulate", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab simulate: error: " + message)
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--policy", "greedy"], "argument --policy: invalid choice: 'greedy'"),
        (["--lengths", "zipf"], "argument --lengths: invalid choice: 'zipf'"),
        (["--slots", "eight"], "argument --slots: invalid int value: 'eight'"),
        (["--max-concurrency", "2.5"], "argument --max-concurrency: invalid int value: '2.5'"),
    ],
)
def test_unparsable_flags_give_one_line_and_status_2(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["simulate", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab simulate: error: ") and message in err
    assert err.count("\n") == 1


def test_console_script_runs():
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", "simulate", "--num-requests", "20", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout)["num_requests"] == 20


# ---------------------------------------------------------------- --policy vllm
VLLM_KEYS = [
    "mean_ttft_s",
    "p95_ttft_s",
    "mean_tpot_s",
    "num_preemptions",
    "num_steps",
    "peak_kv_blocks",
    "mean_running",
    "output_tokens_per_s",
]


def test_vllm_json_has_the_issue_keys_and_the_engines_numbers(capsys):
    from kvlab.core import engine
    from kvlab.core.config import EngineConfig
    from kvlab.core.cost import LinearStepCost

    flags = [
        "--policy",
        "vllm",
        "--num-requests",
        "300",
        "--prompt-tokens",
        "200",
        "--num-gpu-blocks",
        "300",
        "--max-num-seqs",
        "64",
        "--step-ms",
        "5",
        "--step-ms-per-token",
        "0.02",
        "--seed",
        "1",
    ]
    w = synthetic.article_s2_workload(300, 11.0, "article", np.random.default_rng(1))
    w = type(w)(w.arrival_s, np.full(300, 200), w.output_tokens)
    for extra, mode in (([], True), (["--no-async-scheduling"], False)):  # vLLM's default on a GPU: async
        out = run_json(capsys, *flags, *extra)
        assert set(VLLM_KEYS) <= set(out) and out["num_gpu_blocks"] == 300 and out["cost"] == "linear"
        assert out["async_scheduling"] is mode
        config = EngineConfig().replace(max_num_seqs=64, max_model_len=8192, async_scheduling=mode)
        summary = engine.simulate(w, config, num_gpu_blocks=300, cost=LinearStepCost(5.0, 0.02)).summary()
        assert {k: out[k] for k in VLLM_KEYS} == pytest.approx({k: summary[k] for k in VLLM_KEYS})
        assert out["num_preemptions"] > 0  # 299 usable blocks do not hold the load


def test_vllm_text_output_names_units(capsys):
    assert cli.main(["simulate", "--policy", "vllm", "--num-requests", "50"]) == 0
    out = capsys.readouterr().out
    assert "vLLM 0.33's scheduler (asynchronous: the next batch is scheduled before this one's output" in out
    assert "7,681 GPU blocks of 16 tokens (7,680 usable + vLLM's null block; the article's 60 GiB" in out
    assert "constant, 8 ms a step" in out and "output tokens/s" in out and "TTFT                 mean" in out


def test_requests_csv_round_trips_through_trace(tmp_path, capsys):
    path = tmp_path / "requests.csv"
    run_json(capsys, "--policy", "vllm", "--num-requests", "40", "--prompt-tokens", "30", "--requests-csv", str(path))
    lines = path.read_text().splitlines()
    assert lines[0] == (
        "request_id,arrival_s,prompt_tokens,output_tokens,first_scheduled_s,first_token_s,finish_s,"
        "num_preemptions,scheduling"
    )
    rows = [line.split(",") for line in lines[1:]]
    assert {r[-1] for r in rows} == {"async"}
    assert [int(r[0]) for r in rows] == list(range(40))
    assert all(float(r[4]) >= float(r[1]) and float(r[6]) >= float(r[5]) for r in rows)
    again = run_json(capsys, "--policy", "vllm", "--trace", str(path), "--requests-csv", str(tmp_path / "again.csv"))
    assert again["trace_format"] == "csv" and again["num_requests"] == 40
    assert (tmp_path / "again.csv").read_text() == path.read_text()  # arrivals start at 0 in both


def test_capacity_flags_give_the_pool_vllm_logs(capsys):
    out = run_json(
        capsys,
        "--policy",
        "vllm",
        "--num-requests",
        "20",
        "--model",
        "facebook/opt-13b",
        "--gpu",
        "A100-40GB",
        "--max-model-len",
        "2048",
        "--cost",
        "roofline",
        "--prompt-tokens",
        "100",
    )
    assert (
        cli.main(["capacity", "--model", "facebook/opt-13b", "--gpu", "A100-40GB", "--max-model-len", "2048", "--json"])
        == 0
    )
    assert out["num_gpu_blocks"] == json.loads(capsys.readouterr().out)["num_gpu_blocks"]
    assert out["cost"] == "roofline"


def test_the_measured_step_cost_from_the_command_line(capsys):
    flags = [
        "--policy",
        "vllm",
        "--num-requests",
        "20",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--gpu",
        "RTX-PRO-6000-Server-96GB",
        "--max-model-len",
        "4096",
        "--prompt-tokens",
        "100",
    ]
    out = run_json(capsys, *flags, "--cost", "measured")
    roofline = run_json(capsys, *flags, "--cost", "roofline")
    assert out["cost"] == "measured" and out["num_gpu_blocks"] == roofline["num_gpu_blocks"]
    assert out["mean_tpot_s"] > roofline["mean_tpot_s"]  # the roofline is a lower bound
    assert cli.main(["simulate", *flags, "--cost", "measured"]) == 0
    assert (
        "step cost            measured, LLMServingSim profile RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-gpu-blocks", "1"], "--num-gpu-blocks=1 is not allowed: must be >= 2: it counts vLLM's null block"),
        (["--num-gpu-blocks", "0"], "--num-gpu-blocks=0 is not allowed"),
        (["--max-num-seqs", "0"], "--max-num-seqs=0 is not allowed"),
        (["--block-size", "0"], "--block-size=0 is not allowed: must be an integer from 1 to 1,048,576 tokens"),
        (
            ["--long-prefill-token-threshold", "-1"],
            "--long-prefill-token-threshold=-1 is not allowed: must be an integer >= 0",
        ),
        (
            ["--model", "facebook/opt-13b", "--gpu", "A100-40GB", "--tensor-parallel-size", "0"],
            "--tensor-parallel-size=0 is not allowed: must be an integer >= 1",
        ),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens=0 is not allowed"),
        (
            ["--max-num-batched-tokens", "100"],
            "--max-num-batched-tokens=100 is not allowed: must be >= --max-num-seqs (256)",
        ),
        (
            ["--no-chunked-prefill", "--max-model-len", "9000"],
            "--max-num-batched-tokens=8192 is not allowed: is smaller than --max-model-len (9,000) with chunked prefill off",
        ),
        (
            ["--prompt-tokens", "9000"],
            "prompt_tokens[0]=9000 is not allowed: must be shorter than --max-model-len=8,192",
        ),
        (
            ["--prompt-tokens", "5000", "--num-gpu-blocks", "100"],
            "request 26='5,000 prompt + 983 output tokens' is not allowed: needs 374 blocks of 16 tokens at its longest "
            "(5,982 tokens) but the pool has 99 usable blocks",
        ),
        (
            ["--allocation", "max", "--num-gpu-blocks", "100"],
            "--allocation='max' is not allowed: reserves --max-model-len=8,192 "
            "token slots a request but the pool holds 1,584",
        ),
        (["--slots", "4"], "--slots and --policy vllm cannot be used together"),
        (
            ["--num-gpu-blocks", "10", "--kv-cache-dtype", "fp8"],
            "--num-gpu-blocks and --kv-cache-dtype cannot be used together",
        ),
        (
            ["--num-gpu-blocks", "10", "--model", "facebook/opt-13b", "--gpu", "A100-40GB"],
            "--num-gpu-blocks and --gpu cannot be used together",
        ),
        (["--model", "facebook/opt-13b"], "--model needs --gpu too"),
        (
            ["--step-ms-per-token", "0.1", "--cost", "constant"],
            "--step-ms-per-token and --cost constant cannot be used together",
        ),
        (["--step-ms", "0"], "--step-ms=0.0 is not allowed"),
        (["--cost", "roofline"], "--cost roofline needs --model and --gpu"),
        (["--cost", "calibrated"], "--cost calibrated needs --calibration FILE"),
        (["--cost", "measured"], "--cost measured needs --model and --gpu"),
        (
            ["--cost", "measured", "--model", "Qwen3-14B", "--gpu", "MI300X-192GB"],
            "--gpu='MI300X-192GB' is not allowed: has no operator-level measurement for the measured clock; GPUs with "
            "measurements: A100-SXM-80GB, A40-48GB, Arc-Pro-B60-24GB, B200-180GB, B300-SXM, GB200, GB300, H100-SXM-80GB, "
            "H200-141GB, L40S-48GB, RTX-4090-24GB, RTX-PRO-6000-Server-96GB (or use the roofline clock: --cost roofline)",
        ),
        (
            ["--enable-prefix-caching", "--allocation", "oracle"],
            "--enable-prefix-caching and --allocation oracle cannot",
        ),
        (["--num-requests", "10000000000"], "--num-requests=10000000000 is not allowed: needs about"),
    ],
)
def test_vllm_bad_input_is_one_line_naming_the_flag(capsys, flags, message):
    assert cli.main(["simulate", "--policy", "vllm", "--num-requests", "50", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab simulate: error: " + message), err
    assert err.count("\n") == 1


@pytest.mark.parametrize("flag", ["--num-gpu-blocks", "--max-num-seqs", "--allocation", "--step-ms"])
def test_engine_flags_need_policy_vllm(capsys, flag):
    value = {"--allocation": "paged"}.get(flag, "10")
    assert cli.main(["simulate", flag, value]) == 2
    assert f"{flag} applies only with --policy vllm" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, source",
    [
        ([], "constant, 8 ms a step"),
        (["--step-ms", "5", "--step-ms-per-token", "0.02"], "linear, 5 ms + 0.02 ms per scheduled token"),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B",
                "--gpu",
                "RTX-PRO-6000-Server-96GB",
                "--max-model-len",
                "4096",
                "--cost",
                "roofline",
            ],
            "roofline, 15.0 GiB of weights and 131,072 B of KV per token at 1597 GB/s, 503.8 TFLOPS "
            "(the GPU's peak figures, data/gpus.csv)",
        ),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B",
                "--gpu",
                "RTX-PRO-6000-Server-96GB",
                "--max-model-len",
                "4096",
                "--cost",
                "measured",
            ],
            "measured, LLMServingSim profile RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1",
        ),
        (
            [
                "--model",
                "Qwen/Qwen3-14B",
                "--gpu",
                "RTX-PRO-6000-Server-96GB",
                "--max-model-len",
                "4096",
                "--cost",
                "measured",
            ],
            "measured, composed from the RTX-PRO-6000-Server-96GB's operator tables (AIConfigurator, vLLM 0.24.0): "
            "GEMMs (torch.nn.functional.linear, bf16), attention (vllm_flash_attn_fa2, bf16 KV); small operators",
        ),
    ],
)
def test_the_output_says_where_the_step_costs_numbers_come_from(capsys, flags, source):
    flags = ["--policy", "vllm", "--num-requests", "10", "--prompt-tokens", "50", *flags]
    out = run_json(capsys, *flags)
    assert out["cost_source"].startswith(source) and list(out).index("cost_source") == list(out).index("cost") + 1
    assert cli.main(["simulate", *flags]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step cost ")]
    assert lines == [f"step cost            {out['cost_source']}"]


def test_the_engine_flags_defaults_are_the_config_objects():
    from kvlab.core.config import CacheConfig, ParallelConfig, SchedulerConfig

    cache, parallel, scheduler = CacheConfig(), ParallelConfig(), SchedulerConfig()
    expected = {
        "block_size": cache.block_size,
        "kv_cache_dtype": cache.kv_cache_dtype,
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "long_prefill_token_threshold": scheduler.long_prefill_token_threshold,
        "async_scheduling": scheduler.async_scheduling,
    }
    parser = cli.build_parser()[1]["simulate"]
    assert {name: parser.get_default(name) for name in expected} == expected


def test_the_command_leaves_every_check_of_config_and_workload_to_the_engine(capsys, monkeypatch):
    from kvlab.core import engine

    calls = []
    for name in ("check_scheduler_config", "check_workload"):
        monkeypatch.setattr(engine, name, lambda *args, name=name: calls.append(name), raising=False)
    run_json(capsys, "--policy", "vllm", "--num-requests", "20")
    assert calls == []  # the engine checks them itself, once, before any step
    assert cli.main(["simulate", "--policy", "vllm", "--max-num-batched-tokens", "100"]) == 2
    assert capsys.readouterr().err == (
        "kvlab simulate: error: --max-num-batched-tokens=100 is not allowed: must be >= "
        "--max-num-seqs (256), as vLLM requires\n"
    )


def test_the_kv_pool_and_the_requests_csv_have_their_homes_below_the_command_line(capsys):
    from kvlab.cli import simulate
    from kvlab.core import pool, requests_csv
    from kvlab.core.config import EngineConfig

    assert pool.size_kv_pool(EngineConfig()) == (7_681, "the article's 60 GiB at 0.5 MiB per token (122,880 tokens)")
    assert simulate.REQUESTS_CSV_COLUMNS is requests_csv.REQUESTS_CSV_COLUMNS
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    assert ", ".join(requests_csv.REQUESTS_CSV_COLUMNS) in " ".join(capsys.readouterr().out.split())


CONFIGS = __import__("pathlib").Path(__file__).parent / "data" / "configs"


def test_a_config_json_is_served_as_its_catalog_model(capsys):
    flags = ["--policy", "vllm", "--num-requests", "30", "--gpu", "A100-40GB", "--max-model-len", "2048",
             "--cost", "roofline", "--prompt-tokens", "100"]  # fmt: skip
    catalog = run_json(capsys, *flags, "--model", "facebook/opt-13b")
    config = run_json(capsys, *flags, "--config", str(CONFIGS / "opt-13b.json"), "--num-params-b", "12.85")
    assert {k: v for k, v in config.items() if k != "cost_source"} == {
        k: v for k, v in catalog.items() if k != "cost_source"
    }
    counted = run_json(capsys, *flags, "--config", str(CONFIGS / "opt-13b.json"))  # 12,853,473,280 parameters
    assert counted["num_gpu_blocks"] <= catalog["num_gpu_blocks"]  # a few more weights than the catalog's 12.85B


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--config", str(CONFIGS / "opt-13b.json"), "--model", "facebook/opt-13b", "--gpu", "A100-40GB"],
         "--model and --config cannot be used together"),
        (["--model", "facebook/opt-13b", "--gpu", "A100-40GB", "--num-params-b", "13"],
         "--num-params-b applies only with --config"),
        (["--config", str(CONFIGS / "opt-13b.json")], "--config needs --gpu too"),
        (["--config", str(CONFIGS / "gemma-3-27b-it.json"), "--gpu", "H100-SXM-80GB"],
         f"--config {CONFIGS / 'gemma-3-27b-it.json'}: config.json has no field 'vocab_size', which kvlab needs to "
         "count a gemma3_text model's parameters; give --num-params-b"),
    ],
)  # fmt: skip
def test_a_config_json_is_refused_in_one_line_naming_the_flag(capsys, flags, message):
    assert cli.main(["simulate", "--policy", "vllm", "--num-requests", "20", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab simulate: error: " + message), err
    assert err.count("\n") == 1


def test_a_hybrid_model_is_served_with_its_kv_cache_groups_over_exactly_the_blocks_given(capsys):
    """--model with --num-gpu-blocks (vLLM's --num-gpu-blocks-override): a model with sliding-window layers is
    served with vLLM's KV cache groups over those blocks, and says so; a full-attention model as one group."""
    flags = ["--policy", "vllm", "--num-gpu-blocks", "2000", "--num-requests", "40", "--max-model-len", "4096"]
    out = run_json(capsys, *flags, "--model", "google/gemma-3-27b-it")
    assert out["num_gpu_blocks"] == 2000
    assert out["kv_cache_groups"] == (
        "7 sharing the pool: 6 of a 1,024-token sliding window (16 tokens a block), 1 of full attention (16 tokens a "
        "block) (vLLM's hybrid KV cache manager)"
    )
    assert "kv_cache_groups" not in run_json(capsys, *flags, "--model", "facebook/opt-13b")


def test_a_hybrid_model_on_a_gpu_gets_the_blocks_vllm_sizes_for_its_groups_and_caches_prefixes(capsys):
    """--model and --gpu without --num-gpu-blocks: a hybrid model's pool is what vLLM sizes for its groups
    (kvlab.core.capacity.plan_capacity, proven against vLLM's sizing code), served with prefix caching too."""
    from kvlab.core import capacity, models
    from kvlab.core.config import EngineConfig

    flags = ["--policy", "vllm", "--num-requests", "40", "--max-model-len", "8192", "--gpu", "H100-SXM-80GB"]
    out = run_json(capsys, *flags, "--model", "google/gemma-3-27b-it", "--enable-prefix-caching")
    model = models.get_model("google/gemma-3-27b-it")
    planned = capacity.plan_capacity(model, 80, 8192, EngineConfig().replace(max_model_len=8192))
    assert out["num_gpu_blocks"] == planned["num_gpu_blocks"]
    assert out["kv_cache_groups"].startswith("7 sharing the pool")


def test_qwen3_next_with_prefix_caching_is_served_in_the_layout_vllm_builds_on_a_hopper_gpu(capsys):
    """--enable-prefix-caching on a model with Gated DeltaNet layers: its Mamba groups hold states in blocks of the
    attention block size (576 tokens, mamba_cache_mode "align"), with in-kernel prefill checkpoints
    (num_prefill_checkpoint_blocks 1), which the engine serves."""
    flags = ["--policy", "vllm", "--num-gpu-blocks", "400", "--num-requests", "40", "--max-model-len", "8192"]
    out = run_json(capsys, *flags, "--model", "Qwen3-Next-80B-A3B-Instruct", "--enable-prefix-caching")
    assert out["enable_prefix_caching"] and out["num_output_tokens"] > 0
    assert out["kv_cache_groups"].startswith("4 sharing the pool: 3 of Mamba states (576 tokens a block)")


# ---------------------------------------------------------------- --max-concurrency: a closed loop
def read_requests_csv(path):
    lines = path.read_text().splitlines()
    return np.array([[float(v) for v in line.split(",")[1:8]] for line in lines[1:]])  # arrival_s .. num_preemptions


def test_max_concurrency_is_the_engines_closed_loop_from_t0_with_the_send_in_the_csv(tmp_path, capsys):
    from kvlab.core import engine
    from kvlab.core.config import EngineConfig
    from kvlab.core.cost import ConstantStepCost

    path = tmp_path / "requests.csv"
    flags = ["--policy", "vllm", "--num-requests", "200", "--prompt-tokens", "100", "--seed", "2"]
    out = run_json(capsys, *flags, "--max-concurrency", "8", "--requests-csv", str(path))
    assert out["max_concurrency"] == 8
    w = synthetic.article_s2_workload(200, 11.0, "article", np.random.default_rng(2))
    w = type(w)(np.zeros(200), np.full(200, 100), w.output_tokens)  # vLLM bench's default rate, inf: all at t=0
    config = EngineConfig().replace(max_model_len=8192)
    result = engine.simulate(w, config, num_gpu_blocks=7681, cost=ConstantStepCost(8.0), max_concurrency=8)
    summary = result.summary()
    assert {k: out[k] for k in VLLM_KEYS} == pytest.approx({k: summary[k] for k in VLLM_KEYS})
    rows = read_requests_csv(path)
    assert np.array_equal(rows[:, 0], result.arrival_s) and np.array_equal(rows[:, 5], result.finish_s)
    assert (rows[:8, 0] == 0).all() and (rows[8:, 0] > 0).all()  # 8 sent at t=0, the rest as slots free
    assert "max_concurrency" not in run_json(capsys, *flags)  # the open loop's output is unchanged


def test_one_in_flight_sends_each_request_as_the_one_before_finishes(tmp_path, capsys):
    path = tmp_path / "requests.csv"
    run_json(capsys, "--policy", "vllm", "--num-requests", "30", "--max-concurrency", "1", "--requests-csv", str(path))
    arrival, finish = read_requests_csv(path)[:, [0, 5]].T
    assert arrival[0] == 0 and np.array_equal(arrival[1:], finish[:-1])


def test_max_concurrency_with_a_rate_waits_for_both_and_a_trace_gives_its_lengths(tmp_path, capsys):
    path, again = tmp_path / "requests.csv", tmp_path / "again.csv"
    flags = ["--policy", "vllm", "--num-requests", "60", "--prompt-tokens", "40", "--no-async-scheduling"]
    run_json(capsys, *flags, "--arrival-rate", "50", "--max-concurrency", "3", "--requests-csv", str(path))
    poisson = synthetic.poisson_arrivals(60, 50.0, np.random.default_rng(0))
    sent = read_requests_csv(path)[:, 0]
    assert (sent >= poisson).all() and (sent > poisson).any() and (np.diff(sent) >= 0).all()
    # the trace's lengths, its timestamps unused: all 60 sent from t=0, 3 at a time
    out = run_json(capsys, "--policy", "vllm", "--trace", str(path), "--max-concurrency", "3", "--requests-csv",
                   str(again), "--no-async-scheduling")  # fmt: skip
    rows = read_requests_csv(again)
    assert out["num_requests"] == 60 and (rows[:3, 0] == 0).all() and out["poisson_arrivals"] is False
    assert np.array_equal(rows[:, 1:3], read_requests_csv(path)[:, 1:3])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-concurrency", "0"], "--max-concurrency=0 is not allowed: must be a whole number of requests >= 1"),
        (["--max-concurrency", "-2"], "--max-concurrency=-2 is not allowed: must be a whole number of requests"),
        (["--max-concurrency", "2", "--trace", "x.csv", "--seed", "1"], "--seed applies with --trace and --max-con"),
    ],
)
def test_a_bad_max_concurrency_is_refused_in_one_line(capsys, monkeypatch, tmp_path, flags, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n")
    assert cli.main(["simulate", "--policy", "vllm", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab simulate: error: " + message), err
    assert err.count("\n") == 1


def test_max_concurrency_needs_policy_vllm(capsys):
    assert cli.main(["simulate", "--max-concurrency", "4"]) == 2
    assert "--max-concurrency applies only with --policy vllm" in capsys.readouterr().err
