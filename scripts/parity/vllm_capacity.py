#!/usr/bin/env python
"""vLLM's own KV-cache sizing, run on the CPU, for kvlab's parity check (`make parity`).

Usage (in the vLLM virtual environment, no GPU, no network):

    .venv-vllm/bin/python scripts/parity/vllm_capacity.py IN.json OUT.json [--verbose]

IN.json is {"cases": [case, ...]}. A case names a model (a Hugging Face config.json, inline or by
path) and the settings vLLM's KV-cache sizing reads:

    id                      any string (echoed back)
    config_json | config_path | config_ref
                            the HF config dict, the path of a config.json (or of its folder), or
                            the key of a dict in IN.json's top-level "configs" {key: HF config}
    available_kv_bytes      KV-cache bytes per GPU: one int for every GPU, a list with one int per
                            pipeline stage (or one per GPU, stage-major), or
                            {"requests": n, "plus_blocks": k, "plus_bytes": b}: n times the bytes
                            vLLM says one max_model_len request needs on each stage, plus k of that
                            stage's blocks, plus b bytes (n=1, k=0 is the smallest memory vLLM
                            refuses; k=1 the smallest it accepts)
    max_model_len           tokens per request (default: vLLM derives it from the config)
    block_size              16
    kv_cache_dtype          "auto" (the model's dtype), "bfloat16", "fp8", ... (vLLM's names)
    tensor_parallel_size    1
    pipeline_parallel_size  1
    data_parallel_size      1 (each rank sizes its own KV cache; a mixture-of-experts model's experts are
                            split over DP x TP GPUs)
    enable_expert_parallel  false
    max_num_batched_tokens  8192 (`vllm serve` on an H100/H200)
    async_scheduling        null: vLLM decides as on a GPU (on, except the V1 runner with PP > 1);
                            true or false as --async-scheduling / --no-async-scheduling
    hybrid_kv_cache_manager true (vLLM's default on a GPU); false as --disable-hybrid-kv-cache-manager
    enable_prefix_caching   null: vLLM's default (on for generative models, so Mamba layers take
                            mamba_cache_mode "align"); true or false as --(no-)enable-prefix-caching
    model_runner            "v2" (vLLM's default on a GPU with Triton) or "v1"
    attention_backend       null: the first backend of vLLM's Hopper (SM90) priority list that takes
                            the KV dtype and block size (FLASH_ATTN for bf16/fp8; for MLA,
                            TRITON_MLA stands in for FLASH_ATTN_MLA, which imports only on a
                            GPU: both take any multiple of 16 tokens); or a name of
                            vllm.v1.attention.backends.registry.AttentionBackendEnum
    spec_source             "auto" (model class, else constructed), "model" or "constructed"
    quantization            null (the checkpoint's quantization_config, if any) or vLLM's --quantization, e.g.
                            "fp8" (online per-tensor FP8 of a 16-bit checkpoint)

For every case the script (1) builds vLLM's VllmConfig from the config.json; (2) builds the
per-layer KV cache specs of every pipeline stage the way a vLLM worker does: it instantiates
vLLM's own model class on the meta device, with vLLM's tensor- and pipeline-parallel group sizes
set to the case's, and asks each attention layer for get_kv_cache_spec ("model" path); where that
fails it constructs vLLM's spec classes from vLLM's ModelConfig helpers instead ("constructed"
path); (3) runs vLLM's sizing functions in the order vllm/v1/engine/core.py
(EngineCore._initialize_kv_caches) calls them: get_global_kv_cache_groups, get_kv_cache_configs,
generate_scheduler_kv_cache_config, update_kv_cache_capacity. OUT.json gets, per case,
num_gpu_blocks, the "GPU KV cache size" token figure, the maximum concurrency, whether vLLM
starts (or the error it raises), the KV cache groups, the exact log lines, and the spec path.

Running on a CPU, vLLM selects its CPU platform (VLLM_TARGET_DEVICE=cpu; the CUDA build on a
machine without a GPU cannot even build a VllmConfig). The CPU platform changes settings a GPU
would not, so the script sets them back to what vLLM chooses on a CUDA GPU and records each
change under "emulation" in OUT.json: the settings the CPU platform's check_and_update_config
changes after vLLM resolved them (async scheduling, which it turns off; the block size, which it
forces to 16 for MLA; the Mamba SSM state dtype, which it makes float32), the model runner (V2, which needs Triton; VLLM_USE_V2_MODEL_RUNNER), the
attention backend of every layer (CPU_ATTN takes multiples of 32 tokens only, which changes
sliding-window block sizes), the device name in the log line, and, for Gated DeltaNet layers,
the prefill backend vLLM picks on a Hopper GPU (FlashInfer's, which exports prefill checkpoints in
mamba_cache_mode "align"). After the model is built, vLLM's Platform.update_block_size_for_backend
runs as a GPU worker runs it (the attention block size raised to cover a Mamba state, the Mamba
page padded to the attention page).

Only vLLM is imported (no kvlab, no pandas); a bad case is recorded and the next one runs.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

# vLLM reads these when it is imported: use its CPU platform, never reach the network.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
# vLLM would install its own stream handler; this script captures its records instead.
os.environ["VLLM_CONFIGURE_LOGGING"] = "0"


class _Capture(logging.Handler):
    """Keeps vLLM's log records of the current case instead of printing them."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.echo = False

    def emit(self, record):
        self.records.append(record)
        if self.echo:
            print(f"  [vllm {record.levelname}] {record.getMessage()}", file=sys.stderr)


