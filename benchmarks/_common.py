"""Shared parts of bench_load.py and bench_overhead.py: running ``sweepflow run``, finding the local services'
processes, and sampling their CPU time and memory while a run goes on.

The services are the ones ``sweepflow run`` starts under its state directory (``infra/services/local.py``
records each one's pid in ``<state_dir>/services/<name>.json``): the Prefect server, the MLflow server, the
Dask cluster (its first process holds the scheduler and the workers' nannies; the workers are its children),
and the warm launcher, whose forked children are the flow processes.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import psutil

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
SERVICE_NAMES = ("prefect", "mlflow", "dask", "launcher")
#: What each sample measures, in print order. "dask scheduler" is the Dask service's own process (the scheduler
#: and the nannies); "dask workers" its children (the ranks' processes: they also do the training itself);
#: "flow process" the launcher's children (one per `sweepflow run`) and those it has reaped.
#: "postgres": the PostgreSQL server of a run on the stack with a database (bench_load.py --start-postgres).
LABELS = ("prefect server", "mlflow server", "postgres", "flow process", "dask scheduler", "dask workers")
CONTROL_PLANE = ("prefect server", "mlflow server", "postgres", "flow process", "dask scheduler")
#: On the stack (``sweepflow stack up``, bench_load.py --stack) each of these is a service of its own; its Dask
#: workers (``dask-worker-<i>``) together are "dask workers". The flow processes stay the local launcher's.
STACK_LABELS = {
    "prefect-server": "prefect server",
    "mlflow": "mlflow server",
    "dask-scheduler": "dask scheduler",
}


def sweepflow_exe() -> str:
    return os.path.join(os.path.dirname(sys.executable), "sweepflow")


def bench_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ``sweepflow run``: this folder on PYTHONPATH, so the services started from it (the
    Dask workers, the launcher and its flow processes) can import a training function module kept here."""
    env = dict(os.environ if base is None else base)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([BENCH_DIR, *[p for p in paths if p != BENCH_DIR]])
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class CliRun:
    wall_s: float
    stdout: str
    summary: dict


def run_cli(state_dir: str, sets: Iterable[str], env: Mapping[str, str], *, label: str = "run") -> CliRun:
    """``sweepflow run --set ...`` against ``state_dir``'s local services; exits the benchmark if it fails."""
    summary_path = os.path.join(state_dir, f"summary-{label}.json")
    cmd = [sweepflow_exe(), "run", "--summary-json", summary_path, "--set", f"state_dir={state_dir}"]
    for item in sets:
        cmd += ["--set", item]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(env))
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"FAIL sweepflow run ({label}) exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    with open(summary_path) as f:
        return CliRun(wall, proc.stdout, json.load(f))


def read_record(state_dir: str, name: str) -> dict | None:
    try:
        with open(os.path.join(state_dir, "services", f"{name}.json")) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def service_pids(state_dir: str) -> dict[str, int]:
    return {name: int(r["pid"]) for name in SERVICE_NAMES if (r := read_record(state_dir, name))}


def service_trees(state_dir: str, names: Iterable[str]) -> list[psutil.Process]:
    """Every live process of the named services (each recorded process and its descendants)."""
    out = []
    for name in names:
        record = read_record(state_dir, name)
        if record is None:
            continue
        try:
            root = psutil.Process(int(record["pid"]))
            out += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return out


def _cpu(process: psutil.Process, *, own: bool = True, reaped: bool = True) -> float:
    t = process.cpu_times()
    return (t.user + t.system if own else 0.0) + (t.children_user + t.children_system if reaped else 0.0)


def _rss(process: psutil.Process) -> int:
    return process.memory_info().rss


