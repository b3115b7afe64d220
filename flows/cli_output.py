"""What ``sweepflow run`` prints once its flow has run: the leaderboard and the outcome (best trial,
registered model, failed trials, resources), the command's timings, and where to look at the sweep (the
MLflow UI's views, the Prefect UI). What it prints of a flow that failed is in ``run_console.py``."""

from __future__ import annotations

import argparse
import os
from typing import Any


def print_run(
    summary: dict[str, Any], args: argparse.Namespace, *, timings: tuple[float, float, float, float]
) -> None:
    """The run's outcome, its timings and its links, from the flow's ``summary``. ``timings``: the wall-clock
    times (``time.time()``) the command started, had its services, had imported the flow, and ended."""
    _print_outcome(summary)
    _print_timings(summary, *timings)
    _print_views(summary)
    # The Prefect server the run used: the local one cmd_run set up, unless PREFECT_API_URL was given.
    if not args.no_server and os.environ.get("PREFECT_API_URL"):
        from sweepflow.tasks.tracking.links import prefect_ui_url

        print(f"Prefect UI (flow runs, task runs per trial): {prefect_ui_url(os.environ['PREFECT_API_URL'])}")


def _print_outcome(summary: dict[str, Any]) -> None:
    """The leaderboard, the best trial's test metrics, the registered model, the failed trials and the
    resources the sweep used (and early stopping saved)."""
    import pandas as pd

    board = pd.DataFrame(summary["leaderboard"])
    cols = [c for c in board.columns if c != "mlflow_run_id"]
    print("\nLeaderboard (best first):")
    print(board[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    reg = summary["registration"]
    print(
        f"\nBest trial: {summary['best_trial']['trial_id']}  test metrics: "
        + ", ".join(f"{k}={v:.4f}" for k, v in summary["test_metrics"].items() if "class" not in k)
    )
    print(
        f"Registered model: {reg['name']} v{reg['version']} (alias challenger"
        + (", champion)" if reg["became_champion"] else f"; champion stays v{reg['champion_version']})")
    )
    print(f"Failed trials: {summary['failed_trials'] or 'none'}")
    usage = summary["usage"]
    print(
        f"Resources: {usage['worker_seconds']:.1f} worker-seconds, {usage['gpu_seconds']:.1f} GPU-seconds; "
        f"early stopping saved {usage['saved_worker_seconds']:.1f} worker-seconds "
        f"({usage['saved_gpu_seconds']:.1f} GPU-seconds)"
        + (
            f"; worker start-up {usage['startup_seconds']:.1f}s (first imports; in no trial's time)"
            if usage.get("startup_seconds")
            else ""
        )
    )


def _print_timings(
    summary: dict[str, Any], t0: float, t_server: float, t_import: float, t_end: float
) -> None:
    """Where the command's time went: its services, its imports, and the flow (by stage)."""
    stages = ", ".join(f"{k.removesuffix('_s')} {v:.1f}s" for k, v in summary["timings"].items())
    print(
        f"\nTimings: services {t_server - t0:.1f}s, imports {t_import - t_server:.1f}s, "
        f"flow {t_end - t_import:.1f}s ({stages})"
    )


def _print_views(summary: dict[str, Any]) -> None:
    """The MLflow UI's views of the sweep (and how to start the UI on a local store), and the sweep report."""
    from sweepflow.tasks.tracking.links import MlflowLinks, sweep_views

    reg = summary["registration"]
    uri = summary["tracking_uri"]
    print("\nCompare trials in the MLflow UI:")
    local_ui = None
    if not uri.startswith(("http://", "https://")):
        local_ui = "http://127.0.0.1:5000"
        print(f"  .venv/bin/mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000   # then open:")
    trial_run_ids = [
        r["mlflow_run_id"] for r in summary["leaderboard"] if r.get("mlflow_run_id")
    ]  # best first
    views = sweep_views(
        MlflowLinks.for_tracking_uri(uri, local_ui=local_ui),
        summary["experiment_id"],
        parent_run_id=summary["parent_run_id"],
        trial_run_ids=trial_run_ids,
        best_run_id=summary["best_trial"]["run_id"],
        registered=(reg["name"], reg["version"]),
        metric=summary["selection"]["metric"],
        mode=summary["selection"]["mode"],
        view_key=summary.get("mlflow_view_key"),
    )
    if summary.get("report_url"):
        views["sweep report"] = summary["report_url"]  # a page of its own: interactive plots of every trial
    for label, url in views.items():
        print(f"  {label + ':':17} {url}")
