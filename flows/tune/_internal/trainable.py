"""What a Tune trainable becomes: the function each rank of a trial runs, and the trial's DDP group shape.

Accepted trainables (as in Ray): a function ``fn(config)`` or classic ``fn(config, checkpoint_dir=None)`` (also a
``functools.partial``, closure or lambda from the user's script: Dask ships it to the workers by value), the
same wrapped by ``tune.with_parameters`` / ``tune.with_resources``, a ``DistributedTrainableCreator`` (a DDP
group per trial), a ``ddp_runtime.torch.TorchTrainer`` (its ``train_loop_per_worker`` on its
``scaling_config``, the trial's ``param_space["train_loop_config"]`` merged over its own), and any object that
defines ``_sweepflow_trial_template(config)`` (e.g. ``sweepflow.sgd.pytorch.PyTorchTrainable``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ddp_runtime.config import ScalingConfig
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tune import session
from sweepflow.tune._internal.resources import (
    PlacementGroupFactory,
    Shape,
    TrialShapes,
    dask_resources,
    example_config,
    shape_of,
)
from sweepflow.tune.class_trainable import ClassTrainableRun, is_class_trainable
from sweepflow.tune.shared import SharedValue


def _name_of(fn: Any) -> str:
    fn = getattr(fn, "func", fn)  # functools.partial
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


class ClassicFunction:
    """Calls a function trainable the way Ray Tune does: ``fn(config)``, or ``fn(config, checkpoint_dir=...)``
    with the directory of the checkpoint to resume from (None on a fresh start); a returned dict is reported
    as the trial's final result. ``parameters`` (``tune.with_parameters``) are passed as keyword arguments."""

    def __init__(self, fn: Callable[..., Any], parameters: Mapping[str, Any] | None = None) -> None:
        self.fn = fn
        self.parameters = dict(parameters or {})  # name -> SharedValue (resolved on the worker)

    def _accepts_checkpoint_dir(self) -> bool:
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False
        return "checkpoint_dir" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

    def __call__(self, config: dict[str, Any]) -> None:
        kwargs = {name: v.get() if isinstance(v, SharedValue) else v for name, v in self.parameters.items()}
        checkpoint = session.get_checkpoint()
        if self._accepts_checkpoint_dir():
            if checkpoint is not None:
                with checkpoint.as_directory() as directory:
                    result = self.fn(config, checkpoint_dir=directory, **kwargs)
            else:
                result = self.fn(config, checkpoint_dir=None, **kwargs)
        else:
            result = self.fn(config, **kwargs)
        if isinstance(result, dict) and result:
            session.report(result)


# ------------------------------------------------------------------------------------------- wrappers


class _WithParameters:
    def __init__(self, trainable: Any, parameters: dict[str, Any]) -> None:
        self.trainable = trainable
        self.parameters = parameters
        self.__name__ = _name_of(trainable)


def function(func: Callable[..., Any]) -> Callable[..., Any]:
    """Ray 0.7's ``tune.function(f)`` marked a function config value as not-to-be-sampled; config values here are
    never called, so it returns ``func`` unchanged."""
    return func


def with_parameters(trainable: Any, **kwargs: Any) -> Any:
    """Pass large objects (datasets, ...) to the trainable as keyword arguments, sent to the cluster once.
    Without keyword arguments it is the trainable itself (as in Ray)."""
    return _WithParameters(trainable, kwargs)


class _WithResources:
    def __init__(self, trainable: Any, resources: Any) -> None:
        self.trainable = trainable
        self.resources = resources
        self.__name__ = _name_of(trainable)


def with_resources(trainable: Any, resources: Any) -> Any:
    """Resources per trial, as Ray takes them (``_internal/resources.py`` maps them onto Dask): a dict
    (``{"cpu": 2, "gpu": 0.5}``; fractional GPUs share a GPU between trials; ``memory`` in bytes; other keys are
    Dask worker resources), a ``ScalingConfig`` (a DDP group of its workers, the trainable on every rank), a
    ``PlacementGroupFactory``, or a function of the trial's config returning one of these (evaluated per trial)."""
    if not _is_function_of_config(resources):
        shape_of("tune.with_resources", resources)  # a mistake refused here, not when the run starts
    return _WithResources(trainable, resources)


