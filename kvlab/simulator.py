"""The serving engine model of section 2: static vs continuous batching, event-driven.

The article's model: max_num_seqs slots; a request holds one slot for output_tokens x ms_per_token
(prompts cost nothing); requests are served first come, first served in arrival order (ties: the
order they were given).
- continuous ("fill a free slot"): a request starts at max(its arrival, the moment a slot frees).
- static ("start together, finish together"): when no batch runs and requests wait, the first
  min(max_num_seqs, waiting) that have arrived start together; with none waiting, the batch starts
  at the next arrival with those arrived by then. Every request of a batch is released when the
  batch's longest request is done, and the next batch starts then.

The simulator jumps from event to event (a heap of slot free times; one step per batch) and never
steps token by token; tests/stepwise.py is the per-step loop the tests hold it to.

Seams for what vLLM adds later: the cost model (``TokenCost``: here a constant time per output
token, so a request's service time is known on arrival; ``CalibratedCost``: measured decode step
times of a calibration file at a fixed batch size) and the scheduler policy (an object with
``schedule(arrival_s, service_s, max_num_seqs) -> Schedule``). A KV-memory budget, prefill costs or a
batch-dependent step time replace these two objects, not ``simulate``.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvlab import ledger, validate, workloads
from kvlab.workloads import Workload

SUMMARY_KEYS = ("num_requests", "mean_latency_s", "p95_latency_s", "max_latency_s", "mean_queue_s",
                "makespan_s", "throughput_rps", "busy_slot_s", "idle_share")
LENGTHS = ("article", "constant")


@dataclass(frozen=True)
class TokenCost:
    """The article's cost model: every output token takes ms_per_token; prompts take nothing."""

    ms_per_token: float = 8.0

    def __post_init__(self):
        validate.positive_number("ms_per_token", self.ms_per_token)

    def service_s(self, output_tokens: np.ndarray, prompt_tokens: np.ndarray | None = None) -> np.ndarray:
        """Seconds each request holds its slot: output_tokens x ms_per_token (prompt_tokens cost nothing)."""
        return np.asarray(output_tokens, dtype=np.float64) * (self.ms_per_token / 1000.0)


