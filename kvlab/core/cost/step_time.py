"""A step's time read off a step cost's tables, written once: the measured step cost's (measured_s), vLLM 2023's
(vllm_2023_s) and the roofline's (roofline_s). Their step costs (MeasuredStepCost, Vllm2023StepCost, RooflineStepCost,
whose docstrings say what each term is and where its numbers come from) call these functions over their Clock, whose
tables are Python lists; the engine's compiled loops compile them from this source over the same Clock packed into
one array (kvlab.core.engine.fast: part, length, search and interpolate's bisect_right bound to their compiled
selves), so that a step lasts the same bits either way. Grids are flat, in C order, indexed by their axes' lengths."""

from bisect import bisect_left, bisect_right
from collections import namedtuple

from kvlab.core.cost.interpolate import blend, bracket, interp

# A step cost's tables, one after another (an unused one empty): the figures of a constant, linear, 2023 or roofline
# step cost (cost_ms: ROOFLINE's or VLLM_2023's figures, or ms a step and ms a token), the CUDA-graph capture sizes,
# the dense and per-sequence tables, the attention grid's 4 axes, the grid and its decode-only plane, the MoE grid (by
# its two axes), the all-reduce's table, the dispatch's, the CPU's, the skew fit's prefill chunks (in the order of its
# alphas), 4 bin edges and alphas (by the chunks and the bins between the edges).
TABLES = (
    "cost_ms",
    "sizes",
    "dense_tokens",
    "dense_us",
    "sequences",
    "per_sequence_us",
    "axis0",
    "axis1",
    "axis2",
    "axis3",
    "attention",
    "decode_grid",
    "moe_tokens",
    "moe_experts",
    "moe_us",
    "all_reduce_sizes",
    "all_reduce_us",
    "dispatch_sizes",
    "dispatch_us",
    "cpu_sequences",
    "cpu_us",
    "skew_chunks",
    "skew_bins0",
    "skew_bins1",
    "skew_bins2",
    "skew_bins3",
    "skew_alpha",
)
(
    COST_MS,
    SIZES,
    DENSE_TOKENS,
    DENSE_US,
    SEQUENCES,
    PER_SEQUENCE_US,
    AXIS0,
    AXIS1,
    AXIS2,
    AXIS3,
    ATTENTION,
    DECODE_GRID,
    MOE_TOKENS,
    MOE_EXPERTS,
    MOE_US,
    ALL_REDUCE_SIZES,
    ALL_REDUCE_US,
    DISPATCH_SIZES,
    DISPATCH_US,
    CPU_SEQUENCES,
    CPU_US,
    SKEW_CHUNKS,
    SKEW_BINS0,
    SKEW_BINS1,
    SKEW_BINS2,
    SKEW_BINS3,
    SKEW_ALPHA,
) = range(len(TABLES))
# A step cost as these functions read it. kind: 0 constant, 1 linear, 2 measured, 3 vLLM 2023's, 4 the roofline
# without all-reduces; the measured one's scalars: layers, the experts (E, k, EP, DP), the all-reduce's and the
# expert dispatch's count a step and bytes a token, whether the CPU overlaps the GPU (asynchronous scheduling), whether
# a skew fit is there and its pooled alpha, the overhead (us). table: a list of TABLES' tables (Python), or all of
# them one after another in one float64 array, table p from at[p] to at[p + 1] (compiled: two arrays and scalars,
# so that a compiled function takes the clock at the cost of a few words).
Clock = namedtuple(
    "Clock",
    [
        "kind",
        "layers",
        "num_experts",
        "num_experts_per_tok",
        "expert_parallel_size",
        "data_parallel_size",
        "all_reduce_per_step",
        "all_reduce_bytes_per_token",
        "dispatch_per_step",
        "dispatch_bytes_per_token",
        "cpu_overlapped",
        "skew",
        "skew_default",
        "overhead_us",
        "table",
        "at",
    ],
)
INTEGERS = (
    "num_experts",
    "num_experts_per_tok",
    "expert_parallel_size",
    "data_parallel_size",
    "cpu_overlapped",
    "skew",
)


