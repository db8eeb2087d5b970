"""A request as vLLM's v1 scheduler sees it: its tokens, how many are computed, its status and its blocks.

Token contents matter only for prefix caching, where a full block is known by a chain of content hashes
(vllm/v1/core/kv_cache_utils.py, hash_request_tokens). kvlab hashes the same contents: the prompt's
token ids when the workload gives them (equal prompts share blocks), otherwise a prompt no other request
shares; every generated token is unique to its request (as in scripts/parity/vllm_scheduler.py, whose
model samples token 20,000,000 + request id), so a block holding a generated token is only ever hit by
its own request after a preemption.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

WAITING, RUNNING, PREEMPTED, FINISHED = "waiting", "running", "preempted", "finished"


class Request:
    """One request: prompt, output so far, computed tokens, status, preemptions and its block table."""

    __slots__ = (
        "request_id",
        "arrival_s",
        "num_prompt_tokens",
        "max_tokens",
        "max_num_tokens",
        "num_tokens",
        "num_computed_tokens",
        "status",
        "num_preemptions",
        "block_ids",
        "num_cached_blocks",
        "reserved_tokens",
        "first_scheduled_s",
        "first_token_s",
        "prompt_token_ids",
        "prompt_block_ids",
        "prompt_block_tokens",
        "_block_hashes",
        "num_output_placeholders",
        "num_in_flight_tokens",
        "num_stale_tokens",
    )

    def __init__(
        self,
        request_id: int,
        arrival_s: float,
        num_prompt_tokens: int,
        max_tokens: int,
        max_request_tokens: int,
        prompt_token_ids: np.ndarray | None = None,
        prompt_block_ids: np.ndarray | None = None,
        prompt_block_tokens: int = 0,
    ):
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens  # output tokens it asks for
        # vLLM's check_stop: finished once num_output_tokens >= max_tokens or num_tokens >= max_model_len (the
        # scheduler's max_request_tokens: max_model_len + 1 for vLLM 0.1.4, which stops once past it).
        self.max_num_tokens = min(num_prompt_tokens + max_tokens, max_request_tokens)
        self.num_tokens = num_prompt_tokens  # prompt + tokens sampled so far
        self.num_computed_tokens = 0  # tokens whose KV is computed or scheduled
        self.status = WAITING
        self.num_preemptions = 0
        self.block_ids: list[int] = []  # the block table (paged allocation)
        self.num_cached_blocks = 0  # leading blocks of the table in the prefix cache
        self.reserved_tokens = 0  # token slots reserved (reservation allocation)
        self.first_scheduled_s: float | None = None  # start of the first step that scheduled it
        self.first_token_s: float | None = None  # end of the step that sampled its first token
        self.prompt_token_ids = prompt_token_ids  # content for prefix caching, or None
        self.prompt_block_ids = prompt_block_ids  # or: ids of prompt blocks (e.g. Mooncake's hash ids)
        self.prompt_block_tokens = prompt_block_tokens  # tokens per prompt_block_ids entry
        self._block_hashes: list[bytes] = []
        # Asynchronous scheduling only (vLLM's AsyncScheduler); always 0 in the synchronous engine.
        self.num_output_placeholders = 0  # tokens being sampled in a batch still in flight
        self.num_in_flight_tokens = 0  # tokens scheduled in batches still in flight
        self.num_stale_tokens = 0  # of those, scheduled before its last preemption

    @property
    def num_output_tokens(self) -> int:
        """Tokens sampled so far (kept across preemptions)."""
        return self.num_tokens - self.num_prompt_tokens

    def block_hashes(self, num_blocks: int, block_size: int) -> list[bytes]:
        """The content hashes of the first num_blocks full blocks of known tokens (computed once, chained)."""
        hashes = self._block_hashes
        while len(hashes) < num_blocks:
            j = len(hashes)
            parent = hashes[-1] if hashes else b""
            hashes.append(hashlib.blake2b(parent + self._block_content(j, block_size), digest_size=16).digest())
        return hashes

    def _block_content(self, j: int, block_size: int) -> bytes:
        """Bytes that tell block j's tokens apart (given its parent): prompt part, then an output marker."""
        start, end = j * block_size, (j + 1) * block_size
        prompt_end = min(end, self.num_prompt_tokens)
        if start >= prompt_end:
            prompt = b""
        elif self.prompt_token_ids is not None:
            prompt = self.prompt_token_ids[start:prompt_end].tobytes()
        elif self.prompt_block_ids is not None:
            size = self.prompt_block_tokens
            first, last = start // size, (prompt_end - 1) // size
            prompt = struct.pack(f"<qq{last - first + 1}q", start, prompt_end, *self.prompt_block_ids[first : last + 1])
        else:
            prompt = struct.pack("<qq", -1, self.request_id)  # a prompt no other request has
        content = struct.pack("<q", prompt_end - start) + prompt
        if end > self.num_prompt_tokens:
            content += struct.pack("<q", -2 - self.request_id)  # generated tokens: this request's own
        return content
