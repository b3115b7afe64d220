"""The pipeline's settings lowered to the one ``Experiment`` both faces run (``experiment_for``; the Tune face's
lowering is ``sweepflow.tune._internal.runner.lowered``), and the parts of it the pre-flight checks before any data is
prepared: what a trial runs (``trial_template``) and where (``placement``). Pure, but for the flow run's name the
recording takes."""

from __future__ import annotations

import os

from sweepflow.flows.config import PipelineConfig
from sweepflow.tasks import WORKER_PRELOAD
from sweepflow.tasks.checks import PreflightError, load_train_fn
from sweepflow.tasks.datasets import PreparedDataset
from sweepflow.tasks.sweep.experiment import Experiment, Finalize, Placement, Recording, Resume
from sweepflow.tasks.sweep.resume import resume_key
from sweepflow.tasks.sweep.samplers import SAMPLERS, Sampler, make_sampler
from sweepflow.tasks.sweep.searcher import Searcher, searcher_ranking, searcher_sampler
from sweepflow.tasks.sweep.space import Constant, parse_space
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.tracking.params import flatten, public_params


def experiment_for(cfg: PipelineConfig, prepared: PreparedDataset, *, resume_from: str | None = None) -> Experiment:
    """The pipeline's settings as the one ``Experiment`` both faces run: its sweep over ``prepared``, recorded as
    a pipeline run, its best trial evaluated and registered (``resume_from``: the interrupted parent run)."""
    space = parse_space(cfg.sweep.search_space)
    sampler, search_label = pipeline_sampler(cfg)
    template = trial_template(cfg, prepared.path, varying_names=tuple(space.varying_names))
    recording = _recording(cfg, prepared)
    return Experiment(
        name=cfg.mlflow.experiment_name,
        sampler=sampler,
        scheduler=cfg.scheduler.build(),
        template=template,
        search_space=cfg.sweep.search_space,
        search_label=search_label,
        placement=placement(cfg),
        recording=recording,
        root_dir=cfg.state_dir,
        max_concurrent_trials=cfg.sweep.max_concurrent_trials,
        time_budget_s=cfg.sweep.time_budget_s,
        resume=Resume(resume_from) if resume_from else None,
        finalize=Finalize(
            data_path=prepared.path,
            data_checksum=prepared.checksum,
            registered_model_name=cfg.mlflow.registered_model_name,
            champion_metric=cfg.selection.champion_metric,
            champion_mode=cfg.selection.champion_mode,
            evaluate_fn=None if cfg.evaluation.builtin else cfg.evaluation.evaluate_fn,
            model_fn=None if cfg.training.builtin_model else cfg.training.model_fn,
            project_dir=cfg.project_dir,
        ),
    )


def pipeline_sampler(cfg: PipelineConfig) -> tuple[Sampler, str]:
    """The sweep's sampler ``sweep.sampler`` names, and how the sweep's log names it: a built-in one, or a
    ``Searcher`` subclass imported by its path and made with ``sweep.sampler_options`` (the pre-flight builds it
    once too, so a mistake in it is found before any work).

    Raises:
        PreflightError: the class does not import, is not a ``Searcher``, refuses its options, or its metric/mode
            differ from ``selection``'s.
    """
    space = parse_space(cfg.sweep.search_space)
    kind = cfg.sweep.sampler
    if kind in SAMPLERS:
        sampler = make_sampler(
            kind, space, num_samples=cfg.sweep.num_samples, seed=cfg.sweep.seed, mode=cfg.selection.mode
        )
        return sampler, f"{kind} sampler"
    found = load_train_fn(kind, field="sweep.sampler", arity=False)
    if not (isinstance(found, type) and issubclass(found, Searcher)):
        raise PreflightError(
            "sweep.sampler", kind, f"is {type(found).__name__} {found!r}, not a Searcher class",
            "name a subclass of sweepflow.tune.search.Searcher (its suggest and on_trial_complete), or use "
            "'random', 'grid' or 'tpe'",
        )
    try:
        searcher = found(**cfg.sweep.sampler_options)
    except TypeError as exc:
        raise PreflightError(
            "sweep.sampler_options", cfg.sweep.sampler_options, f"{kind} refused them: {exc}",
            f"give the keyword arguments {found.__name__}(...) takes",
        ) from None
    # The search space as the searcher's set_search_properties gets it: domains, and the constants as values.
    config = {name: domain.value if isinstance(domain, Constant) else domain for name, domain in space.params}
    try:
        metric, mode = searcher_ranking(searcher, cfg.selection.metric, cfg.selection.mode)
        sampler = searcher_sampler(searcher, config, configs=cfg.sweep.num_samples, metric=metric, mode=mode)
    except ValueError as exc:
        raise PreflightError("sweep.sampler", kind, str(exc), "make the searcher and selection agree") from None
    return sampler, f"{kind} (searcher)"


