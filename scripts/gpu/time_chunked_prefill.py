"""Does a prefill chunk after cached tokens take the time of a fresh prompt of the same query-key pairs?

kvlab's measured clock reads a chunk of n new tokens after c cached ones from a table of fresh prompts (one
causal prefill of s tokens, no history) at the s whose pairs s(s+1)/2 equal the chunk's n c + n(n+1)/2. This script
times, on one GPU with PyTorch's attention in CUDA graphs (flash backend, grouped heads, causal aligned lower right as vLLM's
kernels align a chunk after its history), both sides of that rule: chunks after history, and fresh prompts on a
fine grid, and writes one CSV (chunk_tokens, history_tokens, pairs, equal_pairs_prompt, chunk_us, prompt_us,
ratio) to --out. Heads: Llama-3.1-8B's (32 query heads, 8 KV heads, head dim 128), bf16.

    python3 scripts/gpu/time_chunked_prefill.py --out DIR
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
CHUNKS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
HISTORIES = (0, 256, 1024, 2048, 4096, 8192, 16384, 32768)


def gpu_us(fn, calls: int = 20, replays: int = 5) -> float:
    """GPU time of one call of fn (us): a CUDA graph of `calls` calls replayed `replays` times, the median replay
    / calls (no launch gaps, as a CUDA-graph step runs them; profile_ops_h200.py's method)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    times.sort()
    return times[len(times) // 2]


def attention_us(queries: int, keys: int) -> float:
    """One layer's causal attention of `queries` new tokens over `keys` tokens (the last `queries` of them new)."""
    q = torch.randn(1, HEADS, queries, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, KV_HEADS, keys, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    mask = causal_lower_right(queries, keys)
    out = torch.empty_like(q)

    def call():
        out.copy_(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        return gpu_us(call)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    rows = []
    for n in CHUNKS:
        for c in HISTORIES:
            pairs = n * c + n * (n + 1) // 2
            s = (math.sqrt(1 + 8 * pairs) - 1) / 2
            try:
                chunk = attention_us(n, c + n)
                prompt = attention_us(round(s), round(s))
            except RuntimeError as err:  # a backend that refuses the shape: recorded, the rest goes on
                print({"chunk_tokens": n, "history_tokens": c, "error": str(err)[:200]}, flush=True)
                continue
            rows.append(
                {
                    "chunk_tokens": n,
                    "history_tokens": c,
                    "pairs": pairs,
                    "equal_pairs_prompt": round(s),
                    "chunk_us": round(chunk, 2),
                    "prompt_us": round(prompt, 2),
                    "ratio": round(prompt / chunk, 4),
                }
            )
            print(rows[-1], flush=True)
    with open(args.out / "chunked_prefill.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "seconds": round(time.time() - start, 1)}
    (args.out / "chunked_prefill.json").write_text(json.dumps(env, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
