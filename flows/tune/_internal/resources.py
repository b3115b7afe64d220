"""What a trial asks for (``tune.with_resources``, ``resources_per_trial``, a class's ``default_resource_request``),
as the shape of its DDP group on Dask: how many ranks, and the Dask worker resources each rank reserves.

The forms Ray takes, mapped onto how a ``Tuner(TorchTrainer)`` trial reserves its group (one rank per Dask
worker, every rank reserving the same resources; the trial's driver is a thread of the flow's process and
reserves nothing):

- a dict in Ray's keys: ``cpu``/``CPU`` -> Dask ``CPU``, ``gpu``/``GPU`` -> ``GPU``, ``memory`` (bytes) -> Dask
  ``memory`` (reserved when the workers declare it, else checked against their memory limit), any other key
  (or those under ``custom_resources``) a Dask worker resource of that name; one rank;
- a ``ddp_runtime.ScalingConfig``: ``num_workers`` ranks of its ``worker_resources``, the trainable on every rank
  (as a ``TorchTrainer``'s ``train_loop_per_worker``); ``trainer_resources`` reserves nothing;
- a ``PlacementGroupFactory(bundles)``: one bundle is one rank of it; with further bundles, the first is the
  trainable's driver (``trainer_resources``: nothing reserved) and the others its ranks, which must be equal;
- a function of the trial's config returning any of these (``TrialShapes``: evaluated for each trial before it
  is scheduled, and once in the pre-flight on a config drawn from the search space).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ddp_runtime.config import ScalingConfig

_REFUSED_KEYS = {
    "object_store_memory": "sweepflow reserves no object store (objects ddp_runtime.put places live in Dask "
    "workers' memory): remove it, or ask for \"memory\"",
}


class PlacementGroupFactory:
    """Ray's resource request of a trial as bundles: ``[{"CPU": 1, "GPU": 0.5}]`` is one rank of those resources;
    ``[{"CPU": 1}, {"CPU": 2}, {"CPU": 2}]`` is a driver (reserving nothing, as ``ScalingConfig.trainer_resources``)
    and a DDP group of two ranks of ``{"CPU": 2}``, the trainable on each rank. ``strategy``: ``"PACK"`` (what the
    gang placement does); Ray's others are refused with the resource that gets the same placement."""

    def __init__(self, bundles: list[Mapping[str, float]], strategy: str = "PACK", *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            raise TypeError(
                "PlacementGroupFactory(bundles, strategy): the further arguments go to Ray's placement_group(), which "
                "is not here; remove them"
            )
        if not isinstance(bundles, list | tuple) or not bundles or not all(isinstance(b, Mapping) for b in bundles):
            raise ValueError(
                f'PlacementGroupFactory needs a non-empty list of bundles like [{{"CPU": 1}}], got {bundles!r}'
            )
        ScalingConfig(placement_strategy=strategy)  # Ray's other strategies refused there, with the fix
        self._bundles = [{k: float(v) for k, v in b.items() if v != 0} for b in bundles]
        self.head_bundle_is_empty = not self._bundles[0]
        if self.head_bundle_is_empty:
            self._bundles.pop(0)
            if not self._bundles:
                raise ValueError("PlacementGroupFactory: every bundle is empty; ask for at least one resource")
        self.strategy = strategy

    @property
    def bundles(self) -> list[dict[str, float]]:
        """The bundles without zero entries (the empty head left out, as Ray does)."""
        return [dict(b) for b in self._bundles]

    @property
    def head_cpus(self) -> float:
        """The CPUs of the trainable's own bundle."""
        return 0.0 if self.head_bundle_is_empty else self._bundles[0].get("CPU", 0.0)

    @property
    def required_resources(self) -> dict[str, float]:
        """Every bundle's resources added up."""
        total: dict[str, float] = {}
        for bundle in self._bundles:
            for name, value in bundle.items():
                total[name] = total.get(name, 0.0) + value
        return total

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, PlacementGroupFactory)
            and self._bundles == other._bundles
            and self.strategy == other.strategy
            and self.head_bundle_is_empty == other.head_bundle_is_empty
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = "{}, " if self.head_bundle_is_empty else ""
        return f"PlacementGroupFactory([{head}{', '.join(map(repr, self._bundles))}], strategy={self.strategy!r})"


@dataclass(frozen=True)
class Shape:
    """A trial's DDP group: ``num_ranks`` ranks, each reserving ``per_rank`` (Dask worker resource names)."""

    num_ranks: int
    per_rank: dict[str, float]

    @property
    def use_gpu(self) -> bool:
        return self.per_rank.get("GPU", 0.0) > 0

    def fields(self) -> dict[str, Any]:
        """The ``TrialTemplate`` fields this shape sets."""
        return {
            "num_ranks": self.num_ranks,
            "resources_per_rank": {k: v for k, v in self.per_rank.items() if v},
            "use_gpu": self.use_gpu,
        }


