"""Idle cost: the CPU the background local services use when no run is going (run by hand; exit 1: over target).

    .venv/bin/python benchmarks/bench_idle_services.py [--window 60] [--settle 10] [--no-job] [--threads N]
        [--idle-minutes M] [--state-dir DIR] [--keep-services]

Starts the local services the way the CLI does, under a fresh state directory (127.0.0.1, free ports): by
default with one small ``sweepflow run`` (2 one-epoch trials of a tiny model, 1 rank each, FIFO), which starts
the Prefect server, the MLflow server, the Dask cluster and the warm launcher and warms their caches (the Dask
workers' imports, the servers' database connections); with ``--no-job`` with ``sweepflow server start`` (no
launcher). Then, after ``--settle`` seconds for the run's tail (event flushes), measures each service's CPU
over ``--window`` seconds with nothing running: user + system time of every process of the service (found as
``sweepflow server stop`` finds them: its process group, session and service id, and their descendants), plus
what those processes reaped from children that ended in the window. Prints CPU-seconds per minute per process
and per service, the total against issue 24's target (at most 1 CPU-second per minute in all), and the
machine's load average before and after (the CPU time of a process moves little with the other work on the
machine, unlike wall times, but it still does: compare figures measured side by side). ``--threads N`` also
lists each process's N busiest threads (Linux thread ids and names): where the idle CPU goes inside a process.

``--idle-minutes M`` starts the services with ``SWEEPFLOW_SERVICES_IDLE_MINUTES=M`` (default: the setting's
default, an hour, longer than the window) and, after the window, waits for them to stop themselves
(``sweepflow.infra.services.idle``): prints when they did, counted from the end of the last use, and what is left of
them (nothing, so 0 CPU-seconds a minute from then on). M must leave room for the settling and the window.
The exit code is 0 when the services were within the target while up, or stopped themselves.

Stops everything it started through ``sweepflow.infra.services.local.stop_server`` (by the recorded pids), unless
``--keep-services``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psutil  # noqa: E402
from _common import bench_env, run_cli, sweepflow_exe  # noqa: E402 - this folder on sys.path first

TARGET_PER_MIN = 1.0  # issue 24: at most 1 CPU-second per minute in all, with no run going
JOB_SPACE = {
    "l1": {"type": "pow2", "low": 4, "high": 16},
    "l2": {"type": "pow2", "low": 4, "high": 16},
    "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1},
    "batch_size": {"type": "choice", "values": [64, 128]},
}
JOB_SETS = [
    "sweep.num_samples=2",
    f"sweep.search_space={json.dumps(JOB_SPACE)}",
    "sweep.max_concurrent_trials=2",
    "training.epochs=1",
    "scheduler.type=fifo",
    "resources.ranks_per_trial=1",
]


@dataclass
class ProcessCpu:
    service: str
    label: str
    cpu: float  # own user+system, and that of the children it reaped
    threads: dict[int, tuple[str, float]]  # tid -> (name, user+system)


def _thread_name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _label(service: str, process: psutil.Process, root_pid: int) -> str:
    """A short name for one process of a service, from its command line."""
    try:
        cmd = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        cmd = ""
    if service == "dask":
        if process.pid == root_pid:
            return "scheduler + nannies"
        if "resource_tracker" in cmd:
            return "resource tracker"
        return "worker" if "spawn_main" in cmd else cmd[:40]
    if process.pid == root_pid:
        return "main"
    for server in ("uvicorn", "gunicorn"):  # the Prefect server's; the MLflow server's (arbiter and worker)
        if server in cmd:
            return server
    return os.path.basename(cmd.split(" ")[0]) or "child"


def snapshot(state_dir: str) -> dict[tuple[int, float], ProcessCpu]:
    """Every live process of every recorded local service, by (pid, start time)."""
    from sweepflow.infra.services import supervisor

    out: dict[tuple[int, float], ProcessCpu] = {}
    for service in supervisor.recorded(state_dir):
        record = supervisor.read_record(state_dir, service)
        if record is None:
            continue
        root = int(record["pid"])
        for process in supervisor.processes_of(
            root, started=record.get("started"), service_id=record.get("service_id")
        ):
            try:
                with process.oneshot():
                    t = process.cpu_times()
                    key = (process.pid, process.create_time())
                    threads = {
                        th.id: (_thread_name(process.pid, th.id), th.user_time + th.system_time)
                        for th in process.threads()
                    }
                label = _label(service, process, root)
            except psutil.NoSuchProcess:
                continue
            cpu = t.user + t.system + t.children_user + t.children_system
            out[key] = ProcessCpu(service, label, cpu, threads)
    return out


def start_services(state_dir: str, env: dict[str, str], job: bool) -> str:
    if job:
        run = run_cli(state_dir, JOB_SETS, env, label="idle-warmup")
        return f"one `sweepflow run` of 2 one-epoch trials: {run.wall_s:.1f} s"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sweepflow_exe(), "server", "start", "--state-dir", state_dir],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"FAIL sweepflow server start exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return f"`sweepflow server start`: {time.perf_counter() - t0:.1f} s"


def report(before: dict, after: dict, window: float, threads: int) -> float:
    per_min = 60.0 / window
    services: dict[str, float] = {}
    print(f"\n{'service':9s} {'process':22s} {'pid':>7s} {'CPU-s/min':>10s}")
    for key in sorted(after, key=lambda k: (after[k].service, k[0])):
        now = after[key]
        was = before.get(key)
        used = now.cpu - (was.cpu if was else 0.0)
        services[now.service] = services.get(now.service, 0.0) + used
        note = "" if was else "  (started in the window)"
        print(f"{now.service:9s} {now.label:22s} {key[0]:7d} {used * per_min:10.2f}{note}")
        if threads:
            busy = sorted(
                (
                    (cpu - (was.threads.get(tid, ("", 0.0))[1] if was else 0.0), tid, name)
                    for tid, (name, cpu) in now.threads.items()
                ),
                reverse=True,
            )
            for used_t, tid, name in busy[:threads]:
                if used_t > 0:
                    print(f"{'':9s}   thread {tid:<7d} {name[:15]:15s} {used_t * per_min:8.2f}")
    gone = [k for k in before if k not in after]
    if gone:
        print(f"(processes that ended in the window, their own time not counted: {[k[0] for k in gone]})")
    print(f"\n{'service':9s} {'CPU-s/min':>10s}")
    for service, used in sorted(services.items()):
        print(f"{service:9s} {used * per_min:10.2f}")
    total = sum(services.values()) * per_min
    print(f"{'total':9s} {total:10.2f}   ({total / 60:.1%} of one core)")
    return total


def wait_for_self_stop(state_dir: str, idle_minutes: float, since: float) -> bool:
    """After the window: wait until the watchdog has stopped the services (bounded); print what it did."""
    from sweepflow.infra.services import supervisor

    deadline = (
        since + idle_minutes * 60 + 180
    )  # its checks come at most a minute apart; stopping takes a while
    while supervisor.recorded(state_dir) and time.time() < deadline:
        time.sleep(1.0)
    left = supervisor.recorded(state_dir)
    if left:
        print(f"\nFAIL the services did not stop themselves within {deadline - since:.0f} s: still {left}")
        return False
    print(
        f"\nthe services stopped themselves {time.time() - since:.0f} s after their last use ended "
        f"(SWEEPFLOW_SERVICES_IDLE_MINUTES={idle_minutes:g}); processes of them left: {len(snapshot(state_dir))}, "
        "so 0 CPU-seconds a minute from then on, until the next run starts them again"
    )
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured (default 60)")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds to wait before (default 10)")
    parser.add_argument(
        "--no-job", action="store_true", help="`sweepflow server start` instead of a small run"
    )
    parser.add_argument("--threads", type=int, default=0, help="list each process's N busiest threads")
    parser.add_argument(
        "--idle-minutes",
        type=float,
        default=None,
        help="SWEEPFLOW_SERVICES_IDLE_MINUTES, then wait for the stop",
    )
    parser.add_argument("--state-dir", default=None, help="default: a new temporary directory")
    parser.add_argument("--keep-services", action="store_true", help="leave the local services running")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows as it goes, also into a file
    state_dir = os.path.abspath(args.state_dir or tempfile.mkdtemp(prefix="sweepflow-idle-"))
    from sweepflow.infra.services.local import stop_server

    print(
        f"state dir {state_dir}; window {args.window:.0f} s after {args.settle:.0f} s of settling; "
        f"{os.cpu_count()} cores"
    )
    env = bench_env()
    if args.idle_minutes is not None:
        env["SWEEPFLOW_SERVICES_IDLE_MINUTES"] = f"{args.idle_minutes:g}"
    print(f"SWEEPFLOW_SERVICES_IDLE_MINUTES={env.get('SWEEPFLOW_SERVICES_IDLE_MINUTES', '(default)')}")
    stopped_themselves = True
    try:
        how = start_services(state_dir, env, job=not args.no_job)
        last_use = time.time()  # the command that used them has ended
        print(f"services started by {how}")
        time.sleep(args.settle)
        load0 = os.getloadavg()
        before = snapshot(state_dir)
        t0 = time.monotonic()
        time.sleep(args.window)
        after = snapshot(state_dir)
        window = time.monotonic() - t0
        load1 = os.getloadavg()
        print(
            f"load average (1, 5, 15 min) at the window's start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
            f"at its end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}"
        )
        total = report(before, after, window, args.threads)
        if args.idle_minutes:
            stopped_themselves = wait_for_self_stop(state_dir, args.idle_minutes, last_use)
    finally:
        if not args.keep_services:
            stop_server(state_dir)
            if not args.state_dir:
                shutil.rmtree(state_dir, ignore_errors=True)
    ok = total <= TARGET_PER_MIN
    print(
        f"\n{'PASS' if ok else 'FAIL'} idle services, while up: {total:.2f} CPU-seconds per minute in all "
        f"(target: at most {TARGET_PER_MIN:g})"
    )
    if args.idle_minutes:
        print(
            f"{'PASS' if stopped_themselves else 'FAIL'} idle services, after {args.idle_minutes:g} minutes unused: "
            + ("0 CPU-seconds per minute (stopped themselves)" if stopped_themselves else "still up")
        )
    return 0 if ok or (args.idle_minutes and stopped_themselves) else 1


if __name__ == "__main__":
    sys.exit(main())
