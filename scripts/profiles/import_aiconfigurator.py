"""Import AIConfigurator's vLLM operator tables into data/operators/ (run by hand; never at test or report time).

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) measures vLLM's own kernels, one operator at a
time, on each GPU it covers: GEMMs by (m, n, k) per weight dtype as vLLM's linear layers dispatch them, context
(prefill) and generation (decode) attention through vLLM's attention backend for the GPU, the fused MoE block, and
vLLM's custom all-reduce. This script reads, for each GPU and table, the newest vLLM version that holds the table
(0.24 is the nearest to the vLLM 0.33 kvlab models; the version is kept in meta.json per table), trims each table
to the rows and columns kvlab reads, and writes it as a compressed NumPy archive of columns (latency in
microseconds, float32) plus meta.json (source, commit, version, kernel and rows per table) and all_reduce.csv in
data/profiles' all-reduce layout.

    python scripts/profiles/import_aiconfigurator.py --repo PATH [--commit SHA] [--out data/operators]

PATH is a clone (or bare mirror) of ai-dynamo/aiconfigurator; the tables are read from git at the commit, so the
import names exactly what it read. Needs pyarrow (pinned in requirements.lock) to read parquet.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TABLES_DIR = "aic-core/src/aiconfigurator_core/systems/data"
# AIConfigurator's system folders with vLLM tables, by kvlab's GPU name (data/gpus.csv): data/operator_gpus.csv
OPERATOR_GPUS_CSV = ROOT / "data" / "operator_gpus.csv"
# Weight dtypes kvlab times, by AIConfigurator's gemm_dtype / moe_dtype names.
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block"}
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "w4a16_mxfp4": "mxfp4"}
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
# The attention backend vLLM 0.33 runs by default on each architecture, by AIConfigurator's kernel_source: FlashAttention
# 3 on Hopper, FlashInfer's TRT-LLM kernels on data-center Blackwell, FlashAttention 2 (bf16 KV) or FlashInfer (fp8 KV)
# on Ada and Blackwell workstation GPUs, vLLM's FlashAttention on Ampere (AIConfigurator's older tables name no
# version).
ATTENTION_KERNELS = {
    "context": (
        "vllm_flash_attn_fa3",
        "vllm_flashinfer_trtllmprefill",
        "vllm_flash_attn_fa2",
        "vllm_flashinfer_fiprefill",
        "vllm_flash_attn",
        "vllm_flashinfer",
    ),
    "generation": (
        "vllm_flash_attn_fa3",
        "vllm_flashinfer_trtllmdecode",
        "vllm_flash_attn_fa2",
        "vllm_flashinfer_fidecode",
        "vllm_flash_attn",
        "vllm_flashinfer",
    ),
}


def git(repo: Path, *args: str) -> bytes:
    """Output of a git command on repo (a work tree or a bare mirror)."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def newest_table(
    repo: Path, commit: str, system: str, op: str, filename: str, framework: str = "vllm"
) -> tuple[str, str] | None:
    """(version, path) of the newest version folder of system/op/framework (vLLM's by default; "nccl" for the NCCL
    library's collectives) that holds filename, or None."""
    folder = f"/{framework}/"
    listing = git(repo, "ls-tree", "-r", "--name-only", commit, f"{TABLES_DIR}/{system}/{op}{folder}").decode().split()
    found = [p for p in listing if p.endswith("/" + filename)]
    if not found:
        return None

    def version(path: str) -> tuple:
        text = path.split(folder)[1].split("/")[0]
        return tuple(int(x) if x.isdigit() else -1 for x in text.replace("dev", ".").split("."))

    path = max(found, key=version)
    return path.split(folder)[1].split("/")[0], path


def read_parquet(repo: Path, commit: str, path: str):
    """The table at path, as a pandas DataFrame."""
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(git(repo, "show", f"{commit}:{path}"))).to_pandas()


def first_kernel(frame, preferred: tuple[str, ...]) -> str | None:
    """The first of preferred that frame's kernel_source holds."""
    present = set(frame["kernel_source"])
    return next((k for k in preferred if k in present), None)


def most_measured(frame) -> str:
    """The kernel_source measured at the most shapes (where a dtype was measured with several kernels)."""
    counts = frame["kernel_source"].value_counts()
    return str(sorted(counts.index, key=lambda k: (-counts[k], k))[0])


def us(values) -> np.ndarray:
    """Milliseconds (AIConfigurator's latency) to microseconds, float32."""
    return (np.asarray(values, dtype=np.float64) * 1000.0).astype(np.float32)


def import_gemm(frame) -> tuple[dict, dict]:
    """GEMM columns by weight dtype: every row of the dtype (AIConfigurator records the kernel vLLM's default
    dispatch selected at each shape), with its kernel."""
    arrays, meta = {}, {}
    for source, dtype in GEMM_DTYPES.items():
        rows = frame[frame["gemm_dtype"] == source]
        if rows.empty:
            continue
        rows = rows.sort_values(["m", "n", "k"]).drop_duplicates(["m", "n", "k"])
        for col in ("m", "n", "k"):
            arrays[f"{dtype}_{col}"] = rows[col].to_numpy(np.int32)
        arrays[f"{dtype}_us"] = us(rows["latency"])
        meta[dtype] = {"kernels": sorted(set(rows["kernel_source"])), "rows": len(rows)}
    return arrays, meta


