#!/usr/bin/env python3
"""Write data/profiles/ and data/checks/ from public repositories' git history (kvlab reads only the results).

    python scripts/profiles/import_public_data.py --llmservingsim GIT_DIR --vidur GIT_DIR

GIT_DIR: a clone (bare or not) of casys-kaist/LLMServingSim and of microsoft/vidur at the commits below;
every file is read with `git show COMMIT:PATH`, so the clones may be newer. What is kept (data/README.md):

- LLMServingSim profiler/perf/<GPU>/<model>/bf16/tp<N>/: dense.csv and per_sequence.csv whole; attention.csv
  on its doubling grid only (prefill_chunk 0 and 16..2048, kv_prefill and kv_decode 0 and 16..16384 by powers
  of 2, every n_decode: the grid the cost model interpolates on; the 1.5x rows are left out); moe.csv whole.
  Where meta.yaml's skew_fit is enabled, tp<N>/skew_fit.csv's alpha per bucket (its n_samples left out), each
  bucket axis written as its bin's upper bound, and meta.yaml's bucket bins, pooled alpha_default and fit
  errors for that TP as skew_fit.json; the raw shots (skew.csv) are left out.
- vidur data/profiling/compute/<gpu>/<model>/mlp.csv, every model on every GPU: the medians (ms -> us) of its
  four linear layers (attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj, renamed as vLLM names them)
  per token count and TP, split by TP; the first row of a repeated (num_tokens, TP) is kept. The layer shapes
  the rows were measured at (heads, KV heads, hidden and MLP sizes, gated MLP, vocabulary) go to index.csv.
- vidur data/profiling/network/<topology>/all_reduce.csv: the median NCCL all-reduce time (ms -> us) per size
  (bytes) and GPU count, single-node rows only (devices_per_node = num_workers, the rows vidur's predictor reads).
- vidur data/profiling/<gpu>/cpu_overheads.csv (its history, before the profiling data moved to per-model
  folders): the median CPU time (ms) of each part of a step of Sarathi-Serve's engine, per model, batch and TP.
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

import yaml

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
VIDUR_CPU_COMMIT = "6d98aa8f71696520acc603d87439e77cc78160a7"  # the last with cpu_overheads.csv
VIDUR_GPUS = {"h100": "H100-SXM-80GB", "a100": "A100-SXM-80GB", "a40": "A40-48GB"}
VIDUR_NETWORKS = ("a100_pairwise_nvlink", "a100_dgx", "h100_pairwise_nvlink", "h100_dgx")
VIDUR_CPU_GPUS = ("a100", "a40")
# vidur's model configs pad Llama-2's and CodeLlama's 32,000-token vocabulary to 32,768; the index keeps the
# model's own (config.json), which kvlab's lm_head estimate reads.
VIDUR_VOCAB = {
    "meta-llama/Llama-2-7b-hf": 32000,
    "meta-llama/Llama-2-70b-hf": 32000,
    "codellama/CodeLlama-34b-Instruct-hf": 32000,
}
INDEX_COLUMNS = [
    "source", "gpu", "source_gpu", "model", "dtype", "tensor_parallel_size", "path", "hidden_size",
    "intermediate_size", "vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "num_attention_heads", "num_kv_heads", "head_dim", "gated_mlp", "vllm_version", "profiled_at",
]  # fmt: skip
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
        skew_fit(git_dir, f"profiler/perf/{hardware}/{model}/bf16", tp, dst)


# LLMServingSim's bucket labels (skew_fit.csv) and bins (meta.yaml::skew_fit.bucket_axes) per axis, and kvlab's names.
SKEW_AXES = {"n": "n_decode", "skew_rate": "skew_rate", "kv_big": "kv_big", "kp": "kv_prefill"}


def skew_fit(git_dir: str, bundle: str, tp: int, dst: str) -> None:
    """tp<N>/skew_fit.csv and skew_fit.json where the bundle's meta.yaml has an enabled fit for tp."""
    fit = yaml.safe_load(show(git_dir, LLMSERVINGSIM_COMMIT, f"{bundle}/meta.yaml")).get("skew_fit") or {}
    if not fit.get("enabled") or tp not in (fit.get("per_tp") or {}):
        return
    axes, per_tp = fit["bucket_axes"], fit["per_tp"][tp]
    upper = {
        key: dict(zip(axes[f"{key}_labels"], axes[f"{key}_bins"][1:])) for key in ("n", "skew_rate", "kv_big", "kp")
    }
    rows = list(csv.DictReader(io.StringIO(show(git_dir, LLMSERVINGSIM_COMMIT, f"{bundle}/{per_tp['bucket_table']}"))))
    out = [
        (
            int(r["pc"]),
            upper["n"][r["n_label"]],
            upper["skew_rate"][r["skew_rate_label"]],
            upper["kv_big"][r["kv_big_label"]],
            upper["kp"][r["kp_label"]],
            r["alpha"],
        )
        for r in rows
    ]
    write(os.path.join(dst, "skew_fit.csv"), ["prefill_chunk", *SKEW_AXES.values(), "alpha"], sorted(out))
    summary = {
        "method": per_tp["method"],
        "n_samples": per_tp["n_samples"],
        "alpha_default": per_tp["alpha_default"],
        "rel_err_p50": per_tp["rel_err_p50"],
        "rel_err_p90": per_tp["rel_err_p90"],
        "rel_err_p99": per_tp["rel_err_p99"],
        "bins": {name: axes[f"{key}_bins"] for key, name in SKEW_AXES.items()},
    }
    with open(os.path.join(dst, "skew_fit.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")


def vidur(git_dir: str) -> list[dict]:
    """Every compute profile's linear layers; returns their index rows."""
    listing = subprocess.run(
        ["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", VIDUR_COMMIT, "data/profiling/compute"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    index = []
    for path in sorted(p for p in listing if p.endswith("/mlp.csv")):
        gpu, model = path.split("/")[3], "/".join(path.split("/")[4:-1])
        rows = list(csv.DictReader(io.StringIO(show(git_dir, VIDUR_COMMIT, path))))
        shapes = {
            (r["n_head"], r["n_kv_head"], r["n_embd"], r["n_expanded_embd"], r["vocab_size"], r["use_gated_mlp"])
            for r in rows
        }
        if len(shapes) != 1:
            raise SystemExit(f"{path}: rows of more than one layer shape")
        heads, kv_heads, hidden, intermediate, vocab, gated = shapes.pop()
        by_tp: dict[int, dict[int, dict]] = {}
        for r in rows:
            by_tp.setdefault(int(r["num_tensor_parallel_workers"]), {}).setdefault(int(r["num_tokens"]), r)
        for tp, by_tokens in sorted(by_tp.items()):
            out = [
                (name, tokens, repr(round(float(r[f"time_stats.{op}.median"]) * 1000.0, 6)))
                for op, name in VIDUR_LINEAR.items()
                for tokens, r in sorted(by_tokens.items())
            ]
            folder = f"vidur/{gpu}/{model}/tp{tp}"
            write(os.path.join(ROOT, "data", "profiles", folder, "dense.csv"), ["layer", "tokens", "time_us"], out)
            index.append(
                {
                    "source": "vidur",
                    "gpu": VIDUR_GPUS[gpu],
                    "source_gpu": gpu,
                    "model": model,
                    "dtype": "fp16",
                    "tensor_parallel_size": tp,
                    "path": folder,
                    "hidden_size": hidden,
                    "intermediate_size": intermediate,
                    "vocab_size": VIDUR_VOCAB.get(model, int(vocab)),
                    "num_experts": 0,
                    "num_experts_per_tok": 0,
                    "moe_intermediate_size": 0,
                    "num_attention_heads": heads,
                    "num_kv_heads": kv_heads,
                    "head_dim": int(hidden) // int(heads),
                    "gated_mlp": int(gated == "True"),
                    "vllm_version": "",
                    "profiled_at": "2024",
                }  # fmt: skip
            )
    return index


def vidur_network(git_dir: str) -> None:
    for topology in VIDUR_NETWORKS:
        rows = csv.DictReader(
            io.StringIO(show(git_dir, VIDUR_COMMIT, f"data/profiling/network/{topology}/all_reduce.csv"))
        )
        kept = {}
        for r in rows:
            n = int(r["num_workers"])
            if r["collective"] == "all_reduce" and int(r["devices_per_node"]) == n:
                kept.setdefault((n, int(r["size"])), float(r["time_stats.all_reduce.median"]) * 1000.0)
        write(
            os.path.join(ROOT, "data", "profiles", "vidur", "network", topology, "all_reduce.csv"),
            ["num_gpus", "size_bytes", "time_us"],
            [(n, size, repr(round(us, 6))) for (n, size), us in sorted(kept.items())],
        )


def vidur_cpu(git_dir: str) -> None:
    parts = ("schedule", "prepare_inputs_e2e", "sampler_e2e", "process_model_outputs")
    for gpu in VIDUR_CPU_GPUS:
        rows = csv.DictReader(io.StringIO(show(git_dir, VIDUR_CPU_COMMIT, f"data/profiling/{gpu}/cpu_overheads.csv")))
        out = sorted(
            (r["model_name"], int(r["tensor_parallel_degree"]), int(r["batch_size"]))
            + tuple(repr(round(float(r[f"{p}_median"]), 6)) for p in parts)
            for r in rows
        )
        write(
            os.path.join(ROOT, "data", "profiles", "vidur", "cpu", f"{gpu}.csv"),
            ["model", "tensor_parallel_size", "batch_size"] + [f"{p}_ms" for p in parts],
            out,
        )


def write_index(vidur_rows: list[dict]) -> None:
    """index.csv: LLMServingSim's rows as they are (written by hand from each bundle's meta.json), then vidur's."""
    path = os.path.join(ROOT, "data", "profiles", "index.csv")
    with open(path, newline="", encoding="utf-8") as f:
        kept = [r for r in csv.DictReader(f) if r["source"] != "vidur"]
    write(path, INDEX_COLUMNS, [[r[c] for c in INDEX_COLUMNS] for r in kept + vidur_rows])


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
    write_index(vidur(args.vidur))
    vidur_network(args.vidur)
    vidur_cpu(args.vidur)
    check_runs(args.llmservingsim)


if __name__ == "__main__":
    main()
