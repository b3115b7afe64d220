"""Which hyperparameters varied between a sweep's trials (tasks/tracking/params.py: ``varying_params``), the one
answer the MLflow views' columns, the sweep report's table and axes, and its importances use."""

from __future__ import annotations

import math

import numpy as np

from sweepflow.tasks.tracking.params import varying_params

CONFIGS = [
    {"lr": 0.1, "batch_size": 32, "model": {"hidden": 64, "act": "relu"}, "epochs": 4},
    {"lr": 0.01, "batch_size": 32, "model": {"hidden": 128, "act": "relu"}, "epochs": 4},
    {"lr": 0.01, "batch_size": 32, "model": {"hidden": 64, "act": "relu"}, "epochs": 4, "mutated": 1},
]


def test_the_hyperparameters_worth_a_column_are_those_that_vary():
    # Dotted as the trial runs' params are; constants left out; a name only some trials have varies.
    assert varying_params(CONFIGS) == ["lr", "model.hidden", "mutated"]
    assert varying_params(CONFIGS[:1]) == [] and varying_params([]) == []


def test_top_level_names_compare_a_nested_value_whole():
    """The leaderboard's config/ columns and the report's axes: top-level names, in the order they appear."""
    assert varying_params(CONFIGS, nested=False) == ["lr", "model", "mutated"]
    same = [{"model": {"hidden": 64}, "lr": 0.1}, {"lr": 0.1, "model": {"hidden": 64}}]
    assert varying_params(same, nested=False) == [] and varying_params(same) == []


def test_a_name_some_trials_lack_varies_even_when_the_others_agree():
    configs = [{"lr": 0.1, "momentum": 0.9}, {"lr": 0.1}, {"lr": 0.1, "momentum": 0.9}]
    assert varying_params(configs) == ["momentum"]
    assert varying_params([{"lr": 0.1}, {"lr": 0.1, "extra": None}]) == ["extra"]  # present as None: still varies


def test_numbers_are_compared_by_value():
    """A numpy float and a float, an int and the same float, two NaNs: one value each; 0.1 and 0.1000001 differ
    (the report once compared by 4 significant digits)."""
    assert varying_params([{"lr": np.float64(0.1), "n": 2}, {"lr": 0.1, "n": 2.0}]) == []
    assert varying_params([{"x": math.nan}, {"x": float("nan")}]) == []
    assert varying_params([{"lr": 0.1}, {"lr": 0.1000001}]) == ["lr"]
    assert varying_params([{"flag": True}, {"flag": 1}]) == ["flag"]  # a bool is no number
    assert varying_params([{"layers": [64, 32]}, {"layers": [64, 32]}, {"layers": (64, 32)}]) == ["layers"]
