"""kvlab.studies.serving: one setup of a run from its options, each default and refusal once; the flag table that
the parsers, the one-line errors and the `vllm serve` lines are made from."""

import dataclasses
import json
import shlex

import numpy as np
import pytest

from kvlab import cli
from kvlab.core import capacity, models
from kvlab.core.config import VLLM_FLAGS, EngineConfig
from kvlab.core.engine import DEFAULT_CONFIG
from kvlab.studies import serving, sizing
from kvlab.studies.plan_space import Candidate, SearchSpace
from kvlab.studies.serving import ServingOptions, setup

GEMMA = "google/gemma-3-27b-it"  # sliding-window layers beside full attention: vLLM's hybrid KV cache groups
LLAMA = "meta-llama/Llama-3.1-8B"  # dense, 131,072 tokens of context
H100 = "H100-SXM-80GB"


# ---------------------------------------------------------------- max_model_len's default: one rule
def test_max_model_len_is_the_one_given_else_the_models_context_else_the_runs_default():
    llama = models.get_model(LLAMA)
    assert serving.max_model_len_of(ServingOptions(max_model_len=4096), llama) == 4096
    assert serving.max_model_len_of(ServingOptions(), llama) == llama.max_position_embeddings == 131_072
    assert serving.max_model_len_of(ServingOptions(), None) == DEFAULT_CONFIG.scheduler.max_model_len == 8192
    assert serving.max_model_len_of(ServingOptions(default_max_model_len=1000), None) == 1000
    no_context = dataclasses.replace(llama, max_position_embeddings=0)
    assert serving.max_model_len_of(ServingOptions(default_max_model_len=1000), no_context) == 1000
    with pytest.raises(ValueError, match=f"^max_model_len is needed: {LLAMA} gives no context length$"):
        serving.max_model_len_of(ServingOptions(default_max_model_len=None), no_context)
    with pytest.raises(ValueError, match="^max_model_len=0 is not allowed: must be an integer from 1 to"):
        serving.max_model_len_of(ServingOptions(max_model_len=0), llama)


