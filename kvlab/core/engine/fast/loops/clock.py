"""The step costs the compiled loops evaluate, over a step cost's Clock packed into one array (kvlab.core.cost.step_time):
the measured, 2023 and roofline ones compiled from kvlab.core.cost.step_time's own source (its functions and
kvlab.core.cost.interpolate's, over part, length and search below), so that a step lasts the same bits in the loops
as in the step costs' step_s; the constant and linear ones; and what stays the same through the steps of a decode run
on the measured clock (decode_run_clock)."""

import builtins
import types

from kvlab.core.cost import interpolate, step_time
from kvlab.core.cost.step_time import (
    AXIS2,
    SKEW_ALPHA,
    SKEW_BINS0,
    SKEW_BINS1,
    SKEW_BINS2,
    SKEW_BINS3,
    SKEW_CHUNKS,
)
from kvlab.core.engine.fast.loops.jit import compiled_into, inline, njit


@njit
def search(axis, x, right):
    """np.searchsorted(axis, x, side="right" if right else "left") of a sorted axis and a number (not NaN), by
    bisection: numba's searchsorted costs about 40 ns a call more."""
    low, high = 0, axis.shape[0]
    while low < high:
        middle = (low + high) >> 1
        if axis[middle] < x or (right and axis[middle] == x):
            low = middle + 1
        else:
            high = middle
    return low


@njit
def bisect_right(axis, x):
    """bisect.bisect_right of a sorted axis and a number (interpolate's, compiled)."""
    return search(axis, x, True)


@njit
def part(cost, name):
    """The clock's table `name` (a TABLES index): a view of cost.table."""
    return cost.table[cost.at[name] : cost.at[name + 1]]


@njit
def length(cost, name):
    """The number of values in the clock's table `name`."""
    return cost.at[name + 1] - cost.at[name]


# kvlab.core.cost.step_time's functions (and interpolate's), compiled from their source: the few-line ones inlined into
# their callers (LEAVES), the others each compiled once and called
LEAVES = ("bracket", "blend", "interp", "padded_tokens", "active_experts", "corner", "skew_bucket", "cpu_us", "with_cpu_us",
          "vllm_2023_dense_us", "paged_attention_kernel_us")  # fmt: skip
_OWN = {"part": part, "length": length, "search": search, "bisect_right": bisect_right}
_FUNCTIONS = [interpolate.bracket, interpolate.blend, interpolate.interp] + [
    f for f in vars(step_time).values()
    if isinstance(f, types.FunctionType) and f.__module__ == step_time.__name__ and f.__name__ not in {*_OWN, "clock"}
]  # fmt: skip
_STEP_TIME = compiled_into(
    {"__builtins__": builtins, "__name__": __name__}
    | {k: v for k, v in vars(step_time).items() if type(v) is int}
    | _OWN,
    [f for f in _FUNCTIONS if f.__name__ in LEAVES],
)
_STEP_TIME = compiled_into(_STEP_TIME, [f for f in _FUNCTIONS if f.__name__ not in LEAVES], inlined=False)
bracket, fixed_us, decode_at = _STEP_TIME["bracket"], _STEP_TIME["fixed_us"], _STEP_TIME["decode_at"]
skew_bucket, with_cpu_us = _STEP_TIME["skew_bucket"], _STEP_TIME["with_cpu_us"]
cpu_us, measured_s = _STEP_TIME["cpu_us"], _STEP_TIME["measured_s"]
vllm_2023_s, roofline_s = _STEP_TIME["vllm_2023_s"], _STEP_TIME["roofline_s"]


@njit
def decode_run_clock(cost, num_decodes, dctx, low, high):
    """What stays the same through the steps of a decode run on the measured clock, from its first step's Batch
    fields (num_decodes decodes of dctx context tokens in all, from low to high each): every term but attention, the
    decode plane's bracket along the decodes, the skew fit's alpha index but for the largest history's bucket, and
    the CPU's time. decode_step_s reads it."""
    if cost.kind != 2:  # none to read
        return num_decodes, dctx, high, 0.0, 0, 0.0, False, -1, 0.0
    fixed = fixed_us(cost, num_decodes, num_decodes, -1.0, True)
    i, wi = bracket(part(cost, AXIS2), num_decodes)
    skewed = cost.skew != 0 and num_decodes >= 2 and high > low  # the history spread, the same every step
    at = -1  # the alpha's index but for the largest history's bucket (-1: the pooled alpha)
    if skewed:
        chunks = part(cost, SKEW_CHUNKS)
        for k in range(chunks.shape[0]):
            if chunks[k] == 0:
                rate = (dctx - num_decodes * low) / (num_decodes * (high - low))  # each history grows by one: the same
                rate = 0.0 if rate < 0.0 else 1.0 if rate > 1.0 else rate
                at = k * (length(cost, SKEW_BINS0) - 1) + skew_bucket(cost, SKEW_BINS0, num_decodes)
                at = at * (length(cost, SKEW_BINS1) - 1) + skew_bucket(cost, SKEW_BINS1, rate)
                break
    return num_decodes, dctx, high, fixed, i, wi, skewed, at, cpu_us(cost, num_decodes)


@njit
def decode_step_s(cost, run, j):
    """measured_s of step j of the decode run decode_run_clock described (its decodes' context j tokens longer
    each): the same float operations, the run's constant terms read from it."""
    num_decodes, dctx, high, fixed, i, wi, skewed, at, cpu = run
    dctx, high = dctx + num_decodes * j, high + j
    attention = decode_at(cost, i, wi, (dctx - num_decodes) / num_decodes)
    if skewed:
        alpha = cost.skew_default
        if at >= 0:
            big = at * (length(cost, SKEW_BINS2) - 1) + skew_bucket(cost, SKEW_BINS2, high - 1)
            alpha = part(cost, SKEW_ALPHA)[big * (length(cost, SKEW_BINS3) - 1) + skew_bucket(cost, SKEW_BINS3, 0)]
        if alpha != 0.0:
            at_max = decode_at(cost, i, wi, high - 1)
            if at_max > attention:
                attention = attention + alpha * (at_max - attention)
                attention = attention if attention > 0.0 else 0.0
    us = fixed
    us += cost.layers * attention
    return with_cpu_us(cost, us, cpu) / 1e6


@njit
def cost_s(cost, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high):
    """The measured, 2023 or roofline step cost's seconds for a step of these Batch fields."""
    if cost.kind == 3:
        return vllm_2023_s(cost, tokens, context, num_decodes, dctx, num_prefills, pairs)
    if cost.kind == 4:
        return roofline_s(cost, tokens, context)
    return measured_s(cost, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high)


@inline
def step_s(cost, num_scheduled, acc):
    """The step cost's seconds for a step of num_scheduled tokens whose other Batch fields account() left in acc
    (context, decodes, their context, prefills, their pairs, the least and most decode context)."""
    if cost.kind == 0:
        return cost.table[0] / 1000.0  # the COST_MS table is the first
    if cost.kind == 1:
        return (cost.table[0] + cost.table[1] * num_scheduled) / 1000.0
    return cost_s(cost, num_scheduled, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6])
