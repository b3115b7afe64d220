"""A pipeline's sweep alone, for tests that check the sweep's behaviour on the real services without the rest of
the pipeline (data download, evaluation, registration): built from the pipeline's config as the lifecycle
builds it (``experiment_for``, then ``place`` and ``sweep_on`` of ``sweepflow.flows.experiment``)."""

from __future__ import annotations

import os
from typing import Any

from prefect import get_run_logger

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.experiment import place, sweep_on
from sweepflow.flows.pipeline import experiment_for
from sweepflow.tasks.datasets import PreparedDataset
from sweepflow.tasks.sweep.driver import Sweep
from sweepflow.tasks.sweep.resume import PriorSweep
from sweepflow.tasks.tracking.runs import RunTracker


def tracker_of(cfg: PipelineConfig) -> RunTracker:
    """The tracker the pipeline's run of ``cfg`` records in (its artifacts under the state dir on a SQLite store)."""
    default_store = cfg.mlflow.tracking_uri.startswith("sqlite:")
    return RunTracker(
        cfg.mlflow.tracking_uri,
        cfg.mlflow.experiment_name,
        artifact_root=os.path.join(cfg.state_dir, "mlartifacts") if default_store else None,
    )


def sweep_of(
    cfg: PipelineConfig,
    prepared: PreparedDataset,
    client: Any,
    tracker: RunTracker,
    parent_run_id: str,
    *,
    prior: PriorSweep | None = None,
) -> Sweep:
    """The configured sweep over ``prepared`` on ``client``'s cluster, its trials under the parent run
    (``prior``: the trials of the interrupted sweep it resumes), inside a flow run. Fails at once if the cluster
    can never hold one trial."""
    exp = experiment_for(cfg, prepared)
    log = get_run_logger().info
    template, at_once = place(exp, client, log=log)
    return sweep_on(exp, client, tracker, parent_run_id, template, at_once, prior=prior, log=log)
