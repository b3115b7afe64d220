"""ddp_runtime benchmarks (run by hand; prints numbers and ratios, asserts nothing).

    .venv/bin/python benchmarks/bench_ddp_runtime.py [--epochs 20] [--repeats 5]

1. Group start latency on a warm cluster: from ``fit()`` to the first training step, 1 and 2 ranks.
2. Overhead: the same N-epoch loop (digits, a small MLP, one report per epoch) in a plain process with one
   torch thread vs through TorchTrainer with 1 rank on a single-threaded Dask worker. Ratio = trainer / plain.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import ddp_runtime as train  # noqa: E402
from ddp_runtime.cluster import local_cluster  # noqa: E402
from ddp_runtime.torch import TorchTrainer, prepare_data_loader, prepare_model  # noqa: E402


def first_step(config: dict) -> None:
    train.report({"first_step_at": time.time()})


def digits_loop(config: dict, report=None, prepare=True) -> float:
    """Train an MLP on digits for config['epochs'] epochs; returns the loop's own wall time."""
    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    if prepare:
        loader, model = prepare_data_loader(loader), prepare_model(model)
    report = report or train.report
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    for epoch in range(config["epochs"]):
        for xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        report({"epoch": epoch, "loss": loss.item()})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    storage = tempfile.mkdtemp(prefix="sweepflow-bench-")
    run_config = train.RunConfig(storage_path=storage)

    t0 = time.perf_counter()
    with local_cluster(n_workers=2) as client:
        print(f"local cluster (2 workers) started in {time.perf_counter() - t0:.2f} s")
        # Warm-up: the first group on fresh workers also pays lazy torch imports (torch._dynamo for DDP).
        for n in (1, 2):
            TorchTrainer(
                digits_loop,
                train_loop_config={"epochs": 1},
                scaling_config=train.ScalingConfig(num_workers=n),
                run_config=run_config,
                client=client,
            ).fit()

        print("\n1. group start latency, fit() -> first training step (warm cluster)")
        for n in (1, 2):
            samples = []
            for _ in range(args.repeats):
                start = time.time()
                result = TorchTrainer(
                    first_step,
                    scaling_config=train.ScalingConfig(num_workers=n),
                    run_config=run_config,
                    client=client,
                ).fit()
                samples.append(result.metrics["first_step_at"] - start)
            print(
                f"   {n} rank(s): median {statistics.median(samples) * 1000:.0f} ms, "
                f"min {min(samples) * 1000:.0f} ms, max {max(samples) * 1000:.0f} ms  (target < 1000 ms)"
            )

        print(f"\n2. overhead: {args.epochs}-epoch digits loop, plain process vs TorchTrainer 1 rank")
        torch.set_num_threads(1)  # a Dask worker thread gets one core (the nanny sets OMP_NUM_THREADS=1)
        plain, wrapped = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            digits_loop({"epochs": args.epochs}, report=lambda m: None, prepare=False)
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            TorchTrainer(
                digits_loop,
                train_loop_config={"epochs": args.epochs},
                scaling_config=train.ScalingConfig(num_workers=1),
                run_config=run_config,
                client=client,
            ).fit()
            wrapped.append(time.perf_counter() - start)
        p, w = statistics.median(plain), statistics.median(wrapped)
        print(f"   plain process: median {p:.2f} s; TorchTrainer (whole fit()): median {w:.2f} s")
        print(f"   ratio trainer/plain = {w / p:.3f}  (target <= 1.10)")


if __name__ == "__main__":
    main()
