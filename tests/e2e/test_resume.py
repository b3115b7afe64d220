"""Resuming an interrupted sweep: `sweepflow run --resume PARENT_RUN_ID` after the flow process was SIGKILLed.

The acceptance case of the resume feature: a sweep is killed while some trials have ended and another is
between two reports; the resumed run trains no ended trial again, continues the interrupted one from its
checkpoint in the same MLflow run, and ends with the leaderboard, best trial and test metrics an
uninterrupted run with the same seed produces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import paths
import pytest
from mlflow.tracking import MlflowClient
from mlflow_server import sqlite_store

SWEEPFLOW = os.path.join(os.path.dirname(sys.executable), "sweepflow")
TESTS_DIR = os.pathsep.join([str(paths.SUPPORT), os.path.dirname(os.path.abspath(__file__))])  # helpers, this module
SETTINGS = [
    "sweep.num_samples=4",
    "sweep.max_concurrent_trials=2",
    "sweep.seed=7",
    "training.epochs=3",
    "training.train_fn=pipeline_helpers:held_classifier",
    # it writes the built-in classifier's checkpoints: the built-in model and evaluation read them
    "training.model_fn=sweepflow.tasks.training.builtin:model_fn",
    "evaluation.evaluate_fn=sweepflow.tasks.training.builtin:evaluate_fn",
    "scheduler.type=fifo",
    "resources.ranks_per_trial=1",
    "dask.n_workers=2",
    "mlflow.registered_model_name=resume-digits",
]


def _command(state_dir: str, *extra: str, settings: list[str] | None = None) -> list[str]:
    """The sweep (SETTINGS; its last trial to start holds, see ``held_classifier``, marks in state_dir/marks)."""
    if settings is None:
        settings = [*SETTINGS, f"training.base_config={{optimizer: adam, marks: {state_dir}/marks, hold: 4}}"]
    cmd = [SWEEPFLOW, "run", "--no-server", "--summary-json", os.path.join(state_dir, "summary.json"), *extra]
    for item in [*settings, f"state_dir={state_dir}"]:
        cmd += ["--set", item]
    return cmd


def _env() -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DASK_", "SWEEPFLOW_"))}
    env["PREFECT_API_URL"] = PREFECT_API_URL.value()  # the session's Prefect harness
    env["PYTHONPATH"] = os.pathsep.join([TESTS_DIR, env.get("PYTHONPATH", "")])
    return env


def _summary(state_dir: str) -> dict:
    with open(os.path.join(state_dir, "summary.json")) as f:
        return json.load(f)


def _client(state_dir: str) -> MlflowClient:
    return MlflowClient(f"sqlite:///{state_dir}/mlflow.db")


def _trial_runs(client: MlflowClient, parent: str) -> dict[str, object]:
    experiment = client.get_experiment_by_name("sweepflow")
    runs = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    return {r.data.tags["sweepflow.trial_id"]: r for r in runs if "sweepflow.trial_id" in r.data.tags}


def _wait_until_interruptible(state_dir: str, proc: subprocess.Popen, timeout: float = 300) -> tuple[str, set]:
    """The parent run id once the other three trials ended and the last one (held by ``held_classifier``) waits
    between two reports, its checkpoint committed and its two reports in MLflow. Conditions, not timing: the
    held trial waits until told."""
    deadline = time.monotonic() + timeout
    held = os.path.join(state_dir, "marks", "held")
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.2)
        if not os.path.exists(held):
            continue  # a trial holds: the store is migrated and the parent run is in (opening it sooner would race)
        client = _client(state_dir)
        parents = client.search_runs(
            [client.get_experiment_by_name("sweepflow").experiment_id], "tags.`sweepflow.resume_key` != ''"
        )
        trials = _trial_runs(client, parents[0].info.run_id)
        ended = {t for t, r in trials.items() if "sweepflow.status" in r.data.tags}
        waiting = [
            r
            for t, r in trials.items()
            if t not in ended
            and len(client.get_metric_history(r.info.run_id, "val_loss")) == 2
            and os.path.isdir(checkpoints := os.path.join(r.info.artifact_uri.removeprefix("file://"), "checkpoints"))
            and any(name.startswith("checkpoint_") for name in os.listdir(checkpoints))
        ]
        if len(ended) == 3 and waiting:
            return parents[0].info.run_id, ended
    raise AssertionError(f"no moment to interrupt the run within {timeout} s")


@pytest.fixture(scope="module")
def straight(prefect_harness, tmp_path_factory) -> str:
    """The reference: the sweep (SETTINGS), never interrupted, run to its end by the CLI; its state dir. The
    resume test compares the resumed sweep with it; the refusal test asks to resume it, a finished run."""
    state_dir = str(tmp_path_factory.mktemp("resume") / "straight")
    sqlite_store(state_dir)  # the CLI's default store under state_dir, migrated once
    os.makedirs(os.path.join(state_dir, "marks"))
    open(os.path.join(state_dir, "marks", "go"), "w").close()  # no trial holds
    ref = subprocess.run(_command(state_dir), capture_output=True, text=True, timeout=600, env=_env())
    assert ref.returncode == 0, ref.stderr[-3000:]
    return state_dir


@pytest.mark.subprocess
@pytest.mark.prefect
def test_a_killed_sweep_resumes_from_mlflow_and_storage_and_ends_as_an_uninterrupted_one(
    prefect_harness, straight, tmp_path
):
    env = _env()
    broken = str(tmp_path / "broken")
    sqlite_store(broken)  # the CLI's default store under state_dir, migrated once
    os.makedirs(os.path.join(broken, "marks"))

    # The same sweep as the reference (``straight``), killed (the flow process and its local Dask workers)
    # between two reports of a trial.
    proc = subprocess.Popen(
        _command(broken), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        parent, ended_before = _wait_until_interruptible(broken, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at_ms = time.time() * 1000
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    client = _client(broken)
    before = _trial_runs(client, parent)
    interrupted = {t for t, r in before.items() if "sweepflow.status" not in r.data.tags}
    assert interrupted, "no trial was running when the sweep was killed"
    assert client.get_run(parent).info.status == "RUNNING"  # what a dead process leaves
    open(os.path.join(broken, "marks", "go"), "w").close()  # the resumed trial goes on

    resumed = subprocess.run(
        _command(broken, "--resume", parent), capture_output=True, text=True, timeout=600, env=env
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout + resumed.stderr
    assert "continues from its checkpoint after report" in out

    # One MLflow run per trial, the same runs as before the kill, each epoch logged exactly once.
    after = _trial_runs(client, parent)
    assert sorted(after) == [f"trial_{i:04d}" for i in range(4)]
    for trial_id, run in before.items():
        assert after[trial_id].info.run_id == run.info.run_id
    for trial_id, run in after.items():
        history = client.get_metric_history(run.info.run_id, "val_loss")
        steps = Counter(m.step for m in history)
        assert steps == Counter({1: 1, 2: 1, 3: 1}), (trial_id, sorted(steps.items()))
        assert run.info.status == "FINISHED"
    # Ended trials were not trained again: nothing was logged to them after the kill.
    for trial_id in ended_before:
        history = client.get_metric_history(after[trial_id].info.run_id, "val_loss")
        assert max(m.timestamp for m in history) < killed_at_ms, trial_id
    # The interrupted trials continued in their runs, and say so.
    for trial_id in interrupted:
        assert after[trial_id].data.tags["sweepflow.resumes"] == "1"
    assert client.get_run(parent).data.tags["sweepflow.resumes"] == "1"
    assert client.get_run(parent).info.status == "FINISHED"

    # The same outcome as the uninterrupted run.
    a, b = _summary(straight), _summary(broken)
    keys = ("trial", "status", "epochs", "best_epoch") + tuple(
        k for k in a["leaderboard"][0] if k.startswith("best_") and k != "best_epoch"
    )

    def board(summary: dict) -> list[tuple]:
        rows = sorted(summary["leaderboard"], key=lambda r: r["trial"])
        return [
            tuple(round(r[k], 6) if isinstance(r[k], float) else r[k] for k in keys)
            + tuple(sorted((k, v) for k, v in r.items() if k.startswith("config/")))
            for r in rows
        ]

    assert board(a) == board(b)
    assert a["best_trial"]["trial_id"] == b["best_trial"]["trial_id"]
    assert a["test_metrics"]["test_accuracy"] == pytest.approx(b["test_metrics"]["test_accuracy"], abs=1e-9)


@pytest.mark.prefect
def test_resume_refuses_a_changed_configuration_or_a_finished_run_before_any_work(
    prefect_harness, straight, monkeypatch, capsys
):
    """Asked of the reference run (finished), in this process: every refusal comes before any work."""
    from sweepflow.flows.cli import main

    for key in ("MLFLOW_TRACKING_URI", "DASK_SCHEDULER_ADDRESS", "PREFECT_API_URL", "SWEEPFLOW_STORAGE"):
        monkeypatch.delenv(key, raising=False)
    # The reference's own command line. Marking its run FAILED below leaves what the resume test reads of it (its
    # summary file) as it was.
    argv = _command(straight)[1:]
    parent = _summary(straight)["parent_run_id"]

    def refused(*extra: str) -> str:
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1, err
        return err

    assert "nothing to resume" in refused("--resume", parent)
    client = _client(straight)
    client.set_terminated(parent, "FAILED")  # as a run that died of an error leaves it
    assert "sweep.num_samples was 4, now 5" in refused("--resume", parent, "--set", "sweep.num_samples=5")
    assert "no such MLflow run" in refused("--resume", "0123456789abcdef")
    runs = client.search_runs([client.get_experiment_by_name("sweepflow").experiment_id])
    assert len([r for r in runs if "sweepflow.resume_key" in r.data.tags]) == 1  # no run was started
