"""Background services kept under one state directory: start once, probe, reuse, stop, read their logs.

Used by ``sweepflow run`` (a local Prefect server, MLflow server and Dask cluster reused by every run) and by
``sweepflow stack`` (the full stack: Prefect server + worker, Dask scheduler + workers, MLflow, S3 gateway).

Each service is a process started in its own session (so it outlives the command that started it and can be
stopped as a group), logging to ``<state_dir>/logs/<name>.log``. Once its health probe passes, a record
``<state_dir>/services/<name>.json`` keeps its address, pid, log and probe, so any later command can tell
whether it is still up without knowing how it was started.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweepflow.tasks.compat import dask_identity_has_worker

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------------- probes
# A probe is plain data (stored in the service's record) so that any process can re-check a service.


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def tcp_open(address: str, timeout: float = 1.0) -> bool:
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def dask_worker_registered(identity_url: str, worker_name: str) -> bool:
    """True when the scheduler's ``/json/identity.json`` lists a worker with this name."""
    try:
        with urllib.request.urlopen(identity_url, timeout=1.0) as response:
            identity = json.load(response)
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return dask_identity_has_worker(identity, worker_name)


def unix_socket_accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def file_contents(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def probe(health: Mapping[str, Any]) -> bool:
    kind = health["kind"]
    if kind == "http":
        return http_ok(health["url"])
    if kind == "tcp":
        return tcp_open(health["address"])
    if kind == "dask_worker":
        return dask_worker_registered(health["identity_url"], health["name"])
    if kind == "unix":
        return unix_socket_accepts(health["path"])
    raise ValueError(f"unknown probe kind {kind!r} in a service record; delete the record and start again")


# ------------------------------------------------------------------------------------------------- services


@dataclass(frozen=True)
class ServiceSpec:
    """How to start one service and how to tell that it is up."""

    name: str
    argv: Sequence[str]
    health: Mapping[str, Any]  # see probe(); for "ready_file" services, checked after the file appears
    address: str | None = None  # what clients use; None: read from ``ready_file`` once written
    ready_file: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    health_from_address: Callable[[str], dict[str, Any]] | None = None  # for ready_file services
    # The code it runs (see code_fingerprint): a running service started with another key is replaced, so a
    # long-lived process never runs code older than the files on disk.
    code_key: str | None = None


PACKAGES = ("sweepflow.flows", "sweepflow.tasks", "sweepflow.services", "ddp_runtime")


def package_dirs() -> list[str]:
    """Where our packages' source files are (the checkout's folders in an editable install)."""
    dirs = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        dirs.extend(spec.submodule_search_locations or [] if spec is not None else [])
    return dirs


def code_fingerprint(*, extra_files: Sequence[str] = (), extra: Sequence[str] = ()) -> str:
    """A short key for the interpreter, our packages' source files (path, mtime, size), ``extra_files`` (e.g.
    a user's training module) and ``extra`` strings: it changes whenever any of them does."""
    h = hashlib.sha256(sys.executable.encode())
    files = [
        os.path.join(directory, name)
        for root in package_dirs()
        for directory, _, names in sorted(os.walk(root))
        for name in sorted(names)
        if name.endswith(".py")
    ]
    for path in [*files, *extra_files]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            h.update(f"{path}:missing".encode())
            continue
        h.update(f"{path}:{st.st_mtime_ns}:{st.st_size}".encode())
    for item in extra:
        h.update(item.encode())
    return h.hexdigest()[:16]


def _record_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, "services", f"{name}.json")


def log_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, "logs", f"{name}.log")


def read_record(state_dir: str, name: str) -> dict[str, Any] | None:
    try:
        with open(_record_path(state_dir, name)) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def running(state_dir: str, name: str) -> str | None:
    """The service's address if its record exists and its probe passes."""
    record = read_record(state_dir, name)
    if record is None:
        return None
    return record["address"] if probe(record["health"]) else None


def ensure(state_dir: str, spec: ServiceSpec) -> str:
    """Return the address of a healthy ``spec.name`` service, starting it in the background if needed."""
    record = read_record(state_dir, spec.name)
    if record and spec.code_key and record.get("code_key") != spec.code_key:
        stop(state_dir, spec.name)  # it runs other code than what is on disk now
    address = running(state_dir, spec.name)
    if address:
        return address
    if read_record(state_dir, spec.name):
        stop(state_dir, spec.name)  # recorded but unhealthy: do not leave a half-dead process behind
    os.makedirs(os.path.join(state_dir, "services"), exist_ok=True)
    os.makedirs(os.path.join(state_dir, "logs"), exist_ok=True)
    if spec.ready_file and os.path.exists(spec.ready_file):
        os.remove(spec.ready_file)
    log = log_path(state_dir, spec.name)
    with open(log, "ab") as out:
        out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(spec.argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(spec.argv),
            env={**os.environ, **spec.env},
            cwd=spec.cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: outlives this command, stopped as a group
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        address, health = spec.address, dict(spec.health)
        if spec.ready_file:
            address = file_contents(spec.ready_file)
            if address and spec.health_from_address:
                health = spec.health_from_address(address)
        if address and probe(health):
            with open(_record_path(state_dir, spec.name), "w") as f:
                json.dump(
                    {
                        "address": address,
                        "pid": proc.pid,
                        "log": log,
                        "health": health,
                        "argv": list(spec.argv),
                        "code_key": spec.code_key,
                    },
                    f,
                )
            return address
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    _terminate_group(proc.pid)
    raise RuntimeError(
        f"the {spec.name} service did not become healthy within {START_TIMEOUT_S:.0f} s "
        f"(command: {' '.join(spec.argv)}). The end of its log ({log}):\n{tail(log)}"
    )


def _terminate_group(pid: int) -> None:
    """SIGTERM the process group, wait, then SIGKILL what is left."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        try:  # reap it if it is our child, so it does not linger as a zombie
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child: its own parent (init) reaps it
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def stop(state_dir: str, name: str) -> bool:
    """Stop a recorded service (its whole process group); False if there was no record."""
    record = read_record(state_dir, name)
    if record is None:
        return False
    _terminate_group(int(record["pid"]))
    os.remove(_record_path(state_dir, name))
    return True


def recorded(state_dir: str) -> list[str]:
    try:
        names = os.listdir(os.path.join(state_dir, "services"))
    except FileNotFoundError:
        return []
    return sorted(n.removesuffix(".json") for n in names if n.endswith(".json"))


def tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except FileNotFoundError:
        return "(no log)"
