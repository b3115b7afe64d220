"""The sweep report's cost as trials grow: ``write_sweep_report`` for 50 and for 200 synthetic trials.

    .venv/bin/python benchmarks/bench_report.py [--sizes 50,200] [--repeats 3] [--browser]

Prints the best wall seconds per size (after one warm-up render, which pays Optuna's and scikit-learn's imports
for the importances) and the ratio of each size to the smallest: about linear in trials is the expectation (one
row and one curve per trial) up to 400 finished trials, less beyond (the fANOVA importances, most of the time,
fit a forest over at most 400 of them: tasks/reporting/importance.py's MAX_TRIALS). Taken side by side in one
run, since the machine's speed swings between hours.

``--browser`` also opens each size's page in headless Chromium (tests/support/browser.py) and prints how long the page
took from navigation to its plots drawn (the script's ``data-rendered-ms``), and the wall time from asking
Chromium to navigate until the DOM read back showed it (polled every 0.5 s). Above ``MAX_DRAWN_TRIALS`` trials
the plots draw a sample and a band (report_data.drawn_trials); the table lists every trial.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import time

import numpy as np

from sweepflow.tasks.reporting.sweep_report import write_sweep_report
from sweepflow.tasks.sweep.results import SweepResult, TrialResult, TrialStatus

SPACE = {
    "l1": {"type": "pow2", "low": 4, "high": 16},
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "batch_size": {"type": "choice", "values": [32, 64]},
}
STATUSES = (TrialStatus.COMPLETED, TrialStatus.STOPPED, TrialStatus.FAILED)


def sweep(n: int) -> SweepResult:
    """``n`` trials as an ASHA sweep leaves them: a third each completed, stopped early and failed."""
    rng = np.random.default_rng(0)
    trials = []
    for i in range(n):
        lr = float(10 ** rng.uniform(-4, -1))
        status = STATUSES[i % 3]
        epochs = 4 if status is TrialStatus.COMPLETED else 1
        history = [
            {"training_iteration": e, "epoch": e, "val_loss": 2.0 / e + abs(math.log10(lr) + 2)}
            for e in range(1, epochs + 1)
        ]
        config = {"l1": int(rng.choice([4, 8, 16])), "lr": lr, "batch_size": 32}
        trials.append(
            TrialResult.from_history(
                history, metric="val_loss", mode="min", trial_id=f"t{i:03d}", index=i, name=f"train_{i:03d}",
                config=config, status=status, run_id=f"{i:03d}" + "ab" * 14, started_at=1e9 + 10 * i,
                ended_at=1e9 + 10 * i + 7 * epochs + 1,
            )
        )  # fmt: skip
    return SweepResult(trials=tuple(trials), metric="val_loss", mode="min")


def open_in_browser(path: str, profile: str) -> tuple[float, int | None]:
    """(wall seconds from navigation until the DOM read back showed the drawn plots, the page's own
    milliseconds from navigation to the end of its script)."""
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from browser import page_showing

    start = time.monotonic()
    dom = page_showing(f"file://{path}", profile, "data-rendered-ms=", timeout_s=120)
    wall = time.monotonic() - start
    found = re.search(r'data-rendered-ms="(\d+)"', dom)
    return wall, int(found.group(1)) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200", help="trial counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="renders per size; the best is kept")
    parser.add_argument("--browser", action="store_true", help="also time each page in headless Chromium")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as out:
        write_sweep_report(sweep(sizes[0]), out_dir=f"{out}/warm", search_space=SPACE, title="warm-up")
        best = {}
        for n in sizes:
            result = sweep(n)
            times = []
            for r in range(args.repeats):
                start = time.perf_counter()
                write_sweep_report(result, out_dir=f"{out}/{n}-{r}", search_space=SPACE, title=f"{n} trials")
                times.append(time.perf_counter() - start)
            best[n] = min(times)
            if args.browser:
                page = f"{out}/{n}-0/sweep_report.html"
                wall, drawn_ms = open_in_browser(page, f"{out}/profile-{n}")
                size_mb = os.path.getsize(page) / 1e6
                drawn = f"{drawn_ms / 1000:.2f} s" if drawn_ms is not None else "not drawn within 120 s"
                print(
                    f"{n:5d} trials in Chromium: plots drawn {drawn} after navigation ({wall:.1f} s wall "
                    f"until seen); page {size_mb:.1f} MB"
                )
    base = sizes[0]
    for n in sizes:
        print(
            f"{n:5d} trials: {best[n]:6.2f} s  ({best[n] / best[base]:.2f}x {base} trials; {n / base:.0f}x the rows)"
        )


if __name__ == "__main__":
    main()
