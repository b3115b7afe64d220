"""The catalogue of mistakes `sweepflow run` refuses before any work (docs/preflight.md: "What sweepflow checks before it
starts"). Each case is one mistake a Ray Tune / Prefect / MLflow user makes; each must cost seconds, exit 2 with
one sentence naming the field, the value and the fix (no traceback), and create nothing: no MLflow store, no
Prefect flow run.

The cases run the CLI's `main` in this process (after the first, imports are warm, so the figure is the check's
own cost); the subprocess tests at the end show the same at the process level, and `--debug`.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import paths
import pytest
from conftest import free_port
from http_stub import serving

from sweepflow.flows.cli import main

BIN = os.path.dirname(sys.executable)

# (id, --set overrides, extra env, substrings the one message must hold). Placeholders filled per test:
# {closed} a loopback port nothing listens on, {http} a file server, {scheduler} a 1-worker Dask cluster
# without GPUs, {s3} a moto S3 endpoint (its bucket `sweepflow-existing` exists).
CASES: list[tuple[str, list[str], dict[str, str], list[str]]] = [
    # --- the configuration itself
    ("unknown-field", ["sweep.num_sample=4"], {}, ["num_sample", "Extra inputs are not permitted"]),
    ("wrong-type", ["sweep.num_samples=many"], {}, ["sweep.num_samples", "valid integer"]),
    ("zero-samples", ["sweep.num_samples=0"], {}, ["sweep.num_samples", "greater than or equal to 1"]),
    ("set-without-equals", ["sweep.num_samples"], {}, ["--set expects key=value"]),
    ("max-t-above-epochs", ["scheduler.max_t=10"], {}, ["scheduler.max_t=10 exceeds training.epochs=4"]),
    ("bad-mode", ["scheduler.mode=maximize"], {}, ["scheduler.mode", "'min' or 'max'"]),
    ("unknown-sampler", ["sweep.sampler=bayes"], {}, ["sweep.sampler", "'random', 'grid' or 'tpe'"]),
    (
        "bad-search-space",
        ["sweep.search_space={lr: {type: loguniform, low: 0, high: 0.1}}"],
        {},
        ["lr", "low"],
    ),
    (
        "tpe-with-grid",
        ["sweep.sampler=tpe", "sweep.search_space={lr: {type: grid, values: [0.1, 0.01]}}"],
        {},
        ["sampler='tpe' cannot search grid parameters ['lr']"],
    ),
    (
        "fractional-gpu-ddp",
        ["resources.gpus_per_rank=0.5", "resources.ranks_per_trial=2"],
        {},
        ["gpus_per_rank=0.5", "whole GPU per rank"],
    ),
    ("train-fn-not-a-path", ["training.train_fn=train"], {}, ["train_fn must be 'package.module:function'"]),
    # --- data
    ("unknown-dataset", ["data.name=imagenet"], {}, ["unknown dataset 'imagenet'", "mnist"]),
    (
        "unsupported-source-scheme",
        ["data.name=mnist", "data.source=ftpx://mirror/mnist"],
        {},
        ["unsupported scheme 'ftpx'"],
    ),
    (
        "no-training-data-left",
        ["data.val_fraction=0.5", "data.test_fraction=0.5"],
        {},
        ["val_fraction + test_fraction must be < 1"],
    ),
    ("source-for-bundled", ["data.source=/tmp"], {}, ["'digits' is bundled", "drop source"]),
    (
        "source-host-unreachable",
        ["data.name=mnist", "data.source=http://127.0.0.1:{closed}/mnist"],
        {},
        ["data.source=", "did not answer"],
    ),
    (
        "source-not-found",
        ["data.name=mnist", "data.source={http}/no-such-mirror"],
        {},
        ["data.source=", "HTTP 404"],
    ),
    ("source-dir-missing", ["data.name=mnist", "data.source=/no/such/dir"], {}, ["not a directory"]),
    (
        "source-bucket-missing",
        ["data.name=mnist", "data.source=s3://no-such-bucket/mnist"],
        {"s3": "1"},
        ["data.source='s3://no-such-bucket/mnist'", "does not exist"],
    ),
    # --- the training function and what it accepts
    ("train-fn-no-module", ["training.train_fn=nosuch.module:train"], {}, ["no module named 'nosuch'"]),
    (
        "train-fn-import-fails",
        ["training.train_fn=preflight_fns_broken:train"],
        {},
        ["importing 'preflight_fns_broken' failed with RuntimeError"],
    ),
    (
        "train-fn-missing",
        ["training.train_fn=sweepflow.tasks.training.loop:train_classifier"],
        {},
        ["has no attribute 'train_classifier'", "train_image_classifier"],
    ),
    (
        "train-fn-not-callable",
        ["training.train_fn=sweepflow.tasks.training.loop:OPTIMIZERS"],
        {},
        ["is a tuple, not a function"],
    ),
    ("train-fn-two-args", ["training.train_fn=preflight_fns:two_args"], {}, ["takes 2 required arguments"]),
    ("train-fn-keyword-only", ["training.train_fn=preflight_fns:keyword_only"], {}, ["['config']"]),
    ("unknown-model", ["training.model=resnet50"], {}, ["training.base_config=", "unknown model 'resnet50'"]),
    (
        "unknown-optimizer",
        ["training.base_config={optimizer: adamx}"],
        {},
        ["training.base_config=", "optimizer", "adamx"],
    ),
    ("negative-lr", ["training.base_config={lr: -0.1}"], {}, ["config['lr'] must be a positive number"]),
    (
        "sampled-batch-size-zero",
        ["sweep.search_space={batch_size: {type: choice, values: [0, 16]}}"],
        {},
        ["sweep.search_space=", "config['batch_size'] must be >= 1"],
    ),
    (
        "sampled-layer-width-zero",
        ["sweep.search_space={l1: {type: choice, values: [0]}}"],
        {},
        ["sweep.search_space=", "'l1' must be >= 1"],
    ),
    (
        "custom-validate",
        [
            "training.train_fn=preflight_fns:declared",
            "training.base_config={width: 0}",
            "selection.metric=loss",
            "selection.mode=min",
            "scheduler.metric=loss",
        ],
        {},
        ["config['width'] must be >= 1"],
    ),
    # --- metrics
    (
        "selection-metric-not-reported",
        ["selection.metric=val_acc"],
        {},
        ["selection.metric='val_acc'", "val_accuracy"],
    ),
    ("scheduler-metric-not-reported", ["scheduler.metric=accuracy"], {}, ["scheduler.metric='accuracy'"]),
    ("champion-metric-unknown", ["selection.champion_metric=accuracy"], {}, ["test_accuracy"]),
    # --- MLflow
    ("model-name-slash", ["mlflow.registered_model_name=team/classifier"], {}, ["cannot contain '/'"]),
    ("empty-experiment", ["mlflow.experiment_name=' '"], {}, ["mlflow.experiment_name", "is empty"]),
    ("tracking-scheme", ["mlflow.tracking_uri=mlflw://server"], {}, ["no tracking store for scheme 'mlflw'"]),
    (
        "tracking-server-down",
        ["mlflow.tracking_uri=http://alice:s3cret-token@127.0.0.1:{closed}"],
        {},
        ["mlflow.tracking_uri='http://***@127.0.0.1:", "health check"],
    ),
    # --- Prefect, Dask, S3
    (
        "prefect-down",
        [],
        {"PREFECT_API_URL": "http://127.0.0.1:{closed}/api"},
        ["PREFECT_API_URL=", "Prefect API"],
    ),
    ("dask-down", ["dask.scheduler_address=tcp://127.0.0.1:{closed}"], {}, ["no Dask scheduler answered"]),
    (
        "s3-endpoint-down",
        ["storage=s3://sweepflow-existing/runs"],
        {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:{closed}"},
        ["storage='s3://sweepflow-existing/runs'", "127.0.0.1"],
    ),
    (
        "s3-bucket-missing",
        ["storage=s3://no-such-bucket/runs"],
        {"s3": "1"},
        ["bucket 'no-such-bucket' does not exist"],
    ),
    # --- resources
    (
        "ranks-above-local-workers",
        ["resources.ranks_per_trial=3", "dask.n_workers=2"],
        {},
        ["no trial could ever start"],
    ),
    ("gpus-without-gpus", ["resources.gpus_per_rank=1", "resources.ranks_per_trial=1"], {}, ["has no GPU"]),
    ("cpus-above-worker", ["resources.cpus_per_rank=64"], {}, ["resources.cpus_per_rank=64.0", "core(s)"]),
    (
        "ranks-above-cluster",
        ["dask.scheduler_address={scheduler}", "resources.ranks_per_trial=2"],
        {},
        ["cannot hold one trial", "1 worker(s)"],
    ),
    (
        "gpus-on-cpu-cluster",
        ["dask.scheduler_address={scheduler}", "resources.ranks_per_trial=1", "resources.gpus_per_rank=1"],
        {},
        ["cannot hold one trial", "{'GPU': 1.0}"],
    ),
    (
        "synch-pbt-above-cluster",
        ["dask.scheduler_address={scheduler}", "resources.ranks_per_trial=1", "scheduler.type=pbt", "scheduler.synch=true",
         "scheduler.hyperparam_mutations={lr: [0.01, 0.1]}", "sweep.num_samples=3"],
        {},
        ["scheduler.type='pbt'", "waits for all 3 trials", "only 1 can run at once", "scheduler.synch=false"],
    ),
    (
        "synch-pbt-above-local-workers",
        ["scheduler.type=pbt", "scheduler.synch=true", "scheduler.hyperparam_mutations={lr: [0.01, 0.1]}",
         "sweep.num_samples=3", "dask.n_workers=2", "resources.ranks_per_trial=1"],
        {},
        ["scheduler.type='pbt'", "waits for all 3 trials", "only 2 can run at once"],
    ),
    # --- where state goes
    (
        "state-dir-unwritable",
        ["state_dir=/proc/sweepflow"],
        {},
        ["state_dir='/proc/sweepflow'", "cannot write"],
    ),
]


@pytest.fixture(scope="module")
def file_server(tmp_path_factory) -> Iterator[str]:
    """A plain HTTP server on loopback, serving an empty directory."""
    root = tmp_path_factory.mktemp("www")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format, *args):  # noqa: A002 - the base class's signature
            pass  # the test reads this process's stderr

    with serving(Quiet) as url:
        yield url


@pytest.fixture(scope="module")
def small_cluster() -> Iterator[str]:
    """A Dask cluster of one CPU worker process (no GPU resources)."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
    ) as c:
        yield c.scheduler_address


