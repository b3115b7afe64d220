"""``sweepflow init DIR``: a small working project of one's own, to run, read and replace piece by piece.

It is the pipeline's contract made concrete (docs/own-project.md): a tabular regression on a generated
CSV of houses, with the four functions a project plugs in (``train_fn``, ``model_fn``, ``evaluate_fn``; the data
needs no ``prepare_fn``: ``format: csv`` splits it), ``sweep.yaml`` naming them, and ``prefect.yaml`` + ``flow.py``
that deploy the pipeline on this project. ``cd DIR && sweepflow run --config sweep.yaml`` trains, evaluates and
registers at once.
"""

from __future__ import annotations

import keyword
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np

#: Rows of the generated CSV: enough for a useful split (70/15/15), small enough to train in seconds.
ROWS = 1200


def package_name(directory: Path) -> str:
    """A Python package name from the project directory's name (``my-houses`` -> ``my_houses``)."""
    name = re.sub(r"\W+", "_", directory.resolve().name).strip("_").lower() or "project"
    if name[0].isdigit() or keyword.iskeyword(name) or name in ("sweepflow", "ddp_runtime", "flows", "tasks"):
        name = f"project_{name}"
    return name


def houses_csv(rows: int = ROWS, seed: int = 0) -> str:
    """A seeded table of houses: size, rooms, age, distance to the centre, and a price that depends on them
    (non-linearly) plus noise: a regression a small MLP learns in seconds."""
    rng = np.random.default_rng(seed)
    sqft = rng.uniform(400, 3500, rows)
    rooms = rng.integers(1, 7, rows)
    age = rng.uniform(0, 80, rows)
    distance_km = rng.uniform(0.5, 30, rows)
    price = (
        60_000
        + 180 * sqft
        + 12_000 * rooms
        - 900 * age
        + 250_000 * np.exp(-distance_km / 6)
        + rng.normal(0, 15_000, rows)
    )
    lines = ["sqft,rooms,age,distance_km,price"]
    lines += [
        f"{a:.1f},{b},{c:.1f},{d:.2f},{e:.0f}" for a, b, c, d, e in zip(sqft, rooms, age, distance_km, price, strict=True)
    ]
    return "\n".join(lines) + "\n"


