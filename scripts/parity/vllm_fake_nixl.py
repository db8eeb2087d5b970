"""A KV connector for make parity's vLLM side: NIXL's pull connector's scheduler side as kvlab models it
(kvlab/core/engine/kv_connector.py), its transfers timed by the workload instead of a network.

Each request has a role (0: none; 1: producer, vLLM's do_remote_decode; 2: consumer, do_remote_prefill), a consumer a
load_s and a producer a hold_s. A consumer not yet set up matches every prompt token past its local hit, loaded
asynchronously (NixlConnectorScheduler.get_num_new_matched_tokens); its load starts at the clock of the schedule()
that allocated its blocks (update_state_after_alloc) and ends load_s later. A producer that finishes holding blocks
delays their free (request_finished), until hold_s after its finish. The replay (vllm_scheduler.py) reports the
transfers that ended by a step's end in that step's output (KVConnectorOutput), in the order they ended.
"""

from __future__ import annotations

import heapq
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
from vllm.v1.request import RequestStatus

CONSUMER, PRODUCER = 2, 1


class FakeNixlConnector(KVConnectorBase_V1):
    """The scheduler side; the worker side's calls do nothing (no worker runs)."""

    # set by the replay before the scheduler is built (one replay per process)
    roles: dict[str, tuple[int, float, float]] = {}  # request id -> (role, load_s, hold_s)
    clock = None  # the replay: its clock_s is the schedule()'s, or the step's end in update_from_output

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.processed: set[str] = set()
        self.events: list = []  # heap of (end_s, sequence, "recv" | "send", request id)
        self.sequence = 0  # events in the order they were set up (ties at one end_s)

    # -- the scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        role = self.roles.get(request.request_id, (0, 0.0, 0.0))[0]
        if role == CONSUMER and request.request_id not in self.processed:
            count = len(request.prompt_token_ids) - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        rid = request.request_id
        role, load_s, _ = self.roles.get(rid, (0, 0.0, 0.0))
        if role == CONSUMER and rid not in self.processed:
            self.processed.add(rid)
            if num_external_tokens > 0:
                self._add(self.clock.clock_s + load_s, "recv", rid)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        role, _, hold_s = self.roles.get(request.request_id, (0, 0.0, 0.0))
        if role != PRODUCER or request.status not in (
            RequestStatus.FINISHED_LENGTH_CAPPED,
            RequestStatus.FINISHED_STOPPED,
        ):
            return False, None
        if not block_ids:
            return False, None
        self._add(self.clock.clock_s + hold_s, "send", request.request_id)
        return True, None

    def _add(self, end_s: float, kind: str, rid: str) -> None:
        heapq.heappush(self.events, (end_s, self.sequence, kind, rid))
        self.sequence += 1

    # -- what the replay reads
    def next_event_s(self) -> float:
        return self.events[0][0] if self.events else float("inf")

    def finished_by(self, now_s: float) -> tuple[list, list]:
        recving, sending = [], []
        while self.events and self.events[0][0] <= now_s:
            _, _, kind, rid = heapq.heappop(self.events)
            (recving if kind == "recv" else sending).append(rid)
        return recving, sending

    # -- the worker side (no worker runs)
    def start_load_kv(self, forward_context, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self) -> None:
        pass
