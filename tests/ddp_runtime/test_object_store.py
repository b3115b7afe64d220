"""Ray's object store on Dask (``ddp_runtime.put`` / ``get`` / ``wait``, ``ObjectRef``), against real Dask
LocalClusters with worker processes: a script makes the calls a Ray script makes (``ray.put`` in the driver,
``ray.get`` in the trainable or the ranks, ``ray.wait``)."""

from __future__ import annotations

import gc
import pickle
import time

import numpy as np
import pytest

import ddp_runtime as ray  # what a Ray script's `import ray` becomes for the object store
from ddp_runtime.object_store import KEY_PREFIX
from ddp_runtime.torch import TorchTrainer


def _objects_on(client) -> dict[str, list[str]]:
    """The object store's keys the scheduler knows, with the workers holding each."""

    def listing(dask_scheduler=None):
        return {
            k: [ws.address for ws in ts.who_has or ()]
            for k, ts in dask_scheduler.tasks.items()
            if isinstance(k, str) and k.startswith("ddp_runtime-object-")
        }

    return client.run_on_scheduler(listing)


def _wanted_by(client, key: str) -> list[str]:
    """The clients the scheduler keeps ``key`` for."""

    def wanting(dask_scheduler=None):
        ts = dask_scheduler.tasks.get(key)
        return sorted(cs.client_key for cs in (ts.who_wants or ())) if ts is not None else []

    return client.run_on_scheduler(wanting)


def _flush(client) -> None:
    """Once this returns the scheduler has handled every message ``client`` sent before (a scope's cancel is
    one): a task submitted now travels the same ordered stream, and its result comes back after it ran."""
    assert client.submit(int, pure=False).result(timeout=30) == 0


