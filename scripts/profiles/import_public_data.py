#!/usr/bin/env python3
"""Write data/profiles/ and data/checks/ from public repositories' git history (kvlab reads only the results).

    python scripts/profiles/import_public_data.py --llmservingsim GIT_DIR --vidur GIT_DIR

GIT_DIR: a clone (bare or not) of casys-kaist/LLMServingSim and of microsoft/vidur at the commits below;
every file is read with `git show COMMIT:PATH`, so the clones may be newer. What is kept (data/README.md):

- LLMServingSim profiler/perf/<GPU>/<model>/bf16/tp<N>/: dense.csv and per_sequence.csv whole; attention.csv
  on its doubling grid only (prefill_chunk 0 and 16..2048, kv_prefill and kv_decode 0 and 16..16384 by powers
  of 2, every n_decode: the grid the cost model interpolates on; the 1.5x rows are left out); moe.csv whole.
  Skew files are left out (the engine gives no per-request spread of contexts).
- vidur data/profiling/compute/<gpu>/<model>/mlp.csv: the medians (ms -> us) of its four linear layers
  (attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj, renamed as vLLM names them) per token count and
  TP, split by TP; the first row of a repeated (num_tokens, TP) is kept.
- LLMServingSim bench/examples/RTXPRO6000/<model>/vllm/: meta.json's engine settings and, per request,
  its token counts and engine-core timestamps (vLLM's monotonic queued, scheduled, first-token and
  last-token times), relative to the run's first queued time.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLMSERVINGSIM_COMMIT = "5daddb21a545658d5150b535712d0494584b5278"
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
DOUBLING = [0] + [16 * 2**i for i in range(11)]  # 0, 16, ..., 16384
# (source GPU label, kvlab GPU, model, TP) profiled by LLMServingSim with every operator the model needs.
LLMSERVINGSIM_PROFILES = [
    ("RTXPRO6000", "meta-llama/Llama-3.1-8B", 1),
    ("RTXPRO6000", "meta-llama/Llama-3.1-8B", 2),
    ("RTXPRO6000", "Qwen/Qwen3-32B", 1),
    ("RTXPRO6000", "Qwen/Qwen3-32B", 2),
    ("RTXPRO6000", "Qwen/Qwen3-30B-A3B-Instruct-2507", 1),  # its tp2 folder has no moe.csv: left out
    ("RTX4090", "meta-llama/Llama-3.1-8B", 1),
]
VIDUR_PROFILES = [
    ("h100", "meta-llama/Llama-2-7b-hf"),
    ("h100", "meta-llama/Llama-2-70b-hf"),
    ("a100", "meta-llama/Llama-2-7b-hf"),
    ("a100", "meta-llama/Llama-2-70b-hf"),
]
VIDUR_LINEAR = {
    "attn_pre_proj": "qkv_proj",
    "attn_post_proj": "o_proj",
    "mlp_up_proj": "gate_up_proj",
    "mlp_down_proj": "down_proj",
}
CHECK_RUNS = ["Llama-3.1-8B", "Qwen3-32B", "Qwen3-30B-A3B-Instruct-2507"]


def show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def write(path: str, header: list[str], rows) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(header)
        out.writerows(rows)


def llmservingsim(git_dir: str) -> None:
    for hardware, model, tp in LLMSERVINGSIM_PROFILES:
        src = f"profiler/perf/{hardware}/{model}/bf16/tp{tp}"
        dst = os.path.join(ROOT, "data", "profiles", "llmservingsim", hardware, model, "bf16", f"tp{tp}")
        for name in ("dense", "per_sequence", "moe"):
            try:
                text = show(git_dir, LLMSERVINGSIM_COMMIT, f"{src}/{name}.csv")
            except subprocess.CalledProcessError:
                continue
            rows = list(csv.reader(io.StringIO(text)))
            write(os.path.join(dst, f"{name}.csv"), rows[0], rows[1:])
        rows = list(csv.reader(io.StringIO(show(git_dir, LLMSERVINGSIM_COMMIT, f"{src}/attention.csv"))))
        kept = [r for r in rows[1:] if int(r[0]) in DOUBLING[:9] and int(r[1]) in DOUBLING and int(r[3]) in DOUBLING]
        write(os.path.join(dst, "attention.csv"), rows[0], kept)


def vidur(git_dir: str) -> None:
    for gpu, model in VIDUR_PROFILES:
        rows = list(
            csv.DictReader(io.StringIO(show(git_dir, VIDUR_COMMIT, f"data/profiling/compute/{gpu}/{model}/mlp.csv")))
        )
        by_tp: dict[int, dict[int, dict]] = {}
        for r in rows:
            by_tp.setdefault(int(r["num_tensor_parallel_workers"]), {}).setdefault(int(r["num_tokens"]), r)
        for tp, by_tokens in by_tp.items():
            out = [
                (name, tokens, repr(round(float(r[f"time_stats.{op}.median"]) * 1000.0, 6)))
                for op, name in VIDUR_LINEAR.items()
                for tokens, r in sorted(by_tokens.items())
            ]
            write(
                os.path.join(ROOT, "data", "profiles", "vidur", gpu, model, f"tp{tp}", "dense.csv"),
                ["layer", "tokens", "time_us"],
                out,
            )


def check_runs(git_dir: str) -> None:
    for name in CHECK_RUNS:
        src = f"bench/examples/RTXPRO6000/{name}/vllm"
        meta = json.loads(show(git_dir, LLMSERVINGSIM_COMMIT, f"{src}/meta.json"))
        requests = [
            json.loads(line)
            for line in show(git_dir, LLMSERVINGSIM_COMMIT, f"{src}/requests.jsonl").splitlines()
            if line.strip()
        ]
        zero = min(r["queued_ts"] for r in requests)
        dst = os.path.join(ROOT, "data", "checks", "llmservingsim", "RTXPRO6000", name)
        write(
            os.path.join(dst, "requests.csv"),
            [
                "request_id",
                "arrival_s",
                "prompt_tokens",
                "output_tokens",
                "first_scheduled_s",
                "first_token_s",
                "finish_s",
            ],
            [
                (
                    r["request_id"],
                    f"{r['queued_ts'] - zero:.6f}",
                    r["input_toks"],
                    r["output_toks"],
                    f"{r['scheduled_ts'] - zero:.6f}",
                    f"{r['first_token_ts'] - zero:.6f}",
                    f"{r['last_token_ts'] - zero:.6f}",
                )
                for r in sorted(requests, key=lambda r: r["queued_ts"])
            ],
        )
        keep = ("model", "vllm_version", "num_requests", "dataset_path", "started_at")
        settings = {k: meta[k] for k in keep} | {"engine_kwargs": meta["engine_kwargs"], "hardware": "RTXPRO6000"}
        with open(os.path.join(dst, "settings.json"), "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=2)
            f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llmservingsim", required=True, help="git dir of casys-kaist/LLMServingSim")
    parser.add_argument("--vidur", required=True, help="git dir of microsoft/vidur")
    args = parser.parse_args()
    llmservingsim(args.llmservingsim)
    vidur(args.vidur)
    check_runs(args.llmservingsim)


if __name__ == "__main__":
    main()