@pytest.fixture(scope="module")
def warm_imports() -> None:
    """The cases time the checks, not a cold interpreter's imports (the subprocess test below times those)."""
    import distributed  # noqa: F401
    import mlflow  # noqa: F401
    import s3fs  # noqa: F401

    import sweepflow.tasks.training.loop  # noqa: F401 - torch


def _needs(case: tuple) -> dict[str, str]:
    """The servers a case uses (fixture -> marker): its placeholders and its env say which."""
    _, overrides, env, _ = case
    text = " ".join([*overrides, *map(str, env.values())])
    needs = {}
    if "{scheduler}" in text:
        needs["small_cluster"] = "dask"
    if "s3" in env or "AWS_ENDPOINT_URL_S3" in env:
        needs["s3_endpoint"] = "s3"
    return needs


def _case_param(case: tuple) -> object:
    """Each case carries the markers of what it starts, so the ones that start nothing are in the fast lane."""
    return pytest.param(case, id=case[0], marks=[getattr(pytest.mark, m) for m in _needs(case).values()])


@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_each_mistake_is_refused_in_seconds_with_one_sentence_and_nothing_created(
    case, request, monkeypatch, tmp_path, capsys, file_server, warm_imports
):
    name, overrides, env, expected = case
    env = dict(env)
    servers = {fixture: request.getfixturevalue(fixture) for fixture in _needs(case)}
    fill = {"closed": free_port(), "http": file_server, "scheduler": servers.get("small_cluster", "")}
    home = tmp_path / "home"
    for key in ("MLFLOW_TRACKING_URI", "DASK_SCHEDULER_ADDRESS", "PREFECT_API_URL", "SWEEPFLOW_STORAGE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SWEEPFLOW_HOME", str(home))
    if env.pop("s3", None) or "AWS_ENDPOINT_URL_S3" in env:
        s3_endpoint = servers["s3_endpoint"]
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint["url"])
        _ensure_bucket(s3_endpoint, "sweepflow-existing")
    for key, value in env.items():
        monkeypatch.setenv(key, _fill(value, fill))
    # The CLI creates a Prefect flow run only by calling the pipeline flow, so a tripwire on it shows that a
    # refused run never gets there, without a Prefect server. (The flow's own pre-flight, for a deployment's
    # flow run, is checked against a real Prefect API: test_a_flow_run_with_bad_parameters_... below.)
    import sweepflow.flows.pipeline as pipeline

    flow_calls: list[object] = []
    monkeypatch.setattr(pipeline, "training_pipeline", lambda *a, **k: flow_calls.append((a, k)) or {})
    argv = ["run", "--no-server"]
    for item in overrides:
        argv += ["--set", _fill(item, fill)]

    started = time.monotonic()
    code = main(argv)
    took = time.monotonic() - started

    out, err = capsys.readouterr()
    assert code == 2, f"{name}: exit {code}\n{out[-2000:]}\n{err[-2000:]}"
    assert err.startswith("sweepflow: ") and "Traceback" not in err, err
    for text in expected:
        assert _fill(text, fill) in err, f"{name}: {text!r} not in {err!r}"
    assert "s3cret-token" not in err + out
    assert took < 60, f"{name}: refused after {took:.1f} s"  # seconds (even on a loaded 2-core machine), not minutes
    assert not (home / "mlflow.db").exists() and not (home / "mlartifacts").exists(), (
        "an MLflow store was created"
    )
    assert not (home / "data").exists(), "data was downloaded or prepared"
    assert not flow_calls, "the pipeline flow was called: a Prefect flow run was created"


