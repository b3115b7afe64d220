"""Comparing trials in a real browser: a finished sweep's MLflow UI views and its report, in headless Chromium.

Set SWEEPFLOW_SCREENSHOTS_DIR to keep the screenshots (README's "Compare trials" shows the ones in docs/).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from browser import rendered_dom, screenshot
from matplotlib.image import imread
from mlflow.tracking import MlflowClient

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.pipeline import training_pipeline
from sweepflow.tasks.reporting.report_page import REPORT_PATH, page_url
from sweepflow.tasks.tracking.links import MlflowLinks, sweep_views


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

    # The links the CLI prints (the same everywhere we link): each opens MLflow's model-training mode, not its
    # GenAI mode (whose sidebar offers judges and prompts); the trials are listed best first.
    best_first = [r["mlflow_run_id"] for r in summary["leaderboard"]]
    views = sweep_views(
        links, eid, parent_run_id=parent, trial_run_ids=best_first, best_run_id=best_first[0],
        registered=(summary["registration"]["name"], summary["registration"]["version"]),
        metric="val_accuracy", mode="max",
    )
    rendered = {label: rendered_dom(url, str(tmp_path / f"view-{i}")) for i, (label, url) in enumerate(views.items())}
    for label, dom in rendered.items():
        assert "Judges" not in dom and "Prompts" not in dom, f"the {label} link opened MLflow's GenAI mode"
    names = {r.info.run_id: r.info.run_name for r in (client.get_run(i) for i in best_first)}
    table = rendered["runs table"]
    at = [table.find(f">{names[i]}<") for i in best_first]
    assert all(p >= 0 for p in at) and at == sorted(at), f"the runs table is not best first: {at}"
    assert "best_val_accuracy" in table
    compare = rendered["compare trials"]
    order = [compare.find(trial_id) for trial_id in (names[i] for i in best_first)]
    assert all(p >= 0 for p in order) and order[0] == min(order), f"the compare view does not open on the best: {order}"

    # The compare view of the sweep's trials renders them, with their summary metric and hyperparameters.
    for trial_id in trial_runs:
        assert trial_id in compare, f"{trial_id} not in the compare view"
    assert "best_val_accuracy" in compare and "lr" in compare
    # Its parallel-coordinates plot opens on the trials' best value (the metric each run logged first).
    axes = re.findall(r'class="axis-title"[^>]*>([^<]+)<', compare)
    assert axes and axes[-1] == "best_val_accuracy", axes
    # The whole experiment's runs table (model-training mode) shows the pipeline's parent run.
    assert client.get_run(parent).info.run_name in rendered_dom(links.runs_table(eid), str(tmp_path / "p2"))

    shots = os.environ.get("SWEEPFLOW_SCREENSHOTS_DIR") or str(tmp_path / "shots")
    os.makedirs(shots, exist_ok=True)
    # The sweep report opens as a page of its own, served by the tracking server (sweepflow's MLflow app, not
    # MLflow's artifact viewer or a download); its script draws the plots, and #highlight= picks the best trial.
    report = summary["report_url"]
    assert report == page_url(mlflow_server, parent, REPORT_PATH), report
    best_trial = summary["best_trial"]["trial_id"]
    dom = rendered_dom(f"{report}#highlight={best_trial}", str(tmp_path / "report"))
    assert 'data-rendered="true"' in dom and '<div class="plot" id="plot-curves"><svg' in dom
    assert re.search(rf'<g class="trial best-trial hl" data-trial="{best_trial}"', dom)
    pages = {
        "mlflow-runs-table.png": (views["runs table"], (1400, 900)),
        "mlflow-compare-trials.png": (views["compare trials"], (1400, 1600)),
        "mlflow-best-trial.png": (links.run(eid, summary["best_trial"]["run_id"]), (1400, 1000)),
        "sweep-report.png": (report, (1600, 1000)),
    }
    for name, (url, size) in pages.items():
        path = screenshot(url, os.path.join(shots, name), size=size, wait_ms=15000)
        assert _drawn(path) > 0.03, f"{name}: the page is nearly blank"