def clock(kind: int, table: dict, **scalars) -> Clock:
    """A Clock of kind with these tables (by TABLES name, each a list; the rest empty) and scalars (the rest 0): each
    scalar an int (INTEGERS) or a float, whatever the kind, so that a compiled function takes every clock alike."""
    numbers = {name: int(scalars.get(name, 0)) if name in INTEGERS else float(scalars.get(name, 0.0))
               for name in Clock._fields[1:-2]}  # fmt: skip
    return Clock(kind, **numbers, table=[list(table.get(name, ())) for name in TABLES], at=None)


# RooflineStepCost's figures in the cost_ms table, in this order.
ROOFLINE = ("weights_bytes", "kv_bytes_per_token", "num_params", "memory_bandwidth_gb_s", "bf16_dense_tflops")
# Vllm2023StepCost's figures in the cost_ms table, in this order.
VLLM_2023 = (
    "weights_bytes",
    "memory_bandwidth_gb_s",
    "num_params",
    "dense_tflops",
    "hidden_size",
    "attention_launch_us",
    "attention_us_per_sequence",
    "attention_us_per_token",
    "attention_us_per_block",
    "block_size",
    "step_overhead_ms",
)


def part(cost, name):
    """The clock's table `name` (a TABLES index)."""
    return cost.table[name]


def length(cost, name):
    """The number of values in the clock's table `name`."""
    return len(cost.table[name])


def search(axis, x, right):
    """bisect_right (right) or bisect_left of a sorted axis and a number."""
    return bisect_right(axis, x) if right else bisect_left(axis, x)


def padded_tokens(cost, num_tokens):
    """The tokens a step of num_tokens runs with: the next CUDA-graph capture size, or itself past the last."""
    sizes = part(cost, SIZES)
    if len(sizes) == 0 or num_tokens > sizes[len(sizes) - 1]:
        return num_tokens
    return int(sizes[search(sizes, num_tokens, False)])


def active_experts(cost, num_tokens):
    """Experts this GPU runs in a layer for num_tokens tokens of its rank under uniform top-k routing: of its E / EP
    experts (all E without expert parallelism), those hit by the DP x num_tokens tokens of every rank,
    E / EP x (1 - (1 - k/E)^tokens), at most the token-expert pairs they receive."""
    e, k, ep = cost.num_experts, cost.num_experts_per_tok, cost.expert_parallel_size
    tokens = cost.data_parallel_size * num_tokens
    return min(e / ep, k * tokens / ep, e / ep * (1.0 - (1.0 - k / e) ** float(tokens)))


def moe_block_us(cost, num_tokens):
    """One layer's MoE block at num_tokens (us; 0 for a dense model): bilinear on the MoE grid at (the tokens, the
    experts active)."""
    if cost.num_experts == 0:
        return 0.0
    i, wi = bracket(part(cost, MOE_TOKENS), num_tokens)
    j, wj = bracket(part(cost, MOE_EXPERTS), active_experts(cost, num_tokens))
    grid, n = part(cost, MOE_US), length(cost, MOE_EXPERTS)
    low, high = i * n + j, (i + 1) * n + j
    return blend(blend(grid[low], grid[low + 1], wj), blend(grid[high], grid[high + 1], wj), wi)


def fixed_us(cost, num_tokens, num_sequences, expert_tokens, pad):
    """Every term but attention (us): dense and all-reduce at the padded tokens (num_tokens itself with pad False),
    MoE and dispatch there too or at expert_tokens (>= 0: a rank's share of the tokens every rank sends the experts),
    per-sequence (none for 0 sequences: vLLM's dummy batch samples nothing), overhead."""
    padded = padded_tokens(cost, num_tokens) if pad else num_tokens
    experts = padded if expert_tokens < 0 else expert_tokens
    us = interp(part(cost, DENSE_TOKENS), part(cost, DENSE_US), padded)
    us += cost.layers * moe_block_us(cost, experts)
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
            cost.data_parallel_size * experts * cost.dispatch_bytes_per_token,
        )
    return us + cost.overhead_us


