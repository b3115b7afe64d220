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
