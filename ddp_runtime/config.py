"""Typed, validated configuration for ddp_runtime.

Names and fields mirror Ray Train's (``ScalingConfig``, ``RunConfig``, ...) so that user code ported from
Ray changes only its imports. Every config is a frozen dataclass validated in ``__post_init__``: a bad value
fails where it is written, with a message that says how to fix it, instead of deep inside a Dask worker.

Every field of Ray 2.60's signatures is taken: it works, or it is refused by name in one sentence that says
why and what to use instead (``tests/ddp_runtime/test_ray_train_fields.py`` walks them). A Ray field with no counterpart
here is not a field of ours: its Ray default, which asks for nothing, is accepted and any other value refused
(``_refuses``); a name neither has is a ``TypeError`` listing the fields.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

#: Ray fields with no counterpart here, per class: name -> (the values accepted: Ray's defaults, which ask for
#: nothing; why any other is refused and what to use instead).
_Refused = dict[str, tuple[tuple[Any, ...], str]]


def _is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    return any(value is d or (type(value) is type(d) and value == d) for d in defaults)


def _refuses(table: _Refused) -> Callable[[type], type]:
    """Class decorator (outside ``@dataclass``): the constructor takes the names of ``table`` as keywords,
    accepts their Ray defaults and refuses any other value with the table's sentence; a keyword that is in
    neither the fields nor the table is a ``TypeError`` that lists the fields."""

    def decorate(cls: type) -> type:
        init = cls.__init__
        known = [f.name for f in fields(cls)]

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for name in [k for k in kwargs if k not in known]:
                if name not in table:
                    raise TypeError(
                        f"{cls.__name__}() has no field {name!r} (nor has Ray 2.60's {cls.__name__}); "
                        f"its fields: {', '.join(known)}"
                    )
                defaults, why = table[name]
                value = kwargs.pop(name)
                if not _is_default(value, defaults):
                    raise ValueError(f"{cls.__name__}({name}={value!r}) is not supported: {why}")
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]
        return cls

    return decorate


def _check_amount(name: str, amount: Any) -> None:
    if (
        isinstance(amount, bool)
        or not isinstance(amount, int | float)
        or not math.isfinite(amount)
        or amount <= 0
    ):
        raise ValueError(
            f"resources_per_worker[{name!r}] must be a positive number, got {amount!r}; "
            f'use e.g. {{"{name}": 1}} (fractions such as 0.5 let two 1-rank groups share a worker)'
        )


_RESOURCE_FIX = (
    "Dask workers have no node labels: give the workers you mean a resource (`dask worker <scheduler> "
    '--resources "zone_a=1"`) and ask for it with resources_per_worker={"zone_a": 1}'
)
#: ``ScalingConfig(accelerator_type="A100")`` places a rank on a worker declaring ``accelerator_type:A100``.
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_PLACEMENT_FIX = {
    "SPREAD": "ranks are always packed onto as few hosts as possible (Ray's 'PACK'); to spread them, start one "
    'Dask worker per host with a resource (`dask worker <scheduler> --resources "slot=1"`) and ask for '
    'resources_per_worker={"slot": 1}: every rank then needs a worker of its own host',
    "STRICT_PACK": "ranks are packed onto as few hosts as possible (Ray's 'PACK', the default) but not forced "
    "onto one; to force one host, give only that host's workers a resource (`dask worker <scheduler> "
    '--resources "host_a=1"`) and ask for resources_per_worker={"host_a": 1}, or use placement_strategy="PACK"',
}
_PLACEMENT_FIX["STRICT_SPREAD"] = _PLACEMENT_FIX["SPREAD"]


@_refuses(
    {
        "label_selector": ((None,), _RESOURCE_FIX),
        "use_tpu": (
            (False,),
            "ddp_runtime trains PyTorch on CPUs and NVIDIA GPUs (torch.distributed gloo/NCCL), not on TPUs; use "
            "use_gpu=True, or leave it out for the CPU",
        ),
        "topology": (
            (None,),
            "it describes a TPU slice and TPUs are not supported; use use_gpu=True or the CPU",
        ),
        "elastic_resize_monitor_interval_s": (
            (60.0, 60),
            "it paces Ray's elastic resizing (num_workers=(min, max)) and a ddp_runtime group has a fixed "
            "number of ranks; remove it and pass num_workers=<int>",
        ),
    }
)
@dataclass(frozen=True)
class ScalingConfig:
    """How many ranks a training group has and what each rank reserves on its Dask worker.

    Each rank runs on its own Dask worker. ``resources_per_worker`` names Dask worker resources (workers
    declare them with ``--resources "GPU=1"``); ``use_gpu=True`` implies ``{"GPU": 1}`` per rank unless
    overridden and selects the NCCL backend.

    ``placement_strategy`` is Ray's name for where the ranks go: ``"PACK"`` (the default, and what the gang
    placement does: a group's ranks on as few hosts as possible). ``"SPREAD"``, ``"STRICT_PACK"`` and
    ``"STRICT_SPREAD"`` are refused with the resource that gets the same placement. ``accelerator_type``
    (``"A100"``, ...) places each rank on a worker that declares the resource ``accelerator_type:<type>``
    (``dask worker <scheduler> --resources "GPU=1,accelerator_type:A100=1"``), as Ray's node resource of that
    name does; it reserves a token 0.001 of it, so it never limits how many ranks a worker hosts.
    ``trainer_resources`` is taken and reserves nothing: there is no trainer actor here, the driver is the
    process that calls ``fit()`` (Ray 2.60's Train refuses the field; its Tune took it for that actor).
    Ray's ``num_workers=(min, max)`` (elastic), ``num_workers=0`` (local mode), ``use_tpu``/``topology`` and
    ``label_selector`` are refused with what to use instead.
    """

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    # Intra-op threads each rank's torch uses; None: its "CPU" resource. Set apart from the reservation when a
    # rank is meant to use more cores than one worker declares (Tune trials sharing one host's cores, as Ray does).
    threads_per_worker: int | None = None
    placement_strategy: Literal["PACK"] = "PACK"
    accelerator_type: str | None = None
    trainer_resources: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, tuple):
            raise ValueError(
                f"ScalingConfig(num_workers={self.num_workers!r}) asks for Ray's elastic training, which is not "
                "supported: a ddp_runtime group has a fixed number of ranks; pass num_workers=<int> "
                "(FailureConfig(max_failures=...) restarts a group that lost a worker)"
            )
        if self.num_workers == 0 and not isinstance(self.num_workers, bool):
            raise ValueError(
                "ScalingConfig.num_workers must be an int >= 1, got 0: Ray's local mode (the function in the "
                "driver's process) is not supported; use num_workers=1, one rank on a Dask worker"
            )
        if self.placement_strategy != "PACK":
            fix = _PLACEMENT_FIX.get(self.placement_strategy) or (
                f"Ray's strategies are {', '.join(map(repr, _PLACEMENT_STRATEGIES))} and ddp_runtime places "
                "ranks as 'PACK' does (as few hosts as possible); use placement_strategy=\"PACK\" or leave it out"
            )
            raise ValueError(
                f"ScalingConfig(placement_strategy={self.placement_strategy!r}) is not supported: {fix}"
            )
        if self.accelerator_type is not None and (
            not isinstance(self.accelerator_type, str) or not self.accelerator_type.strip()
        ):
            raise ValueError(
                f'ScalingConfig.accelerator_type must be an accelerator name such as "A100" (or None), '
                f"got {self.accelerator_type!r}"
            )
        if self.trainer_resources is not None:
            if not isinstance(self.trainer_resources, Mapping):
                raise ValueError(
                    f'ScalingConfig.trainer_resources must be a dict such as {{"CPU": 0}} (or None), '
                    f"got {self.trainer_resources!r}"
                )
            for name, amount in self.trainer_resources.items():
                if not isinstance(name, str) or not name:
                    raise ValueError(f"trainer_resources keys must be resource names, got {name!r}")
                if isinstance(amount, bool) or not isinstance(amount, int | float) or not amount >= 0:
                    raise ValueError(
                        f"trainer_resources[{name!r}] must be a number >= 0, got {amount!r} (it reserves "
                        "nothing here: the driver is the process that calls fit())"
                    )
        if self.threads_per_worker is not None and (
            isinstance(self.threads_per_worker, bool)
            or not isinstance(self.threads_per_worker, int)
            or self.threads_per_worker < 1
        ):
            raise ValueError(
                f"ScalingConfig.threads_per_worker must be an int >= 1 (or None: the CPU resource), "
                f"got {self.threads_per_worker!r}"
            )
        if (
            isinstance(self.num_workers, bool)
            or not isinstance(self.num_workers, int)
            or self.num_workers < 1
        ):
            raise ValueError(f"ScalingConfig.num_workers must be an int >= 1, got {self.num_workers!r}")
        resources = dict(self.resources_per_worker or {})
        for name, amount in resources.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"resources_per_worker keys must be resource names, got {name!r}")
            _check_amount(name, amount)
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        object.__setattr__(self, "resources_per_worker", resources)

    @property
    def worker_resources(self) -> dict[str, float]:
        """The Dask resources one rank reserves (never None): ``resources_per_worker``, and a token of
        ``accelerator_type:<type>`` with ``accelerator_type``."""
        resources = dict(self.resources_per_worker or {})
        if self.accelerator_type is not None:
            resources.setdefault(f"{ACCELERATOR_RESOURCE_PREFIX}{self.accelerator_type}", 0.001)
        return resources


@_refuses(
    {
        name: (
            (),
            "Ray 2.60 refuses this experimental option too; remove it (each rank's report(checkpoint=...) is "
            "written from its own worker straight to RunConfig.storage_path)",
        )
        for name in ("_checkpoint_keep_all_ranks", "_checkpoint_upload_from_workers")
    }
)
@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoint retention: keep the best ``num_to_keep`` by a reported metric (the latest is always kept,
    so a restart can resume from it). ``checkpoint_frequency`` (every n steps) and ``checkpoint_at_end`` drive a
    Tune class trainable's ``save_checkpoint``; a training function saves its own (``report(checkpoint=...)``)."""

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["min", "max"] = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (
            isinstance(self.num_to_keep, bool)
            or not isinstance(self.num_to_keep, int)
            or self.num_to_keep < 1
        ):
            raise ValueError(
                f"CheckpointConfig.num_to_keep must be None (keep all) or an int >= 1, got {self.num_to_keep!r}"
            )
        if (
            isinstance(self.checkpoint_frequency, bool)
            or not isinstance(self.checkpoint_frequency, int)
            or self.checkpoint_frequency < 0
        ):
            raise ValueError(
                f"CheckpointConfig.checkpoint_frequency must be an int >= 0 (0: none), got {self.checkpoint_frequency!r}"
            )
        if self.checkpoint_score_order not in ("min", "max"):
            raise ValueError(
                f"CheckpointConfig.checkpoint_score_order must be 'min' or 'max', got {self.checkpoint_score_order!r}"
            )


_NO_PREEMPTION = (
    "a preempted Dask worker is a lost worker here: its group is restarted from the latest checkpoint and that "
    "counts against FailureConfig(max_failures=...); set max_failures instead"
)


@_refuses(
    {
        # Ray's default -1 (retry without limit) is refused too: it promises retries that do not happen here.
        "controller_failure_limit": (
            (0,),
            "there is no controller actor to restart: the driver is the process that called fit(), and the run "
            "ends with it; remove it (max_failures restarts failed groups; to go on after the driver died, start "
            "again with TorchTrainer(resume_from_checkpoint=<the run's latest checkpoint>))",
        ),
        "max_preemption_failures": ((), _NO_PREEMPTION),
        "relax_collectives_on_preemption": ((False,), _NO_PREEMPTION),
        "preemption_grace_s": ((0.0, 0), _NO_PREEMPTION),
    }
)
@dataclass(frozen=True)
class FailureConfig:
    """How many times a failed group is restarted (from its latest checkpoint) before ``fit()`` fails; in a Tune
    experiment, ``fail_fast`` ends the experiment at its first failed trial (True: the others stop and none
    starts; "raise": the same, and ``Tuner.fit`` raises instead of returning the grid).

    Ray 2.60's preemption fields and ``controller_failure_limit`` are refused (but for the values that ask for
    nothing: ``relax_collectives_on_preemption=False``, ``preemption_grace_s=0``, ``controller_failure_limit=0``):
    a preempted worker is a failed one here, and there is no controller actor (the driver is your process)."""

    max_failures: int = 0
    fail_fast: bool | str = False

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_failures, bool)
            or not isinstance(self.max_failures, int)
            or self.max_failures < -1
        ):
            raise ValueError(
                f"FailureConfig.max_failures must be an int >= 0 (or -1 for unlimited), got {self.max_failures!r}"
            )
        if self.fail_fast not in (True, False, "raise"):
            raise ValueError(
                f'FailureConfig.fail_fast must be True, False or "raise", got {self.fail_fast!r}'
            )