# Installed before vLLM is imported, so its import-time notes are kept out of the output too.
CAPTURE = _Capture()
_vllm_root = logging.getLogger("vllm")
_vllm_root.addHandler(CAPTURE)
_vllm_root.setLevel(logging.INFO)
_vllm_root.propagate = False

import torch  # noqa: E402

logging.getLogger("torch").setLevel(logging.ERROR)  # torch's notes while vLLM imports (set after
# torch's import, which sets its own level)

import vllm  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import parallel_state  # noqa: E402
from vllm.distributed.utils import get_pp_indices  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.layers.attention.attention import _largest_kernel_block_within  # noqa: E402
from vllm.model_executor.model_loader.utils import initialize_model  # noqa: E402
from vllm.platforms.interface import Platform  # noqa: E402
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype, set_default_torch_dtype  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.backends.utils import (  # noqa: E402
    get_supported_kv_cache_layouts,
    resolve_kv_cache_layout,
)
from vllm.v1.core import kv_cache_planning as planning  # noqa: E402
from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    resolve_kv_cache_block_sizes,
    update_kv_cache_capacity,
)
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    get_kv_quant_mode,
)
from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec as worker_kv_cache_spec  # noqa: E402
from vllm.v1.worker.utils import customize_attention_spec  # noqa: E402

# ---------------------------------------------------------------- case settings and their defaults
DEFAULTS = {
    "block_size": 16,
    "kv_cache_dtype": "auto",
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    "enable_expert_parallel": False,
    "max_model_len": None,
    "max_num_batched_tokens": 8192,
    "async_scheduling": None,
    "hybrid_kv_cache_manager": True,
    "enable_prefix_caching": None,
    "model_runner": "v2",
    "attention_backend": None,
    "spec_source": "auto",
    "quantization": None,
}
# The order vLLM's CUDA platform tries attention backends in on a Hopper GPU (SM90;
# vllm/platforms/cuda.py, _get_backend_priorities). The first that takes the KV dtype and block
# size is used (vLLM also checks the device, which cannot be done here).
BACKEND_PRIORITY = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
MLA_BACKEND_PRIORITY = ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA")
# Why each backend was chosen, once per backend and KV dtype (OUT.json's "attention_backends").
BACKEND_NOTES: dict[str, str] = {}
# vLLM's loggers whose lines OUT.json keeps (the sizing path).
PLANNING_LOGGERS = ("vllm.v1.core", "vllm.v1.attention.backends.utils")


# ---------------------------------------------------------------- logging
def _reset_log_once():
    """vLLM logs its capacity line with info_once (an lru_cache): clear it so every case logs."""
    from vllm import logger as vllm_logger

    for name in ("_print_debug_once", "_print_info_once", "_print_warning_once", "_print_error_once"):
        fn = getattr(vllm_logger, name, None)
        if fn is not None and hasattr(fn, "cache_clear"):
            fn.cache_clear()


# ---------------------------------------------------------------- model configs on disk
_CONFIG_DIRS: dict[str, str] = {}
_SCRATCH = Path(tempfile.mkdtemp(prefix="vllm_capacity_"))


def _model_dir(case: dict) -> str:
    """A folder holding the case's config.json (vLLM loads models from a folder or the hub)."""
    if case.get("config_json") is not None:
        text = json.dumps(case["config_json"], sort_keys=True)
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        if key not in _CONFIG_DIRS:
            folder = _SCRATCH / key
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text(text)
            _CONFIG_DIRS[key] = str(folder)
        return _CONFIG_DIRS[key]
    path = Path(case["config_path"])
    if path.is_dir():
        return str(path)
    if path.name == "config.json":
        return str(path.parent)
    key = "path-" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    if key not in _CONFIG_DIRS:  # a config file under another name: copy it into a folder
        folder = _SCRATCH / key
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(path.read_text())
        _CONFIG_DIRS[key] = str(folder)
    return _CONFIG_DIRS[key]


