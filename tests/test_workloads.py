"""Request-length generators and the fit of the article's section 1 lengths."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import workloads
from kvlab.sections import s01_allocation as allocation
from kvlab.workloads import LENGTH_DISTRIBUTIONS, sample_lengths, synthetic


def rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("name", list(LENGTH_DISTRIBUTIONS))
def test_every_family_is_seeded_whole_and_within_the_maximum(name):
    a = sample_lengths(name, 5000, rng(1), max_len_tokens=4096)
    b = sample_lengths(name, 5000, rng(1), max_len_tokens=4096)
    assert a.dtype == np.int64 and a.shape == (5000,)
    np.testing.assert_array_equal(a, b)
    assert a.min() >= 1 and a.max() <= 4096


def test_different_seeds_give_different_lengths():
    assert not np.array_equal(sample_lengths("article-s1", 1000, rng(0)), sample_lengths("article-s1", 1000, rng(1)))


@given(max_len=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_truncated_families_never_exceed_a_smaller_maximum(max_len, seed):
    for name in ("article-s1", "exponential", "uniform"):
        lengths = sample_lengths(name, 500, rng(seed), max_len_tokens=max_len)
        assert 1 <= lengths.min() and lengths.max() <= max_len


def test_article_s2_is_the_section_2_mixture():
    lengths = sample_lengths("article-s2", 200_000, rng(3))
    short = (lengths >= 40) & (lengths <= 200)
    long = (lengths >= 400) & (lengths <= 1000)
    assert np.all(short | long)
    assert lengths[short].min() == 40 and lengths[short].max() == 200
    assert lengths[long].min() == 400 and lengths[long].max() == 1000
    # 15% long: binomial standard deviation is 0.0008 at 200,000 draws; allow 5 of them.
    assert abs(long.mean() - 0.15) < 0.004
    assert abs(lengths.mean() - (0.85 * 120 + 0.15 * 700)) < 2.5  # the article's 207-token mean


def test_article_s2_parameters_are_one_keyword_away():
    lengths = sample_lengths("article-s2", 1000, rng(0), long_share=0.0, short_tokens=(150, 150))
    assert np.all(lengths == 150)


def test_exponential_mean_matches_its_truncated_expectation():
    lengths = sample_lengths("exponential", 200_000, rng(5), mean_tokens=300, max_len_tokens=100_000)
    # ceil of an exponential with mean m has mean 1 / (1 - exp(-1/m)).
    assert lengths.mean() == pytest.approx(1 / (1 - np.exp(-1 / 300)), rel=0.01)


def test_constant_and_uniform():
    assert np.all(sample_lengths("constant", 10, rng(), tokens=7) == 7)
    u = sample_lengths("uniform", 50_000, rng(), low_tokens=10, high_tokens=20)
    assert set(np.unique(u)) == set(range(10, 21))


def test_article_s1_pmf_is_a_distribution_on_1_to_max():
    pmf = synthetic.article_s1_pmf(**synthetic.S1_MIXTURE_PARAMS)
    assert pmf.shape == (4096,) and pmf.min() > 0
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    # the uniform share puts at least uniform_share / 4096 on every length
    assert pmf.min() >= synthetic.S1_MIXTURE_PARAMS["uniform_share"] / 4096 * (1 - 1e-12)


def test_article_s1_sampler_follows_its_pmf():
    pmf = synthetic.article_s1_pmf(**synthetic.S1_MIXTURE_PARAMS)
    lengths = sample_lengths("article-s1", 400_000, rng(9))
    expected_mean = float(pmf @ np.arange(1, 4097))
    assert lengths.mean() == pytest.approx(expected_mean, rel=0.005)
    assert (lengths <= 256).mean() == pytest.approx(pmf[:256].sum(), abs=0.004)


def test_expected_totals_equal_a_direct_sum():
    pmf = np.array([0.5, 0.0, 0.25, 0.25])  # lengths 1, 3, 4
    got = allocation.expected_totals(pmf, 4, [4, 2])
    # per request: mean length 0.5*1 + 0.25*3 + 0.25*4; blocks of 4: 1 each; blocks of 2: 1, 2, 2
    np.testing.assert_allclose(got, [4 * 2.25, 4 * 4, 4 * 2 * (0.5 + 0.5 + 0.5)])


def test_fit_reproduces_the_published_totals_and_the_default_parameters():
    fit = allocation.fit_article_lengths()
    assert fit.max_relative_error < 0.001  # every published total within 0.1% in expectation
    for name, value in synthetic.S1_MIXTURE_PARAMS.items():
        assert fit.params[name] == pytest.approx(value, abs=2e-4), name
    assert list(fit.table.index) == ["used (tokens)"] + [
        f"reserved with {b}-token blocks (tokens)" for b in (4096, 1024, 256, 64, 16)
    ]


def test_fit_targets_come_from_the_article_figures():
    t = allocation.article_s1_targets()
    assert t["used_tokens"] == 11_336_014 and t["num_requests"] == 20_000
    assert t["reserved_tokens"] == {4096: 81_920_000, 1024: 26_132_480, 256: 13_992_448, 64: 11_958_528, 16: 11_486_464}


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sample_lengths("zipf", 10, rng()), "lengths='zipf' is not allowed: must be one of article-s1"),
        (
            lambda: sample_lengths("uniform", 0, rng()),
            "num_requests=0 is not allowed: must be an integer from 1 to 10,000,000,000 requests",
        ),
        (lambda: sample_lengths("exponential", 10, rng(), mean_tokens=-1), "mean_tokens=-1 is not allowed"),
        (lambda: sample_lengths("exponential", 10, rng(), width=3), "params=['width'] is not allowed"),
        (
            lambda: sample_lengths("article-s2", 10, rng(), long_tokens=(900, 400)),
            "long_tokens=(900, 400) is not allowed",
        ),
        (lambda: sample_lengths("article-s2", 10, rng(), long_share=1.5), "long_share=1.5 is not allowed"),
        (lambda: sample_lengths("constant", 10, rng(), tokens=0), "tokens=0 is not allowed"),
        (lambda: synthetic.article_s1_pmf(5.0, 0.0, 0.1), "log_sigma=0.0 is not allowed"),
        (lambda: synthetic.article_s1_pmf(float("nan"), 1.0, 0.1), "log_mean=nan is not allowed"),
    ],
)
def test_bad_parameters_raise_one_line(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "prompt, output, message",
    [
        ([0, 2.5], [1, 1], r"prompt_tokens\[1\]=2.5 is not allowed: must be a whole number of tokens"),
        ([0, 0], [1, 1.5], r"output_tokens\[1\]=1.5 is not allowed: must be a whole number of tokens"),
        ([0, 0], [1, float("nan")], r"output_tokens\[1\]=nan is not allowed: must be a whole number of tokens"),
    ],
)
def test_a_workload_refuses_fractional_token_counts_instead_of_truncating_them(prompt, output, message):
    with pytest.raises(ValueError, match="^" + message):
        workloads.Workload(np.array([0.0, 1.0]), np.array(prompt), np.array(output))
    whole = workloads.Workload(np.array([0.0, 1.0]), np.array([0.0, 3.0]), np.array([1.0, 2.0]))
    assert whole.prompt_tokens.tolist() == [0, 3] and whole.output_tokens.dtype == np.int64


def test_a_workload_refuses_prefix_hashes_that_do_not_cover_the_prompt():
    """Each request's prompt block ids cover its prompt (one for every prefix_block_tokens), as Mooncake's rows do: a
    shorter list is refused in one line naming the request and what it needs."""
    ok = workloads.Workload(
        np.zeros(2), np.array([512, 513]), np.ones(2), prefix_hashes=([0], [0, 1]), prefix_block_tokens=512
    )
    assert len(ok.prefix_hashes[1]) == 2
    with pytest.raises(
        ValueError,
        match=r"^prefix_hashes\[1\]='1 ids' is not allowed: request 1's 513 prompt tokens need 2 ids \(one for every 512 prompt tokens\)$",
    ):
        workloads.Workload(
            np.zeros(2), np.array([512, 513]), np.ones(2), prefix_hashes=([0], [0]), prefix_block_tokens=512
        )
