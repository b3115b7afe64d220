"""Background services kept under one state directory: start once, probe, reuse, stop, read their logs.

Used by ``sweepflow run`` (a local Prefect server, MLflow server and Dask cluster reused by every run) and by
``sweepflow stack`` (the full stack: Prefect server + worker, Dask scheduler + workers, MLflow, S3 gateway).

Each service is a process started in its own session (so it outlives the command that started it and can be
stopped as a group), logging to ``<state_dir>/logs/<name>.log``. Once its health probe passes, a record
``<state_dir>/services/<name>.json`` keeps its address, pid (and the pid's start time), log and probe, so any
later command can tell whether it is still up without knowing how it was started: up means the recorded process
is alive (the same process, not a reused pid) *and* its probe passes.

Stopping a service ends every process of it, including those that left its process group: each service
starts with a unique ``SWEEPFLOW_SERVICE_ID`` in its environment, which its descendants inherit (a Prefect
worker's flow-run processes start their own sessions; Dask workers and DataLoaders fork and spawn), so
``stop`` finds, besides the recorded process group and session and the recorded pid's descendants, every
process carrying that id, even one re-parented to init. (Only a process that both leaves the session and
replaces its whole environment, then outlives its parent, could escape; that needs a cgroup to catch.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil  # a dependency of distributed

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
LOOPBACK = "127.0.0.1"  # every service binds here unless its caller asks for another address
SERVICE_ID_ENV = "SWEEPFLOW_SERVICE_ID"  # inherited by all of a service's processes: see stop()
logger = logging.getLogger(__name__)


def free_port(host: str = LOOPBACK) -> int:
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


def dask_worker_registered(names_url: str, worker_name: str, timeout: float = 1.0) -> bool:
    """True when the scheduler lists a worker with this name (``names_url``: its
    ``sweepflow.infra.services.dask_worker_names`` route)."""
    try:
        with urllib.request.urlopen(names_url, timeout=timeout) as response:
            names = json.load(response).get("workers", [])
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return False
    return worker_name in names


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


def probe(health: Mapping[str, Any], timeout: float = 1.0) -> bool:
    kind = health["kind"]
    if kind == "http":
        return http_ok(health["url"], timeout)
    if kind == "tcp":
        return tcp_open(health["address"], timeout)
    if kind == "dask_worker":
        # "identity_url": a record written before the names route (its service is replaced on the next start)
        url = health.get("names_url") or health.get("identity_url", "")
        return dask_worker_registered(url, health["name"], timeout)
    if kind == "unix":
        return unix_socket_accepts(health["path"])
    if kind == "alive":  # a service that serves nothing (a watchdog): its process being alive is its health
        return True
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
    cwd: str | None = None  # None: the state directory (never the caller's: the service outlives it)
    health_from_address: Callable[[str], dict[str, Any]] | None = None  # for ready_file services
    # The code it runs (see code_fingerprint): a running service started with another key is replaced, so a
    # long-lived process never runs code older than the files on disk.
    code_key: str | None = None
    # Called right before the service's process starts (never while it runs): e.g. setting up its files.
    before_start: Callable[[], None] | None = None
    # Processes carrying this environment variable are work the service started (a Prefect worker's flow runs),
    # not the service: when the service died and is replaced they are left running, and the new record adopts
    # them, so that ``stop`` (``down``) still ends them.
    spare_env: str | None = None


PACKAGES = ("sweepflow.flows", "sweepflow.tasks", "sweepflow.infra.services", "ddp_runtime")


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


def _started_at(pid: int) -> float | None:
    """The process's start time (seconds since the epoch), None if there is no such live process."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except psutil.NoSuchProcess:
        return None


def process_start_time(pid: int) -> float | None:
    """What a record keeps as ``started`` for process ``pid`` (see ``alive``); None if it is not running."""
    return _started_at(pid)


def _same_process(started: float | None, recorded_start: float | None) -> bool:
    # create_time comes from the kernel's start time in clock ticks: equal for the same process, and a
    # reused pid starts later. Records without it (older versions) only check that the pid exists.
    return started is not None and (recorded_start is None or abs(started - recorded_start) < 0.05)


