"""``sweepflow.tune.integration.ray_train``: Ray Train v2's Tune pattern (Ray's module path).

A Tune function trainable that fits a ``TorchTrainer`` per trial, its reports forwarded to Tune::

    def train_driver_fn(config):
        trainer = TorchTrainer(
            train_fn_per_worker,
            train_loop_config=config["train_loop_config"],
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name=f"train-{tune.get_context().get_trial_id()}",
                                 callbacks=[TuneReportCallback()]),
        )
        trainer.fit()

    Tuner(train_driver_fn, param_space={"train_loop_config": {...}}, tune_config=TuneConfig(...)).fit()

Each trial's function runs on a Dask worker; its ``fit()`` drives the trial's DDP group from there. The trial's
own reservation (one worker) is lent to that group while it runs (``ddp_runtime._gang.lend``), so trials do not
hold workers their groups wait for; the group's workers are reserved all at once, for the trial. Every report
of the group reaches Tune as the trial's (rank 0's metrics, and the checkpoint's path as ``checkpoint_path``
when the report had one, as Ray's callback does); when Tune stops the trial (ASHA, a stopper), the group stops
at that report and ``fit()`` raises ``StopTraining``, which ends the trial's function as stopped.
"""

from __future__ import annotations

from typing import Any

from ddp_runtime import Checkpoint, TrainRunContext, UserCallback
from ddp_runtime.session import inside_training_function
from sweepflow.tune.not_built import refusing
from sweepflow.tune.session import report

#: The metric a forwarded report's checkpoint path goes under (Ray's ``CHECKPOINT_PATH_KEY``).
CHECKPOINT_PATH_KEY = "checkpoint_path"


class TuneReportCallback(UserCallback):
    """Forward a ``TorchTrainer``'s reports to the Tune trial whose function fits it (Ray's
    ``ray.tune.integration.ray_train.TuneReportCallback``): give it in the trainer's
    ``RunConfig(callbacks=[TuneReportCallback()])``, inside a Tune trainable."""

    def __init__(self) -> None:
        if not inside_training_function():
            raise RuntimeError(
                "TuneReportCallback must be used in a Tune session: create it inside the trainable that Tuner/"
                "tune.run runs (the function that builds the TorchTrainer), not where the Tuner is built"
            )

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None
    ) -> None:
        """Report rank 0's metrics to the trial (``checkpoint_path`` added when the report had a checkpoint, which
        stays where the trainer stored it); raises ``StopTraining`` when Tune stops the trial."""
        forwarded = dict(metrics[0])
        if checkpoint is not None:
            forwarded[CHECKPOINT_PATH_KEY] = checkpoint.path
        report(forwarded)


__getattr__ = refusing(__name__)
