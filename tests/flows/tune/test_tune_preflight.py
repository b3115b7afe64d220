"""A Tune script's run gets the pipeline's pre-flight checks that apply to it (``flows/preflight.py``:
``check_experiment`` over ``script_checks``, ``check_script_workers``): each mistake is one ``PreflightError`` sentence naming the
setting and the fix, raised by ``tune.run`` / ``Tuner.fit`` before any service, flow run or trial starts."""

from __future__ import annotations

import os
import socket
import sys
import textwrap

import pytest

from sweepflow import tune
from sweepflow.tasks.checks import PreflightError
from sweepflow.tasks.training.function import with_checks


def trainable(config):
    tune.report(loss=config["x"])


@with_checks(reports=("loss",))
def declared(config):
    tune.report(loss=config["x"])


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def script_env(monkeypatch, tmp_path):
    """A script's environment with nothing running: MLflow in a local SQLite file, a state dir of its own."""
    monkeypatch.setenv("SWEEPFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for name in ("PREFECT_API_URL", "DASK_SCHEDULER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _nothing_started(tmp_path) -> bool:
    home = tmp_path / "home"
    return not (home.exists() and any(home.iterdir())) and not (tmp_path / "mlflow.db").exists()


def test_a_prefect_api_that_does_not_answer_is_one_sentence_before_any_service_starts(
    script_env, monkeypatch
):
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{_closed_port()}/api")
    with pytest.raises(
        PreflightError, match=r"^PREFECT_API_URL='http://127\.0\.0\.1:\d+/api': .*prefect server start"
    ):
        tune.run(trainable, config={"x": tune.grid_search([1, 2])}, metric="loss", mode="min", verbose=0)
    assert _nothing_started(script_env)


def test_a_state_dir_that_cannot_be_written_is_refused_naming_sweepflow_home(script_env, monkeypatch):
    blocker = script_env / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SWEEPFLOW_HOME", str(blocker / "home"))
    tuner = tune.Tuner(
        trainable, param_space={"x": 1}, tune_config=tune.TuneConfig(metric="loss", mode="min")
    )
    with pytest.raises(PreflightError, match=r"^SWEEPFLOW_HOME='.*a-file/home': cannot write there"):
        tuner.fit()
    assert not (script_env / "mlflow.db").exists()


def test_a_metric_the_trainable_declares_it_never_reports_is_refused(script_env):
    with pytest.raises(
        PreflightError, match=r"^metric='accuracy': the training function never reports it .*'loss'"
    ):
        tune.run(declared, config={"x": 1}, metric="accuracy", mode="max", verbose=0)
    scheduler = tune.schedulers.ASHAScheduler(metric="val_loss", mode="min", max_t=4)
    with pytest.raises(
        PreflightError, match=r"^the scheduler's metric='val_loss': the training function never"
    ):
        tune.Tuner(declared, param_space={"x": 1}, tune_config=tune.TuneConfig(scheduler=scheduler)).fit()
    assert _nothing_started(script_env)


def test_s3_storage_without_its_bucket_is_refused_naming_the_storage_path(
    script_env, monkeypatch, s3_endpoint
):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint["url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    run_config = tune.RunConfig(name="s3-missing", storage_path="s3://no-such-bucket/tune")
    tuner = tune.Tuner(
        trainable,
        param_space={"x": 1},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=run_config,
    )
    with pytest.raises(PreflightError, match=r"^RunConfig\.storage_path='s3://no-such-bucket/tune': "):
        tuner.fit()
    assert _nothing_started(script_env)


def test_a_trainable_its_workers_cannot_import_is_refused_before_any_trial(script_env, monkeypatch, cluster):
    """A trainable from a package only the script's machine has travels by reference (cloudpickle names its
    module): one of the cluster's workers imports it first, and the refusal names the module and the worker."""
    package = script_env / "only_here"
    package.mkdir()
    (package / "only_here_trainable.py").write_text(
        textwrap.dedent(
            """
            from sweepflow import tune

            def train(config):
                tune.report(loss=config["x"])
            """
        )
    )
    # On the script's import path, not in its directory (sys.path[0], which the workers get as Ray's do): a
    # package installed where the script runs and nowhere else.
    monkeypatch.setattr(sys, "path", [sys.path[0], str(package), *sys.path[1:]])
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler.address)
    import only_here_trainable

    try:
        with pytest.raises(
            PreflightError,
            match=r"^the trainable='only_here_trainable:train': does not import on the Dask worker .*No module named",
        ):
            tune.run(only_here_trainable.train, config={"x": 1}, metric="loss", mode="min", verbose=0)
    finally:
        sys.modules.pop("only_here_trainable", None)
    assert not os.path.exists(script_env / "mlflow.db")
