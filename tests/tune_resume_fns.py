"""A Tune experiment that the resume test kills part-way (run as a script: ``python tune_resume_fns.py MARKS
NAME``), and its trainable. The script's Dask workers are its own children, so killing its process group ends
the experiment's driver and its workers at once, as a lost node would."""

from __future__ import annotations

import os
import sys
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


if __name__ == "__main__":  # python tune_resume_fns.py MARKS NAME [run|tuner]
    from ddp_runtime.cluster import local_cluster

    with local_cluster(n_workers=1) as client:
        os.environ["DASK_SCHEDULER_ADDRESS"] = client.scheduler.address
        if sys.argv[3:] == ["tuner"]:
            tuner(sys.argv[1], sys.argv[2]).fit()
        else:
            experiment(sys.argv[1], sys.argv[2])
