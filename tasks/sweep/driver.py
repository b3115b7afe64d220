"""The sweep driver: ask the sampler for trials, run each as a ``train-trial`` task, tell the sampler the results.

    result = Sweep(sampler=..., template=..., cluster=client, tracker=..., parent_run_id=...,
                   scheduler=make_scheduler(...), concurrency=2).run()
    result.best(), result.leaderboard(), result.usage()

Trials start in their number's order, at most ``concurrency`` at a time. A trial is submitted when a slot is
free (a running trial's final report was answered, while its group tears down), so a trial's Prefect task run
and MLflow run start when it starts training, never while it waits; its wait is the ``sweepflow.queued_s``
tag of its MLflow run. The sweep's state lives in the trials' MLflow child runs (see ``results.py``), not here.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ddp_runtime.cluster import warm_up_workers
from ddp_runtime.config import ScalingConfig
from sweepflow.tasks.sweep.events import SweepObserver
from sweepflow.tasks.sweep.launch import PrefectTasks, TrialLauncher
from sweepflow.tasks.sweep.progress import SweepProgress
from sweepflow.tasks.sweep.results import SweepResult, TrialResult, TrialStatus
from sweepflow.tasks.sweep.resume import PriorSweep, replay
from sweepflow.tasks.sweep.runtime import SweepRuntime, Trainer
from sweepflow.tasks.sweep.samplers import Sampler, SamplerExhausted, SamplerWaiting
from sweepflow.tasks.sweep.slots import TrialSlots
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.sweep.trial_scheduler import TrialScheduler
from sweepflow.tasks.tracking.runs import RunTracker
from sweepflow.tasks.training.function import TrainFunction

PROGRESS_EVERY_S = 1.0  # at most one progress line a second (sub-second trials would log several each)
_SLOT_FREED = object()  # wakes the loop: a trial gave its slot back, so the next one may start
_COLD_S = 0.25  # a worker whose start-up took longer was cold (a warm one answers in milliseconds)


class Sweep:
    """Run a hyperparameter sweep: one DDP group per trial on the Dask cluster, one Prefect task run and one
    MLflow child run (under ``parent_run_id``) per trial, early stopping by ``scheduler``."""

    def __init__(
        self,
        *,
        sampler: Sampler,
        template: TrialTemplate,
        cluster: Any,
        tracker: RunTracker,
        parent_run_id: str,
        scheduler: TrialScheduler,
        concurrency: int,
        staging_dir: str,
        time_budget_s: float | None = None,
        artifacts_destination: str | None = None,
        prior: PriorSweep | None = None,
        fail_fast: bool = False,
        log: Callable[[str], None] = print,
        observer: SweepObserver | None = None,
        launcher: TrialLauncher | None = None,
        trainer: Trainer | None = None,
        on_tail: Callable[[], None] | None = None,
    ) -> None:
        """``prior``: the trials of an interrupted sweep this one resumes (``resume.load_prior_sweep``);
        ``fail_fast``: the first failed trial ends the sweep (the running trials stop, none starts);
        ``observer``: told the sweep's events as they happen (``events.py``); ``launcher``: how trials start
        (default: as ``train-trial`` Prefect task runs; ``launch.Threads()``: plain threads, no Prefect);
        ``trainer``: what runs a trial's group (default ``TorchTrainer`` on ``cluster``; tests give a fake one,
        and ``cluster`` None, for a sweep held wholly in memory); ``on_tail``: called once, from the driver
        loop, when every trial has started and one ends while fewer than ``concurrency`` others still run (a slot
        stays free for the rest of the sweep: the experiment starts registration's imports on an idle worker)."""
        if getattr(sampler, "total", None) is None:
            raise ValueError("the sweep's sampler must know how many trials it proposes (give it num_samples)")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.sampler = sampler
        self.template = template
        self.cluster = cluster
        self.tracker = tracker
        self.parent_run_id = parent_run_id
        self.scheduler = scheduler
        self.concurrency = min(concurrency, sampler.total)
        self.staging_dir = staging_dir
        self.time_budget_s = time_budget_s
        self.artifacts_destination = artifacts_destination
        self.prior = prior
        self.fail_fast = fail_fast
        self.log = log
        self.observer = observer
        self.launcher = launcher or PrefectTasks()
        self.trainer = trainer
        self.on_tail = on_tail

    def run(self) -> SweepResult:
        """Run every trial the sampler proposes (or as many as the time budget allows); return their results.
        Every trial's MLflow writes are done when this returns, even when it raises."""
        runtime = SweepRuntime(
            client=self.cluster,
            slots=TrialSlots(self.concurrency),
            scheduler=self.scheduler,
            tracker=self.tracker,
            parent_run_id=self.parent_run_id,
            progress=SweepProgress(
                self.template.selection_metric,
                self.template.selection_mode,
                self.sampler.total,
                log=self.log,
                min_interval_s=PROGRESS_EVERY_S,
            ),
            staging_dir=self.staging_dir,
            deadline=time.monotonic() + self.time_budget_s if self.time_budget_s else None,
            artifacts_destination=self.artifacts_destination,
            fail_fast=self.fail_fast,
            observer=self.observer,
            sampler=self.sampler,
            **({"trainer": self.trainer} if self.trainer is not None else {}),
        )
        started = time.perf_counter()
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(runtime.writers.join)  # raises if a trial's results did not reach MLflow
            cleanup.callback(runtime.progress.close)
            cleanup.callback(self.launcher.close)
            in_flight: dict[Any, tuple[int, float]] = {}  # task future -> (sampler's number, submitted at)
            try:
                startup_s = self._start_up_workers()
                runtime.notify("sweep_started", self.sampler.total)
                trials, not_started = self._run_trials(runtime, in_flight)
            except BaseException as exc:
                # A trial's mistake that every trial would repeat (or an interrupt): the running trials stop at
                # their next report, the queued ones start nothing, and the sweep ends with the first error.
                runtime.abort(f"the sweep is stopping: {type(exc).__name__}")
                for future in list(in_flight):
                    self.launcher.wait(future)
                raise
        runtime.notify("sweep_ended", tuple(trials))
        if runtime.observer_error is not None:  # the trials have ended (as after any error): now it is raised
            raise runtime.observer_error
        result = SweepResult(
            tuple(trials),
            metric=self.template.selection_metric,
            mode=self.template.selection_mode,
            not_started=not_started,
            startup_s=startup_s,
        )
        self.log(self._summary_line(result, time.perf_counter() - started))
        return result

    def _start_up_workers(self) -> float:
        """The workers' one-time start-up (a cold cluster's first imports: torch._dynamo, the preloads, the
        training function's module), all at once before the first trial, so it is in no trial's time or
        worker-seconds; returns its seconds (0.0: the workers were warm). Best effort: a worker that did not
        finish is finished by its first rank, whose group reports those seconds apart (``startup_seconds``)."""
        t = self.template
        if self.cluster is None:  # a sweep held in memory (a fake trainer): nothing to start
            return 0.0
        scaling = ScalingConfig(
            num_workers=t.num_ranks, use_gpu=t.use_gpu, resources_per_worker=t.resources_per_rank or None
        )
        prepare = TrainFunction(t.train_fn, script_dir=t.import_dir).warm_up
        started = time.perf_counter()
        try:
            took = warm_up_workers(self.cluster, scaling, prepare=prepare)
        except Exception as exc:  # noqa: BLE001 - the trials start the workers then, as they always could
            self.log(f"worker start-up before the first trial skipped ({type(exc).__name__}: {exc})")
            return 0.0
        seconds = time.perf_counter() - started
        cold = [s for s in took.values() if isinstance(s, str) or s >= _COLD_S]
        if not cold:
            return 0.0
        self.log(
            f"workers started up in {seconds:.1f}s ({len(cold)} of {len(took)} cold: first imports); "
            "not charged to any trial"
        )
        return seconds

    @staticmethod
    def _summary_line(result: SweepResult, wall_s: float) -> str:
        usage = result.usage()
        line = (
            f"sweep ended in {wall_s:.1f}s: {len(result.trials)} trial(s) used {usage['worker_seconds']:.1f} "
            f"worker-seconds ({usage['gpu_seconds']:.1f} GPU-seconds; early stopping saved "
            f"{usage['saved_worker_seconds']:.1f})"
        )
        if usage["startup_seconds"] > 0:
            line += f"; worker start-up {usage['startup_seconds']:.1f}s, in no trial's time"
        return line

    def _run_trials(
        self, runtime: SweepRuntime, in_flight: dict[Any, tuple[int, float]]
    ) -> tuple[list[TrialResult], int]:
        # The loop wakes when a trial's task ends (its future) and when a trial gives its slot back.
        events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        runtime.slots.on_release = lambda: events.put(_SLOT_FREED)
        finished: list[TrialResult] = []
        submitted = 0  # trials the sweep is done with starting (read back from a resumed sweep, or submitted)
        tasks_submitted = 0  # trials submitted as tasks: each tells the scheduler it started
        next_in_line_since = time.perf_counter()  # when the next trial began to wait for a slot
        tail = self.on_tail  # called once, then None
        # A proposal is asked for when its turn has a free slot, and kept if a paused trial took the slot first.
        proposal: tuple[int, dict[str, Any]] | None = None
        waiting = False  # the sampler had no config for the next trial: ask again once a trial ends
        while True:  # a step: start what can start, then take one trial's end or a freed slot
            runtime.notify("step_begin")
            while (
                submitted < self.sampler.total and not waiting and not runtime.aborted and not runtime.out_of_time()
            ):
                prior = self.prior.trials.get(submitted) if self.prior else None
                if prior is not None and prior.result is not None:  # it ended before the sweep died
                    finished.append(self._read_back(prior.result, runtime))
                    submitted += 1
                    continue
                if proposal is None:
                    if not runtime.slots.free_for(submitted):
                        break  # every slot is held: wait for a release or a trial's end
                    if prior is not None:  # it was running: same config, same run, from its checkpoint
                        proposal = self.sampler.ask_known(prior.config), prior.config
                    else:
                        try:
                            proposal = self.sampler.ask()
                        except SamplerWaiting:
                            waiting = True
                            break
                        except SamplerExhausted:
                            break  # its searcher has no more: ``total`` is now the trials it proposed
                slot = runtime.slots.acquire(submitted, timeout=0)
                if slot is None:
                    break  # a paused trial took the slot: the proposal waits for the next one
                self._start(
                    runtime, slot, submitted, proposal, prior, queued_s=time.perf_counter() - next_in_line_since,
                    in_flight=in_flight, events=events,
                )
                proposal = None
                tasks_submitted += 1
                submitted += 1
                next_in_line_since = time.perf_counter()
            if submitted >= self.sampler.total or runtime.aborted or runtime.out_of_time():
                # A scheduler waiting for a full group of trials stops waiting once the ones started are there.
                self.scheduler.no_more_trials(tasks_submitted)
            if not in_flight:
                runtime.notify("step_end")
                if waiting:
                    raise RuntimeError(
                        f"the search had no config for trial {submitted} (a Searcher's suggest returned None) while "
                        "no trial was running, so no result could change its answer: return a config, or "
                        "Searcher.FINISHED when the search is done"
                    )
                break
            event = events.get()
            if event is _SLOT_FREED:
                runtime.notify("step_end")
                continue
            ended = self._ended(event, in_flight, runtime)
            if ended is None:
                runtime.notify("step_end")
                continue  # the sweep was stopping when its task began
            waiting = False
            finished.append(ended)
            if tail is not None and submitted >= self.sampler.total and 0 < len(in_flight) < self.concurrency:
                tail, call = None, tail
                call()
            runtime.notify("step_end")
        not_started = self.sampler.total - len(finished)
        if not_started:
            why = runtime.aborted or "time budget spent"
            self.log(f"{why}: {not_started} trial(s) not started")
        return finished, not_started

    def _start(
        self,
        runtime: SweepRuntime,
        slot: Any,
        index: int,
        proposal: tuple[int, dict[str, Any]],
        prior: Any,
        *,
        queued_s: float,
        in_flight: dict[Any, tuple[int, float]],
        events: queue.SimpleQueue[Any],
    ) -> None:
        """Start trial ``index`` on ``slot`` with the sampler's ``proposal``: the scheduler learns of it, its task
        is submitted, and its end wakes the loop (``events``); ``queued_s`` is how long it waited for the slot."""
        number, params = proposal
        resume = prior.resume_from() if prior is not None and not prior.restart else None
        spec = self.template.trial(index, params, resume)
        self.sampler.started(number, spec.trial_id)
        filled = self.scheduler.on_trial_config(spec.trial_id, spec.params)  # PBT adds mutated names
        if filled != spec.params:
            spec = self.template.trial(index, filled, spec.resume)
        runtime.progress.holds_slot(spec.trial_id, slot)
        runtime.grant(spec.index, slot, queued_s=queued_s)
        # Added here, in trial order, not when its task's thread gets going: a scheduler that deals
        # trials into groups (HyperBand's brackets) deals the same trials together on every run.
        self.scheduler.on_trial_add(spec.trial_id)
        try:
            future = self.launcher.submit(spec, runtime)
        except BaseException:
            runtime.take_grant(spec.index)[0].release()
            self.scheduler.on_trial_error(spec.trial_id)
            raise
        future.add_done_callback(events.put)
        in_flight[future] = (number, time.perf_counter())

    def _ended(
        self, event: Any, in_flight: dict[Any, tuple[int, float]], runtime: SweepRuntime
    ) -> TrialResult | None:
        """A trial's task ended: the sampler learns its result and the callbacks see it; None if it never
        started (the sweep was stopping when its task began)."""
        number, submitted_at = in_flight[event]
        result: TrialResult = event.result()  # a trial's own error (not a training failure) ends the sweep
        del in_flight[event]
        self.launcher.ended(event)
        if result.status is TrialStatus.NOT_STARTED:
            return None
        # Early-stopped trials count with the best value they reached, as in Ray; failures as failed.
        self.sampler.tell_result(number, result)
        ended = self._with_bookkeeping(result, submitted_at)
        runtime.notify("trial_ended", ended)
        return ended

    def _read_back(self, result: TrialResult, runtime: SweepRuntime) -> TrialResult:
        """An ended trial of the resumed sweep: not trained again. The sampler and the scheduler learn its
        result as they did the first time, and its turn to start is over."""
        number = self.sampler.ask_known(result.config)
        self.sampler.tell_result(number, result)
        replay(runtime.scheduler, result)
        runtime.slots.forfeit(result.index)
        runtime.progress.update(result.trial_id, metrics={self.template.selection_metric: result.best}, status=result.status)
        return result

    @staticmethod
    def _with_bookkeeping(result: TrialResult, submitted_at: float) -> TrialResult:
        """Per-trial bookkeeping (Prefect task run + MLflow child run + group start/stop): the trial's wall time
        from its submission (it held a slot from then on) minus the time spent inside the training function and
        any wait for a cold worker's start-up."""
        wall = time.perf_counter() - submitted_at
        return replace(result, bookkeeping_s=wall - result.train_time_s - result.usage.startup_seconds)