def _eventually_no_objects(client, timeout_s: float = 10.0) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout_s
    while (left := _objects_on(client)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _eventually_only(client, keys: set[str], timeout_s: float = 30.0) -> None:
    """Wait until the scheduler holds no task but ``keys`` (released futures are forgotten a moment later)."""

    def held(dask_scheduler=None):
        return sorted(str(k) for k in dask_scheduler.tasks)

    deadline = time.monotonic() + timeout_s
    while (left := set(client.run_on_scheduler(held)) - keys) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, left


def read_sum(ref) -> float:
    """On a worker: the object a ref passed as a task argument points at (a dict holding an array)."""
    return float(ray.get(ref)["weights"].sum())


def read_nested(box: dict) -> list[float]:
    """On a worker: refs inside a container (a trial config's shape)."""
    return [float(v["weights"].sum()) for v in ray.get(box["refs"])]


def sleep_then(value: int, seconds: float) -> int:
    time.sleep(seconds)
    return value


@pytest.fixture
def own_cluster():
    """Two 1-thread worker processes of our own (the test restarts one); not the process's default client, so
    only ``object_store`` places objects on it."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client


def test_refs_pickle_to_their_key_and_the_driver_reads_its_own_copy():
    model = {"weights": np.arange(10.0)}
    ref = ray.put(model)
    model["weights"][:] = 0  # put took a snapshot, as Ray's does
    assert isinstance(ref, ray.ObjectRef) and ref.hex().startswith(KEY_PREFIX)
    assert len(pickle.dumps(ref)) < 200 and pickle.loads(pickle.dumps(ref)) == ref
    first, second = ray.get([ref, ref])
    assert first["weights"].sum() == 45.0 and first is not second  # a fresh copy per get
    assert ray.wait([ref], timeout=0) == ([ref], [])
    with pytest.raises(ValueError, match="unique"):
        ray.wait([ref, ref])


@pytest.mark.dask
def test_objects_are_read_on_workers_survive_a_worker_restart_and_are_freed_when_the_scope_ends(own_cluster):
    client = own_cluster
    with ray.object_store(client):
        ref = ray.put({"weights": np.arange(1000.0)})
        other = ray.put({"weights": np.ones(3)})
        assert client.submit(read_sum, ref, pure=False).result(timeout=30) == 499500.0  # a task argument
        assert client.submit(read_nested, {"refs": [ref, other]}, pure=False).result(timeout=30) == [
            499500.0,
            3.0,
        ]
        assert client.submit(lambda: read_sum(ref), pure=False).result(timeout=30) == 499500.0  # in a closure

        holder = _objects_on(client)[ref.key]
        assert len(holder) == 1  # one copy on the cluster
        # The three reads' tasks gone from the scheduler first: a finished task still held when its worker is
        # restarted is recomputed on the other (1-thread) worker, where it waits for the object the restarted
        # worker has not placed again yet, and the next read queues behind it (seen once in CI: 30 s timeout).
        _eventually_only(client, {ref.key, other.key})
        client.restart_workers(holder, timeout=60)  # the worker holding it is restarted: its memory is gone
        assert client.submit(read_sum, ref, pure=False).result(timeout=30) == 499500.0  # the task ran again
        assert _objects_on(client)[ref.key]

        # ray.wait: a put object is ready at once; a running task only when it finishes.
        slow = client.submit(sleep_then, 7, 1.5, pure=False)
        ready, not_ready = ray.wait([slow, ref], num_returns=1, timeout=5)
        assert ready == [ref] and not_ready == [slow]
        ready, not_ready = ray.wait([slow, ref], num_returns=2, timeout=0.2)
        assert ready == [ref] and not_ready == [slow]  # the timeout passed with one ready
        with pytest.raises(ray.GetTimeoutError):
            ray.get(slow, timeout=0.1)
        ready, not_ready = ray.wait([slow, ref], num_returns=2)  # no timeout: until both are
        assert ready == [slow, ref] and not_ready == [] and ray.get([slow, ref])[0] == 7
        del slow

    assert _eventually_no_objects(client) == {}  # released at the scope's end, while the refs still live
    with pytest.raises(ray.ObjectLostError, match="not on this Dask cluster"):
        client.submit(read_sum, ref, pure=False).result(timeout=30)
    assert (
        ray.get(ref)["weights"].sum() == 499500.0
    )  # the driver still holds it: the next scope places it again


def rank_reads(config: dict) -> None:
    """A TorchTrainer's train_loop_per_worker: every rank reads the object the driver put."""
    ctx = ray.get_context()
    weights = ray.get(config["model_ref"])["weights"]
    if weights.sum() != 499500.0:
        raise AssertionError(f"rank {ctx.get_world_rank()} read {weights.sum()}")
    ray.report({"sum": float(weights.sum()), "world_size": ctx.get_world_size()})


def test_every_rank_of_a_torch_trainer_reads_an_object_put_in_the_driver(cluster, tmp_path):
    model_ref = ray.put({"weights": np.arange(1000.0)})
    result = TorchTrainer(
        rank_reads,
        train_loop_config={"model_ref": model_ref},
        scaling_config=ray.ScalingConfig(num_workers=2),
        run_config=ray.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
        client=cluster,
    ).fit()
    assert result.metrics["sum"] == 499500.0 and result.metrics["world_size"] == 2
    # The default client put it before any scope: the fit's scope on that same client did not place it, so its
    # end does not release it.
    _flush(cluster)
    assert _wanted_by(cluster, model_ref.key) == [cluster.id]  # it lives while its ref does, as in Ray
    del model_ref
    gc.collect()
    assert _eventually_no_objects(cluster) == {}


def test_a_tune_function_trainable_gets_the_object_and_the_experiment_releases_its_copy(services, cluster):
    from sweepflow import tune

    model_ref = ray.put({"weights": np.arange(1000.0)})
    scale = 2.0

    def trainable(config):  # Tune's DCGAN PBT example's shape: the model comes from the driver's put
        weights = ray.get(config["model_ref"])["weights"]
        tune.report({"score": float(weights.sum()) * scale * config["x"]})

    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1.0, 2.0]), "model_ref": model_ref},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name="object-store", verbose=0),
    ).fit()
    assert not grid.errors and sorted(r.metrics["score"] for r in grid) == [999000.0, 1998000.0]
    # The experiment's own client released it; what is left is this process's default client's placement (a
    # Ray script's `ray.init()`), which lives while the ref does: a scope on that client ending keeps it.
    assert _wanted_by(cluster, model_ref.key) == [cluster.id]
    with ray.object_store(cluster):
        pass
    _flush(cluster)
    assert _wanted_by(cluster, model_ref.key) == [cluster.id]
    del model_ref, grid  # the results hold the param space, and so the ref, as Ray's do
    gc.collect()
    assert _eventually_no_objects(cluster) == {}