def default_storage_path() -> str:
    """Where runs are kept when ``RunConfig.storage_path`` is None."""
    return os.path.join(os.path.expanduser("~"), "sweepflow_results")


#: ``RunConfig.stop``: stop once a reported metric reaches a bound, or when ``stop(trial_id, metrics)`` is True.
StopCriteria = Mapping[str, float] | Callable[[str, dict[str, Any]], bool]


@_refuses(
    {
        "storage_filesystem": (
            (None,),
            "storage goes through fsspec, not pyarrow: pass the whole URI as storage_path "
            '("s3://bucket/prefix") and the filesystem\'s options as storage_options '
            '(for s3fs: key, secret, client_kwargs={"endpoint_url": ...})',
        ),
        "worker_runtime_env": (
            (None, {}),
            "ranks run in their Dask workers' environment, which ddp_runtime does not change: install packages "
            "where the workers run and set environment variables on the workers (or at the top of the training "
            "function)",
        ),
        "logging_config": (
            (None,),
            "ddp_runtime logs through the standard logging module; set the level with "
            'logging.getLogger("ddp_runtime").setLevel("DEBUG")',
        ),
        "sync_config": (
            (None,),
            "nothing is synced afterwards (Ray 2.60 deprecates it too): every rank writes its checkpoints straight "
            'to storage_path; for cloud storage use an fsspec URI such as storage_path="s3://bucket/prefix" '
            "with storage_options",
        ),
        "local_dir": ((None,), "Ray 2.60 refuses it too; use storage_path (a directory or an fsspec URI)"),
        "log_to_file": (
            (False, None),
            "ranks' stdout and stderr go to their Dask worker's log; to keep them in a file, write to one under "
            "get_context().get_trial_dir() in the training function (contextlib.redirect_stdout)",
        ),
    }
)
@dataclass(frozen=True)
class RunConfig:
    """How a run is kept and ended (Ray: ``ray.train.RunConfig``, which is also ``ray.tune.RunConfig``; the same
    class serves ``TorchTrainer`` and ``sweepflow.tune.Tuner``).

    Checkpoints live in ``storage_path/name/``: a local directory or any fsspec URI (``s3://bucket/prefix``), by
    default ``default_storage_path()``; ``storage_options`` are passed to fsspec (for s3fs: ``key``, ``secret``,
    ``client_kwargs={"endpoint_url": ...}``). Every rank's worker must be able to reach it: on a multi-node
    cluster use shared storage. ``stop`` ends a run (a trial) at the report that meets it: ``{"training_iteration":
    10}`` (any reported metric reaching its bound) or a function ``stop(trial_id, metrics) -> bool``.
    ``progress_reporter`` and ``verbose`` say how a Tune experiment prints its trials table (``verbose=0``: not);
    ``callbacks`` are a Tune experiment's ``sweepflow.tune.Callback`` objects (a ``TorchTrainer`` alone has none).
    Ray's ``storage_filesystem``, ``worker_runtime_env``, ``logging_config``, ``sync_config``, ``local_dir`` and
    ``log_to_file`` are refused unless at their defaults, each with what to use instead.
    """

    name: str | None = None
    storage_path: str | None = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    storage_options: dict[str, Any] | None = None
    stop: StopCriteria | None = None
    progress_reporter: Any = None  # sweepflow.tune.CLIReporter
    verbose: int = 1
    callbacks: list[Any] | None = None  # sweepflow.tune.Callback objects (checked by the Tuner)

    def __post_init__(self) -> None:
        if self.checkpoint_config is None:
            object.__setattr__(self, "checkpoint_config", CheckpointConfig())
        if self.failure_config is None:
            object.__setattr__(self, "failure_config", FailureConfig())
        if self.stop is not None and not callable(self.stop) and not isinstance(self.stop, Mapping):
            raise TypeError(
                f'RunConfig.stop must be a dict like {{"training_iteration": 10}} or a function '
                f"stop(trial_id, metrics) -> bool, got {self.stop!r}"
            )
        if self.callbacks is not None and not isinstance(self.callbacks, list | tuple):
            raise TypeError(
                f"RunConfig.callbacks must be a list of callbacks, e.g. callbacks=[MyCallback()], got {self.callbacks!r}"
            )
        if self.name is not None and (not self.name or "/" in self.name):
            raise ValueError(f"RunConfig.name must be a non-empty name without '/', got {self.name!r}")


