"""The content hashes of a request's full blocks, for prefix caching: kvlab's token contents under vLLM's chain.

vLLM knows a full block by a chain of content hashes (vllm/v1/core/kv_cache_utils.py, hash_request_tokens): a
block's hash covers its parent's hash and its own tokens. kvlab hashes the same contents: the prompt's token ids
when the workload gives them (equal prompts share blocks), or its prompt block ids (Mooncake's hash ids), otherwise
a prompt no other request shares; every generated token is unique to its request (as in
scripts/parity/vllm_scheduler.py, whose model samples token 20,000,000 + request id), so a block holding a
generated token is only ever hit by its own request after a preemption.
"""

from __future__ import annotations

import hashlib
import struct

from kvlab.core.engine.request import Request


def block_hashes(request: Request, num_blocks: int, block_size: int) -> list[bytes]:
    """The content hashes of the request's first num_blocks full blocks of known tokens (computed once, chained)."""
    hashes = request.block_hash_cache
    while len(hashes) < num_blocks:
        parent = hashes[-1] if hashes else b""
        content = block_content(request, len(hashes), block_size)
        hashes.append(hashlib.blake2b(parent + content, digest_size=16).digest())
    return hashes


def block_content(request: Request, j: int, block_size: int) -> bytes:
    """Bytes that tell block j's tokens apart (given its parent): prompt part, then an output marker."""
    start, end = j * block_size, (j + 1) * block_size
    num_prompt_tokens = request.num_prompt_tokens
    prompt_end = min(end, num_prompt_tokens)
    if start >= prompt_end:
        prompt = b""
    elif request.prompt_token_ids is not None:
        prompt = request.prompt_token_ids[start:prompt_end].tobytes()
    elif request.prompt_block_ids is not None:
        size = request.prompt_block_tokens
        first, last = start // size, (prompt_end - 1) // size
        prompt = struct.pack(f"<qq{last - first + 1}q", start, prompt_end, *request.prompt_block_ids[first : last + 1])
    else:
        prompt = struct.pack("<qq", -1, request.request_id)  # a prompt no other request has
    content = struct.pack("<q", prompt_end - start) + prompt
    if end > num_prompt_tokens:
        content += struct.pack("<q", -2 - request.request_id)  # generated tokens: this request's own
    return content
