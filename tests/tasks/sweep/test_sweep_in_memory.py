"""The sweep driver held in memory (sweepflow.tasks.sweep.in_memory): the real ``Sweep``, slots, schedulers, trial life and run
writers, with trials as threads, groups played in memory and runs kept in dicts. No Prefect, Dask or
MLflow server runs, so each sweep takes milliseconds; the end-to-end tests (test_tune*, test_pipeline) run the
same driver on the real services."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from sweepflow.tasks.sweep.driver import Sweep
from sweepflow.tasks.sweep.hyperband import HyperBandScheduler
from sweepflow.tasks.sweep.in_memory import InMemoryTracker, InMemoryTrainer
from sweepflow.tasks.sweep.launch import Threads
from sweepflow.tasks.sweep.pbt import PopulationBasedTraining
from sweepflow.tasks.sweep.results import SweepResult, TrialStatus
from sweepflow.tasks.sweep.samplers import GridSampler
from sweepflow.tasks.sweep.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.sweep.trial_groups import MetricNotReported

PARENT = "parent"


def _sweep(
    tmp_path,
    script,
    values: list[Any],
    *,
    scheduler: TrialScheduler | None = None,
    concurrency: int = 2,
    max_reports: int = 0,
    **kwargs: Any,
) -> tuple[Sweep, InMemoryTracker]:
    tracker = InMemoryTracker(str(tmp_path / "runs"))
    sweep = Sweep(
        sampler=GridSampler({"lr": {"type": "grid", "values": values}}),
        template=TrialTemplate(
            train_fn=script,
            selection_metric="loss",
            selection_mode="min",
            max_reports=max_reports,
            varying_names=("lr",),
            checkpoints_to_keep=None,
        ),
        cluster=None,
        tracker=tracker,
        parent_run_id=PARENT,
        scheduler=scheduler or FIFOScheduler(),
        concurrency=concurrency,
        staging_dir=str(tmp_path / "staging"),
        log=lambda line: None,
        launcher=Threads(),
        trainer=InMemoryTrainer,
        **kwargs,
    )
    return sweep, tracker


def _losses(lr_to_curve):
    """A script whose trial with ``lr`` reports the losses ``lr_to_curve(lr)`` (from where it resumes)."""

    def script(config: dict[str, Any], start: int):
        for loss in lr_to_curve(config["lr"])[start:]:
            yield {"loss": loss}

    return script


def _by_lr(result: SweepResult) -> dict[float, Any]:
    return {t.config["lr"]: t for t in result.trials}


def test_a_fifo_sweep_runs_every_trial_at_most_concurrency_at_a_time_and_records_each_once(tmp_path):
    running, most = [0], [0]
    lock = threading.Lock()

    def script(config, start):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            for epoch in range(3):
                yield {"loss": config["lr"] * (3 - epoch)}
        finally:
            with lock:
                running[0] -= 1

    sweep, tracker = _sweep(tmp_path, script, [0.1, 0.2, 0.3, 0.4], concurrency=2)
    result = sweep.run()

    assert [t.status for t in result.trials] == [TrialStatus.COMPLETED] * 4
    assert most[0] == 2  # two slots: never more, and both used
    assert result.best().config == {"lr": 0.1} and result.best().best == pytest.approx(0.1)
    runs = tracker.children(PARENT)
    assert len(runs) == 4 and {r.status for r in runs} == {"FINISHED"}
    by_run = {t.run_id: t for t in result.trials}
    assert set(by_run) == {r.run_id for r in runs}  # one run per trial, none twice
    for run in runs:
        trial = by_run[run.run_id]
        assert run.tags["sweepflow.trial_index"] == str(trial.index)
        assert run.params["lr"] == str(trial.config["lr"])
        assert [step for step, _ in run.metrics["loss"]] == [1, 2, 3]  # each report logged once, in order
        assert run.metrics["best_loss"][-1][1] == pytest.approx(trial.best)


def test_asha_stops_the_trials_behind_at_its_rung_and_says_so(tmp_path):
    scheduler = ASHAScheduler(metric="loss", mode="min", max_t=8, grace_period=2, reduction_factor=2)
    # Trials start in order, one at a time: the first sets each rung's bar, the worse ones fall at it.
    sweep, tracker = _sweep(
        tmp_path, _losses(lambda lr: [lr * 10 / e for e in range(1, 9)]), [0.1, 0.5, 0.2, 0.9],
        scheduler=scheduler, concurrency=1, max_reports=8,
    )
    trials = _by_lr(sweep.run())

    assert trials[0.1].status is TrialStatus.COMPLETED and trials[0.1].epochs == 8
    for lr in (0.5, 0.9):
        assert trials[lr].status is TrialStatus.STOPPED and trials[lr].stop_reason == "ASHA"
        assert trials[lr].epochs == 2  # at the first rung
    stopped = tracker.runs[trials[0.9].run_id]
    assert stopped.status == "FINISHED" and stopped.tags["sweepflow.stop_reason"] == "ASHA"


def test_a_failing_trial_fails_alone_and_fail_fast_ends_the_sweep_at_it(tmp_path):
    def script(config, start):
        yield {"loss": 1.0}
        if config["lr"] == 0.2:
            raise RuntimeError("CUDA out of memory (pretend)")
        yield {"loss": 0.5}

    result = _sweep(tmp_path / "a", script, [0.1, 0.2, 0.3], concurrency=1)[0].run()
    trials = _by_lr(result)
    assert trials[0.2].status is TrialStatus.FAILED and "out of memory" in trials[0.2].error
    assert trials[0.1].status is trials[0.3].status is TrialStatus.COMPLETED

    sweep, tracker = _sweep(tmp_path / "b", script, [0.1, 0.2, 0.3], concurrency=1, fail_fast=True)
    result = sweep.run()
    assert [t.status for t in result.trials] == [TrialStatus.COMPLETED, TrialStatus.FAILED]
    assert result.not_started == 1
    assert [r.status for r in tracker.children(PARENT)] == ["FINISHED", "FAILED"]


def test_a_diverged_trial_fails_and_is_never_shown_to_the_scheduler(tmp_path):
    seen: list[float] = []

    class Watching(FIFOScheduler):
        def on_trial_result(self, trial_id, result):
            seen.append(result["loss"])
            return super().on_trial_result(trial_id, result)

    sweep, _ = _sweep(
        tmp_path, _losses(lambda lr: [1.0, math.nan, 0.5] if lr == 0.2 else [1.0, 0.8, 0.6]), [0.1, 0.2],
        scheduler=Watching(), concurrency=1,
    )
    trials = _by_lr(sweep.run())
    assert trials[0.2].status is TrialStatus.FAILED and "non-finite loss" in trials[0.2].error
    assert trials[0.2].epochs == 2 and all(not math.isnan(v) for v in seen)


def test_a_metric_the_function_never_reports_stops_the_sweep_with_one_sentence(tmp_path):
    def script(config, start):
        yield {"accuracy": 0.5}

    sweep, tracker = _sweep(tmp_path, script, [0.1, 0.2, 0.3], concurrency=1)
    with pytest.raises(MetricNotReported, match="never reports 'loss'"):
        sweep.run()
    assert len(tracker.children(PARENT)) == 1  # the first trial's mistake: no other trial started


def test_pbt_continues_the_bottom_trial_from_the_top_ones_checkpoint(tmp_path):
    pbt = PopulationBasedTraining(
        time_attr="training_iteration", metric="loss", mode="min", perturbation_interval=2,
        hyperparam_mutations={"lr": [0.1, 0.2, 0.8, 0.9]}, quantile_fraction=0.5, resample_probability=1.0,
        synch=True,
    )
    starts: dict[float, list[int]] = {}

    def script(config, start):
        starts.setdefault(config["lr"], []).append(start)
        for epoch in range(start, 6):
            yield {"loss": config["lr"] * 10 / (epoch + 1)}

    sweep, tracker = _sweep(tmp_path, script, [0.1, 0.9], scheduler=pbt, concurrency=2, max_reports=6)
    result = sweep.run()

    exploited = [t for t in result.trials if len(t.config_history) > 1]
    assert len(exploited) >= 1
    first = exploited[0].config_history[1]
    assert first["donor"] == "trial_0000"  # lr=0.1 is on top
    assert first["iteration"] == 2
    assert any(s >= 2 for s in sum(starts.values(), []))  # a group started from the donor's report-2 checkpoint
    run = tracker.runs[exploited[0].run_id]
    assert int(run.tags["sweepflow.pbt.exploits"]) == len(exploited[0].config_history) - 1
    assert all(t.status is not TrialStatus.FAILED for t in result.trials)


def test_hyperband_pauses_a_bracket_at_its_milestone_and_goes_on_from_each_kept_trials_checkpoint(tmp_path):
    """As tests/flows/tune/test_tune_hyperband.py's end-to-end run: 8 trials, 2 at a time; trials 0-2 run to max_t=9;
    trials 3-7 (one bracket) pause at 3 until all five got there, then the best two go on from their
    checkpoints and three are stopped."""
    qualities = [0.5, 0.2, 0.9, 0.1, 0.7, 0.3, 0.95, 0.4]
    starts: dict[float, list[int]] = {}

    def script(config, start):
        starts.setdefault(config["lr"], []).append(start)
        for epoch in range(start, 9):
            yield {"loss": (1 - config["lr"]) * 10 / (epoch + 1)}

    sweep, tracker = _sweep(
        tmp_path, script, qualities, scheduler=HyperBandScheduler(metric="loss", mode="min", max_t=9,
        reduction_factor=3), concurrency=2, max_reports=9,
    )
    trials = _by_lr(sweep.run())

    assert [trials[q].epochs for q in qualities[:3]] == [9, 9, 9]
    bracket = qualities[3:]
    kept = sorted(q for q in bracket if trials[q].epochs == 9)
    assert kept == [0.7, 0.95]
    for q in bracket:
        assert starts[q][0] == 0
        if q in kept:
            # Paused at 3, then went on from that checkpoint, not from scratch (the last of the bracket to get
            # there is decided at once: it goes on without a pause).
            assert starts[q] in ([0, 3], [0]), starts
            assert [s for s, _ in tracker.runs[trials[q].run_id].metrics["loss"]] == list(range(1, 10))
        else:
            assert starts[q] == [0] and trials[q].status is TrialStatus.STOPPED
            assert trials[q].stop_reason == "HyperBand"
    assert sum(len(starts[q]) == 2 for q in kept) >= 1


def test_the_tail_hook_runs_once_when_every_trial_started_and_a_slot_stays_free(tmp_path):
    """``on_tail`` (the experiment starts registration's imports there): once, after the last trial started and
    one ended while another still runs; not while trials wait for slots, not after the last one ended."""
    tail_seen = threading.Event()
    calls: list[dict[float, bool]] = []
    running: dict[float, bool] = {}

    def script(config: dict[str, Any], start: int):
        running[config["lr"]] = True
        if config["lr"] == 4.0:  # started last; runs until the tail is seen
            assert tail_seen.wait(10), "on_tail was not called while this trial ran"
        yield {"loss": config["lr"]}
        running[config["lr"]] = False

    def on_tail() -> None:
        calls.append(dict(running))
        tail_seen.set()

    sweep, _ = _sweep(tmp_path, script, [1.0, 2.0, 3.0, 4.0], concurrency=2, on_tail=on_tail)
    result = sweep.run()
    assert {t.status for t in result.trials} == {TrialStatus.COMPLETED} and len(result.trials) == 4
    assert len(calls) == 1
    # Every trial had been launched; the first three had ended and the last had not (its thread may not have
    # begun its function yet: launched is what the hook waits for).
    assert [calls[0].get(lr) for lr in (1.0, 2.0, 3.0)] == [False, False, False]
    assert calls[0].get(4.0, True) is True

    # Fewer trials than slots: every trial starts at once, so the first to end leaves a slot free for good.
    tail_seen.clear()
    calls.clear()
    sweep, _ = _sweep(tmp_path / "b", script, [1.0, 4.0], concurrency=3, on_tail=on_tail)
    assert len(sweep.run().trials) == 2 and len(calls) == 1
    # One trial: it never ends while another runs.
    calls.clear()
    sweep, _ = _sweep(tmp_path / "c", _losses(lambda lr: [1.0]), [1.0], concurrency=2, on_tail=on_tail)
    sweep.run()
    assert calls == []


@pytest.mark.subprocess
def test_the_modules_example_runs_as_a_script_with_no_service(tmp_path):
    """The in-memory sweep is product code: the example in its docstring, run as a user's script (module level,
    no ``__main__`` guard) in a fresh interpreter with no Prefect API, MLflow or Dask address set, sweeps its
    four plain-Python trials (ASHA stopping the worse ones) and prints the best config."""
    import ast
    import os
    import subprocess
    import sys
    import textwrap

    from sweepflow.tasks.sweep import in_memory

    doc = ast.get_docstring(ast.parse(open(in_memory.__file__).read()))
    example = textwrap.dedent(doc.split("::\n\n", 1)[1].split("\nA trial's training function")[0])
    script = tmp_path / "sweep.py"
    script.write_text(example)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DASK_"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")  # nothing of the user's Prefect profile either
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "{'lr': 0.1}" in out.stdout, out.stdout
    # Which of the worse trials ASHA stops depends on the order two trials at a time reach its rungs: every
    # trial ended, none failed, and at least one was stopped early.
    import re

    ended = re.search(r"0 running, (\d+) stopped early, (\d+) completed, 0 failed, 0 pending", out.stdout)
    assert ended and int(ended[1]) >= 1 and int(ended[1]) + int(ended[2]) == 4, out.stdout
