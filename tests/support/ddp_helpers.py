"""Training functions the ddp_runtime tests run on Dask workers (importable there via PYTHONPATH)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import ddp_runtime as train
from ddp_runtime.torch import prepare_data_loader, prepare_model


class IndexedDataset(Dataset):
    """Returns (x, y, index) so a test can see which samples each rank got."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] + self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def ddp_train(config: dict) -> None:
    """2-rank training that records, per rank: sample indices of epoch 0, losses, final parameters' hash."""
    torch.manual_seed(1234 + train.get_context().get_world_rank())  # different init per rank: DDP must sync
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    )
    loader = prepare_data_loader(
        DataLoader(
            IndexedDataset(config["n"]), batch_size=16, shuffle=True, num_workers=config.get("num_workers", 0)
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    ctx = train.get_context()
    seen, losses = [], []
    for epoch in range(config["epochs"]):
        loader.sampler.set_epoch(epoch)
        total, count = 0.0, 0
        for x, y, idx in loader:
            if epoch == 0:
                seen.extend(idx.tolist())
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            count += len(y)
        losses.append(total / count)
        train.report({"loss": losses[-1], "epoch": epoch})
    state = model.module.state_dict()
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in state.values())).hexdigest()
    with open(os.path.join(config["out"], f"rank{ctx.get_world_rank()}.json"), "w") as f:
        json.dump({"seen": seen, "losses": losses, "params": digest, "world": ctx.get_world_size()}, f)


def report_forever(config: dict) -> None:
    """Reports every `interval` seconds with timestamps until stopped by the driver (or `max_reports`)."""
    for i in range(config.get("max_reports", 10_000)):
        time.sleep(config.get("interval", 0.05))
        train.report({"i": i, "t": time.time(), "rank_count": train.get_context().get_world_size()})


def checkpointed_epochs(config: dict) -> None:
    """Trains `epochs` epochs with a checkpoint each; appends each epoch it starts to a log; rank 1 kills its own
    worker process at `kill_at` on the first attempt (when nothing is resumed... but only once: a marker file)."""
    ctx = train.get_context()
    model = prepare_model(torch.nn.Linear(4, 1))
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.module.load_state_dict(state["model"]) if hasattr(model, "module") else model.load_state_dict(
            state["model"]
        )
        start = state["epoch"] + 1
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(start, config["epochs"]):
        if ctx.get_world_rank() == 0:
            with open(config["log"], "a") as f:
                f.write(f"{epoch}\n")
        marker = config["log"] + ".killed"
        if ctx.get_world_rank() == 1 and epoch == config["kill_at"] and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(32, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.05)
        with tempfile.TemporaryDirectory() as d:
            module = model.module if hasattr(model, "module") else model
            torch.save({"model": module.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
            train.report({"epoch": epoch, "loss": loss.item()}, checkpoint=train.Checkpoint.from_directory(d))


def fail_on_rank_one(config: dict) -> None:
    """Rank 1 raises after a few steps while rank 0 is inside DDP collectives."""
    ctx = train.get_context()
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10_000):
        if ctx.get_world_rank() == 1 and step == 5:
            raise ValueError("boom on rank one")
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def scored_checkpoints(config: dict) -> None:
    """One checkpoint per step with a given score sequence."""
    for i, score in enumerate(config["scores"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "value.txt"), "w") as f:
                f.write(str(i))
            train.report({"score": score, "step": i}, checkpoint=train.Checkpoint.from_directory(d))


def linear_regression(config: dict) -> None:
    torch.manual_seed(0)
    x = torch.randn(128, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    loader = prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True))
    model = prepare_model(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(config["epochs"]):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with tempfile.TemporaryDirectory() as d:
            module = model.module if hasattr(model, "module") else model
            torch.save(module.state_dict(), os.path.join(d, "model.pt"))
            train.report({"loss": loss.item(), "epoch": epoch}, checkpoint=train.Checkpoint.from_directory(d))


def side_messages(config: dict) -> None:
    """On rank 0, posts side messages (from another thread, as a sampler does) around two reports; then, with no
    report to carry them, "d", and "e" once "d" has waited flush_after_s (both go then, alone); then "f", a
    second before the function returns (it goes with the rank's result)."""
    import threading

    import ddp_runtime.session

    wait_s = config["flush_after_s"]
    post = ddp_runtime.session.side_channel(flush_after_s=wait_s)
    if train.get_context().get_world_rank() != 0:
        assert post is None
        train.report({"n": 1})
        train.report({"n": 2})
        return

    def from_a_thread(payload):
        thread = threading.Thread(target=post, args=(payload,))
        thread.start()
        thread.join()

    from_a_thread("a")
    from_a_thread("b")
    train.report({"n": 1})
    from_a_thread("c")
    train.report({"n": 2})
    post("d")
    time.sleep(wait_s * 2)
    post("e")
    time.sleep(1.0)
    post("f")