def test_every_command_takes_the_same_rule(capsys):
    """kvlab simulate falls back to the engine's default, kvlab capacity to --context, kvlab plan to nothing."""
    flags = ["--policy", "vllm", "--num-requests", "5", "--json"]
    assert cli.main(["simulate", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["max_model_len"] == 8192
    assert cli.main(["simulate", *flags, "--model", LLAMA, "--num-gpu-blocks", "9000"]) == 0
    assert json.loads(capsys.readouterr().out)["max_model_len"] == 131_072
    assert cli.main(["capacity", "--num-kv-heads", "8", "--available-kv-gib", "4", "--context", "3000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_model_len"] == 3000
    options = sizing.SizingOptions(num_kv_heads=8, available_kv_gib=4, default_max_model_len=3000)
    assert sizing.size(options).max_model_len == 3000


# ---------------------------------------------------------------- what setup makes, each once
def test_setup_makes_the_config_pool_cost_groups_and_workload_of_the_options():
    options = ServingOptions(model=GEMMA, gpu=H100, max_model_len=8192, num_requests=20, prompt_tokens=30, seed=4)
    run = setup(options)
    model = models.get_model(GEMMA)
    config = EngineConfig().replace(max_model_len=8192)
    assert run.model == model and run.config == config
    assert run.num_gpu_blocks == capacity.plan_capacity(model, 80, 8192, config)["num_gpu_blocks"]
    assert run.pool_source == f"{GEMMA} on {H100} as vLLM sizes it"
    assert run.kv_cache_groups == capacity.kv_cache_groups(model, config)
    assert run.cost.describe() == "8 ms a step"
    assert run.workload.num_requests == 20 and (run.workload.prompt_tokens == 30).all()
    assert run.run().num_requests == 20


def test_setup_groups_a_hybrid_models_layers_once(monkeypatch):
    calls = []
    grouped = capacity.kv_cache_groups

    def counted(*args, **kwargs):
        calls.append(args)
        return grouped(*args, **kwargs)

    monkeypatch.setattr(capacity, "kv_cache_groups", counted)
    run = setup(ServingOptions(model=GEMMA, gpu=H100, max_model_len=8192, num_requests=10))
    assert len(calls) == 1 and len(run.kv_cache_groups) == 7  # the pool sized over the same groups the engine serves
    run.run()
    assert len(calls) == 1


def test_a_full_attention_model_is_served_as_a_plain_decoder():
    run = setup(ServingOptions(model=LLAMA, num_gpu_blocks=9000, num_requests=5))
    assert run.kv_cache_groups is None and run.pool_source == "--num-gpu-blocks"


def test_the_workloads_defaults():
    """Section 2's 600 requests with one-token prompts for the engine and none for the slots; kvlab plan's 10,000
    of gamma lengths around 1,000 prompt and 250 output tokens; all made at t=0 in a closed loop without a rate."""
    engine, _ = serving.workload(ServingOptions())
    slots, _ = serving.workload(ServingOptions(policy="continuous"))
    assert engine.num_requests == slots.num_requests == 600
    assert (engine.prompt_tokens == 1).all() and (slots.prompt_tokens == 0).all()
    assert np.array_equal(engine.output_tokens, slots.output_tokens)
    gamma, _ = serving.workload(ServingOptions(lengths="gamma", arrival_rate=5.0))
    assert gamma.num_requests == 10_000
    assert abs(gamma.prompt_tokens.mean() / 1000 - 1) < 0.05 and abs(gamma.output_tokens.mean() / 250 - 1) < 0.05
    closed, _ = serving.workload(ServingOptions(lengths="gamma", max_concurrency=4, num_requests=50))
    assert (closed.arrival_s == 0).all() and closed.name.startswith("synthetic (all made at t=0, seed 0;")


# ---------------------------------------------------------------- the refusals, each once
@pytest.mark.parametrize(
    "options, message",
    [
        (
            ServingOptions(model=LLAMA, gpu=H100, data_parallel_size=2),
            f"data_parallel_size=2 is not allowed for {LLAMA}: it is dense, and vLLM runs a dense model's "
            "data-parallel ranks as independent engines (drop --data-parallel-size and serve one rank on its share of "
            "the requests)",
        ),
        (
            ServingOptions(data_parallel_size=2),
            "--data-parallel-size needs --model (or --config): only a mixture-of-experts model's ranks step together",
        ),
        (ServingOptions(cost="roofline"), "--cost roofline needs --model and --gpu (weights, KV bytes, bandwidth"),
        (ServingOptions(cost="calibrated"), "--cost calibrated needs --calibration FILE (a CSV of kvlab calibrate)"),
        (
            ServingOptions(enable_prefix_caching=True, allocation="max"),
            "--enable-prefix-caching and --allocation max cannot be used together: prefix caching shares the paged",
        ),
        (ServingOptions(num_gpu_blocks=0), "num_gpu_blocks=0 is not allowed"),
        (ServingOptions(max_concurrency=0), "max_concurrency=0 is not allowed: must be a whole number of requests"),
        (ServingOptions(model=LLAMA, gpu=H100, quantization="int4"), "--quantization='int4' is not allowed"),
        (ServingOptions(model=LLAMA, hf_config_path="config.json"), f"model='{LLAMA}' is not allowed: give --model"),
        (ServingOptions(trace="/no/such/trace.csv"), "trace='/no/such/trace.csv' is not allowed: cannot be read"),
        (ServingOptions(prompt_tokens=0), "prompt_tokens=0 is not allowed"),
    ],
)
def test_a_refusal_is_one_line_naming_the_option_its_value_and_the_fix(options, message):
    with pytest.raises(ValueError) as refused:
        setup(options)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_the_dense_data_parallel_refusal_is_one_for_kvlab_simulate_and_kvlab_plan(capsys):
    model = models.get_model(LLAMA)
    serving.check_data_parallel(model, 1)  # one rank: nothing to refuse
    with pytest.raises(ValueError, match=r"^data_parallel_size 1,2 is not allowed for .*: it is dense, .*\(fix\)$"):
        serving.check_data_parallel(model, 2, " 1,2", "fix")
    flags = ["--model", LLAMA, "--gpu", "RTX-PRO-6000-Server-96GB", "--data-parallel-size"]
    assert cli.main(["simulate", "--policy", "vllm", *flags, "2"]) == 2
    simulate_says = capsys.readouterr().err.split(": error: ")[1]
    assert cli.main(["plan", *flags, "1,2", "--arrival-rate", "1", "--num-requests", "9", "--slo-e2e-p95-s", "9"]) == 2
    plan_says = capsys.readouterr().err.split(": error: ")[1]
    assert (
        simulate_says.split(" is not allowed")[1].split("(")[0] == plan_says.split(" is not allowed")[1].split("(")[0]
    )


def test_a_closed_loop_over_a_sharegpt_trace_takes_its_lengths(tmp_path):
    """Under max_concurrency a ShareGPT file's lengths are served from t=0 (its drawn arrivals replaced), for kvlab
    plan as for kvlab simulate."""
    path = tmp_path / "sharegpt.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{10 + i},{5 + i}\n" for i in range(8)))
    for lengths in ("article", "gamma"):
        requests, load = serving.workload(ServingOptions(trace=str(path), max_concurrency=2, lengths=lengths))
        assert load.trace_format == "sharegpt" and (requests.arrival_s == 0).all()
        assert requests.prompt_tokens.tolist() == list(range(10, 18))


# ---------------------------------------------------------------- each flag's vLLM name written once
def test_the_parsers_take_vllms_flags_from_the_one_table():
    parser, commands = cli.build_parser()
    for name in ("simulate", "capacity"):
        option_strings = {s for a in commands[name]._actions for s in a.option_strings}
        for field in ("block_size", "kv_cache_dtype", "tensor_parallel_size", "max_model_len", "async_scheduling"):
            assert VLLM_FLAGS[field] in option_strings
    parsed = commands["simulate"].parse_args(["--no-chunked-prefill", "--config", "c.json", "--max-num-seqs", "7"])
    options = cli.common.options_of(parsed)
    assert (options.enable_chunked_prefill, options.hf_config_path, options.max_num_seqs) == (False, "c.json", 7)
    assert set(serving.FLAGS) >= {f.name for f in dataclasses.fields(ServingOptions)} - {"default_max_model_len"}


def test_the_vllm_serve_line_is_made_from_the_table_and_a_candidate_from_the_setups_config():
    for candidate in SearchSpace(data_parallel_size=(1, 2), tensor_parallel_size=(1,)).candidates()[::7]:
        words = shlex.split(candidate.serve_command("m", 4096))
        flags = [w.replace("--no-", "--") for w in words if w.startswith("--")]
        assert set(flags) <= set(VLLM_FLAGS.values()) and len(flags) == len(set(flags))
        settings = candidate.settings | {"max_model_len": 4096}
        assert candidate.config(4096) == serving.engine_config(ServingOptions(**candidate.settings), 4096)
        assert candidate.config(4096) == EngineConfig().replace(**settings)
    assert Candidate(data_parallel_size=2).serve_command("m", 8).count("--enable-expert-parallel") == 1
