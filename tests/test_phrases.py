"""Sentences built from their numbers: data going the other way changes the words (kvlab.sections.shared.phrases and
the prose that uses it)."""

from hypothesis import given
from hypothesis import strategies as st

from kvlab.sections.s06_memory_budget import prose
from kvlab.sections.shared import phrases

figures = st.floats(0.001, 1e6, allow_nan=False)


@given(figures, figures, st.integers(0, 3))
def test_a_change_says_the_way_the_printed_figures_go(before, after, decimals):
    a, b = phrases.shown(before, decimals), phrases.shown(after, decimals)
    text = phrases.change(before, after, decimals)
    assert text.startswith("rise" if b > a else "fall" if b < a else "stay the same")
    if a != b:  # flipped, the other way
        assert phrases.change(after, before, decimals).startswith("fall" if b > a else "rise")


def test_figures_that_print_the_same_are_the_same_and_a_ratio_is_of_the_printed_figures():
    assert phrases.change(0.61614, 0.61594, 3) == "stay the same at 0.616"
    assert phrases.change(4265, 26461, 0) == "rise from 4,265 to 26,461 (6.2x)"
    assert phrases.change(26461, 4265, 0) == "fall from 26,461 to 4,265 (to 0.16x)"


def test_alike_only_within_the_share_else_how_many_times():
    assert phrases.comparison("vLLM", 0.4285, "Orca (Oracle)", 3.4439, 3, "s per token") == (
        "Orca (Oracle) takes 8.0x as long as vLLM (3.444 against 0.429 s per token)"
    )
    assert phrases.comparison("vLLM", 0.4285, "Orca (Oracle)", 0.44, 3, "s per token").startswith(
        "vLLM and Orca (Oracle) are alike (0.429 and 0.440 s per token, within 5%)"
    )
    assert phrases.comparison("vLLM", 3.4439, "Orca (Oracle)", 0.4285, 3, "s").startswith("vLLM takes 8.0x")


def test_counts_name_every_kind_counted():
    assert phrases.counted({"meet every objective": 2, "miss one": 4, "miss two": 4}) == (
        "2 meet every objective, 4 miss one and 4 miss two"
    )
    assert phrases.counted({"meet every objective": 0, "miss one": 3}) == "3 miss one"
    assert phrases.shift(40.8, 65.8, 1) == "+61%" and phrases.shift(7.0, 7.0, 1) == "0%"


BLOCKS = {
    "small": 1,
    "large": 256,
    "best": 1,
    "ties": "1, 2",
    "alpaca_ties": "1",
    "alpaca_best": 1,
    "alpaca_ratio": 1.2,
    "of_held_large": 60.0,
    "of_held_16": 95.0,
    "alpaca_of_held_large": 30.0,
    "entries_small": 600.0,
    "entries_large": 3.0,
    "busy_best": 16,
    "busy_batched_small": 36.5,
    "busy_batched_large": 28.0,
    "busy_latency_small": 0.6,
    "busy_latency_16": 0.5,
    "busy_latency_large": 4.5,
    "busy_preemptions_small": 4265,
    "busy_preemptions_large": 26461,
    "busy_blocks": [1, 16, 256],
    "busy_latency": [0.6, 0.5, 4.5],
    "busy_preemptions": [4265, 9000, 26461],
}


