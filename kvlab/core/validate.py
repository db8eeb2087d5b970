"""Parameter checks that fail with one line naming the parameter, its value and what is allowed."""
from __future__ import annotations

import math
import numbers
from typing import Iterable


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


def one_of(name: str, value, choices: Iterable) -> object:
    """Return value if it is one of choices."""
    choices = list(choices)
    if value not in choices:
        fail(name, value, "must be one of " + ", ".join(map(str, choices)))
    return value


def non_empty(name: str, values) -> list:
    """Return values as a list if it has at least one element."""
    values = list(values)
    if not values:
        fail(name, values, "must not be empty")
    return values
