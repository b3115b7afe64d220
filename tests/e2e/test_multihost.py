"""DDP across hosts (issue 23, items 1 and 4): a 2-rank trial whose ranks sit on two hosts of a Dask cluster
started with Dask's own commands, one of those hosts lost mid-trial.

The hosts are network namespaces this test makes and removes (root needed): a bridge in a namespace of its
own, every host joined to it by a veth pair, the root namespace too (where the test and `sweepflow run` run), in
a private /24 (10.213.N.0/24) that nothing on the machine routes. Traffic goes to loopback and to these
namespaces only: they have no other route. Hosts share the machine's filesystem (only the network is separate),
which the training function uses to tell the test where each rank ran.

    sched      `dask scheduler`
    worker-a   `dask worker --nworkers 2 --nthreads 1 ...`  (two worker processes)
    worker-b   the same
    storage    moto's S3 server (checkpoints, dataset cache, MLflow's artifacts) and `mlflow server`

The same cluster then runs a `prefect deployment run` of the repository's prefect.yaml through a `prefect worker`
whose environment names the cluster (item 4). The unit tests at the top check how a rank picks the interface
gloo/NCCL use (``ddp_runtime._network``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import paths
import psutil
import pytest
from checkout_commands import run_from_checkout
from netns_hosts import Hosts

from ddp_runtime import _network

TESTS_DIR = os.pathsep.join([str(paths.SUPPORT), os.path.dirname(os.path.abspath(__file__))])  # helpers, this module
BIN = os.path.dirname(sys.executable)

# ------------------------------------------------------------------------------------- the interface choice


def test_the_interface_is_the_one_holding_the_workers_address():
    assert _network.interface_holding("127.0.0.1") == "lo"
    assert _network.interface_holding("localhost") == "lo"  # a name: resolved first
    # TEST-NET-2, a documentation address: held by no interface
    assert _network.interface_holding("198.51.100.254") is None
    some_nic = {
        name: a.address
        for name, addresses in psutil.net_if_addrs().items()
        for a in addresses
        if a.family.name == "AF_INET" and not a.address.startswith("127.")
    }
    for name, address in some_nic.items():
        assert _network.interface_holding(address) == name


def test_gloo_and_nccl_get_that_interface_unless_the_user_chose_one(caplog):
    assert _network.socket_interface_env("gloo", "127.0.0.1", {}) == {"GLOO_SOCKET_IFNAME": "lo"}
    # NCCL reads a bare name as a prefix ("eth1" also matches "eth10"); "=" makes it that interface only.
    assert _network.socket_interface_env("nccl", "127.0.0.1", {}) == {"NCCL_SOCKET_IFNAME": "=lo"}
    assert _network.socket_interface_env("cpu:gloo,cuda:nccl", "127.0.0.1", {}) == {
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "=lo",
    }
    # A user's setting (a faster fabric than the Dask network, say) stays.
    assert _network.socket_interface_env("gloo", "127.0.0.1", {"GLOO_SOCKET_IFNAME": "ib0"}) == {}
    assert _network.socket_interface_env("nccl", "127.0.0.1", {"GLOO_SOCKET_IFNAME": "ib0"}) == {
        "NCCL_SOCKET_IFNAME": "=lo"
    }
    with caplog.at_level(logging.WARNING, logger="ddp_runtime._network"):
        assert _network.socket_interface_env("gloo", "198.51.100.254", {}) == {}
    assert "no network interface of this host holds its Dask worker's address 198.51.100.254" in caplog.text
    assert "set GLOO_SOCKET_IFNAME for the Dask workers" in caplog.text


# ------------------------------------------------------------------------------ a cluster that is not ours

# A `dask scheduler --preload` that makes its process behave as if sweepflow were not installed there.
NOT_INSTALLED = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ddp_runtime", "sweepflow"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
"""