def alive(record: Mapping[str, Any]) -> bool:
    """Whether the record's process is still running (and is the process that was recorded)."""
    return _same_process(_started_at(int(record["pid"])), record.get("started"))


def describe(state_dir: str, name: str) -> tuple[str | None, str]:
    """(address, "up") for a live service; (None, why) otherwise: not started, its process gone, or alive
    but not answering its health check."""
    record = read_record(state_dir, name)
    if record is None:
        return None, "not started"
    if not alive(record):
        return None, f"DOWN (its process {record['pid']} is gone)"
    if not probe(record["health"]):
        return None, f"DOWN (process {record['pid']} does not answer its health check)"
    return record["address"], "up"


def previous_port(state_dir: str, name: str, host: str, *, url: str | None = None) -> int:
    """The port a service restarted now should listen on: the one its record holds, so that every client
    configured with its address (a running flow, the Dask workers, the Prefect worker, ``stack.env``) reaches
    it again without being restarted; a free one when there is no record, the record is for another host, or
    its port is taken by a process that is not the recorded service's (which ``ensure`` is about to stop).
    ``url``: the record's URL holding that port, when it is not the address (e.g. the health URL)."""
    record = read_record(state_dir, name)
    if record is not None:
        parts = urlsplit(url or _recorded_url(record))
        if parts.hostname == host.strip("[]") and parts.port:
            if _bindable(host, parts.port) or processes_of(
                int(record["pid"]), started=record.get("started"), service_id=record.get("service_id")
            ):
                return parts.port
    return free_port(host)


def recorded_health_url(state_dir: str, name: str) -> str | None:
    record = read_record(state_dir, name)
    return (record or {}).get("health", {}).get("url")


def _recorded_url(record: Mapping[str, Any]) -> str:
    address = str(record.get("address", ""))
    return address if "://" in address else f"tcp://{address}"


