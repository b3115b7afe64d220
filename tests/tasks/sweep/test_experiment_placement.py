"""The one check that the cluster can hold an experiment's trials (tasks/sweep/placement.py: ``fit_trials``), run by
the lifecycle's ``place`` and, before its flow run starts, by a Tune script (flows/tune/_internal/runner.py)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from distributed import Client, LocalCluster

from ddp_runtime import InsufficientResourcesError
from sweepflow.flows.experiment import place
from sweepflow.tasks.sweep.experiment import Placement
from sweepflow.tasks.sweep.placement import fit_trials
from sweepflow.tasks.sweep.schedulers import TrialScheduler
from sweepflow.tasks.sweep.template import TrialTemplate


class RoomFor(TrialScheduler):
    """Refuses as a synchronous population does when fewer than ``needs`` trials run at once; remembers what
    it was asked."""

    def __init__(self, needs: int = 0) -> None:
        super().__init__()
        self.needs, self.asked = needs, []

    def check_room(self, *, trials: int, at_once: int) -> None:
        self.asked.append((trials, at_once))
        if at_once < self.needs:
            raise ValueError(f"needs {self.needs} trials at once, the cluster runs {at_once}")


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """Two single-thread workers in this process: the cluster fits two one-rank trials at once."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, Client(
        cluster
    ) as c:
        yield c


def _template(ranks: int = 1) -> TrialTemplate:
    return TrialTemplate(train_fn="pkg.mod:train", num_ranks=ranks)


def test_the_cluster_holds_the_trials_at_once_up_to_the_concurrency_asked(client) -> None:
    placement = Placement(scheduler_address=None)
    scheduler = RoomFor()
    placed, at_once, fits = fit_trials(client, _template(), placement, scheduler, trials=6, max_concurrent_trials=None)
    assert (at_once, fits) == (2, 2) and placed.num_ranks == 1
    assert fit_trials(client, _template(), placement, scheduler, trials=6, max_concurrent_trials=1)[1:] == (1, 2)
    assert scheduler.asked == [(6, 2), (6, 1)]  # the scheduler's room check sees what will run at once


def test_what_the_cluster_can_never_hold_is_refused_naming_the_setting(client) -> None:
    with pytest.raises(InsufficientResourcesError, match=r"3 worker\(s\).*from resources\.ranks_per_trial"):
        fit_trials(client, _template(ranks=3), Placement(None, asked_by="resources.ranks_per_trial"), RoomFor(),
                   trials=2, max_concurrent_trials=None)
    with pytest.raises(ValueError, match="needs 4 trials at once, the cluster runs 2"):
        fit_trials(client, _template(), Placement(None), RoomFor(needs=4), trials=4, max_concurrent_trials=None)


def test_the_lifecycles_place_checks_once_and_says_the_sweep_line_once(client) -> None:
    lines: list[str] = []
    scheduler = RoomFor()
    exp: Any = SimpleNamespace(
        template=_template(), placement=Placement(None), scheduler=scheduler, sampler=SimpleNamespace(total=5),
        max_concurrent_trials=None, search_label="random search",
    )
    template, at_once = place(exp, client, log=lines.append)
    assert at_once == 2 and template.num_ranks == 1 and scheduler.asked == [(5, 2)]
    assert lines == ["sweep: 5 trials (random search), 2 at a time (cluster fits 2), 1 rank(s) each"]
