"""Section 2 (notebook 02_batching): static vs continuous batching, seed bands, sweeps, ledger rows.

The mechanism (the slot model's two policies) is kvlab.core.batching; the workload is
kvlab.workloads.synthetic.article_s2_workload. One Experiment object carries the section's settings.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvlab.core import article, validate
from kvlab.core.batching import simulate
from kvlab.core.service_time import TokenServiceTime
from kvlab.core.workload import Workload
from kvlab.sections.s04_traces import TRACE_NAMES, NotebookTrace
from kvlab.sections.shared import ledger
from kvlab.sections.shared.ledger import round_half_up
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
    cost: object = field(default_factory=TokenServiceTime)
    constant_tokens: int = article.CONSTANT_TOKENS

    def __post_init__(self):
        validate.in_range("num_requests", self.num_requests, "num_requests")
        validate.in_range("arrival_rate", self.arrival_rate, "arrival_rate")
        validate.one_of("lengths", self.lengths, synthetic.S2_LENGTHS)
        validate.positive_int("max_num_seqs", self.max_num_seqs)
        validate.positive_int("constant_tokens", self.constant_tokens)

    def replace(self, **changes) -> Experiment:
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)

    def workload(self, seed: int) -> Workload:
        """The workload of one seed (numpy default_rng(seed))."""
        return synthetic.article_s2_workload(
            self.num_requests,
            self.arrival_rate,
            self.lengths,
            np.random.default_rng(seed),
            constant_tokens=self.constant_tokens,
        )


def compare_policies(workload: Workload, *, max_num_seqs: int = article.MAX_NUM_SEQS, cost=None) -> pd.DataFrame:
    """The article's tables for one workload: one row per policy (static, continuous), idle in %."""
    rows = {
        name: simulate(workload, name, max_num_seqs=max_num_seqs, cost=cost).summary()
        for name in ("static", "continuous")
    }
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
            rows.append(
                {
                    "row": policy,
                    "column": column,
                    "article": value,
                    "median": float(np.median(values)),
                    "band_low": float(low),
                    "band_high": float(high),
                    # seeds at or below it over all seeds, x 100 first: exact where the share is (57 of 200: 28.5)
                    "article_percentile": 100.0 * int(np.count_nonzero(values <= value)) / len(values),
                    "inside": bool(low <= value <= high),
                    "num_seeds": len(values),
                }
            )
    return pd.DataFrame(rows).set_index(["row", "column"])


# Why a figure lies where it does, where the seed percentile alone does not say (table, row, column) -> reason.
NOTES = {
    (
        "equal150",
        "static",
        "makespan_s",
    ): "kvlab's static batcher starts its first batch with the requests that have arrived: one extra batch.",
}


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def band_note(row: pd.Series) -> str:
    """One line on where the article's figure lies among kvlab's seeds (its percentile rounded half up, as kvlab
    rounds every figure it prints: 28.5 is the 29th)."""
    return (
        f"The article's value lies at the {_ordinal(int(round_half_up(row['article_percentile'], 0)))} percentile of "
        f"kvlab's {int(row['num_seeds'])} seeds."
    )


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


def variance_sweep(
    experiment: Experiment, cvs: list[float], num_seeds: int, mean_tokens: float = article.MEAN_OUTPUT_TOKENS
) -> pd.DataFrame:
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
        rows.append(
            {
                "lengths": label,
                "cv": float(np.median(measured)),
                "static": float(np.median(static)),
                "continuous": float(np.median(continuous)),
            }
        )
    sweep = pd.DataFrame(rows).set_index("lengths")
    sweep["ratio"] = sweep["static"] / sweep["continuous"]
    return sweep


def requests_table(result) -> pd.DataFrame:
    """One row per request of a kvlab.core.batching.SimulationResult: arrival, start, done, finish, slot,
    latency and queueing (s)."""
    return pd.DataFrame(
        {
            "arrival_s": result.arrival_s,
            "output_tokens": result.output_tokens,
            "start_s": result.start_s,
            "done_s": result.done_s,
            "finish_s": result.finish_s,
            "slot": result.slot,
            "latency_s": result.latency_s,
            "queue_s": result.queue_s,
        }
    )