# ---------------------------------------------------------------- VllmConfig as on a CUDA GPU
@contextlib.contextmanager
def _model_runner_env(runner: str):
    """vLLM reads VLLM_USE_V2_MODEL_RUNNER whenever it asks which runner is in use."""
    old = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = old


# Settings vLLM resolves in VllmConfig.__post_init__ that the CPU platform's
# check_and_update_config (run at its end) may change for the CPU's sake.
# (The hybrid KV cache manager is resolved after the hook; the CPU platform supports it.)
_WATCHED = (
    ("scheduler_config", "async_scheduling"),
    ("scheduler_config", "max_num_batched_tokens"),
    ("cache_config", "block_size"),
    ("cache_config", "cache_dtype"),
    ("cache_config", "mamba_cache_dtype"),
    ("cache_config", "mamba_ssm_cache_dtype"),  # the CPU's GDN backend wants float32 SSM states
    ("model_config", "max_model_len"),
)


@contextlib.contextmanager
def _before_platform_hook():
    """Record the watched settings as vLLM resolved them, just before the platform's hook runs."""
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    original = platform_cls.__dict__["check_and_update_config"]
    seen: dict = {}

    def watched(cls, vllm_config):
        seen.update({(part, name): getattr(getattr(vllm_config, part), name) for part, name in _WATCHED})
        return original.__func__(cls, vllm_config)

    platform_cls.check_and_update_config = classmethod(watched)
    try:
        yield seen
    finally:
        platform_cls.check_and_update_config = original


def build_vllm_config(case: dict, settings: dict):
    """vLLM's VllmConfig for the case, with the CPU platform's changes set back to a GPU's.

    vLLM resolves every setting itself (async scheduling: on unless the V1 runner meets pipeline
    parallelism, and an explicit request it cannot honour raises as on a GPU); the CPU platform's
    hook then changes some for the CPU (async scheduling off, block_size 16 for MLA), and those
    are set back to vLLM's resolution. Each change is recorded in the returned "emulation".
    """
    args = EngineArgs(
        model=_model_dir(case),
        skip_tokenizer_init=True,
        max_model_len=settings["max_model_len"],
        block_size=settings["block_size"],
        kv_cache_dtype=settings["kv_cache_dtype"],
        tensor_parallel_size=settings["tensor_parallel_size"],
        pipeline_parallel_size=settings["pipeline_parallel_size"],
        data_parallel_size=settings["data_parallel_size"],
        enable_expert_parallel=settings["enable_expert_parallel"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        async_scheduling=settings["async_scheduling"],
        disable_hybrid_kv_cache_manager=None if settings["hybrid_kv_cache_manager"] else True,
        enable_prefix_caching=settings["enable_prefix_caching"],
        quantization=settings["quantization"],
    )
    with _before_platform_hook() as resolved:
        config = args.create_engine_config()
    emulation = {}

    def restore(where, name, value):
        now = getattr(where, name)
        if now != value:
            emulation[name] = [now, value]  # [the CPU platform's value, the value used]
            setattr(where, name, value)

    for (part, name), value in resolved.items():  # as vLLM resolved them before the CPU's hook
        restore(getattr(config, part), name, value)
    # Only the capacity log line's wording ("GPU KV cache size") reads the device type here.
    restore(config.device_config, "device_type", "cuda")
    return config, emulation


# ---------------------------------------------------------------- attention backends (GPU's)
def _backend_class(name: str):
    return AttentionBackendEnum[name].get_class()


def choose_backend(settings: dict, use_mla: bool) -> tuple[type, str]:
    """The attention backend class vLLM would use on a Hopper GPU, and a note on the choice."""
    if settings["attention_backend"]:
        name = settings["attention_backend"]
        return _backend_class(name), "as asked"
    skipped = []
    for name in MLA_BACKEND_PRIORITY if use_mla else BACKEND_PRIORITY:
        try:
            backend = _backend_class(name)
        except Exception as error:  # noqa: BLE001 - a GPU-only import
            skipped.append(f"{name} (no import on CPU: {type(error).__name__})")
            continue
        dtype = settings["kv_cache_dtype"]
        if dtype not in backend.supported_kv_cache_dtypes:
            skipped.append(f"{name} (kv_cache_dtype {dtype})")
            continue
        if not backend.supports_block_size(settings["block_size"]):
            skipped.append(f"{name} (block_size {settings['block_size']})")
            continue
        note = "first of vLLM's SM90 priority list that takes the KV dtype and block size"
        return backend, note + ("; skipped: " + ", ".join(skipped) if skipped else "")
    raise ValueError("no attention backend takes this KV dtype and block size: " + ", ".join(skipped))


# ---------------------------------------------------------------- per-layer KV cache specs
_DIST_READY = False


def _init_distributed():
    """One-process gloo world, so vLLM's model classes find their parallel groups."""
    global _DIST_READY
    if _DIST_READY:
        return
    # A config without a model makes vLLM create every group, the expert-parallel one included
    # (it is skipped for dense models, and MoE layers ask for it).
    with set_current_vllm_config(VllmConfig()):
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{_SCRATCH / 'dist_init'}",
            backend="gloo",
        )
        parallel_state.initialize_model_parallel(1, 1)
    _DIST_READY = True


