"""How an experiment's trials fit on a Dask cluster: the resources each rank reserves as this cluster grants them,
and how many trials run at once; a trial the cluster can never hold is refused, naming the setting to change."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ddp_runtime.cluster import groups_that_fit
from ddp_runtime.config import ScalingConfig
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.sweep.trial_scheduler import TrialScheduler

if TYPE_CHECKING:
    from sweepflow.tasks.sweep.experiment import Placement


def fit_trials(
    client: Any,
    template: TrialTemplate,
    placement: Placement,
    scheduler: TrialScheduler,
    *,
    trials: int,
    max_concurrent_trials: int | None,
    log: Callable[[str], None] | None = None,
) -> tuple[TrialTemplate, int, int]:
    """The cluster can hold the experiment's trials, else it is refused, naming the setting: ``template`` placed
    on ``client``'s cluster (``place_trials``: refused naming ``placement.asked_by`` when no worker can ever hold
    a trial), and the scheduler's room check (a synchronous population needs ``trials`` at once). Returns the
    placed template, how many trials run at once and how many the cluster fits. ``log``: told how shared cores
    were granted. The one placement check: the lifecycle's ``place`` runs it, and each face's pre-flight before
    any service work on a cluster of the user's (the pipeline's ``check_pipeline``, a Tune script's run)."""
    placed, fits = place_trials(
        client, template, share_cores=placement.share_cores, asked_by=placement.asked_by, log=log
    )
    at_once = min(max_concurrent_trials or fits, fits)
    scheduler.check_room(trials=trials, at_once=at_once)
    return placed, at_once, fits


def place_trials(
    client: Any,
    template: TrialTemplate,
    *,
    share_cores: bool,
    asked_by: str,
    log: Callable[[str], None] | None = None,
) -> tuple[TrialTemplate, int]:
    """The template with its per-rank resources as this cluster grants them, and how many trials fit at once.

    ``share_cores`` (the Tune face, as Ray on one machine): a trial asking more CPUs than one worker declares
    runs with that many threads per rank and fewer trials at once, and a CPU ask on workers that declare no CPU
    resource is a thread count, not a reservation; without it the resources are reserved as asked."""
    if template.per_trial is not None:  # placed as its example; each trial's own shape when the trial is made
        shapes = template.per_trial
        placed, fits = place_trials(
            client, replace(template, per_trial=None), share_cores=share_cores, asked_by=asked_by, log=log
        )

        def placed_shape(config: dict[str, Any]) -> dict[str, Any]:
            asked = replace(template, per_trial=None, **shapes(config))
            granted, _ = place_trials(client, asked, share_cores=share_cores, asked_by=_asked(asked))
            return {name: getattr(granted, name) for name in _SHAPE_FIELDS}

        return replace(placed, per_trial=placed_shape), fits
    if not share_cores:
        return template, _fits(client, template, template.resources_per_rank, asked_by)
    template, shared_cores = _share_cores(client, template)
    if shared_cores is not None and log is not None:
        log(
            f"each trial asks {template.threads_per_rank} CPUs per rank, more than one Dask worker here declares: "
            f"as Ray does on one machine, its ranks use {template.threads_per_rank} threads and {shared_cores} "
            "trial(s) run at once, so the host's cores are shared, not oversubscribed"
        )
    resources = _declared_resources(client, template)
    fits = _fits(client, template, resources, asked_by)
    return replace(template, resources_per_rank=resources), min(fits, shared_cores or fits)


_SHAPE_FIELDS = ("num_ranks", "resources_per_rank", "use_gpu", "threads_per_rank")


def _asked(template: TrialTemplate) -> str:
    return f"a trial's resources function ({template.num_ranks} rank(s) of {template.resources_per_rank})"


def _share_cores(client: Any, template: TrialTemplate) -> tuple[TrialTemplate, int | None]:
    """Ray fits a trial that asks more CPUs than one Dask worker declares when the machine has them (a trial
    asking {"cpu": 2} runs on a 2-core laptop, one at a time): when every worker is on one host and their CPUs
    add up to a trial's, each rank reserves one worker's CPUs, runs ``asked`` torch threads, and the trials
    running at once are capped by the host's CPUs (the cap returned; None when nothing was changed). Across hosts
    a rank cannot use another host's cores, so such a trial is refused by ``_fits`` with the fix."""
    asked = template.resources_per_rank.get("CPU", 0.0)
    workers = list(client.scheduler_info()["workers"].values())
    cpus = [float((w.get("resources") or {}).get("CPU", 0.0)) for w in workers]
    if not asked or not cpus or max(cpus) >= asked or len({w.get("host") for w in workers}) != 1:
        return template, None
    at_once = int(sum(cpus) // (asked * template.num_ranks))
    if at_once < 1 or template.num_ranks > len(workers):
        return template, None  # the host has not the cores: refused by _fits
    granted = {**template.resources_per_rank, "CPU": max(cpus)}
    return replace(template, resources_per_rank=granted, threads_per_rank=max(1, math.ceil(asked))), at_once


def _declared_resources(client: Any, template: TrialTemplate) -> dict[str, float]:
    """The template's per-rank resources as this cluster can grant them: GPU and custom resources always; CPU only
    when the workers declare it (otherwise a worker is one slot, its threads the CPUs a rank gets); memory when
    they declare it, else none when a worker's memory limit holds it."""
    workers = client.scheduler_info()["workers"].values()
    declared = {name for w in workers for name in (w.get("resources") or {})}
    # Ray's "memory" (bytes): a reservation where the workers declare it, else a worker's memory limit holds it
    held = max((float(w.get("memory_limit") or 0) for w in workers), default=0.0)
    undeclared = {"CPU"} | ({"memory"} if template.resources_per_rank.get("memory", 0.0) <= held else set())
    return {name: v for name, v in template.resources_per_rank.items() if name not in undeclared or name in declared}


def _fits(client: Any, template: TrialTemplate, resources: dict[str, float], asked_by: str) -> int:
    """How many trials run at once; raises, naming ``asked_by``, when none fits."""
    scaling = ScalingConfig(
        num_workers=template.num_ranks, use_gpu=template.use_gpu, resources_per_worker=dict(resources) or None
    )
    return groups_that_fit(client, scaling, what=asked_by)
