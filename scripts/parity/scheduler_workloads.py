"""The workloads of make parity's scheduler comparison (and of make bench's speed ratio), as IN.json documents.

Each run is a document for scripts/parity/vllm_scheduler.py (vLLM's side) and kvlab.core.engine.replay
(kvlab's side): a config, a step cost and the requests. Everything is drawn from numpy default_rng with a
fixed seed, or read from the Azure conversation trace (TRACE_DIR), so every run is the same on every machine.

Runs (RUNS): the whole Azure conversation trace (19,366 requests over an hour; about 1.5 minutes of vLLM's scheduler
per run) with memory that forces preemption and with ample memory; synthetic workloads with chunked prefill off,
with a long-prefill threshold, with prefix caching over shared system prompts (tight memory, so cached blocks are
evicted and requests preempted); a long-prompt, short-output workload; and three hybrid models' KV cache groups
(gpt-oss-20b's and Gemma-3-27B's sliding windows beside full attention, and Llama 4 Scout's attention chunks
beside it, as kvlab.core.capacity lays them out for the catalog models, each without and with prefix caching;
Qwen3-Next's Mamba states beside it, with a smaller attention block than vLLM's). Each in both of vLLM's scheduling modes: synchronous (NAME) and asynchronous,
vLLM's default on a GPU (NAME-async).
"""

from __future__ import annotations

import numpy as np

LINEAR = {"kind": "linear", "step_ms": 8.0, "step_ms_per_token": 0.01}
CONSTANT = {"kind": "constant", "step_ms": 8.0}


def _config(**settings) -> dict:
    base = {
        "num_gpu_blocks": 2000,
        "block_size": 16,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "max_model_len": 16384,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "enable_prefix_caching": False,
        "async_scheduling": False,
    }
    return base | settings


def _requests(arrival_s, prompt_tokens, output_tokens, prompt_token_ids=None) -> list[dict]:
    requests = [
        {"arrival_s": float(a), "prompt_tokens": int(p), "output_tokens": int(o)}
        for a, p, o in zip(arrival_s, prompt_tokens, output_tokens)
    ]
    if prompt_token_ids is not None:
        for request, ids in zip(requests, prompt_token_ids):
            request["prompt_token_ids"] = [int(t) for t in ids]
    return requests


def azure(num_gpu_blocks: int, num_requests: int | None = None) -> dict:
    """The Azure conversation trace, all of it or its first num_requests requests (needs the trace file)."""
    from kvlab.workloads import traces

    load = traces.load_trace(traces.trace_path("azure"), max_requests=num_requests)
    w = load.workload
    return {
        "config": _config(num_gpu_blocks=num_gpu_blocks),
        "cost": LINEAR,
        "requests": _requests(w.arrival_s, w.prompt_tokens, w.output_tokens),
    }


def _azure_like(rng, n: int, rate_per_s: float, max_prompt: int = 14_000):
    """Lengths and Poisson arrivals shaped like the Azure conversation trace (median prompt ~800, output ~120)."""
    arrival = np.cumsum(rng.exponential(1 / rate_per_s, n))
    prompt = np.clip(rng.lognormal(np.log(800), 0.9, n), 1, max_prompt).astype(np.int64)
    output = np.clip(rng.lognormal(np.log(120), 1.0, n), 1, 1000).astype(np.int64)
    return arrival - arrival[0], prompt, output


def chunked_prefill_off(n: int = 3000) -> dict:
    """Chunked prefill off (a prompt waits for a step with room for all of it), memory that preempts."""
    arrival, prompt, output = _azure_like(np.random.default_rng(1), n, 6.0, max_prompt=7000)
    return {
        "config": _config(
            num_gpu_blocks=900,
            max_model_len=8192,
            max_num_batched_tokens=8192,
            max_num_seqs=64,
            enable_chunked_prefill=False,
        ),
        "cost": CONSTANT,
        "requests": _requests(arrival, prompt, output),
    }


def long_prefill_threshold(n: int = 3000) -> dict:
    """A small step budget shared by long prompts capped at 256 tokens a step, memory that preempts."""
    arrival, prompt, output = _azure_like(np.random.default_rng(2), n, 5.0)
    return {
        "config": _config(
            num_gpu_blocks=1200, max_num_batched_tokens=1024, max_num_seqs=128, long_prefill_token_threshold=256
        ),
        "cost": LINEAR,
        "requests": _requests(arrival, prompt, output),
    }