@contextlib.contextmanager
def _as_rank(tp_size: int, pp_size: int, pp_rank: int, dp_size: int = 1):
    """Make vLLM's tensor, pipeline and data-parallel groups report the case's sizes (rank 0 of the
    stage's TP, data-parallel rank 0).

    Building a model only reads the group sizes and ranks (heads per GPU, layers of the stage, an
    MoE layer's experts per GPU); nothing is communicated, so one process can build any rank's
    layers on the meta device.
    """
    tp, pp, dp = parallel_state.get_tp_group(), parallel_state.get_pp_group(), parallel_state.get_dp_group()
    saved = (tp.world_size, tp.rank_in_group, pp.world_size, pp.rank_in_group, dp.world_size, dp.rank_in_group)
    tp.world_size, tp.rank_in_group = tp_size, 0
    pp.world_size, pp.rank_in_group = pp_size, pp_rank
    dp.world_size, dp.rank_in_group = dp_size, 0
    try:
        yield
    finally:
        tp.world_size, tp.rank_in_group, pp.world_size, pp.rank_in_group, dp.world_size, dp.rank_in_group = saved


def _construction_backend_path(backend) -> str:
    """Qualified name of the class the selector hands layers while the model is built.

    MLA backends are used as they are (their kernel objects build on the CPU). Other backends go
    through a subclass whose kernel object (AttentionImpl) skips its __init__, which needs the GPU
    (FlashAttention's refuses fp8 on a device it cannot query); the layers read the kernel
    class's flags only, and get_kv_cache_spec reads the backend class, swapped back for the real
    one right after the build.
    """
    if backend.is_mla():
        module, qualname = backend.full_cls_name()
        return f"{module}.{qualname}"
    name = f"_NoKernels_{backend.get_name()}"
    if not hasattr(sys.modules[__name__], name):
        impl = backend.get_impl_cls()
        idle_impl = type(f"_Idle{impl.__name__}", (impl,), {"__init__": lambda self, *args, **kwargs: None})
        stub = type(name, (backend,), {"get_impl_cls": staticmethod(lambda: idle_impl)})
        setattr(sys.modules[__name__], name, stub)
    return f"{__name__}.{name}"


@contextlib.contextmanager
def _gpu_backend_selected(backend):
    """Make vLLM's attention selector hand every layer the GPU's backend while a model is built.

    On the CPU platform the selector returns CPU_ATTN / CPU_MLA (and refuses fp8 MLA); on a GPU
    it returns the backend chosen here. The selector caches its answers, so the cache is
    cleared on the way in and out.
    """
    from vllm.platforms import current_platform
    from vllm.v1.attention import selector

    platform_cls = type(current_platform)
    original = platform_cls.__dict__["get_attn_backend_cls"]
    path = _construction_backend_path(backend)
    platform_cls.get_attn_backend_cls = classmethod(lambda cls, *args, **kwargs: path)
    selector._cached_get_attn_backend.cache_clear()
    try:
        yield
    finally:
        platform_cls.get_attn_backend_cls = original
        selector._cached_get_attn_backend.cache_clear()


@contextlib.contextmanager
def _hopper_gdn_prefill():
    """Gated DeltaNet layers pick their prefill kernel by the device: FlashInfer's on a Hopper GPU (SM90), which
    exports prefill checkpoints in mamba_cache_mode "align"; on the CPU they would pick Triton's."""
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn

    original = gdn._resolve_gdn_prefill_backend
    gdn._resolve_gdn_prefill_backend = lambda vllm_config: ("auto", "flashinfer")
    try:
        yield
    finally:
        gdn._resolve_gdn_prefill_backend = original


