"""A request as vLLM's v1 scheduler sees it: its tokens, how many are computed, its status and its blocks.

Token contents matter only for prefix caching, where a full block is known by a chain of content hashes
(block_hashes.py, kvlab's token contents for vLLM's hash_request_tokens).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import numpy as np

WAITING, RUNNING, PREEMPTED, FINISHED = "waiting", "running", "preempted", "finished"


@dataclass(slots=True, eq=False)
class Request:
    """One request: prompt, output so far, computed tokens, status, preemptions and its block table."""

    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int  # output tokens it asks for
    max_request_tokens: InitVar[int]  # check_stop's max_model_len (+ 1 for vLLM 0.1.4, which stops once past it)
    prompt_token_ids: np.ndarray | None = None  # content for prefix caching, or None
    prompt_block_ids: np.ndarray | None = None  # or: ids of prompt blocks (e.g. Mooncake's hash ids)
    prompt_block_tokens: int = 0  # tokens per prompt_block_ids entry
    max_num_tokens: int = field(init=False)  # min(prompt + max_tokens, max_request_tokens)
    num_tokens: int = field(init=False)  # prompt + tokens sampled so far
    num_computed_tokens: int = 0  # tokens whose KV is computed or scheduled
    status: str = WAITING
    num_preemptions: int = 0
    block_ids: list[int] = field(default_factory=list)  # its block table in the first KV cache group (paged)
    shared_prefix_boundary: int = 0  # a longer prefix than its hit one group found cached on admission (0: none)
    reserved_tokens: int = 0  # token slots reserved (reservation allocation)
    first_scheduled_s: float | None = None  # start of the first step that scheduled it
    first_token_s: float | None = None  # end of the step that sampled its first token
    block_hash_cache: list[bytes] = field(default_factory=list)  # block_hashes.block_hashes' chain so far
    # Asynchronous scheduling only (vLLM's AsyncScheduler); always 0 in the synchronous engine.
    num_output_placeholders: int = 0  # tokens being sampled in a batch still in flight
    num_in_flight_tokens: int = 0  # tokens scheduled in batches still in flight
    num_stale_tokens: int = 0  # of those, scheduled before its last preemption

    def __post_init__(self, max_request_tokens: int) -> None:
        self.max_num_tokens = min(self.num_prompt_tokens + self.max_tokens, max_request_tokens)
        self.num_tokens = self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        """Tokens sampled so far (kept across preemptions)."""
        return self.num_tokens - self.num_prompt_tokens
