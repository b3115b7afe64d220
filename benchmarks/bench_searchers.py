"""Search algorithms side by side on one toy objective: the best value each finds with the same budget (3 seeds),
and the time per suggestion as the history grows to 1,000 trials.

The samplers are the ones a Tune script's ``search_alg`` becomes (``sweepflow.tune._internal.searchers.plan``),
driven by ask/tell as the sweep's loop drives them, one trial at a time; no service starts, so the figures are the
searchers' own cost and quality, not the trials'.

    .venv/bin/python benchmarks/bench_searchers.py                  # budget 60, 3 seeds, timing to 1,000 trials
    .venv/bin/python benchmarks/bench_searchers.py --budget 30 --timing-trials 200

BayesOptSearch is left out: it searches continuous parameters only (as Ray's), and the space has an integer and a
category; ``--continuous`` runs them all on the objective's two continuous parameters alone. TuneBOHB is told each
trial's one report at budget 1 (``training_iteration``), as a FIFO sweep of one-report trials tells it; AxSearch's
Gaussian process is timed to a shorter history, as BayesOpt's is (``--gp-timing-trials``). ZOOpt searches the
learning rate's exponent (``uniform(-5, -1)``: Ray's ZOOptSearch converts no ``loguniform``).

The objective (minimised, 0 at lr=1e-2, momentum=0.9, layers=3, activation=relu) mixes what a real sweep has: a
log-scale float, a bounded float, an integer and a category.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import numpy as np

from sweepflow import tune
from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
from sweepflow.tune._internal.searchers import plan
from sweepflow.tune.search.ax import AxSearch
from sweepflow.tune.search.bayesopt import BayesOptSearch
from sweepflow.tune.search.bohb import TuneBOHB
from sweepflow.tune.search.hyperopt import HyperOptSearch
from sweepflow.tune.search.nevergrad import NevergradSearch
from sweepflow.tune.search.optuna import OptunaSearch
from sweepflow.tune.search.zoopt import ZOOptSearch

SPACE = {
    "lr": tune.loguniform(1e-5, 1e-1),
    "momentum": tune.uniform(0.0, 0.99),
    "layers": tune.randint(1, 6),
    "activation": tune.choice(["relu", "tanh", "sigmoid"]),
}


#: The same space with the learning rate's exponent searched (ZOOpt converts no ``loguniform``, as Ray's).
EXPONENT_SPACE = {"log_lr": tune.uniform(-5.0, -1.0)} | {k: v for k, v in SPACE.items() if k != "lr"}


def objective(config: dict[str, Any]) -> float:
    log_lr = config["log_lr"] if "log_lr" in config else math.log10(config["lr"])
    return (
        (log_lr + 2) ** 2
        + 4 * (config["momentum"] - 0.9) ** 2
        + 0.25 * abs(config["layers"] - 3)
        + {"relu": 0.0, "tanh": 0.3, "sigmoid": 0.8}[config["activation"]]
    )


#: ``--continuous``: the objective's continuous part alone (BayesOpt's kind of space).
CONTINUOUS = {"log_lr": tune.uniform(-5.0, -1.0), "momentum": tune.uniform(0.0, 0.99)}


def continuous_objective(config: dict[str, Any]) -> float:
    return (config["log_lr"] + 2) ** 2 + 4 * (config["momentum"] - 0.9) ** 2


def searchers(seed: int, continuous: bool, budget: int) -> dict[str, Any]:
    """Each searcher as a script passes it (None: the default random search, seeded by ``seed=``); ``budget``:
    the trials Nevergrad's NGOpt is told it has (it picks its algorithm by it)."""
    extra = {"BayesOptSearch (GP)": BayesOptSearch(metric="loss", mode="min", random_state=seed)} if continuous else {}
    return {
        "random": None,
        "OptunaSearch (TPE)": OptunaSearch(metric="loss", mode="min", seed=seed),
        "HyperOptSearch (TPE)": HyperOptSearch(metric="loss", mode="min", random_state_seed=seed),
        "NevergradSearch (1+1)": _nevergrad(seed, continuous, budget),
        "ZOOptSearch (ASRacos)": ZOOptSearch(budget=budget, metric="loss", mode="min"),
        "TuneBOHB": TuneBOHB(metric="loss", mode="min", seed=seed),
        "AxSearch (Sobol, then GP)": AxSearch(metric="loss", mode="min", random_seed=seed, verbose_logging=False),
    } | extra


