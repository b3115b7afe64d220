"""Chaos soak: a sweep on the stack (PostgreSQL) while a seeded driver breaks things; nothing may be lost or doubled.
Run by hand as root (it makes a network namespace); prints PASS/FAIL lines and a summary, exits 1 on a FAIL.

    .venv/bin/python benchmarks/bench_chaos.py [--num-samples 500] [--faults 12] [--seed 0] [--epochs 2]

What it stands up (all on this machine, stopped and removed at the end):
* a throwaway PostgreSQL (tests/support/postgres_server.py) holding the Prefect server's and MLflow's databases;
* ``sweepflow stack up --workers 2`` bound to the root end of a private bridge (``--host`` that address,
  ``--insecure``: the network is this run's own), so that
* a third Dask worker runs on another host: a network namespace (tests/support/netns_hosts.py), its Dask worker started
  as the stack's are;
* ``prefect deploy --all`` from this checkout, and one ``prefect deployment run training-pipeline/default``
  of N trials (1 rank each, FIFO, ``training.max_failures=3``), run by the stack's Prefect worker.

Once the sweep's first trial is recorded, the chaos driver injects ``--faults`` faults at seeded random times,
kinds cycling through a seeded order of:
* ``dask-worker``: SIGKILL one Dask worker process (its nanny starts another);
* ``prefect-worker``: SIGKILL the Prefect worker, then ``sweepflow stack up`` (what an operator runs);
* ``mlflow`` / ``prefect-server``: SIGKILL every process of the server (a crash), then ``sweepflow stack up``;
* ``postgres``: ``pg_ctl restart -m fast`` (its sessions are cut);
* ``link``: the other host's link down for 20 s, then up.

The flow run ends COMPLETED, or is finished by one ``sweepflow run --resume <parent run>``. Then, asserted:
every trial is recorded exactly once (one MLflow child run per trial id, terminal, one value per metric step;
one COMPLETED trial task run per trial over the flow runs; committed checkpoints with distinct indexes, none
left half-written); no trial failed; no process or namespace is left. The summary prints the faults injected
(when, how long the service was away), the trials that ran again, and the time lost against an undisturbed
sweep's trial rate.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import BENCH_DIR, bench_env, mlflow_children, sweepflow_exe, task_runs  # noqa: E402

ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, os.path.join(ROOT, "tests"))

KINDS = ("dask-worker", "prefect-worker", "mlflow", "prefect-server", "postgres", "link")
LINK_DOWN_S = 20.0
MIN_GAP_S = 30.0  # between two faults: a server's restart (5-20 s) is over before the next fault
DEPLOYMENT = "training-pipeline/default"
REMOTE = "remote"
SEARCH_SPACE = {
    "l1": {"type": "pow2", "low": 4, "high": 16},
    "l2": {"type": "pow2", "low": 4, "high": 16},
    "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1},
    "batch_size": {"type": "choice", "values": [64, 128]},
}
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


# ------------------------------------------------------------------------------------------- the plan (pure)


@dataclasses.dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the sweep's first trial was recorded
    kind: str
    target: int  # which of several (e.g. Dask workers): an index taken modulo their number


def plan_faults(
    seed: int, faults: int, window_s: float, *, kinds: Sequence[str] = KINDS, gap_s: float = MIN_GAP_S
) -> list[Fault]:
    """``faults`` faults at seeded random times in ``[0.05, 0.95] * window_s``, at least ``gap_s`` apart (the
    window grows when it is too short for that), kinds in seeded rounds: each round is every kind once."""
    rng = random.Random(seed)
    window = max(window_s, (faults + 1) * gap_s)
    order: list[str] = []
    while len(order) < faults:
        round_ = list(kinds)
        rng.shuffle(round_)
        order += round_
    times = sorted(rng.uniform(0.05, 0.95) * window for _ in range(faults))
    spaced: list[float] = []
    for t in times:
        spaced.append(max(t, spaced[-1] + gap_s) if spaced else t)
    return [Fault(round(t, 1), kind, rng.randrange(1000)) for t, kind in zip(spaced, order, strict=False)]


def config(num_samples: int, epochs: int) -> dict[str, Any]:
    """The deployment run's ``config`` parameter (and, as --set items, the resume's command line)."""
    return {
        "sweep": {"num_samples": num_samples, "search_space": SEARCH_SPACE, "max_concurrent_trials": 3},
        "training": {"epochs": epochs, "max_failures": 3},
        "scheduler": {"type": "fifo"},
        "resources": {"ranks_per_trial": 1},
    }


def as_sets(cfg: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in cfg.items():
        if isinstance(value, dict) and key != "search_space":
            out += as_sets(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={json.dumps(value) if isinstance(value, dict) else value}")
    return out


# ---------------------------------------------------------------------------------------------- the world


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, ok: bool, what: str, detail: str = "") -> bool:
        print(
            f"{'PASS' if ok else 'FAIL'} {what}" + (f"  [{detail}]" if detail and not ok else ""), flush=True
        )
        self.failed += not ok
        return ok


@dataclasses.dataclass
class World:
    """What the faults act on."""

    stack_dir: str
    env: dict[str, str]  # the environment of `sweepflow stack up` (with the database URL)
    stack_env: dict[str, str]  # the clients' (stack.env)
    up_args: list[str]
    pg: Any
    net: Any
    remote_worker: subprocess.Popen | None = None
    restarted: list[str] = dataclasses.field(default_factory=list)  # services `stack up` started again
    up_notes: list[str] = dataclasses.field(default_factory=list)  # why, as `stack up` said it

    def pids(self) -> dict[str, int]:
        from sweepflow.infra.services import supervisor

        records = {n: supervisor.read_record(self.stack_dir, n) for n in supervisor.recorded(self.stack_dir)}
        return {n: int(r["pid"]) for n, r in records.items() if r}

    def stack_up(self) -> float:
        """``sweepflow stack up``, as an operator runs it after a crash; records the services it restarted."""
        before = self.pids()
        t0 = time.monotonic()
        up = subprocess.run(
            [sweepflow_exe(), "stack", "up", "--state-dir", self.stack_dir, *self.up_args],
            capture_output=True, text=True, env=self.env, timeout=900,
        )  # fmt: skip
        if up.returncode != 0:
            raise RuntimeError(
                f"sweepflow stack up exited {up.returncode}:\n{up.stdout[-2000:]}\n{up.stderr[-2000:]}"
            )
        after = self.pids()
        self.restarted += [name for name, pid in before.items() if after.get(name) != pid]
        self.up_notes += [line for line in up.stderr.splitlines() if line.startswith("restarting ")]
        return time.monotonic() - t0

    def record(self, name: str) -> dict[str, Any]:
        from sweepflow.infra.services import supervisor

        record = supervisor.read_record(self.stack_dir, name)
        if record is None:
            raise RuntimeError(f"no record of the stack's {name}")
        return record

    def worker_processes(self) -> list[int]:
        """The Dask worker processes (each its nanny's child): the stack's and the other host's."""
        import psutil

        nannies = [int(self.record(n)["pid"]) for n in ("dask-worker-0", "dask-worker-1")]
        if self.remote_worker is not None:
            nannies.append(self.remote_worker.pid)
        out = []
        for pid in nannies:
            with contextlib.suppress(psutil.NoSuchProcess):
                out += [
                    c.pid
                    for c in psutil.Process(pid).children()
                    if any("multiprocessing" in part for part in c.cmdline())
                    and "resource_tracker" not in " ".join(c.cmdline())
                ]
        return out


def flow_run_processes(worker_pid: int) -> list:
    """The Prefect worker's flow-run processes (they carry PREFECT__FLOW_RUN_ID)."""
    import psutil

    out = []
    for child in psutil.Process(worker_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "PREFECT__FLOW_RUN_ID" in child.environ():
                out.append(child)
    return out


def inject(world: World, fault: Fault) -> str:
    """Do ``fault``; returns what was done and how long it took to heal (where the driver heals it)."""
    if fault.kind == "dask-worker":
        pids = world.worker_processes()
        if not pids:
            return "no Dask worker process found (all restarting)"
        pid = pids[fault.target % len(pids)]
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL worker process {pid} (its nanny starts another)"
    if fault.kind == "prefect-worker":
        pid = int(world.record("prefect-worker")["pid"])
        flows = flow_run_processes(pid)
        os.kill(pid, signal.SIGKILL)
        time.sleep(2.0)
        alive_before_up = [p for p in flows if p.is_running()]
        up_s = world.stack_up()
        alive = [p for p in flows if p.is_running()]
        return (
            f"SIGKILL prefect worker {pid}; its flow-run processes {[p.pid for p in flows]}: "
            f"{len(alive_before_up)} alive 2 s later, {len(alive)} after stack up ({up_s:.1f} s)"
        )
    if fault.kind in ("mlflow", "prefect-server"):
        pid = int(world.record(fault.kind)["pid"])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        t0 = time.monotonic()
        time.sleep(2.0)
        up_s = world.stack_up()
        return f"SIGKILL {fault.kind} (process group {pid}); back after {time.monotonic() - t0:.1f} s (stack up {up_s:.1f} s)"
    if fault.kind == "postgres":
        return f"pg_ctl restart -m fast: {world.pg.restart():.1f} s"
    if fault.kind == "link":
        world.net.cut_link(REMOTE)
        try:
            time.sleep(LINK_DOWN_S)
        finally:
            world.net.restore_link(REMOTE)
        return f"link of host {REMOTE} down for {LINK_DOWN_S:.0f} s"
    raise ValueError(f"unknown fault kind {fault.kind!r}")


class ChaosDriver(threading.Thread):
    """Injects the planned faults, each at its time after ``start_at``, until the plan ends or ``done`` is set."""

    def __init__(self, world: World, plan: Sequence[Fault], done: threading.Event) -> None:
        super().__init__(daemon=True, name="chaos")
        self.world, self.plan, self.done = world, list(plan), done
        self.start_at = 0.0
        self.log: list[tuple[float, Fault, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for fault in self.plan:
                if self.done.wait(max(0.0, self.start_at + fault.at_s - time.monotonic())):
                    return
                t = time.monotonic() - self.start_at
                what = inject(self.world, fault)
                self.log.append((t, fault, what))
                print(f"  chaos t={t:6.1f} s  {fault.kind:15s} {what}", flush=True)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the main thread: a fault not injected
            self.error = exc


# ------------------------------------------------------------------------------------------ the stack


def start_remote_worker(world: World, state_dir: str) -> subprocess.Popen:
    """A Dask worker on the other host, started as the stack's are (same preloads and settings)."""
    from sweepflow.infra.services.stack import Exposure, dask_worker_spec
    from sweepflow.tasks import WORKER_PRELOAD

    spec = dask_worker_spec(
        9,
        world.stack_env["DASK_SCHEDULER_ADDRESS"],
        "",
        world.stack_env,
        None,
        Exposure(host=world.net.addresses[REMOTE], insecure=True),
        worker_preload=[WORKER_PRELOAD],
    )
    argv = [a if a != "dask-worker-9" else "dask-worker-remote" for a in spec.argv]
    env = {**os.environ, **bench_env(), **spec.env}
    return world.net.spawn(REMOTE, argv, env, os.path.join(state_dir, "remote-worker.log"))


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # a server restarting: asked again
            value = condition()
            if value:
                return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def workers_registered(stack_env: dict[str, str]) -> int:
    from distributed import Client

    with Client(stack_env["DASK_SCHEDULER_ADDRESS"], timeout=30) as client:
        return len(client.scheduler_info(n_workers=-1)["workers"])


def deploy_and_run(stack_env: dict[str, str], cfg: dict[str, Any]) -> str:
    """``prefect deploy --all`` from this checkout, then one deployment run; returns its flow run id."""
    prefect = os.path.join(os.path.dirname(sys.executable), "prefect")
    env = {**stack_env, "PREFECT_HOME": os.path.join(stack_env["SWEEPFLOW_HOME"], "prefect-cli")}
    deploy = subprocess.run(
        [prefect, "--no-prompt", "deploy", "--all"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if deploy.returncode != 0:
        raise RuntimeError(f"prefect deploy failed:\n{deploy.stdout[-3000:]}\n{deploy.stderr[-3000:]}")
    run = subprocess.run(
        [prefect, "deployment", "run", DEPLOYMENT, "--params", json.dumps({"config": cfg})],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", run.stdout)
    if run.returncode != 0 or not found:
        raise RuntimeError(f"prefect deployment run failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return found.group(1)


def pipeline_flow_runs() -> list[str]:
    """Every flow run of the training pipeline on the (fresh) stack's server: the deployment's and a resume's."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["training-pipeline"])))
    return [str(r.id) for r in runs]


def flow_run_state(flow_run_id: str) -> str:
    from uuid import UUID

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(flow_run_id)).state
    return state.type.value if state else "PENDING"


def pickup_times(flow_run_id: str, parent: Any) -> str:
    """How the deployment run was picked up, from its Prefect state history: seconds from the run's creation to
    each of its first states, and to its parent MLflow run's start."""
    from uuid import UUID

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        created = client.read_flow_run(UUID(flow_run_id)).created
        states = client.read_flow_run_states(UUID(flow_run_id))
    seen: dict[str, float] = {}
    for state in sorted(states, key=lambda s: s.timestamp):
        seen.setdefault(state.name, (state.timestamp - created).total_seconds())
    parts = [f"{name} +{at:.1f} s" for name, at in seen.items() if name in ("Pending", "Running")]
    parts.append(f"parent MLflow run +{parent.info.start_time / 1000 - created.timestamp():.1f} s")
    return "picked up: " + ", ".join(parts) + " after the run was created"


def parent_run(tracking_uri: str, flow_run_id: str) -> Any | None:
    """The sweep's MLflow parent run, found by the flow run id it is tagged with."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(
        ids, filter_string=f"tags.`prefect.flow_run_id` = '{flow_run_id}'", max_results=5
    )
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents[0] if parents else None


# --------------------------------------------------------------------------------------------- checking


def verify(
    stack_env: dict[str, str], parent: Any, flow_run_ids: list[str], n: int, check: Checks
) -> dict[str, Any]:
    """The exactly-once checks; returns figures for the summary."""
    from bench_load import metric_step_problems

    from sweepflow.tasks.tracking.runs import direct_storage_uri

    tracking_uri = stack_env["MLFLOW_TRACKING_URI"]
    expected = {f"trial_{i:04d}" for i in range(n)}
    children = mlflow_children(tracking_uri, parent.info.experiment_id, parent.info.run_id)
    ids = [r.data.tags.get("sweepflow.trial_id") for r in children]
    check(len(children) == n, f"MLflow: {n} child runs under the parent run", f"{len(children)} found")
    check(
        set(ids) == expected and len(set(ids)) == len(ids),
        "MLflow: the trial ids are exactly trial_0000.., each once",
        f"missing {sorted(expected - set(ids))[:5]}, doubled {sorted({i for i in ids if ids.count(i) > 1})[:5]}",
    )
    bad = [
        f"{r.data.tags.get('sweepflow.trial_id')}:{r.info.status}"
        for r in children
        if r.info.status not in ("FINISHED", "KILLED", "FAILED") or r.info.end_time is None
    ]
    check(not bad, "MLflow: every child run ended", ", ".join(bad[:10]))
    failed = sorted(
        r.data.tags.get("sweepflow.trial_id")
        for r in children
        if r.data.tags.get("sweepflow.status") == "failed"
    )
    check(
        not failed, "no trial failed (each killed one restarted from its checkpoint)", ", ".join(failed[:10])
    )
    problems = metric_step_problems(tracking_uri, children)
    check(
        not problems,
        "MLflow: exactly one value per step of every metric of every child",
        "; ".join(problems[:10]),
    )

    # Checkpoints: each child's committed ones, read from storage (the artifact store's S3 bucket).
    from ddp_runtime.checkpoint import MARKER, RunStorage

    doubled, half_written, without = [], [], []
    for run in children:
        storage = direct_storage_uri(run.info.artifact_uri, f"{stack_env['SWEEPFLOW_STORAGE']}/mlflow")
        trial = run.data.tags.get("sweepflow.trial_id")
        rs = RunStorage(storage, "checkpoints")
        committed = rs.list_committed()
        indexes = [c.index for c in committed]
        if len(set(indexes)) != len(indexes):
            doubled.append(f"{trial}:{indexes}")
        if not committed:
            without.append(trial)
        entries = rs.fs.ls(rs.root, detail=False) if rs.fs.exists(rs.root) else []
        for entry in entries:
            if entry.rstrip("/").rsplit("/", 1)[-1].startswith("checkpoint_") and not rs.fs.exists(
                f"{entry.rstrip('/')}/{MARKER}"
            ):
                half_written.append(f"{trial}:{entry.rsplit('/', 1)[-1]}")
    check(not doubled, "checkpoints: each trial's committed indexes are distinct", ", ".join(doubled[:10]))
    check(not without, "checkpoints: every trial has a committed checkpoint", ", ".join(without[:10]))
    check(not half_written, "checkpoints: none left half-written", ", ".join(half_written[:10]))

    # Prefect: over the flow runs (the first, and the resume's), no trial has two COMPLETED task runs, and every
    # trial has one, unless the resume read its result back from MLflow (it had ended, its task had not).
    completed: dict[str, int] = {}
    seen: set[str] = set()
    interrupted = []
    for flow_run_id in flow_run_ids:
        for t in task_runs(flow_run_id):
            if not t.name.startswith("trial_"):
                continue
            trial = t.name.split("-", 1)[0]
            seen.add(trial)
            if t.state_type.value == "COMPLETED":
                completed[trial] = completed.get(trial, 0) + 1
            else:
                interrupted.append(f"{trial}:{t.state_name}")
    twice = sorted(k for k, v in completed.items() if v > 1)
    check(not twice, "Prefect: no trial has two COMPLETED task runs", ", ".join(twice[:10]))
    check(seen == expected, "Prefect: every trial has a task run", f"missing {sorted(expected - seen)[:10]}")
    read_back = sorted(expected - set(completed))
    if len(flow_run_ids) == 1:
        check(not read_back, "Prefect: every trial's task run is COMPLETED", ", ".join(read_back[:10]))

    def tagged(tag: str) -> list[str]:
        return sorted(
            f"{r.data.tags.get('sweepflow.trial_id')}x{int(float(r.data.tags[tag]))}"
            for r in children
            if float(r.data.tags.get(tag, "0") or 0)
        )

    return {
        "children": children,
        "interrupted_task_runs": interrupted,
        "restarted_trials": tagged("sweepflow.restarts"),  # group restarts (max_failures), from a checkpoint
        "resumed_trials": tagged("sweepflow.resumes"),  # picked up again by `sweepflow run --resume`
        "read_back": read_back,  # ended in the first flow run, whose task did not complete: read from MLflow
    }


def leftovers(stack_dir: str, state_dir: str, before: set[int]) -> list[str]:
    """What the soak left running: stack services still recorded, processes started meanwhile that name its
    ``state_dir`` (see ``_ours``). (Its network namespace is checked by ``Hosts.close``, which raises if one is
    left.)"""
    import psutil

    from sweepflow.infra.services import supervisor

    out = [f"stack service {name} still recorded" for name in supervisor.recorded(stack_dir)]
    out += [
        f"process {p.pid} {' '.join(p.cmdline()[:3])}"
        for p in psutil.process_iter()
        if p.pid not in before and p.pid != os.getpid() and _ours(p, state_dir)
    ]
    return out


def _ours(process: Any, state_dir: str) -> bool:
    """A process of this soak's: its command line or environment names the soak's state directory (other work
    on the machine, e.g. tests running beside it, is not this soak's to report)."""
    try:
        if process.ppid() == os.getpid():
            return False  # this process's own children, being reaped
        texts = [*process.cmdline(), *process.environ().values()]
    except Exception:  # noqa: BLE001 - a process that exited or that we may not read is not ours to report
        return False
    return any(state_dir in text for text in texts)


# ------------------------------------------------------------------------------------------------ main


@dataclasses.dataclass
class Outcome:
    failed_checks: int
    planned: list[Fault]
    injected: list[tuple[float, Fault, str]]
    resumed: bool
    sweep_s: float


def soak(
    num_samples: int,
    faults: int,
    seed: int,
    epochs: int,
    state_dir: str,
    *,
    window_s: float | None = None,
    gap_s: float = MIN_GAP_S,
    kinds: Sequence[str] = KINDS,
) -> Outcome:
    """The whole soak (see the module doc); prints as it goes. ``window_s``: the seconds the faults spread
    over from the first trial (default: 0.25 s per trial and epoch, about the undisturbed sweep's length)."""
    import psutil
    from netns_hosts import Hosts
    from postgres_server import postgres_server

    check = Checks()
    before = {p.pid for p in psutil.process_iter()}
    t_start = time.perf_counter()

    def phase(label: str) -> None:  # where the wall time goes, printed as the run goes
        print(f"  [{time.perf_counter() - t_start:6.1f} s] {label}", flush=True)

    @contextlib.contextmanager
    def reported(label: str, manager: Any) -> Iterator[Any]:  # a teardown step, timed
        with manager as value:
            yield value
        phase(label)

    cfg = config(num_samples, epochs)
    with contextlib.ExitStack() as cleanup:
        pg = cleanup.enter_context(reported("PostgreSQL stopped and removed", postgres_server()))
        net = cleanup.enter_context(reported("the other host gone", Hosts((REMOTE,))))
        stack_dir = os.path.join(state_dir, "stack")
        env = {
            **bench_env(),
            "SWEEPFLOW_STACK_DATABASE_URL": pg.url,
            "SWEEPFLOW_HOME": os.path.join(state_dir, "home"),
        }
        up_args = ["--workers", "2", "--host", net.addresses["root"], "--insecure"]
        down = [sweepflow_exe(), "stack", "down", "--state-dir", stack_dir]
        cleanup.callback(phase, "sweepflow stack down")
        cleanup.callback(lambda: subprocess.run(down, env=env, check=False, capture_output=True))

        # A resume's `sweepflow run` leaves its warm launcher under SWEEPFLOW_HOME, as on a user's machine.
        def stop_local() -> None:  # the resume's runs use the stack's SWEEPFLOW_HOME (stack.env)
            home = world.stack_env.get("SWEEPFLOW_HOME", env["SWEEPFLOW_HOME"])
            stop = [sweepflow_exe(), "server", "stop", "--state-dir", home]
            subprocess.run(stop, env=env, check=False, capture_output=True)
            phase("sweepflow server stop (the resume's local services)")

        from sweepflow.infra.services.stack import read_env

        world = World(stack_dir, env, {}, up_args, pg, net)
        phase("PostgreSQL and the other host up")
        t0 = time.monotonic()
        # The other host's worker needs only the scheduler's address: it starts as soon as `stack up` has written
        # stack.env (its servers are up), beside the stack's own workers, not after them.
        up = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="stack-up")
        cleanup.callback(up.shutdown)
        stack_started = up.submit(world.stack_up)
        wait_for(
            lambda: read_env(stack_dir) or stack_started.done(),
            600,
            "`stack up` to write stack.env",
            every=0.2,
        )
        world.stack_env = {
            **{k: v for k, v in env.items() if k != "SWEEPFLOW_STACK_DATABASE_URL"},
            **read_env(stack_dir),
        }
        if "DASK_SCHEDULER_ADDRESS" in world.stack_env:
            world.remote_worker = start_remote_worker(world, state_dir)
        stack_started.result()  # `stack up`'s error, if it failed
        phase("sweepflow stack up")
        os.environ.update(
            {k: v for k, v in world.stack_env.items() if k.startswith(("PREFECT_", "MLFLOW_", "AWS_"))}
        )
        os.environ["PREFECT_HOME"] = os.path.join(state_dir, "prefect-home")  # this process's: not ~/.prefect
        wait_for(
            lambda: workers_registered(world.stack_env) >= 3, 300, "3 Dask workers (one on the other host)"
        )
        print(
            f"stack up on PostgreSQL, 3 Dask workers (one on host {REMOTE}): {time.monotonic() - t0:.1f} s",
            flush=True,
        )

        window = window_s or num_samples * epochs * 0.25
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise SystemExit(f"unknown fault kinds {unknown}: choose from {', '.join(KINDS)}")
        plan = plan_faults(seed, faults, window, gap_s=gap_s, kinds=kinds)
        print(f"plan (seed {seed}): " + ", ".join(f"{f.kind}@{f.at_s:.0f}s" for f in plan), flush=True)
        flow_run_id = deploy_and_run(world.stack_env, cfg)
        phase("deployed, and its run created")
        print(f"deployment run {flow_run_id}: {num_samples} trials, {epochs} epochs each", flush=True)
        tracking = world.stack_env["MLFLOW_TRACKING_URI"]
        parent = wait_for(lambda: parent_run(tracking, flow_run_id), 600, "the sweep's parent run")
        phase("the flow run's parent MLflow run")
        wait_for(
            lambda: mlflow_children(tracking, parent.info.experiment_id, parent.info.run_id), 600, "a trial"
        )
        phase("its first trial's run")
        done = threading.Event()
        driver = ChaosDriver(world, plan, done)
        driver.start_at = sweep_t0 = time.monotonic()
        driver.start()
        state = wait_for(
            lambda: (s := flow_run_state(flow_run_id)) in FINAL and s,
            6 * 3600, "the flow run to end", every=3.0,
        )  # fmt: skip
        sweep_s = time.monotonic() - sweep_t0
        done.set()
        driver.join(timeout=300)
        if driver.error is not None:
            raise RuntimeError(f"a fault could not be injected: {driver.error!r}") from driver.error
        print(f"flow run {flow_run_id}: {state} after {sweep_s:.1f} s of sweep", flush=True)
        print(pickup_times(flow_run_id, parent), flush=True)
        flow_runs, resumed = [flow_run_id], False
        if state != "COMPLETED":
            resumed = True
            print(f"resuming: sweepflow run --resume {parent.info.run_id}", flush=True)
            summary = os.path.join(state_dir, "resume-summary.json")
            argv = [sweepflow_exe(), "run", "--resume", parent.info.run_id, "--summary-json", summary]
            for item in as_sets(cfg):
                argv += ["--set", item]
            cleanup.callback(stop_local)  # only a resume starts local services
            t1 = time.monotonic()
            proc = subprocess.run(argv, env=world.stack_env, capture_output=True, text=True, timeout=6 * 3600)
            check(
                proc.returncode == 0,
                "the one `sweepflow run --resume` completes the sweep",
                proc.stdout[-3000:] + proc.stderr[-2000:],
            )
            print(f"resume: exit {proc.returncode} after {time.monotonic() - t1:.1f} s", flush=True)
            flow_runs += [r for r in pipeline_flow_runs() if r != flow_run_id]
        else:
            check(True, "the deployment run completed without a resume")
        injected = driver.log
        check(
            len(injected) == len(plan),
            "every planned fault was injected while the sweep ran",
            f"{len(injected)} of {len(plan)}: the sweep ended first (a longer sweep or a shorter --window)",
        )
        phase("sweep ended")
        figures = verify(world.stack_env, parent, flow_runs, num_samples, check)
        phase("checked")
        print("\nSUMMARY")
        print(
            f"   trials {num_samples}, faults planned {len(plan)}, injected {len(injected)} "
            f"({', '.join(sorted({f.kind for _, f, _ in injected}))}); resumed with sweepflow run: {resumed}"
        )
        print(
            f"   trials retried: {len(figures['restarted_trials'])} restarted from their checkpoint after a "
            f"failure {figures['restarted_trials'][:10]}, {len(figures['resumed_trials'])} picked up by the "
            f"resume {figures['resumed_trials'][:10]}; {len(figures['read_back'])} ended before their task "
            f"did, read back by the resume {figures['read_back'][:10]}"
        )
        print(
            f"   interrupted trial task runs (not COMPLETED, in the flow runs): {len(figures['interrupted_task_runs'])} "
            f"{figures['interrupted_task_runs'][:10]}"
        )
        lost = time_lost(figures["children"], injected, sweep_t0)
        print(f"   sweep {sweep_s:.1f} s; {lost}")
        killed = {f.kind for _, f, _ in injected if f.kind in ("mlflow", "prefect-server", "prefect-worker")}
        extra = sorted(set(world.restarted) - killed)
        print(f"   services `stack up` started again: {world.restarted}; why: {world.up_notes}")
        check(not extra, "`stack up` restarted only the services the faults took down", ", ".join(extra))
    phase("torn down")
    left = leftovers(os.path.join(state_dir, "stack"), state_dir, before)
    check(not left, "no process or namespace left", "; ".join(left[:10]))
    print(f"\nwall {time.perf_counter() - t_start:.1f} s")
    print(f"{'FAIL' if check.failed else 'PASS'}: {check.failed} check(s) failed")
    return Outcome(check.failed, plan, injected, resumed, sweep_s)


def time_lost(children: list, injected: list, sweep_t0: float) -> str:
    """The sweep's time against the trial rate before the first fault (an undisturbed sweep's)."""
    ends = sorted(r.info.end_time / 1000 for r in children if r.info.end_time)
    if not injected or len(ends) < 4:
        return "time lost: not measured (no fault injected)"
    first_fault = sweep_t0 + injected[0][0]
    starts = min(r.info.start_time / 1000 for r in children)
    wall_start = time.time() - (time.monotonic() - sweep_t0)  # the sweep's start on the wall clock
    before = [e for e in ends if e - wall_start < first_fault - sweep_t0]
    if len(before) < 3:
        return "time lost: too few trials before the first fault to know the undisturbed rate"
    rate = (before[-1] - starts) / len(before)
    expected = rate * len(ends)
    actual = ends[-1] - starts
    return f"time lost: {actual - expected:.0f} s ({actual:.0f} s for {len(ends)} trials vs {expected:.0f} s at the undisturbed {rate:.2f} s/trial)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=500)
    parser.add_argument("--faults", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--window",
        type=float,
        default=None,
        help="seconds the faults spread over (default 0.25 s per trial-epoch)",
    )
    parser.add_argument("--gap", type=float, default=MIN_GAP_S, help="least seconds between two faults")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"the faults to draw from (default {','.join(KINDS)})"
    )
    parser.add_argument("--state-dir", default=None)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_chaos.py makes a network namespace: run it as root", file=sys.stderr)
        return 2
    state_dir = os.path.abspath(args.state_dir or tempfile.mkdtemp(prefix="sweepflow-chaos-"))
    outcome = soak(
        args.num_samples,
        args.faults,
        args.seed,
        args.epochs,
        state_dir,
        window_s=args.window,
        gap_s=args.gap,
        kinds=tuple(args.kinds.split(",")),
    )
    return 1 if outcome.failed_checks else 0


if __name__ == "__main__":
    sys.exit(main())