def trace_policy_comparison(trace: NotebookTrace, experiment: Experiment) -> pd.DataFrame:
    """Section 2's static-vs-continuous table on the trace's arrivals and output lengths; empty when not available."""
    if trace.load is None:
        return pd.DataFrame(
            columns=[
                "num_requests",
                "mean_latency_s",
                "p95_latency_s",
                "max_latency_s",
                "mean_queue_s",
                "makespan_s",
                "throughput_rps",
                "busy_slot_s",
                "idle_pct",
            ],
            index=pd.Index([], name="policy"),
        )
    return compare_policies(trace.load.workload, max_num_seqs=experiment.max_num_seqs, cost=experiment.cost)


# ---------------------------------------------------------------- the figures the notebook's prose states
# Each function below returns the numbers one paragraph of notebook 02 states, so that the notebook only formats them.
WORK_FIGURES = ("p95_latency_s", "max_latency_s", "makespan_s")  # figures that grow with the total work of a draw


def _words(column: str) -> str:
    """A column's label without its unit: p95_latency_s -> 'p95 latency'."""
    from kvlab.sections.shared.present import label

    return re.sub(r" \([^)]*\)$", "", label(column))


def _listed(words: list[str]) -> str:
    """a, b and c."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def workload_figures(workload: Workload) -> dict:
    """One draw of section 2's workload: requests, the last arrival (s), the mean output (tokens) and the share of
    long outputs (400 tokens or more, %), beside the article's mix: its mean output (tokens) and long share (%)."""
    out = workload.output_tokens
    return {
        "requests": workload.num_requests,
        "last_arrival_s": float(workload.arrival_s[-1]),
        "output_mean": float(out.mean()),
        "long_pct": 100 * float(np.mean(out >= article.LONG_OUTPUT_TOKENS[0])),
        "mix_mean": article.MEAN_OUTPUT_TOKENS,
        "mix_long_pct": 100 * article.LONG_OUTPUT_SHARE,
    }


def service_figures(experiment: Experiment) -> dict:
    """How fast the slots can finish requests of the article's mix: slots / (mean output x ms per token), in
    requests/s, with what goes into it and the experiment's arrival rate."""
    ms = experiment.cost.ms_per_token
    return {
        "slots": experiment.max_num_seqs,
        "mix_mean": article.MEAN_OUTPUT_TOKENS,
        "ms_per_token": ms,
        "service_rate": experiment.max_num_seqs / (article.MEAN_OUTPUT_TOKENS * ms / 1000),
        "arrival_rate": experiment.arrival_rate,
    }


def slower_figures(results) -> dict:
    """From the static and the continuous run of one workload: requests, and the share (%) that wait at least as
    long under static batching as under continuous batching."""
    static, continuous = results
    same = np.array_equal(static.arrival_s, continuous.arrival_s)
    return {
        "requests": len(static.latency_s),
        "slower_pct": 100 * float(np.mean(static.latency_s >= continuous.latency_s)) if same else float("nan"),
    }


