"""The stack with real processes: the deployments end to end as users run them, and its hygiene: `stop`/`down` leave no process of a service behind, whatever came before
(a crash, a SIGKILL, a second `up`, a deployment run whose processes left the service's session), `status`
tells a dead or hung service from a live one, `up`/`start` restart only the dead ones, and every service listens
on 127.0.0.1 only.

"No process behind" is checked independently of the supervisor's own bookkeeping: at start the tests snapshot
each service's process tree, process group and session (psutil), plus the pids that escaped processes report
themselves (a process that started its own session and whose parent exited, so init adopted it); after the
stop every one of those (pid + start time) must be gone, and no process anywhere may still carry a stopped
service's SWEEPFLOW_SERVICE_ID in /proc/<pid>/environ.

Three levels, cheapest first: the supervisor with small Python services (a second or two per case); the local
services of `sweepflow server start/stop` (one start for the module); the whole stack with two Dask workers
(one `up` for the module): first the pipeline's deployments end to end (S3 gateway, MLflow server proxying
artifacts to S3, Prefect server + process worker, 2-rank DDP trials), then `up` again, a killed worker, and a
deployment run whose processes left their session before `down`."""

from __future__ import annotations

import datetime
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from types import SimpleNamespace

import paths
import psutil
import pytest
from checkout_commands import run_from_checkout
from http_stub import serving

from sweepflow.infra.services import supervisor as services

ROOT = str(paths.ROOT)
BIN = os.path.dirname(sys.executable)
LOOPBACK = "127.0.0.1"

# A process that escapes its service's process group and session and is adopted by init: `escape PIDFILE` starts
# a child in a new session, which forks a grandchild and exits at once; the grandchild writes its pid and sleeps
# (ignoring SIGTERM with `--stubborn`, so only SIGKILL ends it). `serve PORT TRIGGER_DIR` is a service: it starts
# one escaped process and one plain child, answers HTTP on PORT, exits by itself when TRIGGER_DIR/crash appears
# and stops answering (but keeps running) when TRIGGER_DIR/hang appears.
HELPER = textwrap.dedent(
    """
    import http.server, os, signal, subprocess, sys, threading, time

    def escape(pidfile, stubborn=False):
        argv = [sys.executable, __file__, "grandchild", pidfile] + (["--stubborn"] if stubborn else [])
        subprocess.run(argv, start_new_session=True, check=True)

    def grandchild(pidfile, stubborn):
        if os.fork():
            os._exit(0)  # the parent exits: init adopts the grandchild
        if stubborn:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pidfile + ".tmp", pidfile)
        time.sleep(3600)

    def serve(port, trigger_dir):
        escape(os.path.join(trigger_dir, f"escaped-{os.getpid()}.pid"), stubborn=True)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        server = http.server.HTTPServer(("127.0.0.1", int(port)), http.server.SimpleHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        while True:
            if os.path.exists(os.path.join(trigger_dir, "crash")):
                sys.exit(3)  # a crash: exits by itself, its child and the escaped process stay
            if os.path.exists(os.path.join(trigger_dir, "hang")):
                server.shutdown()
                server.server_close()
            time.sleep(0.05)

    if __name__ == "__main__":
        if sys.argv[1] == "escape":
            escape(sys.argv[2], "--stubborn" in sys.argv)
        elif sys.argv[1] == "grandchild":
            grandchild(sys.argv[2], "--stubborn" in sys.argv)
        else:
            serve(sys.argv[2], sys.argv[3])
    """
)


# ------------------------------------------------------------------------------------------------ helpers


def _identity(process: psutil.Process) -> tuple[int, float] | None:
    try:
        return process.pid, process.create_time()
    except psutil.NoSuchProcess:
        return None


def _tree(pid: int) -> set[tuple[int, float]]:
    """The process, its descendants, and every process in its process group or session (pid, start time)."""
    found: set[tuple[int, float]] = set()
    for process in psutil.process_iter():
        try:
            if pid in (os.getpgid(process.pid), os.getsid(process.pid)):
                found.add(_identity(process))
        except OSError:
            continue
    try:
        root = psutil.Process(pid)
        found.update(_identity(p) for p in [root, *root.children(recursive=True)])
    except psutil.NoSuchProcess:
        pass
    return {i for i in found if i is not None}


def _escaped(directory: str) -> set[tuple[int, float]]:
    """The escaped processes that reported their pids in ``directory``."""
    found = set()
    for name in os.listdir(directory):
        if name.endswith(".pid"):
            with open(os.path.join(directory, name)) as f:
                try:
                    found.add(_identity(psutil.Process(int(f.read()))))
                except psutil.NoSuchProcess:
                    continue
    return {i for i in found if i is not None}