def test_the_block_prose_turns_with_its_figures():
    text = prose.block_text(BLOCKS)
    assert "Waste grows with the block" in text and "Bookkeeping falls as the block grows" in text
    assert "As blocks grow, preemptions rise from 4,265 at block size 1 to 26,461 at block size 256 (6.2x)" in text
    assert "runs out sooner" in text
    # latency dips at 16 before its rise: the whole series, not its ends, is described
    assert (
        "normalized latency stays between 0.5000 and 0.6000 s per token from block size 1 to block size 16, then "
        "jumps to 4.5000 at block size 256" in text
    )
    flipped = BLOCKS | {
        "of_held_large": 99.0,
        "entries_small": 1.0,
        "busy_preemptions_small": 26461,
        "busy_preemptions_large": 4265,
        "busy_preemptions": [26461, 9000, 4265],
    }
    text = prose.block_text(flipped)
    assert "Waste shrinks with the block" in text and "Bookkeeping rises as the block grows" in text
    assert "preemptions fall from 26,461 at block size 1 to 4,265 at block size 256" in text
    assert "fewer requests are admitted" in text
    # the review's series: flat up to block 128, then one jump; "rise" would misdescribe it
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    series = [4266, 4034, 4132, 4028, 4154, 4178, 3991, 3726, 26487]
    text = prose.block_text(BLOCKS | {"busy_blocks": sizes, "busy_preemptions": series, "busy_latency": [0.5] * 9})
    assert (
        "preemptions stay between 3,726 and 4,266 from block size 1 to block size 128, then jump to 26,487 at block "
        "size 256" in text
    )
    assert "preemptions rise" not in text and "normalized latency stays the same at 0.5000 s per token" in text


def test_a_trend_sentence_is_built_from_the_whole_series():
    assert phrases.trend([1, 2, 3], ["a", "b", "c"], 0) == "rise from 1 at a to 3 at c (3.0x)"
    assert phrases.trend([3, 2, 1], ["a", "b", "c"], 0) == "fall from 3 at a to 1 at c (to 0.33x)"
    assert phrases.trend([5, 9, 5, 9, 5], list("abcde"), 0) == (
        "move with no steady trend from 5 at a to 5 at e, between 5 at a and 9 at b"
    )
    assert phrases.trend([10, 11, 10, 40, 41], list("abcde"), 0) == (
        "stay between 10 and 11 from a to c, then jump to 40 at d and end at 41 at e (between 40 and 41 after it)"
    )


MEMORY = {
    "small_gib": 2,
    "large_gib": 12,
    "preempt_small": 2.69,
    "preempted_pct_small": 88.6,
    "preempt_large": 0.0,
    "vllm_small": 16.36,
    "oracle_small": 47.28,
    "max_small": 101.5,
    "vllm_large": 0.4285,
    "oracle_large": 3.4439,
}


def test_the_memory_prose_says_alike_only_of_alike_figures():
    text = prose.memory_text(MEMORY)
    assert "Orca (Oracle) takes 8.0x as long as vLLM (3.444 against 0.429 s per token)" in text
    assert "costs vLLM less than the slots Orca reserves" in text
    text = prose.memory_text(MEMORY | {"oracle_large": 0.43, "vllm_small": 200.0})
    assert "vLLM and Orca (Oracle) are alike" in text and "costs it more than Orca's reservations" in text


def test_the_variant_prose_says_how_much_the_alpaca_family_moves_each_mode():
    v = {
        "sharegpt_processed_input": 607,
        "sharegpt_processed_vllm_pct": 94.3,
        "sharegpt_processed_vllm": 18.18,
        "sharegpt_processed_oracle": 9.45,
        "sharegpt_processed_max": 6.99,
        "sharegpt_turn_input": 103,
        "sharegpt_turn_vllm_pct": 92.9,
        "alpaca_geometric_vllm_pct": 65.9,
        "alpaca_gamma_vllm_pct": 55.1,
    }
    v |= {f"alpaca_geometric_{k}": x for k, x in (("vllm", 140.0), ("oracle", 65.9), ("pow2", 40.8), ("max", 7.0))}
    v |= {f"alpaca_gamma_{k}": x for k, x in (("vllm", 158.1), ("oracle", 101.8), ("pow2", 65.8), ("max", 7.0))}
    text = prose.variant_text(v)
    assert "The Alpaca family matters:" in text and "Orca (Pow2) +61%" in text and "vLLM +13%" in text
    assert "holding token states falls from 65.9 to 55.1% (to 0.84x)" in text and "18.2 requests" in text
    v |= {f"alpaca_gamma_{k}": v[f"alpaca_geometric_{k}"] * 1.01 for k in ("vllm", "oracle", "pow2", "max")}
    assert "The Alpaca family matters little" in prose.variant_text(v)