MODEL_PY = '''"""{package}'s model: a small MLP regressor of house prices, trained Ray-Train style on each DDP rank.

The four functions sweepflow's pipeline calls (sweep.yaml names them):
    train_fn(config)                      every rank of every trial; reports val_rmse, checkpoints the model
    model_fn(checkpoint)                  the best checkpoint's model, for the registry: the module alone (its
                                          input example: test.csv's first rows), or (module, input_example)
    evaluate_fn(checkpoint, data_path)    the test-set metrics of the best checkpoint (logged as test_<name>)
config["data_path"] is the prepared data: train.csv, val.csv, test.csv and schema.json (format: csv).
"""

from __future__ import annotations

import json
import os
import tempfile

import fsspec
import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ddp_runtime as train
from ddp_runtime.torch import prepare_data_loader, prepare_model


def load_split(data_path: str, split: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """One split as (features float32, target float32, feature names); data_path may be local or s3://."""
    with fsspec.open(f"{{data_path}}/schema.json", "r") as f:
        schema = json.load(f)
    with fsspec.open(f"{{data_path}}/{{split}}.csv", "r") as f:
        table = pd.read_csv(f)
    x = torch.tensor(table[schema["features"]].to_numpy(np.float32))
    y = torch.tensor(table[schema["target"]].to_numpy(np.float32))
    return x, y, schema["features"]


class PriceModel(nn.Module):
    """Raw features in, price out: the scaling learned from the training split travels inside the model, so
    the registered model takes the CSV's columns as they are."""

    def __init__(self, n_features: int, hidden: int, stats: dict[str, list[float]]) -> None:
        super().__init__()
        self.register_buffer("x_mean", torch.tensor(stats["x_mean"]))
        self.register_buffer("x_std", torch.tensor(stats["x_std"]))
        self.register_buffer("y_mean", torch.tensor(stats["y_mean"]))
        self.register_buffer("y_std", torch.tensor(stats["y_std"]))
        self.net = nn.Sequential(
            nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.x_mean) / self.x_std).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scaled(x) * self.y_std + self.y_mean


def train_fn(config: dict) -> None:
    x, y, features = load_split(config["data_path"], "train")
    val_x, val_y, _ = load_split(config["data_path"], "val")
    stats = {{
        "x_mean": x.mean(0).tolist(), "x_std": x.std(0).clamp_min(1e-6).tolist(),
        "y_mean": [float(y.mean())], "y_std": [float(y.std())],
    }}
    torch.manual_seed(config.get("seed", 0))
    model = PriceModel(len(features), config["hidden"], stats)
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:  # a restarted trial, or one that PBT or HyperBand continues: from its last epoch
        with checkpoint.as_directory() as d:
            saved = torch.load(os.path.join(d, "model.pt"), weights_only=False)
        model.load_state_dict(saved["state"])
        start = saved["epoch"]
    model = prepare_model(model)
    loader = prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=config["batch_size"], shuffle=True))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    core = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    for epoch in range(start, config["epochs"]):
        if train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        model.train()
        for xb, yb in loader:
            # the loss on the scaled target: every trial's learning rate means the same whatever the prices
            loss = nn.functional.mse_loss(model(xb), yb) / core.y_std.pow(2).squeeze()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        core.eval()
        with torch.no_grad():
            val_rmse = float(torch.sqrt(nn.functional.mse_loss(core(val_x), val_y)))
        with tempfile.TemporaryDirectory() as d:
            torch.save({{"state": core.state_dict(), "hidden": config["hidden"], "features": features,
                        "stats": stats, "epoch": epoch + 1}}, os.path.join(d, "model.pt"))
            train.report(
                {{"epoch": epoch + 1, "val_rmse": val_rmse, "train_loss": float(loss)}},
                checkpoint=train.Checkpoint.from_directory(d),
            )


def model_fn(checkpoint: train.Checkpoint) -> nn.Module:
    """The trained module. sweepflow stores it with the first rows of test.csv's features as its input example
    (MLflow infers the signature from them); return (model, x[:4]) to choose the example yourself."""
    with checkpoint.as_directory() as d:
        saved = torch.load(os.path.join(d, "model.pt"), weights_only=False)
    model = PriceModel(len(saved["features"]), saved["hidden"], saved["stats"])
    model.load_state_dict(saved["state"])
    return model.eval()


def evaluate_fn(checkpoint: train.Checkpoint, data_path: str) -> dict[str, float]:
    model = model_fn(checkpoint)
    x, y, _ = load_split(data_path, "test")
    with torch.no_grad():
        error = model(x) - y
    rmse = float(error.pow(2).mean().sqrt())
    return {{"rmse": rmse, "mae": float(error.abs().mean()), "r2": float(1 - error.pow(2).sum() / (y - y.mean()).pow(2).sum())}}
'''

SWEEP_YAML = """# {package}: sweepflow's pipeline on this project. Paths are relative to this file.
#   sweepflow run --config sweep.yaml          (README.md: what each part is)
data:
  source: data/houses.csv      # any fsspec URL or path: s3://bucket/houses.csv, https://..., a directory
  format: csv                  # split without code: train.csv / val.csv / test.csv + schema.json
  target: price
training:
  train_fn: {package}.model:train_fn
  model_fn: {package}.model:model_fn
  epochs: 12
evaluation:
  evaluate_fn: {package}.model:evaluate_fn
sweep:
  search_space:
    hidden: {{type: choice, values: [16, 32, 64]}}
    lr: {{type: loguniform, low: 3.0e-3, high: 3.0e-2}}
    batch_size: {{type: choice, values: [32, 64]}}
  num_samples: 6
scheduler: {{metric: val_rmse, mode: min, max_t: 12, grace_period: 4}}
resources: {{ranks_per_trial: 2}}
selection: {{metric: val_rmse, mode: min, champion_metric: test_rmse, champion_mode: min}}
mlflow: {{experiment_name: {package}, registered_model_name: {package}-price}}
"""

