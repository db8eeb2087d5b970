"""The one way tables reach a reader: rounded to the precision they are shown at, never a negative zero.

Outputs that nbval compares must not depend on the machine: another CPU or BLAS kernel changes the last
bits of a floating-point result, so every float a notebook shows is rounded to what it means first.
"""
from __future__ import annotations

import pandas as pd


def rounded(frame: pd.DataFrame, decimals: int | dict = 2) -> pd.DataFrame:
    """frame with its float columns rounded (pandas' round: an int, or column -> decimals) and -0.0 shown as 0.0."""
    out = frame.round(decimals)
    floats = out.select_dtypes("float").columns
    out[floats] = out[floats] + 0.0  # IEEE: -0.0 + 0.0 is +0.0, every other value is unchanged
    return out
