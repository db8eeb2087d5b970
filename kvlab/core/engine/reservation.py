"""A reservation pool: the vLLM paper's Orca baselines, a KV-cache manager of their own.

A request reserves its slots once, on admission, from a pool of (num_gpu_blocks - 1) x block_size token slots
(the same KV memory as the paged pool's usable blocks), and never needs more, so it is never preempted. max asks for max_model_len slots, pow2
its prompt plus the next power of two of its output (the paper's §6.1: an output of 25 tokens reserves 32;
at most max_model_len), oracle exactly its final length. The paper's Orca places reservations with the buddy
allocation algorithm, and so does kvlab (kvlab.core.buddy): the chunk is the next power of two of what is
asked, and a request whose chunk is not free waits even when enough slots are free in all (external
fragmentation).
"""

from __future__ import annotations

import numpy as np

from kvlab.core.allocator import pow2_reservation
from kvlab.core.buddy import BuddyAllocator, chunk_order
from kvlab.core.engine.request import Request


class ReservationManager:
    """A token pool from which a request reserves a buddy chunk on admission (max, pow2 or oracle); never preempts."""

    enable_caching = False
    noop_decodes = True  # (the scheduler's shortcut; a reservation holds every slot a decode writes)

    def __init__(self, allocation: str, num_gpu_blocks: int, block_size: int, max_model_len: int, recorder=None):
        self.allocation = allocation
        self.recorder = recorder if recorder is not None and recorder.freed_tables is not None else None
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_tokens_total = (num_gpu_blocks - 1) * block_size
        self.buddy = BuddyAllocator(self.num_tokens_total)
        self.offsets: dict[int, int] = {}  # request_id -> offset of its chunk
        self.num_final_tokens = 0  # final lengths of the requests holding a chunk

    @property
    def num_free_tokens(self) -> int:
        """Free token slots, in chunks of any size."""
        return self.buddy.num_free_slots

    @property
    def num_held(self) -> int:
        """What the requests hold, as the step records count it: token slots in their chunks."""
        return self.num_tokens_total - self.buddy.num_free_slots

    def reservation_tokens(self, request: Request) -> int:
        """Slots the request asks for: max_model_len (max), kvlab.core.allocator.pow2_reservation (pow2), or its
        final length (oracle). The buddy allocator rounds the chunk up to a power of two."""
        if self.allocation == "max":
            return self.max_model_len
        if self.allocation == "pow2":
            return pow2_reservation(request.num_prompt_tokens, request.max_num_tokens, self.max_model_len)
        return request.max_num_tokens

    def reservation_tokens_of(self, prompt_tokens: np.ndarray, final_tokens: np.ndarray) -> np.ndarray:
        """reservation_tokens for arrays of prompts and final lengths (tokens), one a request."""
        if self.allocation == "max":
            return np.full(len(final_tokens), self.max_model_len, dtype=np.int64)
        if self.allocation == "pow2":
            return pow2_reservation(prompt_tokens, final_tokens, self.max_model_len)
        return np.asarray(final_tokens, dtype=np.int64)

    def can_reserve(self, request: Request) -> bool:
        """Whether a chunk for the request's reservation is free now."""
        return self.buddy.can_allocate(self.reservation_tokens(request))

    def can_admit(self, request: Request, num_new_tokens: int, hit_blocks=()) -> bool:
        """Whether allocate_slots would admit the request: a chunk for its reservation is free (a running request's
        decodes take nothing from a reservation pool)."""
        return self.can_reserve(request)

    def record_split(self, steps, head: Request | None) -> None:
        """Add the vLLM paper's Fig. 2 counts of the last step to steps (a StepLog): final tokens, the buddy's
        rounding and external fragmentation against head (the waiting queue's head, or None when nothing waits)."""
        steps.add_split(self.num_final_tokens, self.buddy.num_rounding_slots, self.external_fragmentation(head))

    def external_fragmentation(self, head: Request | None) -> int:
        """Free slots in chunks too small for the waiting queue's head's reservation (0 when nothing waits)."""
        return self.buddy.free_slots_below(self.reservation_tokens(head)) if head is not None else 0

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """No prefix cache: no hit."""
        return [], 0

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hit_blocks=(), full_sequence_must_fit: bool = False
    ) -> bool:
        """Reserve the request's chunk on admission (False if no free chunk is large enough, however many slots
        are free in all: external fragmentation); later steps need nothing."""
        if request.reserved_tokens:
            return True
        need = self.reservation_tokens(request)
        offset = self.buddy.allocate(need)
        if offset is None:
            return False
        self.offsets[request.request_id] = offset
        request.reserved_tokens = 1 << chunk_order(need)
        self.num_final_tokens += request.max_num_tokens
        return True

    def free(self, request: Request) -> int:
        """Give back the request's chunk (none held: nothing); the slots it held."""
        if self.recorder is not None:
            self.recorder.freed(request)
        if not request.reserved_tokens:
            return 0
        request.reserved_tokens = 0
        self.num_final_tokens -= request.max_num_tokens
        return self.buddy.free(self.offsets.pop(request.request_id))