def band_figures(mixed_band: pd.DataFrame, slots_band: pd.DataFrame, num_requests: int, ms_per_token: float) -> dict:
    """What the seed bands of the article's first two tables say: figures inside the band and in all, those
    outside (in words), the article's percentiles for the figures that grow with the total work (p95, maximum,
    total time of both policies) and for throughput, and the article's busy slot time against the mix's mean:
    the article's tokens per request, the busy time the mix's mean gives, and kvlab's median."""
    bands = pd.concat([mixed_band, slots_band])
    outside = bands[~bands["inside"]]
    by_policy = {}
    for row, column in outside.index:
        by_policy.setdefault(row, []).append(_words(column))
    columns = mixed_band.index.get_level_values("column")
    work = mixed_band[columns.isin(WORK_FIGURES)]["article_percentile"]
    throughput = mixed_band[columns == "throughput_rps"]["article_percentile"]
    busy = slots_band.xs("busy_slot_s", level="column").iloc[0]
    return {
        "inside": int(bands["inside"].sum()),
        "total": len(bands),
        "num_outside": len(outside),
        "outside": "; ".join(f"{row} {_listed(words)}" for row, words in by_policy.items()) or "none",
        "work_pct_low": float(work.min()),
        "work_pct_high": float(work.max()),
        "throughput_pct_low": float(throughput.min()),
        "throughput_pct_high": float(throughput.max()),
        "article_busy_s": float(busy["article"]),
        "busy_pct": float(busy["article_percentile"]),
        "article_tokens_per_request": float(busy["article"]) / num_requests / (ms_per_token / 1000),
        "mix_mean": article.MEAN_OUTPUT_TOKENS,
        "mix_busy_s": num_requests * article.MEAN_OUTPUT_TOKENS * ms_per_token / 1000,
        "median_busy_s": float(busy["median"]),
        "num_seeds": int(busy["num_seeds"]),
        **{
            f"{policy}_mean_pct": float(mixed_band.loc[(policy, "mean_latency_s"), "article_percentile"])
            for policy in ("static", "continuous")
            if (policy, "mean_latency_s") in mixed_band.index
        },
        "requests": num_requests,
        "ms_per_token": ms_per_token,
    }


