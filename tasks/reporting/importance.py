"""Which hyperparameters mattered: Optuna's fANOVA importances over a sweep's finished trials.

The sweep's trials become an in-memory Optuna study (one trial per sweep trial, its sampled values and its best
value of the selection metric), and ``optuna.importance.get_param_importances`` with a seeded fANOVA evaluator
splits the variance of that value among the hyperparameters: the shares add up to 1. Computed once, when the
report is written; the page only draws the bars.

With few trials the numbers are noise, so below ``MIN_TRIALS`` finished trials (or with fewer than two
hyperparameters that took different values) there are no importances, only a sentence saying why.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sweepflow.tasks.tracking.params import varying_params

__all__ = ["MIN_TRIALS", "Importances", "param_importances"]

MIN_TRIALS = 3  # finished trials (completed or stopped early, with a value): fewer say nothing
SEED = 0  # fANOVA fits a random forest: the same sweep gets the same numbers
#: fANOVA's cost grows faster than the trials (its trees grow with them: 6 s for 1,000 trials, ~50 s for 4,000
#: on a loaded 2-core machine, in the report stage the user waits for); beyond this many finished trials it fits
#: a seeded random sample of them, which estimates the same variance shares.
MAX_TRIALS = 400


@dataclass(frozen=True)
class Importances:
    """``values``: parameter -> share of the metric's variance it explains, largest first (empty when not
    computed); ``note``: what the numbers rest on, or why there are none."""

    values: dict[str, float]
    note: str


@contextmanager
def _quiet_optuna() -> Any:
    """Optuna logs every study it creates at INFO; a report writes one per sweep. Its level is global: it is
    put back afterwards."""
    import optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def _distribution(values: Sequence[Any], log: bool, label: Callable[[Any], str]) -> tuple[Any, list[Any]]:
    """An Optuna distribution covering the values trials got, and the values as that distribution holds them.
    Numbers: a float range over what was observed (fANOVA's marginals are taken over the distribution: the
    searched bounds would weigh ranges no trial tried); anything else: categories of its printed label."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    if all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        numbers = [float(v) for v in values]
        lo, hi = min(numbers), max(numbers)
        return FloatDistribution(lo, hi, log=log and lo > 0), numbers
    labels = [label(v) for v in values]
    return CategoricalDistribution(sorted(set(labels))), labels


def param_importances(
    configs: Sequence[Mapping[str, Any]],
    bests: Sequence[float],
    params: Sequence[str],
    *,
    log_params: frozenset[str],
    mode: str,
    label: Callable[[Any], str] = str,
) -> Importances:
    """fANOVA importances of ``params`` for ``bests`` (one finished trial's best value per entry of
    ``configs``). ``log_params``: sampled on a log scale (their spread is judged by ratio); ``label``: how a
    non-numeric value (a list, a string) is named as a category."""
    if len(configs) < MIN_TRIALS:
        return Importances(
            {},
            f"Not computed: {len(configs)} finished trial{'s' if len(configs) != 1 else ''} with a value; "
            f"hyperparameter importances need at least {MIN_TRIALS}.",
        )
    # fANOVA needs a value from every trial: a name some trials lack (varying for the report) is left out here.
    changed = set(varying_params(configs, nested=False))
    varying = [p for p in params if p in changed and all(p in c for c in configs)]
    if len(varying) < 2:
        what = (
            f"only {varying[0]} took different values"
            if varying
            else "no hyperparameter took different values"
        )
        return Importances(
            {}, f"Not computed: {what} in the finished trials, so there is nothing to compare."
        )

    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    finished = len(configs)
    over = f"{finished} finished trials"
    if finished > MAX_TRIALS:
        import random

        chosen = sorted(random.Random(SEED).sample(range(finished), MAX_TRIALS))
        configs, bests = [configs[i] for i in chosen], [bests[i] for i in chosen]
        over = f"a random sample of {MAX_TRIALS} of the {finished} finished trials"
    columns = {p: _distribution([c[p] for c in configs], p in log_params, label) for p in varying}
    with _quiet_optuna():
        study = optuna.create_study(direction="maximize" if mode == "max" else "minimize")
        for i, value in enumerate(bests):
            study.add_trial(
                optuna.trial.create_trial(
                    params={p: columns[p][1][i] for p in varying},
                    distributions={p: columns[p][0] for p in varying},
                    value=float(value),
                )
            )
        values = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=SEED), normalize=True)
    ordered = dict(sorted(((p, float(v)) for p, v in values.items()), key=lambda kv: -kv[1]))
    return Importances(
        ordered,
        f"fANOVA (Optuna) over the best value of {over} (completed or stopped early): "
        "the share of its variance each hyperparameter explains. Few trials make these rough.",
    )
