"""Every field of Ray 2.60's Train/Tune configs works here or is refused by name with the fix; Ray's collectives.

The signatures are copied, as data, from the Ray 2.60.0 wheel (``ray/train/v2/api/config.py``: the Train
``ScalingConfig``, ``RunConfig``, ``CheckpointConfig``, ``FailureConfig``; ``ray/air/config.py``: their Tune
counterparts ``ray.tune.*``, whose fields our same classes take; ``ray/train/torch/config.py``: ``TorchConfig``),
so this needs no Ray installed. ``DEPRECATED`` marks Ray's sentinel default of a field that Ray 2.60 itself
refuses any value for.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import ddp_runtime as train
from ddp_runtime import collective
from ddp_runtime.torch import TorchConfig, TorchTrainer

DEPRECATED = "DEPRECATED"

#: Ray 2.60.0's fields and defaults: class -> {field: default}. The union of ray.train's and ray.tune's classes
#: of that name (ray.train.ScalingConfig inherits ray.air's fields).
RAY_2_60_FIELDS: dict[str, dict[str, Any]] = {
    "ScalingConfig": {
        "trainer_resources": None,
        "num_workers": 1,
        "use_gpu": False,
        "resources_per_worker": None,
        "placement_strategy": "PACK",
        "accelerator_type": None,
        "label_selector": None,
        "use_tpu": False,
        "topology": None,
        "elastic_resize_monitor_interval_s": 60.0,
    },
    "RunConfig": {
        "name": None,
        "storage_path": None,
        "storage_filesystem": None,
        "failure_config": None,
        "checkpoint_config": None,
        "callbacks": None,
        "worker_runtime_env": None,
        "logging_config": None,
        "sync_config": None,  # ray.train: DEPRECATED
        "verbose": None,  # ray.train: DEPRECATED
        "stop": None,  # ray.train: DEPRECATED
        "progress_reporter": None,  # ray.train: DEPRECATED
        "log_to_file": False,  # ray.train: DEPRECATED
        "local_dir": None,  # ray.tune only; Ray refuses any value
    },
    "CheckpointConfig": {
        "num_to_keep": None,
        "checkpoint_score_attribute": None,
        "checkpoint_score_order": "max",
        "checkpoint_frequency": 0,  # ray.train: DEPRECATED
        "checkpoint_at_end": None,  # ray.train: DEPRECATED
        "_checkpoint_keep_all_ranks": DEPRECATED,  # ray.tune only
        "_checkpoint_upload_from_workers": DEPRECATED,  # ray.tune only
    },
    "FailureConfig": {
        "max_failures": 0,
        "fail_fast": False,  # ray.train: DEPRECATED
        "controller_failure_limit": -1,
        "max_preemption_failures": -1,
        "relax_collectives_on_preemption": False,
        "preemption_grace_s": 0.0,
    },
    "TorchConfig": {
        "backend": None,
        "init_method": "env",
        "timeout_s": 1800,
    },
}

CLASSES: dict[str, type] = {
    "ScalingConfig": train.ScalingConfig,
    "RunConfig": train.RunConfig,
    "CheckpointConfig": train.CheckpointConfig,
    "FailureConfig": train.FailureConfig,
    "TorchConfig": TorchConfig,
}


def _works(value: Any, honoured: Callable[[Any], bool]) -> tuple[str, Any, Callable[[Any], bool]]:
    return ("works", value, honoured)


def _refused(value: Any, *fix: str) -> tuple[str, Any, tuple[str, ...]]:
    return ("refused", value, fix)


#: (class, field) -> what a Ray user's value does here: works (and is honoured: the check) or refused (words of
#: the fix the message must hold). Every field of RAY_2_60_FIELDS has at least one.
CASES: dict[tuple[str, str], list[tuple]] = {
    ("ScalingConfig", "trainer_resources"): [
        _works({"CPU": 0}, lambda c: c.trainer_resources == {"CPU": 0} and c.worker_resources == {}),
        _refused({"CPU": -1}, "reserves nothing", "fit()"),
    ],
    ("ScalingConfig", "num_workers"): [
        _works(3, lambda c: c.num_workers == 3),
        _refused((2, 4), "fixed number of ranks", "num_workers=<int>"),
        _refused(0, "local mode", "num_workers=1"),
    ],
    ("ScalingConfig", "use_gpu"): [_works(True, lambda c: c.worker_resources == {"GPU": 1})],
    ("ScalingConfig", "resources_per_worker"): [
        _works({"CPU": 2}, lambda c: c.worker_resources == {"CPU": 2}),
        _refused({"GPU": -1}, "positive number"),
    ],
    ("ScalingConfig", "placement_strategy"): [
        _works("PACK", lambda c: c.placement_strategy == "PACK"),
        _refused("SPREAD", "--resources", "resources_per_worker"),
        _refused("STRICT_SPREAD", "--resources", "resources_per_worker"),
        _refused("STRICT_PACK", "--resources", 'placement_strategy="PACK"'),
        _refused("ANYWHERE", 'placement_strategy="PACK"'),
    ],
    ("ScalingConfig", "accelerator_type"): [
        _works("A100", lambda c: c.worker_resources == {"accelerator_type:A100": 0.001}),
        _refused("", '"A100"'),
    ],
    ("ScalingConfig", "label_selector"): [_refused({"zone": "a"}, "--resources", "resources_per_worker")],
    ("ScalingConfig", "use_tpu"): [_refused(True, "use_gpu=True")],
    ("ScalingConfig", "topology"): [_refused("4x4", "use_gpu=True")],
    ("ScalingConfig", "elastic_resize_monitor_interval_s"): [_refused(5.0, "num_workers=<int>")],
    ("RunConfig", "name"): [_works("run-a", lambda c: c.name == "run-a"), _refused("a/b", "without '/'")],
    ("RunConfig", "storage_path"): [_works("/tmp/x", lambda c: c.storage_path == "/tmp/x")],
    ("RunConfig", "storage_filesystem"): [_refused(object(), "storage_path", "storage_options")],
    ("RunConfig", "failure_config"): [
        _works(train.FailureConfig(max_failures=2), lambda c: c.failure_config.max_failures == 2)
    ],
    ("RunConfig", "checkpoint_config"): [
        _works(train.CheckpointConfig(num_to_keep=2), lambda c: c.checkpoint_config.num_to_keep == 2)
    ],
    ("RunConfig", "callbacks"): [
        _works([], lambda c: c.callbacks == []),
        _refused(3, "callbacks=[MyCallback()]"),
    ],
    ("RunConfig", "worker_runtime_env"): [
        _refused({"env_vars": {"A": "1"}}, "environment variables on the workers")
    ],
    ("RunConfig", "logging_config"): [_refused(object(), 'logging.getLogger("ddp_runtime")')],
    ("RunConfig", "sync_config"): [_refused(object(), "storage_path=", "s3://")],
    ("RunConfig", "verbose"): [_works(0, lambda c: c.verbose == 0)],
    ("RunConfig", "stop"): [
        _works(
            {"training_iteration": 3}, lambda c: train.config.stop_met(c.stop, "t", {"training_iteration": 3})
        ),
        _refused(3, '{"training_iteration": 10}'),
    ],
    ("RunConfig", "progress_reporter"): [_works(None, lambda c: c.progress_reporter is None)],
    ("RunConfig", "log_to_file"): [_refused(True, "get_trial_dir()")],
    ("RunConfig", "local_dir"): [_refused("/tmp/results", "storage_path")],
    ("CheckpointConfig", "num_to_keep"): [
        _works(2, lambda c: c.num_to_keep == 2),
        _refused(0, "None (keep all) or an int >= 1"),
    ],
    ("CheckpointConfig", "checkpoint_score_attribute"): [
        _works("loss", lambda c: c.checkpoint_score_attribute == "loss")
    ],
    ("CheckpointConfig", "checkpoint_score_order"): [
        _works("min", lambda c: c.checkpoint_score_order == "min"),
        _refused("best", "'min' or 'max'"),
    ],
    ("CheckpointConfig", "checkpoint_frequency"): [_works(2, lambda c: c.checkpoint_frequency == 2)],
    ("CheckpointConfig", "checkpoint_at_end"): [_works(True, lambda c: c.checkpoint_at_end is True)],
    ("CheckpointConfig", "_checkpoint_keep_all_ranks"): [_refused(True, "remove it")],
    ("CheckpointConfig", "_checkpoint_upload_from_workers"): [_refused(True, "remove it")],
    ("FailureConfig", "max_failures"): [
        _works(-1, lambda c: c.max_failures == -1),
        _refused(-2, "-1 for unlimited"),
    ],
    ("FailureConfig", "fail_fast"): [
        _works("raise", lambda c: c.fail_fast == "raise"),
        _refused("yes", '"raise"'),
    ],
    ("FailureConfig", "controller_failure_limit"): [
        _works(0, lambda c: c.max_failures == 0),  # no controller retries: what there is here
        _refused(-1, "resume_from_checkpoint"),
        _refused(3, "resume_from_checkpoint"),
    ],
    ("FailureConfig", "max_preemption_failures"): [_refused(-1, "max_failures"), _refused(3, "max_failures")],
    ("FailureConfig", "relax_collectives_on_preemption"): [_refused(True, "max_failures")],
    ("FailureConfig", "preemption_grace_s"): [_refused(30.0, "max_failures")],
    ("TorchConfig", "backend"): [
        _works("gloo", lambda c: c.backend == "gloo"),
        _refused("mpi", "'nccl' (GPUs), 'gloo' (CPUs)"),
    ],
    ("TorchConfig", "init_method"): [
        _works("tcp", lambda c: c.init_method == "tcp"),
        _refused("file:///tmp/rdv", "'env' or 'tcp'"),
    ],
    ("TorchConfig", "timeout_s"): [_works(60, lambda c: c.timeout_s == 60), _refused(0, "positive number")],
}

#: Ray defaults that promise what does not happen here (retries without limit of a controller and of preempted
#: workers), refused like any other value (their cases above).
DEFAULTS_REFUSED = {
    ("FailureConfig", "controller_failure_limit"),
    ("FailureConfig", "max_preemption_failures"),
}

_EVERY_CASE = [
    pytest.param(cls, name, case, id=f"{cls}.{name}-{case[0]}-{i}")
    for (cls, name), cases in CASES.items()
    for i, case in enumerate(cases)
]


def test_every_ray_field_has_a_case():
    walked = {(cls, name) for cls, names in RAY_2_60_FIELDS.items() for name in names}
    assert walked == set(CASES), (walked - set(CASES), set(CASES) - walked)


@pytest.mark.parametrize(("cls", "name", "case"), _EVERY_CASE)
def test_ray_field_works_or_is_refused_by_name_with_the_fix(cls, name, case):
    kind, value, expect = case
    if kind == "works":
        config = CLASSES[cls](**{name: value})
        assert expect(config), f"{cls}({name}={value!r}) constructed but is not honoured: {config!r}"
        return
    with pytest.raises((ValueError, TypeError)) as info:
        CLASSES[cls](**{name: value})
    message = str(info.value)
    assert name in message, f"the refusal must name {name}: {message}"
    for words in expect:
        assert words in message, f"the refusal of {cls}({name}=...) must say {words!r}: {message}"


@pytest.mark.parametrize(
    ("cls", "name", "default"),
    [
        pytest.param(cls, name, default, id=f"{cls}.{name}")
        for cls, names in RAY_2_60_FIELDS.items()
        for name, default in names.items()
        if default != DEPRECATED and (cls, name) not in DEFAULTS_REFUSED
    ],
)
def test_ray_defaults_spelled_out_are_accepted(cls, name, default):
    """A Ray script that writes a default out (``use_tpu=False``, ``label_selector=None``) runs unchanged."""
    CLASSES[cls](**{name: default})


def test_none_sub_configs_are_filled_in_and_unknown_names_list_the_fields():
    run = train.RunConfig(checkpoint_config=None, failure_config=None)
    assert run.checkpoint_config == train.CheckpointConfig() and run.failure_config == train.FailureConfig()
    with pytest.raises(TypeError, match=r"ScalingConfig\(\) has no field 'num_gpus'.*num_workers, use_gpu"):
        train.ScalingConfig(num_gpus=1)
    with pytest.raises(
        TypeError, match=r"TorchConfig\(\) has no field 'init'.*backend, init_method, timeout_s"
    ):
        TorchConfig(init="env")
    # A refused field is not a field: replace/pickle see only ours.
    scaling = train.ScalingConfig(num_workers=2, use_tpu=False, accelerator_type="A100")
    assert not hasattr(scaling, "use_tpu") and scaling.num_workers == 2


def test_collectives_outside_a_training_function_say_where_they_belong():
    for call in (collective.barrier, lambda: collective.broadcast_from_rank_zero(1)):
        with pytest.raises(RuntimeError, match="inside a training function"):
            call()


def collectives_fn(config):
    """Barrier and broadcast on every rank; writes what each rank saw to ``out/rank<r>.json``."""
    import torch.distributed as dist

    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    seen: dict[str, Any] = {"rank": rank, "world": world}
    if world > 1:
        seen["backend"] = dist.get_backend()
        seen["master"] = os.environ.get("MASTER_ADDR")
    if rank == 1:
        time.sleep(config["late_s"])  # the barrier must hold rank 0 until rank 1 arrives
    seen["arrived"] = time.time()
    collective.barrier()
    seen["passed"] = time.time()
    mine = {"run": "abc", "from": rank, "blob": "x" * 100_000}
    got = collective.broadcast_from_rank_zero(mine if rank == 0 else None)
    seen["got_from"], seen["blob"] = got["from"], len(got["blob"])
    seen["identity"] = got is mine
    try:
        collective.broadcast_from_rank_zero(threading.Lock() if rank == 0 else None)
        seen["unpicklable"] = None
    except TypeError as exc:
        seen["unpicklable"] = str(exc)
    seen["after_error"] = collective.broadcast_from_rank_zero(rank * 10 + 7)  # the group still works
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    train.report({"done": 1})


def _fit(client, tmp_path, num_workers, out, **scaling):
    return TorchTrainer(
        collectives_fn,
        train_loop_config={"out": str(out), "late_s": 1.5},
        scaling_config=train.ScalingConfig(num_workers=num_workers, **scaling),
        torch_config=TorchConfig(backend="gloo", init_method="tcp", timeout_s=120),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results"), name=f"coll{num_workers}"),
        client=client,
    ).fit()


def test_barrier_and_broadcast_in_a_two_rank_group_and_a_one_rank_group(cluster, tmp_path):
    two = tmp_path / "two"
    two.mkdir()
    result = _fit(cluster, tmp_path, 2, two, placement_strategy="PACK", trainer_resources={"CPU": 0})
    assert result.error is None and result.metrics["done"] == 1
    r0, r1 = (json.loads((two / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["backend"] == r1["backend"] == "gloo" and r0["master"] == r1["master"]  # TorchConfig honoured
    assert r0["passed"] >= r1["arrived"], "barrier() let rank 0 through before rank 1 arrived"
    assert r0["passed"] - r0["arrived"] > 1.0
    assert r0["got_from"] == r1["got_from"] == 0 and r0["blob"] == r1["blob"] == 100_000
    assert r0["identity"] is True and r1["identity"] is False
    for seen in (r0, r1):
        assert "rank 0's data cannot be pickled" in seen["unpicklable"], seen["unpicklable"]
        assert seen["after_error"] == 7  # rank 0's value, on every rank

    one = tmp_path / "one"
    one.mkdir()
    _fit(cluster, tmp_path, 1, one)
    alone = json.loads((one / "rank0.json").read_text())
    assert alone["world"] == 1 and alone["got_from"] == 0 and alone["identity"] is True
    assert alone["unpicklable"] is None and alone["after_error"] == 7  # identity: nothing is pickled


def test_accelerator_type_places_ranks_only_on_workers_that_declare_it(cluster, tmp_path):
    with pytest.raises(train.InsufficientResourcesError, match="accelerator_type:H100"):
        _fit(cluster, tmp_path, 1, tmp_path, accelerator_type="H100")
