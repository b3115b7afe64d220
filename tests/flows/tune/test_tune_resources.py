"""``tune.with_resources`` in Ray's four forms: a dict (cpu, gpu, memory, custom resources), a ``ScalingConfig``, a
``PlacementGroupFactory`` and a function of the config; the mapping onto a trial's DDP group as unit tests, then one
real ``tune.run`` per form on the session's cluster (2 Dask workers declaring CPU=1 each, on one host)."""

from __future__ import annotations

import pytest

import ddp_runtime as train
from ddp_runtime import ScalingConfig
from sweepflow import tune
from sweepflow.tune._internal.resources import example_config
from sweepflow.tune._internal.trainable import plan_trial


def report_world(config):
    """Reports its rank's world size and torch threads."""
    import torch

    context = train.get_context()
    tune.report(world=context.get_world_size(), threads=torch.get_num_threads(), cpus=config.get("cpus", 0))


class OneStep(tune.Trainable):
    def step(self):
        return {"done": True}


def _shape(trainable, resources=None, space=None):
    t = plan_trial(trainable, resources, dict(space or {}))
    return t.num_ranks, t.resources_per_rank, t.use_gpu


# ------------------------------------------------------------------------------------------- the mapping


def test_a_dict_in_rays_keys_is_one_rank_of_dask_resources():
    asked = {"cpu": 2, "GPU": 0.5, "memory": 1e9, "custom_resources": {"TPU": 1}, "accelerator_type:A100": 0.001}
    assert _shape(tune.with_resources(report_world, asked)) == (
        1, {"CPU": 2.0, "GPU": 0.5, "memory": 1e9, "TPU": 1.0, "accelerator_type:A100": 0.001}, True
    )
    assert _shape(report_world, {"cpu": 1, "gpu": 0}) == (1, {"CPU": 1.0}, False)  # resources_per_trial too
    with pytest.raises(ValueError, match="object store.*remove it"):
        tune.with_resources(report_world, {"object_store_memory": 1e9})
    with pytest.raises(ValueError, match="must be a number >= 0"):
        tune.with_resources(report_world, {"cpu": -1})
    with pytest.raises(TypeError, match="a ScalingConfig, a PlacementGroupFactory"):
        tune.with_resources(report_world, 2)


def test_a_scaling_config_is_its_group_with_the_function_on_every_rank():
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}, trainer_resources={"CPU": 1})
    assert _shape(tune.with_resources(report_world, scaling)) == (2, {"CPU": 1.0}, False)
    assert _shape(tune.with_resources(report_world, ScalingConfig(num_workers=3, use_gpu=True))) == (
        3, {"GPU": 1.0}, True
    )
    with pytest.raises(ValueError, match="class trainable, which runs as one rank"):
        plan_trial(tune.with_resources(OneStep, scaling), None, {})


def test_a_placement_group_factory_is_a_driver_and_its_ranks():
    one = tune.PlacementGroupFactory([{"CPU": 1, "GPU": 0.5, "slot": 2}])
    assert _shape(tune.with_resources(report_world, one)) == (1, {"CPU": 1.0, "GPU": 0.5, "slot": 2.0}, True)
    group = tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 2}, {"CPU": 2}], strategy="PACK")
    assert _shape(tune.with_resources(report_world, group)) == (2, {"CPU": 2.0}, False)
    assert _shape(tune.with_resources(report_world, tune.PlacementGroupFactory([{}, {"CPU": 1}]))) == (
        1, {"CPU": 1.0}, False
    )
    assert group.required_resources == {"CPU": 5.0} and group.head_cpus == 1.0 and group.strategy == "PACK"
    assert _shape(OneStep, one) == (1, {"CPU": 1.0, "GPU": 0.5, "slot": 2.0}, True)
    with pytest.raises(ValueError, match="all reserve the same resources here; give equal bundles"):
        tune.with_resources(report_world, tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 2}, {"CPU": 3}]))
    with pytest.raises(ValueError, match="placement_strategy='SPREAD'"):
        tune.PlacementGroupFactory([{"CPU": 1}], strategy="SPREAD")
    with pytest.raises(ValueError, match="every bundle is empty"):
        tune.PlacementGroupFactory([{"CPU": 0}])
    with pytest.raises(ValueError, match="non-empty list of bundles"):
        tune.PlacementGroupFactory([])


