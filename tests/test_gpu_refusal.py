"""``ScalingConfig(use_gpu=True)`` on a machine without GPUs and without a Dask cluster: refused in one sentence
before any worker starts (it used to start the workers, fail every rank on CUDA, restart them: 26-110 s)."""

from __future__ import annotations

import time

import psutil
import pytest

from ddp_runtime import ScalingConfig
from ddp_runtime.cluster import gpu_count
from ddp_runtime.torch import TorchTrainer


def _never_runs(config):  # pragma: no cover - refused before any rank starts
    raise AssertionError("a rank ran")


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU")
def test_use_gpu_without_a_gpu_or_a_cluster_is_refused_before_any_worker_starts(tmp_path):
    trainer = TorchTrainer(
        _never_runs,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
    )
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"no GPU .* set use_gpu=False") as refused:
        trainer.fit()
    assert time.monotonic() - started < 5, "refused only after work"
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # no worker started
    assert "\n" not in str(refused.value)
