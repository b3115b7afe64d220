"""A cold cluster's start-up is not a trial's time (issue 22, item 5): on a Dask cluster started a moment ago
whose workers were spawned (as `dask worker` starts them, and a local cluster on a host with GPUs: still importing
the pipeline's modules in their preload threads; torch._dynamo not yet imported), the sweep does
the workers' one-time start-up before its first trial and reports it apart (``startup_seconds``), so the first
trial's group time, worker-seconds and MLflow run are its own; the progress line never counts more trials
running than the sweep runs at a time."""

from __future__ import annotations

import re

import pytest
from mlflow.tracking import MlflowClient
from prefect import flow
from sweep_parts import sweep_of, tracker_of

from ddp_runtime.cluster import local_cluster
from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.settings import resolve_settings
from sweepflow.tasks import WORKER_PRELOAD
from sweepflow.tasks.datasets import DataConfig, prepare_dataset


@pytest.mark.dask
def test_the_first_trial_on_a_cold_cluster_is_charged_only_its_own_time(prefect_harness, mlflow_server, tmp_path):
    prepared = prepare_dataset(DataConfig(name="digits", cache_dir=str(tmp_path / "data")))
    lines: list[str] = []
    with local_cluster(n_workers=2, preload=[WORKER_PRELOAD], start_method="spawn") as cluster:
        cfg = resolve_settings(
            PipelineConfig.model_validate(
                {
                    "state_dir": str(tmp_path / "state"),
                    "dask": {"scheduler_address": cluster.scheduler.address},
                    "mlflow": {"tracking_uri": mlflow_server, "experiment_name": "cold-start"},
                    "sweep": {
                        "search_space": {"quality": {"type": "grid", "values": [1, 2]}},
                        "num_samples": 1,
                        "max_concurrent_trials": 1,
                    },
                    "training": {
                        "train_fn": "pipeline_helpers:burning_quality",
                        "epochs": 20,  # 20 x 50 ms of a busy core: a second of training
                        "base_config": {"epoch_s": 0.05},
                    },
                    "scheduler": {"type": "fifo"},
                    "resources": {"ranks_per_trial": 2},
                }
            )
        )
        tracker = tracker_of(cfg)

        @flow
        def sweep_only():
            parent = tracker.start_run("cold-parent")
            try:
                sweep = sweep_of(cfg, prepared, cluster, tracker, parent)
                sweep.log = lines.append
                return sweep.run()
            finally:
                tracker.end_run(parent, "FINISHED")

        result = sweep_only()
        # What the start-up loaded is out of the garbage collector's walks for the workers' lives.
        frozen = cluster.run(lambda: __import__("gc").get_freeze_count())
        assert len(frozen) == 2 and min(frozen.values()) > 100_000, frozen

    first, second = sorted(result.trials, key=lambda t: t.index)
    assert first.status == "COMPLETED" and second.status == "COMPLETED", (first.error, second.error)
    shown = {t.trial_id: (t.train_time_s, t.usage.group_seconds, t.usage.startup_seconds) for t in result.trials}
    # The workers were still starting up when the sweep began: it waited for them, and says so, apart.
    assert result.startup_s > 0.5, (result.startup_s, shown)
    assert any(line.startswith("workers started up in") for line in lines), lines
    usage = result.usage()
    assert usage["startup_seconds"] == pytest.approx(result.startup_s + sum(shown[t][2] for t in shown), abs=1e-3)
    assert "worker start-up" in lines[-1] and lines[-1].startswith("sweep ended in"), lines[-1]
    # The first trial's group held its workers for its training and a moment around it, as the second did.
    for trial in (first, second):
        assert trial.train_time_s >= 1.0
        assert trial.usage.startup_seconds == 0, shown
        assert trial.usage.group_seconds - trial.train_time_s < 1.5, shown
    assert usage["worker_seconds"] == pytest.approx(2 * (first.usage.group_seconds + second.usage.group_seconds), abs=1e-3)
    # ... and so does its MLflow run: it opened when the trial could train, not before the workers' start-up.
    run = MlflowClient(mlflow_server).get_run(first.run_id)
    assert (run.info.end_time - run.info.start_time) / 1000 < first.train_time_s + 5.0, (run.info, shown)
    assert run.data.metrics["startup_seconds"] == 0

    # One trial at a time: never two "running", though the second starts while the first's group tears down.
    running = [int(m.group(1)) for line in lines if (m := re.search(r"trials: (\d+) running", line))]
    assert running and max(running) == 1, lines
    assert "0 running, 0 stopped early, 2 completed, 0 failed, 0 pending" in lines[-2], lines


def _imported(name: str) -> bool:
    import sys

    return name in sys.modules


@pytest.mark.dask
def test_a_one_rank_workers_start_up_imports_what_its_first_optimizer_would():
    """torch._dynamo comes with a rank's first optimizer (``torch.optim.Optimizer.__init__``), not only with DDP:
    the one-time start-up a sweep does before its first trial imports it for one-rank trials too, so the first
    trial on each worker is not charged its ~2 CPU-s (measured: a first 6-s trial took 8.1 CPU-s, the next ones
    6.1 and 5.9)."""
    from ddp_runtime.cluster import warm_up_workers
    from ddp_runtime.config import ScalingConfig

    with local_cluster(n_workers=1, start_method="spawn") as cluster:
        assert list(cluster.run(_imported, "torch._dynamo").values()) == [False]  # the preload leaves it
        (cold,) = warm_up_workers(cluster, ScalingConfig(num_workers=1)).values()
        assert list(cluster.run(_imported, "torch._dynamo").values()) == [True]
        (warm,) = warm_up_workers(cluster, ScalingConfig(num_workers=1)).values()
    assert isinstance(cold, float) and cold > 0.25 and warm < 0.25, (cold, warm)
