"""Load: many tiny trials through ``sweepflow run`` (run by hand; prints PASS/FAIL lines, exits 1 on a FAIL).

    .venv/bin/python benchmarks/bench_load.py [--num-samples 200] [--state-dir DIR] [--keep-services]
        [--stack | --start-postgres]

``--stack``: Prefect, MLflow and Dask are ``sweepflow stack up``'s (under ``<state dir>/stack``; S3 storage; their
databases on $SWEEPFLOW_STACK_DATABASE_URL's PostgreSQL when set), the flow processes still the local launcher's.
``--start-postgres``: the same on a throwaway PostgreSQL server this benchmark starts (tests/support/postgres_server.py:
Debian's postgresql, scripts/install-postgres.sh) and measures as the "postgres" service.

N one-epoch trials (default 200) of a tiny model (the Ray Tune CIFAR tutorial's Net with l1, l2 in 4..16, batch 64 or 128, on the
bundled digits set: ~0.1-0.3 s of training each), 1 rank per trial, FIFO (no early stopping), 2 at a time, on
fresh local services under their own state directory (started by a 2-trial warm-up run, which also warms the
Dask workers). Then:

1. correctness, asserted: the MLflow parent run has exactly N child runs (deleted ones included), one per trial
   id trial_0000..trial_{N-1}, each in a terminal state with its end time, and every metric of every child
   has exactly one value per step; the flow run has exactly one Prefect task run per trial, all Completed;
   the run's summary lists N trials, none failed;
2. wall time: the command, and its sweep phase (first child run queued -> last child run ended), and the
   throughput in the first and last quarter of the trials (does it slow down as the stores fill up?);
3. CPU seconds per trial of each service over the sweep phase, sampled with psutil over each service's
   process tree (the Prefect server, the MLflow server, the flow process, the Dask scheduler and nannies;
   the Dask workers too, whose CPU is mostly the training itself), and per half of the sweep;
4. each service's RSS at the start and the end of the sweep phase, its growth per 100 trials (least-squares
   slope over the samples) and the extrapolation to 10,000 trials, with a verdict.

The machine is shared: wall times and CPU per trial move with the other work on it.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402 - this folder on sys.path first
    BENCH_DIR,
    CONTROL_PLANE,
    LABELS,
    Sampler,
    bench_env,
    mib,
    mlflow_children,
    read_record,
    run_cli,
    service_pids,
    slope,
    sweepflow_exe,
    task_runs,
)

SEARCH_SPACE = {
    "l1": {"type": "pow2", "low": 4, "high": 16},
    "l2": {"type": "pow2", "low": 4, "high": 16},
    "lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1},
    "batch_size": {"type": "choice", "values": [64, 128]},
}
EXTRAPOLATE_TO = 10_000
TERMINAL_MLFLOW = {"FINISHED", "KILLED", "FAILED"}


def sets(num_samples: int) -> list[str]:
    return [
        f"sweep.num_samples={num_samples}",
        f"sweep.search_space={json.dumps(SEARCH_SPACE)}",
        "sweep.max_concurrent_trials=2",
        "training.epochs=1",
        "scheduler.type=fifo",
        "resources.ranks_per_trial=1",
    ]


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, ok: bool, what: str, detail: str = "") -> bool:
        print(f"{'PASS' if ok else 'FAIL'} {what}" + (f"  [{detail}]" if detail else ""))
        self.failed += not ok
        return ok


def metric_step_problems(tracking_uri: str, runs: list) -> list[str]:
    """For every child run and metric: the steps that hold more or fewer than one value. Read with the MLflow
    server's bulk history endpoint (what its UI charts from: 100 runs and one metric per request), so 200
    runs take a few dozen requests instead of one per run and metric."""
    import urllib.parse
    import urllib.request

    by_id = {r.info.run_id: r for r in runs}
    keys = sorted({k for r in runs for k in r.data.metrics})
    counts: dict[tuple[str, str], dict[int, int]] = {}
    ids = sorted(by_id)
    out = []
    for key in keys:
        for i in range(0, len(ids), 100):
            query = urllib.parse.urlencode([("metric_key", key), *[("run_id", r) for r in ids[i : i + 100]]])
            url = f"{tracking_uri.rstrip('/')}/ajax-api/2.0/mlflow/metrics/get-history-bulk?{query}"
            with urllib.request.urlopen(url, timeout=120) as response:
                metrics = json.load(response).get("metrics", [])
            if len(metrics) >= 25000:  # the endpoint's cap: the counts below would be incomplete
                out.append(f"{key}: more than 25000 values for runs {i}..{i + 99}, not all checked")
            for m in metrics:
                steps = counts.setdefault((m["run_id"], key), {})
                steps[int(m["step"])] = steps.get(int(m["step"]), 0) + 1
    for run_id, run in by_id.items():
        for key in run.data.metrics:
            steps = counts.get((run_id, key), {})
            dup = {s: c for s, c in steps.items() if c != 1}
            if dup or not steps:
                out.append(f"{run.data.tags.get('sweepflow.trial_id')} {key}: {dup or 'no values'}")
    return out


def prefect_task_runs(state_dir: str, flow_run_id: str, api_url: str | None = None) -> list:
    """Every task run of the flow run, read from the state dir's Prefect server (or the one at ``api_url``)."""
    from sweepflow.infra.services.local import server_env

    os.environ.update(server_env(state_dir))
    os.environ["PREFECT_API_URL"] = api_url or read_record(state_dir, "prefect")["address"]
    return task_runs(flow_run_id)


