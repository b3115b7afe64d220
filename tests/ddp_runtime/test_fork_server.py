"""A local cluster's workers forked from the fork server (ddp_runtime._fork_server): they start with torch and
torch._dynamo imported, and with the environment, sys.path and working directory a spawned worker would have."""

from __future__ import annotations

import os
import sys
import time

import pytest

from ddp_runtime import _fork_server
from ddp_runtime.cluster import local_cluster


def _worker_side() -> dict:
    import multiprocessing

    import psutil
    import torch

    return {
        "dynamo": "torch._dynamo" in sys.modules,
        "parent": " ".join(psutil.Process().parent().cmdline()),
        "probe": os.environ.get("SWEEPFLOW_TEST_PROBE"),
        "removed": os.environ.get("SWEEPFLOW_TEST_REMOVED"),
        "names": _fork_server._ENVIRON_NAMES in os.environ,
        "hash_seed": os.environ.get("PYTHONHASHSEED"),
        "threads": torch.get_num_threads(),
        "daemon": multiprocessing.current_process().daemon,
        "cwd": os.getcwd(),
        "path": sys.path,
    }


def _one(client) -> dict:
    (seen,) = client.run(_worker_side).values()
    return seen


@pytest.mark.dask
def test_forked_workers_hold_torch_and_see_the_parents_environment_of_the_moment(monkeypatch, tmp_path):
    monkeypatch.setenv("SWEEPFLOW_TEST_PROBE", "first")
    monkeypatch.setenv("SWEEPFLOW_TEST_REMOVED", "still here")
    with local_cluster(n_workers=1) as client:
        first = _one(client)
    # What changed in this process after the fork server started (with the first cluster, or earlier).
    monkeypatch.setenv("SWEEPFLOW_TEST_PROBE", "second")
    monkeypatch.delenv("SWEEPFLOW_TEST_REMOVED")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "project"))
    with local_cluster(n_workers=1) as client:
        second = _one(client)

    for seen in (first, second):
        assert seen["dynamo"], "a forked worker imports torch._dynamo itself"
        assert "forkserver" in seen["parent"], seen["parent"]
        assert seen["hash_seed"] == "6640" and seen["threads"] == 1 and seen["daemon"] is False, seen
        assert not seen["names"]
    assert (first["probe"], first["removed"]) == ("first", "still here")
    assert (second["probe"], second["removed"]) == ("second", None)
    assert second["cwd"] == str(tmp_path) and str(tmp_path / "project") in second["path"]


def _on_exit_write(path: str) -> None:
    import atexit

    atexit.register(lambda: open(path, "w").write("ran"))


@pytest.mark.dask
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_workers_exit_handlers_run_when_its_cluster_closes(start_method, tmp_path):
    marker = tmp_path / "exit-handler-ran"
    with local_cluster(n_workers=1, start_method=start_method) as client:
        client.run(_on_exit_write, str(marker))
    for _ in range(50):  # the worker process may still be ending when the cluster's close returns
        if marker.exists():
            break
        time.sleep(0.1)
    assert marker.read_text() == "ran"


@pytest.mark.dask
def test_spawned_workers_import_torch_themselves():
    with local_cluster(n_workers=1, start_method="spawn") as client:
        seen = _one(client)
    assert "forkserver" not in seen["parent"] and not seen["dynamo"], seen
    assert seen["hash_seed"] == "6640" and seen["threads"] == 1, seen


def test_a_worker_keeps_the_parents_variables_and_the_nannys_own(monkeypatch):
    """``restore_parent_environment`` in this process, as a forked worker runs it."""
    import dask.config

    monkeypatch.setenv("SWEEPFLOW_TEST_PARENT", "1")
    monkeypatch.setenv("SWEEPFLOW_TEST_STALE", "from the fork server")
    monkeypatch.setenv("SWEEPFLOW_TEST_NANNY", "2")
    monkeypatch.setenv("PYTHONHASHSEED", "6640")
    names = [n for n in os.environ if n not in ("SWEEPFLOW_TEST_STALE", "SWEEPFLOW_TEST_NANNY", "PYTHONHASHSEED")]
    monkeypatch.setenv(_fork_server._ENVIRON_NAMES, __import__("json").dumps(names))
    with dask.config.set({"distributed.nanny.environ": {"SWEEPFLOW_TEST_NANNY": "2"}}):
        assert _fork_server.restore_parent_environment()
    assert os.environ["SWEEPFLOW_TEST_PARENT"] == "1" and os.environ["SWEEPFLOW_TEST_NANNY"] == "2"
    assert "SWEEPFLOW_TEST_STALE" not in os.environ and _fork_server._ENVIRON_NAMES not in os.environ
    assert os.environ["PYTHONHASHSEED"] == "6640"
    # Without the names (a worker the nanny did not hand the parent's environment to): left as it is.
    assert not _fork_server.restore_parent_environment()
    assert os.environ["SWEEPFLOW_TEST_PARENT"] == "1"


def test_the_start_method_a_local_cluster_sets():
    import dask.config

    method = _fork_server.START_METHOD
    config, kwargs = _fork_server.start_settings("forkserver", gpus=0)
    assert config == {method: "forkserver"} and kwargs["env"]["PATH"] == os.environ["PATH"]
    assert _fork_server.start_settings("spawn", gpus=0) == ({method: "spawn"}, {})
    assert _fork_server.start_settings("forkserver", gpus=2) == ({method: "spawn"}, {})  # CUDA and fork
    with dask.config.set({method: "fork"}):  # chosen in the cluster's Dask config: kept
        assert _fork_server.start_settings("forkserver", gpus=0) == ({}, {})
    with dask.config.set({method: "forkserver"}):  # e.g. set by an enclosing local cluster
        assert _fork_server.start_settings("spawn", gpus=0) == ({method: "spawn"}, {})
