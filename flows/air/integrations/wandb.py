"""Ray's ``ray.air.integrations.wandb`` on sweepflow: ``WandbLoggerCallback`` and ``setup_wandb``, on Weights &
Biases' own client (the ``wandb`` extra: ``pip install 'sweepflow[wandb]'``).

W&B is recorded *alongside* MLflow, never instead of it: every trial is still its MLflow run (params, every
report, checkpoints, status), and a W&B run is added beside it.

* ``WandbLoggerCallback(project=..., ...)`` in ``tune.run(callbacks=[...])`` / ``RunConfig(callbacks=[...])``
  opens one W&B run per trial in the script's process (where Tune's callbacks run), logs each of its results
  (numbers only, nested keys flattened to ``a/b``, step ``training_iteration``), and finishes it when the trial
  ends: exit code 1 when it failed, 0 otherwise. The run's id is the trial's MLflow run id (Ray uses the trial
  id, which here repeats across experiments), its name the trial's, its group the experiment's directory name.
  Its files go in the trial's directory (``<trial>/wandb``), as in Ray, unless ``WANDB_DIR`` says otherwise.
* ``run = setup_wandb(config)`` inside a trainable or a ``TorchTrainer`` training loop starts a W&B run for the
  trial (id: its MLflow run id; name: the trial's; group: the experiment's) with ``config`` logged, and returns
  it (``run.log({...})``). Only rank 0 of a DDP group starts one (``rank_zero_only=True``); the others get a
  disabled run. The run is finished when the training function returns (exit code 1 if it raised).

The API key (``api_key=``, ``api_key_file=``, else ``WANDB_API_KEY`` or ``wandb login``'s) is only ever put in
this process's environment as ``WANDB_API_KEY``, where ``wandb`` reads it: never in a log, a message, the run's
config or a command line. ``WANDB_MODE=offline`` (or ``disabled``) needs none; offline runs are uploaded later
with ``wandb sync``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from numbers import Number
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sweepflow.tune.logger import LoggerCallback
from sweepflow.tune.utils import flatten_dict

if TYPE_CHECKING:
    from sweepflow.tune.analysis import Trial

__all__ = ["WandbLoggerCallback", "setup_wandb"]

log = logging.getLogger(__name__)

#: Ray's environment variables (``ray.air.integrations.wandb``).
WANDB_ENV_VAR = "WANDB_API_KEY"
WANDB_PROJECT_ENV_VAR = "WANDB_PROJECT_NAME"
WANDB_GROUP_ENV_VAR = "WANDB_GROUP_NAME"
WANDB_MODE_ENV_VAR = "WANDB_MODE"

#: Ray's ``DEFAULT_SYNC_TIMEOUT``: how long the experiment's end waits for the runs' last uploads.
DEFAULT_UPLOAD_TIMEOUT = 1800

_OFFLINE_MODES = ("offline", "disabled", "dryrun")
_key_lock = threading.Lock()


def _import_wandb(where: str) -> ModuleType:
    try:
        import wandb
    except ImportError as exc:
        raise ImportError(
            f"{where} records to Weights & Biases with the wandb client, which is not installed: pip install "
            "'sweepflow[wandb]' (or 'wandb>=0.16')"
        ) from exc
    return wandb


def _offline(mode: Any = None) -> bool:
    """Whether runs are made without the W&B server (no API key needed): ``mode=`` or ``WANDB_MODE``."""
    chosen = mode if mode is not None else os.environ.get(WANDB_MODE_ENV_VAR)
    return str(chosen or "").lower() in _OFFLINE_MODES


def _resolve_api_key(api_key: str | None, api_key_file: str | None, where: str) -> str | None:
    """The API key given as an argument or in a file (None: wandb finds its own, from ``WANDB_API_KEY`` or
    ``wandb login``). The key itself is never put in a message."""
    if api_key is not None and api_key_file is not None:
        raise ValueError(f"{where}: give api_key or api_key_file, not both")
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise TypeError(f"{where}(api_key=...) must be a non-empty string")
    if api_key_file is None:
        return api_key.strip() if api_key else None
    path = os.path.expanduser(str(api_key_file))
    try:
        with open(path) as f:
            key = f.readline().strip()
    except OSError as exc:
        raise FileNotFoundError(
            f"{where}(api_key_file={path!r}): cannot read it ({type(exc).__name__}); give a file holding the "
            "W&B API key on its first line"
        ) from None
    if not key:
        raise ValueError(f"{where}(api_key_file={path!r}) is empty; put the W&B API key on its first line")
    return key


@contextlib.contextmanager
def _api_key_env(key: str | None) -> Iterator[None]:
    """``WANDB_API_KEY`` set to ``key`` in this process's environment for the block, then as it was (nothing to
    do without a key). wandb reads it when a run starts."""
    if key is None:
        yield
        return
    with _key_lock:
        previous = os.environ.get(WANDB_ENV_VAR)
        os.environ[WANDB_ENV_VAR] = key
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(WANDB_ENV_VAR, None)
            else:
                os.environ[WANDB_ENV_VAR] = previous


def _from_environment() -> dict[str, str]:
    """``WANDB_MODE`` and ``WANDB_DIR`` as they are now, for ``wandb.init``: wandb reads the environment once per
    process, so a later change would otherwise go unseen."""
    chosen = {"mode": os.environ.get(WANDB_MODE_ENV_VAR), "dir": os.environ.get("WANDB_DIR")}
    return {name: value for name, value in chosen.items() if value}


def _project(project: str | None) -> str | None:
    return project or os.environ.get(WANDB_PROJECT_ENV_VAR) or None


def _allowed(value: Any, wandb: ModuleType) -> bool:
    """A value W&B charts: a number (a one-element array too) or a W&B media object (or a list of them)."""
    wb_value = wandb.sdk.data_types.base_types.wb_value.WBValue
    if hasattr(value, "ndim") and hasattr(value, "size") and value.size == 1:
        value = value.item()
    if isinstance(value, Number):
        return not (isinstance(value, float) and math.isnan(value))
    if isinstance(value, list | tuple) and value:
        return isinstance(value[0], wb_value)
    return isinstance(value, wb_value)


def _clean(value: Any, wandb: ModuleType, image_kwargs: Mapping[str, Any], video_kwargs: Mapping[str, Any]) -> Any:
    """``value`` as W&B takes it (Ray's conversions): NumPy images (3-D, or 4-D batches) as ``wandb.Image``,
    5-D arrays as ``wandb.Video``, dicts and sequences item by item, anything JSON cannot hold as its ``str``."""
    if isinstance(value, Mapping):
        return {k: _clean(v, wandb, image_kwargs, video_kwargs) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        cleaned = [_clean(v, wandb, image_kwargs, video_kwargs) for v in value]
        return tuple(cleaned) if isinstance(value, tuple) else cleaned
    ndim = getattr(value, "ndim", None)
    if ndim == 3 and hasattr(value, "shape"):
        return wandb.Image(value, **image_kwargs)
    if ndim == 4:
        images = [wandb.Image(v, **image_kwargs) for v in value]
        return images if len(images) > 1 else images[0]
    if ndim == 5:
        videos = [wandb.Video(v, **video_kwargs) for v in value]
        return videos if len(videos) > 1 else videos[0]
    if hasattr(value, "item") and getattr(value, "size", 0) == 1:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if value is None or isinstance(value, str | bool | Number) or _allowed(value, wandb):
        return value
    return str(value)


# --------------------------------------------------------------------------------------------- setup_wandb


def setup_wandb(
    config: dict[str, Any] | None = None,
    api_key: str | None = None,
    api_key_file: str | None = None,
    rank_zero_only: bool = True,
    **kwargs: Any,
) -> Any:
    """Ray's ``setup_wandb``, called inside a trainable or a ``TorchTrainer`` training loop: a W&B run for the
    trial, returned (``run.log({...})``), with ``config`` as its config.

    Its id is the trial's MLflow run id, its name the trial's name, its group the experiment's name (outside a
    Tune trial: the ``TorchTrainer`` run's name, as both); ``trial_id=``, ``trial_name=`` and ``group=``, and any
    other ``wandb.init`` argument in ``kwargs`` (``project=``, ``mode=``, ``dir=``, ...), take precedence.
    ``project`` defaults to ``WANDB_PROJECT_NAME``. ``rank_zero_only``: the other ranks of a DDP group get a
    disabled run (its calls do nothing). The run is finished when the training function returns, with exit
    code 1 if it raised. The API key: see the module's documentation.
    """
    import ddp_runtime
    from ddp_runtime.session import inside_training_function

    wandb = _import_wandb("setup_wandb")
    inside = inside_training_function()
    if rank_zero_only and inside and ddp_runtime.get_context().get_world_rank() != 0:
        return wandb.init(mode="disabled", reinit="create_new")
    key = None if _offline(kwargs.get("mode")) else _resolve_api_key(api_key, api_key_file, "setup_wandb")
    defaults = _trial_defaults() if inside else {}
    trial_id = kwargs.pop("trial_id", None) or defaults.get("id")
    trial_name = kwargs.pop("trial_name", None) or defaults.get("name")
    init = {
        "id": trial_id,
        "name": trial_name,
        "group": kwargs.pop("group", None) or os.environ.get(WANDB_GROUP_ENV_VAR) or defaults.get("group"),
        "project": _project(kwargs.pop("project", None)),
        "config": _clean(dict(config or {}), wandb, {}, {}),
        "resume": "allow",
        "reinit": "create_new",
        "allow_val_change": True,
    }
    if "settings" not in kwargs:
        # the worker's stdout is shared by the trials it runs: W&B does not capture it
        init["settings"] = wandb.Settings(console="off")
    init.update(_from_environment())
    init.update(kwargs)
    with _api_key_env(key):
        run = wandb.init(**init)
    if inside:
        _finish_at_function_end(run)
    return run


def _trial_defaults() -> dict[str, str | None]:
    """The run's id, name and group for the trial of the calling training function."""
    import ddp_runtime
    from sweepflow.tasks.training.function import current_trial_run

    trial = current_trial_run()
    if trial is not None:
        return {"id": trial.run_id, "name": trial.run_name, "group": trial.experiment_name}
    name = ddp_runtime.get_context().get_experiment_name()  # a TorchTrainer of its own: its run's name
    return {"id": None, "name": name, "group": name}


def _finish(run: Any) -> None:
    """Finish ``run``: exit code 1 when called while an error (not a stop) propagates."""
    from ddp_runtime.session import StopTraining

    error = sys.exc_info()[1]
    failed = error is not None and not isinstance(error, StopTraining)
    run.finish(exit_code=1 if failed else 0)


def _finish_at_function_end(run: Any) -> None:
    """Finish the run when the training function returns or raises: in a Tune trial through its end hooks; in a
    ``TorchTrainer`` of its own when the rank lets go of its context (the function returned)."""
    import ddp_runtime
    from sweepflow.tasks.training.function import at_function_end, current_trial_run

    if current_trial_run() is not None:
        at_function_end(lambda: _finish(run))
    else:
        weakref.finalize(ddp_runtime.get_context(), run.finish)


# ----------------------------------------------------------------------------------------- the callback


#: Result keys never logged (Ray's ``_exclude_results``).
_EXCLUDED = ("done", "should_checkpoint")


class WandbLoggerCallback(LoggerCallback):
    """Ray's ``WandbLoggerCallback``: one W&B run per trial, opened in the script's process when the trial starts,
    each result logged to it, finished when the trial ends (exit code 1 when it failed). See the module's
    documentation.

    ``project`` (else ``WANDB_PROJECT_NAME``; required), ``group`` (else ``WANDB_GROUP_NAME``, else the
    experiment's directory name), ``excludes``: result and config keys left out; ``log_config``: log the config
    with each result too (``config/<key>``; PBT changes it); ``upload_checkpoints`` (``save_checkpoints``, its old
    name): the trial's last checkpoint, when on this machine, is logged as an artifact ``checkpoint_<trial>`` when
    the trial ends; ``upload_timeout``: how long the experiment's end waits for the runs to finish uploading;
    ``image_kwargs`` / ``video_kwargs``: for ``wandb.Image`` / ``wandb.Video`` made from arrays; ``kwargs`` go to
    ``wandb.init`` and take precedence. Needs the ``wandb`` extra.
    """

    #: Results kept in the run's config rather than its history (Ray's ``AUTO_CONFIG_KEYS``).
    AUTO_CONFIG_KEYS = ["trial_id", "experiment_tag", "node_ip", "experiment_id", "hostname", "pid", "date"]

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        log_config: bool = False,
        upload_checkpoints: bool = False,
        save_checkpoints: bool = False,
        upload_timeout: int = DEFAULT_UPLOAD_TIMEOUT,
        video_kwargs: dict[str, Any] | None = None,
        image_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._wandb = _import_wandb("WandbLoggerCallback")
        if save_checkpoints:
            import warnings

            warnings.warn(
                "WandbLoggerCallback(save_checkpoints=...) is deprecated: use upload_checkpoints=...",
                DeprecationWarning,
                stacklevel=2,
            )
        if excludes is not None and (isinstance(excludes, str) or not isinstance(excludes, Sequence)):
            raise TypeError(f"WandbLoggerCallback(excludes=...) takes a list of keys, got {excludes!r}")
        self._key = None if _offline(kwargs.get("mode")) else _resolve_api_key(
            api_key, api_key_file, "WandbLoggerCallback"
        )
        self.project = project
        self.group = group
        self.excludes = list(excludes or [])
        self.log_config = bool(log_config)
        self.upload_checkpoints = bool(upload_checkpoints or save_checkpoints)
        self.upload_timeout = upload_timeout
        self.video_kwargs = dict(video_kwargs or {})
        self.image_kwargs = dict(image_kwargs or {})
        self.kwargs = kwargs
        self._runs: dict[str, Any] = {}
        self._finishing: dict[str, threading.Thread] = {}

    def __repr__(self) -> str:  # never the key
        return f"WandbLoggerCallback(project={self.project!r}, group={self.group!r})"

    def setup(self, *args: Any, **info: Any) -> None:
        """Before the first trial: the project and group from the environment when not given (a project is
        required), and the API key put in this process's environment (``WANDB_API_KEY``)."""
        self.project = _project(self.project)
        if not self.project:
            raise ValueError(
                "WandbLoggerCallback needs a W&B project: give WandbLoggerCallback(project=...) or set "
                f"{WANDB_PROJECT_ENV_VAR}"
            )
        self.group = self.group or os.environ.get(WANDB_GROUP_ENV_VAR) or None
        if self._key is not None:
            os.environ[WANDB_ENV_VAR] = self._key  # as Ray: this process's wandb runs read it

    def log_trial_start(self, trial: Trial) -> None:
        """Open the trial's W&B run (a resumed trial's goes on: same id)."""
        if trial.trial_id in self._runs:
            return
        if self.project is None:
            self.setup()
        config = {k: v for k, v in _clean(dict(trial.config), self._wandb, {}, {}).items() if k not in self.excludes}
        config.pop("callbacks", None)
        if trial.local_path:
            config["trial_log_path"] = trial.local_path
        init = {
            "id": trial.mlflow_run_id or trial.trial_id,
            "name": str(trial),
            "group": self.group or _experiment_dir_name(trial),
            "project": self.project,
            "config": config,
            "resume": "allow",
            "reinit": "create_new",
            "allow_val_change": True,
            # the script's console belongs to the experiment: W&B does not capture it
            "settings": self._wandb.Settings(console="off"),
        }
        if not os.environ.get("WANDB_DIR") and trial.local_path:
            os.makedirs(trial.local_path, exist_ok=True)
            init["dir"] = trial.local_path  # <trial>/wandb, as Ray's logging actor runs in the trial's directory
        init.update(_from_environment())
        init.update(self.kwargs)
        self._runs[trial.trial_id] = self._wandb.init(**init)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """Log the result's numbers (step ``training_iteration``); its config and ``AUTO_CONFIG_KEYS`` update the
        run's config."""
        if trial.trial_id not in self._runs:
            self.log_trial_start(trial)
        run = self._runs[trial.trial_id]
        metrics, config = self._split(_clean(result, self._wandb, self.image_kwargs, self.video_kwargs))
        if config:
            run.config.update(config, allow_val_change=True)
        step = result.get("training_iteration")
        run.log(metrics, step=step if isinstance(step, int) else None)

    def _split(self, result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The result's history entries and its config updates (Ray's rules: ``excludes`` and the bookkeeping
        keys left out, ``config/...`` logged only with ``log_config``, non-numbers left out)."""
        excluded = [*_EXCLUDED, *self.excludes, *([] if self.log_config else ["config"])]
        config = {k: v for k, v in dict(result.get("config") or {}).items() if k not in self.excludes}
        config.pop("callbacks", None)
        metrics: dict[str, Any] = {}
        for key, value in flatten_dict(result, delimiter="/").items():
            if any(key == item or key.startswith(item + "/") for item in excluded):
                continue
            if any(key == item or key.startswith(item + "/") for item in self.AUTO_CONFIG_KEYS):
                config[key] = value
            elif _allowed(value, self._wandb):
                metrics[key] = value
        return metrics, config

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """Finish the trial's run (exit code 1 when it failed), in the background: uploads do not hold up the
        experiment; its end waits for them (``upload_timeout``)."""
        run = self._runs.pop(trial.trial_id, None)
        if run is None:
            return
        checkpoint = _local_checkpoint(trial) if self.upload_checkpoints else None
        if checkpoint is not None:
            artifact = self._wandb.Artifact(name=f"checkpoint_{trial}", type="model")
            artifact.add_dir(checkpoint)
            run.log_artifact(artifact)
        thread = threading.Thread(
            target=run.finish, kwargs={"exit_code": 1 if failed else 0}, name=f"wandb-finish-{trial.trial_id}",
            daemon=True,
        )
        thread.start()
        self._finishing[trial.trial_id] = thread

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Finish the runs still open (trials stopped with the experiment) and wait, up to ``upload_timeout``
        seconds in all, for every run to be finished."""
        for trial in trials:
            if trial.trial_id in self._runs:
                self.log_trial_end(trial, failed=getattr(trial, "status", "") == "ERROR")
        for trial_id in list(self._runs):  # a trial this experiment never listed
            self._runs.pop(trial_id).finish()
        deadline = time.monotonic() + float(self.upload_timeout)
        for trial_id, thread in list(self._finishing.items()):
            thread.join(max(0.0, deadline - time.monotonic()))
            if not thread.is_alive():
                self._finishing.pop(trial_id)
        if self._finishing:
            log.warning(
                "W&B runs of trials %s had not finished uploading after upload_timeout=%ss; their files stay in "
                "their wandb directories: upload them with `wandb sync`",
                sorted(self._finishing),
                self.upload_timeout,
            )


def _experiment_dir_name(trial: Trial) -> str | None:
    """Ray's ``trial.experiment_dir_name``: the name of the directory holding the trial's."""
    if trial.local_path:
        return os.path.basename(os.path.dirname(os.path.normpath(trial.local_path))) or None
    return getattr(trial, "trainable_name", None)


def _local_checkpoint(trial: Trial) -> str | None:
    """The trial's last checkpoint's directory when it is on this machine (Ray uploads only those)."""
    ref = getattr(trial, "checkpoint", None)
    uri = getattr(ref, "uri", None)
    if not uri or ("://" in uri and not uri.startswith("file://")):
        return None
    path = uri.removeprefix("file://")
    return path if os.path.isdir(path) else None
