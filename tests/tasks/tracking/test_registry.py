"""sweepflow.tasks.tracking.registry against a real MLflow server (the session ``mlflow_server`` fixture, direct artifact mode)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid

import mlflow
import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from sweepflow.tasks.compat import tracking_uri_scope
from sweepflow.tasks.tracking.registry import (
    CHALLENGER_ALIAS,
    CHAMPION_ALIAS,
    TAG_HIGHER_IS_BETTER,
    TAG_METRIC_NAME,
    TAG_METRIC_VALUE,
    RegistrationResult,
    current_champion,
    log_and_register,
)


class TinyNet(torch.nn.Module):
    """Defined in the test module on purpose: a pickled model would need this module to load; pt2 must not."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.flatten = torch.nn.Flatten()
        self.dropout = torch.nn.Dropout(0.5)  # must be inactive in the logged model (exported in eval mode)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(self.flatten(x)))


EXAMPLE = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)


def _expected(model: torch.nn.Module, batch: np.ndarray) -> np.ndarray:
    model = model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(batch)).numpy()


@pytest.fixture
def client(mlflow_server: str) -> MlflowClient:
    return MlflowClient(mlflow_server)


@pytest.fixture
def model_name() -> str:
    return f"sweepflow-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def experiment_id(client: MlflowClient) -> str:
    return client.create_experiment(f"registry-{uuid.uuid4().hex[:8]}")


def _run(client: MlflowClient, experiment_id: str) -> str:
    return client.create_run(experiment_id).info.run_id


def _register(
    uri: str, client: MlflowClient, experiment_id: str, name: str, value: float, seed: int, **kwargs
) -> RegistrationResult:
    return log_and_register(
        model=TinyNet(seed).train(),  # training mode, as a trainer hands it over
        input_example=EXAMPLE,
        registered_model_name=name,
        run_id=_run(client, experiment_id),
        metric_name=kwargs.pop("metric_name", "val_accuracy"),
        metric_value=value,
        tracking_uri=uri,
        **kwargs,
    )


def test_champion_challenger_lifecycle(mlflow_server, client, experiment_id, model_name):
    assert current_champion(model_name, tracking_uri=mlflow_server) is None

    first = _register(
        mlflow_server, client, experiment_id, model_name, 0.5, seed=1, extra_tags={"trial": "t1"}
    )
    assert first == RegistrationResult(
        name=model_name,
        version=1,
        model_uri=f"models:/{model_name}/1",
        became_champion=True,
        champion_version=1,
        previous_champion_version=None,
        previous_champion_value=None,
    )
    aliases = client.get_registered_model(model_name).aliases
    assert aliases == {CHAMPION_ALIAS: "1", CHALLENGER_ALIAS: "1"}

    worse = _register(mlflow_server, client, experiment_id, model_name, 0.4, seed=2)
    assert (worse.version, worse.became_champion, worse.champion_version) == (2, False, 1)
    assert (worse.previous_champion_version, worse.previous_champion_value) == (1, 0.5)
    assert client.get_registered_model(model_name).aliases == {CHAMPION_ALIAS: "1", CHALLENGER_ALIAS: "2"}

    better = _register(mlflow_server, client, experiment_id, model_name, 0.9, seed=3)
    assert (better.version, better.became_champion, better.champion_version) == (3, True, 3)
    assert (better.previous_champion_version, better.previous_champion_value) == (1, 0.5)
    assert client.get_registered_model(model_name).aliases == {CHAMPION_ALIAS: "3", CHALLENGER_ALIAS: "3"}

    tie = _register(mlflow_server, client, experiment_id, model_name, 0.9, seed=4)
    assert (tie.version, tie.became_champion, tie.champion_version) == (4, False, 3)
    assert current_champion(model_name, tracking_uri=mlflow_server) == (3, 0.9)

    tags = client.get_model_version(model_name, "1").tags
    assert tags[TAG_METRIC_NAME] == "val_accuracy"
    assert float(tags[TAG_METRIC_VALUE]) == 0.5
    assert tags[TAG_HIGHER_IS_BETTER] == "true"
    assert tags["trial"] == "t1"
    assert float(client.get_model_version(model_name, "2").tags[TAG_METRIC_VALUE]) == 0.4


