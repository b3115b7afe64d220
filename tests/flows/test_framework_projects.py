"""``sweepflow init DIR --template lightning | transformers`` (issue 64 item 3): each project sweeps through
``sweepflow run --config`` as a user types it, evaluates and registers its model, which loads with
``mlflow.pyfunc`` in a fresh process that cannot import the project (nor need Lightning or Transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from sweepflow.flows.cli import main
from sweepflow.flows.init_project import init_lines

PREDICT = r"""
import json, sys
import mlflow
import numpy as np
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
x = np.array(json.loads(sys.argv[3]), dtype=sys.argv[4])
print(json.dumps(np.asarray(model.predict(x)).tolist()))
"""

QUICK = ["sweep.num_samples=2", "scheduler.max_t=3", "scheduler.grace_period=1", "training.epochs=3"]


def _predict(tracking_uri: str, model_uri: str, rows: np.ndarray) -> np.ndarray:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", PREDICT, tracking_uri, model_uri, json.dumps(rows.tolist()), str(rows.dtype)],
        capture_output=True, text=True, timeout=300, cwd="/", env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return np.array(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("template", ["lightning", "transformers"])
def test_a_template_project_sweeps_registers_and_loads_anywhere(template, services, tmp_path, capsys):
    pytest.importorskip("lightning" if template == "lightning" else "transformers")
    project = tmp_path / {"lightning": "shop", "transformers": "reviews"}[template]
    with pytest.raises(ValueError, match=f"package would be named '{template}', which is already an installed"):
        init_lines(tmp_path / template, template=template)  # it would hide the real package
    said = init_lines(project, template=template)
    assert said[-1].strip().endswith("run --config sweep.yaml") and f"template {template}" in said[0]
    assert f'"sweepflow[{template}]"' in (project / "pyproject.toml").read_text()
    name = f"{template}-{os.urandom(3).hex()}"
    summary = tmp_path / "summary.json"
    argv = ["run", "--no-server", "--config", str(project / "sweep.yaml"), "--summary-json", str(summary)]
    for item in [*QUICK, f"mlflow.registered_model_name={name}", f"mlflow.experiment_name={name}"]:
        argv += ["--set", item]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    done = json.loads(summary.read_text())
    assert done["registration"]["version"] == 1 and not done["failed_trials"]
    if template == "lightning":
        assert done["test_metrics"]["test_r2"] > 0.5, done["test_metrics"]
        rows = pd.read_csv(project / "data" / "houses.csv")[["sqft", "rooms", "age", "distance_km"]].to_numpy(np.float32)
        assert _predict(services["mlflow"], f"models:/{name}/1", rows[:5]).shape == (5,)
    else:
        assert done["test_metrics"]["test_accuracy"] > 0.7, done["test_metrics"]
        ids = np.random.default_rng(0).integers(3, 20, size=(3, 24)).astype(np.int64)
        assert _predict(services["mlflow"], f"models:/{name}/1", ids).shape == (3, 2)


def test_a_template_without_its_extra_is_refused_before_any_work_naming_the_extra(tmp_path):
    """The pre-flight imports train_fn in a process where the framework is missing (here: blocked)."""
    init_lines(tmp_path / "shop", template="lightning")
    script = (
        "import sys, importlib.abc\n"
        "class NoLightning(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('lightning', 'pytorch_lightning'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoLightning())\n"
        "from sweepflow.tasks.checks import PreflightError, load_train_fn\n"
        f"sys.path.insert(0, {str(tmp_path / 'shop')!r})\n"
        "try:\n"
        "    load_train_fn('shop.model:train_fn')\n"
        "except PreflightError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "no module named 'lightning" in out.stdout and "pip install 'sweepflow[lightning]'" in out.stdout, (
        out.stdout + out.stderr[-2000:]
    )