def decode_at(cost, i, wi, history):
    """The decode plane blended at its decodes' bracket (i, wi) along them first, then at a history (us)."""
    grid, n = part(cost, DECODE_GRID), length(cost, AXIS3)
    j, w = bracket(part(cost, AXIS3), history)
    low, high = i * n + j, (i + 1) * n + j
    return blend(blend(grid[low], grid[high], wi), blend(grid[low + 1], grid[high + 1], wi), w)


def decode_attention_us(cost, num_decodes, history):
    """One layer's attention for num_decodes decodes of history computed tokens each (us)."""
    i, wi = bracket(part(cost, AXIS2), num_decodes)
    return decode_at(cost, i, wi, history)


def mixed_at(cost, a, wa, b, wb, c, wc, history):
    """One layer's attention for a prefill chunk beside decodes, at the grid's corners (a, b, c) and weights along the
    chunk's tokens, its history and the decodes (mixed_attention_us finds them), blended at a decode history: along
    it, then the decodes, the chunk's history and its tokens."""
    d, wd = bracket(part(cost, AXIS3), history)
    grid, n2, n3 = part(cost, ATTENTION), length(cost, AXIS2), length(cost, AXIS3)
    ab, ab1 = (
        (a * length(cost, AXIS1) + b) * n2 + c,
        (a * length(cost, AXIS1) + b + 1) * n2 + c,
    )  # (a, b, c), (a, b + 1, c)
    a1b, a1b1 = ab + length(cost, AXIS1) * n2, ab1 + length(cost, AXIS1) * n2  # (a + 1, b, c), (a + 1, b + 1, c)
    k0, k1 = corner(grid, ab * n3 + d, wd), corner(grid, (ab + 1) * n3 + d, wd)
    k2, k3 = corner(grid, ab1 * n3 + d, wd), corner(grid, (ab1 + 1) * n3 + d, wd)
    k4, k5 = corner(grid, a1b * n3 + d, wd), corner(grid, (a1b + 1) * n3 + d, wd)
    k6, k7 = corner(grid, a1b1 * n3 + d, wd), corner(grid, (a1b1 + 1) * n3 + d, wd)
    first = blend(blend(k0, k1, wc), blend(k2, k3, wc), wb)
    return blend(first, blend(blend(k4, k5, wc), blend(k6, k7, wc), wb), wa)


def corner(grid, at, wd):
    """A corner of the attention grid (its row along the decode history at `at`), blended to at + 1 by wd."""
    return blend(grid[at], grid[at + 1], wd)


def mixed_attention_us(cost, prefill_tokens, prefill_history, num_decodes, decode_history):
    """One layer's attention for a prefill chunk of prefill_tokens after prefill_history tokens beside num_decodes
    decodes of decode_history each (us): multilinear on the measured grid."""
    a, wa = bracket(part(cost, AXIS0), prefill_tokens)
    b, wb = bracket(part(cost, AXIS1), prefill_history)
    c, wc = bracket(part(cost, AXIS2), num_decodes)
    return mixed_at(cost, a, wa, b, wb, c, wc, decode_history)


def skew_bucket(cost, name, x):
    """The skew fit's bucket of x along its bin edges `name`: i with bins[i] < x <= bins[i + 1], the last past the
    last edge."""
    bins = part(cost, name)
    last = len(bins) - 1
    i = search(bins, x, False)
    i = 1 if i < 1 else last if i > last else i
    return i - 1


