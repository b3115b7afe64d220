"""A Tune experiment that the resume test kills part-way (run as a script: ``python tune_resume_fns.py MARKS
NAME``), and its trainable. The script's Dask workers are its own children, so killing its process group ends
the experiment's driver and its workers at once, as a lost node would.

Also the steps of Ray's fault-tolerance pattern across processes, each a script run of its own on the cluster
the environment names (``python tune_resume_fns.py MARKS NAME crash|resume_errored|read``): a fit whose trials
crash, ``Tuner.restore(path, resume_errored=True).fit()``, then the finished experiment read back. Each step writes
what it saw to ``MARKS/<step>.json``."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from sweepflow import tune


def blocking_trainable(config, checkpoint_dir=None):
    """loss = quality / epoch for 3 epochs, a checkpoint each epoch; the quality-3 trial waits after its first
    report until the file ``go`` exists (the test kills the experiment meanwhile). Every start is logged to
    ``starts`` as ``quality:epoch-it-starts-from``."""
    start = 0
    if checkpoint_dir:
        with open(os.path.join(checkpoint_dir, "epoch")) as f:
            start = int(f.read())
    with open(os.path.join(config["marks"], "starts"), "a") as f:
        f.write(f"{config['quality']}:{start}\n")
    for epoch in range(start + 1, 4):
        with tune.checkpoint_dir(epoch) as directory:
            with open(os.path.join(directory, "epoch"), "w") as f:
                f.write(str(epoch))
        tune.report(loss=config["quality"] / epoch)
        if config["quality"] == 3 and epoch == 1:
            while not os.path.exists(os.path.join(config["marks"], "go")):
                time.sleep(0.05)


def experiment(marks: str, name: str, **kwargs):
    return tune.run(
        blocking_trainable,
        name=name,
        config={"quality": tune.grid_search([1, 2, 3]), "marks": marks},
        metric="loss",
        mode="min",
        max_concurrent_trials=1,  # the trials start in order: 1, 2, then 3
        verbose=0,
        **kwargs,
    )


def tuner(marks: str, name: str) -> tune.Tuner:
    """The same experiment as current Ray Tune writes it."""
    return tune.Tuner(
        blocking_trainable,
        param_space={"quality": tune.grid_search([1, 2, 3]), "marks": marks},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1),
        run_config=tune.RunConfig(name=name, verbose=0),
    )


CRASH_EPOCHS = 6


def crashing_trainable(config):
    """score = x * epoch for ``CRASH_EPOCHS`` epochs, a checkpoint each epoch (reported with it); raises
    ``RuntimeError("simulated crash at epoch N")`` after report N while the file ``crash-<x>-at-<N>`` exists.
    Each report says the epoch it started from (``started_from``)."""
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory, open(os.path.join(directory, "epoch")) as f:
            start = int(f.read())
    for epoch in range(start + 1, CRASH_EPOCHS + 1):
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "epoch"), "w") as f:
                f.write(str(epoch))
            report = {"score": config["x"] * epoch, "epoch": epoch, "started_from": start}
            tune.report(report, checkpoint=tune.Checkpoint.from_directory(directory))
        if os.path.exists(os.path.join(config["marks"], f"crash-{config['x']}-at-{epoch}")):
            raise RuntimeError(f"simulated crash at epoch {epoch}")


def crashing_tuner(marks: str, name: str) -> tune.Tuner:
    """Two trials (x = 1, 2) of ``crashing_trainable``, kept under ``MARKS/results``."""
    return tune.Tuner(
        crashing_trainable,
        param_space={"x": tune.grid_search([1, 2]), "marks": marks},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name=name, storage_path=os.path.join(marks, "results"), verbose=0),
    )


def seen(grid) -> dict:
    """What a ``ResultGrid`` holds, as JSON: its errors and, per trial, its error, last report, checkpoint."""

    def epoch_of(checkpoint) -> int | None:
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as directory, open(os.path.join(directory, "epoch")) as f:
            return int(f.read())

    return {
        "path": grid.experiment_path,
        "errors": grid.errors,
        "num_errors": grid.num_errors,
        "num_terminated": grid.num_terminated,
        "trials": {
            str(r.config["x"]): {
                "error": r.error,
                "metrics": {k: v for k, v in r.metrics.items() if k != "config"},
                "reports": len(r.metrics_dataframe),
                "checkpoint": r.checkpoint.path if r.checkpoint is not None else None,
                "checkpoint_epoch": epoch_of(r.checkpoint),
                "run_id": r.mlflow_run_id,
            }
            for r in grid
        },
    }


def crash_step(marks: str, name: str, step: str) -> None:
    """One step of the fault-tolerance pattern, in this process (see the module's docstring)."""
    path = os.path.join(marks, "results", name)
    if step == "crash":
        out = seen(crashing_tuner(marks, name).fit())
    elif step == "resume_errored":
        assert tune.Tuner.can_restore(path), path
        out = seen(tune.Tuner.restore(path, trainable=crashing_trainable, resume_errored=True).fit())
    else:  # read: the finished experiment read back, then restored again (nothing left to run)
        out = {
            "get_results": seen(tune.Tuner.restore(path, trainable=crashing_trainable).get_results()),
            "fit": seen(tune.Tuner.restore(path, trainable=crashing_trainable).fit()),
        }
    with open(os.path.join(marks, f"{step}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":  # python tune_resume_fns.py MARKS NAME [run|tuner|crash|resume_errored|read]
    if sys.argv[3:4] and sys.argv[3] in ("crash", "resume_errored", "read"):
        crash_step(*sys.argv[1:4])  # on the cluster DASK_SCHEDULER_ADDRESS names
        sys.exit(0)
    from ddp_runtime.cluster import local_cluster

    with local_cluster(n_workers=1) as client:
        os.environ["DASK_SCHEDULER_ADDRESS"] = client.scheduler.address
        if sys.argv[3:] == ["tuner"]:
            tuner(sys.argv[1], sys.argv[2]).fit()
        else:
            experiment(sys.argv[1], sys.argv[2])
