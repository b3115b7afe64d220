"""A failed trial that ``Tuner.restore(path, resume_errored=True)`` resumed reads back as it ended, in every later
process: Ray's fault-tolerance pattern across processes, each step a script of its own (``tune_resume_fns.py``)
against the session's MLflow server, Prefect API and Dask cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import paths
import pytest
from mlflow.tracking import MlflowClient

from sweepflow.tasks.sweep.resume import ERRORED_KEEP, load_prior_sweep
from sweepflow.tasks.tracking.runs import RunTracker
from sweepflow.tasks.tracking.writers import RunWriter

TESTS = str(paths.SUPPORT)  # tune_resume_fns.py


def _step(marks: str, name: str, step: str) -> dict:
    """``python tune_resume_fns.py MARKS NAME STEP`` in a new process; what it saw (``MARKS/STEP.json``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, os.path.join(TESTS, "tune_resume_fns.py"), marks, name, step],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"{step}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    )
    with open(os.path.join(marks, f"{step}.json")) as f:
        return json.load(f)


def _messages(errors: list[str]) -> list[str]:
    """Each error's message, without the rank that raised it and its traceback."""
    return sorted(error.splitlines()[0].split(" failed: ", 1)[-1] for error in errors)


def _message(error: str | None) -> str | None:
    return None if error is None else _messages([error])[0]


def _touch(path: str) -> None:
    open(path, "w").close()


@pytest.mark.subprocess
def test_a_resumed_trial_reads_back_as_it_ended_not_with_its_first_error(services, tmp_path):
    """Trial x=1 crashes at epoch 4, is resumed from its epoch-4 checkpoint and finishes (epoch 6); trial x=2
    crashes at epoch 4, is resumed and crashes again at epoch 5. Read back in a third process (``get_results``, and
    a restore of the finished experiment), and in MLflow: x=1 finished, without an error, with the resumed run's
    last report and checkpoint; x=2 failed with its latest error only."""
    marks, name = str(tmp_path), "crash-then-resume"
    _touch(os.path.join(marks, "crash-1-at-4"))
    _touch(os.path.join(marks, "crash-2-at-4"))
    crashed = _step(marks, name, "crash")
    assert _messages(crashed["errors"]) == ["simulated crash at epoch 4"] * 2, crashed["errors"]
    first_run = {x: t["run_id"] for x, t in crashed["trials"].items()}

    os.remove(os.path.join(marks, "crash-1-at-4"))
    os.remove(os.path.join(marks, "crash-2-at-4"))
    _touch(os.path.join(marks, "crash-2-at-5"))  # x=2 fails again, one epoch after its checkpoint
    resumed = _step(marks, name, "resume_errored")
    assert _messages(resumed["errors"]) == ["simulated crash at epoch 5"], resumed["errors"]
    finished = resumed["trials"]["1"]
    assert (
        finished["error"] is None and finished["metrics"]["epoch"] == 6 and finished["checkpoint_epoch"] == 6
    )

    read = _step(marks, name, "read")
    client = MlflowClient(services["mlflow"])
    for how, grid in read.items():
        assert _messages(grid["errors"]) == ["simulated crash at epoch 5"], (how, grid["errors"])
        assert "epoch 4" not in grid["errors"][0], how
        assert grid["num_errors"] == 1 and grid["num_terminated"] == 1, how
        one, two = grid["trials"]["1"], grid["trials"]["2"]
        # The trial that finished after its resume: no error, the resumed run's last report and checkpoint.
        assert one["error"] is None, (how, one["error"])
        assert one["metrics"]["epoch"] == 6 and one["metrics"]["score"] == 6, (how, one["metrics"])
        # epochs 1-4 of the crashed run, then 5-6 of the resumed one, from its epoch-4 checkpoint
        assert one["metrics"]["started_from"] == 4 and one["reports"] == 6, how
        assert one["checkpoint"] == finished["checkpoint"] and one["checkpoint_epoch"] == 6, (how, one)
        # The trial that failed again: its latest error only, its checkpoint the one it reached after the resume.
        assert _message(two["error"]) == "simulated crash at epoch 5", (how, two["error"])
        assert two["metrics"]["epoch"] == 5 and two["reports"] == 5, (how, two["metrics"])
        assert two["checkpoint"] == resumed["trials"]["2"]["checkpoint"] and two["checkpoint_epoch"] == 5, how
        assert {x: t["run_id"] for x, t in grid["trials"].items()} == first_run, how  # each in its own run

    one_run, two_run = client.get_run(first_run["1"]), client.get_run(first_run["2"])
    assert one_run.info.status == "FINISHED"
    assert "sweepflow.error" not in one_run.data.tags, one_run.data.tags["sweepflow.error"]
    assert (
        one_run.data.tags["sweepflow.status"] == "COMPLETED"
        and one_run.data.tags["sweepflow.outcome"] == "completed"
    )
    assert one_run.data.tags["sweepflow.resumes"] == "1"
    assert [m.value for m in client.get_metric_history(first_run["1"], "score")] == [1, 2, 3, 4, 5, 6]
    assert two_run.info.status == "FAILED"
    assert _message(two_run.data.tags["sweepflow.error"]) == "simulated crash at epoch 5"
    assert "epoch 4" not in two_run.data.tags["sweepflow.error"]
    assert two_run.data.tags["sweepflow.outcome"].endswith("failed: simulated crash at epoch 5")

    # What a later resume of the experiment starts from (the pipeline's and Tune's read): the same final state.
    parent = one_run.data.tags["mlflow.parentRunId"]
    tracker = RunTracker(services["mlflow"], client.get_experiment(one_run.info.experiment_id).name)
    prior = load_prior_sweep(tracker, parent, metric="score", mode="max", errored=ERRORED_KEEP)
    by_x = {t.config["x"]: t.result for t in prior.trials.values()}
    assert by_x[1].status.value == "COMPLETED" and by_x[1].error is None and by_x[1].last["epoch"] == 6
    assert by_x[1].checkpoint == finished["checkpoint"]
    assert by_x[2].status.value == "FAILED" and _message(by_x[2].error) == "simulated crash at epoch 5"


def test_a_writer_removes_tags_in_order_with_its_other_writes(mlflow_server):
    """What a resumed trial's run does as it reopens: the tags of its earlier end go (one it never had is no
    error), after the writes queued before and before those queued after; its new end sets them again."""
    tracker = RunTracker(mlflow_server, f"reopen-{uuid.uuid4().hex[:8]}")
    run_id, _ = tracker.create_run("trial")
    writer = RunWriter(tracker, run_id, linger_s=60.0)  # everything below goes out as the run ends
    writer.set_tags(
        {"sweepflow.status": "FAILED", "sweepflow.error": "first", "sweepflow.outcome": "failed: first"}
    )
    writer.delete_tags(("sweepflow.status", "sweepflow.error", "sweepflow.stop_reason", "sweepflow.outcome"))
    writer.set_tags({"sweepflow.status": "COMPLETED", "sweepflow.outcome": "completed"})
    writer.finish("FINISHED")
    writer.join()
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert (
        run.data.tags["sweepflow.status"] == "COMPLETED" and run.data.tags["sweepflow.outcome"] == "completed"
    )
    assert "sweepflow.error" not in run.data.tags and "sweepflow.stop_reason" not in run.data.tags
