"""What a sweep produces: one ``TrialResult`` per trial and the ``SweepResult`` over all of them.

Every field of a ``TrialResult`` is also written to the trial's MLflow child run (params: the sampled config;
tags: trial id, status, error, best and latest checkpoint; metrics: the per-epoch history and the resource
summary), so a sweep's state can be rebuilt from MLflow and storage alone: ``TrialResult.from_mlflow`` does it
for one run.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from ._str_enum import StrEnum

# Tags and metrics of a trial's MLflow child run (the names other tools filter by, too).
TAG_TRIAL_ID = "sweepflow.trial_id"
TAG_TRIAL_INDEX = "sweepflow.trial_index"
TAG_STATUS = "sweepflow.status"
TAG_EPOCHS = "sweepflow.epochs"
TAG_ERROR = "sweepflow.error"
TAG_BEST_CHECKPOINT = "sweepflow.best_checkpoint"
TAG_CHECKPOINT = "sweepflow.checkpoint"  # its latest checkpoint (Ray's Result.checkpoint)
TAG_OUTCOME = "sweepflow.outcome"  # how the trial ended, in words
TAG_STOP_REASON = "sweepflow.stop_reason"
#: The tags that say how a trial ended. A resumed trial's run is no longer ended: they are removed as it reopens
#: (its end writes them again), so an error or stop reason of its earlier end does not outlive it.
ENDED_TAGS = (TAG_STATUS, TAG_OUTCOME, TAG_ERROR, TAG_STOP_REASON)
#: Per-trial summary metrics (``TrialResult.summary_metrics``): not per-epoch reports.
SUMMARY_METRICS = ("epochs_run", "best_epoch")
TAG_CONFIG = "sweepflow.config"  # the sampled hyperparameters as JSON (params are strings in MLflow)
USAGE_METRICS = (
    "worker_seconds",
    "gpu_seconds",
    "saved_worker_seconds",
    "saved_gpu_seconds",
    "group_seconds",
    "startup_seconds",
)


class TrialStatus(StrEnum):
    """How a trial ended. The values are what the ``sweepflow.status`` tag of its MLflow run holds."""

    COMPLETED = "COMPLETED"  # trained to the end (all epochs, or the scheduler's max_t)
    STOPPED = "STOPPED"  # stopped early: the scheduler (ASHA) pruned it, or the sweep's time budget ran out
    FAILED = "FAILED"  # its training failed (after any group restarts)
    NOT_STARTED = "NOT_STARTED"  # queued, then the time budget ran out before it got a slot
    # read back, never written: the experiment's process died while the trial ran (a resume continues it)
    INTERRUPTED = "INTERRUPTED"

    @property
    def mlflow_status(self) -> str:
        """The MLflow run status this ends a trial's run with. Early stopping is a normal end (FINISHED, as in
        Optuna's and W&B's integrations; Ray says TERMINATED), not a failure: MLflow's KILLED draws a red cross.
        A trial the sweep itself stopped (it is stopping after an error) is ended KILLED by the trial."""
        return {"COMPLETED": "FINISHED", "STOPPED": "FINISHED", "FAILED": "FAILED"}[self.value]

    @property
    def selectable(self) -> bool:
        """A trial that trained (to the end or stopped early) can be the sweep's best."""
        return self in (TrialStatus.COMPLETED, TrialStatus.STOPPED)