def test_the_front_page_sentence_of_section_6_states_the_ledgers_values_at_its_rounding():
    import pandas as pd

    rows = [
        (6, "s6.2", f"vLLM over {m}", "sustained_rate_ratio_x", x)
        for m, x in (("Orca (Max)", 4.03), ("Orca (Oracle)", 2.09))
    ]
    section_ledger = pd.DataFrame(rows, columns=["section", "table", "row", "column", "reproduced"])
    text = prose.finding_text(section_ledger, 0.5)
    assert "sustains 4.0x Orca (Max)'s" in text and "and 2.1x Orca (Oracle)'s (the paper: 1.7 to 2.7x)" in text
    section_ledger.loc[1, "reproduced"] = 1.44
    assert "and 1.4x Orca (Oracle)'s" in prose.finding_text(section_ledger, 0.5)


def test_a_queue_is_blamed_on_memory_only_beside_a_nearly_full_cache():
    assert prose.limit_words(95.0, 0.0, 217.8).startswith("a queue beside a nearly full cache, so memory is the likely")
    assert prose.limit_words(89.7, 9.4, 580.8).startswith("a queue beside a nearly full cache")  # free in fragments
    assert prose.limit_words(73.0, 0.0, 1.8).startswith("a queue with 27% of the cache free and usable, so something")
    assert prose.limit_words(95.0, 0.0, 0.4).startswith("no queue")


def test_the_rerun_is_said_to_lie_where_it_lies_against_the_blog():
    import pandas as pd

    fit = pd.DataFrame(
        {"blog_tokens_per_s": [6121.0, 1898.0], "rerun_tokens_per_s": [5752.0, 1653.0], "residual_pct": [-0.16, 0.4]}
    )
    text = prose.rerun_text(fit)
    assert "lands 6% to 13% below the blog's figures" in text and "at most 0.4%" in text
    fit["rerun_tokens_per_s"] = [6500.0, 2000.0]
    assert "lands 5% to 6% above" in prose.rerun_text(fit)


def test_section_5s_measured_step_prose_turns_with_the_measured_times():
    import pandas as pd

    from kvlab.sections.s05_calibration import profile_decode_figures

    def table(step_ms, linear_ms):
        index = pd.MultiIndex.from_tuples(
            [("G", 1, 1024), ("G", 8, 1024)], names=["gpu", "batch_size", "context_tokens"]
        )
        return pd.DataFrame(
            {"linear_measured_ms": linear_ms, "rest_estimated_ms": 0.0, "step_ms": step_ms}, index=index
        )

    fast = profile_decode_figures(table([5.0, 6.0], [5.0, 5.1]), 8, 1024, ms_per_token=8.0)
    slow = profile_decode_figures(table([5.0, 11.0], [5.0, 10.0]), 8, 1024, ms_per_token=8.0)
    assert "the step comes to 6.00 ms, so the article's 8 ms lies above it" in fast["steps"]
    assert "the step comes to 11.00 ms, so the article's 8 ms lies below it" in slow["steps"]
    assert fast["linear"].endswith("the most 2% above the least")  # 5.10 / 5.00
    # 8.74 / 8.32 is 5.05% apart: said as printed, not as "within 5%"
    edge = profile_decode_figures(table([8.0, 9.0], [8.32, 8.74]), 8, 1024, ms_per_token=8.0)
    assert edge["linear"].endswith("8.32 to 8.74 ms on the G at 1 to 8 requests, the most 5% above the least")
    assert slow["linear"] == "5.00 to 10.00 ms on the G at 1 to 8 requests, 2.0x apart"
    assert profile_decode_figures(table([5.0, 6.0], [5.0, 5.1]).iloc[:0], 8, 1024) == {"any": False}


