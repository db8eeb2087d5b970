#!/usr/bin/env python3
"""Whole decoder step on one GPU against the sum of its operators timed one by one.

    python3 scripts/gpu/time_whole_step.py --out OUTDIR [--quick] [--deadline-s 300]
    python3 scripts/gpu/time_whole_step.py --device cpu --tiny --out /tmp/x    # a CPU check of the code paths

kvlab composes a step's time from operator measurements (each linear layer a GEMM, attention, norms, lm_head,
sampler). This script measures, for a Llama-3.1-8B-shaped decoder (32 layers, hidden 4,096, 32 heads, 8 KV heads,
head_dim 128, MLP 14,336, vocab 128,256, bf16, random weights, TP 1), how long the WHOLE forward step takes when
captured in one CUDA graph, and how that compares with the sum of the same operators timed alone:

  whole step   embedding; per layer: residual add + RMSNorm (layer 0: RMSNorm alone), qkv_proj (F.linear),
               rotary (neox, in place on qkv's q and k), the KV-cache write (vLLM's reshape_and_cache: one
               launch writes each new token's K and V at its slot), attention (torch SDPA over the cache),
               o_proj, residual add + RMSNorm, gate_up_proj, SiLU and mul, down_proj; final residual add +
               RMSNorm; the last token of each request gathered (vLLM's logits_indices); lm_head; the sampler
               (fp32 cast, softmax, exponential race: vLLM v1's random sampling). One CUDA graph of the step,
               replayed --replays times back to back; the median replay is whole_step_us.
  operators    each of those ops alone at the same shapes, the way kvlab's H200 profile was taken
               (/work/shared/gpu/profile_ops.py, "measured for kvlab on an NVIDIA H200"): a CUDA graph of R calls
               (R 3-40, about 2 ms of work) replayed 3 times, median / R, weights cycled over the 32 layers'
               own copies and inputs over copies exceeding 256 MB where they are small (L2 is 60 MB).

KV cache: dense per request, in vLLM's paged layout [blocks, block_size, kv_heads, head_dim] (K and V apart, per
layer) with one block per request (block_size = the longest context in the step), so SDPA reads each request's
K/V as one strided tensor. The write indexes it by a slot mapping (block * block_size + offset) as vLLM's
reshape_and_cache does.

Attention: torch SDPA. Decode: one query per request over its C cached tokens (the new token included, at
position C-1), the 4 query heads of a KV head packed as that head's queries, flash backend (as profile_ops.py).
Prefill: a causal chunk with no history, GQA by enable_gqa, PyTorch's own backend choice (as profile_ops.py).
Mixed: the decodes first, then the chunk; the two SDPA calls are one attention op, their outputs concatenated.

Composed clock (composed_us) = embedding + rmsnorm(layer 0) + 2L add_rmsnorm (the last one the final norm)
+ L x (qkv_proj, rotary, attention, o_proj, gate_up_proj, act_fn, down_proj) + lm_head + sampler.
Listed apart: kv_write_us (L x the cache write: a composed clock of GEMMs/attention/norms leaves it out),
attn_out_copy_us (L x the copy that puts SDPA's output in o_proj's row layout; vLLM's FlashAttention writes its
output in place, so this copy is the script's, not vLLM's; zero where the output is already a view),
logits_select_us (the last-token gather vLLM also makes), unexplained_us = whole - all of the above (gaps between
kernels, cache effects of running ops back to back).

Outputs in --out: whole_step.csv (one row per step shape), ops.csv (every op's time and count per step),
whole_step.json (environment, clocks, self-check, seconds per part, errors). One failing shape is recorded with
its error and skipped. Before timing, a tiny 2-layer model is run through the same step code (eager and, on a
GPU, replayed from a CUDA graph) and compared with a plain reference forward pass (full recompute, explicit causal
attention): the result is in whole_step.json["self_check"].
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------------------------
# Settings
LLAMA_8B = dict(layers=32, hidden=4096, inter=14336, heads=32, kv=8, hd=128, vocab=128256)
TINY = dict(layers=2, hidden=256, inter=512, heads=4, kv=2, hd=64, vocab=1000)
EPS = 1e-5
ROPE_THETA = 500000.0  # Llama 3.1's base (its long-context scaling changes values, not the time)
L2_DEFEAT_BYTES = 256 * 2**20  # as profile_ops.py
KV_BUDGET_BYTES = 100e9  # skip decode shapes whose KV cache would not fit comfortably

CUDA = False  # set by main() from --device
DEV = "cpu"
USE_TRITON = False
EAGER_POINTS: list[str] = []


def step_shapes(tiny: bool, quick: bool):
    """(kind, n_decode, decode_ctx, chunk): decodes are n_decode requests of decode_ctx tokens (the new one
    included); chunk is one prefill request's chunk with no history."""
    if tiny:
        shapes = [("decode", b, c, 0) for b in (1, 3) for c in (8, 32)]
        shapes += [("prefill", 0, 0, c) for c in (16, 32)] + [("mixed", 3, 32, 16)]
        return shapes[:1] + shapes[-2:] if quick else shapes
    if quick:
        return [("decode", 1, 2048, 0), ("decode", 32, 2048, 0), ("prefill", 0, 0, 512), ("mixed", 32, 2048, 512)]
    shapes = [("decode", b, c, 0) for b in (1, 8, 32, 128) for c in (512, 2048, 8192)]
    shapes += [("prefill", 0, 0, 512), ("prefill", 0, 0, 2048), ("mixed", 32, 2048, 512)]
    return shapes


def kv_bytes(m, n_dec, ctx, chunk, elem=2):
    slots = n_dec + (1 if chunk else 0)
    bs = max(ctx if n_dec else 0, chunk)
    return 2 * m["layers"] * slots * bs * m["kv"] * m["hd"] * elem


