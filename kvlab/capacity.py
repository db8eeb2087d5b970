"""KV-cache capacity: bytes per token, memory per request, and how many requests fit."""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

import pandas as pd

from kvlab import validate

UNIT_BYTES = {"GiB": 2**30, "GB": 10**9, "MiB": 2**20, "MB": 10**6}


def unit_bytes(unit: str) -> int:
    """Bytes in one unit (GiB = 2^30, GB = 10^9, MiB, MB)."""
    validate.one_of("unit", unit, UNIT_BYTES)
    return UNIT_BYTES[unit]


def _exact(x: float | int) -> int | float:
    """An integral float as int (so byte counts print without '.0')."""
    return int(x) if float(x).is_integer() else x


@dataclass(frozen=True)
class KVShape:
    """The per-token KV footprint of a decoder: layers x KV heads x head dim x bytes per value."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: float = 2

    def __post_init__(self):
        validate.positive_int("num_layers", self.num_layers)
        validate.positive_int("num_kv_heads", self.num_kv_heads)
        validate.positive_int("head_dim", self.head_dim)
        validate.positive_number("dtype_bytes", self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int | float:
        """Bytes of K and V for one token over all layers (the factor 2 is K plus V)."""
        return _exact(2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes)


ARTICLE_SHAPE = KVShape(num_layers=32, num_kv_heads=32, head_dim=128, dtype_bytes=2)


def bytes_per_request(shape: KVShape, context_tokens: int) -> int | float:
    """KV bytes one request holds at a context length of context_tokens (bytes)."""
    context_tokens = validate.positive_int("context_tokens", context_tokens)
    return _exact(shape.kv_bytes_per_token * context_tokens)


def free_bytes(gpu_memory: float, weights: float, unit: str = "GiB") -> Fraction:
    """Memory left for the KV cache once the weights are loaded (bytes, exact)."""
    validate.positive_number("gpu_memory", gpu_memory)
    validate.non_negative_number("weights", weights)
    if weights >= gpu_memory:
        validate.fail("weights", weights, f"must be below the GPU memory ({gpu_memory:g} {unit})")
    return (Fraction(gpu_memory) - Fraction(weights)) * unit_bytes(unit)


def max_num_requests(free: Fraction | float, request_bytes: float) -> int:
    """Requests of request_bytes each that fit in free bytes: floor(free / request_bytes)."""
    validate.non_negative_number("free_bytes", float(free))
    validate.positive_number("bytes_per_request", request_bytes)
    return math.floor(Fraction(free) / Fraction(request_bytes))


def memory_table(
    shape: KVShape, contexts: Iterable[int], concurrency: Iterable[int], unit: str = "GiB"
) -> pd.DataFrame:
    """KV memory (in unit) for each context length, for one request and for each concurrency level."""
    contexts = validate.non_empty("contexts", contexts)
    concurrency = [validate.positive_int("concurrency", c) for c in validate.non_empty("concurrency", concurrency)]
    scale = unit_bytes(unit)
    rows = {}
    for ctx in contexts:
        per = bytes_per_request(shape, ctx)
        rows[ctx] = {f"per_request_{unit.lower()}": per / scale}
        rows[ctx].update({f"{n}_requests_{unit.lower()}": n * per / scale for n in concurrency})
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "context_tokens"
    return table


def fit_table(
    shape: KVShape, gpu_memory: float, weights: float, contexts: Iterable[int], unit: str = "GiB"
) -> pd.DataFrame:
    """Requests that fit in gpu_memory less weights (both in unit), for each context length."""
    contexts = validate.non_empty("contexts", contexts)
    free = free_bytes(gpu_memory, weights, unit)
    table = pd.DataFrame(
        {"max_num_requests": [max_num_requests(free, bytes_per_request(shape, c)) for c in contexts]},
        index=pd.Index(contexts, name="context_tokens"),
    )
    return table


def capacity(
    shape: KVShape, gpu_memory: float, weights: float, context_tokens: int, unit: str = "GiB"
) -> dict:
    """Headline capacity figures for one context length, as plain numbers (bytes and counts)."""
    free = free_bytes(gpu_memory, weights, unit)
    per = bytes_per_request(shape, context_tokens)
    return {
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "bytes_per_request": per,
        "free_bytes": _exact(float(free)),
        "max_num_requests": max_num_requests(free, per),
    }
