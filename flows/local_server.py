"""Local services started once and reused by later runs: a Prefect server and a Dask cluster.

Prefect's ephemeral mode starts a temporary server for every flow run (9-13 s here), and a fresh Dask cluster
costs its workers' torch imports on every run. Instead the CLI keeps one Prefect server and one Dask
LocalCluster per state directory running in the background (state files under ``<state_dir>/services/``),
checks their health, and points the run at them, so every run is still a real, recorded Prefect flow run on a
real Dask cluster. ``sweepflow server stop`` ends both. Both listen on free ports on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

START_TIMEOUT_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(api_url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _state_file(state_dir: str, name: str = "prefect") -> str:
    return os.path.join(state_dir, "services", f"{name}.json")


def server_env(state_dir: str) -> dict[str, str]:
    home = os.path.join(state_dir, "prefect")
    return {
        "PREFECT_HOME": home,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    }


def running_server(state_dir: str) -> str | None:
    """The API URL of this state dir's server if it is up."""
    try:
        with open(_state_file(state_dir)) as f:
            info = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info["api_url"] if _healthy(info["api_url"]) else None


def ensure_server(state_dir: str, *, host: str = "127.0.0.1", port: int | None = None) -> str:
    """Return the API URL of a healthy local server, starting one in the background if needed."""
    url = running_server(state_dir)
    if url:
        return url
    home = os.path.join(state_dir, "prefect")
    os.makedirs(home, exist_ok=True)
    os.makedirs(os.path.dirname(_state_file(state_dir)), exist_ok=True)
    port = port or _free_port()
    api_url = f"http://{host}:{port}/api"
    log_path = os.path.join(home, "server.log")
    prefect_exe = os.path.join(os.path.dirname(sys.executable), "prefect")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [prefect_exe, "server", "start", "--host", host, "--port", str(port)],
            env={**os.environ, **server_env(state_dir)},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this command: later runs reuse it
        )
    return _await_service(
        proc, state_dir, "prefect", log_path, lambda: api_url if _healthy(api_url) else None, key="api_url"
    )


def _await_service(
    proc: subprocess.Popen[bytes], state_dir: str, name: str, log_path: str, probe: Any, *, key: str
) -> str:
    """Wait until ``probe()`` returns the service's address, record it for later runs, and return it; on
    failure kill the process and raise with its log's tail."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        value = probe()
        if value:
            with open(_state_file(state_dir, name), "w") as f:
                json.dump({key: value, "pid": proc.pid, "log": log_path}, f)
            return value
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    with open(log_path, errors="replace") as f:
        tail = f.read()[-3000:]
    raise RuntimeError(f"the local {name} service did not start; its log ({log_path}):\n{tail}")


def _stop(state_dir: str, name: str) -> bool:
    try:
        with open(_state_file(state_dir, name)) as f:
            info = json.load(f)
    except FileNotFoundError:
        return False
    try:
        os.killpg(info["pid"], signal.SIGTERM)
    except ProcessLookupError:
        pass  # already gone: only the state file is left to remove
    os.remove(_state_file(state_dir, name))
    return True


def stop_server(state_dir: str) -> bool:
    """Stop this state dir's Prefect server and Dask cluster; True if either was recorded."""
    dask_stopped = _stop(state_dir, "dask")
    return _stop(state_dir, "prefect") or dask_stopped


# ------------------------------------------------------------------------------------------ local Dask cluster


def _scheduler_up(address: str) -> bool:
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def running_dask(state_dir: str) -> str | None:
    try:
        with open(_state_file(state_dir, "dask")) as f:
            info = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info["address"] if _scheduler_up(info["address"]) else None


def ensure_dask(state_dir: str, *, n_workers: int | None = None) -> str:
    """The scheduler address of this state dir's background LocalCluster, starting it if needed."""
    address = running_dask(state_dir)
    if address:
        return address
    services = os.path.dirname(_state_file(state_dir, "dask"))
    os.makedirs(services, exist_ok=True)
    log_path = os.path.join(services, "dask.log")
    ready = os.path.join(services, "dask.ready")
    if os.path.exists(ready):
        os.remove(ready)
    cmd = [sys.executable, "-m", "flows.local_server", "dask", "--ready-file", ready]
    if n_workers:
        cmd += ["--n-workers", str(n_workers)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def read_address() -> str | None:
        if not os.path.exists(ready):
            return None
        with open(ready) as f:
            return f.read().strip()

    return _await_service(proc, state_dir, "dask", log_path, read_address, key="address")


def _serve_dask(ready_file: str, n_workers: int | None) -> None:
    """Foreground body of the background Dask process: run a LocalCluster until SIGTERM."""
    import threading

    from ddp_runtime.cluster import local_cluster

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with local_cluster(n_workers=n_workers) as client:
        with open(ready_file + ".tmp", "w") as f:
            f.write(client.scheduler.address)
        os.replace(ready_file + ".tmp", ready_file)
        stop.wait()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="run a local Dask cluster for sweepflow in the foreground")
    parser.add_argument("service", choices=["dask"])
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--n-workers", type=int, default=None)
    args = parser.parse_args()
    _serve_dask(args.ready_file, args.n_workers)
