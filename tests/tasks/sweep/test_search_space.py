"""Tests for sweepflow.tasks.sweep.space: parsing/validation, samplers, trial names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sweepflow.tasks.sweep.naming import describe_trial
from sweepflow.tasks.sweep.samplers import GridSampler, RandomSampler, SamplerExhausted, generate_trials
from sweepflow.tasks.sweep.space import (
    Choice,
    Constant,
    Grid,
    LogUniform,
    Pow2,
    QRandInt,
    RandInt,
    SearchSpace,
    Uniform,
    parse_space,
)

# The Ray Tune CIFAR tutorial's space, written as data (plus a grid and a few extras).
CIFAR_SPACE = {
    "l1": {"type": "pow2", "low": 4, "high": 256},
    "l2": {"type": "pow2", "low": 4, "high": 256},
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "batch_size": {"type": "choice", "values": [2, 4, 8, 16]},
    "momentum": {"type": "uniform", "low": 0.1, "high": 0.9},
    "epochs": {"type": "randint", "low": 1, "high": 5},
    "hidden": {"type": "qrandint", "low": 8, "high": 64, "q": 8},
    "optimizer": {"type": "grid", "values": ["sgd", "adam"]},
    "data_dir": "/data/cifar",
    "layers": [64, 32],
}


def test_parse_space_domains() -> None:
    space = parse_space(CIFAR_SPACE)
    assert isinstance(space, SearchSpace)
    assert space.names == list(CIFAR_SPACE)
    assert space["l1"] == Pow2(4, 256)
    assert space["lr"] == LogUniform(1e-4, 1e-1)
    assert space["batch_size"] == Choice((2, 4, 8, 16))
    assert space["momentum"] == Uniform(0.1, 0.9)
    assert space["epochs"] == RandInt(1, 5)
    assert space["hidden"] == QRandInt(8, 64, 8)
    assert space["optimizer"] == Grid(("sgd", "adam"))
    assert space["data_dir"] == Constant("/data/cifar")
    assert space["layers"] == Constant([64, 32])
    assert space.varying_names == [
        "l1",
        "l2",
        "lr",
        "batch_size",
        "momentum",
        "epochs",
        "hidden",
        "optimizer",
    ]
    assert space.grid_names == ["optimizer"]
    assert parse_space(space) is space
    with pytest.raises(KeyError):
        space["nope"]


def test_space_json_round_trip() -> None:
    space = parse_space(CIFAR_SPACE | {"cfg": {"type": "constant", "value": {"a": 1}}})
    raw = json.loads(json.dumps(space.to_dict()))
    assert parse_space(raw) == space
    assert raw["cfg"] == {"type": "constant", "value": {"a": 1}}
    assert raw["layers"] == [64, 32]


def test_random_reproducible_by_seed() -> None:
    a = generate_trials(CIFAR_SPACE, num_samples=5, seed=123)
    b = generate_trials(CIFAR_SPACE, num_samples=5, seed=123)
    c = generate_trials(CIFAR_SPACE, num_samples=5, seed=124)
    assert a == b
    assert a != c
    # A sampler object continues its sequence; a new one with the same seed replays it.
    s = RandomSampler(CIFAR_SPACE, seed=7)
    first, second = s.generate(2), s.generate(2)
    assert first != second
    assert RandomSampler(CIFAR_SPACE, seed=7).generate(4) == first + second


def test_random_ranges_and_types() -> None:
    trials = generate_trials(CIFAR_SPACE, num_samples=200, seed=0)
    assert len(trials) == 400  # 200 samples x 2 grid values
    pow2s = {2**e for e in range(2, 9)}  # 4 .. 256
    for t in trials:
        assert list(t) == list(CIFAR_SPACE)
        assert t["l1"] in pow2s and t["l2"] in pow2s
        assert type(t["l1"]) is int
        assert 1e-4 <= t["lr"] <= 1e-1 and type(t["lr"]) is float
        assert t["batch_size"] in (2, 4, 8, 16) and type(t["batch_size"]) is int
        assert 0.1 <= t["momentum"] < 0.9 and type(t["momentum"]) is float
        assert 1 <= t["epochs"] < 5 and type(t["epochs"]) is int
        assert t["hidden"] in (8, 16, 24, 32, 40, 48, 56, 64) and type(t["hidden"]) is int
        assert t["data_dir"] == "/data/cifar"
        assert t["layers"] == [64, 32]
    # Over 400 draws every discrete value shows up, including both inclusive ends.
    assert {t["l1"] for t in trials} == pow2s
    assert {t["epochs"] for t in trials} == {1, 2, 3, 4}  # randint: high exclusive
    assert {t["hidden"] for t in trials} >= {8, 64}  # qrandint: high inclusive
    # loguniform spreads over decades: roughly a third of the draws in each of the 3 decades.
    decades = np.floor(np.log10([t["lr"] for t in trials]))
    assert all(80 < int((decades == d).sum()) < 190 for d in (-4, -3, -2))
    # Configs don't share mutable values.
    trials[0]["layers"].append(1)
    assert trials[1]["layers"] == [64, 32]
    # JSON-serialisable as-is (no numpy scalars).
    assert json.loads(json.dumps(trials)) == trials


def test_pow2_bounds() -> None:
    # Non-power bounds: the powers of two inside [5, 100] are 8, 16, 32, 64.
    vals = {
        t["x"]
        for t in generate_trials({"x": {"type": "pow2", "low": 5, "high": 100}}, num_samples=100, seed=1)
    }
    assert vals == {8, 16, 32, 64}
    assert Pow2(1, 1).enumerate() == [1]
    assert Pow2(4, 256).enumerate() == [4, 8, 16, 32, 64, 128, 256]


def test_grid_crossing_with_ray_semantics() -> None:
    space = {
        "a": {"type": "grid", "values": [1, 2]},
        "b": {"type": "grid", "values": ["x", "y", "z"]},
        "lr": {"type": "uniform", "low": 0.0, "high": 1.0},
    }
    assert parse_space(space).num_grid_combinations == 6
    trials = generate_trials(space, num_samples=4, seed=0)
    assert len(trials) == 4 * 2 * 3
    combos = [(t["a"], t["b"]) for t in trials]
    # Every combination appears exactly num_samples times; each pass covers the full grid.
    assert all(combos.count((a, b)) == 4 for a in (1, 2) for b in "xyz")
    assert sorted(combos[:6]) == sorted((a, b) for a in (1, 2) for b in "xyz")
    # Random params are drawn independently per trial.
    assert len({t["lr"] for t in trials}) == 24
    # No grid -> exactly num_samples trials.
    assert len(generate_trials({"lr": {"type": "uniform", "low": 0, "high": 1}}, num_samples=3, seed=0)) == 3


def test_grid_sampler() -> None:
    space = {
        "opt": {"type": "grid", "values": ["sgd", "adam"]},
        "bs": {"type": "choice", "values": [8, 16, 32]},
        "width": {"type": "pow2", "low": 16, "high": 64},
        "name": "run",
    }
    trials = generate_trials(space, sampler="grid", num_samples=1)
    assert len(trials) == 2 * 3 * 3
    assert {(t["opt"], t["bs"], t["width"]) for t in trials} == {
        (o, b, w) for o in ("sgd", "adam") for b in (8, 16, 32) for w in (16, 32, 64)
    }
    assert all(t["name"] == "run" for t in trials)
    assert len(generate_trials(space, sampler="grid", num_samples=2)) == 36
    assert GridSampler(space).num_combinations == 18

    with pytest.raises(
        ValueError, match=r"cannot enumerate continuous parameters \['lr'\].*sampler='random'"
    ):
        generate_trials(
            space | {"lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1}}, sampler="grid", num_samples=1
        )
    with pytest.raises(ValueError, match="would generate 1000000 configs"):
        GridSampler({"seed": {"type": "randint", "low": 0, "high": 1_000_000}})


def test_generate_trials_argument_errors() -> None:
    with pytest.raises(ValueError, match="unknown sampler 'bayes'; valid samplers: random, grid, tpe"):
        generate_trials(CIFAR_SPACE, sampler="bayes", num_samples=1, seed=0)
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1, got 0"):
        generate_trials(CIFAR_SPACE, num_samples=0, seed=0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "loguniform", "low": 0, "high": 1}, "l1: loguniform needs 0 < low < high, got low=0"),
        ({"type": "uniform", "low": 2, "high": 1}, "l1: uniform needs low < high, got low=2, high=1; swap"),
        ({"type": "uniform", "low": "0", "high": 1}, "l1: uniform 'low' must be a finite number, got '0'"),
        ({"type": "uniform", "low": True, "high": 1}, "must be a finite number, got True"),
        ({"type": "uniform", "low": float("nan"), "high": 1}, "must be a finite number"),
        ({"type": "randint", "low": 3, "high": 3}, "l1: randint needs low < high .* to include 3 set high=4"),
        ({"type": "randint", "low": 1.5, "high": 3}, "l1: randint 'low' must be an integer, got 1.5"),
        ({"type": "qrandint", "low": 1, "high": 7, "q": 8}, r"no multiple of q=8 in \[1, 7\]"),
        ({"type": "qrandint", "low": 8, "high": 64, "q": 0}, "q >= 1"),
        ({"type": "pow2", "low": 0, "high": 8}, "pow2 needs low >= 1"),
        ({"type": "pow2", "low": 5, "high": 7}, r"no power of two in \[5, 7\]"),
        ({"type": "choice", "values": []}, "choice needs a non-empty list under 'values'"),
        ({"type": "grid", "values": "abc"}, "grid needs a non-empty list"),
        ({"type": "choice", "value": [1, 2]}, r"missing \['values'\]; unexpected \['value'\]"),
        ({"type": "loguniform", "low": 1e-4, "high": 1e-1, "base": 10}, r"unexpected \['base'\]"),
        (
            {"type": "log_uniform", "low": 1, "high": 2},
            "unknown type 'log_uniform'. Did you mean 'loguniform'",
        ),
        ({"grid_search": [1, 2]}, r'\{"type": "grid", "values": \[...\]\}'),
        ({"low": 1, "high": 2}, "a dict value must be a domain spec with a 'type' key"),
    ],
)
def test_validation_messages(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_space({"l1": spec})


def test_validation_misc() -> None:
    with pytest.raises(ValueError, match="parameter names must be non-empty strings"):
        parse_space({"": 1})
    with pytest.raises(ValueError, match="must be a dict"):
        parse_space([1, 2])  # type: ignore[arg-type]
    # Integral floats are fine for integer bounds (JSON/YAML may give 1e3 as a float).
    assert parse_space({"n": {"type": "randint", "low": 1.0, "high": 1e3}})["n"] == RandInt(1, 1000)
    # Validation happens up front: the first bad param is reported before anything is sampled.
    with pytest.raises(ValueError, match="^b:"):
        generate_trials({"a": 1, "b": {"type": "uniform", "low": 1, "high": 0}}, num_samples=1, seed=0)


def test_describe_trial() -> None:
    config = {"l1": 64, "l2": 16, "lr": 0.0032141, "batch_size": 8, "data_dir": "/d"}
    assert describe_trial(config, ["l1", "l2", "lr", "batch_size"]) == "l1=64,l2=16,lr=3.2e-03,batch_size=8"
    assert describe_trial({"m": 0.9, "w": 0.123456, "big": 123456.0, "mid": 123.4, "z": 0.0}) == (
        "m=0.9,w=0.12,big=1.2e+05,mid=120,z=0"
    )
    assert describe_trial({"layers": [64, 32], "flag": True, "opt": "adam", "n": None}) == (
        "layers=64x32,flag=True,opt=adam,n=None"
    )
    assert describe_trial({"lr": 0.0032141}, precision=3) == "lr=3.21e-03"
    assert describe_trial({"x": float("nan")}) == "x=nan"
    with pytest.raises(ValueError, match=r"keys \['lr'\] are not in the config"):
        describe_trial({"l1": 1}, ["lr"])
    # Works on generated configs, with the space's varying names.
    space = parse_space(CIFAR_SPACE)
    name = describe_trial(generate_trials(space, num_samples=1, seed=0)[0], space.varying_names)
    assert name.startswith("l1=") and "data_dir" not in name


# --------------------------------------------------------------------------------------------------
# TPE (Optuna): adaptive, ask/tell
# --------------------------------------------------------------------------------------------------


def _tpe_run(seed: int, n: int = 40) -> list[float]:
    from sweepflow.tasks.sweep.samplers import TPESampler

    sampler = TPESampler({"x": {"type": "uniform", "low": 0.0, "high": 10.0}}, mode="min", seed=seed)
    xs = []
    for _ in range(n):
        number, config = sampler.ask()
        xs.append(config["x"])
        sampler.tell(number, (config["x"] - 3.0) ** 2)
    return xs


def test_tpe_concentrates_on_the_optimum_and_is_reproducible():
    xs = _tpe_run(seed=1)
    assert _tpe_run(seed=1) == xs  # same seed, same results told -> same proposals
    assert min(abs(x - 3.0) for x in xs) < 0.2
    # Uniform random proposals on [0, 10] are on average (3**2 + 7**2) / 20 = 2.9 away from the optimum; once
    # TPE has results (after 10 trials) its proposals must be much closer (measured ~1.2-1.5 over seeds 0-5).
    assert np.mean([abs(x - 3.0) for x in xs[10:]]) < 0.65 * 2.9


def test_tpe_maps_every_domain_type_and_accepts_failures():
    from sweepflow.tasks.sweep.samplers import TPESampler

    space = {
        "l1": {"type": "pow2", "low": 4, "high": 256},
        "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
        "units": {"type": "qrandint", "low": 8, "high": 64, "q": 8},
        "layers": {"type": "randint", "low": 1, "high": 4},
        "shape": {"type": "choice", "values": [[64, 32], [128]]},
        "optimizer": "adam",
    }
    sampler = TPESampler(space, mode="max", seed=0)
    for i in range(12):
        number, c = sampler.ask()
        assert c["l1"] in (4, 8, 16, 32, 64, 128, 256)
        assert 1e-4 <= c["lr"] <= 1e-1
        assert c["units"] % 8 == 0 and 8 <= c["units"] <= 64
        assert c["layers"] in (1, 2, 3)  # randint's high is exclusive, as in Ray
        assert c["shape"] in ([64, 32], [128])
        assert c["optimizer"] == "adam"
        json.dumps(c)  # plain values: a Prefect task parameter
        sampler.tell(number, None if i % 3 == 0 else float(c["lr"]))  # some trials fail


def test_tpe_rejects_grids_with_the_fix():
    from sweepflow.tasks.sweep.samplers import TPESampler

    with pytest.raises(ValueError, match="choice"):
        TPESampler({"bs": {"type": "grid", "values": [16, 32]}}, mode="max")
    with pytest.raises(ValueError, match="adaptive"):
        generate_trials({"x": {"type": "uniform", "low": 0, "high": 1}}, sampler="tpe", num_samples=2)


def test_pipeline_config_rejects_tpe_with_a_grid_before_any_work():
    from sweepflow.flows.config import PipelineConfig

    with pytest.raises(ValueError, match="sampler='tpe' cannot search grid parameters"):
        PipelineConfig.model_validate(
            {"sweep": {"sampler": "tpe", "search_space": {"bs": {"type": "grid", "values": [1, 2]}}}}
        )


# ----------------------------------------------------------------------------- one vocabulary with sweepflow.tune


def test_tune_helpers_return_the_domains_the_data_parses_to():
    from sweepflow import tune

    written = {
        "lr": tune.loguniform(1e-4, 1e-1),
        "momentum": tune.uniform(0.1, 0.9),
        "dropout": tune.quniform(0.0, 0.5, 0.05),
        "noise": tune.randn(0.0, 2.0),
        "layers": tune.randint(1, 4),
        "width": tune.qrandint(8, 64, 8),
        "batch_size": tune.choice([16, 32]),
    }
    as_data = SearchSpace(tuple(written.items())).to_dict()
    assert json.loads(json.dumps(as_data)) == as_data  # what a deployment parameter holds
    assert dict(parse_space(as_data).params) == written
    assert as_data["dropout"] == {"type": "quniform", "low": 0.0, "high": 0.5, "q": 0.05}
    assert as_data["noise"] == {"type": "randn", "mean": 0.0, "sd": 2.0}
    with pytest.raises(ValueError, match="is a Python function"):
        SearchSpace((("f", tune.sample_from(lambda spec: 1)),)).to_dict()


def test_new_data_domains_sample_in_range_and_are_validated():
    configs = RandomSampler(
        {"d": {"type": "quniform", "low": 0.0, "high": 0.5, "q": 0.05}, "n": {"type": "randn", "mean": 3, "sd": 0.1}},
        seed=0,
    ).generate(50)
    assert all(0.0 <= c["d"] <= 0.5 and abs(c["d"] / 0.05 - round(c["d"] / 0.05)) < 1e-9 for c in configs)
    assert 2.5 < np.mean([c["n"] for c in configs]) < 3.5
    with pytest.raises(ValueError, match="quniform needs q > 0"):
        parse_space({"d": {"type": "quniform", "low": 0, "high": 1, "q": 0}})
    with pytest.raises(ValueError, match="randn needs sd > 0"):
        parse_space({"n": {"type": "randn", "mean": 0, "sd": -1}})
    with pytest.raises(ValueError, match="cannot enumerate continuous parameters"):
        GridSampler({"n": {"type": "randn", "mean": 0, "sd": 1}})


def test_tpe_refuses_domains_it_cannot_model_by_name():
    from sweepflow.tasks.sweep.samplers import TPESampler

    with pytest.raises(ValueError, match="noise: Normal cannot be searched by TPE"):
        TPESampler({"noise": {"type": "randn", "mean": 0, "sd": 1}}, mode="min")


# ------------------------------------------------------------------ one random x grid sampler for both spaces


def _ask_all(sampler: RandomSampler) -> list[dict]:
    return [sampler.ask()[1] for _ in range(sampler.total)]


def _tune_space():
    from sweepflow import tune

    return {
        "lr": tune.loguniform(1e-4, 1e-1),
        "model": {
            "width": tune.grid_search([16, 32]),
            "kind": "mlp",
            "depth": tune.choice([1, 2, 3]),
            # Ray's CIFAR tutorial's sample_from draws from NumPy's global state and returns a NumPy integer.
            "units": tune.sample_from(lambda spec: 2 ** np.random.randint(2, 9)),
            "total": tune.sample_from(lambda spec: spec.config.model.width * spec.config.model.depth),
        },
        "twice_lr": tune.sample_from(lambda spec: spec.config.lr * 2),
        "opt": tune.grid_search(["sgd", "adam", "adamw"]),
        "layers": [64, 32],
    }


def test_is_grid_recognises_both_spellings_and_parse_param_space_makes_them_one():
    from sweepflow import tune
    from sweepflow.tasks.sweep.space import ParamSpace, grid_values, is_grid, parse_param_space

    assert is_grid(tune.grid_search([1, 2])) and is_grid(Grid((1, 2)))
    assert not is_grid({"grid_search": [1], "x": 2}) and not is_grid(Choice((1, 2))) and not is_grid([1, 2])
    assert grid_values(tune.grid_search([1, 2])) == grid_values(Grid((1, 2))) == [1, 2]
    parsed = parse_param_space({"a": {"b": tune.grid_search([1, 2]), "c": Grid((3, 4))}, "d": 5, "e": tune.choice([1])})
    assert parsed == ParamSpace(
        ((("a", "b"), Grid((1, 2))), (("a", "c"), Grid((3, 4))), (("d",), Constant(5)), (("e",), Choice((1,))))
    )
    assert parse_space({"g": {"type": "grid", "values": [1, 2]}}).leaves == ((("g",), Grid((1, 2))),)


def test_random_sampler_resolves_a_nested_tune_space_as_ray_does():
    from sweepflow.tasks.sweep.space import parse_param_space

    sampler = RandomSampler(parse_param_space(_tune_space()), seed=3, num_samples=2)
    assert sampler.total == 2 * 2 * 3  # num_samples passes over the grids' product
    configs = _ask_all(sampler)
    with pytest.raises(SamplerExhausted):
        sampler.ask()
    # The grids cycle, the last one written fastest, in each of the num_samples passes.
    combos = [(c["model"]["width"], c["opt"]) for c in configs]
    assert combos == [(w, o) for w in (16, 32) for o in ("sgd", "adam", "adamw")] * 2
    for c in configs:
        assert list(c) == ["lr", "model", "twice_lr", "opt", "layers"]  # as the space is written, functions too
        assert list(c["model"]) == ["width", "kind", "depth", "units", "total"]
        assert c["model"]["kind"] == "mlp" and c["layers"] == [64, 32]
        assert c["model"]["total"] == c["model"]["width"] * c["model"]["depth"]  # sample_from reads the others
        assert c["twice_lr"] == c["lr"] * 2
        assert c["model"]["units"] in {2**e for e in range(2, 9)} and type(c["model"]["units"]) is int  # plain
        json.dumps(c)
    configs[0]["layers"].append(0)
    assert configs[1]["layers"] == [64, 32]  # each trial has its own copy of a constant
    assert len({c["lr"] for c in configs}) == len(configs)  # drawn per trial


def test_random_sampler_is_one_generator_for_the_data_and_the_tune_spellings():
    from sweepflow import tune
    from sweepflow.tasks.sweep.space import parse_param_space

    data = {
        "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
        "bs": {"type": "grid", "values": [16, 32]},
        "depth": {"type": "randint", "low": 1, "high": 4},
        "opt": {"type": "grid", "values": ["sgd", "adam"]},
        "name": "run",
    }
    written = {
        "lr": tune.loguniform(1e-4, 1e-1),
        "bs": tune.grid_search([16, 32]),
        "depth": tune.randint(1, 4),
        "opt": Grid(("sgd", "adam")),  # the canonical grid works in a param_space too
        "name": "run",
    }
    from_data = RandomSampler(data, seed=11, num_samples=3)
    from_tune = RandomSampler(parse_param_space(written), seed=11, num_samples=3)
    assert from_data.total == from_tune.total == 12
    assert _ask_all(from_data) == _ask_all(from_tune) == generate_trials(data, num_samples=3, seed=11)


def test_random_sampler_seeded_is_deterministic_and_generate_continues_the_sequence():
    from sweepflow.tasks.sweep.space import parse_param_space

    def sampler(space, seed, num_samples=1):
        np.random.seed(0)  # the tune space's "units" function draws from NumPy's global state, as in Ray's tutorial
        return RandomSampler(space, seed=seed, num_samples=num_samples)

    for space in (CIFAR_SPACE, parse_param_space(_tune_space())):
        s = sampler(space, 7)
        first, second = s.generate(2), s.generate(2)
        assert first != second
        assert sampler(space, 7).generate(4) == first + second
        assert _ask_all(sampler(space, 7, num_samples=4)) == first + second  # ask: the same sequence
        assert sampler(space, 8).generate(4) != first + second
    # A seeded sampler's draws do not touch NumPy's global state (a space's sample_from functions may).
    np.random.seed(0)
    RandomSampler(CIFAR_SPACE, seed=7).generate(3)
    assert np.random.randint(2**31) == np.random.RandomState(0).randint(2**31)


def test_random_sampler_unseeded_draws_from_numpy_global_state_as_ray():
    from sweepflow.tasks.sweep.space import parse_param_space

    def draws(space):
        sampler = RandomSampler(space, num_samples=3)
        out = []
        for _ in range(sampler.total):  # drawn when asked: the script's own draws in between count
            out.append(sampler.ask()[1])
            out.append(float(np.random.rand()))
        return out

    for space in (CIFAR_SPACE, parse_param_space(_tune_space())):
        np.random.seed(7)
        first = draws(space)
        np.random.seed(7)
        assert draws(space) == first  # seeding NumPy's global state reproduces an unseeded sweep
        np.random.seed(8)
        assert draws(space) != first


def test_random_sampler_with_an_empty_grid_proposes_nothing():
    from sweepflow import tune
    from sweepflow.tasks.sweep.space import parse_param_space

    sampler = RandomSampler(parse_param_space({"x": tune.grid_search([]), "y": 1}), seed=0, num_samples=3)
    assert sampler.total == 0 and sampler.generate(2) == []
    with pytest.raises(SamplerExhausted):
        sampler.ask()
