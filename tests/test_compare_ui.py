"""Comparing trials in a real browser: a finished sweep's MLflow UI views and its report, in headless Chromium.

Set SWEEPFLOW_SCREENSHOTS_DIR to keep the screenshots (README's "Compare trials" shows the ones in docs/).
"""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
from browser import rendered_dom, screenshot
from matplotlib.image import imread
from mlflow.tracking import MlflowClient

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.pipeline import training_pipeline
from sweepflow.tasks.tracking.links import MlflowLinks


def _drawn(path: str) -> float:
    """The share of the screenshot's pixels that are not (nearly) white."""
    rgb = imread(path)[..., :3]
    assert np.ptp(rgb) > 0, f"{path} is a single colour"
    return float((rgb.min(axis=2) < 0.95).mean())


@pytest.mark.browser
def test_a_finished_sweep_reads_in_the_mlflow_ui_and_its_report(
    prefect_harness, mlflow_server, cluster, tmp_path
):
    cfg = PipelineConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "dask": {"scheduler_address": cluster.scheduler.address},
            "mlflow": {
                "tracking_uri": mlflow_server,
                "experiment_name": "compare-ui",
                "registered_model_name": "compare-ui-digits",
            },
            "sweep": {"num_samples": 6, "seed": 3},
            "training": {"epochs": 4},
            "scheduler": {"type": "asha", "max_t": 4, "grace_period": 1, "reduction_factor": 2},
            "resources": {"ranks_per_trial": 1},
        }
    )
    summary = training_pipeline(config=cfg)
    client = MlflowClient(mlflow_server)
    eid, parent = summary["experiment_id"], summary["parent_run_id"]
    trial_runs = {t["trial_id"]: t["run_id"] for t in summary["trials"]}
    links = MlflowLinks.for_tracking_uri(mlflow_server)

    # The compare view of the sweep's trials renders them, with their summary metric and hyperparameters.
    compare = rendered_dom(links.compare(eid, list(trial_runs.values())), str(tmp_path / "p1"))
    for trial_id in trial_runs:
        assert trial_id in compare, f"{trial_id} not in the compare view"
    assert "best_val_accuracy" in compare and "lr" in compare
    # Its parallel-coordinates plot opens on the trials' best value (the metric each run logged first).
    axes = re.findall(r'class="axis-title"[^>]*>([^<]+)<', compare)
    assert axes and axes[-1] == "best_val_accuracy", axes
    # The runs table (model-training mode, not the GenAI overview) shows the pipeline's parent run.
    table = rendered_dom(links.runs_table(eid), str(tmp_path / "p2"))
    assert client.get_run(parent).info.run_name in table

    shots = os.environ.get("SWEEPFLOW_SCREENSHOTS_DIR") or str(tmp_path / "shots")
    os.makedirs(shots, exist_ok=True)
    report = client.download_artifacts(parent, "report/sweep_report.html", str(tmp_path / "report"))
    pages = {
        "mlflow-runs-table.png": (links.runs_table(eid), (1400, 900)),
        "mlflow-compare-trials.png": (links.compare(eid, list(trial_runs.values())), (1400, 1600)),
        "mlflow-best-trial.png": (links.run(eid, summary["best_trial"]["run_id"]), (1400, 1000)),
        "sweep-report.png": (f"file://{os.path.abspath(report)}", (1280, 2400)),
    }
    for name, (url, size) in pages.items():
        path = screenshot(url, os.path.join(shots, name), size=size, wait_ms=15000)
        assert _drawn(path) > 0.03, f"{name}: the page is nearly blank"
    shutil.rmtree(tmp_path / "report", ignore_errors=True)
