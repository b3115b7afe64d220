"""An experiment's pre-flight: every mistake that can be found before work is found here, in seconds.

``check_experiment(checks)`` is the one pre-flight of both faces: each lowers its settings to
``ExperimentChecks`` (``pipeline_checks``, ``script_checks``). ``check_pipeline(cfg, ...)`` runs it for the
pipeline at the entry point (the CLI, before any service, run or trial starts) and again as the flow's first
step (a deployment's flow run with bad parameters then fails before it creates anything); a Tune script's run
runs it before its services start. They raise ``PreflightError`` (``sweepflow.tasks.checks``): one sentence
naming the field, the value (credentials removed) and the fix. The CLI prints it and exits 2.

What is checked, in the order a user would fix it (docs/preflight.md): the pipeline's own names (the
experiment's, the registered model's, the champion metric); the state directory; MLflow (tracking URI scheme,
the server answering); the Prefect API; S3 storage and the data cache; the training function (imports, is
callable, takes 0 or 1 arguments, accepts every config the sweep will give it, reports the metrics the sweep
selects and schedules by); the Dask scheduler and whether the trials fit its workers (or the local cluster the
run will start); the data source; the project's other functions; a resume.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sweepflow.flows.config import PipelineConfig
from sweepflow.tasks.checks import (
    PreflightError,
    check_http_source,
    check_local_resources,
    check_prefect_api,
    check_reported_metrics,
    check_s3,
    check_tracking_server,
    check_tracking_uri_scheme,
    check_worker_imports,
    check_writable_dir,
    load_project_fn,
    load_train_fn,
    validate_train_configs,
)
from sweepflow.tasks.datasets.uris import protocol
from sweepflow.tasks.library_checks import check_dask_scheduler, check_registered_model_name
from sweepflow.tasks.training.function import project_importable

__all__ = [
    "ExperimentChecks",
    "PreflightError",
    "check_experiment",
    "check_pipeline",
    "check_script_workers",
    "pipeline_checks",
    "script_checks",
]

#: The test metrics ``evaluate_best`` reports (``sweepflow.tasks.training.evaluate``): the champion metric's choices.
_CHAMPION_METRIC = re.compile(r"test_(loss|accuracy|accuracy_class_\d+)")


def check_experiment(checks: ExperimentChecks) -> None:
    """The one pre-flight of an experiment, whichever face asked for it (each lowers its settings to
    ``ExperimentChecks``: ``pipeline_checks``, ``script_checks``), before any service, run or trial starts, in
    the order a user would fix them: where its state goes, MLflow (the tracking URI's scheme, its server
    answering in seconds, not the MLflow client's minutes of retries), the Prefect API it was given, its S3
    storage, then the training code (every config it will get, the metrics it must report). Raises
    ``PreflightError``. A face's own settings are checked around it (``check_pipeline``; a Tune call's
    arguments as it builds the request), and the cluster by the lifecycle's ``fit_trials``."""
    if checks.state_dir is not None:
        check_writable_dir(checks.state_dir[1], field=checks.state_dir[0])
    if checks.tracking is not None:
        field, uri = checks.tracking
        check_tracking_uri_scheme(uri, field=field)
        check_tracking_server(uri, field=field)
    if checks.prefect_api_url:
        check_prefect_api(checks.prefect_api_url)
    for field, uri, options in checks.s3:
        check_s3(uri, field=field, storage_options=options)
    if checks.code is not None:
        for field, configs in checks.configs:
            validate_train_configs(checks.code, list(configs), field=field)
        check_reported_metrics(checks.code, checks.metrics)


def check_pipeline(
    cfg: PipelineConfig,
    *,
    prefect_api_url: str | None = None,
    imports: bool = True,
    resume_from: str | None = None,
) -> None:
    """Check ``cfg`` (resolved: ``resolve_settings``) before any work: its own settings, the experiment's checks
    (``check_experiment``), the cluster, the data, the project's functions, a resume. ``prefect_api_url``: a
    Prefect API the run will use but did not start (checked to answer). ``imports=False`` skips the checks that
    import the training code, torch or MLflow (seconds in a cold process): the CLI's thin front process leaves
    them to the warm process that runs the flow, which checks everything before it starts the flow.
    ``resume_from``: the parent run of the interrupted pipeline to resume (it must be one, with the same
    settings)."""
    _check_settings(cfg)
    if imports:
        check_registered_model_name(cfg.mlflow.registered_model_name)
    with project_importable(cfg.project_dir) if imports else contextlib.nullcontext():
        check_experiment(pipeline_checks(cfg, prefect_api_url=prefect_api_url, imports=imports))
        _check_cluster(cfg)
        _check_data_source(cfg)
        if imports:
            _check_project_functions(cfg)
    # After the training function's own checks: a mistake in it is the first thing to fix.
    _check_contract(cfg)
    if imports and resume_from:
        _check_resume(cfg, resume_from)


