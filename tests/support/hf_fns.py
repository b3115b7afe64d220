"""Hugging Face training functions the integration tests run on Dask workers (importable via PYTHONPATH).

No download: a small BERT-style classifier built from a ``BertConfig``, on a generated corpus of token ids
(a sequence is positive when it holds the "signal" token), as Ray's Transformers guide's ``train_func`` is
shaped; and an ``Accelerator()`` loop with nothing but the environment the group sets.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset

import ddp_runtime as train

VOCAB, LENGTH, SIGNAL = 40, 12, 7


class Corpus(Dataset):
    """Token-id sequences; label 1 when the signal token appears."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(8, VOCAB, (n, LENGTH), generator=g)
        positive = torch.rand(n, generator=g) < 0.5
        where = torch.randint(1, LENGTH, (n,), generator=g)
        self.ids[positive, where[positive]] = SIGNAL
        self.ids[:, 0] = 2  # [CLS]
        self.labels = positive.long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long), "labels": self.labels[i]}


def corpus_frame(n: int, seed: int):
    """The corpus as a table (one column per token, and the label): what ``ddp_runtime.data.from_pandas`` takes."""
    import pandas as pd

    corpus = Corpus(n, seed)
    frame = pd.DataFrame(corpus.ids.numpy(), columns=[f"tok{i}" for i in range(LENGTH)])
    frame["label"] = corpus.labels.numpy()
    return frame


def collate(batch: dict) -> dict:
    """A numpy batch of ``corpus_frame``'s rows as the model's inputs."""
    import numpy as np

    ids = torch.from_numpy(np.stack([batch[f"tok{i}"] for i in range(LENGTH)], axis=1).astype(np.int64))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.from_numpy(batch["label"].astype(np.int64))}


def tiny_bert(seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=LENGTH, num_labels=2,
    )
    return BertForSequenceClassification(config)


def train_transformers(config: dict) -> None:
    """Ray's Transformers guide's ``train_func``: Trainer + RayTrainReportCallback + prepare_trainer, resumed
    from ``get_checkpoint()``; the train set a ``get_dataset_shard`` shard when the trainer was given one."""
    from transformers import Trainer, TrainingArguments

    from ddp_runtime.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    shard = config.get("shard")
    args = TrainingArguments(
        output_dir=os.path.join(train.get_context().get_trial_dir(), "hf-out"),
        eval_strategy="epoch" if not shard else "steps",
        save_strategy="epoch" if not shard else "steps",
        logging_strategy="epoch" if not shard else "steps",
        eval_steps=config.get("steps_per_save"),
        save_steps=config.get("steps_per_save"),
        logging_steps=config.get("steps_per_save"),
        max_steps=config.get("max_steps", -1),
        num_train_epochs=config.get("epochs", 1),
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        learning_rate=config.get("lr", 2e-3),
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )
    # A shard of TorchTrainer(datasets={"train": ...}) in batches the way Ray's guide forms them, else a torch
    # Dataset that the Trainer's own loader shards.
    train_dataset = (
        train.get_dataset_shard("train").iter_torch_batches(batch_size=16, collate_fn=collate) if shard else Corpus(256, 0)
    )
    trainer = Trainer(
        model=tiny_bert(),
        args=args,
        train_dataset=train_dataset,
        eval_dataset=Corpus(64, 1),
        callbacks=[RayTrainReportCallback()],
    )
    trainer = prepare_trainer(trainer)
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        trainer.train()
        return
    with checkpoint.as_directory() as directory:
        trainer.train(resume_from_checkpoint=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))


def train_accelerate(config: dict) -> None:
    """An ``Accelerator()`` built in the training function: it joins the group's process group, shards the
    loader, and keeps the ranks' weights equal."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    accelerator = Accelerator(cpu=True)
    model = tiny_bert(seed=accelerator.process_index)  # different init per rank: the wrapper must sync them
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loader = DataLoader(Corpus(256, 0), batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(config["epochs"]):
        total, batches = 0.0, 0
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total, batches = total + float(loss), batches + 1
        train.report(
            {
                "epoch": epoch,
                "loss": total / batches,
                "batches": batches,
                "num_processes": accelerator.num_processes,
                "process_index": accelerator.process_index,
            }
        )
    weights = torch.cat([p.detach().reshape(-1) for p in accelerator.unwrap_model(model).parameters()])
    gathered = accelerator.gather(weights[None])
    if not all(torch.equal(gathered[0], row) for row in gathered):
        raise AssertionError("ranks hold different weights after Accelerate's DDP")
