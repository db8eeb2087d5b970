import math

import pytest

from kvlab.core import validate


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3", None])
def test_positive_int_rejects(value):
    with pytest.raises(ValueError, match=r"^num_layers=.* is not allowed: must be an integer >= 1$"):
        validate.positive_int("num_layers", value)


@pytest.mark.parametrize("value", [0, -0.5, math.nan, math.inf, "1"])
def test_positive_number_rejects(value):
    with pytest.raises(ValueError, match=r"^rate=.* is not allowed: must be a finite number > 0$"):
        validate.positive_number("rate", value)


def test_accepted_values_come_back_typed():
    assert validate.positive_int("n", 3) == 3
    assert validate.non_negative_number("w", 0) == 0.0
    assert validate.fraction("u", 1) == 1.0
    assert validate.one_of("unit", "GiB", ["GiB", "GB"]) == "GiB"
    with pytest.raises(ValueError, match="must be one of GiB, GB"):
        validate.one_of("unit", "TB", ["GiB", "GB"])
    with pytest.raises(ValueError, match=r"^contexts=\[\] is not allowed: must not be empty$"):
        validate.non_empty("contexts", [])
