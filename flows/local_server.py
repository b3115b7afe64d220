"""A local Prefect server that is started once and reused by later runs, like a local Dask scheduler.

Prefect's ephemeral mode starts a temporary server for every flow run (9-13 s here). Instead the CLI keeps one
server per state directory running in the background (state: ``<state_dir>/prefect/server.json``), checks its
health, and points ``PREFECT_API_URL`` at it, so every run is a real, recorded flow run visible in the UI.
``sweepflow server stop`` ends it.
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


def _state_file(state_dir: str) -> str:
    return os.path.join(state_dir, "prefect", "server.json")


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
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _healthy(api_url):
            with open(_state_file(state_dir), "w") as f:
                json.dump({"api_url": api_url, "pid": proc.pid, "log": log_path}, f)
            return api_url
        if proc.poll() is not None:
            break
        time.sleep(0.25)
    proc.kill()
    with open(log_path, errors="replace") as f:
        tail = f.read()[-3000:]
    raise RuntimeError(
        f"the local Prefect server did not become healthy at {api_url}; its log ({log_path}):\n{tail}"
    )


def stop_server(state_dir: str) -> bool:
    try:
        with open(_state_file(state_dir)) as f:
            info = json.load(f)
    except FileNotFoundError:
        return False
    try:
        os.killpg(info["pid"], signal.SIGTERM)
    except ProcessLookupError:
        pass
    os.remove(_state_file(state_dir))
    return True
