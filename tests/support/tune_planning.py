"""What a Tune entry point would run, caught where it would be handed to the runner: before any service starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sweepflow.tune._internal import runner


class Planned(Exception):
    def __init__(self, experiment: runner.TuneRequest) -> None:
        super().__init__("planned")
        self.experiment = experiment


def catching_plans(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], Any]], runner.TuneRequest]:
    """A function that calls a Tune entry point and returns the ``Experiment`` it would run."""

    def stop_before_work(experiment: runner.TuneRequest) -> Any:
        raise Planned(experiment)

    monkeypatch.setattr(runner, "run", stop_before_work)

    def planned(call: Callable[[], Any]) -> runner.TuneRequest:
        with pytest.raises(Planned) as caught:
            call()
        return caught.value.experiment

    return planned


def ended(index: int, config: dict[str, Any], last: dict[str, Any], status: str = "COMPLETED") -> Any:
    """The ``TrialResult`` of trial ``index`` that ended with ``last`` as its last report (its best: ``loss``)."""
    from sweepflow.tasks.sweep.results import TrialResult, TrialStatus

    return TrialResult(
        trial_id=f"trial_{index:04d}", index=index, name=f"t{index}", config=config, status=TrialStatus(status),
        last=last, best=last.get("loss"),
    )


def drive(sampler: Any, objective: Callable[[dict[str, Any]], float], n: int | None = None, metric: str = "loss"
          ) -> list[dict[str, Any]]:
    """Ask and tell as the sweep's driver does, one trial at a time, each trial reporting ``objective(config)``
    as ``metric``; stops when the sampler is exhausted (or after ``n``). Returns the configs, in order."""
    from sweepflow.tasks.sweep.samplers import SamplerExhausted

    configs: list[dict[str, Any]] = []
    while n is None or len(configs) < n:
        try:
            number, config = sampler.ask()
        except SamplerExhausted:
            break
        configs.append(config)
        sampler.tell_result(number, ended(number, config, {metric: objective(config)}))
    return configs


def planning(monkeypatch: pytest.MonkeyPatch) -> Callable[..., runner.TuneRequest]:
    """``tune.run(trainable, **kwargs)``'s request (a trainable that does nothing), caught before any work."""
    from sweepflow import tune

    planned = catching_plans(monkeypatch)
    return lambda **kwargs: planned(lambda: tune.run(lambda config: None, **{"verbose": 0, **kwargs}))
