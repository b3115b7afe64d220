"""Sharded models (issue 63, item 2): ``prepare_model(parallel_strategy="fsdp")`` (FSDP2 ``fully_shard`` on CPUs
over gloo here), checkpointed with ``torch.distributed.checkpoint`` through ``report`` from every rank, a rank
killed, the group resumed from ``get_checkpoint()`` with the sharded state; ``load_full_state_dict`` reads the
checkpoint back whole in one process. Run with ``-s`` for the losses before and after the resume."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import whole
from fsdp_fns import dataset, fsdp_regression, net
from torch import nn

import ddp_runtime as train
from ddp_runtime.cluster import local_cluster
from ddp_runtime.sharded import load_full_state_dict
from ddp_runtime.torch import TorchTrainer


@pytest.fixture(scope="module")
def _own_cluster():
    """This module's own 2 workers: its test kills one (its nanny restarts it)."""
    with local_cluster(n_workers=2) as client:
        yield client


@pytest.fixture
def cluster(_own_cluster):
    return whole(_own_cluster, 2)


def test_an_fsdp_group_killed_mid_run_resumes_its_sharded_state_and_the_loss_goes_on(cluster, tmp_path):
    result = TorchTrainer(
        fsdp_regression,
        train_loop_config={"epochs": 6, "kill_at": 2, "once": str(tmp_path / "killed-once")},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="fsdp",
            storage_path=str(tmp_path / "results"),
            failure_config=train.FailureConfig(max_failures=1),
            checkpoint_config=train.CheckpointConfig(num_to_keep=2),
        ),
        client=cluster,
    ).fit()
    assert result.num_failures == 1 and os.path.exists(tmp_path / "killed-once")
    history = result.metrics_history
    assert [m["epoch"] for m in history] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]  # epochs 0-2 committed before the kill: not redone
    losses = [m["loss"] for m in history]
    resumed = history[3]["resumed_loss"]
    # The sharded state came back whole: the loss before any step of the new group is the checkpoint's.
    assert resumed == pytest.approx(losses[2], rel=1e-5), (resumed, losses)
    assert losses[5] < losses[2] < losses[0], losses  # and it goes on down
    with result.checkpoint.as_directory() as d:
        names = set(os.listdir(d))
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "progress.json"} <= names, names
    # One process, no process group: the full state dict of the sharded checkpoint.
    state = load_full_state_dict(result.checkpoint, key="model")
    plain = net()
    plain.load_state_dict(state)
    x, y = dataset()
    with torch.no_grad():
        loss = float(nn.functional.mse_loss(plain(x), y))
    assert loss == pytest.approx(losses[5], rel=1e-4)
    print(
        "\nFSDP2 on 2 CPU ranks (gloo), rank 1 killed after epoch 2's report: loss by epoch "
        + ", ".join(f"{v:.4f}" for v in losses[:3])
        + f" | killed, resumed from the sharded checkpoint: {resumed:.4f} before any step, then "
        + ", ".join(f"{v:.4f}" for v in losses[3:])
        + f"; full state dict from the checkpoint, unsharded: {loss:.4f}"
    )


def test_prepare_model_takes_rays_arguments(cluster, tmp_path):
    """move_to_device=<a device> is honoured, a 1-rank group is never wrapped, and a strategy outside Ray's three
    is refused by name."""
    from fsdp_fns import prepared_kinds

    result = TorchTrainer(
        prepared_kinds,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="kinds", storage_path=str(tmp_path / "results")),
        client=cluster,
    ).fit()
    assert result.metrics["kinds"] == {
        "ddp": "DistributedDataParallel",
        "fsdp": "FSDPSequential",
        "none": "Sequential",
        "device": "cpu",
        "bad": "ValueError: prepare_model(parallel_strategy='zero3'): use 'ddp' (DistributedDataParallel), "
        "'fsdp' (sharded: FullyShardedDataParallel) or None (not wrapped)",
    }