FLOW_PY = '''"""{package}'s deployment entry point: sweepflow's training pipeline on this project's sweep.yaml."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from sweepflow.flows.config_file import load_config_file
from sweepflow.flows.pipeline import training_pipeline

HERE = Path(__file__).resolve().parent


@flow(name="{package}-pipeline", log_prints=True)
def {package}_pipeline(overrides: list[str] | None = None) -> dict:
    """sweep.yaml, with `key=value` overrides (as `sweepflow run --set`), e.g. ["sweep.num_samples=12"]."""
    return training_pipeline(config=load_config_file(HERE / "sweep.yaml", overrides or []))
'''

PREFECT_YAML = """# {package}'s deployments. With PREFECT_API_URL and the stack's settings in the environment
# (`set -a; . ~/.sweepflow/stack/stack.env; set +a` after `infra/stack up`), from this directory:
#   prefect --no-prompt deploy --all
#   prefect deployment run '{package}-pipeline/default' --watch
# The worker runs the flow from this directory (the pull step), so it and the Dask workers import
# {package} from here: on other machines, install it there instead (pip install .).
name: {package}
prefect-version: 3.8.8

build:
  - prefect.deployments.steps.run_shell_script:
      id: checkout
      script: pwd
      stream_output: false

push: null

pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{{{{ checkout.stdout }}}}"

deployments:
  - name: default
    entrypoint: flow.py:{package}_pipeline
    parameters: {{}}
    # stream_output false: the flow run outlives a worker that dies (its logs: the Prefect UI)
    work_pool: {{name: sweepflow-process, work_queue_name: default, job_variables: {{stream_output: false}}}}
  - name: nightly-retrain
    description: Retrains at 02:00 UTC on whatever data/houses.csv (or your source) holds then; the new model
      becomes champion only if its test_rmse beats the champion's.
    entrypoint: flow.py:{package}_pipeline
    parameters: {{}}
    schedules:  # off until you enable it: prefect deployment schedule resume '{package}-pipeline/nightly-retrain' <id>
      - cron: "0 2 * * *"
        timezone: UTC
        active: false
    concurrency_limit: {{limit: 1, collision_strategy: CANCEL_NEW}}
    # stream_output false: the flow run outlives a worker that dies (its logs: the Prefect UI)
    work_pool: {{name: sweepflow-process, work_queue_name: default, job_variables: {{stream_output: false}}}}
"""

PYPROJECT = """[project]
name = "{package}"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["sweepflow"]

[tool.setuptools]
packages = ["{package}"]
"""

README = """# {package}

A project on sweepflow: a house-price regression (data/houses.csv, generated) swept, trained with DDP,
evaluated and registered by sweepflow's pipeline.

    sweepflow run --config sweep.yaml     # sweep, evaluate the best on the test split, register {package}-price

- `{package}/model.py`: `train_fn` (each rank of each trial), `model_fn` (the registered model: the module
  alone, or `(module, input_example)`), `evaluate_fn` (test metrics, logged as test_<name>). Replace them with
  yours; keep the signatures. If evaluation or registration fails after the sweep, the error says so in one
  sentence; fix it and run the command it prints (`sweepflow run --config sweep.yaml --resume <run id>`): it
  evaluates and registers again without training.
- `sweep.yaml`: the data (`data.source`: a path or any fsspec URL; `format: csv` + `target`, or your own
  `data.prepare_fn`), the functions, the search space. `--set key=value` overrides one setting.
- `prefect.yaml` + `flow.py`: deployments of this pipeline (on demand, nightly): `prefect deploy --all`.
- Load the model anywhere: `mlflow.pyfunc.load_model("models:/{package}-price@champion").predict(x)`.
"""


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