def _still_alive(identities: set[tuple[int, float]]) -> list[str]:
    alive = []
    for pid, started in identities:
        try:
            process = psutil.Process(pid)
            if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {' '.join(process.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            continue
    return alive


def _carrying(service_ids: set[str]) -> list[str]:
    """Processes whose /proc environ carries one of these SWEEPFLOW_SERVICE_IDs (read straight from /proc)."""
    wanted = {f"{services.SERVICE_ID_ENV}={sid}".encode() for sid in service_ids}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                variables = set(f.read().split(b"\0"))
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rpartition(")")[2].split()[0] == "Z"
        except OSError:
            continue
        if variables & wanted and not zombie:
            found.append(entry)
    return found


def _environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


def _record_pids(state: str) -> dict[str, int]:
    return {name: services.read_record(state, name)["pid"] for name in services.recorded(state)}


def _code_keys(state: str) -> dict[str, str | None]:
    return {name: services.read_record(state, name).get("code_key") for name in services.recorded(state)}


def _service_ids(state: str) -> set[str]:
    return {services.read_record(state, name)["service_id"] for name in services.recorded(state)}


def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket and bound UDP socket of these processes."""
    sockets = []
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        for c in connections:
            if c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr):  # SOCK_DGRAM
                sockets.append((pid, c.laddr.ip, c.laddr.port))
    return sockets


def _assert_only_loopback(identities: set[tuple[int, float]]) -> None:
    sockets = _listening({pid for pid, _ in identities})
    assert sockets, "the services listen nowhere: the check itself is broken"
    exposed = [s for s in sockets if s[1] != LOOPBACK]
    assert not exposed, f"sockets not on {LOOPBACK}: {exposed}"


def _wait_for(condition, timeout: float, what: str, every: float = 0.2):
    """Poll until ``condition()`` holds; ``timeout`` only bounds a failure (generous: a busy machine is slow)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# ------------------------------------------------------------------------------ the supervisor, small services


@pytest.fixture
def helper(tmp_path, monkeypatch):
    """A spec factory for the HELPER service, its state dir, and its trigger dir."""
    script = tmp_path / "helper.py"
    script.write_text(HELPER)
    triggers = tmp_path / "triggers"
    triggers.mkdir()
    state = str(tmp_path / "state")
    monkeypatch.setattr(services, "STOP_TIMEOUT_S", 2.0)  # the stubborn escaped process needs the SIGKILL

    def spec() -> services.ServiceSpec:
        port = services.free_port()
        return services.ServiceSpec(
            name="svc",
            argv=[sys.executable, str(script), "serve", str(port), str(triggers)],
            health={"kind": "http", "url": f"http://{LOOPBACK}:{port}/"},
            address=f"{LOOPBACK}:{port}",
        )

    ids: set[str] = set()
    yield spec, state, str(triggers), ids
    services.stop(state, "svc")  # whatever a failed test left
    assert not _carrying(ids), "a helper service's process outlived the test"


def _start(spec, state, triggers, ids) -> set[tuple[int, float]]:
    address = services.ensure(state, spec())
    record = services.read_record(state, "svc")
    ids.add(record["service_id"])
    # The escaped process reports itself; the plain child exists once the service answers.
    _wait_for(lambda: len(_escaped(triggers)) >= len(ids), 60, "the escaped process")
    assert services.running(state, "svc") == address
    return _tree(record["pid"]) | _escaped(triggers)


def test_a_crashed_service_shows_down_and_start_replaces_it_and_its_leftovers(helper):
    spec, state, triggers, ids = helper
    first = _start(spec, state, triggers, ids)
    assert len(first) >= 3  # the service, its child, the escaped grandchild
    open(os.path.join(triggers, "crash"), "w").close()
    pid = services.read_record(state, "svc")["pid"]
    _wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 60, "the crash")
    os.remove(os.path.join(triggers, "crash"))

    assert services.running(state, "svc") is None
    assert services.describe(state, "svc")[1].startswith("DOWN (its process")
    second = _start(spec, state, triggers, ids)  # `up` again: replaces the dead one ...
    assert not _still_alive(first), (
        "the crashed service's child and escaped process must go when it is replaced"
    )
    services.stop(state, "svc")  # ... and `stop` leaves nothing of either
    assert not _still_alive(second) and not _carrying(ids)


def test_a_service_killed_with_sigkill_shows_down_and_stop_leaves_nothing(helper):
    spec, state, triggers, ids = helper
    first = _start(spec, state, triggers, ids)
    os.kill(services.read_record(state, "svc")["pid"], signal.SIGKILL)
    # Its child and its escaped process still run, and the HTTP port is free: only the pid says it is dead.
    _wait_for(lambda: services.running(state, "svc") is None, 60, "status to see the SIGKILL")
    assert services.describe(state, "svc")[0] is None
    assert services.stop(state, "svc")
    assert not _still_alive(first) and not _carrying(ids)


def test_a_live_service_that_does_not_answer_is_down_and_start_restarts_it(helper):
    spec, state, triggers, ids = helper
    first = _start(spec, state, triggers, ids)
    open(os.path.join(triggers, "hang"), "w").close()
    _wait_for(lambda: services.running(state, "svc") is None, 60, "status to see the hang")
    assert "does not answer" in services.describe(state, "svc")[1]
    os.remove(os.path.join(triggers, "hang"))
    second = _start(spec, state, triggers, ids)
    assert not _still_alive(first)
    services.stop(state, "svc")
    assert not _still_alive(second) and not _carrying(ids)


def test_start_twice_reuses_the_live_service_and_starts_nothing_more(helper):
    spec, state, triggers, ids = helper
    first = _start(spec, state, triggers, ids)
    record = services.read_record(state, "svc")
    second = _start(spec, state, triggers, ids)
    assert services.read_record(state, "svc") == record
    assert second == first, "a second start must not start anything"
    services.stop(state, "svc")
    assert not _still_alive(first) and not _carrying(ids)


def test_stop_spares_a_process_that_reused_a_dead_services_pid_and_group(tmp_path):
    """A record whose pid now belongs to another process (pid reuse) must not get that process killed."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        state = str(tmp_path)
        os.makedirs(os.path.join(state, "services"))
        with open(os.path.join(state, "services", "gone.json"), "w") as f:
            json.dump({"pid": other.pid, "started": psutil.Process(other.pid).create_time() - 100,
                       "service_id": "not-this-one", "address": "x", "health": {"kind": "tcp",
                       "address": f"{LOOPBACK}:1"}}, f)  # fmt: skip
        assert services.describe(state, "gone")[1].startswith("DOWN (its process")
        assert services.stop(state, "gone")
        assert other.poll() is None, "stop killed a process that only reused the service's pid"
    finally:
        other.kill()
        other.wait()


# ----------------------------------------------------------------------- `sweepflow server start/stop`


def _sweepflow(*argv: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [os.path.join(BIN, "sweepflow"), *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


def _clean_env(tmp_path) -> dict[str, str]:
    prefixes = ("PREFECT_", "MLFLOW_", "DASK_", "AWS_", "SWEEPFLOW_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PREFECT_HOME"] = str(tmp_path / "client-prefect-home")
    env["SWEEPFLOW_HOME"] = str(tmp_path / "home")
    return env


class Seen:
    """Every process and service id a module's services ever had, for the final check."""

    def __init__(self, state: str):
        self.state = state
        self.processes: set[tuple[int, float]] = set()
        self.ids: set[str] = set()

    def snapshot(self) -> set[tuple[int, float]]:
        now = set()
        for pid in _record_pids(self.state).values():
            now |= _tree(pid)
        self.processes |= now
        self.ids |= _service_ids(self.state)
        return now

    def assert_all_gone(self, command: str) -> None:
        """After ``command`` stopped the services: none of their processes, and no process carrying their id."""
        self.snapshot()
        assert not _still_alive(self.processes) and not _carrying(self.ids), f"`{command}` left processes"



IMPORTS_PREFECT_FIRST = """
import sys
import prefect  # first, as a script or a library it imports may do: prefect reads its settings now
from prefect.settings import PREFECT_API_URL
from sweepflow.flows.settings import Settings
from sweepflow.flows.run_services import use_run_services

use_run_services(Settings.from_env(), sys.argv[1], tracking_uri="sqlite:///unused.db",
                 scheduler_address="tcp://127.0.0.1:9", use_gpu=False)
print(PREFECT_API_URL.value())
"""


@pytest.fixture(scope="module")
def local_services(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("server")
    state = str(tmp_path / "state")
    env = _clean_env(tmp_path)
    seen = Seen(state)
    try:
        started = _sweepflow("server", "start", "--state-dir", state, env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        seen.snapshot()
        yield state, env, seen
    finally:
        stopped = _sweepflow("server", "stop", "--state-dir", state, env=env, timeout=120)
        print(stopped.stdout, stopped.stderr)
    seen.assert_all_gone("sweepflow server stop")


@pytest.mark.subprocess
@pytest.mark.prefect
@pytest.mark.mlflow_server
@pytest.mark.dask
class TestServer:
    def test_every_listening_socket_of_the_local_services_is_on_loopback(self, local_services):
        state, _, seen = local_services
        _assert_only_loopback(seen.snapshot())

    def test_start_twice_starts_nothing_more(self, local_services):
        state, env, seen = local_services
        seen.snapshot()
        pids, keys = _record_pids(state), _code_keys(state)
        trees = {name: _tree(pid) for name, pid in pids.items()}
        again = _sweepflow("server", "start", "--state-dir", state, env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        # The Dask cluster is replaced when our source files changed in between (an edit while this runs):
        # that is the rule, so only services whose code key is unchanged must be the very same processes.
        same = [name for name, key in _code_keys(state).items() if key == keys[name]]
        assert {"prefect", "mlflow"} <= set(same)
        assert {n: _record_pids(state)[n] for n in same} == {n: pids[n] for n in same}
        assert {n: _tree(pids[n]) for n in same} == {n: trees[n] for n in same}
        seen.snapshot()

    def test_a_killed_service_shows_down_and_start_restarts_only_it(self, local_services):
        state, env, seen = local_services
        pids = _record_pids(state)
        killed = seen.snapshot() & _tree(pids["mlflow"])
        os.kill(pids["mlflow"], signal.SIGKILL)  # its gunicorn children keep the port and answer /health
        status = _sweepflow("server", "status", "--state-dir", state, env=env, timeout=60)
        assert status.returncode == 1
        assert f"mlflow: DOWN (its process {pids['mlflow']} is gone)" in status.stdout, status.stdout
        address = services.read_record(state, "mlflow")["address"]
        again = _sweepflow("server", "start", "--state-dir", state, env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        now = _record_pids(state)
        assert now["mlflow"] != pids["mlflow"]
        # at its address: a run that was using it (another terminal's) reaches it again
        assert services.read_record(state, "mlflow")["address"] == address
        assert {k: now[k] for k in ("prefect", "dask")} == {k: pids[k] for k in ("prefect", "dask")}
        assert not _still_alive(killed), "the killed MLflow server's children must go when it is replaced"
        seen.snapshot()

    def test_a_process_that_imported_prefect_first_uses_the_state_dirs_prefect_server(self, local_services):
        """Prefect reads its settings from the environment when it is imported: a script that imported it before
        sweepflow pointed it at the state dir's server must still send its flow runs there, not to a temporary
        server of its own."""
        state, env, seen = local_services
        out = subprocess.run(
            [sys.executable, "-c", IMPORTS_PREFECT_FIRST, state],
            env=env, cwd=state, capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.strip().splitlines()[-1] == services.running(state, "prefect"), out.stdout
        seen.snapshot()

    def test_the_servers_sqlite_databases_are_set_up_for_long_sweeps(self, local_services):
        """MLflow's database in write-ahead-log mode (cheaper commits); the Prefect server started through our
        entry point, which bounds its SQLite page cache (tests/repo/test_compat.py checks the bound itself)."""
        state, _, _ = local_services
        db = sqlite3.connect(os.path.join(state, "mlflow.db"))
        try:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            db.close()
        argv = psutil.Process(_record_pids(state)["prefect"]).cmdline()
        assert argv[1:3] == ["-m", "sweepflow.infra.services.prefect_server"], argv

    def test_a_new_prefect_server_has_its_block_types_without_registering_them_at_start_up(self, local_services):
        """The state dir's new database is a copy of the template, which holds the block types (registered once,
        when the template was made): the server ran with registration off, and lists them all the same."""
        import httpx

        state, _, _ = local_services
        api = services.read_record(state, "prefect")["address"]
        settings = httpx.get(f"{api}/admin/settings", timeout=30).json()
        assert settings["server"]["register_blocks_on_start"] is False, settings["server"]
        listed = httpx.post(f"{api}/block_types/filter", json={}, timeout=30).json()
        slugs = {block_type["slug"] for block_type in listed}
        assert {"secret", "local-file-system", "webhook"} <= slugs and len(slugs) >= 40, slugs

    def test_no_service_sends_mlflow_telemetry(self, local_services):
        """MLflow starts its telemetry client at import unless MLFLOW_DISABLE_TELEMETRY is set in the process:
        every process of the services (the MLflow server's, the Dask scheduler's and workers') has it, though
        the command was started without it."""
        state, env, _ = local_services
        assert "MLFLOW_DISABLE_TELEMETRY" not in env
        pids = _record_pids(state)
        processes = [psutil.Process(pids[name]) for name in ("mlflow", "dask")]
        processes += [child for p in processes for child in p.children(recursive=True)]
        assert len(processes) >= 4, processes  # with MLflow's gunicorn and the Dask workers
        unset = {
            p.pid: " ".join(p.cmdline())[:120]
            for p in processes
            if p.environ().get("MLFLOW_DISABLE_TELEMETRY") != "true"
        }
        assert not unset, unset

    def test_stop_leaves_no_process_behind(self, local_services):
        state, env, seen = local_services
        seen.snapshot()
        stopped = _sweepflow("server", "stop", "--state-dir", state, env=env, timeout=120)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        assert not _still_alive(seen.processes) and not _carrying(seen.ids)
        status = _sweepflow("server", "status", "--state-dir", state, env=env, timeout=60)
        assert status.returncode == 1 and "not started" in status.stdout


# ----------------------------------------------------------------------------------- the whole stack

FLOW = textwrap.dedent(
    """
    import subprocess, sys, time
    from prefect import flow

    @flow
    def hog(helper: str, pidfile: str):
        # A flow-run process (its own session, from the worker) that starts a process which escapes again.
        subprocess.run([sys.executable, helper, "escape", pidfile], check=True)
        time.sleep(600)
    """
)

DEPLOY = textwrap.dedent(
    """
    import sys
    from prefect import flow
    flow.from_source(source=sys.argv[1], entrypoint="hog.py:hog").deploy(
        name="hog", work_pool_name="sweepflow-process", build=False, push=False, print_next_steps=False
    )
    """
)


# ----------------------------------------------------------------------- the whole stack, as users run it

MODEL = "sweepflow-classifier"

# A good first run (fixed hyperparameters, 3 epochs, 2-rank DDP) and a worse second one (1 epoch, tiny lr).
GOOD = {"l1": 64, "l2": 64, "lr": 0.01, "batch_size": 32}
WORSE = {"l1": 4, "l2": 4, "lr": 0.0001, "batch_size": 64}


def _params(hparams: dict, *, epochs: int, num_samples: int, data: dict | None = None) -> str:
    space = {name: {"type": "choice", "values": [value]} for name, value in hparams.items()}
    config = {
        "sweep": {"search_space": space, "num_samples": num_samples},
        "training": {"epochs": epochs},
        "scheduler": {"type": "fifo"},
        "resources": {"ranks_per_trial": 2},
        **({"data": data} if data is not None else {}),
    }
    return json.dumps({"config": config})


MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


def _idx_gz(array) -> bytes:
    import gzip
    import struct

    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return gzip.compress(header + array.astype("uint8").tobytes(), mtime=0)


def _publish_export(directory, seed: int) -> None:
    """A data export in MNIST's format (IDX gz, the official file names) made of scikit-learn's 8x8 digits:
    learnable, and as quick to train on as the bundled default. ``seed`` picks the 300 test images, so each
    export has other bytes under the same names. Files are replaced atomically, as a publisher should."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.clip(digits.images * 16, 0, 255).astype(np.uint8)  # 0..16 -> 0..255, like MNIST's pixels
    order = np.random.default_rng(seed).permutation(len(images))
    test, train = order[:300], order[300:]
    arrays = (images[train], digits.target[train], images[test], digits.target[test])
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in zip(MNIST_FILES, arrays, strict=True):
        (directory / f".{name}.tmp").write_bytes(_idx_gz(array))
        os.replace(directory / f".{name}.tmp", directory / name)


def _export_handler(directory, requests: list[str]):
    """A quiet static-file handler for ``directory`` (Last-Modified and Content-Length, no ETag) that records
    every request as "GET /file" / "HEAD /file"."""
    import functools
    import http.server

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(f"GET {self.path}")
            super().do_GET()

        def do_HEAD(self) -> None:
            requests.append(f"HEAD {self.path}")
            super().do_HEAD()

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's signature
            """The request list is the log."""

    return functools.partial(Handler, directory=str(directory))


def _assert_on_postgres(pg, state: str, runs: list, flow_runs: list, experiment_id: str) -> None:
    """The stack's data is in PostgreSQL (``pg``: a tests/support/postgres_server.Postgres), and its password nowhere it
    must not be."""
    assert pg.count(
        "sweepflow_mlflow", "SELECT count(*) FROM runs WHERE experiment_id = %s", (int(experiment_id),)
    ) == len(runs)
    assert pg.count("sweepflow_mlflow", "SELECT count(*) FROM model_versions") == 2
    assert pg.count(
        "sweepflow_prefect",
        "SELECT count(*) FROM flow_run WHERE id = ANY(%s::uuid[])",
        ([str(r.id) for r in flow_runs],),
    ) == len(flow_runs) == 4  # the two pipeline runs, the missed slot's (cancelled) and the refused one
    sqlite = [p for p in ("mlflow.db", "prefect/prefect.db") if os.path.exists(os.path.join(state, p))]
    assert not sqlite, f"SQLite databases beside PostgreSQL: {sqlite}"

    from test_secrets import file_leaks, process_args_leaks

    password = [pg.password_token]  # in every encoding of the password
    assert not process_args_leaks(password)
    assert not file_leaks(state, password)
    shown = [v for r in runs for v in (*r.data.params.values(), *r.data.tags.values()) if password[0] in v]
    assert not shown, "the database password is in an MLflow param or tag"
    holders = {
        name
        for name in services.recorded(state)
        if password[0].encode() in _environ(services.read_record(state, name)["pid"])
    }
    assert holders == {"mlflow", "prefect-server"}, f"the database password is in the environment of {holders}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, request):
    """The stack, its Prefect server and MLflow on a real PostgreSQL server (the `postgres` fixture: the URL with
    its password reaches `stack up` through the environment); on SQLite with SWEEPFLOW_SKIP_POSTGRES_TESTS=1."""
    tmp_path = tmp_path_factory.mktemp("stack")
    state = str(tmp_path / "state")
    env = _clean_env(tmp_path)
    if os.environ.get("SWEEPFLOW_SKIP_POSTGRES_TESTS") != "1":
        env["SWEEPFLOW_STACK_DATABASE_URL"] = request.getfixturevalue("postgres").url
    seen = Seen(state)
    try:
        up = _sweepflow("stack", "up", "--state-dir", state, "--workers", "2", env=env, timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        seen.snapshot()
        from sweepflow.infra.services.stack import read_env

        yield state, env, {**env, **read_env(state)}, seen, tmp_path
    finally:
        down = _sweepflow("stack", "down", "--state-dir", state, env=env, timeout=300)
        print(down.stdout, down.stderr)
    seen.assert_all_gone("sweepflow stack down")


@pytest.fixture(scope="class")
def deployed(stack):
    """The stack the way users run it (each property is a test of TestStack below): `prefect deploy --all` and a
    first `prefect deployment run training-pipeline/default --watch` on a data export served over HTTP; then a new export at the same URLs and
    a schedule on `nightly-retrain` (a slot seconds ahead, the worse budget as its parameters): Prefect's
    scheduler creates the retrain, the stack's worker runs it, it downloads the new data, records its checksum,
    registers a challenger and leaves the champion alone. A run of a slot missed while the worker was down,
    arriving meanwhile, is cancelled (the deployment's concurrency limit); then a run with bad parameters. The
    tests check it through the MLflow client, Prefect's client and the S3 endpoint."""
    state, _, env, seen, tmp_path = stack
    api = env["PREFECT_API_URL"]
    run_from_checkout([os.path.join(BIN, "prefect"), "--no-prompt", "deploy", "--all"], env, 300)

    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.actions import DeploymentScheduleCreate, DeploymentUpdate
    from prefect.client.schemas.filters import DeploymentFilter, FlowRunFilter
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.states import Scheduled

    def runs_of(client, deployment) -> list:
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id={"any_": [deployment.id]}),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        )

    with SyncPrefectClient(api) as prefect_client:
        nightly = prefect_client.read_deployment_by_name("training-pipeline/nightly-retrain")
        assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
        assert nightly.schedules[0].active is False  # a real schedule, inactive until resumed
        assert nightly.global_concurrency_limit is not None and nightly.global_concurrency_limit.limit == 1
        assert nightly.concurrency_options.collision_strategy == ConcurrencyLimitStrategy.CANCEL_NEW
        default = prefect_client.read_deployment_by_name("training-pipeline/default")
        assert default.work_pool_name == "sweepflow-process"

    export = tmp_path / "export"
    _publish_export(export, seed=0)
    requests: list[str] = []

    def downloads(since: int = 0) -> list[str]:
        return sorted(r for r in requests[since:] if r.startswith("GET"))

    prefect = os.path.join(BIN, "prefect")
    run = [prefect, "deployment", "run", "training-pipeline/default", "--watch", "--params"]
    with serving(_export_handler(export, requests)) as url:
        data = {"name": "mnist", "source": f"{url}/", "follow_source": True}
        first = run_from_checkout([*run, _params(GOOD, epochs=3, num_samples=2, data=data)], env, 900)
        assert "Completed" in first.stdout
        first_downloads = downloads()

        # ---- The retrain: a new export at the same URLs, then a schedule whose first slot is seconds ahead.
        _publish_export(export, seed=1)
        seen_requests = len(requests)
        worse = json.loads(_params(WORSE, epochs=1, num_samples=1, data=data))
        slot = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=15)).replace(microsecond=0)
        with SyncPrefectClient(api) as prefect_client:
            [schedule] = prefect_client.create_deployment_schedules(
                nightly.id,
                [
                    DeploymentScheduleCreate(
                        # Every 2 minutes: should the scheduler miss the first slot, the next one is close.
                        schedule=IntervalSchedule(interval=datetime.timedelta(minutes=2), anchor_date=slot),
                        active=True,
                        parameters=worse,
                        slug="stack-test-retrain",
                    )
                ],
            )
            # Updating the deployment brings the scheduler's 5-s loop over recently updated deployments to it,
            # instead of its 60-s loop over all of them (Prefect's default intervals, which the stack keeps).
            prefect_client.update_deployment(nightly.id, DeploymentUpdate(description=nightly.description))
            scheduled_at = time.monotonic()

            def started():
                runs = [r for r in runs_of(prefect_client, nightly) if r.auto_scheduled]
                return next((r for r in runs if r.state_type.value not in ("SCHEDULED", "PENDING")), None)

            try:
                retrain = _wait_for(started, 400, "the scheduled retrain to start", every=1.0)
                # Its later slots are not wanted here: pausing deletes them (the started run is not touched).
                prefect_client.update_deployment_schedule(nightly.id, schedule.id, active=False)
                # The run of a slot missed while the worker was down (due a day ago) comes in while the retrain
                # runs: the deployment's concurrency limit (1, CANCEL_NEW) cancels it before it starts anything.
                missed = prefect_client.create_flow_run_from_deployment(
                    nightly.id,
                    parameters=worse,
                    state=Scheduled(
                        scheduled_time=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
                    ),
                )
                missed = _wait_for(
                    lambda: (r := prefect_client.read_flow_run(missed.id)).state_type.value != "SCHEDULED" and r,
                    120,
                    "the missed slot's run to be picked up",
                    every=1.0,
                )
                assert prefect_client.read_flow_run(retrain.id).state_type.value == "RUNNING"
                retrain = _wait_for(
                    lambda: (r := prefect_client.read_flow_run(retrain.id)).state.is_final() and r,
                    900,
                    "the scheduled retrain to end",
                    every=2.0,
                )
            finally:
                prefect_client.update_deployment_schedule(nightly.id, schedule.id, active=False)
            missed = prefect_client.read_flow_run(missed.id)
            nightly_runs = runs_of(prefect_client, nightly)
        retrain_downloads = downloads(seen_requests)

    def seconds(later, earlier) -> float:
        return (later - earlier).total_seconds()

    print(
        f"scheduled retrain: created by the scheduler {seconds(retrain.created, schedule.created):.1f} s after "
        f"the schedule, slot {retrain.expected_start_time}, started "
        f"{seconds(retrain.start_time, retrain.expected_start_time):.1f} s after it, ran "
        f"{retrain.total_run_time.total_seconds():.1f} s, ended {time.monotonic() - scheduled_at:.0f} s after "
        "the schedule was made"
    )

    # What Prefect recorded of the two pipeline runs, read before the refused run below adds one of its own.
    with SyncPrefectClient(api) as prefect_client:
        [first_run] = runs_of(prefect_client, default)
        task_runs = [
            prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [r.id]}))
            for r in (first_run, retrain)
        ]
        missed_task_runs = prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [missed.id]}))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("sweepflow")
    mlflow_runs = len(client.search_runs([experiment.experiment_id]))

    # A deployment run with bad parameters (its assertions: test_a_deployment_run_with_bad_parameters_...).
    bad = json.dumps({"config": {"training": {"model": "resnet50"}, "mlflow": {"registered_model_name": MODEL}}})
    refused = subprocess.run([*run, bad], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    from prefect.client.schemas.filters import LogFilter

    with SyncPrefectClient(api) as prefect_client:
        default_runs = prefect_client.read_flow_runs(
            deployment_filter=DeploymentFilter(id={"any_": [default.id]}), sort=FlowRunSort.START_TIME_ASC
        )
        failed = default_runs[-1]
        failed_task_runs = prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [failed.id]}))
        failed_logs = prefect_client.read_logs(log_filter=LogFilter(flow_run_id={"any_": [failed.id]}))
    seen.snapshot()
    return SimpleNamespace(
        state=state, env=env, tmp_path=tmp_path, slot=slot, schedule=schedule, worse=worse, retrain=retrain,
        missed=missed, nightly_runs=nightly_runs, first_run=first_run, task_runs=task_runs,
        missed_task_runs=missed_task_runs, first_downloads=first_downloads, retrain_downloads=retrain_downloads,
        client=client, experiment=experiment, mlflow_runs=mlflow_runs, refused=refused, default_runs=default_runs,
        failed=failed, failed_task_runs=failed_task_runs, failed_logs=failed_logs,
    )


