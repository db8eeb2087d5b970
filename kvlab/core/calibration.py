"""Calibration: measure KV bytes per token, decode step time and prefill time of a decoder on one device.

The article assumes 0.5 MiB of KV per token and 8 ms per output token. `measure` builds a Llama-like
decoder with random weights (nothing is downloaded; no rotary embedding, which costs a few elementwise
operations per token), caches tokens and times its steps; `write_csv` stores the result as one tidy CSV
under data/calibration/ that `read_calibration` (and kvlab.core.service_time.CalibratedServiceTime) loads without
torch.

PyTorch is optional (`pip install 'kvlab[calibrate]'`): it is imported inside the functions that need it.

CSV layout: a header block of `# key: value` lines (device, GPU, driver, torch and CUDA versions, dtype,
shape, date), then the columns kind, batch_size, context_tokens, prompt_tokens, value, unit. Kinds:
- kv_bytes_per_token (B): K and V bytes per cached token; batch_size x context_tokens tokens were cached;
- weights_bytes (B): bytes of the decoder's parameters;
- decode_step_ms (ms): median time of one decode step of batch_size requests whose caches hold
  context_tokens tokens each (the step attends context_tokens + 1 tokens);
- prefill_ms (ms): median time of the prefill of one prompt of prompt_tokens tokens.
"""

from __future__ import annotations

import csv
import datetime
import math
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.core import capacity, validate

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION_DIR = ROOT / "data" / "calibration"
COLUMNS = ("kind", "batch_size", "context_tokens", "prompt_tokens", "value", "unit")
UNITS = {"kv_bytes_per_token": "B", "weights_bytes": "B", "decode_step_ms": "ms", "prefill_ms": "ms"}
DTYPES = ("bfloat16", "float16", "float32")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
INSTALL_HINT = "PyTorch is not installed: pip install 'kvlab[calibrate]' (or pip install torch) to measure"

# The full grid (a GPU run) and the tiny one (--quick, the CPU tests).
FULL_GRID = {
    "batch_sizes": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "context_tokens": (1024, 2048, 4096, 8192, 16384, 32768),
    "prompt_tokens": (128, 512, 1024, 2048, 4096, 8192, 16384, 32768),
}
QUICK_GRID = {"batch_sizes": (1, 2, 4), "context_tokens": (16, 32, 64), "prompt_tokens": (16, 64)}


