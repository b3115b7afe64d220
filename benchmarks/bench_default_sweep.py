"""The "seed-sweep" workload (run by hand; prints numbers and ratios, asserts nothing).

    .venv/bin/python benchmarks/bench_default_sweep.py [--state-dir DIR] [--repeats N] [--num-samples N]

digits, the Ray Tune CIFAR tutorial's Net(l1, l2), 8 trials sampled from that tutorial's space, at most 4 epochs, ASHA (grace 1,
reduction factor 2), 1 rank per trial, 2 trials at a time. Reports:
1. whole-run wall time of `sweepflow run` (command -> registered model), with the fixed start-up itemized;
   the first run also starts the reusable local services, the next N reuse them;
2. for each of those N runs: sweep-phase time vs the same trials (same configs, same number of epochs each
   trial actually ran, i.e. the same stopping decisions) run in plain PyTorch processes at the same
   concurrency (2 processes, 1 thread each), once as the loop's bare training and validation, once also saving
   the per-epoch checkpoint the built-in loop saves (the work ASHA and best-checkpoint selection need);
3. per-trial overhead, two ways: on the critical path, how long a worker sat idle between one trial's
   training function returning and the next one's starting (Prefect task + MLflow child run + group start/stop
   that was not hidden behind other trials' training); and the bookkeeping work itself (each trial's wall
   time minus its wait for a slot and its training), most of which now overlaps the running trials.
4. CPU seconds each local service (and the flow processes, and the Dask workers) used per run: with
   --num-samples 24 against the default 8, the difference per extra trial is each one's per-trial cost.
The machine's speed drifts between runs (shared host), so every ratio is computed within one repetition.
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

SETS = [
    "sweep.max_concurrent_trials=2",
    "training.epochs=4",
    "scheduler.max_t=4",
    "scheduler.grace_period=1",
    "scheduler.reduction_factor=2",
    "resources.ranks_per_trial=1",
]


def plain_trial(args: tuple[dict, int, str, bool]) -> float:
    """The built-in training loop's work for one trial, in a plain process without ddp_runtime; with
    ``checkpoint``, also the per-epoch checkpoint it writes (model + optimizer state, to a local directory)."""
    import tempfile

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from sweepflow.tasks.datasets import load_meta, load_split
    from sweepflow.tasks.training.loop import make_model, make_optimizer

    torch.set_num_threads(1)
    config, epochs, data_path, checkpoint = args
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
        if checkpoint:
            with tempfile.TemporaryDirectory() as directory:
                torch.save(model.state_dict(), os.path.join(directory, "model.pt"))
                torch.save(opt.state_dict(), os.path.join(directory, "optimizer.pt"))
    return time.perf_counter() - start


def run_cli(state_dir: str, summary_path: str, num_samples: int) -> tuple[float, str]:
    cmd = [os.path.join(os.path.dirname(sys.executable), "sweepflow"), "run", "--summary-json", summary_path]
    for item in SETS + [f"sweep.num_samples={num_samples}", f"state_dir={state_dir}"]:
        cmd += ["--set", item]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"sweepflow run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def slot_gaps_ms(trials: list[dict]) -> list[float]:
    """Per worker, the idle time between one trial's training function returning and the next one's start."""
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for t in trials:
        if t.get("rank0_worker") and t.get("started_at") is not None:
            by_worker.setdefault(t["rank0_worker"], []).append((t["started_at"], t["ended_at"]))
    gaps = []
    for spans in by_worker.values():
        spans.sort()
        gaps += [(nxt[0] - prev[1]) * 1000 for prev, nxt in zip(spans, spans[1:], strict=False)]
    return gaps


def service_cpu_seconds(state_dir: str) -> dict[str, float]:
    """CPU seconds used so far by each local service's processes (children included, reaped ones too: the
    launcher's forked flow processes). The Dask service is split into its scheduler and its workers."""
    import psutil

    from sweepflow.infra.services import supervisor as services

    def total(process: psutil.Process, *, reaped: bool) -> float:
        t = process.cpu_times()
        return t.user + t.system + ((t.children_user + t.children_system) if reaped else 0.0)

    out: dict[str, float] = {}
    for name in ("prefect", "mlflow", "dask", "launcher"):
        record = services.read_record(state_dir, name)
        if record is None:
            continue
        root = psutil.Process(int(record["pid"]))
        children = root.children(recursive=True)
        if name == "dask":
            out["dask scheduler"] = total(root, reaped=False)
            out["dask workers"] = sum(total(c, reaped=False) for c in children)
        else:
            label = "flow processes" if name == "launcher" else f"{name} server"
            out[label] = total(root, reaped=True) + sum(total(c, reaped=False) for c in children)
    return out