# The cache settings update_block_size_for_backend may change, kept with a stage's specs.
_BLOCK_SETTINGS = ("block_size", "mamba_block_size", "mamba_page_size_padded")


def loaded_weight_bytes(model) -> int:
    """The bytes of the parameters one GPU holds once loaded: each parameter as vLLM's create_weights allocates it,
    except a layer of an online FP8 method (`--quantization fp8` on a 16-bit checkpoint: Fp8PerTensorOnlineLinearMethod
    in vllm/model_executor/layers/quantization/online/fp8.py), whose 16-bit weight create_weights puts on the meta
    device and process_weights_after_loading replaces with the FP8 weight (1 byte a value) and its one fp32 scale.
    A parameter two modules share (a tied lm_head: ParallelLMHead.tie_weights points its weight at the embedding's)
    is one tensor on the GPU and counts once."""
    from vllm.model_executor.layers.quantization.online.fp8 import Fp8PerTensorOnlineLinearMethod

    total, seen = 0, set()
    for module in model.modules():
        online = isinstance(getattr(module, "quant_method", None), Fp8PerTensorOnlineLinearMethod)
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if online and name == "weight":
                total += param.numel() * torch.finfo(torch.float8_e4m3fn).bits // 8 + 4  # + weight_scale, fp32 [1]
            else:
                total += param.numel() * param.element_size()
    return total


def specs_from_model(config, backend, pp_rank: int) -> tuple[dict, int]:
    """One stage's specs from vLLM's model class: each attention layer's get_kv_cache_spec, and the
    bytes of the parameters one GPU of the stage holds (rank 0 of its TP and DP groups).

    The model is instantiated on the meta device (no memory, no weights), its attention layers
    given the GPU's backend class (on the CPU they would get CPU_ATTN), and the worker's own
    collector (vllm/v1/worker/gpu/attn_utils.py: get_kv_cache_spec, which also applies the
    backend's customize_attention_spec) reads the specs.
    """
    _init_distributed()
    parallel = config.parallel_config
    config.compilation_config.static_forward_context.clear()
    with _as_rank(parallel.tensor_parallel_size, parallel.pipeline_parallel_size, pp_rank, parallel.data_parallel_size):
        with _gpu_backend_selected(backend), set_default_torch_dtype(config.model_config.dtype), torch.device("meta"):
            with _hopper_gdn_prefill():
                model = initialize_model(config)
        weights = loaded_weight_bytes(model)
        for layer in config.compilation_config.static_forward_context.values():
            if issubclass(getattr(layer, "attn_backend", object), backend):
                layer.attn_backend = backend  # the real class, not the no-kernels stand-in
        # A GPU worker's next step after load_model (vllm/v1/executor/uniproc_executor.py), on CUDA's platform
        # class (the interface's; the CPU platform overrides it)
        Platform.update_block_size_for_backend.__func__(Platform, config)
        with set_current_vllm_config(config):
            specs = worker_kv_cache_spec(config)
    config.compilation_config.static_forward_context.clear()
    return specs, weights


def _layer_windows(model_config, start: int, end: int) -> dict[int, int | None]:
    """Sliding window of each layer from the HF config (layer_types, else one model-wide window)."""
    text = model_config.hf_text_config
    window = model_config.get_sliding_window()
    layer_types = getattr(text, "layer_types", None)
    windows = {}
    for i in range(start, end):
        if layer_types:
            windows[i] = window if layer_types[i] == "sliding_attention" else None
        else:
            windows[i] = window
    return windows


