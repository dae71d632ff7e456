"""Series verdicts of accelmatrix.history.series.regression on small hand-made histories."""

from __future__ import annotations

import pandas as pd
import pytest

from accelmatrix.history.series.regression import Rules, classify


def history(series: dict[str, list[float]], lower=1.0, upper=2.0) -> pd.DataFrame:
    rows = [
        {
            "benchmark": "b",
            "cell_id": cell,
            "metric": "step_time",
            "time": i,
            "value": x,
            "lower": lower,
            "upper": upper,
        }
        for cell, values in series.items()
        for i, x in enumerate(values)
    ]
    return pd.DataFrame(rows).sample(frac=1, random_state=1)  # order must not matter


def test_each_verdict():
    got = classify(
        history(
            {
                "reg": [1.5, 1.5, 1.5, 3, 3],
                "sus": [1.5, 3, 3, 3, 1.5, 1.5],
                "flaky": [1.5, 3, 1.5, 3, 1.5],
                "one-off": [1.5, 1.6, 1.4, 3],
                "few": [3, 3],
                "fast": [1.5, 1.5, 0.5, 0.4],  # below the lower bound counts too
            }
        )
    ).set_index("cell_id")
    assert got.status.to_dict() == {
        "fast": "regression",
        "few": "insufficient_data",
        "flaky": "flaky",
        "one-off": "ok",
        "reg": "regression",
        "sus": "suspicious",
    }
    assert got.loc["reg", "trailing_violations"] == 2
    assert got.loc["sus", "longest_earlier_violations"] == 3
    assert got.loc["flaky", "flips"] == 4
    assert got.loc["one-off", "last_value"] == 3 and got.loc["one-off", "last_time"] == 3


def test_rules_are_configurable_and_checked():
    h = history({"a": [1.5, 3, 3, 3]})
    assert classify(h).status.item() == "regression"
    assert classify(h, Rules(regression_run=4)).status.item() == "ok"
    assert classify(h, Rules(min_points=5)).status.item() == "insufficient_data"
    with pytest.raises(ValueError):
        Rules(regression_run=1)


def test_empty_history_and_unbounded_side():
    assert classify(history({})).empty
    h = history({"a": [5, 6, 7]}, lower=1.0, upper=float("nan"))  # no upper bound
    assert classify(h).status.item() == "ok"