@dataclass(frozen=True)
class ExperimentChecks:
    """What ``check_experiment`` checks, lowered from either face's settings: each value with the setting a
    refusal names."""

    state_dir: tuple[str, str] | None  # (setting, directory the run writes its state to); None: not resolved yet
    tracking: tuple[str, str] | None = None  # (setting, tracking URI); None: none given (the default store)
    prefect_api_url: str | None = None  # a Prefect API the run was given (and did not start)
    s3: tuple[tuple[str, str, Mapping[str, Any] | None], ...] = ()  # (setting, s3:// URI, storage options)
    code: Any = None  # the training function or trainable; None: not imported in this process
    configs: tuple[tuple[str, tuple[Mapping[str, Any], ...]], ...] = ()  # (setting, configs the code must accept)
    metrics: Mapping[str, str | None] = field(default_factory=dict)  # setting -> a metric the code must report


def pipeline_checks(cfg: PipelineConfig, *, prefect_api_url: str | None, imports: bool) -> ExperimentChecks:
    """The pipeline's settings as the experiment's checks; ``imports``: its training code loaded (with the
    project on the path), with the configs the sweep will give it."""
    uri = cfg.mlflow.tracking_uri
    return ExperimentChecks(
        state_dir=("state_dir", cfg.state_dir) if cfg.state_dir else None,
        tracking=("mlflow.tracking_uri", uri) if uri else None,
        prefect_api_url=prefect_api_url,
        s3=_s3_locations(cfg),
        **(_training_checks(cfg) if imports else {}),
    )


def script_checks(
    *,
    home: str,
    tracking_uri: str | None,
    tracking_field: str,
    prefect_api_url: str | None,
    storage_path: str | None,
    code: Any,
    metrics: Mapping[str, str | None],
) -> ExperimentChecks:
    """A Tune script's run (``tune.run``, ``Tuner.fit``) as the experiment's checks: its state directory
    (``home``: $SWEEPFLOW_HOME), MLflow, the Prefect API it was given, ``RunConfig.storage_path`` on S3, and the
    metrics the trainable (``code``: the script's own function or class) declares it reports, against
    ``metrics`` (argument -> metric). Not its ``validate`` on configs: its sampler is the experiment's own, and
    asking it here would change the trials. The cluster's room and its workers' imports are checked on the
    cluster (``check_script_workers``, then ``fit_trials``)."""
    return ExperimentChecks(
        state_dir=("SWEEPFLOW_HOME", home),
        tracking=(tracking_field, tracking_uri) if tracking_uri else None,
        prefect_api_url=prefect_api_url,
        s3=(("RunConfig.storage_path", storage_path, None),) if storage_path and protocol(storage_path) == "s3" else (),
        code=code,
        metrics=metrics,
    )


def _check_settings(cfg: PipelineConfig) -> None:
    """The pipeline's own settings that no service needs to refuse: the experiment's name, the built-in
    classifier on one's own data (before its reported metrics: the training function is the mistake), the
    champion metric."""
    if not cfg.mlflow.experiment_name.strip():
        raise PreflightError(
            "mlflow.experiment_name",
            cfg.mlflow.experiment_name,
            "is empty",
            "name the experiment, e.g. sweepflow",
        )
    if cfg.data.is_own_data and cfg.training.builtin:
        raise PreflightError(
            "data.source",
            cfg.data.source,
            "is your own data, which the built-in image classifier cannot read",
            "set training.train_fn, training.model_fn and evaluation.evaluate_fn to your project's functions "
            "(`sweepflow init DIR` writes an example)",
        )
    if cfg.evaluation.builtin and not _CHAMPION_METRIC.fullmatch(cfg.selection.champion_metric):
        raise PreflightError(
            "selection.champion_metric",
            cfg.selection.champion_metric,
            "the test-set evaluation reports test_loss, test_accuracy and test_accuracy_class_<i> only",
            "use test_accuracy (mode max) or test_loss (mode min)",
        )