def specs_constructed(config, backend, pp_rank: int) -> dict:
    """One stage's specs built from vLLM's spec classes, as vLLM's attention layers build them.

    Mirrors Attention.get_kv_cache_spec (model_executor/layers/attention/attention.py) and
    MLAAttention.get_kv_cache_spec (mla_attention.py), with vLLM's ModelConfig helpers for the
    layer split (get_pp_indices), heads per GPU (get_num_kv_heads) and head size; the worker then
    applies customize_attention_spec. Layer names follow vLLM's decoder models.
    """
    model_config, cache_config, parallel = config.model_config, config.cache_config, config.parallel_config
    start, end = get_pp_indices(model_config.get_total_num_hidden_layers(), pp_rank, parallel.pipeline_parallel_size)
    dtype_str = cache_config.cache_dtype
    dtype = kv_cache_dtype_str_to_dtype(dtype_str, model_config)
    head = model_config.get_head_size()
    block = cache_config.block_size
    quant = get_kv_quant_mode(dtype_str)
    specs = {}
    for i, window in _layer_windows(model_config, start, end).items():
        name = f"model.layers.{i}.self_attn.attn"
        if model_config.use_mla:
            spec = MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                max_tp_shards=1,
                head_size=head,
                dtype=dtype,
                cache_dtype_str=dtype_str,
                kv_quant_mode=quant,
            )
        else:
            heads = model_config.get_num_kv_heads(parallel)
            if window is None:
                spec = FullAttentionSpec(
                    block_size=block, num_kv_heads=heads, head_size=head, dtype=dtype, kv_quant_mode=quant
                )
            else:
                one = backend.customize_spec(
                    SlidingWindowSpec(
                        block_size=1,
                        num_kv_heads=heads,
                        head_size=head,
                        dtype=dtype,
                        kv_quant_mode=quant,
                        sliding_window=window,
                    )
                )
                per_token = one.real_page_size_bytes
                sw_block = _largest_kernel_block_within(backend, per_token, per_token * block, block, one)
                spec = SlidingWindowSpec(
                    block_size=sw_block,
                    num_kv_heads=heads,
                    head_size=head,
                    dtype=dtype,
                    kv_quant_mode=quant,
                    sliding_window=window,
                )
        specs[name] = customize_attention_spec(backend, spec)
    return specs


_SPEC_CACHE: dict[tuple, tuple] = {}


def stage_specs(case: dict, config, settings: dict, backend) -> tuple[list[dict], str, list[str], bool | None, list]:
    """Per-stage layer specs ([stage 0, stage 1, ...]), the path used, notes on a fallback,
    whether the constructed specs equal the model class's (None where only one path ran), and the
    parameter bytes one GPU of each stage holds (None on the constructed path)."""
    key = (
        _model_dir(case),
        settings["tensor_parallel_size"],
        settings["pipeline_parallel_size"],
        settings["data_parallel_size"],
        settings["enable_expert_parallel"],
        config.cache_config.cache_dtype,
        settings["block_size"],
        backend.get_name(),
        settings["spec_source"],
        settings["quantization"],
    )
    if config.model_config.is_hybrid:  # Mamba specs read the length, the cache mode and the step budget too
        key += (config.model_config.max_model_len, config.cache_config.mamba_cache_mode, config.max_in_flight_tokens)
    if key in _SPEC_CACHE:
        stages, path, notes, agree, weights, block = _SPEC_CACHE[key]
        for name, value in block.items():  # as update_block_size_for_backend left them
            setattr(config.cache_config, name, value)
        return [dict(s) for s in stages], path, list(notes), agree, list(weights)
    pp = settings["pipeline_parallel_size"]
    notes: list[str] = []
    stages = None
    weights = [None] * pp
    path = "constructed"
    if settings["spec_source"] in ("auto", "model"):
        try:
            stages, weights = (list(x) for x in zip(*(specs_from_model(config, backend, r) for r in range(pp))))
            path = "model"
        except Exception as error:  # noqa: BLE001 - recorded, then the constructed path
            if settings["spec_source"] == "model":
                raise
            notes.append(
                f"model class failed ({type(error).__name__}: {str(error)[:300]}); "
                "specs constructed from vLLM's spec classes"
            )
            config.compilation_config.static_forward_context.clear()
    agree = None
    if stages is None:
        stages = [specs_constructed(config, backend, r) for r in range(pp)]
    else:  # check the constructed path against vLLM's layers wherever both run (names aside:
        # multimodal wrappers prefix theirs, e.g. language_model.model.layers.0.self_attn.attn)
        constructed = [specs_constructed(config, backend, r) for r in range(pp)]
        agree = [list(c.values()) for c in constructed] == [list(s.values()) for s in stages]
    block = {name: getattr(config.cache_config, name) for name in _BLOCK_SETTINGS}
    _SPEC_CACHE[key] = ([dict(s) for s in stages], path, list(notes), agree, list(weights), block)
    return stages, path, notes, agree, weights


