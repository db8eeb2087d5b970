"""The step costs the compiled loops evaluate (kvlab/core/cost/), over the named arrays of arrays.Clock: constant,
linear, measured, vLLM 2023's and the roofline, each the float operations of its Python namesake in the same order."""

from kvlab.core.engine.fast.arrays import (
    ALL_REDUCE_SIZES,
    ALL_REDUCE_US,
    ATTENTION,
    AXIS0,
    AXIS1,
    AXIS2,
    AXIS3,
    COST_MS,
    CPU_SEQUENCES,
    CPU_US,
    DECODE_GRID,
    DENSE_TOKENS,
    DENSE_US,
    DISPATCH_SIZES,
    DISPATCH_US,
    MOE_EXPERTS,
    MOE_TOKENS,
    MOE_US,
    PER_SEQUENCE_US,
    SEQUENCES,
    SIZES,
    SKEW_ALPHA,
    SKEW_BINS0,
    SKEW_BINS1,
    SKEW_BINS2,
    SKEW_BINS3,
    SKEW_CHUNKS,
)
from kvlab.core.engine.fast.loops.jit import (
    attention_pairs,
    inline,
    njit,
)

# ---------------------------------------------------------------- the step cost
# ConstantStepCost, LinearStepCost and MeasuredStepCost (kvlab/core/cost/) over the named arrays of arrays.Clock, each
# function the float operations of its Python namesake in the same order (kvlab.core.cost.interpolate's bracket, blend
# and interp; MeasuredStepCost's step_s and what it calls), so that a step lasts the same bits either way.


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


@inline
def bracket(axis, x):
    """interpolate.bracket: (j, w), x w of the way from axis[j] to axis[j + 1]."""
    j = search(axis, x, True) - 1
    last = axis.shape[0] - 2
    j = 0 if j < 0 else last if j > last else j
    w = (x - axis[j]) / (axis[j + 1] - axis[j])
    return j, (w if w > 0.0 else 0.0)


@inline
def blend(low, high, w):
    return (1.0 - w) * low + w * high


@inline
def interp(axis, values, x):
    """interpolate.interp: piecewise linear, past the last point along the secant of the last doubling."""
    last = axis.shape[0] - 1
    if x <= axis[last]:
        j, w = bracket(axis, x)
        return blend(values[j], values[j + 1], w)
    j = search(axis, axis[last] / 2, True) - 1
    j = 0 if j < 0 else j
    return values[last] + (values[last] - values[j]) * (x - axis[last]) / (axis[last] - axis[j])


@njit
def part(cost, name):
    """The clock's table `name` (an arrays.TABLES index): a view of cost.table."""
    return cost.table[cost.at[name] : cost.at[name + 1]]


@njit
def length(cost, name):
    """The number of values in the clock's table `name`."""
    return cost.at[name + 1] - cost.at[name]


@inline
def padded_tokens(cost, num_tokens):
    sizes = part(cost, SIZES)
    if sizes.shape[0] == 0 or num_tokens > sizes[sizes.shape[0] - 1]:
        return num_tokens
    return int(sizes[search(sizes, num_tokens, False)])


@njit
def moe_block_us(cost, num_tokens):
    """MeasuredStepCost.moe_block_us (with active_experts)."""
    e, k = cost.num_experts, cost.num_experts_per_tok
    ep, dp = cost.expert_parallel_size, cost.data_parallel_size
    if e == 0:
        return 0.0
    tokens = dp * num_tokens
    active = min(e / ep, k * tokens / ep, e / ep * (1.0 - (1.0 - k / e) ** float(tokens)))
    i, wi = bracket(part(cost, MOE_TOKENS), num_tokens)
    j, wj = bracket(part(cost, MOE_EXPERTS), active)
    grid = part(cost, MOE_US).reshape((length(cost, MOE_TOKENS), length(cost, MOE_EXPERTS)))
    return blend(blend(grid[i, j], grid[i, j + 1], wj), blend(grid[i + 1, j], grid[i + 1, j + 1], wj), wi)