def _check_contract(cfg: PipelineConfig) -> None:
    """The built-in classifier brings its model and evaluation; a train_fn of one's own names its own (or the
    built-in ones, when it writes the built-in classifier's checkpoints)."""
    from sweepflow.flows.config import BUILTIN_EVALUATE_FN, BUILTIN_MODEL_FN

    training, evaluation = cfg.training, cfg.evaluation
    if training.builtin:
        return
    named = {"training.model_fn": training.model_fn, "evaluation.evaluate_fn": evaluation.evaluate_fn}
    missing = [name for name, value in named.items() if value is None]
    if missing:
        raise PreflightError(
            "training.train_fn",
            training.train_fn,
            "is your own, so the pipeline cannot tell how to rebuild and test its model after the sweep",
            f"add {' and '.join(missing)} (model_fn(checkpoint) -> torch.nn.Module or (module, input_example); "
            "evaluate_fn(checkpoint, data_path) -> {name: value}; `sweepflow init DIR` writes an example), or, "
            "if it writes the built-in classifier's checkpoints (it calls train_image_classifier), "
            f"{BUILTIN_MODEL_FN} and {BUILTIN_EVALUATE_FN}",
        )
    if not evaluation.builtin and not cfg.selection.champion_metric.startswith("test_"):
        raise PreflightError(
            "selection.champion_metric",
            cfg.selection.champion_metric,
            "the evaluation's metrics are logged as test_<name> (what evaluate_fn returns, prefixed)",
            "name one of those, e.g. test_rmse",
        )


def _check_resume(cfg: PipelineConfig, resume_from: str) -> None:
    from mlflow.tracking import MlflowClient

    from sweepflow.tasks.sweep.resume import check_resumable, resume_key

    client = MlflowClient(cfg.mlflow.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment_name)  # None: the run cannot be in it
    check_resumable(
        client, experiment.experiment_id if experiment else None, resume_from, resume_key(cfg.model_dump())
    )


