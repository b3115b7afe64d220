"""Secrets stay secret: credentials in any URI, AWS keys and storage options never reach what others can read.

The end-to-end test runs ``sweepflow run`` (in-process, under the Prefect test harness) with a credential in
every place one can be given — the MLflow tracking URI (``user:password@``), the data source (an HTTP mirror
that *requires* basic auth, plus a token header in its storage options), the S3 cache's storage options, the
AWS keys in the environment (the S3 storage on moto) — and then searches every surface for every secret
string: the MLflow API (every run's params, tags, metric names; registered model versions) and every artifact
file of the experiment; the Prefect API (flow run with its parameters and states, task runs and their states,
logs, artifacts, events); every file under the state directory; the S3 objects written; the command's output;
and ``ps -eo args`` while the Dask cluster and the MLflow server are still up. The other tests are quick
checks of the pieces: refusals, the launcher hand-off, the redaction of messages.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import struct
import subprocess
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from datetime import datetime, timezone
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prefect_records import final_task_runs

from ddp_runtime.cluster import local_cluster
from sweepflow.flows import cli
from sweepflow.tasks import WORKER_PRELOAD

TRACKING_USER, TRACKING_PASSWORD = "trk-user-5f1c", "trk-pass-Q9zX31wq"
DATA_USER, DATA_PASSWORD = "data-user-b52e", "data-pass-Hk40pLmz"
DATA_TOKEN = "data-token-Vv7Rr2Ss"  # a header in data.storage_options
AWS_KEY, AWS_SECRET = "AKIASECRETS4TESTKEY", "aws-secret-Zp8Lr2Nn6Tt"
CACHE_KEY, CACHE_SECRET = "cache-key-M3nq8Aa", "cache-secret-J7ws2Ee"  # data.cache_storage_options
SECRETS = (
    TRACKING_USER,
    TRACKING_PASSWORD,
    DATA_USER,
    DATA_PASSWORD,
    DATA_TOKEN,
    AWS_KEY,
    AWS_SECRET,
    CACHE_KEY,
    CACHE_SECRET,
)
BUCKET = "secrets-test"
IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


def leaks(text: str | bytes, where: str, secrets: Sequence[str] = SECRETS) -> list[str]:
    """``where`` for each of ``secrets`` found in ``text``."""
    data = text if isinstance(text, bytes) else text.encode()
    return [
        f"secret #{i} of {len(secrets)} in {where}"
        for i, secret in enumerate(secrets)
        if secret.encode() in data
    ]


def file_leaks(
    root: str | Path, secrets: Sequence[str] = SECRETS, *, skip: Collection[str] = ()
) -> list[str]:
    """Each of ``secrets`` in each file under ``root`` but the paths in ``skip`` (files that hold them on purpose)."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path) and path not in skip:
                with open(path, "rb") as f:
                    found += leaks(f.read(), path, secrets)
    return found