def _nevergrad(seed: int, continuous: bool, budget: int) -> NevergradSearch:
    """Nevergrad's (1+1) evolution strategy on the same space written as ``ng.p`` parameters, seeded through
    their random state (NGOpt, Nevergrad's recommended default, fails in its metamodel on NumPy 2.4 with nevergrad
    1.0.12)."""
    import nevergrad as ng

    if continuous:
        space = ng.p.Dict(log_lr=ng.p.Scalar(lower=-5.0, upper=-1.0), momentum=ng.p.Scalar(lower=0.0, upper=0.99))
    else:
        space = ng.p.Dict(
            lr=ng.p.Log(lower=1e-5, upper=1e-1),
            momentum=ng.p.Scalar(lower=0.0, upper=0.99),
            layers=ng.p.Scalar(lower=1, upper=5).set_integer_casting(),
            activation=ng.p.Choice(["relu", "tanh", "sigmoid"]),
        )
    space.random_state = np.random.RandomState(seed)
    optimizer = ng.optimizers.OnePlusOne(parametrization=space, budget=budget)
    return NevergradSearch(optimizer=optimizer, metric="loss", mode="min")


def run(search_alg: Any, *, seed: int, trials: int, continuous: bool = False) -> tuple[list[float], list[float]]:
    """Ask and tell ``trials`` times; returns (each trial's value, each suggestion's seconds)."""
    space, objective_of = (CONTINUOUS, continuous_objective) if continuous else (SPACE, objective)
    if isinstance(search_alg, NevergradSearch):
        space = {}  # it searches the same space, written as ng.p parameters (seeded)
    elif isinstance(search_alg, ZOOptSearch) and not continuous:
        space = EXPONENT_SPACE
    sampler = plan(search_alg, None, space, num_samples=trials, metric="loss", mode="min", seed=seed).sampler
    np.random.seed(seed)  # ZOOpt and BOHB's model draw from NumPy's global state
    values, seconds = [], []
    for _ in range(trials):
        started = time.perf_counter()
        number, config = sampler.ask()
        seconds.append(time.perf_counter() - started)
        value = objective_of(config)
        values.append(value)
        result = TrialResult(
            trial_id=f"trial_{number:04d}", index=number, name=str(number), config=config,
            status=TrialStatus.COMPLETED, last={"loss": value}, best=value,
        )
        if hasattr(sampler, "on_report"):  # a Searcher hears the report before the trial's end (TuneBOHB learns so)
            sampler.started(number, result.trial_id)
            sampler.on_report(result.trial_id, {"loss": value, "training_iteration": 1})
        sampler.tell_result(number, result)
    return values, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=60, help="trials per search for the best-value table")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--timing-trials", type=int, default=1000, help="history length for the timing table")
    parser.add_argument("--continuous", action="store_true", help="two continuous parameters, BayesOpt included")
    parser.add_argument(
        "--gp-timing-trials", type=int, default=150,
        help="BayesOpt's and Ax's history for the timing table (a Gaussian process grows cubically with it)",
    )
    args = parser.parse_args()
    c = args.continuous

    print(f"best value found in {args.budget} trials (lower is better; optimum 0), {args.seeds} seeds")
    print(f"{'searcher':<26} {'per seed':<28} {'mean':>7} {'vs random':>10}")
    means: dict[str, float] = {}
    for name in searchers(0, c, args.budget):
        bests = [
            min(run(searchers(seed, c, args.budget)[name], seed=seed, trials=args.budget, continuous=c)[0])
            for seed in range(args.seeds)
        ]
        means[name] = statistics.mean(bests)
        ratio = means[name] / means["random"] if means.get("random") else float("nan")
        print(f"{name:<26} {', '.join(f'{b:.3f}' for b in bests):<28} {means[name]:>7.3f} {ratio:>9.2f}x")

    n = args.timing_trials
    print(f"\nseconds per suggestion over {n} trials (ask only; the objective is free)")
    print(f"{'searcher':<26} {'first 100 mean':>15} {'last 100 mean':>15} {'whole run':>10}")
    for name, search_alg in searchers(0, c, n).items():
        gp = isinstance(search_alg, BayesOptSearch | AxSearch)
        trials = min(n, args.gp_timing_trials) if gp else n
        started = time.perf_counter()
        _, seconds = run(search_alg, seed=0, trials=trials, continuous=c)
        whole = time.perf_counter() - started
        print(
            f"{name:<26} {statistics.mean(seconds[:100]) * 1e3:>12.2f} ms {statistics.mean(seconds[-100:]) * 1e3:>12.2f} ms"
            f" {whole:>8.1f} s" + (f" ({trials} trials)" if trials != n else "")
        )


if __name__ == "__main__":
    main()
