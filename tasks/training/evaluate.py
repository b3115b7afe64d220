"""Evaluate a trained classifier on a prepared split: loss, accuracy, per-class accuracy, confusion matrix.

Used after a sweep on the best trial's checkpoint (``evaluate_checkpoint``), and on any in-memory model
(``evaluate_model``). The result is plain data: ``to_metrics()`` flattens it for MLflow, and
``sweepflow.tasks.reporting.confusion_matrix`` draws its matrix as a PNG to log as an artifact.

Only torch and numpy are imported (no Prefect, MLflow or matplotlib), so this runs on a Dask worker, in a flow
task or a notebook alike, and a worker that evaluates imports nothing it does not use.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the conventional PyTorch alias
from torch import nn

import ddp_runtime
from sweepflow.tasks.datasets import load_meta, load_split
from sweepflow.tasks.training.loop import load_model_from_checkpoint


@dataclass(frozen=True)
class EvaluationResult:
    """A model's performance on one split.

    ``confusion_matrix[i][j]`` counts samples of true class ``i`` predicted as class ``j`` (rows: truth,
    columns: prediction), so row ``i`` sums to the number of class-``i`` samples. ``per_class_accuracy``
    (recall per class) is keyed by class name; a class with no samples in the split has NaN.
    """

    loss: float
    accuracy: float
    per_class_accuracy: dict[str, float]
    confusion_matrix: list[list[int]]
    class_names: list[str]
    num_samples: int

    def to_metrics(self, prefix: str = "test") -> dict[str, float]:
        """Flat metrics for ``mlflow.log_metrics``: ``test_loss``, ``test_accuracy``, ``test_accuracy_class_3``.

        Per-class keys use the class *index*, not its name: names such as "T-shirt/top" hold characters that
        MLflow rejects or treats as a hierarchy. Classes absent from the split (NaN accuracy) are left out
        rather than logged as NaN, which would break MLflow's charts.
        """
        if not re.fullmatch(r"[A-Za-z0-9_.-]*", prefix):
            raise ValueError(f"metric prefix may hold only letters, digits, '_', '.', '-'; got {prefix!r}")
        lead = f"{prefix}_" if prefix else ""
        metrics = {f"{lead}loss": float(self.loss), f"{lead}accuracy": float(self.accuracy)}
        for index, name in enumerate(self.class_names):
            value = self.per_class_accuracy.get(name, float("nan"))
            if not np.isnan(value):
                metrics[f"{lead}accuracy_class_{index}"] = float(value)
        return metrics


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@torch.no_grad()
def evaluate_model(
    model: nn.Module, data_path: str, split: str = "test", batch_size: int = 512
) -> EvaluationResult:
    """Evaluate ``model`` on ``split`` of the prepared dataset at ``data_path`` (on the model's device).

    The model is put in eval mode for the pass and restored to its previous mode afterwards.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    meta = load_meta(data_path)
    num_classes = int(meta["num_classes"])
    class_names = [str(name) for name in meta.get("class_names", range(num_classes))]
    x, y = load_split(data_path, split)
    if len(y) == 0:
        raise ValueError(f"split {split!r} of {data_path!r} is empty; nothing to evaluate")

    device = _model_device(model)
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    predictions = []
    try:
        for start in range(0, len(y), batch_size):
            xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
            logits = model(xb)
            if logits.ndim != 2 or logits.shape[1] != num_classes:
                raise ValueError(
                    f"the model outputs shape {tuple(logits.shape)} but {meta.get('name', data_path)!r} has "
                    f"{num_classes} classes; evaluate it on the dataset it was trained for"
                )
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
            predictions.append(logits.argmax(dim=1).cpu())
    finally:
        model.train(was_training)

    predicted = torch.cat(predictions)
    # One bincount over (true, predicted) pairs builds the whole matrix.
    confusion = torch.bincount(y * num_classes + predicted, minlength=num_classes * num_classes)
    confusion = confusion.reshape(num_classes, num_classes)
    per_class_total = confusion.sum(dim=1).tolist()
    correct = confusion.diagonal().tolist()  # python ints: exact ratios, not float32 ones
    per_class = {
        name: (correct[i] / per_class_total[i] if per_class_total[i] > 0 else float("nan"))
        for i, name in enumerate(class_names)
    }
    return EvaluationResult(
        loss=loss_sum / len(y),
        accuracy=sum(correct) / len(y),
        per_class_accuracy=per_class,
        confusion_matrix=confusion.tolist(),
        class_names=class_names,
        num_samples=len(y),
    )


def evaluate_checkpoint(
    checkpoint_dir: str | os.PathLike[str] | ddp_runtime.Checkpoint, data_path: str, split: str = "test"
) -> EvaluationResult:
    """Evaluate the model of a ``train_image_classifier`` checkpoint (a directory or a ``Checkpoint``)."""
    return evaluate_model(load_model_from_checkpoint(checkpoint_dir), data_path, split=split)
