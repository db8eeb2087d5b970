"""The report's glossary: every term a reader meets that is kvlab's own or vLLM's, defined once, on the front page
before any section uses it (tests/test_report.py holds the sections to it)."""

from __future__ import annotations

import html

# term -> definition, in the order a reader meets them.
GLOSSARY = {
    "kvlab": "the small Python library and command line that computes every number in this report: vLLM's KV "
    "allocation, scheduler and memory sizing, checked against vLLM's own code, and the clocks below",
    "KV cache": "the keys and values (K and V) of every token a request holds, kept on the GPU so that each new "
    "token attends to them without recomputing them",
    "block": "the unit vLLM reserves KV memory in: block_size tokens (16 by default) of one request",
    "block table": "a request's list of the blocks it holds, one entry a block",
    "token states": "the KV slots that hold a token a request has actually computed (the rest of what it holds is "
    "reserved ahead or lost to rounding)",
    "internal fragmentation": "slots a request holds beyond its final length (a reservation's or a block's unused end)",
    "external fragmentation": "free slots that no request can use because they lie in pieces too small for it",
    "Orca (Max), Orca (Pow2), Orca (Oracle)": "the vLLM paper's baselines: a request reserves its maximum length, "
    "its prompt plus the next power of two of its output, or exactly its final length (an oracle)",
    "static and continuous batching": "static: a batch starts together and holds its slots until its longest "
    "request ends; continuous: a finished request's slot is refilled at once",
    "TTFT": "time to first token: first token minus arrival",
    "TPOT": "time per output token after the first: (finish - first token) / (output tokens - 1)",
    "E2E latency": "end to end: finish minus arrival",
    "normalized latency": "the vLLM paper's measure: the mean over requests of (finish - arrival) / output tokens, "
    "in seconds per token",
    "sustains": "a rate a mode sustains keeps its normalized latency under a stated bound",
    "regime": "whether a run sustains its rate (sustained) or its queue grows without bound (saturated)",
    "knee": "the highest rate a mode sustains: where its latency curve turns up",
    "preemption": "vLLM freeing a running request's blocks when the pool is full, to recompute it later",
    "watermark": "the share of the pool vLLM keeps free when it admits a request (1% in vLLM 0.1.4)",
    "null block": "one block vLLM keeps back and never hands out (a placeholder in block tables)",
    "KV cache groups": "layers that share one block layout (full attention, a sliding window, a linear-attention "
    "state); vLLM's hybrid KV-cache manager keeps one pool for them all",
    "admission cap": "the blocks vLLM counts a sliding-window layer at when it decides whether a request fits: its "
    "window less one plus the tokens in flight",
    "retention interval": "how often along a prompt vLLM keeps a sliding-window layer's blocks for prefix caching "
    "(0 by default: only at the prompt's end and where prompts part)",
    "align mode": "vLLM's way of caching a linear-attention (Mamba-like) state in blocks whose size it raises to fit "
    "the state, checkpointed inside the prefill kernel",
    "long_prefill_token_threshold": "vLLM's cap on the tokens one long prompt may take of a step's budget",
    "prefix caching": "reusing the blocks of a prompt's beginning that another request already computed",
    "instance, router": "a fleet's vLLM engines (each its own scheduler and KV cache), and what picks the instance of "
    "each request as it arrives",
    "chunked prefill": "splitting a long prompt over several steps beside the running decodes",
    "step": "one forward pass of the model over a batch: prefill chunks and one token of each decode",
    "clock": "kvlab's model of how long a step takes on a GPU",
    "measured clock": "the clock built from operator timings measured on GPUs (whole-model operator profiles, or "
    "vLLM's kernels timed one at a time by AIConfigurator, composed by shape)",
    "roofline clock": "the clock at a GPU's datasheet bandwidth and FLOP/s: a lower bound on a dense model's step "
    "(scaled to measured kernels' rates: an estimate)",
    "pooled alpha": "LLMServingSim's fit for decodes of unequal context: how far a batch's attention time moves from "
    "its mean context's toward its longest's (per cell of batch shapes; pooled: one value for the rest)",
    "composed clock": "the measured clock built from a GPU's operator tables alone (AIConfigurator's), by the "
    "model's shapes: how kvlab times a (model, GPU) that no whole-model profile measures",
    "AIConfigurator": "NVIDIA's open tool (ai-dynamo/aiconfigurator) whose tables time vLLM's own kernels (GEMMs, "
    "attention, MoE blocks, collectives) one at a time on many GPUs",
    "LLMServingSim": "an open LLM-serving simulator (casys-kaist/LLMServingSim) that publishes whole-model operator "
    "profiles on real GPUs and real vLLM runs, which kvlab reads as measurements and as checks",
    "Vidur": "an open LLM-serving simulator (microsoft/vidur) that publishes operator measurements on the A100 and H100",
    "nccl-tests": "NVIDIA's benchmarks of NCCL's collectives (all-reduce, all-gather, ...), one collective at a time",
    "2023 clock": "a clock of the paper's 2023 system, fitted to Anyscale's June 2023 benchmark and the paper's "
    "kernel measurement (section 6)",
    "article-s1": "section 1's default lengths: a lognormal with a uniform share, fitted to the article's totals",
    "twins": "plan candidates that differ only in settings that cannot change a single decision of the run (served "
    "once, counted for all)",
    "rung": "one stage of the plan's search: candidates served on a prefix of the workload, the hopeless dropped",
    "goodput": "requests per second per GPU served within every objective",
    "TP, DP, EP": "tensor, data and expert parallelism: a layer split over TP GPUs, DP ranks serving their own "
    'requests, experts spread over the GPUs; "TP 2 x 3": three replicas of two GPUs',
    "gpu_memory_utilization, max_num_seqs, max_num_batched_tokens": "vLLM's share of GPU memory to use, requests a "
    "step may hold, tokens a step may compute",
    "FlyDSL, AITER": "AMD's kernel language and kernel library for ROCm, whose paged-attention kernels one public "
    "measurement times at block sizes 1 and 16",
}


def glossary_html() -> str:
    """The glossary as a definition list, for the front page."""
    items = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}.</dd>" for term, text in GLOSSARY.items())
    return f'<h2 id="terms">Terms</h2><dl class="glossary">{items}</dl>'


__all__ = ["GLOSSARY", "glossary_html"]