@njit
def fixed_us(cost, num_tokens, num_sequences):
    """MeasuredStepCost.fixed_us of one rank: dense, MoE, all-reduce and dispatch at the padded tokens."""
    padded = padded_tokens(cost, num_tokens)
    us = interp(part(cost, DENSE_TOKENS), part(cost, DENSE_US), padded)
    us += cost.layers * moe_block_us(cost, padded)
    if num_sequences:
        us += interp(part(cost, SEQUENCES), part(cost, PER_SEQUENCE_US), num_sequences)
    if cost.all_reduce_per_step:
        us += cost.all_reduce_per_step * interp(
            part(cost, ALL_REDUCE_SIZES), part(cost, ALL_REDUCE_US), padded * cost.all_reduce_bytes_per_token
        )
    if cost.dispatch_per_step:
        us += cost.dispatch_per_step * interp(
            part(cost, DISPATCH_SIZES),
            part(cost, DISPATCH_US),
            cost.data_parallel_size * padded * cost.dispatch_bytes_per_token,
        )
    return us + cost.overhead_us


@njit
def decode_attention_us(cost, num_decodes, history):
    """MeasuredStepCost.decode_attention_us: the decode-only plane, along the decodes, then the history."""
    i, wi = bracket(part(cost, AXIS2), num_decodes)
    j, w = bracket(part(cost, AXIS3), history)
    grid = part(cost, DECODE_GRID).reshape((length(cost, AXIS2), length(cost, AXIS3)))
    return blend(blend(grid[i, j], grid[i + 1, j], wi), blend(grid[i, j + 1], grid[i + 1, j + 1], wi), w)


@njit
def mixed_at(cost, a, wa, b, wb, c, wc, history):
    """MeasuredStepCost._mixed_at of the corners (a, b, c) and weights _mixed_corners found."""
    shape = (length(cost, AXIS0), length(cost, AXIS1), length(cost, AXIS2), length(cost, AXIS3))
    grid = part(cost, ATTENTION).reshape(shape)
    d, wd = bracket(part(cost, AXIS3), history)
    k0 = blend(grid[a, b, c, d], grid[a, b, c, d + 1], wd)
    k1 = blend(grid[a, b, c + 1, d], grid[a, b, c + 1, d + 1], wd)
    k2 = blend(grid[a, b + 1, c, d], grid[a, b + 1, c, d + 1], wd)
    k3 = blend(grid[a, b + 1, c + 1, d], grid[a, b + 1, c + 1, d + 1], wd)
    k4 = blend(grid[a + 1, b, c, d], grid[a + 1, b, c, d + 1], wd)
    k5 = blend(grid[a + 1, b, c + 1, d], grid[a + 1, b, c + 1, d + 1], wd)
    k6 = blend(grid[a + 1, b + 1, c, d], grid[a + 1, b + 1, c, d + 1], wd)
    k7 = blend(grid[a + 1, b + 1, c + 1, d], grid[a + 1, b + 1, c + 1, d + 1], wd)
    first = blend(blend(k0, k1, wc), blend(k2, k3, wc), wb)
    return blend(first, blend(blend(k4, k5, wc), blend(k6, k7, wc), wb), wa)


@inline
def skew_bucket(bins, x):
    """SkewFit.bucket: i with bins[i] < x <= bins[i + 1], the last past the last edge."""
    i = search(bins[1:], x, False) + 1
    last = bins.shape[0] - 1
    return (i if i < last else last) - 1


