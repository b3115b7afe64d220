"""Comparing trials in a real browser: a finished sweep's MLflow UI views and its report, in headless Chromium.

Set SWEEPFLOW_SCREENSHOTS_DIR to keep the screenshots (docs/comparing-trials.md shows the ones in docs/screenshots).
"""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest
from matplotlib.image import imread
from mlflow.tracking import MlflowClient

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.pipeline import training_pipeline
from sweepflow.tasks.reporting.report_page import REPORT_PATH, page_url
from sweepflow.tasks.tracking.links import MlflowLinks, sweep_views
from sweepflow.tasks.tracking.params import varying_params


def _drawn(path: str) -> float:
    """The share of the screenshot's pixels that are not (nearly) white."""
    rgb = imread(path)[..., :3]
    assert np.ptp(rgb) > 0, f"{path} is a single colour"
    return float((rgb.min(axis=2) < 0.95).mean())


@pytest.fixture(scope="module")
def prefect_ui(tmp_path_factory):
    """A real Prefect server with its UI (the test harness serves the API only), as `sweepflow server start` runs
    it; the flow runs of this module's sweep go to it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from sweepflow.infra.services import supervisor
    from sweepflow.infra.services.local import PREFECT, prefect_server_spec

    state = str(tmp_path_factory.mktemp("prefect-ui"))
    try:
        api = supervisor.ensure(state, prefect_server_spec(state))
        with temporary_settings({PREFECT_API_URL: api}):
            _new_event_workers()
            try:
                yield api
            finally:
                _new_event_workers()
    finally:
        supervisor.stop(state, PREFECT)


def _new_event_workers() -> None:
    """Prefect keeps one events worker per process whatever the API URL (task runs are recorded from its events):
    one that an earlier test started for the session's test harness would send this module's task runs there.
    Drained (what it holds is sent), the next use starts one for the API of the moment."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    EventsWorker.drain_all(timeout=60, at_exit=False)
    APILogWorker.drain_all(timeout=60, at_exit=False)


