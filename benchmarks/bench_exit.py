"""Exit times: Python's default interpreter exit vs ``ddp_runtime._exit.fast_exit()`` (run by hand; prints numbers
and ratios, asserts nothing).

    .venv/bin/python benchmarks/bench_exit.py [--repeats N]

Each repetition (default 3) measures, side by side, both ways; the medians over the repetitions are printed:
1. a process's exit: from its script's last statement (it writes ``time.time()`` to a file) to the parent's
   ``wait()`` returning, for
   (a) a process that imports torch, runs one ``torch.export.export`` of a small ``nn.Sequential`` with a dynamic
       batch (``torch.export.Dim.AUTO``; this imports torch._dynamo and sympy) and imports mlflow.pytorch: what a
       worker holds after a registration;
   (b) a process that imports ``sweepflow.flows.pipeline``, ``sweepflow.tasks.reporting.sweep_report`` and
       ``optuna.importance``: what the ``sweepflow`` command's flow process holds;
   each with the default exit and with ``fast_exit()`` called at the start (both import ``ddp_runtime._exit``,
   so they hold the same modules); prints both and the ratio default / fast.
2. a ``local_cluster(n_workers=2, preload=[WORKER_PRELOAD])``'s close (the time to leave its ``with`` block),
   after one worker ran a task doing (a)'s work: with the workers' fast exit (their preload calls ``fast_exit()``)
   and without it (``client.run`` of ``atexit.unregister(gc.freeze)`` on every worker just before the close);
   prints both, the ratio, and how many workers the nannies SIGKILLed ("Worker process still alive after ...
   seconds, killing", counted on the ``distributed.nanny`` logger of this process, where LocalCluster's nannies
   run).
The machine's speed drifts (shared host), so each ratio is taken within one repetition.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))

#: The child's script: ``{fast}`` is "fast_exit()" or "pass", ``{work}`` its imports and work, ``{path}`` where
#: its last statement writes the time.
CHILD = """\
from ddp_runtime._exit import fast_exit
{fast}
import sys
import time
sys.path.insert(0, {bench_dir!r})
{work}
open({path!r}, "w").write(repr(time.time()))
"""
WORKLOADS = {
    "(a) torch.export + mlflow.pytorch": "from bench_exit import pt2_registration_work\npt2_registration_work()",
    "(b) pipeline + sweep_report + optuna.importance": (
        "import optuna.importance\nimport sweepflow.flows.pipeline\nimport sweepflow.tasks.reporting.sweep_report"
    ),
}


def pt2_registration_work() -> int:
    """What a registration leaves in a process: torch._dynamo and sympy (a first pt2 export, dynamic batch) and
    mlflow.pytorch. Returns the number of modules then loaded."""
    import mlflow.pytorch  # noqa: F401
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    torch.export.export(model, (torch.zeros(4, 8),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    return len(sys.modules)


def process_exit(work: str, fast: bool) -> tuple[float, float]:
    """(exit seconds, the child's whole wall seconds) of one child process running ``work``."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "last-statement")
        code = CHILD.format(fast="fast_exit()" if fast else "pass", bench_dir=BENCH_DIR, work=work, path=path)
        start = time.time()
        process = subprocess.Popen([sys.executable, "-c", code])
        process.wait()
        exited = time.time()
        if process.returncode != 0:
            raise RuntimeError(f"child exited with {process.returncode}")
        with open(path) as f:
            last = float(f.read())
    return exited - last, exited - start


class KillCounter(logging.Handler):
    """Counts the nannies' "Worker process still alive after ... seconds, killing" warnings."""

    def __init__(self) -> None:
        super().__init__()
        self.kills = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "still alive" in record.getMessage():
            self.kills += 1


def default_exit() -> bool:
    """On a worker (``client.run``): take back the preload's ``fast_exit()`` (``atexit.unregister`` removes every
    registration of ``gc.freeze``); returns whether the preload had registered it."""
    from ddp_runtime import _exit

    atexit.unregister(gc.freeze)
    return _exit._registered


def cluster_close(fast: bool, counter: KillCounter) -> tuple[float, int, int, int]:
    """(close seconds, nanny kills, modules on the worker after the task, workers whose preload's fast exit was
    taken back) for one cluster."""
    from ddp_runtime.cluster import local_cluster
    from sweepflow.tasks import WORKER_PRELOAD

    counter.kills = 0
    removed = 0
    with local_cluster(n_workers=2, preload=[WORKER_PRELOAD]) as client:
        client.wait_for_workers(2)
        worker = sorted(client.scheduler_info()["workers"])[0]
        modules = client.submit(pt2_registration_work, workers=[worker], pure=False).result()
        if not fast:
            removed = sum(client.run(default_exit).values())
        start = time.perf_counter()
    return time.perf_counter() - start, counter.kills, modules, removed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3, help="repetitions, medians printed (default 3)")
    args = parser.parse_args()
    counter = KillCounter()
    logging.getLogger("distributed.nanny").addHandler(counter)

    exits: dict[str, dict[bool, list[float]]] = {name: {True: [], False: []} for name in WORKLOADS}
    closes: dict[bool, list[float]] = {True: [], False: []}
    kills: dict[bool, list[int]] = {True: [], False: []}
    for i in range(args.repeats):
        for name, work in WORKLOADS.items():
            for fast in (False, True):
                seconds, wall = process_exit(work, fast)
                exits[name][fast].append(seconds)
                print(
                    f"run {i + 1}: 1. {name}, {'fast_exit()' if fast else 'default exit'}: exit {seconds:.2f} s "
                    f"(whole process {wall:.1f} s)",
                    flush=True,
                )
        for fast in (False, True):
            seconds, killed, modules, removed = cluster_close(fast, counter)
            closes[fast].append(seconds)
            kills[fast].append(killed)
            how = "workers' fast exit" if fast else f"without it (taken back on {removed} workers)"
            print(
                f"run {i + 1}: 2. LocalCluster close, {how}: {seconds:.2f} s, {killed} workers killed by their "
                f"nanny (the task's worker held {modules} modules)",
                flush=True,
            )

    print(f"medians over {args.repeats} runs:")
    for name in WORKLOADS:
        default = statistics.median(exits[name][False])
        fast = statistics.median(exits[name][True])
        ratios = [d / f for d, f in zip(exits[name][False], exits[name][True], strict=True)]
        print(
            f"1. {name}: exit {default:.2f} s default, {fast:.2f} s with fast_exit(): "
            f"ratio {default / fast:.1f} (per run {', '.join(f'{r:.1f}' for r in ratios)})"
        )
    default = statistics.median(closes[False])
    fast = statistics.median(closes[True])
    ratios = [d / f for d, f in zip(closes[False], closes[True], strict=True)]
    print(
        f"2. LocalCluster(2 workers) close after a pt2 export on one worker: {default:.2f} s without the "
        f"workers' fast exit, {fast:.2f} s with it: ratio {default / fast:.1f} "
        f"(per run {', '.join(f'{r:.1f}' for r in ratios)}); nanny kills per close: without "
        f"{kills[False]}, with {kills[True]}"
    )


if __name__ == "__main__":
    main()