def dask_resources(where: str, resources: Mapping[str, Any]) -> dict[str, float]:
    """A dict in Ray's keys as Dask worker resources (``{"cpu": 2, "gpu": 0.5}`` -> ``{"CPU": 2.0, "GPU": 0.5}``)."""
    if not isinstance(resources, Mapping):
        raise TypeError(f'{where}: resources must be a dict like {{"cpu": 1, "gpu": 0}}, got {resources!r}')
    flat = {k: v for k, v in resources.items() if k != "custom_resources"}
    custom = resources.get("custom_resources") or {}
    if not isinstance(custom, Mapping):
        raise TypeError(f'{where}: custom_resources must be a dict like {{"TPU": 1}}, got {custom!r}')
    out: dict[str, float] = {}
    for key, value in {**flat, **custom}.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{where}: resource names are strings, got {key!r}")
        if key in _REFUSED_KEYS:
            raise ValueError(f"{where}: {key!r}: {_REFUSED_KEYS[key]}")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{where}: {key} must be a number >= 0, got {value!r}")
        name = key.upper() if key.lower() in ("cpu", "gpu") else key
        out[name] = out.get(name, 0.0) + float(value)
    return out


def shape_of(where: str, resources: Any, *, config: Mapping[str, Any] | None = None) -> Shape:
    """The group ``resources`` asks for (a dict, a ``ScalingConfig``, a ``PlacementGroupFactory``, or a function of
    ``config`` returning one of them); raises with the fix when it is none of them."""
    if callable(resources) and not isinstance(resources, ScalingConfig | PlacementGroupFactory):
        if config is None:
            raise TypeError(f"{where}: a function of the config is evaluated per trial; here give a dict")
        returned = resources(dict(config))
        if callable(returned) and not isinstance(returned, ScalingConfig | PlacementGroupFactory):
            raise TypeError(f"{where}: the resources function returned a function; return a dict, ScalingConfig "
                            "or PlacementGroupFactory")
        return shape_of(f"{where} (returned for config {dict(config)!r})", returned)
    if isinstance(resources, ScalingConfig):
        return Shape(resources.num_workers, dask_resources(where, resources.worker_resources))
    if isinstance(resources, PlacementGroupFactory):
        return _pgf_shape(where, resources)
    if isinstance(resources, Mapping):
        return Shape(1, dask_resources(where, resources))
    raise TypeError(
        f'{where}: resources must be a dict like {{"cpu": 1, "gpu": 0}}, a ScalingConfig, a PlacementGroupFactory or '
        f"a function of the config returning one, got {type(resources).__name__}"
    )


def _pgf_shape(where: str, pgf: PlacementGroupFactory) -> Shape:
    bundles = [dask_resources(where, b) for b in pgf.bundles]
    if len(bundles) == 1 and not pgf.head_bundle_is_empty:
        return Shape(1, bundles[0])
    workers = bundles if pgf.head_bundle_is_empty else bundles[1:]
    if any(b != workers[0] for b in workers):
        raise ValueError(
            f"{where}: {pgf!r}: the bundles after the first are a DDP group's ranks, which all reserve the same "
            "resources here; give equal bundles (or a ScalingConfig(num_workers=..., resources_per_worker=...))"
        )
    return Shape(len(workers), workers[0])


def example_config(param_space: Mapping[str, Any], seed: int = 0) -> dict[str, Any] | None:
    """A config drawn from ``param_space`` (a grid's first value, a domain's draw), for the pre-flight's evaluation
    of a resources function; None when a value depends on others (``tune.sample_from``)."""
    import numpy as np

    from sweepflow.tasks.sweep.space import Constant, Grid, SampleFrom, parse_param_space, set_leaf

    rng = np.random.default_rng(seed)
    config: dict[str, Any] = {}
    for path, domain in parse_param_space(param_space).leaves:
        if isinstance(domain, SampleFrom):
            return None
        if isinstance(domain, Grid):
            value = domain.values[0]
        elif isinstance(domain, Constant):
            value = domain.value
        else:
            value = domain.sample(rng)
        set_leaf(config, path, value)
    return config


class TrialShapes:
    """A resources function as the template's ``per_trial``: each trial's group from its config
    (``Shape.fields``); ``check`` refuses, naming ``where``, a group the trainable cannot run as."""

    def __init__(self, where: str, resources: Callable[[dict[str, Any]], Any], check: Callable[[Shape], None]) -> None:
        self.where, self.resources, self.check = where, resources, check

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        shape = shape_of(self.where, self.resources, config=config)
        self.check(shape)
        return shape.fields()
