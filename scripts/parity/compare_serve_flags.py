"""`kvlab plan`'s `vllm serve` lines read by vLLM 0.33's own parser: every knob's every value arrives as the setting
kvlab served (make parity). Usage: python compare_serve_flags.py --vllm-python .venv-vllm/bin/python"""

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from kvlab.core.config import VLLM_KV_CACHE_DTYPES
from kvlab.studies.plan_space import Candidate

HERE = Path(__file__).resolve().parent
MODEL, MAX_MODEL_LEN = "Qwen/Qwen3-32B", 16384
# Every knob moved off its default once, and every KV cache dtype: vLLM's parser refuses a dtype name it does not
# know; which of vLLM's dtypes each of kvlab's is comes from kvlab.core.config (CacheConfig's docstring).
VARIANTS = [
    dict(tensor_parallel_size=2, num_replicas=3),
    dict(max_num_seqs=64, max_num_batched_tokens=2048),
    dict(block_size=32, gpu_memory_utilization=0.85),
    dict(enable_chunked_prefill=False),
    dict(enable_prefix_caching=True),
    dict(async_scheduling=False),
] + [dict(kv_cache_dtype=d) for d in VLLM_KV_CACHE_DTYPES]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vllm-python", required=True, help="python of the environment with vllm==0.33.0")
    args = parser.parse_args()
    candidates = [replace(Candidate(), **v) for v in VARIANTS]
    lines = [shlex.split(c.serve_command(MODEL, MAX_MODEL_LEN))[2:] for c in candidates]  # MODEL and its flags
    done = subprocess.run(
        [args.vllm_python, str(HERE / "vllm_serve_flags.py")], input=json.dumps(lines), capture_output=True, text=True
    )
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return 1
    failures = 0
    for candidate, parsed in zip(candidates, json.loads(done.stdout)):
        want = {
            "model": MODEL,
            "tensor_parallel_size": candidate.tensor_parallel_size,
            "max_model_len": MAX_MODEL_LEN,
            "max_num_seqs": candidate.max_num_seqs,
            "max_num_batched_tokens": candidate.max_num_batched_tokens,
            "block_size": candidate.block_size,
            "gpu_memory_utilization": candidate.gpu_memory_utilization,
            "kv_cache_dtype": VLLM_KV_CACHE_DTYPES[candidate.kv_cache_dtype],
            "enable_chunked_prefill": candidate.enable_chunked_prefill,
            "enable_prefix_caching": candidate.enable_prefix_caching,
            "async_scheduling": candidate.async_scheduling,
        }
        wrong = {k: (v, parsed[k]) for k, v in want.items() if parsed[k] != v}
        if wrong:
            failures += 1
            print(f"serve flags: {candidate.label()}: kvlab -> vLLM {wrong}")
    print(
        f"serve flags: {len(candidates) - failures} of {len(candidates)} `vllm serve` lines of kvlab plan read by "
        "vLLM 0.33's parser as the settings kvlab served"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
