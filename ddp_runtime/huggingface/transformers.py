"""``ddp_runtime.huggingface.transformers``: a Hugging Face ``transformers.Trainer`` inside a ``TorchTrainer``
rank, as Ray 2.60's ``ray.train.huggingface.transformers`` has it.

    from ddp_runtime.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    def train_func(config):
        args = TrainingArguments(output_dir="out", eval_strategy="epoch", save_strategy="epoch", ...)
        trainer = Trainer(model=model, args=args, train_dataset=..., eval_dataset=...,
                          callbacks=[RayTrainReportCallback()])
        trainer = prepare_trainer(trainer)
        trainer.train(resume_from_checkpoint=...)   # get_checkpoint()'s directory / "checkpoint"

The group has initialised ``torch.distributed`` and set the torchrun variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) before the function runs: the Trainer (Accelerate underneath)
joins that group and shards its data loaders by its ranks, as it does under ``torchrun``. Each time the Trainer
saves, ``RayTrainReportCallback`` reports every metric of its log history with its newest checkpoint directory,
stored as ``checkpoint/``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

try:
    import transformers.trainer
    from transformers.trainer_callback import TrainerCallback
except ModuleNotFoundError:
    raise ModuleNotFoundError(
        "ddp_runtime.huggingface.transformers needs Hugging Face Transformers, which is not installed: pip install "
        "'sweepflow[transformers]' (Transformers and Accelerate), on the Dask workers too"
    ) from None

from torch.utils.data import DataLoader, IterableDataset

from ddp_runtime.checkpoint import Checkpoint
from ddp_runtime.data._iterate import DataIterator, Passes
from ddp_runtime.session import report

__all__ = ["RayTrainReportCallback", "prepare_trainer"]


class RayTrainReportCallback(TrainerCallback):
    """After each save of the Trainer: ``report`` the metrics of its whole log history (later values win) with
    its newest checkpoint (``transformers.trainer.get_last_checkpoint(args.output_dir)``) copied under
    ``checkpoint/``; a rank that saved none reports the metrics alone. Keep the Trainer's evaluation and save
    strategies aligned (both ``"epoch"``, or ``save_steps`` a multiple of ``eval_steps``) so the metric a
    scheduler reads is the evaluation's of that checkpoint."""

    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The Trainer saved: report its metrics so far with its newest checkpoint."""
        metrics: dict[str, Any] = {}
        for entry in state.log_history:
            metrics.update(entry)
        with tempfile.TemporaryDirectory(prefix="transformers-checkpoint-") as directory:
            source = transformers.trainer.get_last_checkpoint(args.output_dir)
            checkpoint = None
            if source is not None:
                # Hard links where they can be (the Trainer writes each checkpoint into a new directory and only
                # ever deletes old ones): report() copies the files into storage, so a second copy here would
                # only cost each save its bytes again.
                shutil.copytree(source, Path(directory, self.CHECKPOINT_NAME), copy_function=_link_or_copy)
                checkpoint = Checkpoint.from_directory(directory)
            report(metrics, checkpoint=checkpoint)


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)
    return dst


class _Batches(IterableDataset):
    """Batches a ``get_dataset_shard`` iterable already forms, one pass per epoch, as a torch dataset."""

    def __init__(self, batches: Iterable[Any]) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)


def _passes(dataset: Any, batch_size: int) -> Iterable[Any] | None:
    """A dataset given as one of ``ddp_runtime.data``'s iterables, as batches that start over each epoch: an
    ``iter_torch_batches(...)`` result as it is, a shard (``get_dataset_shard``) in batches of the Trainer's
    per-device batch size; None for any other dataset (the Trainer's own loader serves it)."""
    if isinstance(dataset, Passes):
        return dataset
    if isinstance(dataset, DataIterator):
        return Passes(lambda: dataset.iter_torch_batches(batch_size=batch_size))
    return None


def _loader(batches: Iterable[Any]) -> DataLoader:
    return DataLoader(_Batches(batches), batch_size=1, collate_fn=lambda one: one[0])


def prepare_trainer(trainer: transformers.Trainer) -> transformers.Trainer:
    """Let ``trainer`` read datasets given as ``ddp_runtime.data`` iterables (each rank its own shard: a
    ``get_dataset_shard`` shard, or its ``iter_torch_batches(...)``), evaluation datasets by name included; any
    other dataset goes to the Trainer's own loaders, which shard it by the group's ranks. Returns ``trainer``."""
    base = type(trainer)

    class RayTransformersTrainer(base):  # type: ignore[misc, valid-type]
        def get_train_dataloader(self) -> DataLoader:
            batches = _passes(self.train_dataset, self.args.per_device_train_batch_size)
            return _loader(batches) if batches is not None else super().get_train_dataloader()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
            chosen = eval_dataset if eval_dataset is not None else self.eval_dataset
            if isinstance(chosen, str) and isinstance(self.eval_dataset, dict):
                chosen = self.eval_dataset[chosen]
            batches = _passes(chosen, self.args.per_device_eval_batch_size)
            return _loader(batches) if batches is not None else super().get_eval_dataloader(eval_dataset)

    RayTransformersTrainer.__name__ = RayTransformersTrainer.__qualname__ = f"Ray{base.__name__}"
    trainer.__class__ = RayTransformersTrainer
    return trainer
