"""Units and exact arithmetic shared by every layer: bytes per unit, ceiling division, exact numbers."""

from __future__ import annotations

from fractions import Fraction

from kvlab.core import validate

GIB = 2**30
MIB = 2**20
KIB = 2**10
UNIT_BYTES = {"GiB": GIB, "GB": 10**9, "MiB": MIB, "MB": 10**6}


def unit_bytes(unit: str) -> int:
    """Bytes in one unit (GiB = 2^30, GB = 10^9, MiB, MB)."""
    validate.one_of("unit", unit, UNIT_BYTES)
    return UNIT_BYTES[unit]


def cdiv(a, b):
    """Ceiling division of integers (or integer arrays): -(-a // b)."""
    return -(-a // b)


def exact(x: float | int) -> int | float:
    """An integral float as int (so byte counts print without '.0')."""
    return int(x) if float(x).is_integer() else x


def as_written(x) -> Fraction:
    """x as an exact fraction; a float is read as its shortest decimal (0.1 is 1/10, as a user writes it)."""
    return Fraction(repr(float(x))) if isinstance(x, float) else Fraction(x)