def process_args_leaks(secrets: Sequence[str] = SECRETS) -> list[str]:
    """Each of ``secrets`` in ``ps -eo args``: every process's command line, readable by every local user."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30, check=True).stdout
    return [
        f"{leak}: {redact_secrets(line[:300], secrets)}"
        for line in out.splitlines()
        for leak in leaks(line, "ps -eo args", secrets)
    ]


def redact_secrets(text: str, secrets: Sequence[str]) -> str:
    """``text`` fit for a failure message: the secrets found in it replaced."""
    for secret in secrets:
        text = text.replace(secret, "<SECRET>")
    return text


# --------------------------------------------------------------------------------------- a mirror that needs auth


def _idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes(), mtime=0)


class _AuthHandler(SimpleHTTPRequestHandler):
    """Serves the mirror only to requests with the right basic auth; records what each request carried."""

    seen: list[dict[str, Any]]

    def _authorized(self) -> bool:
        expected = "Basic " + base64.b64encode(f"{DATA_USER}:{DATA_PASSWORD}".encode()).decode()
        ok = self.headers.get("Authorization") == expected
        token = self.headers.get("X-Data-Token") == DATA_TOKEN
        self.seen.append({"method": self.command, "path": self.path, "auth": ok, "token": token})
        if not ok:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="mirror"')
            self.end_headers()
        return ok

    def do_GET(self) -> None:
        if self._authorized():
            super().do_GET()

    def do_HEAD(self) -> None:
        if self._authorized():
            super().do_HEAD()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        """Quiet: ``seen`` is the log."""


@pytest.fixture
def mirror(tmp_path) -> Iterator[dict[str, Any]]:
    """A small MNIST in the official IDX format on 127.0.0.1, behind basic auth; its MD5s for DataConfig.checksums."""
    rng = np.random.default_rng(7)
    root = tmp_path / "mirror" / "mnist"
    root.mkdir(parents=True)
    arrays = (
        rng.integers(0, 256, size=(120, 28, 28)),
        np.arange(120) % 10,
        rng.integers(0, 256, size=(40, 28, 28)),
        np.arange(40) % 10,
    )
    md5 = {}
    for name, array in zip(IDX_FILES, arrays, strict=True):
        (root / name).write_bytes(_idx_bytes(array))
        md5[name] = hashlib.md5((root / name).read_bytes(), usedforsecurity=False).hexdigest()
    seen: list[dict[str, Any]] = []
    handler = type("Handler", (_AuthHandler,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root.parent)))
    thread = threading.Thread(target=server.serve_forever, name="auth-mirror", daemon=True)
    thread.start()
    try:
        yield {"address": f"127.0.0.1:{server.server_address[1]}", "md5": md5, "seen": seen}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# ------------------------------------------------------------------------------------------------- end to end


def _mlflow_leaks(client: Any, experiment_name: str, model_name: str) -> list[str]:
    from urllib.parse import unquote, urlparse

    from mlflow.entities import ViewType

    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)
    assert len(runs) >= 3, "a parent run and a child run per trial"
    found = leaks(str(experiment.to_proto()), "the experiment")
    for run in runs:
        record = {
            "info": dict(run.info),
            "params": run.data.params,
            "tags": run.data.tags,
            "metric_names": sorted(run.data.metrics),
        }
        found += leaks(json.dumps(record, default=str), f"MLflow run {run.info.run_id}")
    for version in client.search_model_versions(f"name='{model_name}'"):
        found += leaks(json.dumps(dict(version), default=str), f"model version {version.version}")
    # Every artifact of the experiment (runs' checkpoints, leaderboard, confusion matrix, the logged model):
    # the session's MLflow server keeps them under a local artifact root.
    root = urlparse(experiment.artifact_location)
    assert root.scheme == "file", experiment.artifact_location
    artifacts = unquote(root.path)
    assert any(files for _, _, files in os.walk(artifacts)), f"no artifacts under {artifacts}"
    return found + file_leaks(artifacts)


def _prefect_leaks(flow_run_id: str, since: Any) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, LogFilter, LogFilterFlowRunId
    from prefect.events.filters import EventFilter, EventOccurredFilter
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # the flow's last log lines go out in batches
    found: list[str] = []
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        assert flow_run.parameters["config"]["data"]["name"] == "mnist"  # the parameters are stored ...
        found += leaks(flow_run.model_dump_json(), "the Prefect flow run (parameters, state, context)")
        for state in client.read_flow_run_states(flow_run_id):
            found += leaks(
                state.model_dump_json(exclude={"data"}) + (state.message or ""), "a flow run state"
            )
        task_runs = final_task_runs(client, flow_run_id, at_least=4)
        assert {t.name.split("-")[0] for t in task_runs} >= {"download", "trial_0000", "evaluate", "register"}
        for task_run in task_runs:
            found += leaks(
                task_run.model_dump_json(), f"task run {task_run.name} (task_inputs, cache key, state)"
            )
            for state in client.read_task_run_states(task_run.id):
                found += leaks(
                    state.model_dump_json(exclude={"data"}), f"a state of task run {task_run.name}"
                )
        deadline = time.monotonic() + 10
        while True:  # logs arrive asynchronously: wait for the flow's last line
            logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            if any("best trial" in log.message for log in logs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert logs, "the flow run's logs"
        found += leaks("\n".join(log.message for log in logs), "the Prefect logs")
        artifacts = client.read_artifacts(flow_run_filter=FlowRunFilter(id={"any_": [flow_run_id]}))
        assert artifacts, "the leaderboard table artifact"
        found += leaks(json.dumps([a.model_dump(mode="json") for a in artifacts]), "the Prefect artifacts")
        page = client.read_events(EventFilter(occurred=EventOccurredFilter(since=since)), limit=50)
        events = list(page.events)
        while page.next_page and len(events) < 5000:
            page = client.read_events_page(page.next_page)
            events += page.events
        found += leaks(json.dumps([e.model_dump(mode="json") for e in events]), "the Prefect events")
    return found


def test_no_secret_reaches_mlflow_prefect_logs_files_or_command_lines(
    prefect_harness, mlflow_server, s3_endpoint, mirror, tmp_path, monkeypatch, capsys
):
    import s3fs
    from mlflow.tracking import MlflowClient

    started = time.monotonic()
    since = datetime.now(timezone.utc)
    for name in ("MLFLOW_TRACKING_URI", "DASK_SCHEDULER_ADDRESS", "SWEEPFLOW_STORAGE", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, "")  # so that what the run sets is undone after the test
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint["url"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    home = tmp_path / "home"
    monkeypatch.setenv("SWEEPFLOW_HOME", str(home))
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint["url"]})
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)

    state = tmp_path / "state"
    tracking = mlflow_server.replace("http://", f"http://{TRACKING_USER}:{TRACKING_PASSWORD}@")
    config = {
        "state_dir": str(state),
        "storage": f"s3://{BUCKET}/root",  # the dataset cache's default and the artifacts destination
        "data": {
            "name": "mnist",
            "checksums": mirror["md5"],
            "storage_options": {"client_kwargs": {"headers": {"X-Data-Token": DATA_TOKEN}}},
            "cache_dir": f"s3://{BUCKET}/cache",
            "cache_storage_options": {
                "key": CACHE_KEY,
                "secret": CACHE_SECRET,
                "client_kwargs": {"endpoint_url": s3_endpoint["url"]},
            },
        },
        "sweep": {
            "search_space": {
                "l1": {"type": "choice", "values": [8, 16]},
                "l2": 8,
                "lr": 0.01,
                "batch_size": 64,
            },
            "num_samples": 2,
        },
        "training": {"epochs": 1},
        "scheduler": {"type": "fifo"},
        "resources": {"ranks_per_trial": 1},
        "mlflow": {"experiment_name": "secrets", "registered_model_name": "secrets-model"},
    }
    config_file = tmp_path / "sweep.yaml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    summary_file = tmp_path / "summary.json"
    with local_cluster(n_workers=1, preload=[WORKER_PRELOAD]) as dask_client:
        code = cli.main(
            [
                "run",
                "--no-server",
                "--in-process",
                "--config",
                str(config_file),
                "--set",
                f"mlflow.tracking_uri={tracking}",
                "--set",
                f"data.source=http://{DATA_USER}:{DATA_PASSWORD}@{mirror['address']}/mnist",
                "--set",
                f"dask.scheduler_address={dask_client.scheduler.address}",
                "--summary-json",
                str(summary_file),
            ]
        )
        out = capsys.readouterr()
        assert code == 0, out.out[-3000:] + out.err[-3000:]
        # While the Dask workers and the MLflow server are still up: no command line holds a secret.
        found = process_args_leaks()
    run_s = time.monotonic() - started

    # The credentials were really used: the mirror served only requests with the right basic auth, and the
    # storage options' header reached it with every download.
    downloads = [r for r in mirror["seen"] if r["method"] == "GET"]
    assert downloads and all(r["auth"] and r["token"] for r in downloads), mirror["seen"]

    found += leaks(out.out + out.err, "the command's output")
    found += leaks(summary_file.read_bytes(), "the summary JSON")
    summary = json.loads(summary_file.read_text())
    client = MlflowClient(mlflow_server)
    found += _mlflow_leaks(client, "secrets", "secrets-model")
    parent = client.get_run(summary["parent_run_id"])
    assert (
        parent.data.params["data.source"] == f"http://***@{mirror['address']}/mnist"
    )  # redacted, not dropped
    found += _prefect_leaks(parent.data.tags["prefect.flow_run_id"], since)
    found += file_leaks(state) + file_leaks(home)
    for key in fs.find(BUCKET):
        found += leaks(fs.cat_file(key), f"s3://{key}")
    assert not found, "\n".join(found)
    timings = [line for line in out.out.splitlines() if line.startswith("Timings")]
    print(f"pipeline run {run_s:.1f} s ({timings}), whole test {time.monotonic() - started:.1f} s")


# ---------------------------------------------------------------------------------------------- the pieces


def test_credentials_with_no_safe_place_are_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.setenv("SWEEPFLOW_HOME", str(tmp_path / "home"))
    cases = {
        "dask.scheduler_address": f"dask.scheduler_address=tls://{AWS_KEY}:{AWS_SECRET}@scheduler:8786",
        "storage": f"storage=s3://{AWS_KEY}:{AWS_SECRET}@bucket/root",
        "mlflow.artifacts_destination": f"mlflow.artifacts_destination=s3://{AWS_KEY}:{AWS_SECRET}@bucket/a",
        "MLFLOW_TRACKING_URI instead": f"mlflow.tracking_uri=postgresql://{AWS_KEY}:{AWS_SECRET}@db/mlflow",
    }
    for expected, item in cases.items():
        assert cli.main(["run", "--no-server", "--set", item, "--set", f"state_dir={tmp_path}"]) == 2
        err = capsys.readouterr().err
        assert expected in err and "***@" in err, err
        assert not leaks(err, "the refusal"), err
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", f"tcp://{AWS_KEY}:{AWS_SECRET}@scheduler:8786")
    assert cli.main(["run", "--no-server", "--set", f"state_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "DASK_SCHEDULER_ADDRESS" in err and not leaks(err, "the refusal"), err
    assert not os.path.exists(tmp_path / "services")


def test_the_warm_launcher_gets_set_values_in_its_handover_not_its_logged_command(tmp_path, monkeypatch):
    from sweepflow.flows import preflight
    from sweepflow.infra.services import launcher

    handed = {}

    def fake_run(state_dir: str, argv: list[str], *, handover: dict) -> int:
        handed.update(argv=argv, overrides=handover["sets"], started_at=handover["started_at"])
        return 0

    monkeypatch.setenv("SWEEPFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(preflight, "check_pipeline", lambda *a, **k: None)
    monkeypatch.setattr(cli, "_use_local_services", lambda config, *a, **k: config)
    monkeypatch.setattr(launcher, "run", fake_run)
    tracking = f"mlflow.tracking_uri=http://{TRACKING_USER}:{TRACKING_PASSWORD}@127.0.0.1:5000"
    source = f"data.source=http://{DATA_USER}:{DATA_PASSWORD}@127.0.0.1:8000/mnist"
    argv = [
        "run",
        "--set",
        tracking,
        f"--set={source}",
        "--set",
        "data.name=mnist",
        "--summary-json",
        "s.json",
    ]
    assert cli.main(argv) == 0
    assert handed["argv"] == ["run", "--summary-json", "s.json"]  # what the launcher logs: no --set value
    assert handed["overrides"] == [tracking, source, "data.name=mnist"]  # all of them, in order
    assert time.time() - 60 < handed["started_at"] <= time.time()
    assert not [k for k, v in os.environ.items() if k.startswith("SWEEPFLOW_RUN") or TRACKING_PASSWORD in v]


def test_split_credentials_leaves_a_config_without_secrets_and_the_flow_gets_them_back(monkeypatch):
    from sweepflow.flows.config import PipelineConfig
    from sweepflow.flows.credentials import Credentials, split_credentials, with_credentials
    from sweepflow.flows.settings import Settings, resolve_settings

    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, "")
    source = f"https://{DATA_USER}:{DATA_PASSWORD}@mirror.example.com/mnist"
    config = PipelineConfig.model_validate(
        {
            "mlflow": {"tracking_uri": f"https://{TRACKING_USER}:{TRACKING_PASSWORD}@mlflow.example.com"},
            "data": {
                "name": "mnist",
                "source": source,
                "storage_options": {"client_kwargs": {"headers": {"X-Data-Token": DATA_TOKEN}}},
                "cache_dir": "s3://bucket/cache",
                "cache_storage_options": {"key": CACHE_KEY, "secret": CACHE_SECRET},
            },
        }
    )
    settings = Settings.from_env({"SWEEPFLOW_HOME": "/tmp/sweepflow-home"})
    public, credentials = split_credentials(config, settings)
    assert not leaks(public.model_dump_json(), "the public config")
    assert not leaks(repr(credentials) + repr(credentials.data), "the credentials' repr")
    assert public.mlflow.tracking_uri == "https://mlflow.example.com"
    assert public.data.source == "https://mirror.example.com/mnist"
    credentials.install()  # MLflow's auth variables; the data credentials go to the flow explicitly
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == TRACKING_USER
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == TRACKING_PASSWORD
    cfg = with_credentials(resolve_settings(public, settings), credentials)
    assert cfg.data.source == source
    assert cfg.data.storage_options == config.data.storage_options
    assert cfg.data.cache_storage_options == config.data.cache_storage_options
    assert cfg.mlflow.tracking_uri == "https://mlflow.example.com"
    # Another source does not get this one's credentials; a flow given none has none.
    other = public.model_copy(update={"data": public.data.model_copy(update={"source": "https://other/m"})})
    assert with_credentials(resolve_settings(other, settings), credentials).data.storage_options is None
    assert with_credentials(resolve_settings(public, settings), Credentials()).data.source == public.data.source

    # A deployment's parameters (already stored by Prefect) with a tracking URI's user:password@: the flow
    # moves them into MLflow's variables, so no URI it uses, logs or shows holds them.
    deployed = PipelineConfig.model_validate(
        {"mlflow": {"tracking_uri": f"http://u:{TRACKING_PASSWORD}@h:5000"}}
    )
    cfg = with_credentials(resolve_settings(deployed, settings), Credentials())
    assert cfg.mlflow.tracking_uri == "http://h:5000"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == TRACKING_PASSWORD


def test_messages_are_redacted_wherever_a_uri_sits_in_them():
    from sweepflow.tasks.datasets.download import _classify_fetch_error
    from sweepflow.tasks.datasets.uris import redact, split_userinfo
    from sweepflow.tasks.tracking.credentials import SecretEnv

    url = f"http://{DATA_USER}:{DATA_PASSWORD}@127.0.0.1:8000/mnist/train.gz"
    text = f"ClientResponseError(401, message='Unauthorized', url=URL('{url}')) and s3://plain/key, a@b.c"
    assert redact(text) == (
        "ClientResponseError(401, message='Unauthorized', url=URL('http://***@127.0.0.1:8000/mnist/train.gz')) "
        "and s3://plain/key, a@b.c"
    )
    for exc in (FileNotFoundError(url), ConnectionError(f"cannot connect to {url}")):
        message = str(_classify_fetch_error(exc, "train.gz", url))
        assert "http://***@127.0.0.1:8000" in message and not leaks(message, "the fetch error")
    assert split_userinfo("https://u:p%40ss@h:1/x") == ("https://h:1/x", "u", "p@ss")
    assert split_userinfo("s3://bucket/key") == ("s3://bucket/key", None, None)
    env = SecretEnv(MLFLOW_TRACKING_PASSWORD=TRACKING_PASSWORD)
    assert TRACKING_PASSWORD not in repr(env) and TRACKING_PASSWORD not in str([env])
