"""vLLM's data-parallel rank choice (kvlab.core.engine.data_parallel.RankChooser); make parity plays the same events
through vLLM's own DPLBAsyncMPClient (scripts/parity/compare_dp_rank.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core.engine.data_parallel import RankChooser


@given(st.integers(1, 8), st.lists(st.booleans(), max_size=60))
def test_without_a_snapshot_requests_go_round_the_ranks_whatever_finishes(num_ranks, finish_first):
    # every choice counts as waiting on its rank until the coordinator's next snapshot, so the load the client
    # sees is what it sent: round robin from rank 0, finishes or not
    chooser, sent, in_flight = RankChooser(num_ranks), [], []
    for finish in finish_first:
        if finish and in_flight:
            chooser.finished(in_flight.pop(0))
        sent.append(chooser.choose())
        in_flight.append(sent[-1])
    assert sent == [i % num_ranks for i in range(len(sent))]


def test_a_snapshot_sends_requests_to_the_least_loaded_rank_and_penalizes_a_full_cache():
    chooser = RankChooser(3)
    chooser.snapshot([[0, 9, 0.2], [0, 2, 0.2], [0, 5, 0.2]])
    assert [chooser.choose() for _ in range(3)] == [1, 1, 1]  # waiting + running: 2, 3, 4 < 5
    # equal loads, but rank 0's queue waits on a 90% full cache: 2 + 2 x 6 x 0.4 = 6.8 against 4
    chooser = RankChooser(2)
    chooser.snapshot([[2, 0, 0.9], [1, 3, 0.5]])
    assert chooser.choose() == 1


def test_clients_start_their_scans_apart_and_bad_input_is_refused():
    assert RankChooser(4, client_count=2, client_index=1).choose() == 2
    with pytest.raises(ValueError, match="client_index=2 is not allowed"):
        RankChooser(4, client_count=2, client_index=2)
    with pytest.raises(ValueError, match="must give each of the 3 ranks"):
        RankChooser(3).snapshot([[0, 0, 0.0]])
