"""A (model, GPU, TP) whose profile times its linear layers only (vidur's) is served by them, the rest at the
sustained rates (kvlab.core.cost.LinearProfileStepCost)."""

import csv
import dataclasses

import numpy as np
import pytest

from kvlab.core import models, profiles
from kvlab.core.config import EngineConfig, ParallelConfig
from kvlab.core.cost import Batch, LinearProfileStepCost, RooflineStepCost, make_step_cost
from kvlab.core.engine import Engine
from kvlab.core.workload import Workload

LLAMA2 = "meta-llama/Llama-2-7b-hf"
SYNC = EngineConfig().replace(async_scheduling=False)


def cost(model=LLAMA2, gpu="A100-SXM-80GB", config=SYNC):
    """The measured clock of model as a config.json without its MLP and vocabulary sizes gives it: the operator
    tables cannot compose it, so vidur's linear layers time it (with the sizes, the tables win: every term measured)."""
    spec = dataclasses.replace(models.get_model(model), layer_sizes=())
    return make_step_cost("measured", model=spec, gpu=models.get_gpu(gpu), config=config)


def linear_us(path: str, tokens: int) -> float:
    """One layer's four linear layers at tokens, summed from the committed CSV by hand."""
    with open(profiles.PROFILES_DIR / path / "dense.csv", newline="") as f:
        return sum(float(r["time_us"]) for r in csv.DictReader(f) if int(r["tokens"]) == tokens)


def test_a_vidur_model_is_served_by_its_measured_linear_layers_and_says_so():
    c = cost()
    assert isinstance(c, LinearProfileStepCost) and c.name == "measured"
    assert c.describe().startswith("vidur profile a100/meta-llama/Llama-2-7b-hf/fp16/tp1: its linear layers measured")
    assert "added to each step" in c.describe()


def test_a_decode_step_is_the_layers_measured_plus_the_rest_and_the_cpu():
    c = cost()
    batch = Batch(8, 8 * 1025, 8, 8 * 1025)  # 8 is a measured token count and a CUDA-graph size
    cpu_us = c._with_cpu(0.0, 8)
    expected_us = 32 * linear_us("vidur/a100/meta-llama/Llama-2-7b-hf/tp1", 8) + c.rest.step_s(batch) * 1e6 + cpu_us
    assert c.step_s(batch) * 1e6 == pytest.approx(expected_us, rel=1e-12)
    # the rest holds the weights outside the linear layers: embeddings and lm_head, 2 x 32,000 x 4,096 x 2 bytes,
    # within the rounding of the parameter count (6.74 B)
    assert c.rest.weights_bytes == pytest.approx(2 * 32000 * 4096 * 2, rel=0.05)
    assert c.min_step_s(8) <= c.step_s(batch)


def test_tensor_parallelism_reads_that_tps_profile_and_adds_the_all_reduce():
    tp2 = cost(config=SYNC.replace(tensor_parallel_size=2))
    assert isinstance(tp2, LinearProfileStepCost) and "tp2" in tp2.describe()
    assert (
        tp2.rest.all_reduce is not None
        and "vLLM's custom all-reduce in a CUDA graph measured among 2 GPUs" in tp2.describe()
    )


def test_a_model_with_no_such_profile_falls_back_to_the_roofline():
    assert isinstance(cost("deepseek-ai/DeepSeek-V2-Lite"), RooflineStepCost)  # MLA: no operator table composes it
    piped = EngineConfig(parallel=ParallelConfig(pipeline_parallel_size=2))
    assert isinstance(cost(gpu="H100-SXM-80GB", config=piped), RooflineStepCost)


def test_the_engine_serves_a_workload_on_it():
    w = Workload(np.array([0.0, 0.01, 0.02]), np.array([300, 500, 700]), np.array([20, 30, 40]))
    result = Engine(w, SYNC.replace(max_model_len=4096), num_gpu_blocks=500, cost=cost()).run()
    assert (result.num_output_tokens == [20, 30, 40]).all() and (np.diff(result.steps["end_s"]) > 0).all()