# ---------------------------------------------------------------------------------------------------------------
# Timing of one op, copied from profile_ops.py (kvlab's H200 operator profile): a CUDA graph of R calls over input
# sets, median of 3 replays divided by R; eager back-to-back calls where a call cannot be captured.
def gpu_time_us(call, n_sets: int, reps_hint: int | None = None) -> float:
    if not CUDA:  # a CPU check of the code paths only
        t = time.perf_counter()
        for i in range(3):
            call(i % n_sets)
        return (time.perf_counter() - t) / 3 * 1e6
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2):
            call(i % n_sets)
    torch.cuda.current_stream().wait_stream(s)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    call(0)
    e1.record()
    e1.synchronize()
    first_us = e0.elapsed_time(e1) * 1000
    reps = reps_hint or max(3, min(40, int(2000 / max(first_us, 1.0))))
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(reps):
                call(i % n_sets)
        g.replay()
        torch.cuda.synchronize()
        replay = g.replay
    except Exception as exc:  # noqa: BLE001  (not capturable: time R eager calls back to back instead)
        torch.cuda.synchronize()
        EAGER_POINTS.append(repr(exc)[:160])

        def replay():
            for i in range(reps):
                call(i % n_sets)

    times = []
    for _ in range(3):
        e0.record()
        replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1000 / reps)
    return statistics.median(times)


def copies_for(nbytes: int, cap: int = 16) -> int:
    return max(1, min(cap, math.ceil(L2_DEFEAT_BYTES / max(nbytes, 1))))