# ---------------------------------------------------------------- sizing, in EngineCore's order
def _memory_per_worker(spec, stages, config, builder, global_groups, tp: int) -> list[int]:
    """Available KV bytes of every worker (stage-major, as vLLM orders ranks: PP x TP)."""
    pp = len(stages)
    if isinstance(spec, dict):
        per_stage = []
        for worker_spec in stages:
            groups = planning._project_kv_cache_groups_to_worker(global_groups, worker_spec)
            one_request = planning._max_memory_usage_bytes_from_groups(builder, config, groups)
            block = planning._pool_bytes_per_block_from_builder(builder, config, groups)
            per_stage.append(
                int(spec.get("requests", 1)) * one_request
                + int(spec.get("plus_blocks", 0)) * block
                + int(spec.get("plus_bytes", 0))
            )
        return [m for m in per_stage for _ in range(tp)]
    if isinstance(spec, list):
        if len(spec) == pp:
            return [int(m) for m in spec for _ in range(tp)]
        if len(spec) == pp * tp:
            return [int(m) for m in spec]
        raise ValueError(f"available_kv_bytes lists {len(spec)} values; give 1, PP={pp} or PP*TP={pp * tp}")
    return [int(spec)] * (pp * tp)


def _group_summary(group, config) -> dict:
    spec = group.kv_cache_spec
    layer = next(iter(spec.kv_cache_specs.values())) if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    return {
        "spec": type(layer).__name__,
        "num_layers": len(group.layer_names),
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
        "sliding_window": getattr(layer, "sliding_window", None),
        "max_memory_usage_bytes": spec.max_memory_usage_bytes(config),
        "blocks_per_request": -(-spec.max_memory_usage_bytes(config) // spec.page_size_bytes),
    }


def size_case(case: dict, capture: _Capture = CAPTURE) -> dict:
    """Run one case through vLLM; the result dict of OUT.json."""
    settings = {k: case.get(k, v) for k, v in DEFAULTS.items()}
    if case.get("model") is not None:
        settings = {"model": case["model"], **settings}
    result: dict = {"id": case.get("id"), "settings": settings}
    _reset_log_once()
    capture.records.clear()
    step = "config"
    started = time.perf_counter()
    try:
        with _model_runner_env(settings["model_runner"]):
            config, emulation = build_vllm_config(case, settings)
            result["emulation"] = emulation
            backend, backend_note = choose_backend(settings, config.model_config.use_mla)
            result["attention_backend"] = backend.get_name()
            BACKEND_NOTES.setdefault(f"{backend.get_name()} for {settings['kv_cache_dtype']}", backend_note)
            result["resolved"] = {
                "architecture": config.model_config.architectures[0],
                "max_model_len": config.model_config.max_model_len,
                "kv_cache_dtype": config.cache_config.cache_dtype,
                "model_dtype": str(config.model_config.dtype).replace("torch.", ""),
                "use_mla": config.model_config.use_mla,
                "async_scheduling": config.scheduler_config.async_scheduling,
                "disable_hybrid_kv_cache_manager": config.scheduler_config.disable_hybrid_kv_cache_manager,
                "use_v2_model_runner": config.use_v2_model_runner,
                "max_concurrent_batches": config.max_concurrent_batches,
                "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
                "max_in_flight_tokens": config.max_in_flight_tokens,
            }

            step = "specs"
            stages, path, notes, agree, weights = stage_specs(case, config, settings, backend)
            result["spec_path"] = path
            result["weights_bytes_per_stage"] = weights
            result["constructed_specs_agree"] = agree
            if notes:
                result["spec_notes"] = notes
            tp = settings["tensor_parallel_size"]
            # One dict per worker, ranks ordered PP x TP; TP ranks of a stage hold the same specs.
            kv_cache_specs = [dict(s) for s in stages for _ in range(tp)]
            result["layers_per_stage"] = [len(s) for s in stages]

            step = "planning"
            # vllm/v1/engine/core.py, EngineCore._initialize_kv_caches, in its order:
            register_all_kvcache_specs(config)
            layout = resolve_kv_cache_layout(
                config,
                [[x.name for x in get_supported_kv_cache_layouts([backend])]] * len(kv_cache_specs),
                [s for specs in kv_cache_specs for s in specs.values()],
            )
            result["resolved"]["kv_cache_layout"] = layout.name
            global_groups = planning.get_global_kv_cache_groups(config, kv_cache_specs)
            config.adjust_dcp_kv_cache_interleave_size(global_groups)
            builder = get_kv_cache_config_builder(config)
            memory = _memory_per_worker(case["available_kv_bytes"], stages, config, builder, global_groups, tp)
            result["available_kv_bytes_per_stage"] = memory[::tp]
            per_stage = []
            for worker_spec, avail in zip(stages, memory[::tp]):
                groups = planning._project_kv_cache_groups_to_worker(global_groups, worker_spec)
                block = planning._pool_bytes_per_block_from_builder(builder, config, groups)
                per_stage.append(
                    {
                        "num_layers": len(worker_spec),
                        "bytes_per_block": block,
                        "num_blocks": avail // block if groups else 1,
                        "one_request_bytes": planning._max_memory_usage_bytes_from_groups(builder, config, groups),
                    }
                )
            result["stages"] = per_stage
            result["num_kv_cache_groups"] = len(global_groups)
            result["kv_cache_groups"] = [_group_summary(g, config) for g in global_groups]
            try:
                kv_cache_configs = planning.get_kv_cache_configs(config, kv_cache_specs, memory, global_groups)
            except ValueError as error:  # vLLM's "not enough KV cache memory" refusal
                result["starts"] = False
                result["error"] = str(error)
                return result
            scheduler_config = generate_scheduler_kv_cache_config(kv_cache_configs)
            config.cache_config.num_gpu_blocks = scheduler_config.num_blocks
            groups = scheduler_config.kv_cache_groups
            if groups:
                participating = [g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable]
                config.cache_config.block_size = min(participating or [g.kv_cache_spec.block_size for g in groups])
                update_kv_cache_capacity(config, scheduler_config)
            config.validate_block_size()
            resolve_kv_cache_block_sizes(scheduler_config, config)

            result["starts"] = True
            result["num_gpu_blocks"] = scheduler_config.num_blocks
            result["gpu_kv_cache_tokens"] = config.cache_config.kv_cache_size_tokens
            result["max_concurrency"] = config.cache_config.kv_cache_max_concurrency
            result["blocks_per_request"] = sum(
                -(-g.kv_cache_spec.max_memory_usage_bytes(config) // g.kv_cache_spec.page_size_bytes)
                for g in groups
                if not g.host_resident
            )
            return result
    except Exception as error:  # noqa: BLE001 - one bad case must not stop the grid
        # vLLM itself rejects the settings (config) or the memory (planning): it would not start.
        # A failure to build the specs here says nothing about vLLM: starts is unknown (None).
        result["starts"] = None if step == "specs" else False
        result["error_stage"] = step
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = "".join(traceback.format_exc().splitlines(keepends=True)[-16:])
        return result
    finally:
        lines = [r for r in capture.records if r.name.startswith(PLANNING_LOGGERS)]
        result["log_lines"] = [f"{r.levelname} {r.getMessage()}" for r in lines]
        capacity = [r.getMessage() for r in lines if "KV cache size:" in r.getMessage()]
        if capacity:
            result["log_capacity_line"] = capacity[-1]
        result["seconds"] = round(time.perf_counter() - started, 4)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="IN.json: {'cases': [...]}")
    parser.add_argument("output", help="OUT.json to write")
    parser.add_argument("--verbose", action="store_true", help="print vLLM's log lines and progress")
    opts = parser.parse_args(argv)
    data = json.loads(Path(opts.input).read_text())
    configs = data.get("configs", {})
    cases = data["cases"]
    for case in cases:  # a shared config by name: as if given inline
        if "config_ref" in case:
            case["config_json"] = configs[case["config_ref"]]
    capture = CAPTURE
    capture.echo = opts.verbose
    started = time.perf_counter()
    results = []
    for n, case in enumerate(cases, 1):
        results.append(size_case(case, capture))
        if opts.verbose or n % 500 == 0:
            r = results[-1]
            print(
                f"[{n}/{len(cases)}] {r['id']}: starts={r.get('starts')} blocks={r.get('num_gpu_blocks')} "
                f"{r.get('error', '')[:120]}",
                file=sys.stderr,
            )
    out = {
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "platform": (
            "vLLM's CPU platform; each case's emulation lists the settings set back to what vLLM "
            "resolves on a CUDA GPU, as [CPU platform's value, value used]"
        ),
        "attention_backends": BACKEND_NOTES,
        "seconds": round(time.perf_counter() - started, 2),
        "num_cases": len(results),
        "cases": results,
    }
    # One case per line: small enough to keep, easy to diff and grep.
    head = json.dumps({k: v for k, v in out.items() if k != "cases"}, default=str)[:-1]
    lines = ",\n".join(json.dumps(r, default=str, separators=(",", ":")) for r in results)
    Path(opts.output).write_text(f'{head}, "cases": [\n{lines}\n]}}\n')
    refused = sum(1 for r in results if r.get("starts") is False)
    unknown = sum(1 for r in results if r.get("starts") is None)
    print(
        f"{len(results)} cases in {out['seconds']} s: {len(results) - refused - unknown} start, "
        f"{refused} refused or rejected by vLLM, {unknown} not sized (spec errors); "
        f"output {opts.output}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