def prefix_caching(n: int = 2000) -> dict:
    """Prefix caching: each prompt is one of 8 system prompts (200-1,500 tokens) plus its own question."""
    rng = np.random.default_rng(3)
    systems = [rng.integers(1000, 30_000, int(rng.integers(200, 1500))) for _ in range(8)]
    arrival = np.cumsum(rng.exponential(1 / 6.0, n))
    which = rng.integers(0, len(systems), n)
    questions = [rng.integers(1000, 30_000, int(q)) for q in np.clip(rng.lognormal(np.log(150), 0.8, n), 1, 2000)]
    ids = [np.concatenate([systems[s], q]) for s, q in zip(which, questions)]
    output = np.clip(rng.lognormal(np.log(100), 1.0, n), 1, 800).astype(np.int64)
    return {
        "config": _config(num_gpu_blocks=700, enable_prefix_caching=True),
        "cost": LINEAR,
        "requests": _requests(arrival - arrival[0], [len(x) for x in ids], output, ids),
    }


def long_prompt_short_output(n: int = 2000) -> dict:
    """Long prompts (2,000-8,000 tokens) with short outputs (16-128 tokens): prefill-heavy steps."""
    rng = np.random.default_rng(4)
    prompt = rng.integers(2000, 8001, n)
    output = rng.integers(16, 129, n)
    arrival = np.cumsum(rng.exponential(1 / 6.0, n))
    return {
        "config": _config(num_gpu_blocks=6000),
        "cost": LINEAR,
        "requests": _requests(arrival - arrival[0], prompt, output),
    }


def hybrid_groups(name: str, prefix_caching: bool = False) -> list[dict]:
    """A catalog model's KV cache groups as kvlab.core.capacity lays them out (engine_kv_cache_groups: vLLM's order,
    block sizes, windows and chunks on its default attention backend, the base config's max_model_len; with
    prefix_caching, a Mamba group's mamba_cache_mode "align" and its prefill checkpoint blocks and alignment, as a
    Hopper GPU's Gated DeltaNet kernel exports them), as IN.json gives them to both sides."""
    from kvlab.core.capacity import engine_kv_cache_groups
    from kvlab.core.config import EngineConfig
    from kvlab.core.models import get_model

    config = EngineConfig().replace(max_model_len=_config()["max_model_len"], enable_prefix_caching=prefix_caching)
    return [
        {"kind": g.kind, "block_size": g.block_size, "sliding_window": g.sliding_window}
        | ({"attention_chunk_size": g.attention_chunk_size} if g.attention_chunk_size else {})
        | (
            {
                "mamba_cache_mode": g.mamba_cache_mode,
                "num_prefill_checkpoint_blocks": g.num_prefill_checkpoint_blocks,
                "prefill_checkpoint_alignment": g.prefill_checkpoint_alignment,
            }
            if g.num_prefill_checkpoint_blocks
            else {}
        )
        for g in engine_kv_cache_groups(get_model(name), config)
    ]


def hybrid(groups: list[dict], num_gpu_blocks: int, block_size: int = 16, n: int = 2000) -> dict:
    """Azure-like requests on a hybrid model's KV cache groups (hybrid_groups), a step budget of
    2,048 tokens (long prompts cross a window in chunks) and memory that preempts."""
    arrival, prompt, output = _azure_like(np.random.default_rng(6), n, 5.0, max_prompt=12_000)
    config = _config(
        num_gpu_blocks=num_gpu_blocks, block_size=block_size, max_num_batched_tokens=2048, max_num_seqs=128
    )
    return {
        "config": config | {"kv_cache_groups": groups},
        "cost": LINEAR,
        "requests": _requests(arrival, prompt, output),
    }


def hybrid_prefix(groups: list[dict], num_gpu_blocks: int, block_size: int = 16, n: int = 1000) -> dict:
    """Prefix caching on a hybrid model's KV cache groups: each prompt is one of 8 system prompts (200-3,000 tokens)
    plus its own question, and one request in five repeats an earlier request's prompt exactly (a window's blocks
    are cached at a prompt's end and where prompts part, vLLM's default); a step budget of 2,048 tokens and memory
    that preempts."""
    rng = np.random.default_rng(7)
    systems = [rng.integers(1000, 30_000, int(rng.integers(200, 3000))) for _ in range(8)]
    arrival = np.cumsum(rng.exponential(1 / 5.0, n))
    which = rng.integers(0, len(systems), n)
    questions = [rng.integers(1000, 30_000, int(q)) for q in np.clip(rng.lognormal(np.log(150), 0.8, n), 1, 2000)]
    ids = [np.concatenate([systems[s], q]) for s, q in zip(which, questions)]
    for i in np.flatnonzero(rng.random(n) < 0.2)[1:]:
        ids[i] = ids[int(rng.integers(0, i))]
    output = np.clip(rng.lognormal(np.log(100), 1.0, n), 1, 800).astype(np.int64)
    config = _config(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        enable_prefix_caching=True,
    )
    return {
        "config": config | {"kv_cache_groups": groups},
        "cost": LINEAR,
        "requests": _requests(arrival - arrival[0], [len(x) for x in ids], output, ids),
    }