# ---------------------------------------------------------------------------------------------------------------
# Small fused ops: Triton kernels (one launch each, as vLLM fuses them), from profile_ops.py; rotary takes qkv's
# row stride (q and k stay views of qkv, as in vLLM) and the KV-cache write is added. Eager PyTorch otherwise.
TRITON_OK = False
TRITON_ERR = ""
try:
    import triton
    import triton.language as tl

    @triton.jit
    def _add_rmsnorm(x_ptr, r_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
        x = x + r
        tl.store(r_ptr + row * n + cols, x.to(r_ptr.dtype.element_ty), mask=m)
        var = tl.sum(x * x, axis=0) / n
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(var + eps) * w
        tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _rmsnorm(x_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
        var = tl.sum(x * x, axis=0) / n
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n + cols, (x * tl.rsqrt(var + eps) * w).to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _silu_mul(x_ptr, out_ptr, d, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1)
        cols = blk * BLOCK + tl.arange(0, BLOCK)
        m = cols < d
        a = tl.load(x_ptr + row * 2 * d + cols, mask=m, other=0.0).to(tl.float32)
        b = tl.load(x_ptr + row * 2 * d + d + cols, mask=m, other=0.0).to(tl.float32)
        y = a / (1.0 + tl.exp(-a)) * b
        tl.store(out_ptr + row * d + cols, y.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _rotary_qkv(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, stride_tok, HALF: tl.constexpr):
        # neox style, in place: one program per (token, head) over q's heads then k's, which open qkv's row.
        tok = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        p = tl.load(pos_ptr + tok)
        c = tl.arange(0, HALF)
        cos = tl.load(cos_ptr + p * HALF + c)
        sin = tl.load(sin_ptr + p * HALF + c)
        base = qkv_ptr + tok * stride_tok + h * 2 * HALF
        x1 = tl.load(base + c).to(tl.float32)
        x2 = tl.load(base + HALF + c).to(tl.float32)
        tl.store(base + c, (x1 * cos - x2 * sin).to(base.dtype.element_ty))
        tl.store(base + HALF + c, (x2 * cos + x1 * sin).to(base.dtype.element_ty))

    @triton.jit
    def _reshape_and_cache(qkv_ptr, kc_ptr, vc_ptr, slot_ptr, stride_tok, k_off, v_off, n, BLOCK: tl.constexpr):
        # vLLM's reshape_and_cache: token t's K and V (n = kv_heads * head_dim values each) to slot slot[t].
        tok = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        c = tl.arange(0, BLOCK)
        m = c < n
        k = tl.load(qkv_ptr + tok * stride_tok + k_off + c, mask=m)
        v = tl.load(qkv_ptr + tok * stride_tok + v_off + c, mask=m)
        tl.store(kc_ptr + slot * n + c, k, mask=m)
        tl.store(vc_ptr + slot * n + c, v, mask=m)

    TRITON_OK = True
except Exception as exc:  # noqa: BLE001
    TRITON_ERR = repr(exc)


def op_add_rmsnorm(x, r, w, out):
    """r += x; out = RMSNorm(r) * w (vLLM's fused_add_rms_norm)."""
    if USE_TRITON:
        n = x.shape[-1]
        _add_rmsnorm[(x.shape[0],)](x, r, w, out, n, EPS, BLOCK=triton.next_power_of_2(n))
    else:
        r.add_(x)
        out.copy_(F.rms_norm(r, (r.shape[-1],), w, EPS))


def op_rmsnorm(x, w, out):
    if USE_TRITON:
        n = x.shape[-1]
        _rmsnorm[(x.numel() // n,)](x, w, out, n, EPS, BLOCK=triton.next_power_of_2(n))
    else:
        out.copy_(F.rms_norm(x, (x.shape[-1],), w, EPS))


def op_silu_mul(x, out):
    d = out.shape[-1]
    if USE_TRITON:
        _silu_mul[(x.shape[0], triton.cdiv(d, 1024))](x, out, d, BLOCK=1024)
    else:
        out.copy_(F.silu(x[:, :d]) * x[:, d:])


def op_rotary(qkv, pos, cos, sin, m):
    """neox rotary in place on the q and k parts of qkv [T, (heads + 2 kv) * hd]."""
    hq, hkv, hd = m["heads"], m["kv"], m["hd"]
    if USE_TRITON:
        _rotary_qkv[(qkv.shape[0], hq + hkv)](qkv, pos, cos, sin, qkv.stride(0), HALF=hd // 2)
    else:
        t_ = qkv.shape[0]
        half = hd // 2
        c, s_ = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
        for t in (qkv[:, : hq * hd].view(t_, hq, hd), qkv[:, hq * hd : (hq + hkv) * hd].view(t_, hkv, hd)):
            x1, x2 = t[..., :half].float(), t[..., half:].float()
            t.copy_(torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1))


def op_kv_write(qkv, kc, vc, slots, m):
    """vLLM's reshape_and_cache: each token's K and V (views of qkv) to kc/vc [blocks, block_size, kv, hd] at
    slot = block * block_size + offset."""
    hq, hkv, hd = m["heads"], m["kv"], m["hd"]
    n = hkv * hd
    if USE_TRITON:
        _reshape_and_cache[(qkv.shape[0],)](
            qkv, kc, vc, slots, qkv.stride(0), hq * hd, (hq + hkv) * hd, n, BLOCK=triton.next_power_of_2(n)
        )
    else:
        kc.view(-1, n).index_copy_(0, slots, qkv[:, hq * hd : hq * hd + n])
        vc.view(-1, n).index_copy_(0, slots, qkv[:, hq * hd + n : hq * hd + 2 * n])


def op_sampler(logits):
    """vLLM v1's random sampling: fp32 logits, softmax, then argmax of p / q with q ~ Exp(1)."""
    p = logits.float().softmax(dim=-1)
    q = torch.empty_like(p).exponential_()
    return p.div_(q).argmax(dim=-1)


# ---- attention (torch SDPA), as profile_ops.py calls it ----
# Decode: flash backend, each KV head's query group packed as its queries. Prefill: the first mode that works,
# tried in order (profile_ops.py: the default backend with enable_gqa, else K/V heads repeated).
DECODE_MODES = ["flash", "default"]
PREFILL_MODES = ["default, enable_gqa", "flash, enable_gqa", "default, K/V heads repeated", "math, K/V heads repeated"]
MODE = {"decode": 0, "prefill": 0, "log": []}


def _backend_ctx(name):
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not CUDA:
        return sdpa_kernel([SDPBackend.MATH])
    if name == "flash":
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    if name == "math":
        return sdpa_kernel([SDPBackend.MATH])
    return nullcontext()


def sdpa_decode(q, k, v):
    while True:
        mode = DECODE_MODES[MODE["decode"]]
        try:
            with _backend_ctx(mode):
                return F.scaled_dot_product_attention(q, k, v)
        except Exception as exc:  # noqa: BLE001
            if MODE["decode"] + 1 >= len(DECODE_MODES) or (CUDA and torch.cuda.is_current_stream_capturing()):
                raise
            MODE["log"].append(f"decode {mode} failed: {exc!r}"[:300])
            MODE["decode"] += 1


def sdpa_prefill(q, k, v, bias):
    while True:
        mode = PREFILL_MODES[MODE["prefill"]]
        backend = mode.split(",")[0]
        try:
            with _backend_ctx(backend):
                if "enable_gqa" in mode:
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
                g = q.shape[1] // k.shape[1]
                return F.scaled_dot_product_attention(
                    q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), attn_mask=bias
                )
        except Exception as exc:  # noqa: BLE001
            if MODE["prefill"] + 1 >= len(PREFILL_MODES) or (CUDA and torch.cuda.is_current_stream_capturing()):
                raise
            MODE["log"].append(f"prefill {mode} failed: {exc!r}"[:300])
            MODE["prefill"] += 1


def op_attention(qkv, kc, vc, plan, m):
    """Raw SDPA outputs for the step's parts: decode [n, kv, group, hd]; prefill [1, heads, c, hd]."""
    hq, hkv, hd = m["heads"], m["kv"], m["hd"]
    g = hq // hkv
    outs = []
    for part in plan:
        r0 = part["row0"]
        if part["kind"] == "decode":
            n, ctx, s0 = part["n"], part["ctx"], part["slot0"]
            q = qkv[r0 : r0 + n, : hq * hd].view(n, hkv, g, hd)
            k = kc[s0 : s0 + n, :ctx].transpose(1, 2)
            v = vc[s0 : s0 + n, :ctx].transpose(1, 2)
            outs.append(sdpa_decode(q, k, v))
        else:
            c, total, s = part["n"], part["ctx"], part["slot0"]
            q = qkv[r0 : r0 + c, : hq * hd].view(c, hq, hd).transpose(0, 1).unsqueeze(0)
            k = kc[s, :total].transpose(0, 1).unsqueeze(0)
            v = vc[s, :total].transpose(0, 1).unsqueeze(0)
            outs.append(sdpa_prefill(q, k, v, part["bias"]))
    return outs


def attn_rows(o, part, m):
    """An SDPA output as [tokens, heads * hd] rows (a view where its memory allows)."""
    width = m["heads"] * m["hd"]
    if part["kind"] == "decode":
        return o.reshape(part["n"], width)
    return o[0].transpose(0, 1).reshape(part["n"], width)


def op_attn_merge(outs, plan, m):
    """SDPA's outputs as o_proj's input [T, heads * hd]: a view, a reshape copy, or a concatenation (mixed)."""
    rows = [attn_rows(o, p, m) for o, p in zip(outs, plan)]
    return rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)


# ---------------------------------------------------------------------------------------------------------------
class Model:
    """Random weights, created on the device directly (std 0.02; norms near 1)."""

    def __init__(self, m, dtype):
        self.m, self.dtype = m, dtype
        h, hq, hkv, hd, inter, v = m["hidden"], m["heads"], m["kv"], m["hd"], m["inter"], m["vocab"]

        def w(*shape, std=0.02, mean=0.0):
            return torch.empty(*shape, device=DEV, dtype=dtype).normal_(mean, std)

        self.emb = w(v, h)
        self.lm = w(v, h)
        self.ln1 = [w(h, std=0.05, mean=1.0) for _ in range(m["layers"])]
        self.ln2 = [w(h, std=0.05, mean=1.0) for _ in range(m["layers"])]
        self.lnf = w(h, std=0.05, mean=1.0)
        self.wqkv = [w((hq + 2 * hkv) * hd, h) for _ in range(m["layers"])]
        self.wo = [w(h, hq * hd) for _ in range(m["layers"])]
        self.wgu = [w(2 * inter, h) for _ in range(m["layers"])]
        self.wd = [w(h, inter) for _ in range(m["layers"])]
        maxpos = 32768
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, device=DEV, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(maxpos, device=DEV, dtype=torch.float32), inv)
        self.cos, self.sin = ang.cos().contiguous(), ang.sin().contiguous()


class KVPool:
    """Per-layer K and V storage, allocated once for the largest step and viewed per step shape."""

    def __init__(self, m, dtype, numel):
        self.m = m
        self.k = [torch.empty(numel, device=DEV, dtype=dtype) for _ in range(m["layers"])]
        self.v = [torch.empty(numel, device=DEV, dtype=dtype) for _ in range(m["layers"])]
        for t in self.k + self.v:
            t.normal_(0.0, 1.0)

    def views(self, blocks, block_size):
        m = self.m
        n = blocks * block_size * m["kv"] * m["hd"]
        shape = (blocks, block_size, m["kv"], m["hd"])
        return [t[:n].view(shape) for t in self.k], [t[:n].view(shape) for t in self.v]


class Step:
    """One step's static inputs: token ids, positions, slot mapping, logits indices, the attention plan."""

    def __init__(self, model, pool, n_dec, ctx, chunk, ids=None):
        from torch.nn.attention.bias import causal_lower_right

        m = model.m
        self.n_dec, self.ctx, self.chunk = n_dec, ctx, chunk
        self.T = n_dec + chunk
        self.n_seq = n_dec + (1 if chunk else 0)
        self.block_size = max(ctx if n_dec else 0, chunk)
        pos, slots, plan = [], [], []
        if n_dec:
            pos += [ctx - 1] * n_dec
            slots += [b * self.block_size + ctx - 1 for b in range(n_dec)]
            plan.append(dict(kind="decode", row0=0, n=n_dec, ctx=ctx, slot0=0))
        if chunk:
            pos += list(range(chunk))
            slots += [n_dec * self.block_size + p for p in range(chunk)]
            plan.append(dict(kind="prefill", row0=n_dec, n=chunk, ctx=chunk, slot0=n_dec,
                             bias=causal_lower_right(chunk, chunk)))  # fmt: skip
        self.plan = plan
        dev = DEV
        self.pos = torch.tensor(pos, device=dev, dtype=torch.long)
        self.slots = torch.tensor(slots, device=dev, dtype=torch.long)
        last = list(range(n_dec)) + ([self.T - 1] if chunk else [])
        self.logits_idx = torch.tensor(last, device=dev, dtype=torch.long)
        self.ids = ids if ids is not None else torch.randint(0, m["vocab"], (self.T,), device=dev)
        self.kc, self.vc = pool.views(self.n_seq, self.block_size)
        self.resid = torch.empty(self.T, m["hidden"], device=dev, dtype=model.dtype)


def forward_step(M: Model, S: Step):
    """The whole step, as vLLM's Llama runs it; returns (logits of each request's last token, sampled tokens)."""
    m = M.m
    T, h_ = S.T, m["hidden"]
    torch.index_select(M.emb, 0, S.ids, out=S.resid)  # the residual stream starts as the embeddings
    h = torch.empty(T, h_, device=S.resid.device, dtype=M.dtype)
    op_rmsnorm(S.resid, M.ln1[0], h)
    down = None
    for layer in range(m["layers"]):
        if layer > 0:
            op_add_rmsnorm(down, S.resid, M.ln1[layer], h)
        qkv = F.linear(h, M.wqkv[layer])
        op_rotary(qkv, S.pos, M.cos, M.sin, m)
        op_kv_write(qkv, S.kc[layer], S.vc[layer], S.slots, m)
        a = op_attn_merge(op_attention(qkv, S.kc[layer], S.vc[layer], S.plan, m), S.plan, m)
        o = F.linear(a, M.wo[layer])
        op_add_rmsnorm(o, S.resid, M.ln2[layer], h)
        gu = F.linear(h, M.wgu[layer])
        act = torch.empty(T, m["inter"], device=h.device, dtype=M.dtype)
        op_silu_mul(gu, act)
        down = F.linear(act, M.wd[layer])
    op_add_rmsnorm(down, S.resid, M.lnf, h)  # final norm (vLLM: norm(hidden, residual))
    sel = torch.index_select(h, 0, S.logits_idx)
    logits = F.linear(sel, M.lm)
    return logits, op_sampler(logits)


# ---------------------------------------------------------------------------------------------------------------
# Reference forward pass (self-check): full recompute in fp32, explicit causal attention, query head j on KV head
# j // group.
def reference(M: Model, seqs):
    """Last-token logits of each id sequence, and each layer's rotated K and V per sequence."""
    m = M.m
    hq, hkv, hd = m["heads"], m["kv"], m["hd"]
    g = hq // hkv
    f = lambda t: t.float()  # noqa: E731

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * f(w)

    def rope(t, pos):
        half = hd // 2
        c, s = M.cos[pos].unsqueeze(1), M.sin[pos].unsqueeze(1)
        return torch.cat((t[..., :half] * c - t[..., half:] * s, t[..., half:] * c + t[..., :half] * s), -1)

    logits, kvs = [], []
    for ids in seqs:
        n = ids.shape[0]
        pos = torch.arange(n, device=ids.device)
        x = f(M.emb[ids])
        per_layer = []
        for layer in range(m["layers"]):
            hs = rms(x, M.ln1[layer])
            qkv = hs @ f(M.wqkv[layer]).t()
            q = rope(qkv[:, : hq * hd].view(n, hq, hd), pos)
            k = rope(qkv[:, hq * hd : (hq + hkv) * hd].view(n, hkv, hd), pos)
            v = qkv[:, (hq + hkv) * hd :].view(n, hkv, hd)
            per_layer.append((k, v))
            kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            sc = torch.einsum("qhd,khd->hqk", q, kr) / math.sqrt(hd)
            mask = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
            sc = sc.masked_fill(~mask, float("-inf")).softmax(-1)
            att = torch.einsum("hqk,khd->qhd", sc, vr).reshape(n, hq * hd)
            x = x + att @ f(M.wo[layer]).t()
            gu = rms(x, M.ln2[layer]) @ f(M.wgu[layer]).t()
            d = m["inter"]
            x = x + (F.silu(gu[:, :d]) * gu[:, d:]) @ f(M.wd[layer]).t()
        logits.append(rms(x, M.lnf)[-1] @ f(M.lm).t())
        kvs.append(per_layer)
    return torch.stack(logits), kvs


def self_check(dtype) -> dict:
    """The step code on a tiny model against the reference: decode, prefill and mixed steps, eager and graphed."""
    torch.manual_seed(0)
    m = TINY
    M = Model(m, dtype)
    tol = 1e-3 if dtype == torch.float32 else 3e-2  # bf16: about 0.6% seen on the CPU
    res = {"dtype": str(dtype), "tolerance_rel": tol, "cases": {}, "ok": True}
    pool = KVPool(m, dtype, 8 * 64 * m["kv"] * m["hd"])
    for name, (n_dec, ctx, chunk) in {"decode": (3, 24, 0), "prefill": (0, 0, 20), "mixed": (3, 24, 20)}.items():
        try:
            seqs = [torch.randint(0, m["vocab"], (ctx,), device=DEV) for _ in range(n_dec)]
            if chunk:
                seqs.append(torch.randint(0, m["vocab"], (chunk,), device=DEV))
            ref, kvs = reference(M, seqs)
            ids = torch.cat([s[-1:] for s in seqs[:n_dec]] + ([seqs[-1]] if chunk else []))
            S = Step(M, pool, n_dec, ctx, chunk, ids=ids)
            for layer in range(m["layers"]):  # the decodes' history (not their new token) into the cache
                S.kc[layer].zero_()
                S.vc[layer].zero_()
                for b in range(n_dec):
                    k, v = kvs[b][layer]
                    S.kc[layer][b, : ctx - 1] = k[: ctx - 1].to(dtype)
                    S.vc[layer][b, : ctx - 1] = v[: ctx - 1].to(dtype)
            case = {}
            logits, tokens = forward_step(M, S)
            err = ((logits.float() - ref).abs().max() / ref.abs().max()).item()
            case["eager_rel_err"] = err
            ok = err < tol and tokens.shape == (S.n_seq,) and int(tokens.min()) >= 0 and int(tokens.max()) < m["vocab"]
            for b in range(n_dec):  # the step wrote the new token's K/V at its slot
                k, _ = kvs[b][0]
                kerr = ((S.kc[0][b, ctx - 1].float() - k[ctx - 1]).abs().max() / k.abs().max()).item()
                ok = ok and kerr < tol
                case["kv_write_rel_err"] = max(case.get("kv_write_rel_err", 0.0), kerr)
            if CUDA:
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    forward_step(M, S)
                torch.cuda.current_stream().wait_stream(s)
                with torch.cuda.graph(g):
                    glog, gtok = forward_step(M, S)
                S.resid.zero_()
                g.replay()
                torch.cuda.synchronize()
                gerr = ((glog.float() - ref).abs().max() / ref.abs().max()).item()
                case["graph_rel_err"] = gerr
                ok = ok and gerr < tol and gtok.shape == (S.n_seq,)
                del g
            case["ok"] = bool(ok)
            res["ok"] = res["ok"] and bool(ok)
            res["cases"][name] = case
        except Exception as exc:  # noqa: BLE001
            res["ok"] = False
            res["cases"][name] = {"ok": False, "error": repr(exc)[:400], "trace": traceback.format_exc()[-1200:]}
    return res


def check_triton(m, dtype) -> str:
    """The Triton ops against eager PyTorch at the model's widths; '' when they agree, else the reason."""
    global USE_TRITON
    if not TRITON_OK:
        return "triton unavailable: " + TRITON_ERR[:200]
    try:
        t = 64
        h, hq, hkv, hd = m["hidden"], m["heads"], m["kv"], m["hd"]
        rn = lambda *s: torch.randn(*s, device=DEV, dtype=dtype)  # noqa: E731
        x, r, w = rn(t, h), rn(t, h), rn(h) * 0.1 + 1
        xs = rn(t, 2 * m["inter"])
        qkv = rn(t, (hq + 2 * hkv) * hd)
        pos = torch.randint(0, 4096, (t,), device=DEV)
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, device=DEV, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(4096, device=DEV, dtype=torch.float32), inv)
        cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
        kc = torch.zeros(4, 32, hkv, hd, device=DEV, dtype=dtype)
        slots = torch.randperm(128, device=DEV)[:t]
        outs = {}
        for use in (True, False):
            USE_TRITON = use
            r_, q_, k_, v_ = r.clone(), qkv.clone(), kc.clone(), kc.clone()
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            a = torch.empty(t, m["inter"], device=DEV, dtype=dtype)
            op_add_rmsnorm(x, r_, w, o1)
            op_rmsnorm(x, w, o2)
            op_silu_mul(xs, a)
            op_rotary(q_, pos, cos, sin, m)
            op_kv_write(q_, k_, v_, slots, m)
            outs[use] = (r_, o1, o2, a, q_, k_, v_)
        USE_TRITON = False
        for a, b in zip(outs[True], outs[False]):
            if not torch.allclose(a.float(), b.float(), atol=3e-2, rtol=3e-2):
                return "triton ops differ from eager"
        return ""
    except Exception as exc:  # noqa: BLE001
        USE_TRITON = False
        return "triton failed: " + repr(exc)[:300]


# ---------------------------------------------------------------------------------------------------------------
def time_whole_step(M, S, replays):
    """Median (and min) GPU time of the whole step captured in one CUDA graph, replayed back to back."""
    if not CUDA:
        times = []
        for _ in range(max(3, min(replays, 5))):
            t = time.perf_counter()
            forward_step(M, S)
            times.append((time.perf_counter() - t) * 1e6)
        return statistics.median(times), min(times), len(times)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            forward_step(M, S)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward_step(M, S)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for e0, e1 in ev:
        e0.record()
        g.replay()
        e1.record()
    torch.cuda.synchronize()
    times = [e0.elapsed_time(e1) * 1000 for e0, e1 in ev]
    del g
    return statistics.median(times), min(times), replays


def time_ops(M, S, pool_views):
    """Each op of the step alone at this step's shapes: {op: (us per call, calls per step)}."""
    m = M.m
    L, T, n_seq = m["layers"], S.T, S.n_seq
    h, hq, hkv, hd, inter, vocab = m["hidden"], m["heads"], m["kv"], m["hd"], m["inter"], m["vocab"]
    width_qkv = (hq + 2 * hkv) * hd
    dt = M.dtype
    BIG = 10**6  # calls pick their own copy: i % layers for weights and caches, i % k for inputs

    def rn(*shape):
        return torch.empty(*shape, device=DEV, dtype=dt).normal_(0.0, 1.0)

    res = {}
    kcs, vcs = pool_views
    # embedding
    k = copies_for(T * h * 2 * 2)
    ids = [torch.randint(0, vocab, (T,), device=DEV) for _ in range(k)]
    outs = [torch.empty(T, h, device=DEV, dtype=dt) for _ in range(k)]
    res["embedding"] = (gpu_time_us(lambda i: torch.index_select(M.emb, 0, ids[i % k], out=outs[i % k]), BIG), 1)
    # norms
    k = copies_for(T * h * 2 * 3)
    xs, rs = [rn(T, h) for _ in range(k)], [rn(T, h) for _ in range(k)]
    outs = [torch.empty(T, h, device=DEV, dtype=dt) for _ in range(k)]
    res["rmsnorm_layer0"] = (gpu_time_us(lambda i: op_rmsnorm(xs[i % k], M.ln1[i % L], outs[i % k]), BIG), 1)
    res["add_rmsnorm"] = (
        gpu_time_us(lambda i: op_add_rmsnorm(xs[i % k], rs[i % k], M.ln2[i % L], outs[i % k]), BIG),
        2 * L,
    )
    # linear layers: weights cycled over the layers' own
    for name, ws, in_f in (("qkv_proj", M.wqkv, h), ("o_proj", M.wo, hq * hd), ("gate_up_proj", M.wgu, h),
                           ("down_proj", M.wd, inter)):  # fmt: skip
        k = min(4, copies_for(T * in_f * 2))
        xin = [rn(T, in_f) for _ in range(k)]
        res[name] = (gpu_time_us(lambda i, xin=xin, ws=ws, k=k: F.linear(xin[i % k], ws[i % L]), BIG), L)
        del xin
    # act_fn
    k = copies_for(T * inter * 2 * 3)
    gus = [rn(T, 2 * inter) for _ in range(k)]
    acts = [torch.empty(T, inter, device=DEV, dtype=dt) for _ in range(k)]
    res["act_fn"] = (gpu_time_us(lambda i: op_silu_mul(gus[i % k], acts[i % k]), BIG), L)
    # rotary, the KV-cache write, attention: on qkv copies; caches cycled over the layers' own
    k = copies_for(T * width_qkv * 2 * 2)
    qkvs = [rn(T, width_qkv) for _ in range(k)]
    res["rotary_emb"] = (gpu_time_us(lambda i: op_rotary(qkvs[i % k], S.pos, M.cos, M.sin, m), BIG), L)
    res["kv_write"] = (gpu_time_us(lambda i: op_kv_write(qkvs[i % k], kcs[i % L], vcs[i % L], S.slots, m), BIG), L)
    res["attention"] = (gpu_time_us(lambda i: op_attention(qkvs[i % k], kcs[i % L], vcs[i % L], S.plan, m), BIG), L)
    # SDPA's output into o_proj's layout: a copy only where it is not a view
    sample = op_attention(qkvs[0], kcs[0], vcs[0], S.plan, m)
    merged = op_attn_merge(sample, S.plan, m)
    is_view = len(sample) == 1 and merged.data_ptr() == sample[0].data_ptr()
    if is_view:
        res["attn_out_copy"] = (0.0, L)
    else:
        kk = copies_for(T * hq * hd * 2 * 2)
        sets = [[torch.empty_strided(o.size(), o.stride(), device=DEV, dtype=o.dtype).normal_() for o in sample]
                for _ in range(kk)]  # fmt: skip
        res["attn_out_copy"] = (gpu_time_us(lambda i: op_attn_merge(sets[i % kk], S.plan, m), BIG), L)
        del sets
    # the last-token gather, lm_head, sampler
    k = copies_for(T * h * 2)
    fin = [rn(T, h) for _ in range(k)]
    res["logits_select"] = (gpu_time_us(lambda i: torch.index_select(fin[i % k], 0, S.logits_idx), BIG), 1)
    xs_ = [rn(n_seq, h) for _ in range(4)]
    res["lm_head"] = (gpu_time_us(lambda i: F.linear(xs_[i % 4], M.lm), BIG), 1)
    k = copies_for(n_seq * vocab * (2 + 4 + 4), cap=8)
    lg = [rn(n_seq, vocab) for _ in range(k)]
    res["sampler"] = (gpu_time_us(lambda i: op_sampler(lg[i % k]), BIG), 1)
    return res, is_view


COMPOSED = ["embedding", "rmsnorm_layer0", "add_rmsnorm", "qkv_proj", "rotary_emb", "attention", "o_proj",
            "gate_up_proj", "act_fn", "down_proj", "lm_head", "sampler"]  # fmt: skip


def attention_backend_note(S, m):
    """Which SDPA backend PyTorch would pick for the prefill part (decode forces flash): best effort."""
    notes = {"decode": DECODE_MODES[MODE["decode"]], "prefill": PREFILL_MODES[MODE["prefill"]]}
    if not CUDA:
        return notes
    try:
        names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
        for part in S.plan:
            if part["kind"] != "prefill":
                continue
            hq, hkv, hd, c = m["heads"], m["kv"], m["hd"], part["n"]
            qkv = torch.empty(c, (hq + 2 * hkv) * hd, device=DEV, dtype=torch.bfloat16)  # the step's q layout
            q = qkv[:, : hq * hd].view(c, hq, hd).transpose(0, 1).unsqueeze(0)
            k = S.kc[0][part["slot0"], :c].transpose(0, 1).unsqueeze(0)
            choice = torch._fused_sdp_choice(q, k, k, is_causal=True, enable_gqa=True)
            notes["prefill_default_backend"] = names.get(int(choice), str(choice))
    except Exception as exc:  # noqa: BLE001
        notes["prefill_default_backend"] = "unknown: " + repr(exc)[:120]
    return notes


def gpu_env() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "triton": getattr(sys.modules.get("triton"), "__version__", None)}  # fmt: skip
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), sm_count=p.multi_processor_count,
                   memory_gib=round(p.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version())  # fmt: skip
    env["nvidia_smi"] = nvidia_smi()
    return env


