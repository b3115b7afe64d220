"""The pipeline's settings lowered to the one ``Experiment`` both faces run (``experiment_for``): pure, no service."""

from __future__ import annotations

import pytest

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.pipeline_lowering import experiment_for
from sweepflow.tasks.datasets import PreparedDataset
from sweepflow.tasks.sweep.experiment import Experiment
from sweepflow.tasks.sweep.resume import resume_key
from sweepflow.tune.schedulers import ASHAScheduler


def _prepared(tmp_path) -> PreparedDataset:
    return PreparedDataset(
        name="digits", path=str(tmp_path / "prepared"), num_classes=10, input_shape=(1, 8, 8),
        sizes={"train": 1, "val": 1, "test": 1}, checksum="c0ffee", source="bundled",
    )


def test_the_pipeline_lowers_to_an_experiment_that_evaluates_and_registers(tmp_path):
    cfg = PipelineConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "sweep": {"num_samples": 3, "seed": 5, "max_concurrent_trials": 2, "time_budget_s": 60},
            "training": {"epochs": 3},
            "scheduler": {"type": "asha", "max_t": 3},
            "mlflow": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "registered_model_name": "m"},
        }
    )
    exp = experiment_for(cfg, _prepared(tmp_path), resume_from="parent0")
    assert isinstance(exp, Experiment) and isinstance(exp.scheduler, ASHAScheduler)
    assert exp.sampler.total == 3 and exp.search_label == "random sampler"
    assert (exp.metric, exp.mode, exp.template.max_reports) == ("val_accuracy", "max", 3)
    assert exp.template.train_loop_config["data_path"] == str(tmp_path / "prepared")
    assert (exp.max_concurrent_trials, exp.time_budget_s, exp.fail_fast) == (2, 60, False)
    assert exp.placement.scheduler_address is None and not exp.placement.share_cores
    rec = exp.recording
    assert rec.kind == "pipeline" and rec.resume_key == resume_key(cfg.model_dump())
    assert rec.tags["sweepflow.data_checksum"] == "c0ffee" and "sweepflow.data_checksum" in rec.same_on_resume
    assert rec.params["sweep.num_samples"] == 3 and "state_dir" not in rec.settings
    assert rec.artifact_root == str(tmp_path / "state" / "mlartifacts")  # a local store keeps its artifacts here
    assert exp.resume is not None and exp.resume.parent_run_id == "parent0"
    assert exp.finalize is not None
    assert (exp.finalize.registered_model_name, exp.finalize.champion_metric) == ("m", "test_accuracy")
    assert exp.finalize.data_checksum == "c0ffee" and exp.finalize.evaluate_fn is None  # the built-in one


def test_a_tracking_server_keeps_the_artifacts(tmp_path):
    cfg = PipelineConfig.model_validate(
        {"state_dir": str(tmp_path), "mlflow": {"tracking_uri": "http://127.0.0.1:1"}}
    )
    exp = experiment_for(cfg, _prepared(tmp_path))
    assert exp.recording.artifact_root is None and exp.resume is None
    with pytest.raises(AttributeError):
        exp.name = "other"  # frozen: checked once, then run as it is
