"""Piecewise-linear reading of measured tables, shared by the measured step cost and the all-reduce (and compiled from
this source for the engine's compiled loops: kvlab.core.cost.step_time)."""

from __future__ import annotations

from bisect import bisect_right


def bracket(axis: list, x: float) -> tuple[int, float]:
    """(j, w): x lies w of the way from axis[j] to axis[j + 1]; below axis[0] w = 0 (its value), above the last
    point w > 1 (linear extrapolation from the last two)."""
    j = min(max(bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return j, max((x - axis[j]) / (axis[j + 1] - axis[j]), 0.0)


def blend(low, high, w):
    """(1 - w) x low + w x high: low at w = 0 and high at w = 1 exactly (floats or arrays alike)."""
    return (1.0 - w) * low + w * high


def interp(axis: list, values: list, x: float) -> float:
    """Piecewise linear in axis's measured points; past the last, linear along the secant of the last doubling
    (from the last point at or below half the last abscissa), not of the last two points: on a densely measured
    axis (tokens every 16 up to 2,048) those two lie within the measurements' noise of each other, and their slope
    can even fall (Qwen3-32B's dense operators measure 350.8 ms at 2,032 tokens, 348.1 ms at 2,048)."""
    if x <= axis[-1]:
        j, w = bracket(axis, x)
        return blend(values[j], values[j + 1], w)
    j = max(bisect_right(axis, axis[-1] / 2) - 1, 0)
    return values[-1] + (values[-1] - values[j]) * (x - axis[-1]) / (axis[-1] - axis[j])