@dataclass(frozen=True)
class ResourceUsage:
    """What a trial cost the cluster, and what early stopping saved.

    ``worker_seconds`` = ranks x the wall time its DDP group held its workers; ``gpu_seconds`` the same times
    the GPUs per rank. A trial stopped early saved its remaining epochs at its own observed epoch time. A cold
    worker's one-time start-up (first imports) is not the trial's: ``startup_seconds``, apart from the rest.
    """

    ranks: int = 0
    gpus_per_rank: float = 0.0
    group_seconds: float = 0.0  # the group's wall time, from reservation to release (all attempts), less start-up
    startup_seconds: float = 0.0  # what its group waited for cold workers' one-time start-up (usually 0)
    saved_epochs: int = 0  # epochs early stopping spared (max_t - epochs run) for a STOPPED trial
    epoch_seconds: float = 0.0  # observed mean seconds per epoch (rank 0's time in the training function)

    @property
    def worker_seconds(self) -> float:
        return self.ranks * self.group_seconds

    @property
    def gpu_seconds(self) -> float:
        return self.ranks * self.gpus_per_rank * self.group_seconds

    @property
    def saved_worker_seconds(self) -> float:
        return self.ranks * self.saved_epochs * self.epoch_seconds

    @property
    def saved_gpu_seconds(self) -> float:
        return self.gpus_per_rank * self.saved_worker_seconds

    def metrics(self) -> dict[str, float]:
        """As MLflow metrics (``USAGE_METRICS``)."""
        return {name: round(float(getattr(self, name)), 4) for name in USAGE_METRICS}

    @staticmethod
    def total(usages: Sequence[ResourceUsage]) -> dict[str, float]:
        """The sweep's totals of each metric."""
        return {name: round(sum(float(getattr(u, name)) for u in usages), 4) for name in USAGE_METRICS}