def verify(state_dir: str, summary: dict, n: int, check: Checks, api_url: str | None = None) -> list:
    """The correctness checks; returns the MLflow child runs. ``api_url``: the Prefect API (default: the state
    dir's server)."""
    expected = {f"trial_{i:04d}" for i in range(n)}
    trials = summary["trials"]
    check(
        len(trials) == n and {t["trial_id"] for t in trials} == expected,
        f"the run's summary lists {n} distinct trials",
        f"{len(trials)} listed",
    )
    check(not summary["failed_trials"], "no trial failed", f"failed: {summary['failed_trials'][:10]}")

    tracking_uri, parent = summary["tracking_uri"], summary["parent_run_id"]
    t0 = time.perf_counter()
    children = mlflow_children(tracking_uri, summary["experiment_id"], parent)
    ids = [r.data.tags.get("sweepflow.trial_id") for r in children]
    check(
        len(children) == n, f"MLflow: {n} child runs under the parent run {parent}", f"{len(children)} found"
    )
    check(
        set(ids) == expected and len(set(ids)) == len(ids),
        f"MLflow: trial ids are exactly trial_0000..trial_{n - 1:04d}, each once",
        f"{len(set(ids))} distinct, missing {sorted(expected - set(ids))[:5]}, "
        f"extra {sorted(set(ids) - expected)[:5]}",
    )
    indexes = sorted(int(r.data.tags.get("sweepflow.trial_index", -1)) for r in children)
    check(indexes == list(range(n)), "MLflow: trial_index tags are 0..N-1")
    bad_state = [
        f"{r.data.tags.get('sweepflow.trial_id')}:{r.info.status}/{r.info.lifecycle_stage}"
        for r in children
        if r.info.status not in TERMINAL_MLFLOW
        or r.info.end_time is None
        or r.info.lifecycle_stage != "active"
    ]
    check(
        not bad_state,
        "MLflow: every child run is terminal (FINISHED/KILLED/FAILED), ended and not deleted",
        ", ".join(bad_state[:10]),
    )
    problems = metric_step_problems(tracking_uri, children)
    keys = sorted({k for r in children for k in r.data.metrics})
    check(
        not problems,
        f"MLflow: exactly one value per step for every metric of every child ({len(keys)} metrics: {', '.join(keys)})",
        "; ".join(problems[:10]),
    )
    without_history = [
        r.data.tags.get("sweepflow.trial_id") for r in children if "val_accuracy" not in r.data.metrics
    ]
    check(
        not without_history,
        "MLflow: every child has its epoch's val_accuracy",
        ", ".join(without_history[:10]),
    )
    print(f"     (MLflow checks took {time.perf_counter() - t0:.1f} s)")

    from mlflow.tracking import MlflowClient

    flow_run_id = MlflowClient(tracking_uri).get_run(parent).data.tags.get("prefect.flow_run_id", "")
    if not check(bool(flow_run_id), "MLflow: the parent run names its Prefect flow run"):
        return children
    task_runs = prefect_task_runs(state_dir, flow_run_id, api_url)
    trial_runs = [t for t in task_runs if t.name.startswith("trial_")]
    others = sorted(t.name.rsplit("-", 1)[0] for t in task_runs if not t.name.startswith("trial_"))
    names = [t.name.split("-", 1)[0] for t in trial_runs]
    check(
        len(trial_runs) == n and set(names) == expected and len(set(names)) == n,
        f"Prefect: flow run {flow_run_id} has exactly one train-trial task run per trial ({n})",
        f"{len(trial_runs)} trial task runs, {len(set(names))} distinct; the other task runs: {others}",
    )
    keys = {t.task_key.rsplit("-", 1)[0] for t in trial_runs}
    not_done = [
        f"{t.name.split('-', 1)[0]}:{t.state_name}" for t in trial_runs if t.state_type.value != "COMPLETED"
    ]
    check(not not_done, "Prefect: every trial task run is Completed", ", ".join(not_done[:10]))
    print(
        f"     (Prefect: {len(task_runs)} task runs in the flow run: {n} of task {sorted(keys)}, and {others})"
    )
    return children