@pytest.mark.subprocess
@pytest.mark.stack
@pytest.mark.prefect
@pytest.mark.mlflow_server
@pytest.mark.dask
@pytest.mark.s3
class TestStack:
    def test_every_listening_socket_of_the_stack_is_on_loopback(self, stack):
        state, _, _, seen, _ = stack
        names = set(_record_pids(state))
        assert {
            "s3",
            "mlflow",
            "prefect-server",
            "prefect-worker",
            "dask-scheduler",
            "dask-worker-0",
        } <= names
        _assert_only_loopback(seen.snapshot())

    def test_a_scheduled_retrain_is_created_by_its_schedule_and_run_by_the_stacks_worker_on_new_data(self, deployed):
        """`prefect deployment run` downloaded the export; the schedule's slot created the retrain, with the
        schedule's parameters, and the stack's worker ran it on the new export at the same URLs."""
        d = deployed
        retrain, schedule, slot = d.retrain, d.schedule, d.slot
        assert d.first_downloads == sorted(f"GET /{name}" for name in MNIST_FILES)
        assert retrain.state_type.value == "COMPLETED", retrain.state
        assert retrain.auto_scheduled is True
        assert retrain.created_by is not None and retrain.created_by.type == "SCHEDULE"
        assert retrain.created_by.id == schedule.id
        assert retrain.parameters == d.worse
        assert retrain.work_pool_name == "sweepflow-process"
        assert (retrain.expected_start_time - slot).total_seconds() % 120 == 0  # one of the schedule's slots
        assert d.retrain_downloads == sorted(f"GET /{name}" for name in MNIST_FILES), "the new export"

    def test_a_missed_slot_arriving_during_the_retrain_is_cancelled_by_the_concurrency_limit(self, deployed):
        """The deployment's concurrency limit (1, CANCEL_NEW) cancels it before it starts anything."""
        d = deployed
        retrain, missed, nightly_runs = d.retrain, d.missed, d.nightly_runs
        # The missed slot's run never started, and the schedule left nothing else behind.
        assert missed.state_type.value == "CANCELLED", missed.state
        assert "concurrency limit" in (missed.state.message or ""), missed.state.message
        # (Prefect stamps a start time on any run entering a final state; it never ran: no run count, no run time)
        assert missed.run_count == 0 and missed.total_run_time.total_seconds() == 0
        assert {r.id for r in nightly_runs} == {retrain.id, missed.id}
        assert d.missed_task_runs == []

    def test_prefect_records_both_pipeline_runs_with_a_task_run_per_trial_and_the_data_prepared_again(self, deployed):
        """Both pipeline runs COMPLETED, one task run per trial, both prepared the data they were given."""
        d = deployed
        first_run, task_runs = d.first_run, d.task_runs
        assert first_run.state_type.value == "COMPLETED"
        trials = [sorted(t.name for t in runs if t.name.startswith("trial_")) for runs in task_runs]
        assert [len(t) for t in trials] == [2, 1]
        assert trials[0][0].startswith("trial_0000-")  # named after the trial and its key params
        data_states = [
            [t.state_name for t in runs if t.name.startswith("download-dataset")] for runs in task_runs
        ]
        assert data_states == [["Completed"], ["Completed"]], "new data at the same URLs must be prepared again"
    def test_mlflow_keeps_the_champion_on_the_better_model_and_each_version_names_its_data(self, deployed):
        """Parent and child runs, statuses, params and metrics; the champion stays on the better model."""
        d = deployed
        client, experiment, flow_runs = d.client, d.experiment, [d.first_run, d.retrain]
        runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        assert len(parents) == 2 and all(p.info.status == "FINISHED" for p in parents)
        assert [sum(c.data.tags["mlflow.parentRunId"] == p.info.run_id for c in children) for p in parents] == [
            2,
            1,
        ]
        assert all(c.info.status == "FINISHED" for c in children)
        assert {c.data.params["lr"] for c in children} == {"0.01", "0.0001"}
        flow_run_ids = {p.data.tags["prefect.flow_run_id"] for p in parents}
        assert flow_run_ids == {str(r.id) for r in flow_runs}

        versions = sorted(client.search_model_versions(f"name='{MODEL}'"), key=lambda v: int(v.version))
        assert [v.version for v in versions] == ["1", "2"]
        assert client.get_model_version_by_alias(MODEL, "champion").version == "1"
        assert client.get_model_version_by_alias(MODEL, "challenger").version == "2"
        first_acc, second_acc = (p.data.metrics["test_accuracy"] for p in parents)
        assert first_acc >= 0.85 and second_acc < first_acc
        # Each run and the version it registered name the data they trained on: the two exports differ.
        checksums = [p.data.tags["sweepflow.data_checksum"] for p in parents]
        assert len(set(checksums)) == 2 and all(len(c) == 64 for c in checksums)
        assert [v.tags["sweepflow.data_checksum"] for v in versions] == checksums
    def test_s3_holds_the_datasets_every_trials_checkpoints_and_the_registered_model(self, deployed):
        """The dataset objects, every trial's checkpoints under its run's artifact location, the model."""
        d = deployed
        env, client, experiment = d.env, d.client, d.experiment
        children = [
            r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" in r.data.tags
        ]
        import s3fs

        fs = s3fs.S3FileSystem(
            key=env["AWS_ACCESS_KEY_ID"],
            secret=env["AWS_SECRET_ACCESS_KEY"],
            client_kwargs={"endpoint_url": env["AWS_ENDPOINT_URL_S3"]},
        )
        prepared = fs.glob("sweepflow/datasets/prepared/mnist-*/meta.json")
        assert len(prepared) == 2, fs.find("sweepflow/datasets")  # one per export
        raw = fs.glob("sweepflow/datasets/raw/mnist/v-*/*")  # each file under the version it was fetched at
        assert len(raw) == 2 * len(MNIST_FILES), raw
        for child in children:
            assert child.info.artifact_uri.startswith("mlflow-artifacts:")  # proxied by the server ...
            prefix = f"sweepflow/mlflow/{experiment.experiment_id}/{child.info.run_id}/artifacts/checkpoints"
            markers = [p for p in fs.find(prefix) if p.endswith(".sweepflow_checkpoint.json")]
            assert markers, f"no committed checkpoint on S3 under {prefix}"  # ... but written there directly
            listed = [a.path for a in client.list_artifacts(child.info.run_id, "checkpoints")]
            assert listed, "the checkpoints are visible as the run's artifacts"
        champion = client.get_model_version_by_alias(MODEL, "champion")
        model_id = champion.source.removeprefix("models:/")
        assert fs.glob(f"sweepflow/mlflow/{experiment.experiment_id}/models/{model_id}/artifacts/MLmodel")
    def test_a_fresh_process_that_only_knows_the_tracking_uri_runs_the_champion(self, deployed):
        """models:/<name>@champion loads and predicts in a new interpreter."""
        env, tmp_path = deployed.env, deployed.tmp_path
        script = (
            "import mlflow, numpy as np\n"
            f"model = mlflow.pyfunc.load_model('models:/{MODEL}@champion')\n"
            "print(np.asarray(model.predict(np.zeros((3, 1, 8, 8), dtype=np.float32))).shape)\n"
        )
        fresh_env = {**_clean_env(tmp_path / "fresh"), "MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]}
        loaded = run_from_checkout([sys.executable, "-c", script], fresh_env, 300)
        assert loaded.stdout.strip().endswith("(3, 10)")
    def test_a_deployment_run_with_bad_parameters_fails_at_its_first_step_and_starts_nothing(self, deployed):
        """It fails, says why in its state and its log, and creates no task run and no MLflow run."""
        d = deployed
        assert d.refused.returncode != 0, d.refused.stdout[-3000:]
        assert d.failed.state_type.value == "FAILED"
        assert "unknown model 'resnet50'" in d.failed.state.message, d.failed.state.message
        assert d.failed_task_runs == []
        assert any("unknown model 'resnet50'" in log.message for log in d.failed_logs)
        assert len(d.client.search_runs([d.experiment.experiment_id])) == d.mlflow_runs, (
            "the refused run created MLflow runs"
        )

    def test_the_stacks_s3_secret_is_on_no_command_line_and_in_no_file_but_the_two_that_keep_it(self, deployed):
        """See tests/flows/test_secrets.py: while everything is up, `ps` shows no secret, and only stack.env and
        s3-credentials (mode 0600) hold it."""
        state, env = deployed.state, deployed.env
        # (`ps` shows them to every user) and in no file of the stack's state but the two that keep it (mode 0600).
        from test_secrets import file_leaks, process_args_leaks

        secret = [env["AWS_SECRET_ACCESS_KEY"]]
        assert not process_args_leaks(secret)
        kept = {os.path.join(state, "stack.env"), os.path.join(state, "s3-credentials")}
        assert not file_leaks(state, secret, skip=kept)
    def test_postgres_holds_the_runs_registry_and_flow_runs_and_its_password_is_nowhere_it_must_not_be(self, deployed, request):
        """No SQLite file beside it; its password on no command line, in no file of the state, in no MLflow param or
        tag, and in no service's environment but the two servers'."""
        d = deployed
        if "SWEEPFLOW_STACK_DATABASE_URL" not in d.env:
            pytest.skip("the stack runs on SQLite here (SWEEPFLOW_SKIP_POSTGRES_TESTS=1)")
        runs = d.client.search_runs([d.experiment.experiment_id])
        pg = request.getfixturevalue("postgres")
        _assert_on_postgres(pg, d.state, runs, [*d.default_runs, *d.nightly_runs], d.experiment.experiment_id)

    def test_an_init_project_deploys_from_its_directory_and_registers_its_own_model(self, stack):
        """A team's project the way docs/own-project.md says: `sweepflow init`, then from its directory `prefect deploy --all`
        and `prefect deployment run '<package>-pipeline/default' --watch` against the stack. The stack's worker
        runs the project's flow.py from that directory (the pull step), the Dask workers import the project's
        package from it; the run trains, evaluates with the project's evaluate_fn and registers its model, which
        predicts prices in a fresh process."""
        _, _, env, seen, tmp_path = stack
        project = tmp_path / "teamproj"
        init = _sweepflow("init", str(project), env=env, timeout=120)
        assert init.returncode == 0, init.stdout + init.stderr
        deploy = subprocess.run(
            [os.path.join(BIN, "prefect"), "--no-prompt", "deploy", "--all"],
            cwd=project, env=env, capture_output=True, text=True, timeout=300,
        )
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        name = f"teamproj-{os.urandom(3).hex()}"
        overrides = [
            "sweep.num_samples=2", "training.epochs=4", "scheduler.max_t=4", "resources.ranks_per_trial=2",
            f"mlflow.registered_model_name={name}",
        ]
        run = subprocess.run(
            [os.path.join(BIN, "prefect"), "deployment", "run", "teamproj-pipeline/default", "--watch",
             "--params", json.dumps({"overrides": overrides})],
            cwd=project, env=env, capture_output=True, text=True, timeout=900,
        )
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        assert "Completed" in run.stdout, run.stdout[-3000:]

        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        version = client.get_model_version_by_alias(name, "champion")
        trial = client.get_run(version.run_id)
        assert set(trial.data.metrics) >= {"test_rmse", "test_mae", "test_r2"}, trial.data.metrics
        parent = client.get_run(trial.data.tags["mlflow.parentRunId"])
        assert parent.data.params["training.train_fn"] == "teamproj.model:train_fn"
        assert parent.data.params["evaluation.evaluate_fn"] == "teamproj.model:evaluate_fn"
        script = (
            "import mlflow, numpy as np, pandas as pd\n"
            f"table = pd.read_csv({str(project / 'data' / 'houses.csv')!r})\n"
            "x = table[['sqft', 'rooms', 'age', 'distance_km']].to_numpy(np.float32)[:4]\n"
            f"print(np.asarray(mlflow.pyfunc.load_model('models:/{name}@champion').predict(x)).shape)\n"
        )
        fresh_env = {**_clean_env(tmp_path / "fresh-teamproj"), "MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3"):
            if key in env:  # the model's files are behind the MLflow server or on the stack's S3
                fresh_env[key] = env[key]
        loaded = subprocess.run(
            [sys.executable, "-c", script], cwd=tmp_path, env=fresh_env, capture_output=True, text=True, timeout=300
        )
        assert loaded.returncode == 0 and loaded.stdout.strip().endswith("(4,)"), loaded.stdout + loaded.stderr
        seen.snapshot()

    def test_up_twice_starts_nothing_more(self, stack):
        state, env, _, seen, _ = stack
        before, pids = seen.snapshot(), _record_pids(state)
        again = _sweepflow("stack", "up", "--state-dir", state, "--workers", "2", env=env, timeout=600)
        assert again.returncode == 0, again.stdout + again.stderr
        assert _record_pids(state) == pids
        new = seen.snapshot() - before
        if new:
            time.sleep(5)  # a service's short-lived helper (a subprocess it ran and waited for) is gone by now
        assert not _still_alive(new), f"`stack up` a second time started: {_still_alive(new)}"


    def test_a_killed_worker_shows_down_and_up_restarts_only_it(self, stack):
        state, env, _, seen, _ = stack
        pids = _record_pids(state)
        killed = seen.snapshot() & _tree(pids["dask-worker-0"])
        os.kill(pids["dask-worker-0"], signal.SIGKILL)  # the nanny; its worker process is left behind
        status = _sweepflow("stack", "status", "--state-dir", state, env=env, timeout=60)
        assert status.returncode == 1
        worker_line = next(line for line in status.stdout.splitlines() if line.startswith("dask-worker-0"))
        assert "DOWN" in worker_line, status.stdout
        again = _sweepflow("stack", "up", "--state-dir", state, "--workers", "2", env=env, timeout=600)
        assert again.returncode == 0, again.stdout + again.stderr
        now = _record_pids(state)
        assert now["dask-worker-0"] != pids["dask-worker-0"]
        assert {k: v for k, v in now.items() if k != "dask-worker-0"} == {
            k: v for k, v in pids.items() if k != "dask-worker-0"
        }
        assert not _still_alive(killed), "the killed worker's processes must go when it is replaced"
        seen.snapshot()

    def test_servers_that_died_come_back_at_their_addresses_and_their_clients_stay(self, stack):
        """A crash of the MLflow and Prefect servers (every process of each, SIGKILL), then `stack up`: both come
        back on the ports they had, so the clients holding their addresses (Dask workers, the Prefect worker, a
        running flow, stack.env) reach them again; none of those is restarted."""
        state, env, stack_env, seen, _ = stack
        pids = _record_pids(state)
        addresses = {name: services.read_record(state, name)["address"] for name in ("mlflow", "prefect-server")}
        for name in addresses:
            os.killpg(pids[name], signal.SIGKILL)
        _wait_for(lambda: not any(services.running(state, n) for n in addresses), 60, "the servers down")
        again = _sweepflow("stack", "up", "--state-dir", state, "--workers", "2", env=env, timeout=600)
        assert again.returncode == 0, again.stdout + again.stderr
        now = _record_pids(state)
        assert all(now[name] != pids[name] for name in addresses)
        assert {name: services.read_record(state, name)["address"] for name in addresses} == addresses
        assert {k: v for k, v in now.items() if k not in addresses} == {
            k: v for k, v in pids.items() if k not in addresses
        }
        assert (stack_env["MLFLOW_TRACKING_URI"], stack_env["PREFECT_API_URL"]) == (
            addresses["mlflow"],
            addresses["prefect-server"],
        )
        with urllib.request.urlopen(addresses["prefect-server"] + "/health", timeout=30) as answer:
            assert answer.status == 200
        seen.snapshot()

    def test_down_after_a_deployment_run_leaves_no_process_behind(self, stack):
        state, env, stack_env, seen, tmp_path = stack
        (tmp_path / "flow").mkdir()
        (tmp_path / "flow" / "hog.py").write_text(FLOW)
        helper = tmp_path / "helper.py"
        helper.write_text(HELPER)
        escaped = tmp_path / "escaped"
        escaped.mkdir()
        deploy = subprocess.run(
            [sys.executable, "-c", DEPLOY, str(tmp_path / "flow")],
            env=stack_env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        params = json.dumps({"helper": str(helper), "pidfile": str(escaped / "flow.pid")})
        run = subprocess.run(
            [os.path.join(BIN, "prefect"), "deployment", "run", "hog/hog", "--params", params],
            env=stack_env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        # A Dask task that leaves a process behind the same way (DataLoader workers, torch subprocesses).
        from distributed import Client

        with Client(stack_env["DASK_SCHEDULER_ADDRESS"], timeout=60) as client:
            argv = [sys.executable, str(helper), "escape", str(escaped / "dask.pid")]
            assert client.submit(subprocess.call, argv, pure=False).result(timeout=60) == 0
        _wait_for(lambda: len(_escaped(str(escaped))) == 2, 240, "the flow run's escaped process")

        flow_runs = [  # this stack's flow runs (other tests may run flows of their own stacks meanwhile)
            p
            for p in psutil.process_iter(["cmdline", "environ"])
            if "prefect.engine" in " ".join(p.info["cmdline"] or [])
            and (p.info["environ"] or {}).get("PREFECT_API_URL") == stack_env["PREFECT_API_URL"]
        ]
        worker = psutil.Process(_record_pids(state)["prefect-worker"])
        assert any(os.getsid(p.pid) != worker.pid for p in flow_runs), (
            "expected a flow run in its own session"
        )
        seen.snapshot()
        seen.processes |= {i for p in flow_runs if (i := _identity(p))} | _escaped(str(escaped))

        down = _sweepflow("stack", "down", "--state-dir", state, env=env, timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not _still_alive(seen.processes), "`stack down` left processes"
        assert not _carrying(seen.ids)
        status = _sweepflow("stack", "status", "--state-dir", state, env=env, timeout=60)
        assert "no stack services recorded" in status.stdout

    def test_up_on_an_unreachable_or_refusing_database_says_so_in_one_sentence_and_starts_nothing(
        self, tmp_path, request
    ):
        if os.environ.get("SWEEPFLOW_SKIP_POSTGRES_TESTS") == "1":
            pytest.skip("SWEEPFLOW_SKIP_POSTGRES_TESTS=1")
        import dataclasses

        from conftest import free_port

        pg = request.getfixturevalue("postgres")
        nowhere = dataclasses.replace(pg, port=free_port())  # nothing listens there
        wrong = dataclasses.replace(pg, password=pg.password + "-wrong")
        for i, (server, says) in enumerate([(wrong, "password authentication failed"), (nowhere, "refused")]):
            state = str(tmp_path / f"state-{i}")
            env = {**_clean_env(tmp_path), "SWEEPFLOW_STACK_DATABASE_URL": server.url}
            refused = _sweepflow("stack", "up", "--state-dir", state, env=env, timeout=120)
            assert refused.returncode == 2, refused.stdout + refused.stderr
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1, refused.stderr  # one sentence, no traceback
            assert lines[0].startswith(
                f"sweepflow stack: cannot connect to the stack's PostgreSQL postgresql://sweepflow@127.0.0.1:{server.port}/"
            ), lines[0]
            assert says in lines[0] and "SWEEPFLOW_STACK_DATABASE_URL" in lines[0], lines[0]
            assert pg.password_token not in refused.stdout + refused.stderr
            assert services.recorded(state) == [], "a service started before the database was checked"