@dataclass(frozen=True)
class TrialResult:
    """One trial's outcome: what it tried, how it ended, what it reached, where its best model is."""

    trial_id: str
    index: int  # the trial's number in the sweep: trials start in this order
    name: str
    config: dict[str, Any]  # the sampled hyperparameters
    status: TrialStatus
    run_id: str | None = None  # its MLflow child run
    epochs: int = 0  # reports received
    last: dict[str, Any] = field(default_factory=dict)  # the last report's metrics
    best: float | None = None  # best value of the selection metric over its reports
    best_epoch: int | None = None  # the report (epoch) that reached it
    best_checkpoint: str | None = None  # URI of the checkpoint with the best selection metric
    checkpoint: str | None = None  # URI of its latest checkpoint
    error: str | None = None
    started_at: float | None = None  # epoch seconds: rank 0 entered / left the training function
    ended_at: float | None = None
    train_time_s: float = 0.0  # rank 0's time inside the training function
    slot_wait_s: float = 0.0  # queued for a free slot (the cluster was busy)
    # The trial's own bookkeeping, measured by the sweep: its wall time minus the slot wait and the training
    # (Prefect task run + MLflow child run + group start and stop), and that time's parts.
    bookkeeping_s: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)
    rank0_worker: str | None = None  # the Dask worker rank 0 trained on
    history: tuple[dict[str, Any], ...] = ()  # every report's metrics, in order
    usage: ResourceUsage = field(default_factory=ResourceUsage)
    restarts: int = 0  # group restarts after failures (FailureConfig.max_failures)
    stop_reason: str | None = None  # why a STOPPED trial stopped: "ASHA", "time budget", or the sweep's abort
    # PBT: its configs over time, from the one it started with: {"iteration", "config"[, "donor", ...]} (empty:
    # never exploited another trial)
    config_history: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_history(
        cls,
        history: Sequence[Mapping[str, Any]],
        *,
        metric: str,
        mode: str,
        **fields: Any,
    ) -> TrialResult:
        """A result whose ``epochs``, ``last``, ``best`` and ``best_epoch`` come from its report history."""
        best, best_epoch = best_of(history, metric, mode) if metric else (None, None)
        return cls(
            epochs=len(history),
            last=dict(history[-1]) if history else {},
            best=best,
            best_epoch=best_epoch,
            history=tuple(dict(report) for report in history),
            **fields,
        )

    @classmethod
    def from_mlflow(cls, client: Any, run_id: str, *, metric: str, mode: str) -> TrialResult:
        """Rebuild a finished trial's result from its MLflow child run alone (``client``: an MlflowClient)."""
        run = client.get_run(run_id)
        tags, metrics = run.data.tags, run.data.metrics
        history = history_from_mlflow(client, run_id, run.data.metrics, metric)
        usage = ResourceUsage(
            ranks=int(run.data.params.get("num_ranks", 0)),
            gpus_per_rank=float(run.data.params.get("gpus_per_rank", 0.0)),
            group_seconds=float(metrics.get("group_seconds", 0.0)),
            startup_seconds=float(metrics.get("startup_seconds", 0.0)),
            saved_epochs=int(float(tags.get("sweepflow.saved_epochs", 0))),
            epoch_seconds=float(tags.get("sweepflow.epoch_seconds", 0.0)),
        )
        return cls.from_history(
            history,
            metric=metric,
            mode=mode,
            trial_id=tags[TAG_TRIAL_ID],
            index=int(tags.get(TAG_TRIAL_INDEX, 0)),
            name=tags.get("sweepflow.trial_name", run.info.run_name),
            config=json.loads(tags.get(TAG_CONFIG, "{}")),
            status=TrialStatus(tags[TAG_STATUS]),
            run_id=run_id,
            best_checkpoint=tags.get(TAG_BEST_CHECKPOINT) or None,
            checkpoint=tags.get(TAG_CHECKPOINT) or None,
            error=tags.get(TAG_ERROR),
            train_time_s=float(tags.get("sweepflow.train_time_s", 0.0)),
            usage=usage,
            restarts=int(float(tags.get("sweepflow.restarts", 0))),
            stop_reason=tags.get(TAG_STOP_REASON) or None,
        )

    def summary_tags(self) -> dict[str, Any]:
        """The tags that, with the run's params and metric history, make ``from_mlflow`` possible. The error and
        the stop reason are written only when there is one: a resumed trial's run had those of its earlier end
        removed as it reopened (``ENDED_TAGS``)."""
        tags = {
            TAG_STATUS: self.status.value,
            TAG_EPOCHS: self.epochs,
            TAG_BEST_CHECKPOINT: self.best_checkpoint or "",
            TAG_CHECKPOINT: self.checkpoint or "",
            "sweepflow.train_time_s": round(self.train_time_s, 4),
            "sweepflow.saved_epochs": self.usage.saved_epochs,
            "sweepflow.epoch_seconds": round(self.usage.epoch_seconds, 4),
            "sweepflow.restarts": self.restarts,
            TAG_OUTCOME: self.outcome(),
        }
        if self.stop_reason:
            tags[TAG_STOP_REASON] = self.stop_reason
        if self.error is not None:
            tags[TAG_ERROR] = self.error[:5000]
        return tags

    def summary_metrics(self, metric: str) -> dict[str, float]:
        """Sortable columns of the MLflow runs table: the best value of the selection metric, the epoch it came
        at, and the epochs run (the run's other metrics show their last values there)."""
        out: dict[str, float] = {"epochs_run": self.epochs}
        if self.best is not None:
            out[f"best_{metric}"] = self.best
            out["best_epoch"] = self.best_epoch or 0
        return out

    def outcome(self) -> str:
        """How it ended, in words: "completed", "stopped early (ASHA) at epoch 2", "failed: <reason>"."""
        if self.status is TrialStatus.STOPPED:
            return f"stopped early ({self.stop_reason or 'scheduler'}) at epoch {self.epochs}"
        if self.status is TrialStatus.FAILED:
            return f"failed: {(self.error or 'unknown error').splitlines()[0][:300]}"
        return self.status.value.lower().replace("_", " ")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-friendly): the flow's return value and the CLI's summary carry this."""
        out = asdict(self)
        out["status"] = self.status.value
        out["params"] = out["config"]  # the name Ray's ResultGrid dataframe users look for
        out["usage"] = {**self.usage.metrics(), "ranks": self.usage.ranks, "gpus_per_rank": self.usage.gpus_per_rank}
        return out


def best_of(history: Sequence[Mapping[str, Any]], metric: str, mode: str) -> tuple[float | None, int | None]:
    """The best finite value of ``metric`` over the reports, and the epoch (or report number) it came at."""
    best: tuple[float, int] | None = None
    for i, report in enumerate(history, start=1):
        value = report.get(metric)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            continue
        epoch = int(report.get("epoch", report.get("training_iteration", i)))
        if best is None or (value > best[0] if mode == "max" else value < best[0]):
            best = (float(value), epoch)
    return (best[0], best[1]) if best else (None, None)


def history_from_mlflow(
    client: Any, run_id: str, latest: Mapping[str, float], metric: str
) -> list[dict[str, Any]]:
    """Per-step reports rebuilt from every metric's history (step = epoch), in step order."""
    by_step: dict[int, dict[str, Any]] = {}
    for key in latest:
        if key in USAGE_METRICS or key in SUMMARY_METRICS or key == f"best_{metric}" or key.startswith("system/"):
            continue  # one value per run, not a report's
        for m in client.get_metric_history(run_id, key):
            by_step.setdefault(m.step, {})[key] = m.value
    return [by_step[step] for step in sorted(by_step)]