def skew_alpha(cost, chunk, num_decodes, rate, kv_big, kv_prefill):
    """The skew fit's alpha for decodes beside a prefill chunk of chunk tokens (0: none): its bucket by (decodes, the
    skew rate clipped to [0, 1], the largest decode history, the chunk's history); the pooled alpha off its chunks."""
    chunks = part(cost, SKEW_CHUNKS)
    p = -1
    for k in range(len(chunks)):
        if chunks[k] == chunk:
            p = k
            break
    if p < 0:
        return cost.skew_default
    rate = 0.0 if rate < 0.0 else 1.0 if rate > 1.0 else rate
    at = p * (length(cost, SKEW_BINS0) - 1) + skew_bucket(cost, SKEW_BINS0, num_decodes)
    at = at * (length(cost, SKEW_BINS1) - 1) + skew_bucket(cost, SKEW_BINS1, rate)
    at = at * (length(cost, SKEW_BINS2) - 1) + skew_bucket(cost, SKEW_BINS2, kv_big)
    return part(cost, SKEW_ALPHA)[at * (length(cost, SKEW_BINS3) - 1) + skew_bucket(cost, SKEW_BINS3, kv_prefill)]


def skewed_attention_us(cost, attention_us, prefill_tokens, prefill_history, num_decodes, dctx, low, high, corners):
    """One layer's attention of a batch whose decodes' mean-history attention is attention_us, with the skew penalty
    of decodes of unequal history (dctx context tokens in all, from low to high each): attention_us itself without a
    fit, with one decode, or with decodes of equal history; at most the attention at the largest history, at least 0.
    corners: the batch's mixed_at corners (a, wa, b, wb, c, wc) where it has a prefill chunk."""
    if not cost.skew or num_decodes < 2 or high <= low:
        return attention_us
    rate = (dctx - num_decodes * low) / (num_decodes * (high - low))
    alpha = skew_alpha(cost, prefill_tokens, num_decodes, rate, high - 1, int(prefill_history))
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


def cpu_us(cost, num_sequences):
    """The CPU's scheduling of a step of num_sequences scheduled sequences (us; 0 without a CPU table)."""
    if length(cost, CPU_SEQUENCES) == 0:
        return 0.0
    return interp(part(cost, CPU_SEQUENCES), part(cost, CPU_US), num_sequences)


def with_cpu_us(cost, gpu_us, cpu):
    """A step of gpu_us of GPU work beside cpu us of the CPU's scheduling: their sum (synchronous scheduling) or the
    longer (asynchronous: the CPU schedules while the GPU runs the batch before); gpu_us itself without a CPU table."""
    if length(cost, CPU_SEQUENCES) == 0:
        return gpu_us
    if not cost.cpu_overlapped:
        return gpu_us + cpu
    return cpu if cpu > gpu_us else gpu_us


def gpu_us(cost, num_tokens, expert_tokens, pad, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high):
    """The GPU's work of a step (us) of a Batch of these fields (tokens, context, num_decodes, dctx: the decodes'
    context, num_prefills, pairs: their query-key pairs, low and high: the least and most decode context), its dense,
    MoE and all-reduce terms read at num_tokens (the batch's own tokens, or the largest of data-parallel ranks in
    lockstep; fixed_us says what expert_tokens and pad change); and the sequences it schedules."""
    prefill_tokens = tokens - num_decodes
    decode_history = (dctx - num_decodes) / num_decodes if num_decodes else 0.0
    if not prefill_tokens:
        us = fixed_us(cost, num_tokens, num_decodes, expert_tokens, pad)
        attention = decode_attention_us(cost, num_decodes, decode_history)
        corners = (0, 0.0, 0, 0.0, 0, 0.0)
        us += cost.layers * skewed_attention_us(cost, attention, 0, 0.0, num_decodes, dctx, low, high, corners)
        return us, num_decodes
    if num_prefills:
        history = (pairs - prefill_tokens * (prefill_tokens + 1) / 2) / prefill_tokens
    else:  # a caller without the prefill aggregates: one chunk
        history = float(context - dctx - prefill_tokens)
    history = history if history > 0.0 else 0.0
    num_sequences = num_decodes + (num_prefills if num_prefills > 1 else 1)
    us = fixed_us(cost, num_tokens, num_sequences, expert_tokens, pad)
    a, wa = bracket(part(cost, AXIS0), prefill_tokens)
    b, wb = bracket(part(cost, AXIS1), history)
    c, wc = bracket(part(cost, AXIS2), num_decodes)
    attention = mixed_at(cost, a, wa, b, wb, c, wc, decode_history)
    corners = (a, wa, b, wb, c, wc)
    us += cost.layers * skewed_attention_us(
        cost, attention, prefill_tokens, history, num_decodes, dctx, low, high, corners
    )
    return us, num_sequences


