"""A straightforward per-step reference loop of section 2's model: the oracle for kvlab.core.batching.

Every running request produces its output one token at a time (one decode step of ms_per_token);
the clock moves to the next token or arrival. Slow on purpose and written for plain reading: the
tests hold the event-driven simulator to it, and the benchmark measures the speed-up over it.
"""

from __future__ import annotations

import numpy as np


def simulate_stepwise(arrival_s, output_tokens, policy: str, max_num_seqs: int, ms_per_token: float) -> dict:
    """Start and release time (s) of every request, decode step by decode step."""
    step_s = ms_per_token / 1000.0
    arrival = [float(a) for a in arrival_s]
    tokens = [int(t) for t in output_tokens]
    n = len(arrival)
    start, finish = [np.nan] * n, [np.nan] * n
    # per slot: the request it holds (None: free), its tokens still to produce, when its next token is done
    request, left, next_token_s = [None] * max_num_seqs, [0] * max_num_seqs, [0.0] * max_num_seqs
    waiting_from = 0  # requests before this one have started (first come, first served)
    num_finished = 0
    clock = arrival[0]
    while num_finished < n:
        # 1. every running request whose next token is due now produces it
        for s in range(max_num_seqs):
            if request[s] is not None and left[s] > 0 and next_token_s[s] == clock:
                left[s] -= 1
                next_token_s[s] = clock + step_s
        # 2. release: continuous frees a slot when its request is done; static when the whole batch is
        held = [s for s in range(max_num_seqs) if request[s] is not None]
        if policy == "continuous":
            done = [s for s in held if left[s] == 0]
        else:
            done = held if held and all(left[s] == 0 for s in held) else []
        for s in done:
            finish[request[s]] = clock
            request[s] = None
            num_finished += 1
        # 3. admit arrived requests in order into free slots (static: only when no batch is running)
        may_admit = policy == "continuous" or all(r is None for r in request)
        if may_admit:
            for s in range(max_num_seqs):
                if request[s] is None and waiting_from < n and arrival[waiting_from] <= clock:
                    request[s], left[s], next_token_s[s] = waiting_from, tokens[waiting_from], clock + step_s
                    start[waiting_from] = clock
                    waiting_from += 1
        # 4. advance the clock to the next token, or to the next arrival if it could start then
        upcoming = [next_token_s[s] for s in range(max_num_seqs) if request[s] is not None and left[s] > 0]
        has_free_slot = any(r is None for r in request)
        batch_over = all(r is None for r in request)
        if waiting_from < n and (batch_over if policy == "static" else has_free_slot):
            upcoming.append(arrival[waiting_from])
        if upcoming:
            clock = min(upcoming)
    return {"start_s": np.array(start), "finish_s": np.array(finish)}
