"""Training functions for pipeline tests (importable on Dask workers via PYTHONPATH)."""

from __future__ import annotations

import json
import os
import tempfile
import time

import ddp_runtime as train
from sweepflow.tune.search import Searcher


def scripted_quality(config: dict) -> None:
    """Reports val_loss = config['quality'] every epoch: a trial whose ASHA fate is known in advance."""
    for epoch in range(1, config["epochs"] + 1):
        time.sleep(0.05)
        train.report(
            {"epoch": epoch, "val_loss": float(config["quality"]), "val_accuracy": 1.0 / config["quality"]}
        )


def checkpointed_quality(config: dict) -> None:
    """``scripted_quality`` that saves a checkpoint every epoch and continues from ``get_checkpoint()``: a
    trial HyperBand can pause and resume, and PBT can continue from another trial's checkpoint."""
    start = 1
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["epoch"] + 1
    for epoch in range(start, config["epochs"] + 1):
        time.sleep(0.05)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"epoch": epoch}, f)
            train.report(
                {"epoch": epoch, "val_loss": float(config["quality"]), "val_accuracy": 1.0 / config["quality"]},
                checkpoint=train.Checkpoint.from_directory(d),
            )


def held_classifier(config: dict) -> None:
    """The built-in train_image_classifier (real checkpoints: evaluation and registration work), where the
    trial that starts ``config['hold']``-th holds after its second report (its checkpoint committed) until the file ``go`` exists
    in ``config['marks']``, having written ``held`` there: a sweep the resume test kills at a moment it can see,
    whatever the machine's speed. With ``go`` there from the start, no trial holds."""
    from sweepflow.tasks.training.loop import train_image_classifier

    marks = config["marks"]
    order = 0
    while True:  # claim the next start number: one file each, created atomically
        order += 1
        try:
            os.close(os.open(os.path.join(marks, f"start_{order}"), os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            continue
    real_report = train.report
    reports = 0

    def held(metrics: dict, checkpoint: train.Checkpoint | None = None) -> None:
        nonlocal reports
        real_report(metrics, checkpoint=checkpoint)
        reports += 1
        if order == config["hold"] and reports == 2 and not os.path.exists(os.path.join(marks, "go")):
            open(os.path.join(marks, "held"), "w").close()
            while not os.path.exists(os.path.join(marks, "go")):
                time.sleep(0.05)

    train.report = held
    try:
        train_image_classifier(config)
    finally:
        train.report = real_report


def burning_quality(config: dict) -> None:
    """``scripted_quality`` that keeps a core busy for ``config['epoch_s']`` (default 0.05) seconds per epoch:
    a trial whose CPU use and training time are known."""
    for epoch in range(1, config["epochs"] + 1):
        until = time.perf_counter() + config.get("epoch_s", 0.05)
        while time.perf_counter() < until:
            pass
        train.report(
            {"epoch": epoch, "val_loss": float(config["quality"]), "val_accuracy": 1.0 / config["quality"]}
        )


class BestAgainSearcher(Searcher):
    """A team's own searcher as ``sweep.sampler`` names it (``pipeline_helpers:BestAgainSearcher``): it proposes
    ``first`` in order, then, once all of them ended, the quality of the best result it was told (by the
    experiment's metric and mode): a third trial that can only be right if every end reached ``on_trial_complete``."""

    def __init__(self, first, metric=None, mode=None):
        super().__init__(metric=metric, mode=mode)
        self.first, self.proposed, self.told = list(first), {}, {}

    def set_search_properties(self, metric, mode, config, **spec):
        self._metric, self._mode = self._metric or metric, self._mode or mode  # Ray: properties over these
        return True  # it searches the space's "quality" itself

    def suggest(self, trial_id):
        if self.first:
            self.proposed[trial_id] = {"quality": self.first.pop(0)}
        elif len(self.told) < len(self.proposed):
            return None  # wait for the running trials' results
        else:
            pick = max if self.mode == "max" else min
            best = pick(self.told.values(), key=lambda r: r[self.metric])
            self.proposed[trial_id] = {"quality": best["config"]["quality"]}
        return self.proposed[trial_id]

    def on_trial_complete(self, trial_id, result=None, error=False):
        if not error:
            self.told[trial_id] = result