def trial_template(cfg: PipelineConfig, data_path: str | None, *, varying_names: tuple[str, ...] = ()) -> TrialTemplate:
    """What each of the sweep's trials runs: the training function on its DDP group, on the prepared data at
    ``data_path`` (None: before the data is prepared, the pre-flight's placement check)."""
    return TrialTemplate(
        train_fn=cfg.training.train_fn,
        train_loop_config={
            **cfg.training.base_config,
            "model": cfg.training.model,
            "epochs": cfg.training.epochs,
            **({"data_path": data_path} if data_path is not None else {}),
        },
        num_ranks=cfg.resources.ranks_per_trial,
        resources_per_rank=cfg.resources.resources_per_rank(),
        use_gpu=cfg.resources.use_gpu,
        selection_metric=cfg.selection.metric,
        selection_mode=cfg.selection.mode,
        max_reports=cfg.scheduler.max_reports(cfg.training.epochs),
        seed=cfg.sweep.seed,
        varying_names=varying_names,
        max_failures=cfg.training.max_failures,
        hang_timeout_s=cfg.training.hang_timeout_s,
        system_metrics_interval_s=cfg.training.system_metrics_interval_s,
        import_dir=cfg.project_dir,
    )


def placement(cfg: PipelineConfig) -> Placement:
    """Where the pipeline's trials run, and the settings a trial that fits nowhere is refused by."""
    return Placement(
        scheduler_address=cfg.dask.scheduler_address,
        use_gpu=cfg.resources.use_gpu,
        n_workers=cfg.dask.n_workers,
        preload=(WORKER_PRELOAD,),
        asked_by="resources.ranks_per_trial / gpus_per_rank / cpus_per_rank",
    )


def _recording(cfg: PipelineConfig, prepared: PreparedDataset) -> Recording:
    """How the pipeline run is recorded in MLflow: its parent run (named after the Prefect flow run), its
    settings, and the data a resume must find again."""
    from prefect.runtime import (
        flow_run,  # the flow run it records (imported when the flow lowers, not before)
    )

    name = flow_run.get_name() or "local"
    # Every setting (credentials removed) as one artifact; as params only the few a user filters runs by, so
    # the runs table and compare view are not buried under ~50 settings.
    settings = public_params(flatten("", cfg.model_dump(exclude={"state_dir"})))
    default_store = cfg.mlflow.tracking_uri.startswith("sqlite:")
    return Recording(
        tracking_uri=cfg.mlflow.tracking_uri,
        experiment_name=cfg.mlflow.experiment_name,
        run_name=f"pipeline-{name}",
        kind="pipeline",
        params={
            k: v
            for k, v in settings.items()
            if k in PARENT_PARAMS or (k in PROJECT_PARAMS and v is not None)
        },
        settings=settings,
        settings_file="pipeline_config.json",
        resume_key=resume_key(cfg.model_dump()),
        title=f"Sweep {name}: {cfg.data.label}",
        # the data it trains on: a resume must find the same data
        tags={"sweepflow.data_checksum": prepared.checksum, "sweepflow.dataset": prepared.name},
        same_on_resume={"sweepflow.data_checksum": "the data (its checksum)"},
        artifact_root=os.path.join(cfg.state_dir, "mlartifacts") if default_store else None,
        artifacts_destination=cfg.mlflow.artifacts_destination,
        resume_hint="if interrupted: sweepflow run --resume {parent}, same settings",
    )


#: The parent run's params: what a user filters and compares pipeline runs by (the rest: config/ artifact).
PARENT_PARAMS = frozenset(
    {
        "data.name",
        "data.source",
        "sweep.sampler",
        "sweep.num_samples",
        "sweep.max_concurrent_trials",
        "sweep.seed",
        "scheduler.type",
        "training.epochs",
        "training.train_fn",
        "resources.ranks_per_trial",
        "resources.gpus_per_rank",
        "training.model",
        "selection.metric",
        "selection.mode",
        "mlflow.registered_model_name",
    }
)


#: A project's functions and data preparation: parent params too, when set (a built-in run has none of them).
PROJECT_PARAMS = frozenset({"data.prepare_fn", "data.format", "data.target", "training.model_fn", "evaluation.evaluate_fn"})
