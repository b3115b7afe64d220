"""Ray Tune's file loggers (``ray.tune.logger``'s ``CSVLoggerCallback``, ``JsonLoggerCallback`` and
``TBXLoggerCallback``): each trial's results written as files in the trial's local directory
(``trial.local_path``: ``<experiment path>/<trial dirname or id>``, under ``$SWEEPFLOW_HOME/tune/<name>`` when the
experiment's path is remote), alongside MLflow, which records every trial whatever loggers are given.

They are ``LoggerCallback`` objects: pass them in ``tune.run(callbacks=[...])`` or ``RunConfig(callbacks=[...])``.
The files are Ray's: ``progress.csv`` (one row per report, nested results flattened to ``a/b`` columns),
``result.json`` (one JSON object per report, a line each) with ``params.json`` and ``params.pkl`` (the trial's
config), and TensorBoard event files (scalars under ``ray/tune/<key>``, the trial's hyperparameters when it ends),
so a notebook or script that reads Ray's files reads these. A resumed experiment appends to a trial's files (no
second CSV header), as Ray does.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import cloudpickle

from sweepflow.tune.logger_callback import LoggerCallback
from sweepflow.tune.utils import flatten_dict

if TYPE_CHECKING:
    from sweepflow.tune.analysis import Trial

__all__ = ["CSVLoggerCallback", "JsonLoggerCallback", "TBXLoggerCallback"]

#: Ray's file names (``ray.tune.result``'s ``EXPR_*``).
PROGRESS_FILE = "progress.csv"
RESULT_FILE = "result.json"
PARAM_FILE = "params.json"
PARAM_PICKLE_FILE = "params.pkl"


def trial_dir(trial: Trial) -> Path:
    """The trial's local directory, made if missing.

    Raises:
        ValueError: the trial has no local directory (a ``Trial`` not made by a running experiment).
    """
    if not trial.local_path:
        raise ValueError(f"trial {trial.trial_id} has no local directory to write its files in")
    path = Path(trial.local_path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _json_default(value: Any) -> Any:
    """What ``json`` cannot write as it is: NumPy and torch scalars as numbers, arrays as lists, the rest as its
    ``str`` (Ray's ``SafeFallbackEncoder``)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


class CSVLoggerCallback(LoggerCallback):
    """Each trial's reports as rows of ``progress.csv`` in its directory (Ray's ``CSVLoggerCallback``). The
    columns are the first report's keys, flattened (``{"a": {"b": 1}}`` is column ``a/b``), ``config`` left out;
    a key a later report adds is not written (as in Ray: a CSV has one header)."""

    def __init__(self) -> None:
        self._files: dict[str, IO[str]] = {}
        self._writers: dict[str, csv.DictWriter | None] = {}
        self._appending: dict[str, bool] = {}

    def log_trial_start(self, trial: Trial) -> None:
        """Open (or, resumed, reopen for appending) the trial's ``progress.csv``."""
        self._close(trial.trial_id)
        path = trial_dir(trial) / PROGRESS_FILE
        self._appending[trial.trial_id] = path.exists() and path.stat().st_size > 0
        self._files[trial.trial_id] = path.open("a", newline="")
        self._writers[trial.trial_id] = None

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """Write one row (and, first, the header)."""
        if trial.trial_id not in self._files:
            self.log_trial_start(trial)
        row = flatten_dict({k: v for k, v in result.items() if k != "config"}, delimiter="/")
        writer = self._writers[trial.trial_id]
        if writer is None:
            writer = csv.DictWriter(self._files[trial.trial_id], fieldnames=list(row))
            if not self._appending[trial.trial_id]:
                writer.writeheader()
            self._writers[trial.trial_id] = writer
        writer.writerow({k: v for k, v in row.items() if k in writer.fieldnames})
        self._files[trial.trial_id].flush()

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """Close the trial's file."""
        self._close(trial.trial_id)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Close what is still open (a trial stopped with the experiment)."""
        for trial_id in list(self._files):
            self._close(trial_id)

    def _close(self, trial_id: str) -> None:
        file = self._files.pop(trial_id, None)
        self._writers.pop(trial_id, None)
        if file is not None:
            file.close()


class JsonLoggerCallback(LoggerCallback):
    """Each trial's reports as lines of ``result.json`` (one JSON object per report), and its config as
    ``params.json`` and ``params.pkl`` (cloudpickle), in its directory (Ray's ``JsonLoggerCallback``)."""

    def __init__(self) -> None:
        self._files: dict[str, IO[str]] = {}

    def log_trial_start(self, trial: Trial) -> None:
        """Write the trial's config files and open its ``result.json`` for appending."""
        self._close(trial.trial_id)
        self.update_config(trial, trial.config)
        self._files[trial.trial_id] = (trial_dir(trial) / RESULT_FILE).open("a")

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """Append the report as one line (the config it ran with included, as Ray's)."""
        if trial.trial_id not in self._files:
            self.log_trial_start(trial)
        file = self._files[trial.trial_id]
        json.dump(result, file, default=_json_default)
        file.write("\n")
        file.flush()

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """Close the trial's file."""
        self._close(trial.trial_id)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Close what is still open."""
        for trial_id in list(self._files):
            self._close(trial_id)

    def update_config(self, trial: Trial, config: dict[str, Any]) -> None:
        """Write ``config`` as the trial's ``params.json`` and ``params.pkl``."""
        where = trial_dir(trial)
        with (where / PARAM_FILE).open("w") as f:
            json.dump(config, f, indent=2, sort_keys=True, default=_json_default)
        with (where / PARAM_PICKLE_FILE).open("wb") as f:
            cloudpickle.dump(config, f)

    def _close(self, trial_id: str) -> None:
        file = self._files.pop(trial_id, None)
        if file is not None:
            file.close()


#: Result keys not written to TensorBoard (Ray leaves the same out: the step axis and bookkeeping).
_NOT_SCALARS = ("config", "pid", "timestamp", "time_total_s", "training_iteration")
_HPARAM_TYPES = (str, bool, int, float, list, type(None))


class TBXLoggerCallback(LoggerCallback):
    """Each trial's numeric results as TensorBoard scalars (``ray/tune/<key>``, step ``timesteps_total`` or
    ``training_iteration``) in event files in its directory, and its hyperparameters with its last results (the
    HParams tab) when it ends (Ray's ``TBXLoggerCallback``, on ``tensorboardX``). Point ``tensorboard --logdir``
    at the experiment's directory to compare the trials. Needs the ``tensorboard`` extra.

    Raises:
        ImportError: ``tensorboardX`` is not installed (the message names the extra).
    """

    def __init__(self) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "TBXLoggerCallback writes TensorBoard files with tensorboardX, which is not installed: pip install "
                "'sweepflow[tensorboard]' (or 'tensorboardX>=2.6')"
            ) from exc
        self._writer_class = SummaryWriter
        self._writers: dict[str, Any] = {}
        self._last: dict[str, dict[str, float]] = {}

    def log_trial_start(self, trial: Trial) -> None:
        """Open an event file writer in the trial's directory."""
        self._close(trial.trial_id)
        self._writers[trial.trial_id] = self._writer_class(str(trial_dir(trial)), flush_secs=30)
        self._last[trial.trial_id] = {}

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """Write each finite number of the report as a scalar (a list or array of numbers as a histogram)."""
        if trial.trial_id not in self._writers:
            self.log_trial_start(trial)
        writer = self._writers[trial.trial_id]
        step = result.get("timesteps_total") or result.get("training_iteration") or iteration
        flat = flatten_dict({k: v for k, v in result.items() if k not in _NOT_SCALARS}, delimiter="/")
        last = self._last[trial.trial_id]
        for key, value in flat.items():
            tag = f"ray/tune/{key}"
            number = _scalar(value)
            if number is not None:
                writer.add_scalar(tag, number, global_step=step)
                last[tag] = number
            elif _numbers(value):
                writer.add_histogram(tag, value, global_step=step)
        writer.flush()

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """Write the trial's hyperparameters with its last scalars (TensorBoard's HParams), then close."""
        writer = self._writers.get(trial.trial_id)
        if writer is not None and self._last.get(trial.trial_id):
            self._hparams(writer, trial, self._last[trial.trial_id])
        self._close(trial.trial_id)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Close what is still open."""
        for trial_id in list(self._writers):
            self._close(trial_id)

    @staticmethod
    def _hparams(writer: Any, trial: Trial, metrics: dict[str, float]) -> None:
        from tensorboardX.summary import hparams

        params = {}
        for key, value in flatten_dict(dict(trial.evaluated_params or trial.config)).items():
            if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
                value = value.item()  # a NumPy scalar
            if isinstance(value, _HPARAM_TYPES) and value is not None:
                params[key] = value if not isinstance(value, list) else str(value)
        for summary in hparams(hparam_dict=params, metric_dict=metrics):
            writer.file_writer.add_summary(summary)

    def _close(self, trial_id: str) -> None:
        writer = self._writers.pop(trial_id, None)
        self._last.pop(trial_id, None)
        if writer is not None:
            writer.close()


def _scalar(value: Any) -> float | None:
    """``value`` as a finite float if it is one number (bool excluded), else None."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _numbers(value: Any) -> bool:
    """A non-empty list or array of numbers (written as a histogram)."""
    if hasattr(value, "size") and hasattr(value, "dtype"):
        return bool(value.size) and value.dtype.kind in "iuf"
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


def experiment_logs_dir(experiment_path: str, home: str, name: str) -> str:
    """Where trials' local directories go: the experiment's path when it is on this machine, else
    ``<home>/tune/<name>`` (the files are local; an ``s3://`` experiment path keeps the Tuner's settings)."""
    if "://" not in experiment_path or experiment_path.startswith("file://"):
        return os.path.abspath(experiment_path.removeprefix("file://"))
    return os.path.join(home, "tune", name)
