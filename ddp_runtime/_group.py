"""One attempt of a ``TorchTrainer`` group, driven from the trainer's process: reserve, launch, relay reports,
watch, tear down, release (``GroupRun``).

The ranks themselves run ``_worker.run_rank`` on their Dask workers; the scheduler side of the reservation is
``_gang``; naming the rank(s) that hung, from their stacks, is ``_hang``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from distributed import Client, Event, Future, Queue, Variable
from distributed.comm import get_address_host

from ddp_runtime import _compat
from ddp_runtime import _gang as gang
from ddp_runtime._hang import blame_stuck_rank, hang_error
from ddp_runtime._worker import (
    CHECKPOINT_THEN_CONTINUE,
    CHECKPOINT_THEN_STOP,
    CONTINUE,
    STARTED,
    STOP,
    RankSpec,
    rank_stacks,
    rendezvous_variable_name,
    reports_queue_name,
    run_rank,
    verdicts_queue_name,
)
from ddp_runtime.callback import TrainRunContext, UserCallback
from ddp_runtime.checkpoint import Checkpoint, RunStorage, StoredCheckpoint, select_kept
from ddp_runtime.config import RunConfig, ScalingConfig, TorchConfig, default_storage_path, stop_met
from ddp_runtime.result import RankError, RankHangError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """What ``on_report`` may return instead of a bool: whether the group stops at this report, and whether rank
    0 saves a checkpoint of it first (when its function offers one: ``report(..., checkpoint_on_request=...)``;
    e.g. a Tune class trainable, asked by a callback's ``should_checkpoint``)."""

    stop: bool = False
    checkpoint: bool = False


ReportCallback = Callable[[dict[str, Any]], bool | Verdict | None]

# How often the driver asks the scheduler whether the group's workers are still alive. Each check is a
# `run_on_scheduler` round trip that costs the flow process and the scheduler CPU for as long as a trial trains
# (every 0.5 s, with the loop's old 0.1-s wake-ups, it was about half the flow process's CPU during long trials:
# benchmarks/RESULTS.md, "The watch loop"); a killed worker is noticed within this long, against the seconds a
# group takes to restart.
_LIVENESS_EVERY_S = 2.0
_MIN_WAIT_S = 0.01  # the shortest wait on the report queue: a check that is due does not spin the loop
_WORKER_RESTART_GRACE_S = (
    120.0  # how long killed workers may take to come back before "too few workers" is final
)
_RESERVE_WAIT_S = 2.0  # longest single wait for workers inside the scheduler before asking again
_STACKS_TIMEOUT_S = 10.0  # how long the driver waits for a stuck group's stacks (a worker may not answer)


class Trainer(Protocol):
    """What a group reads from the ``TorchTrainer`` that runs it (a Protocol, since the trainer imports this
    module)."""

    name: str
    train_loop_per_worker: Callable[..., Any]
    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig
    run_config: RunConfig
    torch_config: TorchConfig
    storage: RunStorage
    on_report: ReportCallback | None
    callbacks: list[UserCallback]  # RunConfig(callbacks=...): called with each report (``callback``)
    run_context: TrainRunContext


class WorkerRestarts:
    """Until when the Dask workers that a failed group's teardown killed may still be coming back, for one
    client's cluster.

    Their nannies start fresh processes, which takes a while; meanwhile the cluster looks too small, and a
    reservation the scheduler calls "impossible" only means "busy". Kept per client (``of``), so every group
    this client drives (an attempt after the failed one, other trials sharing the client) waits for them.
    """

    _NAME = "sweepflow-worker-restarts"

    def __init__(self) -> None:
        self._until = 0.0  # time.monotonic()

    @classmethod
    def of(cls, client: Client) -> WorkerRestarts:
        return _compat.client_singleton(client, cls._NAME, cls)

    def started(self, grace_s: float) -> None:
        """Workers were just killed: they may take up to ``grace_s`` to come back."""
        self._until = time.monotonic() + grace_s

    def under_way(self) -> bool:
        return time.monotonic() <= self._until


class _Wake:
    """Put on a group's inbox when a rank's future ends: wakes the watch loop, carries nothing."""


_END = "__sweepflow_end__"  # put on the report queue by the driver to stop its pump thread
_WAKE = _Wake()

Inbox = queue.Queue[dict[str, Any] | _Wake]


def _pump(reports: Queue, inbox: Inbox) -> None:
    while True:
        message = reports.get()
        if message == _END:
            return
        inbox.put(message)


def _peek(inbox: Inbox) -> list[dict[str, Any] | _Wake]:
    return _compat.queued_items(inbox)


class GroupRun:
    """One attempt of a group: reserve, launch, relay reports, watch, tear down, release."""

    def __init__(
        self,
        trainer: Trainer,
        client: Client,
        attempt: int,
        resume: Checkpoint | None,
        committed: list[StoredCheckpoint],
        history: list[dict[str, Any]],
    ) -> None:
        self.trainer = trainer
        self.client = client
        self.attempt = attempt
        self.resume = resume
        self.committed = list(committed)
        self.history = history
        self.restarts = WorkerRestarts.of(client)
        self.group_id = f"{trainer.name}-{uuid.uuid4().hex[:8]}"
        self.channel = f"sweepflow-{self.group_id}-a{attempt}"
        self.error: BaseException | None = None
        self.stopped = False
        # What a UserCallback raised (StopTraining or an error): the group stops, fit() raises it after.
        self.callback_raised: BaseException | None = None
        # a report whose callbacks wait for its checkpoint (a multi-rank group's, committed after its metrics)
        self._awaiting_checkpoint: dict[str, Any] | None = None
        self.train_time_s = 0.0
        self.held_s = 0.0  # from the reservation to its release, less the start-up below
        # Seconds the group waited for cold workers' one-time start-up (imports; the slowest rank's): not the
        # group's own time, so not in held_s (``_warmup``).
        self.startup_s = 0.0
        self.launched_at = 0.0  # time.time() when the rank tasks were submitted
        self.rank0_window: tuple[str, float, float] | None = None  # worker, entered, left the function
        # Stacks of the ranks still running when a failed group was torn down (by rank), taken before their
        # workers were killed; "why" when they could not be taken.
        self.stuck_stacks: dict[int, list[tuple[str, int, str, str, str]]] = {}

    def run(self) -> GroupRun:
        # The report channel first: opening it costs scheduler round trips, better spent before workers free
        # up than between their release and the ranks' start.
        reports = Queue(reports_queue_name(self.channel), client=self.client)
        verdicts = Queue(verdicts_queue_name(self.channel), client=self.client)
        try:
            addresses = self._reserve()
            reserved_at = time.perf_counter()
            try:
                self._launch_and_watch(addresses, reports, verdicts)
                self.flush_callbacks()
            finally:
                # Usually a no-op: the reservation ended on the scheduler when the last rank task finished.
                # It matters when a rank's worker died or the launch itself failed.
                self.client.run_on_scheduler(gang.release, self.group_id)
                self.held_s = max(time.perf_counter() - reserved_at - self.startup_s, 0.0)
                if len(addresses) > 1:  # only multi-rank groups rendezvous
                    name = rendezvous_variable_name(self.channel)
                    with contextlib.suppress(KeyError):  # not set when rank 0 never got that far
                        Variable(name, client=self.client).delete()
                    Event(name, client=self.client).clear()  # the scheduler drops it: no rank waits on it now
        finally:
            # The scheduler drops a queue when its last holder (this driver, rank 0) lets go of it.
            reports.close()
            verdicts.close()
        return self

    def _rank_keys(self) -> list[str]:
        return [
            f"{gang.RANK_KEY_PREFIX}{self.group_id}-a{self.attempt}-r{rank}"
            for rank in range(self.trainer.scaling_config.num_workers)
        ]

    def _reserve(self) -> list[str]:
        scaling = self.trainer.scaling_config
        resources = {k: float(v) for k, v in scaling.worker_resources.items()}
        while True:
            # Waits on the scheduler while the cluster is busy and returns as soon as workers free up; the
            # bounded wait only keeps the driver responsive (and re-checks after a missed wake-up).
            status, payload = self.client.run_on_scheduler(
                gang.reserve,
                self.group_id,
                scaling.num_workers,
                resources,
                self._rank_keys(),
                _RESERVE_WAIT_S,
            )
            if status == "reserved":
                return payload
            # Workers this process killed after a group failure are coming back: that is "busy", not "never".
            if status == "impossible":
                if not self.restarts.under_way():
                    raise gang.InsufficientResourcesError(payload)
                time.sleep(0.25)

    def _specs(self, addresses: list[str]) -> list[RankSpec]:
        trainer = self.trainer
        scaling, tc, rc = trainer.scaling_config, trainer.torch_config, trainer.run_config
        hosts = [get_address_host(a) for a in addresses]
        node_order = list(dict.fromkeys(hosts))
        next_index = (self.committed[-1].index + 1) if self.committed else 0
        # Ray's switch, read where a Ray script sets it (the driver): 0 keeps ranks in their worker's directory.
        chdir = os.environ.get("RAY_CHDIR_TO_TRIAL_DIR", "1").strip() != "0"
        specs = []
        for rank, host in enumerate(hosts):
            same_host = [r for r, h in enumerate(hosts) if h == host]
            specs.append(
                RankSpec(
                    group_id=self.group_id,
                    attempt=self.attempt,
                    world_rank=rank,
                    world_size=len(addresses),
                    local_rank=same_host.index(rank),
                    local_world_size=len(same_host),
                    node_rank=node_order.index(host),
                    backend=tc.backend or ("nccl" if scaling.use_gpu else "gloo"),
                    use_gpu=scaling.use_gpu,
                    cpus=scaling.threads_per_worker or scaling.worker_resources.get("CPU"),
                    timeout_s=tc.timeout_s,
                    rendezvous_timeout_s=tc.rendezvous_timeout_s,
                    storage_path=rc.storage_path or default_storage_path(),
                    run_name=trainer.name,
                    storage_options=rc.storage_options,
                    resume_from=self.resume,
                    next_checkpoint_index=next_index,
                    chdir=chdir,
                )
            )
        return specs

    def _launch_and_watch(self, addresses: list[str], reports: Queue, verdicts: Queue) -> None:
        client = self.client
        self.launched_at = time.time()
        futures: list[Future] = [
            client.submit(
                run_rank,
                self.trainer.train_loop_per_worker,
                self.trainer.train_loop_config,
                spec,
                key=key,
                workers=[address],
                allow_other_workers=False,
                pure=False,
            )
            for spec, address, key in zip(self._specs(addresses), addresses, self._rank_keys(), strict=True)
        ]
        try:
            self._watch(futures, addresses, reports, verdicts)
        finally:
            outcomes = self._teardown(futures, addresses)
        if isinstance(self.error, RankHangError):
            return  # named from the ranks' stacks when the hang was found
        if isinstance(self.error, RankError) and self.error.traceback_text:
            self.error = self._root_cause(outcomes)
            # The earliest error is often a rank whose collective timed out waiting for a peer that never came
            # (TorchConfig.timeout_s): the cause is then that peer, still running somewhere else.
            timeout_s = self.trainer.torch_config.timeout_s
            self.error = (
                blame_stuck_rank(self.error, self.stuck_stacks, addresses, timeout_s=timeout_s) or self.error
            )

    def _startup_s(self, outcomes: list[dict[str, Any]]) -> float:
        """How long the group waited for cold workers' start-up: from its launch until the last cold rank was
        ready (a busy cold worker is slow even to start the rank's task), at least the longest a rank measured
        itself (clocks of other hosts may differ a little). 0.0 when every rank's worker was warm."""
        cold = [o for o in outcomes if "startup_s" in o]
        if not cold:
            return 0.0
        waited = max(float(o["ready_at"]) for o in cold) - self.launched_at
        return max(waited, *(float(o["startup_s"]) for o in cold))

    @staticmethod
    def _root_cause(outcomes: list[dict[str, Any]]) -> RankError:
        """The rank that failed first caused the others to fail (their peers' connections closed)."""
        failed = [o for o in outcomes if o["status"] == "error"]
        first = min(
            failed, key=lambda o: (o.get("time", float("inf")), o["rank"] if o["rank"] is not None else -1)
        )
        return RankError(first["rank"], first.get("worker"), first["message"], first.get("traceback", ""))

    def _watch(self, futures: list[Future], addresses: list[str], reports: Queue, verdicts: Queue) -> None:
        # A thread long-polls the Dask queue (one pending RPC, no timeouts) and hands messages to this loop
        # through a local queue, so waiting here costs nothing and a report is answered as soon as it lands.
        inbox: Inbox = queue.Queue()
        pump = threading.Thread(
            target=_pump, args=(reports, inbox), name=f"{self.channel}-reports", daemon=True
        )
        pump.start()
        for future in futures:  # wake the loop as soon as a rank ends, instead of at its next poll
            future.add_done_callback(lambda _f: inbox.put(_WAKE))
        try:
            self._watch_loop(futures, addresses, inbox, verdicts)
        finally:
            reports.put(_END)  # wakes the pump so it exits
            pump.join(timeout=5)

    def _watch_loop(self, futures: list[Future], addresses: list[str], inbox: Inbox, verdicts: Queue) -> None:
        next_liveness = time.monotonic() + _LIVENESS_EVERY_S
        hang_timeout_s = self.trainer.torch_config.hang_timeout_s
        # When the group last made progress: rank 0 entering the training function, then each report. Set-up
        # before that (rendezvous, process group) is bounded by TorchConfig's rendezvous and collective timeouts.
        last_progress: float | None = None
        while True:
            # Reports, a rank's start and a rank's end all arrive through the inbox (the futures' done callbacks
            # put _WAKE there): between them the loop sleeps until its next check is due, not on a timer.
            due = next_liveness
            if hang_timeout_s is not None and last_progress is not None:
                due = min(due, last_progress + hang_timeout_s)
            try:
                message = inbox.get(timeout=max(_MIN_WAIT_S, due - time.monotonic()))
            except queue.Empty:
                message = None
            if message == STARTED:
                last_progress = time.monotonic()
                continue
            if message is not None and message is not _WAKE:
                verdicts.put(self._on_report(message))
                if message["metrics"] is not None or message["checkpoint"] is not None:
                    last_progress = time.monotonic()  # side messages alone are no progress of the training
                continue  # drain reports before looking at futures: a finished rank 0 may have queued some
            outcomes = [self._outcome(f) for f in futures if f.done()]
            if any(o["status"] == "error" for o in outcomes):
                self._deliver_side(outcomes)
                self.error = self._root_cause(outcomes)  # refined after teardown, once every rank has ended
                return
            if len(outcomes) == len(futures) and all(m is _WAKE for m in _peek(inbox)):
                self._deliver_side(outcomes)
                self.stopped = any(o["status"] == "stopped" for o in outcomes)
                return
            if time.monotonic() >= next_liveness:
                gone = self.client.run_on_scheduler(gang.missing_workers, addresses)
                if gone:
                    ranks = [addresses.index(a) for a in gone]
                    self.error = RankError(
                        ranks[0],
                        gone[0],
                        f"Dask worker(s) {gone} of rank(s) {ranks} died (process killed, out of memory, or lost)",
                    )
                    return
                next_liveness = time.monotonic() + _LIVENESS_EVERY_S
            if hang_timeout_s is not None and last_progress is not None:
                silent_s = time.monotonic() - last_progress
                if silent_s > hang_timeout_s:
                    self.error = self._hang_error(futures, addresses, silent_s)
                    if self.error is not None:
                        return
                    last_progress = time.monotonic()  # every rank ended meanwhile: the loop sees that next

    def _outcome(self, future: Future) -> dict[str, Any]:
        if future.status == "finished":
            return future.result()
        rank = int(str(future.key).rsplit("-r", 1)[-1])
        if future.status == "cancelled":
            return {"rank": rank, "status": "error", "message": "rank task was cancelled"}
        exc = future.exception()
        text = "".join(traceback.format_exception(type(exc), exc, future.traceback()))
        return {"rank": rank, "status": "error", "message": f"{type(exc).__name__}: {exc}", "traceback": text}

    def _stacks(self, futures: list[Future], addresses: list[str], ranks: list[int]) -> dict[int, Any]:
        """The current Python stack of each of these ranks that is still running, by rank, read on its worker;
        a rank whose worker did not answer (within ``_STACKS_TIMEOUT_S``: its event loop may be stuck too)
        maps to the reason, a string."""
        running = {
            str(futures[rank].key): (rank, addresses[rank]) for rank in ranks if not futures[rank].done()
        }
        if not running:
            return {}
        answer: dict[str, Any] = {}

        def ask() -> None:
            try:
                answer["stacks"] = self.client.run(
                    rank_stacks,
                    list(running),
                    workers=sorted({a for _, a in running.values()}),
                    on_error="return",
                )
            except BaseException as exc:  # noqa: BLE001 - told to the user as why the stacks are missing
                answer["error"] = exc

        # In a thread, so a worker that never answers delays the verdict by _STACKS_TIMEOUT_S, not forever.
        asking = threading.Thread(target=ask, name=f"{self.channel}-stacks", daemon=True)
        asking.start()
        asking.join(_STACKS_TIMEOUT_S)
        found: dict[int, Any] = {}
        for key, (rank, address) in running.items():
            reply = answer.get("stacks", {}).get(address, answer.get("error"))
            if isinstance(reply, dict):
                found[rank] = reply.get(key, "it ended while its stack was being read")
            elif reply is not None:  # the exception that worker (or the call) raised
                found[rank] = f"its worker could not be asked for its stack ({type(reply).__name__}: {reply})"
            else:
                found[rank] = (
                    f"its worker did not answer within {_STACKS_TIMEOUT_S:g} s when asked for its stack"
                )
        return found

    def _hang_error(
        self, futures: list[Future], addresses: list[str], silent_s: float
    ) -> RankHangError | None:
        """TorchConfig.hang_timeout_s ran out: name the rank(s) that hung, from every running rank's stack
        (None if every rank ended meanwhile: no hang then)."""
        stacks = self._stacks(futures, addresses, list(range(len(futures))))
        if not stacks:
            return None
        finished = [rank for rank, f in enumerate(futures) if f.done()]
        return hang_error(
            stacks,
            addresses,
            finished,
            silent_s=silent_s,
            hang_timeout_s=self.trainer.torch_config.hang_timeout_s,
        )

    def _deliver_side(self, outcomes: list[dict[str, Any]]) -> None:
        """Rank 0's side messages that came with its result (posted after its last report)."""
        for outcome in outcomes:
            for payload in outcome.get("side", ()):
                self._on_side(payload)

    def _on_side(self, payload: Any) -> None:
        if self.trainer.on_side is not None:
            self.trainer.on_side(payload)

    def _on_report(self, message: dict[str, Any]) -> str:
        for payload in message.get("side", ()):  # posted before this report: they go first
            self._on_side(payload)
        # No metrics: the last report's checkpoint (one its verdict asked for, or a multi-rank group's files).
        if message["metrics"] is None:
            if message["checkpoint"] is not None:
                checkpoint = self._track_checkpoint(message["checkpoint"], self.history[-1])
                if self._awaiting_checkpoint is not None:
                    self._call_back(self._awaiting_checkpoint, checkpoint)
            return CONTINUE  # rank 0 goes by the verdict it had
        self.flush_callbacks()  # a report whose checkpoint never came (its group failed meanwhile)
        metrics = dict(message["metrics"])
        metrics.setdefault("training_iteration", len(self.history) + 1)
        self.history.append(metrics)
        checkpoint = None
        if message["checkpoint"] is not None:
            checkpoint = self._track_checkpoint(message["checkpoint"], metrics)
        if message.get("checkpoint_follows"):
            self._awaiting_checkpoint = metrics
        else:
            self._call_back(metrics, checkpoint)
        callback = self.trainer.on_report
        answer = callback(dict(metrics)) if callback is not None else None
        verdict = answer if isinstance(answer, Verdict) else Verdict(stop=bool(answer))
        stop = verdict.stop or stop_met(self.trainer.run_config.stop, self.trainer.name, metrics)
        stop = stop or self.callback_raised is not None
        if verdict.checkpoint and message["checkpoint"] is None:
            return CHECKPOINT_THEN_STOP if stop else CHECKPOINT_THEN_CONTINUE
        return STOP if stop else CONTINUE

    def _call_back(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        """The trainer's ``UserCallback.after_report`` hooks, once per report; what one raises stops the group
        (kept in ``callback_raised``) and the later hooks of that report are not called."""
        self._awaiting_checkpoint = None
        for callback in self.trainer.callbacks:
            if self.callback_raised is not None:
                return
            try:
                callback.after_report(self.trainer.run_context, [dict(metrics)], checkpoint)
            except BaseException as raised:  # noqa: BLE001 - StopTraining included: fit() raises it after the group
                self.callback_raised = raised

    def flush_callbacks(self) -> None:
        """Call back a report still waiting for its checkpoint, without one."""
        if self._awaiting_checkpoint is not None:
            self._call_back(self._awaiting_checkpoint, None)

    def _track_checkpoint(self, path: str, metrics: dict[str, Any]) -> Checkpoint:
        cfg = self.trainer.run_config.checkpoint_config
        ckpt = Checkpoint(path, storage_options=self.trainer.run_config.storage_options)
        index = (self.committed[-1].index + 1) if self.committed else 0
        self.committed.append(StoredCheckpoint(index=index, checkpoint=ckpt, metrics=metrics))
        kept, doomed = select_kept(
            self.committed,
            num_to_keep=cfg.num_to_keep,
            score_attribute=cfg.checkpoint_score_attribute,
            score_order=cfg.checkpoint_score_order,
        )
        for stored in doomed:
            self.trainer.storage.delete(stored)
        self.committed = kept
        return ckpt

    def _teardown(self, futures: list[Future], addresses: list[str]) -> list[dict[str, Any]]:
        """End every rank of the group, within a bounded time; returns the ranks' outcomes.

        When a rank fails, its peers are usually blocked in a collective with it, and neither gloo nor NCCL
        lets another thread or the failed rank release them: gloo's connections close only when the process
        exits, and a process that held a broken communicator is not safe to reuse. So after a short grace
        (``teardown_timeout_s``: time for ranks whose peer process died to notice and exit), the Dask workers
        of the failed group are killed (their nannies start fresh processes), as Ray kills a failed group's
        actors. A rank whose worker already died is not waited for: its task is pinned to that worker. A rank
        that does not end at all (hung) holds its worker's thread for good, so even a 1-rank group's worker is
        restarted then.
        """
        if self.error is None and all(f.done() for f in futures):
            gone: set[str] = set()  # every rank returned: nothing to wait for or to kill
        else:
            gone = set(self.client.run_on_scheduler(gang.missing_workers, addresses))
        live = [(f, a) for f, a in zip(futures, addresses, strict=True) if a not in gone]
        running = [f for f, _ in live if not f.done()]
        if running and self.error is not None:
            # Polling, not distributed.wait(): that can trip over futures whose done-callbacks already awaited
            # them on the client's loop ("Event bound to a different event loop").
            deadline = time.monotonic() + self.trainer.torch_config.teardown_timeout_s
            while time.monotonic() < deadline and not all(f.done() for f in running):
                time.sleep(0.02)
        outcomes = [self._outcome(f) for f in futures if f.done()]
        self.startup_s = self._startup_s(outcomes)
        rank0 = next((o for o in outcomes if o.get("rank") == 0 and "started_at" in o), None)
        if rank0 is not None:
            self.train_time_s = rank0["ended_at"] - rank0["started_at"]
            self.rank0_window = (rank0["worker"], rank0["started_at"], rank0["ended_at"])
        # A multi-rank group's processes are all unsafe to reuse; a rank that did not end (hung) holds its
        # worker's thread for good, even alone: both kinds of worker are restarted.
        stuck = [a for f, a in live if not f.done()]
        doomed = [a for _, a in live] if len(futures) > 1 else stuck
        if (
            self.error is not None
            and stuck
            and len(futures) > 1
            and not isinstance(self.error, RankHangError)
        ):
            # Where the ranks that did not end are, read before their workers die: the cause of a collective
            # that timed out is the peer that never joined it.
            self.stuck_stacks = self._stacks(futures, addresses, [addresses.index(a) for a in stuck])
        if self.error is not None and doomed:
            log.warning("group %s failed: restarting its Dask workers %s", self.group_id, doomed)
            # Kill the processes and let their nannies start fresh ones in the background; waiting here only
            # until the scheduler has dropped them, so no other group is placed on a dying worker.
            self.client.run(gang.kill_worker_process, workers=doomed, wait=False)
            self.restarts.started(_WORKER_RESTART_GRACE_S)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if set(self.client.run_on_scheduler(gang.missing_workers, doomed)) == set(doomed):
                    break
                time.sleep(0.05)
        for future in futures:
            # A rank that did not end is cancelled; a finished one's key is only released. Cancelling a finished
            # key is two INFO lines in the scheduler's log per group, which it keeps (distributed.admin.log-length).
            if future.done():
                future.release()
            else:
                future.cancel()
        return outcomes
