"""Overhead as trials grow: a sweep phase through ``sweepflow run`` vs the same trials in plain PyTorch processes.

    .venv/bin/python benchmarks/bench_overhead.py [--lengths 0.3,3,30] [--trials 8,8,4] [--epochs 2]
        [--nice-services N] [--repeats 1] [--calibrate] [--glibc-malloc-in-workers] [--state-dir DIR]
        [--keep-services]

For each trial length, N trials of ``sized_trial.train_fn`` (the Ray Tune CIFAR tutorial's Net(64, 64) on digits, batch 32, Adam;
``--epochs`` reports per trial, each with the built-in loop's per-epoch checkpoint; the passes over the data per
epoch set the length) run as the sweep phase of one ``sweepflow run`` (1 rank per trial, FIFO, 2 at a time on
the local 2-worker Dask cluster) and, right after, as the same trials (same configs, same order) in 2 warm
plain processes (``sized_trial.plain_trial``, 1 thread each). A length is CPU seconds of training per trial
(``SECONDS_PER_PASS_EPOCH`` per pass, measured on the development machine; ``--calibrate`` measures it on the
plain processes first): the wall time on an idle core. The plain trials' wall and CPU seconds and the training
function's wall time inside the sweep are printed beside the ratio, so the length actually run is visible.

Prints per length: sweep-phase seconds, plain seconds, the ratio sweep/plain (target <= 1.05 at 3 s), the
overhead per trial, and the CPU that explains it: each service's CPU over the sweep phase (Prefect server,
MLflow server, flow process, Dask scheduler and workers; psutil over their process trees), per trial and per
second, the same services' CPU per second when idle (measured once after the warm-up), and the CPU ratio (all
CPU of the sweep phase / the plain trials' CPU), which the other work on the machine moves less than walls.

``--nice-services N`` also runs each length's sweep with the Prefect and MLflow servers' processes (every
thread) reniced to N for that run (restored after), followed by its own plain run, and prints both ratios side
by side. The machine is shared: every ratio is taken within one pair of adjacent runs, never across runs, and
still moves with the other work on the machine.

``sized_trial`` lives in this folder, which is put on PYTHONPATH for the local services started here (a fresh
state directory, unless --state-dir names one whose services were started the same way).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402 - this folder on sys.path first
    CONTROL_PLANE,
    Sampler,
    bench_env,
    mlflow_children,
    niceness_of,
    renice,
    restore_nice,
    run_cli,
    service_pids,
)
from sized_trial import plain_trial  # noqa: E402

CONCURRENCY = 2
MODEL = {"l1": 64, "l2": 64, "batch_size": 32, "optimizer": "adam"}
SPACE = {"lr": {"type": "loguniform", "low": 1e-3, "high": 1e-2}}
NICE_SERVICES = ("prefect", "mlflow")
#: CPU seconds one pass over digits' training split takes with MODEL (plain, 1 thread) on the 2-core development
#: machine, measured at 0.13-0.19 s under its usual load; --calibrate measures it on the machine at hand.
SECONDS_PER_PASS_EPOCH = 0.15


def sweep_sets(num_samples: int, epochs: int, passes: float) -> list[str]:
    return [
        "training.train_fn=sized_trial:train_fn",
        # it writes the built-in classifier's checkpoints: the built-in model and evaluation read them
        "training.model_fn=sweepflow.tasks.training.builtin:model_fn",
        "evaluation.evaluate_fn=sweepflow.tasks.training.builtin:evaluate_fn",
        f"training.base_config={json.dumps({**MODEL, 'passes': passes})}",
        f"training.epochs={epochs}",
        f"sweep.num_samples={num_samples}",
        f"sweep.search_space={json.dumps(SPACE)}",
        f"sweep.max_concurrent_trials={CONCURRENCY}",
        "scheduler.type=fifo",
        "resources.ranks_per_trial=1",
    ]


def plain_configs(summary: dict, epochs: int, passes: float) -> list[dict]:
    """The sweep's trials as the training function saw them (base config + sampled params + seed), in start
    order. The sweep seeds trial i with seed 0 + i (``TrialTemplate.seed``)."""
    trials = sorted(summary["trials"], key=lambda t: t["index"])
    return [
        {
            **MODEL,
            "passes": passes,
            "epochs": epochs,
            "data_path": summary["data_path"],
            **t["params"],
            "seed": t["index"],
        }
        for t in trials
    ]


def run_plain(pool: ProcessPoolExecutor, configs: list[dict]) -> tuple[float, list[float], list[float]]:
    """(wall seconds for all, each trial's seconds, each trial's CPU seconds) at CONCURRENCY processes."""
    start = time.perf_counter()
    results = list(pool.map(plain_trial, configs))
    return time.perf_counter() - start, [r[0] for r in results], [r[1] for r in results]


def calibrate(pool: ProcessPoolExecutor, data_path: str, epochs: int) -> float:
    """CPU seconds per pass per epoch of a plain trial on this machine now: the slope through two points,
    each the median of 4 trials run 2 at a time."""
    points = []
    for passes in (0.5, 3.0):
        config = {**MODEL, "passes": passes, "epochs": epochs, "data_path": data_path, "lr": 3e-3}
        _, _, cpu = run_plain(pool, [config] * CONCURRENCY * 2)
        points.append((passes * epochs, statistics.median(cpu)))
    (p1, t1), (p2, t2) = points
    return max((t2 - t1) / (p2 - p1), 1e-3)


def idle_rates(state_dir: str, seconds: float) -> dict[str, float]:
    """CPU milliseconds per second each service uses with no run going on."""
    with Sampler(state_dir, interval=0.5) as sampler:
        time.sleep(seconds)
    t0, t1 = sampler.samples[0].t, sampler.samples[-1].t
    return {k: v / (t1 - t0) * 1000 for k, v in sampler.cpu_between(t0, t1).items()}


def pair(
    pool: ProcessPoolExecutor,
    state_dir: str,
    env: dict,
    sets: list[str],
    label: str,
    epochs: int,
    passes: float,
) -> dict:
    """One ``sweepflow run`` and, right after, its trials in the plain processes. CPU of the services over the
    sweep phase (first child run queued -> last ended) is sampled with psutil."""
    before = service_pids(state_dir)
    with Sampler(state_dir, interval=0.5) as sampler:
        run = run_cli(state_dir, sets, env, label=label)
    restarted = sorted(k for k, pid in before.items() if service_pids(state_dir).get(k) != pid)
    summary = run.summary
    if summary["failed_trials"]:
        raise SystemExit(f"FAIL {label}: trials failed: {summary['failed_trials']}")
    children = mlflow_children(summary["tracking_uri"], summary["experiment_id"], summary["parent_run_id"])
    t0 = min(r.info.start_time for r in children) / 1000
    t1 = max(r.info.end_time for r in children) / 1000
    n = len(summary["trials"])
    cpu = sampler.cpu_between(t0, t1)
    plain_s, plain_times, plain_cpu = run_plain(pool, plain_configs(summary, epochs, passes))
    return {
        "n": n,
        "sweep_s": summary["sweep_seconds"],
        "plain_s": plain_s,
        "ratio": summary["sweep_seconds"] / plain_s,
        "overhead_ms": (summary["sweep_seconds"] - plain_s) * CONCURRENCY / n * 1000,
        "plain_trial_s": statistics.fmean(plain_times),
        "plain_cpu_s": statistics.fmean(plain_cpu),
        "train_s": statistics.fmean(t["train_time_s"] for t in summary["trials"]),
        "cpu_ms": {k: v / n * 1000 for k, v in cpu.items()},
        "rate_ms_s": {k: v / (t1 - t0) * 1000 for k, v in cpu.items()},
        "control_ms": sum(cpu.get(k, 0.0) for k in CONTROL_PLANE) / n * 1000,
        # all the CPU the sweep phase used (control plane + workers) against the plain trials' CPU
        "cpu_ratio": sum(cpu.values()) / max(sum(plain_cpu), 1e-9),
        "restarted": restarted,
    }


def describe(p: dict) -> str:
    text = f"sweep {p['sweep_s']:.2f} s, plain {p['plain_s']:.2f} s, ratio {p['ratio']:.3f}"
    if p["restarted"]:
        text += f" [NOTE restarted at its start (a source file changed): {p['restarted']}]"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--lengths", default="0.3,3,30", help="CPU seconds of training per trial (default 0.3,3,30)"
    )
    parser.add_argument("--trials", default="8,8,4", help="trials per length (default 8,8,4)")
    parser.add_argument(
        "--epochs", type=int, default=2, help="reports (with checkpoints) per trial (default 2)"
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help=f"measure the CPU seconds per pass per epoch now instead of using {SECONDS_PER_PASS_EPOCH}",
    )
    parser.add_argument(
        "--nice-services",
        type=int,
        default=None,
        metavar="N",
        help="also run each sweep with the Prefect and MLflow servers reniced to N (e.g. 19), side by side",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each kind per length (default 1)")
    parser.add_argument(
        "--idle-seconds", type=float, default=15.0, help="how long to sample the idle services"
    )
    parser.add_argument(
        "--glibc-malloc-in-workers",
        action="store_true",
        help="start the services' Dask workers without the MALLOC_TRIM_THRESHOLD_=65536 Dask's nannies export "
        "(glibc's adaptive defaults, as in the plain processes)",
    )
    parser.add_argument("--state-dir", default=None, help="default: a new temporary directory")
    parser.add_argument("--keep-services", action="store_true", help="leave the local services running")
    args = parser.parse_args()
    lengths = [float(x) for x in args.lengths.split(",")]
    counts = [int(x) for x in args.trials.split(",")]
    if len(counts) != len(lengths):
        parser.error("--trials needs one count per --lengths entry")
    state_dir = os.path.abspath(args.state_dir or tempfile.mkdtemp(prefix="sweepflow-overhead-"))
    env = bench_env()
    if args.glibc_malloc_in_workers:  # Dask's documented way to unset one of its pre-spawn variables: None
        env["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"] = "{'MALLOC_TRIM_THRESHOLD_': None}"
    from sweepflow.infra.services.local import stop_server

    began = time.perf_counter()
    print(
        f"state dir {state_dir}; machine load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start "
        "(shared machine: numbers move with the other work on it)"
    )
    rows = []
    # spawn: the plain processes start clean (no threads or imports of this process), like the Dask workers
    with ProcessPoolExecutor(max_workers=CONCURRENCY, mp_context=get_context("spawn")) as pool:
        try:
            warm = run_cli(state_dir, sweep_sets(2, 1, 0.05), env, label="warmup")
            data_path = warm.summary["data_path"]
            print(f"warm-up run (starts the local services, warms the Dask workers): {warm.wall_s:.1f} s")
            warm_config = {**MODEL, "passes": 0.5, "epochs": 1, "data_path": data_path, "lr": 3e-3}
            run_plain(pool, [warm_config] * CONCURRENCY * 2)  # imports and data in both plain processes
            per_pass = SECONDS_PER_PASS_EPOCH
            if args.calibrate:
                per_pass = calibrate(pool, data_path, args.epochs)
                print(f"calibrated: {per_pass:.3f} CPU s per pass per epoch (plain, {CONCURRENCY} at a time)")
            idle = idle_rates(state_dir, args.idle_seconds)
            print(
                f"idle services, CPU ms per second over {args.idle_seconds:g} s: "
                + ", ".join(f"{k} {v:.0f}" for k, v in idle.items())
            )
            for length, n in zip(lengths, counts, strict=True):
                passes = round(max(length / (per_pass * args.epochs), 0.02), 3)
                sets = sweep_sets(n, args.epochs, passes)
                for rep in range(args.repeats):
                    row = {"length": length, "n": n, "passes": passes}
                    row["default"] = pair(
                        pool, state_dir, env, sets, f"{length:g}s-{rep}", args.epochs, passes
                    )
                    line = f"  {length:g} s x {n} ({passes:g} passes per epoch): {describe(row['default'])}"
                    if args.nice_services is not None:
                        previous = renice(state_dir, NICE_SERVICES, args.nice_services)
                        try:
                            shown = niceness_of(state_dir, NICE_SERVICES)
                            row["nice"] = pair(
                                pool, state_dir, env, sets, f"{length:g}s-{rep}-nice", args.epochs, passes
                            )
                            shown_after = niceness_of(state_dir, NICE_SERVICES)
                        finally:
                            restore_nice(previous)
                        line += (
                            f" | Prefect+MLflow servers at nice {args.nice_services} (their threads' nice values "
                            f"before/after: {shown}/{shown_after}): {describe(row['nice'])}"
                        )
                    print(line + f"  ({time.perf_counter() - began:.0f} s so far)", flush=True)
                    rows.append(row)
        finally:
            if not args.keep_services:
                stop_server(state_dir)
                if not args.state_dir:
                    shutil.rmtree(state_dir, ignore_errors=True)

    print(
        f"\nSweep phase vs the same trials in {CONCURRENCY} plain PyTorch processes, {CONCURRENCY} at a time "
        f"({args.epochs} epochs per trial, each with its checkpoint; load now {os.getloadavg()[0]:.1f}).\n"
        "  plain s/trial: a plain trial's wall (CPU) seconds; train s: the training function's wall seconds per\n"
        "  trial inside the sweep (on a Dask worker); overhead: (sweep - plain) x 2 slots / trials; ctl CPU:\n"
        "  control-plane CPU per trial over the sweep phase (Prefect server + MLflow server + flow process + Dask\n"
        "  scheduler); CPU ratio: all CPU of the sweep phase (control plane + workers) / the plain trials' CPU"
    )
    kinds = ["default"] + (["nice"] if args.nice_services is not None else [])
    head = (
        f"  {'length':>6s} {'trials':>6s} {'services':>8s} {'plain s/trial':>14s} {'train s':>7s} {'sweep s':>8s} "
        f"{'plain s':>8s} {'ratio':>6s} {'overhead ms':>11s} {'ctl CPU ms':>10s} {'CPU ratio':>9s}"
    )
    print(head)
    for row in rows:
        for kind in kinds:
            p = row[kind]
            tag = "default" if kind == "default" else f"nice {args.nice_services}"
            plain = f"{p['plain_trial_s']:.2f} ({p['plain_cpu_s']:.2f})"
            print(
                f"  {row['length']:>5g}s {row['n']:6d} {tag:>8s} {plain:>14s} {p['train_s']:7.2f} {p['sweep_s']:8.2f} "
                f"{p['plain_s']:8.2f} {p['ratio']:6.3f} {p['overhead_ms']:11.0f} {p['control_ms']:10.0f} "
                f"{p['cpu_ratio']:9.3f}"
            )
    print(
        "  CPU by process over the sweep phase, ms per trial [ms per second] (Dask workers: with the training):"
    )
    for row in rows:
        for kind in kinds:
            p = row[kind]
            tag = "default" if kind == "default" else f"nice {args.nice_services}"
            parts = ", ".join(f"{k} {v:.0f} [{p['rate_ms_s'][k]:.0f}]" for k, v in p["cpu_ms"].items())
            print(f"    {row['length']:>5g}s {tag:>8s}: {parts}")
    print("Median ratio sweep/plain per length:")
    for length in sorted({r["length"] for r in rows}):
        text = f"  {length:g} s:"
        for kind in kinds:
            ratios = [r[kind]["ratio"] for r in rows if r["length"] == length]
            cpu = [r[kind]["cpu_ratio"] for r in rows if r["length"] == length]
            tag = "services at default priority" if kind == "default" else f"at nice {args.nice_services}"
            text += f" {tag} {statistics.median(ratios):.3f} (CPU ratio {statistics.median(cpu):.3f});"
        if length == 3:
            text += " target <= 1.05"
        print(text)
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
