"""The built-in image classifier's side of the project contract (docs/own-project.md).

``train_image_classifier`` (the default ``training.train_fn``) writes checkpoints of its own (``model.pt`` and
``meta.json``: the architecture and the data's shape). These are the ``training.model_fn`` and
``evaluation.evaluate_fn`` that read them: the pipeline's defaults when the built-in trains, and what a
``train_fn`` of one's own that calls ``train_image_classifier`` (a wrapper adding logging, faults, pacing) names.
The pipeline runs them through its own paths (the confusion matrix comes with the evaluation); called directly
they keep the contract, so ``sweepflow.tune.register_best`` takes them too.
"""

from __future__ import annotations

from typing import Any

import ddp_runtime

#: Their import paths: what a config names, and what the pipeline recognises as the built-in ones.
MODEL_FN = "sweepflow.tasks.training.builtin:model_fn"
EVALUATE_FN = "sweepflow.tasks.training.builtin:evaluate_fn"


def model_fn(checkpoint: ddp_runtime.Checkpoint) -> Any:
    """The classifier a ``train_image_classifier`` checkpoint holds, in eval mode (no input example: the
    pipeline takes one from the data's test split)."""
    from sweepflow.tasks.training.loop import load_model_from_checkpoint

    return load_model_from_checkpoint(checkpoint)


def evaluate_fn(checkpoint: ddp_runtime.Checkpoint, data_path: str) -> dict[str, float]:
    """Test-set loss, accuracy and per-class accuracy (``loss``, ``accuracy``, ``accuracy_class_<i>``)."""
    from sweepflow.tasks.training.evaluate import evaluate_checkpoint

    return evaluate_checkpoint(checkpoint, data_path, split="test").to_metrics(prefix="")