def _bindable(host: str, port: int) -> bool:
    """Whether a server could listen on ``port`` now. With SO_REUSEADDR, as the servers set it (gunicorn,
    uvicorn, tornado, Go's net): the connections a killed server leaves in TIME_WAIT do not hold its port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def running(state_dir: str, name: str) -> str | None:
    """The service's address if its record exists, its recorded process is alive and its probe passes;
    None for a service that is dead (process gone), hung (alive but not answering) or not recorded."""
    record = read_record(state_dir, name)
    if record is None or not alive(record):
        return None
    return record["address"] if probe(record["health"]) else None


#: A live service that missed its 1-s health check is asked again this many times, each with this long to
#: answer, before it counts as hung and is replaced: a Dask scheduler or a server busy with a sweep can take
#: seconds to answer, and replacing a Dask worker kills the trials on it (found by benchmarks/bench_chaos.py).
PATIENT_PROBES, PATIENT_TIMEOUT_S = 3, 5.0


def _answers_when_given_time(record: Mapping[str, Any] | None) -> str | None:
    """The recorded address, if the recorded process is alive and answers a patient health check."""
    if record is None or not alive(record):
        return None
    for attempt in range(PATIENT_PROBES):
        if probe(record["health"], timeout=PATIENT_TIMEOUT_S):
            return record["address"]
        time.sleep(1.0 if attempt < PATIENT_PROBES - 1 else 0.0)
    return None


def ensure(state_dir: str, spec: ServiceSpec) -> str:
    """Return the address of a healthy ``spec.name`` service, starting it in the background if needed."""
    record = read_record(state_dir, spec.name)
    if record and spec.code_key and record.get("code_key") != spec.code_key:
        logger.warning("restarting %s: its settings or code changed", spec.name)
        stop(state_dir, spec.name)  # it runs other code than what is on disk now
    address = running(state_dir, spec.name) or _answers_when_given_time(read_record(state_dir, spec.name))
    if address:
        return address
    adopted: list[dict[str, Any]] = []
    if read_record(state_dir, spec.name):
        logger.warning("restarting %s: %s", spec.name, describe(state_dir, spec.name)[1])
        # recorded but dead or unhealthy: do not leave a half-dead process behind (its work, see spare_env, lives on)
        adopted = replace_dead(state_dir, spec.name, spec.spare_env)
    os.makedirs(os.path.join(state_dir, "services"), mode=0o700, exist_ok=True)
    os.makedirs(os.path.join(state_dir, "logs"), mode=0o700, exist_ok=True)
    if spec.ready_file and os.path.exists(spec.ready_file):
        os.remove(spec.ready_file)
    if spec.before_start is not None:
        spec.before_start()
    log = log_path(state_dir, spec.name)
    service_id = uuid.uuid4().hex
    with open(log, "ab") as out:
        out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(spec.argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(spec.argv),
            env={**os.environ, **spec.env, SERVICE_ID_ENV: service_id},
            # Not the caller's directory: a service outlives the command that started it, and a working directory
            # deleted after it (a script's temporary one) would fail every later trial on its workers.
            cwd=spec.cwd or state_dir,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: outlives this command, stopped as a group
        )
    started = _started_at(proc.pid)
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
                        "started": started,
                        "service_id": service_id,
                        "log": log,
                        "health": health,
                        "argv": list(spec.argv),
                        "code_key": spec.code_key,
                        "adopted": adopted,
                    },
                    f,
                )
            return address
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    terminate(proc.pid, started=started, service_id=service_id)
    proc.wait()
    raise RuntimeError(
        f"the {spec.name} service did not become healthy within {START_TIMEOUT_S:.0f} s "
        f"(command: {' '.join(spec.argv)}). The end of its log ({log}):\n{tail(log)}"
    )


def _leader_is_ours(pid: int, started: float | None) -> bool:
    """Whether processes in process group / session ``pid`` belong to the recorded service. The kernel does
    not hand out a pid again while a group or session of that number has members, so with the leader gone its
    members are ours; with a live process of that pid, it must be the recorded one (not a reuse)."""
    current = _started_at(pid)
    return current is None or _same_process(current, started)


def processes_of(
    pid: int, *, started: float | None = None, service_id: str | None = None
) -> list[psutil.Process]:
    """Every live process of a service: its process group and session ``pid`` (it was started as their
    leader), the processes carrying its ``SWEEPFLOW_SERVICE_ID`` (wherever they were re-parented), and all
    their descendants. Never this process or its ancestors."""
    spared = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    group_is_ours = _leader_is_ours(pid, started)
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["environ", "status"]):  # environ: None where access is denied
        if process.pid in spared or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            in_group = group_is_ours and pid in (os.getpgid(process.pid), os.getsid(process.pid))
        except OSError:  # it exited meanwhile
            continue
        tagged = service_id is not None and (process.info["environ"] or {}).get(SERVICE_ID_ENV) == service_id
        if in_group or tagged:
            found[process.pid] = process
    for process in list(found.values()):
        try:
            found.update((child.pid, child) for child in process.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return [p for pid_, p in sorted(found.items()) if pid_ not in spared]


def _gone(process: psutil.Process) -> bool:
    try:
        gone = not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        gone = True
    if gone:  # reaped after it exited (before, a zombie could slip between the reap and the check and linger)
        try:  # our child (a service this process started): reap it so it does not linger as a zombie
            os.waitpid(process.pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child: its parent (or init) reaps it
    return gone


def _wait_gone(processes: Sequence[psutil.Process], timeout: float) -> None:
    """Wait until every process has exited (a zombie counts as exited) or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while not all(_gone(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_all(processes: Sequence[psutil.Process], signum: int) -> None:
    for process in processes:
        try:
            process.send_signal(signum)
        except psutil.NoSuchProcess:
            continue


def _spared(processes: Sequence[psutil.Process], spare_env: str | None) -> set[int]:
    """The pids among ``processes`` that carry ``spare_env``, with their descendants."""
    if spare_env is None:
        return set()
    spared: set[int] = set()
    for process in processes:
        try:
            if spare_env in process.environ():
                spared |= {process.pid, *(c.pid for c in process.children(recursive=True))}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return spared


def terminate(
    pid: int, *, started: float | None = None, service_id: str | None = None, spare_env: str | None = None
) -> list[psutil.Process]:
    """End every process of a service (see ``processes_of``): SIGTERM to its process group first (its
    own orderly shutdown: a Dask nanny closes its worker, a server its workers), then SIGTERM to whatever of
    it is left, wherever it went, and SIGKILL after ``STOP_TIMEOUT_S``; again until nothing of it is left.
    ``spare_env``: leave the processes carrying it (and theirs) running, and return them (never the group's
    SIGTERM then: it would reach them)."""
    spared = _spared(processes_of(pid, started=started, service_id=service_id), spare_env)
    if _leader_is_ours(pid, started) and not spared:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # the group is already gone; escaped processes are handled below
        _wait_gone(processes_of(pid, started=started), STOP_TIMEOUT_S)

    def rest() -> list[psutil.Process]:
        return [p for p in processes_of(pid, started=started, service_id=service_id) if p.pid not in spared]

    for signum in (signal.SIGTERM, signal.SIGKILL, signal.SIGKILL):
        left = rest()
        if not left:
            return [p for p in processes_of(pid, started=started, service_id=service_id) if p.pid in spared]
        _signal_all(left, signum)
        _wait_gone(left, STOP_TIMEOUT_S)
    left = rest()
    if left:
        raise RuntimeError(
            f"could not stop processes {[p.pid for p in left]} of a service (pid {pid}) even with SIGKILL; "
            "they are probably in uninterruptible I/O: check `ps -o pid,stat,cmd -p PID` and end them by hand"
        )


def stop(state_dir: str, name: str) -> bool:
    """Stop a recorded service, every process of it (see ``terminate``), and the work it adopted from an earlier
    process of it (see ``replace_dead``); False if there was no record."""
    record = read_record(state_dir, name)
    if record is None:
        return False
    terminate(int(record["pid"]), started=record.get("started"), service_id=record.get("service_id"))
    for earlier in record.get("adopted") or []:
        terminate(int(earlier["pid"]), started=earlier.get("started"), service_id=earlier.get("service_id"))
    os.remove(_record_path(state_dir, name))
    return True


def stop_side_by_side(state_dir: str, names: Sequence[str]) -> list[str]:
    """Stop these recorded services at once, a thread each: each stop waits for its own processes to end
    (a server's orderly shutdown: ~0.3-1.4 s each here), so together they take as long as the slowest, not the
    sum. Returns those that were recorded, in the order given. A stop that fails (``terminate``'s error) is
    raised once every stop has returned."""
    from concurrent.futures import ThreadPoolExecutor

    if len(names) < 2:
        return [name for name in names if stop(state_dir, name)]
    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="stop") as pool:
        stopped = list(pool.map(lambda name: stop(state_dir, name), names))
    return [name for name, was in zip(names, stopped, strict=True) if was]


def replace_dead(state_dir: str, name: str, spare_env: str | None) -> list[dict[str, Any]]:
    """Stop what is left of a recorded service that died or hangs, before it is started again. With
    ``spare_env`` (see ``ServiceSpec.spare_env``) its processes carrying that variable live on; returns what
    identifies them (the dead process's pid, start time and service id, and what it had adopted before), which
    the new record keeps so that ``stop`` ends them."""
    if spare_env is None:
        stop(state_dir, name)
        return []
    record = read_record(state_dir, name)
    if record is None:
        return []
    identity = {
        "pid": int(record["pid"]),
        "started": record.get("started"),
        "service_id": record.get("service_id"),
    }
    kept = terminate(
        identity["pid"], started=identity["started"], service_id=identity["service_id"], spare_env=spare_env
    )
    os.remove(_record_path(state_dir, name))
    return list(record.get("adopted") or []) + ([identity] if kept else [])


def forget(state_dir: str, name: str) -> None:
    """Remove a service's record without stopping anything: for a service that ends by itself."""
    try:
        os.remove(_record_path(state_dir, name))
    except FileNotFoundError:
        pass  # already forgotten


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