@_refuses({})  # every Ray 2.60 field is one of ours; an unknown name lists them
@dataclass(frozen=True)
class TorchConfig:
    """torch.distributed settings of a group (Ray: ``ray.train.torch.TorchConfig``).

    ``backend`` defaults to ``nccl`` with GPUs and ``gloo`` without. ``init_method`` is Ray's ``"env"`` (the
    default) or ``"tcp"``: both mean the same rendezvous here, a TCP store on rank 0's Dask worker (a port the
    OS picks), with ``MASTER_ADDR``/``MASTER_PORT`` (and ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) set in every
    rank's environment as ``env://`` expects. ``rendezvous_timeout_s`` bounds the
    wait for every rank to join the group's store (a peer slow to start counts here, not against the
    collective timeout); ``timeout_s`` bounds connecting the process group once all have joined, and every
    collective. ``teardown_timeout_s`` is how long the driver waits for the surviving ranks
    of a failed group to exit on their own before it restarts the group's Dask workers.

    ``hang_timeout_s`` (default None: no bound) is the longest the group may go without progress: from rank 0
    entering the training function (every rank has joined the process group by then; set-up before it is
    bounded by the two timeouts above) to its first report, and between two reports. Past it, the driver
    takes every rank's Python stack, fails the attempt with a ``RankHangError`` naming the rank that hung and
    the line it is at (the ranks waiting for it in a collective or ``report`` are told apart from it), and
    restarts the group's Dask workers as for a failed group (a hung thread cannot be stopped otherwise, so
    even a 1-rank group's worker is restarted). A hang counts as a failure for ``FailureConfig``. Set it above
    the slowest epoch, the first included (on a fresh worker it pays DDP's first-use imports, ~10 s on a
    small machine).
    """

    backend: Literal["nccl", "gloo"] | None = None
    init_method: Literal["env", "tcp"] = "env"
    timeout_s: float = 300.0
    rendezvous_timeout_s: float = 60.0
    teardown_timeout_s: float = 1.0
    hang_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.backend not in (None, "nccl", "gloo"):
            raise ValueError(
                f"TorchConfig.backend must be 'nccl' (GPUs), 'gloo' (CPUs) or None (chosen by "
                f"ScalingConfig.use_gpu), got {self.backend!r}"
            )
        if self.init_method not in ("env", "tcp"):
            raise ValueError(
                f"TorchConfig.init_method must be 'env' or 'tcp' (Ray's two; both are a TCP store on rank 0's "
                f"worker here), got {self.init_method!r}; leave it out for the default 'env'"
            )
        for name in ("timeout_s", "rendezvous_timeout_s", "teardown_timeout_s", "hang_timeout_s"):
            value = getattr(self, name)
            if name == "hang_timeout_s" and value is None:
                continue  # no bound on a group's time without progress
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"TorchConfig.{name} must be a positive number of seconds, got {value!r}")


