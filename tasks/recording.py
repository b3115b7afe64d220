"""How a sweep is recorded, the same for a pipeline run and a Tune experiment: the MLflow parent run's lifecycle
(``parent_run``: started or reopened, its settings and resume key as artifacts, FINISHED or FAILED at the end)
and the recording step once the sweep has ended (``record_sweep``: the leaderboard as a CSV artifact and as the
flow run's Prefect markdown artifact with links, the sweep report, the sweep's resource totals and best value as
parent-run metrics, its failed trials as a tag, and a multi-objective sweep's Pareto front). Each trial's own summary and outcome tags are written by the
sweep driver as the trial ends."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL

from sweepflow.tasks.sweep.results import SweepResult, TrialResult, pareto_front
from sweepflow.tasks.sweep.resume import RESUME_KEY_ARTIFACT, TAG_RESUME_KEY, TAG_RESUMES, digest
from sweepflow.tasks.tracking.links import (
    DESCRIPTION_TAG,
    SHARED_VIEW_TAG_PREFIX,
    MlflowLinks,
    leaderboard_markdown,
    markdown_link,
    prefect_flow_run,
    prefect_ui_url,
    sweep_view_state,
    sweep_views,
)
from sweepflow.tasks.tracking.params import varying_params
from sweepflow.tasks.tracking.runs import RunTracker, check_direct_writes, direct_storage_uri


@dataclass(frozen=True)
class ParentRun:
    """What a sweep's MLflow parent run holds about it (everything credential-free)."""

    name: str
    params: dict[str, Any]  # the few settings a user filters and compares runs by
    tags: dict[str, Any]  # e.g. "sweepflow.kind", the data checksum
    settings: dict[str, Any]  # every setting, as the artifact config/<settings_file>
    settings_file: str  # e.g. "pipeline_config.json"
    resume_key: dict[str, Any]  # what a resume must share: its digest is a tag, the settings an artifact
    scratch_dir: str  # a local directory for files on their way to the artifact store
    # Tags a reopened run must still hold with the same value, with what to say when one differs.
    same_on_resume: dict[str, str] = field(default_factory=dict)
    artifacts_destination: str | None = None  # the server's artifact root, to check direct writes against


@contextlib.contextmanager
def parent_run(tracker: RunTracker, spec: ParentRun, *, resume_from: str | None = None) -> Iterator[str]:
    """The sweep's MLflow parent run: FINISHED if the block completes, FAILED if it raises. With ``resume_from``,
    that (interrupted) run is reopened instead of a new one started."""
    if resume_from:
        parent = _reopen(tracker, resume_from, spec)
    else:
        parent = tracker.start_run(
            spec.name,
            params=spec.params,
            tags={
                **spec.tags,
                "sweepflow.code_version": code_version(),
                "prefect.flow_run_id": str(flow_run.get_id() or ""),
                TAG_RESUME_KEY: digest(spec.resume_key),
                DESCRIPTION_TAG: flow_run_description(),
            },
        )
        # The settings a resume must share, in full: a refused resume names what differs.
        tmp = os.path.join(spec.scratch_dir, parent)
        os.makedirs(tmp, exist_ok=True)
        with open(os.path.join(tmp, os.path.basename(RESUME_KEY_ARTIFACT)), "w") as f:
            json.dump(spec.resume_key, f, indent=1, sort_keys=True)
        tracker.log_artifact(parent, f.name, os.path.dirname(RESUME_KEY_ARTIFACT))
        with open(os.path.join(tmp, spec.settings_file), "w") as f:
            json.dump(spec.settings, f, indent=1, sort_keys=True, default=str)
        tracker.log_artifact(parent, f.name, "config")
    status = "FAILED"
    try:
        if spec.artifacts_destination:
            direct = direct_storage_uri(tracker.artifact_uri(parent), spec.artifacts_destination)
            if direct:
                check_direct_writes(tracker, parent, direct)
        yield parent
        status = "FINISHED"
    finally:
        tracker.end_run(parent, status)


def _reopen(tracker: RunTracker, parent: str, spec: ParentRun) -> str:
    """The interrupted parent run, RUNNING again and its resumes counted, once it is checked to still hold
    ``spec.same_on_resume``'s tags (e.g. the data it trained on)."""
    run = tracker.client.get_run(parent)
    for tag, what in spec.same_on_resume.items():
        before, now = run.data.tags.get(tag), spec.tags.get(tag)
        if before != str(now):
            raise RuntimeError(
                f"resume: {what} changed since run {parent} started ({tag} {before}, now {now}); its trials "
                "cannot be continued on something else. Restore it, or start a new run"
            )
    tracker.set_status(parent, "RUNNING")
    tracker.set_tags(
        parent,
        {
            TAG_RESUMES: int(run.data.tags.get(TAG_RESUMES, 0)) + 1,
            "prefect.flow_run_id": str(flow_run.get_id() or ""),
            DESCRIPTION_TAG: flow_run_description(),
        },
    )
    return parent


