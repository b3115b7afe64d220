"""Addresses of the MLflow and Prefect UI views that answer "what did the sweep find?".

The CLI prints them, the flow logs them, and runs and artifacts carry them, so a user clicks from a Prefect flow
run to its MLflow parent run, from there to the compare view of its trials, and from a trial's Prefect task run
to its MLflow child run and back:

    mlflow = MlflowLinks.for_tracking_uri("http://127.0.0.1:5000")
    mlflow.runs_table("1")        # http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning
    mlflow.compare("1", ["a", "b"])
    prefect_task_run("http://127.0.0.1:4200", task_run_id)

A tracking URI without a web server (``sqlite:``, a directory) has no links: ``MlflowLinks.ui`` is None and
every method returns None. Credentials in a URI (``user:pass@``) never reach a link.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

#: The MLflow run tag whose markdown the UI shows as the run's description.
DESCRIPTION_TAG = "mlflow.note.content"

#: An experiment tag ``<prefix><key>`` holds a saved view of its runs page (filter, order, columns, charts) as
#: JSON; the UI opens it from ``?viewStateShareKey=<key>`` (what MLflow's own "Share" button writes).
SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."

#: The chart a sweep's saved view opens with: every varying hyperparameter against the selection metric.
_PARALLEL_CHART = "sweepflow-parallel"
_SWEEP_SECTION = "sweepflow-sweep"
_METRICS_SECTION = "sweepflow-model-metrics"


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


@dataclass(frozen=True)
class MlflowLinks:
    """Links into the MLflow web UI at ``ui`` (None: the store has no UI, so no links)."""

    ui: str | None

    @classmethod
    def for_tracking_uri(cls, tracking_uri: str, *, local_ui: str | None = None) -> MlflowLinks:
        """The UI of an ``http(s)`` tracking server is the server itself; for a database or directory store,
        ``local_ui`` (where ``mlflow ui`` over that store is served, if the caller says so)."""
        if tracking_uri.startswith(("http://", "https://")):
            return cls(_without_credentials(tracking_uri))
        return cls(local_ui.rstrip("/") if local_ui else None)

    def runs_table(
        self,
        experiment_id: str,
        *,
        parent_run_id: str | None = None,
        metric: str | None = None,
        mode: str = "max",
        view_key: str | None = None,
    ) -> str | None:
        """The experiment's runs table; with ``parent_run_id`` only that sweep's trials, listed flat (MLflow
        keeps a nested parent collapsed, and cannot be told otherwise by URL), and with ``metric`` sorted best
        first by ``best_<metric>`` (which the trial runs log as they train). ``view_key``: the sweep's saved view
        (``sweep_view_state``, an experiment tag), which also shows the metric and the varying hyperparameters
        as columns; MLflow ignores a saved view when the URL names a filter or an order, so the link names
        only the view."""
        if view_key:
            return self._at(f"/experiments/{experiment_id}/runs", [("viewStateShareKey", view_key)])
        query: list[tuple[str, str]] = []
        if parent_run_id:
            query.append(("searchFilter", f"tags.`mlflow.parentRunId` = '{parent_run_id}'"))
        if metric:
            query += [("orderByKey", f"metrics.`best_{metric}`"), ("orderByAsc", "true" if mode == "min" else "false")]
        return self._at(f"/experiments/{experiment_id}/runs", query)

    def trials_chart(self, experiment_id: str, view_key: str) -> str | None:
        """The sweep's saved view in the runs page's chart mode: the parallel-coordinates plot of every varying
        hyperparameter against the metric first (MLflow's compare view picks three parameters by name)."""
        return self._at(
            f"/experiments/{experiment_id}/runs", [("viewStateShareKey", view_key), ("compareRunsMode", "CHART")]
        )

    def run(self, experiment_id: str, run_id: str) -> str | None:
        return self._at(f"/experiments/{experiment_id}/runs/{run_id}")

    def run_artifact(self, experiment_id: str, run_id: str, path: str) -> str | None:
        """The run page's artifact viewer, opened on ``path`` (e.g. "report/sweep_report.html")."""
        return self._at(f"/experiments/{experiment_id}/runs/{run_id}/artifacts/{path}")

    def compare(self, experiment_id: str, run_ids: Sequence[str]) -> str | None:
        """The compare view of these runs, in this order (give them best first: MLflow shows them as given).
        MLflow's own route: JSON lists of run and experiment ids."""
        if not run_ids:
            return None
        runs = json.dumps(list(run_ids), separators=(",", ":"))
        experiments = json.dumps([str(experiment_id)], separators=(",", ":"))
        return self._at("/compare-runs", [("runs", runs), ("experiments", experiments)])

    def model_version(self, name: str, version: str | int) -> str | None:
        return self._at(f"/models/{quote(name, safe='')}/versions/{version}")

    def _at(self, route: str, query: Sequence[tuple[str, str]] = ()) -> str | None:
        """``route`` in the UI, in its model-training mode: without ``workflowType=machine_learning`` MLflow 3
        opens runs, the compare view and model versions in its GenAI mode (traces, judges, prompts)."""
        if not self.ui:
            return None
        # Last: MLflow's compare view reads its runs and experiments only when they lead the query.
        pairs = [*(kv for kv in query if kv[0] != "workflowType"), ("workflowType", "machine_learning")]
        return f"{self.ui}/#{route}?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in pairs)


def sweep_view_state(
    *, parent_run_id: str, metric: str | None, mode: str, params: Sequence[str], trials: int
) -> dict[str, Any]:
    """The runs page's saved view of one sweep (the JSON of MLflow's ``mlflow.sharedViewState.<key>``
    experiment tag): its trials listed flat, best first by ``best_<metric>``, with the metric, its last value
    and ``params`` (the varying hyperparameters) as columns, every trial shown in the charts, and a
    parallel-coordinates chart of ``params`` against ``best_<metric>`` first in the chart mode (MLflow adds
    its own per-metric charts after it)."""
    columns = [f"metrics.`best_{metric}`", f"metrics.`{metric}`"] if metric else []
    columns += [f"params.`{p}`" for p in params]
    view: dict[str, Any] = {
        "searchFilter": f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
        "selectedColumns": columns,
        "runsHiddenMode": "SHOW_ALL",
    }
    if metric:
        view |= {"orderByKey": f"metrics.`best_{metric}`", "orderByAsc": mode == "min"}
    if metric and params:
        section = {"display": True, "isReordered": False, "deleted": False}
        view["compareRunSections"] = [
            # One chart across the page (MLflow's default is three a row): a parallel plot needs the width.
            {**section, "uuid": _SWEEP_SECTION, "name": "Sweep", "isGenerated": False, "columns": 1, "cardHeight": 420},
            # MLflow fills its own section with a chart per metric, as in a view it generated itself.
            {**section, "uuid": _METRICS_SECTION, "name": "Model metrics", "isGenerated": True},
        ]
        view["compareRunCharts"] = [
            {
                "uuid": _PARALLEL_CHART,
                "type": "PARALLEL",
                "metricSectionId": _SWEEP_SECTION,
                "runsCountToCompare": trials,
                "deleted": False,
                "isGenerated": False,
                "selectedParams": list(params),
                "selectedMetrics": [f"best_{metric}"],
                "showAllRuns": True,
            }
        ]
    return view


def sweep_views(
    mlflow: MlflowLinks,
    experiment_id: str,
    *,
    parent_run_id: str,
    trial_run_ids: Sequence[str],
    best_run_id: str | None = None,
    registered: tuple[str, str | int] | None = None,
    metric: str | None = None,
    mode: str = "max",
    view_key: str | None = None,
) -> dict[str, str | None]:
    """The MLflow views of one sweep, by label, in the order a user wants them: the runs table (the sweep's
    trials, best first by ``metric``; in its saved view ``view_key`` when there is one), the pipeline's parent
    run, the trials chart (the saved view's parallel coordinates), the compare view of its trials
    (``trial_run_ids``: give them best first), the best trial's run and the registered version (those known:
    ``best_run_id`` and ``registered`` = (name, version) once the sweep has them)."""
    views = {
        "runs table": mlflow.runs_table(
            experiment_id, parent_run_id=parent_run_id, metric=metric, mode=mode, view_key=view_key
        ),
        "parent run": mlflow.run(experiment_id, parent_run_id),
    }
    if view_key:
        views["trials chart"] = mlflow.trials_chart(experiment_id, view_key)
    views["compare trials"] = mlflow.compare(experiment_id, trial_run_ids)
    if best_run_id:
        views["best trial"] = mlflow.run(experiment_id, best_run_id)
    if registered:
        views["registered model"] = mlflow.model_version(*registered)
    return views


def prefect_ui_url(api_url: str | None) -> str | None:
    """The Prefect UI of an API URL (``http://host:4200/api`` -> ``http://host:4200``); None without one."""
    if not api_url or not api_url.startswith(("http://", "https://")):
        return None
    return _without_credentials(api_url).removesuffix("/api")


def prefect_flow_run(ui: str | None, flow_run_id: str | None) -> str | None:
    return f"{ui}/runs/flow-run/{flow_run_id}" if ui and flow_run_id else None


def prefect_task_run(ui: str | None, task_run_id: str | None) -> str | None:
    return f"{ui}/runs/task-run/{task_run_id}" if ui and task_run_id else None


def markdown_link(text: str, url: str | None) -> str:
    """``[text](url)``, or just the text when there is no URL (no UI to link to)."""
    return f"[{text}]({url})" if url else text


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:.4g}"  # NaN: empty
    return "" if value is None else str(value).replace("|", "\\|")