def import_attention(frame, phase: str) -> tuple[dict, dict]:
    """Attention columns by KV dtype, for the backend vLLM runs (ATTENTION_KERNELS), windowless rows only (kvlab
    reads a window as the keys it keeps): batch, length (prompt tokens for context, cached tokens for
    generation), heads, KV heads, head dim, us."""
    arrays, meta = {}, {}
    length = "isl" if phase == "context" else "step"
    for source, dtype in KV_DTYPES.items():
        windowless = frame["window_size"] == 0 if "window_size" in frame else True
        rows = frame[(frame["kv_cache_dtype"] == source) & windowless]
        kernel = first_kernel(rows, ATTENTION_KERNELS[phase]) if not rows.empty else None
        if kernel is None:
            continue
        rows = rows[rows["kernel_source"] == kernel]
        keys = ["num_heads", "num_key_value_heads", "head_dim", "batch_size", length]
        rows = rows.sort_values(keys).drop_duplicates(keys)
        for col, name in zip(keys, ("heads", "kv_heads", "head_dim", "batch", "tokens")):
            arrays[f"{dtype}_{name}"] = rows[col].to_numpy(np.int32)
        arrays[f"{dtype}_us"] = us(rows["latency"])
        meta[dtype] = {"kernel": kernel, "rows": len(rows)}
    return arrays, meta


def import_moe(frame) -> tuple[dict, dict]:
    """MoE block columns by weight dtype (the kernel measured at the most shapes), both routing distributions."""
    arrays, meta = {}, {}
    for source, dtype in MOE_DTYPES.items():
        rows = frame[frame["moe_dtype"] == source]
        if rows.empty:
            continue
        kernel = most_measured(rows)
        rows = rows[rows["kernel_source"] == kernel]
        keys = [
            "distribution",
            "hidden_size",
            "inter_size",
            "topk",
            "num_experts",
            "moe_tp_size",
            "moe_ep_size",
            "num_tokens",
        ]
        rows = rows.sort_values(keys).drop_duplicates(keys)
        arrays[f"{dtype}_distribution"] = rows["distribution"].to_numpy(str)
        for col in keys[1:]:
            arrays[f"{dtype}_{col}"] = rows[col].to_numpy(np.int32)
        arrays[f"{dtype}_us"] = us(rows["latency"])
        meta[dtype] = {"kernel": kernel, "rows": len(rows)}
    return arrays, meta


# vLLM's MLA backend by KV dtype, in the order kvlab prefers where a GPU's table holds several: FlashMLA where it
# measured fp8 KV on Hopper, FlashAttention's MLA backend for bf16 KV on Hopper, FlashInfer's on Blackwell, Triton's
# on Ada and Blackwell workstation GPUs.
MLA_KERNELS = ("FLASHMLA", "FLASH_ATTN_MLA", "FLASHINFER_MLA", "CUTLASS_MLA", "TRITON_MLA", "FLASH_ATTN")
MLA_GEMMS = {"bfloat16": "bf16", "fp8_block": "fp8_block"}


def import_mla(frame, phase: str) -> tuple[dict, dict]:
    """The whole MLA attention module of DeepSeek-V3's shape (its projections and attention, one layer, one GPU),
    per KV dtype and projection dtype: heads on the GPU, batch, tokens (prompt for context, cached for generation)."""
    arrays, meta = {}, {}
    length = "isl" if phase == "context" else "step"
    for kv_source, kv in KV_DTYPES.items():
        for gemm_source, gemm in MLA_GEMMS.items():
            rows = frame[(frame["kv_cache_dtype"] == kv_source) & (frame["gemm_type"] == gemm_source)]
            kernel = first_kernel(rows, MLA_KERNELS) if not rows.empty else None
            if kernel is None:
                continue
            rows = rows[rows["kernel_source"] == kernel]
            keys = ["num_heads", "batch_size", length]
            rows = rows.sort_values(keys).drop_duplicates(keys)
            prefix = f"{kv}_{gemm}"
            for col, name in zip(keys, ("heads", "batch", "tokens")):
                arrays[f"{prefix}_{name}"] = rows[col].to_numpy(np.int32)
            arrays[f"{prefix}_us"] = us(rows["latency"])
            meta[prefix] = {"kernel": kernel, "rows": len(rows), "model": str(rows["model"].iloc[0])}
    return arrays, meta


