"""The processes that drive sweeps never import torch: it costs ~5 s and ~400 MB per process, and only the
ranks (Dask workers) and the evaluation/registration tasks (also on workers) need it."""

from __future__ import annotations

import subprocess
import sys

import paths
import pytest

ROOT = str(paths.ROOT)


def _imports_torch(code: str) -> bool:
    probe = f"{code}\nimport sys\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().endswith("True")


@pytest.mark.subprocess
def test_ddp_runtime_driver_side_does_not_import_torch():
    assert not _imports_torch(
        "import ddp_runtime\nfrom ddp_runtime.torch import TorchTrainer, prepare_model\nimport ddp_runtime.cluster"
    )


@pytest.mark.subprocess
def test_the_flow_process_does_not_import_torch():
    assert not _imports_torch(
        "import sweepflow.flows.cli, sweepflow.flows.pipeline, sweepflow.infra.services.stack\nfrom sweepflow.tasks.training.function import TrainFunction"
    )


@pytest.mark.subprocess
def test_the_pre_flight_of_the_built_in_training_function_does_not_import_torch():
    """A deployment's flow run checks its settings in a new process: the built-in function's checks run there
    without its training code (tasks/training/hparams.py), and still refuse a config it would refuse."""
    assert not _imports_torch(
        "from sweepflow.flows.config import PipelineConfig\n"
        "from sweepflow.flows.preflight import PreflightError, check_experiment, pipeline_checks\n"
        "def _check_training(cfg):\n"
        "    check_experiment(pipeline_checks(cfg, prefect_api_url=None, imports=True))\n"
        "_check_training(PipelineConfig())\n"
        "bad = PipelineConfig(training={'base_config': {'optimizer': 'lbfgs'}})\n"
        "try:\n"
        "    _check_training(bad)\n"
        "except PreflightError as exc:\n"
        "    assert \"must be one of adam, adamw, sgd, got 'lbfgs'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('lbfgs was not refused')"
    )
