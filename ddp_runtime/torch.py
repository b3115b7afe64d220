"""``TorchTrainer``: run a PyTorch training function as a DDP group on a Dask cluster (Ray: ``ray.train.torch``).

The driver (``fit``) gang-reserves one Dask worker per rank, submits one pinned task per rank, relays rank 0's
reports to ``on_report`` while the group runs, keeps checkpoints by ``CheckpointConfig``, tears the whole group
down when any rank fails or its worker dies, and restarts it from the latest checkpoint up to
``FailureConfig.max_failures`` times.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import re
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from distributed import Client, Future, Queue, Variable, default_client
from distributed.comm import get_address_host

from ddp_runtime import _compat
from ddp_runtime import _gang as gang
from ddp_runtime._worker import (
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
from ddp_runtime.checkpoint import Checkpoint, RunStorage, StoredCheckpoint, select_kept
from ddp_runtime.cluster import local_cluster
from ddp_runtime.config import RunConfig, ScalingConfig, TorchConfig
from ddp_runtime.result import RankError, RankHangError, Result, TrainingFailedError
from ddp_runtime.session import get_context

if TYPE_CHECKING:
    # The driver side (TorchTrainer) never touches torch: it is imported by the in-worker helpers below and by
    # the ranks, so the process that drives a sweep does not pay its import (~5 s) or its memory.
    import torch
    from torch.utils.data import DataLoader

log = logging.getLogger(__name__)

ReportCallback = Callable[[dict[str, Any]], bool | None]

_POLL_S = 0.1  # how long the driver blocks on the report queue before checking the ranks' futures
_LIVENESS_EVERY_S = 0.5  # how often the driver checks that the group's workers are still alive
_WORKER_RESTART_GRACE_S = (
    120.0  # how long killed workers may take to come back before "too few workers" is final
)
_RESERVE_WAIT_S = 2.0  # longest single wait for workers inside the scheduler before asking again
_STACKS_TIMEOUT_S = 10.0  # how long the driver waits for a stuck group's stacks (a worker may not answer)
_restarting_until: dict[str, float] = {}  # scheduler address -> until when its workers may be restarting


def default_storage_path() -> str:
    return os.path.join(os.path.expanduser("~"), "sweepflow_results")


class TorchTrainer:
    """Run ``train_loop_per_worker`` on ``scaling_config.num_workers`` ranks (Ray: ``TorchTrainer``).

    ``on_report(metrics) -> bool`` is called on the driver for every rank-0 report while the group runs;
    returning True stops the group at that report (the ranks see ``report`` raise and exit) and frees its
    workers. ``client`` defaults to the current Dask client; with none, ``fit`` starts a local cluster.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        torch_config: TorchConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        client: Client | None = None,
        on_report: ReportCallback | None = None,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise TypeError(
                f"train_loop_per_worker must be a function, got {type(train_loop_per_worker).__name__}"
            )
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.torch_config = torch_config or TorchConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.client = client
        self.on_report = on_report
        self.name = (
            self.run_config.name or f"TorchTrainer_{datetime.now():%Y-%m-%d_%H-%M-%S}_{uuid.uuid4().hex[:6]}"
        )
        self.storage = RunStorage(
            self.run_config.storage_path or default_storage_path(), self.name, self.run_config.storage_options
        )

    # ----------------------------------------------------------------------------------------------- driver

    def fit(self) -> Result:
        with self._client() as client:
            return self._fit(client)

    @contextlib.contextmanager
    def _client(self) -> Iterator[Client]:
        if self.client is not None:
            yield self.client
            return
        try:
            yield default_client()
            return
        except ValueError:
            pass  # no client in this process: start a local cluster sized for this group
        resources = {k: float(v) for k, v in self.scaling_config.worker_resources.items()}
        with local_cluster(n_workers=self.scaling_config.num_workers, resources=resources) as client:
            yield client

    def _fit(self, client: Client) -> Result:
        history: list[dict[str, Any]] = []
        errors: list[BaseException] = []
        committed = self.storage.list_committed()
        resume = self.resume_from_checkpoint
        stopped = False
        max_failures = self.run_config.failure_config.max_failures
        attempt = 0
        self._train_time_s = 0.0
        self._held_s = 0.0
        self._rank0_window: tuple[str, float, float] | None = None
        while True:
            outcome = _GroupRun(self, client, attempt, resume, committed, history).run()
            self._train_time_s += outcome.train_time_s
            self._held_s += outcome.held_s
            self._rank0_window = outcome.rank0_window or self._rank0_window
            committed = outcome.committed
            if outcome.error is None:
                stopped = outcome.stopped
                break
            errors.append(outcome.error)
            log.warning("group %s attempt %d failed: %s", self.name, attempt, outcome.error)
            if max_failures != -1 and len(errors) > max_failures:
                raise TrainingFailedError(
                    self._result(history, committed, errors, stopped=False, error=outcome.error)
                )
            attempt += 1
            resume = committed[-1].checkpoint if committed else resume
        return self._result(history, committed, errors, stopped=stopped, error=None)

    def _result(
        self,
        history: list[dict[str, Any]],
        committed: list[StoredCheckpoint],
        errors: list[BaseException],
        *,
        stopped: bool,
        error: BaseException | None,
    ) -> Result:
        cfg = self.run_config.checkpoint_config
        best = list(committed)
        if cfg.checkpoint_score_attribute is not None:
            sign = -1.0 if cfg.checkpoint_score_order == "max" else 1.0
            best.sort(key=lambda s: sign * float(s.metrics.get(cfg.checkpoint_score_attribute, float("nan"))))
        return Result(
            metrics=history[-1] if history else None,
            metrics_history=history,
            checkpoint=committed[-1].checkpoint if committed else None,
            best_checkpoints=[(s.checkpoint, s.metrics) for s in best],
            path=self.storage.uri,
            error=error,
            stopped_early=stopped,
            num_failures=len(errors),
            attempts_errors=errors,
            train_time_s=self._train_time_s,
            held_s=self._held_s,
            rank0_worker=self._rank0_window[0] if self._rank0_window else None,
            started_at=self._rank0_window[1] if self._rank0_window else None,
            ended_at=self._rank0_window[2] if self._rank0_window else None,
        )