def test_section_5s_term_prose_follows_the_gap_and_each_terms_share():
    import pandas as pd

    from kvlab.sections.s05_calibration import term_text, term_view

    def table(kvlab_tpot_ms, within=False):
        steps = {"measured": kvlab_tpot_ms, "measured without attention": kvlab_tpot_ms - 10.0}
        index = pd.MultiIndex.from_tuples([("r", s) for s in steps], names=["run", "step_cost"])
        return pd.DataFrame(
            {
                "label": "R",
                "within_targets": within,
                "kvlab_mean_tpot_ms": list(steps.values()),
                "vllm_mean_tpot_ms": 50.0,
                "kvlab_mean_ttft_s": 1.0,
                "mean_ttft_error": 0.0,
            },
            index=index,
        )

    assert term_view(table(40.0)).loc[("R", "attention"), "adds_tpot_ms"] == 10.0
    short, over = term_text(table(40.0)), term_text(table(70.0))
    assert (
        short
        == "- R: kvlab's mean TPOT is 40.0 ms, 10.0 ms a token short of vLLM's 50.0 ms; that gap is 1.0x the share of the attention (10.0 ms)."
    )
    assert "20.0 ms a token over vLLM's 50.0 ms; that gap is 2.0x the share" in over
    assert term_text(table(40.0, within=True)) == ""
    from kvlab.sections.s05_calibration import tpot_gaps

    assert tpot_gaps(table(40.0)) == {"R": -10.0} and tpot_gaps(table(70.0)) == {"R": 20.0}


def test_section_5s_composed_against_measured_prose_follows_each_terms_difference():
    import pandas as pd

    from kvlab.sections.s05_calibration import term_pair_text, term_pair_view

    def table(clock, whole_ms, attention_ms, skew_ms=None):
        steps = {clock: whole_ms, f"{clock} without attention": whole_ms - attention_ms}
        if skew_ms is not None:
            steps[f"{clock} without attention skew"] = whole_ms - skew_ms
        index = pd.MultiIndex.from_tuples([("r", s) for s in steps], names=["run", "step_cost"])
        return pd.DataFrame(
            {"label": "R", "kvlab_mean_tpot_ms": list(steps.values()), "vllm_mean_tpot_ms": 50.0,
             "kvlab_mean_ttft_s": 1.0},
            index=index,
        )  # fmt: skip

    measured, composed = table("measured", 50.0, 20.0, skew_ms=2.0), table("composed", 45.0, 17.0)
    view = term_pair_view(measured, composed)
    assert view.loc[("R", "attention"), "difference_ms"] == -3.0
    assert view.loc[("R", "attention skew")].tolist() == [2.0, 0.0, -2.0]  # a term the composed clock lacks adds 0
    assert term_pair_text(measured, composed) == (
        "- R: the composed clock's mean TPOT is 45.0 ms, 5.0 ms below the measured clock's 50.0 ms (vLLM's: 50.0 "
        "ms); composed less measured, by term: the attention -3.0 ms, the attention skew -2.0 ms."
    )
    flipped = term_pair_text(measured, table("composed", 58.0, 24.0))
    assert "8.0 ms above the measured clock's 50.0 ms" in flipped and "the attention +4.0 ms" in flipped


def test_section_5s_ttft_sentence_follows_the_median_and_the_wait():
    from kvlab.sections.s05_calibration import ttft_words

    def row(kvlab_median, kvlab_wait, error=-0.4):
        return {
            "mean_ttft_error": error,
            "kvlab_median_ttft_s": kvlab_median,
            "vllm_median_ttft_s": 0.14,
            "kvlab_mean_wait_s": kvlab_wait,
            "vllm_mean_wait_s": 0.95,
        }

    assert ttft_words(row(0.14, 0.49)) == (
        " Its mean TTFT misses by -40.0%: its median TTFT is 0.14 s against vLLM's 0.14 s (alike, within 5%), and a "
        "request waited 0.49 s on average before its first step, shorter than vLLM's 0.95 s."
    )
    flipped = ttft_words(row(0.28, 1.90, error=0.5))
    assert "misses by +50.0%" in flipped and "(+100%)" in flipped and "longer than vLLM's 0.95 s" in flipped
    assert ttft_words(row(0.14, 0.49, error=0.1)) == ""


