"""What a step cost reads of a step's batch: its tokens and the attention work they do."""

from __future__ import annotations

from typing import NamedTuple


class Batch(NamedTuple):
    """A step's batch as a step cost sees it (the engine's SchedulerOutput.batch). Tokens are counts;
    context_tokens sums, over the scheduled requests, the tokens each attends (computed + new); the decodes are the
    requests computing one last token; prefill_attention_pairs sums, over the other requests' chunks of n new tokens
    after c computed ones, the causal query-key pairs n x c + n (n + 1) / 2 (0 with num_prefills 0: a cost that
    needs them then takes the prefill tokens as one chunk); min_ and max_decode_context_tokens are the least and
    the most context of one decode (0 and 0: not given, the decodes taken as equal)."""

    num_scheduled_tokens: int
    context_tokens: int = 0
    num_decodes: int = 0
    decode_context_tokens: int = 0
    num_prefills: int = 0
    prefill_attention_pairs: int = 0
    min_decode_context_tokens: int = 0
    max_decode_context_tokens: int = 0