@pytest.mark.dask
@pytest.mark.subprocess
def test_a_scheduler_without_sweepflow_is_refused_before_any_work_saying_what_to_install(tmp_path):
    """The gang scheduler runs inside the Dask scheduler (``run_on_scheduler``): a scheduler started from an
    environment without sweepflow cannot place a trial. The pre-flight says so in one sentence, instead of the
    traceback of the scheduler's failed unpickling."""
    from sweepflow.flows.config import PipelineConfig
    from sweepflow.flows.preflight import PreflightError, check_pipeline
    from sweepflow.flows.settings import resolve_settings

    preload = tmp_path / "not_installed.py"
    preload.write_text(NOT_INSTALLED)
    scheduler_file = tmp_path / "scheduler.json"
    argv = [os.path.join(BIN, "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
    argv += ["--scheduler-file", str(scheduler_file), "--preload", str(preload)]
    with open(tmp_path / "scheduler.log", "wb") as log:
        scheduler = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        address = _wait_for(lambda: _scheduler_address(scheduler_file), 120, "the scheduler", alive=scheduler)
        cfg = PipelineConfig.model_validate(
            {
                "state_dir": str(tmp_path / "state"),
                "dask": {"scheduler_address": address},
                "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
            }
        )
        with pytest.raises(PreflightError) as refused:
            check_pipeline(resolve_settings(cfg), imports=False)
        message = str(refused.value)
        assert message.startswith(
            f"dask.scheduler_address='{address}': the Dask scheduler there cannot import"
        )
        assert "No module named 'ddp_runtime'" in message
        assert (
            "install sweepflow (the same version as on the workers and here) where `dask scheduler` runs"
            in message
        )
    finally:
        os.killpg(scheduler.pid, signal.SIGKILL)
        scheduler.wait()


# ------------------------------------------------------------------------------------------------ the hosts

HOSTS = ("sched", "worker-a", "worker-b", "storage")


# ------------------------------------------------------------------------------------------- the scenario

HOLD_AT = 2  # the group holds after this epoch's checkpoint until the test has taken a host away
EPOCHS = 4
BUCKET = "sweepflow-multihost"


def _scheduler_address(scheduler_file) -> str | None:
    """The address in a scheduler file, once the scheduler has written it whole (it exists empty first)."""
    try:
        return json.loads(scheduler_file.read_text())["address"]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait_for(condition, timeout: float, what: str, *, alive: subprocess.Popen | None = None):
    """Poll ``condition()`` until it holds; ``timeout`` only bounds a failure. Fails at once when ``alive``,
    a process the condition depends on, has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            raise AssertionError(
                f"{' '.join(map(str, alive.args[:6]))} exited ({alive.returncode}) while waiting for {what}"
            )
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _http_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answers
    except OSError:
        return False


def _clean_env(tmp_path) -> dict[str, str]:
    """This process's environment without any service setting: each command gets exactly its own."""
    prefixes = ("PREFECT_", "MLFLOW_", "DASK_", "AWS_", "SWEEPFLOW_", "GLOO_", "NCCL_", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["HOME"] = str(tmp_path / "home")
    return env


class _Output:
    """A process's output lines with the time each arrived (its own log lines have no common clock)."""

    def __init__(self, proc: subprocess.Popen, path: str) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc, path), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen, path: str) -> None:
        with open(path, "w") as log:
            for line in proc.stdout:
                self.lines.append((time.time(), line))
                log.write(line)
                log.flush()

    def first(self, text: str) -> float | None:
        return next((t for t, line in self.lines if text in line), None)

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(line for _, line in self.lines)


def _records(record_dir: str) -> list[dict]:
    found = []
    for name in os.listdir(record_dir):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(record_dir, name)) as f:
                found.append(json.load(f))
    return sorted(found, key=lambda r: (r["resumed"], r["rank"]))


def _host_of(address: str) -> str:
    from distributed.comm import get_address_host

    return get_address_host(address)


def _stop_worker(worker: subprocess.Popen) -> None:
    """Prefect's worker (ours to stop: the test started it in its own session): SIGTERM, then, if it has not
    ended within 60 s (a loaded machine), SIGKILL to its whole session (it may have a flow-run child)."""
    if worker.poll() is not None:
        return
    worker.terminate()
    try:
        worker.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)


class LostHost:
    """What the scenario left, read while its hosts were up: each test below checks one property of it."""