def stop_met(stop: StopCriteria | None, trial_id: str, metrics: Mapping[str, Any]) -> bool:
    """Whether a report meets ``RunConfig.stop`` (a dict: any of its metrics reached its bound)."""
    if stop is None:
        return False
    if callable(stop):
        return bool(stop(trial_id, dict(metrics)))
    return any(key in metrics and metrics[key] >= bound for key, bound in stop.items())


@dataclass(frozen=True)
class DataConfig:
    """Which of a ``TorchTrainer``'s ``datasets`` are split between its ranks (Ray: ``ray.train.DataConfig``).

    ``datasets_to_split="all"`` (the default) splits every dataset: each rank's ``get_dataset_shard(name)``
    yields its own disjoint rows, the same number on every rank (the last ``rows % num_workers`` rows are
    dropped, so the ranks' batch counts match and DDP never waits on a rank with one batch more). A list names
    the datasets to split; the others are given whole to every rank (e.g. a validation set each rank scores).
    """

    datasets_to_split: Literal["all"] | list[str] | tuple[str, ...] = "all"

    def __post_init__(self) -> None:
        value = self.datasets_to_split
        if value == "all":
            return
        if (
            isinstance(value, str)
            or not isinstance(value, list | tuple)
            or not all(isinstance(v, str) for v in value)
        ):
            raise ValueError(
                f'DataConfig.datasets_to_split must be "all" or a list of dataset names, got {value!r}'
            )
        object.__setattr__(self, "datasets_to_split", list(value))
