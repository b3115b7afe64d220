"""Local services that stop themselves after an idle period: a watchdog beside them, per state directory.

Tuned as they are (``LOCAL_PREFECT_SERVER_SETTINGS``, ``local_dask_config()`` in ``sweepflow.infra.services.local``),
``sweepflow run``'s background services still cost more than 1 CPU-second a minute while nothing runs: the
Prefect server alone polls its in-memory task queue 4 times a second (Prefect does not expose that interval),
the Dask workers heartbeat twice a second (set by the scheduler), and the uvicorn behind the Prefect server wakes
10 times a second. Only a service that is not running costs nothing. So, with an idle period set
(``SWEEPFLOW_SERVICES_IDLE_MINUTES``), a small process that sleeps between checks stops the state dir's local
services once nothing has used them for that long, and then itself; the next ``sweepflow run`` (or ``sweepflow
server start``) starts them again, as it does after ``sweepflow server stop``.

Used means: a process that called ``mark_used`` is still alive (a ``sweepflow run``'s command, for as long as
its run goes on; a Python process using ``sweepflow.tune``; ``sweepflow server start`` until the services are
up), or one ended within the idle period. A run that starts while the watchdog stops the services cannot
lose them half-way: ``mark_used`` and the watchdog's check-and-stop take the same lock, so either the run is
seen (nothing is stopped) or the services are stopped before the run looks for them (it starts them again).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence

from sweepflow.infra.services import supervisor as services

NAME = "idle-stop"


def _users_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "services", "users")


@contextlib.contextmanager
def _locked(state_dir: str, operation: int) -> Iterator[None]:
    os.makedirs(_users_dir(state_dir), mode=0o700, exist_ok=True)
    with open(os.path.join(state_dir, "services", "idle.lock"), "a") as lock:
        fcntl.flock(lock, operation)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def mark_used(state_dir: str) -> None:
    """Record that this process uses the state dir's local services, before it looks for them: they stay up
    while it lives (a run's command until the run ends; ``sweepflow server start`` until they are up), and
    the idle period starts when it ends."""
    with _locked(state_dir, fcntl.LOCK_SH):
        pid = os.getpid()
        path = os.path.join(_users_dir(state_dir), f"{pid}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"pid": pid, "started": services.process_start_time(pid)}, f)
        os.replace(path + ".tmp", path)


def last_used(state_dir: str, now: float) -> float:
    """When the services were last used, as far as the marks tell: ``now`` while a marked process lives, else
    the latest mark's time (the watchdog keeps the last time it saw one alive). Forgets the marks of processes
    that ended."""
    latest = 0.0
    try:
        names = os.listdir(_users_dir(state_dir))
    except FileNotFoundError:
        return latest
    for name in names:
        path = os.path.join(_users_dir(state_dir), name)
        try:
            with open(path) as f:
                record = json.load(f)
            marked = os.stat(path).st_mtime
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # being replaced, or gone
        if services.alive(record):
            return now
        latest = max(latest, marked)
        os.remove(path)  # that process ended
    return latest


def watch(state_dir: str, *, idle_s: float, stop: Sequence[str], ready_file: str) -> None:
    """Foreground body of the watchdog: check every so often (a tenth of the period, at most a minute); once
    nothing used the services for ``idle_s`` seconds, stop the services named in ``stop``, then exit. Exits
    too when none of them is recorded any more (stopped by other means) while no user is alive."""
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    active = time.time()  # it was started by a use
    with open(ready_file + ".tmp", "w") as f:
        f.write(f"stops {', '.join(stop)} after {idle_s:g} s unused")
    os.replace(ready_file + ".tmp", ready_file)
    every = min(60.0, max(1.0, idle_s / 10))
    while not done.wait(every):
        with _locked(state_dir, fcntl.LOCK_EX):
            now = time.time()
            used = last_used(state_dir, now)
            active = max(active, used)
            if used < now and not any(services.read_record(state_dir, name) for name in stop):
                # Stopped by hand (and not being started by a user): nothing left to watch.
                print(
                    f"{time.strftime('%H:%M:%S')} none of {', '.join(stop)} is running: exiting", flush=True
                )
                services.forget(state_dir, NAME)
                return
            if now - active < idle_s:
                continue
            when = time.strftime("%H:%M:%S")
            print(f"{when} unused for {now - active:.0f} s: stopping {', '.join(stop)}", flush=True)
            for name in stop:
                try:
                    services.stop(state_dir, name)
                except RuntimeError as exc:  # survived SIGKILL: said, and the others still stop
                    print(f"could not stop {name}: {exc}", flush=True)
            services.forget(state_dir, NAME)
            return


def watchdog_spec(state_dir: str, *, idle_s: float, stop: Sequence[str]) -> services.ServiceSpec:
    ready = os.path.join(state_dir, "services", f"{NAME}.ready")
    argv = [sys.executable, "-m", "sweepflow.infra.services.idle", "--state-dir", state_dir, "--ready-file", ready]
    argv += ["--idle-seconds", f"{idle_s:g}", *[f"--stop={name}" for name in stop]]
    return services.ServiceSpec(
        name=NAME,
        argv=argv,
        health={},
        ready_file=ready,
        health_from_address=lambda _: {"kind": "alive"},
        code_key=services.code_fingerprint(extra=[f"{idle_s:g}", *stop]),  # another period: replaced
    )


def ensure(state_dir: str, *, idle_s: float, stop: Sequence[str]) -> str:
    """The state dir's watchdog for this idle period, started (or replaced, for another period) if needed."""
    return services.ensure(state_dir, watchdog_spec(state_dir, idle_s=idle_s, stop=stop))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="stop a state dir's local services once unused (foreground)")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--idle-seconds", type=float, required=True)
    parser.add_argument("--stop", action="append", default=[], help="a service to stop once idle")
    args = parser.parse_args()
    watch(args.state_dir, idle_s=args.idle_seconds, stop=args.stop, ready_file=args.ready_file)
