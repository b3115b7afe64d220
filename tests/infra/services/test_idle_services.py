"""Idle services cost nothing: the local services' idle settings, and the watchdog that stops them once unused.

The watchdog tests use stand-in services (a sleeping Python process recorded like any service): what is under
test is when the watchdog stops what is recorded, not the services themselves. What the real services cost
while idle is measured by benchmarks/bench_idle_services.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sweepflow.infra.services import idle
from sweepflow.infra.services import supervisor as services


def _stand_in(state_dir: str, name: str = "stand-in") -> int:
    """A recorded service that serves nothing and sleeps; its pid."""
    spec = services.ServiceSpec(
        name=name,
        argv=[sys.executable, "-c", "import time; time.sleep(600)"],
        health={"kind": "alive"},
        address="-",
    )
    services.ensure(state_dir, spec)
    return int(services.read_record(state_dir, name)["pid"])


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_watchdog_stops_the_services_once_unused_and_then_itself(tmp_path):
    state = str(tmp_path)
    try:
        pid = _stand_in(state)
        idle.ensure(state, idle_s=1, stop=["stand-in"])
        watchdog = int(services.read_record(state, idle.NAME)["pid"])
        assert _wait(lambda: not services.recorded(state), timeout=60), services.recorded(state)
        assert _wait(lambda: _gone(pid) and _gone(watchdog), timeout=30)
        with open(services.log_path(state, idle.NAME)) as f:
            assert "stopping stand-in" in f.read()
    finally:
        for name in services.recorded(state):
            services.stop(state, name)


def test_a_process_that_uses_the_services_keeps_them_up_while_it_lives(tmp_path):
    """A run's command marks its use before it looks for the services; until it ends, nothing is stopped."""
    state = str(tmp_path)
    user = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from sweepflow.infra.services import idle\n"
            f"idle.mark_used({state!r})\n"
            "print('marked', flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert user.stdout.readline().strip() == "marked"
        pid = _stand_in(state)
        idle.ensure(state, idle_s=1, stop=["stand-in"])
        time.sleep(5)  # five idle periods, checked every second
        assert services.running(state, "stand-in") and services.running(state, idle.NAME)
        user.kill()
        user.wait()
        assert _wait(lambda: _gone(pid) and not services.recorded(state), timeout=60), services.recorded(state)
        assert not os.listdir(os.path.join(state, "services", "users"))  # the ended user's mark is forgotten
    finally:
        if user.poll() is None:
            user.kill()
            user.wait()
        for name in services.recorded(state):
            services.stop(state, name)


def test_the_watchdog_ends_once_what_it_watches_was_stopped_by_other_means(tmp_path):
    state = str(tmp_path)
    try:
        _stand_in(state)
        idle.ensure(state, idle_s=30, stop=["stand-in"])  # checks every 3 s
        watchdog = int(services.read_record(state, idle.NAME)["pid"])
        services.stop(state, "stand-in")
        assert _wait(lambda: _gone(watchdog) and not services.recorded(state), timeout=60)
    finally:
        for name in services.recorded(state):
            services.stop(state, name)


def test_the_idle_period_setting():
    from sweepflow.flows.settings import DEFAULT_SERVICES_IDLE_MINUTES, Settings

    assert Settings.from_env({}).services_idle_minutes == DEFAULT_SERVICES_IDLE_MINUTES == 60
    assert Settings.from_env({"SWEEPFLOW_SERVICES_IDLE_MINUTES": "0"}).services_idle_minutes == 0
    assert Settings.from_env({"SWEEPFLOW_SERVICES_IDLE_MINUTES": "2.5"}).services_idle_minutes == 2.5
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ValueError, match=f"SWEEPFLOW_SERVICES_IDLE_MINUTES='{bad}' is not a number"):
            Settings.from_env({"SWEEPFLOW_SERVICES_IDLE_MINUTES": bad})


def test_the_local_prefect_servers_settings_are_prefects_own_and_valid(monkeypatch, tmp_path):
    """An unknown name would be ignored without a word (pydantic-settings reads only the names it knows), a
    value of the wrong form would stop the server at its start."""
    from prefect.settings import Settings

    from sweepflow.infra.services.local import (
        LOCAL_PREFECT_SERVER_SETTINGS,
        PREFECT_SERVER_SETTINGS,
        prefect_server_spec,
    )

    known = Settings().to_environment_variables(exclude_unset=False)
    assert not set(LOCAL_PREFECT_SERVER_SETTINGS) - set(known)
    assert not set(PREFECT_SERVER_SETTINGS) - set(known)
    for name, value in {**PREFECT_SERVER_SETTINGS, **LOCAL_PREFECT_SERVER_SETTINGS}.items():
        monkeypatch.setenv(name, value)
    assert Settings().server.services.late_runs.loop_seconds == 60
    recorder = Settings().server.services.task_run_recorder
    assert (recorder.batch_size, recorder.flush_interval) == (20, 1)  # batched, flushed every second
    assert Settings().server.events.proactive_granularity.total_seconds() == 60
    assert Settings().server.services.scheduler.enabled  # slowed, none turned off
    spec = prefect_server_spec(str(tmp_path), settings={})  # the stack's: Prefect's own intervals
    assert not set(LOCAL_PREFECT_SERVER_SETTINGS) & set(spec.env)
    assert spec.env.items() >= PREFECT_SERVER_SETTINGS.items()  # but the recorder's batching, as every server


def test_the_local_dask_config_names_dasks_own_settings():
    import dask
    import distributed  # noqa: F401 - loads the distributed.* defaults

    from sweepflow.infra.services.local import local_dask_config

    for key in local_dask_config():
        dask.config.get(key)  # KeyError for a name Dask does not have
