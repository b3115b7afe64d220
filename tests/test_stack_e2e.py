"""The real stack end to end, the way users run it: `sweepflow stack up` (S3 gateway, MLflow server proxying
artifacts to S3, Prefect server + process worker, Dask scheduler + 2 GPU-slot workers), `prefect deploy --all`,
`prefect deployment run training-pipeline/default --watch` twice (the second with a worse budget), then
everything is checked through the MLflow client, Prefect's client and the S3 endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
MODEL = "sweepflow-classifier"

# A good first run (fixed hyperparameters, 3 epochs, 2-rank DDP) and a worse second one (1 epoch, tiny lr).
GOOD = {"l1": 64, "l2": 64, "lr": 0.01, "batch_size": 32}
WORSE = {"l1": 4, "l2": 4, "lr": 0.0001, "batch_size": 64}


def _params(hparams: dict, *, epochs: int, num_samples: int) -> str:
    space = {name: {"type": "choice", "values": [value]} for name, value in hparams.items()}
    config = {
        "sweep": {"search_space": space, "num_samples": num_samples},
        "training": {"epochs": epochs},
        "scheduler": {"type": "fifo", "max_t": epochs},
        "resources": {"ranks_per_trial": 2},
    }
    return json.dumps({"config": config})


def _clean_env(tmp_path) -> dict[str, str]:
    """This process's env without any Prefect/MLflow/Dask/AWS settings, and a private PREFECT_HOME."""
    prefixes = ("PREFECT_", "MLFLOW_", "DASK_", "AWS_", "SWEEPFLOW_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PREFECT_HOME"] = str(tmp_path / "client-prefect-home")
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture
def stack(tmp_path):
    state = str(tmp_path / "stack")
    env = _clean_env(tmp_path)
    sweepflow = [os.path.join(BIN, "sweepflow"), "stack"]
    try:
        up = subprocess.run(
            [*sweepflow, "up", "--state-dir", state, "--workers", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert up.returncode == 0, up.stdout + up.stderr
        status = _run([*sweepflow, "status", "--state-dir", state], env, 60)
        assert "DOWN" not in status.stdout
        from sweepflow.services.stack import read_env

        yield state, {**env, **read_env(state)}
    finally:
        down = subprocess.run(
            [*sweepflow, "down", "--state-dir", state], env=env, capture_output=True, text=True, timeout=120
        )
        print(down.stdout, down.stderr)
    from sweepflow.services.stack import status as stack_status

    assert not any(stack_status(state).values()), "stack down left services running"


def test_deployments_on_the_real_stack_retrain_and_keep_the_better_champion(stack, tmp_path):
    state, env = stack
    api = env["PREFECT_API_URL"]
    _run([os.path.join(BIN, "prefect"), "--no-prompt", "deploy", "--all"], env, 300)

    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import DeploymentFilter, FlowRunFilter
    from prefect.client.schemas.sorting import FlowRunSort

    with SyncPrefectClient(api) as prefect_client:
        nightly = prefect_client.read_deployment_by_name("training-pipeline/nightly-retrain")
        assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
        assert nightly.schedules[0].active is False  # a real schedule, inactive until resumed
        default = prefect_client.read_deployment_by_name("training-pipeline/default")
        assert default.work_pool_name == "sweepflow-process"

    prefect = os.path.join(BIN, "prefect")
    run = [prefect, "deployment", "run", "training-pipeline/default", "--watch", "--params"]
    first = _run([*run, _params(GOOD, epochs=3, num_samples=2)], env, 900)
    assert "Completed" in first.stdout
    second = _run([*run, _params(WORSE, epochs=1, num_samples=1)], env, 900)
    assert "Completed" in second.stdout

    # ---- Prefect: both flow runs COMPLETED, one task run per trial, the second run's data task cached.
    with SyncPrefectClient(api) as prefect_client:
        flow_runs = prefect_client.read_flow_runs(
            deployment_filter=DeploymentFilter(id={"any_": [default.id]}), sort=FlowRunSort.START_TIME_ASC
        )
        assert [r.state_type.value for r in flow_runs] == ["COMPLETED", "COMPLETED"]
        task_runs = [
            prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [r.id]}))
            for r in flow_runs
        ]
    trials = [sorted(t.name for t in runs if t.name.startswith("trial_")) for runs in task_runs]
    assert [len(t) for t in trials] == [2, 1]
    assert trials[0][0].startswith("trial_0000-")  # named after the trial and its key params
    data_states = [
        [t.state_name for t in runs if t.name.startswith("download-dataset")] for runs in task_runs
    ]
    assert data_states == [["Completed"], ["Cached"]], "a rerun with unchanged data must not prepare it again"

    # ---- MLflow: parent + child runs, statuses, params and metrics; champion stays on the better model.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("sweepflow")
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

    # ---- S3: the dataset objects, every trial's checkpoints under its run's artifact location, the model.
    import s3fs

    fs = s3fs.S3FileSystem(
        key=env["AWS_ACCESS_KEY_ID"],
        secret=env["AWS_SECRET_ACCESS_KEY"],
        client_kwargs={"endpoint_url": env["AWS_ENDPOINT_URL_S3"]},
    )
    prepared = fs.glob("sweepflow/datasets/prepared/digits-*/meta.json")
    assert len(prepared) == 1, fs.find("sweepflow/datasets")
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

    # ---- A fresh process that only knows the tracking URI loads and runs the champion.
    script = (
        "import mlflow, numpy as np\n"
        f"model = mlflow.pyfunc.load_model('models:/{MODEL}@champion')\n"
        "print(np.asarray(model.predict(np.zeros((3, 1, 8, 8), dtype=np.float32))).shape)\n"
    )
    fresh_env = {**_clean_env(tmp_path), "MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]}
    loaded = _run([sys.executable, "-c", script], fresh_env, 300)
    assert loaded.stdout.strip().endswith("(3, 10)")

    # ---- A deployment run with bad parameters fails at its first step, says why, and starts nothing.
    bad = json.dumps(
        {"config": {"training": {"model": "resnet50"}, "mlflow": {"registered_model_name": MODEL}}}
    )
    refused = subprocess.run([*run, bad], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0, refused.stdout[-3000:]
    with SyncPrefectClient(api) as prefect_client:
        flow_runs = prefect_client.read_flow_runs(
            deployment_filter=DeploymentFilter(id={"any_": [default.id]}), sort=FlowRunSort.START_TIME_ASC
        )
        failed = flow_runs[-1]
        assert failed.state_type.value == "FAILED"
        assert "unknown model 'resnet50'" in failed.state.message, failed.state.message
        assert prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [failed.id]})) == []
        from prefect.client.schemas.filters import LogFilter

        logs = prefect_client.read_logs(log_filter=LogFilter(flow_run_id={"any_": [failed.id]}))
    assert any("unknown model 'resnet50'" in log.message for log in logs)
    assert len(client.search_runs([experiment.experiment_id])) == len(runs), (
        "the refused run created MLflow runs"
    )

    # ---- Secrets (see tests/test_secrets.py): while everything is up, the stack's S3 secret is on no command line
    # (`ps` shows them to every user) and in no file of the stack's state but the two that keep it (mode 0600).
    from test_secrets import file_leaks, process_args_leaks

    secret = [env["AWS_SECRET_ACCESS_KEY"]]
    assert not process_args_leaks(secret)
    kept = {os.path.join(state, "stack.env"), os.path.join(state, "s3-credentials")}
    assert not file_leaks(state, secret, skip=kept)