def qwen3_next_prefix_groups(attention_block_size: int = 64) -> list[dict]:
    """Qwen3-Next-80B-A3B's KV cache groups with prefix caching as vLLM groups its 48 layers (three Mamba groups of
    12 Gated DeltaNet layers, then one of full attention; mamba_cache_mode "align": a state a block of the attention
    block size, the scheduler cutting prefills at block boundaries), but with an attention block size chosen here,
    64 tokens, and no in-kernel prefill checkpoints: the run holds the scheduler's align-mode cuts at many block
    boundaries to vLLM's. qwen3-next-prefix-hopper takes the layout vLLM builds on a Hopper GPU (576-token blocks,
    prefill checkpoints), and the runs without prefix caching capacity's own layout (hybrid_groups)."""
    mamba = {"kind": "mamba", "block_size": attention_block_size, "sliding_window": 0}
    return [mamba, mamba, mamba, {"kind": "full_attention", "block_size": attention_block_size, "sliding_window": 0}]


def disaggregated(
    role: str, n: int = 2000, prefix: bool = False, chunked: bool = True, budget: int = 8192, threshold: int = 0
) -> dict:
    """An instance of a disaggregated deployment (a KV connector, NIXL's pull, vllm_fake_nixl.py on vLLM's side):
    "decode" (every request loads its prompt's KV, in 2 us a token plus 1 ms, from the step that allocates its blocks),
    "prefill" (every request computes its prompt and one token, its blocks held 5-200 ms after it finishes, until the
    decode instance has read them) or "mixed" (a third of each, and requests of neither role); memory that binds."""
    rng = np.random.default_rng(7)
    arrival, prompt, output = _azure_like(rng, n, 8.0, max_prompt=6000)
    roles = {"decode": np.full(n, 2), "prefill": np.full(n, 1), "mixed": rng.integers(0, 3, n)}[role]
    output = np.where(roles == 1, 1, output)
    requests = _requests(arrival, prompt, output)
    ids = None
    if prefix:  # 8 shared system prompts before each question
        systems = [rng.integers(1000, 30_000, int(rng.integers(200, 1500))) for _ in range(8)]
        ids = [np.concatenate([systems[int(rng.integers(8))], rng.integers(1000, 30_000, int(p))]) for p in prompt]
        requests = _requests(arrival, [len(x) for x in ids], output, ids)
    hold = rng.uniform(0.005, 0.2, n)
    for request, kind, h in zip(requests, roles, hold):
        request["kv_role"] = int(kind)
        if kind == 2:
            request["kv_load_s"] = 0.001 + 2e-6 * request["prompt_tokens"]
        elif kind == 1:
            request["kv_hold_s"] = float(h)
    return {
        "config": _config(
            num_gpu_blocks=700, max_model_len=8192, max_num_seqs=64, enable_prefix_caching=prefix,
            enable_chunked_prefill=chunked, max_num_batched_tokens=budget, long_prefill_token_threshold=threshold,
        ),
        "cost": LINEAR,
        "requests": requests,
    }  # fmt: skip