def test_lower_is_better(mlflow_server, client, experiment_id, model_name):
    kwargs = {"metric_name": "val_loss", "higher_is_better": False}
    assert _register(mlflow_server, client, experiment_id, model_name, 1.0, seed=1, **kwargs).became_champion
    lower = _register(mlflow_server, client, experiment_id, model_name, 0.3, seed=2, **kwargs)
    assert lower.became_champion and lower.previous_champion_value == 1.0
    higher = _register(mlflow_server, client, experiment_id, model_name, 0.7, seed=3, **kwargs)
    assert not higher.became_champion and higher.champion_version == 2
    assert client.get_model_version(model_name, "2").tags[TAG_HIGHER_IS_BETTER] == "false"


def test_model_belongs_to_the_parent_run_which_stays_open(mlflow_server, client, experiment_id, model_name):
    run_id = _run(client, experiment_id)
    client.log_param(run_id, "lr", "0.1")
    result = log_and_register(
        model=TinyNet(1),
        input_example=EXAMPLE,
        registered_model_name=model_name,
        run_id=run_id,
        metric_name="val_accuracy",
        metric_value=0.5,
        tracking_uri=mlflow_server,
    )
    version = client.get_model_version(model_name, str(result.version))
    assert version.run_id == run_id
    # Through the REST API ModelVersion.model_id comes back None; the source names the LoggedModel.
    assert version.source.startswith("models:/m-"), version.source
    model_id = version.source.removeprefix("models:/")
    logged = client.get_logged_model(model_id)
    assert logged.experiment_id == experiment_id  # not the default experiment
    assert logged.source_run_id == run_id
    assert logged.params == {"lr": "0.1"}
    assert logged.tags[TAG_METRIC_NAME] == "val_accuracy" and float(logged.tags[TAG_METRIC_VALUE]) == 0.5
    # Direct artifact mode: the server hands out the real storage location, not an mlflow-artifacts: proxy URI.
    assert logged.artifact_location.startswith(("file:", "/")), logged.artifact_location
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"
    assert [m.model_id for m in run.outputs.model_outputs] == [model_id]
    assert mlflow.active_run() is None


def test_global_tracking_uri_is_restored(mlflow_server, client, experiment_id, model_name, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = mlflow.get_tracking_uri()
    _register(mlflow_server, client, experiment_id, model_name, 0.5, seed=1)
    assert mlflow.get_tracking_uri() == before
    assert "MLFLOW_TRACKING_URI" not in os.environ


@pytest.mark.subprocess
def test_champion_loads_in_a_fresh_process_on_another_batch_size(
    mlflow_server, client, experiment_id, model_name, tmp_path
):
    _register(mlflow_server, client, experiment_id, model_name, 0.5, seed=1)
    _register(mlflow_server, client, experiment_id, model_name, 0.8, seed=2)
    _register(mlflow_server, client, experiment_id, model_name, 0.6, seed=3)
    batch = np.random.default_rng(1).random((7, 1, 8, 8), dtype=np.float32)
    np.save(tmp_path / "batch.npy", batch)

    script = (
        "import json, sys, mlflow, numpy as np\n"
        f"model = mlflow.pyfunc.load_model('models:/{model_name}@champion')\n"
        "out = model.predict(np.load(sys.argv[1]))\n"
        "print(json.dumps({'shape': list(out.shape), 'values': out.tolist()}))\n"
    )
    # Only the tracking URI: no project code on the path, so the model must be self-contained (pt2).
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_") and k != "PYTHONPATH"}
    env["MLFLOW_TRACKING_URI"] = mlflow_server
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "batch.npy")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["shape"] == [7, 10]
    np.testing.assert_allclose(np.array(answer["values"]), _expected(TinyNet(2), batch), rtol=1e-5, atol=1e-6)


def test_batch_one_example_still_accepts_other_batch_sizes(mlflow_server, client, experiment_id, model_name):
    result = log_and_register(
        model=TinyNet(1),
        input_example=EXAMPLE[:1],
        registered_model_name=model_name,
        run_id=_run(client, experiment_id),
        metric_name="val_accuracy",
        metric_value=0.5,
        tracking_uri=mlflow_server,
    )
    with tracking_uri_scope(mlflow_server):
        model = mlflow.pyfunc.load_model(result.model_uri)
    for size in (1, 3):
        assert model.predict(EXAMPLE[:size]).shape == (size, 10)


def test_pickle_format_for_models_the_loader_can_import(mlflow_server, client, experiment_id, model_name):
    result = _register(
        mlflow_server, client, experiment_id, model_name, 0.5, seed=1, serialization_format="pickle"
    )
    with tracking_uri_scope(mlflow_server):
        model = mlflow.pyfunc.load_model(f"models:/{model_name}@champion")
    np.testing.assert_allclose(model.predict(EXAMPLE[:3]), _expected(TinyNet(1), EXAMPLE[:3]), rtol=1e-5)
    assert result.became_champion


