"""Real vLLM runs kept as checks of kvlab's step costs (data/checks/): each run's workload, its engine settings and
the latencies vLLM measured per request. They are checks only: nothing in kvlab is fitted to them.

`check_runs()` names the committed runs; `load_vllm_run(name)` returns a VllmRun: the Workload (arrival =
vLLM's engine-core queued time), the settings in vLLM's names (those meta.json does not record are vLLM's
defaults, listed in `assumed`), and per request the first-scheduled, first-token and finish times on the same
clock. data/README.md gives the origin of each file.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvlab.core import validate
from kvlab.core.config import EngineConfig
from kvlab.core.models import DATA_DIR, get_model
from kvlab.core.workload import Workload

CHECKS_DIR = DATA_DIR / "checks"
# The runs' GPUs by the source's folder name -> kvlab's name (data/gpus.csv).
GPUS = {"RTXPRO6000": "RTX-PRO-6000-Server-96GB"}
# What meta.json leaves out: vLLM 0.19.0's defaults, as kvlab assumes them.
DEFAULTS = {
    "block_size": 16,
    "gpu_memory_utilization": 0.9,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "async_scheduling": True,
}
KV_CACHE_DTYPES = {"auto": "bf16", "bfloat16": "bf16"}


@dataclass(frozen=True, eq=False)
class VllmRun:
    """One real vLLM run: its workload, settings and the per-request times vLLM measured (s, the run's clock)."""

    name: str  # e.g. "llmservingsim/RTXPRO6000/Llama-3.1-8B"
    workload: Workload
    settings: dict  # vLLM's names: model, gpu, tensor_parallel_size, max_num_seqs, ...
    assumed: tuple[str, ...]  # settings meta.json does not record (vLLM's defaults)
    request_ids: tuple[str, ...]
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    source: str

    @property
    def ttft_s(self) -> np.ndarray:
        """Time to first token per request: first token - arrival (s)."""
        return self.first_token_s - self.workload.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        """End-to-end latency per request: last token - arrival (s)."""
        return self.finish_s - self.workload.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Time per output token after the first: (finish - first token) / (outputs - 1) (s; NaN for one output)."""
        extra = self.workload.output_tokens - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(extra > 0, (self.finish_s - self.first_token_s) / np.maximum(extra, 1), np.nan)

    def engine_config(self, **changes) -> EngineConfig:
        """kvlab's EngineConfig of the run's settings (one data-parallel rank's engine, its data and expert
        parallelism included: they size its KV cache and time its experts), with changes by vLLM name."""
        s = self.settings
        return (
            EngineConfig()
            .replace(
                block_size=s["block_size"],
                gpu_memory_utilization=s["gpu_memory_utilization"],
                kv_cache_dtype=s["kv_cache_dtype"],
                enable_prefix_caching=s["enable_prefix_caching"],
                tensor_parallel_size=s["tensor_parallel_size"],
                data_parallel_size=s["data_parallel_size"],
                enable_expert_parallel=s["enable_expert_parallel"],
                max_num_seqs=s["max_num_seqs"],
                max_num_batched_tokens=s["max_num_batched_tokens"],
                max_model_len=s["max_model_len"],
                enable_chunked_prefill=s["enable_chunked_prefill"],
                async_scheduling=s["async_scheduling"],
            )
            .replace(**changes)
        )


def check_runs(directory: str | Path = CHECKS_DIR) -> list[str]:
    """The committed runs, e.g. ["llmservingsim/RTXPRO6000/Llama-3.1-8B", ...], sorted."""
    root = Path(directory)
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("settings.json"))


def _settings(meta: dict, folder: Path) -> tuple[dict, tuple[str, ...]]:
    kwargs = meta["engine_kwargs"]
    model = get_model(meta["model"])
    hardware = meta.get("hardware")
    if hardware not in GPUS:
        validate.fail("hardware", hardware, f"of {folder} must be one of {', '.join(GPUS)}")
    settings = {
        "model": model.name,
        "gpu": GPUS[hardware],
        "vllm_version": meta["vllm_version"],
        "dtype": kwargs.get("dtype", "auto"),
        "kv_cache_dtype": KV_CACHE_DTYPES.get(kwargs.get("kv_cache_dtype", "auto"), kwargs.get("kv_cache_dtype")),
        "tensor_parallel_size": kwargs.get("tensor_parallel_size", 1),
        "data_parallel_size": kwargs.get("data_parallel_size", 1),
        "enable_expert_parallel": kwargs.get("enable_expert_parallel", False),
        "max_num_seqs": kwargs["max_num_seqs"],
        "max_num_batched_tokens": kwargs["max_num_batched_tokens"],
        # None: vLLM takes the model's max_position_embeddings
        "max_model_len": kwargs.get("max_model_len") or model.max_position_embeddings,
    }
    assumed = [name for name in DEFAULTS if name not in kwargs]
    settings |= {name: kwargs.get(name, default) for name, default in DEFAULTS.items()}
    if kwargs.get("max_model_len") is None:
        assumed.append("max_model_len")
    return settings, tuple(assumed)


def load_vllm_run(name: str, directory: str | Path = CHECKS_DIR) -> VllmRun:
    """One committed run by name (see check_runs); a name not committed is a one-line ValueError."""
    folder = Path(directory) / name
    if not (folder / "settings.json").is_file():
        validate.fail("run", name, f"is not a run of {directory}; runs: {', '.join(check_runs(directory))}")
    meta = json.loads((folder / "settings.json").read_text(encoding="utf-8"))
    settings, assumed = _settings(meta, folder)
    with open(folder / "requests.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))

    def column(key: str, kind=float) -> np.ndarray:
        return np.array([kind(r[key]) for r in rows])

    workload = Workload(
        column("arrival_s"), column("prompt_tokens", int), column("output_tokens", int), name=f"vLLM run {name}"
    )
    return VllmRun(
        name,
        workload,
        settings,
        assumed,
        tuple(r["request_id"] for r in rows),
        column("first_scheduled_s"),
        column("first_token_s"),
        column("finish_s"),
        f"{meta['model']} on {settings['gpu']}, vLLM {meta['vllm_version']} "
        f"({meta['num_requests']} requests of {meta['dataset_path']}, {meta['started_at']})",
    )


__all__ = ["CHECKS_DIR", "VllmRun", "check_runs", "load_vllm_run"]
