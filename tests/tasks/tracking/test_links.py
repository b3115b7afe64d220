"""Links into the MLflow and Prefect UIs (tasks/tracking/links.py), and the leaderboard as markdown."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

from sweepflow.tasks.tracking.links import (
    SHARED_VIEW_TAG_PREFIX,
    MlflowLinks,
    leaderboard_markdown,
    markdown_link,
    prefect_flow_run,
    prefect_task_run,
    prefect_ui_url,
    sweep_view_state,
    sweep_views,
)


def test_mlflow_links_open_the_model_training_views_without_credentials():
    links = MlflowLinks.for_tracking_uri("https://alice:s3cret@mlflow.example.com:5443/")
    ml = "workflowType=machine_learning"
    assert links.ui == "https://mlflow.example.com:5443"
    assert links.runs_table("7") == f"https://mlflow.example.com:5443/#/experiments/7/runs?{ml}"
    assert links.run("7", "abc") == f"https://mlflow.example.com:5443/#/experiments/7/runs/abc?{ml}"
    assert links.model_version("digits model", 3) == (
        f"https://mlflow.example.com:5443/#/models/digits%20model/versions/3?{ml}"
    )
    compare = links.compare("7", ["b2", "a1"])
    query = parse_qs(urlsplit(compare.split("#", 1)[1]).query)
    assert json.loads(query["runs"][0]) == ["b2", "a1"]  # in the order given (best first)
    assert json.loads(query["experiments"][0]) == ["7"] and query["workflowType"] == ["machine_learning"]
    assert "s3cret" not in "".join([links.ui, compare])
    assert links.compare("7", []) is None


def test_the_runs_table_link_lists_one_sweeps_trials_best_first():
    table = MlflowLinks("http://127.0.0.1:5000").runs_table("7", parent_run_id="p1", metric="val_loss", mode="min")
    query = parse_qs(urlsplit(table.split("#", 1)[1]).query)
    assert query["searchFilter"] == ["tags.`mlflow.parentRunId` = 'p1'"]
    assert query["orderByKey"] == ["metrics.`best_val_loss`"] and query["orderByAsc"] == ["true"]
    assert query["workflowType"] == ["machine_learning"]


def test_a_sweeps_saved_view_shows_its_metric_and_varying_hyperparameters():
    view = sweep_view_state(parent_run_id="p1", metric="val_loss", mode="min", params=["lr", "model.hidden"], trials=12)
    assert view["searchFilter"] == "tags.`mlflow.parentRunId` = 'p1'"
    assert view["orderByKey"] == "metrics.`best_val_loss`" and view["orderByAsc"] is True
    assert view["selectedColumns"] == [
        "metrics.`best_val_loss`", "metrics.`val_loss`", "params.`lr`", "params.`model.hidden`"
    ]  # fmt: skip
    (chart,) = view["compareRunCharts"]
    assert chart["type"] == "PARALLEL" and chart["selectedParams"] == ["lr", "model.hidden"]
    assert chart["selectedMetrics"] == ["best_val_loss"] and chart["showAllRuns"] is True
    assert chart["metricSectionId"] in {s["uuid"] for s in view["compareRunSections"]}
    assert json.loads(json.dumps(view)) == view  # the experiment tag's value is its JSON
    # Without a metric there is no order and no chart; the trials are still one sweep's.
    bare = sweep_view_state(parent_run_id="p1", metric=None, mode="max", params=["lr"], trials=2)
    assert "orderByKey" not in bare and "compareRunCharts" not in bare and bare["selectedColumns"] == ["params.`lr`"]
    assert SHARED_VIEW_TAG_PREFIX == "mlflow.sharedViewState."


def test_with_a_saved_view_the_links_name_only_the_view():
    links = MlflowLinks("http://127.0.0.1:5000")
    views = sweep_views(links, "7", parent_run_id="p1", trial_run_ids=["a"], metric="acc", view_key="p1")
    table = parse_qs(urlsplit(views["runs table"].split("#", 1)[1]).query)
    # MLflow drops a saved view when the URL also names a filter or an order.
    assert table == {"viewStateShareKey": ["p1"], "workflowType": ["machine_learning"]}
    chart = parse_qs(urlsplit(views["trials chart"].split("#", 1)[1]).query)
    assert chart["viewStateShareKey"] == ["p1"] and chart["compareRunsMode"] == ["CHART"]
    assert list(views) == ["runs table", "parent run", "trials chart", "compare trials"]
    assert "trials chart" not in sweep_views(links, "7", parent_run_id="p1", trial_run_ids=["a"], metric="acc")


def test_a_store_without_a_server_has_links_only_to_a_named_local_ui():
    assert MlflowLinks.for_tracking_uri("sqlite:///tmp/mlflow.db").run("1", "r") is None
    local = MlflowLinks.for_tracking_uri("sqlite:///tmp/mlflow.db", local_ui="http://127.0.0.1:5000/")
    assert local.run("1", "r") == "http://127.0.0.1:5000/#/experiments/1/runs/r?workflowType=machine_learning"
    assert markdown_link("r", None) == "r" and markdown_link("r", "http://x") == "[r](http://x)"


def test_prefect_links():
    ui = prefect_ui_url("http://bob:pw@127.0.0.1:4200/api")
    assert ui == "http://127.0.0.1:4200"
    assert prefect_flow_run(ui, "f1") == "http://127.0.0.1:4200/runs/flow-run/f1"
    assert prefect_task_run(ui, "t1") == "http://127.0.0.1:4200/runs/task-run/t1"
    assert prefect_ui_url(None) is None and prefect_task_run(None, "t1") is None


def test_the_leaderboard_markdown_is_rounded_ordered_as_its_heading_says_and_links_runs():
    rows = [
        {
            "trial": "trial_0001",
            "status": "COMPLETED",
            "epochs": 4,
            "config/lr": 0.0123456789,
            "best_val_loss": 0.123456789,
            "best_epoch": 3,
            "val_loss": 0.2,
            "mlflow_run_id": "r1",
        },
        {
            "trial": "trial_0000",
            "status": "STOPPED",
            "epochs": 1,
            "config/lr": 0.1,
            "best_val_loss": 0.9,
            "best_epoch": 1,
            "val_loss": 0.9,
            "mlflow_run_id": "r0",
        },
    ]
    text = leaderboard_markdown(
        rows, metric="val_loss", mode="min", run_url={"r1": "http://m/#/r1", "r0": None}
    )
    lines = text.splitlines()
    assert lines[0] == "### Trials, best first by best_val_loss (lower is better)"
    assert lines[2] == "| trial | status | best_val_loss | best_epoch | epochs | lr | val_loss | MLflow run |"
    assert lines[4] == "| trial_0001 | COMPLETED | 0.1235 | 3 | 4 | 0.01235 | 0.2 | [r1](http://m/#/r1) |"
    assert lines[5].endswith("| r0 |")
    assert "No trial ran" in leaderboard_markdown([], metric="acc", mode="max", run_url={})


def test_a_trials_prefect_card_is_titled_with_the_trial_and_opens_on_its_result():
    from sweepflow.tasks.sweep.naming import trial_card
    from sweepflow.tasks.sweep.results import TrialResult, TrialStatus

    stopped = TrialResult(
        trial_id="trial_0003", index=3, name="trial_0003-lr=0.01", config={"lr": 0.01}, status=TrialStatus.STOPPED,
        epochs=1, best=0.914814, best_epoch=1, stop_reason="ASHA",
    )  # fmt: skip
    key, description = trial_card("trial_0003", stopped.name, stopped, "val_accuracy")
    assert key == "trial-0003"  # Prefect's keys: lowercase letters, digits, dashes
    first, rest = description.split("\n\n", 1)
    # The card shows one line: the result, best value first.
    assert first == "**val_accuracy 0.9148** (epoch 1) · stopped early (ASHA) at epoch 1"
    assert rest == "trial_0003-lr=0.01"
    failed = TrialResult(trial_id="Train_Fn_0001", index=1, name="n", config={}, status=TrialStatus.FAILED, error="boom")
    key, description = trial_card(failed.trial_id, failed.name, failed, "val_accuracy")
    assert key == "train-fn-0001" and description.startswith("failed: boom")
