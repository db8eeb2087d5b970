"""vLLM's data-parallel load balancing: which engine core (rank) of --data-parallel-size N a request is sent to.

vLLM 0.33 serves N ranks behind one API server (DPLBAsyncMPClient, vllm/v1/engine/core_client.py). For each new
request its get_core_engine_for_request scans the ranks from a start index that moves on by one after every choice
(so that equal scores do not always favour the same rank) and takes the first rank of least score:

    score = max(client_count x in_flight, waiting + running) + waiting x 6 x max(0, kv_cache_usage - 0.5)

in_flight counts the requests this client sent to the rank and has not seen finish (exact, kept by the client);
waiting, running and kv_cache_usage are the rank's figures in the coordinator's last snapshot (sent every 100 ms
while they change, vllm/v1/engine/coordinator.py), whose waiting count the client raises by client_count for each
request it sends meanwhile. RankChooser keeps the same state and makes the same choices (make parity runs vLLM's
own method on the same statistics); an engine of N ranks feeds it the snapshots and the finishes.
"""

from __future__ import annotations

import sys

from kvlab.core import validate

# vLLM's DPCoordinator publishes the ranks' load at most this often (min_stats_update_interval_ms).
STATS_UPDATE_INTERVAL_S = 0.1


class RankChooser:
    """vLLM 0.33's DPLBAsyncMPClient rank choice for num_ranks ranks, as client client_index of client_count API
    servers."""

    def __init__(self, num_ranks: int, client_count: int = 1, client_index: int = 0):
        validate.positive_int("data_parallel_size", num_ranks)
        validate.positive_int("client_count", client_count)
        if not 0 <= client_index < client_count:
            validate.fail("client_index", client_index, f"must be 0 to {client_count - 1}")
        self.num_ranks, self.client_count = num_ranks, client_count
        self.counts: list[list] = [[0, 0, 0.0] for _ in range(num_ranks)]  # per rank: waiting, running, KV usage
        self.in_flight = [0] * num_ranks
        self.start = num_ranks * client_index // client_count

    def choose(self) -> int:
        """The rank of a new request (and the client's bookkeeping of sending it there)."""
        best, rank, n = sys.maxsize, 0, self.num_ranks
        for i in range(n):
            idx = (self.start + i) % n
            waiting, running, usage = self.counts[idx]
            score = max(self.client_count * self.in_flight[idx], waiting + running)
            if waiting:
                score += waiting * 6.0 * max(0.0, usage - 0.5)
            if score < best:
                best, rank = score, idx
        self.counts[rank][0] += self.client_count
        self.start = (self.start + 1) % n
        self.in_flight[rank] += 1
        return rank

    def finished(self, rank: int) -> None:
        """A request sent to rank finished (the client saw it in that rank's outputs)."""
        self.in_flight[rank] -= 1

    def snapshot(self, counts) -> None:
        """The coordinator's latest load of every rank: (waiting, running, kv_cache_usage) each."""
        if len(counts) != self.num_ranks:
            validate.fail("counts", len(counts), f"must give each of the {self.num_ranks} ranks")
        self.counts = [[int(w), int(r), float(u)] for w, r, u in counts]