def _lerp(xp: np.ndarray, fp: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Piecewise-linear fp(x) along the first axis of fp, clamped to xp's ends; a grid point gives its own value
    (a missing neighbour, NaN, does not leak into it)."""
    x = np.clip(x, xp[0], xp[-1])
    if len(xp) == 1:
        return np.broadcast_to(fp[0], x.shape + fp.shape[1:]).copy()
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, len(xp) - 2)
    w = ((x - xp[j]) / (xp[j + 1] - xp[j])).reshape(x.shape + (1,) * (fp.ndim - 1))
    low, high = fp[j], fp[j + 1]
    return np.where(w == 0, low, np.where(w == 1, high, (1 - w) * low + w * high))


@dataclass(frozen=True, eq=False)
class CalibratedCost:
    """A measured cost model: every decode step takes step_ms(batch_size, context), read from a calibration file.

    A request of p prompt tokens and n output tokens holds its slot for the n decode steps at contexts
    p, p+1, ..., p+n-1 (tokens already cached), each at the step time of a batch of batch_size requests
    (a fixed operating point, e.g. all slots busy), plus its prefill when include_prefill is True.
    Interpolation: bilinear in (log2 batch size, log2 context) between measured points; prefill linear in
    log2 prompt tokens. Outside the measured grid: outside="clamp" uses the nearest edge (constant
    extrapolation), outside="raise" refuses. A grid cell with an unmeasured corner (a batch x context
    whose cache did not fit the GPU) always refuses.
    """

    batch_sizes: np.ndarray       # measured batch sizes, increasing
    context_tokens: np.ndarray    # measured contexts, tokens, increasing
    step_ms: np.ndarray           # [batch, context] decode step time, ms (NaN: not measured)
    batch_size: int = 8           # requests decoded together at every step
    outside: str = "clamp"
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # measured prompts, tokens (empty: none)
    prefill_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))     # prefill time of one prompt, ms
    include_prefill: bool = False
    source: str = ""

    def __post_init__(self):
        validate.positive_int("batch_size", self.batch_size)
        validate.one_of("outside", self.outside, ("clamp", "raise"))
        shape = (len(self.batch_sizes), len(self.context_tokens))
        if np.shape(self.step_ms) != shape or 0 in shape:
            validate.fail("step_ms", np.shape(self.step_ms), f"must have the shape {shape} of (batch_sizes, context_tokens)")
        for name in ("batch_sizes", "context_tokens", "prompt_tokens"):
            values = np.asarray(getattr(self, name))
            if np.any(values <= 0) or np.any(np.diff(values) <= 0):
                validate.fail(name, values.tolist(), "must be positive and increasing")
        if self.include_prefill and len(self.prompt_tokens) == 0:
            validate.fail("include_prefill", True, f"{self.source or 'the calibration'} has no prefill_ms rows")

    @classmethod
    def from_csv(cls, path, *, batch_size: int = 8, outside: str = "clamp", include_prefill: bool = False) -> "CalibratedCost":
        """The cost model of a calibration file (kvlab calibrate's CSV); no torch needed."""
        from kvlab import calibrate

        calibration = calibrate.read_calibration(path)
        decode = calibration.kind("decode_step_ms")
        if decode.empty:
            validate.fail("path", str(path), "has no decode_step_ms rows")
        grid = decode.pivot(index="batch_size", columns="context_tokens", values="value").sort_index().sort_index(axis=1)
        prefill = calibration.kind("prefill_ms").sort_values("prompt_tokens")
        return cls(grid.index.to_numpy(dtype=np.float64), grid.columns.to_numpy(dtype=np.float64),
                   grid.to_numpy(dtype=np.float64), batch_size, outside,
                   prefill["prompt_tokens"].to_numpy(dtype=np.float64), prefill["value"].to_numpy(dtype=np.float64),
                   include_prefill, str(path))

    def _inside(self, name: str, values: np.ndarray, grid: np.ndarray) -> None:
        if self.outside == "raise" and (values.min() < grid[0] or values.max() > grid[-1]):
            bad = values.min() if values.min() < grid[0] else values.max()
            validate.fail(name, int(bad), f"lies outside the measured {grid[0]:g}..{grid[-1]:g} of {self.source or 'the calibration'} "
                          "(outside='clamp' uses the nearest edge)")

    def step_time_ms(self, context_tokens, batch_size: int | None = None) -> np.ndarray:
        """Decode step time (ms) at each context (tokens) for batch_size (default: the model's) requests."""
        batch = float(self.batch_size if batch_size is None else validate.positive_int("batch_size", batch_size))
        context = np.atleast_1d(np.asarray(context_tokens, dtype=np.float64))
        self._inside("batch_size", np.array([batch]), self.batch_sizes)
        self._inside("context_tokens", context, self.context_tokens)
        row = _lerp(np.log2(self.batch_sizes), self.step_ms, np.log2(np.array([batch])))[0]
        ms = _lerp(np.log2(self.context_tokens), row, np.log2(np.maximum(context, 1.0)))
        if np.isnan(ms).any():
            at = int(context[np.isnan(ms)][0])
            validate.fail("context_tokens", at, f"at batch size {batch:g} falls in a cell of {self.source or 'the calibration'} "
                          "with an unmeasured corner (its cache did not fit the GPU)")
        return ms

    def prefill_time_ms(self, prompt_tokens) -> np.ndarray:
        """Prefill time (ms) of one prompt of each length (tokens): linear in log2 prompt tokens."""
        prompt = np.atleast_1d(np.asarray(prompt_tokens, dtype=np.float64))
        self._inside("prompt_tokens", prompt, self.prompt_tokens)
        return _lerp(np.log2(self.prompt_tokens), self.prefill_ms, np.log2(np.maximum(prompt, 1.0)))

    def service_s(self, output_tokens: np.ndarray, prompt_tokens: np.ndarray | None = None) -> np.ndarray:
        """Seconds each request holds its slot: the sum of its decode step times (+ its prefill)."""
        output = np.asarray(output_tokens, dtype=np.int64)
        prompt = np.zeros_like(output) if prompt_tokens is None else np.asarray(prompt_tokens, dtype=np.int64)
        if len(output) == 0:
            return np.zeros(0)
        low, high = int(prompt.min()), int((prompt + output).max())
        # cum[c - low] = total step time of the steps at contexts low .. c-1: a request's steps are one difference
        steps = self.step_time_ms(np.arange(low, max(high, low + 1)))
        cum = np.concatenate([[0.0], np.cumsum(steps)])
        service_ms = cum[prompt + output - low] - cum[prompt - low]
        if self.include_prefill:
            service_ms = service_ms + np.where(prompt > 0, self.prefill_time_ms(np.maximum(prompt, 1)), 0.0)
        return service_ms / 1000.0


@dataclass(frozen=True)
class Schedule:
    """What a policy decided per request: start (s), release (s) and slot (0..max_num_seqs-1)."""

    start_s: np.ndarray
    finish_s: np.ndarray
    slot: np.ndarray


@dataclass(frozen=True)
class ContinuousBatching:
    """Fill a free slot: each request starts at max(arrival, first slot free), FCFS."""

    name: str = "continuous"

    def schedule(self, arrival_s: np.ndarray, service_s: np.ndarray, max_num_seqs: int) -> Schedule:
        """Start, release and slot of every request (a heap of (free time, slot); O(n log slots))."""
        n = len(arrival_s)
        arrival, service = arrival_s.tolist(), service_s.tolist()
        start, slot = [0.0] * n, [0] * n
        free = [(0.0, s) for s in range(max_num_seqs)]  # (time the slot frees, slot id): a heap
        replace = heapq.heapreplace
        for i in range(n):
            free_s, s = free[0]
            a = arrival[i]
            t = a if a > free_s else free_s
            start[i], slot[i] = t, s
            replace(free, (t + service[i], s))
        start = np.array(start)
        return Schedule(start, start + service_s, np.array(slot, dtype=np.int32))


@dataclass(frozen=True)
class StaticBatching:
    """Start together, finish together: a batch holds its slots until its longest request is done."""

    name: str = "static"

    def schedule(self, arrival_s: np.ndarray, service_s: np.ndarray, max_num_seqs: int) -> Schedule:
        """Start, release and slot of every request (one Python step per batch)."""
        n = len(arrival_s)
        arrival, service = arrival_s.tolist(), service_s.tolist()
        first, begin, end = [], [], []  # per batch: first request, start time, release time
        i, free_s = 0, 0.0
        while i < n:
            a = arrival[i]
            t = a if a > free_s else free_s
            # the batch: request i and the next ones that have arrived by t, at most max_num_seqs
            j = bisect_right(arrival, t, i + 1, min(i + max_num_seqs, n))
            free_s = t + max(service[i:j])
            first.append(i)
            begin.append(t)
            end.append(free_s)
            i = j
        sizes = np.diff(np.append(np.array(first, dtype=np.int64), n))
        start = np.repeat(np.array(begin), sizes)
        finish = np.repeat(np.array(end), sizes)
        slot = (np.arange(n) - np.repeat(np.array(first, dtype=np.int64), sizes)).astype(np.int32)
        return Schedule(start, finish, slot)


POLICIES = {"static": StaticBatching(), "continuous": ContinuousBatching()}


def policy_named(name: str):
    """The scheduler policy called name (static or continuous)."""
    return POLICIES[validate.one_of("policy", name, POLICIES)]


@dataclass(frozen=True, eq=False)
class SimulationResult:
    """Per-request records of one run: arrival, start, done (own last token), release, slot (s)."""

    policy: str
    max_num_seqs: int
    arrival_s: np.ndarray
    output_tokens: np.ndarray
    start_s: np.ndarray
    done_s: np.ndarray
    finish_s: np.ndarray
    slot: np.ndarray

    @property
    def latency_s(self) -> np.ndarray:
        """The article's "wait": release - arrival (s)."""
        return self.finish_s - self.arrival_s

    @property
    def queue_s(self) -> np.ndarray:
        """Queueing delay: start - arrival (s)."""
        return self.start_s - self.arrival_s

    def summary(self) -> dict:
        """Mean / p95 / max latency, mean queueing, makespan, requests/s, slot-busy s, idle share."""
        latency = self.latency_s
        makespan = float(self.finish_s.max() - self.arrival_s[0])
        busy = float((self.done_s - self.start_s).sum())
        return {
            "num_requests": int(len(latency)),
            "mean_latency_s": float(latency.mean()),
            "p95_latency_s": float(np.percentile(latency, 95)),
            "max_latency_s": float(latency.max()),
            "mean_queue_s": float(self.queue_s.mean()),
            "makespan_s": makespan,
            "throughput_rps": len(latency) / makespan,
            "busy_slot_s": busy,
            "idle_share": 1.0 - busy / (self.max_num_seqs * makespan),
        }

    def requests(self) -> pd.DataFrame:
        """One row per request: arrival, start, done, finish, slot, latency, queue (s)."""
        return pd.DataFrame({
            "arrival_s": self.arrival_s, "output_tokens": self.output_tokens, "start_s": self.start_s,
            "done_s": self.done_s, "finish_s": self.finish_s, "slot": self.slot,
            "latency_s": self.latency_s, "queue_s": self.queue_s,
        })


def simulate(workload: Workload, policy="continuous", *, max_num_seqs: int = 8,
             ms_per_token: float | None = None, cost=None) -> SimulationResult:
    """Serve workload on max_num_seqs slots at ms_per_token (default 8 ms); policy: "static", "continuous" or a policy object.

    cost: a cost model in place of TokenCost(ms_per_token), e.g. CalibratedCost.from_csv(path); give
    one or the other, not both."""
    if not isinstance(workload, Workload):
        validate.fail("workload", type(workload).__name__, "must be a kvlab.workloads.Workload")
    scheduler = policy_named(policy) if isinstance(policy, str) else policy
    if not callable(getattr(scheduler, "schedule", None)):
        validate.fail("policy", policy, "must be static, continuous or an object with a schedule() method")
    max_num_seqs = validate.positive_int("max_num_seqs", max_num_seqs)
    if cost is not None and ms_per_token is not None:
        validate.fail("ms_per_token", ms_per_token, "must be left out when a cost model is given (it sets the step time)")
    cost = TokenCost(8.0 if ms_per_token is None else ms_per_token) if cost is None else cost
    if not callable(getattr(cost, "service_s", None)):
        validate.fail("cost", type(cost).__name__, "must be TokenCost, CalibratedCost or an object with a service_s() method")
    service = cost.service_s(workload.output_tokens, workload.prompt_tokens)
    plan = scheduler.schedule(workload.arrival_s, service, max_num_seqs)
    return SimulationResult(scheduler.name, max_num_seqs, workload.arrival_s, workload.output_tokens,
                            plan.start_s, plan.start_s + service, plan.finish_s, plan.slot)


# ---------------------------------------------------------------- workloads of the article's experiment
def synthetic_workload(num_requests: int, arrival_rate: float, lengths: str, rng: np.random.Generator,
                       *, constant_tokens: int = 150) -> Workload:
    """Poisson arrivals at arrival_rate (requests/s) with the article's output lengths.

    lengths: "article" (85% uniform 40-200, 15% uniform 400-1,000 tokens) or "constant"
    (every request constant_tokens long). Arrivals are drawn first, then lengths, from rng.
    """
    validate.one_of("lengths", lengths, LENGTHS)
    arrival = workloads.poisson_arrivals(num_requests, arrival_rate, rng)
    if lengths == "article":
        output = workloads.sample_lengths("article-s2", num_requests, rng)
    else:
        output = workloads.sample_lengths("constant", num_requests, rng, tokens=constant_tokens)
    return Workload(arrival, np.zeros(num_requests, dtype=np.int64), output, name=f"poisson-{lengths}")


def compare_policies(workload: Workload, *, max_num_seqs: int = 8, ms_per_token: float | None = None,
                     cost=None) -> pd.DataFrame:
    """The article's tables for one workload: one row per policy (static, continuous), idle in %."""
    rows = {name: simulate(workload, name, max_num_seqs=max_num_seqs, ms_per_token=ms_per_token, cost=cost).summary()
            for name in ("static", "continuous")}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["idle_pct"] = 100.0 * table.pop("idle_share")
    table.index.name = "policy"
    return table


def seed_runs(num_seeds: int, *, num_requests: int = 600, arrival_rate: float = 11.0, lengths: str = "article",
              max_num_seqs: int = 8, ms_per_token: float = 8.0, first_seed: int = 0) -> pd.DataFrame:
    """Summary of both policies for seeds first_seed .. first_seed + num_seeds - 1 (one row per seed and policy)."""
    num_seeds = validate.positive_int("num_seeds", num_seeds)
    validate.non_negative_int("first_seed", first_seed)
    frames = []
    for seed in range(first_seed, first_seed + num_seeds):
        workload = synthetic_workload(num_requests, arrival_rate, lengths, np.random.default_rng(seed))
        table = compare_policies(workload, max_num_seqs=max_num_seqs, ms_per_token=ms_per_token)
        frames.append(table.reset_index().assign(seed=seed))
    runs = pd.concat(frames, ignore_index=True)
    return runs[["seed", "policy"] + [c for c in runs.columns if c not in ("seed", "policy")]]


def ratio_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean latency of static over continuous per seed (x), as runs of the row "static vs continuous"."""
    wide = runs.pivot(index="seed", columns="policy", values="mean_latency_s")
    ratio = (wide["static"] / wide["continuous"]).rename("mean_latency_ratio").reset_index()
    ratio.insert(1, "policy", "static vs continuous")
    return ratio


def article_table(table: str) -> pd.DataFrame:
    """One of the article's section 2 tables, wide: a row per policy, its figures as columns."""
    figures = ledger.article_figures(2)
    figures = figures[figures["table"] == validate.one_of("table", table, figures["table"].unique())]
    wide = figures.pivot(index="row", columns="column", values="value")
    return wide.loc[figures["row"].unique(), figures["column"].unique()]


def band_table(runs: pd.DataFrame, table: str, *, low_pct: float = 5.0, high_pct: float = 95.0) -> pd.DataFrame:
    """The article's figures of table against kvlab's seeds: median, low_pct-high_pct band, the article's
    percentile among the seeds (% of seeds at or below it) and whether it lies inside the band."""
    low_pct = 100.0 * validate.fraction("low_pct", low_pct / 100.0, low_open=False)
    high_pct = 100.0 * validate.fraction("high_pct", high_pct / 100.0)
    if low_pct >= high_pct:
        validate.fail("low_pct", low_pct, f"must be below high_pct={high_pct:g}")
    article = article_table(table)
    rows = []
    for policy in article.index:
        mine = runs[runs["policy"] == policy]
        for column in article.columns:
            values, value = mine[column].to_numpy(), float(article.loc[policy, column])
            low, high = np.percentile(values, [low_pct, high_pct])
            rows.append({"row": policy, "column": column, "article": value, "median": float(np.median(values)),
                         "band_low": float(low), "band_high": float(high),
                         "article_percentile": 100.0 * float(np.mean(values <= value)),
                         "inside": bool(low <= value <= high)})
    return pd.DataFrame(rows).set_index(["row", "column"])


def ledger_rows(bands: pd.DataFrame, table: str) -> pd.DataFrame:
    """Section 2 ledger rows of table from band_table: reproduced = median of seeds, with the band."""
    rows = list(dict.fromkeys(bands.index.get_level_values("row")))
    columns = list(dict.fromkeys(bands.index.get_level_values("column")))
    median = bands["median"].unstack("column").loc[rows, columns]
    pairs = pd.Series(list(zip(bands["band_low"], bands["band_high"])), index=bands.index)
    return ledger.from_table(2, table, median, band=pairs.unstack("column").loc[rows, columns])


def rate_sweep(arrival_rates: list[float], num_seeds: int, *, num_requests: int = 600, lengths: str = "article",
               max_num_seqs: int = 8, ms_per_token: float = 8.0) -> pd.DataFrame:
    """Median over seeds of both policies' figures at each arrival rate (requests/s)."""
    frames = []
    for rate in validate.non_empty("arrival_rates", arrival_rates):
        runs = seed_runs(num_seeds, num_requests=num_requests, arrival_rate=rate, lengths=lengths,
                         max_num_seqs=max_num_seqs, ms_per_token=ms_per_token)
        median = runs.drop(columns="seed").groupby("policy", sort=False).median()
        frames.append(median.reset_index().assign(arrival_rate=float(rate)))
    sweep = pd.concat(frames, ignore_index=True)
    return sweep.set_index(["arrival_rate", "policy"]).sort_index(level=0, sort_remaining=False)


def variance_sweep(cvs: list[float], num_seeds: int, *, num_requests: int = 600, arrival_rate: float = 11.0,
                   mean_tokens: float = 207.0, max_num_seqs: int = 8, ms_per_token: float = 8.0) -> pd.DataFrame:
    """Median over seeds of both policies' mean latency (s) as output lengths spread.

    One row per coefficient of variation in cvs (gamma lengths of mean mean_tokens; 0 = all equal) and
    one for the article's mixture; columns: measured cv, static, continuous, ratio (x).
    """
    validate.positive_int("num_seeds", num_seeds)
    families = [(f"gamma cv={validate.non_negative_number('cv', cv):g}", cv) for cv in validate.non_empty("cvs", cvs)]
    rows = []
    for label, cv in families + [("article mix", None)]:
        static, continuous, measured = [], [], []
        for seed in range(num_seeds):
            rng = np.random.default_rng(seed)
            if cv is None:
                workload = synthetic_workload(num_requests, arrival_rate, "article", rng)
            else:
                arrival = workloads.poisson_arrivals(num_requests, arrival_rate, rng)
                output = workloads.sample_lengths("gamma", num_requests, rng, mean_tokens=mean_tokens, cv=cv)
                workload = Workload(arrival, np.zeros_like(output), output)
            table = compare_policies(workload, max_num_seqs=max_num_seqs, ms_per_token=ms_per_token)
            static.append(table.loc["static", "mean_latency_s"])
            continuous.append(table.loc["continuous", "mean_latency_s"])
            measured.append(workload.output_tokens.std() / workload.output_tokens.mean())
        rows.append({"lengths": label, "cv": float(np.median(measured)), "static": float(np.median(static)),
                     "continuous": float(np.median(continuous))})
    sweep = pd.DataFrame(rows).set_index("lengths")
    sweep["ratio"] = sweep["static"] / sweep["continuous"]
    return sweep