def _fill(text: str, values: dict) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def _ensure_bucket(endpoint: dict, bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(**endpoint["storage_options"])
    if not fs.exists(bucket):
        fs.mkdir(bucket)


def test_the_catalogue_holds_at_least_30_mistakes_and_the_docs_list_them():
    assert len(CASES) >= 30
    page = open(paths.ROOT / "docs" / "preflight.md").read()
    missing = [name for name, *_ in CASES if f"`{name}`" not in page]
    assert not missing, f"docs/preflight.md's check list lacks {missing}"


@pytest.mark.subprocess
def test_the_command_exits_2_without_a_traceback_and_debug_shows_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DASK_"))}
    env["SWEEPFLOW_HOME"] = str(tmp_path / "home")
    argv = [os.path.join(BIN, "sweepflow"), "run", "--no-server", "--set", "training.model=resnet50"]
    started = time.monotonic()
    plain = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert plain.returncode == 2, plain.stderr
    assert plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr, plain.stderr
    assert "unknown model 'resnet50'" in plain.stderr
    assert took < 120, f"{took:.1f} s"  # a cold process: imports included, on a shared 2-core machine
    debug = subprocess.run([*argv, "--debug"], env=env, capture_output=True, text=True, timeout=120)
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "PreflightError" in debug.stderr


@pytest.mark.subprocess
def test_a_malformed_config_file_is_refused_by_the_warm_launcher_path_too(tmp_path):
    """Without --no-server the front process checks before it starts any service."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DASK_"))}
    env["SWEEPFLOW_HOME"] = str(tmp_path / "home")
    argv = [
        os.path.join(BIN, "sweepflow"),
        "run",
        "--set",
        "resources.ranks_per_trial=9",
        "--set",
        "dask.n_workers=2",
    ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no trial could ever start" in proc.stderr, proc.stderr
    assert not (tmp_path / "home" / "services").exists(), "services were started for a run that cannot work"


def test_an_undeclared_metric_stops_the_sweep_at_its_first_report_with_exit_2(
    monkeypatch, tmp_path, capsys, prefect_harness, cluster
):
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "SWEEPFLOW_STORAGE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler.address)  # the session's 2 workers
    monkeypatch.setenv("SWEEPFLOW_HOME", str(tmp_path / "home"))
    sets = [
        "training.train_fn=preflight_fns:undeclared",
        "training.model_fn=sweepflow.tasks.training.builtin:model_fn",
        "evaluation.evaluate_fn=sweepflow.tasks.training.builtin:evaluate_fn",
        "sweep.num_samples=6",
        "resources.ranks_per_trial=1",
    ]
    started = time.monotonic()
    code = main(["run", "--no-server", *[arg for item in sets for arg in ("--set", item)]])
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert (
        "never reports 'val_accuracy'" in err.splitlines()[-1] and "['epoch', 'loss']" in err.splitlines()[-1]
    )
    assert took < 120, f"{took:.1f} s: the sweep must stop at the first report, not time out"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) < 6, "trials went on starting after the first report showed the mistake"
    assert all(r.info.status in ("FAILED", "KILLED") for r in runs), [r.info.status for r in runs]


def test_a_flow_run_with_bad_parameters_fails_at_its_first_step_and_starts_nothing(
    monkeypatch, tmp_path, prefect_harness, warm_imports
):
    """As a deployment's flow run does: the parameters pass Prefect's schema, the pre-flight refuses them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, LogFilter
    from prefect.logging.handlers import APILogHandler

    from sweepflow.flows.config import PipelineConfig
    from sweepflow.flows.pipeline import training_pipeline

    for key in ("MLFLOW_TRACKING_URI", "DASK_SCHEDULER_ADDRESS", "SWEEPFLOW_STORAGE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SWEEPFLOW_HOME", str(tmp_path / "home"))
    config = PipelineConfig.model_validate({"training": {"model": "resnet50"}})
    started = time.monotonic()
    state = training_pipeline(config=config, return_state=True)
    took = time.monotonic() - started
    assert state.is_failed()
    assert "unknown model 'resnet50'" in state.message and "training.base_config" in state.message
    assert took < 90, f"{took:.1f} s"
    APILogHandler().flush()  # send the queued logs now
    with get_client(sync_client=True) as client:
        run_id = state.state_details.flow_run_id
        assert client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run_id]})) == []
        logs = client.read_logs(log_filter=LogFilter(flow_run_id={"any_": [run_id]}))
    assert any("unknown model 'resnet50'" in log.message for log in logs), [log.message[:200] for log in logs]
    assert not (tmp_path / "home" / "mlflow.db").exists() and not (tmp_path / "home" / "data").exists()


def test_the_front_process_checks_a_local_run_without_importing_dask_or_torch(tmp_path):
    """`sweepflow run`'s front process checks the configuration before it hands the run to the warm launcher. On
    a local cluster without GPUs that needs neither Dask nor torch: importing Dask cost every warm run ~0.4 s
    before it started (the launcher's child, which has both, checks everything again)."""
    code = (
        "import sys\n"
        "from sweepflow.flows.config_file import load_config_file\n"
        "from sweepflow.flows.settings import Settings, resolve_settings\n"
        "from sweepflow.flows.preflight import check_pipeline\n"
        "settings = Settings.from_env()\n"
        "config = resolve_settings(load_config_file(None, ['sweep.num_samples=2']), settings)\n"
        "check_pipeline(config, prefect_api_url=settings.prefect_api_url, imports=False)\n"
        "print(sorted(m for m in ('dask', 'distributed', 'torch', 'ddp_runtime') if m in sys.modules))\n"
    )
    env = {**os.environ, "SWEEPFLOW_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