def test_get_gives_a_fresh_copy_and_numpy_arrays_as_read_only_views_of_one_copy():
    import torch

    ref = ray.put({"weights": np.arange(10.0), "rows": [1, 2], "tensor": torch.ones(3)})
    first, second = ray.get([ref, ref])
    assert first is not second and first["rows"] is not second["rows"]
    first["rows"].append(3)
    first["tensor"] += 1  # a tensor is a fresh, writable copy
    assert ray.get(ref)["rows"] == [1, 2] and ray.get(ref)["tensor"].sum() == 3.0
    assert np.shares_memory(first["weights"], second["weights"])  # as Ray's zero-copy reads: one copy here
    with pytest.raises(ValueError, match="read-only"):
        first["weights"][0] = 1.0
    writable = first["weights"].copy()
    writable[0] = 5.0
    assert ray.get(ref)["weights"][0] == 0.0
    # Several arrays of several dtypes come back equal and aligned for their dtype.
    given = [np.ones(3, np.float32), np.arange(5, dtype=np.int64), np.full((2, 3), 1 + 2j), np.array([True])]
    back = ray.get(ray.put(given))
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(given, back, strict=True))
    assert all(b.ctypes.data % b.dtype.alignment == 0 for b in back)
    assert ray.get(ray.put({"plain": "no arrays"})) == {"plain": "no arrays"}


def rank_reads_twice(config: dict) -> None:
    """A rank that reads the same object twice and a DataLoader with worker processes (Ray's PBT DCGAN example's
    shape): writes what it saw to a file per rank."""
    import json
    import multiprocessing
    import os

    import torch
    from distributed import get_worker

    from ddp_runtime.object_store import _FETCHED

    ref = config["ref"]
    first, second = ray.get(ref), ray.get(ref)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=2
    )
    seen = {
        "kept": len(_FETCHED),
        "held_here": ref.key in get_worker().data,
        "one_copy": bool(np.shares_memory(first["weights"], second["weights"])),
        "start_method": multiprocessing.get_start_method(),
        "batches": [float(b[0].sum()) for b in loader],
    }
    with open(os.path.join(config["out"], f"rank{ray.get_context().get_world_rank()}.json"), "w") as f:
        json.dump(seen, f)
    ray.report({"done": 1})


def _start_method() -> str | None:
    """On a worker: its multiprocessing default start method (not ``multiprocessing.get_start_method`` itself,
    a bound method cloudpickle would send with a copy of this process's context)."""
    import multiprocessing

    return multiprocessing.get_start_method(allow_none=True)


def _kept_here() -> int:
    from ddp_runtime.object_store import _FETCHED

    return len(_FETCHED)


def test_a_rank_fetches_an_object_once_and_forks_its_data_loader_workers_as_a_plain_process(
    cluster, tmp_path
):
    """The rank's second get reads the copy it fetched (no round trip), dropped once the rank ends; its DataLoader
    workers start with the platform's default method (fork on Linux), which the worker took when it started
    (``ddp_runtime._preload``), not the fork server its nanny started it with."""
    import json
    import subprocess
    import sys

    import torch  # noqa: F401 - the fresh interpreter below imports nothing but multiprocessing

    fresh = subprocess.run(
        [sys.executable, "-c", "import multiprocessing; print(multiprocessing.get_start_method())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert set(cluster.run(_start_method).values()) == {fresh}  # though forked from a fork server
    ref = ray.put({"weights": np.arange(1000.0)})
    TorchTrainer(
        rank_reads_twice,
        train_loop_config={"ref": ref, "out": str(tmp_path)},
        scaling_config=ray.ScalingConfig(num_workers=2),
        run_config=ray.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
        client=cluster,
    ).fit()
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["kept"] == (0 if seen["held_here"] else 1) and seen["one_copy"], seen
        assert seen["start_method"] == fresh and seen["batches"] == [6.0, 22.0], seen
    assert set(cluster.run(_kept_here).values()) == {0}  # dropped with the last rank