def measured_s(cost, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high):
    """Seconds of one step of a Batch of these fields (gpu_us's) on the measured clock."""
    us, num_sequences = gpu_us(
        cost, tokens, -1.0, True, tokens, context, num_decodes, dctx, num_prefills, pairs, low, high
    )
    return with_cpu_us(cost, us, cpu_us(cost, num_sequences)) / 1e6


def vllm_2023_dense_us(cost, tokens):
    """vLLM 2023's linear layers for a step of tokens (us): reading the weights or their FLOPs, whichever is slower."""
    c = part(cost, COST_MS)
    memory_us = c[0] / (c[1] * 1e3)
    compute_us = 2.0 * c[2] * float(tokens) / (c[3] * 1e6)
    return memory_us if memory_us >= compute_us else compute_us


def paged_attention_kernel_us(launch_us, us_per_sequence, us_per_token, us_per_block, block_size, num_decodes,
                              decode_context_tokens):  # fmt: skip
    """One layer's PagedAttention kernel of vLLM 2023 for num_decodes decodes (at least one) attending
    decode_context_tokens tokens in all (us): launch + per sequence x decodes + per token x context tokens + per block
    x blocks, blocks = context tokens / block_size + decodes x (1 - 1/block_size) / 2 (a sequence's last block half
    full on average). Floats or arrays alike."""
    blocks = decode_context_tokens / block_size + num_decodes * (1.0 - 1.0 / block_size) / 2.0
    return launch_us + us_per_sequence * num_decodes + us_per_token * decode_context_tokens + us_per_block * blocks


def vllm_2023_s(cost, tokens, context, num_decodes, dctx, num_prefills, pairs):
    """Seconds of one step of vLLM 2023's step cost (Vllm2023StepCost, its figures in cost_ms: VLLM_2023) for a Batch
    of these fields."""
    c = part(cost, COST_MS)
    hidden, launch, per_sequence, per_token, per_block = c[4], c[5], c[6], c[7], c[8]
    block_size, overhead_ms, tflops = c[9], c[10], c[3]
    prefill_tokens = tokens - num_decodes
    pairs_f = float(pairs)
    if prefill_tokens and not num_prefills:  # one chunk
        history = context - dctx - prefill_tokens
        history = history if history > 0 else 0
        pairs_f = prefill_tokens * history + prefill_tokens * (prefill_tokens + 1) / 2
    dense = vllm_2023_dense_us(cost, tokens)
    decode_context = float(dctx)
    attention = 0.0 * decode_context
    if num_decodes:
        attention = paged_attention_kernel_us(
            launch, per_sequence, per_token, per_block, block_size, num_decodes, decode_context
        )
    prefill = 4.0 * hidden * pairs_f / (tflops * 1e6)
    us = overhead_ms * 1000.0 + dense + cost.layers * (attention + prefill)
    return us / 1e6


def roofline_s(cost, tokens, context):
    """Seconds of one step of the roofline (RooflineStepCost without its all-reduce; its figures in cost_ms: ROOFLINE)
    for a Batch of tokens and context tokens."""
    c = part(cost, COST_MS)
    weights, kv_per_token, params, bandwidth, tflops = c[0], c[1], c[2], c[3], c[4]
    memory_s = (weights + kv_per_token * float(context)) / (bandwidth * 1e9)
    compute_s = 2.0 * params * float(tokens) / (tflops * 1e12)
    return memory_s if memory_s >= compute_s else compute_s
