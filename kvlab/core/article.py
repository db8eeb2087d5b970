"""The article's assumed values, in one place: every default that reproduces the article comes from here.

The article (a short piece on how vLLM manages KV memory; see the README's credits) assumes its
numbers rather than measuring them. kvlab's own choices where the article is silent (an arrival
rate, a length distribution) are not here: they live beside the code that makes them, named as
kvlab's choices.
"""

from __future__ import annotations

# Section 1: allocation granularity
NUM_REQUESTS_S1 = 20_000  # requests in the section 1 table
MAX_LEN_TOKENS = 4096  # longest allowed request, tokens
MEAN_TOKENS = 567  # tokens used per request (11,336,014 / 20,000)
BLOCK_SIZES = (4096, 1024, 256, 64, 16)  # reservation units of the table, tokens
MEMORY_GIB = 60  # "60 GB" of KV memory, GB of 2^30 bytes (61,440 MB)
MIB_PER_TOKEN = 0.5  # "0.5 MB per token", MB of 2^20 bytes
FINE_BLOCK_SIZE = 16  # the claim "7.1x": requests that fit at 16 over 4,096 tokens
COARSE_BLOCK_SIZE = 4096

# Section 2: static vs continuous batching
NUM_REQUESTS_S2 = 600  # requests per run
MAX_NUM_SEQS = 8  # slots: requests served at once
MS_PER_TOKEN = 8.0  # time per output token, ms
SHORT_OUTPUT_TOKENS = (40, 200)  # 85% of outputs, uniform, tokens
LONG_OUTPUT_TOKENS = (400, 1000)  # 15% of outputs, uniform, tokens
LONG_OUTPUT_SHARE = 0.15
MEAN_OUTPUT_TOKENS = 207.0  # the mixture's mean output, tokens (0.85 x 120 + 0.15 x 700)
CONSTANT_TOKENS = 150  # every output in the all-equal experiment, tokens

# Section 3: KV-cache capacity (the article's shape; it names no model: 32 layers, 32 heads, head dim 128, 16-bit)
NUM_LAYERS = 32
NUM_KV_HEADS = 32
HEAD_DIM = 128
DTYPE_BYTES = 2
GPU_MEMORY_GIB = 80  # GPU memory, GiB
WEIGHTS_GIB = 16  # memory the weights hold, GiB
CONTEXTS = (1000, 4000, 8000, 32000, 128000)  # context lengths of the tables, tokens
CONCURRENCY = (8, 32)  # requests held at once in the memory table
