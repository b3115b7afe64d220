"""Training functions whose every rank writes checkpoint files, for tests/ddp_runtime/test_checkpoint_merge.py (importable on
Dask workers via PYTHONPATH)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time

import fsspec

import ddp_runtime as train

MB = 1 << 20


def _payload(rank: int, epoch: int, size: int) -> bytes:
    block = os.urandom(4096)  # incompressible, different on every rank
    return (block * (size // len(block) + 1))[:size] + bytes([rank, epoch])


def every_rank_writes(config: dict) -> None:
    """Each epoch, every rank writes ``model-rank={rank}.pt`` (``config["mb"]`` MB) and the same ``config.json``;
    rank 0 also sets the checkpoint's metadata. Rank r logs, after each report, what
    ``get_all_reported_checkpoints`` lists and how long its ``report`` took, to ``config["log"]/rank{r}.json``."""
    rank = train.get_context().get_world_rank()
    log = []
    for epoch in range(config["epochs"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"model-rank={rank}.pt"), "wb") as f:
                f.write(_payload(rank, epoch, int(config["mb"] * MB)))
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"epochs": config["epochs"], "epoch": epoch}, f)
            checkpoint = train.Checkpoint.from_directory(d)
            if rank == 0:
                checkpoint.set_metadata({"epoch": epoch, "by": "rank 0"})
            name = f"epoch_{epoch}" if config.get("named") else None
            started = time.perf_counter()
            train.report(
                {"epoch": epoch, "loss": 1.0 / (epoch + 1)}, checkpoint=checkpoint, checkpoint_dir_name=name
            )
            took = time.perf_counter() - started
        listed = train.get_all_reported_checkpoints()
        log.append(
            {
                "report_s": took,
                "listed": [[r.checkpoint.path, r.metrics["epoch"], r.status.value] for r in listed],
            }
        )
    with open(os.path.join(config["log"], f"rank{rank}.json"), "w") as f:
        json.dump(log, f)


def conflicting_files(config: dict) -> None:
    """Both ranks write ``model.pt``, each with its own bytes (``config["same_size"]``: of the same length). With
    ``config["extra"]`` each also writes a file of its own (the ranks' file sets differ: not copies of one
    checkpoint); with ``config["fsdp"]`` the ranks first shard a model with ``prepare_model`` (their files are
    shards, whatever their names)."""
    rank = train.get_context().get_world_rank()
    if config.get("fsdp"):
        import torch

        from ddp_runtime.torch import prepare_model

        prepare_model(torch.nn.Linear(4, 4), parallel_strategy="fsdp")
    with tempfile.TemporaryDirectory() as d:
        size = 1000 if config.get("same_size") else 1000 + rank
        with open(os.path.join(d, "model.pt"), "wb") as f:
            f.write(bytes([rank]) * size)
        if config.get("extra"):
            with open(os.path.join(d, f"extra-rank{rank}.bin"), "wb") as f:
                f.write(b"x")
        train.report({"epoch": 0}, checkpoint=train.Checkpoint.from_directory(d))


def rank_one_dies_mid_upload(config: dict) -> None:
    """Rank 1 writes ``config["files"]`` files of 1 MB, rank 0 one; on the first attempt (no file
    ``config["once"]`` yet) rank 1 kills its own Dask worker process as soon as its first file shows up in the
    run's storage (a thread watching it), i.e. mid-upload."""
    rank = train.get_context().get_world_rank()
    n = config["files"] if rank == 1 else 1
    with tempfile.TemporaryDirectory() as d:
        for i in range(n):
            with open(os.path.join(d, f"rank{rank}-part{i:03d}.bin"), "wb") as f:
                f.write(_payload(rank, i, MB))
        if rank == 1 and not os.path.exists(config["once"]):
            open(config["once"], "w").close()
            fs, _, (root,) = fsspec.get_fs_token_paths(
                config["run"], storage_options=config.get("options") or {}
            )

            def watch() -> None:
                while True:
                    fs.invalidate_cache()
                    if fs.glob(f"{root}/**/rank1-part*.bin"):
                        os.kill(
                            os.getpid(), signal.SIGKILL
                        )  # the whole worker process, as the OOM killer would
                    time.sleep(0.01)

            threading.Thread(target=watch, daemon=True).start()
        train.report({"epoch": 0}, checkpoint=train.Checkpoint.from_directory(d))
