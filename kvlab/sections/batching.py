"""Section 2 (notebook 02_batching): static vs continuous batching, seed bands, sweeps, ledger rows.

The mechanism (the slot model's two policies) is kvlab.core.batching; the workload is
kvlab.workloads.synthetic.article_s2_workload. One Experiment object carries the section's settings.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvlab.core import article, validate
from kvlab.core.batching import simulate
from kvlab.core.cost import TokenCost
from kvlab.core.workload import Workload
from kvlab.sections import ledger
from kvlab.sections.traces import NotebookTrace
from kvlab.workloads import synthetic

ARRIVAL_RATE_PER_S = synthetic.S2_ARRIVAL_RATE_PER_S  # kvlab's choice (the article gives no rate); see there


@dataclass(frozen=True)
class Experiment:
    """The section 2 set-up, whole: num_requests Poisson arrivals at arrival_rate (requests/s) with the
    article's output lengths (or all constant_tokens long), served on max_num_seqs slots at cost."""

    num_requests: int = article.NUM_REQUESTS_S2
    arrival_rate: float = ARRIVAL_RATE_PER_S
    lengths: str = "article"
    max_num_seqs: int = article.MAX_NUM_SEQS
    cost: object = field(default_factory=TokenCost)
    constant_tokens: int = article.CONSTANT_TOKENS

    def __post_init__(self):
        validate.in_range("num_requests", self.num_requests, "num_requests")
        validate.in_range("arrival_rate", self.arrival_rate, "arrival_rate")
        validate.one_of("lengths", self.lengths, synthetic.S2_LENGTHS)
        validate.positive_int("max_num_seqs", self.max_num_seqs)
        validate.positive_int("constant_tokens", self.constant_tokens)

    def replace(self, **changes) -> "Experiment":
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)

    def workload(self, seed: int) -> Workload:
        """The workload of one seed (numpy default_rng(seed))."""
        return synthetic.article_s2_workload(self.num_requests, self.arrival_rate, self.lengths,
                                             np.random.default_rng(seed), constant_tokens=self.constant_tokens)


def compare_policies(workload: Workload, *, max_num_seqs: int = article.MAX_NUM_SEQS, cost=None) -> pd.DataFrame:
    """The article's tables for one workload: one row per policy (static, continuous), idle in %."""
    rows = {name: simulate(workload, name, max_num_seqs=max_num_seqs, cost=cost).summary()
            for name in ("static", "continuous")}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["idle_pct"] = 100.0 * table.pop("idle_share")
    table.index.name = "policy"
    return table


def seed_runs(experiment: Experiment, num_seeds: int, first_seed: int = 0) -> pd.DataFrame:
    """Summary of both policies for seeds first_seed .. first_seed + num_seeds - 1 (one row per seed and policy)."""
    num_seeds = validate.positive_int("num_seeds", num_seeds)
    validate.non_negative_int("first_seed", first_seed)
    frames = []
    for seed in range(first_seed, first_seed + num_seeds):
        table = compare_policies(experiment.workload(seed), max_num_seqs=experiment.max_num_seqs, cost=experiment.cost)
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
    figures = article_table(table)
    rows = []
    for policy in figures.index:
        mine = runs[runs["policy"] == policy]
        for column in figures.columns:
            values, value = mine[column].to_numpy(), float(figures.loc[policy, column])
            low, high = np.percentile(values, [low_pct, high_pct])
            rows.append({"row": policy, "column": column, "article": value, "median": float(np.median(values)),
                         "band_low": float(low), "band_high": float(high),
                         "article_percentile": 100.0 * float(np.mean(values <= value)),
                         "inside": bool(low <= value <= high), "num_seeds": len(values)})
    return pd.DataFrame(rows).set_index(["row", "column"])


# Why a figure lies where it does, where the seed percentile alone does not say (table, row, column) -> reason.
NOTES = {
    ("equal150", "static", "makespan_s"):
        "kvlab's static batcher starts each batch with the requests that have arrived, which costs one extra batch "
        "at the start: 91.2 s in every seed (a batcher that waits to fill its batch gives about 90.6 s)",
}


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def band_note(row: pd.Series) -> str:
    """One line on where the article's figure lies among kvlab's seeds."""
    return (f"the article's value lies at the {_ordinal(round(row['article_percentile']))} percentile of kvlab's "
            f"{int(row['num_seeds'])} seeds")