@njit
def skew_alpha(cost, prefill_tokens, prefill_history, num_decodes, dctx, low, high):
    """SkewFit.alpha_at for a batch of num_decodes decodes (more than one, of unequal context from low to high) beside
    a prefill chunk of prefill_tokens (0: none) after prefill_history."""
    chunks = part(cost, SKEW_CHUNKS)
    chunk = -1
    for i in range(chunks.shape[0]):
        if chunks[i] == prefill_tokens:
            chunk = i
            break
    if chunk < 0:
        return cost.skew_default
    rate = (dctx - num_decodes * low) / (num_decodes * (high - low))
    rate = 0.0 if rate < 0.0 else 1.0 if rate > 1.0 else rate
    bins = (length(cost, SKEW_BINS0), length(cost, SKEW_BINS1), length(cost, SKEW_BINS2), length(cost, SKEW_BINS3))
    shape = (chunks.shape[0], bins[0] - 1, bins[1] - 1, bins[2] - 1, bins[3] - 1)  # the bins between the edges
    return part(cost, SKEW_ALPHA).reshape(shape)[
        chunk,
        skew_bucket(part(cost, SKEW_BINS0), num_decodes),
        skew_bucket(part(cost, SKEW_BINS1), rate),
        skew_bucket(part(cost, SKEW_BINS2), high - 1),
        skew_bucket(part(cost, SKEW_BINS3), int(prefill_history)),
    ]


@njit
def skewed_attention_us(cost, attention_us, prefill_tokens, prefill_history, num_decodes, dctx, low, high, corners):
    """MeasuredStepCost.skewed_attention_us (with SkewFit.alpha_at); corners: (a, wa, b, wb, c, wc) of a mixed
    batch (prefill_tokens > 0)."""
    if not cost.skew or num_decodes < 2 or high <= low:
        return attention_us
    alpha = skew_alpha(cost, prefill_tokens, prefill_history, num_decodes, dctx, low, high)
    if alpha == 0.0:
        return attention_us
    if prefill_tokens:
        a, wa, b, wb, c, wc = corners
        at_max = mixed_at(cost, a, wa, b, wb, c, wc, high - 1)
    else:
        at_max = decode_attention_us(cost, num_decodes, high - 1)
    if at_max <= attention_us:
        return attention_us
    skewed = attention_us + alpha * (at_max - attention_us)
    return skewed if skewed > 0.0 else 0.0


@njit
def with_cpu_us(cost, gpu_us, num_sequences):
    """MeasuredStepCost.with_cpu_us: the CPU's scheduling added, or the longer of the two."""
    if length(cost, CPU_SEQUENCES) == 0:
        return gpu_us
    return combine_cpu_us(cost, gpu_us, interp(part(cost, CPU_SEQUENCES), part(cost, CPU_US), num_sequences))


@inline
def combine_cpu_us(cost, gpu_us, cpu_us):
    """kvlab.core.cost.cpu.combine_cpu: a step's GPU work and the CPU's scheduling added (synchronous) or the longer of
    the two (asynchronous), us."""
    if not cost.cpu_overlapped:
        return gpu_us + cpu_us
    return cpu_us if cpu_us > gpu_us else gpu_us


@njit
def decode_run_clock(cost, num_decodes, dctx, low, high):
    """What stays the same through the steps of a decode run on the measured clock, from its first step's Batch
    fields (num_decodes decodes of dctx context tokens in all, from low to high each): every term but attention, the
    decode plane's row along the decodes, the skew fit's alpha but for the largest history's bucket, and the CPU's
    time. decode_step_s reads it."""
    if cost.kind != 2:  # none to read
        return num_decodes, dctx, high, 0.0, 0, 0.0, False, -1, -1, -1, -1, 0.0
    fixed = fixed_us(cost, num_decodes, num_decodes)
    i, wi = bracket(part(cost, AXIS2), num_decodes)
    skewed = cost.skew != 0 and num_decodes >= 2 and high > low  # the history spread, the same every step
    chunk = b0 = b1 = b3 = -1
    if skewed:
        chunks = part(cost, SKEW_CHUNKS)
        for k in range(chunks.shape[0]):
            if chunks[k] == 0:
                chunk = k
                break
        if chunk >= 0:
            rate = (dctx - num_decodes * low) / (num_decodes * (high - low))  # each history grows by one: the same
            rate = 0.0 if rate < 0.0 else 1.0 if rate > 1.0 else rate
            b0 = skew_bucket(part(cost, SKEW_BINS0), num_decodes)
            b1 = skew_bucket(part(cost, SKEW_BINS1), rate)
            b3 = skew_bucket(part(cost, SKEW_BINS3), 0)
    cpu = interp(part(cost, CPU_SEQUENCES), part(cost, CPU_US), num_decodes) if length(cost, CPU_SEQUENCES) else 0.0
    return num_decodes, dctx, high, fixed, i, wi, skewed, chunk, b0, b1, b3, cpu