@pytest.fixture(scope="module")
def finished_sweep(prefect_ui, mlflow_server, _shared_cluster, tmp_path_factory):
    """Six trials under ASHA (some stopped early), evaluated and registered: the pipeline's summary."""
    from conftest import SHARED_WORKERS, whole

    cluster = whole(_shared_cluster, SHARED_WORKERS)
    state = tmp_path_factory.mktemp("compare-ui")
    cfg = PipelineConfig.model_validate(
        {
            "state_dir": str(state / "state"),
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
    return training_pipeline(config=cfg)


@pytest.mark.browser
def test_a_finished_sweep_reads_in_the_mlflow_ui_and_its_report(finished_sweep, mlflow_server, browser, tmp_path):
    summary = finished_sweep
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
        metric="val_accuracy", mode="max", view_key=summary["mlflow_view_key"],
    )
    varying = varying_params([t["config"] for t in summary["trials"]])
    assert "lr" in varying, varying
    rendered = {label: browser.rendered_dom(url) for label, url in views.items()}
    for label, dom in rendered.items():
        assert "Judges" not in dom and "Prompts" not in dom, f"the {label} link opened MLflow's GenAI mode"
    names = {r.info.run_id: r.info.run_name for r in (client.get_run(i) for i in best_first)}
    table = rendered["runs table"]
    at = [table.find(f">{names[i]}<") for i in best_first]
    assert all(p >= 0 for p in at), at
    # Best first; trials tied on the metric may come in either order.
    best = {i: client.get_run(i).data.metrics["best_val_accuracy"] for i in best_first}
    shown = [best[i] for _, i in sorted(zip(at, best_first, strict=True))]
    assert shown == sorted(shown, reverse=True), f"the runs table is not best first: {shown}"
    # The sweep's saved view: the selection metric and every varying hyperparameter are columns, no constant.
    # (The grid renders only the columns in its window: a wide one shows them all.)
    wide = browser.page_showing(
        views["runs table"], *(f"col-id=\"params.`{p}`\"" for p in varying),
        size=(2600, 900), timeout_s=60,
    )
    columns = re.findall(r'role="columnheader"[^>]*col-id="([^"]+)"', wide)
    assert {"metrics.`best_val_accuracy`", *(f"params.`{p}`" for p in varying)} <= set(columns), " ".join(columns)
    assert "params.`num_ranks`" not in columns and "params.`gpus_per_rank`" not in columns, columns
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
    # MLflow's compare view plots three parameters, picked by name; the trials chart (the saved view's chart
    # mode) plots every varying hyperparameter and no constant against the best value.
    shots = os.environ.get("SWEEPFLOW_SCREENSHOTS_DIR") or str(tmp_path / "shots")
    os.makedirs(shots, exist_ok=True)
    chart = browser.page_showing(
        views["trials chart"], *(f'class="label">{p}<' for p in varying),
        size=(1400, 1000), screenshot_path=os.path.join(shots, "mlflow-trials-chart.png"),
    )
    axes = re.findall(r'class="label">([^<]+)<', chart)
    assert axes[:-1] == varying, axes
    # The last axis is the metric, its name shortened to fit ("best_v...curacy").
    assert re.fullmatch(re.escape(axes[-1]).replace(re.escape("..."), ".*"), "best_val_accuracy"), axes
    # The whole experiment's runs table (model-training mode) shows the pipeline's parent run.
    assert client.get_run(parent).info.run_name in browser.rendered_dom(links.runs_table(eid))

    # The sweep report opens as a page of its own, served by the tracking server (sweepflow's MLflow app, not
    # MLflow's artifact viewer or a download); its script draws the plots, and #highlight= picks the best trial.
    report = summary["report_url"]
    assert report == page_url(mlflow_server, parent, REPORT_PATH), report
    best_trial = summary["best_trial"]["trial_id"]
    dom = browser.rendered_dom(f"{report}#highlight={best_trial}")
    assert 'data-rendered="true"' in dom and '<div class="plot" id="plot-curves"><svg' in dom
    assert re.search(rf'<g class="trial best-trial hl" data-trial="{best_trial}"', dom)
    pages = {
        "mlflow-runs-table.png": (views["runs table"], (1400, 900)),
        "mlflow-compare-trials.png": (views["compare trials"], (1400, 1600)),
        "mlflow-best-trial.png": (links.run(eid, summary["best_trial"]["run_id"]), (1400, 1000)),
        "sweep-report.png": (report, (1600, 1000)),
    }
    for name, (url, size) in pages.items():
        path = browser.screenshot(url, os.path.join(shots, name), size=size, wait_ms=15000)
        assert _drawn(path) > 0.03, f"{name}: the page is nearly blank"
    # The best trial's "System metrics" tab charts what its rank 0 sampled (the samples came with its reports).
    system_tab = links.run(eid, summary["best_trial"]["run_id"]).replace("?", "/system-metrics?", 1)
    dom = browser.page_showing(
        system_tab, "cpu_utilization_percentage", "process_memory_megabytes",
        size=(1400, 1200), screenshot_path=os.path.join(shots, "mlflow-system-metrics.png"),
    )
    assert "cpu_utilization_percentage" in dom and "process_memory_megabytes" in dom
    assert _drawn(os.path.join(shots, "mlflow-system-metrics.png")) > 0.03


@pytest.mark.browser
def test_prefect_shows_how_each_trial_ended_and_links_its_mlflow_run(
    finished_sweep, prefect_ui, mlflow_server, browser, tmp_path
):
    """In Prefect's UI: a trial that ASHA stopped reads "Stopped early" with how it ended (a success, not a
    failure), its task run's first log line is its MLflow run's link, and its artifact is titled with the trial
    and its result. (The flow run's page draws its task runs on a canvas: nothing to read in its DOM.)"""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterTaskRunId,
        FlowRunFilter,
        LogFilter,
    )
    from prefect.client.schemas.sorting import LogSort

    stopped = [t for t in finished_sweep["trials"] if t["status"] == "STOPPED"]
    assert stopped, "ASHA stopped none of the six trials: the test shows nothing"
    ui = prefect_ui.removesuffix("/api")
    parent = MlflowClient(mlflow_server).get_run(finished_sweep["parent_run_id"])
    flow_run_id = parent.data.tags["prefect.flow_run_id"]
    with SyncPrefectClient(prefect_ui) as client:
        # The server records task runs and logs from the events and log batches the flow sent as it ended: polled
        # for (a busy machine leaves them queued a while), bounded.
        deadline = time.monotonic() + 120
        while True:
            task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [flow_run_id]}))
            trials = {t.name.split("-", 1)[0]: t for t in task_runs if t.name.startswith("trial_")}
            trial = trials.get(stopped[0]["trial_id"])
            logs = (
                client.read_logs(log_filter=LogFilter(task_run_id={"any_": [trial.id]}), sort=LogSort.TIMESTAMP_ASC)
                if trial is not None
                else []
            )
            if (trial is not None and trial.state.name == "Stopped early" and logs) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert trial is not None, f"no task run of {stopped[0]['trial_id']} on the server: {sorted(trials)}"
        assert trial.state.name == "Stopped early" and trial.state.is_completed(), trial.state
        assert logs and "MLflow run http" in logs[0].message, [log.message for log in logs[:3]]
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=[trial.id]))
        )
        # The trial's link, titled (keyed) with the trial: trial 3 of every sweep is one collection.
        assert len(artifacts) == 1 and artifacts[0].key == stopped[0]["trial_id"].replace("_", "-"), artifacts
    shots = os.environ.get("SWEEPFLOW_SCREENSHOTS_DIR") or str(tmp_path / "shots")
    os.makedirs(shots, exist_ok=True)
    path = os.path.join(shots, "prefect-trial-stopped-early.png")
    # The page fetches the task run, then its logs: read once it shows both (the screenshot is taken then).
    page = browser.page_showing(
        f"{ui}/runs/task-run/{trial.id}", "Stopped early", stopped[0]["run_id"],
        screenshot_path=path,
    )
    assert "Stopped early" in page
    assert "MLflow run" in page and stopped[0]["run_id"] in page, "the MLflow link is not in the task run's logs"
    artifact_path = os.path.join(shots, "prefect-trial-artifact.png")
    artifact = browser.page_showing(
        f"{ui}/artifacts/artifact/{artifacts[0].id}", "stopped early", "in MLflow",
        screenshot_path=artifact_path,
    )
    assert "stopped early" in artifact and stopped[0]["name"] in artifact  # its outcome, the trial
    assert stopped[0]["run_id"] in artifact  # the link to its MLflow run
    # The flow run's Artifacts tab: one card per trial, titled with it, its one line the result (best value
    # first), and one leaderboard. (The tab is a click away: the URL cannot select it.)
    cards_path = os.path.join(shots, "prefect-flow-run-artifacts.png")
    cards = browser.page_showing(
        f"{ui}/runs/flow-run/{flow_run_id}",
        *(f'artifact-card__title">{t["trial_id"].replace("_", "-")}<' for t in finished_sweep["trials"]),
        "(epoch",  # the cards' descriptions render after their titles
        size=(1400, 1400), screenshot_path=cards_path, script="document.getElementById('artifacts')?.click()",
    )  # fmt: skip
    titles = re.findall(r'artifact-card__title">([^<]+)<', cards)
    assert sorted(titles) == sorted(["sweep-leaderboard", *(t["trial_id"].replace("_", "-") for t in finished_sweep["trials"])]), titles
    best = stopped[0]["best"]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cards))
    assert f"val_accuracy {best:.4g} (epoch" in text, "a trial's card does not show its best value"
    assert _drawn(cards_path) > 0.03
    assert _drawn(path) > 0.03, "the Prefect task run page is nearly blank"
