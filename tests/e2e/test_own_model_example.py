"""A team's ``model_fn`` may return the module alone (issue 62): where its input example comes from, and what a
failure after the sweep says.

Fast (no server): the input-example rule on each prepared layout (``tasks/datasets/examples.py``), the module's
acceptance of an example, the one sentence of a failure after the sweep and the command that finishes the run,
the console lines without tracebacks. The registrations themselves, against a real MLflow server, load back with
``mlflow.pyfunc`` in a fresh process: with an example found (pt2 and a signature) and without one (pickled with
the project's code, no signature).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from sweepflow.flows.experiment import AfterSweepFailed, EvaluationMismatch, _failure
from sweepflow.flows.run_console import console_tracebacks, finish_command
from sweepflow.tasks.datasets.examples import example_layout, find_input_example
from sweepflow.tasks.finalize_on_worker import accepts, model_code_paths, own_model
from sweepflow.tasks.sweep.resume import resume_key


# ------------------------------------------------------------------------------------------- the example rule
def _table(tmp_path: Path, fmt: str) -> Path:
    table = pd.DataFrame({"sqft": [50.0, 60.0, 70.0, 80.0, 90.0], "rooms": [1, 2, 3, 4, 5], "price": [1, 2, 3, 4, 5]})
    (tmp_path / "schema.json").write_text(json.dumps({"target": "price", "features": ["rooms", "sqft"], "format": fmt}))
    if fmt == "csv":
        table.to_csv(tmp_path / "test.csv", index=False)
    else:
        table.to_parquet(tmp_path / "test.parquet")
    return tmp_path


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_table_gives_its_test_splits_first_rows_features_in_the_schemas_order(tmp_path, fmt):
    found = find_input_example(str(_table(tmp_path, fmt)))
    assert found is not None and found.array.dtype == np.float32
    np.testing.assert_array_equal(found.array, [[1, 50], [2, 60], [3, 70], [4, 80]])  # rooms, sqft; no price
    assert f"test.{fmt}" in found.source and example_layout(str(tmp_path)) == "schema.json + test.csv/.parquet"


def test_a_table_with_a_text_feature_gives_none(tmp_path):
    pd.DataFrame({"text": ["a b", "c d"], "label": [0, 1]}).to_csv(tmp_path / "test.csv", index=False)
    (tmp_path / "schema.json").write_text(json.dumps({"target": "label", "features": ["text"], "format": "csv"}))
    assert find_input_example(str(tmp_path)) is None


def test_an_npz_gives_its_first_inputs_as_float32(tmp_path):
    np.savez(tmp_path / "test.npz", x=np.arange(60, dtype=np.float64).reshape(10, 6), y=np.zeros(10))
    found = find_input_example(str(tmp_path))
    assert found is not None and found.array.shape == (4, 6) and found.array.dtype == np.float32
    assert "test.npz" in found.source and example_layout(str(tmp_path)) == "test.npz"


def test_an_image_folder_gives_its_first_test_images_channels_first_in_0_1(tmp_path):
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / "test" / label).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((5, 7, 3), 255 if label == "dog" else 0, np.uint8)).save(
                tmp_path / "test" / label / f"{i}.png"
            )
    found = find_input_example(str(tmp_path))
    assert found is not None and found.array.shape == (4, 3, 5, 7) and found.array.dtype == np.float32
    assert found.array[0].max() == 0.0 and found.array[3].min() == 1.0  # cat, cat, cat, dog
    assert example_layout(str(tmp_path)) == "test/<class>/<image>"


def test_images_of_several_sizes_or_an_unknown_layout_give_none(tmp_path):
    from PIL import Image

    (tmp_path / "test" / "a").mkdir(parents=True)
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(tmp_path / "test" / "a" / "1.png")
    Image.fromarray(np.zeros((6, 5), np.uint8)).save(tmp_path / "test" / "a" / "2.png")
    assert find_input_example(str(tmp_path)) is None
    other = tmp_path / "other"
    other.mkdir()
    (other / "windows.pt").write_bytes(b"not ours")
    assert find_input_example(str(other)) is None and example_layout(str(other)) is None


def test_an_example_is_kept_only_if_the_module_maps_it_to_one_tensor():
    model = torch.nn.Linear(2, 1).train()
    assert accepts(model, np.zeros((4, 2), np.float32))
    assert not accepts(model, np.zeros((4, 3), np.float32))  # the wrong number of features
    assert model.training  # the caller's module is left as it was

    class Pair(torch.nn.Module):
        def forward(self, x):
            return x, x

    assert not accepts(Pair(), np.zeros((4, 2), np.float32))


def test_model_fn_returns_the_module_alone_or_with_an_example_else_one_sentence():
    module = torch.nn.Linear(2, 1)
    assert own_model(module, "p.m:model_fn") == (module, None)
    got, example = own_model((module, torch.ones(3, 2)), "p.m:model_fn")
    assert got is module and isinstance(example, np.ndarray) and example.shape == (3, 2)
    with pytest.raises(TypeError, match=r"training.model_fn='p.m:model_fn' returned dict: return the trained"):
        own_model({"state": 1}, "p.m:model_fn")


def test_a_pickled_models_code_is_its_package_in_the_project_only(tmp_path, monkeypatch):
    package = tmp_path / "proj" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "net.py").write_text("import torch\nclass Net(torch.nn.Linear):\n    pass\n")
    (tmp_path / "proj" / "single.py").write_text("import torch\nclass One(torch.nn.Linear):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "proj"))
    from mypkg.net import Net
    from single import One

    assert model_code_paths(Net(2, 1), str(tmp_path / "proj")) == [str(package.resolve())]
    assert model_code_paths(One(2, 1), str(tmp_path / "proj")) == [str((tmp_path / "proj" / "single.py").resolve())]
    assert model_code_paths(torch.nn.Linear(2, 1), str(tmp_path / "proj")) == []  # installed: not copied
    assert model_code_paths(Net(2, 1), None) == []


# -------------------------------------------------------------------------------- a failure after the sweep
def test_a_failure_after_the_sweep_names_the_function_the_project_line_and_the_run_to_resume(tmp_path):
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "model.py").write_text("def model_fn(checkpoint):\n    return {}['stats']\n")
    sys.path.insert(0, str(project))
    try:
        from pkg.model import model_fn

        with pytest.raises(KeyError) as raised:
            model_fn(None)
    finally:
        sys.path.remove(str(project))
        for name in [n for n in sys.modules if n == "pkg" or n.startswith("pkg.")]:
            sys.modules.pop(name)
    problem = _failure("training.model_fn='pkg.model:model_fn'", raised.value, str(project))
    assert problem == "training.model_fn='pkg.model:model_fn' raised KeyError: 'stats' (pkg/model.py:2)"
    failed = AfterSweepFailed("the registration", problem, "abc123", 4)
    said = str(failed)
    assert said.startswith("the registration failed after the sweep: training.model_fn='pkg.model:model_fn' raised")
    assert "the sweep's 4 trial(s) are recorded in MLflow run abc123" in said and "\n" not in said
    assert said.endswith("finish the run without training again: sweepflow run --resume abc123 (same settings)")
    # Our own refusals already name the function: kept as they are.
    ours = TypeError("training.model_fn='p:m' returned dict: return the trained torch.nn.Module")
    assert _failure("training.model_fn='p:m'", ours, None) == str(ours)
    mismatch = EvaluationMismatch("the evaluation", "selection.champion_metric='test_x' is not among", "r1", 2)
    assert isinstance(mismatch, ValueError) and isinstance(mismatch, AfterSweepFailed)


def test_the_finishing_command_repeats_the_config_and_counts_the_sets_without_their_values():
    args = argparse.Namespace(config="my dir/sweep.yaml", no_server=False, set=["mlflow.tracking_uri=http://u:pw@h"])
    said = finish_command(args, "abc", sets=1)
    assert said == "sweepflow run --config 'my dir/sweep.yaml' --resume abc with the same 1 --set option(s)"
    assert "pw" not in said
    plain = argparse.Namespace(config=None, no_server=True, set=[])
    assert finish_command(plain, "abc") == "sweepflow run --no-server --resume abc"


def test_the_fix_of_a_failure_after_the_sweep_may_change_what_only_those_stages_read():
    """model_fn and the champion metric decide nothing the trials computed: a resume after changing them is the
    same sweep. What the trials ran on still differs."""
    base = {"training": {"train_fn": "p:t", "model_fn": "p:m", "epochs": 3}, "selection": {"metric": "val"}}
    fixed = {
        "training": {"train_fn": "p:t", "model_fn": "p:m2", "epochs": 3},
        "selection": {"metric": "val", "champion_metric": "test_rmse", "champion_mode": "min"},
    }
    assert resume_key(base) == resume_key(fixed)
    assert resume_key(base) != resume_key({**base, "training": {**base["training"], "epochs": 4}})


def test_the_console_shows_a_failed_runs_line_without_its_traceback_unless_debug(capsys):
    logger = logging.getLogger("prefect.sweepflow-test")
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        try:
            raise KeyError("stats")
        except KeyError:
            with console_tracebacks(shown=False):
                logger.error("Task run failed with exception: KeyError('stats')", exc_info=True)
            quiet = capsys.readouterr().err
            with console_tracebacks(shown=True):
                logger.error("Task run failed with exception: KeyError('stats')", exc_info=True)
            loud = capsys.readouterr().err
    finally:
        root.removeHandler(handler)
    assert "Traceback" not in quiet and "KeyError('stats')" in quiet and "--debug" in quiet
    assert "Traceback" in loud
    assert handler.formatter is None  # put back as it was


# ------------------------------------------------------------------------------ registered, loaded anywhere
MODEL_PY = textwrap.dedent(
    """
    import torch

    class Price(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def forward(self, x):
            return self.net(x).squeeze(-1) * 10

    def model_fn(checkpoint):
        with checkpoint.as_directory() as d:
            model = Price()
            model.load_state_dict(torch.load(d + "/model.pt"))
        return model.eval()
    """
)

PREDICT = r"""
import json, sys
import mlflow
import numpy as np
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
x = np.array(json.loads(sys.argv[3]), dtype=np.float32)
print(json.dumps({"y": np.asarray(model.predict(x)).reshape(-1).tolist(),
                  "signature": model.metadata.signature is not None}))
"""


def _project(tmp_path: Path, source: str = MODEL_PY) -> tuple[Path, str]:
    """A project whose model_fn returns the module alone, and the checkpoint its train_fn would have written."""
    project = tmp_path / "proj"
    (project / "housing_pkg").mkdir(parents=True)
    (project / "housing_pkg" / "__init__.py").write_text("")
    (project / "housing_pkg" / "model.py").write_text(source)
    sys.path.insert(0, str(project))
    try:
        from housing_pkg.model import Price

        torch.manual_seed(0)
        checkpoint = tmp_path / "checkpoint"
        checkpoint.mkdir()
        torch.save(Price().state_dict(), checkpoint / "model.pt")
    finally:
        sys.path.remove(str(project))
        for name in [n for n in sys.modules if n.partition(".")[0] == "housing_pkg"]:
            sys.modules.pop(name)
    return project, str(checkpoint)


def _register(tracking_uri: str, project: Path, checkpoint: str, data_path: str, name: str) -> dict:
    from mlflow.tracking import MlflowClient

    from sweepflow.tasks.finalize_on_worker import register_own_model

    client = MlflowClient(tracking_uri)
    experiment = client.create_experiment(name)
    run = client.create_run(experiment)
    return register_own_model(
        "housing_pkg.model:model_fn",
        str(project),
        checkpoint,
        data_path,
        None,
        {
            "registered_model_name": name,
            "run_id": run.info.run_id,
            "metric_name": "test_rmse",
            "metric_value": 1.5,
            "higher_is_better": False,
            "tracking_uri": tracking_uri,
        },
        {},
    )


def _predict_elsewhere(tracking_uri: str, model_uri: str, rows: list[list[float]]) -> dict:
    """mlflow.pyfunc in a new interpreter, from /, that cannot import the project."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", PREDICT, tracking_uri, model_uri, json.dumps(rows)],
        capture_output=True, text=True, timeout=300, cwd="/", env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_module_alone_registers_with_the_test_splits_rows_as_its_example_and_loads_anywhere(
    mlflow_server, tmp_path
):
    project, checkpoint = _project(tmp_path)
    data = tmp_path / "prepared"
    data.mkdir()
    _table(data, "csv")
    name = f"alone-{os.urandom(3).hex()}"
    outcome = _register(mlflow_server, project, checkpoint, str(data), name)
    assert outcome["version"] == 1 and "the first 4 rows of the test split's features (test.csv" in outcome["input_example"]
    got = _predict_elsewhere(mlflow_server, f"models:/{name}/1", [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert got["signature"] is True and len(got["y"]) == 3


def test_the_module_alone_with_no_example_registers_without_a_signature_and_loads_without_the_project(
    mlflow_server, tmp_path
):
    project, checkpoint = _project(tmp_path)
    data = tmp_path / "prepared"
    data.mkdir()
    (data / "windows.pt").write_bytes(b"a layout sweepflow does not read")
    name = f"alone-nosig-{os.urandom(3).hex()}"
    outcome = _register(mlflow_server, project, checkpoint, str(data), name)
    assert outcome["version"] == 1
    assert outcome["input_example"].startswith("none: training.model_fn='housing_pkg.model:model_fn' returned the module")
    assert "return (module, input_example) to add one" in outcome["input_example"]
    got = _predict_elsewhere(mlflow_server, f"models:/{name}/1", [[1.0, 2.0], [3.0, 4.0]])
    assert got["signature"] is False and len(got["y"]) == 2
    # The same model as trained: the prediction of the loaded copy is the module's own.
    sys.path.insert(0, str(project))
    try:
        from housing_pkg.model import Price

        model = Price()
        model.load_state_dict(torch.load(Path(checkpoint) / "model.pt"))
        expected = model.eval()(torch.tensor([[1.0, 2.0], [3.0, 4.0]])).tolist()
    finally:
        sys.path.remove(str(project))
        for n in [n for n in sys.modules if n.partition(".")[0] == "housing_pkg"]:
            sys.modules.pop(n)
    assert got["y"] == pytest.approx(expected, rel=1e-5)


def test_a_model_torch_export_cannot_trace_registers_pickled_instead_of_failing(mlflow_server, tmp_path):
    """Data-dependent control flow: the pt2 export fails before anything is written, and the same model is
    registered pickled with its code (the pipeline's user cannot pass serialization_format)."""
    branching = MODEL_PY.replace(
        "return self.net(x).squeeze(-1) * 10",
        "y = self.net(x).squeeze(-1)\n        return y * 10 if float(y.sum()) > 0 else y * -10",
    )
    project, checkpoint = _project(tmp_path, branching)
    data = tmp_path / "prepared"
    data.mkdir()
    _table(data, "csv")
    name = f"branching-{os.urandom(3).hex()}"
    outcome = _register(mlflow_server, project, checkpoint, str(data), name)
    assert outcome["version"] == 1 and "pickled with its code, not pt2: torch.export could not trace" in outcome["input_example"]
    got = _predict_elsewhere(mlflow_server, f"models:/{name}/1", [[1.0, 2.0], [3.0, 4.0]])
    assert got["signature"] is True and len(got["y"]) == 2