def _check_cluster(cfg: PipelineConfig) -> None:
    if cfg.dask.scheduler_address:
        _check_on_scheduler(cfg)
        return
    resources = cfg.resources
    cores = os.cpu_count() or 1
    n_workers = cfg.dask.n_workers or cores
    gpus = 0
    if resources.use_gpu:  # asked once: nvidia-smi takes a while (and ddp_runtime imports Dask: only then)
        from ddp_runtime.cluster import gpu_count

        gpus = gpu_count()
    check_local_resources(
        ranks_per_trial=resources.ranks_per_trial,
        n_workers=n_workers,
        gpus_per_rank=resources.gpus_per_rank,
        gpus=gpus,
        cpus_per_rank=resources.cpus_per_rank,
        cpus_per_worker=float(max(1, cores // n_workers)),
    )
    # The local cluster is not started yet: its slots counted, the scheduler's room checked as fit_trials does.
    slots = int(gpus / resources.gpus_per_rank) if resources.gpus_per_rank else n_workers
    fits = max(1, slots // resources.ranks_per_trial)
    _room_refused(cfg, lambda: cfg.scheduler.build().check_room(
        trials=_trials(cfg), at_once=min(cfg.sweep.max_concurrent_trials or fits, fits)
    ))


def _check_on_scheduler(cfg: PipelineConfig) -> None:
    """A running Dask cluster can hold the trials (the lifecycle's one placement check, ``fit_trials``, as the
    flow's ``place`` runs it again) and its workers import the project's functions."""
    import ddp_runtime as train
    from sweepflow.flows.pipeline_lowering import placement, trial_template
    from sweepflow.tasks.sweep.placement import fit_trials

    address = cfg.dask.scheduler_address
    client = check_dask_scheduler(address)
    try:
        try:
            _room_refused(cfg, lambda: fit_trials(
                client, trial_template(cfg, None), placement(cfg), cfg.scheduler.build(),
                trials=_trials(cfg), max_concurrent_trials=cfg.sweep.max_concurrent_trials,
            ))
        except train.InsufficientResourcesError:
            workers = client.scheduler_info(n_workers=-1).get("workers", {})
            offered = sorted({str(w.get("resources") or {}) for w in workers.values()})
            scaling = train.ScalingConfig(
                num_workers=cfg.resources.ranks_per_trial,
                use_gpu=cfg.resources.use_gpu,
                resources_per_worker=cfg.resources.resources_per_rank() or None,
            )
            raise PreflightError(
                "resources.ranks_per_trial",
                cfg.resources.ranks_per_trial,
                f"the Dask cluster at {address} cannot hold one trial: it has {len(workers)} worker(s) offering "
                f"{offered or 'nothing'}, each trial needs {scaling.num_workers} with "
                f"{scaling.worker_resources or 'a free thread'}",
                "lower resources.ranks_per_trial / gpus_per_rank / cpus_per_rank, or add workers that declare "
                "those resources (dask worker --resources GPU=1)",
            ) from None
        except ModuleNotFoundError as exc:  # raised on the scheduler, where the gang scheduler places ranks
            raise PreflightError(
                "dask.scheduler_address",
                address,
                f"the Dask scheduler there cannot import sweepflow's ddp_runtime ({exc}), which places each "
                "trial's ranks from inside the scheduler",
                "install sweepflow (the same version as on the workers and here) where `dask scheduler` runs",
            ) from None
        check_worker_imports(client, _worker_functions(cfg), cfg.project_dir)
    finally:
        client.close()


def _worker_functions(cfg: PipelineConfig) -> dict[str, str]:
    """The functions the Dask workers run (the trials, the evaluation and the model for the registry): the
    data preparation runs in the flow."""
    named = {
        "training.train_fn": cfg.training.train_fn,
        "training.model_fn": cfg.training.model_fn,
        "evaluation.evaluate_fn": cfg.evaluation.evaluate_fn,
    }
    return {key: value for key, value in named.items() if value}


def _trials(cfg: PipelineConfig) -> int:
    """How many trials the sweep runs (the sampler's total)."""
    from sweepflow.tasks.sweep.samplers import make_sampler
    from sweepflow.tasks.sweep.space import parse_space

    sweep = cfg.sweep
    return make_sampler(
        sweep.sampler, parse_space(sweep.search_space), num_samples=sweep.num_samples, seed=sweep.seed,
        mode=cfg.selection.mode,
    ).total


def _room_refused(cfg: PipelineConfig, check: Any) -> None:
    """``check()``, its scheduler's refusal (synchronous PBT needs every trial at once) as the setting to change."""
    try:
        check()
    except ValueError as exc:
        raise PreflightError(
            "scheduler.type",
            cfg.scheduler.type,
            str(exc),
            "here: lower sweep.num_samples to the trials that run at once, or set scheduler.synch=false",
        ) from None


def _s3_locations(cfg: PipelineConfig) -> tuple[tuple[str, str, Mapping[str, Any] | None], ...]:
    """The S3 locations the run writes to, each with its setting (those under ``storage`` are ``storage``'s)."""
    found: list[tuple[str, str, Mapping[str, Any] | None]] = []
    if cfg.storage and protocol(cfg.storage) == "s3":
        found.append(("storage", cfg.storage, None))
    cache = cfg.data.cache_dir
    if cache and protocol(cache) == "s3" and cache != f"{cfg.storage}/datasets":
        found.append(("data.cache_dir", cache, cfg.data.cache_storage_options))
    destination = cfg.mlflow.artifacts_destination
    if destination and protocol(destination) == "s3" and destination != f"{cfg.storage}/mlflow":
        found.append(("mlflow.artifacts_destination", destination, None))
    return tuple(found)


def _check_data_source(cfg: PipelineConfig) -> None:
    """A configured mirror must answer, unless the raw files are already in a local cache (then it is unused).
    A followed source (``data.follow_source``) is asked for its files' versions on every run: it must answer."""
    data = cfg.data
    if data.is_own_data:
        _check_own_data(cfg)
        return
    if not data.source or not data.spec.remote:
        return
    if not data.follow_source and data.cache_dir and protocol(data.cache_dir) in (None, "file"):
        raw = os.path.join(data.cache_dir, "raw", data.spec.name)
        if all(os.path.exists(os.path.join(raw, name)) for name in data.spec.filenames):
            return
    scheme = protocol(data.source)
    if scheme == "s3":
        check_s3(data.source, field="data.source", storage_options=data.storage_options)
    elif scheme in ("http", "https"):
        check_http_source(data.source, data.spec.filenames[0], field="data.source")
    elif scheme in (None, "file") and not os.path.isdir(data.source.removeprefix("file://")):
        raise PreflightError(
            "data.source",
            data.source,
            "is not a directory on this machine",
            "point it at the dataset's directory",
        )


def _check_own_data(cfg: PipelineConfig) -> None:
    """One's own source lists files (it is asked on every run anyway), and a table has the target column."""
    from sweepflow.tasks.datasets import DatasetError
    from sweepflow.tasks.datasets.own_data import own_source_versions, read_header

    data = cfg.data
    try:
        versions = own_source_versions(data)
        header = read_header(data, versions) if data.format in ("csv", "parquet") else None
    except DatasetError as exc:
        raise PreflightError(
            "data.source", data.source, str(exc), "check the path and its credentials"
        ) from None
    except (OSError, ValueError) as exc:
        raise PreflightError(
            "data.source",
            data.source,
            f"cannot be read ({type(exc).__name__}: {exc})",
            "check it and its credentials",
        ) from None
    if header is not None and data.target not in header:
        raise PreflightError(
            "data.target",
            data.target,
            f"is not a column of {data.label!r} (its header: {header[:20]})",
            "name its label column",
        )


def _check_project_functions(cfg: PipelineConfig) -> None:
    """The project's other functions import here and take what the pipeline gives them; a Searcher named by
    ``sweep.sampler`` imports and is made with its options."""
    if cfg.sweep.sampler not in ("random", "grid", "tpe"):
        from sweepflow.flows.pipeline_lowering import pipeline_sampler

        pipeline_sampler(cfg)
    if cfg.data.prepare_fn:
        load_project_fn(cfg.data.prepare_fn, field="data.prepare_fn", arguments=("raw_dir", "out_dir"))
    if cfg.training.model_fn:
        load_project_fn(cfg.training.model_fn, field="training.model_fn", arguments=("checkpoint",))
    if cfg.evaluation.evaluate_fn:
        load_project_fn(
            cfg.evaluation.evaluate_fn, field="evaluation.evaluate_fn", arguments=("checkpoint", "data_path")
        )


def _training_checks(cfg: PipelineConfig) -> dict[str, Any]:
    """The training function (imported here: the project is on the path), the configs the sweep gives it and
    the metrics it must report, as ``ExperimentChecks`` fields."""
    from sweepflow.tasks.sweep.samplers import make_sampler
    from sweepflow.tasks.sweep.space import parse_space

    if cfg.training.builtin:
        # Its checks without the training code: the flow process runs no torch op, and importing torch there cost
        # a deployment's new flow-run process ~3 s before its first task.
        from sweepflow.tasks.training.hparams import BUILTIN_CHECKS as fn
    else:
        fn = load_train_fn(cfg.training.train_fn)
    base = {**cfg.training.base_config, "model": cfg.training.model, "epochs": cfg.training.epochs}
    sampler = make_sampler(
        cfg.sweep.sampler,
        parse_space(cfg.sweep.search_space),
        num_samples=cfg.sweep.num_samples,
        seed=cfg.sweep.seed,
        mode=cfg.selection.mode,
    )
    # The seeded list samplers give exactly the trials the sweep will run; TPE's later trials depend on
    # results, so its first (random start-up) trial stands for them.
    count = 1 if cfg.sweep.sampler == "tpe" else sampler.total
    wanted: dict[str, Any] = {"selection.metric": cfg.selection.metric}
    if cfg.scheduler.metric is not None:
        wanted["scheduler.metric"] = cfg.scheduler.metric
    return {
        "code": fn,
        "configs": (
            ("training.base_config", (base,)),
            ("sweep.search_space", tuple({**base, **sampler.ask()[1]} for _ in range(count))),
        ),
        "metrics": wanted,
    }


# ------------------------------------------------------------------------------------------ a Tune script's run


def check_script_workers(client: Any, code: Any, import_dir: str | None) -> None:
    """The workers of ``client``'s cluster import the module of the script's own trainable (``code``) when it
    travels by reference, as cloudpickle sends a function or class its module can be imported from (any but the
    script's ``__main__``), with ``import_dir`` (the script's directory, as on the ranks) on their path: a
    package installed only where the script runs fails here, before any trial, not in every trial's ranks."""
    target = _by_reference(code)
    if target:
        check_worker_imports(
            client,
            {"the trainable": target},
            import_dir,
            fix="install the package it is in on the workers (pip install your project there), or define it in "
            "the script itself (it is then sent to the workers by value)",
        )


def _by_reference(code: Any) -> str | None:
    """``module:qualname`` of a function or class that is pickled by reference (its module imports it by that
    name), else None (defined in ``__main__`` or inside a function: it travels by value)."""
    module, qualname = getattr(code, "__module__", None), getattr(code, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname or module not in sys.modules:
        return None
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part, None)
    # The workers import its module and the top-level name it sits under (a class, for a nested one).
    return f"{module}:{qualname.split('.')[0]}" if found is code else None