def write_all_reduce(frame, path: Path) -> dict:
    """vLLM's custom all-reduce captured in a CUDA graph (as vLLM runs it in its graphs), bf16, as
    data/profiles' all_reduce.csv (num_gpus, size_bytes, time_us)."""
    rows = frame[frame["kernel_source"] == "vLLM_custom_graph"]
    if rows.empty:
        rows = frame[frame["kernel_source"] == "vLLM_custom_eager"]
    kernel = str(rows["kernel_source"].iloc[0])
    rows = rows.sort_values(["num_gpus", "message_size"])
    lines = ["num_gpus,size_bytes,time_us"]
    for gpus, size, latency in zip(rows["num_gpus"], rows["message_size"], rows["latency"]):
        # message_size counts bf16 elements (AIConfigurator's collector); 2 bytes each
        lines.append(f"{int(gpus)},{int(size) * 2},{float(latency) * 1000.0:.4g}")
    path.write_text("\n".join(lines) + "\n")
    return {"kernel": kernel, "rows": len(rows)}


def write_nccl(frame, path: Path) -> dict:
    """NCCL's all-reduce, all-gather and reduce-scatter in half precision, timed by nccl-tests (AIConfigurator's
    collect_nccl.py: one out-of-place call, eager, outside a CUDA graph), as nccl.csv (op, num_gpus, size_bytes,
    time_us). size_bytes is nccl-tests' size: the whole buffer (an all-gather's gathered output, a reduce-scatter's
    input)."""
    ops = ("all_reduce", "all_gather", "reduce_scatter")
    rows = frame[(frame["nccl_dtype"] == "half") & frame["op_name"].isin(ops)]
    rows = rows.sort_values(["op_name", "num_gpus", "message_size"])
    lines = ["op,num_gpus,size_bytes,time_us"]
    for op, gpus, size, latency in zip(rows["op_name"], rows["num_gpus"], rows["message_size"], rows["latency"]):
        # message_size counts half elements (collect_nccl.py: size // bytes_per_element); 2 bytes each
        lines.append(f"{op},{int(gpus)},{int(size) * 2},{float(latency) * 1000.0:.4g}")
    path.write_text("\n".join(lines) + "\n")
    return {"kernel": "NCCL (nccl-tests, eager)", "ops": list(ops), "rows": len(rows)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a clone or bare mirror of ai-dynamo/aiconfigurator")
    parser.add_argument("--commit", default="HEAD", help="the commit to read (default: HEAD)")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "operators", help="where to write")
    args = parser.parse_args(argv)
    commit = git(args.repo, "rev-parse", args.commit).decode().strip()
    args.out.mkdir(parents=True, exist_ok=True)
    with open(OPERATOR_GPUS_CSV, newline="") as f:
        systems = {row["gpu"]: row["aiconfigurator_system"] for row in csv.DictReader(f)}
    for gpu, system in systems.items():
        folder = args.out / system
        folder.mkdir(exist_ok=True)
        meta = {
            "gpu": gpu,
            "source": "github.com/ai-dynamo/aiconfigurator (Apache-2.0)",
            "commit": commit,
            "system": system,
            "units": "time_us: microseconds of one call on one GPU",
            "tables": {},
        }
        tables = (
            ("gemm", "gemm_perf.parquet", import_gemm),
            ("context_attention", "context_attention_perf.parquet", lambda f: import_attention(f, "context")),
            ("generation_attention", "generation_attention_perf.parquet", lambda f: import_attention(f, "generation")),
            ("moe", "moe_perf.parquet", import_moe),
            ("context_mla", "mla_context_module_perf.parquet", lambda f: import_mla(f, "context")),
            ("generation_mla", "mla_generation_module_perf.parquet", lambda f: import_mla(f, "generation")),
        )
        op_dirs = {
            "gemm": "gemm",
            "context_attention": "attention",
            "generation_attention": "attention",
            "moe": "moe",
            "context_mla": "mla",
            "generation_mla": "mla",
        }
        for name, filename, reader in tables:
            found = newest_table(args.repo, commit, system, op_dirs[name], filename)
            if found is None:
                continue
            version, path = found
            arrays, table_meta = reader(read_parquet(args.repo, commit, path))
            if not arrays:
                continue
            np.savez_compressed(folder / f"{name}.npz", **arrays)
            meta["tables"][name] = {"vllm_version": version, "path": path, "by_dtype": table_meta}
        found = newest_table(args.repo, commit, system, "comm", "custom_allreduce_perf.parquet")
        if found is not None:
            version, path = found
            table_meta = write_all_reduce(read_parquet(args.repo, commit, path), folder / "all_reduce.csv")
            meta["tables"]["all_reduce"] = {"vllm_version": version, "path": path, **table_meta}
        found = newest_table(args.repo, commit, system, "comm", "nccl_perf.parquet", framework="nccl")
        if found is not None:
            version, path = found
            table_meta = write_nccl(read_parquet(args.repo, commit, path), folder / "nccl.csv")
            meta["tables"]["nccl"] = {"nccl_version": version, "path": path, **table_meta}
        (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        versions = ", ".join(
            f"{k} (vLLM {v['vllm_version']})" if "vllm_version" in v else f"{k} (NCCL {v['nccl_version']})"
            for k, v in meta["tables"].items()
        )
        print(f"{gpu}: {versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
