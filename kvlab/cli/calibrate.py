"""`kvlab calibrate`: measure KV bytes per token, decode and prefill times of a random-weight decoder (PyTorch)."""

from __future__ import annotations

import dataclasses

from kvlab.cli.printing import print_json

CALIBRATE_FLAGS = {
    "num_layers": "--num-layers",
    "num_heads": "--num-heads",
    "head_dim": "--head-dim",
    "hidden_size": "--hidden-size",
    "intermediate_size": "--intermediate-size",
    "vocab_size": "--vocab-size",
    "dtype": "--dtype",
    "device": "--device",
    "batch_sizes": "--batch-sizes",
    "context_tokens": "--contexts",
    "prompt_tokens": "--prompts",
    "kv_tokens": "--kv-tokens",
    "warmup": "--warmup",
    "repeats": "--repeats",
    "time_limit_s": "--time-limit-s",
    "memory_fraction": "--memory-fraction",
}


def add(commands) -> None:
    """Register `kvlab calibrate` (measured KV bytes per token, decode and prefill times in ms)."""
    p = commands.add_parser(
        "calibrate",
        help="measure KV bytes per token, decode step time and prefill time of a random-weight decoder (needs PyTorch)",
        description="Builds a Llama-like decoder with random weights (nothing is downloaded; the article's shape by "
        "default: 32 layers, 32 heads, head dim 128, hidden 4096, bf16) and measures on --device: KV bytes per token "
        "(torch.cuda.memory_allocated before and after caching --kv-tokens tokens; on the CPU the cache tensors' "
        "bytes), the decode step time for every --batch-sizes x --contexts (median of --repeats after --warmup, CUDA "
        "events on a GPU) and the prefill time of each --prompts. Writes one CSV (default "
        "data/calibration/<device>.csv) that kvlab.core.service_time.CalibratedServiceTime.from_csv loads. Needs "
        "PyTorch: pip install 'kvlab[calibrate]'.",
        epilog="examples: kvlab calibrate --device cuda | kvlab calibrate --device cpu --quick --out /tmp/cpu.csv",
    )
    model = p.add_argument_group("decoder (the article's model by default)")
    model.add_argument("--num-layers", type=int, help="decoder layers (default 32)")
    model.add_argument("--num-heads", type=int, help="attention heads per layer, as many K/V heads (default 32)")
    model.add_argument("--head-dim", type=int, help="values per head (default 128)")
    model.add_argument("--hidden-size", type=int, help="model width, values (default: heads x head dim, 4096)")
    model.add_argument(
        "--intermediate-size", type=int, help="MLP width, values (default: 2.6875 x hidden, 11008 at 4096)"
    )
    model.add_argument("--vocab-size", type=int, help="vocabulary, tokens (default 32000)")
    model.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        help="weights and KV dtype (default bfloat16; float32 with --quick on the CPU)",
    )
    grid = p.add_argument_group("measurement grid")
    grid.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where to measure (default cuda)")
    grid.add_argument(
        "--quick",
        action="store_true",
        help="a tiny grid (batch 1-4, contexts 16-64, prompts 16-64 tokens; on the CPU also a tiny "
        "decoder: 2 layers, 4 heads, head dim 16) for a check in seconds",
    )
    grid.add_argument("--batch-sizes", type=int, nargs="+", help="requests per decode step (default 1 2 4 ... 256)")
    grid.add_argument(
        "--contexts",
        type=int,
        nargs="+",
        help="tokens cached per request before a decode step (default 1024 2048 ... 32768)",
    )
    grid.add_argument(
        "--prompts", type=int, nargs="+", help="prompt lengths for the prefill time, tokens (default 128 ... 32768)"
    )
    grid.add_argument(
        "--kv-tokens", type=int, help="tokens cached to measure KV bytes per token (default 4096; --quick 32)"
    )
    grid.add_argument("--warmup", type=int, default=3, help="untimed runs before each point (default 3)")
    grid.add_argument("--repeats", type=int, default=10, help="timed runs per point; the median is kept (default 10)")
    grid.add_argument(
        "--memory-fraction",
        type=float,
        default=0.85,
        help="skip a point whose cache needs more than this fraction of free GPU memory (default 0.85)",
    )
    grid.add_argument(
        "--time-limit-s",
        type=float,
        default=300.0,
        help="seconds after which the remaining points are skipped and listed in the file (default 300)",
    )
    p.add_argument("--out", help="CSV to write (default data/calibration/<device name>.csv)")
    p.add_argument("--json", action="store_true", help="print one JSON object (path, metadata, rows) instead of text")
    p.set_defaults(run=run, flags=CALIBRATE_FLAGS)


def run(args, given: set[str]) -> dict:
    """Measure the decoder on --device and write the calibration CSV; print where and how many points."""
    from kvlab.core import calibration as calibrate

    calibrate.import_torch()  # the one-line install hint before any work
    base = calibrate.TINY_SHAPE if args.quick and args.device == "cpu" else calibrate.DecoderShape()
    given = {
        name: getattr(args, name)
        for name in ("num_layers", "num_heads", "head_dim", "hidden_size", "intermediate_size", "vocab_size", "dtype")
    }
    given = {name: value for name, value in given.items() if value is not None}
    if "hidden_size" not in given and ("num_heads" in given or "head_dim" in given):
        given["hidden_size"] = given.get("num_heads", base.num_heads) * given.get("head_dim", base.head_dim)
    if "intermediate_size" not in given and given.get("hidden_size", base.hidden_size) != base.hidden_size:
        given["intermediate_size"] = round(2.6875 * given["hidden_size"])
    shape = dataclasses.replace(base, **given)
    grid = calibrate.QUICK_GRID if args.quick else calibrate.FULL_GRID
    metadata, rows = calibrate.measure(
        shape,
        device=args.device,
        batch_sizes=args.batch_sizes or grid["batch_sizes"],
        context_tokens=args.contexts or grid["context_tokens"],
        prompt_tokens=args.prompts or grid["prompt_tokens"],
        kv_tokens=args.kv_tokens or (32 if args.quick else 4096),
        warmup=args.warmup,
        repeats=args.repeats,
        memory_fraction=args.memory_fraction,
        time_limit_s=args.time_limit_s,
        log=(lambda message: None) if args.json else None,
    )
    path = calibrate.write_csv(args.out or calibrate.default_path(metadata), metadata, rows)
    result = {"path": str(path), "metadata": metadata, "rows": rows}
    if args.json:
        print_json(result)
    else:
        print(
            f"wrote {path} ({len(rows)} measurements on {metadata['gpu_name']}, {metadata['seconds']} s; "
            f"skipped: {metadata['skipped']})"
        )
    return result
