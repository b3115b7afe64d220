"""A training function of adjustable length, for ``bench_overhead.py``: the same PyTorch work as a sweep trial
(``train_fn``, run by sweepflow on the Dask workers: ``training.train_fn=sized_trial:train_fn`` with this folder
on PYTHONPATH) and in a plain process (``plain_trial``).

Config keys: ``data_path`` (a prepared dataset), ``epochs`` (reports per trial), ``passes`` (passes over the
training split per epoch; fractions allowed: that share of its batches), ``l1``, ``l2`` (the Ray Tune CIFAR tutorial's ``Net``),
``batch_size``, ``lr``, ``seed``. Each epoch trains, validates, and writes the checkpoint the built-in loop
writes (model + optimizer state + meta.json, the layout the pipeline's evaluation reads); the sweep reports it,
the plain process drops it.

torch is imported inside the functions: the flow process imports this module to check it, and never needs torch.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from sweepflow.tasks.training.function import with_checks

REPORTS = ("epoch", "train_loss", "val_loss", "val_accuracy")


def _train(config: dict[str, Any], report: Callable[[dict[str, float], str], None]) -> None:
    """The trial's work in plain PyTorch; ``report(metrics, checkpoint_dir)`` once per epoch."""
    import itertools
    import json

    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.utils.data import DataLoader, TensorDataset

    from sweepflow.tasks.datasets import load_meta, load_split
    from sweepflow.tasks.training.hparams import model_hparams
    from sweepflow.tasks.training.loop import make_model, make_optimizer

    torch.set_num_threads(1)  # as on a Dask worker (its nanny sets OMP_NUM_THREADS=1)
    data_path = config["data_path"]
    meta = load_meta(data_path)
    x, y = load_split(data_path, "train")
    xv, yv = load_split(data_path, "val")
    torch.manual_seed(int(config.get("seed", 0)))
    model_config = {"model": "net", "l1": 64, "l2": 64, "optimizer": "adam", "lr": 1e-3, **config}
    model_config["model"] = "net"
    model = make_model(model_config, meta)
    opt = make_optimizer(model_config, model.parameters())
    loader = DataLoader(TensorDataset(x, y), batch_size=int(config.get("batch_size", 32)), shuffle=True)
    steps = max(1, round(float(config.get("passes", 1.0)) * len(loader)))
    # The built-in loop's checkpoint layout, which the pipeline's evaluation and registration read.
    checkpoint_meta = {
        "model": "net",
        "model_hparams": model_hparams("net", model_config),
        "input_shape": [int(v) for v in meta["input_shape"]],
        "num_classes": int(meta["num_classes"]),
        "dataset": meta.get("name"),
        **{key: meta[key] for key in ("class_names", "mean", "std") if key in meta},
    }
    for epoch in range(1, int(config.get("epochs", 1)) + 1):
        model.train()
        loss_sum, count = 0.0, 0
        batches = itertools.chain.from_iterable(itertools.repeat(loader))  # reshuffled on every pass
        for xb, yb in itertools.islice(batches, steps):
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(yb)
            count += len(yb)
        model.eval()
        with torch.no_grad():
            logits = model(xv)
            val_loss = F.cross_entropy(logits, yv).item()
            val_accuracy = (logits.argmax(dim=1) == yv).float().mean().item()
        metrics = {
            "epoch": epoch,
            "train_loss": loss_sum / max(count, 1),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
        }
        with tempfile.TemporaryDirectory(prefix="sized-trial-") as directory:
            torch.save(model.state_dict(), os.path.join(directory, "model.pt"))
            torch.save(opt.state_dict(), os.path.join(directory, "optimizer.pt"))
            with open(os.path.join(directory, "meta.json"), "w") as f:
                json.dump({**checkpoint_meta, "epoch": epoch}, f)
            report(metrics, directory)


@with_checks(reports=REPORTS)
def train_fn(config: dict[str, Any]) -> None:
    """The sweep's trial: each epoch's metrics and checkpoint go to ``ddp_runtime.report`` (1 rank)."""
    import ddp_runtime

    def report(metrics: dict[str, float], directory: str) -> None:
        ddp_runtime.report(metrics, checkpoint=ddp_runtime.Checkpoint.from_directory(directory))

    _train(config, report)


def plain_trial(config: dict[str, Any]) -> tuple[float, float]:
    """The same trial in this (plain) process; returns its wall time and this process's CPU time, in seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    _train(config, lambda metrics, directory: None)
    return time.perf_counter() - start, time.process_time() - cpu