def ledger_rows(bands: pd.DataFrame, table: str) -> pd.DataFrame:
    """Section 2 ledger rows of table from band_table: reproduced = median of seeds, with the band and why it lies
    where it does."""
    rows = list(dict.fromkeys(bands.index.get_level_values("row")))
    columns = list(dict.fromkeys(bands.index.get_level_values("column")))
    median = bands["median"].unstack("column").loc[rows, columns]
    pairs = pd.Series(list(zip(bands["band_low"], bands["band_high"])), index=bands.index)
    long = ledger.from_table(2, table, median, band=pairs.unstack("column").loc[rows, columns])
    notes = {key: NOTES.get((table, *key), band_note(row)) for key, row in bands.iterrows()}
    long["why"] = [notes[(r, c)] for r, c in zip(long["row"], long["column"])]
    return long


def rate_sweep(experiment: Experiment, arrival_rates: list[float], num_seeds: int) -> pd.DataFrame:
    """Median over seeds of both policies' figures at each arrival rate (requests/s)."""
    frames = []
    for rate in validate.non_empty("arrival_rates", arrival_rates):
        runs = seed_runs(experiment.replace(arrival_rate=rate), num_seeds)
        median = runs.drop(columns="seed").groupby("policy", sort=False).median()
        frames.append(median.reset_index().assign(arrival_rate=float(rate)))
    sweep = pd.concat(frames, ignore_index=True)
    return sweep.set_index(["arrival_rate", "policy"]).sort_index(level=0, sort_remaining=False)


def variance_sweep(experiment: Experiment, cvs: list[float], num_seeds: int,
                   mean_tokens: float = article.MEAN_OUTPUT_TOKENS) -> pd.DataFrame:
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
            if cv is None:
                workload = experiment.replace(lengths="article").workload(seed)
            else:
                rng = np.random.default_rng(seed)
                arrival = synthetic.poisson_arrivals(experiment.num_requests, experiment.arrival_rate, rng)
                output = synthetic.sample_lengths("gamma", experiment.num_requests, rng, mean_tokens=mean_tokens, cv=cv)
                workload = Workload(arrival, np.zeros_like(output), output)
            table = compare_policies(workload, max_num_seqs=experiment.max_num_seqs, cost=experiment.cost)
            static.append(table.loc["static", "mean_latency_s"])
            continuous.append(table.loc["continuous", "mean_latency_s"])
            measured.append(workload.output_tokens.std() / workload.output_tokens.mean())
        rows.append({"lengths": label, "cv": float(np.median(measured)), "static": float(np.median(static)),
                     "continuous": float(np.median(continuous))})
    sweep = pd.DataFrame(rows).set_index("lengths")
    sweep["ratio"] = sweep["static"] / sweep["continuous"]
    return sweep


def requests_table(result) -> pd.DataFrame:
    """One row per request of a kvlab.core.batching.SimulationResult: arrival, start, done, finish, slot,
    latency and queueing (s)."""
    return pd.DataFrame({
        "arrival_s": result.arrival_s, "output_tokens": result.output_tokens, "start_s": result.start_s,
        "done_s": result.done_s, "finish_s": result.finish_s, "slot": result.slot,
        "latency_s": result.latency_s, "queue_s": result.queue_s,
    })


def trace_policy_comparison(trace: NotebookTrace, experiment: Experiment) -> pd.DataFrame:
    """Section 2's static-vs-continuous table on the trace's arrivals and output lengths; empty when not available."""
    if trace.load is None:
        return pd.DataFrame(columns=["num_requests", "mean_latency_s", "p95_latency_s", "max_latency_s",
                                     "mean_queue_s", "makespan_s", "throughput_rps", "busy_slot_s", "idle_pct"],
                            index=pd.Index([], name="policy"))
    return compare_policies(trace.load.workload, max_num_seqs=experiment.max_num_seqs, cost=experiment.cost)
