"""vLLM 0.33's own command-line parser over the `vllm serve` lines kvlab plan prints (run in .venv-vllm).

Usage: python vllm_serve_flags.py < lines.json > parsed.json, where lines.json is a JSON list of argument lists
(what follows `vllm serve`: the model, then its flags). Prints, for each, the engine arguments vLLM's parser (EngineArgs.add_cli_args
on FlexibleArgumentParser, as `vllm serve` builds it) gives them: nothing is started, no device is needed."""

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.engine.arg_utils import EngineArgs  # noqa: E402

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
except ImportError:  # pragma: no cover - older layouts
    from vllm.utils import FlexibleArgumentParser  # noqa: E402

FIELDS = (
    "model",
    "tensor_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "async_scheduling",
)

parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
out = []
for argv in json.load(sys.stdin):
    args = parser.parse_args(["--model", *argv])  # vllm serve takes the model as its first argument
    out.append({name: getattr(args, name) for name in FIELDS})
json.dump(out, sys.stdout)