@njit
def decode_step_s(cost, run, j):
    """measured_s of step j of the decode run decode_run_clock described (its decodes' context j tokens longer
    each): the same float operations, the run's constant terms read from it."""
    num_decodes, dctx, high, fixed, i, wi, skewed, chunk, b0, b1, b3, cpu = run
    dctx, high = dctx + num_decodes * j, high + j
    grid = part(cost, DECODE_GRID).reshape((length(cost, AXIS2), length(cost, AXIS3)))
    axis = part(cost, AXIS3)
    k, w = bracket(axis, (dctx - num_decodes) / num_decodes)
    attention = blend(blend(grid[i, k], grid[i + 1, k], wi), blend(grid[i, k + 1], grid[i + 1, k + 1], wi), w)
    if skewed:
        if chunk < 0:
            alpha = cost.skew_default
        else:
            bins = (length(cost, SKEW_BINS0), length(cost, SKEW_BINS1), length(cost, SKEW_BINS2))
            shape = (length(cost, SKEW_CHUNKS), bins[0] - 1, bins[1] - 1, bins[2] - 1, length(cost, SKEW_BINS3) - 1)
            b2 = skew_bucket(part(cost, SKEW_BINS2), high - 1)
            alpha = part(cost, SKEW_ALPHA).reshape(shape)[chunk, b0, b1, b2, b3]
        if alpha != 0.0:
            k, w = bracket(axis, high - 1)
            at_max = blend(blend(grid[i, k], grid[i + 1, k], wi), blend(grid[i, k + 1], grid[i + 1, k + 1], wi), w)
            if at_max > attention:
                attention = attention + alpha * (at_max - attention)
                attention = attention if attention > 0.0 else 0.0
    us = fixed
    us += cost.layers * attention
    return (us if length(cost, CPU_SEQUENCES) == 0 else combine_cpu_us(cost, us, cpu)) / 1e6


@njit
def prefill_run_clock(cost, num_decodes, chunk):
    """What stays the same through the steps of a prefill run (prefill_run: num_decodes decodes beside a chunk of
    chunk tokens) on the measured clock: every term but attention (the same tokens and sequences), the attention
    grid's corners along the chunk and the decodes, and the CPU's time. prefill_step_s reads it."""
    if cost.kind != 2:  # none to read
        return 0.0, 0, 0.0, 0, 0.0, 0.0
    fixed = fixed_us(cost, num_decodes + chunk, num_decodes + 1)
    a, wa = bracket(part(cost, AXIS0), chunk)
    c, wc = bracket(part(cost, AXIS2), num_decodes)
    cpu = interp(part(cost, CPU_SEQUENCES), part(cost, CPU_US), num_decodes + 1) if length(cost, CPU_SEQUENCES) else 0.0
    return fixed, a, wa, c, wc, cpu


@njit
def prefill_step_s(cost, run, num_decodes, chunk, before, dctx, low, high):
    """measured_s of a step of the prefill run prefill_run_clock described: its chunk after before tokens of the
    prompt, its decodes of dctx context tokens in all, from low to high each; the same float operations, the run's
    constant terms read from it."""
    fixed, a, wa, c, wc, cpu = run
    decode_history = (dctx - num_decodes) / num_decodes if num_decodes else 0.0
    pairs = attention_pairs(chunk, before)
    history = (pairs - chunk * (chunk + 1) / 2) / chunk
    history = history if history > 0.0 else 0.0
    b, wb = bracket(part(cost, AXIS1), history)
    attention = mixed_at(cost, a, wa, b, wb, c, wc, decode_history)
    corners = (a, wa, b, wb, c, wc)
    us = fixed
    us += cost.layers * skewed_attention_us(cost, attention, chunk, history, num_decodes, dctx, low, high, corners)
    return (us if length(cost, CPU_SEQUENCES) == 0 else combine_cpu_us(cost, us, cpu)) / 1e6