@pytest.fixture(scope="module")
def lost_host(request, tmp_path_factory) -> LostHost:
    """`sweepflow run` against the namespace cluster (DASK_SCHEDULER_ADDRESS), 2 ranks per trial, max_failures=1,
    S3 storage: the ranks train on two hosts over the veth addresses; after epoch 2 (checkpoint on the S3 host)
    rank 0's host loses every process; the trial resumes from that checkpoint on the other host's two workers,
    the sweep finishes, and every epoch is recorded once in MLflow. Then the same cluster runs a deployment of
    the repository's prefect.yaml through a `prefect worker`."""
    tmp_path = tmp_path_factory.mktemp("multihost")
    seen = LostHost()
    if os.environ.get("SWEEPFLOW_SKIP_NETNS_TESTS") == "1":
        pytest.skip("SWEEPFLOW_SKIP_NETNS_TESTS=1")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail(
            "this test builds its hosts with `ip netns` and veth pairs: run it as root with iproute2 installed, "
            "or set SWEEPFLOW_SKIP_NETNS_TESTS=1 to skip it"
        )
    from distributed import Client, Event
    from mlflow_server import _mlflow_command, sqlite_store
    from prefect.settings import PREFECT_API_URL

    t_start = time.monotonic()
    logs = tmp_path / "logs"
    logs.mkdir()
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    base_env = _clean_env(tmp_path)
    os.makedirs(base_env["HOME"])
    prefix = f"s3://{BUCKET}/sweepflow"  # the run's storage; MLflow's artifacts under <storage>/mlflow
    with Hosts(HOSTS) as net, contextlib.ExitStack() as stack:
        a = net.addresses
        s3_url = f"http://{a['storage']}:{net.free_port('storage')}"
        s3_env = {
            "AWS_ENDPOINT_URL_S3": s3_url,
            "MLFLOW_S3_ENDPOINT_URL": s3_url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        # ---- the services, all started at once (the workers wait for the scheduler's file).
        moto = net.spawn(
            "storage",
            [os.path.join(BIN, "moto_server"), "-H", a["storage"], "-p", s3_url.rsplit(":", 1)[1]],
            base_env,
            str(logs / "s3.log"),
        )
        scheduler_file = str(tmp_path / "scheduler.json")
        scheduler = net.spawn(
            "sched",
            [os.path.join(BIN, "dask"), "scheduler", "--host", a["sched"], "--port", "0", "--no-dashboard",
             "--scheduler-file", scheduler_file],
            {**base_env, "PYTHONPATH": TESTS_DIR},  # the test's own tasks (multihost_fns.occupy) unpickle there
            str(logs / "scheduler.log"),
        )  # fmt: skip
        # What docs/deploying.md says a cluster's workers need, and the S3 settings a trial's rank 0 writes checkpoints with.
        worker_env = {
            **base_env,
            **s3_env,
            "DASK_DISTRIBUTED__WORKER__DAEMON": "False",  # DataLoader worker processes inside Dask workers
            "PYTHONPATH": TESTS_DIR,  # the user's training code (multihost_fns), importable on the workers
        }
        for host in ("worker-a", "worker-b"):
            net.spawn(
                host,
                [os.path.join(BIN, "dask"), "worker", "--scheduler-file", scheduler_file, "--name", host,
                 "--nworkers", "2", "--nthreads", "1", "--resources", "CPU=1",
                 "--preload", "ddp_runtime._preload", "--no-dashboard",
                 "--local-directory", str(tmp_path / f"{host}-space")],
                worker_env,
                str(logs / f"{host}.log"),
            )  # fmt: skip
        mlflow_state = tmp_path / "mlflow"
        tracking_uri = f"http://{a['storage']}:{net.free_port('storage')}"
        mlflow_proc = net.spawn(
            "storage",
            [*_mlflow_command(), "server", "--backend-store-uri", sqlite_store(mlflow_state),
             "--host", a["storage"], "--port", tracking_uri.rsplit(":", 1)[1], "--workers", "1",
             "--app-name", "sweepflow", "--serve-artifacts", "--artifacts-destination", f"{prefix}/mlflow"],
            {**base_env, **s3_env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            str(logs / "mlflow.log"),
        )  # fmt: skip

        # The session's Prefect API (the flow runs in the root namespace): it starts while the hosts' processes do.
        request.getfixturevalue("prefect_harness")
        _wait_for(lambda: _http_up(s3_url), 120, "the S3 server", alive=moto)
        import s3fs

        s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": s3_url}).mkdir(
            BUCKET
        )
        scheduler_address = _wait_for(
            lambda: _scheduler_address(pathlib.Path(scheduler_file)), 120, "the scheduler", alive=scheduler
        )
        assert scheduler_address.startswith(f"tcp://{a['sched']}:")
        client = stack.enter_context(Client(scheduler_address, timeout=60))
        client.wait_for_workers(4, timeout=240)
        by_host: dict[str, list[str]] = {}
        for address in sorted(client.scheduler_info(n_workers=-1)["workers"]):
            by_host.setdefault(_host_of(address), []).append(address)
        assert sorted(by_host) == sorted([a["worker-a"], a["worker-b"]]) and all(
            len(w) == 2 for w in by_host.values()
        ), by_host
        _wait_for(lambda: _http_up(f"{tracking_uri}/health"), 120, "the MLflow server", alive=mlflow_proc)
        t_cluster = time.monotonic()

        # ---- one worker per host runs another user's task: the gang scheduler, which keeps a group on as few
        # hosts as it can, has one free worker per host, so the trial's two ranks go to two hosts.
        released = Event(f"occupy-{net.tag}", client=client)
        stack.callback(released.set)
        from multihost_fns import occupy

        occupied = {
            host: client.submit(occupy, released.name, workers=[w[1]], allow_other_workers=False, pure=False)
            for host, w in by_host.items()
        }
        _wait_for(
            lambda: all(
                f.key in client.processing(workers=[by_host[h][1]])[by_host[h][1]]
                for h, f in occupied.items()
            ),
            60,
            "the other user's tasks to start",
        )

        # ---- the sweep, as a user runs it against this cluster.
        run_env = {
            **base_env,
            **s3_env,
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            "MLFLOW_TRACKING_URI": tracking_uri,
            "DASK_SCHEDULER_ADDRESS": scheduler_address,
            "SWEEPFLOW_HOME": str(tmp_path / "sweepflow-home"),
            "PYTHONPATH": TESTS_DIR,
        }
        settings = {
            "sweep.num_samples": "1",
            "sweep.search_space": "{l1: 32, l2: 32, lr: 0.01, batch_size: 32}",
            "training.train_fn": "multihost_fns:train_recording_placement",
            "training.model_fn": "sweepflow.tasks.training.builtin:model_fn",
            "evaluation.evaluate_fn": "sweepflow.tasks.training.builtin:evaluate_fn",
            "training.epochs": str(EPOCHS),
            "training.base_config": json.dumps({"optimizer": "adam", "record_dir": str(record_dir), "hold_at": HOLD_AT}),
            "training.max_failures": "1",
            "scheduler.type": "fifo",
            "resources.ranks_per_trial": "2",
            "mlflow.experiment_name": "multihost",
            "mlflow.registered_model_name": "multihost-model",
            "storage": prefix,
        }  # fmt: skip
        summary_path = tmp_path / "summary.json"
        argv = [os.path.join(BIN, "sweepflow"), "run", "--in-process", "--summary-json", str(summary_path)]
        for key, value in settings.items():
            argv += ["--set", f"{key}={value}"]
        run = subprocess.Popen(
            argv,
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        stack.callback(lambda: run.poll() is None and (run.kill(), run.wait()))
        # What the run may have left in its state dir (the idle watchdog of its local services), by its own command.
        stack.callback(
            subprocess.run,
            [os.path.join(BIN, "sweepflow"), "server", "stop", "--state-dir", run_env["SWEEPFLOW_HOME"]],
            env=run_env,
            capture_output=True,
            timeout=120,
        )
        output = _Output(run, str(logs / "sweepflow-run.log"))
        t_run_start = time.monotonic()

        # ---- the first attempt: its ranks on two hosts, over the veth addresses.
        _wait_for(
            lambda: all(os.path.exists(record_dir / f"held-rank{r}") for r in (0, 1)),
            300,
            f"both ranks to report epoch {HOLD_AT}",
            alive=run,
        )
        t_held = time.monotonic()
        first = _records(str(record_dir))
        seen.addresses, seen.first = a, first
        assert [r["rank"] for r in first] == [0, 1], first  # the scenario goes on only with both ranks' records
        ips = [_host_of(r["worker"]) for r in first]
        seen.ips = ips
        # gloo's own connections: between the two ranks' veth addresses, on ports neither Dask nor the store use.
        dask_ports = {int(w.rsplit(":", 1)[1]) for ws in by_host.values() for w in ws}
        dask_ports |= {
            int(n.rsplit(":", 1)[1]) for n in client.run(lambda dask_worker: dask_worker.nanny).values() if n
        }
        dask_ports |= {int(first[0]["MASTER_PORT"]), int(scheduler_address.rsplit(":", 1)[1])}
        seen.gloo = {
            r["rank"]: [c for c in r["connections"] if c[1] not in dask_ports and c[3] not in dask_ports]
            for r in first
        }

        # ---- rank 0's host is lost: every process on it killed at once.
        lost = next(h for h in ("worker-a", "worker-b") if a[h] == ips[0])
        survivor = next(h for h in ("worker-a", "worker-b") if h != lost)
        seen.survivor = a[survivor]
        t_kill = time.time()
        killed = net.kill_host(lost)
        assert len(killed) >= 3, killed  # `dask worker`, its two nannies' worker processes
        released.set()  # the other user's task on the host left ends: room for a 2-rank group there
        (record_dir / "released").touch()  # the surviving rank goes on into epoch 3, towards its lost peer
        _wait_for(
            lambda: not any(_host_of(w) == a[lost] for w in client.scheduler_info(n_workers=-1)["workers"]),
            120,
            "the scheduler to drop the lost host's workers",
        )
        t_gone = time.time()

        try:
            run.wait(timeout=420)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`sweepflow run` did not finish:\n{output.text()[-6000:]}") from None
        text = output.text()
        assert run.returncode == 0, text[-6000:]
        t_run_end = time.time()

        # ---- the resumed attempt: from the epoch-2 checkpoint, both ranks on the host left.
        resumed = [r for r in _records(str(record_dir)) if r["resumed"]]
        seen.resumed = resumed
        assert resumed, "no resumed group reached the training function"

        # ---- MLflow: one trial run, one restart, every epoch's every metric logged exactly once.
        from mlflow.tracking import MlflowClient

        with open(summary_path) as f:
            summary = json.load(f)
        mlflow = MlflowClient(tracking_uri)
        children = mlflow.search_runs(
            [summary["experiment_id"]],
            filter_string=f"tags.mlflow.parentRunId = '{summary['parent_run_id']}'",
        )
        seen.children = children
        assert children, "the sweep recorded no trial run"
        trial = children[0]
        # Every metric but the system samples: no step twice; each one reported per epoch, at every epoch once
        # (the trial's totals, worker_seconds and such, are logged once at its end).
        histories = {
            key: sorted(m.step for m in mlflow.get_metric_history(trial.info.run_id, key))
            for key in trial.data.metrics
            if not key.startswith("system/")
        }
        per_epoch = [key for key, steps in histories.items() if 1 in steps]
        seen.histories, seen.per_epoch = histories, per_epoch
        checked = sum(len(steps) for steps in histories.values())
        epochs = sorted(mlflow.get_metric_history(trial.info.run_id, "epoch"), key=lambda m: m.step)
        seen.epochs = [m.value for m in epochs]
        seen.system_metrics = [k for k in trial.data.metrics if k.startswith("system/")]
        # Its two groups' samples, numbered on across the restart.
        seen.system_steps = sorted(
            m.step for m in mlflow.get_metric_history(trial.info.run_id, "system/cpu_utilization_percentage")
        )
        seen.versions_after_run = len(mlflow.search_model_versions("name='multihost-model'"))
        # The checkpoints are on the S3 host, under the trial's run; the latest is the last epoch's.
        fs = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": s3_url})
        run_prefix = (
            f"{BUCKET}/sweepflow/mlflow/{summary['experiment_id']}/{trial.info.run_id}/artifacts/checkpoints"
        )
        seen.checkpoint_markers = sorted(p for p in fs.find(run_prefix) if p.endswith(".sweepflow_checkpoint.json"))
        seen.bucket = fs.find(BUCKET)
        t_first_after = epochs[HOLD_AT].timestamp / 1000  # epoch 3: the resumed group's first report

        figures = {
            "cluster up (hosts, S3, MLflow, scheduler, 4 workers, Prefect API)": t_cluster - t_start,
            f"`sweepflow run` started to both ranks past epoch {HOLD_AT}": t_held - t_run_start,
            "lost host's workers dropped by the scheduler": t_gone - t_kill,
            "driver's group failed (the trial's `attempt 0 failed` line)": (output.first("attempt 0 failed") or float("nan")) - t_kill,
            "resumed group in the training function, from the checkpoint": min(r["started"] for r in resumed) - t_kill,
            f"resumed group's first report (epoch {HOLD_AT + 1}) in MLflow": t_first_after - t_kill,
            "`sweepflow run` exited (trial, evaluation, registration done)": t_run_end - t_kill,
        }  # fmt: skip
        print(
            f"\nmulti-host DDP: ranks on {ips} (rank 0's host {lost} lost), resumed on {survivor} {a[survivor]}"
        )
        for label, seconds in figures.items():
            print(f"  {label}: {seconds:.1f} s")
        print(
            f"  records checked exactly once: {checked} ({len(per_epoch)} per-epoch metrics x {EPOCHS} epochs, "
            f"{len(histories) - len(per_epoch)} end-of-trial metrics), 1 trial run, 1 model version"
        )
        print(f"  total test time: {time.monotonic() - t_start:.1f} s")

        # ---- the same cluster through Prefect (item 4): the repository's prefect.yaml deployed onto a process
        # work pool, a `prefect worker` whose environment names the cluster, MLflow and S3 (what docs/deploying.md says a
        # worker needs), and `prefect deployment run --watch`. One 2-rank trial, on the host left.
        t_deploy = time.monotonic()
        prefect = os.path.join(BIN, "prefect")
        pool = f"multihost-{net.tag}"
        worker_env = {**run_env, "PREFECT_WORKER_QUERY_SECONDS": "1"}
        run_from_checkout([prefect, "work-pool", "create", pool, "--type", "process"], worker_env, 120)
        run_from_checkout(
            [prefect, "--no-prompt", "deploy", "--name", "default", "--pool", pool], worker_env, 300
        )
        worker = subprocess.Popen(
            [prefect, "worker", "start", "--pool", pool, "--limit", "1"],
            env=worker_env,
            stdout=open(logs / "prefect-worker.log", "w"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        stack.callback(_stop_worker, worker)
        deployed_dir = tmp_path / "deployed-records"
        deployed_dir.mkdir()
        params = {
            "config": {
                "sweep": {
                    "num_samples": 1,
                    "search_space": {"l1": 16, "l2": 16, "lr": 0.01, "batch_size": 64},
                },
                "training": {
                    "train_fn": "multihost_fns:train_recording_placement",
                    "model_fn": "sweepflow.tasks.training.builtin:model_fn",
                    "epochs": 1,
                    "base_config": {"optimizer": "adam", "record_dir": str(deployed_dir), "hold_at": 0},
                },
                "scheduler": {"type": "fifo"},
                "resources": {"ranks_per_trial": 2},
                "evaluation": {"evaluate_fn": "sweepflow.tasks.training.builtin:evaluate_fn"},
                "mlflow": {
                    "experiment_name": "multihost-deployment",
                    "registered_model_name": "multihost-model",
                },
                "storage": prefix,
            }
        }
        done = run_from_checkout(
            [
                prefect,
                "deployment",
                "run",
                "training-pipeline/default",
                "--watch",
                "--params",
                json.dumps(params),
            ],
            worker_env,
            600,
        )
        seen.deployment_output = done.stdout
        seen.deployed = _records(str(deployed_dir))
        experiment = mlflow.get_experiment_by_name("multihost-deployment")
        seen.deployment_parents = mlflow.search_runs(
            [experiment.experiment_id], filter_string="tags.sweepflow.kind = 'pipeline'"
        )
        seen.deployment_children = [
            child
            for parent in seen.deployment_parents
            for child in mlflow.search_runs(
                [experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
            )
        ]
        seen.versions_after_deployment = len(mlflow.search_model_versions("name='multihost-model'"))
        print(f"  `prefect deployment run` on the same cluster: {time.monotonic() - t_deploy:.1f} s")
    return seen


def scenario(test):
    """What a test of the scenario starts (its module fixture asks for the Prefect harness by name)."""
    for mark in (pytest.mark.subprocess, pytest.mark.dask, pytest.mark.s3, pytest.mark.mlflow_server, pytest.mark.prefect):
        test = mark(test)
    return test


@scenario
def test_the_first_attempts_ranks_train_on_two_hosts_over_the_veth_addresses(lost_host):
    first, ips, a = lost_host.first, lost_host.ips, lost_host.addresses
    assert [r["rank"] for r in first] == [0, 1] and not any(r["resumed"] for r in first), first
    assert ips[0] != ips[1] and set(ips) == {a["worker-a"], a["worker-b"]}, ips
    for record in first:
        assert record["MASTER_ADDR"] == ips[0], record  # rank 0's TCPStore, on its worker's address ...
        # The veth, not lo (what the host name resolves to: 127.0.0.1 through /etc/hosts here).
        assert record["GLOO_SOCKET_IFNAME"] == "eth0", record
    master = [ips[0], int(first[0]["MASTER_PORT"])]
    assert any(c[2:] == master for c in first[1]["connections"]), first[1]  # ... which rank 1 reached


@scenario
def test_gloo_connects_the_two_ranks_over_their_veth_addresses_never_loopback(lost_host):
    gloo, ips, first = lost_host.gloo, lost_host.ips, lost_host.first
    assert any(c[0] == ips[1] and c[2] == ips[0] for c in gloo[1]), gloo
    assert any(c[0] == ips[0] and c[2] == ips[1] for c in gloo[0]), gloo
    assert not any("127.0.0.1" in (c[0], c[2]) for r in first for c in gloo[r["rank"]]), gloo


@scenario
def test_the_trial_resumes_from_its_checkpoint_with_both_ranks_on_the_host_left(lost_host):
    resumed, survivor = lost_host.resumed, lost_host.survivor
    assert [r["rank"] for r in resumed] == [0, 1], resumed
    assert {_host_of(r["worker"]) for r in resumed} == {survivor}, resumed
    assert all(r["GLOO_SOCKET_IFNAME"] == "eth0" and r["MASTER_ADDR"] == survivor for r in resumed)


@scenario
def test_mlflow_holds_one_trial_run_one_restart_and_every_epoch_once(lost_host):
    children = lost_host.children
    assert len(children) == 1, [c.info.run_id for c in children]
    (trial,) = children
    assert trial.info.status == "FINISHED" and trial.data.tags["sweepflow.status"] == "COMPLETED"
    assert trial.data.tags["sweepflow.restarts"] == "1"
    # Every metric but the system samples: no step twice; each one reported per epoch, at every epoch once
    # (the trial's totals, worker_seconds and such, are logged once at its end).
    histories, per_epoch = lost_host.histories, lost_host.per_epoch
    assert {"epoch", "train_loss", "val_loss", "val_accuracy", "best_val_accuracy"} <= set(per_epoch), histories
    for key, steps in histories.items():
        assert len(steps) == len(set(steps)), f"{key} recorded twice at a step: {steps}"
        if key in per_epoch:
            assert steps == list(range(1, EPOCHS + 1)), (key, steps)
    assert lost_host.epochs == list(range(1, EPOCHS + 1))  # 1, 2, 3, 4: not 1, 2, 1, 2, 3, 4
    assert lost_host.versions_after_run == 1


@scenario
def test_rank_zeros_system_metrics_number_on_across_the_restart(lost_host):
    assert lost_host.system_metrics, "rank 0 wrote no system metrics"
    steps = lost_host.system_steps
    assert steps == list(range(len(steps))), steps


@scenario
def test_the_checkpoints_are_on_the_s3_host_under_the_trials_run(lost_host):
    assert lost_host.checkpoint_markers, lost_host.bucket


@scenario
def test_a_deployment_of_prefect_yaml_runs_on_the_same_cluster_through_a_prefect_worker(lost_host):
    assert "Completed" in lost_host.deployment_output, lost_host.deployment_output[-3000:]
    deployed = lost_host.deployed
    assert [r["rank"] for r in deployed] == [0, 1], deployed
    assert {_host_of(r["worker"]) for r in deployed} == {lost_host.survivor}, deployed  # the namespace cluster's
    (parent,) = lost_host.deployment_parents
    assert parent.data.tags.get("prefect.flow_run_id"), parent.data.tags
    (child,) = lost_host.deployment_children
    assert child.info.status == "FINISHED" and child.data.tags["sweepflow.status"] == "COMPLETED"
    assert lost_host.versions_after_deployment == 2