def _tree_usage(root_pid: int, *, pss: bool = False) -> tuple[float, int] | None:
    """(CPU seconds, RSS bytes) of a process and its descendants (CPU: own and reaped children's). ``pss``: PSS
    instead of RSS, for processes that share much memory (PostgreSQL's backends: each one's RSS includes the
    shared buffers it touched, so the sum counts them once per backend and grows with every backend)."""
    try:
        root = psutil.Process(root_pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    cpu, rss = 0.0, 0
    for process in processes:
        try:
            with process.oneshot():
                cpu += _cpu(process)
                rss += process.memory_full_info().pss if pss else _rss(process)
        except psutil.NoSuchProcess:
            continue
    return cpu, rss


def _measure_stack(stack_dir: str, cpu: dict[str, float], rss: dict[str, int], pids: dict[str, int]) -> None:
    names = sorted(os.listdir(os.path.join(stack_dir, "services")))
    roots: dict[str, list[int]] = {}
    for name in (n.removesuffix(".json") for n in names if n.endswith(".json")):
        label = STACK_LABELS.get(name) or ("dask workers" if name.startswith("dask-worker-") else None)
        record = read_record(stack_dir, name)
        usage = _tree_usage(int(record["pid"])) if label and record else None
        if usage is None:
            continue
        cpu[label] = cpu.get(label, 0.0) + usage[0]
        rss[label] = rss.get(label, 0) + usage[1]
        roots.setdefault(label, []).append(int(record["pid"]))
    for label, label_pids in roots.items():
        # One identity per label: a restarted service (or any one worker) starts its series anew (Sampler._series).
        pids[label] = hash(tuple(sorted(label_pids)))


def measure(
    state_dir: str, *, stack_dir: str | None = None, roots: Mapping[str, int] | None = None
) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """(CPU seconds so far, RSS bytes, root pid) per label. CPU counts each process's own time and that of the
    children it has reaped (a flow process that ended, a Dask worker its nanny restarted); RSS is summed
    over the live processes (shared pages counted in each). ``stack_dir``: Prefect, MLflow and Dask are that
    stack's services (only the launcher is the state dir's); ``roots``: more labels, each a process tree
    measured by PSS (see ``_tree_usage``: a PostgreSQL server)."""
    cpu: dict[str, float] = {}
    rss: dict[str, int] = {}
    pids: dict[str, int] = {}
    if stack_dir:
        _measure_stack(stack_dir, cpu, rss, pids)
    for label, pid in (roots or {}).items():
        usage = _tree_usage(pid, pss=True)
        if usage is not None:
            cpu[label], rss[label], pids[label] = usage[0], usage[1], pid
    for name in ("launcher",) if stack_dir else SERVICE_NAMES:
        record = read_record(state_dir, name)
        if record is None:
            continue
        try:
            root = psutil.Process(int(record["pid"]))
            with root.oneshot():
                root_cpu_own, root_cpu_reaped, root_rss = (
                    _cpu(root, reaped=False),
                    _cpu(root, own=False),
                    _rss(root),
                )
            children = root.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        child_cpu, child_rss = 0.0, 0
        for child in children:
            try:
                with child.oneshot():
                    child_cpu += _cpu(child)
                    child_rss += _rss(child)
            except psutil.NoSuchProcess:
                continue
        if name == "dask":
            cpu["dask scheduler"], rss["dask scheduler"] = root_cpu_own, root_rss
            cpu["dask workers"], rss["dask workers"] = root_cpu_reaped + child_cpu, child_rss
            pids["dask scheduler"] = pids["dask workers"] = root.pid
        elif name == "launcher":  # the launcher itself idles between runs: only its children count
            cpu["flow process"], rss["flow process"] = root_cpu_reaped + child_cpu, child_rss
            pids["flow process"] = root.pid
        else:
            label = f"{name} server"
            cpu[label], rss[label] = root_cpu_own + root_cpu_reaped + child_cpu, root_rss + child_rss
            pids[label] = root.pid
    return cpu, rss, pids


@dataclass
class Sample:
    t: float  # time.time()
    cpu: dict[str, float]
    rss: dict[str, int]
    pids: dict[str, int]


@dataclass
class Sampler:
    """Samples ``measure(state_dir)`` every ``interval`` seconds in a thread, for the duration of a with-block."""

    state_dir: str
    interval: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    stack_dir: str | None = None  # see measure()
    roots: Mapping[str, int] = field(default_factory=dict)

    def __enter__(self) -> Sampler:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _take(self) -> None:
        t = time.time()
        cpu, rss, pids = measure(self.state_dir, stack_dir=self.stack_dir, roots=self.roots)
        self.samples.append(Sample(t, cpu, rss, pids))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def _series(self, label: str, attr: str) -> tuple[list[float], list[float]]:
        """(times, values) of one label, only from the samples of the process that was there at the end (a
        service restarted at the start of a run would otherwise show a jump back to zero)."""
        pid = next((s.pids.get(label) for s in reversed(self.samples) if label in s.pids), None)
        if pid is None:  # never seen (no PostgreSQL in this run)
            return [], []
        pts = [(s.t, getattr(s, attr)[label]) for s in self.samples if s.pids.get(label) == pid]
        return [p[0] for p in pts], [p[1] for p in pts]

    def value_at(self, label: str, attr: str, t: float) -> float | None:
        """The label's ``attr`` ("cpu" or "rss") at time ``t``, linearly interpolated between samples."""
        times, values = self._series(label, attr)
        if not times:
            return None
        i = bisect.bisect_left(times, t)
        if i <= 0:
            return values[0]
        if i >= len(times):
            return values[-1]
        t0, t1 = times[i - 1], times[i]
        w = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
        return values[i - 1] + w * (values[i] - values[i - 1])

    def value_before(self, label: str, attr: str, t: float) -> float | None:
        """The label's ``attr`` in the last sample taken at or before ``t`` (the first one if none was)."""
        times, values = self._series(label, attr)
        if not times:
            return None
        return values[max(bisect.bisect_right(times, t) - 1, 0)]

    def cpu_between(self, t0: float, t1: float) -> dict[str, float]:
        out = {}
        for label in LABELS:
            a, b = self.value_at(label, "cpu", t0), self.value_at(label, "cpu", t1)
            if a is not None and b is not None:
                out[label] = b - a
        return out

    def rss_series(self, label: str, t0: float, t1: float) -> list[tuple[float, float]]:
        times, values = self._series(label, "rss")
        return [(t, v) for t, v in zip(times, values, strict=True) if t0 <= t <= t1]

    def flow_seen(self) -> bool:
        return any(s.rss.get("flow process") for s in self.samples)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def renice(state_dir: str, names: Iterable[str], niceness: int) -> dict[int, int]:
    """Set every thread of every live process of the named services to ``niceness`` (on Linux a nice value
    belongs to a thread: setting a process's only changes its main thread, while a server's work also runs in
    others, e.g. aiosqlite's; threads and processes started later inherit it from their creator).
    Returns {thread id: previous niceness}."""
    previous = {}
    for process in service_trees(state_dir, names):
        try:
            tids = [t.id for t in process.threads()]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for tid in tids:
            try:
                previous[tid] = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
            except OSError:  # the thread ended meanwhile
                continue
    return previous


def restore_nice(previous: Mapping[int, int]) -> None:
    for tid, niceness in previous.items():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError:
            continue


def niceness_of(state_dir: str, names: Iterable[str]) -> list[int]:
    """The distinct nice values of the named services' threads now (to show that a renice held)."""
    values = set()
    for process in service_trees(state_dir, names):
        try:
            for thread in process.threads():
                try:
                    values.add(os.getpriority(os.PRIO_PROCESS, thread.id))
                except OSError:
                    continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sorted(values)


def mlflow_children(tracking_uri: str, experiment_id: str, parent_run_id: str) -> list:
    """Every child run of the parent run (deleted ones included: a trial recorded twice would show)."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    runs, token = [], None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
            run_view_type=ViewType.ALL,
            max_results=1000,
            page_token=token,
        )
        runs += list(page)
        token = page.token
        if not token:
            return runs


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def task_runs(flow_run_id: str) -> list:
    """Every task run of the flow run, from the Prefect server the environment names (PREFECT_API_URL)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    runs: list = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
                sort=TaskRunSort.EXPECTED_START_TIME_DESC,
                limit=200,
                offset=len(runs),
            )
            runs += page
            if len(page) < 200:
                return runs