#: ``sweepflow init --template``: the training loop the project's train_fn is written with.
TEMPLATES = ("pytorch", "lightning", "transformers")


def write_project(directory: Path, template: str = "pytorch") -> list[Path]:
    """Write the project into ``directory`` (created; it must be empty or new); returns the files written.
    ``template``: a plain PyTorch loop (the default), a Lightning ``Trainer`` or a Hugging Face ``Trainer``
    (``TEMPLATES``)."""
    if template not in TEMPLATES:
        raise ValueError(f"--template {template!r}: choose one of {', '.join(TEMPLATES)}")
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(
            f"{directory} is not empty: `sweepflow init` writes a new project; give it a new directory"
        )
    package = package_name(directory)
    if _installed(package):
        raise ValueError(
            f"{directory}: its package would be named {package!r}, which is already an installed module that the "
            "project's would hide (its imports would break): give the directory another name"
        )
    model_py, sweep_yaml, data, extra = MODEL_PY, SWEEP_YAML, {"data/houses.csv": houses_csv()}, None
    if template == "lightning":
        from sweepflow.flows import init_lightning as chosen

        model_py, extra = chosen.MODEL_PY, chosen.EXTRA
        sweep_yaml = SWEEP_YAML.replace("pipeline on this project", "pipeline on this Lightning project")
    elif template == "transformers":
        from sweepflow.flows import init_transformers as chosen

        model_py, sweep_yaml, extra = chosen.MODEL_PY, chosen.SWEEP_YAML, chosen.EXTRA
        data = {"data/reviews.csv": chosen.reviews_csv()}
    readme = README.format(package=package)
    if template == "transformers":
        readme = readme.replace("a house-price regression (data/houses.csv, generated)", "a review classifier "
                                "(data/reviews.csv, generated; a BERT-style model and a Hugging Face Trainer)")
        readme = readme.replace(f"{package}-price", f"{package}-reviews")
    elif template == "lightning":
        readme = readme.replace("(data/houses.csv, generated)", "(data/houses.csv, generated; a Lightning Trainer)")
    files = {
        f"{package}/__init__.py": "",
        f"{package}/model.py": model_py.format(package=package),
        "sweep.yaml": sweep_yaml.format(package=package),
        "flow.py": FLOW_PY.format(package=package),
        "prefect.yaml": PREFECT_YAML.format(package=package),
        "pyproject.toml": PYPROJECT.format(package=package).replace(
            '["sweepflow"]', f'["sweepflow[{extra}]"]' if extra else '["sweepflow"]'
        ),
        "README.md": readme,
        **data,
    }
    written = []
    for relpath, text in files.items():
        path = directory / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def sweepflow_from(directory: os.PathLike[str] | str) -> str:
    """This command as typed from ``directory``: ``sweepflow`` when that is the one on PATH, else its path
    (relative when inside the same tree, e.g. ``../.venv/bin/sweepflow`` after ``make run``)."""
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not me.endswith("sweepflow") or os.path.realpath(shutil.which("sweepflow") or "") == me:
        return "sweepflow"
    place = os.path.realpath(directory)
    relative = os.path.relpath(os.path.abspath(sys.argv[0]), place)
    return shlex.quote(relative if not relative.startswith("../..") else os.path.abspath(sys.argv[0]))


def init_lines(directory: os.PathLike[str] | str, *, template: str = "pytorch") -> list[str]:
    """``sweepflow init``: write the project (``write_project``) and say what it wrote and what to run next,
    as commands that work as printed (``sweepflow_from``)."""
    directory = Path(directory)
    written = write_project(directory, template=template)
    lines = [f"wrote {len(written)} files into {directory}/ (package {package_name(directory)}, template {template}):"]
    lines += [f"  {path.relative_to(directory)}" for path in written]
    return [*lines, "", "next:", f"  cd {shlex.quote(str(directory))}", f"  {sweepflow_from(directory)} run --config sweep.yaml"]
