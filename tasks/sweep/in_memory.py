"""A sweep held wholly in memory, as an Optuna study runs in memory: the real ``Sweep`` driver, slots, schedulers,
trial life and run writers, with trials started as threads (``launch.Threads``), each trial's group played in
the trial's thread by ``InMemoryTrainer`` and runs kept by ``InMemoryTracker``. No Prefect, no Dask, no MLflow
server: a sweep of plain-Python trials runs in milliseconds a trial, in a notebook or a test::

    import tempfile

    from sweepflow.tasks.sweep.asha import ASHAScheduler
    from sweepflow.tasks.sweep.driver import Sweep
    from sweepflow.tasks.sweep.in_memory import InMemoryTracker, InMemoryTrainer
    from sweepflow.tasks.sweep.launch import Threads
    from sweepflow.tasks.sweep.samplers import GridSampler
    from sweepflow.tasks.sweep.template import TrialTemplate

    def trial(config, start):  # start: the reports made before the checkpoint it continues from
        for step in range(start, 8):
            yield {"loss": (config["lr"] - 0.1) ** 2 + 1 / (step + 1)}

    root = tempfile.mkdtemp()
    result = Sweep(
        sampler=GridSampler({"lr": {"type": "grid", "values": [0.01, 0.1, 0.3, 1.0]}}),
        template=TrialTemplate(train_fn=trial, selection_metric="loss", selection_mode="min", max_reports=8),
        cluster=None, tracker=InMemoryTracker(root), parent_run_id="sweep",
        scheduler=ASHAScheduler(metric="loss", mode="min", max_t=8, grace_period=1),
        concurrency=2, staging_dir=root, launcher=Threads(), trainer=InMemoryTrainer,
    ).run()
    print(result.best().config, result.leaderboard())

A trial's training function here is a *script*: ``script(config, start) -> iterable of reports`` (dicts), where
``start`` is the number of reports the trial made before the checkpoint it continues from (0 on a fresh start).
``InMemoryTrainer`` numbers the reports (``training_iteration``), saves a checkpoint with every report (a JSON
file holding the report count and the config), asks the sweep's ``on_report`` after each, and stops when told. A
script that raises fails its group, as a rank's error does. The sweep's decisions are the ones it makes on the
real services (tests/tasks/sweep/test_sweep_in_memory.py checks them here, the end-to-end tests there).
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ddp_runtime import Checkpoint, Result, TrainingFailedError
from ddp_runtime.checkpoint import RunStorage
from ddp_runtime.torch import Verdict

Script = Callable[[dict[str, Any], int], Iterable[dict[str, Any]]]
STATE_FILE = "state.json"


@dataclass
class InMemoryRun:
    """One run as the in-memory tracker holds it."""

    run_id: str
    name: str
    parent_run_id: str | None
    artifact_uri: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    status: str = "RUNNING"
    artifacts: list[tuple[str, str | None]] = field(default_factory=list)


class InMemoryTracker:
    """The calls a sweep makes on ``RunTracker`` (create a run, write batches, end it, log artifacts), kept in
    dicts. Artifacts stay where they were logged from (their paths are recorded)."""

    tracking_uri = "memory://"
    experiment_id = "0"

    def __init__(self, root: str, experiment_name: str = "in-memory") -> None:
        self.root = root
        self.experiment_name = experiment_name
        self.runs: dict[str, InMemoryRun] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def create_run(self, name: str, *, parent_run_id: str | None = None, tags: dict[str, Any] | None = None):
        with self._lock:
            run_id = f"run{next(self._ids):04d}"
            artifact_uri = os.path.join(self.root, run_id, "artifacts")
            self.runs[run_id] = InMemoryRun(
                run_id, name, parent_run_id, artifact_uri, tags={k: str(v) for k, v in (tags or {}).items()}
            )
        return run_id, artifact_uri

    def log_batch(self, run_id: str, *, metrics=(), params=(), tags=()) -> None:
        run = self.runs[run_id]
        with self._lock:
            for m in metrics:
                run.metrics[m.key].append((m.step, m.value))
            run.params.update({p.key: p.value for p in params})
            run.tags.update({t.key: t.value for t in tags})

    def finish(self, run_id: str, status: str, *, metrics=(), params=(), tags=()) -> None:
        self.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        self.runs[run_id].status = status

    def set_status(self, run_id: str, status: str) -> None:
        self.runs[run_id].status = status

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        self.runs[run_id].artifacts.append((local_path, artifact_path))

    def children(self, parent_run_id: str) -> list[InMemoryRun]:
        """The trial runs under a parent, in creation order."""
        return [r for r in self.runs.values() if r.parent_run_id == parent_run_id]


class InMemoryTrainer:
    """Plays a trial's group in the trial's own thread: the script's reports, one checkpoint each, the sweep's
    verdict after each. Built with ``TorchTrainer``'s arguments (``SweepRuntime.trainer``); the trial's function
    is the script."""

    def __init__(
        self,
        function: Any,
        *,
        train_loop_config: dict[str, Any],
        run_config: Any,
        on_report: Callable[[dict[str, Any]], Any],
        resume_from_checkpoint: Checkpoint | None = None,
        **_: Any,  # scaling, torch config, client, on_side: a group played in memory has no ranks
    ) -> None:
        self.script: Script = function.target
        self.config = train_loop_config
        self.storage = RunStorage(run_config.storage_path, run_config.name, run_config.storage_options)
        self.on_report = on_report
        self.resume_from = resume_from_checkpoint

    def fit(self) -> Result:
        started = time.time()
        start = 0
        if self.resume_from is not None:
            with self.resume_from.as_directory() as d, open(os.path.join(d, STATE_FILE)) as f:
                start = json.load(f)["reports"]
        committed = self.storage.list_committed()
        index = committed[-1].index + 1 if committed else 0
        history: list[dict[str, Any]] = []
        latest: Checkpoint | None = None
        stopped = False
        error: BaseException | None = None
        reports = iter(self.script(dict(self.config), start))
        for n in itertools.count(start + 1):
            try:
                report = next(reports, None)
            except Exception as exc:  # noqa: BLE001 - a rank's error: the group fails with it, as a real one does
                error = exc
                break
            if report is None:
                break
            metrics = {**report, "training_iteration": len(history) + 1}
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, STATE_FILE), "w") as f:
                    json.dump({"reports": n, "config": self.config}, f, default=str)
                latest = self.storage.persist(d, index, metrics)
            index += 1
            history.append(metrics)
            answer = self.on_report(dict(metrics))  # the driver's own errors go on, as from a real group
            if answer.stop if isinstance(answer, Verdict) else bool(answer):
                stopped = True
                break
        result = Result(
            metrics=history[-1] if history else None,
            metrics_history=history,
            checkpoint=latest,
            best_checkpoints=[],
            path=self.storage.uri,
            error=error,
            num_failures=1 if error is not None else 0,
            stopped_early=stopped,
            train_time_s=time.time() - started,
            held_s=time.time() - started,
            started_at=started,
            ended_at=time.time(),
        )
        if error is not None:
            raise TrainingFailedError(result)
        return result
