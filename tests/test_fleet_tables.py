"""Section 8's sentences follow its table: the routers they name are the table's best, as it prints them, and a
router that sends most requests to one instance is said to, only where one does."""

import pandas as pd

from kvlab.sections import s08_fleet as fleet


def table(hits, p95, busiest=(12.5, 12.5, 12.5), scale=1.0) -> pd.DataFrame:
    routers = ["round-robin", "llm-d", "dynamo-kv"]
    return pd.DataFrame(
        {
            "rate_scale": scale,
            "router": routers,
            "prefix_hit_pct": hits,
            "p95_ttft_s": p95,
            "p95_tpot_ms": 10.0,
            "busiest_instance_pct": busiest,
        }
    )


def test_the_finding_names_the_routers_the_table_ranks_best_and_flips_with_the_data():
    said = fleet.finding_text(table([5.0, 16.0, 12.0], [3.0, 2.0, 1.5]), 8, "M", "G", 2000)
    assert "llm-d finds the most prompt tokens in their prefix caches (16.0%)" in said
    assert "dynamo-kv has the lowest p95 TTFT (1.50 s)" in said
    assert "against round robin's 5.0% and 3.00 s." in said and "at the trace's own arrival rate" in said
    flipped = fleet.finding_text(table([20.0, 16.0, 12.0], [1.0, 2.0, 1.5]), 8, "M", "G", 2000)
    assert "round-robin finds the most" in flipped and "round-robin has the lowest" in flipped


def test_figures_that_print_alike_go_to_the_first_router_listed():
    said = fleet.finding_text(table([5.0, 16.04, 16.01], [3.0, 2.0, 2.004]), 8, "M", "G", 2000)
    assert "llm-d finds the most" in said and "llm-d has the lowest" in said


def test_a_hot_spot_is_said_only_where_one_instance_took_most_requests():
    assert fleet.hot_spot_text(table([5.0, 16.0, 12.0], [3.0, 2.0, 1.5]), 100.0) == ""
    said = fleet.hot_spot_text(table([5.0, 16.0, 12.0], [3.0, 900.0, 1.5], busiest=(12.5, 100.0, 12.5)), 99.0)
    assert said.startswith("The llm-d router sent 100.0% of the requests to one instance")
    assert "900.00 s" in said and "99.0% of the trace's prompts start with the same block" in said


def test_the_rate_sentence_speaks_of_each_rate():
    both = pd.concat([table([5.0, 16.0, 12.0], [3.0, 2.0, 1.5]), table([7.0, 6.0, 12.0], [9.0, 8.0, 10.0], scale=4.0)])
    said = fleet.rate_text(both)
    assert said.startswith("At 1x the trace's arrival rate llm-d finds the most")
    assert (
        "at 4x the trace's arrival rate dynamo-kv finds the most prompt tokens in the prefix caches (12.0%) and llm-d"
        in said
    )


def test_the_headline_gives_the_best_routers_at_each_rate():
    both = pd.concat([table([5.0, 16.0, 12.0], [3.0, 2.0, 1.5]), table([7.0, 6.0, 12.0], [9.0, 8.0, 10.0], scale=4.0)])
    assert fleet.headline(both) == [
        "1x the trace's rate: most prefix hits llm-d 16.0%, lowest p95 TTFT dynamo-kv 1.50 s (round robin 5.0%, 3.00 s)",
        "4x the trace's rate: most prefix hits dynamo-kv 12.0%, lowest p95 TTFT llm-d 8.00 s (round robin 7.0%, 9.00 s)",
    ]
