"""A training worker's own timers (ddp_runtime.worker_config): set by the preload a cluster's workers run, with a
cluster's own settings kept."""

from __future__ import annotations

import os
import subprocess
import sys

import dask.config
import pytest

from ddp_runtime.worker_config import TRAINING_WORKER_CONFIG, _dask_defaults, apply_training_worker_config

TICK = "distributed.admin.tick.interval"


def test_the_keys_at_dasks_defaults_are_set_and_a_clusters_own_are_kept():
    shipped = _dask_defaults()
    defaults = {key: dask.config.get(key, config=shipped) for key in TRAINING_WORKER_CONFIG}
    assert defaults["distributed.worker.profile.enabled"] is True and defaults[TICK] == "20ms"  # Dask's, as read
    with dask.config.set({**defaults, TICK: "200ms"}):  # as a cluster's YAML or DASK_* variable would
        chosen = apply_training_worker_config()
        assert chosen == {key: value for key, value in TRAINING_WORKER_CONFIG.items() if key != TICK}
        assert dask.config.get(TICK) == "200ms"
        assert dask.config.get("distributed.worker.profile.enabled") is False


def _heavy_modules() -> list[str]:
    return sorted(name for name in ("torch", "sweepflow.tasks.training.loop") if name in sys.modules)


def _wait_for_the_preload_thread() -> None:
    import threading

    for thread in threading.enumerate():
        if thread.name.startswith("sweepflow-preload"):
            thread.join(timeout=120)


def _timers(dask_worker) -> dict:
    callbacks = dask_worker.periodic_callbacks
    return {
        "profile": "profile" in callbacks,
        **{name: callbacks[name].callback_time for name in ("tick", "memory_monitor", "monitor") if name in callbacks},
    }


@pytest.mark.dask
@pytest.mark.subprocess
def test_a_worker_started_with_the_preload_runs_without_the_profiler_and_keeps_the_clusters_own_tick(tmp_path):
    """`dask worker --preload ddp_runtime._preload`, as docs/deploying.md starts a cluster's workers: the worker
    process is built with the training settings (its nanny got them from the command's import of the preload), and
    a setting the cluster made itself (here the tick, by a DASK_* variable) stays. The command imports the preloads
    in its own (nanny) process as well: there they import neither torch nor the training code, which only the
    worker process needs."""
    from distributed import Client, LocalCluster

    bin_dir = os.path.dirname(sys.executable)
    env = {key: value for key, value in os.environ.items() if not key.startswith("DASK_")}
    env["DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"] = "200ms"
    with (
        LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        worker = subprocess.Popen(
            [os.path.join(bin_dir, "dask"), "worker", cluster.scheduler_address, "--nthreads", "1",
             "--preload", "ddp_runtime._preload", "--preload", "sweepflow.tasks.worker_preload", "--no-dashboard",
             "--local-directory", str(tmp_path)],
            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "w"),
        )  # fmt: skip
        try:
            client.wait_for_workers(1, timeout=120)
            (timers,) = client.run(_timers).values()
            client.run(_wait_for_the_preload_thread)
            (in_worker,) = client.run(_heavy_modules).values()
            (in_nanny,) = client.run(_heavy_modules, nanny=True).values()
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    assert in_worker == ["sweepflow.tasks.training.loop", "torch"], in_worker
    assert in_nanny == [], f"the `dask worker` process imported {in_nanny}"
    assert timers["profile"] is False, timers
    assert timers["tick"] == 200, timers  # the cluster's own
    assert timers["monitor"] == 5000, timers
    assert timers.get("memory_monitor", 1000) == 1000, timers


def test_training_workers_start_without_dasks_malloc_trim_threshold(cluster):
    """Dask's MALLOC_TRIM_THRESHOLD_ turns off glibc's dynamic mmap threshold (a Lightning epoch up to 2x slower,
    benchmarks/RESULTS.md): neither the `dask worker` preload's config nor a local cluster's passes it on."""
    import os

    import dask
    from distributed.nanny import _get_env_variables

    from ddp_runtime.cluster import worker_config
    from ddp_runtime.worker_config import NO_MALLOC_TRIM_KEY, TRAINING_WORKER_CONFIG

    assert TRAINING_WORKER_CONFIG[NO_MALLOC_TRIM_KEY] is None
    with dask.config.set(worker_config()):
        assert "MALLOC_TRIM_THRESHOLD_" not in _get_env_variables("distributed.nanny.pre-spawn-environ")
    seen = cluster.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    assert set(seen.values()) == {None}, seen