def test_the_regime_of_a_fig13_run_follows_its_latency_against_the_bound():
    import pandas as pd

    from kvlab.sections.s06_memory_budget.runs import MODES
    from kvlab.sections.s06_memory_budget.tables import regime_table

    def runs(latency_s):
        return pd.DataFrame({"dataset": "ShareGPT", "mode": list(MODES), "seed": 0, "normalized_latency_s": latency_s})

    calm = regime_table(runs([0.1, 0.2, 0.3, 0.5]), 0.5)
    busy = regime_table(runs([0.1, 0.2, 0.3, 0.51]), 0.5)
    assert calm["ShareGPT: regime"].tolist() == ["sustained"] * 4
    assert busy.loc["vLLM", "ShareGPT: regime"] == "saturated"
    assert "on ShareGPT within the bound for Orca (Max), Orca (Pow2), Orca (Oracle) and vLLM." in prose.regime_text(
        calm, 0.5
    )
    assert "on ShareGPT saturated for vLLM and within the bound for Orca (Max)" in prose.regime_text(busy, 0.5)


def test_section_5s_cpu_prose_follows_which_of_cpu_and_gpu_is_longer():
    import pandas as pd

    from kvlab.sections.s05_calibration import cpu_share_table, cpu_share_text

    table = cpu_share_table(batch_sizes=(1, 256))
    text = cpu_share_text(table)
    assert f"takes {table['cpu_scheduling_ms'].iloc[0]:.2f} ms of CPU a step for 1 request" in text
    assert "hides it at every batch size here" in text

    def flipped(gpu_ms):  # a GPU step shorter than the CPU's at the second batch
        cpu = pd.Series([0.03, 2.5], index=pd.Index([1, 256], name="batch_size"))
        gpu = pd.Series(gpu_ms, index=cpu.index)
        sync = gpu + cpu
        return pd.DataFrame({"gpu_step_ms": gpu, "cpu_scheduling_ms": cpu, "synchronous_step_ms": sync,
                             "asynchronous_step_ms": pd.concat([gpu, cpu], axis=1).max(axis=1),
                             "cpu_share_pct": 100 * cpu / sync})  # fmt: skip

    assert "hides it at 1 request, where the GPU's step is the longer, and not at the others" in cpu_share_text(
        flipped([10.0, 1.0])
    )
    assert "hides none of it here" in cpu_share_text(flipped([0.01, 1.0]))
    assert "2.50 ms for 256" in cpu_share_text(flipped([10.0, 1.0]))


def test_the_ablation_prose_counts_the_figures_each_choice_carries():
    import pandas as pd

    modes = ["Orca (Max)", "Orca (Pow2)", "Orca (Oracle)", "vLLM"]
    paper = {"ShareGPT": [7.0, 9.81, 13.62, 30.42], "Alpaca": [7.0, 43.24, 72.75, 132.44]}

    def table(mixed_alpaca_vllm: float) -> pd.DataFrame:
        rows = []
        for d, p in paper.items():
            rows.append({"dataset": d, "run": "the paper", **dict(zip(modes, p))})
            rows.append({"dataset": d, "run": "as run", **dict(zip(modes, p))})
            mixed = p[:3] + [mixed_alpaca_vllm if d == "Alpaca" else p[3]]
            rows.append({"dataset": d, "run": "mixed steps", **dict(zip(modes, mixed))})
        return pd.DataFrame(rows).set_index(["dataset", "run"])

    text = prose.ablation_text(table(60.71), 2560, "M", "G")
    assert text.startswith("As run, 8 of Fig. 13's 8 figures lie within their tolerance")
    assert "7 of 8 hold: vLLM batches 30.42 on ShareGPT (the paper's 30.42) and 60.71 on Alpaca" in text
    assert "Fig. 13b vLLM then misses." in text and "2,560-token budget" in text
    held = prose.ablation_text(table(130.0), 2560, "M", "G")
    assert "8 of 8 hold" in held and "none that held misses" in held