@njit
def measured_s(cost, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high):
    """MeasuredStepCost.step_s of the Batch of these fields."""
    prefill_tokens = tokens - num_decodes
    decode_history = (dctx - num_decodes) / num_decodes if num_decodes else 0.0
    if not prefill_tokens:
        us = fixed_us(cost, tokens, num_decodes)
        attention = decode_attention_us(cost, num_decodes, decode_history)
        corners = (0, 0.0, 0, 0.0, 0, 0.0)
        us += cost.layers * skewed_attention_us(cost, attention, 0, 0.0, num_decodes, dctx, low, high, corners)
        return with_cpu_us(cost, us, num_decodes) / 1e6
    if num_prefills:
        history = (pairs - prefill_tokens * (prefill_tokens + 1) / 2) / prefill_tokens
    else:
        history = float(context - dctx - prefill_tokens)
    history = history if history > 0.0 else 0.0
    num_sequences = num_decodes + (num_prefills if num_prefills > 1 else 1)
    us = fixed_us(cost, tokens, num_sequences)
    a, wa = bracket(part(cost, AXIS0), prefill_tokens)
    b, wb = bracket(part(cost, AXIS1), history)
    c, wc = bracket(part(cost, AXIS2), num_decodes)
    attention = mixed_at(cost, a, wa, b, wb, c, wc, decode_history)
    corners = (a, wa, b, wb, c, wc)
    us += cost.layers * skewed_attention_us(
        cost, attention, prefill_tokens, history, num_decodes, dctx, low, high, corners
    )
    return with_cpu_us(cost, us, num_sequences) / 1e6


@njit
def vllm_2023_s(cost, tokens, context, num_decodes, dctx, num_prefills, pairs):
    """Vllm2023StepCost.step_s of the Batch of these fields (its figures in the clock's COST_MS, arrays.VLLM_2023)."""
    c = part(cost, COST_MS)
    weights, bandwidth, params, tflops, hidden = c[0], c[1], c[2], c[3], c[4]
    launch, per_sequence, per_token, per_block, block_size, overhead_ms = c[5], c[6], c[7], c[8], c[9], c[10]
    prefill_tokens = tokens - num_decodes
    pairs_f = float(pairs)
    if prefill_tokens and not num_prefills:  # one chunk
        history = context - dctx - prefill_tokens
        history = history if history > 0 else 0
        pairs_f = prefill_tokens * history + prefill_tokens * (prefill_tokens + 1) / 2
    memory_us = weights / (bandwidth * 1e3)
    compute_us = 2.0 * params * float(tokens) / (tflops * 1e6)
    dense = memory_us if memory_us >= compute_us else compute_us
    decode_context = float(dctx)
    attention = 0.0 * decode_context
    if num_decodes:
        blocks = decode_context / block_size + num_decodes * (1.0 - 1.0 / block_size) / 2.0
        attention = launch + per_sequence * num_decodes + per_token * decode_context + per_block * blocks
    prefill = 4.0 * hidden * pairs_f / (tflops * 1e6)
    us = overhead_ms * 1000.0 + dense + cost.layers * (attention + prefill)
    return us / 1e6


@njit
def roofline_s(cost, tokens, context):
    """RooflineStepCost.step_s of a Batch of tokens and context tokens (no all-reduce; its figures in the clock's
    COST_MS, arrays.ROOFLINE): the same float operations."""
    c = part(cost, COST_MS)
    weights, kv_per_token, params, bandwidth, tflops = c[0], c[1], c[2], c[3], c[4]
    memory_s = (weights + kv_per_token * float(context)) / (bandwidth * 1e9)
    compute_s = 2.0 * params * float(tokens) / (tflops * 1e12)
    return memory_s if memory_s >= compute_s else compute_s


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
