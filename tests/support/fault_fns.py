"""Training functions with an injected fault, for tests/e2e/test_faults_ranks.py (importable on Dask workers via
PYTHONPATH)."""

from __future__ import annotations

import os
import signal
import time
from unittest import mock

import ddp_runtime
from sweepflow.tasks.training.function import with_checks
from sweepflow.tasks.training.loop import train_image_classifier, validate_config

HANG_S = 3600  # "forever" for a test: far beyond any timeout the tests set


def hang_on_rank_one(config: dict) -> None:
    """Reports epochs 1..config["epochs"]; rank 1 sleeps instead of reporting epoch config["hang_at"], so rank 0
    waits for it in report's barrier. With config["once"] (a file path) the hang happens on the first attempt
    only."""
    rank = ddp_runtime.get_context().get_world_rank()
    once = config.get("once")
    for epoch in range(1, config["epochs"] + 1):
        time.sleep(0.05)
        if rank == 1 and epoch == config["hang_at"] and not (once and os.path.exists(once)):
            if once:
                open(once, "w").close()
            time.sleep(HANG_S)  # the hung rank
        ddp_runtime.report({"epoch": epoch, "t": time.time()})


@with_checks(validate=validate_config, reports=("epoch", "train_loss", "val_loss", "val_accuracy"))
def train_with_fault(config: dict) -> None:
    """The pipeline's own ``train_image_classifier``, with the fault named by config["fault"] at epoch 2:

    - "kill": once epoch 2's report returns (its checkpoint committed), rank 0 kills its own Dask worker
      process, on the first attempt only (a marker file per trial in config["fault_dir"]);
    - "hang": rank 1 sleeps for an hour instead of making epoch 2's report (rank 0 then waits for it in
      report's barrier);
    - "none": no fault.
    """
    fault = config.get("fault", "none")
    rank = ddp_runtime.get_context().get_world_rank()
    marker = os.path.join(config["fault_dir"], f"killed-seed{config['seed']}")
    real_report = ddp_runtime.report

    def report(metrics: dict, checkpoint: ddp_runtime.Checkpoint | None = None) -> None:
        if fault == "hang" and rank == 1 and metrics["epoch"] == 2:
            time.sleep(HANG_S)  # the hung rank
        real_report(metrics, checkpoint=checkpoint)
        if fault == "kill" and rank == 0 and metrics["epoch"] == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the whole Dask worker process, as the OOM killer would

    # The loop calls ddp_runtime.report at the end of each epoch: it gets ours for this call. (Each rank has its
    # worker process to itself: one thread per worker.)
    with mock.patch.object(ddp_runtime, "report", report):
        train_image_classifier(config)


def silent_but_sampling(config: dict) -> None:
    """Reports once, then never again while its rank 0 keeps posting side messages (as the system-metrics sampler
    does), each batch of them sent alone: a hang all the same."""
    import ddp_runtime.session

    post = ddp_runtime.session.side_channel(flush_after_s=0.05)
    ddp_runtime.report({"epoch": 1})
    until = time.monotonic() + HANG_S
    while time.monotonic() < until:
        post({"t": time.time()})
        time.sleep(0.1)