def report_resources(sampler: Sampler, children: list, summary: dict, n: int, wall: float) -> None:
    starts = sorted(r.info.start_time / 1000 for r in children)
    ends = sorted(r.info.end_time / 1000 for r in children if r.info.end_time)
    t0, t1 = starts[0], ends[-1]
    span = t1 - t0
    print(
        f"\nWall time: command {wall:.1f} s; sweep phase {summary['sweep_seconds']:.1f} s by the flow's clock, "
        f"{span:.1f} s from the first child run queued to the last one ended: {n / span:.2f} trials/s, "
        f"{span / n * 1000:.0f} ms per trial at 2 at a time"
    )
    q = max(1, n // 4)
    first = ends[q - 1] - t0
    last = ends[-1] - ends[-q - 1] if n > q else float("nan")
    print(
        f"   first {q} trials done in {first:.1f} s, last {q} in {last:.1f} s "
        f"({first / q * 1000:.0f} vs {last / q * 1000:.0f} ms per trial)"
    )
    train = [t["train_time_s"] for t in summary["trials"] if t.get("train_time_s") is not None]
    print(
        f"   training function per trial: mean {sum(train) / len(train):.2f} s "
        f"(min {min(train):.2f}, max {max(train):.2f})"
    )

    mid = ends[n // 2 - 1] if n >= 2 else t1
    whole, h1, h2 = sampler.cpu_between(t0, t1), sampler.cpu_between(t0, mid), sampler.cpu_between(mid, t1)
    n1, n2 = n // 2, n - n // 2
    print(f"\nCPU over the sweep phase ({n} trials), per trial (psutil over each service's process tree):")
    print(f"   {'service':16s} {'CPU s':>8s} {'ms/trial':>9s} {'1st half':>9s} {'2nd half':>9s}")
    for label in LABELS:
        if label not in whole:
            continue
        print(
            f"   {label:16s} {whole[label]:8.1f} {whole[label] / n * 1000:9.0f} "
            f"{h1.get(label, 0) / n1 * 1000:9.0f} {h2.get(label, 0) / n2 * 1000:9.0f}"
        )
    control = sum(whole.get(k, 0.0) for k in CONTROL_PLANE)
    print(
        f"   {'control plane':16s} {control:8.1f} {control / n * 1000:9.0f} "
        f"{sum(h1.get(k, 0) for k in CONTROL_PLANE) / n1 * 1000:9.0f} "
        f"{sum(h2.get(k, 0) for k in CONTROL_PLANE) / n2 * 1000:9.0f}   "
        "(all but the Dask workers, whose CPU is mostly the training)"
    )
    print(
        f"   at this rate {EXTRAPOLATE_TO:,} trials cost the control plane "
        f"{control / n * EXTRAPOLATE_TO / 60:.0f} CPU-minutes, and take "
        f"{span / n * EXTRAPOLATE_TO / 3600:.1f} h of sweep at 2 at a time with trials this short"
    )

    print(
        f"\nMemory (RSS summed over each service's processes) over the sweep phase; growth per 100 trials is the "
        f"least-squares slope against trials done; extrapolated to {EXTRAPOLATE_TO:,} trials:"
    )
    print(f"   {'service':16s} {'start':>9s} {'end':>9s} {'growth/100':>11s} {'at 10,000':>10s}")
    projected_total, growing = 0.0, []
    for label in LABELS:
        series = sampler.rss_series(label, t0, t1)
        if len(series) < 2:
            continue
        xs = [float(bisect.bisect_right(ends, t)) for t, _ in series]
        ys = [v for _, v in series]
        per_trial = slope(xs, ys)
        end = ys[-1]
        projected = end + max(per_trial, 0.0) * (EXTRAPOLATE_TO - n)
        projected_total += projected
        per_100 = per_trial * 100
        if per_100 > 2 * 2**20:  # more than 2 MiB per 100 trials: 200 MiB at 10,000
            growing.append(f"{label} +{mib(per_100)}/100 trials")
        print(
            f"   {label:16s} {mib(ys[0]):>9s} {mib(end):>9s} {per_100 / 2**20:+9.1f} Mi {mib(projected):>10s}"
        )
    rss_every_100(sampler, ends, n)
    import psutil

    total = psutil.virtual_memory().total
    fits = projected_total < 0.5 * total
    print(
        f"VERDICT memory at {EXTRAPOLATE_TO:,} trials: {mib(projected_total)} projected for all services together "
        f"({projected_total / total:.0%} of this machine's {mib(total)}): "
        + ("fits" if fits else "DOES NOT FIT in half the machine's memory")
        + (
            f"; grows: {', '.join(growing)}"
            if growing
            else "; no service grows more than 2 MiB per 100 trials"
        )
        + f". (Linear extrapolation from {n} trials; RSS includes allocator slack, so it is noisy at small N.)"
    )
    if "postgres" in sampler.samples[-1].rss:
        print(
            "   (postgres: PSS, not RSS: its backends' RSS would each count the shared buffers they touched)"
        )


FLAT_AFTER = 500  # trials: the plateau is judged from here on (allocators and caches warm up before)
FLAT_WITHIN = 0.05


def rss_every_100(sampler: Sampler, ends: list[float], n: int) -> None:
    """Each service's RSS when trial 100, 200, ... ended (the last sample before that moment: after the last trial
    the flow writes the sweep's report, which is not the sweep's memory), and its growth from
    trial FLAT_AFTER to the last one: flat means under FLAT_WITHIN."""
    marks = list(range(100, n + 1, 100))
    if not marks:
        return
    labels = [label for label in LABELS if sampler.rss_series(label, ends[0], ends[-1])]
    print("\nRSS (MiB) of each service when its 100th, 200th, ... trial ended:")
    print(f"   {'trials':>7s} " + " ".join(f"{label:>15s}" for label in labels))
    at = {}
    for k in marks:
        row = {label: sampler.value_before(label, "rss", ends[k - 1]) for label in labels}
        at[k] = row
        print(f"   {k:7d} " + " ".join(f"{(row[lb] or 0) / 2**20:15.0f}" for lb in labels))
    base = min((k for k in marks if k >= FLAT_AFTER), default=None)
    if base is None or base == marks[-1]:
        print(f"   (flatness after trial {FLAT_AFTER} needs more than {FLAT_AFTER + 100} trials)")
        return
    growth = {
        label: at[marks[-1]][label] / at[base][label] - 1
        for label in labels
        if at[base][label] and at[marks[-1]][label]
    }
    flat = all(g < FLAT_WITHIN for g in growth.values())
    print(
        f"VERDICT memory after trial {base} to trial {marks[-1]} "
        f"({'flat: every service under' if flat else 'NOT flat: a service grew'} {FLAT_WITHIN:.0%}): "
        + ", ".join(f"{lb} {g:+.1%}" + ("" if g < FLAT_WITHIN else " NOT FLAT") for lb, g in growth.items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=200, help="trials (default 200)")
    parser.add_argument("--state-dir", default=None, help="default: a new temporary directory")
    parser.add_argument("--keep-services", action="store_true", help="leave the local services running")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between psutil samples")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--stack",
        action="store_true",
        help="on `sweepflow stack up` (databases on $SWEEPFLOW_STACK_DATABASE_URL's PostgreSQL if set)",
    )
    where.add_argument(
        "--start-postgres", action="store_true", help="on the stack, on a throwaway PostgreSQL started here"
    )
    args = parser.parse_args()
    n = args.num_samples
    state_dir = os.path.abspath(args.state_dir or tempfile.mkdtemp(prefix="sweepflow-load-"))
    env = bench_env()
    check = Checks()
    from sweepflow.infra.services.local import stop_server

    print(
        f"state dir {state_dir}; {n} one-epoch trials, 1 rank, FIFO, 2 at a time; machine load "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start"
    )
    try:
        with contextlib.ExitStack() as cleanup:  # stops, last first: the stack, then its PostgreSQL
            stack_dir, roots = None, {}
            if args.stack or args.start_postgres:
                stack_dir = os.path.join(state_dir, "stack")
                if args.start_postgres:
                    sys.path.insert(0, os.path.join(os.path.dirname(BENCH_DIR), "tests"))
                    from postgres_server import postgres_server

                    pg = cleanup.enter_context(postgres_server())
                    env["SWEEPFLOW_STACK_DATABASE_URL"] = pg.url  # the environment, as a user gives it
                    roots["postgres"] = pg.postmaster_pid()
                env = start_stack(stack_dir, env, cleanup)
            try:
                measured_runs(args.num_samples, args.interval, state_dir, env, check, stack_dir, roots)
            finally:
                if not args.keep_services:
                    stop_server(state_dir)
    finally:
        if not args.state_dir and not args.keep_services:
            shutil.rmtree(state_dir, ignore_errors=True)
    print(f"\n{'FAIL' if check.failed else 'PASS'}: {check.failed} check(s) failed")
    return 1 if check.failed else 0


def start_stack(stack_dir: str, env: dict[str, str], cleanup: contextlib.ExitStack) -> dict[str, str]:
    """``sweepflow stack up`` (``cleanup`` stops it, --keep-services or not: it may run on a PostgreSQL that
    ``cleanup`` stops too); returns the environment of runs on it."""
    from sweepflow.infra.services.stack import read_env

    down = [sweepflow_exe(), "stack", "down", "--state-dir", stack_dir]
    cleanup.callback(lambda: subprocess.run(down, env=env, check=False))
    t0 = time.perf_counter()
    up = subprocess.run(
        [sweepflow_exe(), "stack", "up", "--state-dir", stack_dir, "--workers", "2"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if up.returncode != 0:
        raise SystemExit(
            f"FAIL sweepflow stack up exited {up.returncode}:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        )
    database = next((line for line in up.stdout.splitlines() if line.startswith("Databases:")), "SQLite")
    print(f"stack up: {time.perf_counter() - t0:.1f} s; {database}")
    # The runs need no database: its URL (with the password) stays with the stack's two servers.
    return {**{k: v for k, v in env.items() if k != "SWEEPFLOW_STACK_DATABASE_URL"}, **read_env(stack_dir)}


def measured_runs(
    n: int,
    interval: float,
    state_dir: str,
    env: dict[str, str],
    check: Checks,
    stack_dir: str | None,
    roots: dict[str, int],
) -> None:
    """The warm-up run, the measured run of ``n`` trials, its checks and its report."""
    warm = run_cli(state_dir, sets(2), env, label="warmup")
    print(f"warm-up run (starts the local services, warms the Dask workers; 2 trials): {warm.wall_s:.1f} s")
    before = service_pids(state_dir)
    with Sampler(state_dir, interval=interval, stack_dir=stack_dir, roots=roots) as sampler:
        run = run_cli(state_dir, sets(n), env, label="load")
    after = service_pids(state_dir)
    restarted = sorted(k for k in before if after.get(k) != before[k])
    # A source file changed (another engineer's edit): the service's start-up precedes the sweep phase.
    if restarted:
        print(f"NOTE restarted at the start of the measured run (a source file changed): {restarted}")
    timings = next((line for line in run.stdout.splitlines() if line.startswith("Timings:")), "")
    print(f"measured run: {run.wall_s:.1f} s  [{timings}]  load {os.getloadavg()[0]:.1f} at the end\n")
    children = verify(state_dir, run.summary, n, check, env.get("PREFECT_API_URL") if stack_dir else None)
    if children and all(r.info.end_time for r in children):
        report_resources(sampler, children, run.summary, n, run.wall_s)


if __name__ == "__main__":
    sys.exit(main())
