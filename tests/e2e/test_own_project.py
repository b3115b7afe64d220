"""A team's own project through the pipeline: their data, model and evaluation, registered and loadable.

Two projects that are not image classification:
- the one ``sweepflow init`` writes (a house-price regression: ``format: csv`` data, here on a moto S3), trained,
  evaluated and registered; retrained on new rows of the same S3 object, the new version becomes champion only
  if its test_rmse is better;
- ``tests/support/forecast_project`` (a time-series forecaster with its own ``prepare_fn`` over a directory of CSVs).
Each registered model is loaded back with ``mlflow.pyfunc`` in a fresh process (pt2: nothing of the project
needed there) and a prediction checked. Every mistake in a project's config is refused before any work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import paths
import pytest
from mlflow.tracking import MlflowClient

from sweepflow.flows.cli import main
from sweepflow.flows.config import BUILTIN_EVALUATE_FN, BUILTIN_MODEL_FN, PipelineConfig
from sweepflow.flows.config_file import load_config_file
from sweepflow.flows.init_project import package_name, write_project
from sweepflow.flows.settings import resolve_settings
from sweepflow.tasks.checks import PreflightError
from sweepflow.tasks.datasets import DataConfig, DatasetConfigError, prepare_dataset

HERE = paths.SUPPORT  # the example project beside the helpers
FORECAST = HERE / "forecast_project"


@pytest.fixture
def project(tmp_path) -> Path:
    directory = tmp_path / "houses"
    write_project(directory)
    return directory


# --------------------------------------------------------------------------------------- the contract, unit
def test_init_writes_a_project_whose_config_names_its_functions(project):
    cfg = load_config_file(project / "sweep.yaml")
    package = package_name(project)
    assert cfg.project_dir == str(project)
    assert cfg.data.source == str(project / "data" / "houses.csv") and cfg.data.name is None
    assert cfg.training.train_fn == f"{package}.model:train_fn"
    assert cfg.training.model_fn == f"{package}.model:model_fn"
    assert cfg.evaluation.evaluate_fn == f"{package}.model:evaluate_fn"
    table = pd.read_csv(project / "data" / "houses.csv")
    assert list(table.columns) == ["sqft", "rooms", "age", "distance_km", "price"] and len(table) == 1200
    with pytest.raises(FileExistsError, match="not empty"):
        write_project(project)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "digits", "source": "/x.csv", "format": "csv", "target": "y"}, "drop data.name"),
        ({"source": "/x.csv", "format": "csv"}, "data.target is missing".replace("data.", "DataConfig.")),
        ({"format": "parquet", "target": "y"}, "source is missing"),
        ({"source": "/x", "format": "csv", "target": "y", "prepare_fn": "a:b"}, "keep one"),
        ({"source": "/x", "prepare_fn": "no_colon"}, "'package.module:function'"),
        ({"source": "/x", "format": "image_folder", "target": "y"}, "target only applies"),
        ({"source": "/x.csv", "format": "csv", "target": "y", "checksums": {"x.csv": "0" * 32}}, "drop checksums"),
    ],
)
def test_own_data_configs_are_refused_in_one_sentence(data, message):
    with pytest.raises(DatasetConfigError) as raised:
        DataConfig(**data)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_csv_data_is_split_once_per_version_and_again_when_rows_arrive(tmp_path):
    source = tmp_path / "houses.csv"
    write_project(tmp_path / "p")
    shutil.copyfile(tmp_path / "p" / "data" / "houses.csv", source)
    cfg = DataConfig(source=str(source), format="csv", target="price", cache_dir=str(tmp_path / "cache"))
    first = prepare_dataset(cfg)
    sizes = {split: len(pd.read_csv(Path(first.path) / f"{split}.csv")) for split in ("train", "val", "test")}
    assert sizes == first.sizes == {"train": 840, "val": 180, "test": 180}
    schema = json.loads((Path(first.path) / "schema.json").read_text())
    assert schema == {"target": "price", "features": ["sqft", "rooms", "age", "distance_km"], "format": "csv"}
    assert prepare_dataset(cfg) == first  # unchanged: reused, nothing prepared again
    with open(source, "a") as f:
        f.write("1000.0,3,10.0,5.00,300000\n" * 20)
    second = prepare_dataset(cfg)
    assert second.path != first.path and second.checksum != first.checksum and sum(second.sizes.values()) == 1220


def test_an_image_folder_is_split_per_class(tmp_path):
    for label in ("cat", "dog"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(20):
            (tmp_path / "images" / label / f"{i}.png").write_bytes(bytes([i]) * 8)
    cfg = DataConfig(source=str(tmp_path / "images"), format="image_folder", cache_dir=str(tmp_path / "cache"))
    prepared = prepare_dataset(cfg)
    assert prepared.num_classes == 2 and prepared.sizes == {"train": 28, "val": 6, "test": 6}
    for split, per_class in (("train", 14), ("val", 3), ("test", 3)):
        for label in ("cat", "dog"):
            assert len(list((Path(prepared.path) / split / label).iterdir())) == per_class


def test_a_prepare_fn_runs_once_per_version_of_a_directory(tmp_path, monkeypatch):
    from forecast_project.forecast.model import series_csv

    series = tmp_path / "series"
    series.mkdir()
    for seed in range(2):
        (series / f"s{seed}.csv").write_text(series_csv(seed))
    calls = []

    def prepare(raw_dir: str, out_dir: str) -> None:
        calls.append(sorted(os.listdir(raw_dir)))
        from forecast_project.forecast.model import prepare as real

        real(raw_dir, out_dir)

    cfg = DataConfig(source=str(series), prepare_fn="x:prepare", cache_dir=str(tmp_path / "cache"))
    first = prepare_dataset(cfg, import_fn=lambda path: prepare)
    prepare_dataset(cfg, import_fn=lambda path: prepare)
    assert calls == [["s0.csv", "s1.csv"]], "prepared again although the data did not change"
    with np.load(Path(first.path) / "train.npz") as npz:
        assert npz["x"].shape[1] == 16 and len(npz["x"]) == len(npz["y"])
    (series / "s2.csv").write_text(series_csv(2))
    prepare_dataset(cfg, import_fn=lambda path: prepare)
    assert calls[-1] == ["s0.csv", "s1.csv", "s2.csv"]


# ------------------------------------------------------------------------------- mistakes, before any work
def _bad_model_module(project: Path) -> None:
    (project / package_name(project) / "broken.py").write_text(
        "def model(checkpoint, extra):\n    pass\n\ndef prepare(raw_dir):\n    pass\n"
    )


MISTAKES = [
    # (name, --set overrides, words in the one sentence)
    ("no model_fn", ["training.model_fn=null"], ["add training.model_fn", "builtin:model_fn"]),
    ("built-in classifier on own data", ["training.train_fn=sweepflow.tasks.training.loop:train_image_classifier"],
     ["built-in image classifier cannot read"]),
    ("bundled name too", ["data.name=digits"], ["drop data.name"]),
    ("target not in header", ["data.target=cost"], ["data.target='cost'", "is not a column"]),
    ("champion not a test metric", ["selection.champion_metric=rmse"], ["test_<name>"]),
    ("evaluate_fn not importable", ["evaluation.evaluate_fn=nowhere.mod:evaluate"], ["no module named 'nowhere'"]),
    ("model_fn wrong signature", ["training.model_fn={package}.broken:model"], ["cannot be called as model(checkpoint)"]),
    ("source missing", ["data.source=/nonexistent/houses.csv"], ["holds no files"]),
]


@pytest.mark.parametrize(("name", "overrides", "words"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_project_mistake_is_one_sentence_exit_2_and_no_run(
    name, overrides, words, project, monkeypatch, tmp_path, capsys
):
    _bad_model_module(project)
    package = package_name(project)
    home = tmp_path / "home"
    for key in ("MLFLOW_TRACKING_URI", "DASK_SCHEDULER_ADDRESS", "PREFECT_API_URL", "SWEEPFLOW_STORAGE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SWEEPFLOW_HOME", str(home))
    import sweepflow.flows.pipeline as pipeline

    flow_calls: list[object] = []
    monkeypatch.setattr(pipeline, "training_pipeline", lambda *a, **k: flow_calls.append((a, k)) or {})
    argv = ["run", "--no-server", "--config", str(project / "sweep.yaml")]
    for item in overrides:
        argv += ["--set", item.replace("{package}", package)]
    started = time.monotonic()
    code = main(argv)
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 2, f"{name}: exit {code}\n{out[-2000:]}\n{err[-2000:]}"
    assert err.startswith("sweepflow: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, f"{name}: {word!r} not in {err!r}"
    assert took < 60 and not flow_calls and not (home / "data").exists() and not (home / "mlflow.db").exists()


def test_a_package_the_dask_workers_cannot_import_is_refused_before_any_download(cluster, tmp_path, monkeypatch):
    """Installed where the flow runs only (here: on this process's path, not the workers'): the pre-flight asks one
    worker to import the trial's functions and names the key, the worker and the fix."""
    from sweepflow.flows.preflight import check_pipeline

    package = tmp_path / "onlyhere_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("def train_fn(config):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = resolve_settings(
        PipelineConfig.model_validate(
            {
                "state_dir": str(tmp_path / "state"),
                "dask": {"scheduler_address": cluster.scheduler.address},
                "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'm.db'}"},
                "training": {"train_fn": "onlyhere_pkg.model:train_fn", "model_fn": BUILTIN_MODEL_FN},
                "evaluation": {"evaluate_fn": BUILTIN_EVALUATE_FN},
                "selection": {"metric": "val_loss", "mode": "min"},
                "scheduler": {"type": "fifo"},
            }
        )
    )
    with pytest.raises(PreflightError, match=r"training.train_fn='onlyhere_pkg.model:train_fn': does not import on "
                       r"the Dask worker tcp://.*No module named 'onlyhere_pkg'.*install your package on the workers"):
        check_pipeline(cfg, imports=False)
    assert not (tmp_path / "state" / "data").exists()