# name -> (what it shows, the document's builder)
RUNS = {
    "azure-preempt": (
        "Azure conversation trace, all 19,366 requests, 1,100 blocks: memory forces preemption",
        lambda: azure(1100),
    ),
    "azure-ample": (
        "Azure conversation trace, all 19,366 requests, 40,000 blocks: ample memory",
        lambda: azure(40_000),
    ),
    "chunked-prefill-off": ("synthetic, chunked prefill off, 900 blocks", chunked_prefill_off),
    "long-prefill-threshold": (
        "synthetic, long_prefill_token_threshold 256, budget 1,024 tokens, 1,200 blocks",
        long_prefill_threshold,
    ),
    "prefix-caching": ("synthetic, prefix caching over 8 shared system prompts, 700 blocks", prefix_caching),
    "long-prompt": ("synthetic, prompts 2,000-8,000 tokens, outputs 16-128, 6,000 blocks", long_prompt_short_output),
    "gpt-oss-20b": (
        "gpt-oss-20b's KV cache groups (a 128-token window, full attention), Azure-like, 1,200 blocks",
        lambda: hybrid(hybrid_groups("openai/gpt-oss-20b"), 1200),
    ),
    "gemma-3-27b": (
        "Gemma-3-27B's KV cache groups (six of a 1,024-token window, one full), Azure-like, 4,000 blocks",
        lambda: hybrid(hybrid_groups("google/gemma-3-27b-it"), 4000),
    ),
    "gpt-oss-20b-prefix": (
        "gpt-oss-20b's KV cache groups with prefix caching: 8 shared system prompts, repeated prompts, 600 blocks",
        lambda: hybrid_prefix(hybrid_groups("openai/gpt-oss-20b"), 600),
    ),
    "gemma-3-27b-prefix": (
        "Gemma-3-27B's KV cache groups with prefix caching: 8 shared system prompts, repeated prompts, 2,000 blocks",
        lambda: hybrid_prefix(hybrid_groups("google/gemma-3-27b-it"), 2000),
    ),
    "llama-4-scout": (
        "Llama-4-Scout's KV cache groups (three of 8,192-token attention chunks, one full), Azure-like, 3,500 blocks",
        lambda: hybrid(hybrid_groups("meta-llama/Llama-4-Scout-17B-16E-Instruct"), 3500),
    ),
    "llama-4-scout-prefix": (
        "Llama-4-Scout's KV cache groups with prefix caching: 8 shared system prompts, repeated prompts, 1,200 blocks",
        lambda: hybrid_prefix(hybrid_groups("meta-llama/Llama-4-Scout-17B-16E-Instruct"), 1200),
    ),
    "qwen3-next-prefix": (
        "Qwen3-Next-80B-A3B's KV cache groups with prefix caching (Mamba states in 64-token blocks, vLLM's 'align' "
        "mode): 8 shared system prompts, repeated prompts, 200 blocks",
        lambda: hybrid_prefix(qwen3_next_prefix_groups(), 200, block_size=64),
    ),
    "qwen3-next-prefix-hopper": (
        "Qwen3-Next-80B-A3B's KV cache groups with prefix caching as vLLM lays them out on a Hopper GPU (576-token "
        "blocks; Mamba states in 'align' mode with in-kernel prefill checkpoints): 8 shared system prompts, repeated "
        "prompts, 80 blocks",
        lambda: hybrid_prefix(
            hybrid_groups("Qwen/Qwen3-Next-80B-A3B-Instruct", prefix_caching=True), 80, block_size=576
        ),
    ),
    "qwen3-next": (
        "Qwen3-Next-80B-A3B's KV cache groups (three of Mamba states, one full of 544-token blocks, as vLLM raises "
        "them), Azure-like, 60 blocks",
        lambda: hybrid(hybrid_groups("Qwen/Qwen3-Next-80B-A3B-Instruct"), 60, block_size=544),
    ),
}
SYNC_RUNS = dict(RUNS)
# A disaggregated deployment's instances (a KV connector): the synchronous scheduler only, so far
CONNECTOR_RUNS = {
    "pd-decode": (
        "a decode instance: every request loads its prompt's KV (NIXL), 700 blocks",
        lambda: disaggregated("decode"),
    ),
    "pd-prefill": (
        "a prefill instance: every request's blocks held 5-200 ms after it finishes, 700 blocks",
        lambda: disaggregated("prefill"),
    ),
    "pd-mixed-prefix": (
        "an instance of both roles and neither, prefix caching over 8 shared system prompts, 700 blocks",
        lambda: disaggregated("mixed", prefix=True),
    ),
    "pd-mixed-long-prefill": (
        "an instance of both roles and neither, long_prefill_token_threshold 128 in a budget of 2,048 tokens (prompts "
        "prefill in chunks while others load: the blocks their prefills still need are kept from the loads), 700 blocks",
        lambda: disaggregated("mixed", budget=2048, threshold=128),
    ),
    "pd-mixed-no-chunking": (
        "an instance of both roles and neither, chunked prefill off, 700 blocks",
        lambda: disaggregated("mixed", chunked=False),
    ),
}


def asynchronous(build):
    """The same document with vLLM's asynchronous scheduling (its default on a GPU)."""

    def build_async() -> dict:
        doc = build()
        doc["config"]["async_scheduling"] = True
        return doc

    return build_async


# Every run in both scheduling modes: NAME (synchronous) and NAME-async.
RUNS |= {
    f"{name}-async": (f"{what}; asynchronous scheduling", asynchronous(build))
    for name, (what, build) in SYNC_RUNS.items()
}
RUNS |= CONNECTOR_RUNS
# The two runs make bench measures the speed ratio on (the targets).
SPEED_RUNS = ("azure-preempt", "long-prompt", "azure-preempt-async", "long-prompt-async")
