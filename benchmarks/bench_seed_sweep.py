"""The "seed-sweep" workload (run by hand; prints numbers and ratios, asserts nothing).

    .venv/bin/python benchmarks/bench_seed_sweep.py [--state-dir DIR]

digits, the seed's Net(l1, l2), 8 trials sampled from the seed's space, at most 4 epochs, ASHA (grace 1,
reduction factor 2), 1 rank per trial, 2 trials at a time. Reports:
1. whole-run wall time of `sweepflow run` (command -> registered model), with the fixed start-up itemized;
   run twice: the first run also starts the reusable local Prefect server, the second reuses it;
2. sweep-phase time vs the same trials (same configs, same number of epochs each trial actually ran, i.e. the
   same stopping decisions) run in plain PyTorch processes at the same concurrency (2 processes, 1 thread each);
3. per-trial bookkeeping overhead (Prefect task + MLflow child run + group start/stop).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SETS = [
    "sweep.num_samples=8",
    "sweep.max_concurrent_trials=2",
    "training.epochs=4",
    "scheduler.max_t=4",
    "scheduler.grace_period=1",
    "scheduler.reduction_factor=2",
    "resources.ranks_per_trial=1",
]


def plain_trial(args: tuple[dict, int, str]) -> float:
    """The built-in training loop's work for one trial, in a plain process without ddp_runtime."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tasks.datasets import load_meta, load_split
    from tasks.train_loop import make_model, make_optimizer

    torch.set_num_threads(1)
    config, epochs, data_path = args
    meta = load_meta(data_path)
    x, y = load_split(data_path, "train")
    xv, yv = load_split(data_path, "val")
    start = time.perf_counter()
    model = make_model({"model": "net", **config}, meta)
    opt = make_optimizer({"optimizer": "adam", **config}, model.parameters())
    loader = DataLoader(TensorDataset(x, y), batch_size=config["batch_size"], shuffle=True)
    for _ in range(epochs):
        model.train()
        for xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for xb, yb in DataLoader(TensorDataset(xv, yv), batch_size=512):
                torch.nn.functional.cross_entropy(model(xb), yb)
    return time.perf_counter() - start


def run_cli(state_dir: str, summary_path: str) -> tuple[float, str]:
    cmd = [os.path.join(os.path.dirname(sys.executable), "sweepflow"), "run", "--summary-json", summary_path]
    for item in SETS + [f"state_dir={state_dir}"]:
        cmd += ["--set", item]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"sweepflow run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", default=None)
    args = parser.parse_args()
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="sweepflow-seed-sweep-")
    from flows.local_server import stop_server

    try:
        labels = (
            "first run (starts the local Prefect, MLflow and Dask services)",
            "second run (reuses them)",
        )
        for label in labels:
            summary_path = os.path.join(state_dir, "summary.json")
            wall, out = run_cli(state_dir, summary_path)
            timings = next(line for line in out.splitlines() if line.startswith("Timings:"))
            print(f"1. {label}: {wall:.1f} s from the command to the registered model  [{timings}]")
        with open(summary_path) as f:
            summary = json.load(f)
        lines = [line for line in out.splitlines() if "sweep phase" in line or "startup" in line]
        for line in lines:
            print("   ", line.strip())
    finally:
        stop_server(state_dir)

    trials = summary["leaderboard"]
    data_path = summary["data_path"]
    work = [
        (
            {k.removeprefix("config/"): v for k, v in t.items() if k.startswith("config/")},
            t["epochs"],
            data_path,
        )
        for t in trials
    ]
    with ProcessPoolExecutor(max_workers=2) as pool:
        # Warm both processes first (imports, data load), as the sweep's Dask workers are warm.
        list(pool.map(plain_trial, [(work[0][0], 0, data_path)] * 2))
        start = time.perf_counter()
        list(pool.map(plain_trial, work))
        plain = time.perf_counter() - start
    sweep = summary["sweep_seconds"]
    print(
        f"2. sweep phase {sweep:.2f} s vs plain PyTorch, 2 processes, same trials/epochs {plain:.2f} s: "
        f"ratio {sweep / plain:.3f} (target <= 1.15)"
    )
    overheads = [t["bookkeeping_s"] * 1000 for t in summary["trials"]]
    print(
        f"3. per-trial bookkeeping: median {statistics.median(overheads):.0f} ms, "
        f"max {max(overheads):.0f} ms over {len(overheads)} trials (target < 50 ms)"
    )
    phases = {
        name: statistics.median(t["phases_s"][name] * 1000 for t in summary["trials"])
        for name in summary["trials"][0]["phases_s"]
    }
    print(
        "   median per phase (ms): "
        + ", ".join(f"{k} {v:.0f}" for k, v in phases.items())
        + f"; Prefect task run and the rest {statistics.median(overheads) - sum(phases.values()):.0f}"
    )
    print(f"   epochs run per trial (ASHA): {[t['epochs'] for t in trials]}")


if __name__ == "__main__":
    main()