def nvidia_smi() -> str:
    """Clocks and the like from nvidia-smi, where it answers (a shorter query if the long one is refused)."""
    out = ""
    for q in ("name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,"
              "temperature.gpu", "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem"):  # fmt: skip
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)  # fmt: skip
            if r.returncode == 0:
                return q + " = " + r.stdout.strip()
            out = f"nvidia-smi rc {r.returncode}: {(r.stdout + r.stderr).strip()[:160]}"
        except Exception as exc:  # noqa: BLE001
            return "nvidia-smi: " + repr(exc)[:120]
    return out


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


CSV_HEADER = ["step_kind", "B", "C", "chunk_tokens", "tokens", "whole_step_us", "composed_us", "kv_write_us",
              "composed_with_kv_write_us", "ratio_whole_over_composed", "ratio_whole_over_composed_with_kv_write",
              "attn_out_copy_us", "logits_select_us", "unexplained_us", "whole_step_min_us", "replays",
              "eager_op_points", "error"]  # fmt: skip


def main(argv=None):
    global CUDA, DEV, USE_TRITON
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".", help="folder for whole_step.csv, ops.csv, whole_step.json")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer hidden-256 model (the CPU check of the code)")
    ap.add_argument("--quick", action="store_true", help="four step shapes only")
    ap.add_argument("--replays", type=int, default=30, help="timed replays of each whole-step graph")
    ap.add_argument("--deadline-s", type=float, default=300.0, help="skip what is left after this many seconds")
    ap.add_argument("--no-triton", action="store_true", help="eager PyTorch small ops even on a GPU")
    ap.add_argument("--no-self-check", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    CUDA = args.device == "cuda"
    DEV = args.device
    if CUDA and not torch.cuda.is_available():
        print("no CUDA GPU visible to torch", torch.__version__, "; use --device cpu --tiny", flush=True)
        return 2
    if not CUDA and not args.tiny:
        print("on the CPU only --tiny runs (the 8B model would take hours)", flush=True)
        return 2
    os.makedirs(args.out, exist_ok=True)
    dtype = torch.bfloat16 if CUDA else torch.float32
    m = TINY if args.tiny else LLAMA_8B
    meta = {"model": ("tiny " if args.tiny else "Llama-3.1-8B-shaped ") + json.dumps(m), "dtype": str(dtype),
            "device": DEV, "argv": sys.argv[1:], "replays_whole_step": args.replays,
            "kv_cache": "dense per request in vLLM's layout [blocks, block_size, kv_heads, head_dim], one block "
                        "per request, K and V apart per layer; written by slot mapping (reshape_and_cache)",
            "method_ops": "profile_ops.py: CUDA graph of R calls (3-40, ~2 ms), median of 3 replays / R; weights "
                          "cycled over the layers' own, small inputs over copies > 256 MB",
            "env": gpu_env(), "seconds": {}, "errors": [], "skipped": []}  # fmt: skip
    log("env", meta["env"])

    def dump():
        meta["seconds"]["total"] = round(time.monotonic() - t_start, 1)
        with open(os.path.join(args.out, "whole_step.json"), "w") as f:
            json.dump(meta, f, indent=1, default=str)

    # Triton small ops, checked against eager PyTorch at the model's widths.
    t0 = time.monotonic()
    # On the CPU, TRITON_INTERPRET=1 runs the Triton kernels in Triton's interpreter (a check of their logic).
    try_triton = not args.no_triton and (CUDA or os.environ.get("TRITON_INTERPRET") == "1")
    if try_triton:
        why = check_triton(m, dtype)
        USE_TRITON = why == ""
        meta["small_ops"] = "triton fused kernels" if USE_TRITON else f"eager PyTorch ({why})"
    else:
        USE_TRITON = False
        meta["small_ops"] = "eager PyTorch (" + ("--no-triton" if CUDA else "CPU") + ")"
    log("small ops:", meta["small_ops"])
    if not args.no_self_check:
        big_triton = USE_TRITON
        if USE_TRITON:  # the tiny widths compile their own Triton variants; check those too
            why = check_triton(TINY, dtype)
            USE_TRITON = why == ""
            meta["self_check_small_ops"] = "triton" if USE_TRITON else f"eager PyTorch (tiny widths: {why})"
        try:
            meta["self_check"] = self_check(dtype)
        except Exception as exc:  # noqa: BLE001
            meta["self_check"] = {"ok": False, "error": repr(exc)[:400], "trace": traceback.format_exc()[-1200:]}
        log("self-check", "OK" if meta["self_check"]["ok"] else "FAILED", json.dumps(meta["self_check"])[:600])
        USE_TRITON = big_triton
    meta["seconds"]["checks"] = round(time.monotonic() - t0, 1)
    dump()

    # The model and the KV pool for the largest step that fits the budget.
    t0 = time.monotonic()
    shapes = []
    for kind, n_dec, ctx, chunk in step_shapes(args.tiny, args.quick):
        need = kv_bytes(m, n_dec, ctx, chunk)
        if need > KV_BUDGET_BYTES:
            meta["skipped"].append(f"{kind} B={n_dec} C={ctx} chunk={chunk}: KV cache {need / 1e9:.1f} GB > 100 GB")
            continue
        shapes.append((kind, n_dec, ctx, chunk))
    for s in meta["skipped"]:
        log("skip", s)
    torch.manual_seed(1)
    try:
        M = Model(m, dtype)
        max_numel = max(kv_bytes(m, *s[1:], elem=1) // (2 * m["layers"]) for s in shapes)
        pool = KVPool(m, dtype, max_numel)
        if CUDA:
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        meta["errors"].append("model/KV allocation: " + repr(exc)[:400])
        log("FAILED to build the model or KV pool:", repr(exc)[:400])
        dump()
        return 1
    meta["seconds"]["model_and_kv_init"] = round(time.monotonic() - t0, 1)
    meta["kv_pool_gib"] = round(2 * m["layers"] * max_numel * (2 if CUDA else 4) / 2**30, 2)
    log(f"model ready, KV pool {meta['kv_pool_gib']} GiB, {len(shapes)} step shapes")
    dump()

    rows, op_rows, per_shape = [], [], {}
    for kind, n_dec, ctx, chunk in shapes:
        key = f"{kind} B={n_dec} C={ctx} chunk={chunk}"
        left = args.deadline_s - (time.monotonic() - t_start)
        if left < 20:
            meta["skipped"].append(f"{key}: deadline ({args.deadline_s:.0f} s)")
            log("skip (deadline)", key)
            continue
        t0 = time.monotonic()
        info = {}
        row = dict(step_kind=kind, B=n_dec, C=ctx, chunk_tokens=chunk, tokens=n_dec + chunk, error="")
        EAGER_POINTS.clear()
        S = None
        try:
            S = Step(M, pool, n_dec, ctx, chunk)
            saved_mode = MODE["prefill"]
            for attempt in range(len(PREFILL_MODES)):
                try:
                    whole, whole_min, nrep = time_whole_step(M, S, args.replays)
                    break
                except Exception as exc:  # noqa: BLE001  (a prefill capture that failed: the next attention mode)
                    if CUDA:
                        torch.cuda.synchronize()
                    info[f"whole_attempt_{attempt}"] = repr(exc)[:300]
                    # never to the math backend this way (only an eager failure of all the others leads there)
                    if not chunk or MODE["prefill"] + 2 >= len(PREFILL_MODES):
                        MODE["prefill"] = saved_mode  # the next shapes start from where this one did
                        raise
                    MODE["prefill"] += 1
                    MODE["log"].append(f"prefill mode -> {PREFILL_MODES[MODE['prefill']]} after: {exc!r}"[:300])
            row.update(whole_step_us=whole, whole_step_min_us=whole_min, replays=nrep)
            info["seconds_whole"] = round(time.monotonic() - t0, 1)
            log(f"{key}: whole step {whole:.1f} us (median of {nrep} replays); timing its ops alone")
            info["attention"] = attention_backend_note(S, m)
            t1 = time.monotonic()
            ops, is_view = time_ops(M, S, (S.kc, S.vc))
            info["seconds_ops"] = round(time.monotonic() - t1, 1)
            info["attn_out_is_view"] = is_view
            composed = sum(us * n for name, (us, n) in ops.items() if name in COMPOSED)
            kvw = ops["kv_write"][0] * ops["kv_write"][1]
            copy = ops["attn_out_copy"][0] * ops["attn_out_copy"][1]
            sel = ops["logits_select"][0]
            row.update(whole_step_us=whole, composed_us=composed, kv_write_us=kvw,
                       composed_with_kv_write_us=composed + kvw, ratio_whole_over_composed=whole / composed,
                       ratio_whole_over_composed_with_kv_write=whole / (composed + kvw), attn_out_copy_us=copy,
                       logits_select_us=sel, unexplained_us=whole - composed - kvw - copy - sel)  # fmt: skip
            for name, (us, n) in ops.items():
                op_rows.append(
                    [kind, n_dec, ctx, chunk, name, n, us, us * n, "composed" if name in COMPOSED else "apart"]
                )
            log(f"{key}: whole {whole:.1f} us, composed {composed:.1f} us, kv_write {kvw:.1f} us, "
                f"ratio {whole / composed:.4f} ({time.monotonic() - t0:.1f} s)")  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (record, skip, go on)
            row["error"] = repr(exc)[:300]
            info["trace"] = traceback.format_exc()[-1500:]
            meta["errors"].append(f"{key}: {exc!r}"[:400])
            log(f"{key}: FAILED {exc!r}"[:400])
            try:
                if CUDA:
                    torch.cuda.synchronize()
            except Exception as exc2:  # noqa: BLE001
                meta["errors"].append(f"after {key}: device unusable: {exc2!r}"[:300])
        row["eager_op_points"] = len(EAGER_POINTS)
        if EAGER_POINTS:
            info["eager_reasons"] = sorted(set(EAGER_POINTS))[:3]
        info["seconds"] = round(time.monotonic() - t0, 1)
        per_shape[key] = info
        rows.append(row)
        del S
        if CUDA:
            try:
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001
                pass
        write_outputs(args.out, rows, op_rows)
        meta["per_shape"] = per_shape
        dump()

    meta["attention_modes"] = {"decode": DECODE_MODES[MODE["decode"]], "prefill": PREFILL_MODES[MODE["prefill"]],
                               "log": MODE["log"]}  # fmt: skip
    meta["env"]["nvidia_smi_end"] = nvidia_smi()
    write_outputs(args.out, rows, op_rows)
    dump()
    print_table(rows)
    log(f"done in {meta['seconds']['total']} s; {len(meta['errors'])} errors; {len(meta['skipped'])} skipped;"
        f" files in {os.path.abspath(args.out)}")  # fmt: skip
    return 0


def write_outputs(out, rows, op_rows):
    with open(os.path.join(out, "whole_step.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_HEADER)
        for r in rows:
            w.writerow([fmt(r.get(c, "")) for c in CSV_HEADER])
    with open(os.path.join(out, "ops.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step_kind", "B", "C", "chunk_tokens", "op", "calls_per_step", "us_per_call", "us_per_step",
                    "in"])  # fmt: skip
        for r in op_rows:
            w.writerow([fmt(x) for x in r])


def fmt(x):
    if isinstance(x, float):
        return f"{x:.4f}" if abs(x) < 100 else f"{x:.2f}"
    return x


def print_table(rows):
    print(f"\n{'step':8} {'B':>4} {'C':>5} {'chunk':>5} {'whole us':>10} {'composed':>10} {'kv_write':>9} "
          f"{'copies':>8} {'unexpl.':>9} {'whole/comp':>10} {'w/(c+kv)':>9}", flush=True)  # fmt: skip
    for r in rows:
        if r.get("error"):
            print(f"{r['step_kind']:8} {r['B']:>4} {r['C']:>5} {r['chunk_tokens']:>5}  ERROR {r['error'][:80]}")
            continue
        print(f"{r['step_kind']:8} {r['B']:>4} {r['C']:>5} {r['chunk_tokens']:>5} {r['whole_step_us']:>10.1f} "
              f"{r['composed_us']:>10.1f} {r['kv_write_us']:>9.1f} "
              f"{r['attn_out_copy_us'] + r['logits_select_us']:>8.1f} {r['unexplained_us']:>9.1f} "
              f"{r['ratio_whole_over_composed']:>10.4f} {r['ratio_whole_over_composed_with_kv_write']:>9.4f}")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