def test_a_class_trainables_default_resource_request_may_be_a_placement_group_factory():
    class Asks(OneStep):
        @classmethod
        def default_resource_request(cls, config):
            return tune.PlacementGroupFactory([{"CPU": config["cpus"]}])

    assert _shape(Asks, None, {"cpus": 2}) == (1, {"CPU": 2.0}, False)
    assert _shape(tune.with_resources(Asks, {"gpu": 1}), None, {"cpus": 2}) == (1, {"GPU": 1.0}, True)


def test_a_function_of_the_config_is_evaluated_for_each_trial_and_in_the_preflight():
    def asks(config):
        return ScalingConfig(num_workers=config["ranks"]) if config["ranks"] > 1 else {"cpu": config["cpus"]}

    space = {"ranks": tune.grid_search([1, 2]), "cpus": tune.choice([3])}
    template = plan_trial(tune.with_resources(report_world, asks), None, space)
    assert (template.num_ranks, template.resources_per_rank) == (1, {"CPU": 3.0})  # the space's first grid point
    first, second = template.trial(0, {"ranks": 1, "cpus": 3}), template.trial(1, {"ranks": 2, "cpus": 3})
    assert (first.template.num_ranks, first.template.resources_per_rank) == (1, {"CPU": 3.0})
    assert (second.template.num_ranks, second.template.resources_per_rank) == (2, {})  # a free thread per rank
    assert first.template.per_trial is None and first.name == "trial_0000"
    # Its mistakes, on the pre-flight's config, before any service starts.
    with pytest.raises(ValueError, match=r"returned for config \{'ranks': 1, 'cpus': 3\}.*tpu must be a number"):
        plan_trial(tune.with_resources(report_world, lambda c: {"tpu": "one"}), None, space)
    with pytest.raises(KeyError, match="missing"):
        plan_trial(tune.with_resources(report_world, lambda c: {"cpu": c["missing"]}), None, space)
    with pytest.raises(ValueError, match="class trainable, which runs as one rank"):
        plan_trial(tune.with_resources(OneStep, lambda c: ScalingConfig(num_workers=2)), None, space)


def test_the_preflights_config_is_drawn_from_the_space():
    space = {"a": tune.grid_search([5, 6]), "b": {"c": tune.uniform(0, 1)}, "d": "fixed"}
    config = example_config(space)
    assert config["a"] == 5 and 0 <= config["b"]["c"] <= 1 and config["d"] == "fixed"
    assert example_config({"x": tune.sample_from(lambda spec: 1)}) is None


# ------------------------------------------------------------------------------------------- real runs


def _results(analysis):
    return sorted((t.config.get("cpus", 0), t.last_result["world"], t.last_result["threads"]) for t in analysis.trials)


def test_a_dict_with_memory_runs_and_an_undeclared_resource_is_refused(services):
    analysis = tune.run(tune.with_resources(report_world, {"cpu": 1, "memory": 1e6}), config={}, verbose=0)
    assert _results(analysis) == [(0, 1, 1)]
    with pytest.raises(train.InsufficientResourcesError, match="no trial fits.*TPU"):
        tune.run(tune.with_resources(report_world, {"cpu": 1, "TPU": 1}), config={}, verbose=0)
    with pytest.raises(train.InsufficientResourcesError, match="no trial fits.*memory"):  # more than a worker has
        tune.run(tune.with_resources(report_world, {"memory": 1e15}), config={}, verbose=0)


def test_a_scaling_config_runs_the_function_as_a_ddp_group(services):
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})
    analysis = tune.run(tune.with_resources(report_world, scaling), config={}, verbose=0)
    assert _results(analysis) == [(0, 2, 1)]


def test_a_placement_group_factory_runs_its_ranks(services):
    pgf = tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 1}, {"CPU": 1}])
    analysis = tune.Tuner(tune.with_resources(report_world, pgf), param_space={}).fit()
    assert [(r.metrics["world"], r.metrics["threads"]) for r in analysis] == [(2, 1)]


def test_a_function_of_the_config_gives_each_trial_its_own_resources(services):
    """{"cpu": 2} on workers of CPU=1 runs with 2 threads, one trial at a time (as a dict does); {"cpu": 1}, 1."""
    analysis = tune.run(
        tune.with_resources(report_world, lambda config: {"cpu": config["cpus"]}),
        config={"cpus": tune.grid_search([1, 2])},
        verbose=0,
    )
    assert _results(analysis) == [(1, 1, 1), (2, 1, 2)]