# ---------------------------------------------------------------------------------------------- end to end
PREDICT = r"""
import json, sys
import mlflow
import numpy as np
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
x = np.array(json.loads(sys.argv[3]), dtype=np.float32)
print(json.dumps(np.asarray(model.predict(x)).reshape(-1).tolist()))
"""


def _predict_in_fresh_process(tracking_uri: str, model_uri: str, rows: np.ndarray) -> np.ndarray:
    """Load the registered model with mlflow.pyfunc in a new interpreter that cannot import the project."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", PREDICT, tracking_uri, model_uri, json.dumps(rows.tolist())],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return np.array(json.loads(out.stdout.strip().splitlines()[-1]))


def _quick(cfg: PipelineConfig, cluster, tracking_uri: str, tmp_path: Path, **more) -> PipelineConfig:
    sections = {
        "state_dir": str(tmp_path / "state"),
        "dask": {"scheduler_address": cluster.scheduler.address},
        "mlflow": {**cfg.mlflow.model_dump(), "tracking_uri": tracking_uri},
        **more,
    }
    return resolve_settings(PipelineConfig.model_validate({**cfg.model_dump(), **sections}))


def _sweepflow_run(project: Path, sets: list[str], tmp_path: Path, capsys) -> dict:
    """``sweepflow run --no-server --config sweep.yaml --set ...`` as a user types it (in this process, on the
    services the environment names); its summary."""
    summary = tmp_path / f"summary-{os.urandom(3).hex()}.json"
    argv = ["run", "--no-server", "--config", str(project / "sweep.yaml"), "--summary-json", str(summary)]
    for item in sets:
        argv += ["--set", item]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    assert "Registered model: " in out
    return json.loads(summary.read_text())


@pytest.mark.s3
def test_the_init_project_on_s3_trains_registers_and_retrains_on_new_rows(
    project, services, s3_endpoint, monkeypatch, tmp_path, capsys
):
    import s3fs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint["url"])
    fs = s3fs.S3FileSystem(**s3_endpoint["storage_options"])
    if not fs.exists("houses-data"):
        fs.mkdir("houses-data")
    fs.put_file(str(project / "data" / "houses.csv"), "houses-data/houses.csv")
    name = f"houses-{os.urandom(3).hex()}"
    sets = [
        "data.source=s3://houses-data/houses.csv",
        "sweep.num_samples=3",
        "training.epochs=6",
        "scheduler.max_t=6",
        "scheduler.grace_period=2",
        "resources.ranks_per_trial=1",
        f"mlflow.registered_model_name={name}",
        f"mlflow.experiment_name={name}",
    ]
    first = _sweepflow_run(project, sets, tmp_path, capsys)
    reg = first["registration"]
    assert reg["version"] == 1 and reg["became_champion"], reg
    metrics = first["test_metrics"]
    assert set(metrics) == {"test_rmse", "test_mae", "test_r2"} and metrics["test_r2"] > 0.8, metrics
    client = MlflowClient(services["mlflow"])
    parent = client.get_run(first["parent_run_id"])
    assert parent.data.metrics["test_rmse"] == pytest.approx(metrics["test_rmse"])
    assert parent.data.tags["sweepflow.dataset"] == "houses"
    assert client.get_run(first["best_trial"]["run_id"]).data.metrics["test_rmse"] == pytest.approx(
        metrics["test_rmse"]
    )

    # The registered model takes the CSV's columns as they are and predicts prices, in a process without it.
    table = pd.read_csv(project / "data" / "houses.csv")
    rows = table[["sqft", "rooms", "age", "distance_km"]].to_numpy(np.float32)[:8]
    predicted = _predict_in_fresh_process(services["mlflow"], f"models:/{name}/1", rows)
    relative = np.abs(predicted - table["price"].to_numpy()[:8]) / table["price"].to_numpy()[:8]
    assert predicted.shape == (8,) and float(np.median(relative)) < 0.15, (predicted, relative)

    # New rows at the same S3 object: a new data version, a new model; champion only if its test_rmse is lower.
    more = "".join(f"{1000 + i}.0,3,20.0,5.00,{300000 + 150 * i}\n" for i in range(60))
    fs.pipe_file("houses-data/houses.csv", (project / "data" / "houses.csv").read_bytes() + more.encode())
    fs.invalidate_cache()
    # The retrain under PBT, Tune's class named in the config: the project's train_fn continues from the
    # checkpoints PBT hands it.
    pbt = (
        "scheduler={type: pbt, metric: val_rmse, mode: min, perturbation_interval: 2, quantile_fraction: 0.5, "
        "hyperparam_mutations: {lr: {type: loguniform, low: 3.0e-3, high: 3.0e-2}}}"
    )
    second = _sweepflow_run(project, [s for s in sets if not s.startswith("scheduler.")] + [pbt], tmp_path, capsys)
    assert client.get_run(second["parent_run_id"]).data.params["scheduler.type"] == "pbt"
    assert second["registration"]["version"] == 2
    checksums = [client.get_run(r["parent_run_id"]).data.tags["sweepflow.data_checksum"] for r in (first, second)]
    assert checksums[0] != checksums[1], "the retrain did not see the new rows"
    better = second["test_metrics"]["test_rmse"] < metrics["test_rmse"]
    assert second["registration"]["became_champion"] is better
    champion = client.get_model_version_by_alias(name, "champion").version
    assert champion == ("2" if better else "1")


def test_a_forecaster_with_its_own_prepare_fn_is_registered_and_loads_anywhere(
    prefect_harness, mlflow_server, cluster, tmp_path
):
    from forecast_project.forecast.model import WINDOW, series_csv

    from sweepflow.flows.pipeline import training_pipeline

    project = tmp_path / "forecast_project"
    shutil.copytree(FORECAST, project, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "series").mkdir()
    for seed in range(3):
        (project / "series" / f"s{seed}.csv").write_text(series_csv(seed))
    name = f"forecast-{os.urandom(3).hex()}"
    cfg = load_config_file(
        project / "sweep.yaml", [f"mlflow.registered_model_name={name}", f"mlflow.experiment_name={name}"]
    )
    summary = training_pipeline(config=_quick(cfg, cluster, mlflow_server, tmp_path))
    metrics = summary["test_metrics"]
    assert summary["registration"]["version"] == 1 and set(metrics) == {"test_mse", "test_mae", "test_naive_mse"}
    assert metrics["test_mse"] < metrics["test_naive_mse"], metrics  # it learned more than "tomorrow = today"
    t = np.arange(WINDOW + 1)
    wave = (np.sin(2 * np.pi * t / 50) + 0.5 * np.sin(2 * np.pi * t / 13)).astype(np.float32)
    predicted = _predict_in_fresh_process(mlflow_server, f"models:/{name}/1", wave[None, :WINDOW])
    assert predicted.shape == (1,) and abs(predicted[0] - wave[WINDOW]) < 0.3, (predicted, wave[WINDOW])


def test_a_tune_experiment_hands_its_best_trial_to_the_same_evaluation_and_registry(services, tmp_path):
    """Both faces share the stages after the sweep: ``tune.register_best`` on a ResultGrid."""
    from forecast_project.forecast import model as forecast

    import ddp_runtime as train
    from ddp_runtime.torch import TorchTrainer
    from sweepflow import tune

    series = tmp_path / "series"
    series.mkdir()
    for seed in range(3):
        (series / f"s{seed}.csv").write_text(forecast.series_csv(seed))
    data = DataConfig(source=str(series), prepare_fn="forecast:prepare", cache_dir=str(tmp_path / "cache"))
    prepared = prepare_dataset(data, import_fn=lambda path: forecast.prepare)
    trainer = TorchTrainer(
        forecast.train_fn,
        train_loop_config={"data_path": prepared.path, "epochs": 5, "hidden": 16},
        scaling_config=train.ScalingConfig(num_workers=1),
    )
    grid = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([0.003, 0.02])}},
        tune_config=tune.TuneConfig(metric="val_mse", mode="min"),
        run_config=tune.RunConfig(name="forecast-tune", verbose=0),
    ).fit()
    name = f"forecast-tune-{os.urandom(3).hex()}"
    registration = tune.register_best(
        grid,
        model_fn=forecast.model_fn,
        evaluate_fn=forecast.evaluate_fn,
        data_path=prepared.path,
        registered_model_name=name,
        champion_metric="test_mse",
        champion_mode="min",
    )
    metrics = registration["metrics"]
    assert registration["version"] == 1 and registration["became_champion"]
    assert metrics["test_mse"] < metrics["test_naive_mse"], metrics
    best_run = MlflowClient(services["mlflow"]).get_run(grid.get_best_result().mlflow_run_id)
    assert best_run.data.metrics["test_mse"] == pytest.approx(metrics["test_mse"])
    rows = np.linspace(-1, 1, 2 * forecast.WINDOW, dtype=np.float32).reshape(2, forecast.WINDOW)
    assert _predict_in_fresh_process(services["mlflow"], f"models:/{name}@champion", rows).shape == (2,)


def _break_model_fn_while(project: Path, flag: Path, calls: Path) -> None:
    """The init project with a bug in ``model_fn`` while ``flag`` exists (its evaluation builds the model itself),
    and a ``train_fn`` that counts its calls into ``calls`` (a resume must train nothing)."""
    path = project / package_name(project) / "model.py"
    source = path.read_text()
    source = source.replace(
        "def train_fn(config: dict) -> None:\n",
        f"def train_fn(config: dict) -> None:\n    with open({str(calls)!r}, 'a') as f:\n        f.write('call\\n')\n",
    )
    source = source.replace(
        '    model.load_state_dict(saved["state"])\n    return model.eval()\n',
        f'    model.load_state_dict(saved["state"])\n    if os.path.exists({str(flag)!r}):\n'
        '        return saved["stats_v2"]  # the bug: a key the checkpoint does not have\n    return model.eval()\n',
    )
    source = source.replace(
        "    model = model_fn(checkpoint)\n    x, y, _ = load_split(data_path, \"test\")",
        "    with checkpoint.as_directory() as d:\n"
        "        saved = torch.load(os.path.join(d, 'model.pt'), weights_only=False)\n"
        "    model = PriceModel(len(saved['features']), saved['hidden'], saved['stats'])\n"
        "    model.load_state_dict(saved['state'])\n"
        "    model.eval()\n"
        "    x, y, _ = load_split(data_path, \"test\")",
    )
    assert source.count(str(flag)) == 1 and source.count(str(calls)) == 1 and "saved['stats']" in source
    path.write_text(source)


def test_a_failure_after_the_sweep_is_one_sentence_and_its_resume_registers_without_training_again(
    project, services, tmp_path, capsys
):
    """Issue 62: the sweep's trials stay recorded, the command says what failed where and how to finish, and
    `--resume` after the fix evaluates and registers without calling train_fn once."""
    flag, calls = tmp_path / "BREAK", tmp_path / "train_calls.log"
    _break_model_fn_while(project, flag, calls)
    flag.touch()
    name = f"houses-{os.urandom(3).hex()}"
    argv = ["run", "--no-server", "--config", str(project / "sweep.yaml")]
    for item in ["sweep.num_samples=2", "training.epochs=2", "scheduler.max_t=2", "scheduler.grace_period=1",
                 "resources.ranks_per_trial=1", f"mlflow.registered_model_name={name}", f"mlflow.experiment_name={name}"]:
        argv += ["--set", item]
    assert main(argv) == 1
    failed_at = time.monotonic()
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err[-3000:]
    said = err.strip().splitlines()[-1]
    assert said.startswith(
        f"sweepflow: the registration failed after the sweep: training.model_fn='{package_name(project)}.model:model_fn' "
        "raised KeyError: 'stats_v2' ("
    ), said
    assert f"{package_name(project)}/model.py:" in said and "the sweep's 2 trial(s) are recorded in MLflow run" in said
    parent = said.split("--resume ")[1].split()[0]
    assert said.endswith(
        f"finish the run without training again: sweepflow run --config {project / 'sweep.yaml'} --no-server --resume {parent} "
        "with the same 7 --set option(s)"
    ), said
    trained = calls.read_text().count("call")
    client = MlflowClient(services["mlflow"])
    assert client.get_run(parent).info.status == "FAILED"
    assert not client.search_model_versions(f"name='{name}'")
    children = client.search_runs([client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 2 and all("val_rmse" in c.data.metrics for c in children)

    flag.unlink()  # the fix
    summary = tmp_path / "summary.json"
    assert main([*argv, "--resume", parent, "--summary-json", str(summary)]) == 0, capsys.readouterr().err[-3000:]
    registered_after = time.monotonic() - failed_at
    assert calls.read_text().count("call") == trained, "the resume trained again"
    done = json.loads(summary.read_text())
    assert done["parent_run_id"] == parent and done["registration"]["version"] == 1
    assert client.get_run(parent).info.status == "FINISHED"
    assert {c.info.run_id for c in children} == {
        c.info.run_id for c in client.search_runs([client.get_run(parent).info.experiment_id],
                                                   f"tags.mlflow.parentRunId = '{parent}'")
    }
    rows = pd.read_csv(project / "data" / "houses.csv")[["sqft", "rooms", "age", "distance_km"]].to_numpy(np.float32)[:3]
    assert _predict_in_fresh_process(services["mlflow"], f"models:/{name}/1", rows).shape == (3,)
    print(f"failure -> registered with --resume: {registered_after:.1f} s")