def test_incomparable_registration_is_refused_before_writing(
    mlflow_server, client, experiment_id, model_name
):
    _register(mlflow_server, client, experiment_id, model_name, 0.5, seed=1)
    with pytest.raises(ValueError, match="val_accuracy.*val_loss"):
        _register(mlflow_server, client, experiment_id, model_name, 0.1, seed=2, metric_name="val_loss")
    with pytest.raises(ValueError, match="higher_is_better=True"):
        _register(mlflow_server, client, experiment_id, model_name, 0.1, seed=2, higher_is_better=False)
    with pytest.raises(ValueError, match="non-finite"):
        _register(mlflow_server, client, experiment_id, model_name, float("nan"), seed=2)
    assert [v.version for v in client.search_model_versions(f"name='{model_name}'")] == ["1"]


def test_untraceable_model_fails_with_the_fix(mlflow_server, client, experiment_id, model_name):
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1) * 2 if x.sum() > 0 else x.flatten(1)

    with pytest.raises(ValueError, match="serialization_format='pickle'"):
        log_and_register(
            model=DataDependent(),
            input_example=EXAMPLE,
            registered_model_name=model_name,
            run_id=_run(client, experiment_id),
            metric_name="val_accuracy",
            metric_value=0.5,
            tracking_uri=mlflow_server,
        )
    assert current_champion(model_name, tracking_uri=mlflow_server) is None


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.dask
def test_registrations_imports_warm_on_an_idle_worker_that_then_finalizes_and_exits_unkilled(tmp_path):
    """After the sweep, ``warm_finalizer`` starts registration's imports (mlflow.pytorch and a first pt2 export;
    torch._dynamo and sympy, which that export needs, a local cluster's forked workers hold already) on one
    worker with nothing running, not on the busy one; ``finalizing_worker`` then sends evaluation and
    registration there. When the cluster closes, that worker (torch._dynamo, sympy and mlflow loaded) exits by
    itself: the nanny never has to kill it (``ddp_runtime._exit``: its teardown used to outlast the nanny's 4-s
    wait)."""
    from ddp_runtime.cluster import local_cluster
    from sweepflow.tasks import WORKER_PRELOAD
    from sweepflow.tasks.finalize import finalizing_worker, warm_finalizer

    heavy = ("sweepflow.tasks.tracking.registry", "mlflow.pytorch")

    # Defined here, so they reach the workers by value: by reference they would import this module there, and
    # with it the registry.
    def _imported(modules: tuple[str, ...]) -> dict[str, bool]:
        import sys

        return {m: m in sys.modules for m in modules}

    def _warm_thread_alive() -> bool:
        import threading

        return any(t.name == "sweepflow-warm-registry" for t in threading.enumerate())

    records = _Records()
    nanny_log = logging.getLogger("distributed.nanny")
    nanny_log.addHandler(records)
    release = tmp_path / "release"
    try:
        with local_cluster(n_workers=2, preload=[WORKER_PRELOAD]) as client:
            client.wait_for_workers(2)
            busy, idle = sorted(client.scheduler_info()["workers"])
            fresh = client.run(_imported, heavy)
            assert not any(any(v.values()) for v in fresh.values()), fresh

            def hold() -> None:  # a trial still running on `busy`
                while not release.exists():
                    time.sleep(0.05)

            running = client.submit(hold, workers=[busy], pure=False)
            while not client.processing()[busy]:
                time.sleep(0.05)
            assert warm_finalizer(client) == idle
            deadline = time.monotonic() + 120
            while client.run(_warm_thread_alive, workers=[idle])[idle]:
                assert time.monotonic() < deadline, "the warm-up's imports did not finish in 120 s"
                time.sleep(0.2)
            imported = client.run(_imported, heavy)
            assert all(imported[idle].values()), imported[idle]
            assert not any(imported[busy].values()), imported[busy]  # the running trial's worker was left alone
            assert finalizing_worker(client) == {"workers": [idle], "allow_other_workers": True}
            assert warm_finalizer(client) is None  # one warm worker is enough
            # Every worker exits quickly (ddp_runtime's preload registered it; tests/ddp_runtime/test_ddp_runtime.py checks
            # what it does).
            assert all(client.run(lambda: __import__("ddp_runtime._exit")._exit._registered).values())
            release.touch()
            running.result()
    finally:
        nanny_log.removeHandler(records)
    killed = [m for m in records.messages if "still alive" in m]
    assert not killed, killed