@dataclass(frozen=True)
class SweepResult:
    """Every trial of a sweep that ran, in the order they finished, and how to pick among them."""

    trials: tuple[TrialResult, ...]
    metric: str | None  # None: a Tune experiment without a metric (no best, no ordering)
    mode: str
    not_started: int = 0  # trials the time budget left unstarted
    # Seconds the sweep waited, before its first trial, for the workers' one-time start-up (first imports on a
    # cold cluster; about 0 on warm workers): in no trial's time or worker-seconds.
    startup_s: float = 0.0

    @property
    def failed(self) -> list[TrialResult]:
        return [t for t in self.trials if t.status is TrialStatus.FAILED]

    def best(self) -> TrialResult | None:
        """The trial with the best ``metric`` value any of its reports reached (early-stopped trials count with
        the best value they reached, as in Ray Tune's ``scope="all"``); None if no trial reported it."""
        candidates = [t for t in self.trials if t.status.selectable and t.best is not None]
        if not candidates:
            return None
        pick = max if self.mode == "max" else min
        return pick(candidates, key=lambda t: t.best)

    def usage(self) -> dict[str, float]:
        """The sweep's totals: worker- and GPU-seconds used, what early stopping saved, and (apart, in none of
        those) ``startup_seconds``: the wall time spent waiting for the workers' one-time start-up, before the
        first trial and inside any trial's group (a worker restarted after a failure starts cold)."""
        totals = ResourceUsage.total([t.usage for t in self.trials])
        totals["startup_seconds"] = round(totals["startup_seconds"] + self.startup_s, 4)
        return totals

    def leaderboard(self) -> pd.DataFrame:
        """One row per trial (config, status, epochs, best and last metrics, resources), best first — like Ray's
        ``ResultGrid.get_dataframe()``."""
        rows = []
        for t in self.trials:
            row: dict[str, Any] = {"trial": t.trial_id, "status": t.status.value, "epochs": t.epochs}
            row.update({f"config/{k}": v for k, v in t.config.items()})
            if self.metric:  # a Tune experiment may have no metric: then there is no best
                row[f"best_{self.metric}"] = t.best
                row["best_epoch"] = t.best_epoch
            row.update({k: v for k, v in t.last.items() if k not in ("training_iteration", "epoch")})
            row["worker_s"] = round(t.usage.worker_seconds, 2)
            row["gpu_s"] = round(t.usage.gpu_seconds, 2)
            row["saved_worker_s"] = round(t.usage.saved_worker_seconds, 2)
            row["mlflow_run_id"] = t.run_id
            rows.append(row)
        frame = pd.DataFrame(rows)
        if not frame.empty and self.metric:
            frame = frame.sort_values(f"best_{self.metric}", ascending=(self.mode == "min"), na_position="last")
        return frame.reset_index(drop=True)


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's leaves by name, nested names joined by "/" (PBT's config histories, as metrics and plots)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flat_config(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def pareto_front(trials: Sequence[TrialResult], objectives: Sequence[tuple[str, str]]) -> list[TrialResult]:
    """The trials no other trial dominates on ``objectives`` ((metric, mode) pairs), by each one's value in the
    trial's last report (what a multi-objective search was told), in trial order. A trial dominates another when
    it is at least as good on every objective and better on one. Failed trials, and those without a finite value
    of every objective, are left out."""
    points: list[tuple[TrialResult, tuple[float, ...]]] = []
    for t in trials:
        if not t.status.selectable:
            continue
        values = [t.last.get(name) for name, _ in objectives]
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            signs = [1.0 if mode == "max" else -1.0 for _, mode in objectives]
            points.append((t, tuple(sign * float(v) for sign, v in zip(signs, values, strict=True))))

    def dominated(p: tuple[float, ...]) -> bool:
        return any(all(a >= b for a, b in zip(q, p, strict=True)) and q != p for _, q in points)

    return sorted((t for t, p in points if not dominated(p)), key=lambda t: t.index)
