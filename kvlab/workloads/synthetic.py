"""Synthetic workloads: Poisson arrivals and request-length families, drawn from a numpy Generator."""

from __future__ import annotations

import math

import numpy as np

from kvlab.core import article, validate
from kvlab.core.workload import Workload


def poisson_arrivals(num_requests: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a Poisson process at rate_per_s, the first request at 0."""
    num_requests = validate.in_range("num_requests", num_requests, "num_requests")
    rate_per_s = validate.in_range("arrival_rate", rate_per_s, "arrival_rate")
    gaps = rng.exponential(1.0 / rate_per_s, size=num_requests)
    gaps[0] = 0.0
    return np.cumsum(gaps)


# ---------------------------------------------------------------- request lengths
# Section 1 counts KV slots per request at its longest, so a "length" here is the total tokens a
# request holds at its end (prompt + output). Every generator returns int64 lengths >= 1.

# kvlab's choice for section 1 (the article publishes no distribution): the article-s1 mixture, fitted by
# kvlab.sections.s01_allocation.fit_article_lengths() to the article's section 1 totals (see there).
S1_MIXTURE_PARAMS = {"log_mean": 5.2081, "log_sigma": 0.8259, "uniform_share": 0.1728}
# Section 2's output lengths, as the article states them: 85% in [40, 200], 15% in [400, 1,000] tokens.
S2_OUTPUT_PARAMS = {
    "short_tokens": article.SHORT_OUTPUT_TOKENS,
    "long_tokens": article.LONG_OUTPUT_TOKENS,
    "long_share": article.LONG_OUTPUT_SHARE,
}


def article_s1_pmf(
    log_mean: float, log_sigma: float, uniform_share: float, max_len_tokens: int = article.MAX_LEN_TOKENS
) -> np.ndarray:
    """P(length = l) for l = 1..max_len_tokens (index l - 1) of the article-s1 mixture.

    With probability 1 - uniform_share a length is ceil(X), X lognormal(log_mean, log_sigma) conditioned
    on X <= max_len_tokens (chat-sized requests); otherwise it is uniform on 1..max_len_tokens (requests
    spread over the whole allowed context).
    """
    if isinstance(log_mean, bool) or not isinstance(log_mean, (int, float, np.number)) or not math.isfinite(log_mean):
        validate.fail("log_mean", log_mean, "must be a finite number (log of tokens)")
    log_sigma = validate.positive_number("log_sigma", log_sigma)
    uniform_share = validate.fraction("uniform_share", uniform_share, low_open=False)
    max_len_tokens = validate.positive_int("max_len_tokens", max_len_tokens)
    from scipy.special import ndtr  # here, not at the top: scipy.special takes ~0.5 s to import

    edges = np.log(np.arange(1, max_len_tokens + 1, dtype=np.float64))
    cdf = ndtr((edges - float(log_mean)) / log_sigma)
    lognormal = np.diff(cdf, prepend=0.0)
    if cdf[-1] <= 0:
        validate.fail("log_mean", log_mean, f"puts no mass at or below max_len_tokens={max_len_tokens}")
    lognormal /= cdf[-1]
    return (1.0 - uniform_share) * lognormal + uniform_share / max_len_tokens


def _from_pmf(pmf: np.ndarray, num_requests: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths 1..len(pmf) drawn by inverse CDF from pmf (index l - 1 holds P(length = l))."""
    cdf = np.cumsum(pmf)
    return np.searchsorted(cdf, rng.random(num_requests) * cdf[-1], side="right").astype(np.int64) + 1


def _article_s1(num_requests, rng, *, max_len_tokens=article.MAX_LEN_TOKENS, **params):
    params = {**S1_MIXTURE_PARAMS, **params}
    return _from_pmf(article_s1_pmf(max_len_tokens=max_len_tokens, **params), num_requests, rng)


def _uniform_int(name: str, bounds, rng, size) -> np.ndarray:
    low, high = _bounds(name, bounds)
    return rng.integers(low, high + 1, size=size, dtype=np.int64)


def _bounds(name: str, bounds) -> tuple[int, int]:
    try:
        low, high = bounds
    except (TypeError, ValueError):
        validate.fail(name, bounds, "must be a pair (low, high) of token counts")
    low, high = validate.positive_int(f"{name}[0]", low), validate.positive_int(f"{name}[1]", high)
    if high < low:
        validate.fail(name, bounds, "must have low <= high")
    return low, high


def _article_s2(num_requests, rng, *, max_len_tokens=None, **params):
    params = {**S2_OUTPUT_PARAMS, **params}
    unknown = set(params) - set(S2_OUTPUT_PARAMS)
    if unknown:
        validate.fail("params", sorted(unknown), f"article-s2 takes {', '.join(S2_OUTPUT_PARAMS)}")
    long_share = validate.fraction("long_share", params["long_share"], low_open=False)
    short = _uniform_int("short_tokens", params["short_tokens"], rng, num_requests)
    long = _uniform_int("long_tokens", params["long_tokens"], rng, num_requests)
    return np.where(rng.random(num_requests) < long_share, long, short)


def _exponential(num_requests, rng, *, mean_tokens=float(article.MEAN_TOKENS), max_len_tokens=article.MAX_LEN_TOKENS):
    # ceil of an exponential conditioned on <= max_len_tokens, by inverse CDF (no clipping spike at the max).
    mean_tokens = validate.positive_number("mean_tokens", mean_tokens)
    max_len_tokens = validate.positive_int("max_len_tokens", max_len_tokens)
    top = -np.expm1(-max_len_tokens / mean_tokens)
    x = -mean_tokens * np.log1p(-rng.random(num_requests) * top)
    return np.clip(np.ceil(x), 1, max_len_tokens).astype(np.int64)


def _uniform(num_requests, rng, *, low_tokens=1, high_tokens=None, max_len_tokens=article.MAX_LEN_TOKENS):
    high_tokens = max_len_tokens if high_tokens is None else high_tokens
    return _uniform_int("low_tokens/high_tokens", (low_tokens, high_tokens), rng, num_requests)


def _constant(num_requests, rng, *, tokens=article.MEAN_TOKENS, max_len_tokens=None):
    return np.full(num_requests, validate.positive_int("tokens", tokens), dtype=np.int64)


def _gamma(num_requests, rng, *, mean_tokens=article.MEAN_OUTPUT_TOKENS, cv=1.0, max_len_tokens=None):
    # Gamma of shape 1/cv^2 and scale mean*cv^2, rounded, at least 1; cv = 0 is every request mean_tokens.
    mean_tokens = validate.positive_number("mean_tokens", mean_tokens)
    cv = validate.non_negative_number("cv", cv)
    if cv == 0:
        return np.full(num_requests, max(1, round(mean_tokens)), dtype=np.int64)
    draws = rng.gamma(1.0 / cv**2, mean_tokens * cv**2, size=num_requests)
    return np.maximum(1, np.rint(draws)).astype(np.int64)


# name -> (generator, one-line description). Add a family here and `kvlab allocate --lengths` lists it.
LENGTH_DISTRIBUTIONS = {
    "article-s1": (
        _article_s1,
        "section 1 default: lognormal(5.208, 0.826) with 17.3% uniform on 1..max, "
        "fitted to the article's totals (mean ~567 tokens)",
    ),
    "article-s2": (_article_s2, "section 2 outputs: 85% uniform 40-200, 15% uniform 400-1,000 tokens"),
    "exponential": (_exponential, "exponential, mean 567 tokens, conditioned on <= max"),
    "uniform": (_uniform, "uniform on 1..max tokens"),
    "constant": (_constant, "every request 567 tokens"),
    "gamma": (_gamma, "gamma, mean 207 tokens (section 2's mean), coefficient of variation cv (default 1)"),
}


def sample_lengths(name: str, num_requests: int, rng: np.random.Generator, **params) -> np.ndarray:
    """num_requests request lengths (tokens, int64 >= 1) from the named family in LENGTH_DISTRIBUTIONS.

    params override the family's defaults (e.g. mean_tokens=300, max_len_tokens=8192). Every family
    takes max_len_tokens: article-s1, exponential and uniform draw at or below it; article-s2 and
    constant ignore it (their lengths are fixed by their own parameters).
    """
    validate.one_of("lengths", name, LENGTH_DISTRIBUTIONS)
    num_requests = validate.in_range("num_requests", num_requests, "num_requests")
    generator, _ = LENGTH_DISTRIBUTIONS[name]
    try:
        return generator(num_requests, rng, **params)
    except TypeError as error:  # an unknown keyword: say which family takes what
        validate.fail("params", sorted(params), f"not accepted by {name!r} ({error})")


# ---------------------------------------------------------------- the article's section 2 workload
S2_LENGTHS = ("article", "constant")
# kvlab's choice: the article gives no arrival process. Poisson arrivals at 11 requests/s put most of the
# article's figures inside kvlab's seed band; notebook 02 sweeps the rate to show how much it matters.
S2_ARRIVAL_RATE_PER_S = 11.0


def article_s2_workload(
    num_requests: int,
    arrival_rate: float,
    lengths: str,
    rng: np.random.Generator,
    *,
    constant_tokens: int = article.CONSTANT_TOKENS,
) -> Workload:
    """Poisson arrivals at arrival_rate (requests/s) with the article's section 2 output lengths, no prompts.

    lengths: "article" (85% uniform 40-200, 15% uniform 400-1,000 tokens) or "constant"
    (every request constant_tokens long). Arrivals are drawn first, then lengths, from rng.
    """
    validate.one_of("lengths", lengths, S2_LENGTHS)
    arrival = poisson_arrivals(num_requests, arrival_rate, rng)
    if lengths == "article":
        output = sample_lengths("article-s2", num_requests, rng)
    else:
        output = sample_lengths("constant", num_requests, rng, tokens=constant_tokens)
    return Workload(arrival, np.zeros(num_requests, dtype=np.int64), output, name=f"poisson-{lengths}")


# ---------------------------------------------------------------- a plain serving workload
def gamma_workload(
    num_requests: int,
    rate_per_s: float,
    prompt_tokens: float,
    output_tokens: float,
    rng: np.random.Generator,
    *,
    cv: float = 1.0,
) -> Workload:
    """Poisson arrivals at rate_per_s (requests/s), then gamma prompt and output lengths of those means (tokens) and
    coefficient of variation cv, each at least 1 token: kvlab's stand-in for a real trace."""
    arrival = poisson_arrivals(num_requests, rate_per_s, rng)
    prompt = sample_lengths("gamma", num_requests, rng, mean_tokens=prompt_tokens, cv=cv)
    output = sample_lengths("gamma", num_requests, rng, mean_tokens=output_tokens, cv=cv)
    return Workload(arrival, prompt, output, name=f"synthetic: {rate_per_s:g} requests/s")