def leaderboard_markdown(
    rows: Sequence[dict[str, object]], *, metric: str | None, mode: str, run_url: dict[str, str | None]
) -> str:
    """The leaderboard as a markdown table, best first by ``best_<metric>`` (as its heading says), the columns
    that decide first (trial, status, best value and epoch, epochs, hyperparameters), floats to 4 significant
    digits, each trial's MLflow run id a link (``run_url``: run id -> URL). Without a metric: in trial order."""
    best = f"best_{metric}"
    better = "higher is better" if mode == "max" else "lower is better"
    heading = f"### Trials, best first by {best} ({better})" if metric else "### Trials (no metric: none is best)"
    if not rows:
        return f"{heading}\n\nNo trial ran."
    first = ["trial", "status", best, "best_epoch", "epochs"]
    columns = [c for c in first if c in rows[0]]
    columns += [c for c in rows[0] if c.startswith("config/")]
    columns += [c for c in rows[0] if c not in columns and c != "mlflow_run_id"]
    header = [c.removeprefix("config/") for c in columns] + ["MLflow run"]
    lines = [
        heading,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in rows:
        run_id = row.get("mlflow_run_id")
        run = markdown_link(str(run_id), run_url.get(str(run_id))) if run_id else ""
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + f" | {run} |")
    return "\n".join(lines)