@dataclass(frozen=True)
class LeaderboardArtifact:
    """The flow run's Prefect markdown artifact ``sweep-leaderboard``: links to the sweep's MLflow views and its
    report, then the leaderboard. Published once per flow run, when the stages after the sweep have ended (also
    when one failed), with links to the best trial and the registered version when there are ones."""

    mlflow_ui: MlflowLinks
    experiment_id: str
    parent_run_id: str
    trial_run_ids: tuple[str, ...]  # best first
    report_url: str | None
    table: str
    metric: str | None = None  # what the runs-table link sorts by
    mode: str = "max"
    view_key: str | None = None  # the sweep's saved view of the runs page (an experiment tag)

    def publish(
        self, *, best_run_id: str | None = None, registered: tuple[str, str | int] | None = None
    ) -> dict[str, str | None]:
        """Publish (a new version of) the artifact; returns the MLflow views it links, by label."""
        views = sweep_views(
            self.mlflow_ui,
            self.experiment_id,
            parent_run_id=self.parent_run_id,
            trial_run_ids=self.trial_run_ids,
            best_run_id=best_run_id,
            registered=registered,
            metric=self.metric,
            mode=self.mode,
            view_key=self.view_key,
        )
        links = ["- " + " · ".join(markdown_link(f"MLflow {label}", url) for label, url in views.items())]
        if self.report_url:
            links.append(f"- {markdown_link('sweep report (plots)', self.report_url)}")
        create_markdown_artifact(
            markdown="\n".join(links) + "\n\n" + self.table,
            key="sweep-leaderboard",
            description=f"Trials of MLflow run {self.parent_run_id}",
        )
        return {**views, "sweep report": self.report_url} if self.report_url else views


@dataclass(frozen=True)
class SweepRecord:
    """How ``record_sweep`` presents a sweep."""

    metric: str | None  # the selection metric: the leaderboard's order and the parent's best_<metric>; None
    # (a Tune experiment without one): trials in order, no best and no report (its plots compare by the metric),
    # unless there are two or more objectives: then the report ranks by the first (and draws the Pareto front)
    mode: str
    search_space: Mapping[str, Any]  # as data ({"lr": {"type": "loguniform", ...}}): the report's axes
    title: str  # the report's title
    tracking_uri: str  # for links into the MLflow UI (a server's; none for a local store)
    scratch_dir: str
    # A multi-objective search's (metric, mode) pairs: its Pareto front is recorded (and drawn in the report)
    objectives: tuple[tuple[str, str], ...] = ()


def record_sweep(
    sweep: SweepResult,
    tracker: RunTracker,
    parent: str,
    record: SweepRecord,
    *,
    log: Callable[[str], None] | None = None,
) -> tuple[Any, LeaderboardArtifact]:
    """The leaderboard (CSV artifact on the parent run; the markdown artifact in Prefect is returned, to publish
    once, when the best trial and any registered version are known), the sweep report, the sweep's resource
    totals and best value as parent-run metrics, its failed trials as a tag, and with ``record.objectives`` its
    Pareto front (``record_pareto_front``; ``log``: the flow run's logger, told which trials are on it)."""
    board = sweep.leaderboard()
    os.makedirs(record.scratch_dir, exist_ok=True)
    board_path = os.path.join(record.scratch_dir, f"leaderboard-{parent}.csv")
    board.to_csv(board_path, index=False)
    tracker.log_artifact(parent, board_path, "leaderboard")
    mlflow_ui = MlflowLinks.for_tracking_uri(record.tracking_uri)
    eid = tracker.experiment_id
    rows = board.astype(object).where(board.notna(), None).to_dict(orient="records")
    # Best first (the leaderboard's order), so the compare view opens with the winner in its first column.
    trial_run_ids = tuple(str(r["mlflow_run_id"]) for r in rows if r.get("mlflow_run_id"))
    view_key = share_sweep_view(sweep, tracker, parent, record)  # `mlflow ui` over a database store opens it too
    views = {
        f"MLflow {label}": url
        for label, url in sweep_views(
            mlflow_ui,
            eid,
            parent_run_id=parent,
            trial_run_ids=trial_run_ids,
            metric=record.metric,
            mode=record.mode,
            view_key=view_key,
        ).items()
    }
    artifact = LeaderboardArtifact(
        mlflow_ui=mlflow_ui,
        experiment_id=eid,
        parent_run_id=parent,
        trial_run_ids=trial_run_ids,
        # Without a metric, a multi-objective sweep's report is ranked by the first objective (and draws the front).
        report_url=(
            _sweep_report(sweep, tracker, parent, record, mlflow_ui, views)
            if record.metric or len(record.objectives) >= 2
            else None
        ),
        table=leaderboard_markdown(
            rows,
            metric=record.metric,
            mode=record.mode,
            run_url={str(r["mlflow_run_id"]): mlflow_ui.run(eid, str(r["mlflow_run_id"])) for r in rows},
        ),
        metric=record.metric,
        mode=record.mode,
        view_key=view_key,
    )
    if artifact.report_url:  # the parent run's description links the report, a page of its own
        tracker.set_tags(
            parent,
            {DESCRIPTION_TAG: f"{flow_run_description()}\n\nSweep report: {markdown_link('sweep_report.html', artifact.report_url)}"},
        )
    metrics = dict(sweep.usage())
    best = sweep.best()
    if record.metric and best is not None and best.best is not None:
        metrics[f"best_{record.metric}"] = best.best
    tracker.log_metrics(parent, metrics, step=0)
    tracker.set_tags(parent, {"sweepflow.failed_trials": ",".join(t.trial_id for t in sweep.failed) or "none"})
    if record.objectives:
        front = record_pareto_front(sweep.trials, tracker, parent, record.objectives)
        if log is not None:
            names = ", ".join(m for m, _ in record.objectives)
            log(f"Pareto front of {names}: {[t.trial_id for t in front]} ({PARETO_FRONT_FILE})")
    return board, artifact