def plain_seconds(pool: ProcessPoolExecutor, summary: dict, checkpoint: bool) -> float:
    """The sweep's trials, in its start order (trial number), each for the epochs it ran there."""
    data_path = summary["data_path"]
    trials = sorted(summary["trials"], key=lambda t: t["trial_id"])
    work = [(t["params"], t["epochs"], data_path, checkpoint) for t in trials]
    start = time.perf_counter()
    list(pool.map(plain_trial, work))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--repeats", type=int, default=3, help="runs that reuse the services (default 3)")
    parser.add_argument(
        "--num-samples",
        type=int,
        default=8,
        help="trials per run (default 8, the workload; more shows the per-trial CPU cost of each service)",
    )
    args = parser.parse_args()
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="sweepflow-seed-sweep-")
    from sweepflow.infra.services.local import stop_server

    summary_path = os.path.join(state_dir, "summary.json")
    with ProcessPoolExecutor(max_workers=2) as pool:
        rows, gaps, work, phases, cpu = [], [], [], [], []
        try:
            wall, out = run_cli(state_dir, summary_path, args.num_samples)
            with open(summary_path) as f:
                data_path = json.load(f)["data_path"]
            # Warm both plain processes (imports, data), as the sweep's Dask workers are warm.
            warm = ({"l1": 4, "l2": 4, "lr": 0.01, "batch_size": 64}, 0, data_path, False)
            list(pool.map(plain_trial, [warm] * 2))
            print(
                f"1. first run (starts the local Prefect, MLflow and Dask services and the launcher): {wall:.1f} s"
            )
            for i in range(args.repeats):
                before = service_cpu_seconds(state_dir)
                wall, out = run_cli(state_dir, summary_path, args.num_samples)
                after = service_cpu_seconds(state_dir)
                cpu.append({k: after[k] - before.get(k, 0.0) for k in after})
                timings = next(line for line in out.splitlines() if line.startswith("Timings:"))
                print(
                    f"1. run {i + 1} reusing them: {wall:.1f} s from the command to the registered model  [{timings}]"
                )
                with open(summary_path) as f:
                    summary = json.load(f)
                bare = plain_seconds(pool, summary, checkpoint=False)
                saved = plain_seconds(pool, summary, checkpoint=True)
                rows.append(
                    (summary["sweep_seconds"], bare, saved, [t["epochs"] for t in summary["leaderboard"]])
                )
                gaps += slot_gaps_ms(summary["trials"])
                work += [t["bookkeeping_s"] * 1000 for t in summary["trials"]]
                phases += [t["phases_s"] for t in summary["trials"]]
        finally:
            stop_server(state_dir)

    print("2. sweep phase vs the same trials in plain PyTorch, 2 processes (target <= 1.15):")
    for sweep, bare, saved, epochs in rows:
        print(
            f"   sweep {sweep:.2f} s | plain with per-epoch checkpoints {saved:.2f} s: ratio {sweep / saved:.3f} "
            f"| plain without {bare:.2f} s: ratio {sweep / bare:.3f} | epochs per trial (ASHA) {epochs}"
        )
    ratios = [sweep / saved for sweep, _, saved, _ in rows]
    print(f"   median ratio (with checkpoints) {statistics.median(ratios):.3f}")
    print(
        f"3. per-trial overhead on the critical path (worker idle between trials): median "
        f"{statistics.median(gaps):.0f} ms, max {max(gaps):.0f} ms over {len(gaps)} hand-overs (target < 50 ms)"
    )
    names = phases[0].keys()
    print(
        f"   bookkeeping work per trial, mostly overlapped with other trials' training: median "
        f"{statistics.median(work):.0f} ms ("
        + ", ".join(f"{k} {statistics.median(p[k] for p in phases) * 1000:.0f}" for k in names)
        + ")"
    )
    print("4. CPU seconds per run (whole run: sweep, evaluation, registration), median over the runs:")
    for name in cpu[0]:
        print(f"   {name:16s} {statistics.median(c[name] for c in cpu):6.2f}")


if __name__ == "__main__":
    main()
