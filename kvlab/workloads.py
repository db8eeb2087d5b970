"""Workloads: what requests arrive when, and how long their prompts and outputs are."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlab import validate


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests in arrival order: arrival time (s, first at 0 or later), prompt and output tokens.

    prefix_hashes, when known (e.g. the Mooncake trace), holds one array of prefix-block hash ids
    per request, each block covering prefix_block_tokens prompt tokens.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_hashes: tuple[np.ndarray, ...] | None = None
    prefix_block_tokens: int | None = None
    name: str = ""

    def __post_init__(self):
        arrival = np.ascontiguousarray(self.arrival_s, dtype=np.float64)
        prompt = _token_counts("prompt_tokens", self.prompt_tokens)
        output = _token_counts("output_tokens", self.output_tokens)
        n = len(arrival)
        if n == 0:
            validate.fail("num_requests", 0, "a workload needs at least one request")
        if len(prompt) != n or len(output) != n:
            validate.fail("prompt_tokens", f"{len(prompt)} values", f"must match the {n} arrival times "
                          f"(output_tokens has {len(output)})")
        if not np.all(np.isfinite(arrival)) or arrival.min() < 0:
            validate.fail("arrival_s", float(arrival.min()), "arrival times must be finite and >= 0")
        if n > 1 and np.any(np.diff(arrival) < 0):
            i = int(np.argmax(np.diff(arrival) < 0)) + 1
            validate.fail(f"arrival_s[{i}]", float(arrival[i]), f"must not be before arrival_s[{i - 1}]="
                          f"{float(arrival[i - 1])} (requests come in arrival order)")
        if prompt.min() < 0:
            i = int(np.argmin(prompt))
            validate.fail(f"prompt_tokens[{i}]", int(prompt[i]), "must be >= 0")
        if output.min() < 1:
            i = int(np.argmin(output))
            validate.fail(f"output_tokens[{i}]", int(output[i]), "must be >= 1")
        if self.prefix_hashes is not None:
            if len(self.prefix_hashes) != n:
                validate.fail("prefix_hashes", f"{len(self.prefix_hashes)} entries", f"must have one per request ({n})")
            validate.positive_int("prefix_block_tokens", self.prefix_block_tokens)
        for name, value in (("arrival_s", arrival), ("prompt_tokens", prompt), ("output_tokens", output)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return len(self.arrival_s)

    def __len__(self) -> int:
        return self.num_requests

    @property
    def total_tokens(self) -> np.ndarray:
        """Each request's length, prompt + output tokens (what section 1 reserves memory for)."""
        return self.prompt_tokens + self.output_tokens


def _token_counts(name: str, values) -> np.ndarray:
    """values as contiguous int64 token counts; a fractional or non-finite count is a ValueError, never truncated."""
    array = np.asarray(values)
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.round(array))
        if bad.any():
            i = int(np.argmax(bad))
            validate.fail(f"{name}[{i}]", float(array[i]), "must be a whole number of tokens")
    return np.ascontiguousarray(array, dtype=np.int64)


