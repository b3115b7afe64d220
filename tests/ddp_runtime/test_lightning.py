"""``ddp_runtime.lightning`` (issue 64 item 1): a Lightning Trainer inside a 2-rank TorchTrainer over gloo, as
Ray's Lightning guide writes it, with both import names; its checkpoint resumes; mistakes are one sentence."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("lightning", reason="the lightning extra: pip install 'sweepflow[lightning]'")

from lightning_fns import train_lightning  # noqa: E402

import ddp_runtime as train  # noqa: E402
from ddp_runtime.torch import TorchTrainer  # noqa: E402


def _fit(cluster, tmp_path, name: str, **config):
    return TorchTrainer(
        train_lightning,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name=name, storage_path=str(tmp_path / "results")),
        client=cluster,
    )


@pytest.mark.parametrize("flavour", ["lightning", "pytorch_lightning"])
def test_a_lightning_trainer_trains_on_two_ranks_and_reports_each_epoch_with_its_checkpoint(cluster, tmp_path, flavour):
    result = _fit(cluster, tmp_path, f"pl-{flavour}", epochs=3, flavour=flavour).fit()
    assert result.error is None, result.error
    history = result.metrics_history
    assert [m["epoch"] for m in history] == [0, 1, 2] and [m["step"] for m in history] == [4, 8, 12]  # 256/2/32
    assert history[-1]["val_loss"] < history[0]["val_loss"] and "train_loss" in history[-1]
    with result.checkpoint.as_directory() as directory:
        assert "checkpoint.ckpt" in os.listdir(directory), os.listdir(directory)
        saved = torch.load(os.path.join(directory, "checkpoint.ckpt"), weights_only=False)
    assert saved["epoch"] == 2 and set(saved["state_dict"]) == {"net.weight", "net.bias"}


def test_fit_from_get_checkpoint_continues_where_the_checkpoint_ended(cluster, tmp_path):
    first = _fit(cluster, tmp_path, "pl-first", epochs=2).fit()
    assert first.error is None, first.error
    trainer = _fit(cluster, tmp_path, "pl-resumed", epochs=4)
    trainer.resume_from_checkpoint = first.checkpoint
    resumed = trainer.fit()
    assert resumed.error is None, resumed.error
    assert [m["epoch"] for m in resumed.metrics_history] == [2, 3]  # epochs 0 and 1 came from the checkpoint
    assert resumed.metrics_history[-1]["val_loss"] < first.metrics_history[-1]["val_loss"]


def test_a_trainer_not_on_the_group_is_refused_with_the_fix():
    import lightning.pytorch as pl

    from ddp_runtime.lightning import (
        RayDDPStrategy,
        RayDeepSpeedStrategy,
        RayTrainReportCallback,
        prepare_trainer,
    )

    with pytest.raises(RuntimeError, match=r"strategy=DDPStrategy\).*pass strategy=RayDDPStrategy\(\)"):
        prepare_trainer(pl.Trainer(strategy="ddp", devices=1, logger=False, enable_progress_bar=False))
    with pytest.raises(TypeError, match=r"RayDDPStrategy\(timeout=...\).*TorchConfig\(backend=..., timeout_s=...\)"):
        RayDDPStrategy(timeout=10)
    with pytest.raises(ModuleNotFoundError, match="RayDeepSpeedStrategy needs DeepSpeed.*pip install deepspeed"):
        RayDeepSpeedStrategy()
    with pytest.raises(TypeError, match="RayTrainReportCallback\\(validation=...\\)"):
        RayTrainReportCallback(validation=True)
