"""A Prefect retry of a ``training-pipeline`` flow run resumes the sweep its earlier attempt left unfinished: the
attempt's parent run is found by the flow run's id (``flows/pipeline.py``: ``_interrupted_attempt``)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.pipeline import _interrupted_attempt
from sweepflow.flows.settings import resolve_settings
from sweepflow.tasks.sweep.resume import TAG_RESUME_KEY, digest, resume_key


def test_a_retry_finds_the_unfinished_parent_run_of_its_own_flow_run_only(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = resolve_settings(
        PipelineConfig.model_validate(
            {"state_dir": str(tmp_path), "mlflow": {"tracking_uri": uri, "experiment_name": "retried"}}
        )
    )
    assert _interrupted_attempt(cfg, "flow-run-1") is None  # no experiment yet: nothing ran before

    client = MlflowClient(uri)
    experiment_id = client.create_experiment("retried", artifact_location=str(tmp_path / "artifacts"))

    ours = digest(resume_key(cfg.model_dump()))  # what the attempt's parent run recorded

    def parent(flow_run_id: str, *, ended: bool = False, sweep: bool = True, key: str = ours) -> str:
        tags = {"prefect.flow_run_id": flow_run_id, **({TAG_RESUME_KEY: key} if sweep else {})}
        run = client.create_run(experiment_id, tags=tags)
        if ended:
            client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id

    parent("flow-run-1", ended=True)  # an attempt that finished is not resumed
    parent("flow-run-1", sweep=False)  # a run of that flow run that is no sweep's parent
    parent("flow-run-2")  # another flow run's
    parent("flow-run-1", key="other-settings")  # not with these settings (the one key both faces look up by)
    assert _interrupted_attempt(cfg, "flow-run-1") is None
    interrupted = parent("flow-run-1")
    assert _interrupted_attempt(cfg, "flow-run-1") == interrupted