def poisson_arrivals(num_requests: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a Poisson process at rate_per_s, the first request at 0."""
    num_requests = validate.positive_int("num_requests", num_requests)
    rate_per_s = validate.positive_number("arrival_rate", rate_per_s)
    gaps = rng.exponential(1.0 / rate_per_s, size=num_requests)
    gaps[0] = 0.0
    return np.cumsum(gaps)


# ---------------------------------------------------------------- request lengths
# Section 1 counts KV slots per request at its longest, so a "length" here is the total tokens a
# request holds at its end (prompt + output). Every generator returns int64 lengths >= 1.

ARTICLE_MAX_LEN_TOKENS = 4096
# The article-s1 mixture, fitted by fit_article_lengths() to the article's section 1 totals (see there).
ARTICLE_S1_PARAMS = {"log_mean": 5.2081, "log_sigma": 0.8259, "uniform_share": 0.1728}
# Section 2's output lengths, as the article states them: 85% in [40, 200], 15% in [400, 1,000] tokens.
ARTICLE_S2_PARAMS = {"short_tokens": (40, 200), "long_tokens": (400, 1000), "long_share": 0.15}


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF, elementwise (math.erf: numpy has none and scipy is not a dependency)."""
    return 0.5 * (1.0 + np.frompyfunc(math.erf, 1, 1)(x / math.sqrt(2.0)).astype(np.float64))


def article_s1_pmf(log_mean: float, log_sigma: float, uniform_share: float,
                   max_len_tokens: int = ARTICLE_MAX_LEN_TOKENS) -> np.ndarray:
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
    edges = np.log(np.arange(1, max_len_tokens + 1, dtype=np.float64))
    cdf = _normal_cdf((edges - float(log_mean)) / log_sigma)
    lognormal = np.diff(cdf, prepend=0.0)
    if cdf[-1] <= 0:
        validate.fail("log_mean", log_mean, f"puts no mass at or below max_len_tokens={max_len_tokens}")
    lognormal /= cdf[-1]
    return (1.0 - uniform_share) * lognormal + uniform_share / max_len_tokens


def _from_pmf(pmf: np.ndarray, num_requests: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths 1..len(pmf) drawn by inverse CDF from pmf (index l - 1 holds P(length = l))."""
    cdf = np.cumsum(pmf)
    return np.searchsorted(cdf, rng.random(num_requests) * cdf[-1], side="right").astype(np.int64) + 1


def _article_s1(num_requests, rng, *, max_len_tokens=ARTICLE_MAX_LEN_TOKENS, **params):
    params = {**ARTICLE_S1_PARAMS, **params}
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
    params = {**ARTICLE_S2_PARAMS, **params}
    unknown = set(params) - set(ARTICLE_S2_PARAMS)
    if unknown:
        validate.fail("params", sorted(unknown), f"article-s2 takes {', '.join(ARTICLE_S2_PARAMS)}")
    long_share = validate.fraction("long_share", params["long_share"], low_open=False)
    short = _uniform_int("short_tokens", params["short_tokens"], rng, num_requests)
    long = _uniform_int("long_tokens", params["long_tokens"], rng, num_requests)
    return np.where(rng.random(num_requests) < long_share, long, short)


def _exponential(num_requests, rng, *, mean_tokens=567.0, max_len_tokens=ARTICLE_MAX_LEN_TOKENS):
    # ceil of an exponential conditioned on <= max_len_tokens, by inverse CDF (no clipping spike at the max).
    mean_tokens = validate.positive_number("mean_tokens", mean_tokens)
    max_len_tokens = validate.positive_int("max_len_tokens", max_len_tokens)
    top = -np.expm1(-max_len_tokens / mean_tokens)
    x = -mean_tokens * np.log1p(-rng.random(num_requests) * top)
    return np.clip(np.ceil(x), 1, max_len_tokens).astype(np.int64)


def _uniform(num_requests, rng, *, low_tokens=1, high_tokens=None, max_len_tokens=ARTICLE_MAX_LEN_TOKENS):
    high_tokens = max_len_tokens if high_tokens is None else high_tokens
    return _uniform_int("low_tokens/high_tokens", (low_tokens, high_tokens), rng, num_requests)


def _constant(num_requests, rng, *, tokens=567, max_len_tokens=None):
    return np.full(num_requests, validate.positive_int("tokens", tokens), dtype=np.int64)


def _gamma(num_requests, rng, *, mean_tokens=207.0, cv=1.0, max_len_tokens=None):
    # Gamma of shape 1/cv^2 and scale mean*cv^2, rounded, at least 1; cv = 0 is every request mean_tokens.
    mean_tokens = validate.positive_number("mean_tokens", mean_tokens)
    cv = validate.non_negative_number("cv", cv)
    if cv == 0:
        return np.full(num_requests, max(1, round(mean_tokens)), dtype=np.int64)
    draws = rng.gamma(1.0 / cv**2, mean_tokens * cv**2, size=num_requests)
    return np.maximum(1, np.rint(draws)).astype(np.int64)


# name -> (generator, one-line description). Add a family here and `kvlab allocate --lengths` lists it.
LENGTH_DISTRIBUTIONS = {
    "article-s1": (_article_s1, "section 1 default: lognormal(5.208, 0.826) with 17.3% uniform on 1..max, "
                                "fitted to the article's totals (mean ~567 tokens)"),
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
    num_requests = validate.positive_int("num_requests", num_requests)
    generator, _ = LENGTH_DISTRIBUTIONS[name]
    try:
        return generator(num_requests, rng, **params)
    except TypeError as error:  # an unknown keyword: say which family takes what
        validate.fail("params", sorted(params), f"not accepted by {name!r} ({error})")


# ---------------------------------------------------------------- fitting the article's lengths
@dataclass(frozen=True)
class LengthFit:
    """The article-s1 parameters that best reproduce the published section 1 totals, and how well."""

    params: dict
    table: "pd.DataFrame"   # per published figure: article, expected under the fit, relative difference
    max_relative_error: float


def article_s1_targets() -> dict:
    """The section 1 totals the fit aims at, from data/article_figures.csv: used tokens and reserved per unit."""
    from kvlab import ledger

    figures = ledger.article_figures(1)
    used = figures.query("table == 'workload' and column == 'used_tokens'")["value"].iloc[0]
    reserved = figures.query("table == 'allocation' and column == 'reserved_tokens'")
    return {"num_requests": 20_000, "used_tokens": int(used),
            "reserved_tokens": {int(r): int(v) for r, v in zip(reserved["row"], reserved["value"])}}


def expected_totals(pmf: np.ndarray, num_requests: int, block_sizes) -> np.ndarray:
    """Expected used tokens, then expected reserved tokens for each block size, over num_requests lengths."""
    lengths = np.arange(1, len(pmf) + 1, dtype=np.float64)
    used = num_requests * float(pmf @ lengths)
    reserved = [num_requests * b * float(pmf @ np.ceil(lengths / b)) for b in block_sizes]
    return np.array([used, *reserved])


def fit_article_lengths(targets: dict | None = None, start=(5.5, 1.0, 0.1), max_iter: int = 600) -> LengthFit:
    """Fit article-s1's (log_mean, log_sigma, uniform_share) to the article's totals by least squares.

    The objective is the sum of squared relative errors of the expected used total and the expected
    reserved totals (one per reservation unit), minimised by Nelder-Mead from start; deterministic.
    """
    import pandas as pd

    targets = targets or article_s1_targets()
    n = targets["num_requests"]
    blocks = sorted(targets["reserved_tokens"], reverse=True)
    goal = np.array([targets["used_tokens"], *(targets["reserved_tokens"][b] for b in blocks)], dtype=np.float64)
    max_len = max(blocks)

    def params_of(x):
        return {"log_mean": float(x[0]), "log_sigma": abs(float(x[1])) + 1e-9,
                "uniform_share": float(np.clip(x[2], 0.0, 1.0))}

    def loss(x):
        got = expected_totals(article_s1_pmf(max_len_tokens=max_len, **params_of(x)), n, blocks)
        return float(np.sum(((got - goal) / goal) ** 2))

    best = _nelder_mead(loss, np.array(start, dtype=np.float64), np.array([0.3, 0.2, 0.05]), max_iter)
    params = {k: round(v, 4) for k, v in params_of(best).items()}
    got = expected_totals(article_s1_pmf(max_len_tokens=max_len, **params), n, blocks)
    labels = ["used_tokens"] + [f"reserved_tokens @ {b}" for b in blocks]
    table = pd.DataFrame({"article": goal, "expected_under_fit": got}, index=pd.Index(labels, name="figure"))
    table["relative_error_pct"] = 100 * (table["expected_under_fit"] - table["article"]) / table["article"]
    return LengthFit(params, table, float(np.abs(table["relative_error_pct"]).max() / 100))


def _nelder_mead(f, x0: np.ndarray, step: np.ndarray, max_iter: int, tol: float = 1e-14) -> np.ndarray:
    """Minimise f from x0 with the Nelder-Mead simplex (reflect 1, expand 2, contract and shrink 1/2)."""
    simplex = [x0] + [x0 + np.eye(len(x0))[i] * step[i] for i in range(len(x0))]
    values = [f(x) for x in simplex]
    for _ in range(max_iter):
        order = np.argsort(values, kind="stable")
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] <= tol:
            break
        centre = np.mean(simplex[:-1], axis=0)
        reflected = centre + (centre - simplex[-1])
        f_reflected = f(reflected)
        if f_reflected < values[0]:
            expanded = centre + 2 * (centre - simplex[-1])
            f_expanded = f(expanded)
            simplex[-1], values[-1] = (expanded, f_expanded) if f_expanded < f_reflected else (reflected, f_reflected)
        elif f_reflected < values[-2]:
            simplex[-1], values[-1] = reflected, f_reflected
        else:
            contracted = centre + 0.5 * (simplex[-1] - centre)
            f_contracted = f(contracted)
            if f_contracted < values[-1]:
                simplex[-1], values[-1] = contracted, f_contracted
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]
