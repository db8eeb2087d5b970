"""Section 3 of the article: KV bytes per token, memory per request, requests that fit."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core import capacity
from kvlab.sections import s03_capacity as section
from kvlab.sections.shared import ledger

CONTEXTS = [1000, 4000, 8000, 32000, 128000]


def test_article_kv_bytes_per_token_is_512_kib():
    assert section.ARTICLE_SHAPE.kv_bytes_per_token == 524_288 == 512 * 2**10


def test_memory_table_prints_exactly_as_the_article():
    table = section.memory_table(section.ARTICLE_SHAPE, CONTEXTS, [8, 32])
    printed = ledger.as_printed(table, section=3, table="memory")
    assert printed.values.tolist() == [
        ["0.49", "3.9", "15.6"],
        ["1.95", "15.6", "62.5"],
        ["3.91", "31.3", "125.0"],
        ["15.63", "125.0", "500.0"],
        ["62.50", "500.0", "2,000.0"],
    ]


def test_fit_table_is_the_article_table():
    fit = section.fit_table(section.ARTICLE_SHAPE, 80, 16, CONTEXTS)
    assert fit["max_num_requests"].tolist() == [131, 32, 16, 4, 1]


def test_every_section3_ledger_row_passes_with_zero_tolerance():
    memory = section.memory_table(section.ARTICLE_SHAPE, CONTEXTS, [8, 32])
    fit = section.fit_table(section.ARTICLE_SHAPE, 80, 16, CONTEXTS)
    import pandas as pd

    model = pd.DataFrame({"kv_bytes_per_token": [section.ARTICLE_SHAPE.kv_bytes_per_token]}, index=["all"])
    rows = ledger.compare(
        [
            ledger.from_table(3, "memory", memory),
            ledger.from_table(3, "fit", fit),
            ledger.from_table(3, "model", model),
        ],
        section=3,
    )
    assert (rows["status"] == "pass").all(), rows[rows["status"] != "pass"]
    assert (rows["tolerance"] == "abs 0").all()


def test_gb_and_gib_units_differ():
    gib = capacity.capacity(section.ARTICLE_SHAPE, 80, 16, 1000, unit="GiB")
    gb = capacity.capacity(section.ARTICLE_SHAPE, 80, 16, 1000, unit="GB")
    assert gib["free_bytes"] == 64 * 2**30 and gb["free_bytes"] == 64 * 10**9
    assert (gib["max_num_requests"], gb["max_num_requests"]) == (131, 122)


@given(
    layers=st.integers(1, 128),
    heads=st.integers(1, 128),
    head_dim=st.sampled_from([64, 80, 96, 128, 256]),
    dtype_bytes=st.sampled_from([0.5, 1, 2, 4]),
    context=st.integers(1, 2_000_000),
    gpu=st.integers(1, 200),
    weights_share=st.floats(0, 0.95),
)
def test_max_num_requests_is_the_floor(layers, heads, head_dim, dtype_bytes, context, gpu, weights_share):
    shape = capacity.KVShape(layers, heads, head_dim, dtype_bytes)
    weights = gpu * weights_share
    got = capacity.capacity(shape, gpu, weights, context)
    per = 2 * layers * heads * head_dim * dtype_bytes * context
    assert got["bytes_per_request"] == per
    n = got["max_num_requests"]
    free = (Fraction(gpu) - Fraction(weights)) * 2**30
    assert n * per <= free < (n + 1) * per


@given(st.lists(st.integers(1, 10**6), min_size=2, max_size=8, unique=True))
def test_fewer_requests_fit_as_context_grows(contexts):
    contexts = sorted(contexts)
    counts = section.fit_table(section.ARTICLE_SHAPE, 80, 16, contexts)["max_num_requests"].tolist()
    assert counts == sorted(counts, reverse=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_layers=-1, num_kv_heads=32, head_dim=128), "num_layers=-1 is not allowed: must be an integer >= 1"),
        (dict(num_layers=32, num_kv_heads=0, head_dim=128), "num_kv_heads=0 is not allowed"),
        (dict(num_layers=32, num_kv_heads=32, head_dim=128, dtype_bytes=0), "dtype_bytes=0 is not allowed"),
    ],
)
def test_bad_shapes_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        capacity.KVShape(**kwargs)


def test_bad_budget_and_context():
    with pytest.raises(ValueError, match="gpu_memory=0 is not allowed"):
        section.fit_table(section.ARTICLE_SHAPE, 0, 0, CONTEXTS)
    with pytest.raises(ValueError, match="weights=90 is not allowed: must be below the GPU memory"):
        section.fit_table(section.ARTICLE_SHAPE, 80, 90, CONTEXTS)
    with pytest.raises(ValueError, match="context_tokens=0 is not allowed"):
        capacity.capacity(section.ARTICLE_SHAPE, 80, 16, 0)
    with pytest.raises(ValueError, match="unit='TB' is not allowed"):
        section.fit_table(section.ARTICLE_SHAPE, 80, 16, CONTEXTS, unit="TB")
    assert capacity.capacity(section.ARTICLE_SHAPE, 80, 16, 10**8)["max_num_requests"] == 0
    with pytest.raises(
        ValueError, match="context_tokens=1000000000 is not allowed: must be an integer from 1 to 100,000,000 tokens"
    ):
        capacity.capacity(section.ARTICLE_SHAPE, 80, 16, 10**9)