@dataclass(frozen=True)
class DecoderShape:
    """A Llama-like decoder: layers, heads (as many K/V heads), head dim, hidden and MLP sizes, vocabulary."""

    num_layers: int = 32
    num_heads: int = 32
    head_dim: int = 128
    hidden_size: int = 4096
    intermediate_size: int = 11008
    vocab_size: int = 32000
    dtype: str = "bfloat16"

    def __post_init__(self):
        for name in ("num_layers", "num_heads", "head_dim", "hidden_size", "intermediate_size", "vocab_size"):
            validate.positive_int(name, getattr(self, name))
        validate.one_of("dtype", self.dtype, DTYPES)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token: 2 x layers x heads x head dim x bytes per value (kvlab.core.capacity's formula)."""
        return capacity.KVShape(
            self.num_layers, self.num_heads, self.head_dim, DTYPE_BYTES[self.dtype]
        ).kv_bytes_per_token

    @property
    def num_params(self) -> int:
        """Parameters: per layer QKV, output, gate/up and down projections and two norms; embedding and head."""
        attention = (
            self.hidden_size * 3 * self.num_heads * self.head_dim + self.num_heads * self.head_dim * self.hidden_size
        )
        mlp = 3 * self.hidden_size * self.intermediate_size
        return (
            self.num_layers * (attention + mlp + 2 * self.hidden_size)
            + 2 * self.vocab_size * self.hidden_size
            + self.hidden_size
        )

    @property
    def weights_bytes(self) -> int:
        """Bytes of all parameters at dtype."""
        return self.num_params * DTYPE_BYTES[self.dtype]


TINY_SHAPE = DecoderShape(
    num_layers=2, num_heads=4, head_dim=16, hidden_size=64, intermediate_size=128, vocab_size=256, dtype="float32"
)


def decode_bytes_per_step(shape: DecoderShape, batch_size, context_tokens):
    """Bytes one decode step must read at least: every weight once (the input embedding only for its batch_size
    rows, neglected) plus the batch's cached K and V, context_tokens + 1 tokens each (B)."""
    embedding = shape.vocab_size * shape.hidden_size * DTYPE_BYTES[shape.dtype]
    return shape.weights_bytes - embedding + batch_size * (context_tokens + 1) * shape.kv_bytes_per_token


def decode_bound_ms(shape: DecoderShape, memory_bandwidth_gb_s: float, batch_size, context_tokens):
    """A lower bound on the decode step time: bytes read per step / memory bandwidth (ms). Not a measurement."""
    bandwidth = validate.positive_number("memory_bandwidth_gb_s", memory_bandwidth_gb_s) * 1e9
    return decode_bytes_per_step(shape, batch_size, context_tokens) / bandwidth * 1000.0


# ---------------------------------------------------------------- reading a calibration file
@dataclass(frozen=True, eq=False)
class Calibration:
    """One calibration file: its header block (metadata) and its rows (dicts with COLUMNS; empty cells None)."""

    path: Path
    metadata: dict = field(default_factory=dict)
    rows: tuple = ()

    @property
    def name(self) -> str:
        """The device this file measured (gpu_name, else the file's stem)."""
        return self.metadata.get("gpu_name") or self.path.stem

    def kind(self, kind: str) -> list[dict]:
        """The rows of one kind (kv_bytes_per_token, weights_bytes, decode_step_ms or prefill_ms), in file order."""
        validate.one_of("kind", kind, UNITS)
        return [row for row in self.rows if row["kind"] == kind]


def _bad(path, line: int, message: str):
    raise ValueError(f"{path}:{line}: {message}")


def _cell_int(path, line: int, column: str, text: str):
    if text == "":
        return None
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        _bad(path, line, f"{column}={text!r} is not allowed: must be an integer >= 1 or empty")
    return int(text)


def read_calibration(path) -> Calibration:
    """Load a calibration CSV; a malformed file raises a one-line ValueError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        validate.fail("path", str(path), "no such calibration file")
    metadata, rows, header = {}, [], None
    with path.open(newline="") as handle:
        for number, text in enumerate(handle, start=1):
            text = text.rstrip("\r\n")
            if text.startswith("#"):
                key, sep, value = text[1:].partition(":")
                if not sep or not key.strip():
                    _bad(path, number, f"header line {text!r} is not allowed: must look like '# key: value'")
                metadata[key.strip()] = value.strip()
                continue
            if not text.strip():
                continue
            cells = next(csv.reader([text]))
            if header is None:
                if tuple(cells) != COLUMNS:
                    _bad(path, number, f"columns {','.join(cells)!r} are not allowed: must be {','.join(COLUMNS)}")
                header = cells
                continue
            if len(cells) != len(COLUMNS):
                _bad(path, number, f"{len(cells)} fields are not allowed: must be {len(COLUMNS)} ({','.join(COLUMNS)})")
            kind, batch, context, prompt, value, unit = cells
            if kind not in UNITS:
                _bad(path, number, f"kind={kind!r} is not allowed: must be one of {', '.join(UNITS)}")
            if unit != UNITS[kind]:
                _bad(path, number, f"unit={unit!r} is not allowed: {kind} is in {UNITS[kind]}")
            try:
                number_value = float(value)
            except ValueError:
                number_value = math.nan
            if not math.isfinite(number_value) or number_value <= 0:
                _bad(path, number, f"value={value!r} is not allowed: must be a finite number > 0")
            rows.append(
                {
                    "kind": kind,
                    "batch_size": _cell_int(path, number, "batch_size", batch),
                    "context_tokens": _cell_int(path, number, "context_tokens", context),
                    "prompt_tokens": _cell_int(path, number, "prompt_tokens", prompt),
                    "value": number_value,
                    "unit": unit,
                    "line": number,
                }
            )
    if header is None:
        _bad(path, 1, f"no header row: the file must have the columns {','.join(COLUMNS)}")
    for kind, keys in (("decode_step_ms", ["batch_size", "context_tokens"]), ("prefill_ms", ["prompt_tokens"])):
        seen = set()
        for row in (r for r in rows if r["kind"] == kind):
            key = tuple(row[k] for k in keys)
            if None in key:
                _bad(path, row["line"], f"{kind} needs {' and '.join(keys)}")
            if key in seen:
                _bad(path, row["line"], f"{kind} at this {' and '.join(keys)} appears twice")
            seen.add(key)
    return Calibration(path, metadata, tuple({k: v for k, v in row.items() if k != "line"} for row in rows))


def find_calibrations(directory=None) -> list[Calibration]:
    """Every calibration CSV in directory (default data/calibration/), sorted by file name."""
    directory = CALIBRATION_DIR if directory in (None, "") else Path(directory)
    return [read_calibration(p) for p in sorted(Path(directory).glob("*.csv"))]


# ---------------------------------------------------------------- measuring (needs torch)
def import_torch():
    """The torch module, or a one-line ValueError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return torch


def _sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _init_weights(torch, shape: DecoderShape, device: str) -> dict:
    """Random weights (normal, std 0.02) made on the device directly: no CPU copy, no default init."""
    dtype = getattr(torch, shape.dtype)
    h, qkv, i = shape.hidden_size, shape.num_heads * shape.head_dim, shape.intermediate_size

    def randn(*size):
        return torch.empty(*size, device=device, dtype=dtype).normal_(0.0, 0.02)

    layers = [
        {
            "norm1": torch.ones(h, device=device, dtype=dtype),
            "wqkv": randn(3 * qkv, h),
            "wo": randn(h, qkv),
            "norm2": torch.ones(h, device=device, dtype=dtype),
            "w_gate_up": randn(2 * i, h),
            "w_down": randn(h, i),
        }
        for _ in range(shape.num_layers)
    ]
    return {
        "embed": randn(shape.vocab_size, h),
        "layers": layers,
        "norm": torch.ones(h, device=device, dtype=dtype),
        "head": randn(shape.vocab_size, h),
    }


def _rms_norm(torch, x, weight):
    """RMSNorm written out (torch.nn.functional.rms_norm needs torch 2.4; the extra allows 2.3)."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight


def _forward(torch, shape: DecoderShape, weights: dict, tokens, cache: list, start: int):
    """Run tokens [batch, n] at positions start..start+n-1, writing their K and V into cache; logits of the last."""
    F = torch.nn.functional
    batch, n = tokens.shape
    x = weights["embed"][tokens]
    for layer, (k_cache, v_cache) in zip(weights["layers"], cache):
        y = _rms_norm(torch, x, layer["norm1"]) @ layer["wqkv"].T
        q, k, v = y.view(batch, n, 3, shape.num_heads, shape.head_dim).permute(2, 0, 3, 1, 4)
        k_cache[:, :, start : start + n] = k
        v_cache[:, :, start : start + n] = v
        keys, values = k_cache[:, :, : start + n], v_cache[:, :, : start + n]
        attn = F.scaled_dot_product_attention(q, keys, values, is_causal=(n > 1 and start == 0))
        x = x + attn.transpose(1, 2).reshape(batch, n, -1) @ layer["wo"].T
        gate, up = (_rms_norm(torch, x, layer["norm2"]) @ layer["w_gate_up"].T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ layer["w_down"].T
    return _rms_norm(torch, x[:, -1], weights["norm"]) @ weights["head"].T


def _new_cache(torch, shape: DecoderShape, batch_size: int, tokens: int, device: str) -> list:
    dtype = getattr(torch, shape.dtype)
    size = (batch_size, shape.num_heads, tokens, shape.head_dim)
    return [
        (torch.zeros(size, device=device, dtype=dtype), torch.zeros(size, device=device, dtype=dtype))
        for _ in range(shape.num_layers)
    ]


def _graphed(torch, device: str, run):
    """run captured in a CUDA graph (one launch per decode step, as vLLM decodes), or run itself on the CPU
    or where capture fails; and how it is launched."""
    if device != "cuda":
        return run, "eager"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        return graph.replay, "CUDA graph"
    except Exception as error:  # noqa: BLE001 - any capture failure falls back to eager launches, recorded
        torch.cuda.synchronize()
        return run, f"eager (CUDA graph capture failed: {type(error).__name__})"


def _time_ms(torch, device: str, run, warmup: int, repeats: int) -> float:
    """Median wall time of run() in ms after warmup calls: CUDA events on a GPU, perf_counter on the CPU."""
    for _ in range(warmup):
        run()
    _sync(torch, device)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            run()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def _device_metadata(torch, device: str, shape: DecoderShape) -> dict:
    meta = {
        "device": device,
        "gpu_name": "cpu",
        "driver": "none",
        "torch_version": torch.__version__,
        "cuda_version": str(torch.version.cuda or "none"),
    }
    if device == "cuda":
        meta["gpu_name"] = torch.cuda.get_device_name(0)
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            meta["driver"] = (
                out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
            )
        except (OSError, subprocess.SubprocessError):
            meta["driver"] = "unknown"
    meta.update(
        {
            "dtype": shape.dtype,
            "num_layers": shape.num_layers,
            "num_heads": shape.num_heads,
            "num_kv_heads": shape.num_heads,
            "head_dim": shape.head_dim,
            "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size,
            "vocab_size": shape.vocab_size,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    return meta


def _kv_bytes_per_token(torch, shape, weights, device: str, batch_size: int, tokens: int) -> tuple[float, str]:
    """KV bytes per token after prefilling batch_size x tokens tokens, and how they were counted."""
    prompt = torch.randint(0, shape.vocab_size, (batch_size, tokens), device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        cache = _new_cache(torch, shape, batch_size, tokens, device)
        _forward(torch, shape, weights, prompt, cache, 0)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
        method = "torch.cuda.memory_allocated after - before caching"
    else:
        cache = _new_cache(torch, shape, batch_size, tokens, device)
        _forward(torch, shape, weights, prompt, cache, 0)
        held = sum(k.nbytes + v.nbytes for k, v in cache)
        method = "sum of the cache tensors' nbytes (CPU: no allocator statistics)"
    return held / (batch_size * tokens), method


def measure(
    shape: DecoderShape = DecoderShape(),
    *,
    device: str = "cuda",
    batch_sizes=FULL_GRID["batch_sizes"],
    context_tokens=FULL_GRID["context_tokens"],
    prompt_tokens=FULL_GRID["prompt_tokens"],
    kv_tokens: int = 4096,
    warmup: int = 3,
    repeats: int = 10,
    memory_fraction: float = 0.85,
    time_limit_s: float = 300.0,
    seed: int = 0,
    log=None,
) -> tuple[dict, list[dict]]:
    """Measure shape on device: (metadata, rows with COLUMNS). Grid points whose cache would not fit in
    memory_fraction of free GPU memory are skipped; so is the rest of the grid once time_limit_s is spent."""
    torch = import_torch()
    validate.one_of("device", device, ("cuda", "cpu"))
    if device == "cuda" and not torch.cuda.is_available():
        validate.fail("device", device, "torch.cuda.is_available() is False on this machine; use --device cpu")
    for name, values in (
        ("batch_sizes", batch_sizes),
        ("context_tokens", context_tokens),
        ("prompt_tokens", prompt_tokens),
    ):
        for v in validate.non_empty(name, values):
            validate.positive_int(name, v)
    validate.positive_int("kv_tokens", kv_tokens)
    validate.non_negative_int("warmup", warmup)
    validate.positive_int("repeats", repeats)
    validate.fraction("memory_fraction", memory_fraction)
    validate.positive_number("time_limit_s", time_limit_s)
    log = log or (lambda message: print(message, file=sys.stderr))
    torch.manual_seed(seed)
    start = time.perf_counter()
    metadata = _device_metadata(torch, device, shape)
    metadata.update(
        {
            "warmup": warmup,
            "repeats": repeats,
            "statistic": "median",
            "timer": "CUDA events" if device == "cuda" else "time.perf_counter",
        }
    )
    rows, skipped, launches = [], [], set()
    with torch.inference_mode():
        weights = _init_weights(torch, shape, device)
        rows.append({"kind": "weights_bytes", "value": shape.weights_bytes, "unit": "B"})
        first = torch.randint(0, shape.vocab_size, (1, 8), device=device)
        _forward(torch, shape, weights, first, _new_cache(torch, shape, 1, 8, device), 0)  # library start-up, untimed
        kv, method = _kv_bytes_per_token(torch, shape, weights, device, 1, kv_tokens)
        metadata["kv_method"] = method
        rows.append(
            {"kind": "kv_bytes_per_token", "batch_size": 1, "context_tokens": kv_tokens, "value": kv, "unit": "B"}
        )
        log(f"KV bytes per token {kv:,.1f} B ({method}); analytic {shape.kv_bytes_per_token:,} B")

        def fits(tokens: int) -> bool:
            if device != "cuda":
                return True
            free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
            return tokens * shape.kv_bytes_per_token <= memory_fraction * free  # freed blocks the allocator keeps count

        # prefill first: it is short, and the time limit then cuts the largest decode points, not the prefill
        for p in prompt_tokens:
            if time.perf_counter() - start > time_limit_s or not fits(p):
                skipped.append(f"prefill p={p}")
                continue
            cache = _new_cache(torch, shape, 1, p, device)
            prompt = torch.randint(0, shape.vocab_size, (1, p), device=device)
            ms = _time_ms(torch, device, lambda: _forward(torch, shape, weights, prompt, cache, 0), warmup, repeats)  # noqa: B023 (timed at once)
            del cache
            rows.append({"kind": "prefill_ms", "batch_size": 1, "prompt_tokens": p, "value": ms, "unit": "ms"})
            log(f"prefill      prompt {p:>6}: {ms:8.3f} ms")
        for b in batch_sizes:
            for c in context_tokens:
                if time.perf_counter() - start > time_limit_s:
                    skipped.append(f"decode b={b} c={c} (time)")
                    continue
                if not fits(b * (c + 1)):
                    skipped.append(f"decode b={b} c={c} (memory)")
                    continue
                try:
                    cache = _new_cache(torch, shape, b, c + 1, device)
                    step = torch.randint(0, shape.vocab_size, (b, 1), device=device)
                    run, launch = _graphed(torch, device, lambda: _forward(torch, shape, weights, step, cache, c))  # noqa: B023
                    ms = _time_ms(torch, device, run, warmup, repeats)
                except torch.cuda.OutOfMemoryError:
                    skipped.append(f"decode b={b} c={c} (out of memory)")
                    continue
                finally:
                    cache = run = None
                    if device == "cuda":
                        torch.cuda.empty_cache()
                launches.add(launch)
                rows.append({"kind": "decode_step_ms", "batch_size": b, "context_tokens": c, "value": ms, "unit": "ms"})
                log(f"decode step  batch {b:>4} context {c:>6}: {ms:8.3f} ms")
    metadata["decode_launch"] = "; ".join(sorted(launches)) or "none"
    metadata["prefill_launch"] = "eager"
    metadata["skipped"] = "; ".join(skipped) if skipped else "none"
    metadata["seconds"] = f"{time.perf_counter() - start:.1f}"
    return metadata, rows


def default_path(metadata: dict) -> Path:
    """data/calibration/<device name>.csv, the name lower-cased with non-alphanumerics as '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", metadata.get("gpu_name", "cpu").lower()).strip("-") or "device"
    return CALIBRATION_DIR / f"{slug}.csv"


def write_csv(path, metadata: dict, rows: list[dict]) -> Path:
    """Write a calibration file: the `# key: value` header block, then one row per measurement."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        handle.write("# kvlab calibration: see kvlab/core/calibration.py for what each kind measures\n")
        for key, value in metadata.items():
            handle.write(f"# {key}: {str(value).replace(chr(10), ' ')}\n")
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in rows:
            value = row["value"]
            writer.writerow(
                [
                    row["kind"],
                    row.get("batch_size", ""),
                    row.get("context_tokens", ""),
                    row.get("prompt_tokens", ""),
                    value if isinstance(value, int) else f"{value:.6g}",
                    row["unit"],
                ]
            )
    return path