def equal_batch_figures(experiment: Experiment) -> dict:
    """The all-equal experiment's static total time, counted: every batch lasts constant_tokens x ms per token;
    a batcher that starts with the requests that have arrived runs the first request alone, then full batches
    and a last one of what is left (while arrivals outpace the batches, as at the article's set-up); one that
    waits for a full first batch waits, on average, (slots - 1) / arrival rate, then runs only full batches."""
    ms = experiment.cost.ms_per_token
    n, k = experiment.num_requests, experiment.max_num_seqs
    batch_s = experiment.constant_tokens * ms / 1000
    full, last = divmod(n - 1, k)
    batches = 1 + full + (last > 0)
    fill_batches = -(-n // k)
    fill_wait_s = (k - 1) / experiment.arrival_rate
    return {
        "tokens": experiment.constant_tokens,
        "ms_per_token": ms,
        "batch_s": batch_s,
        "requests": n,
        "slots": k,
        "full": full,
        "last": last,
        "batches": batches,
        "total_s": batches * batch_s,
        "fill_wait_s": fill_wait_s,
        "fill_batches": fill_batches,
        "fill_total_s": fill_wait_s + fill_batches * batch_s,
    }


def rate_figures(sweep: pd.DataFrame, article_mixed: pd.DataFrame, service_rate: float) -> dict:
    """From rate_sweep: per policy, the rate (requests/s) at which its median mean latency meets the article's
    (linear between the swept rates; NaN outside them) and the range of its total time (s); the lowest and highest
    swept rate, and the service rate it is compared with."""
    out = {
        "lowest_rate": float(sweep.index.get_level_values("arrival_rate").min()),
        "highest_rate": float(sweep.index.get_level_values("arrival_rate").max()),
        "service_rate": service_rate,
    }
    for policy in ("static", "continuous"):
        latency = sweep.xs(policy, level="policy")["mean_latency_s"]
        target = float(article_mixed.loc[policy, "mean_latency_s"])
        inside = latency.min() <= target <= latency.max() and latency.is_monotonic_increasing
        out[f"{policy}_rate"] = (
            float(np.interp(target, latency.to_numpy(), latency.index.to_numpy())) if inside else float("nan")
        )
        out[f"{policy}_article"] = target
        makespan = sweep.xs(policy, level="policy")["makespan_s"]
        out[f"{policy}_makespan_low"], out[f"{policy}_makespan_high"] = float(makespan.min()), float(makespan.max())
    return out


def variance_figures(variance: pd.DataFrame) -> dict:
    """From variance_sweep: continuous batching's range of mean latency (s); static batching's at the smallest and
    largest spread of the gamma rows with their measured CV and ratio (x); the article's mix's CV and ratio."""
    gamma = variance.drop(index="article mix", errors="ignore")
    mix = variance.loc["article mix"] if "article mix" in variance.index else pd.Series(dtype=float)
    return {
        "continuous_low": float(variance["continuous"].min()),
        "continuous_high": float(variance["continuous"].max()),
        "static_first": float(gamma["static"].iloc[0]),
        "cv_first": float(gamma["cv"].iloc[0]),
        "ratio_first": float(gamma["ratio"].iloc[0]),
        "static_last": float(gamma["static"].iloc[-1]),
        "cv_last": float(gamma["cv"].iloc[-1]),
        "ratio_last": float(gamma["ratio"].iloc[-1]),
        "mix_cv": float(mix.get("cv", np.nan)),
        "mix_ratio": float(mix.get("ratio", np.nan)),
        "mix_mean": article.MEAN_OUTPUT_TOKENS,
    }


def trace_figures(trace: NotebookTrace, trace_mixed: pd.DataFrame, experiment: Experiment) -> dict:
    """What the real-trace part says: the trace's window (requests, duration in s and min, rate in requests/s,
    mean output in tokens, the share of outputs of 40 to 200 tokens in %, inter-arrival CV), the work it brings
    per second (slot-seconds per second) against the slots, both policies' idle share (%) and mean latency (s)
    and their ratio (x), beside the article's ratio, mix and share and kvlab's chosen rate; {} without a trace."""
    if trace.load is None or trace_mixed.empty:
        return {}
    from kvlab.sections.s04_traces import article_comparison
    from kvlab.sections.shared.plots import INTERARRIVAL_MAX_RATIO

    w = trace.load.workload
    duration = float(w.arrival_s[-1] - w.arrival_s[0])
    rate = w.num_requests / duration
    out = w.output_tokens
    gaps = np.diff(w.arrival_s)
    edge = INTERARRIVAL_MAX_RATIO  # the gap figure's right edge, in mean gaps
    long_gaps = gaps > edge * gaps.mean()
    ms = experiment.cost.ms_per_token
    load = rate * float(out.mean()) * ms / 1000
    shown = article_comparison({trace.name: w}).loc[trace.name]  # the comparison table's figures, as it shows them
    static, continuous = trace_mixed.loc["static"], trace_mixed.loc["continuous"]
    return {
        "name": TRACE_NAMES.get(trace.name, trace.name),
        "requests": w.num_requests,
        "duration_s": duration,
        "duration_min": duration / 60,
        "rate": rate,
        "output_mean": round_half_up(shown["output_mean_tokens"], 0),
        "short_pct": float(shown["output_40_to_200_tokens_pct"]),
        "cv": float(gaps.std() / gaps.mean()),
        "edge": edge,
        "long_gaps": int(long_gaps.sum()),
        "longest_gap_x": float(gaps.max() / gaps.mean()),
        "cv_without_long": float(gaps[~long_gaps].std() / gaps[~long_gaps].mean()),
        "ms_per_token": ms,
        "load": load,
        "slots": experiment.max_num_seqs,
        "load_vs_slots": "more than" if load > experiment.max_num_seqs else "less than",
        "queue_note": "so on average the queue grows through the window under both policies"
        if load > experiment.max_num_seqs
        else "so a queue forms only where arrivals bunch up",
        "output_vs_mix": "longer" if out.mean() > article.MEAN_OUTPUT_TOKENS else "shorter",
        "rate_vs_kvlab": "a lower" if rate < experiment.arrival_rate else "a higher",
        "static_idle": float(static["idle_pct"]),
        "continuous_idle": float(continuous["idle_pct"]),
        "static_latency": float(static["mean_latency_s"]),
        "continuous_latency": float(continuous["mean_latency_s"]),
        "ratio": float(static["mean_latency_s"] / continuous["mean_latency_s"]),
        "article_ratio": float(article_table("claims").iloc[0, 0]),
        "mix_mean": article.MEAN_OUTPUT_TOKENS,
        "mix_short_pct": 100 * (1 - article.LONG_OUTPUT_SHARE),
        "kvlab_rate": experiment.arrival_rate,
    }
