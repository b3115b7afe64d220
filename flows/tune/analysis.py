"""What ``tune.run`` and ``Tuner.fit`` return: Ray's ``ExperimentAnalysis`` (with ``Trial`` objects) and
``ResultGrid`` (with ``Result`` objects), over the sweep's ``TrialResult``s."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from ddp_runtime import Checkpoint
from sweepflow.tasks.sweep.results import TrialResult, TrialStatus, pareto_front

_RAY_STATUS = {
    TrialStatus.COMPLETED: "TERMINATED",
    TrialStatus.STOPPED: "TERMINATED",  # Ray shows early-stopped trials as TERMINATED too
    TrialStatus.FAILED: "ERROR",
    TrialStatus.NOT_STARTED: "PENDING",
    TrialStatus.INTERRUPTED: "PENDING",  # its experiment's process died while it ran: a restore continues it
}


if TYPE_CHECKING:
    from sweepflow.tune._internal.runner import ExperimentRecord


@dataclass(frozen=True)
class _CheckpointRef:
    """Classic Tune's ``trial.checkpoint``: ``.value`` is a local directory holding the checkpoint's files."""

    uri: str

    @property
    def value(self) -> str:
        if "://" not in self.uri or self.uri.startswith("file://"):
            return self.uri.removeprefix("file://")
        target = tempfile.mkdtemp(prefix="sweepflow-checkpoint-")
        Checkpoint(self.uri).to_directory(target)  # a remote checkpoint: downloaded once, here
        return target

    def to_checkpoint(self) -> Checkpoint:
        return Checkpoint(self.uri)


def _score(values: Sequence[float], scope: str, mode: str) -> float | None:
    finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if not finite:
        return None
    if scope == "last":
        return finite[-1]
    if scope == "all":
        return max(finite) if mode == "max" else min(finite)
    if scope == "avg":
        return sum(finite) / len(finite)
    if scope.startswith("last-") and scope.endswith("-avg"):
        n = int(scope[len("last-") : -len("-avg")])
        return sum(finite[-n:]) / len(finite[-n:])
    raise ValueError(f"scope={scope!r}: use 'last', 'all', 'avg', 'last-5-avg' or 'last-10-avg'")


def _best(results: Sequence[TrialResult], metric: str, mode: str, scope: str) -> TrialResult | None:
    if mode not in ("min", "max"):
        raise ValueError(f"mode={mode!r}: use 'min' or 'max'")
    scored = []
    for r in results:
        if r.status is TrialStatus.FAILED:
            continue
        score = _score([h.get(metric) for h in r.history], scope, mode)
        if score is not None:
            scored.append((score, r))
    if not scored:
        return None
    pick = max if mode == "max" else min
    return pick(scored, key=lambda item: item[0])[1]


class Trial:
    """One trial (Ray's ``Trial``): in a classic ``tune.run``'s analysis, and as ``Callback`` hooks and
    ``trial_name_creator`` / ``trial_dirname_creator`` see it (there it changes as the trial runs: status
    PENDING, RUNNING, then TERMINATED or ERROR; ``last_result``). ``str(trial)`` is its name."""

    def __init__(
        self,
        result: TrialResult,
        *,
        trainable_name: str = "",
        experiment_tag: str = "",
        path: str | None = None,
        local_path: str | None = None,
    ) -> None:
        self.trainable_name = trainable_name
        self.experiment_tag = experiment_tag  # Ray's "<number>_<searched values>"
        self.path = path  # where its checkpoints are staged (or its run's artifact location)
        # Its directory on this machine, where file loggers write (<experiment path>/<dirname or trial id>)
        self.local_path = local_path if local_path is not None else path
        self._update(result)

    def _update(self, result: TrialResult) -> None:
        self.result = result
        self.trial_id = result.trial_id
        self.config = result.config
        self.evaluated_params = dict(result.config)
        self.status = _RAY_STATUS[result.status]
        self.error_msg = result.error
        self.metric_history = list(result.history)
        self.last_result = {**result.last, "config": result.config} if result.last else {}
        self.checkpoint = _CheckpointRef(result.checkpoint) if result.checkpoint else None
        self.mlflow_run_id = result.run_id

    def __str__(self) -> str:
        return self.result.name

    def __repr__(self) -> str:
        return f"Trial({self.trial_id}, {self.status})"


class _Experiment:
    """What both Tune results carry: the trials in trial order, the experiment's metric and mode, and where it ran
    and is recorded (MLflow experiment and parent run, Prefect flow run, Ray's experiment path)."""

    def __init__(
        self,
        results: Sequence[TrialResult],
        *,
        metric: str | None,
        mode: str | None,
        record: ExperimentRecord | None = None,
        objectives: Sequence[tuple[str, str]] = (),
    ):
        self._trials = sorted(results, key=lambda r: r.index)
        self.objectives = tuple(objectives)  # a multi-objective search's (metric, mode) pairs
        self.default_metric = metric
        self.default_mode = mode
        self.record = record
        self.experiment_path = record and record.experiment_path  # what Tuner.restore(path) takes


class ExperimentAnalysis(_Experiment):
    """What classic ``tune.run`` returns (Ray's ``ExperimentAnalysis``): the trials, and the best of them.

    Attributes:
        trials: one ``Trial`` per trial, in trial order.
        default_metric: ``tune.run``'s ``metric``, used when a method is not given one.
        default_mode: ``tune.run``'s ``mode``.
        experiment_path: where the experiment's settings were saved (what ``Tuner.restore`` takes).
        record: where it ran and is recorded: the MLflow experiment and parent run, the Prefect flow run.

    Differs from Ray: the trials are the sweep's results (MLflow runs), not files in a local experiment
    directory, so an experiment is not read back with ``ExperimentAnalysis(path)`` (use
    ``Tuner.restore(path).get_results()``), and Ray's per-trial file readers (``trial_dataframes``,
    ``fetch_trial_dataframes``) are not built: ``dataframe()`` and each trial's ``metric_history`` hold the
    reports.
    """

    def __init__(self, results: Sequence[TrialResult], **kwargs: Any):
        super().__init__(results, **kwargs)
        self.trials = [Trial(r) for r in self._trials]
        self._results = results

    def pareto_front(
        self, metric: Sequence[str] | None = None, mode: Sequence[str] | None = None
    ) -> list[Trial]:
        """The trials on the Pareto front of ``metric`` (not in Ray: a sweepflow extra, for a multi-objective
        ``OptunaSearch``): those no other trial beats on every objective, by each trial's last reported values,
        in trial order. It is recorded on the experiment's MLflow parent run too (``pareto_front.json``).

        Args:
            metric: the objectives; default: the multi-objective ``OptunaSearch``'s.
            mode: ``"min"``/``"max"`` for each objective; default: the search's.

        Raises:
            ValueError: no objectives here nor in the search, or metric and mode of different lengths.
        """
        chosen = _objectives(self.objectives, metric, mode)
        return [self.trials[self._trials.index(r)] for r in pareto_front(self._trials, chosen)]

    def _metric_mode(self, metric: str | None, mode: str | None) -> tuple[str, str]:
        metric, mode = metric or self.default_metric, mode or self.default_mode
        if not metric or not mode:
            raise ValueError(
                "get_best_trial needs a metric and a mode: pass them here, or metric=/mode= to tune.run"
            )
        return metric, mode

    def get_best_trial(
        self, metric: str | None = None, mode: str | None = None, scope: str = "last", filter_nan_and_inf: bool = True
    ) -> Trial | None:
        """The trial with the best ``metric`` (Ray's ``ExperimentAnalysis.get_best_trial``).

        Failed trials and non-finite values (NaN, inf) are always left out, so ``filter_nan_and_inf`` is
        accepted and changes nothing.

        Args:
            metric: the reported metric to rank by; default: ``tune.run``'s ``metric``.
            mode: ``"min"`` or ``"max"``; default: ``tune.run``'s ``mode``.
            scope: which of each trial's reports count: ``"last"``, ``"all"`` (its best), ``"avg"``,
                ``"last-5-avg"`` or ``"last-10-avg"`` (any ``"last-<n>-avg"``).
            filter_nan_and_inf: accepted for Ray's signature; ignored.

        Returns:
            The best ``Trial``, or None when no trial reported a finite ``metric``.

        Raises:
            ValueError: no metric or mode here nor in ``tune.run``, or an unknown ``mode`` or ``scope``.
        """
        metric, mode = self._metric_mode(metric, mode)
        best = _best(self._results, metric, mode, scope)
        return next((t for t in self.trials if best is not None and t.trial_id == best.trial_id), None)

    def get_best_config(self, metric: str | None = None, mode: str | None = None, scope: str = "last") -> dict | None:
        """The config of ``get_best_trial(metric, mode, scope)``; None when there is none."""
        trial = self.get_best_trial(metric, mode, scope)
        return trial.config if trial else None

    def get_best_checkpoint(self, trial: Trial, metric: str | None = None, mode: str | None = None) -> Any:
        """The latest checkpoint of ``trial``, or None when it saved none.

        Differs from Ray: ``metric`` and ``mode`` are accepted and ignored -- the trial's latest checkpoint is
        returned, not the best-scoring one it kept -- and the value is Classic Tune's checkpoint reference:
        ``.value`` is a local directory (a remote checkpoint is downloaded into a new temporary directory on
        each access), ``.to_checkpoint()`` a ``Checkpoint``.
        """
        return trial.checkpoint

    @property
    def best_trial(self) -> Trial | None:
        """``get_best_trial()`` with ``tune.run``'s metric and mode."""
        return self.get_best_trial()

    @property
    def best_config(self) -> dict | None:
        """``get_best_config()`` with ``tune.run``'s metric and mode."""
        return self.get_best_config()

    @property
    def best_checkpoint(self) -> Any:
        """The best trial's latest checkpoint (see ``get_best_checkpoint``); None when there is none."""
        trial = self.best_trial
        return trial.checkpoint if trial else None

    @property
    def best_result(self) -> dict | None:
        """The best trial's last result (with its ``config``); None when there is no best trial."""
        trial = self.best_trial
        return trial.last_result if trial else None

    def dataframe(self, metric: str | None = None, mode: str | None = None) -> pd.DataFrame:
        """One row per trial, in trial order: its last result, ``config/<key>`` columns, ``trial_id``,
        ``status`` and ``mlflow_run_id``.

        ``metric`` and ``mode`` are accepted for Ray's signature and ignored: each row is the trial's last
        result, not its best one.
        """
        return _dataframe(self._results)

    @property
    def results_df(self) -> pd.DataFrame:
        """The same table as ``dataframe()``."""
        return _dataframe(self._results)


@dataclass
class Result:
    """One trial of ``Tuner.fit()`` (Ray's ``ray.train.Result``).

    Attributes:
        metrics: the trial's last report, with its ``config`` and ``trial_id``.
        config: the config it ran with.
        checkpoint: its latest checkpoint; None when it saved none.
        error: why it failed, as text (Ray gives the exception); None when it did not.
        path: the directory of its latest checkpoint (Ray: the trial's directory); None without one.
        metrics_dataframe: every report, one row each.
        mlflow_run_id: the trial's MLflow run (not in Ray): its params, metric history and artifacts.
    """

    metrics: dict[str, Any]
    config: dict[str, Any]
    checkpoint: Checkpoint | None
    error: str | None
    path: str | None
    metrics_dataframe: pd.DataFrame
    mlflow_run_id: str | None

    @classmethod
    def of(cls, r: TrialResult) -> Result:
        """The ``Result`` of one of the sweep's trial results (``path``: the directory of its latest
        checkpoint).
        """
        return cls(
            metrics={**r.last, "config": r.config, "trial_id": r.trial_id} if r.last else {"trial_id": r.trial_id},
            config=r.config,
            checkpoint=Checkpoint(r.checkpoint) if r.checkpoint else None,
            error=r.error,
            path=os.path.dirname(r.checkpoint) if r.checkpoint else None,
            metrics_dataframe=pd.DataFrame(list(r.history)),
            mlflow_run_id=r.run_id,
        )


class ResultGrid(_Experiment):
    """What ``Tuner.fit()`` returns: one ``Result`` per trial, in trial order."""

    def __init__(self, results: Sequence[TrialResult], **kwargs: Any):
        super().__init__(results, **kwargs)
        self._results = [Result.of(r) for r in self._trials]

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:
        return self._results[i]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    @property
    def errors(self) -> list[str]:
        """The error message of every failed trial (Ray gives exceptions; here they are the messages)."""
        return [r.error for r in self._results if r.error]

    @property
    def num_errors(self) -> int:
        """How many trials failed."""
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        """How many trials ended without an error, completed or stopped early (Ray's TERMINATED)."""
        return sum(1 for r in self._trials if _RAY_STATUS[r.status] == "TERMINATED")

    def get_best_result(
        self, metric: str | None = None, mode: str | None = None, scope: str = "last", filter_nan_and_inf: bool = True
    ) -> Result:
        """The ``Result`` of the trial with the best ``metric`` (Ray's ``ResultGrid.get_best_result``).

        Failed trials and non-finite values are always left out, so ``filter_nan_and_inf`` is accepted and
        changes nothing.

        Args:
            metric: the reported metric to rank by; default: ``TuneConfig.metric``.
            mode: ``"min"`` or ``"max"``; default: ``TuneConfig.mode``.
            scope: ``"last"``, ``"all"``, ``"avg"`` or ``"last-<n>-avg"``, as in
                ``ExperimentAnalysis.get_best_trial``.
            filter_nan_and_inf: accepted for Ray's signature; ignored.

        Raises:
            ValueError: no metric or mode here nor in ``TuneConfig``, or an unknown ``mode`` or ``scope``.
            RuntimeError: no trial reported a finite ``metric`` (see ``errors``).
        """
        metric, mode = metric or self.default_metric, mode or self.default_mode
        if not metric or not mode:
            raise ValueError("get_best_result needs a metric and a mode: pass them here, or to TuneConfig")
        best = _best(self._trials, metric, mode, scope)
        if best is None:
            raise RuntimeError(f"no trial reported a finite {metric!r}; see ResultGrid.errors")
        return self._results[self._trials.index(best)]

    def trial_result(self, result: Result) -> TrialResult:
        """The sweep's own record of one of the grid's ``Result``s (what the lifecycle's stages take)."""
        return next(t for r, t in zip(self._results, self._trials, strict=True) if r is result)

    def pareto_front(self, metric: Sequence[str] | None = None, mode: Sequence[str] | None = None) -> list[Result]:
        """The ``Result`` of each trial on the Pareto front of ``metric`` (not in Ray: a sweepflow extra, for a
        multi-objective ``OptunaSearch``): those no other trial beats on every objective, by each trial's last
        reported values, in trial order. It is recorded on the experiment's MLflow parent run too
        (``pareto_front.json`` and the tag ``sweepflow.pareto_front``).

        Args:
            metric: the objectives; default: the multi-objective ``OptunaSearch``'s.
            mode: ``"min"``/``"max"`` for each objective; default: the search's.

        Raises:
            ValueError: no objectives here nor in the search, or metric and mode of different lengths.
        """
        chosen = _objectives(self.objectives, metric, mode)
        return [self._results[self._trials.index(t)] for t in pareto_front(self._trials, chosen)]

    def get_dataframe(self, filter_metric: str | None = None, filter_mode: str | None = None) -> pd.DataFrame:
        """One row per trial, as ``ExperimentAnalysis.dataframe()``.

        ``filter_metric`` and ``filter_mode`` are accepted for Ray's signature and ignored: each row is the
        trial's last result, not the one best in ``filter_metric``.
        """
        return _dataframe(self._trials)


def _objectives(
    searched: tuple[tuple[str, str], ...], metric: Sequence[str] | None, mode: Sequence[str] | None
) -> list[tuple[str, str]]:
    if metric is None and mode is None:
        if not searched:
            raise ValueError(
                "pareto_front needs the objectives: pass metric=[...] and mode=[...], or search with "
                "OptunaSearch(metric=[...], mode=[...])"
            )
        return list(searched)
    if isinstance(metric, str) or isinstance(mode, str) or metric is None or mode is None or len(metric) != len(mode):
        raise ValueError(
            f"pareto_front(metric={metric!r}, mode={mode!r}): give a list of metrics and a list of modes of the "
            "same length, e.g. metric=['loss', 'acc'], mode=['min', 'max']"
        )
    if any(m not in ("min", "max") for m in mode):
        raise ValueError(f"pareto_front(mode={mode!r}): each mode must be 'min' or 'max'")
    return list(zip(metric, mode, strict=True))


def _dataframe(results: Sequence[TrialResult]) -> pd.DataFrame:
    rows = []
    for r in sorted(results, key=lambda r: r.index):
        row: dict[str, Any] = dict(r.last)
        row.update({f"config/{k}": v for k, v in r.config.items()})
        row.update({"trial_id": r.trial_id, "status": _RAY_STATUS[r.status], "mlflow_run_id": r.run_id})
        rows.append(row)
    return pd.DataFrame(rows)
