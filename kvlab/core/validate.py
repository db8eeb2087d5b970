"""Parameter checks that fail with one line naming the parameter, its value and what is allowed.

Every numeric input of kvlab has a documented sane range (RANGES): values outside it are an error, not
float noise in a result (an arrival rate of 1e-300 requests/s is a typo, not a workload).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterable

# quantity -> (lowest, highest, unit): the sane range of every kind of numeric input.
RANGES = {
    "arrival_rate": (1e-3, 1e6, "requests/s"),
    "ms_per_token": (1e-3, 1e5, "ms"),
    "step_ms": (0.0, 1e5, "ms"),
    "memory_gib": (1e-3, 1e5, "GiB"),
    "mib_per_token": (1e-3, 1e5, "MiB"),
    "tokens": (1, 10**8, "tokens"),
    "block_size": (1, 2**20, "tokens"),
    "num_requests": (1, 10**10, "requests"),
    "num_seeds": (1, 10**5, "seeds"),
    "seed": (0, 2**63 - 1, ""),
    "seconds": (1e-3, 1e7, "s"),
    "cv": (0.0, 10.0, ""),
    "max_num_seqs": (1, 10**6, "requests"),
    "count": (1, 10**9, ""),
}


def fail(name: str, value, allowed: str) -> None:
    """Raise the project's one-line ValueError for a bad parameter."""
    raise ValueError(f"{name}={value!r} is not allowed: {allowed}")


def positive_int(name: str, value) -> int:
    """Return value as an int if it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        fail(name, value, "must be an integer >= 1")
    return int(value)


def non_negative_int(name: str, value) -> int:
    """Return value as an int if it is an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        fail(name, value, "must be an integer >= 0")
    return int(value)


def _finite_real(name: str, value, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        fail(name, value, allowed)
    return float(value)


def positive_number(name: str, value) -> float:
    """Return value as a float if it is a finite number > 0."""
    x = _finite_real(name, value, "must be a finite number > 0")
    if x <= 0:
        fail(name, value, "must be a finite number > 0")
    return x


def non_negative_number(name: str, value) -> float:
    """Return value as a float if it is a finite number >= 0."""
    x = _finite_real(name, value, "must be a finite number >= 0")
    if x < 0:
        fail(name, value, "must be a finite number >= 0")
    return x


def fraction(name: str, value, *, low_open: bool = True) -> float:
    """Return value as a float if it lies in (0, 1] (or [0, 1] when low_open is False)."""
    allowed = "must be a number in (0, 1]" if low_open else "must be a number in [0, 1]"
    x = _finite_real(name, value, allowed)
    if x > 1 or x < 0 or (low_open and x == 0):
        fail(name, value, allowed)
    return x


def _shown(x) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def in_range(name: str, value, quantity: str):
    """value if it is a number in the sane range of quantity (RANGES), as an int for integer quantities."""
    low, high, unit = RANGES[quantity]
    integer = isinstance(low, int) and isinstance(high, int)
    unit = f" {unit}" if unit else ""
    allowed = f"must be {'an integer' if integer else 'a number'} from {_shown(low)} to {_shown(high)}{unit}"
    given = value
    if integer:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            fail(name, given, allowed)
        value = int(value)
    else:
        value = _finite_real(name, value, allowed)
    if not low <= value <= high:
        fail(name, given, allowed)
    return value


def close_matches(value, choices: Iterable) -> list[str]:
    """Up to three choices that look like value (case-insensitive), best first."""
    names = [str(c) for c in choices]
    lowered = {n.lower(): n for n in names}
    text = str(value).lower()
    found = [lowered[n] for n in lowered if text and (text in n or n in text)]
    found += [lowered[n] for n in difflib.get_close_matches(text, list(lowered), n=3, cutoff=0.5)]
    return list(dict.fromkeys(found))[:3]


def one_of(name: str, value, choices: Iterable) -> object:
    """Return value if it is one of choices; otherwise the error lists them and suggests close matches."""
    choices = list(choices)
    if value not in choices:
        allowed = "must be one of " + ", ".join(map(str, choices))
        near = close_matches(value, choices) if isinstance(value, str) else []
        if near:
            allowed += "; did you mean " + " or ".join(near) + "?"
        fail(name, value, allowed)
    return value


def non_empty(name: str, values) -> list:
    """Return values as a list if it has at least one element."""
    values = list(values)
    if not values:
        fail(name, values, "must not be empty")
    return values
