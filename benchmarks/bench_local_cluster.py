"""Local clusters' workers: forked from the fork server vs spawned (run by hand; prints numbers and ratios,
asserts nothing).

    .venv/bin/python benchmarks/bench_local_cluster.py [--repeats N] [--clusters K] [--workers W]

Each repetition (default 3) runs, in a new process per start method (``local_cluster(start_method=...)``, the
two alternated), what a process that starts local clusters does: K clusters (default 3) of W workers (default 2)
one after the other, each running one task on each worker and, in the last cluster, replacing one SIGKILLed
worker (its nanny starts a new one, as after a failed group). Printed per start method (medians over the
repetitions): each cluster's start (entering ``local_cluster`` until the client is ready), the killed worker's
replacement (until the cluster has W workers again), the process's wall time and the CPU time of the process
and everything it started (a cgroup v1 ``cpuacct`` group per run: needs root); then the ratios spawn /
forkserver. The machine's speed drifts (shared host), so each ratio is taken within one repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: cgroup v1's CPU accounting (this machine's); run as root.
CGROUP_ROOT = "/sys/fs/cgroup/cpuacct"

_CHILD = r"""
import json, os, signal, sys, time
from ddp_runtime.cluster import local_cluster

def main():
    method, clusters, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    starts, replace_s = [], None
    begun = time.perf_counter()
    for index in range(clusters):
        t0 = time.perf_counter()
        with local_cluster(n_workers=workers, start_method=method) as client:
            starts.append(time.perf_counter() - t0)
            client.run(lambda: os.getpid())  # every worker answers
            if index == clusters - 1:
                victim = next(iter(client.run(os.getpid).values()))
                t1 = time.perf_counter()
                os.kill(victim, signal.SIGKILL)
                while True:  # until W workers answer again, none of them the killed one
                    pids = set(client.run(os.getpid, on_error="ignore").values())
                    if len(pids) == workers and victim not in pids:
                        break
                    time.sleep(0.05)
                replace_s = time.perf_counter() - t1
    print(json.dumps({"starts": starts, "replace_s": replace_s, "wall_s": time.perf_counter() - begun}))

if __name__ == "__main__":
    main()
"""


def _run(method: str, clusters: int, workers: int) -> dict:
    """One process's clusters, in a cgroup of its own: the fork server outlives its parent's wait (it is
    reparented and ends by itself), so only the cgroup sees the CPU of every process the run started."""
    group = os.path.join(CGROUP_ROOT, f"bench-local-cluster-{os.getpid()}-{method}")
    os.makedirs(group)
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1" "$2" "$3" "$4"',
                sys.executable,
                _CHILD,
                method,
                str(clusters),
                str(workers),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{method}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        deadline = time.monotonic() + 60
        while open(os.path.join(group, "cgroup.procs")).read().strip() and time.monotonic() < deadline:
            time.sleep(0.1)  # the fork server ends once it sees its parent gone
        with open(os.path.join(group, "cpuacct.usage")) as f:
            cpu = int(f.read()) / 1e9
    finally:
        os.rmdir(group)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    seen["cpu_s"] = cpu
    seen["process_wall_s"] = wall
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows: dict[str, list[dict]] = {"spawn": [], "forkserver": []}
    ratios: list[float] = []
    for repeat in range(args.repeats):
        order = ("spawn", "forkserver") if repeat % 2 == 0 else ("forkserver", "spawn")
        for method in order:
            rows[method].append(_run(method, args.clusters, args.workers))
            r = rows[method][-1]
            starts = ", ".join(f"{s:.2f}" for s in r["starts"])
            print(
                f"repeat {repeat + 1} {method:>10}: cluster starts {starts} s; worker replaced in "
                f"{r['replace_s']:.2f} s; process {r['process_wall_s']:.1f} s, {r['cpu_s']:.1f} CPU-s",
                flush=True,
            )
        ratios.append(rows["spawn"][-1]["cpu_s"] / rows["forkserver"][-1]["cpu_s"])
    med = statistics.median
    for method, runs in rows.items():
        print(
            f"median {method:>10}: first cluster {med(r['starts'][0] for r in runs):.2f} s, later clusters "
            f"{med(s for r in runs for s in r['starts'][1:]):.2f} s, replacement {med(r['replace_s'] for r in runs):.2f} s, "
            f"process {med(r['process_wall_s'] for r in runs):.1f} s, {med(r['cpu_s'] for r in runs):.1f} CPU-s"
        )
    print("CPU-s spawn / forkserver per repetition: " + ", ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