class DistributedTrainableCreator:
    """A trainable whose every trial is a DDP group of ``num_workers`` ranks (Ray's
    ``DistributedTrainableCreator``); the function is ``fn(config, checkpoint_dir=None, ...)`` and uses
    ``is_distributed_trainable()`` and ``distributed_checkpoint_dir(step)``."""

    def __init__(
        self,
        func: Callable[..., Any],
        num_workers: int = 1,
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float = 0,
        use_gpu: bool = False,
        backend: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if not callable(func):
            raise TypeError(f"DistributedTrainableCreator(func, ...): func must be a function, got {func!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"DistributedTrainableCreator: num_workers must be an integer >= 1, got {num_workers!r}")
        gpus = float(num_gpus_per_worker or (1 if use_gpu else 0))
        if num_workers > 1 and 0 < gpus < 1:
            raise ValueError(
                f"DistributedTrainableCreator: num_gpus_per_worker={num_gpus_per_worker} with num_workers={num_workers}: "
                "each DDP rank needs a whole GPU (NCCL refuses two ranks on one GPU); use 1, or num_workers=1"
            )
        self.func = func
        self.num_workers = num_workers
        self.resources = dask_resources("DistributedTrainableCreator", {"cpu": num_cpus_per_worker, "gpu": gpus})
        self.backend = backend
        self.timeout_s = timeout_s
        self.__name__ = _name_of(func)


# ------------------------------------------------------------------------------------------- planning


def trainable_name(trainable: Any) -> str:
    """The trainable's name (Ray names trials and experiments after it)."""
    return _name_of(trainable)


def plan_trial(
    trainable: Any,
    resources_per_trial: Any,
    config_example: dict[str, Any],
    *,
    checkpoint_frequency: int = 0,
    checkpoint_at_end: bool = False,
    refuse_at_end_for_functions: bool = False,
) -> TrialTemplate:
    """What each trial of the trainable runs (the function on every rank, the group's shape); the sweep's
    ranking and retention are filled in by the runner. ``checkpoint_frequency``/``checkpoint_at_end`` drive a
    class trainable's checkpoints. Raises with the fix when it cannot be run."""
    trainable, parameters, resources, where = _unwrapped(trainable, resources_per_trial)
    if is_class_trainable(trainable):
        if resources is None:
            requested = trainable.default_resource_request(dict(config_example))
            resources, where = requested, f"{trainable.__name__}.default_resource_request"
        run = ClassTrainableRun(
            trainable,
            parameters=parameters,
            checkpoint_frequency=checkpoint_frequency,
            checkpoint_at_end=checkpoint_at_end,
        )
        return _shaped(run, resources, where, config_example, one_rank=_name_of(trainable))
    _check_function_checkpoints(checkpoint_frequency, checkpoint_at_end, refuse_at_end_for_functions)

    if isinstance(trainable, DistributedTrainableCreator):
        if resources is not None:
            raise ValueError(
                "tune.run(DistributedTrainableCreator(...), resources_per_trial=...): the creator sets the resources "
                "(num_workers, num_cpus_per_worker, num_gpus_per_worker); pass resources_per_trial=None"
            )
        fn = ClassicFunction(trainable.func, parameters)
        return _template(fn, Shape(trainable.num_workers, trainable.resources))
    planner = getattr(trainable, "_sweepflow_trial_template", None)
    torch_trainer = _as_torch_trainer(trainable)
    if (planner is not None or torch_trainer is not None) and resources is not None:
        raise ValueError(
            f"resources for {_name_of(trainable)} are set by the trainable itself (its scaling_config / num_replicas "
            "/ use_gpu): clear resources_per_trial (or tune.with_resources)"
        )
    if planner is not None:
        plan = planner(config_example)
        per_rank = dask_resources(_name_of(trainable), plan.get("resources_per_rank") or {})
        return _template(plan["function"], Shape(int(plan.get("num_ranks", 1)), per_rank))
    if torch_trainer is not None:
        return _torch_trainer_template(torch_trainer)
    if inspect.isclass(trainable):
        raise TypeError(
            f"tune.run({trainable.__name__}): a class trainable must subclass sweepflow.tune.Trainable (setup, step, "
            "save_checkpoint, load_checkpoint); or write the training as a function fn(config) calling tune.report"
        )
    if not callable(trainable):
        raise TypeError(f"the trainable must be a function, got {type(trainable).__name__}")
    return _shaped(ClassicFunction(trainable, parameters), resources, where, config_example)


def _unwrapped(trainable: Any, resources_per_trial: Any) -> tuple[Any, dict[str, Any], Any, str]:
    """The trainable inside its ``tune.with_parameters`` / ``tune.with_resources`` wrappers, and what they
    give: (trainable, parameters, the resources asked (None: not given), who asked them)."""
    parameters: dict[str, Any] = {}
    resources, where = resources_per_trial or None, "resources_per_trial"
    while isinstance(trainable, _WithParameters | _WithResources):
        if isinstance(trainable, _WithParameters):
            parameters.update(trainable.parameters)
        else:
            resources, where = trainable.resources, "tune.with_resources"
        trainable = trainable.trainable
    return trainable, parameters, resources, where


def _is_function_of_config(resources: Any) -> bool:
    return callable(resources) and not isinstance(resources, ScalingConfig | PlacementGroupFactory)


def _shaped(
    function: Callable[..., Any], resources: Any, where: str, config_example: dict[str, Any], *, one_rank: str = ""
) -> TrialTemplate:
    """The template of ``function`` on the group ``resources`` asks for; a function of the config is evaluated
    on a config drawn from the space (its mistakes refused now) and again for each trial (``per_trial``).
    ``one_rank``: the class trainable's name, which runs as one rank (a group is refused)."""

    def check(shape: Shape) -> None:
        if one_rank and shape.num_ranks > 1:
            raise ValueError(
                f"{where}: {one_rank} is a class trainable, which runs as one rank; ask for one bundle (a dict), or "
                "write the training as a function fn(config), which runs on every rank of a group"
            )

    if resources is None:
        return _template(function, Shape(1, {}))
    if not _is_function_of_config(resources):
        shape = shape_of(where, resources)
        check(shape)
        return _template(function, shape)
    example = example_config(config_example)
    shape = Shape(1, {}) if example is None else shape_of(where, resources, config=example)
    check(shape)
    return replace(_template(function, shape), per_trial=TrialShapes(where, resources, check))


def _check_function_checkpoints(
    checkpoint_frequency: int, checkpoint_at_end: bool, refuse_at_end_for_functions: bool
) -> None:
    """A function trainable saves its own checkpoints: what drives a class trainable's is refused for it."""
    if checkpoint_frequency:
        raise ValueError(
            f"checkpoint frequency {checkpoint_frequency!r} drives a class trainable's save_checkpoint; a function "
            "trainable saves its own checkpoints with tune.checkpoint_dir(...) or tune.report(..., checkpoint=...): "
            "remove checkpoint_freq / CheckpointConfig(checkpoint_frequency=...)"
        )
    if checkpoint_at_end and refuse_at_end_for_functions:
        raise ValueError(
            "CheckpointConfig(checkpoint_at_end=True) drives a class trainable's save_checkpoint; a function "
            "trainable saves its own with tune.report(..., checkpoint=...): report one with its last result and "
            "drop checkpoint_at_end"
        )


def _torch_trainer_template(torch_trainer: Any) -> TrialTemplate:
    """A ``TorchTrainer``'s trial: its ``train_loop_per_worker`` on its ``scaling_config``, with its data."""
    scaling = torch_trainer.scaling_config
    template = _template(
        _ConfigUnder(torch_trainer.train_loop_per_worker, "train_loop_config"),
        Shape(scaling.num_workers, {k: float(v) for k, v in scaling.worker_resources.items()}),
        base_config=dict(torch_trainer.train_loop_config or {}),
    )
    # Its datasets go to every trial's group (each rank reads its shard), not only its loop.
    return replace(
        template, datasets=dict(torch_trainer.datasets), dataset_config=torch_trainer.dataset_config
    )


def _template(function: Callable[..., Any], shape: Shape, base_config: dict[str, Any] | None = None) -> TrialTemplate:
    """``shape``: the group, its per-rank resources in Dask's names ({"CPU": 2, "GPU": 0.5}), zero entries left
    out (the runner drops CPU on a cluster whose workers do not declare it)."""
    return TrialTemplate(
        train_fn=function,
        train_loop_config=dict(base_config or {}),
        seed=None,  # Ray seeds nothing on its own: the trial's config is the user's
        **shape.fields(),
    )


def shared_parameters(template: TrialTemplate) -> dict[str, Any]:
    """The ``tune.with_parameters`` objects of the template's function (sent to the cluster once)."""
    fn = template.train_fn
    if not isinstance(fn, ClassicFunction | ClassTrainableRun):
        return {}
    return {name: v for name, v in fn.parameters.items() if not isinstance(v, SharedValue)}


def sharing(template: TrialTemplate, shared: Mapping[str, SharedValue]) -> TrialTemplate:
    """The template with its ``with_parameters`` objects replaced by their copies on the cluster."""
    fn = template.train_fn
    if isinstance(fn, ClassicFunction):
        return replace(template, train_fn=ClassicFunction(fn.fn, shared))
    if isinstance(fn, ClassTrainableRun):
        return replace(template, train_fn=fn.sharing(shared))
    return template


class _ConfigUnder:
    """A TorchTrainer trial: its ``train_loop_per_worker`` gets ``param_space[key]`` merged over its own config."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any], key: str) -> None:
        self.fn, self.key = fn, key

    def __call__(self, config: dict[str, Any]) -> Any:
        merged = {k: v for k, v in config.items() if k != self.key}
        merged.update(config.get(self.key) or {})
        return self.fn(merged)


def _as_torch_trainer(trainable: Any) -> Any:
    from ddp_runtime.torch import TorchTrainer

    return trainable if isinstance(trainable, TorchTrainer) else None


def users_code(template: TrialTemplate) -> Any:
    """The script's own function or class a trial of ``template`` runs, under sweepflow's wrappers (a function
    trainable's ``ClassicFunction``, a TorchTrainer's loop under its config key, a class trainable's run)."""
    fn = template.train_fn
    if isinstance(fn, ClassTrainableRun):
        return fn.cls
    if isinstance(fn, ClassicFunction | _ConfigUnder):
        return fn.fn
    return fn
