#!/usr/bin/env python3
"""Regenerate tests/data/vllm_scheduler_cases.json by running every scenario below
through vLLM's real scheduler (scripts/parity/vllm_scheduler.py, --block-ids).

    .venv-vllm/bin/python scripts/parity/make_scheduler_cases.py

tests/test_engine.py holds kvlab's engine to these outputs without needing vLLM. The semantics
are those of vLLM 0.33's v1 scheduler (vllm/v1/core/sched/scheduler.py).

Each case: its IN document, what it demonstrates (with a hand check), and vLLM's actual
OUT (requests + steps), or the error vLLM's replay stops with.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "vllm_scheduler.py")
PYTHON = sys.executable


def cfg(**kw):
    base = {
        "num_gpu_blocks": 64,
        "block_size": 4,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "max_model_len": 256,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "enable_prefix_caching": False,
        "async_scheduling": False,
    }
    base.update(kw)
    return base


CONST10 = {"kind": "constant", "step_ms": 10.0}


def req(t, p, o, ids=None):
    r = {"arrival_s": t, "prompt_tokens": p, "output_tokens": o}
    if ids is not None:
        r["prompt_token_ids"] = ids
    return r


SHARED = list(range(1000, 1012))  # a 12-token prompt (3 blocks of 4)

CASES = [
    (
        "ample_memory",
        cfg(block_size=16),
        CONST10,
        [req(0.0, 20, 3), req(0.0, 40, 2)],
        "Two requests, plenty of blocks and budget. Step 0 schedules both whole prompts "
        "(20+40=60 <= 64) in arrival order and samples their first tokens; then one decode "
        "token each per step. Blocks (16 tokens each): req0 cdiv(20,16)=2, req1 cdiv(40,16)=3; "
        "req1 finishes at 0.02 (2 tokens), req0 at 0.03. num_blocks_in_use is read after the "
        "step's update, so finished requests' blocks are already free.",
    ),
    (
        "chunked_prefill_split",
        cfg(max_num_batched_tokens=32, max_num_seqs=4),
        CONST10,
        [req(0.0, 100, 2), req(0.0, 10, 3)],
        "Chunked prefill with a 32-token budget. Step 0: req0 gets min(100,32)=32, the budget "
        "is gone so req1 is not even looked at. Steps 1-2: req0 (running, first) gets 32, 32. "
        "Step 3: req0 gets its last 4 (prefill done, samples), req1 is admitted with 10 "
        "(budget 28 left). A partial chunk samples nothing: req0's first token is at the end "
        "of step 3.",
    ),
    (
        "chunked_prefill_off",
        cfg(enable_chunked_prefill=False, max_num_batched_tokens=64, max_model_len=64),
        CONST10,
        [req(0.0, 40, 3), req(0.0, 30, 2), req(0.0, 10, 2)],
        "enable_chunked_prefill=False: a waiting request is admitted only if its whole "
        "remaining prompt fits the remaining budget, otherwise the waiting scan STOPS (FCFS, "
        "no skipping). Step 0: req0 (40) admitted, budget 24 left; req1 (30) does not fit -> "
        "break, so req2 (10) is not admitted although it would fit. Step 1: req0 decode (1) + "
        "req1 (30) + req2 (10).",
    ),
    (
        "chunked_off_with_threshold",
        cfg(enable_chunked_prefill=False, max_model_len=64, long_prefill_token_threshold=16),
        CONST10,
        [req(0.0, 40, 3), req(0.0, 30, 2), req(0.0, 10, 2)],
        "Surprise: with chunked prefill OFF but long_prefill_token_threshold=16, prompts are "
        "still split into 16-token chunks (the threshold cap is applied before the "
        "chunked-prefill check, and the running loop never looks at enable_chunked_prefill). "
        "Step 0: 16+16+10. Step 1: req0 16, req1 14 (rest), req2 decode 1. Step 2: req0 8.",
    ),
    (
        "max_num_seqs",
        cfg(max_num_seqs=2),
        CONST10,
        [req(0.0, 8, 2), req(0.0, 8, 4), req(0.0, 8, 2), req(0.005, 4, 1)],
        "max_num_seqs=2 caps len(running): step 0 admits req0 and req1 only. req0 finishes at "
        "the end of step 1, so step 2 admits req2 (FCFS); req3 (arrived at 0.005) waits until "
        "req1 finishes at the end of step 3. A request with output_tokens=1 finishes in its "
        "prefill step.",
    ),
    (
        "long_prefill_threshold",
        cfg(long_prefill_token_threshold=8),
        CONST10,
        [req(0.0, 30, 3), req(0.015, 20, 2)],
        "long_prefill_token_threshold=8 caps a prefill chunk at 8 tokens, but ONLY when more "
        "than one request is running or waiting at the start of schedule(). Step 0: req0 alone "
        "-> whole 30-token prompt. Step 2 (req1 arrived at 0.015): req0 decode 1, req1 capped "
        "to 8. Step 3: req0 has finished, req1 alone -> rest 12 at once.",
    ),
    (
        "preempt_self",
        cfg(num_gpu_blocks=9, max_model_len=64),
        CONST10,
        [req(0.0, 6, 8), req(0.0, 6, 8), req(0.0, 5, 8), req(0.0, 3, 2)],
        "8 usable blocks of 4 (num_gpu_blocks=9 includes the null block). Step 0: 2+2+2+1=7 "
        "blocks. req3 finishes at 0.02 (frees block 7). Step 3: req0 and req1 cross into their "
        "3rd block (7 and 8, free queue now empty). Step 4: req2 (9 tokens) needs a 3rd block, "
        "none free -> preempt running[-1] = req2 itself: freed, num_computed_tokens=0, put at "
        "the FRONT of waiting, num_preemptions=1; nothing else is admitted in that step. Its "
        "blocks [5,6] are freed in reverse and prepended: free queue = [6,5]. req0/req1 take 6 "
        "and 5 at step 7. Resume only when the WHOLE current length (5 prompt + 4 output = 9 "
        "tokens = 3 blocks) fits: at 0.08 after req0/req1 finish; it recomputes all 9 tokens "
        "in one step and samples its 5th token.",
    ),
    (
        "preempt_other_no_admission",
        cfg(num_gpu_blocks=5, max_model_len=64),
        CONST10,
        [req(0.0, 8, 3), req(0.0, 6, 4), req(0.005, 2, 2)],
        "4 usable blocks. Step 0: req0 (8 tok, 2 blocks) + req1 (6 tok, 2 blocks) = 4, 0 free. "
        "Step 1: req0 decodes token 8 -> needs a 3rd block -> preempts running[-1]=req1 "
        "(freed, to the front of waiting ahead of req2). req0 gets req1's last block (LIFO). "
        "Although a block is still free, req2 (arrived at 0.005, needs 1 block) is NOT "
        "admitted: no waiting request is admitted in a step that preempted. Step 2: head of "
        "waiting is req1 needing cdiv(7,4)=2 blocks with 1 free -> scan stops, req2 waits "
        "behind it (head-of-line). Step 3 (req0 finished): req1 recomputes 7 tokens, req2 "
        "admitted.",
    ),
    (
        "prefix_cache_hits",
        cfg(num_gpu_blocks=12, max_model_len=64, enable_prefix_caching=True),
        CONST10,
        [
            req(0.0, 12, 3, SHARED),
            req(0.05, 12, 2, SHARED),
            req(0.05, 14, 2, SHARED + [7, 8]),
            req(0.1, 10, 2, SHARED[:10]),
        ],
        "Prefix caching, block size 4; only FULL blocks are hashed. req0 computes blocks "
        "[1,2,3] for the 12-token prompt. req1 has the same 12 tokens: a hit may cover at "
        "most num_tokens-1 = 11 tokens, rounded down to whole blocks -> 8 tokens (blocks 1,2); "
        "it recomputes a whole block (4 tokens), not just the last token. req2 (14 tokens) "
        "hits all 3 blocks (12 <= 13) and computes 2. req3 (first 10 tokens) hits 2 blocks, "
        "computes 2. Freed hashed blocks go to the TAIL of the free queue, unhashed ones to "
        "the FRONT (see block_ids: req3 gets block 5).",
    ),
    (
        "prefix_cache_same_step_hit",
        cfg(num_gpu_blocks=20, max_model_len=64, enable_prefix_caching=True),
        CONST10,
        [req(0.0, 12, 2, SHARED), req(0.0, 12, 2, SHARED)],
        "Two identical prompts arriving together. vLLM registers a block in the prefix cache "
        "when it is ALLOCATED for a chunk that fills it (inside schedule(), before the model "
        "has computed it), so req1, admitted in the same step right after req0, already hits "
        "req0's blocks 1 and 2 (8 tokens; 11 is the cap) and schedules only 4 tokens.",
    ),
    (
        "prefix_cache_resume_hits_own_blocks",
        cfg(num_gpu_blocks=5, max_model_len=64, enable_prefix_caching=True),
        CONST10,
        [req(0.0, 8, 3), req(0.0, 6, 4), req(0.005, 2, 2)],
        "Same workload as preempt_other_no_admission, with prefix caching. When req1 is "
        "preempted its full block (tokens 0-3, hashed) goes to the tail of the free queue and "
        "stays cached; its partial block goes to the front and is reused by req0 at once. "
        "When req1 resumes it hits its own cached block: num_computed_tokens=4 on admission and "
        "it computes only tokens 4-6 (3 tokens) instead of all 7.",
    ),
    (
        "arrivals_busy_and_idle_gap",
        cfg(block_size=16),
        {"kind": "linear", "step_ms": 5.0, "step_ms_per_token": 0.1},
        [req(0.0, 50, 3), req(0.004, 30, 2), req(0.0101, 10, 1), req(0.5, 20, 2)],
        "Linear cost: duration = (5 + 0.1 * tokens) ms. Step 0 [0, 0.010]: req0's 50 tokens. "
        "req1 arrived at 0.004 during step 0: added before step 1 at 0.010. req2 (0.0101) "
        "misses step 1 by 0.1 ms and joins step 2. After everything finishes the engine is "
        "idle and the clock jumps to req3's arrival at 0.5.",
    ),
    (
        "max_model_len_cap",
        cfg(max_model_len=16),
        CONST10,
        [req(0.0, 10, 20)],
        "prompt + output exceeds max_model_len=16: vLLM stops the request with finish reason "
        "'length' as soon as prompt + generated tokens reach 16, i.e. after 6 output tokens "
        "(num_output_tokens=6 < output_tokens=20).",
    ),
    (
        "no_progress_never_fits",
        cfg(num_gpu_blocks=5, max_model_len=64),
        CONST10,
        [req(0.0, 6, 3), req(0.0, 20, 2), req(1.0, 2, 2)],
        "req1 needs 5 blocks for its prompt; only 4 are usable. req0 runs and finishes; then "
        "nothing is running and the head of waiting can never be admitted; req2 (arriving "
        "later) would queue behind it: vLLM waits forever. The replay stops with an error.",
    ),
    (
        "preempt_two_victims_one_step",
        cfg(num_gpu_blocks=9, max_num_batched_tokens=16, max_model_len=64, long_prefill_token_threshold=8),
        CONST10,
        [req(0.0, 30, 2), req(0.0, 2, 6), req(0.0, 2, 6)],
        "8 usable blocks; the 8-token prefill cap lets all three start in step 0 (req0's "
        "admission gate checks its whole 30-token prompt, 8 blocks, against the 8 free "
        "blocks, but only its first chunk is allocated). Step 3: req0's last chunk (6 tokens) "
        "needs 2 more blocks, none free -> preempt running[-1]=req2 (1 block, still short), "
        "then req1: two victims in one step, and the waiting queue becomes [req1, req2] "
        "(original admission order). req0 gets block 3 (req1's, freed last, so at the head) "
        "then 4. Both resume at 0.05 after req0 finishes, recomputing 2 prompt + 3 output "
        "tokens each.",
    ),
    # Asynchronous scheduling (vLLM's AsyncScheduler behind step_with_batch_queue, batch queue of 2).
    (
        "async_idle_engine_as_sync",
        cfg(async_scheduling=True),
        CONST10,
        [req(0.0, 8, 3)],
        "One request, async. S0 (scheduled at 0, runs 0-10 ms): the 8-token prompt, 2 blocks, samples "
        "(a placeholder). S1 is scheduled at once, still at 0: num_tokens 8 + 1 placeholder - 8 computed = 1 "
        "token, position 8 needs a 3rd block, taken now (a step before the synchronous engine takes it); S1 "
        "runs 10-20. The queue is full: wait for S0 (clock 10), first token at 10. S2 at 10 runs 20-30. Wait "
        "for S1 (clock 20). S3 at 20: computed 10 + 2 - 1 placeholder >= 8 + 3, the early stop: nothing to "
        "schedule, an empty batch. Wait for S2 (clock 30): the third token finishes it at 30. An idle engine "
        "gives the synchronous times (10, 30 ms), with one block held a step earlier.",
    ),
    (
        "async_arrival_a_step_later",
        cfg(async_scheduling=True),
        CONST10,
        [req(0.0, 8, 4), req(0.005, 6, 2)],
        "req1 arrives at 5 ms while S0 (0-10) and S1 (10-20, scheduled at 0) are queued. The engine waits "
        "for S0 (clock 10); req1 joins; S2 is scheduled at 10 with req0's decode and req1's prompt, and runs "
        "20-30: req1's first-scheduled time is 10 (the schedule() call), its first token 30, a step later "
        "than synchronous scheduling (20).",
    ),
    (
        "async_preempt_with_a_token_in_flight",
        cfg(num_gpu_blocks=5, max_model_len=64, async_scheduling=True),
        CONST10,
        [req(0.0, 4, 8), req(0.0, 4, 8)],
        "4 usable blocks of 4. Both prompts (1 block each) in S0; S1 (scheduled at 0) takes a second block "
        "each for position 4. When req0 needs a block for position 8 none is free: req1, the last admitted, "
        "is preempted while its decode batch is still in flight. That batch's token still arrives and is "
        "appended to req1 (vLLM's stale output), so req1 resumes later recomputing its prompt and every token "
        "sampled, that one included.",
    ),
    (
        "async_prefix_caching",
        cfg(num_gpu_blocks=12, enable_prefix_caching=True, async_scheduling=True),
        CONST10,
        [req(0.0, 12, 6, SHARED), req(0.03, 13, 2, SHARED + [7])],
        "Prefix caching with async scheduling: req0's full blocks are cached as their tokens settle "
        "(update_from_output caches num_computed - in-flight tokens); req1, arriving later, hits req0's "
        "prompt blocks (its last block is always computed).",
    ),
]


def run_case(name, config, cost, requests):
    doc = {"config": config, "cost": cost, "requests": requests}
    with tempfile.TemporaryDirectory() as tmp:
        inp, outp = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(inp, "w") as f:
            json.dump(doc, f)
        proc = subprocess.run([PYTHON, SCRIPT, "--block-ids", inp, outp], capture_output=True, text=True)
        if proc.returncode == 0:
            with open(outp) as f:
                out = json.load(f)
            return doc, {"requests": out["requests"], "steps": out["steps"]}, None, out
        return doc, None, {"exit_status": proc.returncode, "message": proc.stderr.strip()}, None


def main():
    cases = []
    version = None
    for name, config, cost, requests, description in CASES:
        doc, out, error, full = run_case(name, config, cost, requests)
        if full:
            version = full["vllm_version"]
        case = {"name": name, "description": description, "in": doc}
        if out is not None:
            case["out"] = out
        else:
            case["error"] = error
        cases.append(case)
        print(name, "error" if error else f"{len(out['steps'])} steps", file=sys.stderr)
    result = {
        "about": "Small scheduling scenarios replayed through vLLM's real v1 Scheduler by "
        "scripts/parity/vllm_scheduler.py --block-ids (regenerate with "
        "make_vllm_scheduler_cases.py). Semantics: vllm_scheduler_spec.md. "
        "request_id = index in in.requests; steps[].scheduled = [request_id, "
        "tokens] in vLLM's scheduling order; block_ids = each scheduled request's "
        "block table right after schedule(); num_running/num_waiting are read "
        "after schedule(), num_blocks_in_use after update_from_output(). Times are "
        "float64 sums (clock = start + duration) and may carry rounding noise "
        "such as 0.060000000000000005: compare with a tolerance or replicate the "
        "same additions.",
        "vllm_version": version,
        "cases": cases,
    }
    path = os.path.join(ROOT, "tests", "data", "vllm_scheduler_cases.json")
    with open(path, "w") as f:
        f.write(_dump(result))
    print("wrote", path, file=sys.stderr)


def _dump(result):
    """Indented JSON, but each request/step record on one line."""
    compact = lambda x: json.dumps(x, separators=(",", ":"))  # noqa: E731
    lines = ["{"]
    lines.append(f' "about": {json.dumps(result["about"])},')
    lines.append(f' "vllm_version": {json.dumps(result["vllm_version"])},')
    lines.append(' "cases": [')
    for ci, case in enumerate(result["cases"]):
        lines.append("  {")
        lines.append(f'   "name": {json.dumps(case["name"])},')
        lines.append(f'   "description": {json.dumps(case["description"])},')
        inp = case["in"]
        lines.append('   "in": {')
        lines.append(f'    "config": {compact(inp["config"])},')
        lines.append(f'    "cost": {compact(inp["cost"])},')
        lines.append('    "requests": [')
        lines.append(",\n".join("     " + compact(r) for r in inp["requests"]))
        lines.append("    ]")
        if "out" in case:
            lines.append("   },")
            lines.append('   "out": {')
            lines.append('    "requests": [')
            lines.append(",\n".join("     " + compact(r) for r in case["out"]["requests"]))
            lines.append("    ],")
            lines.append('    "steps": [')
            lines.append(",\n".join("     " + compact(s) for s in case["out"]["steps"]))
            lines.append("    ]")
            lines.append("   }")
        else:
            lines.append("   },")
            lines.append(f'   "error": {compact(case["error"])}')
        lines.append("  }" + ("," if ci < len(result["cases"]) - 1 else ""))
    lines.append(" ]")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == result
    return text


if __name__ == "__main__":
    main()