_END = "__sweepflow_end__"
_WAKE: dict[str, Any] = {}


def _pump(reports: Queue, inbox: queue.Queue[dict[str, Any]]) -> None:
    while True:
        message = reports.get()
        if message == _END:
            return
        inbox.put(message)


def _peek(inbox: queue.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
    return _compat.queued_items(inbox)


class _GroupRun:
    """One attempt of a group: reserve, launch, relay reports, watch, tear down, release."""

    def __init__(
        self,
        trainer: TorchTrainer,
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
        self.group_id = f"{trainer.name}-{uuid.uuid4().hex[:8]}"
        self.channel = f"sweepflow-{self.group_id}-a{attempt}"
        self.error: BaseException | None = None
        self.stopped = False
        self.train_time_s = 0.0
        self.held_s = 0.0  # from the reservation to its release
        self.rank0_window: tuple[str, float, float] | None = None  # worker, entered, left the function
        # Stacks of the ranks still running when a failed group was torn down (by rank), taken before their
        # workers were killed; "why" when they could not be taken.
        self.stuck_stacks: dict[int, list[tuple[str, int, str, str, str]]] = {}

    def run(self) -> _GroupRun:
        # The report channel first: opening it costs scheduler round trips, better spent before workers free
        # up than between their release and the ranks' start.
        reports = Queue(reports_queue_name(self.channel), client=self.client)
        verdicts = Queue(verdicts_queue_name(self.channel), client=self.client)
        try:
            addresses = self._reserve()
            reserved_at = time.perf_counter()
            try:
                self._launch_and_watch(addresses, reports, verdicts)
            finally:
                # Usually a no-op: the reservation ended on the scheduler when the last rank task finished.
                # It matters when a rank's worker died or the launch itself failed.
                self.client.run_on_scheduler(gang.release, self.group_id)
                self.held_s = time.perf_counter() - reserved_at
                if len(addresses) > 1:  # only multi-rank groups rendezvous
                    with contextlib.suppress(KeyError):  # not set when rank 0 never got that far
                        Variable(rendezvous_variable_name(self.channel), client=self.client).delete()
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
                if time.monotonic() > _restarting_until.get(_compat.scheduler_address(self.client), 0):
                    raise gang.InsufficientResourcesError(payload)
                time.sleep(0.25)

    def _specs(self, addresses: list[str]) -> list[RankSpec]:
        trainer = self.trainer
        scaling, tc, rc = trainer.scaling_config, trainer.torch_config, trainer.run_config
        hosts = [get_address_host(a) for a in addresses]
        node_order = list(dict.fromkeys(hosts))
        next_index = (self.committed[-1].index + 1) if self.committed else 0
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
                    cpus=scaling.worker_resources.get("CPU"),
                    timeout_s=tc.timeout_s,
                    rendezvous_timeout_s=tc.rendezvous_timeout_s,
                    storage_path=rc.storage_path or default_storage_path(),
                    run_name=trainer.name,
                    storage_options=rc.storage_options,
                    resume_from=self.resume,
                    next_checkpoint_index=next_index,
                )
            )
        return specs

    def _launch_and_watch(self, addresses: list[str], reports: Queue, verdicts: Queue) -> None:
        client = self.client
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
            if self.stuck_stacks and _COLLECTIVE_FRAME.search(self.error.traceback_text):
                self.error = self._blame_stuck_rank(self.error, addresses) or self.error

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
        inbox: queue.Queue[dict[str, Any]] = queue.Queue()
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

    def _watch_loop(
        self, futures: list[Future], addresses: list[str], inbox: queue.Queue[dict[str, Any]], verdicts: Queue
    ) -> None:
        next_liveness = time.monotonic() + _LIVENESS_EVERY_S
        hang_timeout_s = self.trainer.torch_config.hang_timeout_s
        # When the group last made progress: rank 0 entering the training function, then each report. Set-up
        # before that (rendezvous, process group) is bounded by TorchConfig's rendezvous and collective timeouts.
        last_progress: float | None = None
        while True:
            try:
                message = inbox.get(timeout=_POLL_S)
            except queue.Empty:
                message = None
            if message == STARTED:
                last_progress = time.monotonic()
                continue
            if message is not None and message is not _WAKE:
                verdicts.put(self._on_report(message))
                last_progress = time.monotonic()
                continue  # drain reports before looking at futures: a finished rank 0 may have queued some
            outcomes = [self._outcome(f) for f in futures if f.done()]
            if any(o["status"] == "error" for o in outcomes):
                self.error = self._root_cause(outcomes)  # refined after teardown, once every rank has ended
                return
            if len(outcomes) == len(futures) and all(m is _WAKE for m in _peek(inbox)):
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
        hung, waiting = _split_hung(stacks, len(futures))
        timeout_s = self.trainer.torch_config.hang_timeout_s
        others = []
        if waiting:
            verb = "waits" if len(waiting) == 1 else "wait"
            others.append(f"{_ranks(waiting)} {verb} for it in a collective or report()")
        if finished:
            others.append(f"{_ranks(finished)} already returned")
        return _hung_ranks_error(
            hung,
            stacks,
            addresses,
            problem=f"no report for {silent_s:.0f} s",
            others=others,
            cause=f"TorchConfig.hang_timeout_s={timeout_s:g}",
            or_else="raise TorchConfig.hang_timeout_s if an epoch (set-up included) legitimately takes longer",
        )

    def _blame_stuck_rank(self, root: RankError, addresses: list[str]) -> RankHangError | None:
        """``root`` failed in a collective; if ranks still running at teardown were outside any collective,
        they are the cause: name them (None when every stuck rank was itself waiting for a peer)."""
        hung, waiting = _split_hung(self.stuck_stacks, len(addresses))
        hung = [rank for rank in hung if isinstance(self.stuck_stacks.get(rank), list)]
        if not hung or len(addresses) == 1:
            return None
        first_line = str(root).split("\n", 1)[0]
        others = [f"rank {root.rank} failed waiting for it in a collective ({first_line})"]
        if waiting:
            others.append(
                f"{_ranks(waiting)} {'was' if len(waiting) == 1 else 'were'} still waiting for it too"
            )
        return _hung_ranks_error(
            hung,
            self.stuck_stacks,
            addresses,
            problem="its peers' collective timed out",
            others=others,
            cause=f"TorchConfig.timeout_s={self.trainer.torch_config.timeout_s:g}",
            or_else="raise TorchConfig.timeout_s if a rank legitimately works that long between two collectives",
        )

    def _on_report(self, message: dict[str, Any]) -> str:
        metrics = dict(message["metrics"])
        metrics.setdefault("training_iteration", len(self.history) + 1)
        self.history.append(metrics)
        if message["checkpoint"] is not None:
            self._track_checkpoint(message["checkpoint"], metrics)
        callback = self.trainer.on_report
        return STOP if callback is not None and callback(dict(metrics)) else CONTINUE

    def _track_checkpoint(self, path: str, metrics: dict[str, Any]) -> None:
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
            _restarting_until[_compat.scheduler_address(self.client)] = (
                time.monotonic() + _WORKER_RESTART_GRACE_S
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if set(self.client.run_on_scheduler(gang.missing_workers, doomed)) == set(doomed):
                    break
                time.sleep(0.05)
        for future in futures:
            future.cancel()
        return outcomes


# ------------------------------------------------------------------------------------------- in-worker helpers


def get_device() -> torch.device:
    """The rank's device: its worker's GPU with use_gpu, else the CPU."""
    return get_context().get_device()


def prepare_model(
    model: torch.nn.Module,
    *,
    move_to_device: bool = True,
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move the model to the rank's device and wrap it in DistributedDataParallel when world size > 1."""
    from torch.nn.parallel import DistributedDataParallel

    ctx = get_context()
    device = ctx.get_device()
    if move_to_device:
        model = model.to(device)
    if ctx.get_world_size() > 1:
        kwargs = dict(parallel_strategy_kwargs or {})
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        model = DistributedDataParallel(model, **kwargs)
    return model


def _move(batch: Any, device: torch.device) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(_move(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _move(v, device) for k, v in batch.items()}
    return batch


class _DeviceDataLoader:
    """Iterates the wrapped loader and moves each batch to the rank's device; everything else (``sampler``,
    ``dataset``, ``batch_size``, ``len``) is the wrapped loader's."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self._loader = loader
        self._device = device

    def __iter__(self) -> Iterator[Any]:
        if self._device.type == "cpu":
            yield from self._loader
            return
        for batch in self._loader:
            yield _move(batch, self._device)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def prepare_data_loader(
    data_loader: DataLoader, *, add_dist_sampler: bool = True, move_to_device: bool = True
) -> DataLoader:
    """Shard the loader across ranks with a DistributedSampler (unless it has one) and move batches to the
    rank's device. Shuffling is kept: a shuffling loader gets a shuffling sampler (call ``set_epoch``).

    DataLoader worker processes: Dask workers default to the ``spawn`` start method, which would re-import
    torch in every DataLoader worker at every epoch; on Linux the loader is given ``fork`` (PyTorch's usual
    default there) unless it names a ``multiprocessing_context`` itself.
    """
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

    ctx = get_context()
    if data_loader.num_workers > 0 and multiprocessing.current_process().daemon:
        raise RuntimeError(
            f"DataLoader(num_workers={data_loader.num_workers}) cannot start worker processes inside a daemonic "
            "Dask worker. Start the Dask workers with DASK_DISTRIBUTED__WORKER__DAEMON=False (ddp_runtime's local "
            "clusters do), or use num_workers=0."
        )
    world_size = ctx.get_world_size()
    sampler = data_loader.sampler
    if add_dist_sampler and world_size > 1 and not isinstance(sampler, DistributedSampler):
        if data_loader.batch_size is None:
            raise ValueError(
                "prepare_data_loader cannot shard a DataLoader built with a custom batch_sampler; give it a "
                "DistributedSampler yourself or pass add_dist_sampler=False"
            )
        if not isinstance(sampler, RandomSampler | SequentialSampler):
            raise ValueError(
                f"prepare_data_loader cannot shard a DataLoader with a custom sampler ({type(sampler).__name__}); "
                "use a DistributedSampler yourself or pass add_dist_sampler=False"
            )
        sampler = DistributedSampler(
            data_loader.dataset,
            num_replicas=world_size,
            rank=ctx.get_world_rank(),
            shuffle=isinstance(sampler, RandomSampler),
        )
    mp_context = data_loader.multiprocessing_context
    if (
        data_loader.num_workers > 0
        and mp_context is None
        and sys.platform == "linux"
        and multiprocessing.get_start_method() != "fork"
    ):
        mp_context = "fork"
    loader = data_loader
    if sampler is not data_loader.sampler or mp_context is not data_loader.multiprocessing_context:
        loader = DataLoader(
            data_loader.dataset,
            batch_size=data_loader.batch_size,
            sampler=sampler,
            num_workers=data_loader.num_workers,
            collate_fn=data_loader.collate_fn,
            pin_memory=data_loader.pin_memory,
            drop_last=data_loader.drop_last,
            timeout=data_loader.timeout,
            worker_init_fn=data_loader.worker_init_fn,
            multiprocessing_context=mp_context,
            generator=data_loader.generator,
            prefetch_factor=data_loader.prefetch_factor if data_loader.num_workers > 0 else None,
            persistent_workers=data_loader.persistent_workers,
        )
    if move_to_device:
        return _DeviceDataLoader(loader, ctx.get_device())  # type: ignore[return-value]
    return loader


# ------------------------------------------------------------------------------------------------- hung ranks

# In a rank's traceback: it failed inside a collective.
_COLLECTIVE_FRAME = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def _split_hung(stacks: dict[int, Any], world_size: int) -> tuple[list[int], list[int]]:
    """(hung, waiting) among the ranks with a stack entry: a rank with a frame where ranks wait for their
    peers (a collective, DDP, report) is waiting; the others hung. Every rank waiting (mismatched
    collectives), or a 1-rank group: all of them are named."""
    waiting = [
        rank
        for rank, stack in sorted(stacks.items())
        if world_size > 1 and isinstance(stack, list) and any(frame[4] == "waiting" for frame in stack)
    ]
    hung = [rank for rank in sorted(stacks) if rank not in waiting]
    return (hung, waiting) if hung else (waiting, [])


def _where(stack: Any) -> str:
    """Where a rank is: its innermost frame in the user's code (and the innermost frame, when that is deeper)."""
    if not isinstance(stack, list) or not stack:
        return f"at an unknown line: {stack or 'no Python frame'}"
    user = [frame for frame in stack if frame[4] == "user"]
    frame = user[-1] if user else stack[-1]
    text = f"at {os.path.basename(frame[0])}:{frame[1]} in {frame[2]} ({frame[3]})"
    inner = stack[-1]
    if inner is not frame:
        text += f", inside {os.path.basename(inner[0])}:{inner[1]} in {inner[2]} ({inner[3]})"
    return text


def _format_stack(rank: int, stack: Any) -> str:
    if not isinstance(stack, list):
        return f"rank {rank}: no stack ({stack})"
    lines = [f"rank {rank}'s stack (most recent call last):"]
    for filename, lineno, name, source, _zone in stack:
        lines.append(f'  File "{filename}", line {lineno}, in {name}')
        if source:
            lines.append(f"    {source}")
    return "\n".join(lines)


def _hung_ranks_error(
    hung: list[int],
    stacks: dict[int, Any],
    addresses: list[str],
    *,
    problem: str,
    others: list[str],
    cause: str,
    or_else: str,
) -> RankHangError:
    if len(hung) == 1:
        rank = hung[0]
        head = (
            f"rank {rank} (Dask worker {addresses[rank]}) hung: {problem}; it is {_where(stacks.get(rank))}"
        )
    else:
        places = "; ".join(f"rank {r} (Dask worker {addresses[r]}) is {_where(stacks.get(r))}" for r in hung)
        head = f"{_ranks(hung)} hung: {problem}; {places}"
    if others:
        head += " while " + " and ".join(others)
    summary = (
        f"{head}; the group was torn down and its Dask workers restarted ({cause}). Find why that line blocks "
        f"(every rank must make the same collectives and report() calls, in the same order), or {or_else}"
    )
    traceback_text = "\n".join(_format_stack(rank, stacks.get(rank)) for rank in hung)
    return RankHangError(hung[0], addresses[hung[0]], summary, traceback_text)