#: A multi-objective sweep's Pareto front on its parent run: the artifact and the tag (its trial ids, or "none").
PARETO_FRONT_FILE = "pareto_front.json"
PARETO_FRONT_TAG = "sweepflow.pareto_front"


def pareto_front_data(front: Sequence[TrialResult], objectives: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """What ``pareto_front.json`` holds: the objectives, and each trial on the front (id, MLflow run, config,
    objective values)."""
    return {
        "objectives": [{"metric": m, "mode": d} for m, d in objectives],
        "trials": [
            {
                "trial_id": t.trial_id,
                "mlflow_run_id": t.run_id,
                "config": t.config,
                "values": {m: t.last.get(m) for m, _ in objectives},
            }
            for t in front
        ],
    }


def record_pareto_front(
    trials: Sequence[TrialResult], tracker: RunTracker, parent: str, objectives: Sequence[tuple[str, str]]
) -> list[TrialResult]:
    """A multi-objective search's Pareto front (``results.pareto_front``) on the parent run: the artifact
    ``pareto_front.json`` and the tag ``sweepflow.pareto_front``; returns the front's trials."""
    front = pareto_front(trials, objectives)
    tracker.log_dict(parent, pareto_front_data(front, objectives), PARETO_FRONT_FILE)
    tracker.set_tags(parent, {PARETO_FRONT_TAG: ",".join(t.trial_id for t in front) or "none"})
    return front


def share_sweep_view(sweep: SweepResult, tracker: RunTracker, parent: str, record: SweepRecord) -> str:
    """Save the runs page's view of this sweep (its trials, best first, the metric and the varying
    hyperparameters as columns, their parallel-coordinates chart) as an experiment tag; returns its key (the
    parent run's id: one view per sweep, rewritten when the sweep is resumed)."""
    view = sweep_view_state(
        parent_run_id=parent,
        metric=record.metric,
        mode=record.mode,
        params=varying_params([t.config for t in sweep.trials]),
        trials=len(sweep.trials),
    )
    tracker.set_experiment_tag(SHARED_VIEW_TAG_PREFIX + parent, json.dumps(view, separators=(",", ":")))
    return parent


def _sweep_report(
    sweep: SweepResult,
    tracker: RunTracker,
    parent: str,
    record: SweepRecord,
    mlflow_ui: MlflowLinks,
    views: dict[str, str | None],
) -> str | None:
    """The sweep report (one self-contained, interactive HTML page; a PNG for PBT) as the parent run's
    ``report/`` artifacts; its address: a page of its own where the tracking server serves one (sweepflow's
    servers, report_page.py), else MLflow's artifact viewer; None without a server. ``views``: the MLflow views
    to link, by label."""
    from sweepflow.tasks.reporting.report_page import REPORT_PATH, report_page_url
    from sweepflow.tasks.reporting.sweep_report import write_sweep_report

    eid = tracker.experiment_id
    links = {
        **views,
        "Prefect flow run": prefect_flow_run_url(),
        "run_url_template": mlflow_ui.run(eid, "{run_id}"),
    }
    out_dir = os.path.join(record.scratch_dir, f"report-{parent}")
    page = report_page_url(record.tracking_uri, mlflow_ui.ui, parent, REPORT_PATH)
    write_sweep_report(
        sweep,
        out_dir=out_dir,
        search_space=dict(record.search_space),
        title=record.title,
        links={k: v for k, v in links.items() if v},
        page_url=page,
        objectives=record.objectives,  # two or more: the report draws the Pareto front
    )
    tracker.log_artifact(parent, out_dir, "report")
    return page or mlflow_ui.run_artifact(eid, parent, REPORT_PATH)


def prefect_flow_run_url() -> str | None:
    """This flow run's page in the Prefect UI; None outside a flow run or without an HTTP API."""
    return prefect_flow_run(prefect_ui_url(PREFECT_API_URL.value()), str(flow_run.get_id() or "") or None)


def flow_run_description() -> str:
    """The parent run's description (markdown in the MLflow UI): a link to the Prefect flow run."""
    flow_run_id = str(flow_run.get_id() or "")
    if not flow_run_id:
        return "Not run by a Prefect flow run."
    return f"Prefect flow run: {markdown_link(flow_run.get_name() or flow_run_id, prefect_flow_run_url())}"


def code_version() -> str:
    """The git commit of the checkout the flow runs from, or "unknown" (e.g. an installed package)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"
